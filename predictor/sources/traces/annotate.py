"""Prepare a captured run for what-if transforms: per-step graphs whose tasks know their shapes.

:func:`annotate` takes the replay graph of :func:`~predictor.sources.traces.build.build_graph` and
the traces it came from, and returns one :class:`~predictor.graph.ExecutionGraph` per
ProfilerStep with the *auxiliary columns* of :mod:`predictor.graph.edit` that
:mod:`predictor.whatif.apply` edits:

* **Host ops split into kernels (CPU-only ranks).** On a CPU, PyTorch runs every ATen op on
  the calling thread; the replay graph has one task per top-level op (``aten::linear``,
  ``autograd::engine::evaluate_function: AddmmBackward0``). Each is cut, along the Kineto
  op tree, into the ops that do the arithmetic — the outermost GEMM / convolution /
  embedding-bag / layer-norm / softmax / attention op, else every leaf op that touches a
  tensor and is not a view (:data:`VIEW_OPS`) — as *kernel tasks* (category COMPUTE or
  MEMORY, an op kind the kernel models know, parameters from ``Input Dims``) and the time
  between them as host-time tasks (kind ``cpu_op``): the framework's dispatch cost, which
  does not depend on tensor sizes. This is OpEmitter's ``host`` mode read back from a trace.
  GPU ranks keep their tasks; their kernels get parameters from the launching op (build).
* **Batch dependence.** The captured batch size ``B0`` is dim 0 of the first non-parameter
  tensor input of the step's first forward op (override: ``base_batch``). A tensor input is
  a *parameter* if the execution trace says so (tensor ids consumed by the optimizer step
  or by AccumulateGrad, closed under view ops), else if its shape (or transpose) is a
  gradient's shape. For each kernel the parameters are recomputed with the batch dimension
  doubled — a non-parameter tensor's first dimension divisible by ``B0``; for a 2-D GEMM
  the operand roles decide (activation x weight: ``m``; weight x activation: ``n``; two
  activations, the weight-gradient GEMM: ``k``); for ``bmm`` the batch — and the exponent
  ``log2(p(2B)/p(B))`` of every parameter column is stored (``x_m``, ``x_k``, ``x_flops``,
  ...; ``x_work`` for the work of the op). A transform scales a column by ``s ** x``.
* **Structure.** ``op`` (top-level op instance; a T1 gap belongs to the op it precedes),
  ``phase`` (1 forward, 2 backward = ``autograd::engine::evaluate_function`` ops, 3 inside
  ``Optimizer.step#``, 0 other), ``sig`` (name + input shapes of the op and of its kernels:
  repeated layers have equal signatures), ``grad_bytes`` on the last task of each
  AccumulateGrad op (parameter gradients in the order they became ready: DDP buckets),
  ``act_bytes`` / ``x_act`` (bytes of a forward op's first activation input: pipeline
  stage boundaries).
* **Profiler cost removed.** Every profiled event costs time the unprofiled run does not
  spend — about 10 µs per op with the execution-trace observer on this CPU — partly inside
  its own interval, partly just before it starts (:class:`ProfilerCost`). Task ``i`` loses
  ``inside * n_i + before * m_i`` (``n_i``: events starting in ``[a, b)``, ``m_i``: in
  ``(a, b]``). The total per event comes from the capture itself when it recorded iterations
  after its window (``rank{R}.steps.csv`` of :mod:`~predictor.sources.traces.capture`):
  ``(P - U) / E`` for the profiled step ``P``, the unprofiled iteration ``U`` and ``E``
  events; ``inside`` is the median duration of trivial leaf ops (views, ``detach``). Without
  those iterations the sibling-gap cost of :func:`~predictor.sources.traces.overheads.extract_overheads`
  stands for ``before``. ``duration`` is the corrected time; ``measured_raw`` the traced one.
* **Steps combined.** Steps with the same tasks become one graph with the per-task median
  (robust to a step disturbed by other jobs); :func:`combine_captures` does the same over
  several captures of one configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from predictor.graph import Category, ExecutionGraph, ProcKind
from predictor.graph.edit import AUX_KEY, GraphEditor
from predictor.sources.synth.emit import column_sum
from predictor.sources.traces.build import ReplayGraph, _join_et, build_graph
from predictor.sources.traces.errors import TraceError
from predictor.sources.traces.kineto import EventCat, KinetoTrace
from predictor.sources.traces.load import TraceSet
from predictor.sources.traces.ops import dtype_bytes, is_tensor_type, op_params

__all__ = ["AnnotatedTrace", "ProfilerCost", "annotate", "combine_captures", "VIEW_OPS", "host_kernel_kind", "kernel_params",
           "reduction_kind", "PARAM_EXP_COLUMNS"]

#: ops that only make views or metadata (no arithmetic): their time is dispatch cost
VIEW_OPS = frozenset({
    "aten::as_strided", "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::t",
    "aten::transpose", "aten::permute", "aten::expand", "aten::expand_as", "aten::squeeze", "aten::unsqueeze",
    "aten::select", "aten::slice", "aten::narrow", "aten::split", "aten::split_with_sizes", "aten::chunk",
    "aten::unbind", "aten::detach", "detach", "aten::detach_", "aten::alias", "aten::resolve_conj",
    "aten::resolve_neg", "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::result_type",
    "aten::lift_fresh", "aten::view_as", "aten::numpy_T", "aten::flatten", "aten::unflatten", "aten::size",
    "aten::stride", "aten::is_same_size", "aten::_has_compatible_shallow_copy_type", "aten::set_",
    "aten::to", "aten::_to_copy", "aten::contiguous", "aten::matmul", "aten::linear", "aten::zeros",
    "aten::ones", "aten::new_empty", "aten::new_empty_strided", "aten::new_zeros", "aten::item",
    "aten::_local_scalar_dense", "aten::is_nonzero", "aten::type_as", "aten::movedim", "aten::swapaxes",
    "aten::diagonal", "aten::unfold", "aten::indices", "aten::values", "aten::_indices", "aten::_values",
})
#: GEMM ops: kind and the positions of the two matrix operands in the inputs
_GEMM = {"aten::addmm": ("addmm", 1, 2), "aten::mm": ("mm", 0, 1), "aten::bmm": ("bmm", 0, 1),
         "aten::baddbmm": ("bmm", 1, 2), "aten::addbmm": ("bmm", 1, 2), "aten::_scaled_mm": ("mm", 0, 1)}
#: ops timed as one kernel even though they call other ops (their children are not split out)
_STOP = {
    "aten::mkldnn_convolution": "conv2d", "aten::_slow_conv2d_forward": "conv2d", "aten::convolution_backward": "conv2d",
    "aten::_convolution": "conv2d", "aten::thnn_conv2d": "conv2d",
    "aten::_embedding_bag": "embedding_bag_fwd", "aten::_embedding_bag_forward_only": "embedding_bag_fwd",
    "aten::_embedding_bag_backward": "embedding_bag_bwd", "aten::_embedding_bag_dense_backward": "embedding_bag_bwd",
    "aten::_embedding_bag_sparse_backward": "embedding_bag_bwd",
    "aten::embedding": "embedding", "aten::embedding_dense_backward": "embedding_bwd",
    "aten::embedding_backward": "embedding_bwd",
    "aten::native_layer_norm": "layer_norm", "aten::native_layer_norm_backward": "layer_norm_bwd",
    "aten::_softmax": "softmax", "aten::_log_softmax": "softmax",
    "aten::_softmax_backward_data": "softmax_bwd", "aten::_log_softmax_backward_data": "softmax_bwd",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "attention_bwd",
    "aten::_scaled_dot_product_efficient_attention": "attention",
    "aten::_scaled_dot_product_flash_attention": "attention",
    "aten::native_dropout": "dropout", "aten::native_dropout_backward": "mul",
    "aten::nll_loss_forward": "loss", "aten::nll_loss_backward": "loss",
    "aten::cat": "concat", "aten::_cat": "concat", "aten::clone": "memcpy",
}
#: leaf ops -> the element-wise kinds the calibration models (others: "elementwise" or their own)
_ELTWISE = {
    "aten::relu": "relu", "aten::relu_": "relu", "aten::clamp_min": "relu", "aten::clamp_min_": "relu",
    "aten::threshold": "relu", "aten::threshold_backward": "add", "aten::gelu": "gelu", "aten::gelu_backward": "mul",
    "aten::tanh": "tanh", "aten::tanh_backward": "mul", "aten::sigmoid": "sigmoid", "aten::sigmoid_backward": "mul",
    "aten::add": "add", "aten::add_": "add", "aten::sub": "add", "aten::sub_": "add", "aten::rsub": "add",
    "aten::mul": "mul", "aten::mul_": "mul", "aten::div": "mul", "aten::div_": "mul", "aten::copy_": "memcpy",
    "aten::sum": "reduce", "aten::mean": "reduce", "aten::amax": "reduce", "aten::max": "reduce",
    "aten::fill_": "fill", "aten::zero_": "fill", "aten::normal_": "fill", "aten::uniform_": "fill",
    "aten::index_select": "gather", "aten::index_add_": "scatter", "aten::index": "gather",
    "aten::index_put_": "scatter", "aten::_index_put_impl_": "scatter", "aten::sort": "sort", "aten::cumsum": "reduce",
    "aten::pow": "mul", "aten::square": "mul", "aten::sqrt": "mul", "aten::rsqrt": "mul", "aten::addcmul_": "add",
    "aten::addcdiv_": "add", "aten::lerp_": "add", "aten::masked_fill": "mul", "aten::masked_fill_": "mul",
    "aten::where": "mul", "aten::bmm": "bmm",
}
#: parameter columns whose batch exponent is stored (as aux column ``x_<name>``)
PARAM_EXP_COLUMNS = ("m", "n", "k", "batch", "elements", "rows", "dim", "pooling", "msg_bytes")
_PHASE_OTHER, _PHASE_FWD, _PHASE_BWD, _PHASE_OPT = 0, 1, 2, 3
_BWD_PREFIX = "autograd::engine::evaluate_function"
_ACC_GRAD = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
_TRIVIAL = ("aten::as_strided", "aten::resolve_conj", "detach", "aten::alias", "aten::view", "aten::_reshape_alias")


def host_kernel_kind(name: str) -> tuple[str, Category]:
    """(op kind, category) of an ATen op run as a kernel on the CPU thread."""
    g = _GEMM.get(name)
    if g is not None:
        return g[0], Category.COMPUTE
    k = _STOP.get(name)
    if k is not None:
        return k, Category.COMPUTE if k in ("conv2d", "attention", "attention_bwd") else Category.MEMORY
    return _ELTWISE.get(name, "elementwise"), Category.MEMORY


def _summed_dims(concrete: list | None) -> list[int] | None:
    """The ``dim`` list of an ``aten::sum.dim_IntList`` from Kineto's ``Concrete Inputs`` (e.g. ``"[0]"``);
    None when the trace did not record it."""
    for v in (concrete or [])[1:2]:
        if isinstance(v, str) and v.startswith("[") and v.endswith("]"):
            try:
                return [int(x) for x in v[1:-1].split(",") if x.strip()]
            except ValueError:
                return None
    return None


def reduction_kind(name: str, shapes: list, concrete: list | None) -> str:
    """``"sum"`` for an ``aten::sum`` over the leading dims of a tensor of rank 2 or more (a linear layer's bias
    gradient, ``x.sum(0)``: the calibrated column-sum model times it, as the synthesisers'
    :func:`~predictor.sources.synth.emit.column_sum`), else ``"reduce"``."""
    dims = _summed_dims(concrete)
    first = shapes[0] if isinstance(shapes, list) and shapes else None
    if name != "aten::sum" or dims is None or not isinstance(first, list) or len(first) < 2:
        return "reduce"
    rank = len(first)
    dims = sorted(d % rank for d in dims if -rank <= d < rank)
    return "sum" if dims and dims == list(range(len(dims))) and len(dims) < rank else "reduce"


def _tensor_inputs(shapes: list, types: list | None) -> list[tuple[int, list[int]]]:
    """(input position, shape) of every tensor input (lists of tensors are flattened, position kept)."""
    out: list[tuple[int, list[int]]] = []
    for i, s in enumerate(shapes if isinstance(shapes, list) else []):
        t = types[i] if types is not None and i < len(types) else ""
        if isinstance(s, list) and s and all(isinstance(d, int) for d in s) and is_tensor_type(t):
            out.append((i, s))
        elif isinstance(s, list) and s and all(isinstance(x, list) for x in s) and isinstance(t, str) and \
                ("List" in t or t.startswith("GenericList") or t == ""):
            for x in s:
                if x and all(isinstance(d, int) for d in x):
                    out.append((i, x))
    return out


def _numel(s: list[int]) -> float:
    return float(math.prod(s)) if s else 1.0


def _concat_rows(shapes: list[list[int]], dim: int | None = None) -> float:
    """Outer slices of a concatenation: the product of the dims before the concatenated one (each
    input is copied as that many contiguous chunks).

    ``dim`` is the op's argument when the trace recorded it (Kineto's ``Concrete Inputs``); else it
    is the one dim where the inputs' shapes differ, and inputs of equal shapes read as a
    concatenation along the last dim (DLRM's feature interaction; a ``stack``'s unsqueezed inputs
    give one slice either way). Inputs of different ranks read as one slice.
    """
    if not shapes or len({len(s) for s in shapes}) != 1 or not shapes[0]:
        return 1.0
    rank = len(shapes[0])
    if dim is None:
        differ = [d for d in range(rank) if len({s[d] for s in shapes}) > 1]
        dim = differ[0] if len(differ) == 1 else (rank - 1 if not differ else 0)
    dim = dim % rank if -rank <= dim < rank else 0
    return float(math.prod(shapes[0][:dim]))


def _int_arg(concrete: list | None, types: list | None) -> int | None:
    """The first integer scalar argument recorded in Kineto's ``Concrete Inputs`` (None if absent)."""
    for i, v in enumerate(concrete or []):
        t = types[i] if types is not None and i < len(types) else ""
        if t in ("Int", "Scalar", "int") and isinstance(v, str) and v.lstrip("-").isdigit():
            return int(v)
    return None


def kernel_params(kind: str, name: str, shapes: list, types: list | None,
                  concrete: list | None = None) -> dict[str, float]:
    """Kernel-model parameters (PARAM_COLUMNS plus ``flops``/``bytes``) of an op from its input shapes
    (and, where the trace recorded them, its scalar arguments: ``concrete``, Kineto's ``Concrete Inputs``)."""
    if kind in ("addmm", "mm", "bmm", "matmul", "linear", "gemm", "conv2d", "embedding_bag_fwd", "embedding_bag_bwd",
                "embedding_bag_bwd_dense"):
        out = op_params(name, shapes, types, "embedding_bag_bwd" if kind == "embedding_bag_bwd_dense" else kind)
        if not kind.startswith("embedding_bag") and "m" in out:
            b = out.get("batch", 1.0) if kind == "bmm" else 1.0
            dt = out.get("dtype_bytes", 4.0)
            out["bytes"] = (out["m"] * out["k"] + out["k"] * out["n"] + out["m"] * out["n"]) * b * dt
        return out
    ts = _tensor_inputs(shapes, types)
    out: dict[str, float] = {}
    dt = math.nan
    for t in types or []:
        b = dtype_bytes(t) if isinstance(t, str) else math.nan
        if b == b:
            dt = b
            break
    dt = 4.0 if dt != dt else dt
    out["dtype_bytes"] = dt
    if not ts:
        return out
    first = ts[0][1]
    if kind == "sum":  # the leading dims summed (the recorded ones; else all but the last)
        dims = _summed_dims(concrete)
        lead = len(dims) if dims else len(first) - 1
        out.update(column_sum(name, _numel(first[:lead]), _numel(first[lead:]), dt)[3])  # the synthesisers' params
        return out
    if kind in ("layer_norm", "layer_norm_bwd", "softmax", "softmax_bwd"):
        x = first if kind in ("layer_norm", "softmax") else (ts[1][1] if len(ts) > 1 else first)
        out.update(m=_numel(x[:-1]), n=float(x[-1]), elements=_numel(x))
        out["bytes"] = (2.0 if kind in ("layer_norm", "softmax") else 3.0) * out["elements"] * dt
        return out
    if kind in ("attention", "attention_bwd") and len(ts) >= 3 and len(first) == 4:
        b, h, t, d = first
        s = ts[1][1][2] if len(ts[1][1]) == 4 else t
        out.update(batch=float(b * h), m=float(t), n=float(s), k=float(d), elements=_numel(first))
        out["flops"] = (4.0 if kind == "attention" else 10.0) * b * h * t * s * d
        out["bytes"] = 4.0 * _numel(first) * dt
        return out
    if kind in ("embedding", "embedding_bwd") and len(ts) >= 2:
        w, idx = ts[0][1], ts[1][1]
        if kind == "embedding_bwd":  # grad, indices, num_weights, ...
            out.update(elements=_numel(w), rows=math.nan)
        else:
            out.update(elements=_numel(idx) * float(w[-1]), dim=float(w[-1]), rows=float(w[0]))
        out["bytes"] = 2.0 * out["elements"] * dt
        return out
    if kind == "concat":
        el = sum(_numel(s) for _, s in ts)
        out.update(elements=el, bytes=2.0 * el * dt, parts=float(len(ts)),
                   batch=_concat_rows([s for _, s in ts], _int_arg(concrete, types)))
        return out
    if kind == "gather" and name == "aten::index_select" and len(ts) >= 2:
        src, idx = ts[0][1], ts[-1][1]
        el = _numel(idx) * _numel(src[1:])
        out.update(elements=el, bytes=2.0 * el * dt)
        return out
    if kind == "scatter" and len(ts) >= 2:
        el = _numel(ts[-1][1])  # the source / values written
        out.update(elements=el, bytes=3.0 * el * dt)
        return out
    el = max(_numel(s) for _, s in ts)
    reads = sum(_numel(s) for _, s in ts)
    writes = 0.0 if name.endswith("_") else el
    out.update(elements=el, bytes=(reads + writes) * dt)
    return out


# ----------------------------------------------------------------------------- event tree
@dataclass
class _Tree:
    """CPU-side events of one rank: parent links, children, thread-sorted starts (µs)."""

    kt: KinetoTrace
    events: np.ndarray  # CPU_OP + USER_ANNOTATION event indices
    parent: dict[int, int]
    children: dict[int, list[int]]
    thread_of: dict[int, int]
    thread_starts: dict[int, np.ndarray]  # per thread key: sorted starts of its events
    thread_key: dict[tuple[int, int], int]


def _tree(kt: KinetoTrace) -> _Tree:
    ev = np.flatnonzero(kt.mask(EventCat.CPU_OP, EventCat.USER_ANNOTATION))
    keys = kt.pid[ev].astype(np.int64) * (1 << 32) + (kt.tid[ev].astype(np.int64) & 0xFFFFFFFF)
    uniq, inv = np.unique(keys, return_inverse=True)
    parent: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    thread_of: dict[int, int] = {}
    thread_starts: dict[int, np.ndarray] = {}
    thread_key: dict[tuple[int, int], int] = {}
    ts, end, cat = kt.ts, kt.ts + kt.dur, kt.cat
    op = int(EventCat.CPU_OP)
    for t in range(uniq.size):
        idx = ev[inv == t]
        idx = idx[np.lexsort((-kt.dur[idx], ts[idx]))]
        first = int(idx[0])
        thread_key[(int(kt.pid[first]), int(kt.tid[first]))] = t
        thread_starts[t] = np.sort(ts[idx])
        stack: list[int] = []
        for e in idx.tolist():
            thread_of[e] = t
            s = ts[e]
            while stack and s >= end[stack[-1]] - 1e-3:
                stack.pop()
            if cat[e] != op:
                continue
            if stack:
                parent[e] = stack[-1]
                children.setdefault(stack[-1], []).append(e)
            stack.append(e)
    return _Tree(kt, ev, parent, children, thread_of, thread_starts, thread_key)


def _with_et_dims(kt: KinetoTrace, et) -> KinetoTrace:
    """``kt`` with ``Input Dims``/``Input type`` taken from the execution trace for the ops that
    lack them (traces recorded without ``record_shapes``); ``kt`` itself is not modified."""
    import dataclasses

    if et is None:
        return kt
    ops = np.flatnonzero(kt.cat == EventCat.CPU_OP)
    missing = [e for e in ops.tolist() if "Input Dims" not in kt.args[e]]
    if not missing:
        return kt
    join = _join_et(kt, et, [])
    args = list(kt.args)
    for e in missing:
        n = join.get(e)
        if n is not None:
            args[e] = {**args[e], "Input Dims": et.input_shapes[n], "Input type": et.input_types[n]}
    return dataclasses.replace(kt, args=args)


def _kernels_of(tree: _Tree, e: int) -> list[int]:
    """The events of op ``e``'s subtree that are timed as kernels: GEMM and :data:`_STOP` ops;
    any other ATen op with a tensor input that is not a view and calls no GEMM/stop op (its
    children's time included); view ops, composites (``aten::linear``) and framework wrappers
    (``AddmmBackward0``) are looked into."""
    kt = tree.kt
    names = kt.names
    memo: dict[int, bool] = {}

    def heavy(x: int) -> bool:
        h = memo.get(x)
        if h is None:
            h = any(names[kt.name[c]] in _GEMM or names[kt.name[c]] in _STOP or heavy(c)
                    for c in tree.children.get(x, ()))
            memo[x] = h
        return h

    out: list[int] = []
    todo = [e]
    while todo:
        x = todo.pop()
        nm = names[kt.name[x]]
        if nm in _GEMM or nm in _STOP:
            out.append(x)
            continue
        kids = tree.children.get(x, [])
        if nm in VIEW_OPS or not nm.startswith("aten::") or (kids and heavy(x)):
            todo.extend(reversed(kids))
            continue
        a = kt.args[x]
        if _tensor_inputs(a.get("Input Dims", []), a.get("Input type")):
            out.append(x)
        else:
            todo.extend(reversed(kids))
    out.sort(key=lambda i: kt.ts[i])
    return out


def _calls(tree: _Tree, e: int, name: str) -> bool:
    """Does op ``e``'s subtree hold an op named ``name``?"""
    names = tree.kt.names
    todo = list(tree.children.get(e, ()))
    while todo:
        x = todo.pop()
        if names[tree.kt.name[x]] == name:
            return True
        todo.extend(tree.children.get(x, ()))
    return False


# ----------------------------------------------------------------------------- parameters
def _param_ids(et) -> set[int]:
    """Tensor ids of parameters (and their gradients / optimizer state), closed under view ops."""
    if et is None:
        return set()
    names = et.names
    pos = {int(i): k for k, i in enumerate(et.id.tolist())}
    in_opt = np.zeros(et.n_nodes, dtype=bool)
    for k in range(et.n_nodes):
        p = pos.get(int(et.parent[k]), -1)
        nm = names[et.name[k]]
        in_opt[k] = nm.startswith("Optimizer.step#") or nm == "torch::autograd::AccumulateGrad" or (
            p >= 0 and p < k and in_opt[p])
    ids: set[int] = set()
    for k in np.flatnonzero(in_opt).tolist():
        ids.update(int(t) for t in et.inputs_of(k).tolist())
    for k in range(et.n_nodes):
        if names[et.name[k]] in VIEW_OPS:
            ins = et.inputs_of(k)
            if ins.size and int(ins[0]) in ids:
                ids.update(int(t) for t in et.outputs_of(k).tolist())
    return ids


def _et_tensor_flags(et, node: int, pids: set[int]) -> list[bool] | None:
    """Per Tensor-typed input of ET node ``node``: is it a parameter? None if not resolvable."""
    types = et.input_types[node]
    ids = et.inputs_of(node).tolist()
    flags: list[bool] = []
    j = 0
    for t in types:
        if isinstance(t, str) and t.startswith("GenericList"):
            return None
        if isinstance(t, str) and t.startswith("Tensor"):
            if j >= len(ids):
                return None
            flags.append(int(ids[j]) in pids)
            j += 1
    return flags


@dataclass
class _Params:
    """Which inputs are parameters, for one rank."""

    shapes: set[tuple[int, ...]]
    et_flags: dict[int, list[bool]]  # Kineto event -> flags per tensor input (from the ET)

    def flags(self, e: int, tensors: list[tuple[int, list[int]]], types: list | None = None) -> list[bool]:
        """A tensor input is a parameter if it is floating point, its shape (or, 2-D, its
        transpose) is a gradient's shape and — when the execution trace joined — its tensor id
        is a parameter's (ids can be reused after a tensor is freed: the id alone is not enough)."""
        by_shape = []
        for p, s in tensors:
            t = tuple(s)
            ty = types[p] if types is not None and p < len(types) else ""
            integer = isinstance(ty, str) and any(w in ty.lower() for w in ("long", "int", "bool", "char", "short"))
            by_shape.append(not integer and (t in self.shapes or (len(t) == 2 and (t[1], t[0]) in self.shapes)))
        f = self.et_flags.get(e)
        if f is not None and len(f) == len(tensors):
            return [a and b for a, b in zip(by_shape, f, strict=True)]
        return by_shape


def _rank_params(tree: _Tree, et, notes: list[str]) -> _Params:
    kt = tree.kt
    names = kt.names
    shapes: set[tuple[int, ...]] = set()
    for e in tree.events.tolist():
        if names[kt.name[e]] == "torch::autograd::AccumulateGrad":
            for _, s in _tensor_inputs(kt.args[e].get("Input Dims", []), kt.args[e].get("Input type")):
                shapes.add(tuple(s))
    et_flags: dict[int, list[bool]] = {}
    if et is not None:
        pids = _param_ids(et)
        join = _join_et(kt, et, [])
        for e, node in join.items():
            f = _et_tensor_flags(et, node, pids)
            if f is not None:
                et_flags[e] = f
        notes.append(f"rank {kt.rank}: parameters identified from execution-trace tensor ids "
                     f"({len(pids)} ids, {len(et_flags)} ops joined)")
    else:
        notes.append(f"rank {kt.rank}: no execution trace; parameters identified by gradient shapes")
    return _Params(shapes, et_flags)


def _batch_probe(kind: str, name: str, shapes: list, types: list | None, flags: list[bool],
                 tensors: list[tuple[int, list[int]]], b0: int) -> dict[str, float]:
    """Exponents ``log2(p(2 B0) / p(B0))`` of the parameters of one op (empty: batch-independent)."""
    if b0 < 2 or not tensors:
        return {}
    scaled = [list(s) if isinstance(s, list) else s for s in shapes]
    hit = False

    def scale(pos: int, dim: int) -> None:
        nonlocal hit
        s = scaled[pos]
        if isinstance(s, list) and dim < len(s) and isinstance(s[dim], int):
            s = list(s)
            s[dim] *= 2
            scaled[pos] = s
            hit = True

    g = _GEMM.get(name)
    if g is not None and kind != "bmm":
        ia, ib = g[1], g[2]
        fa = next((f for (p, _), f in zip(tensors, flags, strict=True) if p == ia), False)
        fb = next((f for (p, _), f in zip(tensors, flags, strict=True) if p == ib), False)
        a = shapes[ia] if ia < len(shapes) else None
        b = shapes[ib] if ib < len(shapes) else None
        if isinstance(a, list) and isinstance(b, list) and len(a) == 2 and len(b) == 2:
            if fb and not fa:
                if a[0] % b0 == 0:
                    scale(ia, 0)
            elif fa and not fb:
                if b[1] % b0 == 0:
                    scale(ib, 1)
            elif not fa and not fb:
                if a[1] % b0 == 0:
                    scale(ia, 1)
                    scale(ib, 0)
                elif a[0] % b0 == 0:
                    scale(ia, 0)
                elif b[1] % b0 == 0:
                    scale(ib, 1)
    else:
        for (p, s), f in zip(tensors, flags, strict=True):
            if f or not isinstance(shapes[p], list) or not all(isinstance(d, int) for d in shapes[p]):
                continue
            d = next((j for j, x in enumerate(s) if x >= b0 and x % b0 == 0), -1)
            if d >= 0:
                scale(p, d)
    if not hit:
        return {}
    p0 = kernel_params(kind, name, shapes, types)
    p2 = kernel_params(kind, name, scaled, types)
    out: dict[str, float] = {}
    for c in (*PARAM_EXP_COLUMNS, "flops", "bytes"):
        a, b = p0.get(c, math.nan), p2.get(c, math.nan)
        if a == a and b == b and a > 0 and b > 0 and b != a:
            out[c] = round(math.log2(b / a), 3)
    work = out.get("flops", out.get("elements", max(out.values(), default=0.0)))
    if out:
        out["work"] = work
    return out


# ----------------------------------------------------------------------------- result
@dataclass
class AnnotatedTrace:
    """Per-step graphs of a captured run, ready for :mod:`predictor.whatif.apply`.

    ``steps``: one graph per ProfilerStep (all ranks), task durations profiler-corrected;
    ``step_names``; ``measured_step_s``: traced (profiled) step time, slowest rank;
    ``unprofiled_s``: median wall time of the capture's unprofiled iterations (None if it
    recorded none); ``profiler_cost_s``: per-event cost removed and ``profiler_cost_source``;
    ``base_batch`` and ``batch_source``; ``host_mode``: the ranks ran on the CPU;
    ``counts``: kernel tasks by how their batch dependence was found; ``notes``;
    ``combined``: when every step has the same tasks, one graph with the per-task ``combine``
    statistic (``median`` by default, robust to a disturbed step; ``min``) of the measured
    durations — and then the unprofiled iterations use the same statistic.
    """

    source: str
    steps: list[ExecutionGraph]
    step_names: list[str]
    measured_step_s: list[float]
    unprofiled_s: float | None
    profiler_cost_s: float
    profiler_cost_source: str
    base_batch: int | None
    batch_source: str
    host_mode: bool
    world_size: int
    launch_fraction: float
    counts: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    torch_threads: int | None = None
    combined: ExecutionGraph | None = None
    combine: str = "none"
    profiler_cost: ProfilerCost | None = None
    inside_estimate_s: float = 0.0

    def graphs(self) -> list[ExecutionGraph]:
        """The graphs a prediction runs on: the combined step if the steps agree, else every step."""
        return [self.combined] if self.combined is not None else self.steps


# ----------------------------------------------------------------------------- main
def annotate(trace_set: TraceSet, rg: ReplayGraph | None = None, *, base_batch: int | None = None,
             profiler_cost_s: float | None = None, combine: str = "median") -> AnnotatedTrace:
    """Split, parameterise and annotate the steps of a captured run (see the module docstring).

    Raises:
        TraceError: the trace has no ProfilerStep, or a step holds no tasks.
    """
    rg = rg or build_graph(trace_set)
    g = rg.graph
    if rg.task_event is None:
        raise TraceError(f"{trace_set.source}: replay graph without task events (rebuild it with build_graph)")
    notes: list[str] = []
    steps_df = rg.steps[rg.steps["start_task"] >= 0]
    if steps_df.empty:
        raise TraceError(f"{trace_set.source}: no ProfilerStep markers; capture with tuner.capture (or "
                         "torch.profiler with a schedule and prof.step()) to predict what-if changes")
    trees = [_tree(_with_et_dims(rt.kineto, rt.et)) for rt in trace_set.ranks]
    params = [_rank_params(tr, rt.et, notes) for tr, rt in zip(trees, trace_set.ranks, strict=True)]
    gpu_ranks = set(g.proc_rank[g.proc_kind == ProcKind.GPU_STREAM].tolist())
    host_mode = not gpu_ranks
    t0 = rg.t0_us
    mstart_us = rg.measured_start * 1e6 + t0
    mend_us = rg.measured_end * 1e6 + t0

    # ---- captured batch size: first forward op of the first step with a non-parameter tensor input
    b0, how = base_batch, "given"
    if b0 is None:
        b0, how = _detect_batch(trees[0], params[0], steps_df, rg, t0)
    counts = {"kernel_tasks": 0, "batch_dependent": 0, "batch_independent": 0}

    # ---- per task: split (host mode) and annotate; built once over all steps
    ed = GraphEditor(g)
    keep = np.zeros(g.n_tasks, dtype=bool)  # tasks copied as they are
    old_aux: dict[str, np.ndarray] = {}  # aux of kept tasks, by old index

    def put_old(i: int, **vals: float) -> None:
        for k, v in vals.items():
            col = old_aux.get(k)
            if col is None:
                col = old_aux[k] = np.full(g.n_tasks, np.nan)
            col[i] = v

    piece_aux: dict[str, list[tuple[int, float]]] = {}

    def put_new(i: int, **vals: float) -> None:
        for k, v in vals.items():
            piece_aux.setdefault(k, []).append((i, float(v)))

    first_piece: dict[int, int] = {}  # old task -> editor index of its first / last piece (split tasks)
    last_piece: dict[int, int] = {}

    def put_piece(which: dict[int, int], i: int, **vals: float) -> None:
        if i in which:
            put_new(which[i], **vals)
        else:
            put_old(i, **vals)
    sig_ids: dict[str, int] = {}
    op_sig: dict[tuple[int, int], int] = {}
    is_gpu = g.is_gpu()
    for r, (tree, prm) in enumerate(zip(trees, params, strict=True)):
        kt = tree.kt
        names = kt.names
        annots = _annotation_intervals(kt)
        bwd_first = _first_backward(tree, steps_df[steps_df["rank"] == r], mstart_us)
        proc_thread = {p: (tree.thread_key.get(_thread_of_proc(g.proc_names[p], kt))
                           if g.proc_kind[p] == ProcKind.CPU_THREAD else None)
                       for p in np.unique(g.proc[g.rank == r]).tolist()}
        for i in np.flatnonzero(g.rank == r).tolist():
            e = int(rg.task_event[i])
            kind = g.kinds[g.kind[i]]
            top = _top(tree, e) if e >= 0 else -1
            a_us, b_us = float(mstart_us[i]), float(mend_us[i])
            thread = proc_thread[int(g.proc[i])]
            op_id = float(r * (1 << 32) + top) if top >= 0 else -1.0
            phase = _phase(kt, top, annots, bwd_first) if top >= 0 else _PHASE_OTHER
            sig = -1
            if top >= 0:
                sig = op_sig.get((r, top), -2)
                if sig == -2:
                    sig = sig_ids.setdefault(_signature(tree, top), len(sig_ids))
                    op_sig[(r, top)] = sig
            base_aux = {"op": op_id, "phase": float(phase), "sig": float(sig)}
            kernels = []
            if host_mode and kind == "cpu_op" and e >= 0:
                kernels = [x for x in _kernels_of(tree, e)
                           if kt.ts[x] >= a_us - 0.01 and kt.ts[x] + kt.dur[x] <= b_us + 0.01]
            if not kernels:
                keep[i] = True
                put_old(i, prof_events=float(_count(tree, thread, a_us, b_us)),
                        prof_events_next=float(_count(tree, thread, a_us, b_us, shift=True)),
                        measured_raw=float(g.duration[i]),
                        t_start=a_us, **base_aux)
                if is_gpu[i] and e >= 0:
                    put_old(i, launch_op=float(r * (1 << 32) + e))  # the op that launched the kernel
                    _annotate_kernel(put_old, i, kind, kt, e, prm, b0, counts)
            else:
                pieces = []
                cur = a_us
                for x in kernels:
                    xs, xe = float(kt.ts[x]), float(kt.ts[x] + kt.dur[x])
                    if xs > cur + 1e-3:
                        pieces.append(("host", cur, xs, -1))
                    pieces.append(("kernel", max(xs, cur), max(xe, cur), x))
                    cur = max(cur, xe)
                if b_us > cur + 1e-3:
                    pieces.append(("host", cur, b_us, -1))
                top_name = names[kt.name[top]] if top >= 0 else g.names[g.name[i]]
                for j, (what, s_us, e_us, x) in enumerate(pieces):
                    pos = i + 0.999 * j / len(pieces)
                    dur = max(e_us - s_us, 0.0) * 1e-6
                    if what == "host":
                        k = int(ed.add(g.proc[i], top_name, "cpu_op", Category.CPU, pos, duration=dur)[0])
                    else:
                        xname = names[kt.name[x]]
                        kk, cat = host_kernel_kind(xname)
                        if kk == "embedding_bag_bwd" and _calls(tree, x, "aten::_embedding_bag_dense_backward"):
                            kk = "embedding_bag_bwd_dense"  # dense gradient: not the calibrated sparse kernel
                        a = kt.args[x]
                        if kk == "reduce":
                            kk = reduction_kind(xname, a.get("Input Dims", []), a.get("Concrete Inputs"))
                        p = kernel_params(kk, xname, a.get("Input Dims", []), a.get("Input type"), a.get("Concrete Inputs"))
                        flops = p.pop("flops", math.nan)
                        nbytes = p.pop("bytes", math.nan)
                        k = int(ed.add(g.proc[i], xname, kk, cat, pos, duration=dur, flops=flops, nbytes=nbytes,
                                       params=p)[0])
                        _annotate_kernel(put_new, k, kk, kt, x, prm, b0, counts)
                    put_new(k, prof_events=float(_count(tree, thread, s_us, e_us)),
                            prof_events_next=float(_count(tree, thread, s_us, e_us, shift=True)), measured_raw=dur,
                            t_start=s_us,
                            **base_aux)
                    first_piece.setdefault(i, k)
                    last_piece[i] = k

            # structure annotations on the op's tasks (once per op: on the segment holding its start)
            if top < 0 or not (a_us - 0.01 <= kt.ts[top] <= b_us + 0.01):
                continue
            if names[kt.name[top]] == _ACC_GRAD:
                kid = next((c for c in tree.children.get(top, [])
                            if names[kt.name[c]] == "torch::autograd::AccumulateGrad"), -1)
                if kid >= 0:
                    ts_ = _tensor_inputs(kt.args[kid].get("Input Dims", []), kt.args[kid].get("Input type"))
                    if ts_:
                        dt = dtype_bytes((kt.args[kid].get("Input type") or ["float"])[0])
                        put_piece(last_piece, i, grad_bytes=_numel(ts_[0][1]) * (dt if dt == dt else 4.0))
            if phase == _PHASE_FWD:
                a = kt.args[top]
                tens = _tensor_inputs(a.get("Input Dims", []), a.get("Input type"))
                fl = prm.flags(top, tens, a.get("Input type"))
                act = next(((p, sh) for (p, sh), f in zip(tens, fl, strict=True) if not f), None)
                if act is not None:
                    types = a.get("Input type") or []
                    dt = dtype_bytes(types[act[0]]) if act[0] < len(types) else 4.0
                    dt = dt if dt == dt else 4.0
                    has_b = b0 is not None and b0 >= 2 and any(d % b0 == 0 and d >= b0 for d in act[1])
                    put_piece(first_piece, i, act_bytes=_numel(act[1]) * dt, x_act=1.0 if has_b else 0.0)
    kept = np.flatnonzero(keep)
    kept_new = ed.copy(kept, kept.astype(np.float64))
    for name, col in old_aux.items():
        ed.set_aux(name, kept_new, col[kept])
    for name, vals in piece_aux.items():
        ed.set_aux(name, np.asarray([v[0] for v in vals], dtype=np.int64), np.asarray([v[1] for v in vals]))
    first_new = np.full(g.n_tasks, -1, dtype=np.int64)
    last_new = np.full(g.n_tasks, -1, dtype=np.int64)
    first_new[kept] = kept_new
    last_new[kept] = kept_new
    if first_piece:
        fo = np.fromiter(first_piece.keys(), dtype=np.int64)
        first_new[fo] = np.fromiter(first_piece.values(), dtype=np.int64)
        last_new[fo] = np.fromiter((last_piece[i] for i in fo.tolist()), dtype=np.int64)
    if g.n_edges:  # the replay graph's edges onto the pieces: out of the last, into the first
        ed.edges(last_new[g.edge_src], first_new[g.edge_dst], g.edge_kind)
    ed.meta["source"] = trace_set.source
    whole = ed.build()
    first_new = ed.built_index[first_new]
    whole = _assign_gaps(whole)

    # ---- per-step graphs
    step_graphs: list[ExecutionGraph] = []
    step_names: list[str] = []
    measured: list[float] = []
    for sname, rows in steps_df.groupby("name", sort=False):
        sel = np.zeros(whole.n_tasks, dtype=bool)
        for _, row in rows.iterrows():
            s0, s1 = first_new[int(row["start_task"])], first_new[int(row["end_task"])]
            sel |= _between_markers(whole, int(row["rank"]), int(s0), int(s1))
        idx = np.flatnonzero(sel)
        if idx.size == 0:
            continue
        step_graphs.append(_subgraph(whole, idx))
        step_names.append(str(sname))
        measured.append(float(rows["measured_s"].max()))
    if not step_graphs:
        raise TraceError(f"{trace_set.source}: the ProfilerSteps hold no tasks")

    # ---- steps of identical structure: one graph with the per-task statistic over steps
    combined = _combine(step_graphs, combine) if combine != "none" else None

    # ---- profiler cost
    unprof, threads = _unprofiled(trace_set, "min" if combine == "min" else "median")
    inside = _inside_cost(trees[0]) if host_mode else 0.0
    if profiler_cost_s is not None:
        pc = ProfilerCost(0.0, float(profiler_cost_s), source="given")
    elif unprof is not None:
        pool = [combined] if combined is not None else step_graphs
        fits = [_solve_cost(sg, unprof, rg.launch_fraction, inside) for sg in pool]
        pc = fits[len(fits) // 2]
        pc = ProfilerCost(pc.inside_s, pc.before_s, pc.host_scale,
                          f"(P - U) / events: profiled step P vs the capture's unprofiled iterations U "
                          f"({'min' if combine == 'min' else 'median'} {unprof * 1e3:.3f} ms); "
                          f"{pc.inside_s * 1e6:.2f} µs of it inside an event, the rest before it")
    elif host_mode:
        pc = ProfilerCost(inside, _gap_cost(trace_set), source="estimated from the trace (trivial leaf ops inside "
                          "an event + sibling gaps before it): no unprofiled iterations recorded")
    else:
        pc = ProfilerCost(_gap_cost(trace_set), 0.0, source="per-CPU-op cost of extract_overheads (sibling gaps; "
                          "Lin et al. 2022 fallback): no unprofiled iterations recorded")
    step_graphs = [_remove_profiler(sg, pc) for sg in step_graphs]
    if combined is not None:
        combined = _remove_profiler(combined, pc)
    counts["tasks_per_step"] = int(np.median([sg.n_tasks for sg in step_graphs]))
    return AnnotatedTrace(
        source=trace_set.source, steps=step_graphs, step_names=step_names, measured_step_s=measured,
        unprofiled_s=unprof, profiler_cost_s=pc.per_event_s, profiler_cost_source=pc.source, base_batch=b0,
        batch_source=how, host_mode=host_mode, world_size=trace_set.world_size, launch_fraction=rg.launch_fraction,
        counts=counts, notes=notes + list(rg.notes), torch_threads=threads, combined=combined,
        combine=combine if combined is not None else "none", profiler_cost=pc, inside_estimate_s=inside,
    )


def _combine(graphs: list[ExecutionGraph], how: str) -> ExecutionGraph | None:
    """One graph whose measured durations are the per-task ``min``/``median`` over steps of
    identical structure (same tasks, names, kinds, processors, edges); None if they differ."""
    if len(graphs) < 2:
        return None
    g0 = graphs[0]
    for g in graphs[1:]:
        if (g.n_tasks != g0.n_tasks or g.n_edges != g0.n_edges or g.kinds != g0.kinds
                or not np.array_equal(g.kind, g0.kind) or not np.array_equal(g.proc, g0.proc)
                or not np.array_equal(g.edge_src, g0.edge_src) or not np.array_equal(g.edge_dst, g0.edge_dst)):
            return None
    ed = GraphEditor(g0)
    idx = np.arange(g0.n_tasks)
    new = ed.copy(idx, idx.astype(np.float64))
    if g0.n_edges:
        ed.edges(new[g0.edge_src], new[g0.edge_dst], g0.edge_kind)
    out = ed.build()
    raws = np.stack([g.meta[AUX_KEY]["measured_raw"] for g in graphs])
    durs = np.stack([g.duration for g in graphs])
    stat = np.nanmin if how == "min" else np.nanmedian
    with np.errstate(all="ignore"):
        out.meta[AUX_KEY]["measured_raw"] = stat(raws, axis=0)
        out.duration[:] = stat(durs, axis=0)
    out.meta["combined_steps"] = {"steps": len(graphs), "statistic": how}
    return out


# ----------------------------------------------------------------------------- helpers
def _annotate_kernel(put, k: int, kind: str, kt: KinetoTrace, e: int, prm: _Params, b0: int | None,
                     counts: dict) -> None:
    counts["kernel_tasks"] += 1
    a = kt.args[e]
    shapes, types = a.get("Input Dims", []), a.get("Input type")
    tens = _tensor_inputs(shapes, types)
    flags = prm.flags(e, tens, types)
    exps = _batch_probe(kind, kt.names[kt.name[e]], shapes, types, flags, tens, b0 or 0) if b0 else {}
    if exps:
        counts["batch_dependent"] += 1
        put(k, **{f"x_{c}": v for c, v in exps.items()})
    else:
        counts["batch_independent"] += 1


def _top(tree: _Tree, e: int) -> int:
    while e in tree.parent:
        e = tree.parent[e]
    return e


def _thread_of_proc(proc_name: str, kt: KinetoTrace) -> tuple[int, int]:
    """(pid, tid) of a CPU processor named by build_graph (``cpu tid T`` / ``cpu pid P tid T``)."""
    parts = proc_name.split()
    tid = int(parts[-1])
    if "pid" in parts:
        return int(parts[parts.index("pid") + 1]), tid
    pids = kt.pids
    return (pids[0] if pids else -1), tid


def _count(tree: _Tree, thread: int | None, a: float, b: float, shift: bool = False) -> int:
    """Profiled events of ``thread`` starting in ``[a, b)`` (``shift``: in ``(a, b]`` — the events
    whose entry cost, paid just before they start, falls inside this task)."""
    if thread is None:
        return 0
    st = tree.thread_starts[thread]
    if shift:
        return int(np.searchsorted(st, b + 1e-3, side="left") - np.searchsorted(st, a + 1e-3, side="left"))
    return int(np.searchsorted(st, b - 1e-3, side="left") - np.searchsorted(st, a - 1e-3, side="left"))


def _annotation_intervals(kt: KinetoTrace) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {"opt": [], "zero": []}
    for e in np.flatnonzero(kt.cat == EventCat.USER_ANNOTATION).tolist():
        nm = kt.names[kt.name[e]]
        if nm.startswith("Optimizer.step#"):
            out["opt"].append((float(kt.ts[e]), float(kt.ts[e] + kt.dur[e])))
        elif nm.startswith("Optimizer.zero_grad#"):
            out["zero"].append((float(kt.ts[e]), float(kt.ts[e] + kt.dur[e])))
    return out


def _first_backward(tree: _Tree, steps, mstart_us: np.ndarray) -> list[tuple[float, float, float]]:
    """Per step of a rank: (step start µs, step end µs, first backward op start µs)."""
    kt = tree.kt
    bwd = sorted(float(kt.ts[e]) for e in tree.events.tolist()
                 if kt.cat[e] == EventCat.CPU_OP and e not in tree.parent and kt.names[kt.name[e]].startswith(_BWD_PREFIX))
    out = []
    for _, row in steps.iterrows():
        s0 = float(mstart_us[int(row["start_task"])])
        s1 = s0 + float(row["measured_s"]) * 1e6
        k = np.searchsorted(bwd, s0)
        fb = bwd[k] if k < len(bwd) and bwd[k] <= s1 else s1
        out.append((s0, s1, fb))
    return out


def _phase(kt: KinetoTrace, top: int, annots: dict, bwd_first: list[tuple[float, float, float]]) -> int:
    s = float(kt.ts[top])
    nm = kt.names[kt.name[top]]
    if nm.startswith(_BWD_PREFIX):
        return _PHASE_BWD
    if any(a <= s <= b for a, b in annots["opt"]):
        return _PHASE_OPT
    if any(a <= s <= b for a, b in annots["zero"]):
        return _PHASE_OTHER
    for s0, s1, fb in bwd_first:
        if s0 <= s <= s1:
            return _PHASE_FWD if s < fb else _PHASE_OTHER
    return _PHASE_OTHER


def _signature(tree: _Tree, top: int) -> str:
    kt = tree.kt
    a = kt.args[top]
    parts = [kt.names[kt.name[top]], str(a.get("Input Dims", ""))]
    for x in _kernels_of(tree, top):
        parts.append(kt.names[kt.name[x]] + str(kt.args[x].get("Input Dims", "")))
    return "|".join(parts)


_MODEL_INPUT_OPS = ("aten::linear", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution",
                    "aten::embedding", "aten::embedding_bag", "aten::matmul", *_GEMM, *_STOP)


def _detect_batch(tree: _Tree, prm: _Params, steps, rg: ReplayGraph, t0: float) -> tuple[int | None, str]:
    """Dim 0 of the first non-parameter input of the step's first layer-like forward op
    (linear, convolution, embedding, GEMM...), else of its first ATen op with one."""
    kt = tree.kt
    row = steps.iloc[0]
    s0 = float(rg.measured_start[int(row["start_task"])] * 1e6 + t0)
    s1 = s0 + float(row["measured_s"]) * 1e6
    ops = sorted((float(kt.ts[e]), e) for e in tree.events.tolist()
                 if kt.cat[e] == EventCat.CPU_OP and s0 <= kt.ts[e] <= s1)
    fallback: tuple[int, str] | None = None
    for _, e in ops:
        nm = kt.names[kt.name[e]]
        if nm.startswith(_BWD_PREFIX):
            break
        if not nm.startswith("aten::") or nm in VIEW_OPS and nm not in _MODEL_INPUT_OPS:
            continue
        a = kt.args[e]
        tens = _tensor_inputs(a.get("Input Dims", []), a.get("Input type"))
        for (_, s), f in zip(tens, prm.flags(e, tens, a.get("Input type")), strict=True):
            if not f and len(s) >= 1 and s[0] >= 2:
                found = (int(s[0]), f"dim 0 of the first input of {nm} ({s})")
                if nm in _MODEL_INPUT_OPS:
                    return found
                fallback = fallback or found
                break
    return fallback if fallback else (None, "not found (no forward op with a non-parameter tensor input)")


def _assign_gaps(g: ExecutionGraph) -> ExecutionGraph:
    """A T1 gap (and a GPU stream gap) belongs to the op that follows it on its processor."""
    aux = g.meta[AUX_KEY]
    op = aux["op"].copy()
    phase = aux["phase"].copy()
    sig = aux["sig"].copy()
    order = np.lexsort((np.arange(g.n_tasks), g.proc))
    for p in np.unique(g.proc):
        idx = order[g.proc[order] == p]
        nxt_op, nxt_phase, nxt_sig = -1.0, 0.0, -1.0
        for i in idx[::-1].tolist():
            kind = g.kinds[g.kind[i]]
            if kind in ("cpu_gap", "gpu_gap") and op[i] < 0:
                op[i], phase[i], sig[i] = nxt_op, nxt_phase, nxt_sig
            elif kind == "marker":
                nxt_op, nxt_phase, nxt_sig = -1.0, 0.0, -1.0
            elif op[i] >= 0:
                nxt_op, nxt_phase, nxt_sig = op[i], phase[i], sig[i]
    aux["op"], aux["phase"], aux["sig"] = op, phase, sig
    return g


def _between_markers(g: ExecutionGraph, rank: int, s0: int, s1: int) -> np.ndarray:
    """Tasks of ``rank`` inside a step: on the markers' processor between them; elsewhere, tasks
    whose measured start lies in the step's measured window."""
    aux = g.meta[AUX_KEY]
    sel = np.zeros(g.n_tasks, dtype=bool)
    proc = g.proc[s0]
    on = np.flatnonzero(g.proc == proc)
    sel[on[(on >= s0) & (on <= s1)]] = True
    # other processors of the rank: by the step rank annotation and array order between the
    # first and last task of the step window on the marker thread (their own program order)
    t_lo, t_hi = aux["t_start"][s0], aux["t_start"][s1]
    others = (g.rank == rank) & (g.proc != proc)
    sel |= others & (aux["t_start"] >= t_lo) & (aux["t_start"] <= t_hi)
    return sel


def _subgraph(g: ExecutionGraph, idx: np.ndarray) -> ExecutionGraph:
    ed = GraphEditor(g)
    new = ed.copy(idx, idx.astype(np.float64))
    remap = np.full(g.n_tasks, -1, dtype=np.int64)
    remap[idx] = new
    if g.n_edges:
        s, d = remap[g.edge_src], remap[g.edge_dst]
        keep = (s >= 0) & (d >= 0)
        ed.edges(s[keep], d[keep], g.edge_kind[keep])
    sub = ed.build()
    # drop processors without tasks? keep them: empty processors cost nothing
    return sub


def _unprofiled(ts: TraceSet, stat: str = "median") -> tuple[float | None, int | None]:
    """Wall time (``min`` or ``median``) of the iterations each rank ran after the profiler
    window (slowest rank; the first one after the window is skipped when there are more than 3)."""
    from predictor.sources.traces.capture import read_step_times
    from predictor.sources.traces.load import archive_member_texts

    src = Path(ts.source)
    folder = src if src.is_dir() else src.parent
    # a .tar.gz of a capture folder carries its steps.csv files inside
    packed = archive_member_texts(src, ".steps.csv") if src.is_file() else {}
    meds, threads = [], None
    for rt in ts.ranks:
        name = f"rank{rt.rank}.steps.csv"
        p = folder / name
        if name in packed:
            d = read_step_times(name, text=packed[name])
        elif p.exists():
            d = read_step_times(p)
        else:
            continue
        after = [w for w, win in zip(d["wall_s"], d["window"], strict=True) if win == "after"]
        threads = d["torch_threads"] if threads is None else threads
        if len(after) >= 2:
            vals = after[1:] if len(after) > 3 else after
            meds.append(float(np.min(vals) if stat == "min" else np.median(vals)))
    return (max(meds) if meds else None), threads


@dataclass(frozen=True)
class ProfilerCost:
    """What the profiler added to a traced run (seconds per profiled event).

    ``inside_s``: inside the event's own interval; ``before_s``: just before it starts (its
    entry callbacks), so charged to whatever task holds that instant (the gap before a
    top-level op, the parent op around a child); ``host_scale``: a last factor on the host-time
    tasks (framework time between kernels, gaps) that makes the corrected step meet the
    unprofiled one where clipping at zero left some of the cost in place.
    """

    inside_s: float
    before_s: float
    host_scale: float = 1.0
    source: str = ""

    @property
    def per_event_s(self) -> float:
        return self.inside_s + self.before_s


_HOST_KINDS = ("cpu_op", "cpu_gap")
#: a GPU capture's replay above its unprofiled step is taken for profiler time left on the host (and removed
#: past the mean per-event cost) only when the host's span exceeds this multiple of the busiest stream's
#: kernel time; nearer balance the excess may be the simulated GPU tail (session 39)
HOST_BOUND_RATIO = 1.5


def _corrected(g: ExecutionGraph, pc: ProfilerCost) -> np.ndarray:
    aux = g.meta[AUX_KEY]
    raw = aux["measured_raw"]
    d = g.duration.copy()
    ok = np.isfinite(raw)
    n = aux["prof_events"]
    m = aux.get("prof_events_next", n)
    d[ok] = np.maximum(raw[ok] - pc.inside_s * n[ok] - pc.before_s * np.nan_to_num(m[ok]), 0.0)
    if pc.host_scale != 1.0:
        host = g.kind_mask(*_HOST_KINDS) & ok
        d[host] *= pc.host_scale
    return d


def _bisect(exceeds, lo: float, hi: float, steps: int = 30) -> tuple[float, float]:
    """Narrow ``[lo, hi]`` (``exceeds(lo)`` True, ``exceeds(hi)`` False) by ``steps`` halvings."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if exceeds(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def _solve_cost(g: ExecutionGraph, target_s: float, launch_fraction: float, inside_s: float) -> ProfilerCost:
    """The :class:`ProfilerCost` whose removal makes the simulated step last ``target_s``:
    ``(P - U) / E`` per event over the events of the thread holding the step markers, of which
    ``inside_s`` (at most) inside the event and the rest before it; where clipping at zero
    leaves some in place, both are raised together (at most 3x, bisection), and what is still
    left comes off the host-time tasks. With GPU streams the cost is found by bisection on the
    simulated step up to ``(P - U) / E``; beyond it only when the step is clearly host-bound (the
    host's span over :data:`HOST_BOUND_RATIO` x the busiest stream's kernel time at the mean cost, and
    with the main thread's host-time tasks removed the step falls below ``U``), as above but with the
    host-time scale also found by bisection (host time overlaps the streams); otherwise the GPU (or
    the simulated GPU tail) bounds the step and the mean cost stays."""
    from predictor.simulate import simulate

    aux = g.meta[AUX_KEY]

    def it(pc: ProfilerCost) -> float:
        return simulate(g, _corrected(g, pc), launch_fraction=launch_fraction).iteration_s

    p_s = it(ProfilerCost(0.0, 0.0))
    if p_s <= target_s:
        return ProfilerCost(0.0, 0.0)
    marker = g.kind_mask("marker")
    main = int(g.proc[np.flatnonzero(marker)[0]]) if marker.any() else int(np.bincount(g.proc).argmax())
    events = float(aux["prof_events"][g.proc == main].sum())
    c0 = (p_s - target_s) / max(events, 1.0)
    inside = min(max(inside_s, 0.0), c0)

    def split(c: float) -> ProfilerCost:
        share = inside / c0 if c0 > 0 else 0.0
        return ProfilerCost(c * share, c * (1.0 - share))

    host = g.kind_mask(*_HOST_KINDS) & (g.proc == main)
    gpu = bool(g.is_gpu().any())
    pc = split(c0)
    tl = simulate(g, _corrected(g, pc), launch_fraction=launch_fraction)  # the step at the mean cost
    if gpu:
        if tl.iteration_s <= target_s:
            lo, hi = _bisect(lambda c: it(split(c)) > target_s, 0.0, c0)
            return split(0.5 * (lo + hi))
        floor = _corrected(g, split(3.0 * c0))
        floor[host] = 0.0
        if (tl.host_span_s() <= HOST_BOUND_RATIO * tl.kernel_sum_s()
                or simulate(g, floor, launch_fraction=launch_fraction).iteration_s >= target_s):
            return pc  # the GPU (or what the correction cannot touch) bounds the step: keep the mean cost
        # clearly host-bound: clipping at zero left profiler time on the host; as on a CPU graph below
    if tl.iteration_s > target_s:
        # clipping at zero left some cost in place (events cheaper than the mean): raise the
        # per-event cost until the step meets U (bisection, at most 3x), then host time
        if it(split(3.0 * c0)) > target_s:
            pc = split(3.0 * c0)
        else:
            pc = split(_bisect(lambda c: it(split(c)) > target_s, c0, 3.0 * c0)[1])
    left = it(pc) - target_s
    if left > 1e-9:
        if gpu:  # host time overlaps the streams: the scale that meets U, by bisection
            def scaled(s: float) -> ProfilerCost:
                return ProfilerCost(pc.inside_s, pc.before_s, s)

            return scaled(_bisect(lambda s: it(scaled(s)) <= target_s, 0.0, 1.0)[0])
        d = _corrected(g, pc)
        hs = float(d[host].sum())
        if hs > 0:
            pc = ProfilerCost(pc.inside_s, pc.before_s, max(0.0, 1.0 - left / hs))
    return pc


def _gap_cost(ts: TraceSet) -> float:
    """Per-event profiler cost between sibling ops, as :func:`extract_overheads` measures it (s)."""
    from predictor.sources.traces.overheads import LIN2022_CPU_COST_S, extract_overheads

    try:
        return float(extract_overheads(ts).profiler_cost_s.get("cpu_op", LIN2022_CPU_COST_S))
    except (KeyError, ValueError, TypeError, IndexError):
        return LIN2022_CPU_COST_S


def _inside_cost(tree: _Tree) -> float:
    """Median duration of trivial leaf ops (views, ``detach``): their own work is negligible, so
    this is the profiler's cost inside one event (seconds)."""
    kt = tree.kt
    leaf = [float(kt.dur[e]) for e in tree.events.tolist()
            if kt.cat[e] == EventCat.CPU_OP and e not in tree.children and kt.names[kt.name[e]] in _TRIVIAL]
    return float(np.median(leaf)) * 1e-6 if leaf else 0.0


def _remove_profiler(g: ExecutionGraph, pc: ProfilerCost) -> ExecutionGraph:
    g.duration[:] = _corrected(g, pc)
    return g


def combine_captures(traces: list[AnnotatedTrace], how: str = "median") -> AnnotatedTrace:
    """One :class:`AnnotatedTrace` from several captures of the same configuration: the
    per-task ``how`` (median or min) of the measured durations over every step of every
    capture, and the same statistic of their unprofiled iterations, with the profiler cost
    solved again on that graph.

    Raises:
        TraceError: the captures' steps do not have the same tasks.
    """
    if not traces:
        raise TraceError("nothing to combine")
    if len(traces) == 1:
        return traces[0]
    steps = [g for t in traces for g in t.steps]
    combined = _combine(steps, how)
    if combined is None:
        raise TraceError("the captures differ in their tasks; they cannot be combined")
    unprof = [t.unprofiled_s for t in traces if t.unprofiled_s is not None]
    first = traces[0]
    if unprof:
        u = float(min(unprof) if how == "min" else np.median(unprof))
        pc = _solve_cost(combined, u, first.launch_fraction, first.inside_estimate_s)
        pc = ProfilerCost(pc.inside_s, pc.before_s, pc.host_scale,
                          f"(P - U) / events over {len(traces)} captures (U = {how} unprofiled iteration, "
                          f"{u * 1e3:.3f} ms); {pc.inside_s * 1e6:.2f} µs of it inside an event, the rest before it")
    else:
        u, pc = None, first.profiler_cost
    combined = _remove_profiler(combined, pc)
    return AnnotatedTrace(
        source=first.source, steps=[_remove_profiler(g, pc) for g in steps],
        step_names=[n for t in traces for n in t.step_names],
        measured_step_s=[m for t in traces for m in t.measured_step_s], unprofiled_s=u, profiler_cost_s=pc.per_event_s,
        profiler_cost_source=pc.source, base_batch=first.base_batch, batch_source=first.batch_source,
        host_mode=first.host_mode, world_size=first.world_size, launch_fraction=first.launch_fraction,
        counts=dict(first.counts), notes=list(first.notes) + [f"combined {len(traces)} captures"],
        torch_threads=first.torch_threads, combined=combined, combine=how, profiler_cost=pc,
        inside_estimate_s=first.inside_estimate_s,
    )
