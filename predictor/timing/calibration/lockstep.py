"""Lockstep loss: how much slower K ranks of one CPU host run when they wait for each other after every
segment of work than when they run the same work side by side (CPU platforms).

The host-contention factors (:mod:`predictor.timing.calibration.contention`) compare a kernel's median call
time with all K processes running at once against alone: they price shared caches, memory and cores.
A data-parallel step does more: at every blocking collective each rank waits for the slowest, so every
segment of work between two collectives costs the *maximum* over the ranks of that segment's time,
tails included (a rank pre-empted, an unpinned rank sharing a core with another's thread for a while,
a collective's thread woken late). The median call time at once sees none of that. Measured on an AVX2
VM (2 gloo ranks, GEMM segments then a 256 KiB all-to-all): a 16 ms segment cost 2-4 ms more per step than
its time at once plus the collective alone.

:func:`probe_lockstep` starts K gloo processes (:mod:`.processes`; unpinned, as a user's job runs) that,
per round, time a segment of GEMM work *free* (all at once, no synchronisation), a one-float all-reduce
alone, and the same segments in *lockstep* (each followed by that all-reduce), the three alternating in
blocks of a few segments so the host's drift falls on them alike.
:func:`lockstep_factor`: per round ``(lockstep period - all-reduce alone) / slowest process's free
segment``, the median over rounds. ``tuner calibrate --world-size K`` stores it as the ``sync`` entry of
``Platform.host_contention[K]``; :class:`~predictor.timing.kernels.timing.ModelTiming` multiplies every kernel
class of a K-rank CPU graph by it on top of the class factors. Times in seconds.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from predictor.timing.calibration.processes import run_module_processes

__all__ = ["LockstepError", "probe_lockstep", "lockstep_factor", "per_round_factors", "SEGMENT_S",
           "LOCKSTEP_ROUNDS"]

#: seconds of one segment of work between two synchronisations (a DLRM step's dense forward or backward
#: at batches 256-1024 on a 2-core host: 5-30 ms)
SEGMENT_S = 0.01
#: segments timed per phase and round
SEGMENTS = 40
#: segments of one protocol before the other's turn
BLOCK = 5
#: rounds by calibration level
LOCKSTEP_ROUNDS = {"tiny": 1, "quick": 5, "full": 8}


class LockstepError(RuntimeError):
    """The probe processes failed or timed out."""


def probe_lockstep(world: int, threads: int = 1, *, rounds: int = 3, segment_s: float = SEGMENT_S,
                   segments: int = SEGMENTS, timeout_s: float | None = None) -> list[dict]:
    """Per process, per round: ``free_s`` (median seconds of a segment, all at once), ``sync_s`` (median
    one-float all-reduce alone) and ``lockstep_s`` (median period of segment + all-reduce). ``world`` >= 2."""
    from predictor.timing.calibration.collectives import free_port

    if world < 2:
        raise ValueError("the lockstep probe needs at least 2 processes")
    timeout_s = timeout_s or 60.0 + rounds * 3 * segments * segment_s * 4
    with tempfile.TemporaryDirectory(prefix="tuner-lockstep-") as tmp:
        outs = [Path(tmp) / f"p{r}.json" for r in range(world)]
        port = free_port()
        run = run_module_processes(
            "predictor.timing.calibration.lockstep",
            [[str(r), str(world), str(port), str(threads), str(segment_s), str(segments), str(rounds), str(o)]
             for r, o in enumerate(outs)], Path(tmp), timeout_s)
        if not run.ok or not all(o.exists() for o in outs):
            raise LockstepError(f"lockstep probe over {world} processes failed ({run.why(timeout_s)})")
        return [json.loads(o.read_text()) for o in outs]


def per_round_factors(per_process: list[dict]) -> np.ndarray:
    """Each round's ``(slowest process's lockstep period - the processes' median all-reduce alone) / slowest
    process's free segment``."""
    free = np.array([p["free_s"] for p in per_process])  # (processes, rounds)
    lock = np.array([p["lockstep_s"] for p in per_process])
    sync = np.array([p["sync_s"] for p in per_process])
    return (lock.max(axis=0) - np.median(sync, axis=0)) / free.max(axis=0)


def lockstep_factor(per_process: list[dict]) -> float:
    """Median over rounds of :func:`per_round_factors` (at least 1: waiting never makes the work faster)."""
    return float(max(1.0, np.median(per_round_factors(per_process))))


def _worker(rank: int, world: int, port: int, threads: int, segment_s: float, segments: int, rounds: int,
            out: str) -> None:
    import torch
    import torch.distributed as dist

    from predictor.files import atomic_write_text

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(rank)
        a, b = torch.rand(256, 256, generator=g), torch.rand(256, 256, generator=g)
        one = torch.zeros(1)
        for _ in range(20):
            torch.mm(a, b)
        t0 = time.perf_counter()
        for _ in range(50):
            torch.mm(a, b)
        calls = torch.tensor([max(1.0, segment_s / ((time.perf_counter() - t0) / 50))])
        dist.all_reduce(calls, op=dist.ReduceOp.MIN)  # every rank the same work
        n = int(calls.item())

        def segment() -> None:
            for _ in range(n):
                torch.mm(a, b)

        res: dict[str, list[float]] = {"free_s": [], "sync_s": [], "lockstep_s": []}
        for _ in range(rounds):
            # the two protocols alternate in blocks of BLOCK segments, so the host's drift (its speed moves
            # 10-20 % within a second) falls on both alike
            free, sync, periods = [], [], []
            for _ in range(max(1, segments // BLOCK)):
                dist.barrier()
                for _ in range(BLOCK):
                    t = time.perf_counter()
                    segment()
                    free.append(time.perf_counter() - t)
                dist.barrier()
                for _ in range(3):
                    t = time.perf_counter()
                    dist.all_reduce(one)
                    sync.append(time.perf_counter() - t)
                dist.barrier()
                segment()
                dist.all_reduce(one)
                last = time.perf_counter()
                for _ in range(BLOCK):
                    segment()
                    dist.all_reduce(one)
                    now = time.perf_counter()
                    periods.append(now - last)
                    last = now
            res["free_s"].append(float(np.median(free)))
            res["sync_s"].append(float(np.median(sync)))
            res["lockstep_s"].append(float(np.median(periods)))
        atomic_write_text(Path(out), json.dumps(res))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # one probe process (see probe_lockstep)
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]),
            int(sys.argv[6]), int(sys.argv[7]), sys.argv[8])
