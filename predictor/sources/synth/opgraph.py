"""Operator graph of one training iteration, traced without running the model.

A model (any ``nn.Module``) is built and stepped under :class:`FakeTensorMode`: every tensor
is a *fake* one that carries shape, dtype and device but no data, so a 1.5B-parameter GPT-2
is analysed on a laptop without allocating its 6 GB of weights. A dispatch-level
:class:`TorchDispatchMode` sits above the fake mode and records every ATen operator the
iteration runs — the forward pass, the loss, the backward pass that autograd executes, and
the optimizer step — in execution order.

Per operator: name, phase (forward / backward / optimizer / other), kind (gemm, conv,
attention, embedding, norm, elementwise, copy, view, alloc), FLOPs, bytes read and written,
parameter elements read, the GEMM shape ``m, n, k, batch``, the dtype size, and the
input/output shapes as text.

Memory: every tensor *storage* the iteration allocates is an allocation event when the op
that creates it returns, and a free event when the storage dies (a ``weakref.finalize`` on
the storage object, whose Python object PyTorch keeps alive exactly as long as the C++
storage — so tensors saved by autograd for the backward pass stay allocated until autograd
releases them, as they do in eager execution). Storages alive before the recorded iteration
(weights, optimizer state, the input batch) are the *baseline*. The memory model
(:mod:`predictor.memory`) walks these events; the categories of Centimani §4.2 are assigned
here (:class:`TensorCategory`).

Sizes are affine in the batch size for the models this project traces (activations scale with
the batch, weights do not), and the order of events does not depend on it. So a model is
traced at two batch sizes and every numeric column is interpolated for any other batch
(:class:`ScalableOpGraph`); the two traces are checked to have the same structure, and the
tests check the interpolation against a third trace.

Units: bytes, FLOPs, element counts.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_leaves

__all__ = [
    "Phase",
    "TensorCategory",
    "OP_KINDS",
    "OpGraph",
    "ScalableOpGraph",
    "TrainingLoop",
    "TraceError",
    "trace_training_step",
    "trace_scalable",
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
_K = {k: i for i, k in enumerate(OP_KINDS)}

_GEMM = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "mv", "addmv", "dot"}
_CONV = {"convolution", "_convolution", "convolution_backward", "mkldnn_convolution", "_slow_conv2d_forward",
         "_slow_conv2d_backward", "cudnn_convolution", "convolution_overrideable"}
_EMBED = {"embedding", "embedding_dense_backward", "_embedding_bag", "_embedding_bag_forward_only",
          "_embedding_bag_backward", "_embedding_bag_dense_backward", "_embedding_bag_per_sample_weights_backward",
          "embedding_backward"}
_NORM_PREFIX = ("native_layer_norm", "native_batch_norm", "_native_batch_norm", "native_group_norm",
                "batch_norm", "_batch_norm")
_COPY = {"_to_copy", "copy_", "clone", "cat", "stack", "contiguous", "_copy_from", "index_select", "gather",
         "constant_pad_nd", "repeat", "new_zeros", "zero_", "fill_", "zeros_like", "ones_like", "full_like",
         "zeros", "ones", "full", "_foreach_zero_"}
_ALLOC = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "scalar_tensor",
          "arange", "_local_scalar_dense", "lift_fresh_copy", "detach_", "set_", "resize_"}
_IGNORED_NAMESPACES = {"prim", "profiler"}


# ----------------------------------------------------------------------------- the graph
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
        return np.isin(self.kind, [_K[k] for k in kinds])

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


# ----------------------------------------------------------------------------- the loop
class TrainingLoop:
    """One training iteration of ``model`` in a given precision: the same code runs under fake
    tensors (tracing) and for real (the measurements that validate the trace).

    ``precision``: ``fp32``; ``bf16``/``fp16`` = low-precision weights and activations with
    fp32 master weights, master gradients and optimizer state (the mixed-precision recipe of
    Micikevicius et al. that Megatron and DeepSpeed use); ``amp_bf16``/``amp_fp16`` =
    ``torch.autocast`` around forward and loss (fp32 weights, low-precision copies cached per
    iteration). ``optimizer``: ``adamw``, ``adam``, ``sgd`` (momentum 0.9) or ``none``.
    """

    def __init__(
        self,
        model: nn.Module,
        make_batch: Callable[[int], tuple[tuple, object]],
        loss_fn: Callable[[object, object], torch.Tensor],
        batch: int,
        *,
        precision: str = "fp32",
        optimizer: str = "adamw",
        on_phase: Callable[[Phase], None] | None = None,
    ) -> None:
        if precision not in PRECISIONS:
            raise TraceError(f"precision must be one of {', '.join(PRECISIONS)} (got {precision!r})")
        self.precision = precision
        self.on_phase = on_phase or (lambda p: None)
        low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        if low is not None:
            _cast_floating(model, low)
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master: list[torch.Tensor] = []
        if low is not None:
            self.master = [p.detach().float() for p in self.params]
            for m in self.master:
                m.requires_grad_(True)
        self.amp_dtype = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}.get(precision)
        opt_params = self.master or self.params
        self.optimizer = _make_optimizer(optimizer, opt_params)
        args, self.target = make_batch(batch)
        args = args if isinstance(args, tuple) else (args,)
        if low is not None:  # low-precision weights take low-precision floating inputs
            args = tuple(a.to(low) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        self.inputs = args
        self.loss_fn = loss_fn

    def step(self) -> None:
        """zero_grad, forward + loss, backward, optimizer step (phases reported to ``on_phase``)."""
        self.on_phase(Phase.OTHER)
        for p in self.params:
            p.grad = None
        for m in self.master:
            m.grad = None
        self.on_phase(Phase.FORWARD)
        ctx = torch.autocast("cpu", dtype=self.amp_dtype) if self.amp_dtype is not None else contextlib.nullcontext()
        with ctx:
            out = self.model(*self.inputs)
            loss = self.loss_fn(out, self.target)
        del out
        self.on_phase(Phase.BACKWARD)
        loss.backward()
        del loss
        self.on_phase(Phase.OPTIMIZER)
        if self.master:
            with torch.no_grad():
                for p, m in zip(self.params, self.master, strict=True):
                    m.grad = None if p.grad is None else p.grad.float()
        if self.optimizer is not None:
            self.optimizer.step()
        if self.master:
            with torch.no_grad():
                for p, m in zip(self.params, self.master, strict=True):
                    p.copy_(m)
                    m.grad = None
        self.on_phase(Phase.OTHER)

    def state_tensors(self) -> Iterator[torch.Tensor]:
        """Optimizer state tensors (after at least one step)."""
        if self.optimizer is None:
            return
        for st in self.optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    yield v


def _cast_floating(model: nn.Module, dtype: torch.dtype) -> None:
    """``model.to(dtype)`` for floating parameters and buffers, without swapping tensor subclasses.

    (``Module.to`` swaps the parameter objects of tensor subclasses such as fake tensors,
    which fails; rebinding new Parameters works for real and fake tensors alike, and keeps
    tied weights tied.)
    """
    memo: dict[int, nn.Parameter] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or not p.is_floating_point():
                continue
            if id(p) not in memo:
                memo[id(p)] = nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
            mod._parameters[name] = memo[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is not None and b.is_floating_point():
                mod._buffers[name] = b.to(dtype)


def _make_optimizer(name: str, params: list[torch.Tensor]) -> torch.optim.Optimizer | None:
    if name == "none" or not params:
        return None
    # foreach/fused off: the per-parameter loop is the default on CPU and what the trace times
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=False)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=False)
    raise TraceError(f"optimizer must be adamw, adam, sgd or none (got {name!r})")


# ----------------------------------------------------------------------------- recorder
def _short_name(func) -> str:
    return func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)


def _classify(name: str, func) -> int:
    if name in _GEMM:
        return _K["gemm"]
    if name in _CONV:
        return _K["conv"]
    if "scaled_dot_product" in name or name.startswith(("_flash_attention", "_efficient_attention")):
        return _K["attention"]
    if name in _EMBED:
        return _K["embedding"]
    if name.startswith(_NORM_PREFIX):
        return _K["norm"]
    if name in _ALLOC:
        return _K["alloc"]
    if getattr(func, "is_view", False) or name in ("detach", "alias", "split", "split_with_sizes", "unbind", "chunk"):
        return _K["view"]
    if name in _COPY:
        return _K["copy"]
    return _K["elementwise"]


def _tensor_bytes(t: torch.Tensor) -> float:
    return float(t.numel() * t.element_size())


def _shape_text(ts: list[torch.Tensor]) -> str:
    return ",".join(str(list(t.shape)) for t in ts)


class _Recorder:
    """Builds an :class:`OpGraph` while a TorchDispatchMode feeds it operators."""

    def __init__(self) -> None:
        self.phase = Phase.OTHER
        self.closed = False
        self.names: dict[str, int] = {}
        self.cols: dict[str, list] = {k: [] for k in ("op_name", "phase", "kind", "flops", "bytes_read",
                                                     "bytes_written", "param_elems", "m", "n", "k", "gemm_batch",
                                                     "dtype_bytes")}
        self.shapes: list[str] = []
        self.in_ptr = [0]
        self.in_tensor: list[int] = []
        self.in_bytes: list[float] = []
        self.out_ptr = [0]
        self.out_tensor: list[int] = []
        # tensors (storages)
        self.live: dict[int, int] = {}  # storage cdata -> tensor id
        self.t_nbytes: list[float] = []
        self.t_phase: list[int] = []
        self.t_baseline: list[bool] = []
        self.t_alloc_op: list[int] = []
        self.t_free_op: list[int] = []
        self.t_reads: list[int] = []
        self.t_cast_of_weight: list[bool] = []
        self.t_category: dict[int, int] = {}
        self.weight_ids: set[int] = set()
        self.ev_tensor: list[int] = []
        self.ev_sign: list[int] = []
        self.ev_op: list[int] = []
        self._finalizers: list[weakref.finalize] = []

    # ------------------------------------------------------------ tensors
    def _new_tensor(self, storage, baseline: bool) -> int:
        tid = len(self.t_nbytes)
        key = storage._cdata
        self.live[key] = tid
        self.t_nbytes.append(float(storage.nbytes()))
        self.t_phase.append(int(self.phase))
        self.t_baseline.append(baseline)
        self.t_alloc_op.append(-1 if baseline else self.n_ops)
        self.t_free_op.append(-1)
        self.t_reads.append(0)
        self.t_cast_of_weight.append(False)
        self._finalizers.append(weakref.finalize(storage, self._release, key, tid))
        if not baseline:
            self.ev_tensor.append(tid)
            self.ev_sign.append(1)
            self.ev_op.append(self.n_ops)
        return tid

    def _release(self, key: int, tid: int) -> None:
        if self.closed:
            return
        if self.live.get(key) == tid:
            del self.live[key]
        self.t_free_op[tid] = self.n_ops
        self.ev_tensor.append(tid)
        self.ev_sign.append(-1)
        self.ev_op.append(self.n_ops)

    def register_baseline(self, t: torch.Tensor, category: TensorCategory) -> int:
        """A storage alive before the recorded iteration (weights, optimizer state, inputs)."""
        s = t.untyped_storage()
        tid = self.live.get(s._cdata)
        if tid is None:
            tid = self._new_tensor(s, baseline=True)
        self.t_category.setdefault(tid, int(category))
        if self.t_category[tid] == TensorCategory.WEIGHTS:
            self.weight_ids.add(tid)
        return tid

    def tensor_id(self, t: torch.Tensor, *, as_output: bool) -> int:
        s = t.untyped_storage()
        tid = self.live.get(s._cdata)
        if tid is None:
            # an input nobody registered existed before the iteration: baseline
            tid = self._new_tensor(s, baseline=not as_output)
        return tid

    @property
    def n_ops(self) -> int:
        return len(self.cols["op_name"])

    # ------------------------------------------------------------ operators
    def record(self, func, args, kwargs, out) -> None:
        name = _short_name(func)
        kind = _classify(name, func)
        ins = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        outs = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
        in_ids = [self.tensor_id(t, as_output=False) for t in ins]
        for tid in in_ids:
            self.t_reads[tid] += 1
        out_ids = [self.tensor_id(t, as_output=True) for t in outs]
        weights = self.weight_ids
        param_elems = float(sum(t.numel() for t, tid in zip(ins, in_ids, strict=True)
                                if tid in weights or self.t_cast_of_weight[tid]))
        if name == "_to_copy" and in_ids and (in_ids[0] in weights) and out_ids and self.phase == Phase.FORWARD:
            self.t_cast_of_weight[out_ids[0]] = True
        flops, read, written, gemm = _costs(name, kind, func, args, kwargs, ins, outs, out)
        c = self.cols
        c["op_name"].append(self.names.setdefault(str(func), len(self.names)))
        c["phase"].append(int(self.phase))
        c["kind"].append(kind)
        c["flops"].append(flops)
        c["bytes_read"].append(read)
        c["bytes_written"].append(written)
        c["param_elems"].append(param_elems)
        for key, v in zip(("m", "n", "k", "gemm_batch"), gemm, strict=True):
            c[key].append(v)
        ref = ins[1] if kind == _K["gemm"] and len(ins) > 1 else (ins[0] if ins else (outs[0] if outs else None))
        c["dtype_bytes"].append(float(ref.element_size()) if ref is not None else np.nan)
        self.shapes.append(f"{_shape_text(ins)} -> {_shape_text(outs)}")
        for tid, t in zip(in_ids, ins, strict=True):
            self.in_tensor.append(tid)
            self.in_bytes.append(_tensor_bytes(t))
        self.in_ptr.append(len(self.in_tensor))
        self.out_tensor.extend(out_ids)
        self.out_ptr.append(len(self.out_tensor))

    # ------------------------------------------------------------ freezing
    def close(self) -> None:
        self.closed = True
        for f in self._finalizers:
            f.detach()

    def categories(self, grads: set[int], states: set[int], master: set[int]) -> np.ndarray:
        n = len(self.t_nbytes)
        cat = np.full(n, int(TensorCategory.INPUT_OUTPUT), dtype=np.int8)
        for tid in range(n):
            pre = self.t_category.get(tid)
            if pre is not None:
                cat[tid] = pre
                continue
            if tid in grads:
                cat[tid] = TensorCategory.GRADIENTS
                continue
            if tid in states or tid in master or self.t_cast_of_weight[tid]:
                cat[tid] = TensorCategory.ALGORITHM
                continue
            if self.t_baseline[tid]:
                continue
            freed = self.t_free_op[tid]
            phase = self.t_phase[tid]
            temporary_of_step = phase in (Phase.OPTIMIZER, Phase.OTHER)
            consumed_at_once = self.t_reads[tid] <= 1 and freed - self.t_alloc_op[tid] <= 2
            if freed >= 0 and (temporary_of_step or consumed_at_once):
                cat[tid] = TensorCategory.EPHEMERAL
        return cat


class _Mode:
    """Factory for the recording TorchDispatchMode (imported lazily: private torch API)."""

    @staticmethod
    def make(rec: _Recorder):
        from torch.utils._python_dispatch import TorchDispatchMode

        class RecordingMode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if getattr(func, "namespace", "aten") not in _IGNORED_NAMESPACES:
                    rec.record(func, args, kwargs, out)
                return out

        return RecordingMode()


# ----------------------------------------------------------------------------- costs
def _costs(name, kind, func, args, kwargs, ins, outs, out) -> tuple[float, float, float, tuple]:
    """(FLOPs, bytes read, bytes written, (m, n, k, batch)) of one operator."""
    nan = float("nan")
    gemm = (nan, nan, nan, nan)
    if kind in (_K["view"], _K["alloc"]):
        return 0.0, 0.0, 0.0, gemm
    read = float(sum(_tensor_bytes(t) for t in {id(t): t for t in ins}.values()))
    written = float(sum(_tensor_bytes(t) for t in outs))
    out_elems = float(sum(t.numel() for t in outs))
    in_elems = float(max((t.numel() for t in ins), default=0))
    flops = max(out_elems, in_elems)
    if kind == _K["gemm"]:
        gemm = _gemm_shape(name, ins)
        flops = _registry_flops(func, args, kwargs, out)
        if np.isnan(flops):
            m, n, k, b = gemm
            flops = 2.0 * m * n * k * b
    elif kind in (_K["conv"], _K["attention"]):
        flops = _registry_flops(func, args, kwargs, out)
        if np.isnan(flops):
            flops = _attention_flops(name, ins) if kind == _K["attention"] else 2.0 * out_elems
    elif kind == _K["embedding"]:
        read, written = _embedding_bytes(name, ins, outs)
        flops = out_elems
    elif kind == _K["norm"]:
        flops = 5.0 * in_elems
    return float(flops), read, written, gemm


def _gemm_shape(name: str, ins: list[torch.Tensor]) -> tuple[float, float, float, float]:
    nan = float("nan")
    mats = [t for t in ins if t.dim() >= 2]
    if name in ("mm", "addmm", "_scaled_mm") and len(mats) >= 2:
        a, b = mats[-2], mats[-1]
        return float(a.shape[0]), float(b.shape[1]), float(a.shape[1]), 1.0
    if name in ("bmm", "baddbmm") and len(mats) >= 2:
        a, b = mats[-2], mats[-1]
        return float(a.shape[1]), float(b.shape[2]), float(a.shape[2]), float(a.shape[0])
    return nan, nan, nan, nan


def _registry_flops(func, args, kwargs, out) -> float:
    """FLOPs from PyTorch's own formulas (``torch.utils.flop_counter``), NaN when it has none."""
    try:
        from torch.utils.flop_counter import flop_registry
    except ImportError:  # pragma: no cover - very old torch
        return float("nan")
    fn = flop_registry.get(getattr(func, "_overloadpacket", None))
    if fn is None:
        return float("nan")
    try:
        return float(fn(*args, **kwargs, out_val=out))
    except Exception:  # the formula does not accept these arguments: the caller falls back
        return float("nan")


def _attention_flops(name: str, ins: list[torch.Tensor]) -> float:
    """Scaled-dot-product attention: 2 batched matmuls forward, 5 backward (FlopCounter's count)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    four = [t for t in ins if t.dim() == 4]
    try:
        if "backward" in name and len(four) >= 4:
            g, q, k, v = four[0], four[1], four[2], four[3]
            return float(sdpa_backward_flop_count(g.shape, q.shape, k.shape, v.shape))
        if len(four) >= 3:
            q, k, v = four[0], four[1], four[2]
            return float(sdpa_flop_count(q.shape, k.shape, v.shape))
    except Exception:
        pass
    return float(sum(t.numel() for t in ins))


def _embedding_bytes(name: str, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> tuple[float, float]:
    """Lookups move the rows they gather, not the whole table."""
    idx = [t for t in ins if not t.is_floating_point()]
    idx_bytes = float(sum(_tensor_bytes(t) for t in idx))
    out_bytes = float(sum(_tensor_bytes(t) for t in outs))
    if "backward" in name:
        grads = [t for t in ins if t.is_floating_point()]
        g = float(sum(_tensor_bytes(t) for t in grads))
        # dense backward: read the output gradient and indices, write (zero + scatter) the table grad
        return g + idx_bytes, out_bytes
    # gathered rows: one row per looked-up index
    table = next((t for t in ins if t.is_floating_point() and t.dim() == 2), None)
    rows = float(sum(t.numel() for t in idx[:1])) if idx else 0.0
    gathered = rows * (table.shape[1] * table.element_size() if table is not None else 0.0)
    return gathered + idx_bytes, out_bytes


# ----------------------------------------------------------------------------- tracing
def trace_training_step(
    build: Callable[[], nn.Module],
    make_batch: Callable[[int], tuple[tuple, object]],
    loss_fn: Callable[[object, object], torch.Tensor],
    batch: int,
    *,
    precision: str = "fp32",
    optimizer: str = "adamw",
) -> OpGraph:
    """Trace one steady-state training iteration at ``batch`` under fake tensors.

    An unrecorded warm-up iteration creates the optimizer state first, so the recorded one
    starts as every later iteration does: weights, optimizer state and the previous
    iteration's gradients alive. Nothing is allocated for real.

    Raises:
        TraceError: the model cannot be built or stepped under fake tensors.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    if batch < 1:
        raise TraceError(f"batch size must be >= 1 (got {batch})")
    rec = _Recorder()
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = build()
            if not isinstance(model, nn.Module):
                raise TraceError(f"the model factory returned {type(model).__name__}, not an nn.Module")
            model.train()
            loop = TrainingLoop(model, make_batch, loss_fn, batch, precision=precision, optimizer=optimizer)
            loop.step()  # warm-up: optimizer state
            for p in loop.model.parameters():
                rec.register_baseline(p, TensorCategory.WEIGHTS)
            for b in loop.model.buffers():
                rec.register_baseline(b, TensorCategory.WEIGHTS)
            for m in loop.master:
                rec.register_baseline(m, TensorCategory.ALGORITHM)
            for s in loop.state_tensors():
                rec.register_baseline(s, TensorCategory.ALGORITHM)
            for p in loop.params:
                if p.grad is not None:
                    rec.register_baseline(p.grad, TensorCategory.GRADIENTS)
            for x in tree_leaves((loop.inputs, loop.target)):
                if isinstance(x, torch.Tensor):
                    rec.register_baseline(x, TensorCategory.INPUT_OUTPUT)
            grads: set[int] = set()
            master_grads: set[int] = set()

            def on_phase(p: Phase) -> None:
                if rec.phase == Phase.BACKWARD and p == Phase.OPTIMIZER:
                    for q in loop.params:
                        if q.grad is not None:
                            tid = rec.live.get(q.grad.untyped_storage()._cdata)
                            if tid is not None:
                                grads.add(tid)
                if rec.phase == Phase.OPTIMIZER and p == Phase.OTHER:
                    for m in loop.master:
                        if m.grad is not None:
                            tid = rec.live.get(m.grad.untyped_storage()._cdata)
                            if tid is not None:
                                master_grads.add(tid)
                rec.phase = p

            loop.on_phase = on_phase
            grad_of_param = {}
            with _Mode.make(rec):
                loop.step()
                for i, q in enumerate(loop.params):
                    if q.grad is not None:
                        grad_of_param[i] = q.grad
            # capture before the loop object (and its tensors) go away
            grad_ids = [rec.live.get(grad_of_param[i].untyped_storage()._cdata, -1) if i in grad_of_param else -1
                        for i in range(len(loop.params))]
            states = {rec.live[s.untyped_storage()._cdata] for s in loop.state_tensors()
                      if s.untyped_storage()._cdata in rec.live}
            master = {rec.live[m.untyped_storage()._cdata] for m in loop.master if m.untyped_storage()._cdata in rec.live}
            n_params = int(sum(p.numel() for p in loop.params))
            param_grad_bytes = [float(p.numel() * p.element_size()) for p in loop.params]
    except TraceError:
        rec.close()
        raise
    except Exception as exc:  # an op without a fake implementation, a shape error in the model, ...
        rec.close()
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TraceError(f"cannot trace the model under fake tensors: {type(exc).__name__}: {msg}") from None
    rec.close()
    cat = rec.categories(grads, states, master | master_grads)
    ev_tensor, ev_sign, ev_op = _canonical_events(rec.ev_tensor, rec.ev_sign, rec.ev_op)
    alloc_op = np.asarray(rec.t_alloc_op)
    grad_ready = np.asarray([alloc_op[g] if g >= 0 else -1 for g in grad_ids], dtype=np.int64)
    c = rec.cols
    f64 = lambda k: np.asarray(c[k], dtype=np.float64)  # noqa: E731
    return OpGraph(
        batch=int(batch),
        precision=precision,
        names=list(rec.names),
        op_name=np.asarray(c["op_name"], dtype=np.int32),
        phase=np.asarray(c["phase"], dtype=np.int8),
        kind=np.asarray(c["kind"], dtype=np.int8),
        flops=f64("flops"),
        bytes_read=f64("bytes_read"),
        bytes_written=f64("bytes_written"),
        param_elems=f64("param_elems"),
        m=f64("m"),
        n=f64("n"),
        k=f64("k"),
        gemm_batch=f64("gemm_batch"),
        dtype_bytes=f64("dtype_bytes"),
        shapes=rec.shapes,
        in_ptr=np.asarray(rec.in_ptr, dtype=np.int64),
        in_tensor=np.asarray(rec.in_tensor, dtype=np.int64),
        in_bytes=np.asarray(rec.in_bytes, dtype=np.float64),
        out_ptr=np.asarray(rec.out_ptr, dtype=np.int64),
        out_tensor=np.asarray(rec.out_tensor, dtype=np.int64),
        nbytes=np.asarray(rec.t_nbytes, dtype=np.float64),
        category=cat,
        alloc_phase=np.asarray(rec.t_phase, dtype=np.int8),
        baseline=np.asarray(rec.t_baseline, dtype=bool),
        ev_tensor=ev_tensor,
        ev_sign=ev_sign,
        ev_op=ev_op,
        grad_ready_op=grad_ready,
        grad_bytes=np.asarray(param_grad_bytes, dtype=np.float64),
        n_params=n_params,
        meta={"optimizer": optimizer},
    )


def _canonical_events(tensor: list[int], sign: list[int], op: list[int]) -> tuple[np.ndarray, ...]:
    """Events with each run of consecutive frees (or allocations) between two ops sorted by tensor.

    Python may release the objects of one deallocation cascade in any order; within such a run
    the order cannot change any peak (a run of frees only decreases the live bytes), so sorting
    makes traces at different batch sizes comparable event by event.
    """
    t = np.asarray(tensor, dtype=np.int64)
    s = np.asarray(sign, dtype=np.int8)
    o = np.asarray(op, dtype=np.int64)
    if t.size == 0:
        return t, s, o
    new_run = np.ones(t.size, dtype=bool)
    new_run[1:] = (s[1:] != s[:-1]) | (o[1:] != o[:-1])
    run = np.cumsum(new_run)
    order = np.lexsort((t, run))
    return t[order], s[order], o[order]


def trace_scalable(
    build: Callable[[], nn.Module],
    make_batch: Callable[[int], tuple[tuple, object]],
    loss_fn: Callable[[object, object], torch.Tensor],
    *,
    precision: str = "fp32",
    optimizer: str = "adamw",
    batches: tuple[int, int] = (2, 3),
) -> ScalableOpGraph:
    """Trace at two batch sizes and return the interpolating :class:`ScalableOpGraph`."""
    lo = trace_training_step(build, make_batch, loss_fn, batches[0], precision=precision, optimizer=optimizer)
    hi = trace_training_step(build, make_batch, loss_fn, batches[1], precision=precision, optimizer=optimizer)
    return ScalableOpGraph(lo, hi)
