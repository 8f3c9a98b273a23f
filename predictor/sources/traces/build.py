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
  inter-thread dependency.
* DATA: from the execution trace's tensor ids, between top-level ops on different threads.
* Collectives: NCCL kernels are matched across ranks by process group (or stream) and order
  into collective groups, which the simulator ends together; every member gets the group's
  *minimum* measured duration (the last rank to arrive waits least, so its kernel time is the
  closest to the transfer itself). A single-rank trace of a multi-rank job has no partners:
  its collectives keep their measured durations here, waiting included, and the replay prices them
  from their message size instead (:mod:`~predictor.sources.traces.collectives`).

Every edge respects the measured order of the real run (source placed no later than target),
so the graph is acyclic; durations are the measured ones except for waits, which the
simulator recomputes. Nothing of the measured start times reaches the simulator except, per
CPU thread, the time its first event starts after the trace begins (the ranks' skew).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from predictor.graph import PARAM_COLUMNS, Category, DepKind, ExecutionGraph, GraphBuilder, Overhead, ProcKind
from predictor.sources.traces.cpu_tasks import CpuTasks, cut_cpu_threads
from predictor.sources.traces.dependencies import (
    RuntimeCalls,
    classify_runtime_calls,
    data_dependencies,
    inter_thread_waits,
    match_collectives,
    resource_waits,
)
from predictor.sources.traces.et import JsonLists
from predictor.sources.traces.json_io import no_gc
from predictor.sources.traces.kineto import EventCat
from predictor.sources.traces.load import TraceSet
from predictor.sources.traces.ops import classify_gpu_task, op_params
from predictor.sources.traces.rank_events import (
    EPS_US,
    RankEvents,
    StreamOrder,
    analyse_rank,
    join_et,
    launch_stats,
    queued_gap_us,
    step_annotations,
)

__all__ = ["ReplayGraph", "TraceGraphBuilder", "build_graph"]

_MEMCPY = int(EventCat.MEMCPY)
_MEMSET = int(EventCat.MEMSET)
#: bytes per element of the dtypes NCCL kernels name in Kineto's ``dtype``
_NCCL_DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4, "Byte": 1, "Char": 1}


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
    #: per task, the runtime call (Kineto event index) of a runtime-call task or that launched a GPU task,
    #: and the top-level op a CPU op segment or runtime call lies in (-1: none)
    task_call: np.ndarray | None = None
    task_op: np.ndarray | None = None
    #: per processor, (pid, tid) of a CPU thread or (device, stream) of a GPU stream, as in the trace
    proc_ids: list[tuple[int, int]] = field(default_factory=list)
    #: the GPU names the traces record (Kineto's ``deviceProperties``), every rank's in rank order
    devices: list[str] = field(default_factory=list)


class TraceGraphBuilder(GraphBuilder):
    """A :class:`~predictor.graph.GraphBuilder` that also records where each task lay in the measured
    run, and keeps a dependency only if it respects that order (so the graph is acyclic).

    ``key`` / ``mend``: measured start / end of each task (µs); ``task_ev``: the Kineto event a task
    came from (-1: none, see :attr:`ReplayGraph.task_event`); ``dur_override``: task -> seconds, set
    after the task was appended; ``stats``: counts of how the dependencies were found.
    """

    def __init__(self, trace_set: TraceSet) -> None:
        super().__init__()
        self.trace_set = trace_set
        self.key: list[float] = []
        self.mend: list[float] = []
        self.task_ev: list[int] = []
        self.notes: list[str] = list(trace_set.notes)
        self.stats: dict[str, int] = {}
        self.steps: list[dict] = []
        self.dur_override: dict[int, float] = {}
        self.call_of: dict[int, int] = {}
        self.op_of: dict[int, int] = {}
        self.proc_ids: dict[int, tuple[int, int]] = {}
        # pending dependencies as three flat lists: a list of 6k tuples took 4 ms to become an array
        self._pending_src: list[int] = []
        self._pending_dst: list[int] = []
        self._pending_kind: list[int] = []

    def bump(self, name: str, n: int = 1) -> None:
        """Count ``n`` more of ``name`` in :attr:`stats`."""
        self.stats[name] = self.stats.get(name, 0) + n

    def dependency(self, src: int, dst: int, kind: DepKind) -> None:
        """``dst`` waits for ``src``; checked against the measured order in :meth:`finish`."""
        if src >= 0 and dst >= 0 and src != dst:
            self._pending_src.append(src)
            self._pending_dst.append(dst)
            self._pending_kind.append(int(kind))

    def dependencies(self, src: list[int], dst: list[int], kind: DepKind) -> None:
        """``dst[i]`` waits for ``src[i]``, every pair distinct and non-negative, as :meth:`dependency` for each."""
        self._pending_src.extend(src)
        self._pending_dst.extend(dst)
        self._pending_kind.extend([int(kind)] * len(src))

    def finish(self, infos: list[RankEvents], t0: float, launch_fraction: float) -> ReplayGraph:
        """The :class:`ReplayGraph`: dependencies against the measured order dropped, duplicates merged."""
        key = np.fromiter(self.key, dtype=np.float64, count=len(self.key))
        if self._pending_src:
            e = np.stack([np.fromiter(c, dtype=np.int64, count=len(c))
                          for c in (self._pending_src, self._pending_dst, self._pending_kind)], axis=1)
            ok = key[e[:, 0]] <= key[e[:, 1]] + EPS_US
            dropped = int((~ok).sum())
            if dropped:
                self.bump("edges_against_measured_order_dropped", dropped)
            e = e[ok]
            # (src, dst, kind) rows unique and sorted as one integer each: 5x faster than np.unique(axis=0)
            n = max(len(self.key), 1)
            k = np.unique((e[:, 0] * n + e[:, 1]) * 8 + e[:, 2])
            self.edge_arrays(k // 8 // n, k // 8 % n, k % 8)
        self.meta["source"] = self.trace_set.source
        g = self.build()
        for i, d in self.dur_override.items():
            g.duration[i] = d
        for k in DepKind:
            self.stats[f"edges_{k.name}"] = int((g.edge_kind == k).sum())
        mstart = (key - t0) * 1e-6
        mend = (np.fromiter(self.mend, dtype=np.float64, count=len(self.mend)) - t0) * 1e-6
        task_ev = np.fromiter(self.task_ev, dtype=np.int64, count=len(self.task_ev))
        task_call = np.full(g.n_tasks, -1, dtype=np.int64)
        task_call[list(self.call_of)] = list(self.call_of.values())
        task_op = np.where(g.is_gpu(), -1, task_ev)
        task_op[list(self.op_of)] = list(self.op_of.values())
        steps = pd.DataFrame(self.steps, columns=["rank", "trace_rank", "name", "start_task", "end_task",
                                                  "measured_s", "measured_start_s"])
        for row in steps.index[steps["start_task"] < 0]:  # whole-trace steps: the rank's extent
            on = g.rank == steps.at[row, "rank"]
            steps.at[row, "measured_start_s"] = float(mstart[on].min())
            steps.at[row, "measured_s"] = float(mend[on].max() - mstart[on].min())
        return ReplayGraph(graph=g, measured_start=mstart, measured_end=np.maximum(mend, mstart), steps=steps,
                           trace_ranks=[i.trace.rank for i in infos], world_size=self.trace_set.world_size,
                           launch_fraction=launch_fraction, t0_us=t0, notes=self.notes, stats=self.stats,
                           task_event=task_ev, task_call=task_call, task_op=task_op,
                           proc_ids=[self.proc_ids.get(p, (-1, p)) for p in range(g.n_procs)],
                           devices=[str(d) for i in infos for d in i.trace.kineto.meta.get("devices", [])])


def build_graph(trace_set: TraceSet) -> ReplayGraph:
    """Build the replay graph of every rank of ``trace_set`` (see the module docstring)."""
    with no_gc():
        return _build_graph(trace_set)


def _build_graph(trace_set: TraceSet) -> ReplayGraph:
    infos = [analyse_rank(i, rt) for i, rt in enumerate(trace_set.ranks)]
    t0 = math.inf
    for info in infos:
        kt = info.trace.kineto
        sel = kt.mask(EventCat.CPU_OP, EventCat.USER_ANNOTATION, EventCat.RUNTIME, EventCat.KERNEL,
                      EventCat.MEMCPY, EventCat.MEMSET)
        if sel.any():
            t0 = min(t0, float(kt.ts[sel].min()))
    b = TraceGraphBuilder(trace_set)
    n_groups = match_collectives(infos, b.notes)
    b.stats["collective_groups"] = n_groups
    med_launch, lf = launch_stats(infos)
    for info in infos:
        _add_rank(b, info, t0, med_launch)
    return b.finish(infos, t0, lf)


def _add_rank(b: TraceGraphBuilder, info: RankEvents, t0: float, median_launch: float) -> None:
    """The tasks and dependencies of one rank, and its step rows."""
    rt = info.trace
    r = info.index
    et_map = join_et(rt.kineto, rt.et, b.notes) if rt.et is not None else {}
    order = StreamOrder(info)
    calls = classify_runtime_calls(info, order, b.bump)
    cpu_proc = [b.processor(r, ProcKind.CPU_THREAD, f"cpu tid {tid}" if pid == info.threads[0][0]
                            else f"cpu pid {pid} tid {tid}") for pid, tid in info.threads]
    gpu_proc = [b.processor(r, ProcKind.GPU_STREAM, f"gpu{dev} stream {st}") for dev, st in info.streams]
    for proc, ids in zip([*cpu_proc, *gpu_proc], [*info.threads, *info.streams], strict=True):
        b.proc_ids[proc] = ids
    step_list = step_annotations(rt.kineto)
    cpu = cut_cpu_threads(b, info, calls, cpu_proc, step_list, t0, median_launch)
    for calls_tasks in (cpu.rt_task, cpu.rt_wait_task):
        for e, i in calls_tasks.items():
            b.call_of[i] = e
            b.op_of[i] = info.top_of.get(e, -1)
    if len(info.threads) > 1 and cpu.src_end:  # Lumos: significant gaps bridged by another thread's op
        for src, gap, src_end, gap_end in inter_thread_waits(cpu.t1_gaps, cpu.src_end, cpu.src_task,
                                                              cpu.src_thread):
            b.dependency(src, gap, DepKind.CPU_CPU)
            b.dur_override[gap] = (gap_end - src_end) * 1e-6  # the gap keeps only the time after that op
            b.key[gap] = src_end
            b.bump("inter_thread_edges")
    gpu_task = _add_gpu_tasks(b, info, order, gpu_proc, cpu.rt_task, et_map, t0)
    _add_gpu_dependencies(b, info, order, calls, cpu, gpu_task)
    if rt.et is not None and et_map:  # DATA from the execution trace (top-level ops on different threads)
        for p, c in data_dependencies(info, rt.et, et_map):
            src, dst = cpu.op_last.get(p), cpu.op_first.get(c)
            if src is not None and dst is not None:
                b.dependency(src, dst, DepKind.DATA)
                b.bump("data_edges")
    # steps (a trace without iteration markers is one step: the whole trace)
    if not step_list:
        b.steps.append({"rank": r, "trace_rank": rt.rank, "name": "whole trace", "start_task": -1,
                        "end_task": -1, "measured_s": math.nan, "measured_start_s": math.nan})
    for k, (sname, s0, s1, _) in enumerate(step_list):
        tk = cpu.step_tasks[k]
        if "start" in tk and "end" in tk:
            b.steps.append({"rank": r, "trace_rank": rt.rank, "name": sname, "start_task": tk["start"],
                            "end_task": tk["end"], "measured_s": (s1 - s0) * 1e-6,
                            "measured_start_s": (s0 - t0) * 1e-6})


def _op_kernel_params(info: RankEvents, et_map: dict[int, int], e: int, op_name: str, kind: str,
                      memo: dict[tuple, dict[str, float]]) -> dict[str, float]:
    """:func:`op_params` of cpu_op event ``e`` from its input shapes and types: Kineto's ``Input Dims``, else
    the execution trace's (``memo``: the parameters per op name, kind and ET shape text: the 2805 ops of
    ResNet-50 have 10x fewer distinct inputs)."""
    rt = info.trace
    a = rt.kineto.args[e]
    dims = a.get("Input Dims")
    if isinstance(dims, list) and any(isinstance(d, list) and d for d in dims):
        return op_params(op_name, dims, a.get("Input type"), kind)
    n = et_map.get(e)
    if n is None or rt.et is None:
        return op_params(op_name, [], None, kind)
    shapes, types = rt.et.input_shapes, rt.et.input_types[n]
    if not isinstance(shapes, JsonLists):
        return op_params(op_name, shapes[n], types, kind)
    key = (op_name, kind, shapes.text(n), id(types))  # equal type texts share one list while the trace lives
    known = memo.get(key)
    if known is None:
        known = memo[key] = op_params(op_name, shapes[n], types, kind)
    return known


def _add_gpu_tasks(b: TraceGraphBuilder, info: RankEvents, order: StreamOrder, gpu_proc: list[int],
                   rt_task: dict[int, int], et_map: dict[int, int], t0: float) -> list[int]:
    """Kernels, copies and sets in stream order with stream gaps between them; returns each GPU task's index.
    A stream's tasks are gathered as rows and appended in one :meth:`~predictor.graph.GraphBuilder.append_tasks`."""
    rt = info.trace
    kt = rt.kineto
    names = kt.names
    gpus = info.gpu
    world = b.trace_set.world_size
    gpu_task = [-1] * len(gpus)
    op_memo: dict[tuple[int, str], dict[str, float]] = {}
    text_memo: dict[tuple, dict[str, float]] = {}
    split_memo: dict[tuple[int, str], tuple[float, dict[str, float] | None]] = {}  # (op, kind) -> (FLOPs, parameters)
    # id of an op's parameters (equal input shapes share one dict) -> (that dict, kept alive, FLOPs, parameters)
    split_of: dict[int, tuple[dict[str, float], float, dict[str, float] | None]] = {}
    no_params: dict[str, float] = {}
    # (category, kernel name id, op name id) -> (kind, Category) for all but collectives, whose kind reads their args
    class_memo: dict[tuple[int, int, int], tuple[str, Category]] = {}
    name_of, cat_of = kt.name.tolist(), kt.cat.tolist()  # Python lists: numpy scalars per task were slower
    args = kt.args
    orphan = 0
    gap = queued_gap_us(info, order.stream_tasks, kt)
    b.stats[f"stream_gap_us_rank{rt.rank}"] = round(gap, 3)
    sync, comm, none, nan = Category.SYNC, Category.COMMUNICATION, Overhead.NONE, math.nan
    call_of = b.call_of
    dep_src: list[int] = []  # CPU_GPU: the launching runtime call's task -> the GPU task
    dep_dst: list[int] = []
    step = 2 if gap > 0 else 1  # a stream does not start a queued task the instant the previous one ends: a gap task
    for s_idx, lst in enumerate(order.stream_tasks):
        if not lst:
            continue
        proc = gpu_proc[s_idx]
        g = gpus[lst[0]]
        # issued before the trace began: the stream is busy from its first task on
        lead = g.launch < 0 and g.start > t0 + EPS_US
        base = b.n_tasks + lead
        # one row per GPU task: name, kind, category, duration (s), FLOPs, bytes, group, parameters, measured start
        # and end (µs), event; transposed into columns once per stream, the gap tasks interleaved there
        rows: list[tuple] = []
        add = rows.append
        for pos, gi in enumerate(lst):
            g = gpus[gi]
            e = g.ev
            kid = name_of[e]
            kname = names[kid]
            c = cat_of[e]
            op = g.inner_op
            oid = name_of[op] if op >= 0 else -1
            a = args[e]
            ckey = (c, kid, oid)
            known_class = class_memo.get(ckey)
            if known_class is None:
                gcat = "memcpy" if c == _MEMCPY else "memset" if c == _MEMSET else "kernel"
                kind, category = classify_gpu_task(gcat, kname, names[oid] if op >= 0 else "", a)
                if category != comm:
                    class_memo[ckey] = (kind, category)
            else:
                kind, category = known_class
            if category == comm:  # a collective's parameters add its message size and world from its own args
                params: dict[str, float] | None = {}
                if op >= 0:
                    known = op_memo.get((op, kind))
                    if known is None:
                        known = op_memo[(op, kind)] = _op_kernel_params(info, et_map, op, names[oid], kind,
                                                                         text_memo)
                    params = dict(known)
                flops = params.pop("flops", nan)
                nbytes = _gpu_task_bytes(a, category, params, world)
                params = {k: v for k, v in params.items() if k in PARAM_COLUMNS} or None
            else:  # the op's parameters alone: shared, never changed (3774 kernels of 2721 ops in ResNet-50)
                split = split_memo.get((op, kind))
                if split is None:
                    known = _op_kernel_params(info, et_map, op, names[oid], kind, text_memo) if op >= 0 else no_params
                    both = split_of.get(id(known))
                    if both is None:
                        both = split_of[id(known)] = (known, known.get("flops", nan),
                                                      {k: v for k, v in known.items() if k in PARAM_COLUMNS} or None)
                    split = split_memo[(op, kind)] = both[1:]
                flops, params = split
                nb = a.get("bytes")  # Kineto's bytes, as _gpu_task_bytes reads them
                nbytes = float(nb) if isinstance(nb, (int, float)) else nan
            launch = g.launch
            if launch < 0:
                orphan += 1
            i = base + pos * step
            gpu_task[gi] = i
            d = g.dur
            add((kname, kind, category, (0.0 if d < 0.0 else d) * 1e-6, flops, nbytes, g.group, params, g.start,
                 g.end, op))
            if launch >= 0:
                call_of[i] = launch
                src = rt_task.get(launch)
                if src is not None:
                    dep_src.append(src)
                    dep_dst.append(i)
        cols: list = list(zip(*rows, strict=True))
        if step == 2:
            cols = _with_stream_gaps(cols, gap)
        if lead:
            g = gpus[lst[0]]
            cols = [[v, *c] for v, c in zip(("issued before trace", "gpu_idle", sync, (g.start - t0) * 1e-6, nan, nan,
                                              -1, None, t0, g.start, -1), cols, strict=True)]
        t_name, t_kind, t_cat, t_dur, t_flops, t_bytes, t_group, t_params, keys, mends, evs = cols
        b.append_tasks(proc, t_name, t_kind, t_cat, t_dur, [none] * len(t_name), flops=t_flops, nbytes=t_bytes,
                       groups=t_group, params=t_params)
        b.key.extend(keys)
        b.mend.extend(mends)
        b.task_ev.extend(evs)
    b.dependencies(dep_src, dep_dst, DepKind.CPU_GPU)
    if orphan:
        b.notes.append(f"rank {rt.rank}: {orphan} GPU tasks were launched before the trace began")
    b.bump("gpu_tasks", len(gpus))
    return gpu_task


def _with_stream_gaps(cols: list, gap: float) -> list[list]:
    """Columns of a stream's task rows (as gathered in :func:`_add_gpu_tasks`) with a ``stream gap`` task of ``gap``
    µs between every two tasks, lying from the previous task's measured end on."""
    n = len(cols[0]) - 1
    ends = list(cols[9][:-1])
    gaps = (["stream gap"] * n, ["gpu_gap"] * n, [Category.SYNC] * n, [gap * 1e-6] * n, [math.nan] * n,
            [math.nan] * n, [-1] * n, [None] * n, ends, [x + gap for x in ends], [-1] * n)
    out = []
    for tasks, between in zip(cols, gaps, strict=True):
        both = [None] * (2 * n + 1)
        both[0::2] = tasks
        both[1::2] = between
        out.append(both)
    return out


def _gpu_task_bytes(a: dict, category: Category, params: dict[str, float], world_size: int) -> float:
    """Bytes a GPU task moves (Kineto's ``bytes``; a collective's message); a collective's
    ``msg_bytes`` and ``world`` go into ``params``."""
    nbytes = float(a["bytes"]) if isinstance(a.get("bytes"), (int, float)) else math.nan
    if category == Category.COMMUNICATION:
        nel = a.get("In msg nelems")
        if isinstance(nel, (int, float)):
            params["msg_bytes"] = float(nel) * _NCCL_DTYPE_BYTES.get(str(a.get("dtype", "")), 4)
            nbytes = params["msg_bytes"]
        params["world"] = float(a.get("Group size") or world_size)
    return nbytes


def _add_gpu_dependencies(b: TraceGraphBuilder, info: RankEvents, order: StreamOrder, calls: RuntimeCalls,
                          cpu: CpuTasks, gpu_task: list[int]) -> None:
    """GPU->CPU (syncs, blocking copies), GPU->GPU across streams (event record -> stream wait) and
    GPU->GPU for the device itself (a task held back by another stream's)."""
    for e, targets in calls.awaited.items():
        w = cpu.rt_wait_task.get(e)
        if w is None:
            continue
        for g in targets:
            b.dependency(gpu_task[g], w, DepKind.GPU_CPU)
            b.bump("gpu_cpu_edges")
    wait_src: dict[int, list[int]] = {}
    for src, dst, _, how in calls.waits:
        # a wait named by Kineto's cuda_sync record holds; an inferred one must fit the measured run
        fits = how == "cuda_sync" or info.overlapping or info.gpu[src].end <= info.gpu[dst].start + 0.5
        if fits and info.gpu[src].stream != info.gpu[dst].stream:
            b.dependency(gpu_task[src], gpu_task[dst], DepKind.GPU_GPU)
            wait_src.setdefault(dst, []).append(src)
            b.bump(f"event_edges_{how}")
        else:
            b.bump("event_waits_dropped")
    # a task that started well after everything it depends on was done, right when a task of another
    # stream ended, was held back by it (a kernel that fills every SM, or a busy copy engine)
    for src, dst in resource_waits(info, order.stream_tasks, wait_src, info.trace.kineto):
        b.dependency(gpu_task[src], gpu_task[dst], DepKind.GPU_GPU)
        b.bump("gpu_resource_edges")
