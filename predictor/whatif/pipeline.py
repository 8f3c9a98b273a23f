"""Pipeline parallelism: layers re-staged into stages run with the 1F1B schedule."""

from __future__ import annotations

import numpy as np

from predictor.graph import Category, DepKind, ExecutionGraph, ProcKind
from predictor.graph.edit import GraphEditor, aux_of
from predictor.whatif.batch import scale_batch
from predictor.whatif.common import (
    PHASE_BWD,
    PHASE_FWD,
    PHASE_OPT,
    WhatIfError,
    aux_col,
    main_procs,
    with_meta,
)
from predictor.whatif.layers import detect_layers, with_layers

__all__ = ["restage_pp"]


def restage_pp(g: ExecutionGraph, pp: int, micro_batches: int | None = None, *,
               base_layers: int | None = None) -> ExecutionGraph:
    """Re-stage a single-rank graph into ``pp`` pipeline stages run with 1F1B (module docstring).

    The captured batch is split into ``micro_batches`` (default ``pp``) micro-batches; each
    micro-batch's tasks are the stage's tasks with the batch scaled by ``1 / micro_batches``.
    """
    from predictor.sources.synth.pipeline_schedule import one_f_one_b

    if pp < 1:
        raise WhatIfError(f"pp must be >= 1 (got {pp})")
    if pp == 1:
        return g
    ranks = np.unique(g.rank)
    if ranks.size != 1:
        raise WhatIfError("pipeline re-staging needs a single-rank capture (apply dp after pp)")
    m = micro_batches or pp
    info = detect_layers(g, base_layers, int(ranks[0]))
    if info.count < pp:
        raise WhatIfError(f"pp={pp} needs at least {pp} repeated layers (found {info.count})")
    g_layers = g if "layer" in aux_of(g) and np.any(aux_col(g, "layer") >= 0) else with_layers(g, info)
    micro = scale_batch(g_layers, 1.0 / m) if m > 1 else g_layers
    aux = aux_of(micro)
    phase, layer, region = aux_col(micro, "phase"), aux_col(micro, "layer"), aux_col(micro, "region")
    stage_of_layer = (np.arange(info.count) * pp) // info.count
    stage = np.full(micro.n_tasks, -1, dtype=np.int64)
    lay = layer >= 0
    stage[lay] = stage_of_layer[layer[lay].astype(np.int64)]
    first_side = ((phase == PHASE_FWD) & (region == 0)) | ((phase == PHASE_BWD) & (region == 2)) | (
        (phase == PHASE_OPT) & (region == 0))
    last_side = ((phase == PHASE_FWD) & (region == 2)) | ((phase == PHASE_BWD) & (region == 0)) | (
        (phase == PHASE_OPT) & (region == 2))
    stage[(stage < 0) & first_side] = 0
    stage[(stage < 0) & last_side] = pp - 1
    # optimizer tasks outside any detected region: spread by position (parameters are in model order)
    opt_left = (stage < 0) & (phase == PHASE_OPT)
    if opt_left.any():
        k = np.flatnonzero(opt_left)
        stage[k] = (np.arange(k.size) * pp) // k.size
    stage[stage < 0] = 0  # markers, zero_grad, other host work: the first stage
    # boundary activations: bytes of the first forward op's input of each stage's first layer
    act = aux.get("act_bytes", np.full(micro.n_tasks, np.nan))
    bound = np.zeros(pp)
    for s in range(1, pp):
        first_layer = int(np.flatnonzero(stage_of_layer == s)[0])
        cand = np.flatnonzero((phase == PHASE_FWD) & (layer == first_layer) & np.isfinite(act))
        bound[s] = float(act[cand[0]]) if cand.size else 0.0
    # the original step markers
    markers = np.flatnonzero(micro.kind_mask("marker"))
    ed = GraphEditor(micro, keep_procs=False)
    ed.proc_rank, ed.proc_kind, ed.proc_names = [], [], []
    src_main = main_procs(micro)[int(ranks[0])]
    if micro.is_gpu().any():
        raise WhatIfError("pipeline re-staging of GPU traces is not supported yet (CPU captures only)")
    procs, p2p_f, p2p_b = [], [], []
    for s in range(pp):
        procs.append(ed.processor(s, ProcKind.CPU_THREAD, micro.proc_names[src_main]))
        p2p_f.append(ed.processor(s, ProcKind.CPU_THREAD, "p2p send fwd"))
        p2p_b.append(ed.processor(s, ProcKind.CPU_THREAD, "p2p send bwd"))
    # a stage is the captured main thread's work; tasks of other threads are not carried over
    main_tasks = np.flatnonzero(micro.proc == src_main)
    groups: dict[tuple, int] = {}

    def gid(key: tuple) -> int:
        if key not in groups:
            groups[key] = int(ed.new_groups(1)[0])
        return groups[key]

    cursor = [0.0] * pp
    step_lo = markers.min() if markers.size else -1
    step_hi = markers.max() if markers.size else micro.n_tasks
    for s in range(pp):
        mine = main_tasks[(stage[main_tasks] == s)]
        fwd = mine[(phase[mine] == PHASE_FWD) & (mine > step_lo) & (mine < step_hi)]
        bwd = mine[(phase[mine] == PHASE_BWD) & (mine > step_lo) & (mine < step_hi)]
        rest = mine[~np.isin(mine, np.concatenate([fwd, bwd])) & ~np.isin(mine, markers)]
        head = rest[rest < (fwd.min() if fwd.size else np.inf)]
        tail = rest[rest >= (fwd.min() if fwd.size else np.inf)]

        def put(idx: np.ndarray, s: int = s) -> np.ndarray:
            if not idx.size:
                return np.zeros(0, dtype=np.int64)
            new = ed.copy(idx, cursor[s] + np.arange(idx.size) * 1e-6, proc=procs[s])
            cursor[s] += idx.size * 1e-6 + 1.0
            return new

        if markers.size:
            ed.copy(markers[:1], cursor[s], proc=procs[s])
            cursor[s] += 1.0
        put(head)
        for step in one_f_one_b(pp, m, s):
            mb = step.micro_batch
            if step.phase == "F":
                if s > 0:
                    ed.add(procs[s], "recv activations", "send_recv", Category.COMMUNICATION, cursor[s],
                           group=gid(("F", s, mb)), params={"msg_bytes": bound[s], "world": 2.0}, nbytes=bound[s])
                    cursor[s] += 1.0
                put(fwd)
                if s < pp - 1:
                    last = ed.n - 1
                    snd = ed.add(p2p_f[s], "send activations", "send_recv", Category.COMMUNICATION, cursor[s],
                                 group=gid(("F", s + 1, mb)), params={"msg_bytes": bound[s + 1], "world": 2.0},
                                 nbytes=bound[s + 1])
                    ed.edges(np.asarray([last]), snd, DepKind.CPU_CPU)
            else:
                if s < pp - 1:
                    ed.add(procs[s], "recv gradients", "send_recv", Category.COMMUNICATION, cursor[s],
                           group=gid(("B", s, mb)), params={"msg_bytes": bound[s + 1], "world": 2.0},
                           nbytes=bound[s + 1])
                    cursor[s] += 1.0
                copies = put(bwd)
                if mb != m - 1:  # gradients are all-reduced once, after the last micro-batch
                    ed.set_aux("grad_bytes", copies, np.nan)
                if s > 0:
                    last = ed.n - 1
                    snd = ed.add(p2p_b[s], "send gradients", "send_recv", Category.COMMUNICATION, cursor[s],
                                 group=gid(("B", s - 1, mb)), params={"msg_bytes": bound[s], "world": 2.0},
                                 nbytes=bound[s])
                    ed.edges(np.asarray([last]), snd, DepKind.CPU_CPU)
        put(tail)
        if markers.size:
            ed.copy(markers[-1:], cursor[s], proc=procs[s])
            cursor[s] += 1.0
    out = ed.build()
    # the optimizer was scaled with the micro-batch: it runs once on the full batch's gradients
    return with_meta(out, pp=pp, micro_batches=m, pp_layers_per_stage=np.bincount(stage_of_layer).tolist(),
                      pp_boundary_bytes=bound[1:].tolist())
