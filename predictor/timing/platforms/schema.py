"""Pydantic schema of one accelerator entry in the catalog (``catalog.yaml``).

Every number carries its unit in its field name (``_bytes``, ``_bytes_per_s``, ``_s``,
``_flops``) and its provenance in ``sources`` (field path -> citation). Prices are dated and
can be overridden by the user's own YAML (:func:`predictor.timing.platforms.load_catalog`).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, field_validator

Dtype = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8"]

#: Where each tensor category of the Centimani memory model lives (§4.2 of the paper).
#: ``offchip_all``: everything in device DRAM/HBM (GPUs, TPUs, Gaudi);
#: ``weights_on_chip``: weights and optimizer state on-chip, activations streamed (Cerebras weight streaming
#: inverts this: see the entry's notes);
#: ``onchip_first``: fill on-chip SRAM first, spill the rest off-chip (SambaNova, Graphcore).
MemoryPolicy = Literal["offchip_all", "weights_on_chip", "onchip_first"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MemoryLevel(_Strict):
    """One level of the memory hierarchy, innermost (fastest) first in :attr:`Platform.memory`."""

    name: str = Field(description="e.g. 'l2', 'sram', 'hbm', 'ddr'")
    capacity_bytes: float = Field(gt=0, description="capacity per device, bytes")
    bandwidth_bytes_per_s: float = Field(gt=0, description="sustainable peak bandwidth per device, bytes/s")
    on_chip: bool = Field(description="True for on-die SRAM/cache levels")


class Interconnect(_Strict):
    """Links between devices. Bandwidths are per device, one direction, bytes/s."""

    intra_node_bandwidth_bytes_per_s: float = Field(gt=0)
    intra_node_latency_s: float = Field(ge=0)
    inter_node_bandwidth_bytes_per_s: float = Field(gt=0)
    inter_node_latency_s: float = Field(ge=0)
    name: str = Field(default="", description="e.g. 'NVLink 4 + 400G InfiniBand'")
    #: how uncalibrated collectives are timed: ``"line"``, the latency-bandwidth line of the raw link
    #: rates above; ``"nccl"``, NCCL's ring and tree algorithms with its LL / LL128 / Simple protocols
    #: on the network fields below (:mod:`predictor.timing.kernels.collective`)
    collective_model: Literal["line", "nccl"] = "line"
    #: network adapters per node (None: one per device); devices share them evenly
    nics_per_node: int | None = Field(default=None, ge=1)
    #: line rate of one network adapter, one direction, bytes/s (None: ``inter_node_bandwidth_bytes_per_s``)
    nic_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0)
    #: share of a NIC's line rate a collective's transfers reach (protocol headers, flow control), 0..1
    network_efficiency: float = Field(default=1.0, gt=0, le=1)
    #: bus bandwidth NCCL's ring all-reduce reaches inside one node, bytes/s (None: the NVLink rate above)
    intra_node_bus_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0)
    #: largest bus bandwidth of NCCL's tree algorithm across nodes, bytes/s (None: no tree algorithm)
    tree_bus_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0)
    #: NCCL's LL128 protocol enabled (NVLink-connected Volta, Ampere, Hopper GPUs)
    ll128: bool = False


class CpuOverheads(_Strict):
    """Host-side overheads of Lin et al. 2022 §III-C, seconds (means over ops)."""

    t1_s: float = Field(ge=0, description="between two top-level ops")
    t2_s: float = Field(ge=0, description="op start to first kernel launch")
    t3_s: float = Field(ge=0, description="last kernel launch to op end")
    t4_s: float = Field(ge=0, description="one CUDA runtime call (cudaLaunchKernel ...)")
    t5_s: float = Field(ge=0, description="between two kernel launches of one op")
    step_s: float = Field(default=0.0, ge=0, description="once per training step on a device: framework work "
                          "outside every op (backward() entry, optimizer.step()'s Python); 0 unless calibrated")
    sparse_table_s: float = Field(default=0.0, ge=0, description="once per embedding table with a sparse gradient "
                                  "on a device: host cost beyond its ops' T's; 0 unless calibrated")


#: the kernel classes a CPU host's contention and pace factors are given for (embedding-bag kinds, other
#: memory-bound kernels, compute kernels)
KERNEL_CLASSES: tuple[str, ...] = ("embedding", "memory", "compute")


class Platform(_Strict):
    """One accelerator: compute peaks, memory hierarchy, interconnect, price, overheads."""

    key: str = Field(description="catalog key, lower-case, e.g. 'a100-80gb'")
    name: str
    vendor: str
    kind: Literal["gpu", "tpu", "hpu", "rdu", "ipu", "wse", "cpu"]
    peak_flops: dict[Dtype, float] = Field(description="dense peak FLOP/s per dtype (no sparsity)")
    memory: list[MemoryLevel] = Field(min_length=1, description="innermost first; last = main device memory")
    interconnect: Interconnect
    devices_per_node: int = Field(ge=1)
    memory_policy: MemoryPolicy = "offchip_all"
    overheads: CpuOverheads
    price_per_device_hour_usd: float | None = Field(default=None, ge=0)
    price_date: str | None = Field(default=None, description="when the price was published, YYYY-MM")
    price_note: str = ""
    #: fraction of peak FLOP/s a large GEMM reaches (analytic model's ceiling), 0..1
    gemm_efficiency_max: float = Field(default=0.8, gt=0, le=1)
    #: fraction of peak memory bandwidth a streaming kernel reaches, 0..1
    memory_efficiency: float = Field(default=0.85, gt=0, le=1)
    #: smallest time any kernel takes (launch/tail latency on the device), seconds
    kernel_floor_s: float = Field(default=3e-6, ge=0)
    #: CPU hosts: ranks sharing the host -> slow-down of each kernel class ("embedding", "memory",
    #: "compute") when they all run at once, and ("sync") of every class when they also wait for each other
    #: at every collective, measured by ``tuner calibrate --world-size K``
    host_contention: dict[int, dict[str, float]] = Field(default_factory=dict)
    #: CPU hosts: kernel class ("compute", "memory", "embedding") -> how much slower the machine typically runs
    #: that class's kernels than during the calibration that timed them (1.0: as calibrated). A shared VM's
    #: pace drifts by tens of percent over hours; a pack whose models are right at its calibration's pace
    #: under-predicts a typical step by that drift. Measured, not assumed: the median over many later
    #: windows of the pack's own microbenchmarks re-timed (``tuner calibrate --refit --pace-from``); empty: none
    kernel_pace: dict[str, PositiveFloat] = Field(default_factory=dict)
    #: CPU hosts: ranks sharing the host -> collective kind -> seconds a call waits, on average, beyond its
    #: typical (median) time: on a 2-vCPU VM about one small all-reduce in five waits for the next scheduler
    #: tick (4 ms). The fitted collective curves time the typical call; a step pays the mean. Measured by
    #: ``tuner calibrate --world-size K`` (per kind, the median over the benchmarked sizes of mean call -
    #: median call); empty: no such term
    collective_wait_s: dict[int, dict[str, NonNegativeFloat]] = Field(default_factory=dict)
    #: CPU hosts: wall seconds of one minor page fault (a freshly mapped 4 KiB page) in a training
    #: process, measured by ``tuner calibrate`` (:mod:`predictor.timing.calibration.page_faults`); 0: not
    #: measured, or a device whose allocator keeps its blocks (GPUs' caching allocators): no fault term
    page_fault_s: float = Field(default=0.0, ge=0)
    #: CPU hosts: allocations of at least this many bytes are mapped afresh on every step (glibc's
    #: largest mmap threshold, 32 MiB), so each of their pages faults; 0: none do
    fresh_mapping_bytes: float = Field(default=0.0, ge=0)
    #: CPU hosts: how a training step's embedding-bag kernels run against their cold calibrated timing, by
    #: the step's embedding working set (distinct rows x row bytes over every table of the ranks sharing the
    #: cache) over the last-level cache: ``[[working set / LLC, forward factor, backward factor], ...]``,
    #: measured by ``tuner calibrate`` (:mod:`predictor.timing.calibration.step_reuse`); empty: no such term
    embedding_step_reuse: list[list[float]] = Field(default_factory=list)
    #: the same measured per pooling of the probe's tables (lookups per sample):
    #: ``[[working set / LLC, pooling, forward factor, backward factor], ...]``; where present the
    #: embedding kernels take it per table instead of :attr:`embedding_step_reuse`; empty: not measured
    embedding_step_reuse_pooling: list[list[float]] = Field(default_factory=list)
    sources: dict[str, str] = Field(default_factory=dict, description="field path -> citation")
    notes: str = ""

    @field_validator("peak_flops")
    @classmethod
    def _positive_peaks(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("needs at least one dtype")
        for dt, x in v.items():
            if x <= 0:
                raise ValueError(f"peak for {dt} must be > 0")
        return v

    @field_validator("kernel_pace")
    @classmethod
    def _pace_classes(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(KERNEL_CLASSES))
        if unknown:
            raise ValueError(f"unknown kernel class(es) {', '.join(unknown)}; expected {', '.join(KERNEL_CLASSES)}")
        return v

    @field_validator("embedding_step_reuse")
    @classmethod
    def _reuse_points(cls, v: list[list[float]]) -> list[list[float]]:
        for point in v:
            if len(point) != 3 or not all(math.isfinite(x) and x > 0 for x in point):
                raise ValueError(f"each point is [working set / LLC, forward factor, backward factor], all > 0; "
                                 f"got {point}")
        return sorted(v)

    @field_validator("embedding_step_reuse_pooling")
    @classmethod
    def _reuse_pooling_points(cls, v: list[list[float]]) -> list[list[float]]:
        for point in v:
            if len(point) != 4 or not all(math.isfinite(x) and x > 0 for x in point):
                raise ValueError(f"each point is [working set / LLC, pooling, forward factor, backward factor], "
                                 f"all > 0; got {point}")
        return sorted(v)

    # ---------------------------------------------------------------- helpers
    @property
    def main_memory(self) -> MemoryLevel:
        """The outermost (device DRAM/HBM) level."""
        return self.memory[-1]

    @property
    def memory_bytes(self) -> float:
        """Capacity of device main memory, bytes."""
        return self.main_memory.capacity_bytes

    @property
    def memory_bandwidth(self) -> float:
        """Bandwidth of device main memory, bytes/s."""
        return self.main_memory.bandwidth_bytes_per_s

    @property
    def last_level_cache_bytes(self) -> float:
        """Largest on-chip level (L2 on GPUs), bytes; 0 if none is listed."""
        on = [m.capacity_bytes for m in self.memory if m.on_chip]
        return max(on) if on else 0.0

    @property
    def on_chip_bytes(self) -> float:
        """Total on-chip capacity, bytes."""
        return float(sum(m.capacity_bytes for m in self.memory if m.on_chip))

    def lists_peak(self, dtype: str) -> bool:
        """Whether the catalog gives a peak for ``dtype`` itself (fp16 and bf16 standing for each other): for
        any other, :meth:`flops_for` falls back to another format's peak (a chip listing only bf16 would run
        fp32 GEMMs at its bf16 rate)."""
        return dtype in self.peak_flops or (dtype in ("bf16", "fp16") and bool({"bf16", "fp16"} & set(self.peak_flops)))

    def flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; falls back to fp32, then the smallest listed peak."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]  # type: ignore[index]
        if dtype in ("tf32",) and "fp32" in self.peak_flops:
            return self.peak_flops["fp32"]
        if dtype in ("bf16", "fp16"):
            for alt in ("bf16", "fp16"):
                if alt in self.peak_flops:
                    return self.peak_flops[alt]  # type: ignore[index]
        if "fp32" in self.peak_flops:
            return self.peak_flops["fp32"]
        return min(self.peak_flops.values())
