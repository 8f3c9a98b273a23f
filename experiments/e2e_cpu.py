"""End-to-end accuracy on this CPU: predicted vs measured PyTorch training iterations.

Three models, several batch sizes each, every one *predicted from its spec* (the synthesisers
in host mode: :func:`predictor.sources.synth.mlp.build_mlp_graph`,
:func:`predictor.sources.synth.transformer.build_transformer_graph`,
:func:`predictor.sources.synth.dlrm.build_dlrm_graph`; kernel times from the calibrated asset pack
of ``--platform``) and *measured* by training the same model for real on this machine:

* **MLP**: ``nn.Sequential`` of ``nn.Linear`` + ReLU, cross-entropy, SGD;
* **GPT**: a small GPT-style decoder in plain ``torch.nn`` with random weights, built like one
  layer of the transformer synthesiser (layer norm, QKV GEMM, attention with a causal mask,
  softmax and dropout, output projection, dropout + residual, layer norm, FC1, GeLU, FC2,
  dropout + residual; token + position embedding with dropout; tied output layer,
  cross-entropy; the gradient norm of Megatron's clipping; fused Adam);
* **DLRM** with ``nn.EmbeddingBag`` (sparse gradients, SGD fused into the backward) on one
  process, and table-wise sharded on 2 gloo processes (all-to-all, DDP):
  :mod:`experiments.dlrm_gloo`, the program of the sharding experiment; the tables of one
  "normal" task of the sharding experiment's generator, index batches drawn to its reuse
  profiles. The predictor is given the reuse factors of the real index batches, as in Lin et
  al. 2024.

Measurement: torch threads fixed (the thread count the asset pack was calibrated at, per
process), warm-up iterations, then the median of ``--iters`` timed iterations (each closed by
the end of the optimizer step; CPU ops are synchronous). This VM has 2 cores shared with other
users: every measurement first waits until other processes use little CPU and records how many
cores they used while it ran (:mod:`experiments.measure_env`); a row run beside more than
``--max-background`` cores is measured again (the quietest attempt is kept). Each measured run (a
*window* of the shared machine's state) is appended to the data set
``benchmarks/data/e2e_cpu_windows.json``.

One configuration's measured iteration moves by up to ~20 % between windows minutes apart, more
than the accuracy target, so a pack is scored on every stored window of its CPU: per window
(geomean and max absolute error, median signed error), pooled over every (window, configuration)
pair, and against each configuration's median over the windows (the steadier ground truth).
``--rescore`` does only that, measuring nothing (seconds).

Targets: geomean under 5 %, max under 10 % (Lin et al. 2022 report 7.96 % E2E on GPUs; the
multi-GPU paper of Lin et al. 2024, 5.21 %).

``--allocator no_trim`` measures the same programs with glibc's malloc told never to hand freed
memory back to the OS (:func:`predictor.timing.platforms.host.allocator_env`; the script re-executes
itself with that environment, so every rank process inherits it). Under the default allocator a
step pays 0 to a few thousand page faults depending on the process's allocation history, which no
kernel model sees.

Run: ``flock /tmp/tuner-measure.lock python experiments/e2e_cpu.py`` (measure one window, ~10 min);
``python experiments/e2e_cpu.py --rescore`` (score the stored windows, no measuring).
Writes ``experiments/results/e2e_cpu.md`` and ``.json`` (the scores over the stored windows and the
newest measured window in detail).

The models and their predictions are in :mod:`experiments.e2e_models`; the stored windows and their
scoring (``--rescore``) in :mod:`experiments.e2e_rescore`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.common import fail, host_check, host_line, previous_latest, repo_relative  # noqa: E402
from experiments.dlrm_gloo import (  # noqa: E402
    LEGACY_BATCH_POOL,
    EmbeddingOverride,
    batch_reuse_histogram,
    cold_embedding_seconds,
    table_batch,
)
from experiments.e2e_models import (  # noqa: E402
    DLRM_BATCHES,
    GPT,
    GPT_BATCHES,
    GPT_DROPOUT,
    MLP_BATCHES,
    Case,
    build_cases,
    dlrm_job,
    dlrm_tables,
)
from experiments.e2e_rescore import (  # noqa: E402
    WINDOWS_FILE,
    archive_window,
    load_windows,
    rescore,
    utc_time,
    windows_markdown,
)
from experiments.measure_env import (  # noqa: E402
    cpu_accounting,
    gemm_drift,
    llc_flush_buffer,
    measure_quietly,
    memory_drift,
    time_call,
)
from predictor.files import atomic_write_text  # noqa: E402
from predictor.metrics import abs_pct_errors, geomean_abs_pct_error, max_abs_pct_error  # noqa: E402
from predictor.timing.platforms.host import ALLOCATORS, with_allocator  # noqa: E402

#: where the results go (``OUT.md`` and ``OUT.json``)
OUT = REPO / "experiments" / "results" / "e2e_cpu"


# ----------------------------------------------------------------------------- measurement
def system_time_per_step(step: Callable[[], None], warmup: int, iters: int) -> dict:
    """Per iteration of ``step`` (after ``warmup``): wall, user and system CPU seconds and minor page
    faults of this process (``getrusage``). System time here is the kernel zero-filling pages the
    allocator took back from the OS (glibc trims freed memory at the top of its heap and unmaps large
    blocks), which no microbenchmark of a single op sees."""
    import resource

    for _ in range(warmup):
        step()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(iters):
        step()
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    return {"wall_s": (t1 - t0) / iters, **cpu_accounting(r0, r1, iters)}


@dataclass
class Row:
    model: str
    config: str
    batch: int
    ranks: int
    measured_s: float  #: median over the passes of each pass's median iteration
    p10_s: float  #: 10th percentile of every timed iteration of every pass
    p90_s: float
    pass_medians_s: list[float]
    predicted_s: float
    kernel_sum_s: float
    background_cores: float  #: the most any kept pass ran beside
    attempts: int  #: runs made (passes + re-runs beside background load)
    iters: int
    #: diagnosis (DLRM rows): the simulation with every embedding kernel measured cold instead of the pack's
    cold_embedding_s: float = float("nan")
    #: diagnosis (in-process rows): per-iteration wall / user / system seconds and minor page faults
    system: dict = field(default_factory=dict)
    error_pct: float = 0.0
    kernel_sum_error_pct: float = 0.0
    pass_spread_pct: float = 0.0  #: (max - min) / median of the pass medians

    def __post_init__(self) -> None:
        self.error_pct = float(abs_pct_errors([self.predicted_s], [self.measured_s])[0])
        self.kernel_sum_error_pct = float(abs_pct_errors([self.kernel_sum_s], [self.measured_s])[0])
        pm = np.asarray(self.pass_medians_s)
        self.pass_spread_pct = float(100 * (pm.max() - pm.min()) / np.median(pm)) if pm.size else float("nan")


# ----------------------------------------------------------------------------- runs
def run_all(args, timing, threads: int, log=print) -> list[Row]:
    """Measure every case ``args.passes`` times, the passes interleaved (pass 1 of every row, then
    pass 2, ...), so a slow stretch of the shared machine does not fall on one row only."""
    torch.set_num_threads(threads)
    cases = build_cases(args, timing, threads)
    mr = dict(max_background=args.max_background, retries=args.retries, log=log, quiet_timeout_s=args.quiet_timeout)
    for k in range(args.passes):
        for c in cases:
            m = measure_quietly(c.run, **mr)
            c.passes.append(m)
            log(f"pass {k + 1}: {c.model:<10} batch {c.batch:>5}: {m.median_s * 1e3:9.2f} ms "
                f"(predicted {c.predicted[0] * 1e3:9.2f} ms), background {m.background_cores:.2f} cores")
    if not args.no_check:
        cold_embedding_diagnosis(cases, timing, log)
        for c in cases:
            if c.make_step is not None:
                c.system = system_time_per_step(c.make_step(), args.warmup, args.iters)
                log(f"  {c.model} batch {c.batch}: system time {c.system['system_s'] * 1e3:.2f} ms per iteration, "
                    f"{c.system['minor_faults']:.0f} page faults")
    rows = []
    for c in cases:
        every = [t for m in c.passes for t in m.times]
        medians = [m.median_s for m in c.passes]
        rows.append(Row(c.model, c.config, c.batch, c.ranks, float(np.median(medians)),
                        float(np.percentile(every, 10)), float(np.percentile(every, 90)), medians,
                        c.predicted[0], c.predicted[1], max(m.background_cores for m in c.passes),
                        sum(m.attempts for m in c.passes), args.iters, cold_embedding_s=c.cold_embedding_s,
                        system=c.system))
    return rows


def cold_embedding_diagnosis(cases: list[Case], timing, log=print) -> None:
    """Diagnosis of the DLRM rows (not a prediction): simulate each row's graph again with every
    table's embedding kernels timed alone on its real batch after evicting the cache
    (:func:`experiments.dlrm_gloo.cold_embedding_seconds`) instead of the pack's models."""
    from predictor.simulate import simulate

    per_batch: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for c in cases:
        if c.graph is None or c.job is None:
            continue
        if c.batch not in per_batch:  # every rank looks its tables up for the global batch
            per_batch[c.batch] = cold_embedding_seconds(c.job)
        fwd, bwd = per_batch[c.batch]
        c.cold_embedding_s = float(simulate(c.graph, EmbeddingOverride(timing, fwd, bwd)).iteration_s)
        log(f"  {c.model} batch {c.batch}: with embeddings measured cold {c.cold_embedding_s * 1e3:.2f} ms")


# ----------------------------------------------------------------------------- kernel context check
def kernel_context_check(timing, batch: int = 1024, log=print) -> list[dict]:
    """The kernels that dominate the errors, timed alone: the pack's prediction, the kernel repeated
    on the same inputs (warm caches), and after evicting the LLC with the op before it of the same
    kind (embeddings: another table's call; dropout: the same op on small data) (cold, as in a
    training step where other ops ran in between; the calibration times these kernels this way). Seconds.

    Rows: every embedding-bag forward / backward (+ SGD update) of the DLRM rows' tables at
    ``batch`` (summed), and the GPT's dropout forward and backward (which the transformer
    synthesiser times with the same dropout kernel).
    """
    from predictor.timing.calibration.embedding_bag import neighbour_warmers, neighbour_weight
    from predictor.timing.kernels.base import TaskView
    from predictor.timing.kernels.embedding import RF_COLUMNS

    flush = llc_flush_buffer()
    neighbour = neighbour_weight(torch.device("cpu"))
    tables = dlrm_tables(batch)
    job = dlrm_job(tables, batch, 1, 1, 0, 10)
    sums = {k: np.zeros(3) for k in ("embedding_bag_fwd", "embedding_bag_bwd")}
    for ti in range(len(tables)):
        idx, off = table_batch(job, ti, 0)
        it, ot = torch.as_tensor(idx), torch.as_tensor(off)
        w = nn.Parameter(torch.rand(int(tables.rows[ti]), int(tables.dim[ti])))
        cols = {"batch": batch, "rows": float(tables.rows[ti]), "dim": float(tables.dim[ti]),
                "pooling": float(tables.pooling[ti]), "dtype_bytes": 4.0,
                **{c: float(v) for c, v in zip(RF_COLUMNS, batch_reuse_histogram(idx), strict=True)}}
        out = F.embedding_bag(it, w, ot, mode="sum", sparse=True)
        grad = torch.randn_like(out)

        def fwd(it=it, w=w, ot=ot):
            return F.embedding_bag(it, w, ot, mode="sum", sparse=True)

        def bwd(out=out, grad=grad, w=w):
            out.backward(grad, retain_graph=True)
            with torch.no_grad():
                w.add_(w.grad, alpha=-1e-3)
            w.grad = None

        warm_fwd, warm_bwd = neighbour_warmers(batch, neighbour)
        for kind, fn, warm in (("embedding_bag_fwd", fwd, warm_fwd), ("embedding_bag_bwd", bwd, warm_bwd)):
            pred = float(timing.model_for(kind).predict(TaskView.single(kind, **cols), timing.platform)[0])
            sums[kind] += [pred, time_call(fn, None), time_call(fn, lambda warm=warm: (flush(), warm()))]
        del w, out
    rows = [{"kernel": f"{k} x {len(tables)} tables (DLRM rows, batch {batch})", "predicted_s": v[0], "warm_s": v[1],
             "cold_s": v[2]} for k, v in sums.items()]
    b = GPT_BATCHES[1]
    elems = b * GPT.seq * GPT.hidden
    x = torch.randn(elems, requires_grad=True)
    y = F.dropout(x, GPT_DROPOUT, True)
    g = torch.randn(elems)
    xs = torch.randn(1024, requires_grad=True)  # the code-warming call's small data
    ys = F.dropout(xs, GPT_DROPOUT, True)
    gs = torch.randn(1024)

    def flush_fwd() -> None:
        flush()
        F.dropout(xs.detach(), GPT_DROPOUT, True)

    def flush_bwd() -> None:
        flush()
        torch.autograd.grad(ys, xs, gs, retain_graph=True)
    pred = float(timing.model_for("dropout").predict(TaskView.single("dropout", elements=elems, dtype_bytes=4),
                                                     timing.platform)[0])
    rows.append({"kernel": f"dropout forward, {elems} elements (GPT batch {b})", "predicted_s": pred,
                 "warm_s": time_call(lambda: F.dropout(x.detach(), GPT_DROPOUT, True), None),
                 "cold_s": time_call(lambda: F.dropout(x.detach(), GPT_DROPOUT, True), flush_fwd)})
    # the synthesiser times a dropout's backward as what it is: a multiply by the saved mask
    pred_bwd = float(timing.model_for("mul").predict(
        TaskView.single("mul", elements=elems, dtype_bytes=4, bytes=2.5 * elems * 4), timing.platform)[0])
    rows.append({"kernel": f"dropout backward (mask multiply), {elems} elements: the synthesiser's "
                           "`*_dropout*_bwd` tasks, timed by the `mul` model", "predicted_s": pred_bwd,
                 "warm_s": time_call(lambda: torch.autograd.grad(y, x, g, retain_graph=True), None),
                 "cold_s": time_call(lambda: torch.autograd.grad(y, x, g, retain_graph=True), flush_bwd)})
    for r in rows:
        log(f"  {r['kernel']}: predicted {r['predicted_s'] * 1e3:.3f} ms, warm {r['warm_s'] * 1e3:.3f} ms, "
            f"cold {r['cold_s'] * 1e3:.3f} ms")
    return rows


# ----------------------------------------------------------------------------- report
def summarize(rows: list[Row]) -> dict:
    pred = [r.predicted_s for r in rows]
    meas = [r.measured_s for r in rows]
    ks = [r.kernel_sum_s for r in rows]
    out = {
        "rows": len(rows),
        "geomean_abs_pct_error": geomean_abs_pct_error(pred, meas),
        "max_abs_pct_error": max_abs_pct_error(pred, meas),
        "kernel_sum_geomean_abs_pct_error": geomean_abs_pct_error(ks, meas),
        "kernel_sum_max_abs_pct_error": max_abs_pct_error(ks, meas),
        "per_model": {},
    }
    for model in dict.fromkeys(r.model for r in rows):
        sel = [r for r in rows if r.model == model]
        out["per_model"][model] = {
            "geomean_abs_pct_error": geomean_abs_pct_error([r.predicted_s for r in sel], [r.measured_s for r in sel]),
            "max_abs_pct_error": max_abs_pct_error([r.predicted_s for r in sel], [r.measured_s for r in sel]),
        }
    out["meets_target"] = bool(out["geomean_abs_pct_error"] < 5.0 and out["max_abs_pct_error"] < 10.0)
    spread = [r.pass_spread_pct for r in rows]
    out["pass_spread_median_pct"] = float(np.median(spread)) if spread else float("nan")
    out["pass_spread_max_pct"] = float(np.max(spread)) if spread else float("nan")
    return out


def markdown(rows: list[Row], summary: dict, meta: dict, checks: list[dict]) -> str:
    lines = [
        "# End-to-end accuracy on this CPU: predicted vs measured training iterations",
        "",
        f"{meta['date']}, {meta['machine']} ({meta['cpu_model']}), torch {meta['torch']}, "
        f"{meta['threads']} torch thread(s) per process (the asset pack was calibrated at {meta['pack_threads']}). "
        f"Prediction: `{meta['timing_source']}` (created {meta['pack_created'] or '-'}); "
        "graphs from the model specs by the synthesisers in host mode (no trace of the runs is used).",
        f"Measured: {meta['passes']} passes over all rows, interleaved; a pass = fresh model, "
        f"{meta['warmup']} warm-up iterations ({meta['dlrm_warmup']} for DLRM), median of {meta['iters']} timed "
        "iterations (DLRM: the slowest rank's). `measured` = median of the pass medians, [p10-p90] of every timed "
        "iteration, `passes` = spread of the pass medians. Each pass waited for the machine to be quiet; `bg` = "
        "most cores other processes used during a kept pass (a 2-core VM shared with other users).",
        f"C allocator: `{meta.get('allocator', 'default')}`"
        + (" (glibc told never to return freed memory to the OS: only blocks above 32 MiB are mapped afresh)."
           if meta.get("allocator") == "no_trim" else " (glibc as it comes)."),
        f"DLRM index batches: a pool of {meta.get('batch_pool', LEGACY_BATCH_POOL)} cycled"
        + (" (a batch's rows come back two iterations later, cached while two batches fit in the LLC)."
           if meta.get("batch_pool", LEGACY_BATCH_POOL) <= 2 else " (each iteration's rows as fresh as the reuse profile makes them)."),
        f"Reproduce: `flock /tmp/tuner-measure.lock {meta['command']}`",
        *([host_line(meta), ""] if "cpu" in meta else []),
        "",
        "| model | config | batch | ranks | measured ms [p10-p90] | passes | predicted ms | error | kernel-sum ms | "
        "kernel-sum error | bg cores |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.config} | {r.batch} | {r.ranks} | {r.measured_s * 1e3:.2f} "
            f"[{r.p10_s * 1e3:.2f}-{r.p90_s * 1e3:.2f}] | {r.pass_spread_pct:.1f}% | {r.predicted_s * 1e3:.2f} | "
            f"{r.error_pct:.1f}% | {r.kernel_sum_s * 1e3:.2f} | {r.kernel_sum_error_pct:.1f}% | "
            f"{r.background_cores:.2f} |"
        )
    s = summary
    lines += [
        "",
        "| | geomean abs error | max abs error |",
        "|---|---:|---:|",
        f"| **prediction (simulated graph)** | **{s['geomean_abs_pct_error']:.2f}%** | "
        f"**{s['max_abs_pct_error']:.2f}%** |",
        f"| kernel-sum baseline | {s['kernel_sum_geomean_abs_pct_error']:.2f}% | "
        f"{s['kernel_sum_max_abs_pct_error']:.2f}% |",
    ]
    for model, v in s["per_model"].items():
        lines.append(f"| prediction, {model} only | {v['geomean_abs_pct_error']:.2f}% | {v['max_abs_pct_error']:.2f}% |")
    verdict = "met" if s["meets_target"] else "**not met**"
    lines += [
        "",
        f"Target: geomean under 5 %, max under 10 % — {verdict}. References: Lin et al. 2022, 7.96 % "
        "E2E geomean error on GPUs; Lin et al. 2024 (multi-GPU), 5.21 %. Run-to-run spread of the measurements "
        f"themselves (pass medians): median {s['pass_spread_median_pct']:.1f}%, max {s['pass_spread_max_pct']:.1f}%.",
        "",
    ]
    lines += drift_lines(meta.get("gemm_drift") or {})
    lines += system_lines(rows)
    lines += cold_embedding_lines(rows)
    lines += kernel_check_lines(checks)
    return "\n".join(lines)


def cold_embedding_lines(rows: list[Row]) -> list[str]:
    """The DLRM rows simulated with every embedding kernel measured cold (:func:`cold_embedding_diagnosis`)."""
    diag = [r for r in rows if np.isfinite(r.cold_embedding_s)]
    if not diag:
        return []
    errs = [abs(r.cold_embedding_s - r.measured_s) / r.measured_s * 100 for r in diag]
    lines = [
        "## Diagnosis: DLRM rows with the embedding kernels measured cold",
        "",
        "Not a prediction (it uses measured kernel times): each DLRM row's graph simulated again with every "
        "table's embedding-bag forward and backward (+ SGD update) timed alone on its real batch after evicting "
        "the last-level cache and running another table's call before it (as the calibration times them), instead of the asset pack's embedding models; everything else unchanged.",
        "",
        "| model | batch | measured ms | predicted (pack) ms | error | with cold embeddings ms | error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r, e in zip(diag, errs, strict=True):
        lines.append(f"| {r.model} | {r.batch} | {r.measured_s * 1e3:.2f} | {r.predicted_s * 1e3:.2f} | "
                     f"{r.error_pct:.1f}% | {r.cold_embedding_s * 1e3:.2f} | {e:.1f}% |")
    g_pack = geomean_abs_pct_error([r.predicted_s for r in diag], [r.measured_s for r in diag])
    g_cold = geomean_abs_pct_error([r.cold_embedding_s for r in diag], [r.measured_s for r in diag])
    lines += ["", f"Geomean abs error of these rows: {g_pack:.2f}% with the pack, {g_cold:.2f}% with "
                  "cold-measured embeddings.", ""]
    return lines


def kernel_check_lines(checks: list[dict]) -> list[str]:
    """The kernel context check (:func:`kernel_context_check`) as a table."""
    if not checks:
        return []
    lines = [
        "## Kernel context check",
        "",
        "The kernels behind most of the error, timed alone on this machine: the asset pack's prediction, the "
        "kernel repeated on the same inputs (`warm`: how the calibration times GEMMs) and after evicting the "
        "last-level cache before each call, with an op of the same kind run between (`cold`: embeddings after another "
        "table's call, dropout after the same op on small data; "
        "closer to a training step, where other ops ran since the kernel last touched its data; how the "
        "calibration times embeddings and memory-bound kernels).",
        "",
        "| kernel | predicted ms | warm ms | cold ms |",
        "|---|---:|---:|---:|",
    ]
    for c in checks:
        lines.append(f"| {c['kernel']} | {c['predicted_s'] * 1e3:.3f} | {c['warm_s'] * 1e3:.3f} | "
                     f"{c['cold_s'] * 1e3:.3f} |")
    return [*lines, ""]


def drift_lines(drift: dict) -> list[str]:
    """The machine-drift paragraph: the pack's own GEMM microbenchmarks re-timed around the passes."""
    b, a = drift.get("before") or {}, drift.get("after") or {}
    if not b or not a:
        return []
    return [
        "## Machine drift since calibration",
        "",
        f"The asset pack's own fp32 GEMM microbenchmarks ({b['cases']} shapes from its `data/gemm.csv`, the larger "
        "half by FLOPs), re-timed with the calibration's timer just before and just after the passes, took "
        f"x{b['ratio_geomean']:.3f} and x{a['ratio_geomean']:.3f} their calibrated times (geomean; per shape "
        f"x{min(b['ratio_min'], a['ratio_min']):.2f}..x{max(b['ratio_max'], a['ratio_max']):.2f}; > 1: the machine "
        "is slower now than when it was calibrated). A prediction can be no closer than this drift for the "
        "GEMM-bound rows; it is measured, not used to correct anything.",
        "",
    ] + memory_drift_lines(drift)


def memory_drift_lines(drift: dict) -> list[str]:
    """One paragraph: the pack's own memcpy microbenchmarks re-timed around the passes (the memory
    system's state, which GEMMs barely see)."""
    b, a = drift.get("memory_before") or {}, drift.get("memory_after") or {}
    if not b or not a:
        return []
    return [
        f"The memory system, likewise: the pack's own memcpy microbenchmarks ({b['cases']} shapes, the larger half "
        f"by bytes, timed as calibrated) took x{b['ratio_geomean']:.2f} and x{a['ratio_geomean']:.2f} their "
        f"calibrated times before and after the passes (per shape x{min(b['ratio_min'], a['ratio_min']):.2f}.."
        f"x{max(b['ratio_max'], a['ratio_max']):.2f}).",
        "",
    ]


def system_lines(rows: list[Row]) -> list[str]:
    """The system-time table of the in-process rows (kernel page faults inside a training step)."""
    sel = [r for r in rows if r.system]
    if not sel:
        return []
    out = [
        "## Diagnosis: system time inside a training step",
        "",
        "MLP and GPT rows: measured once more after the passes (same warm-up and iterations, `getrusage` of this "
        "process); DLRM rows: the last pass, mean over the ranks (each rank's own threads, barriers included). System "
        "CPU time per iteration is the kernel zero-filling pages that the C allocator returned to the OS between "
        "uses (glibc trims the top of its heap and unmaps large freed blocks). No single-op microbenchmark sees it "
        "(there the same block is reused), and the predictions do not model it; how much of a step it costs depends "
        "on the allocator's state and changes from run to run.",
        "",
        "`switches` = involuntary context switches per iteration (threads pre-empted on a full host).",
        "",
        "| model | batch | ranks | wall ms | user ms | system ms | system share | page faults | switches | predicted ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sel:
        y = r.system
        out.append(f"| {r.model} | {r.batch} | {r.ranks} | {y['wall_s'] * 1e3:.2f} | {y['user_s'] * 1e3:.2f} | "
                   f"{y['system_s'] * 1e3:.2f} | {100 * y['system_s'] / y['wall_s']:.1f}% | {y['minor_faults']:.0f} | "
                   f"{y['involuntary_switches']:.0f} | {r.predicted_s * 1e3:.2f} |")
    return [*out, ""]


def resolve(platform_name: str):
    """(timing, pack manifest or None, pack folder or None) for ``--platform``."""
    from predictor.timing.kernels.assets import resolve_platform

    res = resolve_platform(platform_name)
    pack = res.pack
    return res.timing(), (pack.manifest if pack is not None else None), (pack.path if pack is not None else None)


def measure(args, argv: list[str] | None) -> dict:
    """Measure every row (``args.passes`` interleaved passes) and return the measured window: ``meta``,
    ``summary``, ``rows`` (as dicts) and ``kernel_context_check``. Exit 2 on a corrupt pack."""
    timing, manifest, pack_path = resolve(args.platform)
    host = host_check(manifest)
    threads = args.threads or int((manifest or {}).get("threads", 1))
    t0 = time.perf_counter()
    torch.set_num_threads(threads)
    check_drift = pack_path is not None and not args.no_check
    try:
        drift = {"before": gemm_drift(pack_path) if check_drift else {},
                 "memory_before": memory_drift(pack_path) if check_drift else {}}
    except ValueError as exc:  # a corrupt pack: one line, exit 2 (no results written)
        fail(str(exc))
    rows = run_all(args, timing, threads)
    drift["after"] = gemm_drift(pack_path) if check_drift else {}
    drift["memory_after"] = memory_drift(pack_path) if check_drift else {}
    checks = [] if args.no_check else kernel_context_check(timing)
    from predictor.timing.platforms.cpu_local import cpu_model

    meta = {
        "date": date.today().isoformat(),
        "machine": f"{os.cpu_count()}-core {pyplatform.machine()} VM",
        "cpu_model": cpu_model(),
        "torch": torch.__version__,
        "threads": threads,
        "timing_source": timing.source,
        "pack_created": (manifest or {}).get("created"),
        "pack_threads": (manifest or {}).get("threads"),
        "iters": args.iters,
        "passes": args.passes,
        "warmup": args.warmup,
        "dlrm_warmup": args.dlrm_warmup,
        "gemm_drift": drift,
        **host,
        "allocator": args.allocator,
        "batch_pool": args.batch_pool,
        "wall_s": round(time.perf_counter() - t0, 1),
        "command": "python experiments/e2e_cpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    return {"meta": meta, "summary": summarize(rows), "rows": [asdict(r) for r in rows],
            "kernel_context_check": checks}


def latest_markdown(latest: dict) -> str:
    """The newest measured window (:func:`measure`'s record) as markdown, one heading level down."""
    rows = [Row(**{k: v for k, v in r.items() if k in Row.__dataclass_fields__}) for r in latest["rows"]]
    text = markdown(rows, latest["summary"], latest["meta"], latest.get("kernel_context_check") or [])
    return "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines()) + "\n"


def write_results(out: Path, scores: dict, latest: dict | None) -> str:
    """``OUT.md`` and ``OUT.json`` (JSON last): the scores over the stored windows and, when there is one,
    the newest measured window. Returns the markdown."""
    text = windows_markdown(scores)
    if latest:
        text += "\n" + latest_markdown(latest)
    atomic_write_text(out.with_suffix(".md"), text)
    atomic_write_text(out.with_suffix(".json"), json.dumps({"windows": scores, "latest": latest}, indent=1))
    return text


def _rescore_command(args) -> str:
    """The command line that re-scores what ``args`` scored (its non-default options)."""
    cmd = "python experiments/e2e_cpu.py --rescore"
    if args.platform != "cpu-local":
        cmd += f" --platform {args.platform}"
    if args.compare:
        cmd += " --compare " + " ".join(args.compare)
    for flag, value, default in (("--allocator", args.allocator, "default"), ("--batch-pool", args.batch_pool, 8),
                                 ("--cpu", args.cpu, "pack"), ("--since", args.since, None)):
        if value != default:
            cmd += f" {flag} {value}"
    if args.data != WINDOWS_FILE:
        cmd += f" --data {repo_relative(args.data)}"
    if args.out != OUT:
        cmd += f" --out {repo_relative(args.out)}"
    return cmd


def score_windows(args) -> dict:
    """:func:`rescore` over the stored windows measured as ``args`` asks (allocator, batch pool, ``--since``)."""
    since = None if args.since is None else utc_time(args.since, "--since")
    windows = [w for w in load_windows(args.data) if w.get("allocator", "default") == args.allocator
               and w.get("batch_pool", LEGACY_BATCH_POOL) == args.batch_pool
               and (since is None or utc_time(w.get("measured_at"), f"{args.data}: measured_at") >= since)]
    if not windows:
        fail(f"{repo_relative(args.data)}: no window measured with --allocator {args.allocator} and --batch-pool "
             f"{args.batch_pool}" + (f" since {args.since}" if since is not None else ""))
    return {**rescore(args, windows), "command": _rescore_command(args)}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rescore", action="store_true",
                    help="measure nothing: score --platform (and --compare) on every stored window")
    ap.add_argument("--platform", default="cpu-local")
    ap.add_argument("--compare", nargs="*", default=[], help="--rescore: more packs (names or folders) beside it")
    ap.add_argument("--cpu", choices=("pack", "host", "all"), default="pack",
                    help="--rescore: the windows measured on the CPU of the --platform pack (default; a pack "
                         "without a record: the windows without one), on this host's CPU, or all of them")
    ap.add_argument("--since", default=None, metavar="ISO_TIME",
                    help="--rescore: only the windows measured at or after this UTC time, e.g. 2026-11-26T11:18")
    ap.add_argument("--models", nargs="+", default=["mlp", "gpt", "dlrm"], choices=["mlp", "gpt", "dlrm"])
    ap.add_argument("--mlp-batches", type=int, nargs="+", default=list(MLP_BATCHES))
    ap.add_argument("--gpt-batches", type=int, nargs="+", default=list(GPT_BATCHES))
    ap.add_argument("--dlrm-batches", type=int, nargs="+", default=list(DLRM_BATCHES[1]))
    ap.add_argument("--dlrm-ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dlrm-warmup", type=int, default=3, help="DDP rebuilds its buckets after the first iteration")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--passes", type=int, default=3, help="measurements of every row, interleaved")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the diagnoses (kernel context, cold embeddings, system time, machine drift)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per process (default: the pack's)")
    ap.add_argument("--max-background", type=float, default=0.3, help="re-measure above this many busy cores of others")
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--quiet-timeout", type=float, default=300.0,
                    help="seconds to wait for the machine to be quiet before each run")
    ap.add_argument("--allocator", choices=ALLOCATORS, default="default",
                    help="C allocator mode of the measured processes (no_trim: no page faults from trimming)")
    ap.add_argument("--batch-pool", type=int, default=8,
                    help="distinct index batches the DLRM rows cycle through (8: fresh rows each iteration, as a "
                         "real input stream; 2: a batch's rows come back cached, as the oldest windows)")
    ap.add_argument("--data", type=Path, default=WINDOWS_FILE, help="the stored windows (a JSON data set)")
    ap.add_argument("--no-archive", action="store_true", help="do not append the measured window to --data")
    ap.add_argument("--out", type=Path, default=OUT, help="results path without suffix (OUT.md and OUT.json)")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.out.suffix in (".md", ".json"):
        ap.error(f"--out {args.out}: the results path without suffix (OUT.md and OUT.json are written)")
    if args.iters < 10:
        ap.error("--iters must be >= 10 (median of at least 10 iterations)")
    if args.passes < 1:
        ap.error("--passes must be >= 1")
    if args.batch_pool < 1:
        ap.error("--batch-pool must be >= 1")
    if args.out.with_suffix(".json").resolve() == args.data.resolve():
        fail(f"--out {args.out}: would overwrite the data set {args.data}")
    if args.rescore:
        print(write_results(args.out, score_windows(args), previous_latest(args.out)))
        return
    want = with_allocator(dict(os.environ), args.allocator)
    if want != dict(os.environ):  # glibc reads its settings at process start: run again with them
        own = argv if argv is not None else sys.argv[1:]
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *own], want)
    latest = measure(args, argv)
    if not args.no_archive:
        archive_window(args.data, latest["meta"], latest["rows"])
    print(write_results(args.out, score_windows(args), latest))


if __name__ == "__main__":
    main()
