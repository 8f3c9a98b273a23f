"""Dependencies of the replay graph, by kind (Lumos §3.3.2; see :mod:`~predictor.sources.traces.build`).

* :func:`classify_runtime_calls` — which CUDA runtime calls become tasks, the GPU tasks a
  synchronisation or blocking copy waits for (GPU->CPU), and ``cudaEventRecord`` ->
  ``cudaStreamWaitEvent`` pairs (GPU->GPU across streams).
* :func:`resource_waits` — GPU->GPU for the device itself (a task held back by another stream's).
* :func:`match_collectives` — NCCL kernels of all ranks grouped into collectives.
* :func:`inter_thread_waits` — CPU->CPU: a long T1 gap waiting for another thread's op.
* :func:`data_dependencies` — DATA: tensors produced on one thread and consumed on another (ET).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from predictor.sources.traces.et import ExecutionTrace
from predictor.sources.traces.kineto import EventCat, KinetoTrace
from predictor.sources.traces.rank_events import EPS_US, RankEvents, StreamOrder

__all__ = ["INTER_THREAD_GAP_US", "RESOURCE_WAIT_US", "RESOURCE_TAIL_US", "RESOURCE_LEAD_US", "SYNC_CALLS",
           "IMPLICIT_SYNC_CALLS",
           "BLOCKING_COPY_CALLS", "LAUNCH_CALLS", "LAUNCH", "SYNC", "BLOCKING_COPY", "RECORD", "WAIT",
           "RuntimeCalls", "classify_runtime_calls", "resource_waits", "match_collectives", "inter_thread_waits",
           "data_dependencies"]

#: a T1 gap at least this long (µs) may be a wait for another thread
INTER_THREAD_GAP_US = 20.0
#: a GPU task that starts this much (µs) after it was ready was held back by the device
RESOURCE_WAIT_US = 20.0
#: ... by a task of another stream that ended at most this long (µs) before it started
RESOURCE_TAIL_US = 100.0
#: ... or ended at most this long (µs) after it started (kernel tails, timestamp granularity)
RESOURCE_LEAD_US = 100.0
#: runtime calls that only synchronise the CPU with the GPU
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
              "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize")
#: runtime calls that wait for the whole device before doing their own work (CUDA's implicit synchronisation)
IMPLICIT_SYNC_CALLS = ("cudaFree", "cudaFreeHost", "cudaFreeArray", "cuMemFree", "cuMemFree_v2", "cuMemFreeHost")
#: runtime calls whose copy blocks the CPU until done
BLOCKING_COPY_CALLS = ("cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyToSymbol",
                       "cudaMemcpyFromSymbol", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "cuMemcpy")
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaMemcpyAsync", "cudaMemsetAsync", "cudaLaunchCooperativeKernel", "cudaGraphLaunch")
_RECORD = ("cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord")
_WAIT = ("cudaStreamWaitEvent", "cuStreamWaitEvent")
#: kinds of the runtime calls that become tasks (plain ints: compared in tight loops)
LAUNCH, SYNC, BLOCKING_COPY, RECORD, WAIT = 1, 2, 3, 4, 5
_RUNTIME = int(EventCat.RUNTIME)
_MEMCPY = int(EventCat.MEMCPY)
_CUDA_SYNC = int(EventCat.CUDA_SYNC)


def _is_blocking_copy(memcpy_name: str) -> bool:
    """A device-to-pageable-host copy blocks the calling thread until it is done."""
    return "DtoH" in memcpy_name and "Pageable" in memcpy_name


@dataclass
class RuntimeCalls:
    """The runtime calls of one rank that become tasks.

    ``kind``: runtime event -> :data:`LAUNCH`, :data:`SYNC`, :data:`BLOCKING_COPY`, :data:`RECORD` or
    :data:`WAIT`; ``awaited``: sync / blocking-copy event -> GPU task indices it waits for;
    ``waits``: (source GPU task, waiting GPU task, wait call event, how it was resolved).
    """

    kind: dict[int, int]
    awaited: dict[int, list[int]]
    waits: list[tuple[int, int, int, str]]


class _Classifier:
    """State of :func:`classify_runtime_calls` over one rank."""

    def __init__(self, info: RankEvents, order: StreamOrder, bump: Callable[[str], None]) -> None:
        kt = info.trace.kineto
        self.info, self.order, self.bump, self.kt = info, order, bump, kt
        # cuda_sync records (newer Kineto): correlation -> args
        self.sync_rec: dict[int, dict] = {}
        for e in np.flatnonzero(kt.cat == _CUDA_SYNC).tolist():
            c = int(kt.corr[e])
            if c >= 0:
                self.sync_rec.setdefault(c, kt.args[e])
        rts = np.flatnonzero((kt.cat == _RUNTIME) & (kt.corr >= 0))  # the last call of a correlation id wins
        self.corr_to_rt = dict(zip(kt.corr[rts].tolist(), rts.tolist(), strict=True))
        self.has_wait_records = any(a.get("cuda_sync_kind") == "Stream Wait Event" for a in self.sync_rec.values())
        self.device0 = info.streams[0][0] if info.streams else 0
        self.last_record: list[list[tuple[float, int]]] = [[] for _ in info.threads]  # per thread (ts, stream)

    def sync_targets(self, nm: str, rec: dict | None, s: float, t_idx: int) -> list[int]:
        """GPU tasks a synchronisation call ``nm`` at ``s`` µs on thread ``t_idx`` waits for."""
        order = self.order
        targets: list[int] = []
        skind = (rec or {}).get("cuda_sync_kind")
        if nm in IMPLICIT_SYNC_CALLS:
            targets = self.device_targets(rec, s)
            self.bump("sync_implicit_device")
        elif nm.startswith(("cudaDeviceSynchronize", "cuCtx")) or skind == "Context Sync":
            targets = self.device_targets(rec, s)
            self.bump("sync_device")
        elif nm.startswith(("cudaStreamSynchronize", "cuStream")):
            si = order.stream(int(rec.get("device", self.device0)), rec.get("stream")) if rec else -1
            if si < 0:
                si = order.stream_before(t_idx, s)
                self.bump("sync_stream_inferred")
            else:
                self.bump("sync_stream_cuda_sync")
            if si >= 0:
                targets = [order.last_issued_before(si, s)]
            else:  # no stream known: the call waits at most for the whole device
                targets = self.device_targets(rec, s)
                self.bump("sync_unresolved_as_device")
        else:  # event synchronize
            si, when = -1, -1.0
            if rec and rec.get("wait_on_cuda_event_record_corr_id") is not None:
                rec_e = self.corr_to_rt.get(int(rec["wait_on_cuda_event_record_corr_id"]))
                si = order.stream(int(rec.get("device", self.device0)), rec.get("wait_on_stream"))
                when = float(self.kt.ts[rec_e]) if rec_e is not None else s
            elif self.last_record[t_idx]:
                when, si = self.last_record[t_idx][-1]
            if si >= 0:
                targets = [order.last_issued_before(si, when)]
                self.bump("sync_event")
            else:  # no record traced: the call waits at most for the whole device
                targets = self.device_targets(rec, s)
                self.bump("sync_unresolved_as_device")
        return [g for g in targets if g >= 0]

    def device_targets(self, rec: dict | None, s: float) -> list[int]:
        """The last GPU task issued before ``s`` µs to each stream of the call's device."""
        dev = int((rec or {}).get("device", self.device0))
        return [self.order.last_issued_before(si, s) for si, (d, _) in enumerate(self.info.streams) if d == dev]

    def event_wait(self, rec: dict | None, s: float, t_idx: int) -> tuple[int, int, str]:
        """(source GPU task, waiting GPU task, how) of a ``cudaStreamWaitEvent`` at ``s`` µs (-1: unresolved)."""
        order = self.order
        src = dst = -1
        how = ""
        if rec and rec.get("cuda_sync_kind") == "Stream Wait Event":
            dev = int(rec.get("device", self.device0))
            wsi = order.stream(dev, rec.get("stream"))
            rsi = order.stream(dev, rec.get("wait_on_stream"))
            rec_e = self.corr_to_rt.get(int(rec.get("wait_on_cuda_event_record_corr_id", -1)))
            if wsi >= 0 and rsi >= 0 and rec_e is not None:
                src = order.last_issued_before(rsi, float(self.kt.ts[rec_e]))
                dst = order.first_issued_after(wsi, s)
                how = "cuda_sync"
        elif not self.has_wait_records:  # older Kineto: infer both streams from the thread
            wsi = order.stream_after(t_idx, s)
            if wsi >= 0:
                dst = order.first_issued_after(wsi, s)
                for when, rsi in reversed(self.last_record[t_idx]):
                    if rsi >= 0 and rsi != wsi:
                        src = order.last_issued_before(rsi, when)
                        how = "inferred"
                        break
                if src < 0 and dst >= 0 and not self.last_record[t_idx]:
                    src, how = self._untraced_record(wsi, dst, s), "inferred_stream"
        return src, dst, how

    def _untraced_record(self, wsi: int, dst: int, s: float) -> int:
        """No record call traced at all: the event is on one of the other streams; the last task issued
        to each before the wait that the measured run allows, the one ending last (-1: none)."""
        info = self.info
        best, src = -np.inf, -1
        for si in range(len(info.streams)):
            if si == wsi or info.streams[si][0] != info.streams[wsi][0]:
                continue
            c = self.order.last_issued_before(si, s)
            limit = info.gpu[dst].start + 0.5
            if c >= 0 and (info.gpu[c].start <= limit if info.overlapping else info.gpu[c].end <= limit) \
                    and info.gpu[c].end > best:
                best, src = info.gpu[c].end, c
        return src


def classify_runtime_calls(info: RankEvents, order: StreamOrder, bump: Callable[[str], None]) -> RuntimeCalls:
    """The :class:`RuntimeCalls` of one rank; ``bump(name)`` counts how each dependency was found."""
    kt = info.trace.kineto
    names, cat = kt.names, kt.cat
    cl = _Classifier(info, order, bump)
    out = RuntimeCalls({}, {}, [])
    for t_idx, evs in enumerate(info.thread_events):
        idx = np.asarray(evs, dtype=np.int64)
        rts = idx[cat[idx] == _RUNTIME]
        # Python lists: per-element numpy access took half of this loop on 23k events
        for e, name_id, s, corr in zip(rts.tolist(), kt.name[rts].tolist(), kt.ts[rts].tolist(),
                                       kt.corr[rts].tolist(), strict=True):
            nm = names[name_id]
            launched = info.gpu_of_launch.get(e)
            rec = cl.sync_rec.get(corr) if corr >= 0 else None
            if nm in SYNC_CALLS or (nm in IMPLICIT_SYNC_CALLS and not launched):
                out.kind[e] = SYNC
                out.awaited[e] = cl.sync_targets(nm, rec, s, t_idx)
            elif launched:
                # a copy to pageable host memory returns only when the data is there (the launched tasks'
                # categories looked up only for a copy call: per launch they were a tenth of this loop)
                blocking = nm in BLOCKING_COPY_CALLS or (
                    nm.startswith(("cudaMemcpy", "cuMemcpy"))
                    and _MEMCPY in {int(cat[info.gpu[g].ev]) for g in launched}
                    and any(_is_blocking_copy(names[kt.name[info.gpu[g].ev]]) for g in launched))
                out.kind[e] = BLOCKING_COPY if blocking else LAUNCH
                if blocking:
                    out.awaited[e] = list(launched)
                    bump("blocking_copies")
            elif nm in _RECORD:
                out.kind[e] = RECORD
                cl.last_record[t_idx].append((s, order.stream_before(t_idx, s)))
            elif nm in _WAIT:
                out.kind[e] = WAIT
                src, dst, how = cl.event_wait(rec, s, t_idx)
                if src >= 0 and dst >= 0:
                    out.waits.append((src, dst, e, how))
    return out


def resource_waits(info: RankEvents, stream_tasks: list[list[int]], wait_src: dict[int, list[int]],
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
    call_ts, call_dur = kt.ts.tolist(), kt.dur.tolist()  # Python floats: numpy scalars per GPU task were slower
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
                ready = max(ready, call_ts[g.launch] + call_dur[g.launch])
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


def match_collectives(infos: list[RankEvents], notes: list[str]) -> int:
    """Group the NCCL kernels of all ranks: same process group (or stream), same position. Every
    member gets the group's minimum measured duration; returns the number of groups."""
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


def inter_thread_waits(t1_gaps: list[tuple[int, float, float, int]], src_end: list[float], src_task: list[int],
                       src_thread: list[int]) -> list[tuple[int, int, float, float]]:
    """(source task, gap task, source end µs, gap end µs): a T1 gap (task, start µs, end µs, thread) of at
    least :data:`INTER_THREAD_GAP_US` during which another thread's op task ended (the last one to end
    before the gap does) waits for it; candidates are the in-op tasks (end µs, task, thread)."""
    o = np.argsort(src_end, kind="stable")
    ends = np.asarray(src_end)[o]
    gaps = [g for g in t1_gaps if not g[2] - g[1] < INTER_THREAD_GAP_US]
    # the last candidate ending by each gap's end, for all gaps in one search; Python lists for the walk back
    last = (np.searchsorted(ends, [g[2] for g in gaps], side="right") - 1).tolist()
    se, st, sth = ends.tolist(), np.asarray(src_task)[o].tolist(), np.asarray(src_thread)[o].tolist()
    out: list[tuple[int, int, float, float]] = []
    for (i, a, bnd, t_idx), k in zip(gaps, last, strict=True):
        while k >= 0 and se[k] > a and sth[k] == t_idx:
            k -= 1
        if k >= 0 and se[k] > a + EPS_US:
            out.append((int(st[k]), i, float(se[k]), bnd))
    return out


def data_dependencies(info: RankEvents, et: ExecutionTrace, et_map: dict[int, int]) -> set[tuple[int, int]]:
    """(producer, consumer) pairs of top-level ops on different threads: the consumer reads a tensor
    (execution-trace id) the producer wrote."""
    n_nodes = et.n_nodes
    # each joined node's top-level op (the last event joined to a node wins), by maps over the join, not a loop
    joined = np.fromiter(et_map.values(), dtype=np.int64, count=len(et_map))
    tops = np.fromiter(map(info.top_of.get, et_map.keys(), repeat(-1, len(et_map))), dtype=np.int64,
                       count=len(et_map))
    joined, tops = joined[tops >= 0][::-1], tops[tops >= 0][::-1]
    last = np.unique(joined, return_index=True)[1]
    top = np.full(n_nodes, -1, dtype=np.int64)
    top[joined[last]] = tops[last]
    top_of_node = top.tolist()
    # each node's parent's position (the last node of that id), by a search over the ids in order
    by_id = np.argsort(et.id, kind="stable")
    ids = et.id[by_id]
    at = np.searchsorted(ids, et.parent, side="right") - 1
    found = (at >= 0) & (ids[np.maximum(at, 0)] == et.parent)
    parent_pos = np.where(found, by_id[np.maximum(at, 0)], -1)
    orphans = np.flatnonzero((top < 0) & found)
    parent_of = parent_pos.tolist()
    for i in orphans.tolist():  # unmatched nodes inherit their parent's op, in node order
        top_of_node[i] = top_of_node[parent_of[i]]
    # one row per tensor read or written by a node under a top-level op, ordered by tensor, node, reads before
    # writes: a read's producer is the last write before it of the same tensor (a Python loop over the 37k
    # tensor ids of the ResNet-50 ET took 10 ms)
    top = np.fromiter(top_of_node, dtype=np.int64, count=n_nodes)
    nodes = np.arange(n_nodes)
    in_node = np.repeat(nodes, np.diff(et.in_ptr))
    out_node = np.repeat(nodes, np.diff(et.out_ptr))
    in_on, out_on = top[in_node] >= 0, top[out_node] >= 0
    tensor = np.concatenate([et.in_ids[in_on], et.out_ids[out_on]])
    node = np.concatenate([in_node[in_on], out_node[out_on]])
    writes = np.concatenate([np.zeros(int(in_on.sum()), dtype=bool), np.ones(int(out_on.sum()), dtype=bool)])
    order = np.lexsort((writes, node, tensor))
    tensor, node, writes = tensor[order], node[order], writes[order]
    last_write = np.maximum.accumulate(np.where(writes, np.arange(len(order)), -1)) if len(order) else order
    reads = np.flatnonzero(~writes & (last_write >= 0))
    reads = reads[tensor[last_write[reads]] == tensor[reads]]
    src, dst = top[node[last_write[reads]]], top[node[reads]]
    ops = np.unique(np.concatenate([src, dst]))
    op_thread = np.full(int(ops[-1]) + 1 if len(ops) else 0, -1, dtype=np.int64)  # by event index
    op_thread[ops] = np.fromiter(map(info.thread_of_event.get, ops.tolist(), repeat(-1, len(ops))),
                                 dtype=np.int64, count=len(ops))
    cross = (src != dst) & (op_thread[src] != op_thread[dst])
    return set(zip(src[cross].tolist(), dst[cross].tolist(), strict=True))
