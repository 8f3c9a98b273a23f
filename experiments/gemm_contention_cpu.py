"""Do two ranks' GEMMs slow each other on this host, by working set? (the 2-rank DLRM's dense part).

The calibration's compute probe (``predictor.timing.calibration.contention``) times a 384^3 GEMM, which fits
in cache; the e2e DLRM's top MLP (``top0``: 2112 -> 256) streams 4-17 MB of activations per rank. Two
spawned processes (1 thread each) follow the probe's slot schedule — each alone, then both — for the
in-cache GEMM and the DLRM's own shapes, ``--repeats`` times.

    flock /tmp/tuner-measure.lock python experiments/gemm_contention_cpu.py --out experiments/results/avx2/gemm_contention_cpu

Writes ``OUT.json`` (raw per-process [alone_s, together_s] per round) and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: name -> (m, k, n) of ``mm(m x k, k x n)``
SHAPES = {"384^3 (in cache)": (384, 384, 384), "top0 b512: 512x2112x256": (512, 2112, 256),
          "top0 b2048: 2048x2112x256": (2048, 2112, 256), "bwd dgrad b2048: 2048x256x2112": (2048, 256, 2112)}
SLOT, ROUNDS = 0.5, 6


def worker(rank: int, start: float, q) -> None:
    """One probe process: the shared slot schedule over every shape
    (:func:`predictor.timing.calibration.contention.slot_schedule`); puts (rank, results) on ``q``."""
    import torch

    from predictor.timing.calibration.contention import slot_schedule

    torch.set_num_threads(1)
    calls = {}
    for k, (m, kk, n) in SHAPES.items():
        x, y = torch.rand(m, kk), torch.rand(kk, n)

        def call(x=x, y=y) -> None:
            torch.mm(x, y)

        call()
        calls[k] = call
    q.put((rank, slot_schedule(calls, start, SLOT, rank, 2, ROUNDS)))


def measure() -> dict:
    """One probe run: shape -> per process, per round, ``[alone_s, together_s]``."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start = time.time() + 8
    ps = [ctx.Process(target=worker, args=(r, start, q)) for r in range(2)]
    for p in ps:
        p.start()
    out = dict(q.get() for _ in ps)
    for p in ps:
        p.join()
    return {k: [out[0][k], out[1][k]] for k in SHAPES}


def ratios(run: dict) -> dict[str, dict[str, float]]:
    """Per shape: median alone seconds, and the median over rounds of the mean / slowest process's
    together over alone (as ``contention.factors`` does for the compute class)."""
    res = {}
    for k, procs in run.items():
        a = np.array([[x[0] for x in p] for p in procs])
        t = np.array([[x[1] for x in p] for p in procs])
        res[k] = {"alone_s": float(np.median(a)), "mean": float(np.median((t / a).mean(0))),
                  "slowest": float(np.median((t / a.mean(0)).max(0)))}
    return res


def main() -> None:
    from experiments.common import write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True, help="output stem (OUT.md, OUT.json)")
    a = ap.parse_args()
    if a.repeats < 1:
        from experiments.common import fail

        fail(f"--repeats {a.repeats}: must be >= 1")
    runs = [measure() for _ in range(a.repeats)]
    scored = [ratios(r) for r in runs]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = "flock /tmp/tuner-measure.lock python experiments/gemm_contention_cpu.py " + " ".join(sys.argv[1:])
    lines = ["# GEMM contention by working set: two processes alone / at once", "",
             f"{when}; 2 processes x 1 thread, {ROUNDS} rounds of {SLOT} s slots per shape, {a.repeats} runs. "
             f"Reproduce: `{cmd}`", "",
             "| shape | run | alone ms | at once / alone: mean of processes | slowest process |", "|---|---:|---:|---:|---:|"]
    for k in SHAPES:
        for i, r in enumerate(scored):
            lines.append(f"| {k} | {i + 1} | {r[k]['alone_s'] * 1e3:.2f} | x{r[k]['mean']:.3f} | x{r[k]['slowest']:.3f} |")
    write_results(a.out, {"measured_at": when, "command": cmd, "runs": runs, "ratios": scored}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
