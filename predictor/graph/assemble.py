"""GraphAssembler: build a large ExecutionGraph by stamping small template graphs (columnar).

A synthesiser that repeats the same work many times (a pipeline stage runs the same chunk of
layers for every micro-batch) builds each distinct piece once as a small
:class:`~predictor.graph.ExecutionGraph` — a *block*, emitted with
:class:`~predictor.sources.synth.emit.OpEmitter` on rank 0 — and stamps copies of it onto ranks:
a stamp is a handful of numpy operations (offset the task and edge indices, map the block's
processors, names and kinds to the big graph's), never a Python loop over tasks.

Stamps and single tasks are appended in call order, and a processor executes its tasks in
array order, so the order of the calls is the program order of every CPU thread and stream.
Blocks carry ``meta["markers"]`` (name -> task index inside the block) so the caller can wire
edges between stamps (:meth:`GraphAssembler.stamp` returns the offset to add).

Parameter columns outside :data:`predictor.graph.PARAM_COLUMNS` (e.g. ``nodes``, read by
:class:`predictor.timing.kernels.collective.PiecewiseCollective`) are carried through.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from predictor.graph import Category, DepKind, ExecutionGraph, GraphVocabulary, Overhead, ProcKind

__all__ = ["GraphAssembler"]

_TASK_COLS = ("rank", "proc", "name", "kind", "category", "overhead", "duration", "flops", "bytes", "group")


class GraphAssembler(GraphVocabulary):
    """Accumulates block stamps, single tasks and edges; :meth:`build` freezes them into one graph.

    Stamping only records ``(block, rank, offset)``; :meth:`build` fills every copy of a block
    with one vectorised assignment per column, so 10^5 stamps cost milliseconds, not seconds.
    """

    def __init__(self) -> None:
        super().__init__()
        self._n = 0
        # block id -> (block, name map, kind map, [offsets], [proc maps]); group maps by offset
        self._stamps: dict[int, tuple[ExecutionGraph, np.ndarray, np.ndarray, list[int], list[np.ndarray]]] = {}
        self._proc_maps: dict[tuple[int, int], np.ndarray] = {}
        self._group_maps: list[tuple[ExecutionGraph, int, Mapping[int, int]]] = []
        self._loose: dict[str, list] = {c: [] for c in ("index", *_TASK_COLS)}
        self._loose_params: dict[str, dict[int, float]] = {}
        self._src: list[int] = []
        self._dst: list[int] = []
        self._ek: list[int] = []

    @property
    def n_tasks(self) -> int:
        return self._n

    # ------------------------------------------------------------------ appending
    def task(
        self,
        proc: int,
        name: str,
        kind: str,
        category: Category,
        *,
        duration: float = float("nan"),
        flops: float = float("nan"),
        bytes: float = float("nan"),  # noqa: A002 - the column's name
        overhead: Overhead = Overhead.NONE,
        group: int = -1,
        params: Mapping[str, float] | None = None,
    ) -> int:
        """Append one task at the end of ``proc``'s order; returns its index in the final graph."""
        idx = self._n
        lo = self._loose
        lo["index"].append(idx)
        lo["rank"].append(self._proc_rank[proc])
        lo["proc"].append(proc)
        lo["name"].append(self._intern(self._names, name))
        lo["kind"].append(self._intern(self._kinds, kind))
        lo["category"].append(int(category))
        lo["overhead"].append(int(overhead))
        lo["duration"].append(duration)
        lo["flops"].append(flops)
        lo["bytes"].append(bytes)
        lo["group"].append(group)
        for key, value in (params or {}).items():
            self._loose_params.setdefault(key, {})[idx] = float(value)
        self._n += 1
        return idx

    def stamp(self, block: ExecutionGraph, rank: int, *, group_map: Mapping[int, int] | None = None) -> int:
        """Append a copy of ``block`` on ``rank``; returns the index its task 0 gets.

        Processors are matched by name on ``rank`` (created on first use). Collective groups of
        the block are dropped (-1) unless ``group_map`` maps them to groups of this graph.
        """
        offset = self._n
        entry = self._stamps.get(id(block))
        if entry is None or entry[0] is not block:
            names = np.asarray([self._intern(self._names, s) for s in block.names] or [0], dtype=np.int32)
            kinds = np.asarray([self._intern(self._kinds, s) for s in block.kinds] or [0], dtype=np.int32)
            entry = (block, names, kinds, [], [])
            self._stamps[id(block)] = entry  # keeps the block alive: ids stay unique
        pkey = (id(block), rank)
        pmap = self._proc_maps.get(pkey)
        if pmap is None:
            pmap = np.asarray(
                [self.processor(rank, ProcKind(int(k)), nm) for k, nm in zip(block.proc_kind, block.proc_names, strict=True)]
                or [0],
                dtype=np.int32,
            )
            self._proc_maps[pkey] = pmap
        entry[3].append(offset)
        entry[4].append(pmap)
        if group_map:
            self._group_maps.append((block, offset, dict(group_map)))
        self._n += block.n_tasks
        return offset

    def edge(self, src: int, dst: int, kind: DepKind) -> None:
        """``dst`` cannot start before ``src`` is done (CPU_GPU: has issued the launch)."""
        self._src.append(src)
        self._dst.append(dst)
        self._ek.append(int(kind))

    # ------------------------------------------------------------------ freezing
    def build(self, validate: bool = True) -> ExecutionGraph:
        n = self._n
        proc_rank = np.asarray(self._proc_rank, dtype=np.int32)
        cols = {
            "proc": np.zeros(n, dtype=np.int32),
            "name": np.zeros(n, dtype=np.int32),
            "kind": np.zeros(n, dtype=np.int32),
            "category": np.zeros(n, dtype=np.int8),
            "overhead": np.zeros(n, dtype=np.int8),
            "duration": np.full(n, np.nan),
            "flops": np.full(n, np.nan),
            "bytes": np.full(n, np.nan),
            "group": np.full(n, -1, dtype=np.int32),
        }
        keys = set(self._loose_params)
        for block, *_ in self._stamps.values():
            keys.update(block.params)
        params = {k: np.full(n, np.nan) for k in sorted(keys)}
        src_parts, dst_parts, ek_parts = [], [], []
        for block, name_map, kind_map, offsets, pmaps in self._stamps.values():
            nb = block.n_tasks
            if not nb or not offsets:
                continue
            off = np.asarray(offsets, dtype=np.int64)
            pos = off[:, None] + np.arange(nb, dtype=np.int64)[None, :]
            cols["proc"][pos] = np.stack(pmaps)[:, block.proc]
            cols["name"][pos] = name_map[block.name][None, :]
            cols["kind"][pos] = kind_map[block.kind][None, :]
            for c in ("category", "overhead", "duration", "flops", "bytes"):
                cols[c][pos] = getattr(block, c)[None, :]
            for key, col in block.params.items():
                params[key][pos] = col[None, :]
            if block.n_edges:
                src_parts.append((off[:, None] + block.edge_src[None, :]).ravel())
                dst_parts.append((off[:, None] + block.edge_dst[None, :]).ravel())
                ek_parts.append(np.tile(block.edge_kind, off.size))
        for block, offset, gmap in self._group_maps:
            for g_local, g_global in gmap.items():
                cols["group"][offset + np.flatnonzero(block.group == g_local)] = g_global
        lo = self._loose
        if lo["index"]:
            idx = np.asarray(lo["index"], dtype=np.int64)
            for c in ("proc", "name", "kind", "category", "overhead", "duration", "flops", "bytes", "group"):
                cols[c][idx] = np.asarray(lo[c])
            for key, values in self._loose_params.items():
                params[key][np.fromiter(values.keys(), dtype=np.int64)] = list(values.values())
        src_parts.append(np.asarray(self._src, dtype=np.int64))
        dst_parts.append(np.asarray(self._dst, dtype=np.int64))
        ek_parts.append(np.asarray(self._ek, dtype=np.int8))
        g = ExecutionGraph(
            rank=proc_rank[cols["proc"]] if n else np.zeros(0, dtype=np.int32),
            proc=cols["proc"],
            name=cols["name"],
            kind=cols["kind"],
            category=cols["category"],
            overhead=cols["overhead"],
            duration=cols["duration"],
            flops=cols["flops"],
            bytes=cols["bytes"],
            group=cols["group"],
            params=params,
            proc_rank=proc_rank,
            proc_kind=np.asarray(self._proc_kind, dtype=np.int8),
            proc_names=list(self._proc_names),
            edge_src=np.concatenate(src_parts).astype(np.int32),
            edge_dst=np.concatenate(dst_parts).astype(np.int32),
            edge_kind=np.concatenate(ek_parts).astype(np.int8),
            names=list(self._names),
            kinds=list(self._kinds),
            meta=dict(self.meta),
        )
        if validate:
            g.validate()
        return g
