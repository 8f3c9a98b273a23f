"""CPU threads cut into consecutive tasks that cover each thread's timeline (see
:mod:`~predictor.sources.traces.build`): runtime calls that matter to the GPU are tasks of their own
(Lin et al. type T4), the time between them a segment typed T1 (between top-level ops), T2 (op start to
first launch), T5 (between launches of one op) or T3 (after the last launch), and ``ProfilerStep#N``
boundaries zero-length markers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from predictor.graph import Category, Overhead
from predictor.sources.traces.dependencies import BLOCKING_COPY, LAUNCH, SYNC, RuntimeCalls
from predictor.sources.traces.kineto import EventCat
from predictor.sources.traces.rank_events import EPS_US, RankEvents

if TYPE_CHECKING:
    from predictor.sources.traces.build import TraceGraphBuilder

__all__ = ["CpuTasks", "cut_cpu_threads"]

_CPU_OP = int(EventCat.CPU_OP)
_RUNTIME = int(EventCat.RUNTIME)
# the enum members' values, once: a lookup on the enum class per task took 3 % of a 24k-task replay, and the
# builder's columns convert plain ints 2x faster than enum members
_CAT_CPU, _CAT_SYNC = int(Category.CPU), int(Category.SYNC)
_NONE, _T1, _T2, _T3, _T4, _T5 = (int(o) for o in (Overhead.NONE, Overhead.T1, Overhead.T2, Overhead.T3, Overhead.T4,
                                                   Overhead.T5))
# item types on a thread's timeline, and their order at one instant: op end, step end, step start,
# op start, runtime call
_OP_START, _OP_END, _CALL, _MARKER = 0, 1, 2, 3
#: a launch call this much (µs) longer than a usual one, with this many tasks queued on the device
#: when it returned, waited for a free slot of the launch queue
BLOCKED_LAUNCH_US = 20.0
BLOCKED_LAUNCH_QUEUE = 8
#: ... freed by the device task that ended at most this long (µs) before the call returned
BLOCKED_LAUNCH_TAIL_US = 50.0


@dataclass
class CpuTasks:
    """What cutting one rank's threads produced (task indices of the builder).

    ``rt_task``: runtime event -> its (issuing) task; ``rt_wait_task``: sync / blocking copy / split
    launch event -> its waiting (or rest) task; ``op_first`` / ``op_last``: top-level op -> its first /
    last task; ``t1_gaps``: (task, start µs, end µs, thread); ``src_end`` / ``src_task`` / ``src_thread``:
    in-op tasks that may end another thread's wait; ``step_tasks``: step -> its start / end markers.
    """

    rt_task: dict[int, int] = field(default_factory=dict)
    rt_wait_task: dict[int, int] = field(default_factory=dict)
    op_first: dict[int, int] = field(default_factory=dict)
    op_last: dict[int, int] = field(default_factory=dict)
    t1_gaps: list[tuple[int, float, float, int]] = field(default_factory=list)
    src_end: list[float] = field(default_factory=list)
    src_task: list[int] = field(default_factory=list)
    src_thread: list[int] = field(default_factory=list)
    step_tasks: dict[int, dict[str, int]] = field(default_factory=dict)


def cut_cpu_threads(b: TraceGraphBuilder, info: RankEvents, calls: RuntimeCalls, cpu_proc: list[int],
                    step_list: list[tuple[str, float, float, int]], t0: float, median_launch: float) -> CpuTasks:
    """Append the tasks of every CPU thread of ``info`` to ``b`` (processors ``cpu_proc``); ``t0``: the
    trace origin (µs), ``median_launch``: a launch call's usual duration (µs)."""
    markers: dict[int, list[tuple[float, str, int]]] = {}  # steps: markers go on the thread holding the annotation
    for k, (_, s0, s1, ev) in enumerate(step_list):
        t_idx = info.thread_of_event.get(ev, 0)
        markers.setdefault(t_idx, []).append((s0, "start", k))
        markers.setdefault(t_idx, []).append((s1, "end", k))
    out = CpuTasks(step_tasks={k: {} for k in range(len(step_list))})
    cutter = _Cutter(b, info, calls, out, step_list, median_launch)
    for t_idx, evs in enumerate(info.thread_events):
        items = _thread_items(info, calls, evs, markers.get(t_idx, []))
        if items:
            cutter.thread(t_idx, cpu_proc[t_idx], items, t0)
    return out


def _thread_items(info: RankEvents, calls: RuntimeCalls, evs: list[int],
                  markers: list[tuple[float, str, int]]) -> list[tuple[float, int, int, int]]:
    """(time µs, order at that instant, item type, payload) of a thread's op starts and ends, runtime
    calls that become tasks and step markers, sorted."""
    kt = info.trace.kineto
    idx = np.asarray(evs, dtype=np.int64)
    items: list[tuple[float, int, int, int]] = []
    top_of, kind = info.top_of, calls.kind
    # Python lists: per-element numpy access took half of this loop on 23k events
    for e, c, t, d in zip(evs, kt.cat[idx].tolist(), kt.ts[idx].tolist(), kt.dur[idx].tolist(), strict=True):
        if c == _CPU_OP and top_of.get(e) == e:
            items.append((t, 3, _OP_START, e))
            items.append((t + d, 0, _OP_END, e))
        elif c == _RUNTIME and e in kind:
            items.append((t, 4, _CALL, e))
    for when, which, k in markers:
        items.append((when, 1 if which == "end" else 2, _MARKER, k * 2 + (1 if which == "end" else 0)))
    items.sort()
    return items


class _Cutter:
    """Walks the items of one thread after another, appending segment, runtime-call and marker tasks."""

    def __init__(self, b: TraceGraphBuilder, info: RankEvents, calls: RuntimeCalls, out: CpuTasks,
                 step_list: list[tuple[str, float, float, int]], median_launch: float) -> None:
        self.b, self.info, self.calls, self.out = b, info, calls, out
        self.step_list, self.median_launch = step_list, median_launch
        self.kt = info.trace.kineto
        # the event columns as Python lists: per-element numpy access cost more than the cutting itself
        self.ev_ts, self.ev_dur = self.kt.ts.tolist(), self.kt.dur.tolist()
        self.ev_name = list(map(self.kt.names.__getitem__, self.kt.name.tolist()))
        self.gpu_end = list(map(attrgetter("end"), info.gpu))
        self.gpu_start = list(map(attrgetter("start"), info.gpu))
        self.kind = calls.kind
        self.queue = _LaunchQueue(info)
        self.op_launches: dict[int, int] = {}  # top-level op -> GPU work it launches
        for e, kind in calls.kind.items():
            if kind in (LAUNCH, BLOCKING_COPY):
                top = info.top_of.get(e)
                if top is not None:
                    self.op_launches[top] = self.op_launches.get(top, 0) + 1

    def thread(self, t_idx: int, proc: int, items: list[tuple[float, int, int, int]], t0: float) -> None:
        """Cut thread ``t_idx`` from ``t0`` to its last item (the time after it is not part of the run)."""
        self.t_idx, self.proc = t_idx, proc
        self.cur, self.in_op, self.seen = t0, -1, 0
        # the thread's tasks gathered as (name, kind, category, µs, overhead, start µs, end µs, event) rows and
        # appended to the builder at once: two calls per task through the builder took half of the cutting
        b = self.b
        self.base = b.n_tasks
        self.tasks: list[tuple[str, str, int, float, int, float, float, int]] = []
        first_item = True
        for when, _, typ, payload in items:
            if when > self.cur + EPS_US:  # the segment up to this item
                self._segment(when, first_item)
                self.cur = when
            first_item = False
            if typ == _OP_START:
                self.in_op, self.seen = payload, 0
            elif typ == _OP_END:
                if payload == self.in_op:
                    self.in_op = -1
            elif typ == _MARKER:
                k, is_end = divmod(payload, 2)
                at = max(when, self.cur)
                i = self._task(self.step_list[k][0], "marker", _CAT_CPU, 0.0, at, at, _NONE, -1)
                self.out.step_tasks[k]["end" if is_end else "start"] = i
            else:
                self._runtime_call(payload)
        if not self.tasks:
            return
        names, kinds, cats, durs, overs, keys, mends, evs = zip(*self.tasks, strict=True)
        # a negative traced duration is 0; µs -> s
        b.append_tasks(proc, names, kinds, cats, [(0.0 if d < 0.0 else d) * 1e-6 for d in durs], overs)
        b.key.extend(keys)
        b.mend.extend(mends)
        b.task_ev.extend(evs)

    def _task(self, name: str, kind: str, cat: int, dur: float, key: float, mend: float, ov: int,
              ev: int) -> int:
        """Gather a task of the current thread lasting ``dur`` µs that lay at [``key``, ``mend``] µs in the
        measured run; returns the index it gets in the graph."""
        i = self.base + len(self.tasks)
        self.tasks.append((name, kind, cat, dur, ov, key, mend, ev))
        return i

    def _segment(self, when: float, first_item: bool) -> None:
        """The time from ``self.cur`` to ``when``: a T1 gap outside ops, else a segment of the op."""
        out, cur, op = self.out, self.cur, self.in_op
        if op < 0:
            i = self._task("T1", "cpu_gap", _CAT_CPU, when - cur, cur, when, _T1, -1)
            out.t1_gaps.append((i, cur, when, self.t_idx))
            if first_item:
                self.b.bump("leading_gaps")
            return
        total = self.op_launches.get(op, 0)
        if total == 0:
            ov = _NONE
        elif self.seen == 0:
            ov = _T2
        elif self.seen >= total:
            ov = _T3
        else:
            ov = _T5
        tasks = self.tasks  # _task inlined: the most frequent task (11k of 24k in ResNet-50)
        i = self.base + len(tasks)
        tasks.append((self.ev_name[op], "cpu_op", _CAT_CPU, when - cur, ov, cur, when, op))
        out.op_first.setdefault(op, i)
        out.op_last[op] = i
        out.src_end.append(when)
        out.src_task.append(i)
        out.src_thread.append(self.t_idx)

    def _runtime_call(self, e: int) -> None:
        """The task(s) of runtime call ``e``, starting no earlier than the thread's current time."""
        out = self.out
        kind = self.kind[e]
        t = self.ev_ts[e]
        s = max(t, self.cur)
        dur = (t + self.ev_dur[e]) - s
        nm = self.ev_name[e]
        # the call's first and last task; the last one ends at s + dur in every case
        if kind == SYNC:  # synchronisation: only the time after the awaited task ends
            g_end = max((self.gpu_end[g] for g in self.calls.awaited.get(e, [])), default=-np.inf)
            begin = max(s, g_end)
            first = last = self._task(nm, "sync", _CAT_SYNC, s + dur - begin, begin, s + dur, _T4, -1)
            out.rt_task[e] = first
            out.rt_wait_task[e] = first
        elif kind == BLOCKING_COPY:
            self._blocking_copy(e, nm, s, dur)
            first, last = out.rt_task[e], out.rt_wait_task[e]
        elif kind == LAUNCH and dur > self.median_launch and min(
                map(self.gpu_start.__getitem__, self.info.gpu_of_launch[e])) < s + dur:
            self._split_launch(e, nm, s, dur)
            first, last = out.rt_task[e], out.rt_wait_task[e]
        elif kind == LAUNCH and dur > self.median_launch + BLOCKED_LAUNCH_US and (
                holder := self.queue.holder(self.info.gpu_of_launch[e][0], s, s + dur)) >= 0:
            self._blocked_launch(e, nm, s, dur, holder)
            first, last = out.rt_task[e], out.rt_wait_task[e]
        else:
            tasks = self.tasks  # _task inlined: a launch is the second most frequent task
            first = last = self.base + len(tasks)
            tasks.append((nm, "launch" if kind == LAUNCH else "cuda_runtime", _CAT_CPU, dur, _T4, s, s + dur, -1))
            out.rt_task[e] = first
            if kind == LAUNCH:
                self.seen += 1
        top = self.in_op
        if top >= 0:
            out.op_first.setdefault(top, first)
            out.op_last[top] = last
            out.src_end.append(s + dur)
            out.src_task.append(last)
            out.src_thread.append(self.t_idx)
        self.cur = s + dur

    def _blocking_copy(self, e: int, nm: str, s: float, dur: float) -> None:
        """A blocking copy: the issuing part costs what a launch costs; the rest of the call is waiting."""
        info = self.info
        launched = info.gpu_of_launch[e]
        g0 = info.gpu[launched[0]]
        d1 = min(max(g0.start - s, 0.0), self.median_launch, dur)
        self.out.rt_task[e] = self._task(nm, "launch", _CAT_CPU, d1, s, s + d1, _T4, -1)
        g_end = max(self.gpu_end[g] for g in launched)
        begin = max(s + d1, g_end)
        self.out.rt_wait_task[e] = self._task(f"{nm} (wait)", "sync", _CAT_SYNC, s + dur - begin, begin, s + dur,
                                              _T4, -1)
        self.seen += 1

    def _blocked_launch(self, e: int, nm: str, s: float, dur: float, holder: int) -> None:
        """A launch that waited for a free slot of the device's launch queue: it issues its work after a
        launch's usual cost, then waits for GPU task ``holder`` (whose end freed the slot); the wait keeps
        only the time after that end (the simulator recomputes the wait itself)."""
        d1 = min(self.median_launch, dur)
        self.out.rt_task[e] = self._task(nm, "launch", _CAT_CPU, d1, s, s + d1, _T4, -1)
        begin = max(s + d1, self.gpu_end[holder])
        self.out.rt_wait_task[e] = self._task(f"{nm} (queue full)", "sync", _CAT_SYNC, s + dur - begin, begin,
                                              s + dur, _T4, -1)
        self.calls.awaited[e] = [holder]
        self.seen += 1
        self.b.bump("launches_blocked_by_full_queue")

    def _split_launch(self, e: int, nm: str, s: float, dur: float) -> None:
        """A launch during which its GPU task began (a pageable copy staged while the call runs, a full
        launch queue): the call issued its work after a launch's usual cost; the rest is host time."""
        info = self.info
        kt = self.kt
        g_first = min(info.gpu[g].start for g in info.gpu_of_launch[e])
        if any("Pageable" in kt.names[kt.name[info.gpu[g].ev]] for g in info.gpu_of_launch[e]):
            d1 = min(max(g_first - s, 0.0), dur)  # a pageable copy starts once the host staged its first chunk
        else:
            d1 = min(self.median_launch, dur)
        self.out.rt_task[e] = self._task(nm, "launch", _CAT_CPU, d1, s, s + d1, _T4, -1)
        self.out.rt_wait_task[e] = self._task(f"{nm} (rest)", "cuda_runtime", _CAT_CPU, dur - d1, s + d1, s + dur,
                                              _NONE, -1)
        self.seen += 1
        self.b.bump("long_launch_calls_split")


class _LaunchQueue:
    """The launch queue of each device of a rank, from the measured run: how many tasks were issued but not
    started at an instant, and which task's end let a blocked launch call return."""

    def __init__(self, info: RankEvents) -> None:
        kt = info.trace.kineto
        n = len(info.gpu)
        # the tasks' fields read by C-level maps into arrays: list comprehensions took 2 ms on 7.5k tasks
        stream_dev = np.asarray([d for d, _ in info.streams] or [0], dtype=np.int64)
        dev = stream_dev[np.fromiter(map(attrgetter("stream"), info.gpu), dtype=np.int64, count=n)]
        launch = np.fromiter(map(attrgetter("launch"), info.gpu), dtype=np.int64, count=n)
        starts = np.fromiter(map(attrgetter("start"), info.gpu), dtype=np.float64, count=n)
        ends = np.fromiter(map(attrgetter("end"), info.gpu), dtype=np.float64, count=n)
        self.device = dev
        self.by_dev: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for d in np.unique(dev).tolist():
            on = dev == d
            issued = np.sort(kt.ts[launch[on & (launch >= 0)]])
            o = np.flatnonzero(on)[np.argsort(ends[on], kind="stable")]
            self.by_dev[d] = (issued, np.sort(starts[on]), ends[o], o)

    def holder(self, task: int, s: float, end: float) -> int:
        """The GPU task whose end freed a slot for a launch call issuing ``task`` over [``s``, ``end``] µs
        (-1: the queue was not full, or no task of the device ended just before the call returned)."""
        issued, starts, e_sorted, o = self.by_dev[int(self.device[task])]
        pending = int(np.searchsorted(issued, s, side="left")) - int(np.searchsorted(starts, end, side="right"))
        if pending < BLOCKED_LAUNCH_QUEUE:
            return -1
        k = int(np.searchsorted(e_sorted, end + EPS_US, side="right")) - 1
        if k < 0 or end - e_sorted[k] > BLOCKED_LAUNCH_TAIL_US:
            return -1
        return int(o[k])
