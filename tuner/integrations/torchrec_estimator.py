"""TorchRec's planner with tuner's timings, and TorchRec's planner as a candidate of the sharding search.

* :func:`make_shard_estimator` returns a TorchRec ``ShardEstimator`` whose ``estimate(sharding_options,
  sharder_data_map)`` fills every shard's ``Perf(fwd_compute, fwd_comms, bwd_compute, bwd_comms)``
  (seconds) from tuner's kernel models: the embedding-bag forward and backward of the shard's rows,
  columns, pooling and batch, and the collective that carries its output as TorchRec runs it
  (all-to-all for table- and column-wise, reduce-scatter / all-gather for row-wise, an all-reduce of
  the gradient for data-parallel). Pass it with TorchRec's storage estimator:
  ``EmbeddingEnumerator(topology, batch_size, constraints, estimator=[ours, EmbeddingStorageEstimator(...)])``.
* :func:`make_perf_model` returns a TorchRec ``PerfModel`` that rates a whole proposal by tuner's
  simulator: the proposal becomes a placement and :class:`tuner.cost.DLRMShardingJob` predicts its
  iteration time.
* :func:`dense_tensor_estimate` is the dense part's memory per rank (bytes) for TorchRec's storage
  reservation (``HeuristicalStorageReservation(dense_tensor_estimate=...)``).
* :func:`torchrec_placement` runs ``EmbeddingShardingPlanner`` on a task and returns its plan as tuner's
  placement (the ``torchrec`` candidate of ``space: sharding``).

TorchRec's ``batch_size`` is per rank; tuner's specs hold the global batch. Units: seconds, bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from predictor.sources.synth.dlrm import DLRMSpec
from predictor.sources.synth.dlrm_sharding import ShardedPlacement, dense_bytes_per_rank
from predictor.timing.kernels import ModelTiming
from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.embedding import RF_COLUMNS
from predictor.timing.platforms.schema import Platform
from tuner.integrations.torchrec_io import constraints_from_tables, ebc_from_tables, placement_from_plan

__all__ = ["shard_perf_seconds", "make_shard_estimator", "make_perf_model", "dense_tensor_estimate",
           "torchrec_topology", "torchrec_placement", "TORCHREC_SHARDING_TYPES"]

#: the sharding types tuner's DLRM graph runs (TorchRec's table_column_wise is left out)
TORCHREC_SHARDING_TYPES = ["table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel"]


def _predict(timing: ModelTiming, platform: Platform, kind: str, **cols: np.ndarray) -> np.ndarray:
    if not len(next(iter(cols.values()))):
        return np.zeros(0)
    return timing.model_for(kind).predict(TaskView.from_columns(kind, **cols), platform)


def shard_perf_seconds(shards: list[dict], timing: ModelTiming, platform: Platform, world: int,
                       ranks_per_host: int) -> np.ndarray:
    """``(n, 4)`` seconds (fwd_compute, fwd_comms, bwd_compute, bwd_comms) of shards given as dicts with
    ``sharding_type``, ``rows``, ``cols``, ``table_rows``, ``table_dim``, ``pooling`` (the table's),
    ``batch`` (global samples), ``dtype_bytes`` and optionally ``reuse`` (17 bins)."""
    n = len(shards)
    if not n:
        return np.zeros((0, 4))
    st = [s["sharding_type"] for s in shards]
    rows = np.array([s["rows"] for s in shards], dtype=float)
    cols = np.array([s["cols"] for s in shards], dtype=float)
    e = np.array([s["table_rows"] for s in shards], dtype=float)
    d = np.array([s["table_dim"] for s in shards], dtype=float)
    pool = np.array([s["pooling"] for s in shards], dtype=float)
    b = np.array([s["batch"] for s in shards], dtype=float)
    dt = np.array([s["dtype_bytes"] for s in shards], dtype=float)
    rw = np.array([t in ("row_wise", "table_row_wise") for t in st])
    dp = np.array([t == "data_parallel" for t in st])
    # row-wise shards see the pooling in proportion to their rows; data-parallel replicas the local batch
    lookups_pool = np.where(rw, pool * rows / np.maximum(e, 1), pool)
    batch = np.where(dp, b / world, b)
    cols_k = {"batch": batch, "rows": rows, "dim": cols, "pooling": lookups_pool, "dtype_bytes": dt}
    if all("reuse" in s for s in shards):
        reuse = np.array([s["reuse"] for s in shards], dtype=float)
        cols_k.update({c: reuse[:, i] for i, c in enumerate(RF_COLUMNS)})
    out = np.zeros((n, 4))
    out[:, 0] = _predict(timing, platform, "embedding_bag_fwd", **cols_k)
    out[:, 2] = _predict(timing, platform, "embedding_bag_bwd", **cols_k)
    # the collective carrying each shard's output (forward) and gradient (backward)
    host = np.array([min(ranks_per_host, world) if t == "table_row_wise" else world for t in st], dtype=float)
    a2a_msg = np.where(rw | dp, 0.0, b * cols * dt)
    rs_msg = np.where(rw, b * d * dt, 0.0)
    ar_msg = np.where(dp, e * d * dt, 0.0)
    w = np.full(n, float(world))
    a2a = _predict(timing, platform, "all_to_all", msg_bytes=a2a_msg, world=w)
    rs = _predict(timing, platform, "reduce_scatter", msg_bytes=rs_msg, world=host)
    ag = _predict(timing, platform, "all_gather", msg_bytes=rs_msg, world=host)
    ar = _predict(timing, platform, "all_reduce", msg_bytes=ar_msg, world=w)
    out[:, 1] = np.where(rw, rs, np.where(dp, 0.0, a2a))
    out[:, 3] = np.where(rw, ag, np.where(dp, ar, a2a))
    return out


def make_shard_estimator(topology: Any, timing: ModelTiming, platform: Platform, constraints: dict | None = None,
                         reuse: dict[str, np.ndarray] | None = None) -> Any:
    """A TorchRec ``ShardEstimator`` filling ``shard.perf`` from tuner's kernel models (see the module docstring).

    ``reuse`` maps table names to their 17-bin reuse histograms (the platform's mean profile otherwise).
    """
    from torchrec.distributed.planner.types import Perf, ShardEstimator

    world = int(topology.world_size)
    per_host = int(topology.local_world_size)

    class TunerShardEstimator(ShardEstimator):
        """TorchRec shard perf from tuner's kernel models (seconds)."""

        def __init__(self, topology: Any = topology, constraints: dict | None = constraints) -> None:
            self._topology, self._constraints = topology, constraints

        def estimate(self, sharding_options: list[Any], sharder_data_map: Any = None) -> None:
            rows = []
            for so in sharding_options:
                e, d = (int(x) for x in so.tensor.shape)
                dt = int(so.tensor.element_size())
                for sh in so.shards:
                    r = {"sharding_type": so.sharding_type, "rows": sh.size[0], "cols": sh.size[1], "table_rows": e,
                         "table_dim": d, "pooling": float(sum(so.input_lengths)), "batch": so.batch_size * world,
                         "dtype_bytes": dt}
                    if reuse and so.name in reuse:
                        r["reuse"] = reuse[so.name]
                    rows.append(r)
            if reuse and not all("reuse" in r for r in rows):
                for r in rows:
                    r.pop("reuse", None)
            secs = shard_perf_seconds(rows, timing, platform, world, per_host)
            i = 0
            for so in sharding_options:
                for sh in so.shards:
                    fc, fm, bc, bm = (float(x) for x in secs[i])
                    sh.perf = Perf(fwd_compute=fc, fwd_comms=fm, bwd_compute=bc, bwd_comms=bm)
                    i += 1

    return TunerShardEstimator()


def make_perf_model(job: Any, names: list[str]) -> Any:
    """A TorchRec ``PerfModel`` whose ``rate(plan)`` is tuner's simulated iteration time (seconds) of the
    proposal on ``job`` (a :class:`tuner.cost.DLRMShardingJob`); ``names`` are the job's table names."""
    from torchrec.distributed.planner.types import PerfModel

    from predictor.sources.synth.dlrm_sharding import TableShards
    from tuner.sharders.sharding_types import TypedShardingJob

    index = {n: i for i, n in enumerate(names)}
    tables = job.spec.tables
    typed = TypedShardingJob(job)

    class TunerPerfModel(PerfModel):
        """Rates a proposal by tuner's simulator (seconds per iteration)."""

        def rate(self, plan: list[Any]) -> float:
            ts = [TableShards.table_wise(int(e), int(d), 0) for e, d in zip(tables.rows, tables.dim, strict=True)]
            for so in plan:
                ranks = tuple(int(s.rank) for s in so.shards)
                ts[index[so.name]] = TableShards(so.sharding_type, ranks, tuple((int(s.size[0]), int(s.size[1]))
                                                                                for s in so.shards),
                                                 tuple((int(s.offset[0]), int(s.offset[1])) for s in so.shards))
            return float(typed.evaluate(ShardedPlacement(tuple(ts)))[0].predicted_iteration_s)

    return TunerPerfModel()


def dense_tensor_estimate(spec: DLRMSpec, n_ranks: int) -> int:
    """Bytes per rank of everything but the tables (tuner's memory model) for TorchRec's storage reservation."""
    return int(dense_bytes_per_rank(spec, n_ranks))


def torchrec_topology(platform: Platform, n_ranks: int) -> Any:
    """A TorchRec ``Topology`` of ``n_ranks`` devices of ``platform`` (its memory as HBM, or DDR on a CPU)."""
    import logging

    from torchrec.distributed.planner import Topology

    # TorchRec warns that a Topology should come from its factory; the plain constructor takes the same numbers
    logging.getLogger("torchrec.distributed.planner.types").setLevel(logging.ERROR)
    cpu = platform.kind == "cpu"
    mem = int(platform.memory_bytes)
    return Topology(world_size=n_ranks, compute_device="cpu" if cpu else "cuda", hbm_cap=None if cpu else mem,
                    ddr_cap=mem if cpu else None, local_world_size=min(n_ranks, int(platform.devices_per_node or n_ranks)))


def torchrec_placement(spec: DLRMSpec, n_ranks: int, platform: Platform, memory_fraction: float = 0.8, *,
                       timing: ModelTiming | None = None, job: Any = None, topology: Any = None,
                       sharding_types: list[str] | None = None) -> tuple[ShardedPlacement, dict]:
    """TorchRec's ``EmbeddingShardingPlanner`` on ``spec``'s tables: (tuner placement, info).

    Defaults: TorchRec's own estimators and proposers, ``fused`` / ``dense`` kernels (no UVM caching,
    which tuner does not model), the sharding types of :data:`TORCHREC_SHARDING_TYPES`, and
    ``1 - memory_fraction`` of each device reserved besides the dense part. With ``timing`` the
    planner's shard estimator is tuner's (:func:`make_shard_estimator`); with ``job`` its perf model is
    tuner's simulator (:func:`make_perf_model`). info holds the planner's wall seconds.
    """
    import logging
    import time
    import warnings

    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

    tables = spec.tables
    topo = topology or torchrec_topology(platform, n_ranks)
    local_batch = spec.batch_size // n_ranks
    cons = constraints_from_tables(tables, sharding_types or TORCHREC_SHARDING_TYPES, ["fused", "dense"])
    enumerator = None
    if timing is not None:
        reuse = dict(zip(tables.name or [], tables.reuse, strict=False)) if tables.reuse is not None else None
        enumerator = EmbeddingEnumerator(topo, local_batch, cons, estimator=[
            make_shard_estimator(topo, timing, platform, cons, reuse), EmbeddingStorageEstimator(topo, cons)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        reservation = HeuristicalStorageReservation(percentage=max(0.0, 1.0 - memory_fraction),
                                                    dense_tensor_estimate=dense_tensor_estimate(spec, n_ranks))
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=local_batch, constraints=cons, enumerator=enumerator,
                                       storage_reservation=reservation, debug=False, stats=[],
                                       performance_model=make_perf_model(job, list(tables.name or []))
                                       if job is not None else None)
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    plan = planner.plan(ebc_from_tables(tables), [EmbeddingBagCollectionSharder()])
    wall = time.perf_counter() - t0
    placement = placement_from_plan(plan, tables)
    types = placement.types()
    return placement, {"planner_s": wall, "sharding_types": {t: types.count(t) for t in sorted(set(types))},
                       "estimator": "tuner" if timing is not None else "torchrec",
                       "perf_model": "tuner-simulator" if job is not None else "torchrec"}
