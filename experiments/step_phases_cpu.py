"""Which phase of a CPU training step the end-to-end error sits in: forward, backward, optimizer.

For the MLP and GPT rows of ``experiments/e2e_cpu.py`` (one process, one thread, no profiler) each step is
cut by wall-clock marks into

* ``forward``: ``zero_grad`` and the forward pass through the loss;
* ``backward``: ``loss.backward()``;
* ``optimizer``: the optimizer step (GPT: the gradient norm and fused Adam; MLP: SGD),

and each phase's median over the timed steps is set against the same phase of the simulated timeline of
the row's synthesised host-mode graph (a task belongs to the phase of the first non-host task at or after
it, so each op's host cost goes with its kernel). The configurations' passes are interleaved, and the
asset pack's own GEMM and memcpy shapes are re-timed before and after (``measure_env.gemm_drift`` /
``memory_drift``): on the shared VM the whole machine drifts by tens of percent between spells, so each
phase's error is also given relative to its step's error (``phase - step``, points): a phase that carries
a model gap stands out from the spell's level that every phase shares.

Nothing here feeds a prediction. Run:

    flock /tmp/tuner-measure.lock python experiments/step_phases_cpu.py [--platform PACK] [--out PATH]

(writes ``experiments/results/step_phases_cpu.{md,json}``; about 2 minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.common import write_results  # noqa: E402

#: (model, batch) rows of experiments/e2e_cpu.py
CONFIGS = (("mlp", 64), ("mlp", 1024), ("gpt", 2), ("gpt", 8))
PHASES = ("forward", "backward", "optimizer")
#: the first task of the backward / optimizer phase in each synthesised graph (task names)
PHASE_STARTS = {"mlp": ("nll_loss_bwd", "sgd."), "gpt": ("loss.ones_like", "grad_norm.")}
#: host-only tasks (per-op overheads) go with the task after them
HOST_TASKS = ("T1", "T2", "T3", "T4", "T5")


def task_phases(names: list[str], model: str) -> np.ndarray:
    """Phase index (0 forward, 1 backward, 2 optimizer) of every task of a synthesised step, in task order."""
    bwd, opt = PHASE_STARTS[model]
    own = np.full(len(names), -1, dtype=np.int64)
    phase = 0
    for i, n in enumerate(names):
        if n.startswith(opt):
            phase = 2
        elif phase == 0 and n.startswith(bwd):
            phase = 1
        if n not in HOST_TASKS:
            own[i] = phase
    out = own.copy()
    nxt = int(own[own >= 0][-1]) if (own >= 0).any() else 0
    for i in range(len(names) - 1, -1, -1):  # a host task takes the phase of the next kernel task
        if own[i] >= 0:
            nxt = int(own[i])
        else:
            out[i] = nxt
    return out


def predicted_phases(graph, timing, model: str) -> tuple[np.ndarray, float]:
    """(seconds per phase, the simulated iteration) of the ``model`` row's host-mode graph: each phase's span on
    the one thread, from the end of the previous phase's last task to the end of its own last task."""
    from predictor.simulate import simulate

    tl = simulate(graph, timing)
    ph = task_phases([str(n) for n in np.asarray(graph.names)[graph.name]], model)
    ends = [float(tl.end[ph == k].max()) if (ph == k).any() else 0.0 for k in range(len(PHASES))]
    spans = np.diff([0.0, *np.maximum.accumulate(ends)])
    spans[-1] += float(tl.iteration_s) - max(ends)  # anything after the last task (none in host mode)
    return spans, float(tl.iteration_s)


def phase_step(model: str, batch: int) -> Callable[[], tuple[float, float, float]]:
    """A closure running one training step of the e2e row (``e2e_cpu.mlp_step`` / ``gpt_step``) and returning
    its phases' wall seconds."""
    from experiments.e2e_cpu import GPT, MLP, gpt_step, mlp_step

    parts = mlp_step(dataclasses.replace(MLP, batch_size=batch)) if model == "mlp" else gpt_step(GPT, batch)

    def step() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        parts.zero_grad()
        loss = parts.forward()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        parts.optimizer()
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2

    return step


def measure(configs, passes: int, warmup: int, iters: int, log=print) -> dict[tuple[str, int], np.ndarray]:
    """Per configuration the phases of every timed step, seconds (``passes`` interleaved passes)."""
    import torch

    torch.set_num_threads(1)
    steps = {c: phase_step(*c) for c in configs}
    out: dict[tuple[str, int], list] = {c: [] for c in configs}
    for p in range(passes):
        for c, step in steps.items():
            for _ in range(warmup):
                step()
            out[c] += [step() for _ in range(iters)]
        log(f"  pass {p + 1} of {passes} done")
    return {c: np.asarray(v) for c, v in out.items()}


def rows_for(measured: dict, timing) -> list[dict]:
    """One row per configuration and phase: measured median, predicted, error, error less the step's."""
    rows = []
    from experiments.e2e_cpu import row_graph

    for (model, batch), phases in measured.items():
        pred, _ = predicted_phases(row_graph(model, batch), timing, model)
        med = np.median(phases, axis=0)
        step_m, step_p = float(np.median(phases.sum(axis=1))), float(pred.sum())
        step_err = (step_p / step_m - 1.0) * 100.0
        for k, name in enumerate(PHASES):
            err = (pred[k] / med[k] - 1.0) * 100.0
            rows.append({"model": model, "batch": batch, "phase": name, "measured_s": float(med[k]),
                         "predicted_s": float(pred[k]), "error_pct": float(err),
                         "vs_step_pts": float(err - step_err)})
        rows.append({"model": model, "batch": batch, "phase": "step", "measured_s": step_m, "predicted_s": step_p,
                     "error_pct": float(step_err), "vs_step_pts": 0.0})
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# A CPU training step by phase: predicted vs measured", "",
             f"{meta['date']}; asset pack `{meta['platform']}`; {meta['passes']} interleaved passes of "
             f"{meta['iters']} timed steps per configuration, one thread, no profiler. The pack's own GEMM / memcpy "
             f"shapes re-timed before and after: GEMMs x{meta['gemm_drift']:.2f}, memcpy x{meta['memory_drift']:.2f} "
             "their calibrated time (above 1: the machine is slower than when the pack was calibrated). "
             f"Reproduce: `flock /tmp/tuner-measure.lock python experiments/step_phases_cpu.py {meta['args']}`.", "",
             "`error` = predicted / measured - 1; `vs step` = the phase's error less its step's (points): what a phase "
             "carries beyond the spell's level.", "",
             "| model | batch | phase | measured ms | predicted ms | error % | vs step (points) |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['phase']} | {r['measured_s'] * 1e3:.2f} | "
                     f"{r['predicted_s'] * 1e3:.2f} | {r['error_pct']:+.1f} | {r['vs_step_pts']:+.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", default="cpu-local-zen4", help="asset pack that predicts (name or folder)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "step_phases_cpu")
    args = ap.parse_args(argv)

    from experiments.common import fail
    from experiments.e2e_cpu import resolve
    from experiments.measure_env import gemm_drift, memory_drift
    from predictor.timing.platforms import UnknownPlatformError
    from predictor.timing.platforms.assets import AssetPackError

    try:
        timing, _, pack_path = resolve(args.platform)
    except (AssetPackError, UnknownPlatformError) as exc:
        fail(f"--platform {args.platform}: {exc}")
    drift0 = (gemm_drift(pack_path).get("ratio_geomean", float("nan")),
              memory_drift(pack_path).get("ratio_geomean", float("nan")))
    measured = measure(CONFIGS, args.passes, args.warmup, args.iters)
    drift1 = (gemm_drift(pack_path).get("ratio_geomean", float("nan")),
              memory_drift(pack_path).get("ratio_geomean", float("nan")))
    rows = rows_for(measured, timing)
    meta = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "platform": args.platform,
            "passes": args.passes, "iters": args.iters, "args": " ".join(argv),
            "gemm_drift": float(np.nanmean([drift0[0], drift1[0]])),
            "memory_drift": float(np.nanmean([drift0[1], drift1[1]]))}
    write_results(args.out, {"meta": meta, "rows": rows}, markdown(rows, meta))
    print(markdown(rows, meta))


if __name__ == "__main__":
    main()
