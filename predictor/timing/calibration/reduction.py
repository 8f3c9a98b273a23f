"""Column-reduction microbenchmarks: ``x.sum(0)`` of an ``m x n`` tensor, a linear layer's bias gradient.

Eager autograd's ``AddmmBackward0`` reduces the output gradient ``[m rows (tokens or samples), n features]``
over its rows into the ``[n]`` bias gradient. ATen runs that as an outer-dimension reduction: each
output column accumulates ``m`` strided elements, vectorised across columns, so its speed depends on the
shape (a narrow ``n`` leaves the vector lanes idle), not on the bytes alone: priced by the ``add`` roofline
on their bytes, a GPT step's bias gradients ran ~2x that on a Zen 4 VM (1.18 ms against 0.52 ms).

Shapes: the row-wise grid (``m`` 1..65536, ``n`` 8..16384, 70 % of ``n`` multiples of 8, elements capped
by level; :func:`~.layer_norm.rows_by_width_cases`). Parameters per row: ``m, n, elements = m n,
dtype_bytes, bytes`` (the input read once; the ``n``-element output is not counted). Modelled by an MLP on
``log2 m, log2 n`` (as layer norm, Lin et al. 2024 §III-F); a graph task of kind ``sum`` needs ``m`` and
``n`` (the synthesisers' :func:`~predictor.sources.synth.emit.column_sum`), else the fitted roofline times it.

Timed as the other memory-bound families (cold on a CPU, :attr:`Benchmark.memory_bound`). In a step the
gradient's state lies between cold and warm: on the Zen 4 VM the cold-fitted model priced a step's sums
0.84-2.7x their profiled time, a warm-fitted one 0.23-0.36x, one timed right after the weight-gradient GEMM
(its width not a model input) 0.26-0.67x.
"""

from __future__ import annotations

import torch

from predictor.timing.calibration.base import BenchContext, Benchmark, Case, ModelSpec
from predictor.timing.calibration.layer_norm import row_features, rows_by_width_cases

__all__ = ["ReductionBenchmark"]


class ReductionBenchmark(Benchmark):
    """``x.sum(0)``: the column sum of a bias gradient."""

    name = "reduction"
    memory_bound = True

    def specs(self, ctx: BenchContext) -> list[ModelSpec]:
        features, raw = row_features(ctx)
        return [ModelSpec(kernel="sum", kinds=("sum",), method="mlp", features=features, raw_features=raw,
                          work=("m", "n"))]

    def cases(self, ctx: BenchContext) -> list[Case]:
        count = ctx.count(tiny=10, quick=150, full=600)
        return rows_by_width_cases(ctx, "sum", _builder, count, rw=1.0)


def _builder(m: int, n: int, dtype: torch.dtype, device: torch.device):
    def build():
        x = torch.randn(m, n, dtype=dtype, device=device)
        return (lambda: x.sum(0)), None

    return build
