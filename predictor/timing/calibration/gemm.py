"""GEMM microbenchmarks: ``addmm``, ``mm`` and ``bmm`` over log-spaced shapes and several dtypes.

Shapes ``m, n, k`` (and the ``bmm`` batch) are drawn log-uniformly, half of them rounded to
multiples of 16 as framework shapes usually are, the other half left ragged (13 dense
features, 27 interaction rows); ``bmm`` draws its per-entry shapes from a quarter of the
range. A shape whose FLOPs exceed the level's cap is redrawn, so one call stays below
~20 ms on a CPU. dtypes: fp32 and bf16 on CPU; fp32, bf16 and fp16 on CUDA. Parameters per
row: ``m, n, k, batch, dtype_bytes, flops`` (``2 m n k batch``).
Modelled by one MLP per (op, dtype) on log2 of ``m, n, k, batch`` (Lin et al. 2022 §III-B2), plus
alignment indicators: ``ld_aligned`` on a GPU; on a CPU ``m_al16, n_al16, k_al16``, kept per
(op, dtype) only where they lower the validation error.
"""

from __future__ import annotations

import numpy as np
import torch

from predictor.timing.calibration.base import BenchContext, Benchmark, Case, ModelSpec, log_uniform_int
from predictor.timing.kernels.features import (
    ALIGN16_FEATURES,
    ALIGN_FINE_FEATURES,
    ONEDNN_FEATURES,
    ROUTE_FEATURES,
)

__all__ = ["GemmBenchmark", "GEMM_KINDS", "gemm_builder", "gemm_route"]

#: graph op kinds timed by the GEMM model
GEMM_KINDS = ("gemm", "mm", "addmm", "bmm", "linear", "matmul")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
OPS = ("addmm", "mm", "bmm")


def gemm_route(op: str, dtype: str) -> str:
    """The key of one (op, dtype) MLP, e.g. ``"addmm/fp32"``."""
    return f"{op}/{dtype}"


class GemmBenchmark(Benchmark):
    """addmm / mm / bmm in every dtype the device runs fast enough to matter."""

    name = "gemm"
    #: not spread (``Benchmark.spread_rounds``): timed once per shape, a 2-core VM's GEMMs read 8 % below the
    #: median of rounds of the same machine 45 minutes later, and the packs predicted training steps worse.
    #: each (op, dtype) kernel gets an equal share of round one's time (``Benchmark.time_fair``): on a CPU
    #: without native bf16 the bf16 GEMMs run ~30x slower than fp32 and took the whole budget
    time_fair = True

    def dtypes(self, ctx: BenchContext) -> tuple[str, ...]:
        return ("fp32", "bf16", "fp16") if ctx.is_cuda else ("fp32", "bf16")

    def specs(self, ctx: BenchContext) -> list[ModelSpec]:
        if ctx.is_cuda:
            # one net per op and dtype; whether n and k rows are 16-byte multiples (fast kernels need them)
            return [ModelSpec(kernel=gemm_route(op, dt), kinds=GEMM_KINDS, method="mlp",
                              features=(*(("m", "n", "k", "batch") if op == "bmm" else ("m", "n", "k")), "ld_aligned"),
                              raw_features=("ld_aligned",),
                              work=("m", "n", "k", "batch") if op == "bmm" else ("m", "n", "k"),
                              route=gemm_route(op, dt), model="gemm", router="gemm", fallback="analytic-gemm")
                    for op in OPS for dt in self.dtypes(ctx)]
        # CPU: one net per dtype pooled over addmm / mm / bmm (they run the same micro-kernels; bmm alone was the
        # worst learned kernel), with ATen's path edges (bf16 ``onednn_gemm``, fp32 ``bmm_naive`` and
        # ``bmm_intensity``) and optional alignment inputs: held-out GMAE on a Zen 4 pack fp32 addmm / mm / bmm
        # 3.5 / 3.5 / 5.3 -> 2.7 / 2.8 / 4.2 %.
        def edge(dt: str) -> tuple[str, ...]:
            return ONEDNN_FEATURES if dt == "bf16" else ("bmm_naive", "bmm_intensity")

        def align(dt: str) -> tuple[str, ...]:
            return ALIGN16_FEATURES if dt == "bf16" else (*ALIGN16_FEATURES, *ALIGN_FINE_FEATURES)

        return [ModelSpec(kernel=gemm_route(op, dt), kinds=GEMM_KINDS, method="mlp",
                          features=("m", "n", "k", "batch", *edge(dt), *ROUTE_FEATURES, *align(dt)),
                          raw_features=(*edge(dt), *ROUTE_FEATURES, *align(dt)),
                          optional_features=align(dt), work=("m", "n", "k", "batch"),
                          route=gemm_route(op, dt), model="gemm", router="gemm", fallback="analytic-gemm",
                          pool=f"gemm/{dt}")
                for op in OPS for dt in self.dtypes(ctx)]

    def flop_cap(self, ctx: BenchContext) -> float:
        if ctx.is_cuda:
            return {"tiny": 1e10, "quick": 2e11, "full": 2e12}[ctx.range_level]
        return {"tiny": 5e7, "quick": 2.5e9, "full": 1e10}[ctx.level]

    def cold(self, ctx: BenchContext) -> bool:
        """Warm (repeated calls on one instance) or, with ``ctx.cold_gemm``, data cold and code warm
        (:meth:`~.timing.Timer.measure_cold`); the column ``cold`` says which."""
        return ctx.cold_gemm

    def cases(self, ctx: BenchContext) -> list[Case]:
        n_each = ctx.count(tiny=12, quick=350, full=1500)
        hi = {"tiny": 256, "quick": 2048, "full": 16384 if ctx.is_cuda else 8192}[ctx.range_level]
        cap = self.flop_cap(ctx)
        cases: list[Case] = []
        for op in OPS:
            for dt in self.dtypes(ctx):
                for m, n, k, b in self._shapes(ctx, op, n_each, hi, cap):
                    row = {"kernel": gemm_route(op, dt), "kind": op, "m": m, "n": n, "k": k, "batch": b,
                           "dtype_bytes": _BYTES[dt], "flops": 2.0 * m * n * k * b}
                    cases.append((row, gemm_builder(op, m, n, k, b, _DTYPES[dt], ctx.device)))
        return cases

    def _shapes(self, ctx: BenchContext, op: str, count: int, hi: int, cap: float) -> list[tuple[int, int, int, int]]:
        out: list[tuple[int, int, int, int]] = []
        rng = ctx.rng
        while len(out) < count:
            mult = 16 if rng.random() < 0.5 else 1
            # batched GEMMs in models are small per batch entry (attention: seq x head_dim), and
            # their aligned half is aligned too
            lo, top = (1, max(2, hi // 4)) if op == "bmm" else (4, hi)
            if op != "bmm" and not ctx.is_cuda and rng.random() < LARGE_SHARE:
                m, n, k = large_gemm_shape(rng, lo, top, cap, mult)
            else:
                m, n, k = (int(v) for v in log_uniform_int(rng, lo, top, 3, mult))
            b = int(log_uniform_int(rng, 1, 1024 if ctx.level != "tiny" else 16, 1)[0]) if op == "bmm" else 1
            if 2.0 * m * n * k * b <= cap and 4.0 * b * (m * k + k * n + m * n) <= ctx.max_tensor_bytes:
                out.append((m, n, k, b))
        return out


#: share of a CPU grid's addmm / mm shapes drawn from the top of the FLOP range (:func:`large_gemm_shape`).
#: Dims drawn log-uniform under a FLOP cap leave few shapes near the cap (5 of ~450 per kernel above
#: 1e9 FLOPs in a ``--quick --scale 2`` grid), yet a training step's time is in its largest GEMMs:
#: a pack fitted on such a grid predicted the e2e MLP's 1-2 GFLOP GEMMs at 113-120 GFLOP/s where they
#: ran at 108-110
LARGE_SHARE = 0.3
#: the top of the FLOP range those shapes are drawn from: the cap over this factor, up to the cap
LARGE_RANGE = 64.0


def large_gemm_shape(rng: np.random.Generator, lo: int, top: int, cap: float, mult: int) -> tuple[int, int, int]:
    """(m, n, k) with ``2 m n k`` log-uniform in ``[cap / LARGE_RANGE, cap]``, the log of ``m n k`` split
    at random between the three dims, each within ``[lo, top]`` and rounded to ``mult``.

    What a dim loses to its bound goes to the dims still inside theirs, so the shape keeps its drawn
    FLOPs wherever ``top ** 3`` allows: clipping alone left 4 of a quick grid's 350 addmm shapes above
    1e9 FLOPs instead of ~20, and a pack fitted on it predicted a 1024 x 1024 x 512 GEMM at 27 ms where
    it runs in 17."""
    log_mnk = rng.uniform(np.log(cap / LARGE_RANGE / 2.0), np.log(cap / 2.0))
    logs = rng.dirichlet(np.ones(3)) * log_mnk
    lo_log, hi_log = np.log(max(lo, 1)), np.log(top)
    for _ in range(3):  # each pass pins at least one more dim to a bound, or moves nothing
        clipped = np.clip(logs, lo_log, hi_log)
        excess = float(logs.sum() - clipped.sum())
        free = clipped < hi_log if excess > 0 else clipped > lo_log  # dims with room in that direction
        logs = clipped
        if abs(excess) < 1e-12 or not free.any():
            break
        logs[free] += excess / free.sum()
    logs = np.clip(logs, lo_log, hi_log)
    dims = [int(min(top, max(mult, round(np.exp(v) / mult) * mult))) for v in logs]
    while 2.0 * dims[0] * dims[1] * dims[2] > cap and max(dims) > mult:  # rounding up past the cap
        i = int(np.argmax(dims))
        dims[i] = max(mult, dims[i] - mult)
    return dims[0], dims[1], dims[2]


def gemm_builder(op: str, m: int, n: int, k: int, b: int, dtype: torch.dtype, device: torch.device):
    """A case builder: a callable that makes random operands and returns ``(fn, None)``, ``fn`` running one ``op``."""
    def build():
        if op == "bmm":
            x = torch.randn(b, m, k, dtype=dtype, device=device)
            y = torch.randn(b, k, n, dtype=dtype, device=device)
            return (lambda: torch.bmm(x, y)), None
        x = torch.randn(m, k, dtype=dtype, device=device)
        y = torch.randn(k, n, dtype=dtype, device=device)
        if op == "addmm":
            bias = torch.randn(n, dtype=dtype, device=device)
            return (lambda: torch.addmm(bias, x, y)), None
        return (lambda: torch.mm(x, y)), None

    return build
