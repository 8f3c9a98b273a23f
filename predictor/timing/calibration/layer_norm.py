"""layer-norm forward microbenchmarks over (rows, normalised width).

Input ``m x n`` (``m`` rows = tokens or samples, ``n`` = the normalised last dimension) with
an affine weight and bias. Parameters per row: ``m, n, elements = m n, dtype_bytes, bytes``
(read input, write output). Modelled by an MLP on ``log2 m, log2 n`` (Lin et al. 2024
§III-F), on a GPU also on whether ``n`` is a multiple of 4 (``n_al4``): PyTorch's CUDA layer norm
takes its vectorised kernel only then, and on the H100 pack's samples over 1M elements a ragged
``n`` ran at a median 563-632 GB/s against 1 357-1 747 GB/s. A graph task that gives only
``elements`` is read as rows of width 1024.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from predictor.timing.calibration.base import BenchContext, Benchmark, Case, ModelSpec, log_uniform_int

__all__ = ["LayerNormBenchmark", "rows_by_width_cases"]


#: dtypes of the row-wise kernels: fp32 on CPU; fp32 and bf16 on CUDA (mixed-precision models run
#: their layer norms and softmaxes in bf16)
_ROW_DTYPES = {"fp32": (torch.float32, 4), "bf16": (torch.bfloat16, 2)}


def row_dtypes(ctx: BenchContext) -> tuple[str, ...]:
    return ("fp32", "bf16") if ctx.is_cuda else ("fp32",)


def row_features(ctx: BenchContext) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(features, raw features) of a row-wise kernel's MLP: ``m, n`` (log2), plus ``dtype_bytes``
    (not log-transformed) where more than one dtype is benchmarked."""
    return (("m", "n", "dtype_bytes"), ("dtype_bytes",)) if len(row_dtypes(ctx)) > 1 else (("m", "n"), ())


def rows_by_width_cases(ctx: BenchContext, kernel: str, make, count: int, rw: float = 2.0) -> list[Case]:
    """Cases over ``m`` rows x ``n`` columns, both log-uniform, capped by elements; ``count`` per dtype.
    ``rw``: tensors of ``m x n`` read or written per call (the ``bytes`` column)."""
    cap = {"tiny": 2**18, "quick": 2**24, "full": 2**27}[ctx.range_level]
    cases: list[Case] = []
    for dt in row_dtypes(ctx):
        dtype, nbytes = _ROW_DTYPES[dt]
        made = 0
        while made < count:
            m = int(log_uniform_int(ctx.rng, 1, 65536, 1)[0])
            n = int(log_uniform_int(ctx.rng, 8, 16384, 1, 8 if ctx.rng.random() < 0.7 else 1)[0])
            if m * n > cap or m * n < 64:
                continue
            row = {"kernel": kernel, "kind": kernel, "m": m, "n": n, "elements": m * n, "dtype_bytes": nbytes,
                   "bytes": rw * nbytes * m * n}
            cases.append((row, make(m, n, dtype, ctx.device)))
            made += 1
    return cases


class LayerNormBenchmark(Benchmark):
    """F.layer_norm over the last dimension, with weight and bias."""

    name = "layer_norm"
    memory_bound = True

    def specs(self, ctx: BenchContext) -> list[ModelSpec]:
        features, raw = row_features(ctx)
        if ctx.is_cuda:  # the vectorised kernel needs n % 4 == 0 (module docstring)
            features, raw = (*features, "n_al4"), (*raw, "n_al4")
        return [ModelSpec(kernel="layer_norm", kinds=("layer_norm",), method="mlp", features=features,
                          raw_features=raw, work=("m", "n"), fill="rows_by_width")]

    def cases(self, ctx: BenchContext) -> list[Case]:
        count = ctx.count(tiny=10, quick=250, full=800)
        return rows_by_width_cases(ctx, "layer_norm", _builder, count)


def _builder(m: int, n: int, dtype: torch.dtype, device: torch.device):
    def build():
        x = torch.randn(m, n, dtype=dtype, device=device)
        w = torch.randn(n, dtype=dtype, device=device)
        b = torch.randn(n, dtype=dtype, device=device)
        return (lambda: F.layer_norm(x, (n,), w, b)), None

    return build
