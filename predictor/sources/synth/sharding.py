"""Embedding-table sharders (table-wise placement of whole tables on ranks) and a local search.

The six sharders of Lin et al. 2024 Table III, behind one contract (:class:`Sharder`, in the
manner of Optuna's ``BaseSampler``):

=====================  =========================  =============================================
name                   rule                       cost of table ``x`` (greedy sharders)
=====================  =========================  =============================================
``naive``              index                      rank ``x.idx % n_ranks``
``random``             index                      uniform random rank (among those with room)
``size_greedy``        greedy                     ``x.E``
``lookup_greedy``      greedy                     ``x.L * x.D``
``norm_lookup_greedy`` greedy                     ``x.L / x.E`` (as printed in Table III)
``size_lookup_greedy`` greedy                     ``x.L * x.D * log10(x.E)``
=====================  =========================  =============================================

:func:`local_search` improves any assignment under an arbitrary (possibly expensive) cost
function such as a simulator's predicted iteration time; a model-guided sharder builds on it.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar

import numpy as np

from predictor.sources.synth.dlrm_tables import EmbeddingTables

__all__ = [
    "InfeasibleShardingError",
    "Sharder",
    "NaiveSharder",
    "RandomSharder",
    "GreedySharder",
    "SizeGreedySharder",
    "LookupGreedySharder",
    "NormLookupGreedySharder",
    "SizeLookupGreedySharder",
    "SHARDERS",
    "get_sharder",
    "rank_loads",
    "check_assignment",
    "local_search",
]

CapacityLike = float | int | Sequence[float] | np.ndarray
RngLike = np.random.Generator | int | None


class InfeasibleShardingError(ValueError):
    """No placement of the tables on the ranks within the memory capacity was found."""


def _capacity(capacity_bytes: CapacityLike, n_ranks: int) -> np.ndarray:
    """Per-rank capacity, bytes (float64, shape ``(n_ranks,)``) from a scalar or a sequence."""
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    cap = np.broadcast_to(np.asarray(capacity_bytes, dtype=np.float64), (n_ranks,)).copy()
    if np.any(np.isnan(cap)) or np.any(cap < 0):
        raise ValueError("capacity_bytes must be >= 0")
    return cap


def _fmt_bytes(b: float) -> str:
    return f"{b / 2**30:.3f} GiB ({int(b)} B)"


def _free_gib(cap: np.ndarray, mem: np.ndarray) -> list[float]:
    """Free memory per rank, GiB, rounded for messages."""
    return np.round((cap - mem) / 2**30, 3).tolist()


def _check_tables_fit(tables: EmbeddingTables, cap: np.ndarray) -> None:
    """Raise if a single table is larger than every rank's capacity."""
    if len(tables) == 0:
        return
    b = tables.bytes_per_table()
    i = int(np.argmax(b))
    if b[i] > cap.max():
        raise InfeasibleShardingError(
            f"table {tables.name[i]!r} needs {_fmt_bytes(b[i])}, more than the capacity of any rank "
            f"({_fmt_bytes(cap.max())})"
        )


def rank_loads(assignment: np.ndarray, weights: np.ndarray, n_ranks: int) -> np.ndarray:
    """Sum of ``weights`` per rank (float64, shape ``(n_ranks,)``)."""
    return np.bincount(
        np.asarray(assignment), weights=np.asarray(weights, dtype=np.float64), minlength=n_ranks
    )


def check_assignment(
    assignment: np.ndarray, tables: EmbeddingTables, n_ranks: int, capacity_bytes: CapacityLike
) -> None:
    """Raise ``ValueError`` unless ``assignment`` gives every table a rank in ``[0, n_ranks)``,
    and :class:`InfeasibleShardingError` if a rank's tables exceed its capacity (bytes)."""
    a = np.asarray(assignment)
    if a.shape != (len(tables),):
        raise ValueError(f"assignment must have shape ({len(tables)},), got {a.shape}")
    if len(a) and (a.min() < 0 or a.max() >= n_ranks):
        raise ValueError(f"assignment has ranks outside [0, {n_ranks})")
    cap = _capacity(capacity_bytes, n_ranks)
    mem = rank_loads(a, tables.bytes_per_table(), n_ranks)
    over = np.flatnonzero(mem > cap)
    if len(over):
        r = int(over[0])
        raise InfeasibleShardingError(
            f"rank {r} holds {_fmt_bytes(mem[r])} of tables, over its capacity {_fmt_bytes(cap[r])}"
        )


class Sharder(abc.ABC):
    """Places whole embedding tables on ranks (table-wise sharding).

    Contract
    --------
    ``shard(tables, n_ranks, capacity_bytes, rng=None)`` returns an ``int32`` array of length
    ``len(tables)`` whose entry ``i`` is the rank (``0 <= r < n_ranks``) holding table ``i``.

    * ``capacity_bytes`` is the memory per rank available for embedding tables, bytes (a scalar,
      or one value per rank). The returned placement never puts more table bytes
      (:meth:`EmbeddingTables.bytes_per_table`) on a rank than its capacity.
    * If no placement is found, :class:`InfeasibleShardingError` (a ``ValueError``) is raised
      with a message naming the table (or rank) and its size against the capacity. It is always
      raised when one table is larger than every rank's capacity. Sharders follow a fixed rule
      (index or greedy), so on tight instances they may raise although some other placement
      would fit; bin packing is NP-hard and none of them searches.
    * ``rng`` (a ``numpy.random.Generator`` or a seed) is used only by randomised sharders;
      deterministic sharders ignore it. Given the same inputs and seed the result is the same.
    * Sharders hold no state between calls; one instance may be reused for many tasks.

    Subclasses set the class attribute :attr:`name` (the key in :data:`SHARDERS`) and implement
    :meth:`_shard`; the base validates inputs and the result.
    """

    #: Registry key, e.g. ``"size_lookup_greedy"``.
    name: ClassVar[str] = ""

    def shard(
        self,
        tables: EmbeddingTables,
        n_ranks: int,
        capacity_bytes: CapacityLike,
        rng: RngLike = None,
    ) -> np.ndarray:
        """Rank of every table (``int32``, shape ``(len(tables),)``); see the class contract."""
        cap = _capacity(capacity_bytes, n_ranks)
        _check_tables_fit(tables, cap)
        out = np.asarray(self._shard(tables, n_ranks, cap, np.random.default_rng(rng)), dtype=np.int32)
        check_assignment(out, tables, n_ranks, cap)
        return out

    @abc.abstractmethod
    def _shard(
        self, tables: EmbeddingTables, n_ranks: int, cap: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        """Compute the placement; ``cap`` is per-rank capacity (bytes), already validated."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NaiveSharder(Sharder):
    """Table ``i`` on rank ``i % n_ranks``, ignoring costs; raises if a rank overflows."""

    name = "naive"

    def _shard(
        self, tables: EmbeddingTables, n_ranks: int, cap: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        a = np.arange(len(tables)) % n_ranks
        mem = np.zeros(n_ranks)
        for i, b in enumerate(tables.bytes_per_table()):
            r = a[i]
            mem[r] += b
            if mem[r] > cap[r]:
                raise InfeasibleShardingError(
                    f"naive placement puts table {tables.name[i]!r} ({_fmt_bytes(b)}) on rank {r}, "
                    f"whose load {_fmt_bytes(mem[r])} exceeds its capacity {_fmt_bytes(cap[r])}"
                )
        return a


class RandomSharder(Sharder):
    """Each table on a uniformly random rank among those with room left.

    Tables are placed largest first (so the capacity constraint bites as late as possible); the
    rank of each is uniform over the ranks whose free memory still holds it.
    """

    name = "random"

    def _shard(
        self, tables: EmbeddingTables, n_ranks: int, cap: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        b = tables.bytes_per_table()
        a = np.empty(len(tables), dtype=np.int64)
        mem = np.zeros(n_ranks)
        for i in np.argsort(-b, kind="stable"):
            ok = np.flatnonzero(mem + b[i] <= cap)
            if len(ok) == 0:
                raise InfeasibleShardingError(
                    f"random placement found no rank with {_fmt_bytes(b[i])} free for table "
                    f"{tables.name[i]!r} (free per rank: {_free_gib(cap, mem)} GiB)"
                )
            r = int(rng.choice(ok))
            a[i] = r
            mem[r] += b[i]
        return a


class GreedySharder(Sharder):
    """Greedy by a per-table cost: sort tables by :meth:`cost` descending (stable, so ties keep
    table order), put each on the rank with the least accumulated cost among those with enough
    free memory; ties go to the rank with fewer tables, then the lower rank id.
    """

    @abc.abstractmethod
    def cost(self, tables: EmbeddingTables) -> np.ndarray:
        """Cost of every table (float64, shape ``(len(tables),)``, arbitrary units)."""

    def _shard(
        self, tables: EmbeddingTables, n_ranks: int, cap: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        c = np.asarray(self.cost(tables), dtype=np.float64)
        b = tables.bytes_per_table()
        a = np.empty(len(tables), dtype=np.int64)
        load = np.zeros(n_ranks)
        mem = np.zeros(n_ranks)
        count = np.zeros(n_ranks, dtype=np.int64)
        for i in np.argsort(-c, kind="stable"):
            ok = np.flatnonzero(mem + b[i] <= cap)
            if len(ok) == 0:
                raise InfeasibleShardingError(
                    f"{self.name}: table {tables.name[i]!r} ({_fmt_bytes(b[i])}) fits on no rank; "
                    f"free memory per rank: {_free_gib(cap, mem)} GiB"
                )
            r = int(ok[np.lexsort((ok, count[ok], load[ok]))[0]])
            a[i] = r
            load[r] += c[i]
            mem[r] += b[i]
            count[r] += 1
        return a


class SizeGreedySharder(GreedySharder):
    """Greedy with cost ``E`` (rows): balances table memory."""

    name = "size_greedy"

    def cost(self, tables: EmbeddingTables) -> np.ndarray:
        return tables.rows.astype(np.float64)


class LookupGreedySharder(GreedySharder):
    """Greedy with cost ``L * D`` (elements gathered per sample): balances lookup work."""

    name = "lookup_greedy"

    def cost(self, tables: EmbeddingTables) -> np.ndarray:
        return tables.pooling * tables.dim


class NormLookupGreedySharder(GreedySharder):
    """Greedy with cost ``L / E``, as Lin et al. 2024 Table III defines "norm lookup greedy"
    (pooling normalised by table rows: lookups per row, a proxy for access density)."""

    name = "norm_lookup_greedy"

    def cost(self, tables: EmbeddingTables) -> np.ndarray:
        return tables.pooling / tables.rows


class SizeLookupGreedySharder(GreedySharder):
    """Greedy with cost ``L * D * log10(E)``: the paper's default sharder (§IV-B1)."""

    name = "size_lookup_greedy"

    def cost(self, tables: EmbeddingTables) -> np.ndarray:
        return tables.pooling * tables.dim * np.log10(tables.rows.astype(np.float64))


#: Name -> sharder class, in the order of Lin et al. 2024 Table III.
SHARDERS: dict[str, type[Sharder]] = {
    cls.name: cls
    for cls in (
        NaiveSharder,
        RandomSharder,
        SizeGreedySharder,
        LookupGreedySharder,
        NormLookupGreedySharder,
        SizeLookupGreedySharder,
    )
}


def get_sharder(name: str) -> Sharder:
    """A new instance of the sharder registered as ``name`` (see :data:`SHARDERS`)."""
    try:
        return SHARDERS[name]()
    except KeyError:
        raise ValueError(f"unknown sharder {name!r}; valid names: {', '.join(SHARDERS)}") from None


# --------------------------------------------------------------------------------------------
# Local search
# --------------------------------------------------------------------------------------------


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

    Returns
    -------
    (best_assignment, best_cost, evals)
        The best placement found (``int32``; never worse than the start), its cost, and the
        number of ``cost_fn`` calls made.
    """
    if max_evals < 0:
        raise ValueError("max_evals must be >= 0")
    best = np.array(assignment, dtype=np.int32, copy=True)
    cap = _capacity(capacity_bytes, n_ranks)
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
            c = float(cost_fn(cand.copy()))
            evals += 1
            if c < best_cost or (c == best_cost and _spread(cand, w, n_ranks) < spread):
                best, best_cost = cand, c
                spread = _spread(best, w, n_ranks)
                for r, dm in d_mem.items():
                    mem[r] += dm
                improved = True
                break
    return best, best_cost, evals
