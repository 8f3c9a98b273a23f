"""Embedding-bag lookup, forward and backward: DRAM traffic with an L2 hit-rate estimate.

Lin et al. 2022 (§III-B1) time the embedding-bag kernels by their DRAM traffic and improve
the estimate by separating L2 hits from DRAM accesses. We keep that structure and estimate
the hit rate from the batch's *reuse factors* (the 17-bin histogram of Lin et al. 2024
§III-E: the fraction of lookups whose row is accessed 1, 2, 3-4, ... times in the batch):

* a row looked up ``c`` times costs one compulsory miss and ``c - 1`` possible hits, so the
  repeat fraction is ``r = sum_b f_b * (1 - 1 / c_b)``; without a histogram we use the
  uniform-access expectation of distinct rows ``E * (1 - exp(-B*L/E))``;
* repeats hit only while the batch's distinct rows fit in the last-level cache:
  ``hit = r * min(1, LLC / (distinct_rows * row_bytes))``.

Forward traffic: looked-up rows that miss (sector-rounded), indices and offsets, pooled output.
Backward (fused SGD, as FBGEMM's table-batched kernels): pooled gradients, a read and a write
of every distinct row, and the index sort. Time = traffic / (bandwidth * efficiency) + floor.
Calibration replaces this with the reuse-factor MLP of Lin et al. 2024.

On a CPU host the backward also pays for its sparse gradient's memory: a gradient of at least the
platform's ``fresh_mapping_bytes`` (glibc maps such blocks afresh every step) faults in every page
at ``page_fault_s`` each (:func:`~predictor.timing.kernels.host_memory.allocation_fault_seconds`). Both the
analytic model and the calibrated MLP add that term; the MLP is fitted to the measured times less
the faults each sample was counted paying, so a step function at 32 MiB is not left to a smooth
network.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.kernels.host_memory import allocation_fault_seconds
from predictor.timing.platforms.schema import Platform

RF_BINS = 17
#: representative access count of each reuse-factor bin: 1, 2, (2,4] -> 3, (4,8] -> 6, ...
RF_COUNTS = np.array([1.0, 2.0] + [1.5 * 2.0 ** (j - 1) for j in range(2, RF_BINS)])
RF_COLUMNS = tuple(f"rf{i}" for i in range(RF_BINS))


def repeat_fraction_from_rf(rf: np.ndarray) -> np.ndarray:
    """Fraction of lookups that revisit a row already read in the batch, from (n, 17) histograms."""
    rf = np.asarray(rf, dtype=np.float64)
    total = rf.sum(axis=1, keepdims=True)
    f = np.divide(rf, total, out=np.zeros_like(rf), where=total > 0)
    return (f * (1.0 - 1.0 / RF_COUNTS)).sum(axis=1)


@dataclass(frozen=True)
class EmbeddingParams:
    """Analytic embedding-lookup parameters."""

    sector_bytes: float = 32.0  #: DRAM access granularity, bytes
    index_bytes: float = 8.0  #: int64 indices, bytes
    sort_passes: float = 2.0  #: radix-sort passes over (index, position) pairs in backward


class AnalyticEmbedding(KernelModel):
    """Embedding-bag forward/backward from DRAM traffic with an L2 hit-rate estimate."""

    kinds = ("embedding_bag_fwd", "embedding_bag_bwd")
    name = "analytic-embedding"

    def __init__(self, params: EmbeddingParams | None = None) -> None:
        self.params = params or EmbeddingParams()

    def distinct_rows(self, tasks: TaskView) -> np.ndarray:
        """Expected distinct rows touched by the batch."""
        b = tasks.get("batch", 1.0)
        e = tasks.get("rows", 1.0)
        L = tasks.get("pooling", 1.0)
        lookups = b * L
        rf = np.stack([tasks.get(c) for c in RF_COLUMNS], axis=1)
        has_rf = np.isfinite(rf).all(axis=1) & (np.nan_to_num(rf).sum(axis=1) > 0)
        uniform = e * -np.expm1(-lookups / np.maximum(e, 1.0))
        rf_distinct = lookups * (1.0 - repeat_fraction_from_rf(np.nan_to_num(rf)))
        return np.minimum(np.where(has_rf, rf_distinct, uniform), e)

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        p = self.params
        b = tasks.get("batch", 1.0)
        d = tasks.get("dim", 1.0)
        L = tasks.get("pooling", 1.0)
        dt = tasks.get("dtype_bytes", 4.0)
        lookups = b * L
        row_bytes = np.ceil(d * dt / p.sector_bytes) * p.sector_bytes
        distinct = self.distinct_rows(tasks)
        repeat = 1.0 - distinct / np.maximum(lookups, 1.0)
        llc = platform.last_level_cache_bytes
        fits = np.minimum(1.0, llc / np.maximum(distinct * row_bytes, 1.0))
        hit = np.clip(repeat * fits, 0.0, 1.0)
        fwd = lookups * row_bytes * (1.0 - hit) + lookups * p.index_bytes + b * 8.0 + b * d * dt
        bwd = b * d * dt + 2.0 * distinct * row_bytes + p.sort_passes * 2.0 * lookups * (p.index_bytes + 4.0)
        traffic = bwd if tasks.kind.endswith("_bwd") else fwd
        bw = platform.memory_bandwidth * platform.memory_efficiency
        return traffic / bw + platform.kernel_floor_s + allocation_fault_seconds(tasks, platform)


#: dense lookups timed by :class:`DenseEmbeddingModel`
DENSE_EMBEDDING_KINDS = ("embedding", "embedding_bwd", "embedding_bag_bwd_dense")


class DenseEmbeddingModel(KernelModel):
    """``nn.Embedding`` lookups and the dense gradients of ``nn.Embedding`` / ``nn.EmbeddingBag`` on a host:
    their bytes priced with the platform's data-movement model (``model_for("memcpy")``, calibrated where a
    pack has it).

    * ``embedding`` (a row gather): reads ``elements`` looked-up values (``lookups x dim``), writes as
      many, and reads one int64 index per lookup (``lookups = elements / dim``);
    * ``embedding_bwd`` (``embedding_dense_backward``: ``index_add_`` of the output gradient into the
      table's gradient): reads the gradient's ``elements``, reads and writes a table row per lookup
      (3 x ``elements`` x ``dtype_bytes``), plus zeroing the ``rows x dim`` table gradient where ``rows``
      is known;
    * ``embedding_bag_bwd_dense`` (``_embedding_bag_dense_backward``, mode sum): reads the pooled gradient
      (``batch x dim``), adds it into one table row per lookup (``batch x pooling`` lookups, read and
      write) and reads their indices; the table gradient's zeroing is not counted (the traced ``rows`` of
      this op is the gradient's first dimension, not the table's).

    Every term but the table zeroing grows with the lookups, so the time grows linearly with the batch
    above the data-movement model's floor.
    """

    kinds = DENSE_EMBEDDING_KINDS
    name = "dense-embedding-composite"

    def __init__(self, model_for) -> None:
        #: the timing's kind -> model lookup (:meth:`~predictor.timing.kernels.timing.ModelTiming.model_for`)
        self.model_for = model_for

    def traffic_bytes(self, tasks: TaskView) -> np.ndarray:
        """Bytes each task moves (see the class docstring); NaN where a needed parameter is missing."""
        dt = tasks.get("dtype_bytes", 4.0)
        index_bytes = EmbeddingParams().index_bytes
        if tasks.kind == "embedding_bag_bwd_dense":
            b, d, pool = tasks.get("batch"), tasks.get("dim"), tasks.get("pooling", 1.0)
            lookups = b * pool
            return b * d * dt + 2.0 * lookups * d * dt + lookups * index_bytes
        el = tasks.get("elements")
        dim = tasks.get("dim")
        lookups = np.where(np.isfinite(dim) & (dim > 0), el / np.where(dim > 0, dim, 1.0), 0.0)
        if tasks.kind == "embedding":
            return 2.0 * el * dt + lookups * index_bytes
        zero = np.nan_to_num(tasks.get("rows") * dim * dt, nan=0.0)
        return 3.0 * el * dt + lookups * index_bytes + zero

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        n = len(tasks)
        moved = self.traffic_bytes(tasks)
        ok = np.isfinite(moved)
        if not ok.any():
            return np.full(n, platform.kernel_floor_s)
        dt = tasks.get("dtype_bytes", 4.0)
        moved = np.where(ok, moved, 0.0)
        view = TaskView({"bytes": moved, "elements": moved / dt, "dtype_bytes": dt}, n, "memcpy")
        t = np.asarray(self.model_for("memcpy").predict(view, platform), dtype=np.float64)
        return np.where(ok, t, platform.kernel_floor_s)
