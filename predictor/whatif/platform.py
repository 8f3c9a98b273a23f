"""Another platform (re-time every kernel; host graphs get device mode) and kernel speed-ups."""

from __future__ import annotations

import numpy as np

from predictor.graph import Category, DepKind, ExecutionGraph, Overhead, ProcKind
from predictor.graph.edit import AUX_KEY, GraphEditor
from predictor.whatif.common import WhatIfError, copy_all, ensure_aux, with_meta

__all__ = ["move_platform", "speed_up"]


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
