"""Replay error per trace: measured vs simulated ProfilerStep, with Lin et al.'s kernel-sum baseline beside it.

For every shared trace (``../shared/data/traces``, recorded by others on A100, V100 and RTX 2080 Ti) and
the H100 / H200 captures in ``benchmarks/traces``: the graph is rebuilt from the trace and simulated
(kernels and host compute keep their measured durations; syncs, blocking copies, launches held by a full
queue, collectives and cross-thread / cross-stream waits are recomputed); a step lasts from the simulated
host's start marker to its end marker. The kernel-sum baseline is the busiest GPU stream's summed task
time in the step (a CPU capture: the busiest thread's op time). Each trace also gets the response of the
simulated step to its kernels x1.5 (durations edited, timestamps untouched) and to its host compute x1.5.

Both ways of pricing the collectives of a trace of some ranks only (ResNet-50 rank 0 of 2, the
recommendation model rank 3 of 8): ``modelled`` (the default: each NCCL kernel lasts the collective
model's transfer for its message size, the rest of its measured time is the per-step peer wait) and
``measured`` (the recorded duration, waiting for the absent peers included).

Lumos reports a 3.3 % mean replay error; the target here is mean < 3 %, max < 5 %.

Run: ``python experiments/replay_error.py`` (about a minute). Writes ``experiments/results/replay_error.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, fail, write_results  # noqa: E402

from predictor.metrics import max_abs_pct_error, mean_abs_pct_error  # noqa: E402
from predictor.simulate.replay import replay_graph, scaled_durations  # noqa: E402
from predictor.sources.traces.build import build_graph  # noqa: E402
from predictor.sources.traces.kineto import EventCat  # noqa: E402
from predictor.sources.traces.load import TraceSet, load_traces  # noqa: E402

OUT = REPO / "experiments" / "results" / "replay_error"
SHARED = Path(os.environ.get("TUNER_SHARED", REPO.parent / "shared")) / "data" / "traces"
#: (file, what, part of the target): the small HTA unit-test traces are listed, not scored
SHARED_TRACES = [
    ("resnet50_ddp_a100_rank0of2.kineto.json.gz", "ResNet-50 DDP, A100, rank 0 of 2 (+ET)", True),
    ("dlrm_v100_8ranks.kineto.tar.gz", "DLRM, 8 x V100 (+ET per rank)", True),
    ("mlp21_rtx2080ti.kineto.json.gz", "21-layer MLP, RTX 2080 Ti (+ET)", True),
    ("recsys_a100_rank3of8.kineto.json.gz", "recommendation model, A100, rank 3 of 8", True),
    ("event_sync.kineto.json.gz", "HTA unit test: event sync", False),
    ("event_sync_multistream.kineto.json.gz", "HTA unit test: multi-stream event sync", False),
    ("simple_add_a100.kineto.json.gz", "HTA unit test: simple add (whole trace)", False),
    ("alexnet_a100.kineto.json.gz", "HTA unit test: AlexNet (whole trace)", False),
]
CAPTURES = REPO / "benchmarks" / "traces"


def kernels_scaled(ts: TraceSet, factor: float) -> TraceSet:
    """``ts`` with every kernel, copy and set ``dur`` times ``factor``, timestamps untouched."""
    out = copy.copy(ts)
    out.ranks = []
    for r in ts.ranks:
        kt = copy.copy(r.kineto)
        kt.dur = kt.dur.copy()
        kt.dur[kt.mask(EventCat.KERNEL, EventCat.MEMCPY, EventCat.MEMSET)] *= factor
        rr = copy.copy(r)
        rr.kineto = kt
        out.ranks.append(rr)
    return out


def one_trace(path: Path, what: str, target: bool) -> dict:
    """Per-step rows and per-trace errors of one trace, and its response to the two perturbations."""
    t0 = time.perf_counter()
    ts = load_traces(path)
    rg = build_graph(ts)
    res = replay_graph(rg)
    seconds = time.perf_counter() - t0
    df = res.steps()
    kept = replay_graph(rg, collectives="measured").steps()  # the collectives' recorded durations, waits included
    pred = df["predicted_s"].to_numpy()
    slow_k = replay_graph(build_graph(kernels_scaled(ts, 1.5))).steps()["predicted_s"].to_numpy()
    slow_h = replay_graph(rg, scaled_durations(rg, host=1.5)).steps()["predicted_s"].to_numpy()
    steps = [{"rank": int(r.rank), "step": str(r.name), "measured_s": float(r.measured_s),
              "simulated_s": float(r.predicted_s), "error_pct": float(r.error_pct),
              "kernel_sum_s": float(r.kernel_sum_s), "kernel_sum_error_pct": float(r.kernel_sum_error_pct),
              "peer_wait_s": float(r.peer_wait_s), "simulated_measured_collectives_s": float(k.predicted_s),
              "error_measured_collectives_pct": float(k.error_pct)}
             for r, k in zip(df.itertuples(), kept.itertuples(), strict=True)]
    return {
        "trace": path.name if path.parent == SHARED else str(path.relative_to(REPO)), "what": what,
        "target": target, "steps": steps, "n_steps": len(steps),
        "mean_abs_error_pct": mean_abs_pct_error(df["predicted_s"], df["measured_s"]),
        "max_abs_error_pct": max_abs_pct_error(df["predicted_s"], df["measured_s"]),
        "measured_collectives_mean_abs_error_pct": mean_abs_pct_error(kept["predicted_s"], kept["measured_s"]),
        "measured_collectives_max_abs_error_pct": max_abs_pct_error(kept["predicted_s"], kept["measured_s"]),
        "collectives": res.collectives.as_dict() if res.collectives is not None else None,
        "kernel_sum_mean_abs_error_pct": mean_abs_pct_error(df["kernel_sum_s"], df["measured_s"]),
        "kernel_sum_max_abs_error_pct": max_abs_pct_error(df["kernel_sum_s"], df["measured_s"]),
        "kernels_x1.5_step_ratio": {"min": float((slow_k / pred).min()), "max": float((slow_k / pred).max())},
        "host_x1.5_step_ratio": {"min": float((slow_h / pred).min()), "max": float((slow_h / pred).max())},
        "dependencies": {k: v for k, v in rg.stats.items() if not k.startswith("stream_gap")},
        "tasks": int(rg.graph.n_tasks), "replay_s": seconds,
    }


def _summary(rows: list[dict]) -> dict:
    steps = [s for r in rows for s in r["steps"]]
    meas = [s["measured_s"] for s in steps]
    return {
        "traces": len(rows), "steps": len(steps),
        "mean_abs_error_pct_over_steps": mean_abs_pct_error([s["simulated_s"] for s in steps], meas),
        "mean_of_per_trace_mean_abs_error_pct": float(np.mean([r["mean_abs_error_pct"] for r in rows])),
        "max_abs_error_pct": max_abs_pct_error([s["simulated_s"] for s in steps], meas),
        "measured_collectives_mean_abs_error_pct_over_steps": mean_abs_pct_error(
            [s["simulated_measured_collectives_s"] for s in steps], meas),
        "measured_collectives_max_abs_error_pct": max_abs_pct_error(
            [s["simulated_measured_collectives_s"] for s in steps], meas),
        "kernel_sum_mean_abs_error_pct_over_steps": mean_abs_pct_error([s["kernel_sum_s"] for s in steps], meas),
        "kernel_sum_max_abs_error_pct": max_abs_pct_error([s["kernel_sum_s"] for s in steps], meas),
    }


def markdown(doc: dict) -> str:
    env, s_main, s_cap = doc["environment"], doc["summary_shared_target"], doc["summary_gpu_captures"]
    L = ["# Replay error: measured vs simulated step, kernel-sum baseline beside it\n",
         f"`{env['command']}` — {env['date']}, {env['machine']}, Python {env['python']}.\n",
         "A step is simulated from the rebuilt graph (kernels and host compute keep their measured durations; "
         "every wait is recomputed) and lasts from the simulated host's start marker to its end marker. "
         "Kernel sum: the busiest GPU stream's summed task time in the step (Lin et al.'s baseline). "
         "Lumos reports 3.3 % mean replay error; target mean < 3 %, max < 5 %. Collectives without their "
         "peers' traces (a trace of some ranks only) last their modelled transfer (`--collectives modelled`, "
         "the default); the columns *measured coll.* keep their recorded durations, waits included.\n",
         "| set | traces | steps | mean \\|err\\| % (steps) | mean of per-trace means % | max % | kernel sum: mean % | "
         "kernel sum: max % |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, s in (("shared traces (4 training traces)", s_main), ("H100/H200 captures", s_cap)):
        if s["steps"]:
            L.append(f"| {label} | {s['traces']} | {s['steps']} | {s['mean_abs_error_pct_over_steps']:.3f} | "
                     f"{s['mean_of_per_trace_mean_abs_error_pct']:.3f} | {s['max_abs_error_pct']:.3f} | "
                     f"{s['kernel_sum_mean_abs_error_pct_over_steps']:.1f} | {s['kernel_sum_max_abs_error_pct']:.1f} |")
    L += ["\n## Per trace\n",
          "| trace | what | steps | mean \\|err\\| % | max % | measured coll.: mean % | measured coll.: max % | "
          "peer wait ms/step | kernel sum mean % | kernel sum max % | kernels x1.5: step x | host x1.5: step x |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["traces"]:
        k, h = r["kernels_x1.5_step_ratio"], r["host_x1.5_step_ratio"]
        wait = np.mean([s["peer_wait_s"] for s in r["steps"]]) * 1e3 if r["steps"] else 0.0
        L.append(f"| `{r['trace']}` | {r['what']} | {r['n_steps']} | {r['mean_abs_error_pct']:.3f} | "
                 f"{r['max_abs_error_pct']:.3f} | {r['measured_collectives_mean_abs_error_pct']:.3f} | "
                 f"{r['measured_collectives_max_abs_error_pct']:.3f} | {wait:.2f} | "
                 f"{r['kernel_sum_mean_abs_error_pct']:.1f} | "
                 f"{r['kernel_sum_max_abs_error_pct']:.1f} | {k['min']:.3f}–{k['max']:.3f} | "
                 f"{h['min']:.3f}–{h['max']:.3f} |")
    L.append("\n## Collectives without their peers\n")
    L.append("| trace | priced | kept measured | platform | measured ms | modelled transfer ms | peer wait ms | note |")
    L.append("|---|---:|---:|---|---:|---:|---:|---|")
    for r in doc["traces"]:
        c = r.get("collectives") or {}
        if c.get("priced") or c.get("unpriced"):
            L.append(f"| `{r['trace']}` | {c['priced']} | {c['unpriced']} | {c['platform'] or '-'} | "
                     f"{c['measured_s'] * 1e3:.3f} | {c['priced_s'] * 1e3:.3f} | {c['peer_wait_s'] * 1e3:.3f} | "
                     f"{'; '.join(c['notes'])} |")
    L.append("\nThe HTA unit-test traces and the captures are not part of the target; the two HTA traces without "
             "ProfilerStep are one step spanning the whole trace. Every trace here has its busiest GPU stream busy "
             "under 65 % of the step (host-bound), so kernels x1.5 moves the step little and host x1.5 moves it "
             "most; the GPU-bound case is checked on a hand-made trace in tests/test_replay_perturb.py.\n")
    return "\n".join(L)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-captures", action="store_true", help="only the traces of ../shared/data/traces")
    args = ap.parse_args()
    if not SHARED.is_dir():
        fail(f"no shared traces at {SHARED} (set TUNER_SHARED to the folder holding data/traces)")
    rows = []
    for fname, what, target in SHARED_TRACES:
        rows.append(one_trace(SHARED / fname, what, target))
        print(f"{fname}: mean {rows[-1]['mean_abs_error_pct']:.3f} %, max {rows[-1]['max_abs_error_pct']:.3f} %")
    if not args.no_captures:
        for path in sorted(CAPTURES.glob("*/*.tar.gz")):
            rows.append(one_trace(path, f"{path.parent.name} capture, {path.name.split('.')[0]}", False))
            print(f"{path}: mean {rows[-1]['mean_abs_error_pct']:.3f} %, max {rows[-1]['max_abs_error_pct']:.3f} %")
    env = {"date": dt.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
           "python": platform.python_version(), "command": "python experiments/replay_error.py"}
    doc = {"environment": env,
           "summary_shared_target": _summary([r for r in rows if r["target"]]),
           "summary_gpu_captures": _summary([r for r in rows if r["trace"].startswith("benchmarks/")]),
           "traces": rows}
    write_results(OUT, doc, markdown(doc))
    print(doc["summary_shared_target"])


if __name__ == "__main__":
    main()
