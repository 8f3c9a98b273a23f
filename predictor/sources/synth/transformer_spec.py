"""A GPT-style transformer and how Megatron-LM trains it: the inputs of the transformer synthesiser.

:class:`TransformerSpec` is the model (layers, hidden, heads and key/value heads, sequence,
vocabulary, FFN width and kind — GeLU or gated SwiGLU —, dense or mixture-of-experts, dtype,
attention kernel); :class:`ParallelPlan` is how it is trained (tensor ``tp`` x pipeline ``pp``
x data ``dp`` x context ``cp`` parallel, micro-batch, global batch,
1F1B or interleaved schedule, sequence parallelism, activation recomputation, expert
parallelism, distributed optimizer, gradient-reduce overlap); :func:`check_plan` rejects a plan
Megatron cannot run with a one-line :class:`PlanError`. Sizes are element counts, batches are
sequences.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["ATTENTION_VALUES", "DTYPE_BYTES", "MLASpec", "MoESpec", "RECOMPUTE_MODULES", "TransformerSpec",
           "ParallelPlan", "PlanError", "check_plan", "check_stage_layers", "chunk_dense_layers", "moe_layout",
           "split_label"]

#: bytes per element of each training dtype
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
#: attention cores the synthesiser emits (:attr:`TransformerSpec.attention`)
ATTENTION_VALUES = ("flash", "flash2", "flash_triton", "cudnn", "te", "flex", "unfused")


def moe_layout(routed: list[bool]) -> tuple[int, int] | None:
    """(``moe.dense_layers``, ``moe.every``) of a model whose layer ``i`` is an MoE layer where ``routed[i]``: the
    first dense layers, then every n-th layer MoE; None for another pattern (or no MoE layer)."""
    if True not in routed:
        return None
    for every in range(1, len(routed) + 1):
        k = routed.index(True) - (every - 1)
        if k >= 0 and all(r == (j >= k and (j - k) % every == every - 1) for j, r in enumerate(routed)):
            return k, every
    return None


#: the modules Megatron-core's selective recomputation can re-run (``--recompute-modules``) that tuner models
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")


class PlanError(ValueError):
    """A model or plan that cannot run (one line naming the problem)."""


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts MLP: ``experts`` per layer, each token routed to ``top_k`` of them.

    Each expert is an MLP of the model's kind (GeLU or SwiGLU) and width ``ffn`` (default: the
    model's ``ffn``; Megatron-LM's ``--moe-ffn-hidden-size``). ``shared_ffn`` > 0 adds a shared
    expert, an MLP of that width every token runs beside the routed ones (DeepSeek, Qwen MoE;
    ``--moe-shared-expert-intermediate-size``, the width of all shared experts together).
    ``dense_layers``: the model's first layers keep a dense MLP of the model's ``ffn`` (DeepSeek's
    ``first_k_dense_replace``; Megatron-LM's ``--moe-layer-freq "([0]*k+[1]*m)"``).
    ``every``: after them, every ``every``-th layer is an MoE layer and the others keep the dense MLP
    (Llama 4 Maverick's ``interleave_moe_layer_step`` 2: layers 1, 3, 5, ... MoE; Megatron-LM's
    ``--moe-layer-freq "([0]+[1])*24"``).
    ``grouped_gemm``: the routed experts' GEMMs as the program's grouped GEMM (Megatron-LM's
    ``--moe-grouped-gemm``: Transformer Engine's grouped linear, one GEMM per expert on 4 streams; the eager
    program's ``torch._grouped_mm``, one kernel); False: one GEMM per expert, one after another
    (Megatron-LM's ``SequentialMLP``, its default without the flag; torchtitan's ``use_grouped_mm = False``).
    ``dispatcher``: how tokens reach the experts of other ranks: ``"alltoall"`` (Megatron's all-to-all
    dispatcher, NCCL: one copy per routed expert) or ``"deepep"`` (DeepEP's normal kernels, Megatron's
    ``--moe-token-dispatcher-type flex --moe-enable-deepep``: one copy per destination node over the network,
    forwarded over NVLink to each destination GPU). ``router_groups`` / ``router_group_topk``: node-limited
    routing (DeepSeek-V3's 8 groups, top 4; ``--moe-router-num-groups`` / ``--moe-router-group-topk``): a token's
    experts lie in at most ``router_group_topk`` of ``router_groups`` contiguous groups of experts (0: no limit).
    """

    experts: int
    top_k: int = 2
    capacity_factor: float = 1.0
    ffn: int | None = None
    shared_ffn: int = 0
    dense_layers: int = 0
    grouped_gemm: bool = True
    every: int = 1
    dispatcher: Literal["alltoall", "deepep"] = "alltoall"
    router_groups: int = 0
    router_group_topk: int = 0


@dataclass(frozen=True)
class MLASpec:
    """Multi-latent attention (DeepSeek-V2/V3; Megatron-LM's ``--multi-latent-attention``). Queries come
    from a ``q_lora_rank``-wide latent (0: straight from the hidden state), keys and values from a
    ``kv_lora_rank``-wide latent plus a ``rope_head_dim``-wide shared rotary key; each head's queries and
    keys are ``qk_head_dim + rope_head_dim`` wide, its values ``v_head_dim``. The down projections are
    whole on every tensor-parallel rank, the up projections split by heads."""

    q_lora_rank: int = 0
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    rope_head_dim: int = 64
    v_head_dim: int = 128

    @property
    def q_head_dim(self) -> int:
        """Width of one head's query and key: ``qk_head_dim + rope_head_dim``."""
        return self.qk_head_dim + self.rope_head_dim


@dataclass(frozen=True)
class TransformerSpec:
    """A GPT-style decoder. Sizes are element counts; ``ffn`` defaults to ``ffn_mult * hidden``.

    Llama-style models set ``kv_heads`` (grouped-query attention) and ``mlp="swiglu"`` with their
    ``ffn`` (Llama 2 7B: ``kv_heads=32, ffn=11008``; Llama 3 8B: ``kv_heads=8, ffn=14336``)."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int | None = None
    ffn_mult: float = 4.0
    #: key/value heads (grouped-query attention; ``None``: as many as ``heads``, multi-head attention).
    #: The QKV projection is ``hidden x (heads + 2 kv_heads) head_dim``; attention FLOPs do not change
    kv_heads: int | None = None
    #: each head's width (Megatron-LM's ``--kv-channels``, Hugging Face's ``head_dim``; ``None``:
    #: ``hidden / heads``): the QKV projection's heads and the attention projection's input are
    #: ``heads x kv_channels`` wide (Qwen3, Gemma set it apart from ``hidden / heads``)
    kv_channels: int | None = None
    #: multi-latent attention in place of the QKV projection (:class:`MLASpec`)
    mla: MLASpec | None = None
    #: ``"gelu"``: ``fc1`` (hidden -> ffn), GeLU, ``fc2``; ``"swiglu"``: the gated MLP of Llama and
    #: Megatron's ``--swiglu``: ``fc1`` projects to gate and up (hidden -> 2 ffn, one GEMM as Megatron
    #: fuses them), ``silu(gate) * up``, ``fc2`` (ffn -> hidden): 1.5x the MLP weights and FLOPs
    mlp: Literal["gelu", "swiglu"] = "gelu"
    moe: MoESpec | None = None
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    #: attention core: ``"flash"`` (one fused kernel per pass, priced as a GEMM of its FLOPs), ``"flash2"``
    #: (FlashAttention-2's CUDA kernels), ``"flash_triton"`` (FlashAttention in Triton, llm-foundry's
    #: ``attn_impl: triton``), ``"cudnn"`` (cuDNN's fused attention, Transformer Engine's choice on
    #: Hopper), ``"te"`` (Transformer Engine's choice on the chip: cuDNN on Hopper, FlashAttention-2
    #: before) or ``"flex"`` (PyTorch's FlexAttention, torchtitan's default), each at its published speed
    #: (:mod:`predictor.timing.kernels.attention`), or ``"unfused"`` (Megatron's batched GEMMs, softmax
    #: and dropout over the full ``s x s`` scores)
    attention: Literal["flash", "flash2", "flash_triton", "cudnn", "te", "flex", "unfused"] = "flash"
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
    #: Transformer Engine FP8 training: the layers' linear GEMMs (QKV, projection, FC1, FC2, experts)
    #: run in fp8 (1-byte inputs, the platform's fp8 peak); under the megatron program each linear keeps its
    #: fp8 input for its weight gradient (Transformer Engine's ``Linear`` saves the quantized input; torchao's
    #: ``Float8Linear``, the eager program's, saves the 16-bit one); attention, the output layer and every
    #: other tensor kept in memory stay in ``dtype``
    fp8_linear: bool = False
    #: with ``fp8_linear``: the layers' linear weights are stored in fp8 (Transformer Engine's FP8
    #: parameters: Megatron-LM's ``--fp8-param-gather``, NeMo's ``fp8_params``, Megatron-Bridge's
    #: ``fp8_param_gather``), one byte a weight in place of a 16-bit copy, and the distributed optimizer
    #: all-gathers them in fp8 (half the bytes of a bf16 gather); under FSDP each layer's weights are
    #: gathered in fp8 and held so (torchtitan's ``enable_fsdp_float8_all_gather``, Megatron-FSDP's
    #: ``--fp8-param-gather``), the sharded master weights unchanged
    fp8_params: bool = False
    #: tokens of one packed document when attention is masked per document (torchtitan's block-causal
    #: attention over documents packed into a sequence): a fused attention kernel then spans ``doc_len``
    #: tokens, ``seq / doc_len`` times, at the published speed of that length; None: the whole sequence
    doc_len: int | None = None
    #: probability of the embedding, hidden and attention dropouts: 0.1 as GPT-2/3 and Megatron-LM's
    #: default; 0 (Llama, Qwen, MPT, Nemotron: Megatron's ``--hidden-dropout 0``) runs no dropout
    #: kernel and stores no mask
    dropout: float = 0.1
    #: the linear layers carry biases (GPT-2/3, MPT's default); False: Llama, Qwen3, Nemotron
    #: (Megatron's ``--disable-bias-linear``), whose eager backward sums no bias gradients
    bias: bool = True
    #: position information: ``"learned"`` absolute embeddings added to the tokens' (GPT-2/3, MPT; a
    #: ``seq x hidden`` table), ``"rope"`` rotary embeddings applied to every layer's queries and keys
    #: (Llama, Qwen, Nemotron; Megatron's ``--position-embedding-type rope``: one fused kernel a pass;
    #: eager, torchtitan's complex rotation: an fp32 copy, the multiply and the copy back) or ``"none"``
    position: Literal["learned", "rope", "none"] = "learned"
    #: the eager program's loss as one fused cross-entropy kernel a pass that keeps the logits once
    #: (flash-attn's ``CrossEntropyLoss``, llm-foundry's default ``loss_fn``), as Megatron's program always
    #: does; False: ``cross_entropy(logits.float())``'s log-softmax and NLL (torchtitan, Hugging Face)
    fused_loss: bool = False
    #: multi-token prediction depth (DeepSeek-V3; Megatron-LM's ``--mtp-num-layers``): after the last layer,
    #: per depth the next tokens' embedding, two norms, a ``2 h -> h`` projection, one layer of the last
    #: layer's kind and another output layer and loss over the same tokens, on the last virtual stage (which
    #: then holds a copy of the input embedding, its gradient all-reduced with the first stage's)
    mtp_layers: int = 0

    @property
    def position_params(self) -> int:
        """Parameters of the learned position table: ``seq x hidden``, or 0 without one."""
        return self.seq * self.hidden if self.position == "learned" else 0

    @property
    def has_dropout(self) -> bool:
        """Whether dropout kernels run (and masks are stored): ``dropout > 0``."""
        return self.dropout > 0.0

    @property
    def ffn_size(self) -> int:
        return int(self.ffn) if self.ffn else int(round(self.ffn_mult * self.hidden))

    @property
    def kv_heads_count(self) -> int:
        """Key/value heads (``heads`` unless grouped-query attention)."""
        return int(self.kv_heads) if self.kv_heads else self.heads

    @property
    def qkv_size(self) -> float:
        """Output width of the QKV projection: ``(heads + 2 kv_heads) head_dim``."""
        return self.attn_size + 2.0 * self.kv_heads_count * self.head_dim

    @property
    def attn_size(self) -> float:
        """Width of the attention heads' output together (the projection's input): ``heads x head_dim``,
        ``heads x v_head_dim`` with multi-latent attention."""
        return self.heads * (self.mla.v_head_dim if self.mla is not None else self.head_dim)

    def attention_param_count(self, tp: int = 1) -> float:
        """Weights (and biases) of one layer's attention projections one of ``tp`` ranks holds: the
        QKV and output projections, or multi-latent attention's down projections (whole on every rank),
        up projections and output projection; the output projection's bias is whole."""
        h, t = self.hidden, tp
        if self.mla is None:
            q = self.qkv_size
            return (h * q + q) / t + (self.attn_size * h) / t + h
        down, up = self.mla_weights()
        norms = self.mla.kv_lora_rank + self.mla.q_lora_rank  # the latents' norms, whole
        return down + norms + up / t + (self.attn_size * h) / t + h

    def mla_weights(self) -> tuple[float, float]:
        """Multi-latent attention's projection weights, output projection aside: (the down projections,
        whole on every rank; the up projections, split by heads)."""
        m, h, heads = self.mla, self.hidden, self.heads
        assert m is not None
        down = h * (m.kv_lora_rank + m.rope_head_dim) + h * m.q_lora_rank
        up = m.kv_lora_rank * heads * (m.qk_head_dim + m.v_head_dim)
        up += (m.q_lora_rank or h) * heads * m.q_head_dim
        return down, up

    @property
    def attention_core_width(self) -> float:
        """Summed width of one head's query/key and value (``2 head_dim``; with multi-latent attention
        ``q_head_dim + v_head_dim``): attention FLOPs per query-key pair are ``2 x`` it."""
        return self.mla.q_head_dim + self.mla.v_head_dim if self.mla is not None else 2.0 * self.head_dim

    @property
    def fc1_size(self) -> int:
        """Output width of the MLP's first GEMM: ``ffn``, or ``2 ffn`` (gate and up) for SwiGLU."""
        return self.fc1_width(self.ffn_size)

    @property
    def expert_ffn_size(self) -> int:
        """FFN width of one routed expert (the model's ``ffn`` unless ``moe.ffn``)."""
        return int(self.moe.ffn) if self.moe is not None and self.moe.ffn else self.ffn_size

    def fc1_width(self, ffn: int) -> int:
        """fc1's output width for an MLP of width ``ffn``: ``ffn``, or ``2 ffn`` for SwiGLU."""
        return 2 * ffn if self.mlp == "swiglu" else ffn

    def mlp_param_count(self, ffn: int) -> float:
        """Weights and biases of one MLP of width ``ffn`` (fc1 and fc2)."""
        h, f1 = self.hidden, self.fc1_width(ffn)
        return h * f1 + f1 + ffn * h + h

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def fused_attention(self) -> bool:
        """One fused attention kernel per pass, no ``s x s`` matrix stored (every value but ``"unfused"``)."""
        return self.attention != "unfused"

    @property
    def head_dim(self) -> float:
        """One head's width: ``kv_channels``, else ``hidden / heads``."""
        return float(self.kv_channels) if self.kv_channels else self.hidden / self.heads

    def padded_vocab(self, tp: int) -> int:
        """Rows of the embedding and the output layer over ``tp`` ranks: Megatron pads the vocabulary to a
        multiple of ``128 * tp``; plain PyTorch modules (``program: eager``: Hugging Face, llm-foundry,
        torchtitan) keep it, each rank holding ``ceil(vocab / tp)`` rows (GPT-2's 50,257 stays unaligned, which
        is why nanoGPT pads it to 50,304)."""
        if self.program == "eager":
            return int(math.ceil(self.vocab / tp) * tp)
        unit = 128 * tp
        return int(math.ceil(self.vocab / unit) * unit)

    def param_count(self) -> float:
        """Parameters of the whole model (embeddings counted once when tied)."""
        h, moe = self.hidden, self.moe
        attn = self.attention_param_count()
        dense_mlp = self.mlp_param_count(self.ffn_size)
        if moe is None:
            mlp = dense_mlp
        else:
            shared = self.mlp_param_count(moe.shared_ffn) if moe.shared_ffn else 0.0
            mlp = h * moe.experts + moe.experts * self.mlp_param_count(self.expert_ffn_size) + shared
        dense = self.layers - self.moe_layer_count
        layers = (self.layers - dense) * (attn + mlp + 4 * h) + dense * (attn + dense_mlp + 4 * h)
        last = attn + 4 * h + (dense_mlp if self.mtp_dense else mlp)  # an MTP depth's layer, as the last one
        mtp = self.mtp_layers * (last + 2 * h * h + 3 * h)  # with its projection and three norms
        emb = self.vocab * h + self.position_params
        return layers + mtp + emb + 2 * h + (0 if self.tie_embeddings else self.vocab * h)

    @property
    def mtp_dense(self) -> bool:
        """Whether the multi-token prediction layers are an MoE model's dense layers (they take the last layer's
        kind, as Megatron-core builds them from the decoder's last layer spec)."""
        return self.moe is not None and not self.is_moe_layer(self.layers - 1)

    def forward_flops_per_sequence(self) -> float:
        """Matmul FLOPs of one forward pass over one sequence (Narayanan et al. SC21 §5.1 accounting)."""
        s, h, moe = self.seq, self.hidden, self.moe
        dense_mlp = 2.0 * s * h * (self.fc1_size + self.ffn_size)
        if moe is None:
            mlp = dense_mlp
        else:
            ef, sf = self.expert_ffn_size, moe.shared_ffn
            mlp = 2.0 * s * h * ((self.fc1_width(ef) + ef) * moe.top_k + self.fc1_width(sf) + sf)
        if self.mla is None:
            attn = 2.0 * s * h * (self.qkv_size + self.attn_size) + 4.0 * s * s * self.attn_size
        else:
            attn = 2.0 * s * (sum(self.mla_weights()) + self.attn_size * h)
            attn += 2.0 * s * s * self.heads * self.attention_core_width
        dense = self.layers - self.moe_layer_count
        head = 2.0 * s * h * self.vocab
        mtp = self.mtp_layers * (attn + (dense_mlp if self.mtp_dense else mlp) + 2.0 * s * 2 * h * h + head)
        return (self.layers - dense) * (attn + mlp) + dense * (attn + dense_mlp) + head + mtp

    def iteration_flops(self, global_batch: int, recompute: str = "none") -> float:
        """Model FLOPs of one iteration: 3 passes (forward + backward) of the layers and the head,
        plus one more forward of the layers with full recomputation (SC21 eq. 3 uses 4)."""
        s, h = self.seq, self.hidden
        head = 2.0 * s * h * self.vocab * (1 + self.mtp_layers)  # the MTP depths' output layers too
        layers = self.forward_flops_per_sequence() - head
        passes = 4.0 if recompute == "full" else 3.0
        return global_batch * (passes * layers + 3.0 * head)

    def validate(self) -> None:
        for field_name in ("layers", "hidden", "heads", "seq", "vocab"):
            if getattr(self, field_name) < 1:
                raise PlanError(f"model {field_name} must be >= 1 (got {getattr(self, field_name)})")
        if self.kv_channels is None and self.hidden % self.heads:
            raise PlanError(f"hidden size {self.hidden} is not divisible by {self.heads} attention heads")
        if self.kv_channels is not None and self.kv_channels < 1:
            raise PlanError(f"kv_channels must be >= 1 (got {self.kv_channels})")
        if not 0.0 <= self.dropout < 1.0:
            raise PlanError(f"dropout must be a probability in [0, 1) (got {self.dropout})")
        if self.fp8_params and not self.fp8_linear:
            raise PlanError("fp8_params needs fp8_linear (fp8 weights are Transformer Engine's FP8 linears' own)")
        if self.doc_len is not None and not 1 <= self.doc_len <= self.seq:
            raise PlanError(f"doc_len must be 1 .. seq = {self.seq} tokens (got {self.doc_len})")
        if self.mla is not None:
            m = self.mla
            if min(m.kv_lora_rank, m.qk_head_dim, m.v_head_dim) < 1 or min(m.q_lora_rank, m.rope_head_dim) < 0:
                raise PlanError("mla: kv_lora_rank, qk_head_dim and v_head_dim must be >= 1, q_lora_rank and "
                                "rope_head_dim >= 0")
            if self.attention == "unfused":
                raise PlanError("multi-latent attention needs a fused attention")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise PlanError(f"{self.heads} attention heads are not a multiple of kv_heads={self.kv_heads}")
        if self.position not in ("learned", "rope", "none"):
            raise PlanError(f"position must be learned, rope or none (got {self.position!r})")
        if self.mlp not in ("gelu", "swiglu"):
            raise PlanError(f"mlp must be gelu or swiglu (got {self.mlp!r})")
        if self.attention not in ATTENTION_VALUES:
            raise PlanError(f"attention must be one of {', '.join(ATTENTION_VALUES)} (got {self.attention!r})")
        if self.moe is not None and (self.moe.experts < 1 or not 1 <= self.moe.top_k <= self.moe.experts):
            raise PlanError(f"MoE needs 1 <= top_k <= experts (got top_k={self.moe.top_k}, experts={self.moe.experts})")
        if self.moe is not None and (self.moe.ffn is not None and self.moe.ffn < 1 or self.moe.shared_ffn < 0):
            raise PlanError(f"MoE expert widths must be >= 1 (got ffn={self.moe.ffn}, shared_ffn={self.moe.shared_ffn})")
        if self.moe is not None and not 0 <= self.moe.dense_layers < self.layers:
            raise PlanError(f"moe.dense_layers must be 0 .. layers - 1 = {self.layers - 1} (got {self.moe.dense_layers})")
        if self.mtp_layers < 0:
            raise PlanError(f"mtp_layers must be >= 0 (got {self.mtp_layers})")
        if self.moe is not None:
            self.moe_routing_check()
        if self.moe is not None and not 1 <= self.moe.every <= self.layers - self.moe.dense_layers:
            raise PlanError(f"moe.every must be 1 .. {self.layers - self.moe.dense_layers} (the layers after the dense "
                            f"ones; got {self.moe.every})")

    def moe_routing_check(self) -> None:
        """PlanError unless the MoE dispatcher and the node-limited routing are ones tuner prices."""
        moe = self.moe
        assert moe is not None
        if moe.dispatcher not in ("alltoall", "deepep"):
            raise PlanError(f"moe.dispatcher must be alltoall or deepep (got {moe.dispatcher!r})")
        g, k = moe.router_groups, moe.router_group_topk
        if (g, k) == (0, 0):
            return
        if not (g >= 1 and moe.experts % g == 0 and 1 <= k <= g and k * (moe.experts // g) >= moe.top_k):
            raise PlanError(f"moe.router_groups {g} must divide the {moe.experts} experts and router_group_topk {k} "
                            f"be 1 .. {g}, its groups holding at least top_k = {moe.top_k} experts")

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based, in model order) is an MoE layer: after the ``moe.dense_layers`` first
        ones, every ``moe.every``-th."""
        moe = self.moe
        return moe is not None and index >= moe.dense_layers and (index - moe.dense_layers) % moe.every == moe.every - 1

    @property
    def moe_layer_count(self) -> int:
        """The model's MoE layers (0 for a dense model)."""
        moe = self.moe
        return 0 if moe is None else (self.layers - moe.dense_layers) // moe.every

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
    #: activation recomputation: ``"selective"`` Megatron's (the attention core; nothing with a fused
    #: attention), ``"full"`` every layer from its input, ``"op"`` torchtitan's op-level selective
    #: checkpointing (``selective_ac_option = "op"``): the outputs of every second matmul of a layer
    #: (in torchtitan's order wq, wk, wv, wo, w1, w3, w2: wk, wo, w3) and of its elementwise ops are
    #: dropped and recomputed in the backward
    recompute: Literal["none", "selective", "full", "op"] = "none"
    #: with ``recompute="full"``: how many layers of each model chunk are recomputed (Megatron's
    #: ``--recompute-method block --recompute-num-layers``; torchtitan's every n-th layer); None: all
    recompute_layers: int | None = None
    #: with ``recompute="selective"``: the modules Megatron-core recomputes (``--recompute-modules``, of
    #: :data:`RECOMPUTE_MODULES`); empty: its default, the attention core. ``core_attn``, ``mlp``, ``moe`` and
    #: ``shared_experts`` keep their input and re-run in the backward; ``layernorm``, ``mla_up_proj`` and
    #: ``moe_act`` discard their output once read and compute it again
    recompute_modules: tuple[str, ...] = ()
    ep: int = 1  #: expert-parallel degree (divides dp), MoE only
    #: tensor-parallel degree of the routed experts: None, the plan's ``tp`` (Megatron's default for
    #: ``--expert-tensor-parallel-size``: each expert's MLP split like a dense one, the routed tokens
    #: all-gathered over the TP ranks before it and reduce-scattered after); 1: each expert whole on
    #: every TP rank, which routes its own 1 / tp of the tokens (torchtitan's
    #: ``expert_tensor_parallel_degree``, its default)
    expert_tp: int | None = None
    #: context-parallel degree (Megatron's ``--context-parallel-size``, torchtitan's
    #: ``context_parallel_degree``): each rank holds ``seq / cp`` tokens of every sequence, its
    #: attention reads the others' keys and values passed round the ``cp`` ranks; the ``dp x cp``
    #: ranks of a stage hold the same weights and reduce (or shard) gradients together
    cp: int = 1
    distributed_optimizer: bool = False
    #: with ``distributed_optimizer``, DeepSpeed's BF16 optimizer (Megatron-DeepSpeed's ZeRO stage 0 with bf16):
    #: the fp32 gradients are all-reduced whole over the data-parallel ranks (Megatron's distributed optimizer
    #: reduce-scatters them) before each rank updates its shard, and each micro-batch's bf16 gradients are held
    #: beside the fp32 accumulation (2 bytes a parameter more)
    deepspeed_bf16: bool = False
    overlap_grad_reduce: bool = True
    #: with ``distributed_optimizer``: the updated parameters' all-gather overlaps the next iteration's first
    #: forward (Megatron's ``--overlap-param-gather``, NeMo's ``overlap_param_sync``): each model chunk's
    #: first bucket is gathered before its first micro-batch's forward starts, the rest before that forward
    #: ends; False: the all-gather runs after the optimizer step, before the next iteration
    overlap_param_gather: bool = False
    #: with ``overlap_param_gather`` and the interleaved schedule: the schedule launches each model chunk's whole
    #: gather ahead (chunks 0 and 1 at the start, chunk c + 1 when chunk c's first forward starts; Megatron-core's
    #: default since 0.9, ``--no-align-param-gather`` turns it off; NeMo's distributed Adam); False: one bucket
    #: in flight, the next launched when a forward waits for the current (Megatron-core 0.8, and every
    #: non-interleaved schedule)
    align_param_gather: bool = True
    #: overlap the input-gradient all-reduce with the wgrad GEMM; with sequence parallelism also each
    #: layer's all-gathers and reduce-scatters with the GEMMs that read or write them (userbuffers)
    tp_comm_overlap: bool = False
    pp_scatter_gather: bool = True
    grad_reduce_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    #: the optimizer's state: ``"fp32"`` master weights and Adam moments (12 bytes per parameter with
    #: 16-bit training); ``"bf16_moments"`` fp32 master weights, 16-bit moments (8: Megatron-LM's
    #: ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``); ``"bf16"`` all
    #: three 16-bit (6: NeMo's ``optim.dtype: bf16`` with apex's distributed Adam, or Megatron-LM's
    #: ``--main-params-dtype fp16`` with 16-bit moments)
    optimizer_state: Literal["fp32", "bf16_moments", "bf16"] = "fp32"
    #: PyTorch FSDP FULL_SHARD over the data-parallel group (pp = 1; with tp > 1 each tensor-parallel rank's
    #: shard, torchtitan's 2-D FSDP + TP; an MoE layer's routed experts over the dp / ep ranks holding
    #: them): each layer's parameters are
    #: all-gathered (in the model dtype) before its forward and again before its backward, the next
    #: layer's gather prefetched on the communication stream; its gradients are reduce-scattered (in
    #: ``grad_reduce_dtype``) after every micro-batch's backward; Adam updates the local shard
    fsdp: bool = False
    #: FSDP as PyTorch's ``fully_shard`` (FSDP2: torchtitan, Megatron's ``--use-torch-fsdp2``): parameters are
    #: sharded one by one, so each layer's all-gather output is copied out into its parameters on the
    #: compute stream (``split_with_sizes_copy``) and its gradients are copied into the reduce-scatter input
    #: (``chunk_cat``, cast to ``grad_reduce_dtype``) on the communication stream: one pass over the layer's
    #: parameters each. FSDP1's flat parameters and Megatron-FSDP's buffers gather and reduce in place
    fsdp2: bool = False
    #: PyTorch FSDP's sharded parameters (FSDP1 as Composer runs it; FSDP2 always, so ``fsdp2`` implies it): kept
    #: in fp32 and updated by the optimizer in place, the weight shard being the master copy (16 / d bytes a
    #: parameter with an fp32 Adam state); False: Megatron-FSDP's 16-bit weight shard beside its fp32 main-weight
    #: shard (18 / d)
    fsdp_fp32_params: bool = False
    #: FSDP frees each layer's gathered parameters after its forward and gathers them again for its backward
    #: (FULL_SHARD; FSDP2's ``reshard_after_forward=True``); False keeps them from the forward to the backward
    #: (SHARD_GRAD_OP, ZeRO-2; torchtitan's ``fsdp_reshard_after_forward = "never"``): one all-gather per layer
    #: and micro-batch instead of two, every layer's full parameters held at the backward's start
    fsdp_reshard_after_forward: bool = True
    #: FSDP's shard group, in data-parallel ranks (each with its ``cp`` ranks): None shards over every replica
    #: (FULL_SHARD); ``k`` shards over ``k`` consecutive data-parallel ranks and replicates over the ``dp / k``
    #: groups (HSDP: PyTorch FSDP's HYBRID_SHARD, torchtitan's ``data_parallel_replicate_degree`` x
    #: ``data_parallel_shard_degree``): each layer gathered and its gradients reduce-scattered inside the group,
    #: the gradient shards then all-reduced over the groups holding the same shard
    fsdp_shard: int | None = None
    #: layers of each virtual pipeline stage in model order (``pp x virtual stages`` entries; virtual stage
    #: ``c x pp + s`` is model chunk ``c`` of pipeline rank ``s``), for splits that are not even: Megatron's
    #: ``--decoder-first/last-pipeline-num-layers`` and ``--account-for-embedding/loss-in-pipeline-split``,
    #: torchtitan's ``pipeline_parallel_first/last_stage_less_layers``; None: ``layers / (pp x v)`` each
    stage_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.recompute_modules, tuple):  # a list from YAML / JSON
            if isinstance(self.recompute_modules, (str, bytes)) or not all(
                    isinstance(m, str) for m in self.recompute_modules):
                raise PlanError(f"recompute_modules must be a list of module names (got {self.recompute_modules!r})")
            object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))
        if self.stage_layers is not None and not isinstance(self.stage_layers, tuple):  # a list from YAML / JSON
            if isinstance(self.stage_layers, (str, bytes)) or not all(
                    isinstance(n, int) and not isinstance(n, bool) for n in self.stage_layers):
                raise PlanError(f"stage_layers must be a list of whole numbers (got {self.stage_layers!r})")
            object.__setattr__(self, "stage_layers", tuple(self.stage_layers))

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def gathers_params_in_forward(self) -> bool:
        """The distributed optimizer's parameter all-gather overlaps the first forward
        (:attr:`overlap_param_gather` with a sharded, non-FSDP optimizer state over several replicas)."""
        return self.overlap_param_gather and self.distributed_optimizer and not self.fsdp and self.replicas > 1

    @property
    def prefetches_chunk_params(self) -> bool:
        """The interleaved schedule launches each model chunk's parameter all-gather ahead of its first forward
        (:attr:`align_param_gather`)."""
        return self.gathers_params_in_forward and self.align_param_gather and self.virtual_stages_effective > 1

    @property
    def etp(self) -> int:
        """Tensor-parallel degree of the routed experts (:attr:`expert_tp`, or ``tp``)."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def selective_modules(self) -> frozenset[str]:
        """The modules selective recomputation re-runs (:attr:`recompute_modules`, or the attention core by
        default); empty for any other recomputation."""
        if self.recompute != "selective":
            return frozenset()
        return frozenset(self.recompute_modules or ("core_attn",))

    @property
    def folds_tp_into_ep(self) -> bool:
        """Whether the expert-parallel groups take in the tensor-parallel ranks: routed experts whole
        (``expert_tp`` 1) beside TP, so the TP x CP x DP ranks of a stage split into ``ep``-rank groups of
        neighbouring ranks, each holding ``experts / ep`` of them (Megatron-core's MoE parallel folding,
        torchtitan's EP borrowing TP when ``expert_tensor_parallel_degree = 1``)."""
        return self.etp == 1 and self.tp > 1

    @property
    def replicas(self) -> int:
        """Ranks holding the same weights (data x context parallel): gradients are reduced, and the
        distributed optimizer or FSDP shards, over them."""
        return self.dp * self.cp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per data-parallel replica and iteration."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def shard_ranks(self) -> int:
        """Ranks FSDP (or the distributed optimizer) shards a stage's states over: the FSDP shard group
        (:attr:`fsdp_shard` x ``cp``) or every replica."""
        return self.fsdp_shard * self.cp if self.fsdp and self.fsdp_shard is not None else self.replicas

    @property
    def fsdp_master_shard(self) -> bool:
        """FSDP whose sharded parameters are the optimizer's master weights (PyTorch FSDP: :attr:`fsdp2` or
        :attr:`fsdp_fp32_params`)."""
        return self.fsdp and (self.fsdp2 or self.fsdp_fp32_params)

    @property
    def fsdp_replicas(self) -> int:
        """FSDP shard groups holding the same shards (HSDP's replicate degree; 1 for FULL_SHARD)."""
        return self.replicas // self.shard_ranks if self.fsdp else 1

    @property
    def fsdp_sharded(self) -> bool:
        """FSDP over more than one rank (with one, it trains as plain data parallelism)."""
        return self.fsdp and self.shard_ranks > 1

    def chunk_layers(self, layers: int) -> int:
        """Layers of one model chunk of a ``layers``-layer model split evenly: ``layers / (pp x virtual stages)``
        (with :attr:`stage_layers`, the largest chunk's)."""
        if self.stage_layers is not None:
            return max(self.stage_layers)
        return layers // (self.pp * self.virtual_stages_effective)

    def layers_of(self, layers: int, virtual_stage: int) -> int:
        """Layers of virtual pipeline stage ``virtual_stage`` (chunk ``c`` of rank ``s`` is ``c x pp + s``)."""
        return self.chunk_layers(layers) if self.stage_layers is None else self.stage_layers[virtual_stage]

    def chunk_start(self, layers: int, virtual_stage: int) -> int:
        """The first layer (0-based, model order) of virtual pipeline stage ``virtual_stage``."""
        return sum(self.layers_of(layers, u) for u in range(virtual_stage))

    def rank_layers(self, layers: int, stage: int) -> int:
        """Layers pipeline rank ``stage`` holds, all its model chunks together."""
        return sum(self.layers_of(layers, c * self.pp + stage) for c in range(self.virtual_stages_effective))

    def recomputes_layer(self, index: int) -> bool:
        """Whether layer ``index`` of a model chunk is recomputed in full."""
        return self.recompute == "full" and (self.recompute_layers is None or index < self.recompute_layers)

    @property
    def deepspeed_bf16_grads(self) -> bool:
        """DeepSpeed's BF16 optimizer in force: ``deepspeed_bf16`` with the optimizer state sharded."""
        return self.deepspeed_bf16 and self.distributed_optimizer and not self.fsdp

    @property
    def virtual_stages_effective(self) -> int:
        return self.virtual_stages if (self.schedule == "interleaved" and self.pp > 1) else 1

    def label(self) -> str:
        """Short human-readable name, e.g. ``tp4-pp8-dp16-mb2-1f1b-full``."""
        sched = self.schedule if self.schedule == "1f1b" or self.pp == 1 else f"int{self.virtual_stages}"
        extra = "-sp" if self.sequence_parallel and self.tp > 1 else ""
        extra += f"-ep{self.ep}" if self.ep > 1 else ""
        extra += f"-etp{self.expert_tp}" if self.expert_tp is not None and self.expert_tp != self.tp else ""
        extra += "-zero1" if self.distributed_optimizer and not self.fsdp else ""
        extra += "-opg" if self.gathers_params_in_forward else ""
        extra += "-noalign" if self.gathers_params_in_forward and self.virtual_stages_effective > 1 \
            and not self.align_param_gather else ""
        extra += "-dsbf16" if self.deepspeed_bf16_grads else ""
        extra += ("-fsdp" if self.fsdp_reshard_after_forward else "-fsdp-zero2") if self.fsdp else ""
        extra += f"-hsdp{self.fsdp_shard}" if self.fsdp and self.fsdp_shard is not None else ""
        extra += f"-cp{self.cp}" if self.cp > 1 else ""
        extra += {"fp32": "", "bf16_moments": "-adam16m", "bf16": "-adam16"}[self.optimizer_state]
        extra += f"-layers{split_label(self.stage_layers)}" if self.stage_layers is not None else ""
        rec = self.recompute + (str(self.recompute_layers) if self.recompute_layers is not None else "")
        rec += f"[{'+'.join(self.recompute_modules)}]" if self.recompute_modules else ""
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}-mb{self.micro_batch}-{sched}-{rec}{extra}"

    def to_dict(self) -> dict:
        return asdict(self)


def chunk_dense_layers(spec: TransformerSpec, plan: ParallelPlan, virtual_stage: int) -> tuple[bool, ...]:
    """Which layers of virtual pipeline stage ``virtual_stage`` are an MoE model's dense layers (all False for a
    dense model, whose layers are priced as they are)."""
    start = plan.chunk_start(spec.layers, virtual_stage)
    moe = spec.moe is not None
    return tuple(moe and not spec.is_moe_layer(start + i) for i in range(plan.layers_of(spec.layers, virtual_stage)))


def split_label(stage_layers: tuple[int, ...]) -> str:
    """``stage_layers`` with runs folded, e.g. ``15,16x6,15``."""
    runs: list[list[int]] = []
    for n in stage_layers:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(f"{n}x{k}" if k > 1 else str(n) for n, k in runs)


def check_stage_layers(layers: int, chunks: int, stage_layers: tuple[int, ...]) -> None:
    """Raise :class:`PlanError` unless ``stage_layers`` splits ``layers`` over ``chunks`` virtual stages: every
    stage at least one layer, but the first (with the embedding) and the last (with the loss) may hold none."""
    if len(stage_layers) != chunks:
        raise PlanError(f"stage_layers has {len(stage_layers)} entries: it needs one per virtual pipeline stage "
                        f"(pp x virtual stages = {chunks})")
    if sum(stage_layers) != layers:
        raise PlanError(f"stage_layers adds up to {sum(stage_layers)} layers, not the model's {layers}")
    inner = stage_layers[1:-1] if chunks > 1 else ()
    if any(n < 0 for n in stage_layers) or any(n < 1 for n in inner):
        raise PlanError("stage_layers: every virtual stage holds at least one layer (the first and the last may "
                        "hold only the embedding or the loss)")


def check_plan(spec: TransformerSpec, plan: ParallelPlan, devices: int | None = None) -> None:
    """Raise :class:`PlanError` (one line) if ``plan`` cannot train ``spec`` on ``devices`` devices."""
    spec.validate()
    for name in ("tp", "pp", "dp", "micro_batch", "global_batch", "ep", "cp"):
        if getattr(plan, name) < 1:
            raise PlanError(f"{name} must be >= 1 (got {getattr(plan, name)})")
    if spec.heads % plan.tp:
        raise PlanError(f"{spec.heads} attention heads are not divisible by tp={plan.tp}")
    if spec.kv_heads_count % plan.tp:
        raise PlanError(f"{spec.kv_heads_count} key/value heads are not divisible by tp={plan.tp}")
    if spec.ffn_size % plan.tp:
        raise PlanError(f"FFN size {spec.ffn_size} is not divisible by tp={plan.tp}")
    if plan.pp > spec.layers:
        raise PlanError(f"pp={plan.pp} pipeline stages but the model has only {spec.layers} layers")
    v = plan.virtual_stages_effective
    if plan.schedule == "interleaved" and plan.pp > 1 and plan.virtual_stages < 2:
        raise PlanError("the interleaved schedule needs virtual_stages >= 2")
    if plan.stage_layers is not None:
        check_stage_layers(spec.layers, plan.pp * v, plan.stage_layers)
    elif spec.layers % (plan.pp * v):
        what = f"pp x virtual_stages = {plan.pp * v}" if v > 1 else f"pp={plan.pp}"
        raise PlanError(f"{spec.layers} layers cannot be split evenly over {what} pipeline chunks "
                        "(stage_layers splits them unevenly)")
    if plan.recompute_modules:
        if plan.recompute != "selective":
            raise PlanError("recompute_modules needs recompute: selective")
        unknown = sorted(set(plan.recompute_modules) - set(RECOMPUTE_MODULES))
        if unknown:
            raise PlanError(f"recompute_modules {', '.join(unknown)}: tuner models {', '.join(RECOMPUTE_MODULES)}")
        if "mla_up_proj" in plan.recompute_modules and spec.mla is None:
            raise PlanError("recompute module mla_up_proj needs multi-latent attention (mla)")
        if spec.moe is None and {"moe", "moe_act", "shared_experts"} & set(plan.recompute_modules):
            raise PlanError("recompute modules moe, moe_act and shared_experts need an MoE model")
    if plan.recompute_layers is not None:
        if plan.recompute != "full":
            raise PlanError("recompute_layers needs recompute: full")
        per_chunk = plan.chunk_layers(spec.layers)
        if not 1 <= plan.recompute_layers <= per_chunk:
            raise PlanError(f"recompute_layers must be 1 .. {per_chunk} (the layers of a model chunk; "
                            f"got {plan.recompute_layers})")
    if plan.global_batch % (plan.dp * plan.micro_batch):
        raise PlanError(
            f"global batch {plan.global_batch} is not divisible by dp x micro_batch = {plan.dp} x {plan.micro_batch}"
        )
    if v > 1 and plan.micro_batches % plan.pp:
        raise PlanError(
            f"the interleaved schedule needs the micro-batches per replica ({plan.micro_batches}) divisible by pp={plan.pp}"
        )
    if plan.fsdp2 and not plan.fsdp:
        raise PlanError("fsdp2 describes how FSDP runs: it needs fsdp")
    if plan.fsdp and plan.pp > 1:
        raise PlanError("fsdp shards over data parallelism, with tensor and expert parallelism inside (pp = 1)")
    if plan.fsdp_shard is not None:
        if not plan.fsdp:
            raise PlanError("fsdp_shard sizes FSDP's shard group: it needs fsdp")
        if plan.fsdp_shard < 1 or plan.dp % plan.fsdp_shard or plan.fsdp_shard * plan.cp < 2:
            raise PlanError(f"fsdp_shard must divide dp={plan.dp} and shard over at least 2 ranks with cp={plan.cp} "
                            f"(got {plan.fsdp_shard})")
        if spec.moe is not None:
            raise PlanError("fsdp_shard (HSDP) is modelled for dense models: an MoE model shards over every replica")
    if plan.ep > 1 and spec.moe is None:
        raise PlanError(f"ep={plan.ep} needs a MoE model (the model has no experts)")
    if plan.expert_tp is not None and plan.expert_tp not in (1, plan.tp):
        raise PlanError(f"expert_tp must be 1 or tp={plan.tp} (got {plan.expert_tp})")
    if spec.moe is not None:
        if plan.folds_tp_into_ep and plan.tp * plan.replicas % plan.ep:
            raise PlanError(f"expert parallelism ep={plan.ep} must divide tp x dp x cp = {plan.tp * plan.replicas} "
                            "(the experts whole, expert_tp = 1)")
        if not plan.folds_tp_into_ep and plan.dp % plan.ep:
            raise PlanError(f"expert parallelism ep={plan.ep} must divide dp={plan.dp}")
        if spec.moe.experts % plan.ep:
            raise PlanError(f"{spec.moe.experts} experts are not divisible by ep={plan.ep}")
    if plan.cp > 1:
        if spec.seq % (2 * plan.cp):
            raise PlanError(f"context parallelism splits each sequence into 2 x cp = {2 * plan.cp} chunks: "
                            f"seq {spec.seq} is not divisible")
        if not spec.fused_attention:
            raise PlanError("context parallelism needs a fused attention (attention: flash, flash2, flash_triton, cudnn, "
                            "te or flex)")
        if spec.doc_len is not None and spec.doc_len < spec.seq:
            raise PlanError("attention masked per document (doc_len) is not modelled with context parallelism")
    if plan.sequence_parallel and (plan.micro_batch * spec.seq) % plan.tp:
        raise PlanError(f"sequence parallelism needs micro_batch x seq divisible by tp={plan.tp}")
    if devices is not None and plan.devices != devices:
        cp = f" x cp {plan.cp}" if plan.cp > 1 else ""
        raise PlanError(f"tp x pp x dp = {plan.tp} x {plan.pp} x {plan.dp}{cp} = {plan.devices}, but the cluster has "
                        f"{devices} devices")
