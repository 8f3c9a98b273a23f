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

Attention (``attention`` / ``attention_bwd``: ``scaled_dot_product_attention``'s fused kernel) is two batched
GEMMs per head, ``Q K^T`` and ``P V``, around a softmax over ``T x S`` scores; the backward recomputes the
scores (flash attention keeps no ``P``) and runs four more GEMMs (``dV``, ``dP``, ``dQ``, ``dK``) and the
softmax's gradient: :class:`AttentionModel` prices those with the platform's ``bmm`` and ``softmax`` models.

Parameters (:func:`~predictor.sources.traces.host_kernels.rnn_params`): ``batch`` B, ``m`` steps T,
``n`` gate width G x H, ``k`` input width, ``dim`` hidden width H, ``elements`` B T G H.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.platforms.schema import Platform

__all__ = ["RNN_KINDS", "BATCH_NORM_KINDS", "ATTENTION_KINDS", "MEMORY_PASS_KINDS", "RecurrentModel",
           "BatchNormModel", "AttentionModel", "MemoryPassModel", "host_op_models"]

#: recurrent-layer kinds timed by :class:`RecurrentModel`
RNN_KINDS = ("rnn", "rnn_bwd")
#: batch-norm kinds timed by :class:`BatchNormModel`
BATCH_NORM_KINDS = ("batch_norm", "batch_norm_bwd")
#: fused attention kinds timed by :class:`AttentionModel`
ATTENTION_KINDS = ("attention", "attention_bwd")
#: one-pass memory kinds timed by :class:`MemoryPassModel`: ``fill`` (``zero_``, ``fill_``, random
#: initialisation) writes its tensor, ``reduce`` (``sum``/``mean``/``amax`` over any dims) reads its input
MEMORY_PASS_KINDS = ("fill", "reduce")


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


class AttentionModel(KernelModel):
    """Fused attention = its batched GEMMs (``model_for("bmm")``) + its softmax (``model_for("softmax")``).

    Parameters: ``batch`` B x heads, ``m`` query length T, ``n`` key length S, ``k`` head width D.
    """

    kinds = ATTENTION_KINDS
    name = "attention-composite"

    def __init__(self, model_for: Callable[[str], KernelModel]) -> None:
        self.model_for = model_for

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        n_tasks = len(tasks)
        bh, t, sk, d = tasks.get("batch"), tasks.get("m"), tasks.get("n"), tasks.get("k")
        dt = tasks.get("dtype_bytes", 4.0)
        ok = np.isfinite(bh) & np.isfinite(t) & np.isfinite(sk) & np.isfinite(d)
        if not ok.any():
            return np.zeros(n_tasks)
        bh, t, sk, d, dt = (np.where(ok, x, 1.0) for x in (bh, t, sk, d, dt))
        bmm = self.model_for("bmm")

        def gemm(m, n, k):
            cols = {"batch": bh, "m": m, "n": n, "k": k, "dtype_bytes": dt, "flops": 2.0 * bh * m * n * k,
                    "bytes": (m * k + k * n + m * n) * bh * dt}
            return bmm.predict(TaskView(cols, n_tasks, "bmm"), platform)

        scores = gemm(t, sk, d)  # Q K^T
        time = scores + gemm(t, d, sk)  # P V
        rows, el = bh * t, bh * t * sk
        sm = {"m": rows, "n": sk, "elements": el, "dtype_bytes": dt, "bytes": 2.0 * el * dt}
        if tasks.kind == "attention_bwd":  # scores again, dV, dP, dQ, dK, the softmax's gradient
            time = time + scores + gemm(sk, d, t) + gemm(t, sk, d) + gemm(t, d, sk) + gemm(sk, d, t)
            time = time + self.model_for("softmax_bwd").predict(
                TaskView({**sm, "bytes": 3.0 * el * dt}, n_tasks, "softmax_bwd"), platform)
        else:
            time = time + self.model_for("softmax").predict(TaskView(sm, n_tasks, "softmax"), platform)
        return np.where(ok, time, 0.0)


class MemoryPassModel(KernelModel):
    """One pass over memory priced with the element-wise model (``model_for("elementwise")``): a ``fill``
    writes ``elements x dtype_bytes`` bytes, a ``reduce`` reads them (its output, one value per reduced
    row or fewer, is not counted). Where the trace gave ``bytes`` and not ``elements``, ``bytes`` is the
    traffic. Linear in the elements above the model's floor."""

    kinds = MEMORY_PASS_KINDS
    name = "memory-pass-composite"

    def __init__(self, model_for: Callable[[str], KernelModel]) -> None:
        self.model_for = model_for

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        n = len(tasks)
        dt = tasks.get("dtype_bytes", 4.0)
        el = tasks.get("elements")
        moved = np.where(np.isfinite(el), el * dt, tasks.get("bytes"))
        moved = np.nan_to_num(moved, nan=0.0)
        view = TaskView({"bytes": moved, "elements": moved / dt, "dtype_bytes": dt}, n, "elementwise")
        return self.model_for("elementwise").predict(view, platform)


def host_op_models(model_for: Callable[[str], KernelModel]) -> list[KernelModel]:
    """The composed models of host ops no calibration benchmarks: dense embedding lookups and gradients
    (:class:`~predictor.timing.kernels.embedding.DenseEmbeddingModel`) and one-pass fills and reductions
    (:class:`MemoryPassModel`), each over ``model_for``'s data-movement / element-wise model."""
    from predictor.timing.kernels.embedding import DenseEmbeddingModel

    return [DenseEmbeddingModel(model_for), MemoryPassModel(model_for)]
