"""Collectives (all-reduce, all-to-all, all-gather, reduce-scatter, send/recv): the piecewise model
of Lin et al. 2024, eq. 2-4.

Latency as a function of the per-rank message size ``m`` (bytes; for all-to-all the "max of
max" rule: the largest of sent/received over all ranks) has three regions:

* ``m <= m1``: constant start-up latency ``ts``;
* ``m1 < m < m2``: ``log10 t = L / (1 + exp(-k (log2 m - x0))) + b`` (the S-shaped bandwidth
  ramp);
* ``m >= m2``: ``ts + m / bw_max`` (saturated bandwidth).

Eight parameters per collective (``ts, m1, m2, bw_max, L, x0, k, b``). Until calibration
fits them from microbenchmarks, :func:`analytic_params` derives them from the platform's
interconnect: ring algorithms move ``2(n-1)/n * m`` bytes per rank for all-reduce and
``(n-1)/n * m`` for the others; the sigmoid is placed between the latency-bound and the
bandwidth-bound regime and chosen so the curve is continuous at ``m1`` and ``m2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from predictor.kernels.base import KernelModel, TaskView
from predictor.platforms.schema import Platform

COLLECTIVES = ("all_reduce", "all_to_all", "all_gather", "reduce_scatter", "send_recv", "broadcast")


@dataclass(frozen=True)
class PiecewiseSigmoid:
    """The 8 parameters of eq. 2-4 (seconds, bytes, bytes/s; x0 in log2 bytes)."""

    ts: float
    m1: float
    m2: float
    bw_max: float
    L: float
    x0: float
    k: float
    b: float

    def __call__(self, m: np.ndarray) -> np.ndarray:
        m = np.asarray(m, dtype=np.float64)
        x = np.log2(np.maximum(m, 1.0))
        mid = 10.0 ** (self.L / (1.0 + np.exp(-self.k * (x - self.x0))) + self.b)
        big = self.ts + m / self.bw_max
        return np.where(m <= self.m1, self.ts, np.where(m >= self.m2, big, mid))

    @classmethod
    def continuous(cls, ts: float, bw_max: float, m1: float, m2: float, steepness: float = 8.0) -> PiecewiseSigmoid:
        """The member of the family that joins ``ts`` at ``m1`` and ``ts + m/bw_max`` at ``m2``."""
        x1, x2 = math.log2(m1), math.log2(m2)
        x0 = 0.5 * (x1 + x2)
        k = steepness / max(x2 - x1, 1e-9)
        y1 = math.log10(ts)
        y2 = math.log10(ts + m2 / bw_max)
        s1 = 1.0 / (1.0 + math.exp(-k * (x1 - x0)))
        s2 = 1.0 / (1.0 + math.exp(-k * (x2 - x0)))
        L = (y2 - y1) / (s2 - s1)
        return cls(ts=ts, m1=m1, m2=m2, bw_max=bw_max, L=L, x0=x0, k=k, b=y1 - L * s1)


def wire_factor(kind: str, world: int) -> float:
    """Bytes each rank sends per byte of message for a ring/pairwise algorithm."""
    n = max(world, 1)
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_to_all", "all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def latency_steps(kind: str, world: int) -> int:
    """Sequential communication steps of the algorithm (each pays the link latency)."""
    n = max(world, 1)
    if kind == "all_reduce":
        return 2 * (n - 1)
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return n - 1
    return 1


def analytic_params(kind: str, world: int, platform: Platform) -> PiecewiseSigmoid:
    """Platform-derived parameters: link bandwidth and latency of the narrowest hop."""
    ic = platform.interconnect
    if world <= platform.devices_per_node:
        bw, lat = ic.intra_node_bandwidth_bytes_per_s, ic.intra_node_latency_s
    else:
        bw, lat = ic.inter_node_bandwidth_bytes_per_s, ic.inter_node_latency_s
    factor = wire_factor(kind, world)
    bw_max = bw / factor
    ts = max(latency_steps(kind, world) * lat, platform.kernel_floor_s)
    knee = ts * bw_max  # message size where latency and bandwidth terms are equal
    return PiecewiseSigmoid.continuous(ts, bw_max, m1=max(knee / 16.0, 4.0), m2=max(knee * 16.0, 64.0))


class PiecewiseCollective(KernelModel):
    """Collectives timed by eq. 2-4; parameters per (kind, world) from calibration or the platform."""

    kinds = COLLECTIVES
    name = "piecewise-sigmoid-collective"

    def __init__(self, fitted: dict[tuple[str, int], PiecewiseSigmoid] | None = None) -> None:
        #: calibrated parameters keyed by (collective kind, world size)
        self.params = dict(fitted or {})

    def curve(self, kind: str, world: int, platform: Platform) -> PiecewiseSigmoid:
        fitted = self.params.get((kind, world))
        return fitted if fitted is not None else analytic_params(kind, world, platform)

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        m = np.nan_to_num(tasks.get("msg_bytes"), nan=0.0)
        world = np.nan_to_num(tasks.get("world", 1.0), nan=1.0).astype(np.int64)
        kind = tasks.kind or "all_reduce"
        out = np.zeros(len(tasks))
        for w in np.unique(world):
            sel = world == w
            if w <= 1:
                out[sel] = 0.0  # a collective over one rank moves nothing
                continue
            out[sel] = self.curve(kind, int(w), platform)(m[sel])
        return out
