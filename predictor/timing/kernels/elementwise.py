"""Element-wise and data-movement kernels (relu, add, dropout, layer-norm, concat, memcpy, optimizer
updates): roofline on bytes moved and FLOPs.

``time = max(bytes / (bandwidth * efficiency), flops / peak_fp32) + floor`` — the model Lin et
al. 2022 use for element-wise and memory kernels, with the bandwidth the platform lists (the
calibration step measures it instead of assuming it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.platforms.schema import Platform


@dataclass(frozen=True)
class RooflineParams:
    """Override the platform's bandwidth (bytes/s) once it has been measured."""

    bandwidth_bytes_per_s: float | None = None


class Roofline(KernelModel):
    """Bandwidth/FLOP roofline: the fallback for every kind without a dedicated model."""

    kinds = (
        "elementwise",
        "relu",
        "gelu",
        "tanh",
        "sigmoid",
        "dropout",
        "add",
        "mul",
        "layer_norm",
        "softmax",
        "concat",
        "memcpy",
        "transpose",
        "optimizer",
        "loss",
        "interaction",
    )
    name = "roofline"

    def __init__(self, params: RooflineParams | None = None) -> None:
        self.params = params or RooflineParams()

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        moved = tasks.get("bytes")
        elems = tasks.get("elements")
        dt = tasks.get("dtype_bytes", 4.0)
        # without an explicit byte count: read + write every element once
        moved = np.where(np.isnan(moved), 2.0 * elems * dt, moved)
        moved = np.nan_to_num(moved, nan=0.0)
        flops = np.nan_to_num(tasks.get("flops"), nan=0.0)
        bw = self.params.bandwidth_bytes_per_s or platform.memory_bandwidth * platform.memory_efficiency
        t = np.maximum(moved / bw, flops / platform.flops_for("fp32"))
        return t + platform.kernel_floor_s
