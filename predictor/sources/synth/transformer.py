"""Transformer (GPT-style, dense or MoE) training under Megatron 3D parallelism -> ExecutionGraph.

:class:`TransformerSpec` is the model (layers, hidden, heads, sequence, vocabulary, FFN width,
dense or mixture-of-experts, dtype, attention kernel); :class:`ParallelPlan` is how it is
trained (tensor ``tp`` x pipeline ``pp`` x data ``dp`` parallel, micro-batch, global batch,
1F1B or interleaved schedule, sequence parallelism, activation recomputation, expert
parallelism, distributed optimizer, gradient-reduce overlap). :func:`build_transformer_graph`
emits one training iteration the way Megatron-LM runs it (Narayanan et al. SC21; Korthikanti
et al. 2022); :func:`predictor.sources.synth.transformer_memory.memory_per_stage` gives the memory.

What one iteration of one rank contains
---------------------------------------
* **Layers** (per micro-batch, per model chunk): layer norm -> QKV GEMM (column-parallel,
  ``3h/t`` outputs) -> attention core -> output projection (row-parallel, ``h/t`` inputs) ->
  TP all-reduce -> bias-dropout-add -> layer norm -> FC1 (column) -> GeLU -> FC2 (row) -> TP
  all-reduce -> bias-dropout-add. With sequence parallelism each all-reduce becomes a
  reduce-scatter and an all-gather precedes the next column-parallel GEMM; layer norms and
  dropouts run on ``1/t`` of the tokens (a dropout's backward is a multiply by its saved mask,
  kind ``mul``: it draws no random numbers). Backward mirrors it: dgrad and wgrad GEMMs, the
  conjugate collectives (all-reduce of the input gradient of column-parallel blocks), and
  with SP the re-gather of the GEMM input for wgrad (Korthikanti §4.2.2).
* **Attention**: ``attention="flash"`` (default) is one fused kernel per pass (FLOPs of the
  causal half, ``4 b s^2 h / t x 1/2``; backward 2.5x forward, since it recomputes the scores)
  and stores no ``s x s`` matrix; ``"unfused"`` is the pre-FlashAttention Megatron path the
  2021-2022 papers measured: batched QK^T GEMM, fused scale-mask-softmax, dropout, GEMM with V
  (full ``s x s``, no causal skipping).
* **MoE** (``moe``): router GEMM + top-k, all-to-all dispatch over the expert-parallel group
  (``ep`` ranks of the data-parallel group), the local experts' GEMMs on the routed tokens
  (balanced routing, ``top_k x capacity_factor`` copies per token), all-to-all combine.
* **Embedding** on the first virtual stage (vocab-parallel: all-reduce over TP); output layer,
  vocab-parallel cross-entropy on the last.
* **Recomputation**: ``full`` re-runs each layer's forward (with its collectives) right before
  its backward; ``selective`` re-runs the attention core (nothing for flash attention, which
  recomputes internally).
* **Pipeline**: the stage's steps in 1F1B or interleaved order
  (:mod:`predictor.sources.synth.pipeline_schedule`); each activation (gradient) goes to the next
  (previous) stage as a send/recv pair — a collective group of two on dedicated p2p streams.
  The send waits for the step that produced the tensor, the receive is posted once the
  receiver's previous step is done (NCCL's stream waits for the compute stream), and the pair
  ends together; Megatron's blocking p2p (``torch.cuda.synchronize`` after the batched
  send/recv) is a CPU sync before the receiving step. The sender does not wait for its receiver
  (a simplification: in the 1F1B steady state it waits for the next gradient anyway). With
  ``pp_scatter_gather`` (SC21 §4.1) each rank sends ``1/t`` of the tensor and the receiver
  all-gathers it over NVLink.
* **Data parallelism**: gradients are reduced in buckets (Megatron DDP: ``max(4e7, 1e6 dp)``
  parameters) on the communication stream as the last micro-batch's backward produces them
  (``overlap_grad_reduce``), or all after the last backward; all-reduce, or reduce-scatter +
  all-gather of the parameters with the distributed optimizer. Expert gradients reduce over
  the expert-data-parallel group (``dp / ep``).
* **End of iteration**: tied-embedding gradient all-reduce between the first and last stage,
  gradient-norm all-reduce over the model-parallel group (clipping), Adam step.

Every framework op costs CPU time (T1, T2, one T4 launch per kernel, T5, T3 — the
:class:`~predictor.sources.synth.emit.OpEmitter` of every synthesiser), so CPU-bound small models
show launch gaps. FLOPs and bytes are set on every kernel. Units: elements, bytes, seconds.

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
(:class:`~predictor.graph.assemble.GraphAssembler`); ``detail="stage"`` replaces each
forward/backward step by one task whose duration is the simulated span of that step's kernel
template (the gray-box split of PredTOP: stage latency + pipeline structure), keeping kernel
detail only where gradients are reduced; ``"auto"`` chooses ``stage`` above
``AUTO_KERNEL_TASK_LIMIT`` tasks. The two agree within 0.3% when kernels dominate
(``tests/test_transformer.py``); when a step is paced by its CPU launches, stage detail misses
a little of the launch overhead at step boundaries (7% on a toy 512-wide model).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

import numpy as np

from predictor.graph import Category, DepKind, ExecutionGraph, GraphBuilder, Overhead, ProcKind
from predictor.graph.assemble import GraphAssembler
from predictor.sources.synth.emit import ExecMode, Kernel, OpEmitter, column_sum, concat, eltwise, gemm
from predictor.sources.synth.pipeline_schedule import ScheduleError, Step, schedule

__all__ = [
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

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
#: ``detail="auto"`` stamps kernels up to this many tasks, then switches to stage detail
AUTO_KERNEL_TASK_LIMIT = 400_000
#: Adam step bytes per parameter: read fp32 param, grad, m, v; write param, m, v, 16-bit copy;
#: zero the fp32 gradient (Megatron's fused multi-tensor Adam + zero_grad)
ADAM_BYTES_PER_PARAM = 34.0


class PlanError(ValueError):
    """A model or plan that cannot run (one line naming the problem)."""


# ============================================================================ specs
@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts MLP: ``experts`` per layer, each token routed to ``top_k`` of them."""

    experts: int
    top_k: int = 2
    capacity_factor: float = 1.0


@dataclass(frozen=True)
class TransformerSpec:
    """A GPT-style decoder. Sizes are element counts; ``ffn`` defaults to ``ffn_mult * hidden``."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int | None = None
    ffn_mult: float = 4.0
    moe: MoESpec | None = None
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    attention: Literal["flash", "unfused"] = "flash"
    causal: bool = True
    tie_embeddings: bool = True
    name: str = "transformer"
    #: the training program: ``"megatron"`` (fused bias-dropout-add, bias-GeLU, vocab-parallel
    #: cross-entropy, multi-tensor Adam: what Megatron-LM runs) or ``"eager"`` (plain PyTorch
    #: modules: separate dropout and residual add, bias-gradient reductions, layer-norm backward in
    #: three kernels, reshape copies around attention, the causal mask copied into the scores (baddbmm),
    #: log-softmax + NLL, a host-only AccumulateGrad
    #: op per parameter tensor, grad-norm and fused Adam of ``torch.optim``); tensor parallelism,
    #: if any, keeps Megatron's collectives
    program: Literal["megatron", "eager"] = "megatron"

    @property
    def ffn_size(self) -> int:
        return int(self.ffn) if self.ffn else int(round(self.ffn_mult * self.hidden))

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def head_dim(self) -> float:
        return self.hidden / self.heads

    def padded_vocab(self, tp: int) -> int:
        """Megatron pads the vocabulary to a multiple of ``128 * tp``."""
        unit = 128 * tp
        return int(math.ceil(self.vocab / unit) * unit)

    def param_count(self) -> float:
        """Parameters of the whole model (embeddings counted once when tied)."""
        h, f = self.hidden, self.ffn_size
        attn = 4 * h * h + 4 * h
        mlp = 2 * h * f + f + h if self.moe is None else h * self.moe.experts + self.moe.experts * (2 * h * f + f + h)
        per_layer = attn + mlp + 4 * h
        emb = self.vocab * h + self.seq * h
        return self.layers * per_layer + emb + 2 * h + (0 if self.tie_embeddings else self.vocab * h)

    def forward_flops_per_sequence(self) -> float:
        """Matmul FLOPs of one forward pass over one sequence (Narayanan et al. SC21 §5.1 accounting)."""
        s, h, f = self.seq, self.hidden, self.ffn_size
        mlp = 4.0 * s * h * f * (self.moe.top_k if self.moe else 1)
        layer = 8.0 * s * h * h + mlp + 4.0 * s * s * h
        return self.layers * layer + 2.0 * s * h * self.vocab

    def iteration_flops(self, global_batch: int, recompute: str = "none") -> float:
        """Model FLOPs of one iteration: 3 passes (forward + backward) of the layers and the head,
        plus one more forward of the layers with full recomputation (SC21 eq. 3 uses 4)."""
        s, h = self.seq, self.hidden
        head = 2.0 * s * h * self.vocab
        layers = self.forward_flops_per_sequence() - head
        passes = 4.0 if recompute == "full" else 3.0
        return global_batch * (passes * layers + 3.0 * head)

    def validate(self) -> None:
        for field_name in ("layers", "hidden", "heads", "seq", "vocab"):
            if getattr(self, field_name) < 1:
                raise PlanError(f"model {field_name} must be >= 1 (got {getattr(self, field_name)})")
        if self.hidden % self.heads:
            raise PlanError(f"hidden size {self.hidden} is not divisible by {self.heads} attention heads")
        if self.moe is not None and (self.moe.experts < 1 or not 1 <= self.moe.top_k <= self.moe.experts):
            raise PlanError(f"MoE needs 1 <= top_k <= experts (got top_k={self.moe.top_k}, experts={self.moe.experts})")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ParallelPlan:
    """How a :class:`TransformerSpec` is trained. ``global_batch`` and ``micro_batch`` are sequences."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    schedule: Literal["1f1b", "interleaved"] = "1f1b"
    virtual_stages: int = 2  #: model chunks per rank with the interleaved schedule
    sequence_parallel: bool = False
    recompute: Literal["none", "selective", "full"] = "none"
    ep: int = 1  #: expert-parallel degree (divides dp), MoE only
    distributed_optimizer: bool = False
    overlap_grad_reduce: bool = True
    tp_comm_overlap: bool = False  #: overlap the input-gradient all-reduce with the wgrad GEMM
    pp_scatter_gather: bool = True
    grad_reduce_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per data-parallel replica and iteration."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def virtual_stages_effective(self) -> int:
        return self.virtual_stages if (self.schedule == "interleaved" and self.pp > 1) else 1

    def label(self) -> str:
        """Short human-readable name, e.g. ``tp4-pp8-dp16-mb2-1f1b-full``."""
        sched = self.schedule if self.schedule == "1f1b" or self.pp == 1 else f"int{self.virtual_stages}"
        extra = "-sp" if self.sequence_parallel and self.tp > 1 else ""
        extra += f"-ep{self.ep}" if self.ep > 1 else ""
        extra += "-zero1" if self.distributed_optimizer else ""
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}-mb{self.micro_batch}-{sched}-{self.recompute}{extra}"

    def to_dict(self) -> dict:
        return asdict(self)


def check_plan(spec: TransformerSpec, plan: ParallelPlan, devices: int | None = None) -> None:
    """Raise :class:`PlanError` (one line) if ``plan`` cannot train ``spec`` on ``devices`` devices."""
    spec.validate()
    for name in ("tp", "pp", "dp", "micro_batch", "global_batch", "ep"):
        if getattr(plan, name) < 1:
            raise PlanError(f"{name} must be >= 1 (got {getattr(plan, name)})")
    if spec.heads % plan.tp:
        raise PlanError(f"{spec.heads} attention heads are not divisible by tp={plan.tp}")
    if spec.ffn_size % plan.tp:
        raise PlanError(f"FFN size {spec.ffn_size} is not divisible by tp={plan.tp}")
    if plan.pp > spec.layers:
        raise PlanError(f"pp={plan.pp} pipeline stages but the model has only {spec.layers} layers")
    v = plan.virtual_stages_effective
    if plan.schedule == "interleaved" and plan.pp > 1 and plan.virtual_stages < 2:
        raise PlanError("the interleaved schedule needs virtual_stages >= 2")
    if spec.layers % (plan.pp * v):
        what = f"pp x virtual_stages = {plan.pp * v}" if v > 1 else f"pp={plan.pp}"
        raise PlanError(f"{spec.layers} layers cannot be split evenly over {what} pipeline chunks")
    if plan.global_batch % (plan.dp * plan.micro_batch):
        raise PlanError(
            f"global batch {plan.global_batch} is not divisible by dp x micro_batch = {plan.dp} x {plan.micro_batch}"
        )
    if v > 1 and plan.micro_batches % plan.pp:
        raise PlanError(
            f"the interleaved schedule needs the micro-batches per replica ({plan.micro_batches}) divisible by pp={plan.pp}"
        )
    if plan.ep > 1 and spec.moe is None:
        raise PlanError(f"ep={plan.ep} needs a MoE model (the model has no experts)")
    if spec.moe is not None:
        if plan.dp % plan.ep:
            raise PlanError(f"expert parallelism ep={plan.ep} must divide dp={plan.dp}")
        if spec.moe.experts % plan.ep:
            raise PlanError(f"{spec.moe.experts} experts are not divisible by ep={plan.ep}")
    if plan.sequence_parallel and (plan.micro_batch * spec.seq) % plan.tp:
        raise PlanError(f"sequence parallelism needs micro_batch x seq divisible by tp={plan.tp}")
    if devices is not None and plan.devices != devices:
        raise PlanError(f"tp x pp x dp = {plan.tp} x {plan.pp} x {plan.dp} = {plan.devices}, but the cluster has {devices} devices")


# ============================================================================ layout
def group_span(ranks: np.ndarray, devices_per_node: int) -> tuple[int, int]:
    """(world, nodes spanned) of a group of global ranks on ``devices_per_node``-device nodes."""
    ranks = np.asarray(ranks, dtype=np.int64)
    return int(ranks.size), int(np.unique(ranks // max(devices_per_node, 1)).size)


@dataclass(frozen=True)
class _Layout:
    """Group sizes and node spans of the plan's process groups (Megatron rank order pp > dp > tp)."""

    tp: tuple[int, int]
    dp: tuple[int, int]
    ep: tuple[int, int]
    edp: tuple[int, int]  # expert-data-parallel
    mp: tuple[int, int]  # model-parallel (grad-norm) group: tp x pp (x dp with the distributed optimizer)
    pp_next: list[tuple[int, int]]  # link stage s -> s+1 (mod p)
    tied: tuple[int, int]

    @classmethod
    def of(cls, plan: ParallelPlan, dpn: int) -> _Layout:
        tp, dp, pp, ep = plan.tp, plan.dp, plan.pp, plan.ep
        stride = tp * dp

        def rank(s: int, d: int, t: int) -> int:
            return s * stride + d * tp + t

        tp_g = group_span(np.arange(tp), dpn)
        dp_g = group_span(np.arange(dp) * tp, dpn)
        ep_g = group_span(np.arange(ep) * tp, dpn)
        edp_g = group_span(np.arange(0, dp, ep) * tp, dpn)
        mp_ranks = [rank(s, d, t) for s in range(pp) for t in range(tp) for d in range(dp if plan.distributed_optimizer else 1)]
        mp_g = group_span(np.asarray(mp_ranks), dpn)
        links = [group_span(np.asarray([rank(s, 0, 0), rank((s + 1) % pp, 0, 0)]), dpn) for s in range(pp)]
        tied = group_span(np.asarray([rank(0, 0, 0), rank(pp - 1, 0, 0)]), dpn)
        return cls(tp_g, dp_g, ep_g, edp_g, mp_g, links, tied)


def _coll(name: str, kind: str, msg_bytes: float, span: tuple[int, int], dt: int) -> Kernel:
    world, nodes = span
    return (name, kind, Category.COMMUNICATION, {"msg_bytes": msg_bytes, "world": world, "nodes": nodes, "dtype_bytes": dt})


# ============================================================================ emitter
class _Emitter(OpEmitter):
    """OpEmitter with extra streams (TP overlap) that records the first/last compute kernel."""

    def __init__(self, b: GraphBuilder, rank: int, mode: ExecMode) -> None:
        super().__init__(b, rank, mode)
        self.first: int | None = None
        self.last: int | None = None
        self.after_next: list[int] = []  # tasks the next compute op must wait for
        self._tp_stream: int | None = None

    @property
    def tp_stream(self) -> int:
        """Stream for TP collectives that overlap compute (``tp_comm_overlap``)."""
        if self.mode != "device":
            return self.comm
        if self._tp_stream is None:
            self._tp_stream = self.b.processor(self.rank, ProcKind.GPU_STREAM, "stream tp")
        return self._tp_stream

    def op(self, name: str, kernels, *, comm: bool = False, async_op: bool = False, after=(), group: int = -1) -> list[int]:
        if not comm and self.after_next:
            after = [*after, *self.after_next]
            self.after_next = []
        out = super().op(name, kernels, comm=comm, async_op=async_op, after=after, group=group)
        if not comm and out:
            if self.first is None:
                self.first = out[0]
            self.last = out[-1]
        return out

    def op_on(self, stream: int, name: str, kernels, *, after=()) -> list[int]:
        """An op whose kernels run on ``stream`` (device mode; blocking on the thread in host mode)."""
        if self.mode != "device":
            return self.op(name, kernels, comm=True, async_op=True, after=after)
        return self._device_op(name, kernels, stream=stream, after=after, group=-1)

    def sync(self, name: str = "cudaStreamSynchronize") -> int:
        """A blocking wait on the CPU thread (its GPU_CPU edges are added by the caller)."""
        return self.b.task(self.cpu, name, "sync", Category.SYNC)

    def freeze(self, markers: dict) -> ExecutionGraph:
        g = self.b.build(validate=False)
        markers.setdefault("first", self.first)
        markers.setdefault("last", self.last)
        g.meta["markers"] = markers
        return g


# ============================================================================ op sequences
@dataclass
class _Buckets:
    """Gradient buckets of the data-parallel reduce (filled in backward order)."""

    limit_params: float
    span: tuple[int, int]
    kind: str  # all_reduce or reduce_scatter
    grad_bytes: int
    tag: str
    params: float = 0.0
    ready_after: int | None = None
    launched: list[int] = field(default_factory=list)
    count: int = 0

    def add(self, e: _Emitter, n_params: float, after: int | None) -> None:
        if self.span[0] <= 1 or n_params <= 0:
            return
        self.params += n_params
        self.ready_after = after
        if self.params >= self.limit_params:
            self.flush(e)

    def flush(self, e: _Emitter) -> None:
        if self.params <= 0 or self.span[0] <= 1:
            return
        k = _coll(f"{self.tag}.{self.kind}", self.kind, self.params * self.grad_bytes, self.span, self.grad_bytes)
        after = [self.ready_after] if self.ready_after is not None else []
        self.launched += e.op(f"{self.tag}.bucket[{self.count}]", [k], comm=True, async_op=True, after=after)
        self.count += 1
        self.params = 0.0


class _Ops:
    """Emits the kernels of one pipeline step (embedding, layers, head) for the plan's shapes."""

    def __init__(self, spec: TransformerSpec, plan: ParallelPlan, layout: _Layout) -> None:
        self.spec, self.plan, self.lay = spec, plan, layout
        self.dt = spec.dtype_bytes
        self.t = plan.tp
        self.sp = plan.sequence_parallel and plan.tp > 1
        self.b = plan.micro_batch
        self.s = spec.seq
        self.h = spec.hidden
        self.f = spec.ffn_size
        self.T = float(self.b * self.s)  # tokens of a micro-batch
        self.Tn = self.T / self.t if self.sp else self.T  # tokens seen by norms/dropouts
        self.heads_local = spec.heads // self.t
        self.d = spec.head_dim
        self.V = spec.padded_vocab(self.t)
        from predictor.sources.synth.transformer_memory import layer_param_count

        self.layer_params = layer_param_count(spec, self.t, plan.ep)
        self.eager = spec.program == "eager"
        moe = spec.moe
        self.expert_params = 0.0 if moe is None else (moe.experts / plan.ep) * (2 * self.h * self.f + self.f + self.h)

    # -------------------------------------------------------------- collectives
    def _tp(self, e: _Emitter, name: str, kind: str, elems: float) -> list[int]:
        if self.t <= 1:
            return []
        return e.op(name, [_coll(name, kind, elems * self.dt, self.lay.tp, self.dt)])

    def _tp_reduce_out(self, e: _Emitter, name: str) -> None:
        """The row-parallel output: all-reduce, or reduce-scatter with sequence parallelism."""
        self._tp(e, name, "reduce_scatter" if self.sp else "all_reduce", self.T * self.h)

    def _tp_gather_in(self, e: _Emitter, name: str) -> None:
        """Sequence parallelism: all-gather the column-parallel GEMM's input."""
        if self.sp:
            self._tp(e, name, "all_gather", self.T * self.h)

    def _input_grad_reduce(self, e: _Emitter, name: str, wgrad: list[Kernel]) -> None:
        """Column-parallel backward: dgrad's input-gradient reduce, then wgrad (overlapped if asked)."""
        if self.t <= 1:
            e.op(f"{name}.wgrad", wgrad)
            return
        kind = "reduce_scatter" if self.sp else "all_reduce"
        coll = _coll(f"{name}.grad_{kind}", kind, self.T * self.h * self.dt, self.lay.tp, self.dt)
        if self.plan.tp_comm_overlap:
            last_dgrad = [e.last] if e.last is not None else []
            ar = e.op_on(e.tp_stream, f"{name}.grad_{kind}", [coll], after=last_dgrad)
            if self.sp:
                self._tp(e, f"{name}.wgrad_input_all_gather", "all_gather", self.T * self.h)
            e.op(f"{name}.wgrad", wgrad)
            e.after_next += ar  # the next op consumes the reduced input gradient
        else:
            e.op(f"{name}.grad_{kind}", [coll])
            if self.sp:
                self._tp(e, f"{name}.wgrad_input_all_gather", "all_gather", self.T * self.h)
            e.op(f"{name}.wgrad", wgrad)

    # -------------------------------------------------------------- attention core
    def _attn_fwd(self, e: _Emitter, p: str) -> None:
        b, s, d, hl, dt = self.b, self.s, self.d, self.heads_local, self.dt
        if self.spec.attention == "flash":
            causal = 0.5 if self.spec.causal else 1.0
            flops = 4.0 * b * s * s * hl * d * causal
            k = (f"{p}flash_attn_fwd", "bmm", Category.COMPUTE,
                 {"m": s, "n": s, "k": d, "batch": b * hl, "dtype_bytes": dt, "flops": flops,
                  "bytes": 4.0 * self.T * hl * d * dt})
            e.op(f"{p}core_attention", [k])
            return
        bh = float(b * hl)
        if self.eager:  # q, k, v split out of the fused projection: view, permute + reshape copies, unbind
            self._views(e, p, "qkv.view", "qkv.permute")
            e.op(f"{p}qkv_split.reshape", [eltwise(f"{p}qkv_split.copy", "memcpy", 3.0 * self.T * hl * d, dt)])
            self._views(e, p, "qkv.unbind", "k.transpose")
        if self.eager and self.spec.causal:
            # baddbmm(mask, q, k^T, alpha): ATen first copies the broadcast [s, s] mask into the [b h, s, s] output
            e.op(f"{p}attn_scores", [eltwise(f"{p}attn_scores.mask_copy", "memcpy", bh * s * s, dt),
                                     self._bmm(f"{p}attn_scores.bmm", s, s, d, bh)])
        else:
            e.op(f"{p}attn_scores", [self._bmm(f"{p}attn_scores.bmm", s, s, d, bh)])  # q @ k^T
        e.op(f"{p}scale_mask_softmax", [eltwise(f"{p}softmax", "softmax", bh * s * s, dt, rw=2.0)])
        e.op(f"{p}attn_dropout", [eltwise(f"{p}attn_dropout", "dropout", bh * s * s, dt, rw=2.5)])
        e.op(f"{p}attn_context", [self._bmm(f"{p}attn_context.bmm", s, d, s, bh)])
        if self.eager:  # heads back to tokens: view, transpose + reshape copy
            self._views(e, p, "context.view", "context.transpose")
            e.op(f"{p}context.reshape", [eltwise(f"{p}context.copy", "memcpy", self.T * hl * d, dt)])

    def _attn_bwd(self, e: _Emitter, p: str) -> None:
        b, s, d, hl, dt = self.b, self.s, self.d, self.heads_local, self.dt
        if self.spec.attention == "flash":
            causal = 0.5 if self.spec.causal else 1.0
            flops = 2.5 * 4.0 * b * s * s * hl * d * causal
            k = (f"{p}flash_attn_bwd", "bmm", Category.COMPUTE,
                 {"m": s, "n": s, "k": d, "batch": b * hl, "dtype_bytes": dt, "flops": flops,
                  "bytes": 8.0 * self.T * hl * d * dt})
            e.op(f"{p}core_attention.backward", [k])
            return
        if self.plan.recompute == "selective":
            self._attn_fwd(e, f"{p}recompute.")
        bh = float(b * hl)
        if self.eager:
            self._views(e, p, "context.unsafe_view_backward", "context.clone_backward", "context.transpose_backward")
            e.op(f"{p}context.reshape.backward", [eltwise(f"{p}context.copy_bwd", "memcpy", self.T * hl * d, dt)])
        e.op(f"{p}attn_context.backward", [self._bmm(f"{p}attn_context.dgrad_probs", s, s, d, bh),
                                           self._bmm(f"{p}attn_context.dgrad_v", s, d, s, bh)])
        e.op(f"{p}attn_dropout.backward", [eltwise(f"{p}attn_dropout_bwd", "mul", bh * s * s, dt, rw=2.5)])
        e.op(f"{p}scale_mask_softmax.backward", [eltwise(f"{p}softmax_bwd", "softmax_bwd", bh * s * s, dt, rw=3.0)])
        if self.eager:  # baddbmm's backward: the two GEMMs plus the scale (alpha) applied to each gradient
            e.op(f"{p}attn_scores.backward", [self._bmm(f"{p}attn_scores.dgrad_q", s, d, s, bh),
                                              eltwise(f"{p}attn_scores.scale_q", "mul", bh * s * d, dt),
                                              # the gradient of k^T: q^T @ dS, [d x s] @ [s x s]
                                              self._bmm(f"{p}attn_scores.dgrad_k", d, s, s, bh),
                                              eltwise(f"{p}attn_scores.scale_k", "mul", bh * s * d, dt)])
            # unbind's backward stacks q, k, v; the permute's backward copies them back to tokens
            self._views(e, p, "k.transpose_backward")
            e.op(f"{p}qkv_split.backward", [concat(f"{p}qkv_split.stack", 1, 3.0 * self.T * hl * d, 3, dt),
                                            eltwise(f"{p}qkv_split.copy_bwd", "memcpy", 3.0 * self.T * hl * d, dt)])
            self._views(e, p, "qkv.unsafe_view_backward", "qkv.clone_backward", "qkv.permute_backward")
            return
        e.op(f"{p}attn_scores.backward", [self._bmm(f"{p}attn_scores.dgrad_q", s, d, s, bh),
                                          self._bmm(f"{p}attn_scores.dgrad_k", d, s, s, bh)])

    # -------------------------------------------------------------- MLP
    def _mlp_fwd(self, e: _Emitter, p: str) -> None:
        T, h, f, t, dt = self.T, self.h, self.f, self.t, self.dt
        if self.spec.moe is None:
            self._tp_gather_in(e, f"{p}mlp_input_all_gather")
            e.op(f"{p}fc1", [self._linear(f"{p}fc1.addmm", T, f / t, h)])
            e.op(f"{p}bias_gelu", [eltwise(f"{p}bias_gelu", "gelu", T * f / t, dt, rw=2.0)])
            e.op(f"{p}fc2", [self._linear(f"{p}fc2.mm", T, h, f / t)])
            self._tp_reduce_out(e, f"{p}mlp_output_{'reduce_scatter' if self.sp else 'all_reduce'}")
            return
        moe, ep = self.spec.moe, self.plan.ep
        Tr = T / t  # tokens this rank routes (TP ranks split the tokens)
        routed = Tr * moe.top_k * moe.capacity_factor
        per_expert = routed * ep / moe.experts
        local = float(moe.experts // ep)
        e.op(f"{p}router", [self._linear(f"{p}router.mm", Tr, moe.experts, h, bias=False),
                            eltwise(f"{p}router.topk", "softmax", Tr * moe.experts, dt, rw=3.0)])
        self._a2a(e, f"{p}moe_dispatch", routed * h)
        e.op(f"{p}experts.fc1", [self._linear(f"{p}experts.fc1", per_expert, f, h, batch=local)])
        e.op(f"{p}experts.gelu", [eltwise(f"{p}experts.gelu", "gelu", routed * f, dt, rw=2.0)])
        e.op(f"{p}experts.fc2", [self._linear(f"{p}experts.fc2", per_expert, h, f, batch=local)])
        self._a2a(e, f"{p}moe_combine", routed * h)
        e.op(f"{p}moe_unpermute", [eltwise(f"{p}moe_unpermute", "elementwise", routed * h, dt, rw=2.0)])
        if not self.sp:
            self._tp(e, f"{p}moe_output_all_gather", "all_gather", T * h)

    def _a2a(self, e: _Emitter, name: str, elems: float) -> None:
        if self.plan.ep > 1:
            e.op(name, [_coll(name, "all_to_all", elems * self.dt, self.lay.ep, self.dt)])
        else:
            e.op(name, [eltwise(name, "elementwise", elems, self.dt, rw=2.0)])  # local permutation

    def _mlp_bwd(self, e: _Emitter, p: str) -> None:
        T, h, f, t, dt = self.T, self.h, self.f, self.t, self.dt
        if self.spec.moe is None:
            if self.sp:
                self._tp(e, f"{p}mlp_output_grad_all_gather", "all_gather", T * h)
            e.op(f"{p}fc2.backward", [self._dgrad(f"{p}fc2.dgrad", T, f / t, h), self._wgrad(f"{p}fc2.wgrad", h, f / t, T),
                                      *self._bias_grad(f"{p}fc2", T, h)])
            self._accumulate_grad(e, f"{p}fc2", 2)
            e.op(f"{p}bias_gelu.backward", [eltwise(f"{p}bias_gelu_bwd", "gelu_bwd", T * f / t, dt, rw=3.0)])
            e.op(f"{p}fc1.dgrad", [self._dgrad(f"{p}fc1.dgrad", T, h, f / t)])
            self._input_grad_reduce(e, f"{p}fc1", [self._wgrad(f"{p}fc1.wgrad", f / t, h, T),
                                                   *self._bias_grad(f"{p}fc1", T, f / t)])
            self._accumulate_grad(e, f"{p}fc1", 2)
            return
        moe, ep = self.spec.moe, self.plan.ep
        Tr = T / t
        routed = Tr * moe.top_k * moe.capacity_factor
        per_expert = routed * ep / moe.experts
        local = float(moe.experts // ep)
        self._a2a(e, f"{p}moe_combine.backward", routed * h)
        e.op(f"{p}experts.fc2.backward", [self._dgrad(f"{p}experts.fc2.dgrad", per_expert, f, h, batch=local),
                                          self._wgrad(f"{p}experts.fc2.wgrad", h, f, per_expert, batch=local)])
        e.op(f"{p}experts.gelu.backward", [eltwise(f"{p}experts.gelu_bwd", "gelu_bwd", routed * f, dt, rw=3.0)])
        e.op(f"{p}experts.fc1.backward", [self._dgrad(f"{p}experts.fc1.dgrad", per_expert, h, f, batch=local),
                                          self._wgrad(f"{p}experts.fc1.wgrad", f, h, per_expert, batch=local)])
        self._a2a(e, f"{p}moe_dispatch.backward", routed * h)
        e.op(f"{p}router.backward", [self._dgrad(f"{p}router.dgrad", Tr, h, moe.experts),
                                     self._wgrad(f"{p}router.wgrad", moe.experts, h, Tr)])
        if not self.sp:
            self._tp(e, f"{p}moe_input_grad_all_gather", "all_gather", T * h)

    # -------------------------------------------------------------- GEMMs
    # Shapes as PyTorch (and Megatron) run them: a linear layer's forward is x @ W.t(), its input
    # gradient grad @ W, its weight gradient grad.t() @ x ([out x tokens] @ [tokens x in]). The
    # eager program names the ATen op (addmm with a bias, else mm; bmm), Megatron's program "gemm".
    def _op(self, eager_op: str) -> str:
        return eager_op if self.eager else "gemm"

    def _linear(self, name: str, rows: float, out: float, inp: float, *, bias: bool = True,
                batch: float = 1.0) -> Kernel:
        """Forward of a linear layer ``inp -> out`` on ``rows`` tokens."""
        op = "bmm" if batch != 1.0 else ("addmm" if bias else "mm")
        return gemm(name, rows, out, inp, self.dt, batch=batch, op=self._op(op))

    def _dgrad(self, name: str, rows: float, inp: float, out: float, *, batch: float = 1.0) -> Kernel:
        """Input gradient of a linear layer ``inp -> out``: ``grad @ W``."""
        return gemm(name, rows, inp, out, self.dt, batch=batch, op=self._op("bmm" if batch != 1.0 else "mm"))

    def _wgrad(self, name: str, out: float, inp: float, rows: float, *, batch: float = 1.0) -> Kernel:
        """Weight gradient of a linear layer ``inp -> out``: ``grad.t() @ x``."""
        return gemm(name, out, inp, rows, self.dt, batch=batch, op=self._op("bmm" if batch != 1.0 else "mm"))

    def _bmm(self, name: str, m: float, n: float, k: float, batch: float) -> Kernel:
        """An attention GEMM per (sample, head)."""
        return gemm(name, m, n, k, self.dt, batch=batch, op=self._op("bmm"))

    # -------------------------------------------------------------- eager-program pieces
    def _dropout_add(self, e: _Emitter, name: str) -> None:
        """The output dropout and the residual add: one fused kernel, or eager's two ops."""
        Tn, h, dt = self.Tn, self.h, self.dt
        if not self.eager:
            e.op(name, [eltwise(name, "dropout", Tn * h, dt, rw=3.5)])
            return
        e.op(f"{name}.dropout", [eltwise(f"{name}.dropout", "dropout", Tn * h, dt, rw=2.5)])
        e.op(f"{name}.residual_add", [eltwise(f"{name}.residual_add", "add", Tn * h, dt, rw=3.0)])

    def _layernorm_bwd(self, e: _Emitter, name: str) -> None:
        """Layer-norm backward: Megatron's fused kernel, or eager's input-gradient kernel plus the
        weight/bias gradient partials and their reduction (and two AccumulateGrad ops)."""
        Tn, h, dt = self.Tn, self.h, self.dt
        if not self.eager:
            e.op(f"{name}.backward", [eltwise(f"{name}_bwd", "layer_norm", Tn * h, dt, rw=4.0)])
            return
        e.op(f"{name}.backward", [eltwise(f"{name}_bwd", "layer_norm", Tn * h, dt, rw=3.0),
                                  eltwise(f"{name}_bwd.gamma_beta", "elementwise", Tn * h, dt, rw=2.0),
                                  eltwise(f"{name}_bwd.reduce", "elementwise", 64.0 * h, 4, rw=1.0)])
        self._accumulate_grad(e, name, 2)

    def _bias_grad(self, name: str, rows: float, n: float) -> list[Kernel]:
        """Eager ``AddmmBackward``'s bias gradient: a column sum of the output gradient."""
        return [column_sum(f"{name}.bias_grad", rows, n, self.dt)] if self.eager else []

    def _accumulate_grad(self, e: _Emitter, name: str, tensors: int) -> None:
        """Eager autograd's AccumulateGrad per parameter tensor: host work, no kernel (gradients set to
        None before backward are taken over, not added); a kernel-less node on a device, a T1 gap on a CPU."""
        if self.eager:
            for i in range(tensors):
                if e.mode == "device":
                    e.node(f"{name}.accumulate_grad[{i}]")
                else:
                    e.op(f"{name}.accumulate_grad[{i}]", [])

    def _views(self, e: _Emitter, p: str, *names: str) -> None:
        """Device mode, eager program: view ops and the autograd nodes of views (no kernel; T1 + T3 each,
        :meth:`OpEmitter.node`). The CPU graphs keep them inside their T's."""
        if self.eager:
            for n in names:
                e.node(f"{p}{n}")

    # -------------------------------------------------------------- layers
    def layer_fwd(self, e: _Emitter, p: str) -> None:
        T, Tn, h, t, dt = self.T, self.Tn, self.h, self.t, self.dt
        e.op(f"{p}input_layernorm", [eltwise(f"{p}input_layernorm", "layer_norm", Tn * h, dt, rw=2.0)])
        self._tp_gather_in(e, f"{p}qkv_input_all_gather")
        e.op(f"{p}qkv", [self._linear(f"{p}qkv.addmm", T, 3 * h / t, h)])
        self._attn_fwd(e, p)
        e.op(f"{p}attn_proj", [self._linear(f"{p}attn_proj.mm", T, h, h / t)])
        self._tp_reduce_out(e, f"{p}attn_output_{'reduce_scatter' if self.sp else 'all_reduce'}")
        self._dropout_add(e, f"{p}bias_dropout_add")
        e.op(f"{p}post_attention_layernorm", [eltwise(f"{p}post_attention_layernorm", "layer_norm", Tn * h, dt, rw=2.0)])
        self._mlp_fwd(e, p)
        self._dropout_add(e, f"{p}bias_dropout_add_2")

    def layer_bwd(self, e: _Emitter, p: str) -> None:
        T, Tn, h, t, dt = self.T, self.Tn, self.h, self.t, self.dt
        if self.plan.recompute == "full":
            self.layer_fwd(e, f"{p}recompute.")
        e.op(f"{p}bias_dropout_add_2.backward", [eltwise(f"{p}bias_dropout_add_2_bwd", "mul", Tn * h, dt, rw=3.5)])
        self._mlp_bwd(e, p)
        self._layernorm_bwd(e, f"{p}post_attention_layernorm")
        if self.eager:  # the residual stream's two gradients summed by autograd
            e.op(f"{p}residual_2.grad_add", [eltwise(f"{p}residual_2.grad_add", "add", Tn * h, dt, rw=3.0)])
        self._views(e, p, "residual_2.add_backward")
        e.op(f"{p}bias_dropout_add.backward", [eltwise(f"{p}bias_dropout_add_bwd", "mul", Tn * h, dt, rw=3.5)])
        if self.sp:
            self._tp(e, f"{p}attn_output_grad_all_gather", "all_gather", T * h)
        e.op(f"{p}attn_proj.backward", [self._dgrad(f"{p}attn_proj.dgrad", T, h / t, h),
                                        self._wgrad(f"{p}attn_proj.wgrad", h, h / t, T), *self._bias_grad(f"{p}attn_proj", T, h)])
        self._accumulate_grad(e, f"{p}attn_proj", 2)
        self._attn_bwd(e, p)
        e.op(f"{p}qkv.dgrad", [self._dgrad(f"{p}qkv.dgrad", T, h, 3 * h / t)])
        self._input_grad_reduce(e, f"{p}qkv", [self._wgrad(f"{p}qkv.wgrad", 3 * h / t, h, T),
                                               *self._bias_grad(f"{p}qkv", T, 3 * h / t)])
        self._accumulate_grad(e, f"{p}qkv", 2)
        self._layernorm_bwd(e, f"{p}input_layernorm")
        if self.eager:
            e.op(f"{p}residual.grad_add", [eltwise(f"{p}residual.grad_add", "add", Tn * h, dt, rw=3.0)])
        # the TBackward0 node of each linear layer's transposed weight (qkv, attention projection, fc1, fc2)
        self._views(e, p, "residual.add_backward", *(f"{n}.t_backward" for n in ("qkv", "attn_proj", "fc1", "fc2")))

    # -------------------------------------------------------------- embedding and head
    def embedding_fwd(self, e: _Emitter) -> None:
        T, Tn, h, dt = self.T, self.Tn, self.h, self.dt
        if self.eager:  # F.embedding, then "+ pos": two ops
            e.op("embedding", [eltwise("word_embedding.gather", "embedding", T * h, dt, rw=2.0)])
            e.op("position_embedding", [eltwise("position_embedding.add", "add", T * h, dt, rw=3.0)])
        else:
            e.op("embedding", [eltwise("word_embedding.gather", "embedding", T * h, dt, rw=2.0),
                               eltwise("position_embedding.add", "add", T * h, dt, rw=3.0)])
        self._tp_reduce_out(e, "embedding.vocab_parallel_reduce")
        e.op("embedding_dropout", [eltwise("embedding_dropout", "dropout", Tn * h, dt, rw=2.5)])

    def embedding_bwd(self, e: _Emitter) -> None:
        T, Tn, h, dt = self.T, self.Tn, self.h, self.dt
        e.op("embedding_dropout.backward", [eltwise("embedding_dropout_bwd", "mul", Tn * h, dt, rw=2.5)])
        if self.sp:
            self._tp(e, "embedding.grad_all_gather", "all_gather", T * h)
        if self.eager:
            # the position table's gradient: a sum over the batch; the token table's: eager's
            # embedding_dense_backward (sort the indices, count, index-add), then the tied output
            # layer's gradient added to it
            e.op("position_embedding.backward", [eltwise("position_embedding.grad_sum", "elementwise", T * h, dt,
                                                         rw=1.0)])
            self._accumulate_grad(e, "position_embedding", 1)
            e.op("embedding.backward", [eltwise("word_embedding.sort_indices", "elementwise", T, 8, rw=4.0),
                                        eltwise("word_embedding.count", "elementwise", T, 8, rw=2.0),
                                        eltwise("word_embedding.grad_index_add", "embedding", T * h, dt, rw=3.0)])
            if self.spec.tie_embeddings:
                e.op("word_embedding.tied_grad_add", [eltwise("word_embedding.tied_grad_add", "add",
                                                              self.V / self.t * h, dt, rw=3.0)])
            self._accumulate_grad(e, "word_embedding", 1)
            return
        e.op("embedding.backward", [eltwise("word_embedding.grad_index_add", "embedding", T * h, dt, rw=3.0)])

    def head_fwd(self, e: _Emitter) -> None:
        T, Tn, h, t, dt, V = self.T, self.Tn, self.h, self.t, self.dt, self.V
        e.op("final_layernorm", [eltwise("final_layernorm", "layer_norm", Tn * h, dt, rw=2.0)])
        self._tp_gather_in(e, "lm_head_input_all_gather")
        e.op("lm_head", [self._linear("lm_head.mm", T, V / t, h, bias=False)])
        if self.eager and t == 1:  # F.cross_entropy: log-softmax, then the NLL gather and mean
            self._views(e, "", "logits.view", "targets.view")
            e.op("cross_entropy", [eltwise("log_softmax", "softmax", T * V, dt, rw=2.0),
                                   eltwise("nll_loss", "elementwise", T, 4, rw=2.0)])
            return
        e.op("cross_entropy", [eltwise("vocab_parallel_cross_entropy", "softmax", T * V / t, dt, rw=4.0)])
        for i in range(3 if t > 1 else 0):  # max, sum of exp, target logit over the vocab shards
            e.op(f"cross_entropy.all_reduce[{i}]", [_coll(f"cross_entropy.all_reduce[{i}]", "all_reduce", T * 4.0, self.lay.tp, 4)])

    def head_bwd(self, e: _Emitter) -> None:
        T, h, t, dt, V = self.T, self.h, self.t, self.dt, self.V
        if self.eager and t == 1:
            # backward() seeds the loss gradient; NLL's backward zero-fills the logits' gradient and
            # scatters into it; log-softmax's backward
            e.op("loss.grad_seed", [eltwise("loss.ones_like", "elementwise", 1.0, 4, rw=1.0)])
            e.op("nll_loss.backward", [eltwise("nll_loss_bwd.zero", "elementwise", T * V, dt, rw=1.0),
                                       eltwise("nll_loss_bwd.scatter", "elementwise", T, 4, rw=2.0)])
            e.op("log_softmax.backward", [eltwise("log_softmax_bwd", "log_softmax_bwd", T * V, dt, rw=3.0)])
        else:
            e.op("cross_entropy.backward", [eltwise("vocab_parallel_cross_entropy_bwd", "softmax", T * V / t, dt,
                                                    rw=3.0)])
        self._views(e, "", "logits.view_backward")
        e.op("lm_head.dgrad", [self._dgrad("lm_head.dgrad", T, h, V / t)])
        self._input_grad_reduce(e, "lm_head", [self._wgrad("lm_head.wgrad", V / t, h, T)])
        self._views(e, "", "lm_head.t_backward")
        self._layernorm_bwd(e, "final_layernorm")


# ============================================================================ builder
@dataclass
class _Recv:
    sync: int
    target: int  # first task the transfer feeds (gather or the step's first kernel)
    posted_after: int  # the receiver's previous kernel (NCCL's stream waits for it), -1 for none


class _GraphBuilder:
    """Builds the iteration graph of one (spec, plan): templates once, stamped per step."""

    def __init__(self, spec: TransformerSpec, plan: ParallelPlan, devices_per_node: int, mode: ExecMode,
                 detail: str, timing) -> None:
        self.spec, self.plan, self.mode = spec, plan, mode
        self.dpn = devices_per_node
        self.lay = _Layout.of(plan, devices_per_node)
        self.ops = _Ops(spec, plan, self.lay)
        self.p, self.v, self.m = plan.pp, plan.virtual_stages_effective, plan.micro_batches
        self.layers_per_chunk = spec.layers // (self.p * self.v)
        self.detail = detail
        self.timing = timing
        self._blocks: dict[tuple, ExecutionGraph] = {}
        self._macro: dict[tuple, ExecutionGraph] = {}
        dt = DTYPE_BYTES[plan.grad_reduce_dtype]
        self.grad_bytes = dt
        self.bucket_params = max(4e7, 1e6 * plan.dp)
        self.msg_act = self.ops.T * spec.hidden * spec.dtype_bytes
        self.sg = plan.pp_scatter_gather and plan.tp > 1 and not self.ops.sp
        if self.ops.sp or self.sg:
            self.msg_act /= plan.tp

    # -------------------------------------------------------------- templates
    def _new(self) -> tuple[GraphBuilder, _Emitter]:
        gb = GraphBuilder()
        return gb, _Emitter(gb, 0, self.mode)

    def step_block(self, phase: str, first: bool, last: bool, final: bool) -> ExecutionGraph:
        """Kernel template of one forward/backward step of one chunk (``final``: reduce gradients)."""
        key = (phase, first, last, final)
        blk = self._blocks.get(key)
        if blk is not None:
            return blk
        _, e = self._new()
        ops = self.ops
        markers: dict = {}
        if phase == "F":
            if first:
                ops.embedding_fwd(e)
            for i in range(self.layers_per_chunk):
                ops.layer_fwd(e, f"layer[{i}].")
            if last:
                ops.head_fwd(e)
        else:
            kind = "reduce_scatter" if self.plan.distributed_optimizer else "all_reduce"
            dense = _Buckets(self.bucket_params, self.lay.dp, kind, self.grad_bytes, "dp_grad")
            expert = _Buckets(self.bucket_params, self.lay.edp, kind, self.grad_bytes, "expert_dp_grad")
            if last:
                ops.head_bwd(e)
                if final:
                    head = 2 * self.spec.hidden
                    if self.p > 1 or not self.spec.tie_embeddings:
                        head += self.spec.padded_vocab(self.plan.tp) * self.spec.hidden / self.plan.tp
                    dense.add(e, head, e.last)
            for i in reversed(range(self.layers_per_chunk)):
                ops.layer_bwd(e, f"layer[{i}].")
                if final:
                    dense.add(e, ops.layer_params - ops.expert_params, e.last)
                    expert.add(e, ops.expert_params, e.last)
            if first:
                ops.embedding_bwd(e)
                if final:
                    dense.add(e, self.spec.padded_vocab(self.plan.tp) * self.spec.hidden / self.plan.tp
                              + self.spec.seq * self.spec.hidden, e.last)
            if final:
                dense.flush(e)
                expert.flush(e)
                markers["dp"] = dense.launched + expert.launched
        blk = e.freeze(markers)
        self._blocks[key] = blk
        return blk

    def preamble_block(self, gather: bool) -> ExecutionGraph:
        """CPU sync after a blocking p2p exchange (+ the scatter/gather all-gather of a received tensor)."""
        key = ("pre", gather)
        blk = self._blocks.get(key)
        if blk is not None:
            return blk
        _, e = self._new()
        markers = {"sync": e.sync("p2p.synchronize")}
        if gather:
            ops = self.ops
            k = ops._tp(e, "p2p.all_gather", "all_gather", ops.T * self.spec.hidden)
            markers["gather"] = k[0]
        blk = e.freeze(markers)
        self._blocks[key] = blk
        return blk

    def final_block(self, stage: int) -> ExecutionGraph:
        """End of the iteration on ``stage``: non-overlapped DP reduce, tied-embedding and grad-norm
        all-reduces, Adam, distributed-optimizer parameter all-gather."""
        p = self.p
        tied = p > 1 and self.spec.tie_embeddings and stage in (0, p - 1)
        key = ("final", tied, stage == 0, stage == p - 1)
        blk = self._blocks.get(key)
        if blk is not None:
            return blk
        from predictor.sources.synth.transformer_memory import memory_per_stage

        gb, e = self._new()
        e.step_framework()  # device mode: backward()'s and optimizer.step()'s framework work, once per step
        plan, spec = self.plan, self.spec
        mem = memory_per_stage(spec, plan)[stage]
        params = mem.params
        markers: dict = {"dp": [], "wait_compute": []}
        kind = "reduce_scatter" if plan.distributed_optimizer else "all_reduce"
        if not plan.overlap_grad_reduce:
            dense = _Buckets(self.bucket_params, self.lay.dp, kind, self.grad_bytes, "dp_grad")
            expert_total = self.ops.expert_params * self.layers_per_chunk * self.v
            expert = _Buckets(self.bucket_params, self.lay.edp, kind, self.grad_bytes, "expert_dp_grad")
            remaining = params - expert_total
            while remaining > 0:
                chunk = min(remaining, self.bucket_params)
                dense.add(e, chunk, None)
                remaining -= chunk
            dense.flush(e)
            remaining = expert_total
            while remaining > 0:
                chunk = min(remaining, self.bucket_params)
                expert.add(e, chunk, None)
                remaining -= chunk
            expert.flush(e)
            markers["dp"] = dense.launched + expert.launched
            markers["wait_compute"] = list(markers["dp"][:1])
        groups: dict = {}
        after_comm = list(markers["dp"])
        if tied:
            g_local = gb.new_group()
            vocab_params = spec.padded_vocab(plan.tp) * spec.hidden / plan.tp
            k = e.op("embedding_grad.all_reduce",
                     [_coll("embedding_grad.all_reduce", "all_reduce", vocab_params * self.grad_bytes, self.lay.tied,
                            self.grad_bytes)], comm=True, async_op=True, group=g_local)
            groups["tied"] = g_local
            markers["tied"] = k[0]
            markers["wait_compute"].append(k[0])
            after_comm.append(k[0])
        local = params / (plan.dp if plan.distributed_optimizer else 1)
        if spec.program == "eager" and plan.tp * plan.pp * plan.dp == 1:
            self._eager_optimizer(e, local, after_comm, markers)
        else:
            norm = e.op("grad_norm", [eltwise("grad_norm.sq_sum", "elementwise", local, 4, rw=1.0)], after=after_comm)
            markers["grad_norm"] = norm[0]
            g_norm = gb.new_group()
            groups["norm"] = g_norm
            e.op("grad_norm.all_reduce", [_coll("grad_norm.all_reduce", "all_reduce", 4.0, self.lay.mp, 4)],
                 group=g_norm)
            e.op("optimizer.step", [("adam.multi_tensor_apply", "optimizer", Category.MEMORY,
                                     {"elements": local, "dtype_bytes": 4, "bytes": ADAM_BYTES_PER_PARAM * local})])
            if plan.distributed_optimizer and plan.dp > 1:
                e.op("param.all_gather", [_coll("param.all_gather", "all_gather", params * spec.dtype_bytes,
                                                self.lay.dp, spec.dtype_bytes)])
        markers["groups"] = groups
        blk = e.freeze(markers)
        self._blocks[key] = blk
        return blk

    def _eager_optimizer(self, e: _Emitter, params: float, after: list[int], markers: dict) -> None:
        """One process of plain PyTorch: ``clip_grad_norm``'s total norm (``_foreach_norm`` over the
        gradients in chunks, ``stack``, a vector norm), then ``torch.optim.Adam(fused=True)``: the step
        counters (``_foreach_add_``) and one fused kernel reading parameter, gradient and both moments
        and writing parameter and moments, all in the parameters' dtype."""
        dt = self.spec.dtype_bytes
        tensors = 12 * self.spec.layers + 4  # per layer: 4 linear + 2 norm (weight, bias); tok, pos, final norm
        chunks = max(1, -(-tensors // 12))
        norm = e.op("grad_norm.foreach_norm", [eltwise(f"grad_norm.foreach_norm[{i}]", "elementwise", params / chunks,
                                                       dt, rw=1.0) for i in range(chunks)], after=after)
        markers["grad_norm"] = norm[0]
        for i in range(tensors):  # each tensor's norm moved to the first's device (kernel-less on one device)
            e.node(f"grad_norm.to[{i}]")
        e.op("grad_norm.stack", [concat("grad_norm.stack", 1, tensors, tensors, 4)])
        e.op("grad_norm.vector_norm", [eltwise("grad_norm.vector_norm", "elementwise", float(tensors), 4, rw=1.0)])
        e.op("optimizer.step_count", [eltwise("adam.foreach_add", "elementwise", float(tensors), 4, rw=2.0)])
        e.op("optimizer.step", [("adam.fused", "optimizer", Category.MEMORY,
                                 {"elements": params, "dtype_bytes": dt, "bytes": 7.0 * dt * params})])
        if e.mode == "device":
            e.node("optimizer.zero_grad")
        else:
            e.op("optimizer.zero_grad", [])

    def macro_block(self, phase: str, first: bool, last: bool) -> ExecutionGraph:
        """Stage detail: one launch + one task lasting the simulated span of the kernel template."""
        key = (phase, first, last)
        blk = self._macro.get(key)
        if blk is not None:
            return blk
        from predictor.simulate import simulate

        kernel = self.step_block(phase, first, last, False)
        tl = simulate(kernel, self.timing)
        on_dev = kernel.category != Category.CPU
        on_dev &= kernel.category != Category.SYNC
        # from the step's first CPU op to its last kernel: after a blocking p2p sync the CPU
        # launches the step from scratch, and a CPU-bound step is paced by its launches anyway;
        # minus half the macro task's own launch call (the simulator adds it back)
        end = float(tl.end[on_dev].max()) if on_dev.any() else 0.0
        t4 = float(self.timing.overhead_seconds()[int(Overhead.T4)]) if hasattr(self.timing, "overhead_seconds") else 0.0
        span = max(end - 0.5 * t4, 0.0)
        gb = GraphBuilder()
        cpu = gb.processor(0, ProcKind.CPU_THREAD, "cpu")
        dev = gb.processor(0, ProcKind.GPU_STREAM, "stream compute") if self.mode == "device" else cpu
        launch = gb.task(cpu, "cudaLaunchKernel", "launch", Category.CPU, overhead=Overhead.T4)
        what = "forward" if phase == "F" else "backward"
        task = gb.task(dev, f"stage {what} ({self.layers_per_chunk} layers{', embedding' if first else ''}"
                            f"{', head' if last else ''})", "pipeline_step", Category.COMPUTE,
                       duration=span, flops=float(np.nansum(kernel.flops)))
        if dev != cpu:
            gb.edge(launch, task, DepKind.CPU_GPU)
        blk = gb.build(validate=False)
        blk.meta["markers"] = {"first": task, "last": task}
        self._macro[key] = blk
        return blk

    # -------------------------------------------------------------- assembly
    def estimate_tasks(self) -> int:
        """Tasks of the kernel-detail graph (from the templates' sizes)."""
        total = 0
        for stage in range(self.p):
            for st in schedule(self.plan.schedule, self.p, self.m, stage, self.v):
                first, last = self._ends(st, stage)
                total += self.step_block(st.phase, first, last, False).n_tasks
        return total

    def _ends(self, st: Step, stage: int) -> tuple[bool, bool]:
        vs = st.chunk * self.p + stage
        return vs == 0, vs == self.p * self.v - 1

    def build(self) -> ExecutionGraph:
        p, v, m = self.p, self.v, self.m
        plan = self.plan
        asm = GraphAssembler()
        edge_gpu = DepKind.GPU_GPU if self.mode == "device" else DepKind.CPU_CPU
        edge_sync = DepKind.GPU_CPU if self.mode == "device" else DepKind.CPU_CPU
        stream_kind = ProcKind.GPU_STREAM if self.mode == "device" else ProcKind.CPU_THREAD
        overlap = plan.overlap_grad_reduce
        recv_at: dict[tuple[str, int, int], _Recv] = {}
        sends: list[list[tuple[str, int, int, int]]] = [[] for _ in range(p)]  # per sender: (phase, mb, vs, last task)
        groups_tied = asm.new_group() if p > 1 else -1
        group_norm = asm.new_group()
        for stage in range(p):
            for name in ("cpu",):
                asm.processor(stage, ProcKind.CPU_THREAD, name)
            if self.mode == "device":
                for name in ("stream compute", "stream comm"):
                    asm.processor(stage, ProcKind.GPU_STREAM, name)
            steps = schedule(plan.schedule, p, m, stage, v)
            dp_tasks: list[int] = []
            last_compute = -1
            for st in steps:
                vs = st.chunk * p + stage
                first, last = vs == 0, vs == p * v - 1
                recv = (st.phase == "F" and not first) or (st.phase == "B" and not last)
                send = (st.phase == "F" and not last) or (st.phase == "B" and not first)
                final = st.phase == "B" and st.micro_batch == m - 1 and overlap
                pre = None
                if recv:
                    blk = self.preamble_block(recv and self.sg)
                    off = asm.stamp(blk, stage)
                    mk = blk.meta["markers"]
                    pre = (off + mk["sync"], off + mk["gather"] if "gather" in mk else None)
                if final or self.detail == "kernel":
                    blk = self.step_block(st.phase, first, last, final)
                else:
                    blk = self.macro_block(st.phase, first, last)
                off = asm.stamp(blk, stage)
                mk = blk.meta["markers"]
                first_k, last_k = off + mk["first"], off + mk["last"]
                dp_tasks += [off + i for i in mk.get("dp", [])]
                posted_after, last_compute = last_compute, last_k
                if recv:
                    target = pre[1] if pre[1] is not None else first_k
                    if pre[1] is not None:
                        asm.edge(pre[1], first_k, edge_gpu)  # gathered before the step starts
                    src_vs = vs - 1 if st.phase == "F" else vs + 1
                    recv_at[(st.phase, st.micro_batch, src_vs)] = _Recv(pre[0], target, posted_after)
                if send:
                    sends[stage].append((st.phase, st.micro_batch, vs, last_k))
            # ---------------------------------------------------------------- end of iteration
            blk = self.final_block(stage)
            mk = blk.meta["markers"]
            gmap = {}
            if "tied" in mk["groups"]:
                gmap[mk["groups"]["tied"]] = groups_tied
            if "norm" in mk["groups"]:  # the eager program of one process has no norm all-reduce
                gmap[mk["groups"]["norm"]] = group_norm
            off = asm.stamp(blk, stage, group_map=gmap)
            for w in mk["wait_compute"]:
                asm.edge(last_compute, off + w, edge_gpu)
            for d in dp_tasks:
                asm.edge(d, off + mk["grad_norm"], edge_gpu)
        # -------------------------------------------------------------------- p2p transfers
        if p > 1:
            for s in range(p):
                for phase, mb, vs, last_k in sends[s]:
                    forward = phase == "F"
                    dst = (s + 1) % p if forward else (s - 1) % p
                    link = self.lay.pp_next[s] if forward else self.lay.pp_next[dst]
                    g = asm.new_group()
                    params = {"msg_bytes": self.msg_act, "world": 2, "nodes": link[1], "dtype_bytes": self.spec.dtype_bytes}
                    tag = "activation" if forward else "gradient"
                    snd_proc = asm.processor(s, stream_kind, f"stream p2p send {'next' if forward else 'prev'}")
                    rcv_proc = asm.processor(dst, stream_kind, f"stream p2p recv {'prev' if forward else 'next'}")
                    snd = asm.task(snd_proc, f"send {tag} (virtual stage {vs})", "send_recv", Category.COMMUNICATION,
                                   group=g, params=params)
                    rcv = asm.task(rcv_proc, f"recv {tag} (virtual stage {vs})", "send_recv", Category.COMMUNICATION,
                                   group=g, params=params)
                    asm.edge(last_k, snd, edge_gpu)
                    r = recv_at.get((phase, mb, vs))
                    if r is None:  # pragma: no cover - schedules always pair sends with receives
                        raise ScheduleError(f"no receiver for {phase} mb{mb} of virtual stage {vs}")
                    asm.edge(rcv, r.target, edge_gpu)
                    if r.posted_after >= 0:
                        asm.edge(r.posted_after, rcv, edge_gpu)
                    asm.edge(rcv, r.sync, edge_sync)
        asm.meta.update(
            {
                "workload": "transformer",
                "model": self.spec.name,
                "plan": plan.label(),
                "n_ranks": p,
                "representatives": [s * plan.dp * plan.tp for s in range(p)],
                "devices": plan.devices,
                "detail": self.detail,
            }
        )
        return asm.build()


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
    builder = _GraphBuilder(spec, plan, devices_per_node, mode, detail, timing)
    if detail == "auto":
        builder.detail = "kernel" if builder.estimate_tasks() <= AUTO_KERNEL_TASK_LIMIT else "stage"
    if builder.detail == "stage" and timing is None:
        raise PlanError("detail='stage' needs a timing to time the step templates")
    g = builder.build()
    return g


def replace_plan(plan: ParallelPlan, **changes) -> ParallelPlan:
    """``dataclasses.replace`` for plans (keeps callers free of the import)."""
    return replace(plan, **changes)


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
    stage_plan = replace(plan, pp=1, dp=1, global_batch=plan.micro_batch, schedule="1f1b")
    check_plan(stage_spec, stage_plan)
    builder = _GraphBuilder(stage_spec, stage_plan, devices_per_node, mode, "kernel", None)
    asm = GraphAssembler()
    fwd = builder.step_block("F", with_embedding, with_head, False)
    bwd = builder.step_block("B", with_embedding, with_head, False)
    asm.stamp(fwd, 0)
    asm.stamp(bwd, 0)  # stream and thread order chain the backward after the forward
    asm.meta.update({"workload": "transformer-stage", "model": spec.name, "layers": n_layers,
                     "embedding": with_embedding, "head": with_head, "tp": plan.tp, "micro_batch": plan.micro_batch})
    return asm.build()
