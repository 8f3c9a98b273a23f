"""Indexes over one rank's Kineto events that the replay graph is built from.

* :func:`analyse_rank` — CPU threads (events in time order, op nesting) and GPU tasks (streams,
  launching runtime call, NCCL kernels): :class:`RankEvents`.
* :class:`StreamOrder` — per stream, its tasks in issue order ("the last task issued before t"); per
  thread, the streams it launched to ("the thread's current stream").
* :func:`step_annotations` — the iteration markers; :func:`join_et` — Kineto op -> execution-trace node;
  :func:`launch_stats` and :func:`queued_gap_us` — the launch and stream timings of the capture.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from predictor.sources.traces.errors import TraceError
from predictor.sources.traces.et import ExecutionTrace
from predictor.sources.traces.kineto import EventCat, KinetoTrace
from predictor.sources.traces.load import RankTrace
from predictor.sources.traces.ops import is_nccl_kernel

__all__ = ["EPS_US", "STREAM_GAP_MAX_US", "GpuTask", "RankEvents", "analyse_rank", "StreamOrder", "queued_gap_us",
           "step_annotations", "join_et", "launch_stats"]

#: time tolerance (µs) between events that touch
EPS_US = 1e-3
#: gaps longer than this (µs) between queued tasks of a stream are waits, not the device's own gap
STREAM_GAP_MAX_US = 20.0


@dataclass(slots=True)
class GpuTask:
    """A kernel, copy or set on a GPU stream (times in µs)."""

    ev: int
    stream: int  # index into RankEvents.streams
    start: float
    end: float
    launch: int  # runtime event index, -1 if none in the trace
    inner_op: int  # innermost cpu_op event that launched it, -1 if unknown
    group: int = -1
    dur: float = 0.0  # replay duration (µs)


@dataclass
class RankEvents:
    """CPU threads and GPU tasks of one rank (``index``: its graph rank)."""

    index: int
    trace: RankTrace
    threads: list[tuple[int, int]]
    thread_events: list[list[int]]  # per thread: CPU-side event indices sorted by time
    top_of: dict[int, int]  # cpu_op / runtime event -> enclosing top-level op event (or itself)
    inner_of: dict[int, int]  # runtime event -> innermost enclosing cpu_op event
    streams: list[tuple[int, int]]  # (device, stream)
    gpu: list[GpuTask]
    gpu_of_launch: dict[int, list[int]]  # runtime event -> indices into gpu
    nccl: list[int]  # indices into gpu of NCCL kernels, by start time
    thread_of_event: dict[int, int]
    #: the GPU tasks' durations contradict their timestamps (tasks of one stream overlap: an edited trace);
    #: inferred dependencies are then checked against the order of starts only
    overlapping: bool = False


def _sort_key_cpu(kt: KinetoTrace, idx: np.ndarray) -> np.ndarray:
    # by start, longer first (parents before children), ops before runtime calls at a tie
    is_rt = (kt.cat[idx] == EventCat.RUNTIME).astype(np.int8)
    return np.lexsort((is_rt, -kt.dur[idx], kt.ts[idx]))


def analyse_rank(index: int, rt: RankTrace) -> RankEvents:
    """The :class:`RankEvents` of ``rt`` (graph rank ``index``).

    Raises:
        TraceError: the trace has neither CPU ops nor GPU kernels.
    """
    kt = rt.kineto
    cpu = np.flatnonzero(kt.mask(EventCat.CPU_OP, EventCat.USER_ANNOTATION, EventCat.PYTHON, EventCat.RUNTIME))
    gpu_idx = np.flatnonzero(kt.mask(EventCat.KERNEL, EventCat.MEMCPY, EventCat.MEMSET))
    has_ops = bool(np.any(kt.cat == EventCat.CPU_OP))
    if not has_ops and gpu_idx.size == 0:
        raise TraceError(f"{kt.label}: has no CPU ops and no GPU kernels (nothing to replay)")
    threads, thread_events, top_of, inner_of, thread_of_event = _thread_nesting(kt, cpu)
    streams, gpu, gpu_of_launch, nccl, overlaps = _gpu_tasks(kt, gpu_idx, inner_of)
    return RankEvents(index, rt, threads, thread_events, top_of, inner_of, streams, gpu, gpu_of_launch, nccl,
                      thread_of_event, overlapping=overlaps > max(1, len(gpu) // 100))


def _thread_nesting(kt: KinetoTrace, cpu: np.ndarray):
    """Threads, their events in time order, and the enclosing top-level / innermost op of each event."""
    keys = kt.pid[cpu] * (1 << 32) + (kt.tid[cpu] & 0xFFFFFFFF)
    thread_keys, inv = np.unique(keys, return_inverse=True)
    threads = [(int(kt.pid[cpu[np.argmax(inv == t)]]), int(kt.tid[cpu[np.argmax(inv == t)]]))
               for t in range(thread_keys.size)]
    thread_events: list[list[int]] = []
    top_of: dict[int, int] = {}
    inner_of: dict[int, int] = {}
    thread_of_event: dict[int, int] = {}
    # an event at or after this (µs) starts after the enclosing one ended: its end less the tolerance, once per event
    limit = (kt.ts + kt.dur) - EPS_US
    CPU_OP = int(EventCat.CPU_OP)
    RUNTIME = int(EventCat.RUNTIME)
    for t in range(thread_keys.size):
        idx = cpu[inv == t]
        idx = idx[_sort_key_cpu(kt, idx)]
        evs = idx.tolist()
        thread_events.append(evs)
        thread_of_event.update(dict.fromkeys(evs, t))
        # open ops (limit, event) above a sentinel that never closes; ``top``: the outermost open op
        stack: list[tuple[float, int]] = [(math.inf, -1)]
        top = -1
        # Python lists: per-element numpy access took half of this loop on 23k events
        for e, c, s, lim in zip(evs, kt.cat[idx].tolist(), kt.ts[idx].tolist(), limit[idx].tolist(), strict=True):
            while s >= stack[-1][0]:
                stack.pop()
            if c == CPU_OP:
                if len(stack) == 1:
                    top = e
                top_of[e] = top
                stack.append((lim, e))
            elif c == RUNTIME and len(stack) > 1:
                top_of[e] = top
                inner_of[e] = stack[-1][1]
    return threads, thread_events, top_of, inner_of, thread_of_event


def _gpu_tasks(kt: KinetoTrace, gpu_idx: np.ndarray, inner_of: dict[int, int]):
    """Streams, GPU tasks in stream order, the tasks of each launch call and the NCCL kernels."""
    rts = np.flatnonzero(kt.cat == EventCat.RUNTIME)
    rt_corr = kt.corr[rts]
    has = rt_corr >= 0
    corr_to_rt: dict[int, int] = dict(zip(rt_corr[has].tolist(), rts[has].tolist(), strict=True))
    skeys = kt.device[gpu_idx] * (1 << 32) + (kt.stream[gpu_idx] & 0xFFFFFFFF)
    stream_keys, sinv = np.unique(skeys, return_inverse=True) if gpu_idx.size else (np.zeros(0), np.zeros(0, int))
    streams = []
    for s in range(stream_keys.size):
        first = gpu_idx[np.argmax(sinv == s)]
        streams.append((int(kt.device[first]), int(kt.stream[first])))
    order = np.lexsort((kt.ts[gpu_idx], sinv)) if gpu_idx.size else np.zeros(0, int)
    gpu: list[GpuTask] = []
    gpu_of_launch: dict[int, list[int]] = {}
    nccl: list[int] = []
    names = kt.names
    ev = gpu_idx[order]
    stream_of = np.asarray(sinv)[order]
    kernel = int(EventCat.KERNEL)
    # the name ids of NCCL kernels, each name tested once (not once per kernel)
    nccl_names = {n for n in np.unique(kt.name[ev[kt.cat[ev] == kernel]]).tolist() if is_nccl_kernel(names[n])}
    # Python lists: per-element numpy access took most of this loop
    for e, s_idx, c, corr, nm, t, d in zip(ev.tolist(), stream_of.tolist(), kt.cat[ev].tolist(),
                                           kt.corr[ev].tolist(), kt.name[ev].tolist(), kt.ts[ev].tolist(),
                                           kt.dur[ev].tolist(), strict=True):
        launch = corr_to_rt.get(corr, -1) if corr >= 0 else -1
        # positional: keyword passing took a third of this loop
        g = GpuTask(e, s_idx, t, t + d, launch, inner_of.get(launch, -1) if launch >= 0 else -1, -1, d)
        gpu.append(g)
        if launch >= 0:
            gpu_of_launch.setdefault(launch, []).append(len(gpu) - 1)
        if c == kernel and nm in nccl_names:
            nccl.append(len(gpu) - 1)
    nccl.sort(key=lambda i: gpu[i].start)
    # a stream runs one task at a time: a task ended no later than the next one on its stream started (an
    # edited trace whose durations grew with the timestamps untouched keeps its order of events)
    overlaps = 0
    start = kt.ts[ev]
    end = start + kt.dur[ev]  # each task's end as GpuTask.end holds it; a pair's fix touches only its first task
    for i in np.flatnonzero((stream_of[:-1] == stream_of[1:]) & (end[:-1] > start[1:])).tolist():
        a, b = gpu[i], gpu[i + 1]
        overlaps += a.end > b.start + 1.0
        a.end = max(b.start, a.start)
    return streams, gpu, gpu_of_launch, nccl, overlaps


class StreamOrder:
    """Issue order of one rank's GPU tasks: per stream, its tasks by launch time; per CPU thread,
    the streams it launched to in time order (the thread's "current stream")."""

    def __init__(self, info: RankEvents) -> None:
        tsa = info.trace.kineto.ts.tolist()  # a Python list: numpy scalars per task were slower
        self.info = info
        self.stream_tasks: list[list[int]] = [[] for _ in info.streams]
        for gi, g in enumerate(info.gpu):
            self.stream_tasks[g.stream].append(gi)
        # each GPU task's launch time (µs; -inf: no launch in the trace)
        gpu_launch_ts = [tsa[g.launch] if g.launch >= 0 else -np.inf for g in info.gpu]
        self._launch_cummax: list[np.ndarray] = []
        for lst in self.stream_tasks:
            lt = np.asarray([gpu_launch_ts[gi] for gi in lst])
            self._launch_cummax.append(np.maximum.accumulate(lt) if lt.size else lt)
        launch_ts: list[list[float]] = [[] for _ in info.threads]
        launch_stream: list[list[int]] = [[] for _ in info.threads]
        thread_of = info.thread_of_event
        for g in info.gpu:
            if g.launch >= 0:
                t = thread_of.get(g.launch)
                if t is not None:
                    launch_ts[t].append(tsa[g.launch])
                    launch_stream[t].append(g.stream)
        for t in range(len(info.threads)):
            o = np.argsort(launch_ts[t], kind="stable")
            launch_ts[t] = [launch_ts[t][i] for i in o]
            launch_stream[t] = [launch_stream[t][i] for i in o]
        self._thread_launch_ts, self._thread_launch_stream = launch_ts, launch_stream
        self._stream_index = {s: i for i, s in enumerate(info.streams)}

    def last_issued_before(self, s: int, t: float) -> int:
        """The last GPU task launched to stream ``s`` before ``t`` µs (-1: none)."""
        k = int(np.searchsorted(self._launch_cummax[s], t, side="left")) - 1
        return self.stream_tasks[s][k] if k >= 0 else -1

    def first_issued_after(self, s: int, t: float) -> int:
        """The first GPU task launched to stream ``s`` after ``t`` µs (-1: none)."""
        k = int(np.searchsorted(self._launch_cummax[s], t, side="right"))
        return self.stream_tasks[s][k] if k < len(self.stream_tasks[s]) else -1

    def stream_before(self, thread: int, t: float) -> int:
        """The stream ``thread`` launched to last before ``t`` µs (-1: none)."""
        k = bisect.bisect_left(self._thread_launch_ts[thread], t) - 1
        return self._thread_launch_stream[thread][k] if k >= 0 else -1

    def stream_after(self, thread: int, t: float) -> int:
        """The stream ``thread`` launches to next after ``t`` µs (-1: none)."""
        k = bisect.bisect_right(self._thread_launch_ts[thread], t)
        return self._thread_launch_stream[thread][k] if k < len(self._thread_launch_ts[thread]) else -1

    def stream(self, device: int, stream: object) -> int:
        """Index of (``device``, ``stream``) in the rank's streams (-1: unknown)."""
        try:
            return self._stream_index.get((device, int(stream)), -1)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return -1


def queued_gap_us(info: RankEvents, stream_tasks: list[list[int]], kt: KinetoTrace) -> float:
    """Median gap (µs) between consecutive tasks of a stream when the second was already issued
    before the first ended: the device's own time to start a queued task (0 if unseen)."""
    gaps: list[float] = []
    # each task's launch call's end (µs) as a Python list (numpy scalars per task pair were slower); a task
    # without a launch reads the last event's, unused
    launch = np.fromiter(map(attrgetter("launch"), info.gpu), dtype=np.int64, count=len(info.gpu))
    issued = (kt.ts[launch] + kt.dur[launch]).tolist()
    for lst in stream_tasks:
        for a, b in zip(lst[:-1], lst[1:], strict=True):
            ga, gb = info.gpu[a], info.gpu[b]
            if gb.launch >= 0 and issued[b] < ga.end:
                d = gb.start - ga.end
                if 0.0 <= d < STREAM_GAP_MAX_US:
                    gaps.append(d)
    return float(np.median(gaps)) if len(gaps) >= 20 else 0.0


def step_annotations(kt: KinetoTrace) -> list[tuple[str, float, float, int]]:
    """(name, start µs, end µs, thread event index) of each iteration marker, in time order."""
    ann = np.flatnonzero(kt.cat == EventCat.USER_ANNOTATION)
    names = kt.names
    steps = [(names[kt.name[e]], float(kt.ts[e]), float(kt.ts[e] + kt.dur[e]), int(e)) for e in ann.tolist()
             if names[kt.name[e]].startswith("ProfilerStep#")]
    if steps:
        return sorted(steps, key=lambda s: s[1])
    # no ProfilerStep: iterations between consecutive starts of a repeated optimizer annotation
    for prefix in ("Optimizer.zero_grad#", "Optimizer.step#", "## zero_grad ##"):
        marks = sorted((float(kt.ts[e]), int(e)) for e in ann.tolist() if names[kt.name[e]].startswith(prefix))
        if len(marks) >= 2:
            return [(f"iteration {i} ({prefix.rstrip('#')})", marks[i][0], marks[i + 1][0], marks[i][1])
                    for i in range(len(marks) - 1)]
    return []


def join_et(kt: KinetoTrace, et: ExecutionTrace, notes: list[str]) -> dict[int, int]:
    """Kineto event index -> ET node index (rf_id join, else name and order); a line on ``notes``."""
    ops = np.flatnonzero(kt.mask(EventCat.CPU_OP, EventCat.USER_ANNOTATION))
    roots = et.is_root()
    if kt.has_record_function_ids() and np.any(et.rf_id >= 0):
        out = _join_by_rf_id(kt, et, ops, roots)
        how = "rf_id"
    else:
        nodes = [i for i in range(et.n_nodes) if not roots[i]]
        if not nodes:
            return {}
        out = _join_by_name(kt, et, ops, nodes, notes)
        if out is None:
            return {}
        how = "name and order"
    n_ops = int((~roots).sum())
    notes.append(f"{et.label}: joined {len(out)} of {n_ops} execution-trace nodes by {how}")
    return out


def _join_by_rf_id(kt: KinetoTrace, et: ExecutionTrace, ops: np.ndarray, roots: np.ndarray) -> dict[int, int]:
    out: dict[int, int] = {}
    # the nodes and ops with an rf_id picked by numpy, then one dict built and probed over Python lists
    keep = (et.rf_id >= 0) & ~roots
    rf_to_node = dict(zip(et.rf_id[keep].tolist(), np.flatnonzero(keep).tolist(), strict=True))
    et_names, et_name = et.names, et.name.tolist()  # Python lists: 2x faster than numpy scalars per op
    kt_names, kt_name = kt.names, kt.name.tolist()
    rf = kt.rf[ops]
    has = rf >= 0
    for e, r in zip(ops[has].tolist(), rf[has].tolist(), strict=True):
        n = rf_to_node.get(r)
        if n is not None and et_names[et_name[n]] == kt_names[kt_name[e]]:
            out[e] = n
    return out


def _join_by_name(kt: KinetoTrace, et: ExecutionTrace, ops: np.ndarray, nodes: list[int],
                  notes: list[str]) -> dict[int, int] | None:
    """The k-th ET node of a name joins the k-th Kineto op of that name from the first one's start on
    (None, with a note, when Kineto has no op named as the first node)."""
    first_name = et.names[et.name[nodes[0]]]
    ops = ops[np.argsort(kt.ts[ops], kind="stable")]
    anchor = next((float(kt.ts[e]) for e in ops.tolist() if kt.names[kt.name[e]] == first_name), None)
    if anchor is None:
        notes.append(f"{et.label}: no Kineto op named {first_name!r}; execution trace not joined")
        return None
    by_name: dict[str, list[int]] = {}
    for e in ops.tolist():
        if kt.ts[e] >= anchor - EPS_US:
            by_name.setdefault(kt.names[kt.name[e]], []).append(e)
    out: dict[int, int] = {}
    pos: dict[str, int] = {}
    for n in nodes:
        nm = et.names[et.name[n]]
        lst = by_name.get(nm)
        if not lst:
            continue
        k = pos.get(nm, 0)
        if k < len(lst):
            out[lst[k]] = n
            pos[nm] = k + 1
    return out


def launch_stats(infos: list[RankEvents]) -> tuple[float, float]:
    """(median launch-call duration µs, launch fraction): where an idle stream's kernel starts
    inside (or after) its launch call, as a fraction of the call's duration (median)."""
    fracs: list[float] = []
    durs: list[float] = []
    for info in infos:
        kt = info.trace.kineto
        # each task's launch call's start and duration as Python lists (numpy scalars per task were slower);
        # a task without a launch reads the last event's, unused
        launch = np.fromiter(map(attrgetter("launch"), info.gpu), dtype=np.int64, count=len(info.gpu))
        prev_end: dict[int, float] = {}
        for g, t, d in zip(info.gpu, kt.ts[launch].tolist(), kt.dur[launch].tolist(), strict=True):
            if g.launch >= 0:
                durs.append(d)
                if prev_end.get(g.stream, -np.inf) < g.start - 2.0 and d > 0:
                    fracs.append((g.start - t) / d)
            prev_end[g.stream] = g.end
    med_launch = float(np.median(durs)) if durs else 5.0
    lf = float(np.clip(np.median(fracs), 0.5, 2.0)) if len(fracs) >= 5 else 1.0
    return med_launch, lf
