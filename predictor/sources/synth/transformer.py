"""Transformer (GPT-style, dense or MoE) training under Megatron 3D parallelism -> ExecutionGraph.

:func:`build_transformer_graph` emits one training iteration of a
:class:`~predictor.sources.synth.transformer_spec.TransformerSpec` trained with a
:class:`~predictor.sources.synth.transformer_spec.ParallelPlan` the way Megatron-LM runs it
(Narayanan et al. SC21; Korthikanti et al. 2022); :func:`build_stage_graph` one micro-batch
through one pipeline stage (Alpa's profiling unit). The pieces:

* :mod:`~predictor.sources.synth.transformer_spec` — the model, the plan, :func:`check_plan`;
* :mod:`~predictor.sources.synth.transformer_kernels` — the kernels of a layer, the embedding and
  the head (:mod:`~predictor.sources.synth.transformer_emitter`: the plan's process groups and the
  step emitter);
* :mod:`~predictor.sources.synth.transformer_steps` — the templates of a forward/backward step,
  of a receive and of the end of the iteration (gradient reduce, optimizer);
* this module — the pipeline: templates stamped in schedule order on every stage, wired by
  p2p transfers;
* :mod:`~predictor.sources.synth.transformer_memory` — the memory per stage.

Pipeline
--------
Each stage runs its steps in 1F1B or interleaved order
(:mod:`predictor.sources.synth.pipeline_schedule`); each activation (gradient) goes to the next
(previous) stage as a send/recv pair — a collective group of two on dedicated p2p streams.
The send waits for the step that produced the tensor, the receive is posted once the
receiver's previous step is done (NCCL's stream waits for the compute stream), and the pair
ends together; Megatron's blocking p2p (``torch.cuda.synchronize`` after the batched
send/recv) is a CPU sync before the receiving step. A transfer that crosses nodes after its
sender launched its data-parallel buckets over the network (``overlap_grad_reduce``) shares
the sender's NICs with them (``nic_share`` 2); the blocking exchange never overlaps the stage's
own TP collectives, so it shares nothing else. The sender does not wait for its receiver
(a simplification: in the 1F1B steady state it waits for the next gradient anyway). With
``pp_scatter_gather`` (SC21 §4.1) each rank sends ``1/t`` of the tensor and the receiver
all-gathers it over NVLink.

Symmetry: one simulated rank per pipeline stage
-----------------------------------------------
Megatron splits evenly (``heads % tp == 0``, FFN and the padded vocabulary divisible by
``tp``, equal micro-batches on every data-parallel replica, balanced MoE routing), so the
``tp x dp`` devices of one pipeline stage run the same kernels on the same shapes in the same
order. A collective among such peers starts at the same moment on all of them, so it needs no
cross-rank synchronisation in the simulation: its duration follows from its size, its group
size (``world``) and the nodes the group spans (``nodes``). The graph therefore holds **one
representative rank per pipeline stage** (graph rank ``s`` = global rank ``s * dp * tp``,
Megatron's rank order pp > dp > tp) and only the collectives that cross stages are real
groups between representatives: the p2p sends/receives, the tied-embedding all-reduce and the
gradient-norm all-reduce. A 1024-GPU plan with ``pp=8`` is an 8-rank graph.

Graph size: with ``detail="kernel"`` every step is stamped at kernel level from a template
(:meth:`~predictor.graph.GraphBuilder.stamp`); ``detail="stage"`` replaces each
forward/backward step by one task whose duration is the simulated span of that step's kernel
template (the gray-box split of PredTOP: stage latency + pipeline structure), keeping kernel
detail only where gradients are reduced; ``"auto"`` chooses ``stage`` above
``AUTO_KERNEL_TASK_LIMIT`` tasks. The two agree within 0.3% when kernels dominate
(``tests/test_transformer.py``); when a step is paced by its CPU launches, stage detail misses
a little of the launch overhead at step boundaries (7% on a toy 512-wide model).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from predictor.graph import Category, DepKind, ExecutionGraph, GraphBuilder, ProcKind
from predictor.sources.synth.emit import ExecMode
from predictor.sources.synth.pipeline_schedule import ScheduleError, Step, schedule
from predictor.sources.synth.transformer_emitter import group_span
from predictor.sources.synth.transformer_spec import (
    MLASpec,
    MoESpec,
    ParallelPlan,
    PlanError,
    TransformerSpec,
    check_plan,
)
from predictor.sources.synth.transformer_steps import StepTemplates

__all__ = [
    "MLASpec",
    "MoESpec",
    "TransformerSpec",
    "ParallelPlan",
    "PlanError",
    "check_plan",
    "build_transformer_graph",
    "transformer_timing",
    "group_span",
    "build_stage_graph",
    "AUTO_KERNEL_TASK_LIMIT",
]

#: ``detail="auto"`` stamps kernels up to this many tasks, then switches to stage detail
AUTO_KERNEL_TASK_LIMIT = 400_000


@dataclass
class _Recv:
    """Where a p2p transfer lands on its receiver."""

    sync: int  # the CPU sync after the blocking exchange
    target: int  # first task the transfer feeds (gather or the step's first kernel)
    posted_after: int  # the receiver's previous kernel (NCCL's stream waits for it), -1 for none


class _PipelineAssembly:
    """Stamps the step templates of every stage in schedule order, then wires the p2p transfers."""

    def __init__(self, templates: StepTemplates, detail: str) -> None:
        self.tpl, self.detail = templates, detail
        self.gb = GraphBuilder()
        device = templates.mode == "device"
        self.edge_gpu = DepKind.GPU_GPU if device else DepKind.CPU_CPU
        self.edge_sync = DepKind.GPU_CPU if device else DepKind.CPU_CPU
        self.stream_kind = ProcKind.GPU_STREAM if device else ProcKind.CPU_THREAD
        self.recv_at: dict[tuple[str, int, int], _Recv] = {}
        # per sender: (phase, micro-batch, virtual stage, last task of the step, buckets in flight)
        self.sends: list[list[tuple[str, int, int, int, bool]]] = [[] for _ in range(templates.p)]
        #: stages whose data-parallel buckets have been launched (a final backward step stamped)
        self.buckets_out: set[int] = set()
        self.group_tied = self.gb.new_group() if templates.p > 1 else -1
        self.group_norm = self.gb.new_group()

    def stage(self, stage: int) -> None:
        """Every step of ``stage`` in schedule order, then its end of the iteration."""
        tpl, gb = self.tpl, self.gb
        gb.processor(stage, ProcKind.CPU_THREAD, "cpu")
        if tpl.mode == "device":
            for name in ("stream compute", "stream comm"):
                gb.processor(stage, ProcKind.GPU_STREAM, name)
        dp_tasks: list[int] = []
        last_compute = -1
        gathers = None
        if tpl.plan.gathers_params_in_forward:  # the last iteration's updated parameters, gathered during this one
            blk = tpl.param_gather_block(stage)
            off = gb.stamp(blk, stage)
            gathers = {k: [off + i for i in blk.meta["markers"][k]] for k in ("head", "rest")}
        for st in schedule(tpl.plan.schedule, tpl.p, tpl.m, stage, tpl.v):
            last_compute = self._step(stage, st, last_compute, dp_tasks, gathers)
        self._end_of_iteration(stage, last_compute, dp_tasks)

    def _step(self, stage: int, st: Step, posted_after: int, dp_tasks: list[int],
              gathers: dict[str, list[int]] | None = None) -> int:
        """Stamp one step (after its receive preamble, if it receives); returns its last compute task.
        ``gathers``: the parameter all-gathers each chunk's first forward waits for (``head`` at its start,
        ``rest`` at its end; at stage detail both before the step) and launches (the chunk's ``rest``, or
        with :attr:`ParallelPlan.prefetches_chunk_params` the next chunk's gather)."""
        tpl, gb = self.tpl, self.gb
        vs = st.chunk * tpl.p + stage
        first, last = tpl.ends(st, stage)
        recv = (st.phase == "F" and not first) or (st.phase == "B" and not last)
        send = (st.phase == "F" and not last) or (st.phase == "B" and not first)
        final = st.phase == "B" and st.micro_batch == tpl.m - 1 and tpl.plan.overlap_grad_reduce
        sync = gather = None
        if recv:
            blk = tpl.preamble_block(tpl.sg)
            off = gb.stamp(blk, stage)
            mk = blk.meta["markers"]
            sync, gather = off + mk["sync"], (off + mk["gather"] if "gather" in mk else None)
        if final or self.detail == "kernel":
            blk = tpl.step_block(st.phase, first, last, final, tpl.layers_at(st, stage), tpl.dense_at(st, stage))
        else:
            blk = tpl.macro_block(st.phase, first, last, tpl.layers_at(st, stage), tpl.dense_at(st, stage))
        off = gb.stamp(blk, stage)
        mk = blk.meta["markers"]
        first_k, last_k = off + mk["first"], off + mk["last"]
        dp_tasks += [off + i for i in mk.get("dp", [])]
        if gathers is not None and st.phase == "F" and st.micro_batch == 0:
            heads, c = gathers["head"], st.chunk
            head, rest = heads[c], gathers["rest"][c]
            gb.edge(head, first_k, self.edge_gpu)
            if tpl.plan.prefetches_chunk_params:  # this forward launches chunk c + 1's gather (0 and 1 at the start)
                if 1 <= c < len(heads) - 1:
                    gb.edge(first_k, heads[c + 1], self.edge_gpu)
            elif rest != head and first_k != last_k:  # the first bucket's wait launches the rest
                gb.edge(first_k, rest, self.edge_gpu)
            gb.edge(rest, last_k, self.edge_gpu)
        if recv:
            if gather is not None:
                gb.edge(gather, first_k, self.edge_gpu)  # gathered before the step starts
            src_vs = vs - 1 if st.phase == "F" else vs + 1
            target = gather if gather is not None else first_k
            self.recv_at[(st.phase, st.micro_batch, src_vs)] = _Recv(sync, target, posted_after)
        if final:
            self.buckets_out.add(stage)
        if send:
            self.sends[stage].append((st.phase, st.micro_batch, vs, last_k, stage in self.buckets_out))
        return last_k

    def _end_of_iteration(self, stage: int, last_compute: int, dp_tasks: list[int]) -> None:
        """The final block of ``stage``, after its last step and its gradient buckets."""
        blk = self.tpl.final_block(stage)
        mk = blk.meta["markers"]
        gmap = {}
        if "tied" in mk["groups"]:
            gmap[mk["groups"]["tied"]] = self.group_tied
        if "norm" in mk["groups"]:  # the eager program of one process has no norm all-reduce
            gmap[mk["groups"]["norm"]] = self.group_norm
        off = self.gb.stamp(blk, stage, group_map=gmap)
        for w in mk["wait_compute"]:
            self.gb.edge(last_compute, off + w, self.edge_gpu)
        for d in dp_tasks:
            self.gb.edge(d, off + mk["grad_norm"], self.edge_gpu)

    def p2p(self) -> None:
        """One send/recv pair per activation and gradient that crosses stages."""
        tpl, gb, p = self.tpl, self.gb, self.tpl.p
        if p == 1:
            return
        dp_net = tpl.lay.dp[1] > 1 and tpl.plan.overlap_grad_reduce
        for s in range(p):
            for phase, mb, vs, last_k, buckets in self.sends[s]:
                forward = phase == "F"
                dst = (s + 1) % p if forward else (s - 1) % p
                link = tpl.lay.pp_next[s] if forward else tpl.lay.pp_next[dst]
                g = gb.new_group()
                params = {"msg_bytes": tpl.msg_act, "world": 2, "nodes": link[1], "dtype_bytes": tpl.spec.dtype_bytes}
                if buckets and dp_net and link[1] > 1:  # the sender's gradient buckets hold half its NICs
                    params["nic_share"] = 2.0
                tag = "activation" if forward else "gradient"
                snd_proc = gb.processor(s, self.stream_kind, f"stream p2p send {'next' if forward else 'prev'}")
                rcv_proc = gb.processor(dst, self.stream_kind, f"stream p2p recv {'prev' if forward else 'next'}")
                snd = gb.task(snd_proc, f"send {tag} (virtual stage {vs})", "send_recv", Category.COMMUNICATION,
                               group=g, params=params)
                rcv = gb.task(rcv_proc, f"recv {tag} (virtual stage {vs})", "send_recv", Category.COMMUNICATION,
                               group=g, params=params)
                gb.edge(last_k, snd, self.edge_gpu)
                r = self.recv_at.get((phase, mb, vs))
                if r is None:  # pragma: no cover - schedules always pair sends with receives
                    raise ScheduleError(f"no receiver for {phase} mb{mb} of virtual stage {vs}")
                gb.edge(rcv, r.target, self.edge_gpu)
                if r.posted_after >= 0:
                    gb.edge(r.posted_after, rcv, self.edge_gpu)
                gb.edge(rcv, r.sync, self.edge_sync)

    def build(self) -> ExecutionGraph:
        """All stages, the p2p transfers, and the graph's metadata."""
        tpl, plan = self.tpl, self.tpl.plan
        for stage in range(tpl.p):
            self.stage(stage)
        self.p2p()
        self.gb.meta.update(
            {
                "workload": "transformer",
                "model": tpl.spec.name,
                "plan": plan.label(),
                "n_ranks": tpl.p,
                "representatives": [s * plan.dp * plan.cp * plan.tp for s in range(tpl.p)],
                "devices": plan.devices,
                "detail": self.detail,
            }
        )
        return self.gb.build()


def transformer_timing(platform, models=None, *, source: str = "analytic"):
    """A :class:`~predictor.timing.kernels.ModelTiming` for transformer graphs, measured durations kept
    (stage-detail steps carry theirs); collectives read the ``nodes`` their group spans."""
    from predictor.timing.kernels import ModelTiming, analytic_models

    return ModelTiming(platform, analytic_models() if models is None else models, keep_measured=True, source=source)


def build_transformer_graph(
    spec: TransformerSpec,
    plan: ParallelPlan,
    *,
    devices_per_node: int = 8,
    detail: Literal["kernel", "stage", "auto"] = "auto",
    timing=None,
    mode: ExecMode = "device",
    check: bool = True,
) -> ExecutionGraph:
    """The iteration graph: one representative rank per pipeline stage (see the module docstring).

    ``timing`` (a :class:`~predictor.simulate.Timing`, normally :func:`transformer_timing`) is
    needed for ``detail="stage"``/``"auto"``: it times the step templates whose spans become
    the stage tasks. Raises :class:`PlanError` for an impossible plan.
    """
    if check:
        check_plan(spec, plan)
    if detail not in ("kernel", "stage", "auto"):
        raise PlanError(f"detail must be kernel, stage or auto (got {detail!r})")
    templates = StepTemplates(spec, plan, devices_per_node, mode, timing)
    if detail == "auto":
        detail = "kernel" if templates.estimate_tasks() <= AUTO_KERNEL_TASK_LIMIT else "stage"
    if detail == "stage" and timing is None:
        raise PlanError("detail='stage' needs a timing to time the step templates")
    return _PipelineAssembly(templates, detail).build()


def build_stage_graph(
    spec: TransformerSpec,
    plan: ParallelPlan,
    n_layers: int,
    *,
    with_embedding: bool,
    with_head: bool,
    devices_per_node: int = 8,
    mode: ExecMode = "device",
) -> ExecutionGraph:
    """One micro-batch through one pipeline stage: the forward then the backward of ``n_layers``
    layers (plus the embedding / output layer), on one device of a ``plan.tp``-way TP group.

    This is the unit Alpa profiles for its stage-construction pass (no gradient reduce, no
    optimizer step, no pipeline communication); ``plan.micro_batch`` is the per-device batch.
    """
    if n_layers < 1:
        raise PlanError(f"a stage needs at least one layer (got {n_layers})")
    stage_spec = replace(spec, layers=n_layers)
    if spec.moe is not None and not with_embedding:  # an MoE model's dense layers are the first stage's
        stage_spec = replace(stage_spec, moe=replace(spec.moe, dense_layers=0))
    stage_plan = replace(plan, pp=1, dp=1, global_batch=plan.micro_batch, schedule="1f1b")
    check_plan(stage_spec, stage_plan)
    templates = StepTemplates(stage_spec, stage_plan, devices_per_node, mode)
    gb = GraphBuilder()
    fwd = templates.step_block("F", with_embedding, with_head, False)
    bwd = templates.step_block("B", with_embedding, with_head, False)
    gb.stamp(fwd, 0)
    gb.stamp(bwd, 0)  # stream and thread order chain the backward after the forward
    gb.meta.update({"workload": "transformer-stage", "model": spec.name, "layers": n_layers,
                     "embedding": with_embedding, "head": with_head, "tp": plan.tp, "micro_batch": plan.micro_batch})
    return gb.build()
