"""A NeMo (1.x, Megatron-core GPT) training YAML read as tuner's spec + plan.

NeMo's ``megatron_gpt_config.yaml`` family — the configs NeMo-Framework-Launcher and NVIDIA's DGX Cloud
benchmarking recipes of NeMo 24.x run (``python megatron_gpt_pretraining.py --config-name X``) — keeps
Megatron-LM's settings under ``model:`` and the cluster under ``trainer:``. Mapping:

* world size ``trainer.num_nodes`` x ``trainer.devices``; ``trainer.precision`` bf16(-mixed) / 16(-mixed) / 32.
* ``model``: ``num_layers``, ``hidden_size``, ``ffn_hidden_size``, ``num_attention_heads``,
  ``num_query_groups`` (grouped-query attention), ``kv_channels``, ``encoder_seq_length``, ``activation``
  (swiglu / fast-swiglu: the gated MLP, geglu / fast-geglu read as it, noted; gelu; squared-relu read as
  gelu, noted), ``bias``,
  ``hidden_dropout``, ``position_embedding_type``, ``share_embeddings_and_output_weights``; experts
  ``num_moe_experts``, ``moe_router_topk``, ``moe_expert_capacity_factor``, ``moe_grouped_gemm``,
  ``moe_ffn_hidden_size``, ``moe_shared_expert_intermediate_size``, ``moe_layer_freq``,
  ``moe_router_num_groups`` / ``moe_router_group_topk``, ``moe_token_dispatcher_type: flex`` /
  ``moe_enable_deepep`` (DeepEP), ``moe_router_force_load_balancing`` — read as Megatron's flags of those
  names (:mod:`tuner.launch.megatron_moe`) — and ``expert_model_parallel_size``;
  ``fp8`` (FP8 linears).
* the plan: ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
  ``virtual_pipeline_model_parallel_size``, ``context_parallel_size``, ``micro_batch_size``,
  ``global_batch_size``, ``sequence_parallel``, ``activations_checkpoint_granularity`` / ``_method`` /
  ``_num_layers``, ``ub_tp_comm_overlap``; ``optim.name: distributed_fused_adam`` is the distributed
  optimizer, its ``overlap_grad_sync`` and ``grad_sync_dtype`` the gradient reduction, its
  ``overlap_param_sync`` the parameter all-gather in the forward (``mcore_distributed_optim``: with its
  ``align_param_gather``).
* attention: Transformer Engine's choice (``te``: cuDNN's fused attention on Hopper, FlashAttention-2
  before); the environment (``NVTE_FUSED_ATTN``, ``NVTE_FLASH_ATTN``) is not in the YAML: ``--set
  attention=flash2`` where a run turns cuDNN's off.
* the vocabulary: NeMo takes it from the tokenizer, so tuner knows the tokenizers of
  :data:`tuner.launch.common.TOKENIZER_FRAGMENTS` by name; another one is read as GPT-2's, with a note
  (``--set vocab=N``).
* interpolations as NeMo-Framework-Launcher composes the file (under ``training``): ``${.hidden_size}``,
  ``${training.model.tensor_model_parallel_size}`` and its resolvers ``${multiply:a, b}``,
  ``${divide_ceil:a, b}``, ``${divide_floor:a, b}``, resolved with OmegaConf; a value referring to what the
  file does not hold (``${data_dir}``) stays its text.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import yaml

from predictor.sources.synth.transformer import ParallelPlan, PlanError, TransformerSpec
from tuner.launch.common import (
    OFFLOAD_NOTE,
    LaunchError,
    LaunchPlan,
    dispatcher_note,
    fp8_recipe_note,
    fraction,
    positive_int,
    positive_number,
    read_launch_text,
    switch,
    tokenizer_vocab,
)
from tuner.launch.megatron_moe import read_moe

__all__ = ["read_nemo_yaml", "read_nemo_file"]

PRECISION = {"bf16": "bf16", "bf16-mixed": "bf16", "16": "fp16", "16-mixed": "fp16", "32": "fp32",
             "32-true": "fp32"}


def _vocab(model: dict, source: str, notes: list[str]) -> int:
    tok = model.get("tokenizer") or {}
    names = " ".join(str(tok.get(k, "")) for k in ("type", "library", "model")) if isinstance(tok, dict) else ""
    size = tokenizer_vocab(names)
    if size is not None:
        return size
    notes.append(f"tokenizer {names.strip() or '?'}: its vocabulary read as GPT-2's 50257 (--set vocab=N)")
    return 50257


#: NeMo-Framework-Launcher's OmegaConf resolvers (launcher_scripts/main.py)
RESOLVERS = {"multiply": lambda x, y: x * y, "divide_ceil": lambda x, y: int(math.ceil(x / y)),
             "divide_floor": lambda x, y: int(math.floor(x / y))}


def _resolved(doc: dict) -> dict:
    """``doc`` with its interpolations resolved as the launcher resolves them, the file being its ``training``
    section; a value that cannot be resolved (a reference to the launcher's other sections) keeps its text."""
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            with warnings.catch_warnings():  # omegaconf 2.4 renames the call 2.3 has; both take this one
                warnings.simplefilter("ignore")
                OmegaConf.register_new_resolver(name, fn)
    try:
        root = OmegaConf.create({"training": doc})
    except (OmegaConfBaseException, ValueError):
        return doc

    def plain(node: DictConfig | ListConfig, raw: dict | list) -> dict | list:
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        out: dict | list = {} if isinstance(node, DictConfig) else []
        for k in keys:
            try:
                v = node[k]
            except OmegaConfBaseException:
                v = raw[k]
            if isinstance(v, (DictConfig, ListConfig)):  # a section, or an interpolation naming one
                v = plain(v, raw[k] if isinstance(raw[k], (dict, list)) else OmegaConf.to_container(v))
            if isinstance(out, dict):
                out[k] = v
            else:
                out.append(v)
        return out

    return plain(root.training, doc)  # type: ignore[return-value]


def _recompute(model: dict, layers_per_chunk: int, source: str) -> tuple[str, int | None]:
    gran = model.get("activations_checkpoint_granularity")
    if gran in (None, "null"):
        return "none", None
    if gran == "selective":
        return "selective", None
    if gran != "full":
        raise LaunchError(f"{source}: model.activations_checkpoint_granularity {gran!r}: tuner models selective and full")
    method = model.get("activations_checkpoint_method") or "uniform"
    n = model.get("activations_checkpoint_num_layers") or 1
    if method == "block" and isinstance(n, int) and 0 < n < layers_per_chunk:
        return "full", n
    return "full", None


def read_nemo_yaml(text: str, source: str = "yaml", *, devices: int | None = None) -> LaunchPlan:
    """A plan from a NeMo 1.x GPT training YAML. The world size is ``devices`` if given, else the trainer's nodes x
    devices. Raises :class:`LaunchError` (one line) for a file tuner cannot read or a run it does not model."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise LaunchError(f"{source}: YAML syntax error{f' at line {mark.line + 1}' if mark else ''}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise LaunchError(f"{source}: not a NeMo training config (no model: section)")
    doc = _resolved(doc)
    model, trainer = doc["model"], doc.get("trainer") or {}
    if not isinstance(trainer, dict):
        raise LaunchError(f"{source}: trainer must be a mapping")
    notes: list[str] = []
    world = devices or positive_int(trainer, "num_nodes", "trainer.", source, 1) * positive_int(trainer, "devices", "trainer.", source, 1)
    precision = str(trainer.get("precision", "bf16-mixed"))
    if precision not in PRECISION:
        raise LaunchError(f"{source}: trainer.precision {precision!r}: tuner models {', '.join(PRECISION)}")
    layers = positive_int(model, "num_layers", "model.", source)
    hidden = positive_int(model, "hidden_size", "model.", source)
    heads = positive_int(model, "num_attention_heads", "model.", source)
    act = str(model.get("activation", "gelu"))
    if act in ("squared-relu", "relu"):
        notes.append(f"activation {act} read as GeLU (the same two-matrix MLP)")
    elif act in ("geglu", "fast-geglu"):
        notes.append(f"activation {act} read as SwiGLU (the same gated MLP: three matrices, fc1 2 x ffn wide)")
    elif act not in ("gelu", "fast-gelu", "swiglu", "fast-swiglu"):
        raise LaunchError(f"{source}: model.activation {act!r}: tuner models gelu, swiglu (geglu as swiglu, "
                          "squared-relu as gelu)")
    pos = str(model.get("position_embedding_type", "learned_absolute"))
    position = {"rope": "rope", "learned_absolute": "learned", "alibi": "none", "none": "none"}.get(pos)
    if position is None:
        raise LaunchError(f"{source}: model.position_embedding_type {pos!r}: tuner models rope, learned_absolute, alibi "
                          "and none")
    norm = str(model.get("normalization", "layernorm"))
    if norm.lower() != "layernorm":
        notes.append(f"model.normalization {norm} priced as LayerNorm")
    if model.get("cpu_offloading"):
        notes.append(f"model.cpu_offloading {OFFLOAD_NOTE}")
    recipe = fp8_recipe_note("model.fp8_recipe", model.get("fp8_recipe")) if model.get("fp8") else None
    if recipe:
        notes.append(recipe)
    dispatch = dispatcher_note("model.moe_token_dispatcher_type", model.get("moe_token_dispatcher_type"))
    if dispatch:
        notes.append(dispatch)
    moe = read_moe(_moe_values(model, source), layers, source, notes) if model.get("num_moe_experts") else None
    groups = model.get("num_query_groups")
    try:
        spec = TransformerSpec(
            layers=layers, hidden=hidden, heads=heads, seq=positive_int(model, "encoder_seq_length", "model.", source),
            vocab=_vocab(model, source, notes), ffn=positive_int(model, "ffn_hidden_size", "model.", source, 4 * hidden),
            kv_heads=groups if isinstance(groups, int) and groups != heads else None,
            kv_channels=positive_int(model, "kv_channels", "model.", source) if model.get("kv_channels") is not None
            else None, mlp="swiglu" if "swiglu" in act or "geglu" in act else "gelu",
            moe=moe, dtype=PRECISION[precision], attention="te", program="megatron",  # type: ignore[arg-type]
            fp8_linear=bool(model.get("fp8", False)),
            fp8_params=bool(model.get("fp8", False)) and bool(model.get("fp8_params", False)),
            dropout=fraction(model, "hidden_dropout", "model.", source, 0.1),
            bias=bool(model.get("bias", True)), position=position,  # type: ignore[arg-type]
            tie_embeddings=bool(model.get("share_embeddings_and_output_weights", True)),
            name=str((doc["run"].get("name") if isinstance(doc.get("run"), dict) else None) or "nemo-gpt"))
        spec.validate()
    except (PlanError, TypeError) as exc:
        raise LaunchError(f"{source}: {exc}") from None
    tp = positive_int(model, "tensor_model_parallel_size", "model.", source, 1)
    pp = positive_int(model, "pipeline_model_parallel_size", "model.", source, 1)
    cp = positive_int(model, "context_parallel_size", "model.", source, 1)
    ep = positive_int(model, "expert_model_parallel_size", "model.", source, 1)
    v = positive_int(model, "virtual_pipeline_model_parallel_size", "model.", source, 1)
    if world % (tp * pp * cp):
        raise LaunchError(f"{source}: tp x pp x cp = {tp * pp * cp} does not divide the {world} devices")
    optim = model.get("optim") or {}
    if not isinstance(optim, dict):
        raise LaunchError(f"{source}: model.optim must be a mapping")
    distributed = "distributed" in str(optim.get("name", ""))
    recompute, recompute_layers = _recompute(model, max(layers // (pp * v), 1), source)
    if layers % (pp * v):
        raise LaunchError(f"{source}: {layers} layers do not split evenly over pp x virtual stages = {pp * v}")
    plan = ParallelPlan(tp=tp, pp=pp, dp=world // (tp * pp * cp), cp=cp, ep=ep,
                        micro_batch=positive_int(model, "micro_batch_size", "model.", source, 1),
                        global_batch=positive_int(model, "global_batch_size", "model.", source),
                        schedule="interleaved" if v > 1 and pp > 1 else "1f1b", virtual_stages=v if v > 1 else 2,
                        sequence_parallel=bool(model.get("sequence_parallel", False)) and tp > 1,
                        recompute=recompute, recompute_layers=recompute_layers,  # type: ignore[arg-type]
                        distributed_optimizer=distributed,
                        overlap_grad_reduce=bool(optim.get("overlap_grad_sync", True)) if distributed else False,
                        overlap_param_gather=bool(optim.get("overlap_param_sync", False)) and distributed,
                        # apex's distributed Adam: the schedule syncs each chunk ahead; Megatron-core's optimizer
                        # only with align_param_gather
                        align_param_gather=bool(optim.get("align_param_gather", False))
                        if "mcore" in str(optim.get("name", "")) else True,
                        grad_reduce_dtype="bf16" if str(optim.get("grad_sync_dtype", "fp32")) in ("bf16", "bfloat16")
                        else "fp32",
                        tp_comm_overlap=bool(model.get("ub_tp_comm_overlap", False)) and tp > 1)
    return LaunchPlan(spec, plan, world, None, trainer.get("devices") if isinstance(trainer.get("devices"), int) else None,
                      (), tuple(notes))


#: NeMo's model keys of Megatron-core's MoE settings (its TransformerConfig's names) -> Megatron's flags as
#: :func:`~tuner.launch.megatron_moe.read_moe` reads them
NEMO_MOE_INTS = {"num_moe_experts": "experts", "moe_router_topk": "top_k", "moe_ffn_hidden_size": "moe_ffn",
                 "moe_shared_expert_intermediate_size": "shared_ffn", "moe_router_num_groups": "router_groups",
                 "moe_router_group_topk": "router_group_topk"}
NEMO_MOE_SWITCHES = {"moe_grouped_gemm": "--moe-grouped-gemm", "moe_enable_deepep": "--moe-enable-deepep",
                     "moe_router_force_load_balancing": "--moe-router-force-load-balancing",
                     "overlap_moe_expert_parallel_comm": "--overlap-moe-expert-parallel-comm"}


def _moe_values(model: dict, source: str) -> dict:
    """The MoE keys of NeMo's ``model`` section as Megatron's parsed flags: experts and their widths, routing
    groups, the capacity factor, ``moe_layer_freq`` (an integer or a list), the dispatcher and the switches."""
    values: dict = {}
    for key, name in NEMO_MOE_INTS.items():
        if model.get(key):  # none or 0 (no shared experts): Megatron's default
            values[name] = positive_int(model, key, "model.", source)
    if model.get("moe_expert_capacity_factor") is not None:
        values["capacity_factor"] = positive_number(model, "moe_expert_capacity_factor", "model.", source, 1.0)
    for key, name in (("moe_layer_freq", "moe_layer_freq"), ("moe_flex_dispatcher_backend", "flex_backend")):
        if model.get(key) is not None:
            values[name] = str(model[key])
    if str(model.get("moe_token_dispatcher_type")) == "flex":  # the others are noted under their NeMo key
        values["moe_dispatcher"] = "flex"
    for key, flag in NEMO_MOE_SWITCHES.items():
        values[flag] = switch(model, key, "model.", source)
    return values


def read_nemo_file(path: Path, *, devices: int | None = None) -> LaunchPlan:
    """:func:`read_nemo_yaml` of a file; raises :class:`LaunchError` for a missing or binary file."""
    return read_nemo_yaml(read_launch_text(path, "a YAML file"), str(path), devices=devices)
