"""softmax microbenchmarks over (rows, width): ``torch.softmax(x, dim=-1)`` on ``m x n``, and the
backward kernels of softmax and log-softmax (``_softmax_backward_data``,
``_log_softmax_backward_data``: the output gradient and the saved output in, the input gradient
out; a cross-entropy's backward is the latter).

Parameters per row: ``m, n, elements, dtype_bytes, bytes``. Each kernel is modelled by an MLP on
``log2 m, log2 n`` like layer-norm (a row reduction followed by an element-wise pass). Before
the backward kernels had models, their tasks were timed by the forward's MLP, which sees only
the shape: a backward was predicted to cost exactly its forward.
"""

from __future__ import annotations

import torch

from predictor.timing.calibration.base import BenchContext, Benchmark, Case, ModelSpec
from predictor.timing.calibration.layer_norm import row_features, rows_by_width_cases
from predictor.timing.kernels.features import SHORT_ROW_FEATURES

__all__ = ["SoftmaxBenchmark"]


class SoftmaxBenchmark(Benchmark):
    """Softmax over the last dimension."""

    name = "softmax"
    memory_bound = True

    def specs(self, ctx: BenchContext) -> list[ModelSpec]:
        # ``short_rows``: a row shorter than one 64-byte vector runs ATen's tail path, ~10x per element; held-out
        # GMAE of the family on four Zen 4 calibrations 7.43 -> 6.07 %
        features, raw = row_features(ctx)
        features, raw = (*features, *SHORT_ROW_FEATURES), (*raw, *SHORT_ROW_FEATURES)
        return [ModelSpec(kernel=k, kinds=(k,), method="mlp", features=features, raw_features=raw,
                          work=("m", "n"), fill="rows_by_width")
                for k in ("softmax", "softmax_bwd", "log_softmax_bwd")]

    def cases(self, ctx: BenchContext) -> list[Case]:
        count = ctx.count(tiny=10, quick=250, full=800)
        count_bwd = ctx.count(tiny=6, quick=120, full=400)
        cases = rows_by_width_cases(ctx, "softmax", _builder, count)
        for kernel in ("softmax_bwd", "log_softmax_bwd"):
            cases += rows_by_width_cases(ctx, kernel, _backward_builder(kernel), count_bwd, rw=3.0)
        return cases


def _builder(m: int, n: int, dtype: torch.dtype, device: torch.device):
    def build():
        x = torch.randn(m, n, dtype=dtype, device=device)
        return (lambda: torch.softmax(x, dim=-1)), None

    return build


def _backward_builder(kernel: str):
    """A builder of the backward of softmax (``softmax_bwd``) or log-softmax (``log_softmax_bwd``)."""

    def make(m: int, n: int, dtype: torch.dtype, device: torch.device):
        def build():
            x = torch.randn(m, n, dtype=dtype, device=device)
            g = torch.randn(m, n, dtype=dtype, device=device)
            if kernel == "softmax_bwd":
                y = torch.softmax(x, dim=-1)
                return (lambda: torch._softmax_backward_data(g, y, -1, dtype)), None
            y = torch.log_softmax(x, dim=-1)
            return (lambda: torch._log_softmax_backward_data(g, y, -1, dtype)), None

        return build

    return make
