"""Kineto (+ execution trace) -> :class:`~predictor.graph.ExecutionGraph` for replay and what-if.

Tasks
-----
* **CPU threads** are cut into consecutive tasks that cover the thread's timeline: the CUDA
  runtime calls that matter to the GPU (launches, synchronisations, event record / wait) are
  tasks of their own (Lin et al. type T4), and the time between them is a *segment* task
  typed by where it lies (Lin et al. 2022 §III-C): between two top-level ops ``T1``, from an
  op's start to its first launch ``T2``, between two launches of one op ``T5``, after its last
  launch ``T3`` (host-only ops: overhead ``NONE``). Other runtime calls
  (``cudaStreamIsCapturing``, ``cudaFuncSetAttribute``...) stay inside their segment.
  ``ProfilerStep#N`` boundaries are zero-length ``marker`` tasks on the thread that holds them.
* **GPU streams** hold kernels, copies and sets in stream order, separated by ``stream gap``
  tasks of the device's own time to start a queued task (the trace's median gap between
  back-to-back queued tasks, about 1-2 µs).
* A launch call during which its GPU task already started (a pageable copy staged while the
  call runs, a full launch queue) is split: an issuing part (a launch's usual cost, or for a
  pageable copy the staging before the copy began) and the rest of the call.

Dependencies (Lumos §3.3.2)
---------------------------
* CPU->CPU: program order of a thread (implicit), and *inter-thread*: a T1 gap of at least
  :data:`INTER_THREAD_GAP_US` in which another thread of the same rank finished an op waits for
  that op (the autograd thread waiting for the forward pass, the main thread waiting for
  ``backward()``); the gap keeps only the time after that op.
* CPU->GPU: the runtime call with the kernel's correlation id launches it.
* GPU->CPU: ``cudaDeviceSynchronize`` / ``cudaStreamSynchronize`` / ``cudaEventSynchronize``
  and blocking copies (``cudaMemcpy``, copies to or from pageable memory) wait for the last
  GPU task issued before them on the stream(s) concerned; the call keeps only the time after
  that task ended (the wait itself is simulated).
* GPU->GPU: stream order (implicit), and ``cudaEventRecord`` -> ``cudaStreamWaitEvent``: the
  first task issued to the waiting stream after the wait depends on the last task issued to
  the recording stream before the record. Kineto's ``cuda_sync`` records name both streams and
  the record's correlation id; older traces without them are resolved per thread (the record
  is on the stream the thread launched to last, the waiting stream is the one it launches to
  next).
* GPU->GPU for the device itself: a task that started well after all of the above were
  satisfied, right when a task of another stream ended, was held back by it (a kernel that
  fills every SM, a busy copy engine) and depends on it — the GPU analogue of Lumos'
  inter-thread rule.
* DATA: from the execution trace's tensor ids, between top-level ops on different threads.
* Collectives: NCCL kernels are matched across ranks by process group (or stream) and order
  into collective groups, which the simulator ends together; every member gets the group's
  *minimum* measured duration (the last rank to arrive waits least, so its kernel time is the
  closest to the transfer itself). A single-rank trace of a multi-rank job has no partners:
  its collectives keep their measured durations, waiting included.

Every edge respects the measured order of the real run (source placed no later than target),
so the graph is acyclic; durations are the measured ones except for waits, which the
simulator recomputes. Nothing of the measured start times reaches the simulator except, per
CPU thread, the time its first event starts after the trace begins (the ranks' skew).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from predictor.graph import PARAM_COLUMNS, Category, DepKind, ExecutionGraph, GraphBuilder, Overhead, ProcKind
from predictor.sources.traces._io import no_gc
from predictor.sources.traces.errors import TraceError
from predictor.sources.traces.et import ExecutionTrace
from predictor.sources.traces.kineto import EventCat, KinetoTrace
from predictor.sources.traces.load import RankTrace, TraceSet
from predictor.sources.traces.ops import classify_gpu_task, is_nccl_kernel, op_params

__all__ = ["ReplayGraph", "build_graph", "INTER_THREAD_GAP_US", "LAUNCH_CALLS"]

#: a T1 gap at least this long (µs) may be a wait for another thread
INTER_THREAD_GAP_US = 20.0
#: a GPU task that starts this much (µs) after it was ready was held back by the device
RESOURCE_WAIT_US = 20.0
#: ... by a task of another stream that ended at most this long (µs) before it started
RESOURCE_TAIL_US = 100.0
#: ... or ended at most this long (µs) after it started (kernel tails, timestamp granularity)
RESOURCE_LEAD_US = 100.0
#: gaps longer than this (µs) between queued tasks of a stream are waits, not the device's own gap
STREAM_GAP_MAX_US = 20.0
#: runtime calls that only synchronise the CPU with the GPU
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
              "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize")
#: runtime calls whose copy blocks the CPU until done
BLOCKING_COPY_CALLS = ("cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyToSymbol",
                       "cudaMemcpyFromSymbol", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "cuMemcpy")
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaMemcpyAsync", "cudaMemsetAsync", "cudaLaunchCooperativeKernel", "cudaGraphLaunch")
_RECORD = ("cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord")
_WAIT = ("cudaStreamWaitEvent", "cuStreamWaitEvent")
_EPS = 1e-3  # µs
# plain ints: IntEnum attribute access is slow in tight loops
_CPU_OP = int(EventCat.CPU_OP)
_RUNTIME = int(EventCat.RUNTIME)
_KERNEL = int(EventCat.KERNEL)
_MEMCPY = int(EventCat.MEMCPY)
_MEMSET = int(EventCat.MEMSET)
_CUDA_SYNC = int(EventCat.CUDA_SYNC)
_CAT_CPU, _CAT_SYNC, _CAT_COMM = Category.CPU, Category.SYNC, Category.COMMUNICATION
_OV_NONE, _OV_T1, _OV_T2, _OV_T3, _OV_T4, _OV_T5 = (Overhead.NONE, Overhead.T1, Overhead.T2, Overhead.T3,
                                                    Overhead.T4, Overhead.T5)


def _is_blocking_copy(memcpy_name: str) -> bool:
    """A device-to-pageable-host copy blocks the calling thread until it is done."""
    return "DtoH" in memcpy_name and "Pageable" in memcpy_name


# --------------------------------------------------------------------------- result
@dataclass
class ReplayGraph:
    """A graph built from traces, with the measured run it came from.

    ``measured_start`` / ``measured_end``: where each task lay in the real run, seconds from
    the trace origin (used for comparison plots only, never by the simulator). ``steps``: one
    row per rank and ProfilerStep — ``rank`` (graph rank), ``trace_rank``, ``name``,
    ``start_task`` / ``end_task`` (marker tasks), ``measured_s``.
    """

    graph: ExecutionGraph
    measured_start: np.ndarray
    measured_end: np.ndarray
    steps: pd.DataFrame
    trace_ranks: list[int]
    world_size: int
    launch_fraction: float
    t0_us: float
    notes: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    #: per task, the Kineto event (index into its rank's trace) it came from: the top-level op
    #: of a CPU op segment, the launching op of a GPU task; -1 for gaps, runtime calls, markers
    task_event: np.ndarray | None = None

    def measured_timeline(self):
        """The measured run as a :class:`~predictor.simulate.Timeline` (same breakdown code)."""
        from predictor.simulate import Timeline

        g = self.graph
        return Timeline(g, self.measured_start.copy(), self.measured_end.copy(),
                        self.measured_end - self.measured_start, np.full(g.n_tasks, -1, dtype=np.int64),
                        np.full(max(g.n_groups, 0), -1, dtype=np.int64))


# --------------------------------------------------------------------------- per-rank analysis
@dataclass
class _Gpu:
    ev: int
    stream: int  # index into _RankInfo.streams
    start: float
    end: float
    launch: int  # runtime event index, -1 if none in the trace
    inner_op: int  # innermost cpu_op event that launched it, -1 if unknown
    group: int = -1
    dur: float = 0.0  # replay duration (µs)


@dataclass
class _RankInfo:
    index: int
    trace: RankTrace
    threads: list[tuple[int, int]]
    thread_events: list[list[int]]  # per thread: CPU-side event indices sorted by time
    top_of: dict[int, int]  # cpu_op / runtime event -> enclosing top-level op event (or itself)
    inner_of: dict[int, int]  # runtime event -> innermost enclosing cpu_op event
    streams: list[tuple[int, int]]  # (device, stream)
    gpu: list[_Gpu]
    gpu_of_launch: dict[int, list[int]]  # runtime event -> indices into gpu
    nccl: list[int]  # indices into gpu of NCCL kernels, by start time
    thread_of_event: dict[int, int]


def _sort_key_cpu(kt: KinetoTrace, idx: np.ndarray) -> np.ndarray:
    # by start, longer first (parents before children), ops before runtime calls at a tie
    is_rt = (kt.cat[idx] == EventCat.RUNTIME).astype(np.int8)
    return np.lexsort((is_rt, -kt.dur[idx], kt.ts[idx]))


def _analyse_rank(index: int, rt: RankTrace) -> _RankInfo:
    kt = rt.kineto
    cpu = np.flatnonzero(kt.mask(EventCat.CPU_OP, EventCat.USER_ANNOTATION, EventCat.PYTHON, EventCat.RUNTIME))
    gpu_idx = np.flatnonzero(kt.mask(EventCat.KERNEL, EventCat.MEMCPY, EventCat.MEMSET))
    has_ops = bool(np.any(kt.cat == EventCat.CPU_OP))
    if not has_ops and gpu_idx.size == 0:
        raise TraceError(f"{kt.label}: has no CPU ops and no GPU kernels (nothing to replay)")
    # threads
    keys = kt.pid[cpu] * (1 << 32) + (kt.tid[cpu] & 0xFFFFFFFF)
    thread_keys, inv = np.unique(keys, return_inverse=True)
    threads = [(int(kt.pid[cpu[np.argmax(inv == t)]]), int(kt.tid[cpu[np.argmax(inv == t)]]))
               for t in range(thread_keys.size)]
    thread_events: list[list[int]] = []
    top_of: dict[int, int] = {}
    inner_of: dict[int, int] = {}
    thread_of_event: dict[int, int] = {}
    cat = kt.cat
    ts = kt.ts
    end = kt.ts + kt.dur
    CPU_OP = int(EventCat.CPU_OP)
    RUNTIME = int(EventCat.RUNTIME)
    for t in range(thread_keys.size):
        idx = cpu[inv == t]
        idx = idx[_sort_key_cpu(kt, idx)]
        thread_events.append(idx.tolist())
        stack: list[tuple[float, int]] = []
        for e in idx.tolist():
            c = cat[e]
            thread_of_event[e] = t
            s = ts[e]
            while stack and s >= stack[-1][0] - _EPS:
                stack.pop()
            if c == CPU_OP:
                top_of[e] = stack[0][1] if stack else e
                stack.append((end[e], e))
            elif c == RUNTIME and stack:
                top_of[e] = stack[0][1]
                inner_of[e] = stack[-1][1]
    # GPU tasks
    corr_to_rt: dict[int, int] = {}
    for e in np.flatnonzero(cat == RUNTIME).tolist():
        c = int(kt.corr[e])
        if c >= 0:
            corr_to_rt[c] = e
    skeys = kt.device[gpu_idx] * (1 << 32) + (kt.stream[gpu_idx] & 0xFFFFFFFF)
    stream_keys, sinv = np.unique(skeys, return_inverse=True) if gpu_idx.size else (np.zeros(0), np.zeros(0, int))
    streams = []
    for s in range(stream_keys.size):
        first = gpu_idx[np.argmax(sinv == s)]
        streams.append((int(kt.device[first]), int(kt.stream[first])))
    order = np.lexsort((kt.ts[gpu_idx], sinv)) if gpu_idx.size else np.zeros(0, int)
    gpu: list[_Gpu] = []
    gpu_of_launch: dict[int, list[int]] = {}
    nccl: list[int] = []
    names = kt.names
    for o in order.tolist():
        e = int(gpu_idx[o])
        launch = corr_to_rt.get(int(kt.corr[e]), -1) if kt.corr[e] >= 0 else -1
        g = _Gpu(ev=e, stream=int(sinv[o]), start=float(ts[e]), end=float(end[e]), launch=launch,
                 inner_op=inner_of.get(launch, -1) if launch >= 0 else -1, dur=float(kt.dur[e]))
        gpu.append(g)
        if launch >= 0:
            gpu_of_launch.setdefault(launch, []).append(len(gpu) - 1)
        if cat[e] == EventCat.KERNEL and is_nccl_kernel(names[kt.name[e]]):
            nccl.append(len(gpu) - 1)
    nccl.sort(key=lambda i: gpu[i].start)
    return _RankInfo(index, rt, threads, thread_events, top_of, inner_of, streams, gpu, gpu_of_launch, nccl,
                     thread_of_event)


def _queued_gap_us(info: _RankInfo, stream_tasks: list[list[int]], kt: KinetoTrace) -> float:
    """Median gap (µs) between consecutive tasks of a stream when the second was already issued
    before the first ended: the device's own time to start a queued task (0 if unseen)."""
    gaps: list[float] = []
    for lst in stream_tasks:
        for a, b in zip(lst[:-1], lst[1:], strict=True):
            ga, gb = info.gpu[a], info.gpu[b]
            if gb.launch >= 0 and kt.ts[gb.launch] + kt.dur[gb.launch] < ga.end:
                d = gb.start - ga.end
                if 0.0 <= d < STREAM_GAP_MAX_US:
                    gaps.append(d)
    return float(np.median(gaps)) if len(gaps) >= 20 else 0.0


def _resource_waits(info: _RankInfo, stream_tasks: list[list[int]], wait_src: dict[int, list[int]],
                    kt: KinetoTrace) -> list[tuple[int, int]]:
    """(holder, waiter) pairs of GPU tasks: the waiter was ready (launched, stream free, events
    done) more than :data:`RESOURCE_WAIT_US` before it started, and a task of the same engine
    class (SMs or copy engine) on another stream of the device, running when the waiter
    started, ended within :data:`RESOURCE_TAIL_US` before (or :data:`RESOURCE_LEAD_US` after:
    the tail of a big kernel frees SMs early) that start."""
    gpu = info.gpu
    if len(info.streams) < 2:
        return []
    engine = (kt.cat[np.asarray([g.ev for g in gpu], dtype=np.int64)] == _MEMCPY).astype(np.int8)
    device = np.asarray([info.streams[g.stream][0] for g in gpu], dtype=np.int64)
    starts = np.asarray([g.start for g in gpu])
    ends = np.asarray([g.end for g in gpu])
    streams = np.asarray([g.stream for g in gpu])
    out: list[tuple[int, int]] = []
    by_class: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for key in {(int(d), int(e)) for d, e in zip(device.tolist(), engine.tolist(), strict=True)}:
        idx = np.flatnonzero((device == key[0]) & (engine == key[1]))
        o = idx[np.argsort(ends[idx], kind="stable")]
        by_class[key] = (o, ends[o])
    for lst in stream_tasks:
        prev_end = -np.inf
        for gi in lst:
            g = gpu[gi]
            ready = prev_end
            if g.launch >= 0:
                ready = max(ready, float(kt.ts[g.launch] + kt.dur[g.launch]))
            else:
                ready = max(ready, g.start)
            for s in wait_src.get(gi, ()):
                ready = max(ready, gpu[s].end)
            prev_end = g.end
            if g.start - ready <= RESOURCE_WAIT_US:
                continue
            o, e = by_class[(int(device[gi]), int(engine[gi]))]
            lo = int(np.searchsorted(e, g.start - RESOURCE_TAIL_US, side="left"))
            hi = int(np.searchsorted(e, g.start + RESOURCE_LEAD_US, side="right"))
            best, best_cost = -1, np.inf
            for k in range(hi - 1, lo - 1, -1):
                c = int(o[k])
                if streams[c] == g.stream or starts[c] >= g.start:
                    continue
                # closest end wins; ending after the waiter started (a kernel's tail) costs double
                late = ends[c] - g.start
                cost = 2.0 * late if late > 0 else -late
                if cost < best_cost:
                    best, best_cost = c, cost
            if best >= 0:
                out.append((best, gi))
    return out


# --------------------------------------------------------------------------- collectives
def _match_collectives(infos: list[_RankInfo], notes: list[str]) -> int:
    """Group the NCCL kernels of all ranks: same process group (or stream), same position."""
    if len(infos) < 2:
        return 0
    per_rank: list[dict[str, list[int]]] = []
    for info in infos:
        kt = info.trace.kineto
        by_pg: dict[str, list[int]] = {}
        for gi in info.nccl:
            g = info.gpu[gi]
            a = kt.args[g.ev]
            pg = a.get("Process Group Name")
            key = f"pg {pg}" if pg is not None else f"stream {info.streams[g.stream][1]}"
            by_pg.setdefault(key, []).append(gi)
        per_rank.append(by_pg)
    n_groups = 0
    all_keys = set().union(*(set(d) for d in per_rank))
    for key in sorted(all_keys):
        lists = [d.get(key, []) for d in per_rank]
        holders = [i for i, lst in enumerate(lists) if lst]
        if len(holders) < 2:
            continue
        n = min(len(lists[i]) for i in holders)
        if any(len(lists[i]) != n for i in holders):
            notes.append(f"collectives on {key}: ranks issue different counts; matched the first {n} by order")
        for k in range(n):
            members = [(i, lists[i][k]) for i in holders]
            kinds = {infos[i].trace.kineto.names[infos[i].trace.kineto.name[infos[i].gpu[g].ev]].split("(")[0]
                     for i, g in members}
            if len(kinds) > 1:
                notes.append(f"collectives on {key}: position {k} differs across ranks ({', '.join(sorted(kinds))}); "
                             "stopped matching there")
                break
            dmin = min(infos[i].gpu[g].end - infos[i].gpu[g].start for i, g in members)
            for i, g in members:
                infos[i].gpu[g].group = n_groups
                infos[i].gpu[g].dur = dmin
            n_groups += 1
    return n_groups


# --------------------------------------------------------------------------- steps
def _step_annotations(kt: KinetoTrace) -> list[tuple[str, float, float, int]]:
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


# --------------------------------------------------------------------------- ET join
def join_et(kt: KinetoTrace, et: ExecutionTrace, notes: list[str]) -> dict[int, int]:
    """Kineto event index -> ET node index (rf_id join, else name and order)."""
    ops = np.flatnonzero(kt.mask(EventCat.CPU_OP, EventCat.USER_ANNOTATION))
    roots = et.is_root()
    out: dict[int, int] = {}
    if kt.has_record_function_ids() and np.any(et.rf_id >= 0):
        rf_to_node = {int(r): i for i, r in enumerate(et.rf_id.tolist()) if r >= 0 and not roots[i]}
        for e in ops.tolist():
            r = int(kt.rf[e])
            if r >= 0:
                n = rf_to_node.get(r)
                if n is not None and et.names[et.name[n]] == kt.names[kt.name[e]]:
                    out[e] = n
        how = "rf_id"
    else:
        nodes = [i for i in range(et.n_nodes) if not roots[i]]
        if not nodes:
            return out
        first_name = et.names[et.name[nodes[0]]]
        ops = ops[np.argsort(kt.ts[ops], kind="stable")]
        anchor = next((float(kt.ts[e]) for e in ops.tolist() if kt.names[kt.name[e]] == first_name), None)
        if anchor is None:
            notes.append(f"{et.label}: no Kineto op named {first_name!r}; execution trace not joined")
            return out
        by_name: dict[str, list[int]] = {}
        for e in ops.tolist():
            if kt.ts[e] >= anchor - _EPS:
                by_name.setdefault(kt.names[kt.name[e]], []).append(e)
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
        how = "name and order"
    n_ops = int((~roots).sum())
    notes.append(f"{et.label}: joined {len(out)} of {n_ops} execution-trace nodes by {how}")
    return out


# --------------------------------------------------------------------------- builder
class _Builder:
    def __init__(self, trace_set: TraceSet) -> None:
        self.ts = trace_set
        self.b = GraphBuilder()
        self.key: list[float] = []  # measured placement start (µs), per task
        self.mend: list[float] = []  # measured end (µs), per task
        self.notes: list[str] = list(trace_set.notes)
        self.stats: dict[str, int] = {}
        self.edges: list[tuple[int, int, int]] = []
        self.steps: list[dict] = []
        self.dur_override: dict[int, float] = {}  # task -> seconds, set after the task was appended
        self.task_ev: list[int] = []  # Kineto event a task came from (-1: none), see ReplayGraph.task_event

    def bump(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    def task(self, proc: int, name: str, kind: str, cat: Category, dur: float, key: float, mend: float, *,
             overhead: Overhead = _OV_NONE, group: int = -1, flops: float = math.nan,
             nbytes: float = math.nan, params: dict | None = None, ev: int = -1) -> int:
        i = self.b.task(proc, name, kind, cat, duration=max(dur, 0.0) * 1e-6, overhead=overhead, group=group,
                        flops=flops, bytes=nbytes, params=params)
        self.key.append(key)
        self.mend.append(mend)
        self.task_ev.append(ev)
        return i

    def edge(self, src: int, dst: int, kind: DepKind) -> None:
        if src >= 0 and dst >= 0 and src != dst:
            self.edges.append((src, dst, int(kind)))

    # ------------------------------------------------------------------ one rank
    def rank(self, info: _RankInfo, t0: float, median_launch: float) -> None:
        rt = info.trace
        kt = rt.kineto
        r = info.index
        names = kt.names
        cat = kt.cat
        tsa = kt.ts
        dura = kt.dur
        b = self.b
        et_map = join_et(kt, rt.et, self.notes) if rt.et is not None else {}
        # shapes of each cpu_op event (Kineto Input Dims, else the ET)
        def shapes_of(e: int) -> tuple[list, list | None]:
            a = kt.args[e]
            dims = a.get("Input Dims")
            if isinstance(dims, list) and any(isinstance(d, list) and d for d in dims):
                return dims, a.get("Input type")
            n = et_map.get(e)
            if n is not None and rt.et is not None:
                return rt.et.input_shapes[n], rt.et.input_types[n]
            return [], None

        # --- streams and per-stream launch order (for "last task issued before t")
        n_streams = len(info.streams)
        stream_tasks: list[list[int]] = [[] for _ in range(n_streams)]
        for gi, g in enumerate(info.gpu):
            stream_tasks[g.stream].append(gi)
        stream_launch_cummax: list[np.ndarray] = []
        for lst in stream_tasks:
            lt = np.asarray([tsa[info.gpu[gi].launch] if info.gpu[gi].launch >= 0 else -np.inf for gi in lst])
            stream_launch_cummax.append(np.maximum.accumulate(lt) if lt.size else lt)

        def last_issued_before(s: int, t: float) -> int:
            arr = stream_launch_cummax[s]
            k = int(np.searchsorted(arr, t, side="left")) - 1
            return stream_tasks[s][k] if k >= 0 else -1

        def first_issued_after(s: int, t: float) -> int:
            arr = stream_launch_cummax[s]
            k = int(np.searchsorted(arr, t, side="right"))
            return stream_tasks[s][k] if k < len(stream_tasks[s]) else -1

        # per thread: launches in time order with their stream (the thread's "current stream")
        thread_launch_ts: list[list[float]] = [[] for _ in info.threads]
        thread_launch_stream: list[list[int]] = [[] for _ in info.threads]
        for g in info.gpu:
            if g.launch >= 0:
                t = info.thread_of_event.get(g.launch)
                if t is not None:
                    thread_launch_ts[t].append(float(tsa[g.launch]))
                    thread_launch_stream[t].append(g.stream)
        for t in range(len(info.threads)):
            o = np.argsort(thread_launch_ts[t], kind="stable")
            thread_launch_ts[t] = [thread_launch_ts[t][i] for i in o]
            thread_launch_stream[t] = [thread_launch_stream[t][i] for i in o]

        def stream_before(t_idx: int, t: float) -> int:
            k = bisect.bisect_left(thread_launch_ts[t_idx], t) - 1
            return thread_launch_stream[t_idx][k] if k >= 0 else -1

        def stream_after(t_idx: int, t: float) -> int:
            k = bisect.bisect_right(thread_launch_ts[t_idx], t)
            return thread_launch_stream[t_idx][k] if k < len(thread_launch_ts[t_idx]) else -1

        stream_index = {s: i for i, s in enumerate(info.streams)}
        # --- cuda_sync records (newer Kineto): correlation -> args
        sync_rec: dict[int, dict] = {}
        for e in np.flatnonzero(cat == _CUDA_SYNC).tolist():
            c = int(kt.corr[e])
            if c >= 0:
                sync_rec.setdefault(c, kt.args[e])
        corr_to_rt = {int(kt.corr[e]): e for e in np.flatnonzero(cat == _RUNTIME).tolist() if kt.corr[e] >= 0}
        has_wait_records = any(a.get("cuda_sync_kind") == "Stream Wait Event" for a in sync_rec.values())

        def dev_stream(device: int, stream: object) -> int:
            try:
                return stream_index.get((device, int(stream)), -1)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                return -1

        device0 = info.streams[0][0] if info.streams else 0

        # --- classify the runtime calls that become tasks
        # kind codes: 1 launch, 2 sync (GPU->CPU), 3 blocking copy, 4 record, 5 wait
        rt_kind: dict[int, int] = {}
        awaited: dict[int, list[int]] = {}  # sync runtime event -> gpu indices it waits for
        waits: list[tuple[int, int, int, str]] = []  # (src gpu, dst gpu, runtime event, how)
        last_record: list[list[tuple[float, int]]] = [[] for _ in info.threads]  # per thread (ts, stream)
        for t_idx, evs in enumerate(info.thread_events):
            for e in evs:
                if cat[e] != _RUNTIME:
                    continue
                nm = names[kt.name[e]]
                s = float(tsa[e])
                launched = info.gpu_of_launch.get(e)
                rec = sync_rec.get(int(kt.corr[e])) if kt.corr[e] >= 0 else None
                if nm in SYNC_CALLS:
                    rt_kind[e] = 2
                    targets: list[int] = []
                    skind = (rec or {}).get("cuda_sync_kind")
                    if nm.startswith(("cudaDeviceSynchronize", "cuCtx")) or skind == "Context Sync":
                        dev = int((rec or {}).get("device", device0))
                        targets = [last_issued_before(si, s) for si, (d, _) in enumerate(info.streams) if d == dev]
                        self.bump("sync_device")
                    elif nm.startswith(("cudaStreamSynchronize", "cuStream")):
                        si = dev_stream(int(rec.get("device", device0)), rec.get("stream")) if rec else -1
                        if si < 0:
                            si = stream_before(t_idx, s)
                            self.bump("sync_stream_inferred")
                        else:
                            self.bump("sync_stream_cuda_sync")
                        if si >= 0:
                            targets = [last_issued_before(si, s)]
                    else:  # event synchronize
                        si, when = -1, -1.0
                        if rec and rec.get("wait_on_cuda_event_record_corr_id") is not None:
                            rec_e = corr_to_rt.get(int(rec["wait_on_cuda_event_record_corr_id"]))
                            si = dev_stream(int(rec.get("device", device0)), rec.get("wait_on_stream"))
                            when = float(tsa[rec_e]) if rec_e is not None else s
                        elif last_record[t_idx]:
                            when, si = last_record[t_idx][-1]
                        if si >= 0:
                            targets = [last_issued_before(si, when)]
                            self.bump("sync_event")
                    awaited[e] = [g for g in targets if g >= 0]
                elif launched:
                    gpu_cats = {int(cat[info.gpu[g].ev]) for g in launched}
                    # a copy to pageable host memory returns only when the data is there
                    blocking = nm in BLOCKING_COPY_CALLS or (
                        _MEMCPY in gpu_cats and nm.startswith(("cudaMemcpy", "cuMemcpy"))
                        and any(_is_blocking_copy(names[kt.name[info.gpu[g].ev]]) for g in launched))
                    rt_kind[e] = 3 if blocking else 1
                    if blocking:
                        awaited[e] = list(launched)
                        self.bump("blocking_copies")
                elif nm in _RECORD:
                    rt_kind[e] = 4
                    last_record[t_idx].append((s, stream_before(t_idx, s)))
                elif nm in _WAIT:
                    rt_kind[e] = 5
                    src = dst = -1
                    how = ""
                    if rec and rec.get("cuda_sync_kind") == "Stream Wait Event":
                        dev = int(rec.get("device", device0))
                        wsi = dev_stream(dev, rec.get("stream"))
                        rsi = dev_stream(dev, rec.get("wait_on_stream"))
                        rec_e = corr_to_rt.get(int(rec.get("wait_on_cuda_event_record_corr_id", -1)))
                        if wsi >= 0 and rsi >= 0 and rec_e is not None:
                            src = last_issued_before(rsi, float(tsa[rec_e]))
                            dst = first_issued_after(wsi, s)
                            how = "cuda_sync"
                    elif not has_wait_records:  # older Kineto: infer both streams from the thread
                        wsi = stream_after(t_idx, s)
                        if wsi >= 0:
                            dst = first_issued_after(wsi, s)
                            for when, rsi in reversed(last_record[t_idx]):
                                if rsi >= 0 and rsi != wsi:
                                    src = last_issued_before(rsi, when)
                                    how = "inferred"
                                    break
                            if src < 0 and dst >= 0 and not last_record[t_idx]:
                                # no record call traced at all: the event is on one of the other
                                # streams; take the last task issued to each before the wait that
                                # the measured run allows, and keep the one ending last
                                best = -np.inf
                                for si in range(n_streams):
                                    if si == wsi or info.streams[si][0] != info.streams[wsi][0]:
                                        continue
                                    c = last_issued_before(si, s)
                                    if c >= 0 and info.gpu[c].end <= info.gpu[dst].start + 0.5 and info.gpu[c].end > best:
                                        best, src = info.gpu[c].end, c
                                how = "inferred_stream"
                    if src >= 0 and dst >= 0:
                        waits.append((src, dst, e, how))

        # --- processors
        cpu_proc = [b.processor(r, ProcKind.CPU_THREAD, f"cpu tid {tid}" if pid == info.threads[0][0]
                                else f"cpu pid {pid} tid {tid}") for pid, tid in info.threads]
        gpu_proc = [b.processor(r, ProcKind.GPU_STREAM, f"gpu{dev} stream {st}") for dev, st in info.streams]

        # --- steps: markers go on the thread holding the annotation
        step_list = _step_annotations(kt)
        markers: dict[int, list[tuple[float, str, int]]] = {}
        for k, (_, s0, s1, ev) in enumerate(step_list):
            t_idx = info.thread_of_event.get(ev, 0)
            markers.setdefault(t_idx, []).append((s0, "start", k))
            markers.setdefault(t_idx, []).append((s1, "end", k))
        step_tasks: dict[int, dict[str, int]] = {k: {} for k in range(len(step_list))}

        # --- per top-level op: does it launch GPU work?
        op_launches: dict[int, int] = {}
        for e, kind in rt_kind.items():
            if kind in (1, 3):
                top = info.top_of.get(e)
                if top is not None:
                    op_launches[top] = op_launches.get(top, 0) + 1

        # --- CPU threads: segments and runtime tasks
        rt_task: dict[int, int] = {}  # runtime event -> its (issuing) task
        rt_wait_task: dict[int, int] = {}  # sync/blocking runtime event -> its wait task
        op_first: dict[int, int] = {}
        op_last: dict[int, int] = {}
        t1_gaps: list[tuple[int, float, float, int]] = []  # (task, a, b, thread)
        src_end: list[float] = []  # ends of in-op tasks (candidates for inter-thread waits)
        src_task: list[int] = []
        src_thread: list[int] = []
        gpu_end = [g.end for g in info.gpu]
        for t_idx, evs in enumerate(info.thread_events):
            proc = cpu_proc[t_idx]
            items: list[tuple[float, int, int, int]] = []  # (time, order, type, payload)
            for e in evs:
                c = cat[e]
                if c == _CPU_OP and info.top_of.get(e) == e:
                    items.append((float(tsa[e]), 3, 0, e))  # op start
                    items.append((float(tsa[e] + dura[e]), 0, 1, e))  # op end
                elif c == _RUNTIME and e in rt_kind:
                    items.append((float(tsa[e]), 4, 2, e))
            # at one instant: op end, step end, step start, op start, runtime call
            for when, which, k in markers.get(t_idx, []):
                items.append((when, 1 if which == "end" else 2, 3, k * 2 + (1 if which == "end" else 0)))
            if not items:
                continue
            items.sort()
            cur = t0
            in_op = -1
            seen = 0
            first_item = True

            for when, _, typ, payload in items:
                if when > cur + _EPS:  # the segment up to this item
                    if in_op < 0:
                        i = self.task(proc, "T1", "cpu_gap", _CAT_CPU, when - cur, cur, when, overhead=_OV_T1)
                        t1_gaps.append((i, cur, when, t_idx))
                        if first_item:
                            self.bump("leading_gaps")
                    else:
                        total = op_launches.get(in_op, 0)
                        if total == 0:
                            ov = _OV_NONE
                        elif seen == 0:
                            ov = _OV_T2
                        elif seen >= total:
                            ov = _OV_T3
                        else:
                            ov = _OV_T5
                        i = self.task(proc, names[kt.name[in_op]], "cpu_op", _CAT_CPU, when - cur, cur, when,
                                      overhead=ov, ev=in_op)
                        op_first.setdefault(in_op, i)
                        op_last[in_op] = i
                        src_end.append(when)
                        src_task.append(i)
                        src_thread.append(t_idx)
                    cur = when
                first_item = False
                if typ == 0:
                    in_op = payload
                    seen = 0
                elif typ == 1:
                    if payload == in_op:
                        in_op = -1
                elif typ == 3:
                    k, is_end = divmod(payload, 2)
                    i = self.task(proc, step_list[k][0], "marker", _CAT_CPU, 0.0, max(when, cur), max(when, cur))
                    step_tasks[k]["end" if is_end else "start"] = i
                else:
                    e = payload
                    kind = rt_kind[e]
                    s = max(float(tsa[e]), cur)
                    dur = float(tsa[e] + dura[e]) - s
                    nm = names[kt.name[e]]
                    top = in_op
                    if kind == 2:  # synchronisation: only the time after the awaited task ends
                        g_end = max((gpu_end[g] for g in awaited.get(e, [])), default=-np.inf)
                        begin = max(s, g_end)
                        i = self.task(proc, nm, "sync", _CAT_SYNC, s + dur - begin, begin, s + dur,
                                      overhead=_OV_T4)
                        rt_task[e] = i
                        rt_wait_task[e] = i
                    elif kind == 3:  # blocking copy: issue part, then the wait
                        launched = info.gpu_of_launch[e]
                        g0 = info.gpu[launched[0]]
                        # the issuing part costs what a launch costs; the rest of the call is waiting
                        d1 = min(max(g0.start - s, 0.0), median_launch, dur)
                        i = self.task(proc, nm, "launch", _CAT_CPU, d1, s, s + d1, overhead=_OV_T4)
                        rt_task[e] = i
                        g_end = max(gpu_end[g] for g in launched)
                        begin = max(s + d1, g_end)
                        w = self.task(proc, f"{nm} (wait)", "sync", _CAT_SYNC, s + dur - begin, begin, s + dur,
                                      overhead=_OV_T4)
                        rt_wait_task[e] = w
                        seen += 1
                    elif kind == 1 and dur > median_launch and min(
                            info.gpu[g].start for g in info.gpu_of_launch[e]) < s + dur:
                        # the GPU task began before the call returned (a pageable copy staged
                        # while it runs, a full launch queue): the call issued its work after
                        # a launch's usual cost; the rest of it is host time of its own
                        g_first = min(info.gpu[g].start for g in info.gpu_of_launch[e])
                        if any("Pageable" in names[kt.name[info.gpu[g].ev]] for g in info.gpu_of_launch[e]):
                            # a pageable copy starts once the host has staged its first chunk
                            d1 = min(max(g_first - s, 0.0), dur)
                        else:
                            d1 = min(median_launch, dur)
                        i = self.task(proc, nm, "launch", _CAT_CPU, d1, s, s + d1, overhead=_OV_T4)
                        rt_task[e] = i
                        rest = self.task(proc, f"{nm} (rest)", "cuda_runtime", _CAT_CPU, dur - d1, s + d1, s + dur)
                        rt_wait_task[e] = rest
                        seen += 1
                        self.bump("long_launch_calls_split")
                    else:
                        kname = "launch" if kind == 1 else "cuda_runtime"
                        i = self.task(proc, nm, kname, _CAT_CPU, dur, s, s + dur, overhead=_OV_T4)
                        rt_task[e] = i
                        if kind == 1:
                            seen += 1
                    if top >= 0:
                        op_first.setdefault(top, rt_task[e])
                        op_last[top] = rt_wait_task.get(e, rt_task[e])
                        src_end.append(self.mend[op_last[top]])
                        src_task.append(op_last[top])
                        src_thread.append(t_idx)
                    cur = s + dur
            # the thread's time after its last item is not part of the run

        # --- inter-thread waits (Lumos: significant gaps bridged by another thread's op)
        if len(info.threads) > 1 and src_end:
            o = np.argsort(src_end, kind="stable")
            se = np.asarray(src_end)[o]
            st = np.asarray(src_task)[o]
            sth = np.asarray(src_thread)[o]
            for i, a, bnd, t_idx in t1_gaps:
                if bnd - a < INTER_THREAD_GAP_US:
                    continue
                k = int(np.searchsorted(se, bnd, side="right")) - 1
                while k >= 0 and se[k] > a and sth[k] == t_idx:
                    k -= 1
                if k >= 0 and se[k] > a + _EPS:
                    self.edge(int(st[k]), i, DepKind.CPU_CPU)
                    # the gap now only holds the time after the other thread's op
                    self.dur_override[i] = (bnd - se[k]) * 1e-6
                    self.key[i] = float(se[k])
                    self.bump("inter_thread_edges")

        # --- GPU tasks
        gpu_task = [-1] * len(info.gpu)
        orphan = 0
        gap = _queued_gap_us(info, stream_tasks, kt)
        self.stats[f"stream_gap_us_rank{rt.rank}"] = round(gap, 3)
        for s_idx, lst in enumerate(stream_tasks):
            proc = gpu_proc[s_idx]
            for pos, gi in enumerate(lst):
                g = info.gpu[gi]
                e = g.ev
                if pos > 0 and gap > 0:
                    # a stream does not start a queued task the instant the previous one ends
                    prev = info.gpu[lst[pos - 1]].end
                    self.task(proc, "stream gap", "gpu_gap", _CAT_SYNC, gap, prev, prev + gap)
                kname = names[kt.name[e]]
                c = cat[e]
                gcat = "memcpy" if c == _MEMCPY else "memset" if c == _MEMSET else "kernel"
                op = g.inner_op
                op_name = names[kt.name[op]] if op >= 0 else ""
                kind, category = classify_gpu_task(gcat, kname, op_name, kt.args[e])
                params: dict[str, float] = {}
                if op >= 0:
                    shapes, types = shapes_of(op)
                    params = op_params(op_name, shapes, types, kind)
                flops = params.pop("flops", math.nan)
                a = kt.args[e]
                nbytes = float(a["bytes"]) if isinstance(a.get("bytes"), (int, float)) else math.nan
                if category == _CAT_COMM:
                    nel = a.get("In msg nelems")
                    if isinstance(nel, (int, float)):
                        dt = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4,
                              "Byte": 1, "Char": 1}.get(str(a.get("dtype", "")), 4)
                        params["msg_bytes"] = float(nel) * dt
                        nbytes = params["msg_bytes"]
                    world = a.get("Group size") or self.ts.world_size
                    params["world"] = float(world)
                if g.launch < 0:
                    orphan += 1
                    if pos == 0 and g.start > t0 + _EPS:
                        # issued before the trace began: the stream is busy from its first task on
                        self.task(proc, "issued before trace", "gpu_idle", _CAT_SYNC, g.start - t0, t0, g.start)
                params = {k: v for k, v in params.items() if k in PARAM_COLUMNS}
                gpu_task[gi] = self.task(proc, kname, kind, category, g.dur, g.start, g.end, group=g.group,
                                         flops=flops, nbytes=nbytes, params=params or None, ev=op)
                if g.launch >= 0 and g.launch in rt_task:
                    self.edge(rt_task[g.launch], gpu_task[gi], DepKind.CPU_GPU)
        if orphan:
            self.notes.append(f"rank {rt.rank}: {orphan} GPU tasks were launched before the trace began")
        self.bump("gpu_tasks", len(info.gpu))
        # --- GPU -> CPU (syncs, blocking copies)
        for e, targets in awaited.items():
            w = rt_wait_task.get(e)
            if w is None:
                continue
            for g in targets:
                self.edge(gpu_task[g], w, DepKind.GPU_CPU)
                self.bump("gpu_cpu_edges")
        # --- GPU -> GPU across streams (event record -> stream wait)
        wait_src: dict[int, list[int]] = {}
        for src, dst, _, how in waits:
            if info.gpu[src].end <= info.gpu[dst].start + 0.5 and info.gpu[src].stream != info.gpu[dst].stream:
                self.edge(gpu_task[src], gpu_task[dst], DepKind.GPU_GPU)
                wait_src.setdefault(dst, []).append(src)
                self.bump(f"event_edges_{how}")
            else:
                self.bump("event_waits_dropped")
        # --- GPU -> GPU for the device itself: a task that started well after everything it
        # depends on was done, right when a task of another stream ended, was held back by it
        # (a kernel that fills every SM, or a busy copy engine)
        for src, dst in _resource_waits(info, stream_tasks, wait_src, kt):
            self.edge(gpu_task[src], gpu_task[dst], DepKind.GPU_GPU)
            self.bump("gpu_resource_edges")
        # --- DATA from the execution trace (top-level ops on different threads)
        if rt.et is not None and et_map:
            self._data_edges(info, rt.et, et_map, op_first, op_last)
        # --- steps (a trace without iteration markers is one step: the whole trace)
        if not step_list:
            self.steps.append({"rank": r, "trace_rank": rt.rank, "name": "whole trace", "start_task": -1,
                               "end_task": -1, "measured_s": math.nan, "measured_start_s": math.nan})
        for k, (sname, s0, s1, _) in enumerate(step_list):
            tk = step_tasks[k]
            if "start" in tk and "end" in tk:
                self.steps.append({"rank": r, "trace_rank": rt.rank, "name": sname, "start_task": tk["start"],
                                   "end_task": tk["end"], "measured_s": (s1 - s0) * 1e-6,
                                   "measured_start_s": (s0 - t0) * 1e-6})

    def _data_edges(self, info: _RankInfo, et: ExecutionTrace, et_map: dict[int, int],
                    op_first: dict[int, int], op_last: dict[int, int]) -> None:
        top_of_node = np.full(et.n_nodes, -1, dtype=np.int64)
        node_pos = {int(nid): i for i, nid in enumerate(et.id.tolist())}
        for ev, n in et_map.items():
            top = info.top_of.get(ev)
            if top is not None:
                top_of_node[n] = top
        parent_pos = [node_pos.get(int(p), -1) for p in et.parent.tolist()]
        for i in range(et.n_nodes):  # unmatched nodes inherit their parent's op
            if top_of_node[i] < 0 and parent_pos[i] >= 0:
                top_of_node[i] = top_of_node[parent_pos[i]]
        producer: dict[int, int] = {}
        pairs: set[tuple[int, int]] = set()
        thread = info.thread_of_event
        for i in range(et.n_nodes):
            top = int(top_of_node[i])
            if top < 0:
                continue
            for tid in et.inputs_of(i).tolist():
                p = producer.get(tid)
                if p is not None and p != top and thread.get(p) != thread.get(top):
                    pairs.add((p, top))
            for tid in et.outputs_of(i).tolist():
                producer[tid] = top
        for p, c in pairs:
            src = op_last.get(p)
            dst = op_first.get(c)
            if src is not None and dst is not None:
                self.edge(src, dst, DepKind.DATA)
                self.bump("data_edges")

    # ------------------------------------------------------------------ finish
    def finish(self, infos: list[_RankInfo], t0: float, launch_fraction: float) -> ReplayGraph:
        b = self.b
        key = np.asarray(self.key)
        if self.edges:
            e = np.asarray(self.edges, dtype=np.int64)
            ok = key[e[:, 0]] <= key[e[:, 1]] + _EPS
            dropped = int((~ok).sum())
            if dropped:
                self.bump("edges_against_measured_order_dropped", dropped)
            e = np.unique(e[ok], axis=0)
            for src, dst, kind in e.tolist():
                b.edge(src, dst, DepKind(kind))
        b.meta["source"] = self.ts.source
        g = b.build()
        for i, d in self.dur_override.items():
            g.duration[i] = d
        for k in DepKind:
            self.stats[f"edges_{k.name}"] = int((g.edge_kind == k).sum())
        mstart = (key - t0) * 1e-6
        mend = (np.asarray(self.mend) - t0) * 1e-6
        steps = pd.DataFrame(self.steps, columns=["rank", "trace_rank", "name", "start_task", "end_task",
                                                  "measured_s", "measured_start_s"])
        for row in steps.index[steps["start_task"] < 0]:  # whole-trace steps: the rank's extent
            on = g.rank == steps.at[row, "rank"]
            steps.at[row, "measured_start_s"] = float(mstart[on].min())
            steps.at[row, "measured_s"] = float(mend[on].max() - mstart[on].min())
        return ReplayGraph(graph=g, measured_start=mstart, measured_end=np.maximum(mend, mstart), steps=steps,
                           trace_ranks=[i.trace.rank for i in infos], world_size=self.ts.world_size,
                           launch_fraction=launch_fraction, t0_us=t0, notes=self.notes, stats=self.stats,
                           task_event=np.asarray(self.task_ev, dtype=np.int64))


def _launch_stats(infos: list[_RankInfo]) -> tuple[float, float]:
    """(median launch-call duration µs, launch fraction): where an idle stream's kernel starts
    inside (or after) its launch call, as a fraction of the call's duration (median)."""
    fracs: list[float] = []
    durs: list[float] = []
    for info in infos:
        kt = info.trace.kineto
        prev_end: dict[int, float] = {}
        for g in info.gpu:
            if g.launch >= 0:
                d = float(kt.dur[g.launch])
                durs.append(d)
                if prev_end.get(g.stream, -np.inf) < g.start - 2.0 and d > 0:
                    fracs.append((g.start - float(kt.ts[g.launch])) / d)
            prev_end[g.stream] = g.end
    med_launch = float(np.median(durs)) if durs else 5.0
    lf = float(np.clip(np.median(fracs), 0.5, 2.0)) if len(fracs) >= 5 else 1.0
    return med_launch, lf


def build_graph(trace_set: TraceSet) -> ReplayGraph:
    """Build the replay graph of every rank of ``trace_set`` (see the module docstring)."""
    with no_gc():
        return _build_graph(trace_set)


def _build_graph(trace_set: TraceSet) -> ReplayGraph:
    infos = [_analyse_rank(i, rt) for i, rt in enumerate(trace_set.ranks)]
    t0 = math.inf
    for info in infos:
        kt = info.trace.kineto
        sel = kt.mask(EventCat.CPU_OP, EventCat.USER_ANNOTATION, EventCat.RUNTIME, EventCat.KERNEL,
                      EventCat.MEMCPY, EventCat.MEMSET)
        if sel.any():
            t0 = min(t0, float(kt.ts[sel].min()))
    builder = _Builder(trace_set)
    n_groups = _match_collectives(infos, builder.notes)
    builder.stats["collective_groups"] = n_groups
    med_launch, lf = _launch_stats(infos)
    for info in infos:
        builder.rank(info, t0, med_launch)
    return builder.finish(infos, t0, lf)
