"""Host contention: how much K processes of one host slow each other's kernels (CPU platforms).

Distributed training on one CPU host runs K rank processes side by side; they share the
last-level cache and the memory controllers, so a bandwidth-bound kernel runs slower while the
other ranks run theirs than it does alone (which is how every microbenchmark times it).
Measured on this 2-core VM: two processes doing embedding-bag forward + backward at once take
1.56x as long as one alone, a streaming multiply 1.74x, a GEMM 0.94-1.0x.

:func:`measure_host_contention` starts K processes (:mod:`.processes`) that follow one
schedule of fixed time slots: for each probe kernel and each of ``rounds`` rounds, K slots in
which one process runs the kernel while the others sleep, then one slot in which all run it.
A synchronous job runs at the pace of its slowest rank (every all-to-all and all-reduce waits for
it), so a class's factor is, per round, the *slowest* process's time all at once over the
processes' mean time alone, and then the median over rounds. Measured on this VM (two processes
of one program, 10 ms of MLP work per step): alone 10.3 and 11.1 ms, all at once 10.6 and 12.0 ms —
the median process ratio (x1.06) missed both the contention of the slower process and the
8 % between the two cores; a lockstep run (work + a one-float all-reduce) took 12.7 ms on both.
The embedding class is the exception: its time alone differs by up to 2x between two processes of
the same program (where the allocator placed the table, huge pages or not), which says nothing
about the host, so each process compares its own two medians; and since the ranks hold different
tables, whose slowest rank the simulator already waits for at each collective, the factor is the
*mean* of the processes' ratios (the slowest process's would count the noise's maximum twice: see
:func:`factors`).

* ``embedding``: embedding-bag forward + sparse backward + SGD row update on a table larger than
  the LLC (random rows);
* ``memory``: an in-place multiply over a buffer twice the LLC (streaming);
* ``compute``: a float32 GEMM whose operands fit in cache.

``tuner calibrate --world-size K`` on a CPU stores the factors in the platform
(``Platform.host_contention[K]``); :class:`~predictor.timing.kernels.timing.ModelTiming` multiplies the
predicted time of every memory-bound, embedding and compute task of a K-rank graph by them (CPU
platforms only: accelerators have their own memory).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from predictor.timing.calibration.processes import run_module_processes
from predictor.timing.platforms.schema import KERNEL_CLASSES

__all__ = ["CLASSES", "CONTENTION_ESTIMATOR", "ESTIMATORS", "ContentionError", "factors", "measure_host_contention", "probe_host_contention",
           "slot_schedule"]

#: kernel classes a factor is measured for
CLASSES: tuple[str, ...] = KERNEL_CLASSES
#: seconds of one time slot
SLOT_S = 1.0
#: how a round's per-process ratios become one factor (see :func:`factors`)
ESTIMATORS: tuple[str, ...] = ("slowest", "mean", "slowest-dense")
#: the estimator ``tuner calibrate`` stores factors by (older packs: ``slowest``; a refit estimates them again)
CONTENTION_ESTIMATOR = "slowest-dense"


class ContentionError(RuntimeError):
    """The probe processes failed or timed out."""


def measure_host_contention(world: int, threads: int = 1, llc_bytes: float = 32 * 2**20,
                            slot_s: float = SLOT_S, rounds: int = 5, timeout_s: float = 300.0,
                            estimator: str = CONTENTION_ESTIMATOR) -> dict[str, float]:
    """Slow-down of each kernel class when ``world`` processes run it at once (>= 1 each; 1 = none).

    Args:
        world: processes sharing the host (the ranks of a local job).
        threads: torch threads per process (as the ranks run).
        llc_bytes: the host's last-level cache, bytes (sizes the probes past it).
        slot_s: seconds of each time slot.
        rounds: alone / together rounds per probe.
        timeout_s: limit for the whole measurement.
        estimator: how a round's per-process ratios become one factor (:func:`factors`).

    Raises:
        ContentionError: a probe process failed.
    """
    if world < 2:
        return dict.fromkeys(CLASSES, 1.0)
    return factors(probe_host_contention(world, threads, llc_bytes, slot_s, rounds, timeout_s), estimator)


def probe_host_contention(world: int, threads: int = 1, llc_bytes: float = 32 * 2**20, slot_s: float = SLOT_S,
                          rounds: int = 5, timeout_s: float = 300.0) -> list[dict[str, list[list[float]]]]:
    """The probe's raw timings: per process, per class, ``[alone_s, together_s]`` (median seconds per
    call in each slot) of each round — what :func:`factors` turns into one factor per class.

    Raises:
        ContentionError: a probe process failed.
    """
    if world < 2:
        raise ValueError("the contention probe needs at least 2 processes")
    return _run_group(world, threads, llc_bytes, slot_s, rounds, timeout_s)


def factors(per_process: list[dict[str, list[list[float]]]], estimator: str = CONTENTION_ESTIMATOR) -> dict[str, float]:
    """Factor per class from each process's ``[alone_s, together_s]`` per round, then the median over rounds.

    A round's ratio is ``together / mean(alone)`` over the processes for ``memory`` and ``compute``, and
    each process's own ``together / alone`` for ``embedding``. ``estimator`` (one of :data:`ESTIMATORS`)
    says how the processes' ratios of a round become one: ``slowest`` takes the slowest process's for
    every class; ``mean`` their mean for every class; ``slowest-dense`` the slowest for ``memory`` and
    ``compute`` (every rank runs the same dense work and waits for the slowest core at the next
    collective; the simulator, which gives the ranks identical dense tasks, cannot see which core that
    is) and the mean for ``embedding`` (the ranks hold different tables and the simulator already waits
    for the slowest rank at each collective: the slowest process's ratio would count the noise's
    maximum a second time — measured against the tables in situ of 30 rank-placements on the AVX2 VM,
    x1.076: slowest x1.121, mean x1.048 over 6 probe runs).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown contention estimator {estimator!r} (one of {', '.join(ESTIMATORS)})")
    out = {}
    for c in CLASSES:
        alone = np.array([[r[0] for r in proc[c]] for proc in per_process])  # (processes, rounds)
        together = np.array([[r[1] for r in proc[c]] for proc in per_process])
        ratio = together / alone if c == "embedding" else together / alone.mean(axis=0)
        slowest = estimator == "slowest" or (estimator == "slowest-dense" and c != "embedding")
        per_round = ratio.max(axis=0) if slowest else ratio.mean(axis=0)
        out[c] = float(np.median(per_round))
    return out


def _run_group(n: int, threads: int, llc_bytes: float, slot_s: float, rounds: int,
               timeout_s: float) -> list[dict[str, list[list[float]]]]:
    """Per process and probe, ``[alone_s, together_s]`` (median seconds per call) of each round."""
    with tempfile.TemporaryDirectory(prefix="tuner-contention-") as tmp:
        start_at = time.time() + 4.0 + 1.5 * n  # time for every process to import torch and build its probes
        outs = [Path(tmp) / f"p{i}.json" for i in range(n)]
        run = run_module_processes(
            "predictor.timing.calibration.contention",
            [[str(start_at), str(threads), str(llc_bytes), str(slot_s), str(o), str(i), str(n), str(rounds)]
             for i, o in enumerate(outs)],
            Path(tmp), timeout_s)
        if not run.ok or not all(o.exists() for o in outs):
            raise ContentionError(f"host contention probe over {n} process(es) failed ({run.why(timeout_s)})")
        return [json.loads(o.read_text()) for o in outs]


def _probes(llc_bytes: float) -> dict:
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    rows, dim, batch, pooling = max(int(8 * llc_bytes / 256), 2**16), 64, 2048, 20
    w = torch.nn.Parameter(torch.rand(rows, dim, generator=g))
    idx = torch.randint(0, rows, (batch * pooling,), generator=g)
    off = torch.arange(0, batch * pooling, pooling)

    def embedding() -> None:
        out = F.embedding_bag(idx, w, off, mode="sum", sparse=True)
        out.sum().backward()
        with torch.no_grad():
            w.add_(w.grad, alpha=-1e-3)
        w.grad = None

    x = torch.rand(int(2 * llc_bytes) // 4, generator=g)

    def memory() -> None:
        x.mul_(1.0000001)

    a, b = torch.rand(384, 384, generator=g), torch.rand(384, 384, generator=g)

    def compute() -> None:
        torch.mm(a, b)

    return {"embedding": embedding, "memory": memory, "compute": compute}


def slot_schedule(probes: dict[str, Callable[[], None]], start_at: float, slot_s: float, rank: int, world: int,
                  rounds: int) -> dict[str, list[list[float]]]:
    """One process's part of the probe's shared slot schedule (every process calls it with the same
    ``start_at``, ``slot_s``, ``world``, ``rounds`` and probe order): for each probe and round, ``world``
    slots in which process r alone runs it, then one slot in which all do. Returns per probe, per round,
    ``[alone_s, together_s]``: the median seconds per call in this process's two active slots."""
    slot = 0

    def run_slot(fn: Callable[[], None], active: bool) -> float:
        nonlocal slot
        begin, end = start_at + slot * slot_s, start_at + (slot + 1) * slot_s - 0.05 * slot_s
        slot += 1
        while time.time() < begin:
            time.sleep(min(0.01, max(begin - time.time(), 0.0)))
        if not active:
            while time.time() < end:
                time.sleep(min(0.01, max(end - time.time(), 0.0)))
            return float("nan")
        times = []
        while time.time() < end or len(times) < 3:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    result: dict[str, list[list[float]]] = {}
    for name, fn in probes.items():
        result[name] = []
        for _ in range(rounds):
            alone = [run_slot(fn, r == rank) for r in range(world)][rank]
            together = run_slot(fn, True)
            result[name].append([alone, together])
    return result


def _probe_main(start_at: float, threads: int, llc_bytes: float, slot_s: float, out: str, rank: int = 0,
                world: int = 1, rounds: int = 3) -> None:
    import torch

    torch.set_num_threads(threads)
    probes = _probes(llc_bytes)
    for fn in probes.values():
        fn()
    Path(out).write_text(json.dumps(slot_schedule(probes, start_at, slot_s, rank, world, rounds)))


if __name__ == "__main__":  # one probe process (see _run_group)
    _probe_main(float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5],
                int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]))
