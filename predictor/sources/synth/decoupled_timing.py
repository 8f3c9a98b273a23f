"""Task durations of the decoupled model's iteration graphs (Centimani §4.3.2), seconds.

:class:`CacheAwareTiming` prices a graph of :func:`predictor.sources.synth.decoupled.build_iteration_graph`
from the catalog: host tasks at the platform's CPU overheads, common kernels (GEMM, convolution,
attention) by the analytic GEMM model bounded below by a cache-aware memory time, other kernels by
the cache-aware roofline, collectives by the piecewise collective model. :func:`asset_timing` is the
platform's calibrated asset pack instead, when it has one; :class:`FixedTiming` replays durations
computed once.
"""

from __future__ import annotations

import numpy as np

from predictor.graph import Category, ExecutionGraph, Overhead
from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.collective import PiecewiseCollective
from predictor.timing.kernels.elementwise import Roofline
from predictor.timing.kernels.gemm import AnalyticGemm
from predictor.timing.kernels.timing import ModelTiming, overhead_array
from predictor.timing.platforms.schema import Platform

__all__ = ["CacheAwareTiming", "FixedTiming", "asset_timing"]

#: task kinds of common operators (GEMM, convolution, attention)
_COMMON_TASK_KINDS = ("gemm", "conv2d", "bmm")


class CacheAwareTiming:
    """A :class:`predictor.simulate.Timing` for graphs from
    :func:`~predictor.sources.synth.decoupled.build_iteration_graph`.

    Host tasks take the platform's CPU overheads; common kernels the analytic GEMM model's
    compute time bounded below by the cache-aware memory time; other kernels the cache-aware
    roofline; collectives the piecewise collective model; the data-loading task keeps the
    duration the builder stored.
    """

    source = "analytic (catalog peaks, cache-aware roofline)"

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.gemm = AnalyticGemm()
        self.roofline = Roofline()
        self.collective = PiecewiseCollective()

    def on_chip_bandwidth(self) -> float:
        """Bandwidth of the largest on-chip level, bytes/s (the off-chip one when none is listed)."""
        on = [m for m in self.platform.memory if m.on_chip]
        if not on:
            return self.platform.memory_bandwidth
        return max(on, key=lambda m: m.capacity_bytes).bandwidth_bytes_per_s

    def memory_seconds(self, total_bytes: np.ndarray, on_chip_bytes: np.ndarray) -> np.ndarray:
        """Cache-aware memory time: on-chip bytes at on-chip bandwidth, the rest off-chip."""
        p = self.platform
        eff = p.memory_efficiency
        on = np.clip(np.nan_to_num(on_chip_bytes), 0.0, total_bytes)
        return on / (self.on_chip_bandwidth() * eff) + (total_bytes - on) / (p.memory_bandwidth * eff)

    def durations(self, graph: ExecutionGraph) -> np.ndarray:
        p = self.platform
        out = np.zeros(graph.n_tasks)
        oh = graph.overhead != Overhead.NONE
        out[oh] = overhead_array(p.overheads)[graph.overhead[oh]]
        given = graph.kind_mask("data_loading")
        out[given] = np.nan_to_num(graph.duration[given])
        on_chip = graph.meta.get("on_chip_bytes", np.zeros(graph.n_tasks))
        dev = ~oh & ~given & (graph.category != Category.CPU)
        for kid in np.unique(graph.kind[dev]):
            kind = graph.kinds[kid]
            idx = np.flatnonzero(dev & (graph.kind == kid))
            view = TaskView.from_graph(graph, idx, kind)
            if kind in self.collective.kinds:
                out[idx] = self.collective.predict(view, p)
                continue
            total = np.nan_to_num(graph.bytes[idx])
            t_mem = self.memory_seconds(total, on_chip[idx]) + p.kernel_floor_s
            compute_only = TaskView({**view.columns, "bytes": np.zeros(idx.size)}, idx.size, kind)
            model = self.gemm if kind in _COMMON_TASK_KINDS else self.roofline
            out[idx] = np.maximum(model.predict(compute_only, p), t_mem)
        return out


def asset_timing(platform: Platform) -> ModelTiming | None:
    """The calibrated timing of ``platform``'s asset pack (``tuner calibrate``), or None without one.

    Uses :func:`predictor.timing.kernels.assets.resolve_platform` by the platform's key; a platform
    without a pack (every catalog accelerator until someone calibrates it) gets None, and the
    analytic cache-aware models are used instead.
    """
    try:
        from predictor.timing.kernels.assets import resolve_platform
    except ImportError:  # the asset-pack module is not installed
        return None
    try:
        resolved = resolve_platform(platform.key)
    except Exception:  # a broken pack must not stop a search: fall back to the analytic models
        return None
    if getattr(resolved, "pack", None) is None:
        return None
    return resolved.timing()


class FixedTiming:
    """A :class:`predictor.simulate.Timing` that returns precomputed durations (seconds)."""

    def __init__(self, durations: np.ndarray, source: str) -> None:
        self._d = np.asarray(durations, dtype=np.float64)
        self.source = source

    def durations(self, graph: ExecutionGraph) -> np.ndarray:
        if self._d.shape != (graph.n_tasks,):
            raise ValueError("FixedTiming used on a graph of another size")
        return self._d.copy()
