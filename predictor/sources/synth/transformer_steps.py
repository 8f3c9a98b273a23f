"""Kernel templates of the steps of one transformer pipeline stage, built once per (spec, plan).

A template is a small :class:`~predictor.graph.ExecutionGraph` of one representative rank, emitted
with :class:`~predictor.sources.synth.transformer_emitter.StepEmitter` and stamped once per step
by :func:`predictor.sources.synth.transformer.build_transformer_graph`:

* a forward or backward **step** of one model chunk (embedding on the first virtual stage, the
  chunk's layers, output layer and loss on the last);
* the **preamble** of a step that receives a tensor: the CPU sync after Megatron's blocking p2p
  exchange (plus the all-gather of a scatter/gather transfer);
* the **end of the iteration** on one stage.

Data parallelism: gradients are reduced in buckets (Megatron DDP: ``max(4e7, 1e6 dp)``
parameters) on the communication stream as the last micro-batch's backward produces them
(``overlap_grad_reduce``), or all after the last backward; all-reduce, or reduce-scatter +
all-gather of the parameters with the distributed optimizer. Expert gradients reduce over
the expert-data-parallel group (``dp / ep``). The end of the iteration adds the tied-embedding
gradient all-reduce between the first and last stage, the gradient-norm all-reduce over the
model-parallel group (clipping) and the Adam step.

Stage detail (:meth:`StepTemplates.macro_block`) replaces a step's kernels by one task lasting
the simulated span of its kernel template (the gray-box split of PredTOP: stage latency +
pipeline structure). Units: elements, bytes, seconds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np

from predictor.graph import Category, DepKind, ExecutionGraph, GraphBuilder, Overhead, ProcKind
from predictor.sources.synth.emit import ExecMode, Kernel, concat, eltwise
from predictor.sources.synth.pipeline_schedule import Step, schedule
from predictor.sources.synth.transformer_emitter import GroupLayout, StepEmitter, collective
from predictor.sources.synth.transformer_kernels import StepKernels
from predictor.sources.synth.transformer_memory import (
    data_parallel_shard,
    expert_params_per_device,
    fp8_weight_params,
    gathered_layer_bytes,
    memory_per_stage,
    mtp_param_count,
    optimizer_state_bytes,
)
from predictor.sources.synth.transformer_spec import (
    DTYPE_BYTES,
    ParallelPlan,
    TransformerSpec,
    chunk_dense_layers,
)

__all__ = ["ADAM_BYTES_PER_PARAM", "adam_bytes_per_param", "GradBuckets", "StepTemplates", "nic_seconds_weight", "weigh_bucket_share"]

#: Adam step bytes per parameter: read fp32 param, grad, m, v; write param, m, v, 16-bit copy;
#: zero the fp32 gradient (Megatron's fused multi-tensor Adam + zero_grad)
ADAM_BYTES_PER_PARAM = 34.0


def adam_bytes_per_param(plan: ParallelPlan) -> float:
    """Bytes Megatron's Adam step moves per local parameter: :data:`ADAM_BYTES_PER_PARAM` with the fp32
    state; a 16-bit state reads and writes its master copy and moments in 16 bits."""
    state = optimizer_state_bytes(plan, 2)
    return ADAM_BYTES_PER_PARAM - 2.0 * (12.0 - state)


@dataclass
class GradBuckets:
    """Gradient buckets of the data-parallel reduce (filled in backward order)."""

    limit_params: float
    span: tuple[int, int]
    kind: str  # all_reduce or reduce_scatter
    grad_bytes: int
    tag: str
    share: float = 1.0  #: traffic classes on the NICs while the buckets reduce
    params: float = 0.0
    ready_after: int | None = None
    launched: list[int] = field(default_factory=list)
    count: int = 0

    def add(self, e: StepEmitter, n_params: float, after: int | None) -> None:
        """Add ``n_params`` gradients ready after task ``after``; launch the bucket once it is full."""
        if self.span[0] <= 1 or n_params <= 0:
            return
        self.params += n_params
        self.ready_after = after
        if self.params >= self.limit_params:
            self.flush(e)

    def flush(self, e: StepEmitter, alone: bool = False) -> None:
        """Launch the gradients collected so far as one asynchronous bucket reduce (``alone``: after the
        backward, so its transfers have the NICs to themselves)."""
        if self.params <= 0 or self.span[0] <= 1:
            return
        k = collective(f"{self.tag}.{self.kind}", self.kind, self.params * self.grad_bytes, self.span, self.grad_bytes,
                       1.0 if alone else self.share)
        after = [self.ready_after] if self.ready_after is not None else []
        self.launched += e.op(f"{self.tag}.bucket[{self.count}]", [k], comm=True, async_op=True, after=after)
        self.count += 1
        self.params = 0.0


def nic_seconds_weight(kind: np.ndarray, msg: np.ndarray, world: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Bytes each collective pushes through one NIC of a node, per byte/s of that NIC: a ring over ``world``
    ranks, ``world / nodes`` of them on a node side by side, sends ``2(n-1)/n`` (all-reduce) or ``(n-1)/n``
    (the others) of ``msg`` bytes per rank over that node's ``world / nodes`` NICs."""
    n = np.maximum(world, 1.0)
    wire = np.where(kind == "all_reduce", 2.0, 1.0) * (n - 1.0) / n
    return msg * wire / np.maximum(n / np.maximum(nodes, 1.0), 1.0)


def weigh_bucket_share(blk: ExecutionGraph, buckets: list[int]) -> None:
    """Set the NIC share of the data-parallel buckets of a backward block (in place) to ``1 + T / D``
    (at most 2): the NIC load ``T`` of the TP collectives sharing the NICs over the buckets' own load
    ``D``. Under fair sharing a bucket loses the NIC only while a TP collective runs, so it slows by the
    TP traffic, not 2x; the TP collectives keep 2 (the buckets are in flight for the backward)."""
    share = blk.params["nic_share"]
    idx = np.asarray([i for i in buckets if np.isfinite(share[i])], dtype=np.int64)
    if idx.size == 0:
        return
    kinds = np.asarray(blk.kinds, dtype=object)[blk.kind]
    load = nic_seconds_weight(kinds, blk.params["msg_bytes"], blk.params["world"], blk.params["nodes"])
    tp = np.isfinite(share)
    tp[idx] = False
    d = float(load[idx].sum())
    share[idx] = 1.0 + min(float(np.nansum(load[tp])) / d, 1.0) if d > 0 else 1.0


_LAYER = re.compile(r"layer\[(\d+)\]\.")
#: the longest run of layers :func:`emit_layers` looks for a repeating unit in (buckets filling over two layers
#: repeat every two)
MAX_UNIT_LAYERS = 4


def emit_layers(e: StepEmitter, order: list[int], emit: Callable[[int], None], signature: Callable[[int], Hashable],
                buckets: tuple[GradBuckets, ...] = ()) -> None:
    """Emit layers ``order`` one after another with ``emit(i)`` (tasks named ``layer[i].``..., gradients added to
    ``buckets``). In a run of layers with the same ``signature(i)``, once the last unit of ``u`` layers emitted
    (1 .. :data:`MAX_UNIT_LAYERS`) repeats the one before it one unit on — tasks, edges, the emitter's and the
    buckets' state alike (a bucket filled over two layers repeats every two; the head's gradients in the first
    bucket make the first unit differ) — the run's remaining whole units are copies of it
    (:meth:`~predictor.graph.GraphBuilder.repeat`): the graph emitting every layer builds, in a fraction of
    the time (a chunk's layers are most of the tasks a search's templates hold)."""
    b, k = e.b, 0
    while k < len(order):
        end = k + 1
        while end < len(order) and signature(order[end]) == signature(order[k]):
            end += 1
        marks, states, done, misses = [b.mark()], [_state(e, buckets)], k, 0
        while done < end:
            emit(order[done])
            done += 1
            marks.append(b.mark())
            states.append(_state(e, buckets))
            m = done - k
            for u in range(1, min(MAX_UNIT_LAYERS, m // 2) + 1):
                copies = (end - done) // u
                if copies < 1 or misses >= MAX_UNIT_LAYERS:
                    break
                at = m - 2 * u  # the last two units emitted: layers order[k + at .. k + m)
                first = order[k + at:k + at + u]
                hit = _repeat_unit(e, buckets, marks[at:m + 1:u], states[at:m + 1:u], copies,
                                   {i: order[k + at + t::u][:copies + 2] for t, i in enumerate(first)})
                if hit:  # the rest of the run, less than a unit, one layer at a time
                    for i in order[done + copies * u:end]:
                        emit(i)
                    done = end
                    break
                misses += hit is False
        k = end


def _repeat_unit(e: StepEmitter, buckets: tuple[GradBuckets, ...], marks: list[tuple[int, int]], states: list,
                 copies: int, layers: dict[int, list[int]]) -> bool | None:
    """Copy the second of two emitted units ``copies`` times where it repeats the first one unit on, and move
    the emitter's and the buckets' state on to the last copy; ``marks`` / ``states``: before, between and after
    the two units; ``layers``: each layer of the first unit -> the layers it stands for, unit by unit. Returns
    whether it copied; None where the states alone rule it out (nothing compared)."""
    (_, c0, _), (t1, c1, v1), (t2, c2, v2) = states
    steps = [y - x for x, y in zip(c0, c1, strict=True)]
    span = marks[1][0] - marks[0][0]
    moved = _moved_tasks(t1, t2, marks[1][0], span)
    if moved is None or v1 != v2 or steps != [y - x for x, y in zip(c1, c2, strict=True)]:
        return None
    if not e.b.repeat(*marks, copies, _renamer(layers, buckets, steps)):
        return False
    tasks = [x + copies * span if m else x for x, m in zip(t2, moved, strict=True)]
    held = len(tasks) - len(buckets)
    e.first, e.last, *e.after_next = tasks[:held]
    for bk, ready, step in zip(buckets, tasks[held:], steps, strict=True):
        new = bk.launched[len(bk.launched) - step:]
        bk.launched += [t + j * span for j in range(1, copies + 1) for t in new]
        bk.count += copies * step
        bk.ready_after = ready
    return True


def _state(e: StepEmitter, buckets: tuple[GradBuckets, ...]) -> tuple[list, list[int], list[float]]:
    """(tasks, counters, values) of the emitter and the buckets: the tasks later ops wait for, the buckets
    launched, the gradients waiting in each."""
    tasks = [e.first, e.last, *e.after_next, *(bk.ready_after for bk in buckets)]
    return tasks, [bk.count for bk in buckets], [bk.params for bk in buckets]


def _moved_tasks(t1: list, t2: list, b: int, span: int) -> list[bool] | None:
    """Per task of state ``t2`` (after the span starting at ``b``): whether it is ``t1``'s one span on (it moves
    with the copies) rather than the same task; None where it is neither."""
    if len(t1) != len(t2):
        return None
    out = []
    for x1, x2 in zip(t1, t2, strict=True):
        if x1 == x2:
            out.append(False)
        elif x1 is not None and x2 is not None and x2 == x1 + span and x2 >= b:
            out.append(True)
        else:
            return None
    return out


def _renamer(layers: dict[int, list[int]], buckets: tuple[GradBuckets, ...],
             steps: list[int]) -> Callable[[str, int], list[str]]:
    """``rename(name, k)`` of :meth:`~predictor.graph.GraphBuilder.repeat`: the name's next ``k`` units' — a
    layer ``layer[i].`` of the first unit as the unit's ``j``-th (``layers[i][j]``), a bucket's launch
    ``<tag>.bucket[c]`` as ``c + j x`` that bucket's launches a unit, any other name kept."""
    tags = {bk.tag: step for bk, step in zip(buckets, steps, strict=True)}

    def rename(name: str, k: int) -> list[str]:
        tag, sep, rest = name.partition(".bucket[")
        if sep and tag in tags:
            c = int(rest[:-1])
            return [f"{tag}.bucket[{c + j * tags[tag]}]" for j in range(1, k + 1)]
        parts = _LAYER.split(name)  # text, layer index, text, layer index, ..., text
        if len(parts) == 1:
            return [name] * k
        template = "layer[{}].".join(p.replace("{", "{{").replace("}", "}}") for p in parts[::2])
        units = [layers.get(int(i), [int(i)] * (k + 1)) for i in parts[1::2]]
        if len(units) == 1:
            return [template.format(i) for i in units[0][1:k + 1]]
        return [template.format(*(unit[j] for unit in units)) for j in range(1, k + 1)]

    return rename


class StepTemplates:
    """The step templates of one (spec, plan), each built once and cached.

    ``timing`` (a :class:`~predictor.simulate.Timing`) is needed only by :meth:`macro_block`.
    """

    def __init__(self, spec: TransformerSpec, plan: ParallelPlan, devices_per_node: int, mode: ExecMode,
                 timing=None) -> None:
        self.spec, self.plan, self.mode = spec, plan, mode
        self.dpn = devices_per_node
        self.lay = GroupLayout.of(plan, devices_per_node)
        self.ops = StepKernels(spec, plan, self.lay)
        self.p, self.v, self.m = plan.pp, plan.virtual_stages_effective, plan.micro_batches
        self.layers_per_chunk = plan.chunk_layers(spec.layers)
        # each virtual stage's layers and dense layers, computed once: every step looks them up
        chunks = range(self.p * self.v)
        self.chunk_layers = tuple(plan.layers_of(spec.layers, vs) for vs in chunks)
        self.chunk_dense = tuple(chunk_dense_layers(spec, plan, vs) for vs in chunks)
        #: an MoE model's first layers, dense (a step block's default: the first chunk's first layers)
        self.dense_layers = spec.moe.dense_layers if spec.moe is not None else 0
        self.timing = timing
        self._blocks: dict[tuple, ExecutionGraph] = {}
        self._macro: dict[tuple, ExecutionGraph] = {}
        dt = DTYPE_BYTES[plan.grad_reduce_dtype]
        self.grad_bytes = dt
        #: the data-parallel gradient collective: the distributed optimizer reduce-scatters, DDP and DeepSpeed's
        #: BF16 optimizer all-reduce
        self.grad_kind = "reduce_scatter" if plan.distributed_optimizer and not plan.deepspeed_bf16_grads \
            else "all_reduce"
        self.bucket_params = max(4e7, 1e6 * plan.replicas)
        #: bytes of one p2p activation message; ``sg``: scatter/gather transfers (SC21 §4.1)
        self.msg_act = self.ops.T * spec.hidden * spec.dtype_bytes
        self.sg = plan.pp_scatter_gather and plan.tp > 1 and not self.ops.sp
        if self.ops.sp or self.sg:
            self.msg_act /= plan.tp

    def _new(self) -> tuple[GraphBuilder, StepEmitter]:
        gb = GraphBuilder()
        return gb, StepEmitter(gb, 0, self.mode)

    def step_block(self, phase: str, first: bool, last: bool, final: bool, layers: int | None = None,
                   dense: tuple[bool, ...] | None = None) -> ExecutionGraph:
        """Kernel template of one forward/backward step of one chunk of ``layers`` layers (default: the even
        split's; ``final``: reduce gradients); ``dense``: which of them are an MoE model's dense layers (default:
        the model's first ``moe.dense_layers``, in the first chunk)."""
        n = self.layers_per_chunk if layers is None else layers
        if dense is None:
            dense = tuple(first and i < self.dense_layers for i in range(n))
        pattern = dense
        key = (phase, first, last, final, n, pattern)
        blk = self._blocks.get(key)
        if blk is not None:
            return blk
        _, e = self._new()
        ops = self.ops
        markers: dict = {}
        fsdp = self.plan.fsdp_sharded
        if phase == "F":
            if fsdp:  # the root unit (embedding, head) first, then layer 0; each layer prefetches the next
                e.after_next += self._fsdp_gather(e, "fsdp.root.all_gather", self._root_params(), layer=False)
                gathered = self._fsdp_gather(e, "fsdp.layer[0].all_gather", *self._fsdp_layer(pattern[0]))
                self._fsdp_copy_out(e, "fsdp.root", self._root_params(), layer=False)
            if first:
                ops.embedding_fwd(e)
            if fsdp:
                for i in range(n):
                    e.after_next += gathered
                    if i + 1 < n:
                        gathered = self._fsdp_gather(e, f"fsdp.layer[{i + 1}].all_gather", *self._fsdp_layer(pattern[i + 1]))
                    self._fsdp_copy_out(e, f"fsdp.layer[{i}]", self._fsdp_layer(pattern[i])[0])
                    ops.layer_fwd(e, f"layer[{i}].", pattern[i])
            else:
                emit_layers(e, list(range(n)), lambda i: ops.layer_fwd(e, f"layer[{i}].", pattern[i]),
                            lambda i: pattern[i])
            if last:
                ops.mtp_fwd(e)
                ops.head_fwd(e)
        elif fsdp:
            reduces = self._fsdp_backward(e, first, last, pattern)
            if final:  # the optimizer waits for the last micro-batch's reduce-scatters
                markers["dp"] = reduces
        else:
            dense = GradBuckets(self.bucket_params, self.lay.dp, self.grad_kind, self.grad_bytes, "dp_grad",
                                self.lay.dp_share)
            expert = GradBuckets(self.bucket_params, self.lay.edp, self.grad_kind, self.grad_bytes, "expert_dp_grad",
                                 self.lay.dp_share)
            with ops.sharing_nics() if final else nullcontext():  # TP traffic meets the buckets' on the NICs
                if last:
                    ops.head_bwd(e)
                    ops.mtp_bwd(e)
                    if final:
                        head = 2 * self.spec.hidden
                        if self.p > 1 or not self.spec.tie_embeddings:
                            head += self.spec.padded_vocab(self.plan.tp) * self.spec.hidden / self.plan.tp
                        mtp, mtp_experts = self._mtp_params()
                        dense.add(e, head + mtp, e.last)
                        if mtp_experts:
                            expert.add(e, mtp_experts, e.last)
                def layer(i: int) -> None:
                    ops.layer_bwd(e, f"layer[{i}].", i, pattern[i])
                    if final and pattern[i]:
                        dense.add(e, ops.dense_layer_params, e.last)
                    elif final:
                        dense.add(e, ops.layer_params - ops.expert_params, e.last)
                        expert.add(e, ops.expert_params, e.last)

                emit_layers(e, list(reversed(range(n))), layer, lambda i: (pattern[i], self.plan.recomputes_layer(i)),
                            (dense, expert) if final else ())
                if first:
                    ops.embedding_bwd(e)
                    if final:
                        dense.add(e, self.spec.padded_vocab(self.plan.tp) * self.spec.hidden / self.plan.tp
                                  + self.spec.position_params, e.last)
            if final:  # the last buckets reduce after the backward's TP traffic
                dense.flush(e, alone=True)
                expert.flush(e, alone=True)
                markers["dp"] = dense.launched + expert.launched
        blk = e.freeze(markers)
        if final and "nic_share" in blk.params:
            weigh_bucket_share(blk, markers.get("dp", []))
        self._blocks[key] = blk
        return blk

    def _root_params(self) -> float:
        """Parameters of FSDP's root unit on one tensor-parallel rank: the embeddings (and an untied head), with
        the multi-token prediction depths' (held with the root, all of them)."""
        spec, t = self.spec, self.plan.tp
        vocab = spec.padded_vocab(t) * spec.hidden / t
        return vocab + spec.position_params + 2 * spec.hidden + (0.0 if spec.tie_embeddings else vocab) \
            + sum(self._mtp_params())

    def _mtp_params(self) -> tuple[float, float]:
        """(parameters but the routed experts', routed experts') of the last stage's multi-token prediction depths
        on one device (:func:`mtp_param_count`)."""
        total, experts = mtp_param_count(self.spec, self.plan)
        return total - experts, experts

    def _fsdp_layer(self, dense: bool) -> tuple[float, float]:
        """(parameters, of them routed experts') of a layer on one device, as FSDP gathers it; ``dense``: one of an
        MoE model's dense layers."""
        ops = self.ops
        if self.spec.moe is None:
            return ops.layer_params, 0.0
        if dense:
            return ops.dense_layer_params, 0.0
        return ops.layer_params, ops.expert_params

    def _fsdp_gather(self, e: StepEmitter, name: str, params: float, experts: float = 0.0,
                     layer: bool = True) -> list[int]:
        """FSDP: all-gather ``params`` parameters (model dtype; a ``layer``'s weights in fp8 under
        ``spec.fp8_params``) on the communication stream; of them the routed experts' ``experts`` over the
        expert-data-parallel ranks that hold the same experts (torchtitan shards an MoE layer's experts apart
        from the rest), the others over FSDP's shard group (the data-parallel ranks, or HSDP's ``fsdp_shard``)."""
        dt = self.spec.dtype_bytes
        dense, expert = self._fsdp_bytes(params, experts, layer)
        kernels = [collective(name, "all_gather", dense, self.lay.fsdp, dt)]
        if experts > 0 and self.lay.edp[0] > 1:
            kernels.append(collective(f"{name}.experts", "all_gather", expert, self.lay.edp, dt))
        return e.op(name, kernels, comm=True, async_op=True)

    def _fsdp_bytes(self, params: float, experts: float, layer: bool) -> tuple[float, float]:
        """Bytes FSDP gathers of ``params`` parameters (``experts`` of them the routed experts'): (the rest's, the
        experts'); a ``layer``'s weights in fp8 under ``spec.fp8_params`` (torchtitan's
        ``enable_fsdp_float8_all_gather``, Megatron-FSDP's ``--fp8-param-gather``), the root unit's never."""
        if layer:
            return gathered_layer_bytes(self.spec, params, experts)
        return (params - experts) * self.spec.dtype_bytes, experts * self.spec.dtype_bytes

    def _fsdp_copy_out(self, e: StepEmitter, name: str, params: float, layer: bool = True) -> None:
        """FSDP2 (``plan.fsdp2``): the gathered ``params`` copied out into the parameters on the compute stream
        before their first use (a read and a write of what was gathered); nothing for flat-parameter FSDP."""
        if self.plan.fsdp2:
            k = eltwise(f"{name}.copy_out", "memcpy", params, self.spec.dtype_bytes, rw=2.0)
            k[3]["bytes"] = 2.0 * sum(self._fsdp_bytes(params, 0.0, layer))
            e.op(f"{name}.copy_out", [k])

    def _fsdp_reduce(self, e: StepEmitter, name: str, params: float, experts: float = 0.0) -> list[int]:
        """FSDP: reduce-scatter ``params`` gradients (the routed experts' ``experts`` over their own ranks) once
        the backward that produced them is done, on the gathers' stream: FSDP issues both on one process group,
        whose NCCL stream runs them in issue order (ProcessGroupNCCL keeps one stream per device and group; NCCL
        serialises a communicator's calls). The experts' group is kept on the same stream, in issue order. HSDP
        (``plan.fsdp_shard``): inside the shard group, then the rank's shard all-reduced over the replicate group."""
        g = self.grad_bytes
        kernels = [collective(name, "reduce_scatter", (params - experts) * g, self.lay.fsdp, g)]
        if self.lay.fsdp_rep[0] > 1:  # HSDP: the shard all-reduced over the groups holding it
            kernels.append(collective(f"{name}.replicas", "all_reduce", params * g / self.lay.fsdp[0],
                                      self.lay.fsdp_rep, g))
        if experts > 0 and self.lay.edp[0] > 1:
            kernels.append(collective(f"{name}.experts", "reduce_scatter", experts * g, self.lay.edp, g))
        after = [e.last] if e.last is not None else []
        if self.plan.fsdp2:  # chunk_cat: the model-dtype gradients read, the reduce-scatter input written in g bytes
            dt = self.spec.dtype_bytes
            after = e.op_on(e.comm, f"{name}.copy_in",
                            [eltwise(f"{name}.copy_in", "memcpy", params, dt, rw=(dt + g) / dt)], after=after)
        return e.op_on(e.comm, name, kernels, after=after)

    def _fsdp_backward(self, e: StepEmitter, first: bool, last: bool, dense: tuple[bool, ...]) -> list[int]:
        """FSDP backward: layers in reverse, each re-gathered (the previous layer's gather prefetched,
        BACKWARD_PRE; none when ``plan.fsdp_reshard_after_forward`` is off: the forward's gathers are kept) and
        its gradients reduce-scattered; the root unit's gradients last. Returns the reduce-scatters."""
        ops, n = self.ops, self.layers_per_chunk
        regather = self.plan.fsdp_reshard_after_forward
        reduces: list[int] = []
        gathered: list[int] = []
        if regather:
            gathered = self._fsdp_gather(e, f"fsdp.layer[{n - 1}].all_gather_bwd", *self._fsdp_layer(dense[n - 1]))
        if last:
            ops.head_bwd(e)
            ops.mtp_bwd(e)
        for i in reversed(range(n)):
            e.after_next += gathered
            if regather and i > 0:
                gathered = self._fsdp_gather(e, f"fsdp.layer[{i - 1}].all_gather_bwd", *self._fsdp_layer(dense[i - 1]))
            if regather:
                self._fsdp_copy_out(e, f"fsdp.layer[{i}].bwd", self._fsdp_layer(dense[i])[0])
            ops.layer_bwd(e, f"layer[{i}].", i, dense[i])
            reduces += self._fsdp_reduce(e, f"fsdp.layer[{i}].reduce_scatter", *self._fsdp_layer(dense[i]))
        if first:
            ops.embedding_bwd(e)
        return reduces + self._fsdp_reduce(e, "fsdp.root.reduce_scatter", self._root_params())

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
            k = ops.tp_collective(e, "p2p.all_gather", "all_gather", ops.T * self.spec.hidden)
            markers["gather"] = k[0]
        blk = e.freeze(markers)
        self._blocks[key] = blk
        return blk

    def param_gather_block(self, stage: int) -> ExecutionGraph:
        """The distributed optimizer's parameter all-gather of ``stage`` when it overlaps the first forward
        (``overlap_param_gather``): per model chunk in forward order, its first bucket, then the rest, on the
        communication stream, in stream order. Markers ``head`` and ``rest``: one task per chunk, which the
        chunk's first forward waits for at its start and at its end (what launches them: the assembly)."""
        key = ("gather", stage)
        blk = self._blocks.get(key)
        if blk is not None:
            return blk
        _, e = self._new()
        spec, plan = self.spec, self.plan
        params = memory_per_stage(spec, plan)[stage].params
        experts = expert_params_per_device(spec, plan, stage)
        dt, edt = self._gather_bytes(stage, params, experts)
        layers = [plan.layers_of(spec.layers, c * self.p + stage) for c in range(self.v)]
        shares = [n / sum(layers) for n in layers] if sum(layers) else [1.0 / self.v] * self.v
        heads: list[int] = []
        rests: list[int] = []
        for c, w in enumerate(shares):
            dense = (params - experts) * w
            head = min(dense, self.bucket_params)
            k = e.op(f"param_gather[{c}].first_bucket", [collective("param.all_gather", "all_gather", head * dt,
                                                                    self.lay.dp, dt)], comm=True, async_op=True)
            rest = self._param_gathers(dense - head, experts * w, dt, edt)
            r = e.op(f"param_gather[{c}].rest", rest, comm=True, async_op=True) if rest else k
            heads.append(k[0])
            rests.append(r[-1])
        blk = e.freeze({"head": heads, "rest": rests})
        self._blocks[key] = blk
        return blk

    def final_block(self, stage: int) -> ExecutionGraph:
        """End of the iteration on ``stage``: non-overlapped DP reduce, tied-embedding and grad-norm
        all-reduces, Adam, distributed-optimizer parameter all-gather (unless it overlaps the forward)."""
        p = self.p
        # the first and last stage share the input embedding when tied, or when the last one embeds for MTP
        tied = p > 1 and (self.spec.tie_embeddings or self.spec.mtp_layers > 0) and stage in (0, p - 1)
        key = ("final", tied, stage == 0, stage == p - 1)
        blk = self._blocks.get(key)
        if blk is not None:
            return blk
        gb, e = self._new()
        e.step_framework()  # device mode: backward()'s and optimizer.step()'s framework work, once per step
        plan, spec = self.plan, self.spec
        params = memory_per_stage(spec, plan)[stage].params
        markers: dict = {"dp": [], "wait_compute": []}
        if not plan.overlap_grad_reduce:
            markers["dp"] = self._reduce_all_gradients(e, params, stage)
            markers["wait_compute"] = list(markers["dp"][:1])
        groups: dict = {}
        after_comm = list(markers["dp"])
        if tied:
            g_local = gb.new_group()
            vocab_params = spec.padded_vocab(plan.tp) * spec.hidden / plan.tp
            k = e.op("embedding_grad.all_reduce",
                     [collective("embedding_grad.all_reduce", "all_reduce", vocab_params * self.grad_bytes,
                                 self.lay.tied, self.grad_bytes)], comm=True, async_op=True, group=g_local)
            groups["tied"] = g_local
            markers["tied"] = k[0]
            markers["wait_compute"].append(k[0])
            after_comm.append(k[0])
        experts = expert_params_per_device(spec, plan, stage)
        local = data_parallel_shard(spec, plan, params, stage) if plan.fsdp or plan.distributed_optimizer else params
        if spec.program == "eager" and plan.devices == 1:
            self._eager_optimizer(e, local, after_comm, markers)
        else:
            groups["norm"] = gb.new_group()
            self._megatron_optimizer(e, params, local, after_comm, markers, groups["norm"], experts, stage)
        markers["groups"] = groups
        blk = e.freeze(markers)
        self._blocks[key] = blk
        return blk

    def _reduce_all_gradients(self, e: StepEmitter, params: float, stage: int) -> list[int]:
        """Without ``overlap_grad_reduce``: every gradient bucket after the last backward, dense
        gradients first, then the experts'; returns the launched collectives."""
        if self.plan.fsdp:  # every micro-batch's backward reduce-scatters its own gradients
            return []
        dense = GradBuckets(self.bucket_params, self.lay.dp, self.grad_kind, self.grad_bytes, "dp_grad")
        expert_total = expert_params_per_device(self.spec, self.plan, stage)
        expert = GradBuckets(self.bucket_params, self.lay.edp, self.grad_kind, self.grad_bytes, "expert_dp_grad")
        for buckets, total in ((dense, params - expert_total), (expert, expert_total)):
            remaining = total
            while remaining > 0:
                chunk = min(remaining, self.bucket_params)
                buckets.add(e, chunk, None)
                remaining -= chunk
            buckets.flush(e)
        return dense.launched + expert.launched

    def _megatron_optimizer(self, e: StepEmitter, params: float, local: float, after: list[int], markers: dict,
                            group: int, experts: float = 0.0, stage: int = 0) -> None:
        """Megatron's step: gradient norm (local square sum + all-reduce over the model-parallel group
        ``group``), fused multi-tensor Adam on the ``local`` parameters, and the parameter all-gather
        of the distributed optimizer (the ``experts`` of the ``params`` over their own ranks) on ``stage``."""
        plan = self.plan
        norm = e.op("grad_norm", [eltwise("grad_norm.sq_sum", "elementwise", local, 4, rw=1.0)], after=after)
        markers["grad_norm"] = norm[0]
        e.op("grad_norm.all_reduce", [collective("grad_norm.all_reduce", "all_reduce", 4.0, self.lay.mp, 4)],
             group=group)
        e.op("optimizer.step", [("adam.multi_tensor_apply", "optimizer", Category.MEMORY,
                                 {"elements": local, "dtype_bytes": 4, "bytes": adam_bytes_per_param(plan) * local})])
        if plan.distributed_optimizer and not plan.fsdp and plan.replicas > 1 and not plan.gathers_params_in_forward:
            dt, edt = self._gather_bytes(stage, params, experts)
            e.op("param.all_gather", self._param_gathers(params - experts, experts, dt, edt))

    def _param_gathers(self, dense: float, experts: float, dt: float, edt: float) -> list[Kernel]:
        """The distributed optimizer's parameter all-gathers: ``dense`` parameters (``dt`` bytes each) over the
        data-parallel ranks, the routed ``experts`` (``edt`` bytes each) over the ranks holding them; none for
        nothing to gather."""
        out = [collective("param.all_gather", "all_gather", dense * dt, self.lay.dp, dt)] if dense > 0 else []
        if experts and self.lay.edp[0] > 1:
            out.append(collective("expert_param.all_gather", "all_gather", experts * edt, self.lay.edp, edt))
        return out

    def _gather_bytes(self, stage: int, params: float, experts: float) -> tuple[float, float]:
        """Bytes per parameter the distributed optimizer all-gathers on ``stage``: (the dense parameters' mean,
        the routed experts'): the model dtype's, one for the weights stored in fp8 (``spec.fp8_params``)."""
        dt = float(self.spec.dtype_bytes)
        fp8 = fp8_weight_params(self.spec, self.plan, stage)
        if not fp8:
            return dt, dt
        dense = params - experts
        return (dt - (fp8 - experts) * (dt - 1.0) / dense if dense > 0 else dt), 1.0

    def _eager_optimizer(self, e: StepEmitter, params: float, after: list[int], markers: dict) -> None:
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

    def macro_block(self, phase: str, first: bool, last: bool, layers: int | None = None,
                    dense: tuple[bool, ...] | None = None) -> ExecutionGraph:
        """Stage detail: one launch + one task lasting the simulated span of the kernel template."""
        n = self.layers_per_chunk if layers is None else layers
        key = (phase, first, last, n, dense)
        blk = self._macro.get(key)
        if blk is not None:
            return blk
        from predictor.simulate import simulate

        kernel = self.step_block(phase, first, last, False, n, dense)
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
        task = gb.task(dev, f"stage {what} ({n} layers{', embedding' if first else ''}"
                            f"{', head' if last else ''})", "pipeline_step", Category.COMPUTE,
                       duration=span, flops=float(np.nansum(kernel.flops)))
        if dev != cpu:
            gb.edge(launch, task, DepKind.CPU_GPU)
        blk = gb.build(validate=False)
        blk.meta["markers"] = {"first": task, "last": task}
        self._macro[key] = blk
        return blk

    def estimate_tasks(self) -> int:
        """Tasks of the kernel-detail graph (from the templates' sizes)."""
        total = 0
        for stage in range(self.p):
            for st in schedule(self.plan.schedule, self.p, self.m, stage, self.v):
                first, last = self.ends(st, stage)
                total += self.step_block(st.phase, first, last, False, self.layers_at(st, stage),
                                         self.dense_at(st, stage)).n_tasks
        return total

    def layers_at(self, st: Step, stage: int) -> int:
        """Layers of the chunk ``st`` runs on ``stage``."""
        return self.chunk_layers[st.chunk * self.p + stage]

    def dense_at(self, st: Step, stage: int) -> tuple[bool, ...]:
        """Which layers of the chunk ``st`` runs on ``stage`` are an MoE model's dense layers."""
        return self.chunk_dense[st.chunk * self.p + stage]

    def ends(self, st: Step, stage: int) -> tuple[bool, bool]:
        """Whether ``st`` on ``stage`` runs the first (embedding) and the last (head) virtual stage."""
        vs = st.chunk * self.p + stage
        return vs == 0, vs == self.p * self.v - 1
