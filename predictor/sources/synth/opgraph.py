"""Operator graph of one training iteration: the operators, their costs and the tensors' lifetimes.

:func:`predictor.sources.synth.op_trace.trace_training_step` records an :class:`OpGraph` by running
one iteration under fake tensors. Per operator: name, phase (forward / backward / optimizer /
other), kind (gemm, conv, attention, embedding, norm, elementwise, copy, view, alloc), FLOPs,
bytes read and written, parameter elements read, the GEMM shape ``m, n, k, batch``, the dtype
size, and the input/output shapes as text.

Memory: every tensor *storage* the iteration allocates is an allocation event when the op
that creates it returns, and a free event when the storage dies. Storages alive before the
recorded iteration (weights, optimizer state, the input batch) are the *baseline*. The memory
model (:mod:`predictor.memory`) walks these events; each storage is in one of the categories of
Centimani §4.2 (:class:`TensorCategory`).

Sizes are affine in the batch size for the models this project traces (activations scale with
the batch, weights do not), and the order of events does not depend on it. So a model is
traced at two batch sizes and every numeric column is interpolated for any other batch
(:class:`ScalableOpGraph`); the two traces are checked to have the same structure, and the
tests check the interpolation against a third trace.

Units: bytes, FLOPs, element counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np

__all__ = [
    "Phase",
    "TensorCategory",
    "CATEGORY_NAMES",
    "OP_KINDS",
    "OP_KIND_INDEX",
    "OpGraph",
    "ScalableOpGraph",
    "TraceError",
    "PRECISIONS",
]

#: training precisions: fp32; mixed precision with low-precision weights/activations and fp32
#: master weights + optimizer state (Megatron / DeepSpeed style); torch.autocast (fp32 weights)
PRECISIONS = ("fp32", "bf16", "fp16", "amp_bf16", "amp_fp16")


class TraceError(ValueError):
    """The model cannot be traced (an op without a fake/meta implementation, a bad input...)."""


class Phase(IntEnum):
    """Where in the iteration an operator runs."""

    FORWARD = 0  #: forward pass and loss
    BACKWARD = 1  #: autograd's backward pass
    OPTIMIZER = 2  #: optimizer step (with master-weight copies for mixed precision)
    OTHER = 3  #: zero_grad and bookkeeping


class TensorCategory(IntEnum):
    """The five tensor categories of Centimani §4.2 (data classification)."""

    INPUT_OUTPUT = 0  #: the input batch, activations, activation gradients
    WEIGHTS = 1  #: weights and biases (and buffers such as BatchNorm statistics)
    GRADIENTS = 2  #: weight gradients (``param.grad``)
    ALGORITHM = 3  #: optimizer state, fp32 master weights/grads, autocast weight copies
    EPHEMERAL = 4  #: short-lived temporaries (within one consumer, or inside the optimizer step)


CATEGORY_NAMES = ("input_output", "weights", "gradients", "algorithm", "ephemeral")

#: op kinds, in the order of the ``kind`` column
OP_KINDS = ("gemm", "conv", "attention", "embedding", "norm", "elementwise", "copy", "view", "alloc")
#: op kind -> its value in the ``kind`` column
OP_KIND_INDEX = {k: i for i, k in enumerate(OP_KINDS)}


@dataclass
class OpGraph:
    """Operators and tensor lifetimes of one traced training iteration (columnar).

    Operator columns (length ``n_ops``): ``op_name`` (index into ``names``), ``phase``
    (:class:`Phase`), ``kind`` (index into :data:`OP_KINDS`), ``flops``, ``bytes_read``,
    ``bytes_written``, ``param_elems`` (parameter elements the op reads), ``m``, ``n``, ``k``,
    ``gemm_batch`` (NaN when not a GEMM), ``dtype_bytes``; ``shapes`` (text, for people).
    Operand lists (CSR): ``in_ptr``/``in_tensor``/``in_bytes`` and ``out_ptr``/``out_tensor``
    (tensor ids) — bytes of the operand *view*, not of its whole storage.

    Tensor columns (length ``n_tensors``, one per storage): ``nbytes``, ``category``
    (:class:`TensorCategory`), ``alloc_phase``, ``baseline`` (alive before the iteration).

    Event columns (length ``n_events``, chronological): ``ev_tensor``, ``ev_sign`` (+1 alloc,
    -1 free) and ``ev_op`` (operators recorded before the event: an allocation by op ``i``
    has ``ev_op = i``, a free between ops ``i`` and ``i+1`` has ``ev_op = i + 1``).

    ``grad_ready_op[p]``: the op that produced parameter ``p``'s gradient (−1 if none);
    ``param_bytes[p]``: its gradient's size, bytes — for gradient all-reduce buckets.
    """

    batch: int
    precision: str
    names: list[str]
    op_name: np.ndarray
    phase: np.ndarray
    kind: np.ndarray
    flops: np.ndarray
    bytes_read: np.ndarray
    bytes_written: np.ndarray
    param_elems: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    gemm_batch: np.ndarray
    dtype_bytes: np.ndarray
    shapes: list[str]
    in_ptr: np.ndarray
    in_tensor: np.ndarray
    in_bytes: np.ndarray
    out_ptr: np.ndarray
    out_tensor: np.ndarray
    nbytes: np.ndarray
    category: np.ndarray
    alloc_phase: np.ndarray
    baseline: np.ndarray
    ev_tensor: np.ndarray
    ev_sign: np.ndarray
    ev_op: np.ndarray
    grad_ready_op: np.ndarray
    grad_bytes: np.ndarray
    n_params: int
    meta: dict = field(default_factory=dict)

    #: numeric columns that scale with the batch size (see :class:`ScalableOpGraph`)
    SCALED = ("flops", "bytes_read", "bytes_written", "m", "n", "k", "gemm_batch", "in_bytes", "nbytes", "grad_bytes")

    @property
    def n_ops(self) -> int:
        return int(self.op_name.shape[0])

    @property
    def n_tensors(self) -> int:
        return int(self.nbytes.shape[0])

    @property
    def n_events(self) -> int:
        return int(self.ev_tensor.shape[0])

    def kind_mask(self, *kinds: str) -> np.ndarray:
        """Mask of the operators of the given kinds."""
        return np.isin(self.kind, [OP_KIND_INDEX[k] for k in kinds])

    def total_flops(self, phase: Phase | None = None) -> float:
        """FLOPs of the iteration (or of one phase)."""
        f = np.nan_to_num(self.flops)
        return float(f.sum() if phase is None else f[self.phase == phase].sum())

    def weight_bytes(self) -> float:
        """Bytes of the weights and biases (baseline WEIGHTS storages)."""
        return float(self.nbytes[self.category == TensorCategory.WEIGHTS].sum())

    def ops_frame(self):
        """Operators as a DataFrame (for reports and analysis, not hot loops)."""
        import pandas as pd

        return pd.DataFrame(
            {
                "op": np.asarray(self.names, dtype=object)[self.op_name],
                "phase": [Phase(p).name.lower() for p in self.phase],
                "kind": np.asarray(OP_KINDS, dtype=object)[self.kind],
                "flops": self.flops,
                "bytes_read": self.bytes_read,
                "bytes_written": self.bytes_written,
                "param_elems": self.param_elems,
                "dtype_bytes": self.dtype_bytes,
                "shapes": self.shapes,
            }
        )


@dataclass
class ScalableOpGraph:
    """Two traces of the same model at batch sizes ``lo.batch < hi.batch``; :meth:`at` interpolates.

    Every column of :attr:`OpGraph.SCALED` is affine in the batch size; all other columns
    (operator sequence, kinds, event order, categories) must be identical in both traces,
    which the constructor checks.
    """

    lo: OpGraph
    hi: OpGraph

    def __post_init__(self) -> None:
        a, b = self.lo, self.hi
        if a.batch >= b.batch:
            raise TraceError("ScalableOpGraph needs two traces with increasing batch sizes")
        same = (
            a.n_ops == b.n_ops
            and a.n_events == b.n_events
            and a.n_tensors == b.n_tensors
            and np.array_equal(a.op_name, b.op_name)
            and [a.names[i] for i in a.op_name] == [b.names[i] for i in b.op_name]
            and np.array_equal(a.ev_tensor, b.ev_tensor)
            and np.array_equal(a.ev_sign, b.ev_sign)
            and np.array_equal(a.category, b.category)
            and np.array_equal(a.in_tensor, b.in_tensor)
        )
        if not same:
            raise TraceError(
                f"the traces at batch {a.batch} and {b.batch} differ in structure; the model's op sequence "
                "depends on the batch size, so it must be traced at every candidate batch"
            )

    @property
    def n_params(self) -> int:
        return self.lo.n_params

    def at(self, batch: int) -> OpGraph:
        """The trace at ``batch`` (exact for the two traced sizes, interpolated otherwise)."""
        if batch == self.lo.batch:
            return self.lo
        if batch == self.hi.batch:
            return self.hi
        t = (batch - self.lo.batch) / (self.hi.batch - self.lo.batch)
        cols = {}
        for name in OpGraph.SCALED:
            x0 = getattr(self.lo, name)
            x1 = getattr(self.hi, name)
            cols[name] = x0 + (x1 - x0) * t
        # sizes are whole bytes and never negative
        cols["nbytes"] = np.maximum(np.round(cols["nbytes"]), 0.0)
        return replace(self.lo, batch=int(batch), shapes=[f"(scaled to batch {batch})"] * self.lo.n_ops, **cols)
