"""The last-level-cache reuse of a training step's embedding tables, measured against the calibration's
cold timing of each table.

The embedding-bag family (:mod:`predictor.timing.calibration.embedding_bag`) times every call *cold*: the cache
evicted, another table's call before it (:func:`~predictor.timing.calibration.embedding_bag.neighbour_warmers`).
In a training step a table's backward + SGD row update runs after its own forward read the same rows, with
the other tables' lookups in between; while the step's embedding working set (distinct rows x row bytes
over every table, summed over the ranks sharing the cache) fits in the last-level cache, those rows are
still there: on an AVX2 VM the e2e DLRM's tables in the step's order ran x0.80-0.88 the cold timing with
a working set of a quarter of the L3, x1.0 at two thirds of it.

:func:`probe_step_reuse` times synthetic tables both ways at working sets from 1/8 to 2x the LLC:

* ``cold``: each table's forward and its backward + SGD update as the calibration times them
  (:meth:`~predictor.timing.calibration.timing.Timer.measure` ``cold=True`` with the neighbour warm-up);
* ``step``: every table's forward in order, then every backward + update in reverse, a fresh batch of
  uniformly drawn rows every iteration (a real input stream: no reuse across iterations the probe's
  data would invent), each call timed alone.

:func:`reuse_curve` keeps per working set the median over rounds of ``step sum / cold sum`` for the
forward and the backward: ``[[working set / LLC, forward factor, backward factor], ...]``, stored as
:attr:`~predictor.timing.platforms.schema.Platform.embedding_step_reuse`. The probe's tables mix light and heavy
poolings (1 to 64 lookups per sample, their order shuffled each round), and a table's gain depends on it: a
heavy table's backward re-reads many rows its forward brought in, a light one's cost is mostly per-sample
work. :func:`reuse_surface` keeps the same ratio per pooling
(:attr:`~predictor.timing.platforms.schema.Platform.embedding_step_reuse_pooling`); :class:`~predictor.timing.kernels.timing.ModelTiming`
applies that per table where the pack has it
(:func:`~predictor.timing.kernels.step_reuse.reuse_factors_by_pooling`), else the sums' curve
(:func:`~predictor.timing.kernels.step_reuse.reuse_factor`). Times in seconds, sizes in bytes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["STEP_REUSE_FRACTIONS", "STEP_REUSE_ROUNDS", "probe_step_reuse", "reuse_curve", "PROBE_POOLINGS",
           "PROBE_DIM", "reuse_surface"]

#: working sets the probe times, as fractions of the last-level cache
STEP_REUSE_FRACTIONS = (0.125, 0.25, 0.5, 1.0, 2.0)
#: rounds over every working set by calibration level (each round times both protocols at every size)
STEP_REUSE_ROUNDS = {"tiny": 1, "quick": 6, "full": 12}
#: the probe's synthetic tables: lookups per sample of each (light tables among heavy ones, as in real
#: tasks: 128 lookups per sample in all) and their embedding dim; rows = ROW_MULTIPLE x the batch's lookups
#: (so nearly every lookup is a distinct row: the working set is set by the batch)
PROBE_POOLINGS = (1, 1, 2, 4, 8, 16, 32, 64)
PROBE_DIM = 64
ROW_MULTIPLE = 4
#: timed iterations of the step protocol per round (after one untimed)
STEP_ITERS = 3
#: most bytes of one probe table (the largest working sets get fewer rows per lookup instead)
MAX_TABLE_BYTES = 128 * 2**20


def _size_for(fraction: float, llc_bytes: float) -> tuple[int, list[int]]:
    """(batch, rows of each probe table) whose lookups span about ``fraction`` x ``llc_bytes`` of distinct rows."""
    per_sample = sum(PROBE_POOLINGS) * PROBE_DIM * 4.0
    batch = max(2, int(round(fraction * llc_bytes / per_sample)))
    rows = [max(1024, min(ROW_MULTIPLE * batch * p, int(MAX_TABLE_BYTES // (PROBE_DIM * 4)))) for p in PROBE_POOLINGS]
    return batch, rows


def probe_step_reuse(llc_bytes: float, rounds: int, *, fractions=STEP_REUSE_FRACTIONS, iters: int = STEP_ITERS,
                     seed: int = 0, timer=None, log: Callable[[str], None] | None = None) -> list[dict]:
    """Time the probe tables cold and in step order at each working set (module doc), ``rounds`` times,
    the sizes interleaved within a round. One CPU process at torch's current thread count.

    Returns one row per (round, working set): ``fraction``, ``batch``, ``rows`` (of the largest table),
    ``ws_bytes`` (the distinct rows the batches touch x row bytes, mean over the step's batches),
    ``llc_bytes``, the sums over the tables ``fwd_cold_s``, ``bwd_cold_s``, ``fwd_step_s``, ``bwd_step_s``
    (seconds; the step's are medians over ``iters`` iterations) and ``per_table``: the same four times and
    the ``pooling`` of each table, as lists in the round's table order (shuffled per round and size).
    """
    from predictor.timing.calibration.embedding_bag import neighbour_warmers, neighbour_weight
    from predictor.timing.calibration.timing import Timer

    dev = torch.device("cpu")
    timer = timer or Timer(dev, warmup=1, cold_repeats=3, cache_bytes=llc_bytes)
    neighbour = neighbour_weight(dev)
    out = []
    for r in range(rounds):
        for fraction in fractions:
            batch, rows = _size_for(fraction, llc_bytes)
            rng = np.random.default_rng([seed, r, int(fraction * 1000)])
            order = rng.permutation(len(PROBE_POOLINGS))  # no pooling always first / last in the step
            poolings = [PROBE_POOLINGS[k] for k in order]
            rows = [rows[k] for k in order]
            weights = [torch.nn.Parameter(torch.rand(n, PROBE_DIM)) for n in rows]
            offsets = [torch.arange(0, batch * p, p, dtype=torch.int64) for p in poolings]
            batches = [[torch.as_tensor(rng.integers(0, n, batch * p), dtype=torch.int64)
                        for n, p in zip(rows, poolings, strict=True)] for _ in range(iters + 1)]
            distinct = np.mean([sum(int(torch.unique(i).numel()) for i in b) for b in batches])
            warm_fwd, warm_bwd = neighbour_warmers(batch, neighbour)
            cold = _cold_times(timer, weights, batches[0], offsets, warm_fwd, warm_bwd)
            step = _step_times(weights, batches, offsets)
            per_table = {"pooling": [float(p) for p in poolings], "fwd_cold_s": cold[0],
                         "bwd_cold_s": cold[1], "fwd_step_s": step[0], "bwd_step_s": step[1]}
            out.append({"round": r, "fraction": float(fraction), "batch": batch, "rows": max(rows),
                        "ws_bytes": float(distinct * PROBE_DIM * 4), "llc_bytes": float(llc_bytes),
                        "fwd_cold_s": sum(cold[0]), "bwd_cold_s": sum(cold[1]),
                        "fwd_step_s": sum(step[0]), "bwd_step_s": sum(step[1]), "per_table": per_table})
            if log is not None:
                log(f"    step reuse round {r + 1}/{rounds}, working set {distinct * PROBE_DIM * 4 / 2**20:6.1f} MiB: "
                    f"backward step / cold {sum(step[1]) / sum(cold[1]):.2f}")
            del weights, batches
    return out


def _cold_times(timer, weights, idx, offsets, warm_fwd, warm_bwd) -> tuple[list[float], list[float]]:
    """Each table's forward and backward + SGD timed as the calibration times them (cold), seconds."""
    fwd, bwd = [], []
    for w, i, o in zip(weights, idx, offsets, strict=True):
        with torch.no_grad():
            fwd.append(timer.measure(lambda w=w, i=i, o=o: F.embedding_bag(i, w, o, mode="sum"), cold=True,
                                     warm_code=warm_fwd).seconds)
        out = F.embedding_bag(i, w, o, mode="sum", sparse=True)
        grad = torch.randn_like(out)

        def backward(out=out, grad=grad, w=w) -> None:
            out.backward(grad, retain_graph=True)
            with torch.no_grad():
                w.add_(w.grad, alpha=-1e-3)

        def clear(w=w) -> None:
            w.grad = None

        bwd.append(timer.measure(backward, setup=clear, cold=True, warm_code=warm_bwd).seconds)
        w.grad = None
    return fwd, bwd


def _step_times(weights, batches, offsets) -> tuple[list[float], list[float]]:
    """Each table's forward and backward + SGD in a step's order (every forward, then every backward in
    reverse), the median over the iterations (the first untimed), seconds."""
    n = len(weights)
    fwd, bwd = np.zeros((len(batches) - 1, n)), np.zeros((len(batches) - 1, n))
    for it, idx in enumerate(batches):
        pooled, tf = [], np.zeros(n)
        for k, (w, i, o) in enumerate(zip(weights, idx, offsets, strict=True)):
            t0 = time.perf_counter()
            pooled.append(F.embedding_bag(i, w, o, mode="sum", sparse=True))
            tf[k] = time.perf_counter() - t0
        grads = [torch.randn_like(p) for p in pooled]
        tb = np.zeros(n)
        for k in reversed(range(n)):
            w = weights[k]
            t0 = time.perf_counter()
            pooled[k].backward(grads[k])
            with torch.no_grad():
                w.add_(w.grad, alpha=-1e-3)
            w.grad = None
            tb[k] = time.perf_counter() - t0
        if it:
            fwd[it - 1], bwd[it - 1] = tf, tb
    return [float(x) for x in np.median(fwd, axis=0)], [float(x) for x in np.median(bwd, axis=0)]


def reuse_curve(probe: list[dict]) -> list[list[float]]:
    """``[[working set / LLC, forward factor, backward factor], ...]`` by working set: per size the median
    over rounds of each round's step sum / cold sum (the working set itself: median over rounds)."""
    by: dict[float, list[dict]] = {}
    for row in probe:
        by.setdefault(float(row["fraction"]), []).append(row)
    curve = []
    for fraction in sorted(by):
        rows = by[fraction]
        x = float(np.median([r["ws_bytes"] / r["llc_bytes"] for r in rows]))
        f = float(np.median([r["fwd_step_s"] / r["fwd_cold_s"] for r in rows]))
        b = float(np.median([r["bwd_step_s"] / r["bwd_cold_s"] for r in rows]))
        if all(math.isfinite(v) and v > 0 for v in (x, f, b)):
            curve.append([x, f, b])
    return curve


def reuse_surface(probe: list[dict]) -> list[list[float]]:
    """``[[working set / LLC, pooling, forward factor, backward factor], ...]``: per working set and per
    pooling of the probe's tables, the median over rounds of each round's step / cold ratio of the tables
    with that pooling (their sums; the working set: median over rounds). Empty when the rows carry no
    ``per_table`` times (a probe recorded before they were kept)."""
    by: dict[float, list[dict]] = {}
    for row in probe:
        if row.get("per_table"):
            by.setdefault(float(row["fraction"]), []).append(row)
    surface = []
    for fraction in sorted(by):
        rows = by[fraction]
        x = float(np.median([r["ws_bytes"] / r["llc_bytes"] for r in rows]))
        ratios: dict[float, list[tuple[float, float]]] = {}
        for r in rows:
            t = {k: np.asarray(v, dtype=float) for k, v in r["per_table"].items()}
            for p in np.unique(t["pooling"]):
                sel = t["pooling"] == p
                ratios.setdefault(float(p), []).append(
                    (t["fwd_step_s"][sel].sum() / t["fwd_cold_s"][sel].sum(),
                     t["bwd_step_s"][sel].sum() / t["bwd_cold_s"][sel].sum()))
        for p in sorted(ratios):
            f, b = np.median(np.asarray(ratios[p]), axis=0)
            if all(math.isfinite(v) and v > 0 for v in (x, p, f, b)):
                surface.append([x, p, float(f), float(b)])
    return surface
