"""GEMM (mm, addmm, bmm, linear) and convolution-as-GEMM: roofline with a size-dependent efficiency.

Small GEMMs do not fill the device (few tiles, one partial wave) and reach a small fraction
of peak; large ones saturate at ``gemm_efficiency_max`` of the platform. We model the
achieved FLOP rate as ``peak * eff_max * f / (f + f_half)`` where ``f`` is the GEMM's FLOP
count and ``f_half`` the FLOP count that reaches half the ceiling (``peak * t_half_s``). Time
is the larger of that compute time and the memory time of reading A, B and writing C, plus
the device's kernel floor. Calibration replaces this with the MLP of Lin et al. 2022.

On NVIDIA GPUs a tensor-core GEMM (16- or 8-bit, or TF32) whose n or k (the leading dimensions of
PyTorch's row-major operands) is not a multiple of 16 bytes' worth of elements cannot use the aligned
tensor-core kernels and saturates at ``unaligned_efficiency`` of peak instead (0.145, fitted on the H100
pack's bf16 GEMMs of >= 1 GFLOP with n or k unaligned, which run at ~0.15 of peak where aligned ones
reach ~0.63; an unaligned m costs little; the H200 pack held out: mean |rate error| 527 % -> 74 %,
``experiments/multinode_validation.py``).

Fused attention kernels of a named implementation (``attn_flash2``, ``attn_flash_triton``, ``attn_cudnn`` and their
``_bwd``) are timed at that implementation's published speed (:mod:`.attention`) where the platform
has figures and the kernel runs in 16-bit, else as a GEMM of their FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.timing.kernels.attention import ATTENTION_KINDS, attention_seconds
from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.platforms.schema import Platform

DTYPE_BY_BYTES = {1: "fp8", 2: "bf16", 4: "fp32", 8: "fp64"}


@dataclass(frozen=True)
class GemmParams:
    """Analytic GEMM parameters."""

    #: a GEMM that would take this long at peak reaches half of the efficiency ceiling, seconds
    t_half_s: float = 8e-6
    #: use tensor-core tf32 for fp32 GEMMs (PyTorch default is off for matmul)
    allow_tf32: bool = False
    #: share of peak a tensor-core GEMM whose n or k is not a multiple of 16 bytes' worth of elements saturates at
    #: (NVIDIA GPUs; fitted on the H100 pack, see the module)
    unaligned_efficiency: float = 0.145


class AnalyticGemm(KernelModel):
    """Roofline GEMM with a saturating efficiency curve (analytic default)."""

    kinds = ("gemm", "mm", "addmm", "bmm", "linear", "matmul", "conv2d", "conv", *ATTENTION_KINDS)
    name = "analytic-gemm"

    def __init__(self, params: GemmParams | None = None) -> None:
        self.params = params or GemmParams()

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        m = tasks.get("m")
        n = tasks.get("n")
        k = tasks.get("k")
        b = tasks.get("batch", 1.0)
        dt = tasks.get("dtype_bytes", 4.0)
        flops = tasks.get("flops")
        shape_flops = 2.0 * m * n * k * b
        flops = np.where(np.isnan(flops), shape_flops, flops)
        flops = np.nan_to_num(flops, nan=0.0)
        moved = tasks.get("bytes")
        shape_bytes = (m * k + k * n + m * n) * b * dt
        moved = np.nan_to_num(np.where(np.isnan(moved), shape_bytes, moved), nan=0.0)
        kinds, inverse = np.unique(dt, return_inverse=True)  # a handful of dtypes over many kernels
        peak = np.array([self._peak(platform, x) for x in kinds])[inverse.reshape(-1)]
        f_half = peak * self.params.t_half_s
        ceiling = np.full(len(flops), platform.gemm_efficiency_max)
        if platform.kind == "gpu" and platform.vendor == "NVIDIA" and tasks.kind not in ("conv2d", "conv", *ATTENTION_KINDS):
            k_lead = np.where(tasks.get("k_strided", 0.0) == 1.0, 0.0, k)  # no operand contiguous along k
            off = self._unaligned(n, k_lead, dt) & (tasks.get("tiled", 0.0) != 1.0)
            ceiling = np.where(off, min(platform.gemm_efficiency_max, self.params.unaligned_efficiency), ceiling)
        # a batch run as separate GEMMs, ``streams`` at a time, saturates on the FLOPs in flight together
        streams = tasks.get("streams", np.nan)
        apart = np.isfinite(streams) & (b > streams)
        in_flight = flops * np.where(apart, streams / b, 1.0)
        rate = peak * ceiling * in_flight / (in_flight + f_half + 1e-30)
        t_compute = np.where(flops > 0, flops / np.maximum(rate, 1e-30), 0.0)
        t_memory = moved / (platform.memory_bandwidth * platform.memory_efficiency)
        out = np.maximum(t_compute, t_memory) + platform.kernel_floor_s
        if tasks.kind in ATTENTION_KINDS and len(tasks) and np.all(dt == 2):
            # m = n = sequence, k = head dim, batch = samples x heads (transformer_kernels' flash kernels)
            published = attention_seconds(tasks.kind, m, k, b * np.ones_like(m), flops, platform)
            if published is not None:
                return published
        return out

    def _unaligned(self, n: np.ndarray, k: np.ndarray, dt: np.ndarray) -> np.ndarray:
        """Tensor-core GEMMs (16- and 8-bit; fp32 with TF32) whose n or k is not a multiple of 16 bytes of elements
        (m, the output rows, leads no row-major operand); False where a dimension is unknown."""
        tensor_core = (dt <= 2) | ((dt == 4) & self.params.allow_tf32)
        step = 16.0 / np.maximum(np.nan_to_num(dt, nan=4.0), 1.0)
        dims = np.stack([n, k])
        known = np.all(np.isfinite(dims), axis=0)
        off = np.any(np.mod(np.where(np.isfinite(dims), dims, 0.0), step) != 0, axis=0)
        return tensor_core & known & off

    def _peak(self, platform: Platform, dtype_bytes: float) -> float:
        dtype = DTYPE_BY_BYTES.get(int(dtype_bytes) if np.isfinite(dtype_bytes) else 4, "fp32")
        if dtype == "fp32" and self.params.allow_tf32:
            dtype = "tf32"
        return platform.flops_for(dtype)
