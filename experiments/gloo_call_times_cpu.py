"""Single gloo calls on two local ranks, each timed on its own: the tick waits behind the collectives' noise.

Why (session 44): the calibration kept, per (kind, size), the median of its passes' medians of *batch means*
(~7 back-to-back small calls per batch), and on the 2-vCPU VM those labels jumped between ~0.35 and ~1.5 ms
from pass to pass. Here two ranks make ``--calls`` back-to-back calls of one small collective, every call
timed alone (the slowest rank's time per call), and the report gives:

* the distribution of single calls (quantiles, the share of calls over ``--slow-ms``, where the slow calls
  lie: on a ``CONFIG_HZ=250`` kernel they cluster at 3.5-4.2 ms, one scheduler tick);
* how stable each estimator of a point's time is over disjoint chunks of ``--chunk`` consecutive calls (the
  calls one point gets in a ``--quick --scale 2`` calibration): the old label (median over 6 passes of the
  median of 15 batch means of ``--batch`` calls), the mean per call, and the median of single calls (the label
  since session 44), as the relative standard deviation over the chunks.

    flock /tmp/tuner-measure.lock python experiments/gloo_call_times_cpu.py

writes ``experiments/results/gloo_call_times_cpu.md`` and ``.json`` (about a minute).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import run_gloo_ranks, write_results  # noqa: E402

KINDS = ("all_reduce", "reduce_scatter", "all_to_all")
#: the old label's shape: passes x batches per pass x calls per batch (``--quick --scale 2``)
PASSES, BATCHES = 6, 15


def _probe(dist, rank: int, cfg: dict) -> list[dict]:
    """Every kind in turn: warm-up, one barrier, ``calls`` single calls; the slowest rank's time per call."""
    import torch

    world = dist.get_world_size()
    elems = max(world, int(cfg["bytes"]) // 4)
    x, y = torch.ones(elems), torch.empty(elems // world)
    z = torch.empty(elems)
    ops = {"all_reduce": lambda: dist.all_reduce(x),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(y, x),
           "all_to_all": lambda: dist.all_to_all_single(z, x)}
    rows = []
    for kind in cfg["kinds"]:
        fn = ops[kind]
        for _ in range(50):
            fn()
        own = np.empty(int(cfg["calls"]))
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(own.size):
            fn()
            t1 = time.perf_counter()
            own[i], t0 = t1 - t0, t1
        slowest = torch.tensor(own, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        rows.append({"kind": kind, "seconds": slowest.numpy().tolist()})
    return rows if rank == 0 else []


def old_label(calls: np.ndarray, batch: int) -> float:
    """The label before session 44 from ``PASSES x BATCHES x batch`` consecutive calls: the median over passes
    of each pass's median batch mean (seconds per call)."""
    per_pass = calls[: PASSES * BATCHES * batch].reshape(PASSES, BATCHES, batch).mean(axis=2)
    return float(np.median(np.median(per_pass, axis=1)))


def summarise(calls: np.ndarray, chunk: int, batch: int, slow_s: float) -> dict:
    """Distribution of ``calls`` (seconds) and each estimator's relative std over disjoint ``chunk``-call chunks."""
    chunks = calls[: calls.size // chunk * chunk].reshape(-1, chunk)
    estimators = {
        f"median over {PASSES} passes of the median of {BATCHES} means of {batch} calls (before)":
            [old_label(c, batch) for c in chunks] if chunk >= PASSES * BATCHES * batch else [],
        "mean per call": chunks.mean(axis=1).tolist(),
        "median of single calls (since session 44)": np.median(chunks, axis=1).tolist(),
    }
    slow = calls[calls > slow_s]
    return {
        "calls": int(calls.size),
        "quantiles_ms": {str(q): float(np.quantile(calls, q) * 1e3) for q in (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)},
        "mean_ms": float(calls.mean() * 1e3),
        "slow_share": float((calls > slow_s).mean()),
        "slow_quartiles_ms": [float(v * 1e3) for v in np.quantile(slow, [0.25, 0.5, 0.75])] if slow.size else [],
        "chunks": int(chunks.shape[0]),
        "estimators": {name: {"values_ms": [v * 1e3 for v in vals],
                              "rel_std_pct": float(100 * np.std(vals) / np.mean(vals)) if len(vals) > 1 else None}
                       for name, vals in estimators.items()},
    }


def markdown(result: dict) -> str:
    a = result["args"]
    lines = [
        "# Single gloo calls on two local ranks",
        "",
        f"{result['date']}; {a['calls']} back-to-back calls of each collective at {a['bytes']} bytes per rank, every call "
        "timed alone (the slowest rank's time per call), one torch thread per rank, unpinned. Reproduce: "
        "`flock /tmp/tuner-measure.lock python experiments/gloo_call_times_cpu.py`.",
        "",
        f"| kind | median ms | p90 ms | p99 ms | mean ms | calls over {a['slow_ms']} ms | their quartiles ms |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for kind, s in result["kinds"].items():
        q = s["quantiles_ms"]
        lines.append(f"| {kind} | {q['0.5']:.3f} | {q['0.9']:.3f} | {q['0.99']:.3f} | {s['mean_ms']:.3f} | "
                     f"{100 * s['slow_share']:.1f} % | {' / '.join(f'{v:.2f}' for v in s['slow_quartiles_ms'])} |")
    lines += ["", f"Each estimator of one point's time over disjoint chunks of {a['chunk']} consecutive calls (the calls "
              "a point gets in a `--quick --scale 2` calibration): relative standard deviation over the chunks.", "",
              "| kind | chunks | " + " | ".join(next(iter(result["kinds"].values()))["estimators"]) + " |",
              "|---|---:|" + "---:|" * len(next(iter(result["kinds"].values()))["estimators"])]
    for kind, s in result["kinds"].items():
        cells = [f"{e['rel_std_pct']:.1f} %" if e["rel_std_pct"] is not None else "-" for e in s["estimators"].values()]
        lines.append(f"| {kind} | {s['chunks']} | " + " | ".join(cells) + " |")
    lines += ["", "A slow call waits for the next scheduler tick (4 ms at `CONFIG_HZ=250`). A batch mean mixes in a varying "
              "number of such waits, so the median of batch means jumps with the local rate of waits; the median of "
              "single calls stays on the fast mode. What a run of many calls pays on average is the mean: the "
              "calibration records it per point (`call_mean_s`) and the platform adds each kind's median gap "
              "(`collective_wait_s`) to a step's collectives.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=6300, help="timed calls per kind (>= --chunk)")
    ap.add_argument("--bytes", type=int, default=64, help="message bytes per rank (>= 8)")
    ap.add_argument("--chunk", type=int, default=630, help="calls per chunk of the estimator comparison (>= 2)")
    ap.add_argument("--batch", type=int, default=7, help="calls per batch mean of the old label (>= 1)")
    ap.add_argument("--slow-ms", type=float, default=2.0, help="a call over this many ms counts as slow")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "gloo_call_times_cpu")
    a = ap.parse_args(argv)
    if a.bytes < 8 or a.chunk < 2 or a.batch < 1 or a.slow_ms <= 0 or a.calls < a.chunk:
        ap.error("need --calls >= --chunk >= 2, --bytes >= 8, --batch >= 1 and --slow-ms > 0")  # exit 2
    rows = run_gloo_ranks(_probe, {"kinds": KINDS, "calls": a.calls, "bytes": a.bytes})
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
              "kinds": {r["kind"]: summarise(np.asarray(r["seconds"]), a.chunk, a.batch, a.slow_ms * 1e-3)
                        for r in rows}}
    write_results(a.out, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
