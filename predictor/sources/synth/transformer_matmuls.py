"""The plain matmuls of one transformer layer's forward in the order torchtitan's modules run them, on one
tensor-parallel rank: what op-level checkpointing saves and replays (every second one's output kept).
Units: elements per token."""

from __future__ import annotations

from dataclasses import dataclass

from predictor.sources.synth.transformer_spec import TransformerSpec

__all__ = ["LayerMatmul", "layer_matmuls"]


@dataclass(frozen=True)
class LayerMatmul:
    """One plain matmul (``aten.mm``) of a layer's forward on one tensor-parallel rank: ``n`` outputs from a
    ``k``-wide reduction per token, in the layer's ``part`` (``"attn"``, ``"mlp"``); ``gathered``: it reads
    that part's sequence-parallel all-gathered input; ``reduced``: row-parallel, its output summed over the
    TP ranks; ``routed``: it runs on the rank's own 1 / tp of the tokens (an MoE router)."""

    name: str
    n: float
    k: float
    part: str
    gathered: bool = False
    reduced: bool = False
    routed: bool = False


def layer_matmuls(spec: TransformerSpec, tp: int, dense: bool = True) -> list[LayerMatmul]:
    """The plain matmuls of one layer's forward in the order torchtitan's modules run them (its op-level
    checkpointing keeps the odd-numbered ones' outputs): attention's wq, wk, wv, wo (multi-latent:
    wq or wq_a, wq_b, then wkv_a, wkv_b, wo); the MLP's w1, w3, w2 (GeLU: fc1, fc2), or an MoE layer's
    router and its shared expert's w1, w3, w2 (the routed experts are grouped GEMMs, not in this list).
    ``dense``: a dense layer of an MoE model, or any layer of a dense one."""
    h, t = spec.hidden, tp
    out: list[LayerMatmul] = []
    m = spec.mla
    if m is None:
        kv = spec.kv_heads_count * spec.head_dim / t
        out += [LayerMatmul("wq", spec.attn_size / t, h, "attn", True), LayerMatmul("wk", kv, h, "attn", True),
                LayerMatmul("wv", kv, h, "attn", True)]
    else:
        q = spec.heads * m.q_head_dim / t
        if m.q_lora_rank:
            out += [LayerMatmul("wq_a", m.q_lora_rank, h, "attn", True), LayerMatmul("wq_b", q, m.q_lora_rank, "attn")]
        else:
            out.append(LayerMatmul("wq", q, h, "attn", True))
        out += [LayerMatmul("wkv_a", m.kv_lora_rank + m.rope_head_dim, h, "attn", True),
                LayerMatmul("wkv_b", spec.heads * (m.qk_head_dim + m.v_head_dim) / t, m.kv_lora_rank, "attn")]
    out.append(LayerMatmul("wo", h, spec.attn_size / t, "attn", reduced=True))

    def mlp(prefix: str, f: int) -> list[LayerMatmul]:
        if spec.mlp == "swiglu":
            return [LayerMatmul(f"{prefix}w1", f / t, h, "mlp", True), LayerMatmul(f"{prefix}w3", f / t, h, "mlp", True),
                    LayerMatmul(f"{prefix}w2", h, f / t, "mlp", reduced=True)]
        return [LayerMatmul(f"{prefix}fc1", f / t, h, "mlp", True), LayerMatmul(f"{prefix}fc2", h, f / t, "mlp", reduced=True)]

    if spec.moe is None or dense:
        return out + mlp("", spec.ffn_size)
    out.append(LayerMatmul("router", spec.moe.experts, h, "mlp", routed=True))
    return out + (mlp("shared_expert.", spec.moe.shared_ffn) if spec.moe.shared_ffn else [])
