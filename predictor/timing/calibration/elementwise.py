"""Element-wise microbenchmarks: relu, gelu, tanh, dropout (training mode), add, mul, and the
backward kernels of relu, gelu and tanh.

Elements are log-uniform over a range that spans the caches and main memory (``2^6`` to
``2^24`` elements in the quick grid, ``2^28`` in the full one). Every op is out of place
(allocates its output), as in a training step. Bytes moved: one read per input and one
write per output, plus the 1-byte mask dropout keeps for backward. Parameters per row:
``elements, dtype_bytes, bytes``.

relu, gelu, tanh, add, mul and the backward kernels are modelled by a roofline with bandwidths *fitted* per
working-set regime (Lin et al. 2022 §III-B1: "the maximum measured bandwidth ... as the
corrected peak"); dropout, which draws random numbers, by an MLP on ``log2 elements``
(Lin et al. 2024 §III-F).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from predictor.timing.calibration.base import BenchContext, Benchmark, Case, ModelSpec, log_uniform_int

__all__ = ["ElementwiseBenchmark", "ELEMENTWISE_OPS"]

#: op -> (inputs read, outputs written, extra bytes per element). The ``*_bwd`` ops are the
#: activations' backward kernels (ATen ``threshold_backward``, ``gelu_backward``,
#: ``tanh_backward``: the output gradient and the saved tensor in, the input gradient out); they
#: are kernels of their own (an exact GELU's backward costs ~2x its forward on the 2-core VM), so
#: they get their own fits rather than the forward's scaled by bytes
ELEMENTWISE_OPS: dict[str, tuple[int, int, float]] = {
    "relu": (1, 1, 0.0),
    "gelu": (1, 1, 0.0),
    "tanh": (1, 1, 0.0),
    "dropout": (1, 1, 1.0),
    "add": (2, 1, 0.0),
    "mul": (2, 1, 0.0),
    "relu_bwd": (2, 1, 0.0),
    "gelu_bwd": (2, 1, 0.0),
    "tanh_bwd": (2, 1, 0.0),
}
#: backward ops get fewer shapes than the forward ones (the quick calibration's 10-minute budget)
_BWD_SHARE = 0.5
_DTYPES = {"fp32": (torch.float32, 4), "bf16": (torch.bfloat16, 2)}


class ElementwiseBenchmark(Benchmark):
    """Activation functions, dropout and binary arithmetic."""

    name = "elementwise"
    memory_bound = True

    def dtypes(self, ctx: BenchContext) -> tuple[str, ...]:
        return ("fp32", "bf16") if ctx.is_cuda else ("fp32",)

    def specs(self, ctx: BenchContext) -> list[ModelSpec]:
        out = []
        for op in ELEMENTWISE_OPS:
            if op == "dropout":
                out.append(ModelSpec(kernel=op, kinds=(op,), method="mlp", features=("elements", "dtype_bytes"),
                                     work=("elements",)))
            else:
                out.append(ModelSpec(kernel=op, kinds=(op,), method="roofline"))
        return out

    def cases(self, ctx: BenchContext) -> list[Case]:
        count = ctx.count(tiny=8, quick=100, full=300)
        hi = {"tiny": 2**18, "quick": 2**24, "full": 2**28}[ctx.range_level]
        cases: list[Case] = []
        for op, (n_in, n_out, extra) in ELEMENTWISE_OPS.items():
            n_op = max(4, int(count * _BWD_SHARE)) if op.endswith("_bwd") else count
            for dt in self.dtypes(ctx):
                dtype, nbytes = _DTYPES[dt]
                for n in log_uniform_int(ctx.rng, 2**6, hi, n_op):
                    n = int(n)
                    if (n_in + n_out) * n * nbytes > 3 * ctx.max_tensor_bytes:
                        continue
                    row = {"kernel": op, "kind": op, "elements": n, "dtype_bytes": nbytes,
                           "bytes": float((n_in + n_out) * n * nbytes + extra * n)}
                    cases.append((row, _builder(op, n, dtype, ctx.device)))
        return cases


def _builder(op: str, n: int, dtype: torch.dtype, device: torch.device):
    def build():
        x = torch.randn(n, dtype=dtype, device=device)
        if op.endswith("_bwd"):
            g = torch.randn(n, dtype=dtype, device=device)
            aten = torch.ops.aten
            if op == "relu_bwd":
                return (lambda: aten.threshold_backward(g, x, 0.0)), None
            if op == "gelu_bwd":
                return (lambda: aten.gelu_backward(g, x)), None
            y = torch.tanh(x)
            return (lambda: aten.tanh_backward(g, y)), None
        if op in ("add", "mul"):
            y = torch.randn(n, dtype=dtype, device=device)
            f = torch.add if op == "add" else torch.mul
            return (lambda: f(x, y)), None
        if op == "dropout":
            return (lambda: F.dropout(x, 0.1, training=True)), None
        f = {"relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh}[op]
        return (lambda: f(x)), None

    return build
