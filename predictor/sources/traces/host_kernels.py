"""Host ops split into kernels: which ATen ops of a CPU rank's op tree do the arithmetic, and their
kernel-model parameters.

On a CPU, PyTorch runs every ATen op on the calling thread; the replay graph has one task per top-level
op (``aten::linear``, ``autograd::engine::evaluate_function: AddmmBackward0``). :func:`kernels_of` picks,
along the Kineto op tree, the ops that do the arithmetic — the outermost GEMM / convolution /
embedding-bag / layer-norm / softmax / attention op (:data:`GEMM_OPS`, :data:`STOP_OPS`), else every leaf
op that touches a tensor and is not a view (:data:`VIEW_OPS`); :func:`host_kernel_kind` names the kernel
model that times each and :func:`kernel_params` gives its parameters from ``Input Dims``. The time between
them is host time (the framework's dispatch cost, which does not depend on tensor sizes). This is
OpEmitter's ``host`` mode read back from a trace.
"""

from __future__ import annotations

import math

from predictor.graph import Category
from predictor.sources.synth.emit import column_sum
from predictor.sources.traces.op_tree import OpTree
from predictor.sources.traces.ops import dtype_bytes, is_tensor_type, op_params

__all__ = ["VIEW_OPS", "GEMM_OPS", "STOP_OPS", "host_kernel_kind", "reduction_kind", "tensor_inputs", "numel",
           "kernel_params", "rnn_params", "kernels_of", "split_at_kernels"]

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
GEMM_OPS = {"aten::addmm": ("addmm", 1, 2), "aten::mm": ("mm", 0, 1), "aten::bmm": ("bmm", 0, 1),
         "aten::baddbmm": ("bmm", 1, 2), "aten::addbmm": ("bmm", 1, 2), "aten::_scaled_mm": ("mm", 0, 1)}
#: ops timed as one kernel even though they call other ops (their children are not split out)
STOP_OPS = {
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
    "aten::mkldnn_rnn_layer": "rnn", "aten::mkldnn_rnn_layer_backward": "rnn_bwd",
    "aten::native_batch_norm": "batch_norm", "aten::_native_batch_norm_legit": "batch_norm",
    "aten::native_batch_norm_backward": "batch_norm_bwd",
}
#: stop ops that only copy or fill memory: an op calling them still does its own arithmetic (an LSTM
#: layer's backward clones its inputs, then computes for milliseconds), so they do not make it a wrapper
_COPY_KINDS = frozenset({"memcpy", "concat"})
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


def host_kernel_kind(name: str) -> tuple[str, Category]:
    """(op kind, category) of an ATen op run as a kernel on the CPU thread."""
    g = GEMM_OPS.get(name)
    if g is not None:
        return g[0], Category.COMPUTE
    k = STOP_OPS.get(name)
    if k is not None:
        return k, Category.COMPUTE if k in ("conv2d", "attention", "attention_bwd", "rnn", "rnn_bwd") else Category.MEMORY
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


def tensor_inputs(shapes: list, types: list | None) -> list[tuple[int, list[int]]]:
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


def numel(s: list[int]) -> float:
    """Elements of a tensor of shape ``s`` (1 for a scalar)."""
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


def rnn_params(shapes: list, dt: float) -> dict[str, float]:
    """Parameters of one recurrent layer, ``aten::mkldnn_rnn_layer(input, w_ih, w_hh, b_ih, b_hh, hx, cx, ...)``
    (its backward takes the same first seven inputs): ``batch`` B (``hx``'s rows), ``m`` time steps T,
    ``n`` gate width G x H (``w_ih``'s rows), ``k`` input width, ``dim`` hidden width H, ``elements`` B T G H
    (the gates), ``flops`` of the forward's GEMMs ``2 B T (k + H) G H`` (x2 for the backward: data and
    weight gradients), ``bytes`` the gates written and read once."""
    if not isinstance(shapes, list) or len(shapes) < 6:
        return {}
    x, w_ih, hx = shapes[0], shapes[1], shapes[5]
    ok = all(isinstance(s, list) and s and all(isinstance(d, int) for d in s) for s in (x, w_ih, hx))
    if not ok or len(w_ih) != 2 or len(hx) != 2 or hx[0] <= 0 or w_ih[1] <= 0:
        return {}
    b, h = float(hx[0]), float(hx[1])
    gh, k = float(w_ih[0]), float(w_ih[1])
    t = max(numel(x) / (b * k), 1.0)
    return {"batch": b, "m": t, "n": gh, "k": k, "dim": h, "elements": b * t * gh,
            "flops": 2.0 * b * t * (k + h) * gh, "bytes": 2.0 * b * t * gh * dt}


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
    ts = tensor_inputs(shapes, types)
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
        out.update(column_sum(name, numel(first[:lead]), numel(first[lead:]), dt)[3])  # the synthesisers' params
        return out
    if kind in ("layer_norm", "layer_norm_bwd", "softmax", "softmax_bwd"):
        x = first if kind in ("layer_norm", "softmax") else (ts[1][1] if len(ts) > 1 else first)
        out.update(m=numel(x[:-1]), n=float(x[-1]), elements=numel(x))
        out["bytes"] = (2.0 if kind in ("layer_norm", "softmax") else 3.0) * out["elements"] * dt
        return out
    if kind in ("attention", "attention_bwd") and len(ts) >= 3 and len(first) == 4:
        b, h, t, d = first
        s = ts[1][1][2] if len(ts[1][1]) == 4 else t
        out.update(batch=float(b * h), m=float(t), n=float(s), k=float(d), elements=numel(first))
        out["flops"] = (4.0 if kind == "attention" else 10.0) * b * h * t * s * d
        out["bytes"] = 4.0 * numel(first) * dt
        return out
    if kind in ("rnn", "rnn_bwd"):
        out.update(rnn_params(shapes, dt))
        if kind == "rnn_bwd" and "flops" in out:  # data and weight gradients: twice the forward's GEMMs
            out["flops"] *= 2.0
            out["bytes"] *= 1.5
        return out
    if kind in ("batch_norm", "batch_norm_bwd") and ts:  # statistics pass + normalising pass (+ gradient)
        el = numel(first)
        out.update(elements=el, batch=float(first[0]), bytes=(3.0 if kind == "batch_norm" else 5.0) * el * dt)
        return out
    if kind in ("embedding", "embedding_bwd") and len(ts) >= 2:
        w, idx = ts[0][1], ts[1][1]
        if kind == "embedding_bwd":  # grad, indices, num_weights, ...
            out.update(elements=numel(w), rows=math.nan)
        else:
            out.update(elements=numel(idx) * float(w[-1]), dim=float(w[-1]), rows=float(w[0]))
        out["bytes"] = 2.0 * out["elements"] * dt
        return out
    if kind == "concat":
        el = sum(numel(s) for _, s in ts)
        out.update(elements=el, bytes=2.0 * el * dt, parts=float(len(ts)),
                   batch=_concat_rows([s for _, s in ts], _int_arg(concrete, types)))
        return out
    if kind == "gather" and name == "aten::index_select" and len(ts) >= 2:
        src, idx = ts[0][1], ts[-1][1]
        el = numel(idx) * numel(src[1:])
        out.update(elements=el, bytes=2.0 * el * dt)
        return out
    if kind == "scatter" and len(ts) >= 2:
        el = numel(ts[-1][1])  # the source / values written
        out.update(elements=el, bytes=3.0 * el * dt)
        return out
    el = max(numel(s) for _, s in ts)
    reads = sum(numel(s) for _, s in ts)
    writes = 0.0 if name.endswith("_") else el
    out.update(elements=el, bytes=(reads + writes) * dt)
    return out




def kernels_of(tree: OpTree, e: int) -> list[int]:
    """The events of op ``e``'s subtree that are timed as kernels: GEMM and :data:`STOP_OPS` ops;
    any other ATen op with a tensor input that is not a view and calls no GEMM/stop op (its
    children's time included); view ops, composites (``aten::linear``) and framework wrappers
    (``AddmmBackward0``) are looked into."""
    kt = tree.kt
    names = kt.names
    memo: dict[int, bool] = {}

    def heavy(x: int) -> bool:
        h = memo.get(x)
        if h is None:
            h = any(names[kt.name[c]] in GEMM_OPS or STOP_OPS.get(names[kt.name[c]], "memcpy") not in _COPY_KINDS
                    or heavy(c) for c in tree.children.get(x, ()))
            memo[x] = h
        return h

    out: list[int] = []
    todo = [e]
    while todo:
        x = todo.pop()
        nm = names[kt.name[x]]
        if nm in GEMM_OPS or nm in STOP_OPS:
            out.append(x)
            continue
        kids = tree.children.get(x, [])
        if nm in VIEW_OPS or not nm.startswith("aten::") or (kids and heavy(x)):
            todo.extend(reversed(kids))
            continue
        a = kt.args[x]
        if tensor_inputs(a.get("Input Dims", []), a.get("Input type")):
            out.append(x)
        else:
            todo.extend(reversed(kids))
    out.sort(key=lambda i: kt.ts[i])
    return out


def split_at_kernels(tree: OpTree, kernels: list[int], a_us: float,
                     b_us: float) -> list[tuple[str, float, float, int]]:
    """The pieces of a host task ``[a_us, b_us]`` cut at its ``kernels`` (events in time order):
    ``("kernel", start µs, end µs, event)`` for each, ``("host", start µs, end µs, -1)`` for the
    time between."""
    kt = tree.kt
    pieces: list[tuple[str, float, float, int]] = []
    cur = a_us
    for x in kernels:
        xs, xe = float(kt.ts[x]), float(kt.ts[x] + kt.dur[x])
        if xs > cur + 1e-3:
            pieces.append(("host", cur, xs, -1))
        pieces.append(("kernel", max(xs, cur), max(xe, cur), x))
        cur = max(cur, xe)
    if b_us > cur + 1e-3:
        pieces.append(("host", cur, b_us, -1))
    return pieces
