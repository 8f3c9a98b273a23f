"""The kernel-model protocol and the columnar task view every model reads.

A kernel model answers one question: how long does this kernel take on this platform?
It sees tasks through a :class:`TaskView` (columns of kernel parameters, one row per task)
so a whole graph's GEMMs are predicted in one vectorised call, and a single task is a view
of length one.

Contract (every implementation):

* ``kinds`` lists the op kinds (``ExecutionGraph.kinds`` strings) the model times;
* ``predict(tasks, platform)`` returns seconds as a float64 array of ``len(tasks)``, finite,
  ``>= platform.kernel_floor_s``; it must not depend on task order;
* parameters that calibration can fit live in a ``params`` attribute (a frozen dataclass or
  dict) that :mod:`predictor.timing.calibrate` may replace; analytic defaults come from the platform.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from predictor.graph import PARAM_COLUMNS, ExecutionGraph
from predictor.timing.platforms.schema import Platform

__all__ = ["TaskView", "KernelModel"]


@dataclass(frozen=True)
class TaskView:
    """Kernel parameters of a set of tasks, columnar (NaN where a task lacks a value).

    Columns: those of :data:`predictor.graph.PARAM_COLUMNS` plus ``flops`` and ``bytes``.
    ``kind`` is the op kind shared by every task of the view (the timing layer groups tasks
    by kind before calling a model; empty when mixed).
    """

    columns: Mapping[str, np.ndarray]
    size: int
    kind: str = ""

    def __len__(self) -> int:
        return self.size

    def get(self, name: str, default: float = np.nan) -> np.ndarray:
        """Column ``name`` (float64); ``default`` where absent."""
        col = self.columns.get(name)
        if col is None:
            return np.full(self.size, default, dtype=np.float64)
        if default is not np.nan and not np.isnan(default):
            col = np.where(np.isnan(col), default, col)
        return col

    @classmethod
    def from_graph(cls, graph: ExecutionGraph, idx: np.ndarray, kind: str = "") -> TaskView:
        """The tasks ``idx`` of ``graph`` (all of op kind ``kind``)."""
        cols = {k: v[idx] for k, v in graph.params.items()}
        cols["flops"] = graph.flops[idx]
        cols["bytes"] = graph.bytes[idx]
        return cls(cols, int(np.asarray(idx).size), kind)

    @classmethod
    def single(cls, kind: str = "", **values: float) -> TaskView:
        """A view of one task, e.g. ``TaskView.single("gemm", m=1024, n=1024, k=1024)``."""
        allowed = set(PARAM_COLUMNS) | {"flops", "bytes"}
        unknown = set(values) - allowed
        if unknown:
            raise ValueError(f"unknown kernel parameter(s) {sorted(unknown)}; known: {sorted(allowed)}")
        return cls({k: np.asarray([float(v)]) for k, v in values.items()}, 1, kind)

    @classmethod
    def from_columns(cls, kind: str = "", **columns: np.ndarray) -> TaskView:
        """A view from equal-length arrays."""
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in columns.items()}
        sizes = {a.size for a in arrays.values()}
        if len(sizes) > 1:
            raise ValueError("columns of a TaskView must have equal lengths")
        return cls(arrays, sizes.pop() if sizes else 0, kind)


class KernelModel(ABC):
    """Predicts kernel durations (seconds) for a batch of tasks on one platform."""

    #: op kinds this model times
    kinds: tuple[str, ...] = ()
    #: short name used in reports ("analytic-gemm", "mlp-gemm", ...)
    name: str = "kernel-model"

    @abstractmethod
    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        """Seconds per task."""

    def predict_one(self, platform: Platform, kind: str = "", **params: float) -> float:
        """Convenience: the duration of a single task of op kind ``kind``, seconds."""
        return float(self.predict(TaskView.single(kind or self.kinds[0], **params), platform)[0])
