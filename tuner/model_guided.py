"""The model-guided sharder: greedy on *predicted* per-table kernel time, then local search on the simulator.

None of the papers has it. Lin et al. 2024 pick the best of six heuristic sharders by
prediction; we go further:

1. a greedy placement whose per-table cost is the kernel models' predicted embedding forward +
   backward time for the task's batch (what the table really costs on this platform, reuse
   factors and cache effects included), instead of a proxy such as ``L * D * log10(E)``;
2. the best of that placement and the heuristic sharders' placements (all already simulated)
   is the start of :func:`predictor.sources.synth.sharding.local_search`, whose cost is the full
   simulator (all-to-all sizes, overlap, the slowest rank);

so it never predicts worse than the best heuristic sharder.
"""

from __future__ import annotations

import numpy as np

from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.sources.synth.sharding import GreedySharder, InfeasibleShardingError, local_search
from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.embedding import RF_COLUMNS
from tuner.cost import DLRMShardingJob

__all__ = ["predicted_table_seconds", "PredictedGreedySharder", "model_guided_shard"]


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


def model_guided_shard(
    job: DLRMShardingJob,
    capacity_bytes: float,
    starts: dict[str, tuple[np.ndarray, float]],
    max_evals: int = 60,
    seed: int = 0,
) -> tuple[np.ndarray, float, dict]:
    """The model-guided placement and its predicted objective (seconds).

    ``starts`` maps heuristic sharder names to (assignment, objective) already evaluated.
    Returns (assignment, objective, info) with info on the start used and evaluations spent.
    """
    candidates = dict(starts)
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
        max_evals=max(max_evals - evals, 0),
        rng=seed,
        start_cost=start_cost,
    )
    info = {"start": start_name, "start_s": start_cost, "evaluations": evals + used}
    return best, best_cost, info
