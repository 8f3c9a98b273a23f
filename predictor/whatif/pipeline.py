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
    stage, stage_of_layer = _stages(micro, info.count, pp)
    bound = _boundary_bytes(micro, stage_of_layer, pp)
    ed = GraphEditor(micro, keep_procs=False)
    ed.proc_rank, ed.proc_kind, ed.proc_names = [], [], []
    src_main = main_procs(micro)[int(ranks[0])]
    if micro.is_gpu().any():
        raise WhatIfError("pipeline re-staging of GPU traces is not supported yet (CPU captures only)")
    stager = _Stager(ed, micro, pp, m, bound, src_main)
    for s in range(pp):
        stager.stage(s, stage)
    out = ed.build()
    # the optimizer was scaled with the micro-batch: it runs once on the full batch's gradients
    return with_meta(out, pp=pp, micro_batches=m, pp_layers_per_stage=np.bincount(stage_of_layer).tolist(),
                      pp_boundary_bytes=bound[1:].tolist())


def _stages(micro: ExecutionGraph, n_layers: int, pp: int) -> tuple[np.ndarray, np.ndarray]:
    """(stage of each task, stage of each layer): layers split evenly; work before / after the layers
    on the first / last stage."""
    phase, layer, region = aux_col(micro, "phase"), aux_col(micro, "layer"), aux_col(micro, "region")
    stage_of_layer = (np.arange(n_layers) * pp) // n_layers
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
    return stage, stage_of_layer


def _boundary_bytes(micro: ExecutionGraph, stage_of_layer: np.ndarray, pp: int) -> np.ndarray:
    """Per stage, the bytes it receives: the first forward op's input of the stage's first layer."""
    phase, layer = aux_col(micro, "phase"), aux_col(micro, "layer")
    act = aux_of(micro).get("act_bytes", np.full(micro.n_tasks, np.nan))
    bound = np.zeros(pp)
    for s in range(1, pp):
        first_layer = int(np.flatnonzero(stage_of_layer == s)[0])
        cand = np.flatnonzero((phase == PHASE_FWD) & (layer == first_layer) & np.isfinite(act))
        bound[s] = float(act[cand[0]]) if cand.size else 0.0
    return bound


class _Stager:
    """Copies the captured main thread's work onto ``pp`` stage ranks in 1F1B order, with the
    activation / gradient transfers between them (tasks of other threads are not carried over)."""

    def __init__(self, ed: GraphEditor, micro: ExecutionGraph, pp: int, m: int, bound: np.ndarray,
                 src_main: int) -> None:
        self.ed, self.micro, self.pp, self.m, self.bound = ed, micro, pp, m, bound
        self.phase = aux_col(micro, "phase")
        self.markers = np.flatnonzero(micro.kind_mask("marker"))  # the original step markers
        self.procs, self.p2p_f, self.p2p_b = [], [], []
        for s in range(pp):
            self.procs.append(ed.processor(s, ProcKind.CPU_THREAD, micro.proc_names[src_main]))
            self.p2p_f.append(ed.processor(s, ProcKind.CPU_THREAD, "p2p send fwd"))
            self.p2p_b.append(ed.processor(s, ProcKind.CPU_THREAD, "p2p send bwd"))
        self.main_tasks = np.flatnonzero(micro.proc == src_main)
        self.groups: dict[tuple, int] = {}
        self.cursor = [0.0] * pp

    def gid(self, key: tuple) -> int:
        """The collective group of a transfer (both ends share it)."""
        if key not in self.groups:
            self.groups[key] = int(self.ed.new_groups(1)[0])
        return self.groups[key]

    def put(self, s: int, idx: np.ndarray) -> np.ndarray:
        """Copies of tasks ``idx`` at the end of stage ``s`` so far."""
        if not idx.size:
            return np.zeros(0, dtype=np.int64)
        new = self.ed.copy(idx, self.cursor[s] + np.arange(idx.size) * 1e-6, proc=self.procs[s])
        self.cursor[s] += idx.size * 1e-6 + 1.0
        return new

    def stage(self, s: int, stage: np.ndarray) -> None:
        """Stage ``s``: its head, the 1F1B steps of every micro-batch, its tail, between the step markers."""
        from predictor.sources.synth.pipeline_schedule import one_f_one_b

        ed, markers, phase, micro = self.ed, self.markers, self.phase, self.micro
        step_lo = markers.min() if markers.size else -1
        step_hi = markers.max() if markers.size else micro.n_tasks
        mine = self.main_tasks[(stage[self.main_tasks] == s)]
        fwd = mine[(phase[mine] == PHASE_FWD) & (mine > step_lo) & (mine < step_hi)]
        bwd = mine[(phase[mine] == PHASE_BWD) & (mine > step_lo) & (mine < step_hi)]
        rest = mine[~np.isin(mine, np.concatenate([fwd, bwd])) & ~np.isin(mine, markers)]
        head = rest[rest < (fwd.min() if fwd.size else np.inf)]
        tail = rest[rest >= (fwd.min() if fwd.size else np.inf)]
        if markers.size:
            ed.copy(markers[:1], self.cursor[s], proc=self.procs[s])
            self.cursor[s] += 1.0
        self.put(s, head)
        for step in one_f_one_b(self.pp, self.m, s):
            if step.phase == "F":
                self._forward(s, step.micro_batch, fwd)
            else:
                self._backward(s, step.micro_batch, bwd)
        self.put(s, tail)
        if markers.size:
            ed.copy(markers[-1:], self.cursor[s], proc=self.procs[s])
            self.cursor[s] += 1.0

    def _forward(self, s: int, mb: int, fwd: np.ndarray) -> None:
        ed, bound = self.ed, self.bound
        if s > 0:
            ed.add(self.procs[s], "recv activations", "send_recv", Category.COMMUNICATION, self.cursor[s],
                   group=self.gid(("F", s, mb)), params={"msg_bytes": bound[s], "world": 2.0}, nbytes=bound[s])
            self.cursor[s] += 1.0
        self.put(s, fwd)
        if s < self.pp - 1:
            last = ed.n - 1
            snd = ed.add(self.p2p_f[s], "send activations", "send_recv", Category.COMMUNICATION, self.cursor[s],
                         group=self.gid(("F", s + 1, mb)), params={"msg_bytes": bound[s + 1], "world": 2.0},
                         nbytes=bound[s + 1])
            ed.edges(np.asarray([last]), snd, DepKind.CPU_CPU)

    def _backward(self, s: int, mb: int, bwd: np.ndarray) -> None:
        ed, bound = self.ed, self.bound
        if s < self.pp - 1:
            ed.add(self.procs[s], "recv gradients", "send_recv", Category.COMMUNICATION, self.cursor[s],
                   group=self.gid(("B", s, mb)), params={"msg_bytes": bound[s + 1], "world": 2.0},
                   nbytes=bound[s + 1])
            self.cursor[s] += 1.0
        copies = self.put(s, bwd)
        if mb != self.m - 1:  # gradients are all-reduced once, after the last micro-batch
            ed.set_aux("grad_bytes", copies, np.nan)
        if s > 0:
            last = ed.n - 1
            snd = ed.add(self.p2p_b[s], "send gradients", "send_recv", Category.COMMUNICATION, self.cursor[s],
                         group=self.gid(("B", s - 1, mb)), params={"msg_bytes": bound[s], "world": 2.0},
                         nbytes=bound[s])
            ed.edges(np.asarray([last]), snd, DepKind.CPU_CPU)
