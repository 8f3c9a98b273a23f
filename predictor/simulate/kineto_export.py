"""The simulated timeline of a replay written in the Kineto trace schema (what ``torch.profiler`` writes).

One file per rank, so that Holistic Trace Analysis, TraceLens or Perfetto load the simulated run next to
the measured one and diff the two; tuner's own Kineto reader re-reads it. Events, times in µs on the
measured trace's clock (the simulated run starts where the measured one did):

* ``cpu_op`` — each top-level op, from its first simulated segment's start to its last task's end;
* ``cuda_runtime`` — each runtime call that is a task (launches, synchronisations, blocking copies; a
  call cut into an issuing part and a wait is one event), ``args.correlation`` = its call's id;
* ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` — each GPU task on ``pid`` device, ``tid`` stream, with
  ``args.device``, ``args.stream``, ``args.correlation`` of its launch;
* ``user_annotation`` — ``ProfilerStep#N`` from the simulated start marker to the end marker;
* flow events ``ph: s`` / ``ph: f``, ``cat: ac2g``, ``id`` = correlation, from each launch to its kernel;
* ``process_name`` / ``thread_name`` metadata, ``distributedInfo`` with the rank and world size.

Overhead gaps between ops, stream gaps and markers are not events (the profiler does not record them).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

from predictor.graph import Category, ProcKind

__all__ = ["kineto_documents", "write_kineto"]

_WAIT_SUFFIXES = (" (wait)", " (queue full)", " (rest)")


def _gpu_cat(name: str) -> str:
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    if name.startswith("Memset"):
        return "gpu_memset"
    return "kernel"


def kineto_documents(result: Any) -> list[tuple[int, dict]]:
    """(trace rank, Kineto document) per rank of a replay ``result`` (a
    :class:`~predictor.simulate.replay.ReplayResult`: ``graph`` a ReplayGraph, ``timeline`` its simulation)."""
    rg, tl = result.graph, result.timeline
    g = rg.graph
    t0 = float(rg.t0_us)
    ts = np.round(t0 + tl.start * 1e6, 3)
    te = np.round(t0 + tl.end * 1e6, 3)
    names = g.names
    kinds = g.kinds
    call = rg.task_call if rg.task_call is not None else np.full(g.n_tasks, -1, dtype=np.int64)
    op = rg.task_op if rg.task_op is not None else np.full(g.n_tasks, -1, dtype=np.int64)
    gpu = g.is_gpu()
    ids = rg.proc_ids or [(-1, p) for p in range(g.n_procs)]
    docs = []
    for r, trace_rank in enumerate(rg.trace_ranks):
        host_pid = next((ids[p][0] for p in range(g.n_procs)
                         if g.proc_rank[p] == r and g.proc_kind[p] != ProcKind.GPU_STREAM), 0)
        ev: list[dict] = [{"ph": "M", "name": "process_name", "pid": host_pid, "tid": 0,
                           "args": {"name": f"rank {trace_rank} (simulated by tuner replay)"}}]
        for p in np.flatnonzero(g.proc_rank == r).tolist():
            pid, tid = ids[p]
            if g.proc_kind[p] == ProcKind.GPU_STREAM:
                ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"GPU {pid}"}})
                ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"stream {tid}"}})
            else:
                ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"thread {tid}"}})
        on = g.rank == r
        # top-level ops: the span of their segments and runtime calls on their thread
        cpu_tasks = np.flatnonzero(on & ~gpu & (op >= 0))
        if cpu_tasks.size:
            key = op[cpu_tasks]
            order = np.lexsort((ts[cpu_tasks], key))
            t_sorted, k_sorted = cpu_tasks[order], key[order]
            first = np.flatnonzero(np.r_[True, k_sorted[1:] != k_sorted[:-1]])
            last = np.r_[first[1:] - 1, k_sorted.size - 1]
            span_end = np.maximum.reduceat(te[t_sorted], first)
            for f, l_, e_end in zip(first.tolist(), last.tolist(), span_end.tolist(), strict=True):
                i = int(t_sorted[f])
                seg = t_sorted[f:l_ + 1]
                named = seg[g.kind[seg] == g.kind_id("cpu_op")]
                nm = names[g.name[int(named[0])]] if named.size else "op"
                pid, tid = ids[g.proc[i]]
                ev.append({"ph": "X", "cat": "cpu_op", "name": nm, "pid": pid, "tid": tid, "ts": float(ts[i]),
                           "dur": round(e_end - float(ts[i]), 3), "args": {"External id": int(k_sorted[f]) + 1}})
        # runtime calls: the issuing task and its wait, one event per call
        rt = np.flatnonzero(on & ~gpu & (call >= 0))
        if rt.size:
            o = np.lexsort((ts[rt], call[rt]))
            rt, keys = rt[o], call[rt][o]
            first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
            ends = np.maximum.reduceat(te[rt], first)
            for f, e_end in zip(first.tolist(), ends.tolist(), strict=True):
                i = int(rt[f])
                nm = names[g.name[i]]
                for suffix in _WAIT_SUFFIXES:
                    nm = nm.removesuffix(suffix)
                pid, tid = ids[g.proc[i]]
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": nm, "pid": pid, "tid": tid, "ts": float(ts[i]),
                           "dur": round(e_end - float(ts[i]), 3),
                           "args": {"correlation": int(keys[f]) + 1, "External id": int(op[i]) + 1}})
        # GPU tasks and the flow from their launch
        launch_ts = {int(call[i]): (float(ts[i]), ids[g.proc[i]]) for i in rt.tolist()}
        kernel_like = on & gpu & (g.category != Category.SYNC)
        for i in np.flatnonzero(kernel_like).tolist():
            dev, stream = ids[g.proc[i]]
            nm = names[g.name[i]]
            args: dict = {"device": dev, "stream": stream, "kind": kinds[g.kind[i]]}
            c = int(call[i])
            if c >= 0:
                args["correlation"] = c + 1
            ev.append({"ph": "X", "cat": _gpu_cat(nm), "name": nm, "pid": dev, "tid": stream, "ts": float(ts[i]),
                       "dur": round(float(te[i] - ts[i]), 3), "args": args})
            if c >= 0 and c in launch_ts:
                lts, (lpid, ltid) = launch_ts[c]
                ev.append({"ph": "s", "id": c + 1, "pid": lpid, "tid": ltid, "ts": lts, "cat": "ac2g", "name": "ac2g"})
                ev.append({"ph": "f", "id": c + 1, "pid": dev, "tid": stream, "ts": float(ts[i]), "cat": "ac2g",
                           "name": "ac2g", "bp": "e"})
        # steps: from the simulated start marker to the end marker
        for row in rg.steps[rg.steps["rank"] == r].itertuples():
            if row.start_task < 0:
                continue
            a, b = int(row.start_task), int(row.end_task)
            pid, tid = ids[g.proc[a]]
            ev.append({"ph": "X", "cat": "user_annotation", "name": str(row.name), "pid": pid, "tid": tid,
                       "ts": float(ts[a]), "dur": round(float(ts[b] - ts[a]), 3), "args": {}})
        docs.append((int(trace_rank), {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": int(trace_rank), "world_size": int(rg.world_size)},
            "deviceProperties": [],
            "displayTimeUnit": "ms",
            "otherData": {"producer": "tuner replay (simulated)", "source": str(g.meta.get("source", ""))},
            "traceEvents": ev,
        }))
    return docs


def write_kineto(result: Any, out: str | Path) -> list[Path]:
    """Write the simulated run of ``result`` as Kineto traces: ``OUT/simulated.kineto.json.gz`` for one rank,
    ``OUT/simulated_kineto/rank{R}.kineto.json.gz`` per rank for several; returns the files."""
    out = Path(out)
    docs = kineto_documents(result)
    if len(docs) == 1:
        targets = [out / "simulated.kineto.json.gz"]
    else:
        targets = [out / "simulated_kineto" / f"rank{r}.kineto.json.gz" for r, _ in docs]
    written = []
    for path, (_, doc) in zip(targets, docs, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=5))
        tmp.replace(path)
        written.append(path)
    return written
