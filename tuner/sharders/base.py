"""The sharder contract (:class:`Sharder`) and the memory checks every placement passes.

A sharder places whole embedding tables on ranks (table-wise sharding). Capacities are bytes
per rank available for tables; a placement is an ``int32`` array with the rank of every table.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from predictor.sources.synth.dlrm_tables import EmbeddingTables

__all__ = [
    "CapacityLike",
    "RngLike",
    "InfeasibleShardingError",
    "Sharder",
    "per_rank_capacity",
    "format_bytes",
    "free_gib",
    "check_tables_fit",
    "rank_loads",
    "check_assignment",
]

CapacityLike = float | int | Sequence[float] | np.ndarray
RngLike = np.random.Generator | int | None


class InfeasibleShardingError(ValueError):
    """No placement of the tables on the ranks within the memory capacity was found."""


def per_rank_capacity(capacity_bytes: CapacityLike, n_ranks: int) -> np.ndarray:
    """Per-rank capacity, bytes (float64, shape ``(n_ranks,)``) from a scalar or a sequence."""
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    cap = np.broadcast_to(np.asarray(capacity_bytes, dtype=np.float64), (n_ranks,)).copy()
    if np.any(np.isnan(cap)) or np.any(cap < 0):
        raise ValueError("capacity_bytes must be >= 0")
    return cap


def format_bytes(b: float) -> str:
    """``b`` bytes as GiB with the exact byte count, for messages."""
    return f"{b / 2**30:.3f} GiB ({int(b)} B)"


def free_gib(cap: np.ndarray, mem: np.ndarray) -> list[float]:
    """Free memory per rank, GiB, rounded for messages (``cap`` and ``mem`` in bytes)."""
    return np.round((cap - mem) / 2**30, 3).tolist()


def check_tables_fit(tables: EmbeddingTables, cap: np.ndarray) -> None:
    """Raise :class:`InfeasibleShardingError` if one table is larger than every rank's capacity (bytes)."""
    if len(tables) == 0:
        return
    b = tables.bytes_per_table()
    i = int(np.argmax(b))
    if b[i] > cap.max():
        raise InfeasibleShardingError(
            f"table {tables.name[i]!r} needs {format_bytes(b[i])}, more than the capacity of any rank "
            f"({format_bytes(cap.max())})"
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
    cap = per_rank_capacity(capacity_bytes, n_ranks)
    mem = rank_loads(a, tables.bytes_per_table(), n_ranks)
    over = np.flatnonzero(mem > cap)
    if len(over):
        r = int(over[0])
        raise InfeasibleShardingError(
            f"rank {r} holds {format_bytes(mem[r])} of tables, over its capacity {format_bytes(cap[r])}"
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
      raised when one table is larger than every rank's capacity. The heuristic sharders follow
      a fixed index or greedy order, so on tight instances they may raise although some other
      placement would fit; bin packing is NP-hard and none of them searches.
    * ``rng`` (a ``numpy.random.Generator`` or a seed) is used only by randomised sharders;
      deterministic sharders ignore it. Given the same inputs and seed the result is the same.
    * Sharders hold no state between calls; one instance may be reused for many tasks.

    Subclasses set the class attribute :attr:`name` (the key in the registry) and implement
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
        cap = per_rank_capacity(capacity_bytes, n_ranks)
        check_tables_fit(tables, cap)
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
