"""Another platform (re-time every kernel; host graphs get device mode) and kernel speed-ups."""

from __future__ import annotations

import numpy as np

from predictor.graph import Category, DepKind, ExecutionGraph, Overhead, ProcKind
from predictor.graph.edit import AUX_KEY, GraphEditor
from predictor.whatif.common import WhatIfError, copy_all, ensure_aux, with_meta

__all__ = ["move_platform", "speed_up", "explain_move"]


def move_platform(g: ExecutionGraph, device: bool, *, launch_s: float = 5e-6) -> ExecutionGraph:
    """Mark every kernel task for re-timing on another platform. ``device``: the target is an
    accelerator; a host-mode graph then gets device mode (a launch call of ``launch_s`` on the
    thread, the kernel on a stream, the step end waiting for the stream)."""
    kernel = (g.category == Category.COMPUTE) | (g.category == Category.MEMORY) | (g.category == Category.COMMUNICATION)
    host_graph = not g.is_gpu().any()
    if not device or not host_graph:
        if device is False and not host_graph:
            raise WhatIfError("moving a GPU trace to a CPU platform is not supported")
        ed, _ = copy_all(g)
        out = ed.build()
        ensure_aux(out, "changed")[kernel] = 1.0
        return with_meta(out, platform_moved=True, platform_retimed=int(kernel.sum()))
    ed = GraphEditor(g)
    idx = np.arange(g.n_tasks)
    on_cpu_kernel = kernel & (g.proc_kind[g.proc] == ProcKind.CPU_THREAD)
    streams = {}
    for r in np.unique(g.rank).tolist():
        streams[r] = ed.processor(r, ProcKind.GPU_STREAM, "stream compute (moved)")
    proc = g.proc.astype(np.int64).copy()
    moved = np.flatnonzero(on_cpu_kernel & (g.category != Category.COMMUNICATION))
    proc[moved] = [streams[int(r)] for r in g.rank[moved].tolist()]
    new = ed.copy(idx, idx.astype(np.float64), proc=proc)
    if g.n_edges:
        ed.edges(new[g.edge_src], new[g.edge_dst], g.edge_kind)
    launches = ed.add(g.proc[moved], "cudaLaunchKernel", "launch", Category.CPU, moved - 0.25, duration=launch_s,
                      overhead=Overhead.T4)
    ed.edges(launches, new[moved], DepKind.CPU_GPU)
    ed.set_aux("changed", new[kernel], 1.0)
    # the end of each step waits for the stream (loss.item() or the next iteration's sync)
    end_markers = []
    marker = np.flatnonzero(g.kind_mask("marker"))
    for r in np.unique(g.rank).tolist():
        mk = marker[g.rank[marker] == r]
        mv = moved[g.rank[moved] == r]
        if mk.size and mv.size:
            ed.edges(new[mv[-1:]], new[mk[-1:]], DepKind.GPU_CPU)
            end_markers.append(int(mk[-1]))
    out = ed.build()
    return with_meta(out, platform_moved=True, platform_device_mode=True, platform_retimed=int(kernel.sum()))


def speed_up(g: ExecutionGraph, kind: str, factor: float) -> ExecutionGraph:
    """Make op kind ``kind`` ``factor`` times faster (its durations, measured or modelled, / factor)."""
    if factor <= 0:
        raise WhatIfError(f"speedup.{kind} must be positive (got {factor})")
    sel = g.kind_mask(kind)
    if not sel.any():
        raise WhatIfError(f"speedup.{kind}: no task of kind {kind!r}; kinds here: {', '.join(sorted(set(g.kinds)))}")
    ed, _ = copy_all(g)
    out = ed.build()
    aux = out.meta[AUX_KEY]
    sp = aux.get("speedup", np.ones(out.n_tasks))
    sp = np.where(np.isnan(sp), 1.0, sp)
    sp[out.kind_mask(kind)] *= factor
    aux["speedup"] = sp
    prev = dict(g.meta.get("whatif", {}).get("speedup", {}))
    prev[kind] = prev.get(kind, 1.0) * factor
    return with_meta(out, speedup=prev)


def explain_move(tl, captured: str, target: str, host_mode: bool) -> dict:
    """What a platform move left on the host and what it re-timed, from the predicted timeline ``tl``.

    ``host_s``: the busiest CPU thread's task time (framework dispatch and the launches, measured on the
    capture's host and kept: the host CPU is assumed to be the same); ``device_busy_s``: the busiest
    stream's kernel time on ``target``; ``bound``: ``host`` when the host's work per step exceeds the
    device's, so a faster accelerator cannot shorten the step; ``explanation``: the same in one sentence.
    """
    g = tl.graph
    dur = tl.end - tl.start
    cpu = g.proc_kind[g.proc] == ProcKind.CPU_THREAD
    gpu = ~cpu
    host = np.bincount(g.proc[cpu], weights=dur[cpu], minlength=g.n_procs).max() if cpu.any() else 0.0
    busy = np.bincount(g.proc[gpu], weights=dur[gpu], minlength=g.n_procs).max() if gpu.any() else 0.0
    kernels = int((gpu & (g.category != Category.CPU)).sum())
    bound = "host" if host >= busy else "device"
    where = "a CPU capture: its ops' kernels moved to the device, their dispatch" if host_mode else "the trace's"
    if bound == "host":
        why = (f"the step is host-bound on {target}: the host's {host * 1e3:.3f} ms per step ({where} "
               f"time and a launch per kernel, measured on {captured}'s host and kept) exceeds the device's "
               f"{busy * 1e3:.3f} ms of kernels, so the accelerator's speed does not change the step; a "
               "larger batch or a faster host would")
    else:
        why = (f"the step is device-bound on {target}: {busy * 1e3:.3f} ms of kernels per step (re-timed with "
               f"{target}'s kernel models) exceed the host's {host * 1e3:.3f} ms ({where} time, kept)")
    return {"host_s": float(host), "device_busy_s": float(busy), "kernels_moved": kernels, "bound": bound,
            "explanation": why}
