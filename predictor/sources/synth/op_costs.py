"""Kind, FLOPs and bytes of one ATen operator from its inputs and outputs (fake or real tensors).

:func:`classify_op` sorts an operator into :data:`~predictor.sources.synth.opgraph.OP_KINDS`;
:func:`op_costs` gives its FLOPs (PyTorch's own ``flop_counter`` formulas where it has one), bytes
read and written (an embedding lookup moves the rows it gathers, not the whole table) and GEMM
shape. Units: FLOPs, bytes.
"""

from __future__ import annotations

import numpy as np
import torch

from predictor.sources.synth.opgraph import OP_KIND_INDEX

__all__ = ["classify_op", "op_costs", "op_short_name", "shape_text", "tensor_bytes"]

_K = OP_KIND_INDEX

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


def op_short_name(func) -> str:
    """``aten.mm.default`` -> ``mm``."""
    return func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)


def classify_op(name: str, func) -> int:
    """The op's index in :data:`~predictor.sources.synth.opgraph.OP_KINDS`."""
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


def tensor_bytes(t: torch.Tensor) -> float:
    """Bytes of the tensor's view (elements x element size), not of its whole storage."""
    return float(t.numel() * t.element_size())


def shape_text(ts: list[torch.Tensor]) -> str:
    """Shapes as text, for people: ``[2, 3],[3]``."""
    return ",".join(str(list(t.shape)) for t in ts)


def op_costs(name, kind, func, args, kwargs, ins, outs, out) -> tuple[float, float, float, tuple]:
    """(FLOPs, bytes read, bytes written, (m, n, k, batch)) of one operator."""
    nan = float("nan")
    gemm = (nan, nan, nan, nan)
    if kind in (_K["view"], _K["alloc"]):
        return 0.0, 0.0, 0.0, gemm
    read = float(sum(tensor_bytes(t) for t in {id(t): t for t in ins}.values()))
    written = float(sum(tensor_bytes(t) for t in outs))
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
    idx_bytes = float(sum(tensor_bytes(t) for t in idx))
    out_bytes = float(sum(tensor_bytes(t) for t in outs))
    if "backward" in name:
        grads = [t for t in ins if t.is_floating_point()]
        g = float(sum(tensor_bytes(t) for t in grads))
        # dense backward: read the output gradient and indices, write (zero + scatter) the table grad
        return g + idx_bytes, out_bytes
    # gathered rows: one row per looked-up index
    table = next((t for t in ins if t.is_floating_point() and t.dim() == 2), None)
    rows = float(sum(t.numel() for t in idx[:1])) if idx else 0.0
    gathered = rows * (table.shape[1] * table.element_size() if table is not None else 0.0)
    return gathered + idx_bytes, out_bytes

