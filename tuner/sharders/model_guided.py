"""The model-guided sharder: greedy on *predicted* per-table kernel time, then local search on the simulator.

Lin et al. 2024 pick the best of six heuristic sharders by prediction; this sharder goes further:

1. a greedy placement whose per-table cost is the kernel models' predicted embedding forward +
   backward time for the task's batch (what the table costs on this platform, reuse factors and
   cache effects included), instead of a proxy such as ``L * D * log10(E)``;
2. the best of that placement and the heuristic sharders' placements (all already simulated)
   is the start of :func:`tuner.sharders.local_search.local_search`, whose cost is the full
   simulator (all-to-all sizes, overlap, the slowest rank);

so it never predicts worse than the best heuristic sharder it is given. With ``sharding_types``
3. tables of the slowest ranks are tried row-wise, column-wise and data-parallel
   (:func:`tuner.sharders.sharding_types.refine_sharding_types`), each change kept when the
   simulated step gets faster: the placement is then a
   :class:`~predictor.sources.synth.dlrm_sharding.ShardedPlacement`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from predictor.sources.synth.dlrm_sharding import ShardedPlacement
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.embedding import RF_COLUMNS
from tuner.cost import DLRMShardingJob
from tuner.sharders.base import InfeasibleShardingError, Sharder
from tuner.sharders.heuristics import GreedySharder
from tuner.sharders.local_search import local_search
from tuner.sharders.sharding_types import TypedShardingJob, refine_sharding_types

__all__ = ["predicted_table_seconds", "PredictedGreedySharder", "ModelGuidedSharder", "ModelGuidedPlacement",
           "model_guided_shard"]

#: heuristic sharder name -> (assignment, predicted seconds) already evaluated
Starts = dict[str, tuple[np.ndarray, float]]


def predicted_table_seconds(job: DLRMShardingJob) -> np.ndarray:
    """Predicted forward + backward embedding-bag time of every table at the job's batch (seconds)."""
    t: EmbeddingTables = job.spec.tables
    cols = {
        "batch": np.full(len(t), float(job.spec.batch_size)),
        "rows": t.rows.astype(float),
        "dim": t.dim.astype(float),
        "pooling": t.pooling.astype(float),
        "dtype_bytes": np.full(len(t), float(t.dtype_bytes)),
    }
    if t.reuse is not None:
        cols.update({c: t.reuse[:, i] for i, c in enumerate(RF_COLUMNS)})
    total = np.zeros(len(t))
    for kind in ("embedding_bag_fwd", "embedding_bag_bwd"):
        view = TaskView.from_columns(kind, **cols)
        total += job.timing.model_for(kind).predict(view, job.platform)
    return total


class PredictedGreedySharder(GreedySharder):
    """Greedy placement by predicted kernel time (costliest table on the least-loaded rank)."""

    name = "predicted_greedy"

    def __init__(self, seconds: np.ndarray) -> None:
        self.seconds = np.asarray(seconds, dtype=float)

    def cost(self, tables: EmbeddingTables) -> np.ndarray:
        return self.seconds


@dataclass
class ModelGuidedPlacement:
    """A model-guided placement: the table-wise assignment, its predicted iteration time (s) and how it was
    found; ``sharded`` when sharding types other than table-wise made it faster (``predicted_s`` is then its time)."""

    assignment: np.ndarray
    predicted_s: float
    info: dict = field(default_factory=dict)  # start (sharder name), start_s (seconds), evaluations (simulations)
    sharded: ShardedPlacement | None = None


class ModelGuidedSharder(Sharder):
    """The model-guided sharder behind the :class:`Sharder` contract, bound to one job.

    ``starts`` are placements the heuristic sharders already produced for the job, with their
    predicted seconds; ``max_evals`` bounds the simulations (the predicted-greedy one included);
    ``seed`` breaks ties among equally promising neighbours; ``type_evals`` (> 0) more simulations
    try sharding types other than table-wise on the result.
    """

    name = "model_guided"

    def __init__(self, job: DLRMShardingJob, starts: Starts | None = None, max_evals: int = 60, seed: int = 0,
                 type_evals: int = 0) -> None:
        self.job = job
        self.starts = dict(starts or {})
        self.max_evals = max_evals
        self.seed = seed
        self.type_evals = type_evals

    def place(self, capacity_bytes: float) -> ModelGuidedPlacement:
        """The placement for the job's tables with ``capacity_bytes`` per rank; raises
        :class:`InfeasibleShardingError` when no start fits."""
        job = self.job
        candidates = dict(self.starts)
        try:
            a = PredictedGreedySharder(predicted_table_seconds(job)).shard(job.spec.tables, job.n_ranks, capacity_bytes)
            candidates["predicted_greedy"] = (a, job.objective(a))
            evals = 1
        except InfeasibleShardingError:
            evals = 0
        feasible = {k: v for k, v in candidates.items() if np.isfinite(v[1])}
        if not feasible:
            raise InfeasibleShardingError("no sharder found a placement that fits in device memory")
        start_name = min(feasible, key=lambda k: feasible[k][1])
        start, start_cost = feasible[start_name]
        best, best_cost, used = local_search(
            start,
            job.n_ranks,
            job.spec.tables,
            capacity_bytes,
            job.objective,
            max_evals=max(self.max_evals - evals, 0),
            rng=self.seed,
            start_cost=start_cost,
            lower_bound=job.lower_bound,  # prunes moves the simulator would reject (same steps)
        )
        info = {"start": start_name, "start_s": start_cost, "evaluations": evals + used}
        if self.type_evals > 0:
            sharded, cost, tinfo = refine_sharding_types(TypedShardingJob(job), best, best_cost, capacity_bytes,
                                                         self.type_evals, table_seconds=predicted_table_seconds(job))
            info.update({"table_wise_s": best_cost, "type_evaluations": tinfo["evaluations"],
                         "type_changes": tinfo["changes"]})
            if tinfo["changes"]:
                return ModelGuidedPlacement(best, cost, info, sharded)
        return ModelGuidedPlacement(best, best_cost, info)

    def _shard(
        self, tables: EmbeddingTables, n_ranks: int, cap: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        if tables is not self.job.spec.tables or n_ranks != self.job.n_ranks:
            raise ValueError("a ModelGuidedSharder places the tables of its own job on the job's ranks")
        return self.place(cap).assignment


def model_guided_shard(
    job: DLRMShardingJob,
    capacity_bytes: float,
    starts: Starts,
    max_evals: int = 60,
    seed: int = 0,
) -> tuple[np.ndarray, float, dict]:
    """The model-guided placement of ``job``: (assignment, predicted seconds, info).

    ``starts`` maps heuristic sharder names to (assignment, predicted seconds) already
    evaluated; info names the start used and the simulations spent.
    """
    p = ModelGuidedSharder(job, starts, max_evals=max_evals, seed=seed).place(capacity_bytes)
    return p.assignment, p.predicted_s, p.info
