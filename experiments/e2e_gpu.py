"""End-to-end accuracy on one GPU: predicted vs measured PyTorch training iterations (H100, H200).

Two halves, because the GPU is lent for minutes and the predictions need none:

* ``--measure`` (on the GPU machine, ``bash experiments/gpu.sh``): trains the models of
  :mod:`experiments.e2e_cpu` (the MLP, the small GPT, one-process DLRM with ``nn.EmbeddingBag``) and a
  larger bf16 GPT at several batch sizes on ``cuda``, and writes the measured iteration times, the GPU and
  software it ran on, to a JSON file; ``--traces DIR`` also records one configuration of each model with
  :func:`tuner.capture` (Kineto + execution trace). Back here, ``--add FILE --name NAME`` stores the run in
  the data set ``benchmarks/data/gpu_runs.json`` (the traces go to ``benchmarks/traces/NAME``).
* ``--predict`` (anywhere, no GPU): predicts every stored run's rows from their specs (the synthesisers in
  device mode: asynchronous kernels on a stream, the host launching them with the platform's CPU overheads
  T1-T5) with the GPU's catalog entry (analytic kernel models) and the calibrated asset packs
  (``assets/h100``, ``assets/h200-cal``), and from the captured traces of the GPU's first run; writes
  ``experiments/results/e2e_gpu.md`` and ``.json``. ``--predict FILE ...`` predicts those measured files
  instead (``--gpu`` names their GPU).

Measurement: per configuration, ``--warmup`` untimed iterations, then ``--iters`` iterations each
timed by CUDA events around the step on the current stream (the host runs ahead as it would in
training; an event pair measures the GPU's time from the step's first launch to its last kernel,
idle gaps waiting for launches included), median per pass; ``--passes`` passes interleaved over the
configurations; reported: the median of the pass medians. Also the wall-clock mean of the timed
iterations between two synchronisations, as a cross-check.

Run (here): ``python experiments/e2e_gpu.py --predict`` (about 2 minutes).
"""

from __future__ import annotations

import argparse
import json
import platform as pyplatform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import date
from pathlib import Path

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.common import fail, repo_relative  # noqa: E402
from experiments.dlrm_gloo import Dense, mlp, sgd_in_backward, table_batch  # noqa: E402
from experiments.e2e_models import (  # noqa: E402
    DLRM_BOTTOM,
    DLRM_TOP,
    GPT,
    MLP,
    dlrm_job,
    dlrm_spec_for,
    dlrm_tables,
    gpt_step,
    mlp_step,
)
from predictor.files import atomic_write_text  # noqa: E402
from predictor.metrics import abs_pct_errors, geomean_abs_pct_error, max_abs_pct_error  # noqa: E402
from predictor.sources.synth.mlp import MLPSpec  # noqa: E402
from predictor.sources.synth.transformer import TransformerSpec  # noqa: E402

#: the stored measured runs: a list of ``--measure`` records, each with its ``name`` and ``gpu_kind``
DATA = REPO / "benchmarks" / "data" / "gpu_runs.json"
TRACES = REPO / "benchmarks" / "traces"
OUT = REPO / "experiments" / "results" / "e2e_gpu"

#: a GPU-sized GPT in bf16 (parameters, activations and Adam state), unfused attention as the synthesiser's
GPT_BF16 = TransformerSpec(layers=4, hidden=1024, heads=16, seq=1024, vocab=32000, dtype="bf16", attention="unfused",
                           name="gpt-4l-1024h-16a-1024s-32000v-bf16")
#: (model, batches): the rows measured
ROWS: dict[str, tuple[int, ...]] = {
    "mlp": (256, 1024, 4096, 16384),
    "gpt": (2, 8, 32),
    "gpt-bf16": (2, 4, 8),
    "dlrm": (1024, 4096, 16384),
}
#: a GPU -> its catalog entry (analytic models), its calibrated asset pack (``assets/PACK``; it also prices
#: the trace what-if rows), the platforms its runs are predicted with, and the traces of its first stored run
GPUS: dict[str, dict] = {
    "h100": {"catalog": "h100-sxm", "pack": "h100", "platforms": ("h100-sxm", "h100"), "traces": "h100"},
    "h200": {"catalog": "h200", "pack": "h200-cal", "platforms": ("h200", "h100", "h200-cal"), "traces": "h200-2"},
}
#: the configuration of each model recorded as a trace (``--traces``)
TRACE_BATCH = {"mlp": 4096, "gpt": 8, "gpt-bf16": 4, "dlrm": 4096}


def _gpt_spec(model: str, program: str = "megatron") -> TransformerSpec:
    """The GPT row's spec; ``program="eager"``: the synthesiser's plain-PyTorch program (what the
    measured :class:`experiments.e2e_models.GPTModel` runs) instead of Megatron's fused one."""
    import dataclasses

    return dataclasses.replace(GPT if model == "gpt" else GPT_BF16, program=program)


def _config(model: str) -> str:
    if model == "mlp":
        return MLP.label
    if model.startswith("gpt"):
        return _gpt_spec(model).name
    t = dlrm_tables(1024)
    return f"{t.label}, {len(t)} tables"


# ----------------------------------------------------------------------------- the real models
def dlrm_step(batch: int, device: torch.device) -> Callable[[], None]:
    """One training step of the DLRM rows on one GPU: every table an ``nn.EmbeddingBag`` (sum pooling,
    sparse gradients, SGD fused into the backward), bottom MLP, concatenation, top MLP, BCE, SGD."""
    tables = dlrm_tables(batch)
    job = dlrm_job(tables, batch, 1, threads=1, warmup=0, iters=1)
    dims = np.asarray(job.dim)
    torch.manual_seed(batch)
    embs = nn.ModuleList(nn.EmbeddingBag(int(job.rows[t]), int(dims[t]), mode="sum", sparse=True)
                         for t in range(len(dims))).to(device)
    for w in embs.parameters():
        w.register_post_accumulate_grad_hook(sgd_in_backward)
    dense = Dense(mlp([job.dense_features, *DLRM_BOTTOM], sigmoid_last=False),
                   mlp([DLRM_BOTTOM[-1] + int(dims.sum()), *DLRM_TOP], sigmoid_last=True)).to(device)
    opt = torch.optim.SGD(dense.parameters(), lr=0.01)
    lookups = [table_batch(job, t, 0) for t in range(len(dims))]
    idx = [(torch.as_tensor(i, device=device), torch.as_tensor(o, device=device)) for i, o in lookups]
    x = torch.randn(batch, job.dense_features, device=device)
    y = torch.rand(batch, 1, device=device)
    loss_fn = nn.BCELoss()

    def step() -> None:
        pooled = [embs[k](i, o) for k, (i, o) in enumerate(idx)]
        loss = loss_fn(dense(x, pooled), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def make_step(model: str, batch: int, device: torch.device) -> Callable[[], None]:
    """A fresh training step of ``model`` at ``batch`` on ``device``."""
    if model == "mlp":
        return mlp_step(MLPSpec(**{**asdict(MLP), "batch_size": batch}), device=device)
    if model.startswith("gpt"):
        return gpt_step(_gpt_spec(model), batch, device=device)
    if model == "dlrm":
        return dlrm_step(batch, device)
    raise ValueError(f"unknown model {model!r}")


# ----------------------------------------------------------------------------- measurement
def time_gpu_steps(step: Callable[[], None], warmup: int, iters: int, device: torch.device) -> dict:
    """Per-iteration seconds by CUDA events (``times``) and the wall-clock mean between two syncs
    (on a CPU device, for smoke tests: the host clock)."""
    for _ in range(warmup):
        step()
    if device.type != "cuda":
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        return {"times": times, "wall_mean_s": float(np.mean(times))}
    torch.cuda.synchronize(device)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    t0 = time.perf_counter()
    for a, b in ev:
        a.record()
        step()
        b.record()
    torch.cuda.synchronize(device)
    wall = (time.perf_counter() - t0) / iters
    return {"times": [a.elapsed_time(b) / 1e3 for a, b in ev], "wall_mean_s": wall}


def measure(args) -> None:
    """Measure every row ``args.passes`` times (passes interleaved) and write ``args.out``."""
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 rows are fp32 (the synthesiser's fp32 peak)
    torch.backends.cudnn.allow_tf32 = False
    rows = [(m, b) for m, bs in ROWS.items() if m in args.models for b in bs]
    steps = {}
    for m, b in rows:
        steps[(m, b)] = make_step(m, b, device)
    result: dict[tuple[str, int], dict] = {r: {"pass_medians_s": [], "wall_means_s": [], "times": []} for r in rows}
    for p in range(args.passes):
        for r in rows:
            t = time_gpu_steps(steps[r], args.warmup, args.iters, device)
            result[r]["pass_medians_s"].append(float(np.median(t["times"])))
            result[r]["wall_means_s"].append(t["wall_mean_s"])
            result[r]["times"] += t["times"]
            print(f"pass {p + 1}: {r[0]:<9} batch {r[1]:>6}: {np.median(t['times']) * 1e3:9.3f} ms "
                  f"(wall mean {t['wall_mean_s'] * 1e3:9.3f} ms)", flush=True)
    from predictor.timing.calibration.overheads import unprofiled_op_seconds

    out = {
        "date": date.today().isoformat(),
        # this host's tight-loop cost per eager op, as a CUDA calibration records it (manifest overheads
        # unprofiled_op_s): how fast this instance's host is against the one that calibrated the pack
        "host_probe_op_s": unprofiled_op_seconds(device, calls=500),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": pyplatform.python_version(),
        "host_cpu": pyplatform.processor() or pyplatform.machine(),
        "warmup": args.warmup, "iters": args.iters, "passes": args.passes, "tf32": False,
        "rows": [{"model": m, "config": _config(m), "batch": b,
                  "measured_s": float(np.median(result[(m, b)]["pass_medians_s"])),
                  "p10_s": float(np.percentile(result[(m, b)]["times"], 10)),
                  "p90_s": float(np.percentile(result[(m, b)]["times"], 90)),
                  "pass_medians_s": result[(m, b)]["pass_medians_s"],
                  "wall_means_s": result[(m, b)]["wall_means_s"]} for m, b in rows],
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    if args.traces:
        from tuner import capture

        which = dict(TRACE_BATCH)
        for item in args.trace_batches or []:
            name, _, b = item.partition("=")
            which[name] = int(b)
        for m in args.models:
            step = steps.get((m, which[m])) or make_step(m, which[m], device)
            folder = Path(args.traces) / f"{m}-b{which[m]}"
            # as the timed loop runs: the host queues ahead, no synchronisation per step (a sync
            # would serialise host and GPU and make the unprofiled iterations slower than training);
            # 3 profiled warm-ups, 3 recorded steps, then 15 unprofiled ones (the profiler-cost baseline)
            with capture(folder, warmup=3, active=3) as cap:
                for _ in range(3 + 3 + 15):
                    step()
                    cap.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            print(f"captured {folder}", flush=True)


# ----------------------------------------------------------------------------- prediction
#: the transformer synthesiser's program for the GPT rows (``--gpt-program``)
GPT_PROGRAM = "eager"


def graph_for(model: str, batch: int, program: str | None = None):
    """The synthesiser's device-mode graph of one iteration of ``model`` at ``batch`` (GPT rows:
    ``program``, default :data:`GPT_PROGRAM`)."""
    from predictor.sources.synth.dlrm import build_dlrm_graph
    from predictor.sources.synth.mlp import build_mlp_graph
    from predictor.sources.synth.transformer import ParallelPlan, build_transformer_graph

    if model == "mlp":
        return build_mlp_graph(MLPSpec(**{**asdict(MLP), "batch_size": batch}), mode="device")
    if model.startswith("gpt"):
        return build_transformer_graph(_gpt_spec(model, program or GPT_PROGRAM),
                                       ParallelPlan(micro_batch=batch, global_batch=batch), detail="kernel", mode="device")
    tables = dlrm_tables(batch)
    job = dlrm_job(tables, batch, 1, threads=1, warmup=0, iters=1)
    spec = dlrm_spec_for(job, tables)
    return build_dlrm_graph(spec, np.zeros(len(tables), dtype=np.int64), 1, mode="device")


def predict_rows(measured: dict, timings: dict, traces_dir: str | Path | None,
                 program: str = GPT_PROGRAM, trace_pack: str = "h100") -> tuple[list[dict], dict]:
    """Every measured row predicted by each timing (and from its model's trace in ``traces_dir``,
    if given, priced by the asset pack ``trace_pack``); returns (rows, summary by predictor)."""
    from predictor.simulate import simulate

    rows = []
    for r in measured["rows"]:
        g = graph_for(r["model"], int(r["batch"]), program)
        row = dict(r)
        row.pop("times", None)
        for p, timing in timings.items():
            tl = simulate(g, timing)
            # the measured loop never synchronises: its pace is the bottleneck's (host span or busiest stream)
            row[f"predicted_s[{p}]"] = float(tl.loop_pace_s())
            row[f"latency_s[{p}]"] = float(tl.iteration_s)
            row[f"kernel_sum_s[{p}]"] = float(tl.kernel_sum_s())
            row[f"error_pct[{p}]"] = float(abs_pct_errors([tl.loop_pace_s()], [r["measured_s"]])[0])
        pm = np.asarray(r["pass_medians_s"])
        row["pass_spread_pct"] = float(100 * (pm.max() - pm.min()) / np.median(pm))
        trace = trace_for(r["model"], traces_dir) if traces_dir is not None else None
        if trace is not None:
            from predictor.whatif.apply import parse_sets, predict_trace

            res = predict_trace(trace, parse_sets([f"batch_size={int(r['batch'])}"]), trace_pack)
            row["trace"] = trace.name
            row["trace_predicted_s"] = float(res.predicted_iteration_s)
            row["trace_unprofiled_s"] = float(res.baseline_measured_s)
            row["trace_error_pct"] = float(abs_pct_errors([res.predicted_iteration_s], [r["measured_s"]])[0])
        rows.append(row)
    summary = {}
    meas = [row["measured_s"] for row in rows]
    for p in timings:
        pred = [row[f"predicted_s[{p}]"] for row in rows]
        summary[p] = {"source": timings[p].source, "geomean_pct": float(geomean_abs_pct_error(pred, meas)),
                      "max_pct": float(max_abs_pct_error(pred, meas)), "n": len(rows)}
    traced = [row for row in rows if "trace_predicted_s" in row]
    if traced:
        pred = [row["trace_predicted_s"] for row in traced]
        summary[f"trace what-if ({trace_pack})"] = {
                                           "source": f"tuner predict TRACE --set batch_size=B --platform {trace_pack}",
                                           "geomean_pct": float(geomean_abs_pct_error(
                                               pred, [row["measured_s"] for row in traced])),
                                           "max_pct": float(max_abs_pct_error(
                                               pred, [row["measured_s"] for row in traced])),
                                           "n": len(traced)}
    return rows, summary


def predict_gpu(gpu: str, runs: list[tuple[str, dict]], platforms: list[str], traces_dir: Path | None,
                program: str = GPT_PROGRAM) -> dict:
    """Every row of ``runs`` (``(name, measured record)``, all of GPU ``gpu``) predicted with each platform
    (a catalog name or an asset pack). The first run is reported row by row (and predicted from the traces in
    ``traces_dir``, captured beside it); the others (runs on other machine instances) by their summary only."""
    from predictor.timing.kernels import timing_for

    pack_name = GPUS[gpu]["pack"]
    timings = {p: timing_for(p) for p in platforms
               if p != pack_name or (REPO / "assets" / pack_name / "manifest.json").exists()}
    platforms = list(timings)
    other = "megatron" if program == "eager" else "eager"
    first_name, measured = runs[0]
    traced = traces_dir if traces_dir is not None and pack_name in platforms else None
    rows, summary = predict_rows(measured, timings, traced, program, pack_name)
    others, programs = [], []
    for name, m in runs:
        s = summary if m is measured else predict_rows(m, timings, None, program)[1]
        if m is not measured:
            others.append({"run": name, "date": m["date"], "gpu": m["gpu"], "summary": s,
                           "measured_s": {f"{r['model']}/{r['batch']}": r["measured_s"] for r in m["rows"]}})
        # the same rows with the transformer synthesiser's other program for the GPT rows
        programs.append({"run": name, "by_program": {program: {p: s[p] for p in timings},
                                                      other: predict_rows(m, timings, None, other)[1]}})
    return {"gpu": gpu, "pack": pack_name, "measured": {k: v for k, v in measured.items() if k != "rows"},
            "run": first_name, "platforms": platforms, "summary": summary, "rows": rows, "other_runs": others,
            "gpt_program": program, "program_comparison": programs,
            "kernel_counts": kernel_counts(traces_dir, program) if traces_dir is not None else [],
            "traces_dir": repo_relative(traces_dir) if traces_dir is not None else None}


def predict(args) -> None:
    """``--predict``: the stored runs of every GPU (or the measured files given, of ``--gpu``); writes
    ``OUT.md`` and ``OUT.json``."""
    try:
        if args.predict:
            runs = {args.gpu: [(Path(f).name, read_measured(Path(f))) for f in args.predict]}
        else:
            stored = load_runs(args.data)
            runs = {g: [(r["name"], r) for r in stored if r["gpu_kind"] == g] for g in GPUS}
    except ValueError as exc:  # a missing, truncated or foreign file: one line, exit 2 (no results written)
        fail(str(exc))
    out = {"date": date.today().isoformat(), "gpus": {}}
    for gpu, these in runs.items():
        if not these:
            continue
        traces = Path(args.traces_dir) if args.traces_dir else TRACES / GPUS[gpu]["traces"]
        out["gpus"][gpu] = predict_gpu(gpu, these, args.platforms or list(GPUS[gpu]["platforms"]), traces,
                                       args.gpt_program)
    text = "# End-to-end accuracy on one GPU: predicted vs measured training iterations\n\n" + "\n".join(
        "\n".join("#" + ln if ln.startswith("#") else ln for ln in render(o).splitlines()) + "\n"
        for o in out["gpus"].values())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out).with_suffix(".md"), text)
    atomic_write_text(Path(args.out).with_suffix(".json"), json.dumps(out, indent=1))
    print(text)


def load_runs(path: Path = DATA) -> list[dict]:
    """The stored runs, each a ``--measure`` record with its ``name`` and ``gpu_kind``.

    Raises:
        ValueError: the data set is missing, not JSON, or a run lacks what a prediction needs.
    """
    try:
        runs = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read the stored GPU runs {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"stored GPU runs {path} are not JSON (line {exc.lineno})") from None
    if not isinstance(runs, list):
        raise ValueError(f"stored GPU runs {path}: not a list of runs")
    for r in runs:
        _check_measured(r, f"{path}, run {r.get('name') if isinstance(r, dict) else r!r}")
        if r.get("gpu_kind") not in GPUS or not r.get("name"):
            raise ValueError(f"{path}: a run without a name or with gpu_kind {r.get('gpu_kind')!r} "
                             f"(one of {', '.join(GPUS)})")
    return runs


def stored_run(name: str, path: Path = DATA) -> dict:
    """The stored run ``name``; ValueError when there is none."""
    for r in load_runs(path):
        if r["name"] == name:
            return r
    raise ValueError(f"{path}: no stored run {name!r}")


def add_run(path: Path, measured: Path, name: str, gpu: str) -> None:
    """Append the measured file ``measured`` to the data set ``path`` as run ``name`` of GPU ``gpu``."""
    runs = load_runs(path) if Path(path).exists() else []
    if any(r["name"] == name for r in runs):
        raise ValueError(f"{path}: a run named {name!r} is stored already")
    runs.append({"name": name, "gpu_kind": gpu, **read_measured(measured)})
    atomic_write_text(Path(path), json.dumps(runs, indent=1))


def kernel_counts(traces_dir: str | Path, program: str = GPT_PROGRAM) -> list[dict]:
    """GPU kernels per iteration: the synthesised graph vs the captured trace, per traced model.

    On a host-bound step every kernel costs the host a launch, so a program with more kernels than
    the synthesiser emits (eager PyTorch vs Megatron's fused kernels) is under-predicted.
    """
    from predictor.sources.traces.load import load_traces
    from predictor.whatif.annotate import annotate

    out = []
    for model in ROWS:
        trace = trace_for(model, traces_dir)
        if trace is None:
            continue
        batch = _trace_batch(trace)
        g = graph_for(model, batch, program)
        tg = annotate(load_traces(trace)).graphs()[0]
        frame = tg.tasks_frame()
        traced = int((tg.is_gpu() & (frame["kind"] != "gpu_gap").to_numpy()).sum())
        out.append({"model": model, "batch": batch, "synthesised": int(g.is_gpu().sum()), "traced": traced})
    return out


def _trace_batch(trace: Path) -> int:
    """The batch of a committed trace archive, from its name (``traces-{model}-b{B}.tar.gz``)."""
    return int(trace.name.split("-b")[-1].split(".")[0])


def trace_for(model: str, folder: str | Path) -> Path | None:
    """The captured trace of ``model`` in ``folder`` (``traces-{model}-b{B}.tar.gz``), if any."""
    hits = sorted(Path(folder).glob(f"traces-{model}-b*.tar.gz"))
    return hits[0] if hits else None


def render(out: dict) -> str:
    m = out["measured"]
    ps = out["platforms"]
    gpu, pack = out.get("gpu", "h100"), out.get("pack", "h100")
    lines = [
        f"# One {gpu.upper()}",
        "",
        f"Run `{out.get('run', '?')}` of `{repo_relative(DATA)}`, measured {m['date']} on {m['gpu']} (torch {m['torch']}, CUDA {m['cuda']}; TF32 off), "
        f"{m['warmup']} warm-up + {m['iters']} timed iterations x {m['passes']} interleaved passes, CUDA events "
        "per iteration; measured = median of the pass medians. Predicted from the specs "
        "(`experiments/e2e_gpu.py --predict`), device-mode graphs, as the pace of the measured loop (no "
        "synchronisation per step: the larger of the host's span and the busiest stream's kernel time, "
        "`Timeline.loop_pace_s`). A calibrated pack's host overheads are the "
        "device host model (T1..T5 x its calibration step's unprofiled / profiled ratio, plus `step_s` per step: "
        "`predictor/timing/calibration/step_graph.py`); the catalog's are as published.",
        "",
        "Platforms: " + "; ".join(f"`{p}` = {out['summary'][p]['source']}" for p in ps),
        "",
        "| model | batch | measured ms | p10-p90 ms | pass spread % | "
        + " | ".join(f"{p} ms | {p} err % | {p} kernel-sum ms" for p in ps) + " |",
        "|---|---:|---:|---:|---:|" + "---:|---:|---:|" * len(ps),
    ]
    for r in out["rows"]:
        cells = [r["model"], str(r["batch"]), f"{r['measured_s'] * 1e3:.3f}",
                 f"{r['p10_s'] * 1e3:.3f}-{r['p90_s'] * 1e3:.3f}", f"{r['pass_spread_pct']:.1f}"]
        for p in ps:
            cells += [f"{r[f'predicted_s[{p}]'] * 1e3:.3f}", f"{r[f'error_pct[{p}]']:.1f}",
                      f"{r[f'kernel_sum_s[{p}]'] * 1e3:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| predictor | geomean abs error % | max abs error % | rows |", "|---|---:|---:|---:|"]
    for p, s in out["summary"].items():
        lines.append(f"| {p} | {s['geomean_pct']:.1f} | {s['max_pct']:.1f} | {s['n']} |")
    traced = [r for r in out["rows"] if "trace_predicted_s" in r]
    if traced:
        lines += [
            "", "## From captured traces (what-if batch size)", "",
            f"Each model's trace (`{out.get('traces_dir', f'benchmarks/traces/{gpu}')}/`, captured with `tuner.capture` at one batch in the same "
            "machine as the measurements, 3 profiled steps, then 15 unprofiled ones) predicted at every measured "
            f"batch with `tuner predict TRACE --set batch_size=B --platform {pack}`: the profiled step corrected to the "
            "capture's unprofiled iterations, changed kernels re-timed by the pack (anchored on the measured ones), "
            "and the loop's pace the larger of the host's step and the busiest stream's work.",
            "",
            "| model | batch | trace | capture's unprofiled ms | predicted ms | measured ms | error % |",
            "|---|---:|---|---:|---:|---:|---:|",
        ]
        for r in traced:
            lines.append(f"| {r['model']} | {r['batch']} | {r['trace']} | {r['trace_unprofiled_s'] * 1e3:.3f} | "
                         f"{r['trace_predicted_s'] * 1e3:.3f} | {r['measured_s'] * 1e3:.3f} | "
                         f"{r['trace_error_pct']:.1f} |")
    if out.get("program_comparison"):
        progs = list(out["program_comparison"][0]["by_program"])
        lines += ["", "## The GPT rows' program: eager (what was measured) vs Megatron's fused kernels", "",
                  f"Rows above: `{out['gpt_program']}`. All 13 rows of every measured run, geomean / max % "
                  "(only the GPT rows differ):", "",
                  "| measured run | " + " | ".join(f"{p} ({prog})" for prog in progs for p in ps) + " |",
                  "|---|" + "---:|" * (len(progs) * len(ps))]
        for c in out["program_comparison"]:
            cells = [f"{c['by_program'][prog][p]['geomean_pct']:.1f} / {c['by_program'][prog][p]['max_pct']:.1f}"
                     for prog in progs for p in ps]
            lines.append(f"| {c['run']} | " + " | ".join(cells) + " |")
    if out.get("kernel_counts"):
        lines += ["", "## Kernels per iteration: synthesised vs traced", "",
                  "A host-bound step pays one launch (T4, plus T5 between launches) per kernel and T1-T3 per op. "
                  f"GPT rows: the transformer synthesiser's `{out.get('gpt_program', 'eager')}` program (Megatron's "
                  "fused program emits 79 kernels for the small GPT at batch 8, 143 for the bf16 GPT at batch 4). "
                  "The MLP and DLRM synthesisers emit eager PyTorch's ops; in device mode every synthesiser also emits "
                  "the kernel-less host work (autograd nodes, views, `zero_grad`) and the step's framework cost "
                  "(the table counts the synthesised GPU kernels against the traced ones).", "",
                  "| model | batch | kernels, synthesised | kernels, traced |", "|---|---:|---:|---:|"]
        for k in out["kernel_counts"]:
            lines.append(f"| {k['model']} | {k['batch']} | {k['synthesised']} | {k['traced']} |")
    if out.get("other_runs"):
        moved, steady = [], []
        for r in out["rows"]:
            vals = [r["measured_s"]] + [o["measured_s"][f"{r['model']}/{r['batch']}"] for o in out["other_runs"]
                                        if f"{r['model']}/{r['batch']}" in o["measured_s"]]
            pct = 100 * (max(vals) / min(vals) - 1)
            moved.append(pct)
            if r["pass_spread_pct"] < 2.0:
                steady.append(pct)
        lines += ["", "## The same rows measured on other machine instances of the same kind", "",
                  f"Across the {len(out['other_runs']) + 1} runs a row's measured time moved by up to "
                  f"{max(moved):.0f} % (median {np.median(moved):.0f} %): the hosts of the lent machines differ, "
                  "and the small-batch rows are host-bound"
                  + (f"; the rows whose passes agree within 2 % (GPU-bound) moved by at most {max(steady):.1f} %."
                     if steady else "."), "",
                  "| measured run | " + " | ".join(f"{p} geomean / max %" for p in ps) + " |",
                  "|---|" + "---:|" * len(ps)]
        for o in out["other_runs"]:
            lines.append(f"| {o['run']} | " + " | ".join(
                f"{o['summary'][p]['geomean_pct']:.1f} / {o['summary'][p]['max_pct']:.1f}" for p in ps) + " |")
    lines += ["", "Configurations: " + "; ".join(f"{k}: {_config(k)}" for k in ROWS), ""]
    return "\n".join(lines)


def read_measured(path: Path) -> dict:
    """A measured file of ``--measure``.

    Raises:
        ValueError: the file is missing, not JSON, or lacks the fields a prediction needs (one line
            naming the problem).
    """
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read measured file {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"measured file {path} is not JSON (line {exc.lineno}): truncated or foreign?") from None
    return _check_measured(data, f"measured file {path}")


def _check_measured(data: object, what: str) -> dict:
    """``data`` when it is a ``--measure`` record (rows with model, batch, measured_s; date and gpu filled in
    as ``?`` when absent); ValueError naming ``what`` otherwise."""
    rows = data.get("rows") if isinstance(data, dict) else None
    need = ("model", "batch", "measured_s")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and all(k in r for k in need) for r in rows):
        raise ValueError(f"{what} has no rows with {', '.join(need)}: not written by `e2e_gpu.py --measure`")
    for k in ("date", "gpu"):
        data.setdefault(k, "?")
    return data


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measure", action="store_true", help="measure on the GPU (writes --out)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="e2e_measured.json", help="--measure: the measured file")
    ap.add_argument("--traces", default=None, help="--measure: folder for one captured trace per model")
    ap.add_argument("--models", nargs="+", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--trace-batches", nargs="*", default=None, metavar="MODEL=BATCH",
                    help="batch of a model's trace (default: TRACE_BATCH)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--add", type=Path, default=None, metavar="FILE",
                    help="store the measured FILE in --data as run --name of --gpu (no prediction)")
    ap.add_argument("--name", default=None, help="--add: the run's name, e.g. h100-5 (its traces: benchmarks/traces/NAME)")
    ap.add_argument("--predict", nargs="*", default=None, metavar="FILE",
                    help="predict the stored runs of every GPU, or the measured FILEs of --gpu (the first row by "
                         "row, the others summarised)")
    ap.add_argument("--gpu", choices=list(GPUS), default="h100",
                    help="the GPU of the measured files (--predict FILE, --add): platforms and traces")
    ap.add_argument("--platforms", nargs="+", default=None,
                    help="catalog names or packs (default: the GPU's catalog entry and asset packs)")
    ap.add_argument("--gpt-program", choices=["eager", "megatron"], default=GPT_PROGRAM,
                    help="the transformer synthesiser's program for the GPT rows (the measured GPTs are eager)")
    ap.add_argument("--data", type=Path, default=DATA, help="the stored runs (a JSON data set)")
    ap.add_argument("--results", type=Path, default=OUT, help="--predict: results path without suffix")
    ap.add_argument("--traces-dir", default=None,
                    help="--predict: captured traces to predict the first run's rows from too "
                         "(default benchmarks/traces/ of the GPU's first stored run)")
    args = ap.parse_args(argv)
    if args.add is not None:
        if not args.name:
            ap.error("--add needs --name")
        try:
            add_run(args.data, args.add, args.name, args.gpu)
        except ValueError as exc:
            fail(str(exc))
        print(f"stored {args.add} as run {args.name} ({args.gpu}) in {repo_relative(args.data)}")
    if args.measure:
        measure(args)
    if args.predict is not None:
        args.out = args.results
        predict(args)
    if not (args.measure or args.predict is not None or args.add is not None):
        ap.error("give --measure, --add FILE or --predict [FILE ...]")


if __name__ == "__main__":
    main()
