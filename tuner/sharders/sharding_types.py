"""Sharding types per table (row-wise, column-wise, table-row-wise, data-parallel) for the sharders.

:class:`TypedShardingJob` prices a :class:`~predictor.sources.synth.dlrm_sharding.ShardedPlacement`
(any mix of TorchRec's sharding types) with the same cost function as table-wise placements: a
table-wise placement goes to :class:`tuner.cost.DLRMShardingJob` unchanged, any other to
:func:`~predictor.sources.synth.dlrm_sharded_graph.build_sharded_dlrm_graph` and
:func:`~predictor.sources.synth.dlrm_sharding.sharded_memory_per_rank`.

:func:`refine_sharding_types` starts from a table-wise placement and, table by table (the costliest
ranks' heaviest tables first), tries the other types — row-wise over every rank, column-wise over
2 and over every rank, data-parallel — keeping a change when the simulated iteration gets faster
and every rank's tables still fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.simulate import Timeline
from predictor.sources.synth.dlrm_sharded_graph import build_sharded_dlrm_graph
from predictor.sources.synth.dlrm_sharding import (
    ShardedPlacement,
    TableShards,
    as_placement,
    sharded_memory_per_rank,
    table_bytes_per_rank,
)
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.timing.platforms.host import comm_thread_has_core
from tuner.cost import CostResult, DLRMShardingJob, evaluate_graph

__all__ = ["TypedShardingJob", "refine_sharding_types", "type_candidates", "rebalance"]


@dataclass
class TypedShardingJob:
    """A :class:`DLRMShardingJob` that also prices placements with sharding types other than table-wise."""

    job: DLRMShardingJob

    def evaluate(self, placement: np.ndarray | ShardedPlacement) -> tuple[CostResult, Timeline]:
        """Cost of a rank-per-table array or of any :class:`ShardedPlacement` (seconds, bytes)."""
        job = self.job
        p = as_placement(job.spec.tables, placement)
        if p.is_table_wise():
            return job.evaluate(p.assignment())
        host = job.platform.kind == "cpu"
        graph = build_sharded_dlrm_graph(job.spec, p, job.n_ranks, mode="host" if host else "device",
                                         comm_threads=not host or comm_thread_has_core(job.n_ranks, job.threads_per_rank))
        mem = sharded_memory_per_rank(job.spec, p, job.n_ranks)
        return evaluate_graph(graph, job.timing, mem, job.platform)

    def objective(self, placement: np.ndarray | ShardedPlacement) -> float:
        """Predicted iteration time (seconds; +inf when it does not fit)."""
        return self.evaluate(placement)[0].objective


def type_candidates(rows: int, dim: int, rank: int, n_ranks: int) -> list[TableShards]:
    """The other ways to shard one table that sits table-wise on ``rank``: row-wise over every rank,
    column-wise over ``rank`` and the next rank and over every rank (when the columns divide), data-parallel."""
    out = [TableShards.row_wise(rows, dim, range(n_ranks))]
    for k in sorted({2, n_ranks}):
        if 1 < k <= n_ranks and dim % k == 0 and dim // k >= 4:
            out.append(TableShards.column_wise(rows, dim, [(rank + j) % n_ranks for j in range(k)]))
    out.append(TableShards.data_parallel(rows, dim, n_ranks))
    return out


def rebalance(placement: ShardedPlacement, tables_s: np.ndarray, tables: EmbeddingTables, n_ranks: int,
              capacity_bytes: float) -> ShardedPlacement | None:
    """The table-wise tables of ``placement`` placed again greedily (costliest first on the least loaded rank
    with room) around its other shards, whose load is their share of the table's seconds (``tables_s``,
    per table); None when they do not fit."""
    load = np.zeros(n_ranks)
    used = np.zeros(n_ranks)
    tw = []
    for i, ts in enumerate(placement.tables):
        if ts.sharding_type == "table_wise":
            tw.append(i)
            continue
        for r, (rows, cols) in zip(ts.ranks, ts.sizes, strict=True):
            share = (rows * cols) / (tables.rows[i] * tables.dim[i])
            load[r] += tables_s[i] * (1.0 / len(ts.ranks) if ts.sharding_type == "data_parallel" else share)
            used[r] += rows * cols * tables.dtype_bytes
    out = list(placement.tables)
    for i in sorted(tw, key=lambda j: -tables_s[j]):
        b = float(tables.rows[i] * tables.dim[i] * tables.dtype_bytes)
        room = np.flatnonzero(used + b <= capacity_bytes)
        if not room.size:
            return None
        r = int(room[np.argmin(load[room])])
        load[r] += tables_s[i]
        used[r] += b
        out[i] = TableShards.table_wise(int(tables.rows[i]), int(tables.dim[i]), r)
    return ShardedPlacement(tuple(out))


def refine_sharding_types(typed: TypedShardingJob, assignment: np.ndarray, start_s: float, capacity_bytes: float,
                          max_evals: int, max_tables: int = 6,
                          table_seconds: np.ndarray | None = None) -> tuple[ShardedPlacement, float, dict]:
    """Greedy change of sharding types from a table-wise ``assignment`` costing ``start_s`` seconds.

    Candidates: the ``max_tables`` tables with the largest embedding work (pooling x dim) on the slowest
    ranks; each is tried with :func:`type_candidates` and, given ``table_seconds`` (each table's predicted
    lookup seconds), also with the table-wise tables placed again around it (:func:`rebalance`: a table cut
    over every rank frees its rank for others); the best change is kept, up to ``max_evals`` simulations.
    Returns (placement, predicted seconds, info with the simulations spent and the changes made).
    """
    job = typed.job
    t = job.spec.tables
    n = job.n_ranks
    placement = ShardedPlacement.from_assignment(t, assignment)
    best = start_s
    if n < 2 or max_evals <= 0 or not np.isfinite(start_s):
        return placement, best, {"evaluations": 0, "changes": []}
    work = t.pooling * t.dim
    load = np.bincount(assignment, weights=work, minlength=n)
    order = sorted(range(len(t)), key=lambda i: (-load[assignment[i]], -work[i]))[:max_tables]
    evals = 0
    changes = []
    for i in order:
        options = []
        for cand in type_candidates(int(t.rows[i]), int(t.dim[i]), int(assignment[i]), n):
            if evals >= max_evals:
                break
            trials = [placement.with_table(i, cand)]
            if table_seconds is not None:
                moved = rebalance(trials[0], table_seconds, t, n, capacity_bytes)
                if moved is not None and moved != trials[0]:
                    trials.append(moved)
            for trial in trials:
                if evals >= max_evals or np.any(
                        table_bytes_per_rank(t, trial, n, job.spec.optimizer == "adagrad") > capacity_bytes):
                    continue
                evals += 1
                options.append((typed.objective(trial), cand, trial))
        if options:
            cost, cand, trial = min(options, key=lambda x: x[0])
            if cost < best:
                placement, best = trial, cost
                changes.append({"table": i, "sharding_type": cand.sharding_type, "ranks": list(cand.ranks)})
        if evals >= max_evals:
            break
    return placement, best, {"evaluations": evals, "changes": changes}
