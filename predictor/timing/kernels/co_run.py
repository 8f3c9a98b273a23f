"""Host contention only while the other ranks of the host run: the co-run refinement of the timing.

The host-contention probe (:mod:`predictor.timing.calibration.contention`) measures how much slower a kernel
class runs while K processes run that class *at once*. In a training step the ranks of one host are not
always all busy: a rank whose embedding tables are heavier keeps computing while the others wait at the
all-to-all, and that tail runs alone, at its uncontended speed. Pricing every kernel at the contended speed
over-prices unbalanced placements (on an AVX2 VM the measured sharding runs put the predicted imbalance
against the residual at r = -0.32).

:func:`co_run_durations` prices a kernel as progressing at ``1 / factor`` of its speed while some other rank
of the host runs a kernel and at full speed otherwise: with ``o`` the part of its span during which another
rank is busy, its duration ``d`` solves ``d = alone + o (1 - 1 / factor)``. The spans depend on the
durations, so it iterates from the all-contended durations (each pass one simulation) until no duration
moves by more than ``tol`` (relative), at most ``iters`` passes. Every rank past the first counts as one
co-runner: the factor is the probe's for K processes at once, applied whenever at least one other runs.
Times in seconds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from predictor.graph import ExecutionGraph

__all__ = ["busy_union", "busy_within", "co_run_durations"]


def busy_union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals ``[start, end)`` as sorted, disjoint (starts, ends), seconds."""
    start, end = np.asarray(start, float), np.asarray(end, float)
    if start.size == 0:
        return start, end
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    block = np.cumsum(new) - 1
    ends = np.zeros(int(new.sum()))
    np.maximum.at(ends, block, e)
    return s[new], ends


def _busy_before(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Busy time of the disjoint sorted intervals before each instant ``t`` (seconds)."""
    lengths = ends - starts
    before = np.concatenate([[0.0], np.cumsum(lengths)])
    k = np.searchsorted(starts, t, side="right") - 1  # the last interval starting at or before t
    kk = np.clip(k, 0, None)
    inside = np.clip(t - starts[kk], 0.0, lengths[kk])
    return np.where(k >= 0, before[kk] + inside, 0.0)


def busy_within(starts: np.ndarray, ends: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Seconds of each window ``[t0, t1)`` covered by the disjoint sorted intervals (:func:`busy_union`)."""
    t0, t1 = np.asarray(t0, float), np.asarray(t1, float)
    if starts.size == 0:
        return np.zeros_like(t0)
    return _busy_before(starts, ends, t1) - _busy_before(starts, ends, t0)


def co_run_durations(graph: ExecutionGraph, alone: np.ndarray, factor: np.ndarray, busy: np.ndarray,
                     simulate: Callable, *, iters: int = 4, tol: float = 1e-3) -> np.ndarray:
    """Durations (seconds) of ``graph``'s tasks with each task's contention ``factor`` applied only while
    another rank runs (module doc).

    ``alone``: every task's duration without host contention; ``factor``: its class factor (1 for tasks
    contention does not touch); ``busy``: the tasks that load the host when they run (the kernels of the
    contention classes, whatever their factor); ``simulate``: :func:`predictor.simulate.simulate`.
    """
    alone = np.asarray(alone, float)
    factor = np.asarray(factor, float)
    slowed = np.flatnonzero((factor != 1.0) & (alone > 0))
    d = alone * factor
    if slowed.size == 0 or graph.n_ranks < 2:
        return d
    rank = graph.rank
    keep = 1.0 - 1.0 / factor[slowed]
    for _ in range(iters):
        start = simulate(graph, d).start
        end = start + d
        co = np.zeros(slowed.size)
        for r in np.unique(rank[slowed]):
            mine = rank[slowed] == r
            others = busy & (rank != r)
            s, e = busy_union(start[others], end[others])
            idx = slowed[mine]
            co[mine] = np.clip(busy_within(s, e, start[idx], end[idx]) / d[idx], 0.0, 1.0)
        new = d.copy()
        new[slowed] = alone[slowed] / (1.0 - co * keep)
        moved = float(np.max(np.abs(new[slowed] / d[slowed] - 1.0)))
        d = new
        if moved < tol:
            break
    return d
