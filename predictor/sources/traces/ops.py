"""What a traced GPU task is: its op kind, category and kernel-model parameters.

The op kind keys the kernel models of :mod:`predictor.timing.kernels` (``"addmm"``, ``"conv2d"``,
``"embedding_bag_fwd"``, ``"all_reduce"``, ``"memcpy"``, ...). It is decided by the innermost
framework op that launched the kernel (``aten::addmm`` -> ``"addmm"``), by the kernel's own
name for NCCL collectives and copies, and falls back to ``"elementwise"``.

Parameters (:data:`predictor.graph.PARAM_COLUMNS`) come from the launching op's input
shapes — Kineto's ``Input Dims`` (``record_shapes=True``) or the execution trace — so that a
what-if transform can later rescale them (batch size, hidden size) and re-time the task.
"""

from __future__ import annotations

import math
import re

from predictor.graph import Category

__all__ = ["classify_gpu_task", "op_params", "dtype_bytes", "collective_kind"]

_GEMM_OPS = {
    "aten::addmm": "addmm",
    "aten::mm": "mm",
    "aten::bmm": "bmm",
    "aten::baddbmm": "bmm",
    "aten::addbmm": "bmm",
    "aten::matmul": "matmul",
    "aten::linear": "linear",
    "aten::_scaled_mm": "mm",
}
_CONV_OPS = (
    "aten::cudnn_convolution",
    "aten::convolution",
    "aten::_convolution",
    "aten::conv2d",
    "aten::conv1d",
    "aten::conv3d",
    "aten::convolution_backward",
    "aten::cudnn_convolution_backward",
    "aten::mkldnn_convolution",
    "aten::_slow_conv2d_forward",
)
_EMB_FWD = ("aten::embedding_bag", "aten::_embedding_bag", "aten::embedding", "fbgemm::split_embedding_codegen_lookup")
_EMB_BWD = ("aten::_embedding_bag_backward", "aten::embedding_dense_backward", "aten::_embedding_bag_dense_backward",
            "aten::embedding_backward", "aten::_embedding_bag_sparse_backward")
_NCCL_KIND = (
    ("allreduce", "all_reduce"),
    ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("all_gather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("reduce_scatter", "reduce_scatter"),
    ("alltoall", "all_to_all"),
    ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"),
    ("sendrecv", "send_recv"),
    ("send", "send_recv"),
    ("recv", "send_recv"),
    ("reduce", "all_reduce"),
)
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "c10::half": 2, "half": 2, "float16": 2, "c10::bfloat16": 2, "bfloat16": 2,
    "double": 8, "float64": 8, "long": 8, "int64": 8, "long int": 8, "int": 4, "int32": 4, "short": 2,
    "int16": 2, "char": 1, "signed char": 1, "unsigned char": 1, "int8": 1, "uint8": 1, "bool": 1,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
}
_TYPE_INNER = re.compile(r"\((.*)\)")


def dtype_bytes(type_name: str) -> float:
    """Bytes per element of a Kineto ``Input type`` or ET type (``"float"``, ``"Tensor(c10::Half)"``)."""
    t = type_name.strip()
    m = _TYPE_INNER.search(t)
    if m:
        t = m.group(1)
    return float(_DTYPE_BYTES.get(t.lower(), math.nan))


def is_nccl_kernel(name: str) -> bool:
    return name.startswith(("ncclKernel", "ncclDevKernel", "ncclKernel_")) or name.startswith("nccl:")


def collective_kind(kernel_name: str, op_name: str = "", collective_arg: str | None = None) -> str:
    """Collective op kind of an NCCL kernel: ``all_reduce``, ``all_to_all``, ``all_gather``, ..."""
    probe = (op_name or "").lower()
    if "alltoall" in probe or "all_to_all" in probe:
        return "all_to_all"
    for text in (collective_arg or "", probe, kernel_name.lower()):
        t = text.replace("nccldevkernel_", "").replace("ncclkernel_", "")
        for key, kind in _NCCL_KIND:
            if key in t:
                return kind
    return "send_recv"


def _numel(shape: object) -> float:
    if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
        return math.nan
    return float(math.prod(shape)) if shape else 1.0


def is_tensor_type(t: object) -> bool:
    """Is a Kineto ``Input type`` / ET type a tensor's? Kineto names dtypes as PyTorch does
    (``float``, ``c10::BFloat16``, ``c10::Half``), hence case-insensitive; ``""``: unknown, assume so."""
    return isinstance(t, str) and (t.startswith("Tensor") or t.lower() in _DTYPE_BYTES or t == "")


def _tensor_shapes(shapes: list, types: list | None) -> list[list[int]]:
    """The shapes of the tensor inputs, in order (scalars and lists dropped)."""
    out: list[list[int]] = []
    for i, s in enumerate(shapes):
        t = types[i] if types is not None and i < len(types) else ""
        if isinstance(s, list) and s and all(isinstance(d, int) for d in s) and is_tensor_type(t):
            out.append(s)
    return out


def op_params(op_name: str, shapes: list, types: list | None, kind: str) -> dict[str, float]:
    """Kernel-model parameters of a task launched by ``op_name`` with these input shapes.

    ``shapes``/``types``: Kineto ``Input Dims``/``Input type`` or the ET's input shapes/types.
    Returns an empty dict when nothing useful is known.
    """
    if not isinstance(shapes, list):
        return {}
    ts = _tensor_shapes(shapes, types)
    out: dict[str, float] = {}
    if types:
        for t in types:
            if isinstance(t, str) and t:
                b = dtype_bytes(t)
                if b == b:
                    out["dtype_bytes"] = b
                    break
    try:
        if kind in ("addmm", "mm", "bmm", "matmul", "linear"):
            mats = [s for s in ts if len(s) >= 2]
            if op_name in ("aten::linear",) and len(mats) >= 2:
                a, w = mats[0], mats[1]
                out.update(m=float(math.prod(a[:-1])), k=float(a[-1]), n=float(w[0]))
            elif len(mats) >= 2 and len(mats[0]) == 3 and len(mats[1]) == 3:
                a, b = mats[-2], mats[-1]
                out.update(batch=float(a[0]), m=float(a[1]), k=float(a[2]), n=float(b[2]))
            elif len(mats) >= 2:
                a, b = mats[-2], mats[-1]
                out.update(m=float(math.prod(a[:-1])), k=float(a[-1]), n=float(b[-1]))
            if "m" in out:
                out["flops"] = 2.0 * out["m"] * out["n"] * out["k"] * out.get("batch", 1.0)
        elif kind == "conv2d" and len(ts) >= 2 and len(ts[0]) >= 3 and len(ts[1]) >= 3:
            x, w = ts[0], ts[1]
            if op_name.endswith("_backward") and len(ts) >= 3:  # grad_output, input, weight
                x, w = ts[1], ts[2]
            spatial = float(math.prod(x[2:]))
            out.update(batch=float(x[0]), m=float(x[0]) * spatial, n=float(w[0]), k=float(math.prod(w[1:])))
            out["flops"] = 2.0 * out["m"] * out["n"] * out["k"]
        elif kind in ("embedding_bag_fwd", "embedding_bag_bwd") and len(ts) >= 2:
            w, idx = ts[0], ts[1]
            if kind == "embedding_bag_bwd":  # grad, indices, offsets, ...
                idx = ts[1] if len(ts) > 1 else idx
            if len(w) == 2:
                out.update(rows=float(w[0]), dim=float(w[1]))
            nnz = _numel(idx)
            if len(ts) >= 3 and len(ts[2]) == 1 and ts[2][0] > 0:
                batch = float(ts[2][0])
                out.update(batch=batch, pooling=nnz / batch)
        elif ts:
            out["elements"] = _numel(ts[0])
    except (TypeError, ValueError, IndexError):
        return {}
    return {k: v for k, v in out.items() if v == v}


def classify_gpu_task(gpu_cat: str, kernel_name: str, op_name: str, args: dict) -> tuple[str, Category]:
    """(op kind, :class:`Category`) of one GPU task.

    ``gpu_cat``: ``"kernel"``, ``"memcpy"`` or ``"memset"``; ``op_name``: the innermost
    framework op that launched it (``""`` if unknown); ``args``: the kernel's Kineto args.
    """
    if gpu_cat == "memcpy":
        return "memcpy", Category.MEMORY
    if gpu_cat == "memset":
        return "memset", Category.MEMORY
    if is_nccl_kernel(kernel_name):
        return collective_kind(kernel_name, op_name, args.get("Collective name")), Category.COMMUNICATION
    kind = _GEMM_OPS.get(op_name)
    if kind is not None:
        return kind, Category.COMPUTE
    if op_name in _CONV_OPS:
        return "conv2d", Category.COMPUTE
    if op_name in _EMB_FWD or "embedding_codegen_forward" in kernel_name or "embedding_bag" in op_name and "backward" not in op_name:
        return "embedding_bag_fwd", Category.MEMORY
    if op_name in _EMB_BWD or "embedding_codegen_backward" in kernel_name:
        return "embedding_bag_bwd", Category.MEMORY
    low = kernel_name.lower()
    if "gemm" in low or "xmma" in low or "cutlass" in low or "conv" in low:
        return ("conv2d" if "conv" in low or "fprop" in low or "dgrad" in low or "wgrad" in low else "gemm"), Category.COMPUTE
    return "elementwise", Category.MEMORY
