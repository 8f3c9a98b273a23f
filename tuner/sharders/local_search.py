"""Local search over table placements under an arbitrary cost, e.g. the simulator's predicted time.

:func:`local_search` improves any assignment by moves and swaps, the most promising first by a
cheap per-rank load proxy; the model-guided sharder (:mod:`tuner.sharders.model_guided`) runs it
with the simulator as the cost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from predictor.sources.synth.dlrm_tables import EmbeddingTables
from tuner.sharders.base import CapacityLike, RngLike, check_assignment, per_rank_capacity, rank_loads

__all__ = ["local_search", "BOUND_MARGIN"]

#: relative slack of a lower bound over the best cost before a neighbour is pruned: the bound sums
#: durations in another order than the simulator, which may differ in the last bits
BOUND_MARGIN = 1e-9


def _proxy(tables: EmbeddingTables) -> np.ndarray:
    """Cheap per-table load proxy ``L * D * log10(max(E, 10))`` (the size-lookup-greedy cost)."""
    return tables.pooling * tables.dim * np.log10(np.maximum(tables.rows, 10).astype(np.float64))


def _spread(a: np.ndarray, w: np.ndarray, n_ranks: int) -> float:
    """Sum of squared proxy loads per rank: the tie-breaker that lets the search cross plateaus."""
    return float(np.square(rank_loads(a, w, n_ranks)).sum())


def _candidates(
    a: np.ndarray, w: np.ndarray, n_ranks: int, jitter: np.ndarray
) -> Iterator[tuple[int, int, int]]:
    """Neighbours of ``a`` most promising first: ``(t, r, -1)`` moves table ``t`` to rank ``r``,
    ``(t, u, 1)`` swaps the ranks of tables ``t`` and ``u``.

    Source ranks are visited from the highest proxy load down; from each, every move to another
    rank and every swap with a table on a less-loaded rank is ranked by the proxy load of the
    heavier of the two ranks afterwards (lower first).
    """
    load = rank_loads(a, w, n_ranks)
    order = np.lexsort((jitter[:n_ranks], -load))
    members = [np.flatnonzero(a == r) for r in range(n_ranks)]
    for pos, s in enumerate(order):
        ts = members[s]
        if len(ts) == 0:
            continue
        keys: list[np.ndarray] = []
        ties: list[np.ndarray] = []
        items: list[np.ndarray] = []
        for d in range(n_ranks):
            if d == s:
                continue
            after = np.maximum(load[s] - w[ts], load[d] + w[ts])
            keys.append(after)
            ties.append(jitter[ts])
            items.append(np.stack([ts, np.full(len(ts), d), np.full(len(ts), -1)], axis=1))
        for d in order[pos + 1 :]:  # swaps only toward less-loaded ranks: each pair once
            td = members[d]
            if len(td) == 0:
                continue
            delta = w[ts][:, None] - w[td][None, :]
            after = np.maximum(load[s] - delta, load[d] + delta).ravel()
            keys.append(after)
            ties.append(np.add.outer(jitter[ts], jitter[td]).ravel())
            tt, uu = np.meshgrid(ts, td, indexing="ij")
            items.append(np.stack([tt.ravel(), uu.ravel(), np.ones(tt.size, dtype=np.int64)], axis=1))
        if not items:
            continue
        all_items = np.concatenate(items)
        for k in np.lexsort((np.concatenate(ties), np.concatenate(keys))):
            t, x, kind = all_items[k]
            yield int(t), int(x), int(kind)


def local_search(
    assignment: np.ndarray,
    n_ranks: int,
    tables: EmbeddingTables,
    capacity_bytes: CapacityLike,
    cost_fn: Callable[[np.ndarray], float],
    max_evals: int = 200,
    rng: RngLike = None,
    start_cost: float | None = None,
    lower_bound: Callable[[np.ndarray], float] | None = None,
) -> tuple[np.ndarray, float, int]:
    """Improve a table placement by first-improvement moves and swaps under ``cost_fn``.

    Starting from ``assignment`` (which must respect capacity), repeatedly try neighbours, the
    most promising first by a cheap proxy (``L * D * log10(E)`` load per rank: tables leave the
    highest-loaded rank first, toward the placement that balances the pair of ranks best):

    * move: one table to another rank;
    * swap: two tables on different ranks exchange ranks.

    Neighbours that overflow a rank's capacity are skipped without evaluation. The first one
    whose cost is strictly lower is accepted and the search restarts from it; it stops at a
    local optimum (no neighbour improves) or when ``max_evals`` evaluations are used. A
    neighbour with exactly the same cost is also accepted when it makes the proxy loads more even
    (lower sum of squares): that crosses the plateaus of max-over-ranks costs and still
    terminates. Move/swap optima are local: a better placement may need a three-way exchange.

    Parameters
    ----------
    assignment:
        Rank per table, shape ``(len(tables),)``. Not modified.
    n_ranks:
        Number of ranks.
    tables:
        The tables (for memory and the proxy).
    capacity_bytes:
        Memory per rank available for tables, bytes (scalar or one per rank).
    cost_fn:
        ``cost_fn(assignment) -> float``, lower is better (e.g. predicted iteration time, s).
        Receives a fresh ``int32`` array it may keep.
    max_evals:
        Budget of ``cost_fn`` calls, including the one for the start unless ``start_cost`` is
        given.
    rng:
        Generator or seed to break ties among equally promising neighbours at random; ``None``
        keeps a deterministic order.
    start_cost:
        Known cost of ``assignment`` (saves one evaluation).
    lower_bound:
        ``lower_bound(assignment) -> float``, never above ``cost_fn``'s value (e.g. the busiest
        processor's summed task time). A neighbour whose bound already exceeds the best cost is
        rejected without calling ``cost_fn``; it still counts as an evaluation, so the search takes
        exactly the steps it takes without the bound, only cheaper.

    Returns
    -------
    (best_assignment, best_cost, evals)
        The best placement found (``int32``; never worse than the start), its cost, and the
        number of ``cost_fn`` calls made.
    """
    if max_evals < 0:
        raise ValueError("max_evals must be >= 0")
    best = np.array(assignment, dtype=np.int32, copy=True)
    cap = per_rank_capacity(capacity_bytes, n_ranks)
    check_assignment(best, tables, n_ranks, cap)
    evals = 0
    if start_cost is None:
        if max_evals == 0:
            raise ValueError("max_evals must be >= 1 when start_cost is not given")
        best_cost = float(cost_fn(best.copy()))
        evals = 1
    else:
        best_cost = float(start_cost)
    n = len(tables)
    if n == 0 or n_ranks < 2:
        return best, best_cost, evals

    gen = None if rng is None else np.random.default_rng(rng)
    w = _proxy(tables)
    b = tables.bytes_per_table().astype(np.float64)
    mem = rank_loads(best, b, n_ranks)
    spread = _spread(best, w, n_ranks)

    improved = True
    while improved and evals < max_evals:
        improved = False
        jitter = gen.random(max(n, n_ranks)) if gen is not None else np.zeros(max(n, n_ranks))
        for t, x, kind in _candidates(best, w, n_ranks, jitter):
            if evals >= max_evals:
                break
            cand = best.copy()
            src = int(best[t])
            if kind < 0:  # move t -> rank x
                dst = x
                if mem[dst] + b[t] > cap[dst]:
                    continue
                cand[t] = dst
                d_mem = {src: -b[t], dst: b[t]}
            else:  # swap t <-> table x
                dst = int(best[x])
                delta = b[x] - b[t]  # change on src
                if mem[src] + delta > cap[src] or mem[dst] - delta > cap[dst]:
                    continue
                cand[t], cand[x] = dst, src
                d_mem = {src: delta, dst: -delta}
            evals += 1
            if lower_bound is not None and lower_bound(cand) > best_cost * (1.0 + BOUND_MARGIN):
                continue  # cannot beat (nor tie) the best: the simulator need not run
            c = float(cost_fn(cand.copy()))
            if c < best_cost or (c == best_cost and _spread(cand, w, n_ranks) < spread):
                best, best_cost = cand, c
                spread = _spread(best, w, n_ranks)
                for r, dm in d_mem.items():
                    mem[r] += dm
                improved = True
                break
    return best, best_cost, evals
