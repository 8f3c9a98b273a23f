"""softmax forward microbenchmarks over (rows, width): ``torch.softmax(x, dim=-1)`` on ``m x n``.

Parameters per row: ``m, n, elements, dtype_bytes, bytes``. Modelled by an MLP on
``log2 m, log2 n`` like layer-norm (a row reduction followed by an element-wise pass).
"""

from __future__ import annotations

import pandas as pd
import torch

from predictor.calibration.base import BenchContext, Benchmark, ModelSpec, run_cases
from predictor.calibration.layer_norm import row_features, rows_by_width_cases

__all__ = ["SoftmaxBenchmark"]


class SoftmaxBenchmark(Benchmark):
    """Softmax over the last dimension."""

    name = "softmax"

    def specs(self, ctx: BenchContext) -> list[ModelSpec]:
        features, raw = row_features(ctx)
        return [ModelSpec(kernel="softmax", kinds=("softmax",), method="mlp", features=features, raw_features=raw,
                          work=("m", "n"), fill="rows_by_width")]

    def run(self, ctx: BenchContext) -> pd.DataFrame:
        count = ctx.count(tiny=10, quick=250, full=800)
        return run_cases(ctx, rows_by_width_cases(ctx, "softmax", _builder, count), self.name)


def _builder(m: int, n: int, dtype: torch.dtype, device: torch.device):
    def build():
        x = torch.randn(m, n, dtype=dtype, device=device)
        return (lambda: torch.softmax(x, dim=-1)), None

    return build
