"""A Hugging Face ``config.json`` read as tuner's model: the shape of a model whose training is predicted.

The fields are those ``transformers`` writes for each ``model_type`` (its ``PretrainedConfig`` subclasses):
``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
``intermediate_size``, ``vocab_size``, ``tie_word_embeddings`` (GPT-2's ``n_layer``, ``n_embd``, ``n_head``,
``n_inner``), the experts of Mixtral / Qwen MoE / DeepSeek (``num_local_experts`` or ``num_experts`` or
``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``, shared experts, the first dense layers,
DeepSeek's node-limited routing ``n_group`` / ``topk_group``)
and DeepSeek's multi-latent attention (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
``qk_rope_head_dim``, ``v_head_dim``). What each family runs beside the shape — a gated MLP, rotary or learned
positions, biases, dropout — is :data:`FAMILIES`'. The model trains as plain PyTorch modules (``program:
eager``; multi-latent attention as Megatron-LM runs it) with PyTorch's fused attention, FlashAttention-2's
kernels (``flash2``); RMSNorm is priced as LayerNorm. The training sequence is the caller's (``seq``), else the config's
context length up to :data:`DEFAULT_SEQ`, with a note.
"""

from __future__ import annotations

import json
from pathlib import Path

from predictor.sources.synth.transformer import MLASpec, MoESpec, TransformerSpec
from tuner.launch.common import LaunchError, fraction, positive_int, read_launch_text

__all__ = ["FAMILIES", "DEFAULT_SEQ", "is_hf_config", "spec_from_hf_config", "read_hf_config_text",
           "read_hf_config_file"]

#: model_type -> (gated MLP, position, linear biases, tied embeddings when the config does not say)
FAMILIES: dict[str, tuple[bool, str, bool, bool]] = {
    "llama": (True, "rope", False, False),
    "mistral": (True, "rope", False, False),
    "mixtral": (True, "rope", False, False),
    "qwen2": (True, "rope", False, False),
    "qwen3": (True, "rope", False, False),
    "qwen2_moe": (True, "rope", False, False),
    "qwen3_moe": (True, "rope", False, False),
    "deepseek_v3": (True, "rope", False, False),
    "gemma": (True, "rope", False, True),
    "gemma2": (True, "rope", False, True),
    "phi3": (True, "rope", False, False),
    "olmo2": (True, "rope", False, False),
    "gpt2": (False, "learned", True, True),
    "gpt_neox": (False, "rope", True, False),
}
#: the training sequence when neither the caller nor a shorter context length gives one
DEFAULT_SEQ = 4096


def is_hf_config(doc: object) -> bool:
    """Whether ``doc`` (a parsed JSON) is a Hugging Face model config (it names its ``model_type``)."""
    return isinstance(doc, dict) and isinstance(doc.get("model_type"), str)


def _field(doc: dict, names: tuple[str, ...], source: str, default: int | None = None) -> int:
    """The first of ``names`` the config sets (the families name some fields differently), a positive integer."""
    name = next((n for n in names if doc.get(n) is not None), None)
    if name is None and default is None:
        raise LaunchError(f"{source}: the config has no {names[0]}")
    return positive_int(doc, name or names[0], "", source, default)


def _count(doc: dict, name: str, source: str, default: int = 0) -> int:
    """``doc[name]`` as a whole number >= 0 (``default`` when absent or null)."""
    return positive_int(doc, name, "", source, default, minimum=0)


def _moe(doc: dict, kind: str, layers: int, source: str, notes: list[str]) -> MoESpec | None:
    """The experts of a Mixtral, Qwen MoE or DeepSeek config (None for a dense model)."""
    names = ("num_local_experts", "num_experts", "n_routed_experts")
    if not any(doc.get(n) for n in names):
        return None
    experts = _field(doc, names, source)
    top_k = _field(doc, ("num_experts_per_tok",), source, 2)
    ffn = _field(doc, ("moe_intermediate_size", "intermediate_size"), source)
    shared = _count(doc, "shared_expert_intermediate_size", source) or _count(doc, "n_shared_experts", source) * ffn
    dense = _count(doc, "first_k_dense_replace", source)
    # Qwen MoE: layer i routed when (i + 1) % decoder_sparse_step == 0 (and not in mlp_only_layers)
    every = max(_count(doc, "decoder_sparse_step", source, 1), 1)
    if doc.get("mlp_only_layers"):
        notes.append(f"{kind}: mlp_only_layers (dense layers where the pattern routes) read as routed")
    if dense + every > layers:
        raise LaunchError(f"{source}: first_k_dense_replace {dense} and decoder_sparse_step {every} leave no layer "
                          "with experts")
    # DeepSeek's node-limited routing: top-k experts from the topk_group best of n_group groups (one group: none)
    groups, group_topk = _count(doc, "n_group", source), _count(doc, "topk_group", source)
    if groups <= 1 or not 1 <= group_topk <= groups or experts % groups:
        groups = group_topk = 0
    return MoESpec(experts=experts, top_k=top_k, ffn=ffn, shared_ffn=shared, dense_layers=dense, every=every,
                   router_groups=groups, router_group_topk=group_topk)


def spec_from_hf_config(doc: dict, source: str, seq: int | None = None) -> tuple[TransformerSpec, list[str]]:
    """The model of a Hugging Face config (parsed ``config.json``) and the notes on what tuner prices in place
    of what the family runs. Raises :class:`LaunchError` (one line) for a family or field tuner does not read."""
    kind = str(doc.get("model_type"))
    if kind not in FAMILIES:
        raise LaunchError(f"{source}: model_type {kind!r}: tuner reads the configs of {', '.join(FAMILIES)}; give "
                          "another model's shape as a model YAML")
    gated, position, bias, tie = FAMILIES[kind]
    notes: list[str] = []
    layers = _field(doc, ("num_hidden_layers", "n_layer"), source)
    hidden = _field(doc, ("hidden_size", "n_embd"), source)
    heads = _field(doc, ("num_attention_heads", "n_head"), source)
    ffn = _field(doc, ("intermediate_size", "n_inner"), source, 4 * hidden)
    vocab = _field(doc, ("vocab_size",), source)
    context = _field(doc, ("max_position_embeddings", "n_positions"), source, DEFAULT_SEQ)
    if seq is None:
        seq = min(context, DEFAULT_SEQ)
        notes.append(f"trained on {seq}-token sequences (the config allows {context}; set seq to change it)")
    kv = _field(doc, ("num_key_value_heads",), source, heads)
    head_dim = _field(doc, ("head_dim",), source, hidden // heads)
    mla = None
    if doc.get("kv_lora_rank"):
        mla = MLASpec(q_lora_rank=_count(doc, "q_lora_rank", source), kv_lora_rank=_field(doc, ("kv_lora_rank",), source),
                      qk_head_dim=_field(doc, ("qk_nope_head_dim",), source, 128),
                      rope_head_dim=_field(doc, ("qk_rope_head_dim",), source, 64),
                      v_head_dim=_field(doc, ("v_head_dim",), source, 128))
        kv, head_dim = heads, hidden // heads
        notes.append("multi-latent attention priced as Megatron-LM runs it (tuner models it in Megatron's program)")
    if kind == "qwen2":
        notes.append("Qwen2's query / key / value biases not priced (the other linears carry none)")
    if kind == "gemma2":
        notes.append("Gemma 2's sliding-window layers and logit soft-capping priced as full causal attention")
    if doc.get("attention_bias") or doc.get("mlp_bias"):
        bias = True
    if kind in ("gpt_neox",) and doc.get("rotary_pct", 1.0) != 1.0:
        notes.append(f"rotary embeddings over {doc['rotary_pct']:.0%} of each head priced over all of it")
    dropout = fraction(doc, "resid_pdrop" if "resid_pdrop" in doc else "hidden_dropout", "", source, 0.0)
    spec = TransformerSpec(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, ffn=ffn,
                           kv_heads=kv if kv != heads else None,
                           kv_channels=head_dim if head_dim * heads != hidden else None,
                           mla=mla, mlp="swiglu" if gated else "gelu", moe=_moe(doc, kind, layers, source, notes),
                           program="megatron" if mla is not None else "eager", attention="flash2",
                           dropout=dropout, bias=bias, position=position,  # type: ignore[arg-type]
                           tie_embeddings=bool(doc.get("tie_word_embeddings", tie)),
                           name=str(doc.get("_name_or_path") or kind).rsplit("/", 1)[-1] or kind)
    if kind not in ("gpt2", "gpt_neox"):
        notes.append(f"model {spec.name}: a {kind} config, RMSNorm priced as LayerNorm")
    try:
        spec.validate()
    except ValueError as exc:
        raise LaunchError(f"{source}: {exc}") from None
    return spec, notes


def read_hf_config_text(text: str, source: str, seq: int | None = None) -> tuple[TransformerSpec, list[str]]:
    """:func:`spec_from_hf_config` of a ``config.json``'s text."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LaunchError(f"{source}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not is_hf_config(doc):
        raise LaunchError(f"{source}: not a Hugging Face model config (it names no model_type)")
    return spec_from_hf_config(doc, source, seq)


def read_hf_config_file(path: Path, seq: int | None = None) -> tuple[TransformerSpec, list[str]]:
    """:func:`read_hf_config_text` of a file; :class:`LaunchError` for a missing or binary file."""
    return read_hf_config_text(read_launch_text(path, "a JSON file"), str(path), seq)
