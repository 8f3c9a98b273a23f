"""The learned kernel model: :class:`MLPKernelModel` holds one or several :class:`~.mlp.MLPNet` s (GEMM: one per
op and dtype) with a router; tasks lacking a feature fall back to the family's analytic model. Its inputs are
the columns of :mod:`.features`; the fitted rooflines are in :mod:`.roofline_fit`, the JSON form of every
calibrated model in :mod:`.serialize`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.kernels.elementwise import Roofline
from predictor.timing.kernels.embedding import RF_COLUMNS, AnalyticEmbedding
from predictor.timing.kernels.features import (
    DERIVED_FEATURES,
    ROUTE_FEATURES,
    feature_matrix,
    route_columns,
    uniform_reuse_factors,
)
from predictor.timing.kernels.gemm import AnalyticGemm
from predictor.timing.kernels.host_memory import known_seconds
from predictor.timing.kernels.mlp import MLPNet
from predictor.timing.platforms.schema import Platform

__all__ = ["MLPKernelModel"]


_FALLBACKS = {"analytic-gemm": AnalyticGemm, "analytic-embedding": AnalyticEmbedding, "roofline": Roofline}
_DTYPE_NAMES = {4: ("fp32",), 2: ("bf16", "fp16"), 8: ("fp64",), 1: ("fp8",)}


class MLPKernelModel(KernelModel):
    """Kernel times from one or several :class:`~.mlp.MLPNet` s, routed per task.

    Routers:

    * ``"single"``: one net (key ``""``).
    * ``"gemm"``: key ``"{op}/{dtype}"`` with op ``bmm`` (kind ``bmm`` or ``batch > 1``),
      ``mm`` (kinds ``mm``, ``matmul``) or ``addmm`` (the others), dtype from ``dtype_bytes``
      (2 bytes: bf16, else fp16).
    * ``"dtype"``: key ``"{prefix}/{dtype}"`` (convolutions).

    Fill-ins before prediction: ``"rows_by_width"`` (layer-norm, softmax) reads a task with
    only ``elements`` as rows of width 1024; ``"reuse"`` (embedding) gives a task without
    reuse factors the uniform-access expectation (:func:`~.features.uniform_reuse_factors`); ``"concat"`` reads a
    concatenation without ``batch`` / ``parts`` as two inputs of one contiguous slice. Tasks
    that still lack a feature, or whose route has no net, go to the analytic ``fallback``.
    """

    def __init__(
        self,
        name: str,
        kinds: Sequence[str],
        nets: Mapping[str, MLPNet],
        *,
        router: str = "single",
        prefix: str = "",
        fill: str = "",
        fallback: str = "roofline",
    ) -> None:
        self.name = name
        self.kinds = tuple(kinds)
        self.nets = dict(nets)
        self.router = router
        self.prefix = prefix
        self.fill = fill
        self.fallback_name = fallback
        self.fallback = _FALLBACKS[fallback]()
        #: the calibrated nets (what an asset pack stores)
        self.params = self.nets

    # ------------------------------------------------------------------ routing
    def _keys(self, tasks: TaskView) -> np.ndarray:
        n = len(tasks)
        if self.router == "single":
            return np.full(n, "", dtype=object)
        dt = np.nan_to_num(tasks.get("dtype_bytes", 4.0), nan=4.0).astype(np.int64)
        if self.router == "gemm":
            batch = np.nan_to_num(tasks.get("batch", 1.0), nan=1.0)
            kind = tasks.kind
            plain = "mm" if kind in ("mm", "matmul") else "addmm"
            is_bmm = (batch > 1) | (kind == "bmm")
        else:
            plain, is_bmm = self.prefix, np.zeros(n, dtype=bool)
        # one route lookup per distinct (op, dtype) pair, not per task
        code = dt * 2 + is_bmm
        uniq, inv = np.unique(code, return_inverse=True)
        keys = np.array([self._with_dtype("bmm" if c % 2 else plain, int(c // 2)) for c in uniq], dtype=object)
        return keys[inv.reshape(-1)]

    def _with_dtype(self, op: str, dtype_bytes: int) -> str:
        for name in _DTYPE_NAMES.get(dtype_bytes, ("fp32",)):
            key = f"{op}/{name}"
            if key in self.nets:
                return key
        return f"{op}/{_DTYPE_NAMES.get(dtype_bytes, ('fp32',))[0]}"

    def _columns(self, tasks: TaskView, features: Sequence[str], key: str = "") -> np.ndarray:
        cols = {f: tasks.get(f) for f in features if f not in DERIVED_FEATURES}
        if any(f in ROUTE_FEATURES for f in features):
            cols.update(route_columns(key, len(tasks)))
        if self.router == "gemm" and "batch" in cols:
            cols["batch"] = np.nan_to_num(cols["batch"], nan=1.0)  # a task without a batch is one GEMM (_keys)
        if any(f in DERIVED_FEATURES for f in features):
            for c in ("batch", "pooling", "rows", "dim", "dtype_bytes", "m", "n", "k", *RF_COLUMNS):
                cols.setdefault(c, tasks.get(c))
        if self.fill == "rows_by_width" and "m" in cols and "n" in cols:
            elems = tasks.get("elements")
            n = np.where(np.isnan(cols["n"]), np.minimum(1024.0, np.maximum(elems, 1.0)), cols["n"])
            m = np.where(np.isnan(cols["m"]), elems / n, cols["m"])
            cols["m"], cols["n"] = m, n
        if self.fill == "concat":
            # a concatenation without its inputs' layout reads as two inputs of one contiguous slice each
            for c, default in (("batch", 1.0), ("parts", 2.0)):
                if c in cols:
                    cols[c] = np.where(np.isnan(cols[c]), default, cols[c])
        if self.fill == "reuse":
            rf = np.stack([tasks.get(c) for c in RF_COLUMNS], axis=1)
            missing = ~np.isfinite(rf).all(axis=1) | (np.nan_to_num(rf).sum(axis=1) <= 0)
            if missing.any():
                lookups = tasks.get("batch", 1.0) * tasks.get("pooling", 1.0)
                guess = uniform_reuse_factors(lookups[missing], tasks.get("rows", 1.0)[missing])
                rf[missing] = guess
                for j, c in enumerate(RF_COLUMNS):
                    if c in cols:
                        cols[c] = rf[:, j]
        if "dtype_bytes" in cols:
            cols["dtype_bytes"] = np.nan_to_num(cols["dtype_bytes"], nan=4.0)
        return feature_matrix(cols, features, len(tasks))

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        """Seconds per task: the routed net's time plus the terms the nets were fitted without
        (:func:`~.host_memory.known_seconds`); tasks no net can time go to the analytic fallback."""
        n = len(tasks)
        out = np.full(n, np.nan)
        keys = self._keys(tasks)
        known = known_seconds(tasks, platform)
        for key in np.unique(keys) if n else []:
            net = self.nets.get(key)
            sel = np.flatnonzero(keys == key)
            if net is None:
                continue
            raw = self._columns(_subset(tasks, sel), net.features, key)
            ok = np.isfinite(raw).all(axis=1)
            if ok.any():
                out[sel[ok]] = net.predict(raw[ok]) + known[sel[ok]]
        todo = np.flatnonzero(~np.isfinite(out))
        if todo.size:
            out[todo] = self.fallback.predict(_subset(tasks, todo), platform)
        return np.maximum(out, 0.0)


def _subset(tasks: TaskView, idx: np.ndarray) -> TaskView:
    return TaskView({k: np.asarray(v)[idx] for k, v in tasks.columns.items()}, int(idx.size), tasks.kind)
