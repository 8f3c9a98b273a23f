"""Device memory of Megatron-style 3D-parallel transformer training, per pipeline stage.

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023, arXiv:2205.05198), §4: one transformer layer stores, per
micro-batch of ``b`` sequences of ``s`` tokens, hidden ``h``, ``a`` heads, 16-bit activations
and 1-byte dropout masks,

* ``s b h (34 + 5 a s / h)`` bytes without parallelism (their eq. 1): 11 sbh + 5 a s^2 b in
  attention, 19 sbh in the MLP, 4 sbh in the two layer norms; a model without dropout
  (``spec.dropout == 0``) stores neither the two ``sbh`` masks nor the scores' mask and output
  (``32 + 2 a s / h``);
* with tensor parallelism ``t``: ``s b h (10 + 24 / t + 5 a s / (h t))`` (eq. 2) — the layer-norm
  inputs and the dropout outputs are replicated, everything inside the column/row-parallel
  blocks is split;
* with sequence parallelism as well: ``s b h / t (34 + 5 a s / h)`` (eq. 4);
* selective recomputation drops the ``5 a s / h`` term (eq. 6: ``34 s b h / t`` with SP);
* full recomputation keeps only the layer input, ``2 s b h`` (``/ t`` with SP).

We generalise the MLP term to any FFN width ``f`` (``24`` becomes ``8 + 4 f / h``; ``8 + 6 f / h``
for SwiGLU, whose activation reads gate and up), shrink K and V by ``kv_heads / heads`` under
grouped-query attention, count a
fused (flash) attention like selective recomputation (it never stores the ``s x s`` scores;
it keeps a 4-byte log-sum-exp per head and token), and for MoE layers count the routed
tokens (``top_k x capacity_factor`` of them) through the expert MLPs. Under FP8 linears
(``spec.fp8_linear``) as Megatron-LM and NeMo run them, each linear keeps its input in fp8 for its
weight gradient, as Transformer Engine's ``Linear`` saves the quantized input: the QKV, projection,
FC1 and FC2 inputs cost one byte an element (GPT's ``34 sbh`` becomes ``31 - f / h``, i.e. 27; Llama
3 8B at 8,192 tokens 1.14 -> 0.92 GB a layer). The eager program's FP8 linears are torchao's
``Float8Linear`` (torchtitan), which saves the 16-bit input, so they keep the 16-bit count.

The number of micro-batches whose activations a stage holds at once comes from its schedule
(:func:`predictor.sources.synth.pipeline_schedule.peak_in_flight`): ``min(p - s, m)`` for 1F1B,
more for interleaving (Korthikanti §4.2.3: the first stage holds ``L (1 + (p-1)/(p v))``
layers' worth). The last stage adds the output layer and loss, ``4 s b h / t (1 + V / h)``
(Korthikanti §4.3); the first stage the embedding dropout mask.

Model states (Megatron-LM's accounting for mixed precision with Adam, as in its
distributed-optimizer documentation): 16-bit weights (2 bytes/param; the layers' weights 1 with FP8
parameters, ``spec.fp8_params``), main gradients (4 when
reduced in fp32, Megatron's default for bf16; 2 with ``--grad-reduce-in-bf16``, whose gradient
buffer is bf16), fp32 master weights + Adam moments (12) — 18 bytes per parameter (16 with bf16
gradients), or ``6 + 12 / d`` with the distributed optimizer (ZeRO-1 over the ``d`` data-parallel ranks; ``dp x cp`` with
context parallelism, whose ranks hold ``seq / cp`` tokens each). fp32 training
keeps no master copy (4 + 4 + 8). A 16-bit optimizer state (``plan.optimizer_state``) halves the
moments (8 bytes: fp32 master + two bf16 moments) or all three (6), as
:func:`optimizer_state_bytes` counts.

FSDP FULL_SHARD (``plan.fsdp``, pp = 1, as PyTorch FSDP and Megatron's
``optim_grads_params`` run it): weights, fp32 gradients and optimizer state are all sharded,
``18 / d`` bytes per parameter (Megatron-FSDP: a 16-bit weight shard beside the fp32 main weights);
``16 / d`` where the fp32 weight shard is itself the master copy (PyTorch FSDP, ``plan.fsdp_master_shard``); with tensor parallelism (torchtitan's 2-D FSDP + TP) of the
tensor-parallel rank's parameters, and what is gathered is that rank's share of a layer. An MoE
layer's routed experts are sharded over the ranks holding the same experts (``dp / ep``), as
torchtitan wraps them apart. On top, each device holds what is gathered at once
(:mod:`predictor.sources.synth.transformer_steps` issues the gathers): the root unit
(embeddings, head, final norm) stays gathered from its forward all-gather to its backward
reduce-scatter, with its full gradient; of the layers, the one computing and the prefetched
next one are gathered (model dtype), and in the backward the layer's full gradient is being
produced while the previous layer's full gradient is reduce-scattered on the second stream
(two full-layer gradient buffers, in ``grad_reduce_dtype``).

``RESERVED_BYTES`` (CUDA context, cuBLAS/NCCL workspaces, allocator slack) is an estimate,
not a measurement; every figure here is bytes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from predictor.sources.synth.pipeline_schedule import peak_in_flight, schedule
from predictor.sources.synth.transformer_matmuls import layer_matmuls
from predictor.sources.synth.transformer_spec import (
    DTYPE_BYTES,
    ParallelPlan,
    TransformerSpec,
    chunk_dense_layers,
)

__all__ = ["StageMemory", "RESERVED_BYTES", "activation_bytes_per_layer", "memory_per_stage", "layer_param_count",
           "mtp_param_count",
           "data_parallel_shard",
           "fp8_weight_params", "gathered_layer_bytes", "layer_norm_params", "optimizer_state_bytes", "op_checkpoint_bytes", "head_loss_bytes", "expert_param_count",
           "expert_params_per_device", "expert_replicas", "dense_layers_on"]

#: CUDA context + library workspaces + allocator fragmentation per device, bytes (estimate)
RESERVED_BYTES = 1.0 * 2**30


@dataclass(frozen=True)
class StageMemory:
    """Memory one device of a pipeline stage needs at its peak, bytes."""

    stage: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    params: float  #: parameters of the stage a device trains (FSDP keeps ``1 / dp`` of them between uses)
    in_flight: int  #: micro-batch chunks whose activations are alive at the peak

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.buffers_bytes

    def as_dict(self) -> dict:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        return d


def layer_param_count(spec: TransformerSpec, tp: int, ep: int = 1, *, dense: bool = False,
                      expert_tp: int = 1) -> float:
    """Parameters of one transformer layer held by one device (TP-split and replicated parts); ``dense``:
    one of an MoE model's dense layers (``moe.dense_layers``); ``expert_tp``: the routed experts' TP degree."""
    h, t = spec.hidden, tp
    attn = spec.attention_param_count(t)  # QKV (column) + proj (row; bias replicated)
    norms = layer_norm_params(spec)

    def split_mlp(f: int) -> float:  # fc1 column-, fc2 row-parallel (fc2's bias whole)
        f1 = spec.fc1_width(f)
        return (h * f1 + f1) / t + (f * h) / t + h

    if spec.moe is None or dense:
        mlp = split_mlp(spec.ffn_size)
    else:  # the router, whole, and the local experts' share; a shared expert TP-split as a dense MLP
        mlp = h * spec.moe.experts + expert_param_count(spec, ep, expert_tp)
        if spec.moe.shared_ffn:
            mlp += split_mlp(spec.moe.shared_ffn)
    return attn + norms + mlp


def mtp_param_count(spec: TransformerSpec, plan: ParallelPlan) -> tuple[float, float]:
    """(parameters, of them routed experts') of the multi-token prediction depths one device of the last stage
    holds: each depth's layer (of the last layer's kind), its ``2 h -> h`` projection (column-parallel) and its
    three norms, and with pipeline parallelism the stage's copy of the untied input embedding (the output layer
    they share, and a tied embedding, are counted with the model's)."""
    if not spec.mtp_layers:
        return 0.0, 0.0
    h, t = spec.hidden, plan.tp
    layer = layer_param_count(spec, t, plan.ep, dense=spec.mtp_dense, expert_tp=plan.etp)
    experts = 0.0 if spec.moe is None or spec.mtp_dense else expert_param_count(spec, plan.ep, plan.etp)
    copy = spec.padded_vocab(t) * h / t if plan.pp > 1 and not spec.tie_embeddings else 0.0
    return spec.mtp_layers * (layer + 2 * h * h / t + 3 * h) + copy, spec.mtp_layers * experts


def layer_norm_params(spec: TransformerSpec) -> float:
    """Parameters of one layer's two norms (a weight and a bias each, whole on every rank): ``4 h``."""
    return 4.0 * spec.hidden


def gathered_layer_bytes(spec: TransformerSpec, params: float, experts: float = 0.0) -> tuple[float, float]:
    """Bytes a gather moves of one layer's ``params`` parameters, ``experts`` of them routed experts': (the rest's,
    the experts'). The model dtype's; under ``spec.fp8_params`` one byte a weight, the norms the model dtype's."""
    dt = spec.dtype_bytes
    if not (spec.fp8_params and spec.fp8_linear):
        return (params - experts) * dt, experts * dt
    norms = layer_norm_params(spec)
    return (params - experts - norms) + norms * dt, experts


def expert_param_count(spec: TransformerSpec, ep: int, expert_tp: int = 1) -> float:
    """Parameters of the routed experts one of ``ep`` expert-parallel ranks holds in one MoE layer, each
    expert split over ``expert_tp`` tensor-parallel ranks."""
    if spec.moe is None:
        return 0.0
    return (spec.moe.experts / ep) * spec.mlp_param_count(spec.expert_ffn_size) / expert_tp


def activation_bytes_per_layer(spec: TransformerSpec, plan: ParallelPlan) -> float:
    """Activation bytes one layer keeps for one micro-batch until its backward (Korthikanti §4)."""
    s, b, h, a, t = spec.seq / plan.cp, plan.micro_batch, spec.hidden, spec.heads, plan.tp  # s: this rank's tokens
    f = spec.ffn_size
    sp = plan.sequence_parallel and t > 1
    sbh = s * b * h
    if plan.recompute == "full":
        return 2.0 * sbh / (t if sp else 1)
    if plan.recompute == "op":
        return op_checkpoint_bytes(spec, plan)
    # the layer-norm inputs and the two 1-byte dropout masks (none without dropout)
    replicated = (10.0 if spec.has_dropout else 8.0) * sbh
    # Q and the projection input 2 s b heads head_dim each, K and V 2 s b kv_heads head_dim each
    split_attn = (4.0 * spec.attn_size + 4.0 * spec.kv_heads_count * spec.head_dim) * s * b
    if spec.mla is not None:  # Q and K heads q_head_dim wide, V and the projection input v_head_dim, and
        m = spec.mla  # the latents the up projections read (whole on every rank)
        split_attn = 2.0 * s * b * spec.heads * (2.0 * m.q_head_dim + 2.0 * m.v_head_dim)
        replicated += 2.0 * s * b * (m.q_lora_rank + m.kv_lora_rank + m.rope_head_dim) * (t if sp else 1)
    # the activation's input (fc1's output: 2 f bytes a token, 4 f for SwiGLU's gate and up) and fc2's input;
    # eager SwiGLU's multiply also keeps silu(gate)
    silu_kept = 2.0 if spec.mlp == "swiglu" and spec.program == "eager" else 0.0
    mlp_per_token = 2.0 * (spec.fc1_size + f) + silu_kept * f
    if spec.moe is None:
        split_mlp = mlp_per_token * s * b
    else:
        routed = s * b * spec.moe.top_k * spec.moe.capacity_factor  # token copies through the experts
        ef, sf = spec.expert_ffn_size, spec.moe.shared_ffn
        expert_per_token = 2.0 * (spec.fc1_width(ef) + ef)
        shared = 2.0 * (spec.fc1_width(sf) + sf) * s * b if sf else 0.0
        # each expert's input as its fc1 reads it: the rank's own routed tokens, or its TP group's (expert_tp)
        split_mlp = routed * (expert_per_token + 2.0 * h * plan.etp) + 4.0 * s * b * spec.moe.experts + shared
    # Transformer Engine's linears keep their fp8 inputs: of the norms' outputs, those QKV and FC1 read (an MoE
    # layer's router keeps its 16-bit input; MLA's down projections are counted apart)
    fp8_inputs = spec.fp8_linear and spec.program == "megatron"
    fp8_norm_outputs = ((spec.mla is None) + (spec.moe is None)) if fp8_inputs else 0
    if fp8_inputs:
        replicated -= sbh * fp8_norm_outputs
        split_attn -= spec.attn_size * s * b  # the projection's input
        if spec.moe is None:
            split_mlp -= f * s * b  # FC2's input
        else:  # the experts' FC1 and FC2 inputs, the shared expert's FC2 input
            split_mlp -= routed * (h * plan.etp + ef) + sf * s * b
    # Megatron-core's selective recomputation of modules (--recompute-modules): what each does not keep
    mods = plan.selective_modules
    if "layernorm" in mods:  # the norms' outputs, where the next GEMMs kept them in 16 bits
        replicated -= 2.0 * sbh * (2 - fp8_norm_outputs)
    if "mla_up_proj" in mods and spec.mla is not None:  # the up projections' queries, keys and values
        split_attn -= 2.0 * s * b * spec.heads * (2.0 * spec.mla.q_head_dim + spec.mla.v_head_dim)
    if ("mlp" in mods and spec.moe is None) or ("moe" in mods and spec.moe is not None):
        split_mlp = 0.0  # the MLP (or MoE layer) keeps its input, which the norm's output already counts
    elif spec.moe is not None:
        if "moe_act" in mods:  # the experts' activation outputs (their FC2 inputs)
            split_mlp -= routed * ef * (1.0 if fp8_inputs else 2.0)
        if "shared_experts" in mods and sf:
            split_mlp -= shared - (sf * s * b if fp8_inputs else 0.0)
    out = (replicated / t if sp else replicated) + (split_attn + split_mlp) / t
    if spec.fused_attention:
        out += 4.0 * a * s * b / t  # fp32 log-sum-exp per head and token
    elif "core_attn" not in plan.selective_modules:
        # softmax output, dropout mask and output; without dropout the softmax output alone
        out += (5.0 if spec.has_dropout else 2.0) * a * s * s * b / t
    return out


def op_checkpoint_bytes(spec: TransformerSpec, plan: ParallelPlan) -> float:
    """Bytes one layer keeps for one micro-batch under torchtitan's op-level selective checkpointing: the
    layer's input and the outputs it saves — the odd-numbered plain matmuls (:func:`layer_matmuls`: a dense
    Llama layer's wq, wv, w1 and w2), the fused attention's output and its fp32 log-sum-exp per head and
    token, and an MoE layer's all-to-all outputs (the dispatched and the combined tokens, with expert
    parallelism); its routed experts' grouped GEMMs are recomputed, not kept."""
    s, b, h, a, t = spec.seq / plan.cp, plan.micro_batch, spec.hidden, spec.heads, plan.tp
    sp = plan.sequence_parallel and t > 1
    dt = spec.dtype_bytes
    kept = layer_matmuls(spec, t, dense=spec.moe is None)[0::2]
    saved = sum(h / t if mm.reduced else mm.n / t if mm.routed else mm.n for mm in kept) + spec.attn_size / t
    out = s * b * dt * (h / (t if sp else 1) + saved) + 4.0 * a * s * b / t
    if spec.moe is not None and plan.ep > 1:
        out += 2.0 * s * b / t * spec.moe.top_k * spec.moe.capacity_factor * h * dt
    return out


def head_loss_bytes(spec: TransformerSpec, plan: ParallelPlan) -> float:
    """Bytes the output layer and the loss add at the last stage's peak, one micro-batch.

    Megatron's vocab-parallel cross-entropy keeps fp32 logits once: ``4 s b h / t (1 + V / h)``
    (Korthikanti §4.3). The eager program computes the loss as plain PyTorch loops do,
    ``cross_entropy(logits.float())`` (torchtitan, Hugging Face Transformers): log-softmax's backward
    holds the fp32 output it saved, the gradient flowing into it and the one it produces at once,
    ``12 s b V``, plus the final norm's output; with TP the logits are split over the vocabulary
    (torchtitan's loss parallelism), ``12 s b V / t``."""
    s, b, h, t = spec.seq / plan.cp, plan.micro_batch, spec.hidden, plan.tp
    vpad = spec.padded_vocab(t)
    if spec.program == "eager" and not spec.fused_loss:
        return 12.0 * s * b * vpad / t + 4.0 * s * b * h
    return 4.0 * s * b * h / t * (1.0 + vpad / h)


def memory_per_stage(spec: TransformerSpec, plan: ParallelPlan) -> list[StageMemory]:
    """Peak memory of one device in each pipeline stage (``plan.pp`` entries), bytes."""
    p, v, t = plan.pp, plan.virtual_stages_effective, plan.tp
    m = plan.micro_batches
    dt = spec.dtype_bytes
    s, b, h = spec.seq / plan.cp, plan.micro_batch, spec.hidden  # s: tokens of a sequence on this rank
    sp = plan.sequence_parallel and t > 1
    vpad = spec.padded_vocab(t)
    full_layer = activation_bytes_per_layer(spec, replace(plan, recompute="none"))
    layer_acts = activation_bytes_per_layer(spec, plan)

    def chunk_acts_of(n: int) -> float:
        """Activations one micro-batch keeps in a chunk of ``n`` layers until its backward."""
        if plan.recompute != "full":
            return n * layer_acts
        recomputed = n if plan.recompute_layers is None else min(plan.recompute_layers, n)
        return recomputed * layer_acts + (n - recomputed) * full_layer  # the recomputed keep their input
    # an MoE model's dense layers (the first ones, and between MoE layers with moe.every): their weights and,
    # averaged over the stage's chunks, their activations in place of MoE layers'
    dense_params = (layer_param_count(spec, t, plan.ep, dense=True, expert_tp=plan.etp)
                    - layer_param_count(spec, t, plan.ep, expert_tp=plan.etp)) if spec.moe is not None else 0.0
    dense_acts = 0.0
    if spec.moe is not None and plan.recompute != "full":
        dense_spec = replace(spec, moe=None)
        dense_acts = (activation_bytes_per_layer(dense_spec, plan) - activation_bytes_per_layer(spec, plan)) / v
    # Megatron's gradient buffer: fp32 when gradients are reduced in fp32, else the parameters' dtype
    # (--grad-reduce-in-bf16); FSDP keeps sharded gradients in the fp32 parameters' dtype
    grad_b = 4.0 if plan.fsdp_sharded or plan.grad_reduce_dtype == "fp32" else float(dt)
    master_b = optimizer_state_bytes(plan, dt)
    out = []
    for stage in range(p):
        layers = plan.rank_layers(spec.layers, stage)
        dense = dense_layers_on(spec, plan, stage)
        # a micro-batch in flight holds one chunk's activations: the mean of the rank's chunks
        chunk_acts = sum(chunk_acts_of(plan.layers_of(spec.layers, c * p + stage)) for c in range(v)) / v
        params = layers * layer_param_count(spec, t, plan.ep, expert_tp=plan.etp) + dense * dense_params
        first, last = stage == 0, stage == p - 1
        if first:
            params += vpad * h / t + spec.position_params  # word + position embeddings
        if last:
            params += 2 * h  # final layer norm
            if p > 1 or not spec.tie_embeddings:
                params += vpad * h / t  # the output embedding (a tied copy when p > 1)
            params += mtp_param_count(spec, plan)[0]
        buffers = RESERVED_BYTES + 2.0 * s * b * h * dt  # p2p send/recv buffers
        if plan.fsdp_sharded:
            weights, grads, optim, gathered = _fsdp_states(spec, plan, params, dt, grad_b, master_b)
            buffers += gathered
        else:
            weights = params * dt - fp8_weight_params(spec, plan, stage) * (dt - 1.0)
            grads = params * (grad_b + (dt if plan.deepspeed_bf16_grads else 0.0))
            sharded = data_parallel_shard(spec, plan, params, stage) if plan.distributed_optimizer else params
            optim = sharded * master_b
        in_flight = peak_in_flight(schedule(plan.schedule, p, m, stage, v))
        acts = in_flight * (chunk_acts + dense * dense_acts)
        if plan.recompute == "full":
            acts += full_layer  # one layer's activations live while it is recomputed and back-propagated
        if first and spec.has_dropout:
            acts += in_flight * s * b * h / (t if sp else 1)  # embedding dropout mask
        if last:
            acts += head_loss_bytes(spec, plan) * (1 + spec.mtp_layers)  # each MTP depth's logits too
            if spec.mtp_layers:  # the MTP layers' activations, in the last of the rank's v chunks
                kind = replace(spec, moe=None) if spec.mtp_dense else spec
                acts += in_flight * spec.mtp_layers * activation_bytes_per_layer(kind, plan) / v
        out.append(StageMemory(stage, weights, grads, optim, acts, buffers, params, in_flight))
    return out


def fp8_weight_params(spec: TransformerSpec, plan: ParallelPlan, stage: int) -> float:
    """Parameters of pipeline ``stage`` a device stores in fp8 under ``spec.fp8_params``: its layers' weights
    less their norms (the linears' biases, a hidden-size vector each, ride with them), on the last stage also each
    multi-token prediction depth's layer and ``2 h -> h`` projection (Transformer Engine modules too); 0
    otherwise."""
    if not (spec.fp8_params and spec.fp8_linear):
        return 0.0
    layers = plan.rank_layers(spec.layers, stage)
    per_layer = layer_param_count(spec, plan.tp, plan.ep, expert_tp=plan.etp) - layer_norm_params(spec)
    dense = 0.0
    if spec.moe is not None:
        dense = dense_layers_on(spec, plan, stage) * (
            layer_param_count(spec, plan.tp, plan.ep, dense=True, expert_tp=plan.etp)
            - layer_param_count(spec, plan.tp, plan.ep, expert_tp=plan.etp))
    mtp = 0.0
    if spec.mtp_layers and stage == plan.pp - 1:
        depth = layer_param_count(spec, plan.tp, plan.ep, dense=spec.mtp_dense, expert_tp=plan.etp)
        mtp = spec.mtp_layers * (depth - layer_norm_params(spec) + 2.0 * spec.hidden ** 2 / plan.tp)
    return layers * per_layer + dense + mtp


def optimizer_state_bytes(plan: ParallelPlan, dtype_bytes: float) -> float:
    """Optimizer bytes per parameter before any sharding: Adam's two moments (4 bytes each, 2 with a
    16-bit state) and, when the weights are 16-bit (``dtype_bytes`` < 4), a master copy (4, or 2 with
    ``optimizer_state="bf16"``)."""
    moments = 8.0 if plan.optimizer_state == "fp32" else 4.0
    if dtype_bytes >= 4:
        return moments
    return moments + (2.0 if plan.optimizer_state == "bf16" else 4.0)


def expert_replicas(plan: ParallelPlan) -> int:
    """Ranks holding the same routed experts, which reduce (or shard) their gradients together: the
    data x context parallel ranks over ``ep`` (Megatron-core's expert-data-parallel group with CP), with
    the tensor-parallel ranks too where EP takes them in (:attr:`ParallelPlan.folds_tp_into_ep`)."""
    return max(plan.replicas * (plan.tp if plan.folds_tp_into_ep else 1) // plan.ep, 1)


def data_parallel_shard(spec: TransformerSpec, plan: ParallelPlan, params: float, stage: int = 0) -> float:
    """Of ``params`` parameters a device of ``stage`` holds, the share that sharding over the data-parallel ranks
    (FSDP, or the distributed optimizer's states) leaves it: the routed experts' over the ranks holding the same
    experts (:func:`expert_replicas`), the rest over ``dp x cp`` (FSDP's shard group with ``plan.fsdp_shard``)."""
    experts = expert_params_per_device(spec, plan, stage)
    return (params - experts) / plan.shard_ranks + experts / expert_replicas(plan)


def _fsdp_states(spec: TransformerSpec, plan: ParallelPlan, params: float, dt: float, grad_b: float,
                 master_b: float) -> tuple[float, float, float, float]:
    """FSDP FULL_SHARD model states of one device, bytes: (weight, gradient, optimizer shards, gathered). With
    ``plan.fsdp_master_shard`` the weight shard is the fp32 (or 16-bit, ``optimizer_state="bf16"``) master copy
    and the optimizer shard holds only the moments.

    ``gathered``: the root unit's full weights and gradient, two layers' full weights (the one
    computing and the prefetched one; every layer's without ``plan.fsdp_reshard_after_forward``, held
    from its forward to its backward) and two layers' full gradients (the one produced and the one
    being reduce-scattered) — full over the data-parallel ranks, a tensor-parallel rank's share.
    FSDP2 (``plan.fsdp2``) holds one layer twice more: its all-gather output beside the parameters it
    is copied out into, and its model-dtype gradients beside the reduce-scatter input they are copied into.
    """
    t = plan.tp
    vocab = spec.padded_vocab(t) * spec.hidden / t  # a tensor-parallel rank's rows of an embedding
    root = vocab + spec.position_params + 2 * spec.hidden + (0.0 if spec.tie_embeddings else vocab)
    layer = layer_param_count(spec, t, plan.ep, expert_tp=plan.etp)
    reduce_b = DTYPE_BYTES[plan.grad_reduce_dtype]
    held = 2.0 if plan.fsdp_reshard_after_forward else float(max(spec.layers, 2))
    layer_b = sum(gathered_layer_bytes(spec, layer))  # one gathered layer (fp8 weights under fp8_params)
    gathered = root * (dt + reduce_b) + held * layer_b + 2.0 * layer * reduce_b
    if plan.fsdp2:
        gathered += 2.0 * layer_b
    shard = data_parallel_shard(spec, plan, params)
    if plan.fsdp_master_shard and dt < 4:  # the weight shard is the master copy: only the moments beside it
        master = 2.0 if plan.optimizer_state == "bf16" else 4.0
        return shard * master, shard * grad_b, shard * (master_b - master), gathered
    return shard * dt, shard * grad_b, shard * master_b, gathered


def dense_layers_on(spec: TransformerSpec, plan: ParallelPlan, stage: int) -> int:
    """An MoE model's dense layers pipeline ``stage`` holds, all its model chunks together (0 for a dense model:
    its layers are all dense, and priced so)."""
    return sum(sum(chunk_dense_layers(spec, plan, c * plan.pp + stage)) for c in range(plan.virtual_stages_effective))


def expert_params_per_device(spec: TransformerSpec, plan: ParallelPlan, stage: int) -> float:
    """Expert parameters a device of pipeline ``stage`` holds (all its MoE layers), for the expert-data-parallel
    reduce."""
    moe_layers = plan.rank_layers(spec.layers, stage) - dense_layers_on(spec, plan, stage)
    mtp = mtp_param_count(spec, plan)[1] if stage == plan.pp - 1 else 0.0
    return moe_layers * expert_param_count(spec, plan.ep, plan.etp) + mtp


def gib(x: float) -> float:
    """Bytes to GiB (for messages)."""
    return x / 2**30 if math.isfinite(x) else x
