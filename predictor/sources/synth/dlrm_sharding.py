"""Embedding-table sharding types beyond table-wise, as TorchRec runs them.

A :class:`TableShards` says how one table is cut and where each piece lives, in TorchRec's
vocabulary (``sharding_type`` and shards of ``(rows, cols)`` at ``(row, col)`` offsets on ranks):

* ``table_wise`` — the whole table on one rank; its pooled vectors for the global batch go
  through the all-to-all;
* ``column_wise`` — the columns cut into pieces, each on a rank and each a table-wise table of
  fewer columns (all-to-all);
* ``row_wise`` — the rows cut over every rank; each rank looks up the global batch's ids that
  fall in its rows (the pooling in proportion to its rows) and yields partial sums ``[B, D]``;
  a reduce-scatter gives each rank its local batch ``[B/N, D]``; backward: an all-gather of the
  gradients;
* ``table_row_wise`` — row-wise within the ranks of one host (reduce-scatter inside the host);
  with more than one host the host's result then joins the all-to-all, each host rank carrying
  ``D / ranks_per_host`` columns' worth of bytes;
* ``data_parallel`` — a replica on every rank, looked up for the local batch; no forward
  communication; backward: an all-reduce of the table's dense gradient (DDP).

:class:`ShardedPlacement` holds one :class:`TableShards` per table; :func:`lookup_shards` expands it
into what each rank looks up and :func:`sharded_comm` into the bytes of each collective.
Units: rows, elements, bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from predictor.sources.synth.dlrm_tables import EmbeddingTables

if TYPE_CHECKING:
    from predictor.sources.synth.dlrm import DLRMSpec

__all__ = ["SHARDING_TYPES", "TableShards", "ShardedPlacement", "LookupShard", "lookup_shards", "sharded_comm",
           "as_placement", "table_bytes_per_rank", "even_cuts", "dense_bytes_per_rank", "sharded_memory_per_rank"]

SHARDING_TYPES = ("table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel")


def even_cuts(total: int, parts: int, align: int = 1) -> list[int]:
    """``total`` cut into ``parts`` sizes as TorchRec cuts rows: ``ceil(total / parts)`` (rounded up
    to ``align``) each, the last taking what is left (a part may be 0 when ``total`` is small)."""
    block = -(-total // parts)
    block = -(-block // align) * align
    out = []
    left = total
    for _ in range(parts):
        out.append(max(min(block, left), 0))
        left -= out[-1]
    return out


@dataclass(frozen=True)
class TableShards:
    """One table's sharding: type, and per shard its rank, ``(rows, cols)`` size and offset."""

    sharding_type: str
    ranks: tuple[int, ...]
    sizes: tuple[tuple[int, int], ...]
    offsets: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if self.sharding_type not in SHARDING_TYPES:
            raise ValueError(f"unknown sharding type {self.sharding_type!r}; one of {', '.join(SHARDING_TYPES)}")
        if not self.ranks or len(self.ranks) != len(self.sizes) or len(self.sizes) != len(self.offsets):
            raise ValueError("a table needs one rank, size and offset per shard")

    @classmethod
    def table_wise(cls, rows: int, dim: int, rank: int) -> TableShards:
        """The whole table on ``rank``."""
        return cls("table_wise", (int(rank),), ((int(rows), int(dim)),), ((0, 0),))

    @classmethod
    def column_wise(cls, rows: int, dim: int, ranks: Sequence[int]) -> TableShards:
        """Columns cut evenly (multiples of 4 where possible) over ``ranks``, one shard each."""
        cols = even_cuts(int(dim), len(ranks), 4 if dim % (4 * len(ranks)) == 0 else 1)
        offs = np.concatenate([[0], np.cumsum(cols)[:-1]]).astype(int)
        return cls("column_wise", tuple(int(r) for r in ranks), tuple((int(rows), c) for c in cols),
                   tuple((0, int(o)) for o in offs))

    @classmethod
    def row_wise(cls, rows: int, dim: int, ranks: Sequence[int], kind: str = "row_wise") -> TableShards:
        """Rows cut as TorchRec does (``ceil(E / n)`` per rank) over ``ranks`` (``kind``: row_wise,
        or table_row_wise for the ranks of one host)."""
        rs = even_cuts(int(rows), len(ranks))
        offs = np.concatenate([[0], np.cumsum(rs)[:-1]]).astype(int)
        return cls(kind, tuple(int(r) for r in ranks), tuple((r, int(dim)) for r in rs),
                   tuple((int(o), 0) for o in offs))

    @classmethod
    def data_parallel(cls, rows: int, dim: int, n_ranks: int) -> TableShards:
        """A replica on each of ``n_ranks`` ranks."""
        return cls("data_parallel", tuple(range(n_ranks)), ((int(rows), int(dim)),) * n_ranks, ((0, 0),) * n_ranks)

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return {"sharding_type": self.sharding_type, "ranks": list(self.ranks),
                "sizes": [list(s) for s in self.sizes], "offsets": [list(o) for o in self.offsets]}

    @classmethod
    def from_dict(cls, d: dict) -> TableShards:
        """Inverse of :meth:`as_dict`."""
        return cls(d["sharding_type"], tuple(int(r) for r in d["ranks"]),
                   tuple((int(a), int(b)) for a, b in d["sizes"]), tuple((int(a), int(b)) for a, b in d["offsets"]))


@dataclass(frozen=True)
class ShardedPlacement:
    """Every table's :class:`TableShards` (one entry per table, in table order)."""

    tables: tuple[TableShards, ...]

    def __len__(self) -> int:
        return len(self.tables)

    @classmethod
    def from_assignment(cls, tables: EmbeddingTables, assignment: np.ndarray) -> ShardedPlacement:
        """The table-wise placement of a rank-per-table array."""
        return cls(tuple(TableShards.table_wise(int(e), int(d), int(r))
                         for e, d, r in zip(tables.rows, tables.dim, np.asarray(assignment), strict=True)))

    def is_table_wise(self) -> bool:
        return all(t.sharding_type == "table_wise" for t in self.tables)

    def assignment(self) -> np.ndarray:
        """Rank per table (int32) of a table-wise placement; ``ValueError`` otherwise."""
        if not self.is_table_wise():
            raise ValueError("the placement is not table-wise")
        return np.asarray([t.ranks[0] for t in self.tables], dtype=np.int32)

    def types(self) -> list[str]:
        return [t.sharding_type for t in self.tables]

    def with_table(self, i: int, shards: TableShards) -> ShardedPlacement:
        """A copy with table ``i`` sharded as ``shards``."""
        ts = list(self.tables)
        ts[i] = shards
        return ShardedPlacement(tuple(ts))

    def as_records(self) -> list[dict]:
        return [t.as_dict() for t in self.tables]

    @classmethod
    def from_records(cls, records: Sequence[dict]) -> ShardedPlacement:
        return cls(tuple(TableShards.from_dict(r) for r in records))


def as_placement(tables: EmbeddingTables, placement: np.ndarray | ShardedPlacement | Sequence[int]) -> ShardedPlacement:
    """A :class:`ShardedPlacement` from either form (a rank-per-table array is table-wise)."""
    if isinstance(placement, ShardedPlacement):
        if len(placement) != len(tables):
            raise ValueError(f"sharding places {len(placement)} tables, the task has {len(tables)}")
        return placement
    return ShardedPlacement.from_assignment(tables, np.asarray(placement))


@dataclass(frozen=True)
class LookupShard:
    """One embedding-bag lookup a rank runs: table index, rank, shard rows and columns, mean lookups per
    sample, samples looked up, and where its pooled output goes (``a2a``, ``reduce_scatter``, ``local``)."""

    table: int
    rank: int
    rows: int
    cols: int
    pooling: float
    batch: float
    output: str


def lookup_shards(tables: EmbeddingTables, placement: ShardedPlacement, n_ranks: int,
                  batch_size: int) -> list[LookupShard]:
    """Every shard's lookup, in table order (empty row shards are skipped)."""
    out = []
    for ti, ts in enumerate(placement.tables):
        e, pool = int(tables.rows[ti]), float(tables.pooling[ti])
        for r, (rows, cols) in zip(ts.ranks, ts.sizes, strict=True):
            if not 0 <= r < n_ranks:
                raise ValueError(f"table {ti} has a shard on rank {r}, outside 0..{n_ranks - 1}")
            if rows <= 0 or cols <= 0:
                continue
            if ts.sharding_type in ("row_wise", "table_row_wise"):
                # ids spread over the rows: each shard sees the pooling in proportion to its rows
                out.append(LookupShard(ti, r, rows, cols, pool * rows / e, float(batch_size), "reduce_scatter"))
            elif ts.sharding_type == "data_parallel":
                out.append(LookupShard(ti, r, rows, cols, pool, batch_size / n_ranks, "local"))
            else:
                out.append(LookupShard(ti, r, rows, cols, pool, float(batch_size), "a2a"))
    return out


def sharded_comm(tables: EmbeddingTables, placement: ShardedPlacement, n_ranks: int, batch_size: int,
                 dtype_bytes: int) -> dict:
    """Bytes of each collective of the embedding exchange.

    Returns ``a2a_cols`` (columns each rank sends through the all-to-all, per rank), ``reduce_scatter``
    (a list of ``(ranks, msg_bytes)``: one fused reduce-scatter of the row-wise tables over all ranks,
    one per host for table-row-wise tables; the backward all-gathers have the same groups and sizes)
    and ``dp_all_reduce_bytes`` (the data-parallel tables' gradients).
    """
    a2a_cols = np.zeros(n_ranks)
    rs: dict[tuple[int, ...], float] = {}
    dp = 0.0
    for ti, ts in enumerate(placement.tables):
        d = float(tables.dim[ti])
        if ts.sharding_type in ("table_wise", "column_wise"):
            for r, (_, cols) in zip(ts.ranks, ts.sizes, strict=True):
                a2a_cols[r] += cols
        elif ts.sharding_type in ("row_wise", "table_row_wise"):
            group = tuple(sorted(set(ts.ranks)))
            rs[group] = rs.get(group, 0.0) + batch_size * d * dtype_bytes
            if ts.sharding_type == "table_row_wise" and len(group) < n_ranks:
                # the host's reduced slices go on through the all-to-all across hosts
                for r in group:
                    a2a_cols[r] += d / len(group)
        else:
            dp += float(tables.rows[ti]) * d * dtype_bytes
    return {"a2a_cols": a2a_cols, "reduce_scatter": sorted(rs.items()), "dp_all_reduce_bytes": dp}


def table_bytes_per_rank(tables: EmbeddingTables, placement: ShardedPlacement, n_ranks: int,
                         adagrad: bool = False) -> np.ndarray:
    """Bytes of table shards (and row-wise adagrad state) each rank holds."""
    out = np.zeros(n_ranks)
    for ts in placement.tables:
        for r, (rows, cols) in zip(ts.ranks, ts.sizes, strict=True):
            out[r] += rows * cols * tables.dtype_bytes + (rows * 4 if adagrad else 0)
    return out


def dense_bytes_per_rank(spec: DLRMSpec, n_ranks: int) -> float:
    """Bytes each rank needs besides its tables and embedding buffers: MLP weights, gradients, DDP
    bucket copies (and adagrad state), and the MLPs' activations for the local batch."""
    dt = spec.dtype_bytes
    params = spec.mlp_param_count() * dt
    opt_state = params if spec.optimizer == "adagrad" else 0
    b = spec.batch_size / n_ranks
    acts = sum(b * (i + 2 * o) * dt for _, i, o in spec.mlp_layers())
    return float(params * 3 + opt_state + acts)


def sharded_memory_per_rank(spec: DLRMSpec, placement: ShardedPlacement, n_ranks: int) -> np.ndarray:
    """Device memory each rank needs (bytes) under a placement of any sharding types: its table shards
    (+ row-wise adagrad state; data-parallel replicas also keep a dense gradient), the dense part, the
    lookups' pooled outputs (twice: output and its gradient) and the collectives' send + receive buffers."""
    t, dt = spec.tables, spec.dtype_bytes
    mem = table_bytes_per_rank(t, placement, n_ranks, spec.optimizer == "adagrad")
    pooled = np.zeros(n_ranks)
    for s in lookup_shards(t, placement, n_ranks, spec.batch_size):
        pooled[s.rank] += s.batch * s.cols * dt
        if s.output == "local":
            mem[s.rank] += s.rows * s.cols * t.dtype_bytes  # the replica's dense gradient
    comm = sharded_comm(t, placement, n_ranks, spec.batch_size, dt)
    sent = spec.batch_size * comm["a2a_cols"] * dt
    recv = spec.batch_size / n_ranks * float(comm["a2a_cols"].sum()) * dt
    a2a = 2 * float(max(sent.max(), recv)) if n_ranks > 1 else 0.0
    rs = np.zeros(n_ranks)
    for group, msg in comm["reduce_scatter"]:
        rs[list(group)] += msg * (1 + 1 / len(group))  # input [B, D] and output [B / n, D]
    return mem + dense_bytes_per_rank(spec, n_ranks) + 2 * pooled + a2a + rs
