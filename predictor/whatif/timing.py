"""Timing of a transformed graph: measured, model, anchored (measured x model ratio) or work ratio."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from predictor.graph import Category, ExecutionGraph, Overhead
from predictor.graph.edit import aux_of
from predictor.timing.kernels.composite import host_op_models
from predictor.whatif.common import EXP_COLS

__all__ = ["WhatIfTiming", "RATIO_ALIAS", "anchored_time", "share_per_op"]


#: kinds without a model of their own whose *ratio* new/old is taken from a related model
#: (the dense embedding-bag backward scales like the sparse one the calibration measures)
RATIO_ALIAS = {"embedding_bag_bwd_dense": "embedding_bag_bwd"}


class WhatIfTiming:
    """Durations for a transformed graph (see the module docstring).

    ``timing``: a :class:`~predictor.timing.kernels.timing.ModelTiming` of the target platform.
    ``platform_moved``: every kernel task takes the model's time (kinds without a model: the
    platform's roofline). After :meth:`durations`, ``counts`` says how many tasks took
    which path.
    """

    def __init__(self, timing, mode: str = "model", platform_moved: bool = False) -> None:
        self.timing = timing
        self.mode = mode
        self.platform_moved = platform_moved
        self.counts: dict[str, int] = {}
        #: op kind -> {"tasks": changed tasks of that kind no kernel model times, "how": how they were scaled}
        self.fallback: dict[str, dict] = {}
        kinds: set[str] = set()
        for model in getattr(timing, "models", []):
            kinds.update(getattr(model, "kinds", ()))
        #: host ops no calibration benchmarks (dense embeddings, fills, reductions), composed of the timing's
        #: data-movement and element-wise models, for the kinds none of its models claims; a RATIO_ALIAS kind
        #: keeps its alias's calibrated ratio (the dense bag backward's bytes miss its index sort and table
        #: zeroing: with them DLRM batch x4 of whatif_cpu fell from 17.3 to 16.3 ms against 20.5 measured)
        self.host_models: dict[str, object] = {}
        if hasattr(timing, "model_for"):
            for model in host_op_models(timing.model_for):
                self.host_models.update((k, model) for k in model.kinds if k not in kinds and k not in RATIO_ALIAS)
        kinds.update(self.host_models)
        self.model_kinds = kinds

    def _model(self, g: ExecutionGraph, idx: np.ndarray, kind: str, params: Mapping[str, np.ndarray] | None = None,
               flops: np.ndarray | None = None, nbytes: np.ndarray | None = None) -> np.ndarray:
        from predictor.timing.kernels.base import TaskView

        cols = {k: (params[k] if params is not None else v)[idx] for k, v in g.params.items()}
        cols["flops"] = (flops if flops is not None else g.flops)[idx]
        cols["bytes"] = (nbytes if nbytes is not None else g.bytes)[idx]
        view = TaskView(cols, int(idx.size), kind)
        model = self.host_models.get(kind) or self.timing.model_for(kind)
        return np.asarray(model.predict(view, self.timing.platform), dtype=np.float64)

    def has_model(self, kind: str) -> bool:
        """Does a kernel model of the timing claim ``kind`` (not just the roofline fallback)? A backward kind
        without its own model counts when the timing times it with its forward kind's model."""
        timed = getattr(self.timing, "timed_kind", lambda k: k)(kind)
        return kind in self.model_kinds or timed in self.model_kinds

    def durations(self, g: ExecutionGraph) -> np.ndarray:
        aux = aux_of(g)
        d = g.duration.copy()
        n = g.n_tasks
        changed = aux.get("changed", np.zeros(n)) > 0
        ratio = np.nan_to_num(aux.get("ratio", np.ones(n)), nan=1.0)
        new = ~np.isfinite(d)
        kernel = np.isin(g.category, (Category.COMPUTE, Category.MEMORY, Category.COMMUNICATION))
        counts = {"unchanged_measured": 0, "model": 0, "anchored_model": 0, "ratio_no_model": 0, "new_model": 0,
                  "new_overhead": 0}
        todo = (changed | new) & kernel
        base = _base_params(g)
        launch_op = aux.get("launch_op", np.full(n, np.nan))
        raw = aux.get("measured_raw", d)
        self.fallback = {}
        for kid in np.unique(g.kind[todo]).tolist():
            kind = g.kinds[kid]
            idx = np.flatnonzero(todo & (g.kind == kid))
            has_model = self.has_model(kind)
            is_new = new[idx]
            if not has_model and self.platform_moved:
                self.fallback[kind] = {"tasks": int(idx.size), "how": "the target platform's roofline on the "
                                       "task's FLOPs and bytes (no kernel model of this kind)"}
            if has_model or self.platform_moved:
                t_new = self._model(g, idx, kind)
                if self.mode == "anchored" and not self.platform_moved and has_model:
                    t_old = self._model(g, idx, kind, base["params"], base["flops"], base["bytes"])
                    anch = anchored_time(d[idx], raw[idx], t_old, t_new)
                    val = np.where(is_new, t_new, anch)
                    counts["anchored_model"] += int((~is_new).sum())
                else:
                    val = share_per_op(t_new, d[idx], launch_op[idx], is_new)
                    counts["model"] += int((~is_new).sum())
                counts["new_model"] += int(is_new.sum())
            elif kind in RATIO_ALIAS and RATIO_ALIAS[kind] in self.model_kinds:
                alias = RATIO_ALIAS[kind]
                t_new = self._model(g, idx, alias)
                t_old = self._model(g, idx, alias, base["params"], base["flops"], base["bytes"])
                val = np.where(is_new | (t_old <= 0), d[idx] * ratio[idx], anchored_time(d[idx], raw[idx], t_old, t_new))
                counts["anchored_model"] += int((~is_new).sum())
                self.fallback[kind] = {"tasks": int(idx.size), "how": f"measured x the {alias} model's ratio new/old"}
            else:
                val = np.where(is_new, 0.0, d[idx] * ratio[idx])
                counts["ratio_no_model"] += int((~is_new).sum())
                self.fallback[kind] = {"tasks": int(idx.size), "how": "measured x work ratio (FLOPs, else elements "
                                       "or bytes, new/old)"}
            d[idx] = val
        # kernels of duplicated layers keep the share of their measured time that was their own, the rest the
        # model's time: a copy of a kernel the profiler correction left at ~0 still costs what the kernel costs
        copied = (np.nan_to_num(aux.get("copied", np.zeros(n)), nan=0.0) > 0) & kernel & ~todo
        if copied.any() and self.mode == "anchored" and not self.platform_moved:
            for kid in np.unique(g.kind[copied]).tolist():
                kind = g.kinds[kid]
                idx = np.flatnonzero(copied & (g.kind == kid))
                if not self.has_model(kind):
                    continue
                w = np.where(np.isfinite(raw[idx]) & (raw[idx] > 0),
                             np.clip(d[idx] / np.maximum(raw[idx], 1e-15), 0.0, 1.0), 1.0)
                d[idx] = w * d[idx] + (1.0 - w) * self._model(g, idx, kind)
                counts["copied_model"] = counts.get("copied_model", 0) + int((w < 1.0).sum())
        # new host tasks without a duration: the platform's overhead of their type, else 0
        rest = ~np.isfinite(d)
        if rest.any():
            ov = self.timing.overhead_seconds() if hasattr(self.timing, "overhead_seconds") else np.zeros(len(Overhead))
            d[rest] = ov[g.overhead[rest]]
            counts["new_overhead"] = int(rest.sum())
        counts["unchanged_measured"] = int((~(todo | rest)).sum()) - counts.get("copied_model", 0)
        sp = aux.get("speedup")
        if sp is not None:
            d = d / np.where(np.isfinite(sp) & (sp > 0), sp, 1.0)
        self.counts = counts
        return np.maximum(np.nan_to_num(d, nan=0.0), 0.0)


def anchored_time(measured: np.ndarray, raw: np.ndarray, t_old: np.ndarray, t_new: np.ndarray) -> np.ndarray:
    """A changed kernel's new time (seconds) from its profiler-corrected ``measured`` time, its traced ``raw``
    time and the model's times before / after the change.

    The share ``w = measured / raw`` of the traced time that is the kernel's own decides how far the
    measurement is trusted: that share scales by the model's ratio ``t_new / t_old`` (the measurement carries
    what the model misses, such as the cache state inside a step), the rest of the change is the model's
    increment ``t_new - t_old``. A kernel traced without profiler cost (``w = 1``) is ``measured x ratio``; one
    whose traced time was mostly the profiler's (an execution trace recording a small op's inputs costs tens of
    µs, more than the op: the correction leaves it at about 0) grows by the model's increment instead of staying
    at 0 whatever the batch."""
    ok = t_old > 0
    ratio = np.where(ok, t_new / np.maximum(t_old, 1e-15), 1.0)
    w = np.where(np.isfinite(raw) & (raw > 0), np.clip(measured / np.maximum(raw, 1e-15), 0.0, 1.0), 1.0)
    val = measured * (1.0 + w * (ratio - 1.0)) + (1.0 - w) * (t_new - t_old)
    return np.where(ok, np.maximum(val, 0.0), t_new)


def share_per_op(t_op: np.ndarray, measured: np.ndarray, launch_op: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Model times of traced kernels when several kernels come from one launching op (a split-K GEMM's
    GEMM and reduce kernels, a backward op's kernels): each kernel's model time ``t_op`` prices the whole
    op, so the op's kernels share one ``t_op`` in proportion to their measured durations (seconds).
    Kernels alone in their op, without a recorded op (``launch_op`` NaN) or new (``new``) keep ``t_op``."""
    out = t_op.copy()
    ok = np.isfinite(launch_op) & ~new & np.isfinite(measured)
    if not ok.any():
        return out
    ops, inv, cnt = np.unique(launch_op[ok], return_inverse=True, return_counts=True)
    multi = cnt[inv] > 1
    if not multi.any():
        return out
    total = np.bincount(inv, weights=measured[ok], minlength=ops.size)
    share = np.where(total[inv] > 0, measured[ok] / np.maximum(total[inv], 1e-15), 1.0 / cnt[inv])
    sel = np.flatnonzero(ok)[multi]
    out[sel] = t_op[sel] * share[multi]
    return out


def _base_params(g: ExecutionGraph) -> dict:
    """Parameters before the batch changes: undo ``s ** x`` with the recorded batch factor."""
    f = g.meta.get("whatif", {}).get("batch_factor", 1.0)
    aux = aux_of(g)
    params = {}
    for c, col in g.params.items():
        x = np.nan_to_num(aux.get(f"x_{c}", np.zeros(g.n_tasks)), nan=0.0) if c in EXP_COLS else 0.0
        params[c] = col / f ** x
    fx = np.nan_to_num(aux.get("x_flops", np.zeros(g.n_tasks)), nan=0.0)
    bx = np.nan_to_num(aux.get("x_bytes", np.zeros(g.n_tasks)), nan=0.0)
    return {"params": params, "flops": g.flops / f ** fx, "bytes": g.bytes / f ** bx}
