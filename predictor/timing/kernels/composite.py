"""Op kinds priced by composing the kernel models of the kernels they run: recurrent layers, batch norm.

A recurrent layer (``aten::mkldnn_rnn_layer``: LSTM / GRU on a CPU) is one op but runs one input
projection GEMM over all steps, then ``T`` dependent GEMMs of the hidden state, each only ``B`` rows
tall, and element-wise gate arithmetic. Its time does not scale with the batch like its FLOPs: the
recurrent GEMMs are small and their efficiency grows with ``B``. :class:`RecurrentModel` times the
layer as the sum of those GEMMs (the platform's GEMM model: calibrated where a pack has one) plus
the gate arithmetic (the element-wise model over ``elements`` gates). The backward runs the
transposed GEMMs for the data gradients (per step again) and the weight gradients (one GEMM over all
steps each), and about twice the gate arithmetic.

Batch norm (``batch_norm`` / ``batch_norm_bwd``) is memory-bound: a statistics pass and a normalising
pass over the activations (plus the gradient's): :class:`BatchNormModel` prices its ``bytes`` with the
platform's element-wise model.

Parameters (:func:`~predictor.sources.traces.host_kernels.rnn_params`): ``batch`` B, ``m`` steps T,
``n`` gate width G x H, ``k`` input width, ``dim`` hidden width H, ``elements`` B T G H.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.platforms.schema import Platform

__all__ = ["RNN_KINDS", "BATCH_NORM_KINDS", "RecurrentModel", "BatchNormModel"]

#: recurrent-layer kinds timed by :class:`RecurrentModel`
RNN_KINDS = ("rnn", "rnn_bwd")
#: batch-norm kinds timed by :class:`BatchNormModel`
BATCH_NORM_KINDS = ("batch_norm", "batch_norm_bwd")


def _gemm_view(m: np.ndarray, n: np.ndarray, k: np.ndarray, dt: np.ndarray) -> TaskView:
    cols = {"m": m, "n": n, "k": k, "dtype_bytes": dt, "flops": 2.0 * m * n * k,
            "bytes": (m * k + k * n + m * n) * dt}
    return TaskView(cols, int(m.size), "mm")


class RecurrentModel(KernelModel):
    """Recurrent layer = its GEMMs (``model_for("mm")``) + its gate arithmetic (``model_for("mul")``).

    ``model_for``: the timing's kind -> model lookup (:meth:`ModelTiming.model_for`).
    """

    kinds = RNN_KINDS
    name = "recurrent-composite"

    def __init__(self, model_for: Callable[[str], KernelModel]) -> None:
        self.model_for = model_for

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        n_tasks = len(tasks)
        b, t, gh = tasks.get("batch"), tasks.get("m", 1.0), tasks.get("n")
        k, h, dt = tasks.get("k"), tasks.get("dim"), tasks.get("dtype_bytes", 4.0)
        ok = np.isfinite(b) & np.isfinite(gh) & np.isfinite(k) & np.isfinite(h)
        out = np.zeros(n_tasks)
        if not ok.any():
            return out
        b, t, gh, k, h, dt = (np.where(ok, x, 1.0) for x in (b, t, gh, k, h, dt))
        gemm = self.model_for("mm")
        bwd = tasks.kind == "rnn_bwd"
        # input projection over all steps; T recurrent GEMMs of B rows
        time = gemm.predict(_gemm_view(b * t, gh, k, dt), platform)
        time = time + t * gemm.predict(_gemm_view(b, gh, h, dt), platform)
        if bwd:  # data gradients (per step for the hidden state), weight gradients over all steps
            time = time + gemm.predict(_gemm_view(b * t, k, gh, dt), platform)
            time = time + t * gemm.predict(_gemm_view(b, h, gh, dt), platform)
            time = time + gemm.predict(_gemm_view(gh, k + h, b * t, dt), platform)
        el = b * t * gh
        ew = TaskView({"elements": el, "dtype_bytes": dt, "bytes": (4.0 if bwd else 2.0) * el * dt}, n_tasks, "mul")
        time = time + self.model_for("mul").predict(ew, platform)
        return np.where(ok, time, 0.0)


class BatchNormModel(KernelModel):
    """Batch norm priced as the element-wise traffic of its passes (``model_for("elementwise")``)."""

    kinds = BATCH_NORM_KINDS
    name = "batch-norm-composite"

    def __init__(self, model_for: Callable[[str], KernelModel]) -> None:
        self.model_for = model_for

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        view = TaskView(dict(tasks.columns), len(tasks), "elementwise")
        return self.model_for("elementwise").predict(view, platform)
