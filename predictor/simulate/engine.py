"""The critical-path simulator: one discrete-event pass over an :class:`ExecutionGraph`.

This is Algorithm 1 of the multi-GPU paper of Lin et al. (2024), generalised to the
dependency kinds of Lumos:

* every processor (CPU thread, GPU stream) runs its tasks in array order, one at a time
  (the per-rank CPU clock and the per-stream fronts ``Tcp``/``Tcm`` of the paper);
* a task starts at ``max(processor front, ready time of every predecessor)``; the ready time
  of a ``CPU_GPU`` (launch) edge is ``start + launch_fraction * duration`` of the launching
  call — the ``cpu_time + T4/2`` of the paper — and of every other edge the predecessor's end;
* the members of one collective group (one per rank) end together at
  ``max(member start) + max(member duration)``: the inter-rank synchronisation at the end of
  a collective; intra-rank synchronisation is the ``GPU_GPU`` edge a builder adds from a
  collective to the first op that consumes its output (or from the compute stream to the
  collective that consumes its output).

CPU overheads (types T1..T5 of Lin et al. 2022) are CPU tasks whose durations the timing
supplies; the simulator itself has no notion of them. Durations come from ``timing``: the
measured column (replay), a kernel model (what-if), or any array.

The inner loop runs in numba over CSR arrays: no per-task Python objects.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numba
import numpy as np
import pandas as pd

from predictor.graph import Category, DepKind, ExecutionGraph, GraphError, ProcKind

__all__ = ["Timing", "MeasuredTiming", "Timeline", "simulate", "Breakdown", "union_length"]


@runtime_checkable
class Timing(Protocol):
    """Decides the duration of every task of a graph.

    Contract: ``durations(graph)`` returns a float64 array of length ``graph.n_tasks`` in
    seconds, finite and non-negative. It must not modify the graph.
    """

    def durations(self, graph: ExecutionGraph) -> np.ndarray: ...


class MeasuredTiming:
    """Replay: every task keeps its measured duration (unknown durations become ``fill_s``)."""

    def __init__(self, fill_s: float = 0.0) -> None:
        self.fill_s = fill_s

    def durations(self, graph: ExecutionGraph) -> np.ndarray:
        d = graph.duration.copy()
        d[~np.isfinite(d)] = self.fill_s
        return d


# ----------------------------------------------------------------------------- core
@numba.njit(cache=True)
def _simulate_core(
    dur: np.ndarray,
    succ_ptr: np.ndarray,
    succ_idx: np.ndarray,
    succ_launch: np.ndarray,
    next_on_proc: np.ndarray,
    indeg: np.ndarray,
    group: np.ndarray,
    grp_ptr: np.ndarray,
    grp_members: np.ndarray,
    launch_fraction: float,
):
    n = dur.shape[0]
    n_groups = grp_ptr.shape[0] - 1
    start = np.zeros(n)
    end = np.zeros(n)
    est = np.zeros(n)
    binding = np.full(n, -1, dtype=np.int64)
    remaining = indeg.copy()
    grp_waiting = np.empty(n_groups, dtype=np.int64)
    for g in range(n_groups):
        grp_waiting[g] = grp_ptr[g + 1] - grp_ptr[g]
    grp_maxstart = np.full(n_groups, -1.0)
    grp_dur = np.zeros(n_groups)
    grp_last = np.full(n_groups, -1, dtype=np.int64)

    stack = np.empty(n, dtype=np.int64)
    top = 0
    for i in range(n):
        if remaining[i] == 0:
            stack[top] = i
            top += 1
    done = 0
    # tasks whose end is known and whose successors must be released
    release = np.empty(n, dtype=np.int64)
    while top > 0:
        top -= 1
        i = stack[top]
        s = est[i]
        start[i] = s
        g = group[i]
        n_release = 0
        if g < 0:
            end[i] = s + dur[i]
            release[0] = i
            n_release = 1
        else:
            if s > grp_maxstart[g]:
                grp_maxstart[g] = s
                grp_last[g] = i
            if dur[i] > grp_dur[g]:
                grp_dur[g] = dur[i]
            grp_waiting[g] -= 1
            if grp_waiting[g] == 0:
                e = grp_maxstart[g] + grp_dur[g]
                for k in range(grp_ptr[g], grp_ptr[g + 1]):
                    m = grp_members[k]
                    end[m] = e
                    release[n_release] = m
                    n_release += 1
        for r in range(n_release):
            t = release[r]
            done += 1
            for k in range(succ_ptr[t], succ_ptr[t + 1]):
                j = succ_idx[k]
                ready = start[t] + launch_fraction * dur[t] if succ_launch[k] else end[t]
                if ready > est[j] or (ready == est[j] and binding[j] < 0):
                    est[j] = ready
                    binding[j] = t
                remaining[j] -= 1
                if remaining[j] == 0:
                    stack[top] = j
                    top += 1
            j = next_on_proc[t]
            if j >= 0:
                ready = end[t]
                if ready > est[j] or (ready == est[j] and binding[j] < 0):
                    est[j] = ready
                    binding[j] = t
                remaining[j] -= 1
                if remaining[j] == 0:
                    stack[top] = j
                    top += 1
    return start, end, binding, grp_last, done


@dataclass
class _Topology:
    """CSR arrays derived once per graph structure (reused when only durations change)."""

    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    succ_launch: np.ndarray
    next_on_proc: np.ndarray
    indeg: np.ndarray
    grp_ptr: np.ndarray
    grp_members: np.ndarray


def _topology(graph: ExecutionGraph) -> _Topology:
    cached = graph.meta.get("_topology")
    if cached is not None and cached[0] == (graph.n_tasks, graph.n_edges):
        return cached[1]
    n = graph.n_tasks
    src = graph.edge_src.astype(np.int64)
    dst = graph.edge_dst.astype(np.int64)
    order = np.argsort(src, kind="stable")
    succ_idx = dst[order]
    succ_launch = (graph.edge_kind[order] == DepKind.CPU_GPU).astype(np.bool_)
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])

    by_proc = np.argsort(graph.proc, kind="stable")
    next_on_proc = np.full(n, -1, dtype=np.int64)
    if n > 1:
        same = graph.proc[by_proc[:-1]] == graph.proc[by_proc[1:]]
        next_on_proc[by_proc[:-1][same]] = by_proc[1:][same]
    indeg = np.bincount(dst, minlength=n).astype(np.int64)
    has_prev = np.zeros(n, dtype=np.int64)
    has_prev[next_on_proc[next_on_proc >= 0]] = 1
    indeg += has_prev

    grouped = np.flatnonzero(graph.group >= 0)
    n_groups = int(graph.group.max()) + 1 if grouped.size else 0
    gorder = grouped[np.argsort(graph.group[grouped], kind="stable")]
    grp_ptr = np.zeros(n_groups + 1, dtype=np.int64)
    if n_groups:
        np.cumsum(np.bincount(graph.group[grouped], minlength=n_groups), out=grp_ptr[1:])
    topo = _Topology(succ_ptr, succ_idx, succ_launch, next_on_proc, indeg, grp_ptr, gorder.astype(np.int64))
    graph.meta["_topology"] = ((graph.n_tasks, graph.n_edges), topo)
    return topo


# ----------------------------------------------------------------------------- results
def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length (seconds) of the union of intervals ``[starts[i], ends[i])``."""
    if starts.size == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = np.maximum.accumulate(ends[order])
    # a new segment begins where a start lies beyond every earlier end
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    seg_start = s[new]
    seg_end_idx = np.append(np.flatnonzero(new)[1:] - 1, s.size - 1)
    return float(np.sum(e[seg_end_idx] - seg_start))


@dataclass(frozen=True)
class Breakdown:
    """Lumos Fig. 5 decomposition of one rank's iteration, seconds.

    ``exposed_compute + exposed_communication + overlap + idle == total``.
    """

    total: float
    exposed_compute: float
    exposed_communication: float
    overlap: float
    idle: float

    def as_dict(self) -> dict[str, float]:
        return {
            "total_s": self.total,
            "exposed_compute_s": self.exposed_compute,
            "exposed_communication_s": self.exposed_communication,
            "overlap_s": self.overlap,
            "idle_s": self.idle,
        }


@dataclass
class Timeline:
    """The simulated run: start and end of every task, seconds from the iteration start."""

    graph: ExecutionGraph
    start: np.ndarray
    end: np.ndarray
    duration: np.ndarray
    binding: np.ndarray  # predecessor that decided each task's start (-1: none)
    group_last: np.ndarray  # per collective group: the member that arrived last

    # ------------------------------------------------------------------ totals
    @property
    def per_rank_s(self) -> np.ndarray:
        """Iteration time of each rank (its last task's end), seconds."""
        out = np.zeros(self.graph.n_ranks)
        if self.graph.n_tasks:
            np.maximum.at(out, self.graph.rank, self.end)
        return out

    @property
    def iteration_s(self) -> float:
        """Predicted iteration time: the maximum over ranks, seconds."""
        return float(self.end.max()) if self.end.size else 0.0

    def loop_pace_s(self) -> float:
        """Seconds per step of a loop repeating this one-device step with no host-device synchronisation.

        The host queues the next step's launches while the device still runs this one's kernels, so the
        loop runs at its bottleneck's pace: the larger of the host's span (its first task's start to its
        last task's end, over the CPU threads) and the busiest stream's kernel time. ``iteration_s`` is one
        step's latency from an idle device, which a host-device overlap near the crossover over-states.
        A graph without GPU streams (a host-mode CPU step) or with several ranks (pipeline bubbles and
        collective waits recur in every step, so the busiest stream is not the pace) has ``iteration_s``.
        """
        g = self.graph
        gpu = g.proc_kind[g.proc] == ProcKind.GPU_STREAM
        if not gpu.any() or g.n_ranks > 1:
            return self.iteration_s
        return max(self.host_span_s(), self.kernel_sum_s())  # one rank: no collective waits, a kernel runs its duration

    def host_span_s(self) -> float:
        """Seconds from the first host task's start to the last one's end, over the CPU threads (0 without any)."""
        host = self.graph.proc_kind[self.graph.proc] != ProcKind.GPU_STREAM
        return float(self.end[host].max() - self.start[host].min()) if host.any() else 0.0

    def kernel_sum_s(self) -> float:
        """Baseline of Lin et al.: max over GPU streams of the summed kernel durations, seconds.

        Graphs without GPU streams (CPU runs) use the max over processors of summed
        compute/memory/communication task durations.
        """
        g = self.graph
        on_gpu = g.proc_kind[g.proc] == ProcKind.GPU_STREAM
        mask = on_gpu if on_gpu.any() else (g.category != Category.CPU) & (g.category != Category.SYNC)
        if not mask.any():
            return 0.0
        sums = np.bincount(g.proc[mask], weights=self.duration[mask], minlength=g.n_procs)
        return float(sums.max())

    def processor_busy(self) -> pd.DataFrame:
        """Per processor: busy (sum of occupied time, collective waits included) and idle, seconds."""
        g = self.graph
        occupied = self.end - self.start
        busy = np.bincount(g.proc, weights=occupied, minlength=g.n_procs)
        rank_t = self.per_rank_s
        return pd.DataFrame(
            {
                "rank": g.proc_rank,
                "processor": g.proc_names,
                "kind": [ProcKind(k).name.lower() for k in g.proc_kind],
                "busy_s": busy,
                "idle_s": rank_t[g.proc_rank] - busy,
            }
        )

    def breakdown(self, rank: int | None = None) -> Breakdown:
        """Exposed compute / exposed communication / overlap / idle of ``rank``.

        With ``rank=None`` the slowest rank is used (the one that sets the iteration time).
        Compute = compute and memory tasks; communication = collective tasks (their whole
        occupied interval, waiting included, as a profiler shows it).
        """
        g = self.graph
        per_rank = self.per_rank_s
        if rank is None:
            rank = int(np.argmax(per_rank)) if per_rank.size else 0
        on = g.rank == rank
        total = float(per_rank[rank]) if per_rank.size else 0.0
        comp = on & ((g.category == Category.COMPUTE) | (g.category == Category.MEMORY))
        comm = on & (g.category == Category.COMMUNICATION)
        c = union_length(self.start[comp], self.end[comp])
        m = union_length(self.start[comm], self.end[comm])
        both = union_length(self.start[comp | comm], self.end[comp | comm])
        overlap = c + m - both
        return Breakdown(total, c - overlap, m - overlap, overlap, max(total - both, 0.0))

    # ------------------------------------------------------------------ critical path
    def critical_path(self) -> np.ndarray:
        """Task indices on the critical path, first to last."""
        if not self.end.size:
            return np.zeros(0, dtype=np.int64)
        path = []
        g = self.graph
        i = int(np.argmax(self.end))
        seen = 0
        while i >= 0 and seen <= g.n_tasks:
            grp = g.group[i]
            if grp >= 0 and self.group_last[grp] >= 0 and self.group_last[grp] != i:
                i = int(self.group_last[grp])  # the group ended when its last member arrived
            path.append(i)
            i = int(self.binding[i])
            seen += 1
        return np.asarray(path[::-1], dtype=np.int64)

    def critical_path_summary(self, top: int = 10) -> pd.DataFrame:
        """Critical-path time by op name: seconds and share of the iteration."""
        path = self.critical_path()
        g = self.graph
        names = np.asarray(g.names, dtype=object)[g.name[path]]
        cats = [Category(c).name.lower() for c in g.category[path]]
        df = pd.DataFrame({"name": names, "category": cats, "time_s": self.end[path] - self.start[path]})
        out = df.groupby(["name", "category"], as_index=False)["time_s"].sum()
        out["share"] = out["time_s"] / max(self.iteration_s, 1e-30)
        return out.sort_values("time_s", ascending=False).head(top).reset_index(drop=True)

    # ------------------------------------------------------------------ export
    def to_frame(self) -> pd.DataFrame:
        df = self.graph.tasks_frame()
        df["start_s"] = self.start
        df["end_s"] = self.end
        df["sim_duration_s"] = self.duration
        return df

    def chrome_trace(self, max_events: int | None = None) -> dict:
        """The predicted run as a Chrome/Perfetto trace (``{"traceEvents": [...]}``, times in µs)."""
        g = self.graph
        on_path = np.zeros(g.n_tasks, dtype=bool)
        on_path[self.critical_path()] = True
        names = g.names
        kinds = g.kinds
        events: list[dict] = []
        for r in range(g.n_ranks):
            events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r} (predicted)"}})
        for p in range(g.n_procs):
            events.append(
                {"ph": "M", "name": "thread_name", "pid": int(g.proc_rank[p]), "tid": p, "args": {"name": g.proc_names[p]}}
            )
        idx = range(g.n_tasks) if max_events is None else range(min(g.n_tasks, max_events))
        start_us = self.start * 1e6
        dur_us = (self.end - self.start) * 1e6
        for i in idx:
            events.append(
                {
                    "ph": "X",
                    "name": names[g.name[i]],
                    "cat": Category(int(g.category[i])).name.lower(),
                    "pid": int(g.rank[i]),
                    "tid": int(g.proc[i]),
                    "ts": round(float(start_us[i]), 3),
                    "dur": round(float(dur_us[i]), 3),
                    "args": {"kind": kinds[g.kind[i]], "critical_path": bool(on_path[i])},
                }
            )
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"producer": "tuner simulate"}}

    def write_chrome_trace(self, path: str | Path) -> Path:
        """Write :meth:`chrome_trace` as JSON (open in ui.perfetto.dev or chrome://tracing)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.chrome_trace()))
        tmp.replace(path)
        return path

    def summary(self) -> dict:
        """Iteration time, per-rank times, breakdown, kernel-sum baseline (all seconds)."""
        return {
            "predicted_iteration_s": self.iteration_s,
            "per_rank_s": [float(x) for x in self.per_rank_s],
            "kernel_sum_s": self.kernel_sum_s(),
            "breakdown": self.breakdown().as_dict(),
        }


# ----------------------------------------------------------------------------- entry point
def simulate(
    graph: ExecutionGraph,
    timing: Timing | np.ndarray | Sequence[float] | None = None,
    *,
    launch_fraction: float = 0.5,
) -> Timeline:
    """Simulate one iteration of ``graph`` and return its :class:`Timeline`.

    ``timing`` is a :class:`Timing`, an array of durations (seconds), or ``None`` for the
    measured durations. ``launch_fraction`` places a kernel's earliest start inside its launch
    call (0.5: the middle of ``cudaLaunchKernel``, as ``T4/2`` in Lin et al.).

    Raises :class:`GraphError` when some tasks can never start (a dependency cycle, or
    collectives issued in different orders on different ranks).
    """
    if timing is None:
        dur = MeasuredTiming().durations(graph)
    elif isinstance(timing, Timing):
        dur = np.asarray(timing.durations(graph), dtype=np.float64)
    else:
        dur = np.asarray(timing, dtype=np.float64)
    if dur.shape != (graph.n_tasks,):
        raise GraphError(f"timing gave {dur.shape} durations for {graph.n_tasks} tasks")
    if graph.n_tasks and (not np.all(np.isfinite(dur)) or dur.min() < 0):
        bad = int(np.flatnonzero(~np.isfinite(dur) | (dur < 0))[0])
        raise GraphError(
            f"task {bad} ({graph.names[graph.name[bad]]!r}) has duration {dur[bad]!r}; durations must be finite and >= 0"
        )
    topo = _topology(graph)
    start, end, binding, grp_last, done = _simulate_core(
        dur,
        topo.succ_ptr,
        topo.succ_idx,
        topo.succ_launch,
        topo.next_on_proc,
        topo.indeg,
        graph.group.astype(np.int64),
        topo.grp_ptr,
        topo.grp_members,
        float(launch_fraction),
    )
    if done != graph.n_tasks:
        stuck = np.flatnonzero((end == 0) & (start == 0))
        example = int(stuck[0]) if stuck.size else 0
        raise GraphError(
            f"{graph.n_tasks - done} of {graph.n_tasks} tasks can never start: a dependency cycle, or collectives "
            f"issued in different orders on different ranks (e.g. {graph.names[graph.name[example]]!r} on rank "
            f"{int(graph.rank[example])})"
        )
    return Timeline(graph, start, end, dur, binding, grp_last)
