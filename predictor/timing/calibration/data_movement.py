"""Data-movement microbenchmarks: concat, memcpy (tensor copy) and batched transpose.

* ``concat``: ``torch.cat`` of 2..32 tensors ``B x d_i`` along dim 1 (DLRM's feature
  interaction input). Bytes: read every input, write the output (``2 x`` output bytes). MLP on
  ``log2 elements, B, parts``: each input is copied as ``B`` chunks, so beyond the bytes the time
  grows with ``parts`` (a fixed cost per input) and ``B x parts`` (per chunk), and a large copy
  interleaving many inputs streams slower than one with few (on the 2-core VM a bytes-only
  roofline was 21 % GMAE, 30 % low at 20-31 inputs and 50-75 % high at 2-7; with ``parts`` 5-6 %).
* ``memcpy``: ``dst.copy_(src)`` into a preallocated tensor. Bytes ``2 x`` payload. Roofline.
* ``transpose``: ``x.transpose(1, 2).contiguous()`` of a ``batch x m x n`` tensor, the one
  permutation DLRM uses (Lin et al. 2022 §III-B). MLP on ``log2 batch, m, n`` (§III-B2).
"""

from __future__ import annotations

import numpy as np
import torch

from predictor.timing.calibration.base import BenchContext, Benchmark, Case, ModelSpec, log_uniform_int

__all__ = ["DataMovementBenchmark", "concat_draws"]


class DataMovementBenchmark(Benchmark):
    """concat / memcpy / transpose."""

    name = "data_movement"
    memory_bound = True

    def specs(self, ctx: BenchContext) -> list[ModelSpec]:
        return [
            ModelSpec(kernel="concat", kinds=("concat",), method="mlp", features=("elements", "batch", "parts"),
                      work=("elements", "parts"), fill="concat"),
            ModelSpec(kernel="memcpy", kinds=("memcpy",), method="roofline"),
            ModelSpec(kernel="transpose", kinds=("transpose",), method="mlp", features=("batch", "m", "n"),
                      work=("batch", "m", "n")),
        ]

    def cases(self, ctx: BenchContext) -> list[Case]:
        rng = ctx.rng
        count = ctx.count(tiny=8, quick=150, full=500)
        cap = {"tiny": 2**18, "quick": 2**24, "full": 2**27}[ctx.range_level]
        dev = ctx.device
        cases: list[Case] = []
        for n in log_uniform_int(rng, 2**6, cap, count):
            n = int(n)
            cases.append(({"kernel": "memcpy", "kind": "memcpy", "elements": n, "dtype_bytes": 4,
                           "bytes": 8.0 * n}, _copy(n, dev)))
        for b, widths in concat_draws(rng, count, cap):
            n = b * sum(widths)
            cases.append(({"kernel": "concat", "kind": "concat", "elements": n, "batch": b, "parts": len(widths),
                           "dtype_bytes": 4, "bytes": 8.0 * n}, _cat(b, widths, dev)))
        made = 0
        while made < count:
            b = int(log_uniform_int(rng, 1, 4096, 1)[0])
            m, n = (int(v) for v in log_uniform_int(rng, 2, 1024, 2))
            if b * m * n > cap or b * m * n < 64:
                continue
            made += 1
            cases.append(({"kernel": "transpose", "kind": "transpose", "batch": b, "m": m, "n": n,
                           "elements": b * m * n, "dtype_bytes": 4, "bytes": 8.0 * b * m * n}, _transpose(b, m, n, dev)))
        return cases


def concat_draws(rng: np.random.Generator, count: int, cap: int) -> list[tuple[int, list[int]]]:
    """``count`` concatenations ``(B, [d_1, ..])``: 2..32 inputs of ``B x d_i``, ``B`` log-uniform 1..8192,
    widths log-uniform 1..512, output elements in ``[64, cap]`` (the grid of :class:`DataMovementBenchmark`)."""
    out: list[tuple[int, list[int]]] = []
    while len(out) < count:
        parts = int(rng.integers(2, 33))
        b = int(log_uniform_int(rng, 1, 8192, 1)[0])
        widths = [int(w) for w in log_uniform_int(rng, 1, 512, parts)]
        if 64 <= b * sum(widths) <= cap:
            out.append((b, widths))
    return out


def _copy(n: int, device: torch.device):
    def build():
        src = torch.randn(n, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        return (lambda: dst.copy_(src)), None

    return build


def _cat(b: int, widths: list[int], device: torch.device):
    def build():
        xs = [torch.randn(b, w, device=device) for w in widths]
        return (lambda: torch.cat(xs, dim=1)), None

    return build


def _transpose(b: int, m: int, n: int, device: torch.device):
    def build():
        x = torch.randn(b, m, n, device=device)
        return (lambda: x.transpose(1, 2).contiguous()), None

    return build
