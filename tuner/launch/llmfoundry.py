"""An llm-foundry training YAML (``composer train/train.py run.yaml``) read as tuner's spec + plan.

llm-foundry trains MPT models with Composer and PyTorch FSDP; its YAML holds the model, the batch, the
precision and the FSDP settings, and OmegaConf interpolations (``${variables.max_seq_len}``), resolved
here with OmegaConf as llm-foundry resolves them. Mapping:

* ``model`` (``name: mpt_causal_lm``): ``n_layers``, ``d_model``, ``n_heads``, ``max_seq_len``,
  ``vocab_size``, ``expansion_ratio`` or ``ffn_config.ffn_hidden_size`` (``ffn_type: mptglu`` is the gated
  MLP, ``mlp: swiglu``), ``attn_config.attn_type`` (grouped-query: ``kv_n_heads``; multi-query: one),
  ``attn_config.attn_impl`` (``flash``: FlashAttention-2, ``flash2``; ``triton``: ``flash_triton``; ``torch``:
  ``unfused``), position (``rope``; ``alibi`` read as none, with a note; else learned), ``no_bias``,
  ``resid_pdrop``, ``tie_word_embeddings``, ``loss_fn`` (``fused_crossentropy``, the default, is the fused
  loss). An ``hf_causal_lm`` is read from the ``config.json`` in its ``pretrained_model_name_or_path`` folder
  (:mod:`tuner.launch.huggingface`); a Hub name needs the model's shape from ``--workload``.
* ``precision``: ``amp_bf16`` / ``amp_fp16`` / ``fp32``; ``amp_fp8`` is FP8 linears over bf16.
* ``global_train_batch_size`` and ``device_train_microbatch_size`` over the ``devices`` data-parallel ranks
  (tuner's eager program, ``tp = pp = 1``).
* ``fsdp_config``: ``sharding_strategy`` FULL_SHARD (``fsdp``), SHARD_GRAD_OP
  (``fsdp_reshard_after_forward: false``), HYBRID_SHARD (``fsdp_shard``: ``data_parallel_shard_degree`` or the
  devices of a node, as PyTorch FSDP shards it), _HYBRID_SHARD_ZERO2 (both), NO_SHARD (data parallelism);
  ``mixed_precision`` PURE reduces gradients in bf16, DEFAULT and FULL in fp32; ``activation_checkpointing``
  full recomputation; the fp32 parameter shards are the weights AdamW updates (``fsdp_fp32_params``). Without
  ``fsdp_config`` the ranks run DDP.

Options that do not change the prediction (optimizer hyper-parameters, data, logging) are not read;
``activation_cpu_offload`` and an optimizer other than AdamW are noted.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec
from tuner.launch.common import LaunchError, LaunchPlan, fraction, positive_int, read_launch_text
from tuner.launch.huggingface import read_hf_config_file

__all__ = ["read_llmfoundry_yaml", "read_llmfoundry_file"]

#: llm-foundry's attn_impl -> tuner's attention
ATTENTION = {"flash": "flash2", "triton": "flash_triton", "torch": "unfused"}
#: Composer's precision -> (tuner's dtype, FP8 linears)
PRECISION = {"amp_bf16": ("bf16", False), "amp_fp16": ("fp16", False), "fp32": ("fp32", False),
             "amp_fp8": ("bf16", True)}
#: Composer's FSDP sharding strategies tuner models
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "NO_SHARD")


def _resolve(text: str, source: str) -> dict:
    """The YAML with its OmegaConf interpolations resolved, as plain dicts and lists."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        doc = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    except OmegaConfBaseException as exc:
        raise LaunchError(f"{source}: {str(exc).splitlines()[0]}") from None
    except Exception as exc:  # noqa: BLE001  the YAML parser's own errors
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise LaunchError(f"{source}: YAML syntax error{where} ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise LaunchError(f"{source}: not a YAML mapping")
    return doc


def _section(d: dict, key: str, source: str) -> dict:
    val = d.get(key) or {}
    if not isinstance(val, dict):
        raise LaunchError(f"{source}: {key} must be a mapping")
    return val


def _mpt_spec(model: dict, seq: int, dtype: str, fp8: bool, source: str, notes: list[str]) -> TransformerSpec:
    """tuner's spec of an MPT ``model`` section."""
    attn, ffn_cfg = _section(model, "attn_config", source), _section(model, "ffn_config", source)
    hidden, heads = positive_int(model, "d_model", "model.", source, 2048), positive_int(model, "n_heads", "model.", source, 16)
    layers = positive_int(model, "n_layers", "model.", source, 24)
    impl = str(attn.get("attn_impl", "flash"))
    if impl not in ATTENTION:
        raise LaunchError(f"{source}: model.attn_config.attn_impl {impl!r}: tuner models flash, triton and torch")
    kind = attn.get("attn_type", "multihead_attention")
    kv_heads = {"multihead_attention": None, "multiquery_attention": 1}.get(kind)
    if kind == "grouped_query_attention":
        kv_heads = positive_int(attn, "kv_n_heads", "model.attn_config.", source)
    elif kind not in ("multihead_attention", "multiquery_attention"):
        raise LaunchError(f"{source}: model.attn_config.attn_type {kind!r}: tuner models multihead, multiquery and "
                          "grouped_query attention")
    position = "learned" if model.get("learned_pos_emb", True) else "none"
    if attn.get("rope", False):
        position = "rope"
    elif attn.get("alibi", False):
        position = "none"
        notes.append("ALiBi read as no position embedding (its bias is added inside the fused attention)")
    ffn_type = ffn_cfg.get("ffn_type", "mptmlp")
    if ffn_type not in ("mptmlp", "mptglu"):
        raise LaunchError(f"{source}: model.ffn_config.ffn_type {ffn_type!r}: tuner models mptmlp and mptglu")
    ratio = model.get("expansion_ratio", 4)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
        raise LaunchError(f"{source}: model.expansion_ratio must be a positive number (got {ratio!r})")
    ffn = positive_int(ffn_cfg, "ffn_hidden_size", "model.ffn_config.", source, 1) if ffn_cfg.get("ffn_hidden_size") \
        else ratio * hidden
    if not float(ffn).is_integer():
        raise LaunchError(f"{source}: the MLP width d_model x expansion_ratio = {ffn} is not a whole number")
    loss = model.get("loss_fn", "fused_crossentropy")
    return TransformerSpec(layers=layers, hidden=hidden, heads=heads, seq=seq,
                           vocab=positive_int(model, "vocab_size", "model.", source, 50368), ffn=int(ffn), kv_heads=kv_heads,
                           mlp="swiglu" if ffn_type == "mptglu" else "gelu", dtype=dtype,  # type: ignore[arg-type]
                           attention=ATTENTION[impl], program="eager", fp8_linear=fp8,  # type: ignore[arg-type]
                           dropout=fraction(model, "resid_pdrop", "model.", source, 0.0),
                           bias=not model.get("no_bias", False),
                           position=position, tie_embeddings=bool(model.get("tie_word_embeddings", True)),  # type: ignore[arg-type]
                           fused_loss=loss == "fused_crossentropy", name=str(model.get("name", "mpt")))


def _hf_spec(model: dict, seq: int, source: str, notes: list[str]) -> TransformerSpec | None:
    """The model of an ``hf_causal_lm`` whose ``pretrained_model_name_or_path`` is a folder holding its
    ``config.json`` (as given, else beside the YAML); None when it is a Hub name."""
    name = model.get("pretrained_model_name_or_path")
    if not isinstance(name, str):
        return None
    for folder in (Path(name), Path(source).parent / name):
        config = folder / "config.json"
        if config.is_file():
            spec, said = read_hf_config_file(config, seq=seq)
            notes += said
            return spec
    return None


def read_llmfoundry_yaml(text: str, source: str = "yaml", *, devices: int | None = None,
                         devices_per_node: int | None = None, spec: TransformerSpec | None = None) -> LaunchPlan:
    """A plan from an llm-foundry training YAML on ``devices`` GPUs (``devices_per_node`` of a node, for
    HYBRID_SHARD's default shard group). The model is ``spec`` if given, else the YAML's MPT model.
    Raises :class:`LaunchError` (one line) for a file tuner cannot read or a run it does not model."""
    doc = _resolve(text, source)
    notes: list[str] = []
    if devices is None:
        raise LaunchError(f"{source}: an llm-foundry YAML does not name the world size: give --devices N")
    model = _section(doc, "model", source)
    precision = str(doc.get("precision", "amp_bf16"))
    if precision not in PRECISION:
        raise LaunchError(f"{source}: precision {precision!r}: tuner models {', '.join(PRECISION)}")
    dtype, fp8 = PRECISION[precision]
    seq = positive_int(model, "max_seq_len", "model.", source, doc.get("max_seq_len", 2048))
    if spec is None and model.get("name", "mpt_causal_lm") == "hf_causal_lm":
        spec = _hf_spec(model, seq, source, notes)
    if spec is None:
        if model.get("name", "mpt_causal_lm") != "mpt_causal_lm":
            raise LaunchError(f"{source}: model.name {model.get('name')!r}: tuner reads MPT models (mpt_causal_lm) and "
                              "Hugging Face models whose config.json is on this machine; give the model's shape with "
                              "--workload")
        spec = _mpt_spec(model, seq, dtype, fp8, source, notes)
    else:  # the given model as this run trains it: its sequence and precision, Composer's eager modules
        program = spec.program if spec.mla is not None else "eager"
        spec = replace(spec, seq=seq, dtype=dtype, fp8_linear=fp8, program=program)  # type: ignore[arg-type]
    gbs = positive_int(doc, "global_train_batch_size", "", source)
    micro = doc.get("device_train_microbatch_size", "auto")
    if micro == "auto":
        raise LaunchError(f"{source}: device_train_microbatch_size auto: give the micro-batch size (Composer finds "
                          "it by trying; tuner predicts one)")
    mb = positive_int(doc, "device_train_microbatch_size", "", source)
    if gbs % devices:
        raise LaunchError(f"{source}: global_train_batch_size {gbs} is not divisible by the {devices} devices")
    if (gbs // devices) % mb:
        raise LaunchError(f"{source}: device_train_microbatch_size {mb} does not divide the per-device batch "
                          f"{gbs // devices}: tuner models equal micro-batches")
    fsdp_cfg = doc.get("fsdp_config")
    if fsdp_cfg is not None and not isinstance(fsdp_cfg, dict):
        raise LaunchError(f"{source}: fsdp_config must be a mapping")
    fsdp_cfg = fsdp_cfg or {}
    strategy = str(fsdp_cfg.get("sharding_strategy", "FULL_SHARD")) if doc.get("fsdp_config") is not None else "NO_SHARD"
    if strategy not in STRATEGIES:
        raise LaunchError(f"{source}: fsdp_config.sharding_strategy {strategy!r}: tuner models {', '.join(STRATEGIES)}")
    mixed = fsdp_cfg.get("mixed_precision", "DEFAULT")
    if mixed not in ("PURE", "DEFAULT", "FULL"):
        raise LaunchError(f"{source}: fsdp_config.mixed_precision {mixed!r}: tuner models PURE, DEFAULT and FULL")
    if mixed == "FULL":
        notes.append("FSDP mixed precision FULL (fp32 parameters gathered) read as DEFAULT: bf16 gathers")
    shard: int | None = None
    if strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        shard = fsdp_cfg.get("data_parallel_shard_degree") or devices_per_node or 8
        if shard in (-1, devices):
            shard = None
        elif isinstance(shard, bool) or not isinstance(shard, int) or shard < 2 or devices % shard:
            raise LaunchError(f"{source}: the HYBRID_SHARD group of {shard} devices does not divide the {devices} devices")
    if fsdp_cfg.get("activation_cpu_offload", False):
        notes.append("activation_cpu_offload is not modelled: the activations stay on the GPU")
    opt = str(_section(doc, "optimizer", source).get("name", "decoupled_adamw"))
    if "adam" not in opt:
        notes.append(f"optimizer {opt} priced as AdamW (its state and update kernels)")
    plan = ParallelPlan(tp=1, pp=1, dp=devices, micro_batch=mb, global_batch=gbs,
                        recompute="full" if fsdp_cfg.get("activation_checkpointing", False) else "none",
                        fsdp=strategy != "NO_SHARD" and devices > 1, overlap_grad_reduce=True,
                        grad_reduce_dtype="bf16" if mixed == "PURE" else "fp32",
                        fsdp_reshard_after_forward=strategy not in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"),
                        fsdp_fp32_params=True,
                        fsdp_shard=shard if strategy != "NO_SHARD" and devices > 1 else None)
    return LaunchPlan(spec, plan, devices, None, devices_per_node, (), tuple(notes))


def read_llmfoundry_file(path: Path, *, devices: int | None = None, devices_per_node: int | None = None,
                         spec: TransformerSpec | None = None) -> LaunchPlan:
    """:func:`read_llmfoundry_yaml` of a file; raises :class:`LaunchError` for a missing or binary file."""
    text = read_launch_text(path, "a YAML file")
    return read_llmfoundry_yaml(text, str(path), devices=devices, devices_per_node=devices_per_node, spec=spec)
