"""A captured run cut into per-step graphs whose tasks know their shapes, phase and signature.

:func:`step_graphs` takes the replay graph of :func:`~predictor.sources.traces.build.build_graph` and
the traces it came from, and returns one :class:`~predictor.graph.ExecutionGraph` per ProfilerStep with
the *auxiliary columns* of :mod:`predictor.graph.edit` that :mod:`predictor.whatif.apply` edits (durations
as traced; :func:`predictor.whatif.annotate.annotate` removes the profiler's cost):

* **Host ops split into kernels (CPU-only ranks)** — :mod:`~predictor.sources.traces.host_kernels`. GPU
  ranks keep their tasks; their kernels get parameters from the launching op (build).
* **Batch dependence** — :mod:`~predictor.sources.traces.batch_dependence`: ``x_<column>`` exponents.
* **Structure.** ``op`` (top-level op instance; a T1 gap belongs to the op it precedes), ``phase`` (1
  forward, 2 backward = ``autograd::engine::evaluate_function`` ops, 3 inside ``Optimizer.step#``, 0
  other), ``sig`` (name + input shapes of the op and of its kernels: repeated layers have equal
  signatures), ``grad_bytes`` on the last task of each AccumulateGrad op (parameter gradients in the
  order they became ready: DDP buckets), ``act_bytes`` / ``x_act`` (bytes of a forward op's first
  activation input: pipeline stage boundaries).
* **Profiler events.** ``prof_events`` / ``prof_events_next`` (events starting in ``[a, b)`` / ``(a, b]``),
  ``measured_raw`` (the traced duration) and ``t_start`` (µs): what
  :mod:`~predictor.sources.traces.profiler_cost` needs.
* **Steps combined.** Steps with the same tasks become one graph with the per-task median (robust to a
  step disturbed by other jobs) or minimum (:func:`combine_steps`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from predictor.graph import Category, ExecutionGraph, ProcKind
from predictor.graph.edit import AUX_KEY, GraphEditor
from predictor.sources.traces.batch_dependence import (
    ParamInputs,
    detect_batch,
    rank_params,
    record_batch_exponents,
)
from predictor.sources.traces.build import ReplayGraph, build_graph
from predictor.sources.traces.errors import TraceError
from predictor.sources.traces.host_kernels import (
    host_kernel_kind,
    kernel_params,
    kernels_of,
    numel,
    reduction_kind,
    split_at_kernels,
    tensor_inputs,
)
from predictor.sources.traces.kineto import EventCat, KinetoTrace
from predictor.sources.traces.load import TraceSet
from predictor.sources.traces.modules import forward_op_of, module_blocks
from predictor.sources.traces.op_tree import (
    BACKWARD_OP_PREFIX,
    OpTree,
    calls_op,
    events_started,
    op_tree,
    thread_of_proc,
    top_op,
    with_et_dims,
)
from predictor.sources.traces.ops import dtype_bytes
from predictor.sources.traces.profiler_cost import inside_cost

__all__ = ["StepGraphs", "step_graphs", "combine_steps"]

PHASE_OTHER, PHASE_FWD, PHASE_BWD, PHASE_OPT = 0, 1, 2, 3
_ACC_GRAD = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"


@dataclass
class StepGraphs:
    """Per-step graphs of a captured run with traced durations (see the module docstring).

    ``steps``: one graph per ProfilerStep (all ranks); ``measured_step_s``: traced step time, slowest
    rank; ``combined``: one graph with the per-task ``combine`` statistic when every step has the same
    tasks, else None; ``inside_estimate_s``: median duration of trivial leaf ops on a CPU capture (the
    profiler's cost inside one event, seconds; 0 on GPU captures); ``counts``: kernel tasks by how
    their batch dependence was found, and tasks per step.
    """

    source: str
    steps: list[ExecutionGraph]
    step_names: list[str]
    measured_step_s: list[float]
    base_batch: int | None
    batch_source: str
    host_mode: bool
    world_size: int
    launch_fraction: float
    combined: ExecutionGraph | None
    inside_estimate_s: float
    counts: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def step_graphs(trace_set: TraceSet, rg: ReplayGraph | None = None, *, base_batch: int | None = None,
                combine: str = "median") -> StepGraphs:
    """Split, parameterise and annotate the steps of a captured run (see the module docstring).

    ``base_batch``: the captured batch size (default: detected); ``combine``: ``median``, ``min`` or
    ``none`` (keep the steps apart).

    Raises:
        TraceError: the trace has no ProfilerStep, or a step holds no tasks.
    """
    rg = rg or build_graph(trace_set)
    g = rg.graph
    if rg.task_event is None:
        raise TraceError(f"{trace_set.source}: replay graph without task events (rebuild it with build_graph)")
    notes: list[str] = []
    steps_df = rg.steps[rg.steps["start_task"] >= 0]
    if steps_df.empty:
        raise TraceError(f"{trace_set.source}: no ProfilerStep markers; capture with tuner.capture (or "
                         "torch.profiler with a schedule and prof.step()) to predict what-if changes")
    trees = [op_tree(with_et_dims(rt.kineto, rt.et)) for rt in trace_set.ranks]
    params = [rank_params(tr, rt.et, notes) for tr, rt in zip(trees, trace_set.ranks, strict=True)]
    host_mode = not set(g.proc_rank[g.proc_kind == ProcKind.GPU_STREAM].tolist())
    # captured batch size: first forward op of the first step with a non-parameter tensor input
    b0, how = base_batch, "given"
    if b0 is None:
        b0, how = detect_batch(trees[0], params[0], steps_df, rg, rg.t0_us)
    ann = _TaskAnnotator(rg, host_mode, b0)
    for r, (tree, prm) in enumerate(zip(trees, params, strict=True)):
        ann.rank(r, tree, prm, steps_df[steps_df["rank"] == r])
    whole, first_new = ann.build(trace_set.source)
    graphs, names, measured = _split_steps(whole, first_new, steps_df)
    if not graphs:
        raise TraceError(f"{trace_set.source}: the ProfilerSteps hold no tasks")
    combined = combine_steps(graphs, combine) if combine != "none" else None
    counts = ann.counts
    counts["tasks_per_step"] = int(np.median([sg.n_tasks for sg in graphs]))
    return StepGraphs(
        source=trace_set.source, steps=graphs, step_names=names, measured_step_s=measured, base_batch=b0,
        batch_source=how, host_mode=host_mode, world_size=trace_set.world_size,
        launch_fraction=rg.launch_fraction, combined=combined, inside_estimate_s=inside_cost(trees[0]) if host_mode else 0.0, counts=counts,
        notes=notes + ann.module_notes + list(rg.notes),
    )


class _TaskAnnotator:
    """Copies the replay graph's tasks into a :class:`GraphEditor`, splitting host ops into kernels
    (CPU ranks) and writing the auxiliary columns; built once over all steps."""

    def __init__(self, rg: ReplayGraph, host_mode: bool, b0: int | None) -> None:
        g = rg.graph
        self.rg, self.g, self.host_mode, self.b0 = rg, g, host_mode, b0
        t0 = rg.t0_us
        self.mstart_us = rg.measured_start * 1e6 + t0
        self.mend_us = rg.measured_end * 1e6 + t0
        self.counts = {"kernel_tasks": 0, "batch_dependent": 0, "batch_independent": 0}
        self.ed = GraphEditor(g)
        self.keep = np.zeros(g.n_tasks, dtype=bool)  # tasks copied as they are
        self.old_aux: dict[str, np.ndarray] = {}  # aux of kept tasks, by old index
        self.piece_aux: dict[str, list[tuple[int, float]]] = {}
        # split tasks: old task -> editor index of its first / last piece
        self.first_piece: dict[int, int] = {}
        self.last_piece: dict[int, int] = {}
        self.sig_ids: dict[str, int] = {}
        self.op_sig: dict[tuple[int, int], int] = {}
        self.is_gpu = g.is_gpu()
        self.module_notes: list[str] = []

    # ------------------------------------------------------------------ aux values
    def put_old(self, i: int, **vals: float) -> None:
        for k, v in vals.items():
            col = self.old_aux.get(k)
            if col is None:
                col = self.old_aux[k] = np.full(self.g.n_tasks, np.nan)
            col[i] = v

    def put_new(self, i: int, **vals: float) -> None:
        for k, v in vals.items():
            self.piece_aux.setdefault(k, []).append((i, float(v)))

    def put_piece(self, which: dict[int, int], i: int, **vals: float) -> None:
        if i in which:
            self.put_new(which[i], **vals)
        else:
            self.put_old(i, **vals)

    # ------------------------------------------------------------------ tasks
    def rank(self, r: int, tree: OpTree, prm: ParamInputs, steps) -> None:
        """Annotate (and, on a CPU rank, split) every task of graph rank ``r``."""
        g, kt = self.g, tree.kt
        annots = _annotation_intervals(kt)
        bwd_first = _first_backward(tree, steps, self.mstart_us)
        proc_thread = {p: (tree.thread_key.get(thread_of_proc(g.proc_names[p], kt))
                           if g.proc_kind[p] == ProcKind.CPU_THREAD else None)
                       for p in np.unique(g.proc[g.rank == r]).tolist()}
        fwd_of = forward_op_of(tree)  # layer structure: backward op -> forward op, repeated module blocks
        blocks = module_blocks(tree, [e for e in tree.events.tolist() if kt.cat[e] == EventCat.CPU_OP
                                      and e not in tree.parent and e not in fwd_of])
        if blocks.count:
            self.module_notes.append(f"rank {r}: repeated module blocks {blocks.description}")
        for i in np.flatnonzero(g.rank == r).tolist():
            e = int(self.rg.task_event[i])
            top = top_op(tree, e) if e >= 0 else -1
            a_us, b_us = float(self.mstart_us[i]), float(self.mend_us[i])
            phase = _phase(kt, top, annots, bwd_first) if top >= 0 else PHASE_OTHER
            base_aux = {"op": float(r * (1 << 32) + top) if top >= 0 else -1.0, "phase": float(phase),
                        "sig": float(self._signature_id(r, tree, top)),
                        "fwd_op": float(r * (1 << 32) + fwd_of[top]) if top in fwd_of else -1.0,
                        "mod_block": float(blocks.block_of.get(top, -1))}
            kernels = []
            if self.host_mode and g.kinds[g.kind[i]] == "cpu_op" and e >= 0:
                kernels = [x for x in kernels_of(tree, e)
                           if kt.ts[x] >= a_us - 0.01 and kt.ts[x] + kt.dur[x] <= b_us + 0.01]
            thread = proc_thread[int(g.proc[i])]
            if not kernels:
                self._keep_task(i, r, e, tree, prm, thread, a_us, b_us, base_aux)
            else:
                self._split_task(i, top, kernels, tree, prm, thread, a_us, b_us, base_aux)
            # structure annotations on the op's tasks (once per op: on the segment holding its start)
            if top >= 0 and a_us - 0.01 <= kt.ts[top] <= b_us + 0.01:
                self._structure(i, top, phase, tree, prm)

    def _signature_id(self, r: int, tree: OpTree, top: int) -> int:
        if top < 0:
            return -1
        sig = self.op_sig.get((r, top), -2)
        if sig == -2:
            sig = self.sig_ids.setdefault(_signature(tree, top), len(self.sig_ids))
            self.op_sig[(r, top)] = sig
        return sig

    def _keep_task(self, i: int, r: int, e: int, tree: OpTree, prm: ParamInputs, thread: int | None,
                   a_us: float, b_us: float, base_aux: dict[str, float]) -> None:
        """Task ``i`` copied as it is, with its aux values (and a GPU kernel's batch exponents)."""
        self.keep[i] = True
        self.put_old(i, prof_events=float(events_started(tree, thread, a_us, b_us)),
                     prof_events_next=float(events_started(tree, thread, a_us, b_us, shift=True)),
                     measured_raw=float(self.g.duration[i]), t_start=a_us, **base_aux)
        if self.is_gpu[i] and e >= 0:
            self.put_old(i, launch_op=float(r * (1 << 32) + e))  # the op that launched the kernel
            record_batch_exponents(self.put_old, i, self.g.kinds[self.g.kind[i]], tree.kt, e, prm, self.b0,
                                   self.counts)

    def _split_task(self, i: int, top: int, kernels: list[int], tree: OpTree, prm: ParamInputs,
                    thread: int | None, a_us: float, b_us: float, base_aux: dict[str, float]) -> None:
        """Host task ``i`` cut into its kernels and the host time between them."""
        g, kt = self.g, tree.kt
        pieces = split_at_kernels(tree, kernels, a_us, b_us)
        top_name = kt.names[kt.name[top]] if top >= 0 else g.names[g.name[i]]
        for j, (what, s_us, e_us, x) in enumerate(pieces):
            pos = i + 0.999 * j / len(pieces)
            dur = max(e_us - s_us, 0.0) * 1e-6
            if what == "host":
                k = int(self.ed.add(g.proc[i], top_name, "cpu_op", Category.CPU, pos, duration=dur)[0])
            else:
                k = self._add_kernel(g.proc[i], x, pos, dur, tree, prm)
            self.put_new(k, prof_events=float(events_started(tree, thread, s_us, e_us)),
                         prof_events_next=float(events_started(tree, thread, s_us, e_us, shift=True)),
                         measured_raw=dur, t_start=s_us, **base_aux)
            self.first_piece.setdefault(i, k)
            self.last_piece[i] = k

    def _add_kernel(self, proc: int, x: int, pos: float, dur: float, tree: OpTree, prm: ParamInputs) -> int:
        """A kernel task for op event ``x``, timed ``dur`` s; returns its editor index."""
        kt = tree.kt
        xname = kt.names[kt.name[x]]
        kk, cat = host_kernel_kind(xname)
        if kk == "embedding_bag_bwd" and calls_op(tree, x, "aten::_embedding_bag_dense_backward"):
            kk = "embedding_bag_bwd_dense"  # dense gradient: not the calibrated sparse kernel
        a = kt.args[x]
        if kk == "reduce":
            kk = reduction_kind(xname, a.get("Input Dims", []), a.get("Concrete Inputs"))
        p = kernel_params(kk, xname, a.get("Input Dims", []), a.get("Input type"), a.get("Concrete Inputs"))
        flops = p.pop("flops", math.nan)
        nbytes = p.pop("bytes", math.nan)
        k = int(self.ed.add(proc, xname, kk, cat, pos, duration=dur, flops=flops, nbytes=nbytes, params=p)[0])
        record_batch_exponents(self.put_new, k, kk, kt, x, prm, self.b0, self.counts)
        return k

    def _structure(self, i: int, top: int, phase: int, tree: OpTree, prm: ParamInputs) -> None:
        """``grad_bytes`` on an AccumulateGrad op's last task; ``act_bytes`` / ``x_act`` on a forward
        op's first."""
        kt = tree.kt
        names = kt.names
        if names[kt.name[top]] == _ACC_GRAD:
            kid = next((c for c in tree.children.get(top, [])
                        if names[kt.name[c]] == "torch::autograd::AccumulateGrad"), -1)
            if kid >= 0:
                ts_ = tensor_inputs(kt.args[kid].get("Input Dims", []), kt.args[kid].get("Input type"))
                if ts_:
                    dt = dtype_bytes((kt.args[kid].get("Input type") or ["float"])[0])
                    self.put_piece(self.last_piece, i, grad_bytes=numel(ts_[0][1]) * (dt if dt == dt else 4.0))
        if phase == PHASE_FWD:
            a = kt.args[top]
            tens = tensor_inputs(a.get("Input Dims", []), a.get("Input type"))
            fl = prm.flags(top, tens, a.get("Input type"))
            act = next(((p, sh) for (p, sh), f in zip(tens, fl, strict=True) if not f), None)
            if act is not None:
                types = a.get("Input type") or []
                dt = dtype_bytes(types[act[0]]) if act[0] < len(types) else 4.0
                dt = dt if dt == dt else 4.0
                b0 = self.b0
                has_b = b0 is not None and b0 >= 2 and any(d % b0 == 0 and d >= b0 for d in act[1])
                self.put_piece(self.first_piece, i, act_bytes=numel(act[1]) * dt, x_act=1.0 if has_b else 0.0)

    # ------------------------------------------------------------------ the graph
    def build(self, source: str) -> tuple[ExecutionGraph, np.ndarray]:
        """The annotated graph of all steps, and per replay task the built index of its first piece."""
        g, ed = self.g, self.ed
        kept = np.flatnonzero(self.keep)
        kept_new = ed.copy(kept, kept.astype(np.float64))
        for name, col in self.old_aux.items():
            ed.set_aux(name, kept_new, col[kept])
        for name, vals in self.piece_aux.items():
            ed.set_aux(name, np.asarray([v[0] for v in vals], dtype=np.int64), np.asarray([v[1] for v in vals]))
        first_new = np.full(g.n_tasks, -1, dtype=np.int64)
        last_new = np.full(g.n_tasks, -1, dtype=np.int64)
        first_new[kept] = kept_new
        last_new[kept] = kept_new
        if self.first_piece:
            fo = np.fromiter(self.first_piece.keys(), dtype=np.int64)
            first_new[fo] = np.fromiter(self.first_piece.values(), dtype=np.int64)
            last_new[fo] = np.fromiter((self.last_piece[i] for i in fo.tolist()), dtype=np.int64)
        if g.n_edges:  # the replay graph's edges onto the pieces: out of the last, into the first
            ed.edges(last_new[g.edge_src], first_new[g.edge_dst], g.edge_kind)
        ed.meta["source"] = source
        whole = ed.build()
        return _assign_gaps(whole), ed.built_index[first_new]


def _split_steps(whole: ExecutionGraph, first_new: np.ndarray,
                 steps_df) -> tuple[list[ExecutionGraph], list[str], list[float]]:
    """(graphs, names, traced seconds) of the ProfilerSteps, all ranks of a step in one graph."""
    graphs: list[ExecutionGraph] = []
    names: list[str] = []
    measured: list[float] = []
    for sname, rows in steps_df.groupby("name", sort=False):
        sel = np.zeros(whole.n_tasks, dtype=bool)
        for _, row in rows.iterrows():
            s0, s1 = first_new[int(row["start_task"])], first_new[int(row["end_task"])]
            sel |= _between_markers(whole, int(row["rank"]), int(s0), int(s1))
        idx = np.flatnonzero(sel)
        if idx.size == 0:
            continue
        graphs.append(_subgraph(whole, idx))
        names.append(str(sname))
        measured.append(float(rows["measured_s"].max()))
    return graphs, names, measured


def combine_steps(graphs: list[ExecutionGraph], how: str) -> ExecutionGraph | None:
    """One graph whose measured durations are the per-task ``min``/``median`` over steps of
    identical structure (same tasks, names, kinds, processors, edges); None if they differ."""
    if len(graphs) < 2:
        return None
    g0 = graphs[0]
    for g in graphs[1:]:
        if (g.n_tasks != g0.n_tasks or g.n_edges != g0.n_edges or g.kinds != g0.kinds
                or not np.array_equal(g.kind, g0.kind) or not np.array_equal(g.proc, g0.proc)
                or not np.array_equal(g.edge_src, g0.edge_src) or not np.array_equal(g.edge_dst, g0.edge_dst)):
            return None
    ed = GraphEditor(g0)
    idx = np.arange(g0.n_tasks)
    new = ed.copy(idx, idx.astype(np.float64))
    if g0.n_edges:
        ed.edges(new[g0.edge_src], new[g0.edge_dst], g0.edge_kind)
    out = ed.build()
    raws = np.stack([g.meta[AUX_KEY]["measured_raw"] for g in graphs])
    durs = np.stack([g.duration for g in graphs])
    stat = np.nanmin if how == "min" else np.nanmedian
    with np.errstate(all="ignore"):
        out.meta[AUX_KEY]["measured_raw"] = stat(raws, axis=0)
        out.duration[:] = stat(durs, axis=0)
    out.meta["combined_steps"] = {"steps": len(graphs), "statistic": how}
    return out


def _annotation_intervals(kt: KinetoTrace) -> dict[str, list[tuple[float, float]]]:
    """(start µs, end µs) of the ``Optimizer.step#`` (``opt``) and ``Optimizer.zero_grad#`` (``zero``)
    annotations."""
    out: dict[str, list[tuple[float, float]]] = {"opt": [], "zero": []}
    for e in np.flatnonzero(kt.cat == EventCat.USER_ANNOTATION).tolist():
        nm = kt.names[kt.name[e]]
        if nm.startswith("Optimizer.step#"):
            out["opt"].append((float(kt.ts[e]), float(kt.ts[e] + kt.dur[e])))
        elif nm.startswith("Optimizer.zero_grad#"):
            out["zero"].append((float(kt.ts[e]), float(kt.ts[e] + kt.dur[e])))
    return out


def _first_backward(tree: OpTree, steps, mstart_us: np.ndarray) -> list[tuple[float, float, float]]:
    """Per step of a rank: (step start µs, step end µs, first backward op start µs)."""
    kt = tree.kt
    bwd = sorted(float(kt.ts[e]) for e in tree.events.tolist()
                 if kt.cat[e] == EventCat.CPU_OP and e not in tree.parent
                 and kt.names[kt.name[e]].startswith(BACKWARD_OP_PREFIX))
    out = []
    for _, row in steps.iterrows():
        s0 = float(mstart_us[int(row["start_task"])])
        s1 = s0 + float(row["measured_s"]) * 1e6
        k = np.searchsorted(bwd, s0)
        fb = bwd[k] if k < len(bwd) and bwd[k] <= s1 else s1
        out.append((s0, s1, fb))
    return out


def _phase(kt: KinetoTrace, top: int, annots: dict, bwd_first: list[tuple[float, float, float]]) -> int:
    """Phase code of top-level op ``top``: backward op, inside the optimizer step, forward (before the
    step's first backward op), else other."""
    s = float(kt.ts[top])
    nm = kt.names[kt.name[top]]
    if nm.startswith(BACKWARD_OP_PREFIX):
        return PHASE_BWD
    if any(a <= s <= b for a, b in annots["opt"]):
        return PHASE_OPT
    if any(a <= s <= b for a, b in annots["zero"]):
        return PHASE_OTHER
    for s0, s1, fb in bwd_first:
        if s0 <= s <= s1:
            return PHASE_FWD if s < fb else PHASE_OTHER
    return PHASE_OTHER


def _signature(tree: OpTree, top: int) -> str:
    """Name and input shapes of op ``top`` and of its kernels: repeated layers have equal signatures."""
    kt = tree.kt
    a = kt.args[top]
    parts = [kt.names[kt.name[top]], str(a.get("Input Dims", ""))]
    for x in kernels_of(tree, top):
        parts.append(kt.names[kt.name[x]] + str(kt.args[x].get("Input Dims", "")))
    return "|".join(parts)


def _assign_gaps(g: ExecutionGraph) -> ExecutionGraph:
    """A T1 gap (and a GPU stream gap) belongs to the op that follows it on its processor."""
    aux = g.meta[AUX_KEY]
    op = aux["op"].copy()
    phase = aux["phase"].copy()
    sig = aux["sig"].copy()
    order = np.lexsort((np.arange(g.n_tasks), g.proc))
    for p in np.unique(g.proc):
        idx = order[g.proc[order] == p]
        nxt_op, nxt_phase, nxt_sig = -1.0, 0.0, -1.0
        for i in idx[::-1].tolist():
            kind = g.kinds[g.kind[i]]
            if kind in ("cpu_gap", "gpu_gap") and op[i] < 0:
                op[i], phase[i], sig[i] = nxt_op, nxt_phase, nxt_sig
            elif kind == "marker":
                nxt_op, nxt_phase, nxt_sig = -1.0, 0.0, -1.0
            elif op[i] >= 0:
                nxt_op, nxt_phase, nxt_sig = op[i], phase[i], sig[i]
    aux["op"], aux["phase"], aux["sig"] = op, phase, sig
    return g


def _between_markers(g: ExecutionGraph, rank: int, s0: int, s1: int) -> np.ndarray:
    """Tasks of ``rank`` inside a step: on the markers' processor between them; elsewhere, tasks
    whose measured start lies in the step's measured window."""
    aux = g.meta[AUX_KEY]
    sel = np.zeros(g.n_tasks, dtype=bool)
    proc = g.proc[s0]
    on = np.flatnonzero(g.proc == proc)
    sel[on[(on >= s0) & (on <= s1)]] = True
    # other processors of the rank: by the step rank annotation and array order between the
    # first and last task of the step window on the marker thread (their own program order)
    t_lo, t_hi = aux["t_start"][s0], aux["t_start"][s1]
    others = (g.rank == rank) & (g.proc != proc)
    sel |= others & (aux["t_start"] >= t_lo) & (aux["t_start"] <= t_hi)
    return sel


def _subgraph(g: ExecutionGraph, idx: np.ndarray) -> ExecutionGraph:
    """Tasks ``idx`` of ``g`` with the edges between them."""
    ed = GraphEditor(g)
    new = ed.copy(idx, idx.astype(np.float64))
    remap = np.full(g.n_tasks, -1, dtype=np.int64)
    remap[idx] = new
    if g.n_edges:
        s, d = remap[g.edge_src], remap[g.edge_dst]
        keep = (s >= 0) & (d >= 0)
        ed.edges(s[keep], d[keep], g.edge_kind[keep])
    return ed.build()  # processors left without tasks stay: they cost nothing
