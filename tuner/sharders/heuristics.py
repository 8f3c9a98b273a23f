"""The six heuristic sharders of Lin et al. 2024 Table III and their registry.

=====================  =========  =============================================
name                   placement  cost of table ``x`` (greedy sharders)
=====================  =========  =============================================
``naive``              index      rank ``x.idx % n_ranks``
``random``             index      uniform random rank (among those with room)
``size_greedy``        greedy     ``x.E``
``lookup_greedy``      greedy     ``x.L * x.D``
``norm_lookup_greedy`` greedy     ``x.L / x.E`` (as printed in Table III)
``size_lookup_greedy`` greedy     ``x.L * x.D * log10(x.E)``
=====================  =========  =============================================
"""

from __future__ import annotations

import abc

import numpy as np

from predictor.sources.synth.dlrm_tables import EmbeddingTables
from tuner.sharders.base import InfeasibleShardingError, Sharder, format_bytes, free_gib

__all__ = [
    "NaiveSharder",
    "RandomSharder",
    "GreedySharder",
    "SizeGreedySharder",
    "LookupGreedySharder",
    "NormLookupGreedySharder",
    "SizeLookupGreedySharder",
    "SHARDERS",
    "get_sharder",
]


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
                    f"naive placement puts table {tables.name[i]!r} ({format_bytes(b)}) on rank {r}, "
                    f"whose load {format_bytes(mem[r])} exceeds its capacity {format_bytes(cap[r])}"
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
                    f"random placement found no rank with {format_bytes(b[i])} free for table "
                    f"{tables.name[i]!r} (free per rank: {free_gib(cap, mem)} GiB)"
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
                    f"{self.name}: table {tables.name[i]!r} ({format_bytes(b[i])}) fits on no rank; "
                    f"free memory per rank: {free_gib(cap, mem)} GiB"
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
    """A new instance of the heuristic sharder registered as ``name`` (see :data:`SHARDERS`)."""
    try:
        return SHARDERS[name]()
    except KeyError:
        raise ValueError(f"unknown sharder {name!r}; valid names: {', '.join(SHARDERS)}") from None
