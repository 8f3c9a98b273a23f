"""``space: parallel`` — search TP/PP/DP plans for training one transformer on one cluster.

Example (``search_spaces/parallel.yaml``)::

    space: parallel
    model: {name: gpt3-13b, layers: 40, hidden: 5120, heads: 40, seq: 2048, vocab: 51200}
    cluster: {platform: a100-80gb, nodes: 8}          # devices_per_node from the catalog
    global_batch: 512
    ranges: {tp: [1, 2, 4, 8], pp: [1, 2, 4, 8], micro_batch: [1, 2, 4],
             schedule: [1f1b, interleaved], recompute: [none, selective, full]}
    search: {strategy: auto, trials: 60}

``dp`` is derived (every device is used: ``dp = devices / (tp * pp * cp)``) unless ``ranges.dp``
restricts it. Combinations that cannot run (heads not divisible by ``tp``, layers not
divisible by the pipeline chunks, batch not divisible...) are not candidates; plans that run
out of memory are evaluated as infeasible. The same file works as ``tuner predict --workload``.

Strategy (``search.strategy``): ``grid`` evaluates every candidate (``auto`` picks it up to
``search.grid_limit`` candidates); ``tpe`` lets an Optuna TPE sampler pick ``search.trials``
distinct plans over the range dimensions, ``workers`` at a time
(:class:`tuner.search.tpe.TPEProposer`). Every evaluated plan is one outcome: ok (value =
predicted seconds per iteration), infeasible (does not fit in memory, with the reason),
invalid or failed.
"""

from __future__ import annotations

import itertools
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial
from pydantic import Field, model_validator

from predictor.sources.synth.transformer import (
    MLASpec,
    MoESpec,
    ParallelPlan,
    PlanError,
    TransformerSpec,
    check_plan,
)
from predictor.timing.platforms import UnknownPlatformError, get_platform
from predictor.timing.platforms.schema import Platform
from tuner.launch.megatron_split import megatron_stage_layers
from tuner.plans import predict_plan, unsupported_precision
from tuner.search.core import (
    AUTO,
    Candidate,
    Evaluator,
    Exhaustive,
    Outcome,
    Progress,
    Proposer,
    SearchResult,
    SearchSpace,
    run_search,
)
from tuner.search.schema import PositiveInt, Seed, SpaceError, StrictModel, at_most, bounded_int
from tuner.search.study import fingerprint
from tuner.search.tpe import TPEProposer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["ParallelSpace", "ModelSection", "ClusterSection", "PlanOptions", "SEARCHED", "normalise", "split_layers",
           "enumerate_candidates", "ParallelContext", "build_context", "evaluate_candidate", "ParallelSearch",
           "run_parallel_search"]


#: devices of one cluster (nodes x devices per node)
MAX_DEVICES = 65536
#: micro-batches of one pipeline per iteration: the schedule is simulated micro-batch by micro-batch
#: (65536 of them took 108 s for one plan on a 2-core Zen 4 VM)
MAX_MICRO_BATCHES = 4096
#: a width in elements (hidden, FFN, sequence)
Width = Annotated[int, Field(gt=0), at_most(2**20, "a width of a million elements")]
#: a parallel degree or a micro-batch size (each list of ``ranges`` holds at most 64 values)
Degree = Annotated[int, Field(gt=0), at_most(MAX_DEVICES, "devices of the largest clusters")]


class MoESection(StrictModel):
    """Mixture-of-experts MLP."""

    experts: bounded_int(1, 4096, "experts of one MoE layer") = Field(description="1 .. 4096")  # type: ignore[valid-type]
    top_k: PositiveInt = 2
    capacity_factor: Annotated[float, Field(gt=0), at_most(64.0, "tokens per expert slot")] = 1.0
    #: one routed expert's FFN width (default: the model's ffn; Megatron's --moe-ffn-hidden-size)
    ffn: bounded_int(1, 1_000_000, "an expert's FFN width") | None = None  # type: ignore[valid-type]
    #: the shared experts' FFN width, every token runs it (0: none; --moe-shared-expert-intermediate-size)
    shared_ffn: bounded_int(0, 1_000_000, "the shared experts' FFN width") = 0  # type: ignore[valid-type]
    #: the model's first layers with a dense MLP (DeepSeek's first_k_dense_replace)
    dense_layers: bounded_int(0, 10_000, "dense layers") = 0  # type: ignore[valid-type]
    #: the experts' GEMMs grouped (Megatron's --moe-grouped-gemm, torch._grouped_mm); false: one expert after
    #: another (Megatron's SequentialMLP)
    grouped_gemm: bool = True
    #: after the dense first layers, every n-th layer MoE and the others dense (Llama 4 Maverick: 2)
    every: bounded_int(1, 10_000, "layers per MoE layer") = 1  # type: ignore[valid-type]
    #: the tokens' way to other ranks' experts: Megatron's all-to-all, or DeepEP's normal kernels (one copy per
    #: destination node over the network, forwarded over NVLink)
    dispatcher: Literal["alltoall", "deepep"] = "alltoall"
    #: node-limited routing: a token's experts in at most router_group_topk of router_groups groups (0: none)
    router_groups: bounded_int(0, 4096, "expert groups") = 0  # type: ignore[valid-type]
    router_group_topk: bounded_int(0, 4096, "expert groups a token uses") = 0  # type: ignore[valid-type]


class MLASection(StrictModel):
    """Multi-latent attention (DeepSeek; Megatron-LM's --multi-latent-attention)."""

    q_lora_rank: bounded_int(0, 2**16, "the query latent's width") = 0  # type: ignore[valid-type]
    kv_lora_rank: bounded_int(1, 2**16, "the key/value latent's width") = 512  # type: ignore[valid-type]
    qk_head_dim: bounded_int(1, 2**12, "a head's query/key width") = 128  # type: ignore[valid-type]
    rope_head_dim: bounded_int(0, 2**12, "the rotary key's width") = 64  # type: ignore[valid-type]
    v_head_dim: bounded_int(1, 2**12, "a head's value width") = 128  # type: ignore[valid-type]


class ModelSection(StrictModel):
    """A GPT-style transformer (sizes are element counts)."""

    name: str = "transformer"
    layers: bounded_int(1, 10_000, "every layer is a block of the simulated schedule") = Field(  # type: ignore[valid-type]
        description="1 .. 10000")
    hidden: Width = Field(description="1 .. 2^20")
    heads: bounded_int(1, 2**14, "attention heads") = Field(description="1 .. 16384")  # type: ignore[valid-type]
    seq: Width = Field(description="tokens per sequence, 1 .. 2^20")
    vocab: bounded_int(1, 2**24, "vocabulary of 16 M tokens") = Field(description="1 .. 2^24")  # type: ignore[valid-type]
    ffn: Width | None = Field(default=None, description="FFN width, 1 .. 2^20 (default ffn_mult x hidden)")
    ffn_mult: Annotated[float, Field(gt=0), at_most(64.0, "FFN width as a multiple of hidden")] = 4.0
    kv_heads: bounded_int(1, 2**14, "key/value heads") | None = Field(  # type: ignore[valid-type]
        default=None, description="key/value heads of grouped-query attention (default: heads)")
    kv_channels: bounded_int(1, 2**14, "a head's width") | None = Field(  # type: ignore[valid-type]
        default=None, description="each head's width (default: hidden / heads; Megatron's --kv-channels)")
    #: gelu: fc1, GeLU, fc2; swiglu: Llama's gated MLP (fc1 to gate and up, 2 x ffn wide)
    mlp: Literal["gelu", "swiglu"] = "gelu"
    moe: MoESection | None = None
    #: multi-latent attention in place of the QKV projection (needs a fused attention)
    mla: MLASection | None = None
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    #: flash: fused attention priced as a GEMM; flash2 / flash_triton: FlashAttention-2 / llm-foundry's Triton
    #: kernel at their published speeds (A100, H100, H200); cudnn: cuDNN's (Transformer Engine on Hopper; H100,
    #: H200); te: Transformer Engine's choice on the chip (cudnn on Hopper, flash2 on the A100); flex:
    #: PyTorch's FlexAttention (torchtitan's default); unfused: separate matmul, softmax and dropout kernels
    attention: Literal["flash", "flash2", "flash_triton", "cudnn", "te", "flex", "unfused"] = "flash"
    causal: bool = True
    tie_embeddings: bool = True
    #: megatron: Megatron-LM's fused kernels; eager: plain PyTorch modules (torchtitan, Hugging Face)
    program: Literal["megatron", "eager"] = "megatron"
    #: Transformer Engine / torchao FP8 linears: the layers' GEMMs at the fp8 peak
    fp8_linear: bool = False
    #: with fp8_linear: the layers' linear weights stored in fp8 and gathered in fp8 (Megatron's --fp8-param-gather)
    fp8_params: bool = False
    #: tokens of one packed document when attention is masked per document (torchtitan); default: seq
    doc_len: Width | None = Field(default=None, description="tokens of a packed document, 1 .. seq")
    #: dropout probability (GPT-2/3 and Megatron's default 0.1); 0 for Llama, Qwen, MPT: no dropout kernels or masks
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    #: the linear layers carry biases; false for Llama, Qwen3, Nemotron (Megatron's --disable-bias-linear)
    bias: bool = True
    #: learned: absolute position embeddings (GPT, MPT); rope: rotary embeddings (Llama, Qwen); none
    position: Literal["learned", "rope", "none"] = "learned"
    #: eager program: one fused cross-entropy kernel (llm-foundry's flash-attn loss) in place of log-softmax + NLL
    fused_loss: bool = False
    #: multi-token prediction depth (DeepSeek-V3, Megatron's --mtp-num-layers): per depth one more layer, projection,
    #: output layer and loss on the last pipeline stage
    mtp_layers: Annotated[int, Field(ge=0, le=8)] = 0

    @model_validator(mode="after")
    def _shape(self) -> ModelSection:
        if self.kv_channels is None and self.hidden % self.heads:
            raise ValueError(f"hidden size {self.hidden} is not divisible by {self.heads} heads")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} heads are not a multiple of kv_heads={self.kv_heads}")
        if self.fp8_params and not self.fp8_linear:
            raise ValueError("fp8_params needs fp8_linear: true")
        if self.moe is not None and self.moe.top_k > self.moe.experts:
            raise ValueError(f"moe.top_k={self.moe.top_k} exceeds moe.experts={self.moe.experts}")
        if self.mla is not None and self.attention == "unfused":
            raise ValueError("multi-latent attention (mla) needs a fused attention (not unfused)")
        if self.doc_len is not None and self.doc_len > self.seq:
            raise ValueError(f"doc_len={self.doc_len} exceeds seq={self.seq}")
        if self.moe is not None and self.moe.dense_layers >= self.layers:
            raise ValueError(f"moe.dense_layers={self.moe.dense_layers} must be below layers={self.layers}")
        if self.moe is not None and self.moe.dense_layers + self.moe.every > self.layers:
            raise ValueError(f"moe.every={self.moe.every} leaves no MoE layer after the "
                             f"{self.moe.dense_layers} dense ones of {self.layers}")
        return self

    def to_spec(self) -> TransformerSpec:
        """The model as the transformer synthesiser's spec."""
        d = self.model_dump()
        moe, mla = d.pop("moe"), d.pop("mla")
        return TransformerSpec(**d, moe=MoESpec(**moe) if moe else None, mla=MLASpec(**mla) if mla else None)


class ClusterSection(StrictModel):
    """The devices: an accelerator of the catalog, devices per node, nodes."""

    platform: str = Field(description="catalog key, e.g. a100-80gb (`tuner catalog` lists them)")
    nodes: bounded_int(1, MAX_DEVICES, "devices of the largest clusters") = 1  # type: ignore[valid-type]
    devices_per_node: bounded_int(1, 1024, "devices one node holds") | None = Field(  # type: ignore[valid-type]
        default=None, description="1 .. 1024 (default: the catalog entry's)")
    catalog: str | None = Field(default=None, description="user YAML overriding or adding catalog entries")


class PlanOptions(StrictModel):
    """Plan settings that are not searched (Megatron-LM switches)."""

    overlap_grad_reduce: bool = True
    #: with the distributed optimizer: the parameter all-gather overlaps the next forward (--overlap-param-gather)
    overlap_param_gather: bool = False
    #: with overlap_param_gather and the interleaved schedule: each chunk's gather launched a chunk ahead
    #: (Megatron-core's default); false: one bucket ahead of the forward (--no-align-param-gather)
    align_param_gather: bool = True
    tp_comm_overlap: bool = False
    pp_scatter_gather: bool = True
    grad_reduce_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    #: with the distributed optimizer, DeepSpeed's BF16 optimizer: fp32 gradients all-reduced whole (not
    #: reduce-scattered) and the bf16 gradients held beside them
    deepspeed_bf16: bool = False
    #: Adam's state: fp32 (12 bytes a parameter), bf16_moments (8), bf16 (6)
    optimizer_state: Literal["fp32", "bf16_moments", "bf16"] = "fp32"
    #: FSDP plans run as PyTorch's fully_shard (FSDP2, torchtitan): each layer's gathered parameters copied
    #: out and its gradients copied in around the collectives; false: flat buffers (Megatron-FSDP, FSDP1)
    fsdp2: bool = False
    #: FSDP plans as PyTorch FSDP1 keeps them (Composer, llm-foundry): the fp32 parameter shards are the weights
    #: Adam updates, no master copy beside them (fsdp2 implies it); false: Megatron-FSDP's bf16 and fp32 shards
    fsdp_fp32_params: bool = False
    #: FSDP plans free each layer's gathered parameters after its forward and gather them again for its backward
    #: (FULL_SHARD); false: kept to the backward (SHARD_GRAD_OP, ZeRO-2): half the all-gathers, the whole model's
    #: parameters held at once
    fsdp_reshard_after_forward: bool = True
    #: FSDP plans shard over this many data-parallel ranks and replicate across the groups (HSDP; e.g. the
    #: devices of a node); null: over every data-parallel rank. FSDP plans whose dp it does not divide are left out
    fsdp_shard: Annotated[int, Field(ge=1, le=MAX_DEVICES)] | None = None
    #: the routed experts' TP degree: null, the plan's tp (Megatron's default: each expert split over the TP
    #: ranks); 1: each expert whole, each TP rank routing its own share of the tokens, and expert parallelism
    #: folded over the TP ranks (ep up to tp x dp: Megatron-core's MoE parallel folding, torchtitan's experts)
    expert_tp: Literal[1] | None = None
    #: the modules selective recomputation re-runs (Megatron's --recompute-modules: core_attn, layernorm,
    #: mla_up_proj, mlp, moe, moe_act, shared_experts); empty: the attention core. Plans with recompute: selective
    recompute_modules: list[Literal["core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act",
                                    "shared_experts"]] = Field(default=[], max_length=7)
    #: how pipeline stages split the layers: even (layers / (pp x v) each); embedding_and_loss (Megatron's
    #: --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split: the embedding and the
    #: loss each count as a layer, so the first and last stages hold one fewer and a 126-layer model splits
    #: over 8 or 16 stages); auto: even where the layers divide, else embedding_and_loss
    pipeline_split: Literal["auto", "even", "embedding_and_loss"] = "auto"
    #: share of each device's memory a plan may use: 1.0 all of it; 0.9 leaves a tenth for what the prediction does
    #: not count (the allocator's cache, the CUDA context, NCCL's buffers)
    memory_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0

    def plan_fields(self) -> dict:
        """The options that are :class:`ParallelPlan` fields (``pipeline_split`` and ``memory_fraction`` are not:
        they shape the split and the fit of each plan)."""
        return self.model_dump(exclude={"pipeline_split", "memory_fraction"})


class RangesSection(StrictModel):
    """Values to try for each plan dimension."""

    tp: list[Degree] = Field(max_length=64, default=[1, 2, 4, 8], min_length=1)
    pp: list[Degree] = Field(max_length=64, default=[1, 2, 4, 8], min_length=1)
    dp: list[Degree] | None = Field(default=None, max_length=64, description="default: devices / (tp x pp)")
    micro_batch: list[Degree] = Field(max_length=64, default=[1, 2, 4], min_length=1)
    schedule: list[Literal["1f1b", "interleaved"]] = Field(default=["1f1b"], min_length=1)
    virtual_stages: list[bounded_int(2, 1024, "model chunks per stage")] = Field(  # type: ignore[valid-type]
        default=[2], min_length=1, max_length=64)
    #: op: torchtitan's op-level selective checkpointing (every second matmul of a layer recomputed)
    recompute: list[Literal["none", "selective", "full", "op"]] = Field(default=["none", "selective", "full"],
                                                                       min_length=1)
    sequence_parallel: list[bool] = Field(default=[False], min_length=1)
    ep: list[Degree] = Field(max_length=64, default=[1], min_length=1)
    distributed_optimizer: list[bool] = Field(default=[False], min_length=1)
    #: FSDP full shard over the data-parallel ranks (PyTorch FSDP, Megatron-FSDP; with tp > 1 or experts
    #: torchtitan's layouts); plans with pp > 1 are left out
    fsdp: list[bool] = Field(default=[False], min_length=1)
    #: context-parallel degrees (Megatron's --context-parallel-size): each rank holds seq / cp tokens
    cp: list[Degree] = Field(max_length=64, default=[1], min_length=1)


class SearchSection(StrictModel):
    """How to search: every candidate (grid) or an Optuna TPE study of ``trials`` plans."""

    strategy: Literal["auto", "grid", "tpe"] = "auto"
    grid_limit: bounded_int(1, 10**6, "candidates of one grid") = Field(  # type: ignore[valid-type]
        default=256, description="auto: grid up to this many candidates (1 .. 10^6), else TPE")
    trials: bounded_int(1, 100_000, "plans one TPE study evaluates") = Field(  # type: ignore[valid-type]
        default=80, description="plans TPE evaluates, 1 .. 10^5")
    seed: Seed = 0
    top: bounded_int(1, 10_000, "rows of the terminal table") = Field(  # type: ignore[valid-type]
        default=10, description="plans shown in the table, 1 .. 10^4")
    detail: Literal["auto", "kernel", "stage"] = "auto"


class ParallelSpace(StrictModel):
    """``space: parallel`` — the fastest feasible TP/PP/DP plan for one model on one cluster."""

    space: Literal["parallel"]
    model: ModelSection
    cluster: ClusterSection
    global_batch: bounded_int(1, 2**24, "sequences per iteration") = Field(  # type: ignore[valid-type]
        description="sequences per iteration, 1 .. 2^24")
    ranges: RangesSection = RangesSection()
    options: PlanOptions = PlanOptions()
    search: SearchSection = SearchSection()

    @model_validator(mode="after")
    def _modules(self) -> ParallelSpace:
        mods = set(self.options.recompute_modules)
        if "mla_up_proj" in mods and self.model.mla is None:
            raise ValueError("options.recompute_modules: mla_up_proj needs model.mla (multi-latent attention)")
        if self.model.moe is None and mods & {"moe", "moe_act", "shared_experts"}:
            raise ValueError("options.recompute_modules: moe, moe_act and shared_experts need model.moe")
        return self

    def devices(self, devices_per_node: int) -> int:
        """Devices of the cluster with ``devices_per_node`` devices per node."""
        return self.cluster.nodes * devices_per_node


#: plan dimensions a search varies (each a list in ``ranges``)
SEARCHED = ("tp", "pp", "micro_batch", "schedule", "virtual_stages", "recompute", "sequence_parallel", "ep",
            "distributed_optimizer", "cp", "fsdp")


def split_layers(split: str, layers: int, pp: int, v: int) -> tuple[int, ...] | None:
    """``stage_layers`` of ``options.pipeline_split`` (None: even); :class:`ValueError` where it cannot split."""
    if split == "embedding_and_loss":
        return megatron_stage_layers(layers, pp, v, embedding=True, loss=True)
    if split == "even" or layers % (pp * v) == 0 or pp * v > layers:
        return None
    try:  # auto: where the layers do not divide, Megatron's split if it makes one (else check_plan says why not)
        return megatron_stage_layers(layers, pp, v, embedding=True, loss=True)
    except ValueError:
        return None


def normalise(space: ParallelSpace, devices: int, raw: dict) -> tuple[str, dict] | tuple[None, str]:
    """(key, plan fields) of the range values ``raw``, or (None, reason) when they cannot make a plan."""
    tp, pp, cp = raw["tp"], raw["pp"], raw.get("cp", 1)
    if devices % (tp * pp * cp):
        what = "tp x pp x cp" if cp > 1 else "tp x pp"
        return None, f"{what} = {tp * pp * cp} does not divide {devices} devices"
    dp = devices // (tp * pp * cp)
    micro_batches = space.global_batch // max(dp * raw["micro_batch"], 1)
    if micro_batches > MAX_MICRO_BATCHES:
        return None, (f"{micro_batches} micro-batches per iteration: at most {MAX_MICRO_BATCHES} (the schedule is "
                      "simulated micro-batch by micro-batch); raise micro_batch or dp")
    if space.ranges.dp is not None and dp not in space.ranges.dp:
        return None, f"dp={dp} is not in ranges.dp"
    fsdp = bool(raw.get("fsdp", False) and dp * cp > 1)
    if fsdp and pp > 1:
        return None, "fsdp is modelled without pipeline parallelism (pp = 1)"
    sched = raw["schedule"] if pp > 1 else "1f1b"
    fields = dict(tp=tp, pp=pp, dp=dp, micro_batch=raw["micro_batch"], global_batch=space.global_batch,
                  schedule=sched, virtual_stages=raw["virtual_stages"] if sched == "interleaved" else 2,
                  recompute=raw["recompute"], sequence_parallel=bool(raw["sequence_parallel"] and tp > 1),
                  ep=raw["ep"], distributed_optimizer=bool(raw["distributed_optimizer"] and dp * cp > 1 and not fsdp),
                  cp=cp, **space.options.plan_fields())
    if fields["recompute"] != "selective":
        fields["recompute_modules"] = []  # the modules of selective recomputation
    shard = space.options.fsdp_shard
    if fsdp and shard is not None and (dp % shard or shard * cp < 2 or space.model.moe is not None):
        return None, (f"options.fsdp_shard={shard} does not make HSDP groups of dp={dp}" if space.model.moe is None
                      else "options.fsdp_shard (HSDP) is modelled for dense models")
    fields.update(fsdp=fsdp, fsdp2=fsdp and space.options.fsdp2, fsdp_shard=shard if fsdp and shard != dp else None,
                  fsdp_fp32_params=fsdp and space.options.fsdp_fp32_params)
    try:
        layers = split_layers(space.options.pipeline_split, space.model.layers, pp,
                              fields["virtual_stages"] if sched == "interleaved" else 1)
    except ValueError as err:
        return None, str(err)
    if layers is not None:
        fields["stage_layers"] = list(layers)
    return ParallelPlan(**fields).label(), fields


def enumerate_candidates(space: ParallelSpace, devices: int) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """Every valid plan of the ranges on ``devices`` devices, and the invalid combinations with their reason.

    A candidate's params are ``fields`` (of a :class:`ParallelPlan`) and ``raw`` (the range values
    that made it: its trial parameters).
    """
    r = space.ranges
    spec = space.model.to_spec()
    seen: dict[str, Candidate] = {}
    invalid: dict[str, str] = {}
    for values in itertools.product(*(getattr(r, name) for name in SEARCHED)):
        raw = dict(zip(SEARCHED, values, strict=True))
        key, fields = normalise(space, devices, raw)
        if key is None:
            invalid.setdefault(f"tp{raw['tp']}-pp{raw['pp']}", fields)  # type: ignore[arg-type]
            continue
        if key in seen or key in invalid:
            continue
        try:
            check_plan(spec, ParallelPlan(**fields), devices)
        except PlanError as exc:
            invalid[key] = str(exc)
            continue
        seen[key] = Candidate(key, {"fields": fields, "raw": raw})
    return list(seen.values()), sorted(invalid.items())


# ----------------------------------------------------------------------------- evaluation
@dataclass
class ParallelContext:
    """What a worker needs to evaluate a plan (picklable)."""

    space: ParallelSpace
    platform: Platform
    spec: TransformerSpec
    devices_per_node: int
    devices: int


def build_context(space: ParallelSpace) -> ParallelContext:
    """Resolve the platform and the device count; raises :class:`SpaceError` on bad input."""
    try:
        platform = get_platform(space.cluster.platform, space.cluster.catalog)
    except UnknownPlatformError as exc:
        raise SpaceError(f"cluster.platform: {exc}") from None
    except FileNotFoundError:
        raise SpaceError(f"cluster.catalog: no such file {space.cluster.catalog}") from None
    dpn = space.cluster.devices_per_node or platform.devices_per_node
    if space.cluster.nodes * dpn > MAX_DEVICES:
        raise SpaceError(f"cluster: {space.cluster.nodes} nodes x {dpn} devices = {space.cluster.nodes * dpn} devices; "
                         f"at most {MAX_DEVICES} (devices of the largest clusters)")
    spec = space.model.to_spec()
    refused = unsupported_precision(spec, platform)
    if refused:
        raise SpaceError(f"cluster.platform: {refused}")
    return ParallelContext(space, platform, spec, dpn, space.cluster.nodes * dpn)


def evaluate_candidate(ctx: ParallelContext, key: str, fields: dict) -> dict:
    """Predict one plan; never raises (an error becomes ``status="failed"`` with its text)."""
    try:
        res, _ = predict_plan(ctx.spec, ParallelPlan(**fields), ctx.platform, devices_per_node=ctx.devices_per_node,
                              devices=ctx.devices, detail=ctx.space.search.detail,
                              memory_fraction=ctx.space.options.memory_fraction)
    except PlanError as exc:
        res = {"status": "invalid", "feasible": False, "reason": str(exc), "predicted_iteration_s": None}
    except Exception as exc:  # recorded, the search goes on
        res = {"status": "failed", "feasible": False, "predicted_iteration_s": None,
               "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=3)}
    res["key"] = key
    res["fields"] = fields
    return res


def _outcome(candidate: Candidate, res: dict) -> Outcome:
    return Outcome(candidate.key, candidate.params["raw"], res,
                   res["predicted_iteration_s"] if res["status"] == "ok" else None)


def evaluate_plan(ctx: ParallelContext, candidate: Candidate, part: object = None) -> list[Outcome]:
    """The evaluation of one candidate plan: one outcome."""
    return [_outcome(candidate, evaluate_candidate(ctx, candidate.key, candidate.params["fields"]))]


# ----------------------------------------------------------------------------- the space
class ParallelSearch(SearchSpace):
    """The parallel space plugged into the search core (grid or TPE)."""

    kind = "parallel"

    def __init__(self, spec: ParallelSpace) -> None:
        self.spec = spec
        self.context = build_context(spec)
        self._candidates, self.invalid = enumerate_candidates(spec, self.context.devices)
        if not self._candidates:
            why = self.invalid[0][1] if self.invalid else "the ranges are empty"
            raise SpaceError(f"no valid plan in the ranges for {self.context.devices} devices (e.g. {why})")
        self._by_key = {c.key: c for c in self._candidates}
        strategy = spec.search.strategy
        if strategy == "auto":
            strategy = "grid" if len(self._candidates) <= spec.search.grid_limit else "tpe"
        self.strategy = strategy

    def study_name(self) -> str:
        # the parts of the space that change results (not search.top, strategy or trials)
        d = self.spec.model_dump(mode="json")
        d["search"] = {k: v for k, v in d["search"].items() if k in ("detail",)}
        return f"parallel-{self.strategy}-{fingerprint(d)}"

    def distributions(self) -> dict[str, CategoricalDistribution]:
        return {name: CategoricalDistribution(list(getattr(self.spec.ranges, name))) for name in SEARCHED}

    def candidates(self) -> list[Candidate]:
        return self._candidates

    def evaluator(self) -> Evaluator:
        return evaluate_plan

    def worker_context(self) -> ParallelContext:
        return self.context

    def failed(self, candidate: Candidate, reason: str) -> list[Outcome]:
        res = {"status": "failed", "feasible": False, "predicted_iteration_s": None, "reason": reason,
               "key": candidate.key, "fields": candidate.params["fields"]}
        return [_outcome(candidate, res)]

    def resolve(self, params: dict) -> Candidate | None:
        """The candidate that sampled range values make (with them as its trial parameters), or ``None``."""
        key, _ = normalise(self.spec, self.context.devices, params)
        if key is None or key not in self._by_key:
            return None
        c = self._by_key[key]
        return Candidate(c.key, {**c.params, "raw": params})

    def proposer(self, candidates: list[Candidate], done: dict[str, list[Outcome]], history: list[FrozenTrial],
                 workers: int) -> Proposer:
        if self.strategy == "grid":
            return Exhaustive(candidates, done)
        s = self.spec.search
        return TPEProposer(self.distributions(), self.resolve, target=min(s.trials, len(candidates)),
                           batch_size=max(workers, 1), seed=s.seed, history=history)

    def write_outputs(self, result: SearchResult, out: Path) -> dict:
        from tuner.report.parallel import write_parallel_outputs

        return write_parallel_outputs(result, out)

    def print_table(self, payload: dict, console: Console) -> None:
        from tuner.report.parallel import print_parallel_table

        print_parallel_table(payload, console, top=self.spec.search.top)

    def summary(self, result: SearchResult, payload: dict, out: Path) -> str:
        best = payload["best"]
        tail = f"best {best['plan']}: {best['predicted_iteration_s']:.3f} s/iteration" if best else "no plan fits in memory"
        return (f"{len(result.outcomes)} plans of {len(self._candidates)} candidates ({self.strategy}; "
                f"{result.evaluated} new, {result.reused} from the study); {tail} -> {out}/results.json")


def run_parallel_search(
    space: ParallelSpace,
    *,
    storage: str,
    workers: int = AUTO,
    address: str | None = None,
    resume: bool = False,
    progress: Progress | None = None,
) -> SearchResult:
    """Search ``space`` (grid or TPE); see :func:`tuner.search.core.run_search`."""
    return run_search(ParallelSearch(space), storage=storage, workers=workers, address=address, resume=resume,
                      progress=progress)
