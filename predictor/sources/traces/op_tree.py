"""The CPU op tree of one rank's Kineto trace: parent links, children, per-thread event starts.

Shared by the analyses that prepare a captured run for what-if transforms
(:mod:`~predictor.sources.traces.host_kernels`, :mod:`~predictor.sources.traces.batch_dependence`,
:mod:`~predictor.sources.traces.profiler_cost`, :mod:`~predictor.sources.traces.step_graphs`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from predictor.sources.traces.kineto import EventCat, KinetoTrace
from predictor.sources.traces.rank_events import join_et

__all__ = ["OpTree", "op_tree", "with_et_dims", "top_op", "calls_op", "thread_of_proc", "events_started",
           "BACKWARD_OP_PREFIX"]

#: name prefix of the top-level ops the autograd engine runs in the backward pass
BACKWARD_OP_PREFIX = "autograd::engine::evaluate_function"


@dataclass
class OpTree:
    """CPU-side events of one rank: parent links, children, thread-sorted starts (µs)."""

    kt: KinetoTrace
    events: np.ndarray  # CPU_OP + USER_ANNOTATION event indices
    parent: dict[int, int]
    children: dict[int, list[int]]
    thread_of: dict[int, int]
    thread_starts: dict[int, np.ndarray]  # per thread key: sorted starts of its events
    thread_key: dict[tuple[int, int], int]


def op_tree(kt: KinetoTrace) -> OpTree:
    """The op tree of ``kt``: ops nest by time on their thread; annotations are counted but parent nothing."""
    ev = np.flatnonzero(kt.mask(EventCat.CPU_OP, EventCat.USER_ANNOTATION))
    keys = kt.pid[ev].astype(np.int64) * (1 << 32) + (kt.tid[ev].astype(np.int64) & 0xFFFFFFFF)
    uniq, inv = np.unique(keys, return_inverse=True)
    parent: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    thread_of: dict[int, int] = {}
    thread_starts: dict[int, np.ndarray] = {}
    thread_key: dict[tuple[int, int], int] = {}
    ts, end, cat = kt.ts, kt.ts + kt.dur, kt.cat
    op = int(EventCat.CPU_OP)
    for t in range(uniq.size):
        idx = ev[inv == t]
        idx = idx[np.lexsort((-kt.dur[idx], ts[idx]))]
        first = int(idx[0])
        thread_key[(int(kt.pid[first]), int(kt.tid[first]))] = t
        thread_starts[t] = np.sort(ts[idx])
        stack: list[int] = []
        for e in idx.tolist():
            thread_of[e] = t
            s = ts[e]
            while stack and s >= end[stack[-1]] - 1e-3:
                stack.pop()
            if cat[e] != op:
                continue
            if stack:
                parent[e] = stack[-1]
                children.setdefault(stack[-1], []).append(e)
            stack.append(e)
    return OpTree(kt, ev, parent, children, thread_of, thread_starts, thread_key)


def with_et_dims(kt: KinetoTrace, et) -> KinetoTrace:
    """``kt`` with ``Input Dims``/``Input type`` taken from the execution trace for the ops that
    lack them (traces recorded without ``record_shapes``); ``kt`` itself is not modified."""
    if et is None:
        return kt
    ops = np.flatnonzero(kt.cat == EventCat.CPU_OP)
    missing = [e for e in ops.tolist() if "Input Dims" not in kt.args[e]]
    if not missing:
        return kt
    join = join_et(kt, et, [])
    args = list(kt.args)
    for e in missing:
        n = join.get(e)
        if n is not None:
            args[e] = {**args[e], "Input Dims": et.input_shapes[n], "Input type": et.input_types[n]}
    return dataclasses.replace(kt, args=args)


def top_op(tree: OpTree, e: int) -> int:
    """The top-level op enclosing event ``e`` (``e`` itself when it has no parent)."""
    while e in tree.parent:
        e = tree.parent[e]
    return e


def calls_op(tree: OpTree, e: int, name: str) -> bool:
    """Does op ``e``'s subtree hold an op named ``name``?"""
    names = tree.kt.names
    todo = list(tree.children.get(e, ()))
    while todo:
        x = todo.pop()
        if names[tree.kt.name[x]] == name:
            return True
        todo.extend(tree.children.get(x, ()))
    return False


def thread_of_proc(proc_name: str, kt: KinetoTrace) -> tuple[int, int]:
    """(pid, tid) of a CPU processor named by build_graph (``cpu tid T`` / ``cpu pid P tid T``)."""
    parts = proc_name.split()
    tid = int(parts[-1])
    if "pid" in parts:
        return int(parts[parts.index("pid") + 1]), tid
    pids = kt.pids
    return (pids[0] if pids else -1), tid


def events_started(tree: OpTree, thread: int | None, a: float, b: float, shift: bool = False) -> int:
    """Profiled events of ``thread`` starting in ``[a, b)`` µs (``shift``: in ``(a, b]`` — the events
    whose entry cost, paid just before they start, falls inside this task)."""
    if thread is None:
        return 0
    st = tree.thread_starts[thread]
    if shift:
        return int(np.searchsorted(st, b + 1e-3, side="left") - np.searchsorted(st, a + 1e-3, side="left"))
    return int(np.searchsorted(st, b - 1e-3, side="left") - np.searchsorted(st, a - 1e-3, side="left"))
