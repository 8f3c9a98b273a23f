"""Columnar editing of an :class:`~predictor.graph.ExecutionGraph`: copy, insert, move, rewire.

What-if transforms (:mod:`predictor.whatif.apply`) never mutate a graph: they describe the new
one as *pieces* — slices of the old graph's task columns (copied with one fancy-index per
column) and small tables of new tasks — each task with a float **position key**. Sorting
by that key gives every processor's execution order (the graph's array order within a
processor), so a block can be duplicated "right after itself" or a task inserted "just
before another" by choosing keys, without renumbering anything by hand. Edges are given
in piece-local indices and remapped once in :meth:`GraphEditor.build`.

Per-task *auxiliary columns* (``graph.meta["aux"]``: float64 arrays aligned with the tasks)
carry what the transforms need beyond the graph's own columns: the top-level op a task
belongs to, its phase (forward/backward/optimizer), its layer, how its kernel parameters
scale with the batch size, its profiler-corrected measured duration, ... They travel with
the tasks through every edit; a column missing from a piece takes its default
(:data:`AUX_DEFAULTS`, else NaN).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from predictor.graph import PARAM_COLUMNS, Category, DepKind, ExecutionGraph, GraphError, Overhead, ProcKind

__all__ = ["AUX_KEY", "AUX_DEFAULTS", "aux_of", "GraphEditor", "topological_ok"]

#: where the auxiliary columns live in ``graph.meta``
AUX_KEY = "aux"
#: defaults of auxiliary columns for tasks that do not set them (others: NaN)
AUX_DEFAULTS: dict[str, float] = {
    "op": -1.0,  # top-level op instance the task belongs to
    "phase": 0.0,  # 0 other, 1 forward, 2 backward, 3 optimizer
    "layer": -1.0,  # repeated layer block index, -1 outside the repeated blocks
    "region": -1.0,  # per phase: 0 before the layers, 1 in a layer, 2 after
    "sig": -1.0,  # signature id of the top-level op (name + shapes), for repeat detection
    "changed": 0.0,  # 1 when a transform changed the task's shape or platform (re-time it)
    "ratio": 1.0,  # work ratio new/old applied so far (for ops without a kernel model)
    "prof_events": 0.0,  # profiled events inside the task (profiler-overhead removal)
}
_TASK_COLS = ("rank", "proc", "name", "kind", "category", "overhead", "duration", "flops", "bytes", "group")
_DTYPES = {"rank": np.int32, "proc": np.int32, "name": np.int32, "kind": np.int32, "category": np.int8,
           "overhead": np.int8, "duration": np.float64, "flops": np.float64, "bytes": np.float64,
           "group": np.int32}


def aux_of(graph: ExecutionGraph) -> dict[str, np.ndarray]:
    """The auxiliary columns of ``graph`` (an empty dict when it has none)."""
    return graph.meta.get(AUX_KEY, {})


class GraphEditor:
    """Assemble a new graph from pieces of ``base`` plus new tasks (see the module docstring).

    Processors of ``base`` keep their indices; :meth:`processor` adds more. Every piece
    returns the (pre-sort) indices of its tasks, which :meth:`edges` accepts.
    """

    def __init__(self, base: ExecutionGraph, *, keep_procs: bool = True) -> None:
        self.base = base
        self.names: list[str] = list(base.names)
        self.kinds: list[str] = list(base.kinds)
        self._name_ix = {s: i for i, s in enumerate(self.names)}
        self._kind_ix = {s: i for i, s in enumerate(self.kinds)}
        self.proc_rank: list[int] = list(base.proc_rank.tolist()) if keep_procs else []
        self.proc_kind: list[int] = list(base.proc_kind.tolist()) if keep_procs else []
        self.proc_names: list[str] = list(base.proc_names) if keep_procs else []
        self._cols: dict[str, list[np.ndarray]] = {c: [] for c in _TASK_COLS}
        self._params: dict[str, list[tuple[int, np.ndarray]]] = {}
        self._aux: dict[str, list[tuple[int, np.ndarray]]] = {}
        self._pos: list[np.ndarray] = []
        self._src: list[np.ndarray] = []
        self._dst: list[np.ndarray] = []
        self._ek: list[np.ndarray] = []
        self.n = 0
        self.meta = {k: v for k, v in base.meta.items() if k not in (AUX_KEY, "_topology")}
        self._group_base = int(base.group.max()) + 1 if base.n_tasks and base.group.size else 0

    # ------------------------------------------------------------------ vocabulary
    def processor(self, rank: int, kind: ProcKind, name: str) -> int:
        """Index of processor ``name`` on ``rank`` (created if new)."""
        for i, (r, nm) in enumerate(zip(self.proc_rank, self.proc_names, strict=True)):
            if r == rank and nm == name:
                return i
        self.proc_rank.append(int(rank))
        self.proc_kind.append(int(kind))
        self.proc_names.append(name)
        return len(self.proc_rank) - 1

    def name_id(self, s: str) -> int:
        i = self._name_ix.get(s)
        if i is None:
            i = self._name_ix[s] = len(self.names)
            self.names.append(s)
        return i

    def kind_id(self, s: str) -> int:
        i = self._kind_ix.get(s)
        if i is None:
            i = self._kind_ix[s] = len(self.kinds)
            self.kinds.append(s)
        return i

    def new_groups(self, count: int) -> np.ndarray:
        """``count`` fresh collective-group ids."""
        out = np.arange(self._group_base, self._group_base + count, dtype=np.int32)
        self._group_base += count
        return out

    # ------------------------------------------------------------------ pieces
    def copy(self, idx: np.ndarray, pos: np.ndarray, *, rank: np.ndarray | int | None = None,
             proc: np.ndarray | int | None = None, group: np.ndarray | int | None = None,
             source: ExecutionGraph | None = None) -> np.ndarray:
        """Copy tasks ``idx`` of ``source`` (default: the base graph), every column and aux column,
        at position keys ``pos``; optional overrides of rank, processor, group. Returns new indices."""
        g = source if source is not None else self.base
        idx = np.asarray(idx, dtype=np.int64)
        k = idx.size
        for c in _TASK_COLS:
            self._cols[c].append(getattr(g, c)[idx].astype(_DTYPES[c], copy=True))
        if source is not None and source is not self.base:  # re-intern names/kinds of a foreign graph
            nmap = np.asarray([self.name_id(s) for s in g.names] or [0], dtype=np.int32)
            kmap = np.asarray([self.kind_id(s) for s in g.kinds] or [0], dtype=np.int32)
            self._cols["name"][-1] = nmap[self._cols["name"][-1]]
            self._cols["kind"][-1] = kmap[self._cols["kind"][-1]]
        if proc is not None:
            self._cols["proc"][-1] = np.broadcast_to(np.asarray(proc, dtype=np.int32), (k,)).copy()
            self._cols["rank"][-1] = np.asarray(self.proc_rank, dtype=np.int32)[self._cols["proc"][-1]]
        elif rank is not None:
            self._cols["rank"][-1] = np.broadcast_to(np.asarray(rank, dtype=np.int32), (k,)).copy()
        if group is not None:
            self._cols["group"][-1] = np.broadcast_to(np.asarray(group, dtype=np.int32), (k,)).copy()
        for p, col in g.params.items():
            self._params.setdefault(p, []).append((self.n, col[idx].copy()))
        for a, col in aux_of(g).items():
            self._aux.setdefault(a, []).append((self.n, col[idx].copy()))
        return self._finish_piece(k, pos)

    def add(self, proc: np.ndarray | int, name: str | list[str], kind: str | list[str], category: Category | np.ndarray,
            pos: np.ndarray | float, *, duration: np.ndarray | float = np.nan, flops: np.ndarray | float = np.nan,
            nbytes: np.ndarray | float = np.nan, overhead: Overhead | np.ndarray = Overhead.NONE,
            group: np.ndarray | int = -1, params: Mapping[str, np.ndarray | float] | None = None,
            aux: Mapping[str, np.ndarray | float] | None = None) -> np.ndarray:
        """Append new tasks (vectorised: any argument may be an array of the piece's length)."""
        pos = np.atleast_1d(np.asarray(pos, dtype=np.float64))
        k = pos.size
        procs = np.broadcast_to(np.asarray(proc, dtype=np.int32), (k,)).copy()
        if k and (procs.min() < 0 or procs.max() >= len(self.proc_rank)):
            raise GraphError("a new task refers to a processor that does not exist")
        self._cols["proc"].append(procs)
        self._cols["rank"].append(np.asarray(self.proc_rank, dtype=np.int32)[procs] if k else np.zeros(0, np.int32))
        names = [name] * k if isinstance(name, str) else list(name)
        kinds = [kind] * k if isinstance(kind, str) else list(kind)
        self._cols["name"].append(np.asarray([self.name_id(s) for s in names], dtype=np.int32))
        self._cols["kind"].append(np.asarray([self.kind_id(s) for s in kinds], dtype=np.int32))

        def arr(v, dt):
            return np.broadcast_to(np.asarray(v, dtype=dt), (k,)).copy()

        self._cols["category"].append(arr(category, np.int8))
        self._cols["overhead"].append(arr(overhead, np.int8))
        self._cols["duration"].append(arr(duration, np.float64))
        self._cols["flops"].append(arr(flops, np.float64))
        self._cols["bytes"].append(arr(nbytes, np.float64))
        self._cols["group"].append(arr(group, np.int32))
        for p, v in (params or {}).items():
            if p not in PARAM_COLUMNS:
                raise GraphError(f"unknown kernel parameter {p!r}")
            self._params.setdefault(p, []).append((self.n, arr(v, np.float64)))
        for a, v in (aux or {}).items():
            self._aux.setdefault(a, []).append((self.n, arr(v, np.float64)))
        return self._finish_piece(k, pos)

    def _finish_piece(self, k: int, pos: np.ndarray | float) -> np.ndarray:
        self._pos.append(np.broadcast_to(np.asarray(pos, dtype=np.float64), (k,)).copy())
        out = np.arange(self.n, self.n + k, dtype=np.int64)
        self.n += k
        return out

    def edges(self, src: np.ndarray, dst: np.ndarray, kind: DepKind | np.ndarray) -> None:
        """Dependencies between tasks of this editor (indices returned by :meth:`copy` / :meth:`add`)."""
        src = np.atleast_1d(np.asarray(src, dtype=np.int64))
        dst = np.atleast_1d(np.asarray(dst, dtype=np.int64))
        if src.shape != dst.shape:
            raise GraphError("edge source and target arrays differ in length")
        self._src.append(src)
        self._dst.append(dst)
        self._ek.append(np.broadcast_to(np.asarray(kind, dtype=np.int8), src.shape).copy())

    def set_aux(self, name: str, idx: np.ndarray, values: np.ndarray | float) -> None:
        """Set an aux column on tasks ``idx`` of this editor (after they were added)."""
        idx = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        vals = np.broadcast_to(np.asarray(values, dtype=np.float64), idx.shape).copy()
        self._aux.setdefault(name, [])
        self._aux_updates = getattr(self, "_aux_updates", [])
        self._aux_updates.append((name, idx, vals))

    # ------------------------------------------------------------------ freezing
    def _column(self, pieces: list[tuple[int, np.ndarray]], default: float) -> np.ndarray:
        col = np.full(self.n, default, dtype=np.float64)
        for start, values in pieces:
            col[start:start + values.size] = values
        return col

    def build(self, validate: bool = True) -> ExecutionGraph:
        """Sort by position key, remap edges, freeze."""
        n = self.n
        pos = np.concatenate(self._pos) if self._pos else np.zeros(0)
        order = np.argsort(pos, kind="stable")
        inv = np.empty(n, dtype=np.int64)
        inv[order] = np.arange(n, dtype=np.int64)
        #: editor index -> index in the built graph (after sorting by position)
        self.built_index = inv
        cols = {c: (np.concatenate(v) if v else np.zeros(0, _DTYPES[c]))[order] for c, v in self._cols.items()}
        params = {p: self._column(v, np.nan)[order] for p, v in self._params.items()}
        aux_cols = {a: self._column(v, AUX_DEFAULTS.get(a, np.nan)) for a, v in self._aux.items()}
        for name, idx, vals in getattr(self, "_aux_updates", []):
            aux_cols[name][idx] = vals
        aux_cols = {a: c[order] for a, c in aux_cols.items()}
        if self._src:
            src = inv[np.concatenate(self._src)]
            dst = inv[np.concatenate(self._dst)]
            ek = np.concatenate(self._ek)
            keep = src != dst
            key = np.unique(np.stack([src[keep], dst[keep], ek[keep].astype(np.int64)], axis=1), axis=0)
            src, dst, ek = key[:, 0], key[:, 1], key[:, 2]
        else:
            src = dst = np.zeros(0, np.int64)
            ek = np.zeros(0, np.int64)
        # renumber collective groups densely (ids stay consistent across ranks)
        grp = cols["group"]
        if n and (grp >= 0).any():
            ids, dense = np.unique(grp[grp >= 0], return_inverse=True)
            grp = grp.copy()
            grp[grp >= 0] = dense.astype(np.int32)
            cols["group"] = grp
        meta = dict(self.meta)
        meta[AUX_KEY] = aux_cols
        g = ExecutionGraph(
            **cols,
            params=params,
            proc_rank=np.asarray(self.proc_rank, dtype=np.int32),
            proc_kind=np.asarray(self.proc_kind, dtype=np.int8),
            proc_names=list(self.proc_names),
            edge_src=src.astype(np.int32),
            edge_dst=dst.astype(np.int32),
            edge_kind=ek.astype(np.int8),
            names=list(self.names),
            kinds=list(self.kinds),
            meta=meta,
        )
        if validate:
            g.validate()
        return g


def topological_ok(graph: ExecutionGraph) -> bool:
    """True when every task can start: no cycle through edges and processor order (Kahn's algorithm)."""
    n = graph.n_tasks
    if n == 0:
        return True
    by_proc = np.argsort(graph.proc, kind="stable")
    same = graph.proc[by_proc[:-1]] == graph.proc[by_proc[1:]]
    src = np.concatenate([graph.edge_src.astype(np.int64), by_proc[:-1][same]])
    dst = np.concatenate([graph.edge_dst.astype(np.int64), by_proc[1:][same]])
    indeg = np.bincount(dst, minlength=n)
    order = np.argsort(src, kind="stable")
    succ = dst[order]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    stack = list(np.flatnonzero(indeg == 0))
    seen = 0
    indeg = indeg.copy()
    while stack:
        t = stack.pop()
        seen += 1
        for j in succ[ptr[t]:ptr[t + 1]]:
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(int(j))
    return seen == n
