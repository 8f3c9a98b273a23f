"""A tuner plan as a torchtitan Python configuration (its main branch), and such a configuration read back.

torchtitan's main branch configures a run by a Python function that returns a ``Trainer.Config``,
named on its command line as ``--module M --config F`` (``MODULE=M CONFIG=F ./run_train.sh``); TOML
job files are gone (pytorch/torchtitan#2386, Feb 2026). The fields are those of
``torchtitan/config/configs.py`` and ``torchtitan/trainer.py`` at pytorch/torchtitan b5bcd76 (Aug 2026):

* ``training``: batches counted in tokens — ``num_tokens_per_microbatch_per_dp_rank`` (one forward of
  one data-parallel rank, before context or tensor sharding: ``micro_batch x seq``),
  ``num_tokens_per_train_step`` (``global_batch x seq``; gradient accumulation is their ratio),
  ``max_context_length`` (``seq``), ``mixed_precision_param``;
* ``parallelism``: the degrees (data-parallel replicate / shard as in the TOML releases),
  ``enable_sequence_parallel``, the pipeline schedule, ``pipeline_parallel_layers_per_stage`` and
  ``num_pp_microbatches`` (pipeline micro-batches per data-parallel rank);
* ``activation_checkpoint``: ``FullAC.Config()`` (tuner's ``full``), ``SelectiveAC.Config()``
  (op-level, tuner's ``op``), ``None``; ``MemoryBudgetAC`` (the compiler's choice) is not modelled;
* ``compile.enable_async_tensor_parallel``: tuner's ``tp_comm_overlap``.

The written recipe starts from torchtitan's own configuration of the model (the flavors of
:data:`~tuner.launch.torchtitan.TORCHTITAN_MODELS` its config registry has a function for) and sets the
plan's fields; another model gets a ``base_config`` that raises until the user returns its configuration.
Reading goes through torchtitan's own ``ConfigManager`` (the module lookup of its ``--module``), so it
needs torchtitan importable; the conversion itself (:func:`plan_from_torchtitan_config`) reads the
fields by name and is tested without it. The model's shape comes from the configuration's model tree
(:func:`spec_from_model_config`: grouped-query attention blocks with a SwiGLU MLP or experts, as
torchtitan's Llama 3 and Qwen 3 are; FlexAttention, torchtitan's default, reads as ``attention: flex``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
from dataclasses import replace
from pathlib import Path

from predictor.sources.synth.transformer import MoESpec, ParallelPlan, TransformerSpec
from predictor.sources.synth.transformer_spec import moe_layout
from tuner.launch.common import LaunchError, LaunchPlan, header_int, header_line, header_str, read_header
from tuner.launch.torchtitan import (
    ASYNC_TP_NOTE,
    CPU_OFFLOAD_NOTE,
    TORCHTITAN_DTYPES,
    TORCHTITAN_MODELS,
    TORCHTITAN_RUNS,
    compiled_parts,
    flavor_spec,
    hsdp_shard,
    launch_meta,
    parallelism_fields,
    part_chunks,
    pipeline_chunks,
    reshard_after_forward,
    sharding_notes,
    spec_from_header,
    torchtitan_dropped,
    torchtitan_model,
    torchtitan_plan,
    torchtitan_spec,
    world_and_data_parallel,
)

__all__ = ["RECIPE_FILE", "RECIPE_FUNCTION", "is_config_ref", "torchtitan_flavor", "torchtitan_recipe",
           "spec_from_model_config", "plan_from_torchtitan_config", "load_torchtitan_config", "read_torchtitan_config"]

#: file name and function of the written recipe (``--module torchtitan_recipe --config tuner_plan``)
RECIPE_FILE = "torchtitan_recipe.py"
RECIPE_FUNCTION = "tuner_plan"
#: torchtitan's config-registry function of each flavor that has one (main branch)
_BASE_FUNCTIONS = {("llama3", "8B"): "llama3_8b", ("llama3", "70B"): "llama3_70b", ("llama3", "405B"): "llama3_405b",
                   ("qwen3", "0.6B"): "qwen3_0_6b", ("qwen3", "1.7B"): "qwen3_1_7b", ("qwen3", "14B"): "qwen3_14b",
                   ("qwen3", "32B"): "qwen3_32b"}
_REF = re.compile(r"^(?P<module>[^:]+):(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")


def is_config_ref(text: str) -> bool:
    """Whether ``text`` names a torchtitan configuration function: ``MODULE:FUNCTION`` or ``FILE.py:FUNCTION``."""
    return _REF.match(text) is not None and not text.endswith(".toml")


def torchtitan_flavor(spec: TransformerSpec) -> tuple[str, str] | None:
    """torchtitan's (model name, flavor) of ``spec``'s shape (:data:`TORCHTITAN_MODELS`), None for another shape."""
    def shape(s: TransformerSpec) -> tuple:
        return s.layers, s.hidden, s.heads, s.kv_heads_count, s.head_dim, s.ffn_size, s.vocab

    return next((key for key in TORCHTITAN_MODELS if shape(torchtitan_model(*key, spec.seq)) == shape(spec)), None)


def torchtitan_recipe(spec: TransformerSpec, plan: ParallelPlan, *, platform: str | None = None,
                      devices_per_node: int | None = None, predicted_s: float | None = None) -> str:
    """The Python module (for torchtitan's main branch) whose :data:`RECIPE_FUNCTION` returns ``plan``'s
    ``Trainer.Config``: torchtitan's configuration of the model with the plan's fields set. The plan is
    written as torchtitan runs it (:func:`~tuner.launch.torchtitan.torchtitan_plan`)."""
    t = torchtitan_plan(plan, spec)
    dpn = devices_per_node or 8
    nodes = max(1, -(-plan.devices // dpn))
    meta, where = launch_meta(torchtitan_spec(spec), plan, platform, devices_per_node)  # the model it trains
    said = f"; predicted {predicted_s:.4f} s/iteration by tuner" if predicted_s else ""
    run = (f"    PYTHONPATH=$FOLDER:$PYTHONPATH NGPU={plan.devices} MODULE=torchtitan_recipe CONFIG={RECIPE_FUNCTION} "
           "./run_train.sh") if nodes == 1 else (
        f"    PYTHONPATH=$FOLDER:$PYTHONPATH torchrun --nnodes {nodes} --nproc_per_node {dpn} --rdzv_backend c10d \\\n"
        f"        --rdzv_endpoint $HEAD:29500 -m torchtitan.train --module torchtitan_recipe --config {RECIPE_FUNCTION}")
    flavor = torchtitan_flavor(spec)
    lines = [f'"""torchtitan configuration (main branch) of {spec.name} plan {t.label()}{where}{said}.',
             "",
             "Run from a torchtitan checkout, with FOLDER the folder of this file:",
             run, '"""', header_line(meta)]
    notes = []
    if spec.dtype == "fp16":
        notes.append("torchtitan trains in bfloat16 or float32: the fp16 model is written as bfloat16")
    if plan.optimizer_state != "fp32":
        notes.append("torchtitan's AdamW keeps an fp32 state: the plan's 16-bit optimizer state is not written")
    notes += torchtitan_dropped(spec)
    if t.recompute == "full" and t.recompute_layers is not None:
        notes.append("torchtitan checkpoints every layer or none: the plan's partial recomputation is written as FullAC")
    if spec.fp8_linear:
        notes.append("FP8 linears: add torchtitan's Float8LinearConverter to the model's converters")
    lines += [f"# {n}" for n in notes]
    policy = {"full": "FullAC", "op": "SelectiveAC"}.get(t.recompute)  # torchtitan's checkpointing class
    lines.append("")
    if policy is not None:
        lines.append(f"from torchtitan.distributed.activation_checkpoint import {policy}")
    if flavor in _BASE_FUNCTIONS:
        lines += [f"from torchtitan.models.{flavor[0]}.config_registry import {_BASE_FUNCTIONS[flavor]} as base_config",
                  "", ""]
    else:
        lines += ["", "", "def base_config():",
                  f'    """torchtitan\'s configuration of {spec.name}: torchtitan has no flavor of its shape (the'
                  " '# tuner:' line above), so return your model's Trainer.Config here.\"\"\"",
                  f"    raise NotImplementedError(\"{RECIPE_FILE}: return the Trainer.Config of {spec.name} "
                  "from base_config()\")", "", ""]
    par = {**parallelism_fields(spec, plan), "enable_sequence_parallel": True}
    if plan.pp > 1:
        par["num_pp_microbatches"] = plan.micro_batches
    training = {"max_context_length": spec.seq, "num_tokens_per_microbatch_per_dp_rank": plan.micro_batch * spec.seq,
                "num_tokens_per_train_step": plan.global_batch * spec.seq,
                "mixed_precision_param": TORCHTITAN_DTYPES[spec.dtype]}
    if plan.pp > 1:
        training["disable_cuda_graphs"] = True  # torchtitan's CUDA graphs do not run pipelines
    lines += [f"def {RECIPE_FUNCTION}():", f'    """{spec.name} with tuner\'s plan {t.label()}."""',
              "    config = base_config()"]
    lines += [f"    config.parallelism.{k} = {v!r}" for k, v in par.items()]
    lines += [f"    config.training.{k} = {v!r}" for k, v in training.items()]
    if plan.tp_comm_overlap and plan.tp > 1:  # torchtitan's async TP is a compiler pass over the model
        lines += ["    config.compile.enable = True",
                  '    if "model" not in config.compile.components:',
                  '        config.compile.components = [*config.compile.components, "model"]',
                  "    config.compile.enable_async_tensor_parallel = True"]
    else:
        lines.append("    config.compile.enable_async_tensor_parallel = False")
    lines += [f"    config.activation_checkpoint = {f'{policy}.Config()' if policy else 'None'}", "    return config", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- configuration -> plan
def _attr(obj: object, *path: str) -> object:
    """``obj.path[0].path[1]...``, None where an attribute is missing."""
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def _layer_shape(layer: object) -> tuple:
    """(heads, key/value heads, head width, dense MLP width or None, MoE fields or None) of one block config."""
    att = _attr(layer, "attention")
    heads = _attr(att, "n_heads")
    kv = _attr(att, "n_kv_heads") or _attr(att, "qkv_linear", "n_kv_heads") or heads
    width = _attr(att, "head_dim") or _attr(att, "qkv_linear", "head_dim")
    ffn = _attr(layer, "feed_forward", "w1", "out_features")
    moe = _attr(layer, "moe")
    routed = None
    if moe is not None:
        routed = (_attr(moe, "num_experts"), _attr(moe, "router", "top_k"),
                  _attr(moe, "routed_experts", "inner_experts", "hidden_dim"),
                  _attr(moe, "shared_experts", "w1", "out_features") or 0)
    return heads, kv, width, ffn, routed


def _quantized_linear(layer: object) -> str | None:
    """The class a converter swapped a block's linears to (``Float8Linear``, ``MXFP8Linear``, ...: the qualified
    name of its config's owner), None for plain ``Linear`` ones."""
    for path in (("feed_forward", "w1"), ("attention", "wo"), ("attention", "qkv_linear"), ("attention", "wq")):
        config = _attr(layer, *path)
        owner = type(config).__qualname__.rsplit(".", 1)[0] if config is not None else ""
        if owner and owner != "Linear" and owner.endswith("Linear"):
            return owner
    return None


def _has_bias(layer: object) -> bool:
    """Whether a block's linear layers carry biases (their ``Linear.Config.bias``; torchtitan's default none)."""
    return any(_attr(layer, *path) is True for path in (("attention", "wo", "bias"), ("feed_forward", "w1", "bias")))


def spec_from_model_config(model_spec: object, seq: int, source: str) -> tuple[TransformerSpec, list[str]] | None:
    """The :class:`TransformerSpec` of a torchtitan ``ModelSpec`` read from its model configuration (a
    decoder of ``layers`` blocks, each grouped-query attention and a SwiGLU MLP or a mixture of experts, as
    torchtitan's Llama 3 and Qwen 3 are; run as :data:`TORCHTITAN_RUNS`), with notes; None when it has no
    such tree. Raises :class:`LaunchError` for blocks tuner does not model."""
    model = _attr(model_spec, "model")
    blocks = _attr(model, "layers")
    dim, vocab = _attr(model, "dim"), _attr(model, "vocab_size")
    if not isinstance(blocks, (list, tuple)) or not blocks or not isinstance(dim, int) or not isinstance(vocab, int):
        return None
    shapes = [_layer_shape(b) for b in blocks]
    heads, kv, width, _, _ = shapes[0]
    if not isinstance(heads, int) or _attr(blocks[0], "attention", "qkv_linear") is None and \
            _attr(blocks[0], "attention", "n_kv_heads") is None:
        kind = type(_attr(blocks[0], "attention")).__qualname__
        raise LaunchError(f"{source}: attention {kind} of {_attr(model_spec, 'name')}: tuner reads grouped-query "
                          "attention; give the model's shape: --workload MODEL.yaml")
    if any(s[:3] != shapes[0][:3] for s in shapes):
        raise LaunchError(f"{source}: the model's layers differ in their attention: give its shape with --workload")
    dense = [s[3] for s in shapes if s[4] is None]
    routed = {s[4] for s in shapes if s[4] is not None}
    layout = moe_layout([s[4] is not None for s in shapes]) if routed else (0, 1)
    if len(set(dense)) > 1 or len(routed) > 1 or layout is None:
        raise LaunchError(f"{source}: tuner reads a model whose first layers are dense and then every n-th layer "
                          "alike mixture-of-experts layers; give this one's shape with --workload")
    moe = None
    if routed:
        experts, top_k, expert_ffn, shared = next(iter(routed))
        moe = MoESpec(experts=int(experts), top_k=int(top_k), ffn=int(expert_ffn), shared_ffn=int(shared),
                      dense_layers=layout[0], every=layout[1])
    ffn = dense[0] if dense else None
    notes = [f"model {_attr(model_spec, 'name')} {_attr(model_spec, 'flavor')}: read from its configuration; "
             "RMSNorm priced as LayerNorm"]
    inner = type(_attr(blocks[0], "attention", "inner_attention")).__qualname__.split(".")[0]
    attention = "flex" if inner == "FlexAttention" else "flash2"  # SDPA and varlen run FlashAttention-2 kernels
    if inner not in ("FlexAttention", "ScaledDotProductAttention", "VarlenAttention"):
        notes.append(f"{inner} priced as FlashAttention-2")
    if _attr(blocks[0], "attention", "qk_norm") is not None:
        notes.append("query / key norms not priced")
    quantized = _quantized_linear(blocks[0])
    if quantized is not None:  # torchtitan's converters swap the linears' configs in the model tree
        notes.append(f"{quantized} linears (a quantization converter) read as tuner's FP8 linears"
                     + ("" if quantized == "Float8Linear" else ", at the fp8 peak"))
    try:
        spec = TransformerSpec(layers=len(blocks), hidden=dim, heads=heads, seq=seq, vocab=vocab,
                               ffn=ffn or (moe.ffn if moe else None), kv_heads=None if kv == heads else int(kv),
                               kv_channels=None if not width or width * heads == dim else int(width),
                               **TORCHTITAN_RUNS, tie_embeddings=bool(_attr(model, "enable_weight_tying")),
                               attention=attention, moe=moe, bias=_has_bias(blocks[0]),
                               fp8_linear=quantized is not None,
                               name=f"{_attr(model_spec, 'name')}-{_attr(model_spec, 'flavor')}")
        spec.validate()
    except (TypeError, ValueError) as exc:
        raise LaunchError(f"{source}: the model's configuration is not a shape tuner models ({exc})") from None
    return spec, notes


def _field(obj: object, path: str, source: str) -> object:
    """Attribute ``path`` (dotted) of the configuration ``obj``; :class:`LaunchError` when it is missing."""
    for name in path.split("."):
        if not hasattr(obj, name):
            raise LaunchError(f"{source}: the configuration has no {path} (torchtitan's main branch of Aug 2026 "
                              "or later is read)")
        obj = getattr(obj, name)
    return obj


def _int_field(obj: object, path: str, source: str) -> int:
    val = _field(obj, path, source)
    if isinstance(val, bool) or not isinstance(val, int):
        raise LaunchError(f"{source}: {path} must be an integer (got {val!r})")
    return val


def plan_from_torchtitan_config(config: object, source: str, *, devices: int | None = None,
                                spec: TransformerSpec | None = None, meta: dict | None = None) -> LaunchPlan:
    """A plan from a torchtitan ``Trainer.Config`` (read by field name).

    The model is ``spec`` if given, else the shape on a ``# tuner:`` line (``meta``), else the
    configuration's ``model_spec`` name and flavor when tuner knows them. The world size is ``devices``
    if given, else the product of the degrees when none is ``-1``, else the header's. Raises
    :class:`LaunchError` (one line) for a configuration tuner does not model.
    """
    meta = meta or {}
    notes: list[str] = []
    seq = _int_field(config, "training.max_context_length", source)
    tokens = _int_field(config, "training.num_tokens_per_microbatch_per_dp_rank", source)
    if 0 < tokens < seq:  # one packed row shorter than the context: its tokens are the sequence
        notes.append(f"a micro-batch of {tokens} tokens, below max_context_length {seq}: read as one {tokens}-token "
                     "sequence")
        seq = tokens
    if spec is None:
        spec = spec_from_header(meta, source)
    if spec is None:
        ms = _field(config, "model_spec", source)
        try:
            read = spec_from_model_config(ms, seq, source) if ms is not None else None
        except LaunchError:  # blocks tuner does not read from the tree (DeepSeek-V3's MLA): its flavor, if known
            if (str(getattr(ms, "name", "")).lower(), str(getattr(ms, "flavor", ""))) not in TORCHTITAN_MODELS:
                raise
            read = None
        if read is not None:
            spec, said = read
            notes += said
        else:
            spec = flavor_spec(str(getattr(ms, "name", "")), str(getattr(ms, "flavor", "")), seq, source, notes)
    if seq != spec.seq:
        spec = replace(spec, seq=seq)
    dtype = {"bfloat16": "bf16", "float32": "fp32"}.get(str(_field(config, "training.mixed_precision_param", source)))
    if dtype is None:
        raise LaunchError(f"{source}: training.mixed_precision_param must be bfloat16 or float32")
    spec = replace(spec, dtype=dtype)  # type: ignore[arg-type]
    if tokens < seq or tokens % seq:
        raise LaunchError(f"{source}: num_tokens_per_microbatch_per_dp_rank {tokens} is not a whole number of "
                          f"sequences of max_context_length {seq}")
    mb = tokens // seq
    names = {"tp": "tensor_parallel", "pp": "pipeline_parallel", "cp": "context_parallel", "ep": "expert_parallel",
             "replicate": "data_parallel_replicate", "shard": "data_parallel_shard"}
    deg = {k: _int_field(config, f"parallelism.{n}_degree", source) for k, n in names.items()}
    world, dp, shard = world_and_data_parallel(deg, devices, meta, source)
    tp, pp, cp, ep = deg["tp"], deg["pp"], deg["cp"], deg["ep"]
    pp_micro = _int_field(config, "parallelism.num_pp_microbatches", source) if pp > 1 else 1
    step = _int_field(config, "training.num_tokens_per_train_step", source)
    per_step = mb * pp_micro * dp * seq
    if step != -1 and (step < per_step or step % per_step):
        raise LaunchError(f"{source}: num_tokens_per_train_step {step} is not a multiple of the {per_step} tokens "
                          "of one forward and backward of every data-parallel rank")
    gb = (step if step != -1 else per_step) // seq
    sched, v, stage_layers = "1f1b", 1, None
    if pp > 1:
        per = _field(config, "parallelism.pipeline_parallel_layers_per_stage", source)
        if per is not None and (isinstance(per, bool) or not isinstance(per, int)):
            raise LaunchError(f"{source}: pipeline_parallel_layers_per_stage must be a positive integer")
        schedule = str(_field(config, "parallelism.pipeline_parallel_schedule", source))
        parts = getattr(_field(config, "parallelism", source), "module_fqns_per_model_part", None)
        if parts is not None:
            v, stage_layers = part_chunks(spec.layers, pp, schedule, parts, source)
        else:
            v, stage_layers = pipeline_chunks(
                spec, pp, schedule, per,
                _int_field(config, "parallelism.pipeline_parallel_first_stage_less_layers", source),
                _int_field(config, "parallelism.pipeline_parallel_last_stage_less_layers", source), source)
        sched = "interleaved" if v > 1 else "1f1b"
        if gb != mb * pp_micro * dp:
            notes.append("gradient accumulation over pipeline runs read as one pipeline of all micro-batches")
    ac = _field(config, "activation_checkpoint", source)
    kind = "None" if ac is None else type(ac).__qualname__.split(".")[0]
    recompute = {"None": "none", "FullAC": "full", "SelectiveAC": "op"}.get(kind)
    if recompute is None:
        raise LaunchError(f"{source}: activation_checkpoint {kind}: tuner models FullAC, SelectiveAC and None")
    if spec.doc_len is None:  # torchtitan main's language models always mask attention per packed document
        notes.append("torchtitan masks attention per packed document; tuner prices it over max_context_length "
                     "unless --set doc_len=N gives the documents' length")
    if pp == 1 and not getattr(getattr(config, "training", None), "disable_cuda_graphs", True):
        notes.append("torchtitan replays the step as CUDA graphs; tuner prices the host's kernel launches as eager "
                     "(it matters where the host, not the GPU, sets the pace)")
    sp = bool(_field(config, "parallelism.enable_sequence_parallel", source))
    sharding_notes(shard * cp > 1, pp, notes)
    if bool(getattr(getattr(config, "training", None), "enable_cpu_offload", False)):
        notes.append(CPU_OFFLOAD_NOTE)
    if compiled_parts(getattr(config, "compile", None), notes):
        spec = replace(spec, fused_loss=True)
    async_tp = bool(_field(config, "compile.enable_async_tensor_parallel", source))
    if async_tp and tp > 1:
        notes.append(ASYNC_TP_NOTE)
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, micro_batch=mb, global_batch=gb, schedule=sched,  # type: ignore[arg-type]
                        virtual_stages=v if v > 1 else 2, recompute=recompute, ep=ep,  # type: ignore[arg-type]
                        distributed_optimizer=shard * cp > 1, cp=cp, stage_layers=stage_layers,
                        tp_comm_overlap=async_tp,
                        fsdp_reshard_after_forward=reshard_after_forward(
                            getattr(getattr(config, "parallelism", None), "fsdp_reshard_after_forward", "default"),
                            pp, source),
                        fsdp_shard=hsdp_shard(deg["replicate"], shard, cp, pp, spec, notes))
    ran = replace(torchtitan_plan(plan, spec), sequence_parallel=sp and tp > 1)
    return LaunchPlan(spec, ran, world, header_str(meta, "platform", source), header_int(meta, "devices_per_node", source),
                      (), tuple(notes))


def load_torchtitan_config(ref: str) -> tuple[object, dict]:
    """torchtitan's ``Trainer.Config`` named by ``ref`` (``MODULE:FUNCTION``, torchtitan's ``--module`` /
    ``--config``; or ``FILE.py:FUNCTION``) built by torchtitan's ``ConfigManager``, and the ``# tuner:``
    header of the file (``{}`` for a module). Raises :class:`LaunchError` when torchtitan is not
    importable or cannot build it."""
    m = _REF.match(ref)
    if m is None:
        raise LaunchError(f"{ref}: name a torchtitan configuration as MODULE:FUNCTION or FILE.py:FUNCTION")
    module, function = m["module"], m["function"]
    meta: dict = {}
    path = Path(module) if module.endswith(".py") else None
    if path is not None:
        if not path.is_file():
            raise LaunchError(f"{ref}: no such file: {path}")
        try:
            meta = read_header(path.read_text(), str(path))
        except UnicodeDecodeError:
            raise LaunchError(f"{ref}: {path} is not a text file") from None
    try:
        from torchtitan.config.manager import ConfigManager
    except ImportError as exc:
        raise LaunchError(f"{ref}: reading a torchtitan configuration needs torchtitan's main branch importable "
                          f"(pip install -e a torchtitan checkout): {exc}") from None
    prior = sys.modules.get(path.stem) if path is not None else None
    if path is not None:  # the file imported under its stem, then taken out of sys.modules again
        sys.modules.pop(path.stem, None)
        sys.path.insert(0, str(path.resolve().parent))
        module = path.stem
    said = io.StringIO()
    logging.disable(logging.WARNING)  # torchtitan's warnings about training assets (tokenizer, checkpoints)
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            config = ConfigManager().parse_args(["--module", module, "--config", function])
    except (Exception, SystemExit) as exc:  # torchtitan's, the recipe's or tyro's own failure, as one line
        why = _first_message(said.getvalue()) if isinstance(exc, SystemExit) else _first_message(str(exc))
        raise LaunchError(f"{ref}: torchtitan could not build the configuration ({type(exc).__name__}: "
                          f"{why[:300]})") from None
    finally:
        logging.disable(logging.NOTSET)
        if path is not None:
            sys.path.remove(str(path.resolve().parent))
            sys.modules.pop(path.stem, None)
            if prior is not None:
                sys.modules[path.stem] = prior
    return config, meta


def _first_message(text: str) -> str:
    """``text`` on one line: the lines of tyro's framed error up to its rule (without the frame and title)."""
    body = []
    for ln in text.splitlines():
        inner = ln.strip("│╭╮╰╯ ")
        if inner.startswith("─") or (inner and not inner.strip("-=─ ")):  # a rule, framed or plain
            if body:
                break
            continue
        if inner and not inner.startswith(("Value error", "For full helptext")):
            body.append(inner)
    return " ".join(body)


def read_torchtitan_config(ref: str, *, devices: int | None = None, spec: TransformerSpec | None = None) -> LaunchPlan:
    """:func:`plan_from_torchtitan_config` of the configuration :func:`load_torchtitan_config` builds."""
    config, meta = load_torchtitan_config(ref)
    return plan_from_torchtitan_config(config, ref, devices=devices, spec=spec, meta=meta)
