"""conv2d forward microbenchmarks, parameterised as the implicit GEMM they compute.

A convolution of ``N x C_in x H x W`` by ``C_out x C_in x kh x kw`` (stride 1, "same"
padding) is a GEMM with ``m = H_out * W_out`` output pixels per image, ``n = C_out`` and
``k = C_in * kh * kw``, repeated over ``batch = N`` images. Those are the parameters a graph
task carries (columns ``m, n, k, batch``, plus ``dim`` = the kernel height ``kh``), and the
MLP's features (a task without ``dim`` falls back to the analytic GEMM model). On a CPU the MLP also
gets ``conv_native`` (one thread; ``conv_native_mt`` with more): whether PyTorch runs the convolution
with its own kernel or hands it to oneDNN (:func:`~predictor.timing.kernels.features.conv_native`, ATen's
rule: 1x1 filters on fewer than 16 images, and small single images, stay native), and ``cout_alV`` /
``cin_alV``: whether ``C_out`` / ``C_in`` fill oneDNN's channel blocks of ``V`` = the CPU's fp32 lanes
(:data:`~predictor.timing.kernels.features.CONV_ALIGN_FEATURES`). Kernel sizes 1, 3 and 5;
channels and spatial sizes log-uniform. fp32 (the CPU's conv path for bf16 is a slow
fallback; on CUDA bf16 is added).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from predictor.timing.calibration.base import BenchContext, Benchmark, Case, ModelSpec, log_uniform_int
from predictor.timing.kernels.features import conv_align_features

__all__ = ["Conv2dBenchmark"]

_DTYPES = {"fp32": (torch.float32, 4), "bf16": (torch.bfloat16, 2)}


class Conv2dBenchmark(Benchmark):
    """2-D convolution forward."""

    name = "conv2d"

    def dtypes(self, ctx: BenchContext) -> tuple[str, ...]:
        return ("fp32", "bf16") if ctx.is_cuda else ("fp32",)

    def specs(self, ctx: BenchContext) -> list[ModelSpec]:
        # on a CPU, which of PyTorch's two convolution paths runs (its own or oneDNN's; the rule
        # depends on the thread count): an indicator the MLP gets as it is (not logged)
        path = () if ctx.is_cuda else ("conv_native" if ctx.threads == 1 else "conv_native_mt",)
        # and whether the channel counts fill oneDNN's channel blocks (the CPU's fp32 lanes)
        align = () if ctx.is_cuda else conv_align_features(ctx.simd_lanes)
        return [
            ModelSpec(kernel=f"conv2d/{dt}", kinds=("conv2d", "conv"), method="mlp",
                      features=("m", "n", "k", "batch", "dim", *path, *align), raw_features=(*path, *align),
                      work=("m", "n", "k", "batch"), route=f"conv2d/{dt}",
                      model="conv2d", router="dtype", prefix="conv2d", fallback="analytic-gemm")
            for dt in self.dtypes(ctx)
        ]

    def cases(self, ctx: BenchContext) -> list[Case]:
        count = ctx.count(tiny=10, quick=280, full=1000)
        cap = (5e11 if ctx.is_cuda else 1.5e9) if ctx.level != "tiny" else 3e7
        rng = ctx.rng
        cases: list[Case] = []
        for dt in self.dtypes(ctx):
            dtype, nbytes = _DTYPES[dt]
            made = 0
            while made < count:
                ks = int(rng.choice([1, 3, 3, 5]))
                n_img = int(log_uniform_int(rng, 1, 64, 1)[0])
                cin = int(log_uniform_int(rng, 1, 512, 1, 1 if rng.random() < 0.3 else 8)[0])
                cout = int(log_uniform_int(rng, 4, 512, 1, 8)[0])
                hw = int(log_uniform_int(rng, 4, 128, 1)[0])
                m, n, k = hw * hw, cout, cin * ks * ks
                flops = 2.0 * m * n * k * n_img
                if flops > cap or 4.0 * n_img * max(cin, cout) * hw * hw > ctx.max_tensor_bytes:
                    continue
                made += 1
                row = {"kernel": f"conv2d/{dt}", "kind": "conv2d", "m": m, "n": n, "k": k, "batch": n_img,
                       "dim": ks, "dtype_bytes": nbytes, "flops": flops}
                cases.append((row, _builder(n_img, cin, cout, hw, ks, dtype, ctx.device)))
        return cases


def _builder(n_img: int, cin: int, cout: int, hw: int, ks: int, dtype: torch.dtype, device: torch.device):
    def build():
        x = torch.randn(n_img, cin, hw, hw, dtype=dtype, device=device)
        w = torch.randn(cout, cin, ks, ks, dtype=dtype, device=device)
        bias = torch.randn(cout, dtype=dtype, device=device)
        pad = ks // 2
        return (lambda: F.conv2d(x, w, bias, padding=pad)), None

    return build
