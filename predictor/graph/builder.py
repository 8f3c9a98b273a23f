"""GraphBuilder: the one way to build an :class:`~predictor.graph.ExecutionGraph`.

A builder appends work in two granularities, freely mixed:

* :meth:`GraphBuilder.task` — one task at a time (trace readers, the DLRM and MLP synthesisers,
  and the small templates themselves);
* :meth:`GraphBuilder.stamp` — a copy of a small template graph, a *block*, onto a rank. A
  synthesiser that repeats the same work many times (a pipeline stage runs the same chunk of
  layers for every micro-batch) builds each distinct piece once as a block, emitted with
  :class:`~predictor.sources.synth.emit.OpEmitter` on rank 0, and stamps it. A stamp only records
  ``(block, rank, offset)``; :meth:`GraphBuilder.build` fills every copy of a block with one
  vectorised assignment per column (offset the task and edge indices, map the block's
  processors, names and kinds to the big graph's), so 10^5 stamps cost milliseconds, not seconds.

Tasks and stamps are appended in call order, and a processor executes its tasks in array order,
so the order of the calls is the program order of every CPU thread and stream. Both return the
index their (first) task has in the final graph. Blocks carry ``meta["markers"]`` (name -> task
index inside the block) so the caller can wire edges between stamps (add the offset
:meth:`GraphBuilder.stamp` returns).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from predictor.graph.execution import (
    PARAM_COLUMNS,
    Category,
    DepKind,
    ExecutionGraph,
    GraphError,
    Overhead,
    ProcKind,
)

__all__ = ["GraphBuilder", "GraphVocabulary"]

_KNOWN_PARAMS = frozenset(PARAM_COLUMNS)
#: task columns filled from the single tasks when the graph also has stamps
_LOOSE_COLS = ("proc", "name", "kind", "category", "overhead", "duration", "flops", "bytes", "group")
#: dtype of each task column (the rank column is the rank of each task's processor)
_TASK_DTYPES = {"proc": np.int32, "name": np.int32, "kind": np.int32, "category": np.int8, "overhead": np.int8,
                "duration": np.float64, "flops": np.float64, "bytes": np.float64, "group": np.int32}


def _check_params(keys: Iterable[str]) -> None:
    """Raise :class:`GraphError` for a kernel parameter that is not one of :data:`PARAM_COLUMNS`."""
    if not _KNOWN_PARAMS.issuperset(keys):
        unknown = next(k for k in keys if k not in _KNOWN_PARAMS)
        raise GraphError(f"unknown kernel parameter {unknown!r}; known: {', '.join(PARAM_COLUMNS)}")


class GraphVocabulary:
    """The processors, task names / kinds and collective groups a graph under construction has named so far:
    names and kinds are interned into dense ids, processors created on first use."""

    def __init__(self) -> None:
        self._proc_rank: list[int] = []
        self._proc_kind: list[int] = []
        self._proc_names: list[str] = []
        self._proc_index: dict[tuple[int, str], int] = {}
        self._names: dict[str, int] = {}
        self._kinds: dict[str, int] = {}
        self._n_groups = 0
        self.meta: dict = {}

    def processor(self, rank: int, kind: ProcKind, name: str) -> int:
        """Index of the processor ``name`` on ``rank`` (created on first use)."""
        key = (rank, name)
        idx = self._proc_index.get(key)
        if idx is None:
            idx = len(self._proc_rank)
            self._proc_index[key] = idx
            self._proc_rank.append(rank)
            self._proc_kind.append(int(kind))
            self._proc_names.append(name)
        return idx

    def new_group(self) -> int:
        """A fresh collective-group id."""
        self._n_groups += 1
        return self._n_groups - 1

    @staticmethod
    def _intern(table: dict[str, int], value: str) -> int:
        """The dense id of ``value`` in ``table`` (added on first use)."""
        idx = table.get(value)
        if idx is None:
            idx = len(table)
            table[value] = idx
        return idx


class GraphBuilder(GraphVocabulary):
    """Accumulates tasks, block stamps, processors and edges, then freezes them into an :class:`ExecutionGraph`.

    Builders (trace readers, synthesisers) call :meth:`processor` once per CPU thread or GPU
    stream, :meth:`task` / :meth:`stamp` in each processor's execution order, :meth:`edge` for
    every dependency and :meth:`new_group` / ``group=`` for collectives. Appending is plain Python;
    :meth:`build` converts everything to arrays once. Kernel parameters are the columns of
    :data:`~predictor.graph.PARAM_COLUMNS`; any other name is rejected (a typo would otherwise
    leave a kernel model reading NaN).
    """

    def __init__(self) -> None:
        super().__init__()
        # single tasks, in call order
        self._cols: dict[str, list] = {
            "proc": [],
            "name": [],
            "kind": [],
            "category": [],
            "overhead": [],
            "duration": [],
            "flops": [],
            "bytes": [],
            "group": [],
        }
        # the column lists bound once: a dict lookup per column per task took a fifth of a trace's task appends
        c = self._cols
        self._col_appends = tuple(c[k].append for k in _LOOSE_COLS)
        # (single tasks appended before, task count) of each stamp: the single tasks' final indices follow
        # from these at freezing, not from a list appended per task
        self._stamped_at: list[tuple[int, int]] = []
        self._params: dict[str, dict[int, float]] = {}  # key -> {index in the final graph: value}
        self._src: list[int] = []
        self._dst: list[int] = []
        self._ekind: list[int] = []
        self._n = 0
        # block id -> (block, name map, kind map, [offsets], [proc maps]); group maps by offset
        self._stamps: dict[int, tuple[ExecutionGraph, np.ndarray, np.ndarray, list[int], list[np.ndarray]]] = {}
        self._proc_maps: dict[tuple[int, int], np.ndarray] = {}
        self._group_maps: list[tuple[ExecutionGraph, int, dict[int, int]]] = []

    @property
    def n_tasks(self) -> int:
        """Tasks appended so far, stamped ones included (the index the next task gets)."""
        return self._n

    # -------------------------------------------------------------- appending
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
        """Append a task at the end of ``proc``'s execution order; returns its index in the final graph."""
        return self.append_task(proc, name, kind, category, duration, flops, bytes, overhead, group, params)

    def append_task(self, proc: int, name: str, kind: str, category: Category, duration: float, flops: float,
                    nbytes: float, overhead: Overhead, group: int, params: Mapping[str, float] | None) -> int:
        """:meth:`task` with every argument positional, for readers appending 10^4-10^5 tasks (keyword
        passing was a fifth of the call); returns the task's index in the final graph."""
        if params:
            _check_params(params)
        idx = self._n
        a_proc, a_name, a_kind, a_cat, a_over, a_dur, a_flops, a_bytes, a_group = self._col_appends
        a_proc(proc)
        names = self._names
        nid = names.get(name)
        if nid is None:
            nid = names[name] = len(names)
        a_name(nid)
        kinds = self._kinds
        kid = kinds.get(kind)
        if kid is None:
            kid = kinds[kind] = len(kinds)
        a_kind(kid)
        a_cat(category)  # the enum members themselves: np.fromiter converts them at freezing, 2x cheaper than int()
        a_over(overhead)
        a_dur(duration)
        a_flops(flops)
        a_bytes(nbytes)
        a_group(group)
        if params:
            for key, value in params.items():
                self._params.setdefault(key, {})[idx] = float(value)
        self._n = idx + 1
        return idx

    def append_tasks(self, proc: int, names: Sequence[str], kinds: Sequence[str], categories: Sequence[int],
                     durations: Sequence[float], overheads: Sequence[int], *, flops: Sequence[float] | None = None,
                     nbytes: Sequence[float] | None = None, groups: Sequence[int] | None = None,
                     params: Sequence[Mapping[str, float] | None] | None = None) -> int:
        """Many tasks at the end of ``proc``'s execution order at once (categories and overheads: :class:`Category` and
        :class:`Overhead` values, durations in seconds; ``flops`` / ``nbytes`` / ``groups`` / ``params`` one entry per
        task, NaN / NaN / -1 / none when not given), as :meth:`append_task` one after another would; returns the
        first one's index."""
        first = self._n
        k = len(names)
        c = self._cols
        c["proc"].extend([proc] * k)
        ids, kids = self._names, self._kinds
        c["name"].extend([ids.setdefault(nm, len(ids)) for nm in names])
        c["kind"].extend([kids.setdefault(kd, len(kids)) for kd in kinds])
        c["category"].extend(categories)
        c["overhead"].extend(overheads)
        c["duration"].extend(durations)
        c["flops"].extend([float("nan")] * k if flops is None else flops)
        c["bytes"].extend([float("nan")] * k if nbytes is None else nbytes)
        c["group"].extend([-1] * k if groups is None else groups)
        if params is not None:
            table = self._params
            for idx, p in enumerate(params, first):
                if p:
                    _check_params(p)
                    for key, value in p.items():
                        table.setdefault(key, {})[idx] = float(value)
        self._n = first + k
        return first

    def stamp(self, block: ExecutionGraph, rank: int, *, group_map: Mapping[int, int] | None = None) -> int:
        """Append a copy of ``block`` on ``rank``; returns the index its task 0 gets.

        Processors are matched by name on ``rank`` (created on first use). Collective groups of
        the block are dropped (-1) unless ``group_map`` maps them to groups of this graph.
        """
        offset = self._n
        entry = self._stamps.get(id(block))
        if entry is None or entry[0] is not block:
            _check_params(block.params)
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
        self._stamped_at.append((len(self._cols["proc"]), block.n_tasks))
        if group_map:
            self._group_maps.append((block, offset, dict(group_map)))
        self._n += block.n_tasks
        return offset

    def edge(self, src: int, dst: int, kind: DepKind) -> None:
        """``dst`` cannot start before ``src`` is done (or, for CPU_GPU, has issued the launch)."""
        self._src.append(src)
        self._dst.append(dst)
        self._ekind.append(int(kind))

    def edge_arrays(self, src: np.ndarray, dst: np.ndarray, kind: np.ndarray) -> None:
        """Many edges at once: ``dst[i]`` cannot start before ``src[i]`` is done (``kind[i]``: a :class:`DepKind`)."""
        self._src.extend(np.asarray(src, dtype=np.int64).tolist())
        self._dst.extend(np.asarray(dst, dtype=np.int64).tolist())
        self._ekind.extend(np.asarray(kind, dtype=np.int64).tolist())

    def edges(self, srcs: Iterable[int], dst: int, kind: DepKind) -> None:
        for s in srcs:
            self.edge(s, dst, kind)

    # -------------------------------------------------------------- repeating
    def mark(self) -> tuple[int, int]:
        """(tasks, edges) appended so far: a position :meth:`repeat` compares and copies spans between."""
        return self._n, len(self._src)

    def repeat(self, before: tuple[int, int], between: tuple[int, int], after: tuple[int, int], copies: int,
               rename: Callable[[str, int], list[str]]) -> bool:
        """Append ``copies`` more copies of span B (the single tasks and edges appended from mark ``between`` to
        ``after``) if B repeats span A (from ``before`` to ``between``) one step on; returns whether it did.

        ``rename(name, k)``: the names a task of A named ``name`` has in B and the copies after it, ``k``
        (= ``copies + 1``) of them. B repeats A when it has A's tasks with A's columns and parameters, the
        names ``rename`` gives A's first, and A's edges moved by A's length, each edge from before A either kept
        (a task both spans wait for) or now from inside A (the previous span's task). Copy ``j`` (2 .. copies
        + 1) takes the ``j``-th names and B's edges moved by ``(j - 1)`` lengths, the kept ones kept: exactly what
        appending the copies one task and edge at a time would have built. Nothing is appended otherwise.
        """
        (a, ea), (b, eb), (c, ec) = before, between, after
        n = b - a
        if copies < 1 or n <= 0 or c - b != n or ec - eb != eb - ea or self._stamps or c != self._n:
            return False
        cols = self._cols
        for k in _LOOSE_COLS:
            if k == "name":
                continue
            col = cols[k]
            if not np.array_equal(np.asarray(col[a:b], dtype=np.float64), np.asarray(col[b:c], dtype=np.float64),
                                  equal_nan=True):
                return False
        names = list(self._names)
        ids_a = cols["name"][a:b]
        # a span repeats a few names (T1, cudaLaunchKernel...) many times: each distinct one renamed once
        later = {i: rename(names[i], copies + 1) for i in dict.fromkeys(ids_a)}
        ids = self._names
        if any(ids.get(later[i][0]) != j for i, j in zip(ids_a, cols["name"][b:c], strict=True)):
            return False
        params: list[tuple[dict[int, float], list[tuple[int, float]]]] = []
        for table in self._params.values():
            span_a = [(i - a, v) for i, v in table.items() if a <= i < b]
            if sorted(span_a) != sorted((i - b, v) for i, v in table.items() if b <= i < c):
                return False
            params.append((table, span_a))
        src_a, dst_a, kind_a = self._src[ea:eb], self._dst[ea:eb], self._ekind[ea:eb]
        src_b, dst_b, kind_b = self._src[eb:ec], self._dst[eb:ec], self._ekind[eb:ec]
        if kind_a != kind_b or any(not a <= d < b or d + n != d2 for d, d2 in zip(dst_a, dst_b, strict=True)):
            return False
        moves = []  # per edge of B: whether its source moves with the copies
        for s, s2 in zip(src_a, src_b, strict=True):
            if a <= s < b and s2 == s + n or s < a and a <= s2 < b:
                moves.append(True)
            elif s < a and s2 == s:
                moves.append(False)
            else:
                return False
        for j in range(2, copies + 2):
            shift = (j - 1) * n
            # interned in first-use order, as appending task by task does
            renamed = {i: ids.setdefault(later[i][j - 1], len(ids)) for i in later}
            for k in _LOOSE_COLS:
                cols[k].extend([renamed[i] for i in ids_a] if k == "name" else cols[k][b:c])
            for table, span_a in params:
                for i, v in span_a:
                    table[b + shift + i] = v
            self._src.extend(s + shift if m else s for s, m in zip(src_b, moves, strict=True))
            self._dst.extend(d + shift for d in dst_b)
            self._ekind.extend(kind_b)
            self._n += n
        return True

    # -------------------------------------------------------------- freezing
    def build(self, validate: bool = True) -> ExecutionGraph:
        g = self._freeze_stamped() if self._stamps else self._freeze_tasks()
        if validate:
            g.validate()
        return g

    def _freeze_tasks(self) -> ExecutionGraph:
        """Single tasks only: their lists are the columns (parameters in first-use order)."""
        c = {k: np.fromiter(v, dtype=_TASK_DTYPES[k], count=len(v)) for k, v in self._cols.items()}
        proc_rank = np.asarray(self._proc_rank, dtype=np.int32)
        n = self.n_tasks
        params = {}
        for key, values in self._params.items():
            col = np.full(n, np.nan)
            idx = np.fromiter(values.keys(), dtype=np.int64, count=len(values))
            col[idx] = np.fromiter(values.values(), dtype=np.float64, count=len(values))
            params[key] = col
        return ExecutionGraph(
            rank=proc_rank[c["proc"]],
            **c,
            params=params,
            proc_rank=proc_rank,
            proc_kind=np.asarray(self._proc_kind, dtype=np.int8),
            proc_names=list(self._proc_names),
            edge_src=np.asarray(self._src, dtype=np.int32),
            edge_dst=np.asarray(self._dst, dtype=np.int32),
            edge_kind=np.asarray(self._ekind, dtype=np.int8),
            names=list(self._names),
            kinds=list(self._kinds),
            meta=dict(self.meta),
        )

    def _freeze_stamped(self) -> ExecutionGraph:
        """Stamps and single tasks: every copy of a block filled at once, then the single tasks at
        their indices (parameters sorted by name); the blocks' edges come before the builder's own."""
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
        keys = set(self._params)
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
        if self._cols["proc"]:
            # a single task's index: its position among the single tasks plus the tasks stamped before it
            at = np.asarray([0, *(a for a, _ in self._stamped_at)], dtype=np.int64)
            stamped = np.cumsum([0, *(nb for _, nb in self._stamped_at)], dtype=np.int64)
            pos = np.arange(len(self._cols["proc"]), dtype=np.int64)
            idx = pos + stamped[np.searchsorted(at, pos, side="right") - 1]
            for c in _LOOSE_COLS:  # np.fromiter in the column's dtype: 2x faster than np.asarray on a list
                values = self._cols[c]
                cols[c][idx] = np.fromiter(values, dtype=_TASK_DTYPES[c], count=len(values))
            for key, values in self._params.items():
                params[key][np.fromiter(values.keys(), dtype=np.int64)] = list(values.values())
        src_parts.append(np.asarray(self._src, dtype=np.int64))
        dst_parts.append(np.asarray(self._dst, dtype=np.int64))
        ek_parts.append(np.asarray(self._ekind, dtype=np.int8))
        return ExecutionGraph(
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
