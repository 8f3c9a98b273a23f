"""A tuner plan as a torchtitan TOML job config, and such a file read back as a plan.

The sections and keys are those of torchtitan's ``torchtitan/config/job_config.py`` up to v0.2.2,
the last releases configured by TOML files (its main branch replaced them by Python
configurations in Feb 2026, pytorch/torchtitan#2386, and later counted batches in tokens). torchtitan
builds its model by ``[model] name`` and ``flavor``, so tuner writes the model's shape into its
``# tuner:`` comment line; a TOML without it reads back with the model given by the caller, or
torchtitan's Llama 3, Llama 4, Qwen 3 and DeepSeek-V3 flavors (:data:`TORCHTITAN_MODELS`).

torchtitan cannot express every tuner plan, so :func:`torchtitan_plan` is the plan as torchtitan
runs it: tensor parallelism always with sequence parallelism, gradients reduced in fp32
(``mixed_precision_reduce`` has no other value), gradient reduction overlapped. Mapping: ``dp``
``data_parallel_shard_degree`` (FSDP) when ``fsdp`` or ``distributed_optimizer`` else
``data_parallel_replicate_degree`` (DDP) — FSDP is tuner's ``fsdp`` without PP (TP and experts
inside it, torchtitan's layouts) and its distributed optimizer under PP; ``micro_batch`` ``local_batch_size`` without pipeline parallelism, else
``pipeline_parallel_microbatch_size`` with ``local_batch_size = global_batch / dp``; interleaved
``virtual_stages`` ``Interleaved1F1B`` with ``pipeline_parallel_layers_per_stage = layers / (pp x v)``
and no embedding / output weighting; ``recompute`` ``[activation_checkpoint] mode`` (selective as
``selective_ac_option = "op"``, torchtitan's op-level checkpointing, tuner's ``"op"``: a ``"selective"``
plan runs as ``"op"``); ``tp_comm_overlap`` ``enable_async_tensor_parallel``; ``cp``
``context_parallel_degree``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

from predictor.sources.synth.transformer import MLASpec, MoESpec, ParallelPlan, TransformerSpec
from tuner.launch.common import (
    LaunchError,
    LaunchPlan,
    expert_tp_degree,
    header_int,
    header_line,
    header_str,
    read_header,
    read_launch_text,
)

__all__ = ["ASYNC_TP_NOTE", "COMPILE_NOTE", "CPU_OFFLOAD_NOTE", "LOSS_COMPILE_NOTE", "compiled_parts", "TORCHTITAN_DTYPES", "TORCHTITAN_MODELS", "TORCHTITAN_RUNS", "flavor_spec", "launch_meta", "parallelism_fields", "llama_ffn", "pipeline_chunks", "model_part_fqns", "part_chunks", "torchtitan_stage_layers", "torchtitan_spec", "torchtitan_dropped", "reshard_after_forward", "hsdp_shard", "sharding_notes", "spec_from_header",
           "world_and_data_parallel", "toml_section", "torchtitan_model", "torchtitan_plan", "torchtitan_toml",
           "read_torchtitan_toml", "read_torchtitan_file"]

#: tuner's dtype -> torchtitan's ``mixed_precision_param`` (torchtitan has no fp16 training)
TORCHTITAN_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "bfloat16"}
_SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B"}


def llama_ffn(dim: int, multiple_of: int, multiplier: float | None = None) -> int:
    """Llama's FFN width: 2/3 of 4 ``dim``, times ``multiplier``, rounded up to ``multiple_of``."""
    width = int(2 * 4 * dim / 3)
    if multiplier is not None:
        width = int(multiplier * width)
    return multiple_of * math.ceil(width / multiple_of)


#: torchtitan's Llama 3 flavors (``torchtitan/models/llama3``: dim, layers, heads, key/value heads, FFN
#: rule) with the Llama 3 tokenizer's 128 256 tokens; SwiGLU, untied output layer, PyTorch SDPA attention
#: (FlashAttention-2 kernels), plain PyTorch modules (tuner's eager program, its fp32 cross-entropy).
#: Rotary embeddings as torchtitan applies them (``position="rope"``); RMSNorm is priced as LayerNorm.
#: what every torchtitan language model runs: plain PyTorch modules, no dropout, rotary embeddings, SwiGLU
TORCHTITAN_RUNS: dict = dict(program="eager", dropout=0.0, position="rope", mlp="swiglu")
#: torchtitan's Qwen 3 flavors (``torchtitan/models/qwen3/__init__.py`` at v0.2.2: 128-wide heads, the
#: Qwen tokenizer's 151 936 tokens, the small ones' output layer tied to the embedding; the MoE ones every
#: layer experts without a shared one); their per-head query and key norms are not priced
_QWEN3 = dict(vocab=151936, kv_heads=8, kv_channels=128)
_QWEN3_MOE = dict(vocab=151936, kv_heads=4, kv_channels=128)
#: DeepSeek-V3's multi-latent attention (``torchtitan/models/deepseek_v3``: 512-wide key / value latent,
#: 128 + 64-wide query / key heads, 128-wide values), straight or through a query latent
_DSV3_MLA = dict(kv_lora_rank=512, qk_head_dim=128, rope_head_dim=64, v_head_dim=128)
#: Llama 4's expert width in torchtitan: the dense SwiGLU width of 5120 (x 1.2, rounded up to 2048: 16,384) over
#: top-1 + one shared expert, rounded up to 2048 (``auto_scale_hidden_dim``): 8192; 17bx128e alternates dense
#: layers of that dense width and MoE layers (``interleave_moe_layer_step`` 2)
_LLAMA4 = dict(layers=48, hidden=5120, heads=40, kv_heads=8, vocab=202048, ffn=8192,
               moe=MoESpec(experts=16, top_k=1, ffn=8192, shared_ffn=8192))
_LLAMA4_128E = dict(_LLAMA4, ffn=16384, moe=MoESpec(experts=128, top_k=1, ffn=8192, shared_ffn=8192, every=2))
TORCHTITAN_MODELS: dict[tuple[str, str], dict] = {
    ("llama3", "8B"): dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=llama_ffn(4096, 1024, 1.3)),
    ("llama3", "70B"): dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=llama_ffn(8192, 4096, 1.3)),
    ("llama3", "405B"): dict(layers=126, hidden=16384, heads=128, kv_heads=8, ffn=llama_ffn(16384, 4096, 1.2)),
    ("qwen3", "0.6B"): dict(layers=28, hidden=1024, heads=16, ffn=3072, tie_embeddings=True, **_QWEN3),
    ("qwen3", "1.7B"): dict(layers=28, hidden=2048, heads=16, ffn=6144, tie_embeddings=True, **_QWEN3),
    ("qwen3", "4B"): dict(layers=36, hidden=2560, heads=32, ffn=9728, tie_embeddings=True, **_QWEN3),
    ("qwen3", "8B"): dict(layers=36, hidden=4096, heads=32, ffn=12288, **_QWEN3),
    ("qwen3", "14B"): dict(layers=40, hidden=5120, heads=40, ffn=17408, **_QWEN3),
    ("qwen3", "32B"): dict(layers=64, hidden=5120, heads=64, ffn=25600, **_QWEN3),
    ("qwen3", "30B-A3B"): dict(layers=48, hidden=2048, heads=32, ffn=768, **_QWEN3_MOE,
                               moe=MoESpec(experts=128, top_k=8, ffn=768)),
    ("qwen3", "235B-A22B"): dict(layers=94, hidden=4096, heads=64, ffn=1536, **_QWEN3_MOE,
                                 moe=MoESpec(experts=128, top_k=8, ffn=1536)),
    # FlexAttention with per-document (block-causal) masks, as these flavors set
    ("deepseek_v3", "16B"): dict(layers=27, hidden=2048, heads=16, ffn=10944, vocab=102400, attention="flex",
                                 mla=MLASpec(q_lora_rank=0, **_DSV3_MLA),
                                 moe=MoESpec(experts=64, top_k=6, ffn=1408, shared_ffn=2 * 1408, dense_layers=1)),
    ("deepseek_v3", "236B"): dict(layers=60, hidden=5120, heads=128, ffn=12288, vocab=102400, attention="flex",
                                  mla=MLASpec(q_lora_rank=1536, **_DSV3_MLA),
                                  moe=MoESpec(experts=160, top_k=6, ffn=1536, shared_ffn=2 * 1536, dense_layers=1)),
    ("deepseek_v3", "671B"): dict(layers=61, hidden=7168, heads=128, ffn=18432, vocab=129280, attention="flex",
                                  mla=MLASpec(q_lora_rank=1536, **_DSV3_MLA),
                                  moe=MoESpec(experts=256, top_k=8, ffn=2048, shared_ffn=2048, dense_layers=3)),
    ("llama4", "17bx16e"): _LLAMA4,
    ("llama4", "17bx16e_irope"): dict(_LLAMA4, attention="flex"),
    ("llama4", "17bx128e"): _LLAMA4_128E,
    ("llama4", "17bx128e_irope"): dict(_LLAMA4_128E, attention="flex"),
}
#: per-document (block-causal) attention masks, which FlexAttention flavors set
_DOC_MASKS = "its per-document (block-causal) attention masks priced over seq_len unless --set doc_len=N gives " \
             "the documents' length"
#: the notes of a flavor's parts tuner prices otherwise, by (model name, flavor), or (model name, None) for all
_FLAVOR_NOTES: dict[tuple[str, str | None], str] = {
    ("qwen3", None): "query / key norms not priced",
    ("deepseek_v3", None): f"its expert-group-limited routing priced as plain top-k routing; {_DOC_MASKS}",
    **{("llama4", f): "its chunked attention (8,192-token blocks) and NoPE layers priced as causal attention over "
                      f"the sequence; {_DOC_MASKS}" for f in ("17bx16e_irope", "17bx128e_irope")},
}


def torchtitan_model(name: str, flavor: str, seq: int) -> TransformerSpec | None:
    """The :class:`TransformerSpec` of torchtitan's ``[model] name`` / ``flavor`` (None if tuner does not know it)."""
    shape = TORCHTITAN_MODELS.get((str(name).lower(), str(flavor)))
    if shape is None:
        return None
    shape = {"vocab": 128256, "tie_embeddings": False, "attention": "flash2", **shape}
    if shape.get("kv_channels") is not None and shape["kv_channels"] * shape["heads"] == shape["hidden"]:
        shape["kv_channels"] = None  # the default width, hidden / heads
    return TransformerSpec(**shape, **TORCHTITAN_RUNS, seq=seq, bias=False, name=f"{name}-{flavor}")


def flavor_spec(name: str | None, flavor: str | None, seq: int, source: str, notes: list[str]) -> TransformerSpec:
    """The :class:`TransformerSpec` of torchtitan's model ``name`` / ``flavor`` (None: the job names none), with
    the note on what tuner prices in its place; :class:`LaunchError` for a flavor tuner does not know."""
    key = (str(name).lower(), str(flavor or ""))
    spec = torchtitan_model(name, flavor or "", seq) if name is not None else None
    if spec is None:
        named = f" ({name or '?'} / {flavor or '?'})" if name is not None else ""
        known = ", ".join(f"{n} / {f}" for n, f in TORCHTITAN_MODELS)
        raise LaunchError(f"{source}: torchtitan names its model{named}, tuner knows {known}; for another model "
                          "give its shape: --workload MODEL.yaml")
    extra = _FLAVOR_NOTES.get(key) or _FLAVOR_NOTES.get((key[0], None))
    notes.append(f"model {spec.name}: torchtitan's flavor, RMSNorm priced as LayerNorm" + (f"; {extra}" if extra else ""))
    return spec


def _sharded(plan: ParallelPlan) -> bool:
    """FSDP (torchtitan shards over the data and context parallel ranks)."""
    return (plan.fsdp or plan.distributed_optimizer) and plan.replicas > 1


def torchtitan_plan(plan: ParallelPlan, spec: TransformerSpec | None = None) -> ParallelPlan:
    """``plan`` as torchtitan runs it: sequence parallel with TP, fp32 gradient reduction, overlapped, an fp32
    optimizer state; sharded data parallelism is FSDP2 (``fully_shard``), which tuner models without PP (with TP
    and experts inside, torchtitan's layouts) and under PP as the distributed optimizer."""
    fsdp = _sharded(plan) and plan.pp == 1
    recompute = "op" if plan.recompute == "selective" else plan.recompute
    layers = plan.recompute_layers
    if layers is not None and spec is not None:  # every n-th layer: as many as n = chunk / layers allows
        per_chunk = plan.chunk_layers(spec.layers)
        every = _layer_every(per_chunk, layers)
        layers = None if every == 1 else per_chunk // every
    # torchtitan's experts are whole on every TP rank (its expert_tensor_parallel_degree, default 1, since removed)
    etp = 1 if plan.expert_tp is None and spec is not None and spec.moe is not None else plan.expert_tp
    return replace(plan, sequence_parallel=plan.tp > 1, grad_reduce_dtype="fp32", overlap_grad_reduce=True,
                   pp_scatter_gather=True, fsdp=fsdp, fsdp2=fsdp, distributed_optimizer=_sharded(plan) and not fsdp,
                   fsdp_shard=plan.fsdp_shard if fsdp else None, fsdp_fp32_params=False,  # fsdp2 implies it
                   recompute=recompute, recompute_layers=layers, optimizer_state="fp32", expert_tp=etp)


def torchtitan_spec(spec: TransformerSpec) -> TransformerSpec:
    """``spec`` as the written torchtitan job trains it: without multi-token prediction (its models have none),
    its experts reached by torchtitan's all-to-all without node-limited routing (neither is written)."""
    moe = spec.moe and replace(spec.moe, dispatcher="alltoall", router_groups=0, router_group_topk=0)
    return replace(spec, moe=moe, mtp_layers=0)


def torchtitan_dropped(spec: TransformerSpec) -> list[str]:
    """What the written torchtitan job leaves out of ``spec`` (:func:`torchtitan_spec`), one line each."""
    tt = torchtitan_spec(spec)
    out = []
    if tt.mtp_layers != spec.mtp_layers:
        out.append("torchtitan trains no multi-token prediction: the model's MTP layers are not written")
    if tt.moe != spec.moe:
        out.append("the plan's DeepEP dispatcher / node-limited routing are not written: torchtitan's all-to-all")
    return out


def _layer_every(per_chunk: int, layers: int) -> int:
    """torchtitan's ``selective_ac_option`` n (every n-th layer checkpointed) nearest ``layers`` of ``per_chunk``."""
    return max(1, round(per_chunk / layers))


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


def toml_section(name: str, items: dict) -> list[str]:
    """The lines of TOML section ``[name]`` holding ``items`` (strings, numbers, booleans), then a blank line."""
    return [f"[{name}]", *(f"{k} = {_value(v)}" for k, v in items.items()), ""]


def launch_meta(spec: TransformerSpec, plan: ParallelPlan, platform: str | None,
                devices_per_node: int | None) -> tuple[dict, str]:
    """The ``# tuner:`` header of a torchtitan file (the model's shape, devices, platform) and the words
    saying where the plan runs (" on 64 x h100-sxm")."""
    meta = {"model": spec.to_dict(), "devices": plan.devices}
    if platform:
        meta["platform"] = platform
    if devices_per_node:
        meta["devices_per_node"] = devices_per_node
    return meta, (f" on {plan.devices} x {platform}" if platform else f" on {plan.devices} devices")


def parallelism_fields(spec: TransformerSpec, plan: ParallelPlan) -> dict:
    """The ``parallelism`` keys of ``plan`` both torchtitan formats share: the degrees (data parallelism
    sharded, FSDP, or replicated) and, with pipeline parallelism, the schedule and even stages."""
    sharded = _sharded(plan)
    shard = (plan.fsdp_shard or plan.dp) if plan.fsdp else plan.dp  # HSDP: shard inside, replicate across groups
    par: dict = {"data_parallel_replicate_degree": plan.dp // shard if sharded else plan.dp,
                 "data_parallel_shard_degree": shard if sharded else 1, "tensor_parallel_degree": plan.tp,
                 "pipeline_parallel_degree": plan.pp, "context_parallel_degree": plan.cp,
                 "expert_parallel_degree": plan.ep}
    if plan.fsdp and not plan.fsdp_reshard_after_forward:
        par["fsdp_reshard_after_forward"] = "never"
    if plan.pp > 1:
        v = plan.virtual_stages_effective
        par["pipeline_parallel_schedule"] = _SCHEDULES[plan.schedule if v > 1 else "1f1b"]
        try:
            per, first, last = _torchtitan_split(spec.layers, plan)
            par.update(pipeline_parallel_layers_per_stage=per, pipeline_parallel_first_stage_less_layers=first,
                       pipeline_parallel_last_stage_less_layers=last)
        except LaunchError:  # a split the fewer-layers keys do not make: each model chunk's modules by name
            assert plan.stage_layers is not None
            par["module_fqns_per_model_part"] = model_part_fqns(plan.stage_layers)
    return par


def model_part_fqns(stage_layers: tuple[int, ...]) -> list[list[str]]:
    """torchtitan's ``module_fqns_per_model_part`` for ``stage_layers`` (layers of each virtual stage): the
    embedding with the first chunk, the final norm and output layer with the last."""
    parts, start = [], 0
    for i, n in enumerate(stage_layers):
        part = [f"layers.{k}" for k in range(start, start + n)]
        start += n
        if i == 0:
            part.insert(0, "tok_embeddings")
        if i == len(stage_layers) - 1:
            part += ["norm", "output"]
        parts.append(part)
    return parts


def part_chunks(layers: int, pp: int, schedule: str, parts: object, source: str) -> tuple[int, tuple[int, ...] | None]:
    """(model chunks a pipeline rank holds, layers of each virtual stage — None: even) of torchtitan's
    ``module_fqns_per_model_part``: chunk ``i`` on rank ``i % pp`` (the looped schedules), its ``layers.N``
    modules counted; :class:`LaunchError` where the parts do not hold the model's layers once each in order,
    the embedding is not in the first or the output layer not in the last, or the schedule cannot run them."""
    what = f"{source}: module_fqns_per_model_part"
    if not isinstance(parts, list | tuple) or not parts or \
            not all(isinstance(part, list | tuple) and all(isinstance(m, str) for m in part) for part in parts):
        raise LaunchError(f"{what} must be a list of lists of module names")
    if len(parts) % pp:
        raise LaunchError(f"{what}: {len(parts)} model parts do not divide over pipeline_parallel_degree {pp}")
    index = [[int(m.split(".", 1)[1]) for m in part if re.fullmatch(r"layers\.\d+", m)] for part in parts]
    if [k for part in index for k in part] != list(range(layers)):
        raise LaunchError(f"{what} must name layers.0 .. layers.{layers - 1} once each, in order")
    if "tok_embeddings" not in parts[0] or "output" not in parts[-1]:
        raise LaunchError(f"{what}: tuner models tok_embeddings in the first part and output in the last")
    counts = tuple(len(part) for part in index)
    if any(n < 1 for n in counts[1:-1]):
        raise LaunchError(f"{what}: a part between the first and the last holds no layer")
    _check_schedule(schedule, source)
    v = len(parts) // pp
    if (v > 1) != (schedule == "Interleaved1F1B"):
        raise LaunchError(f"{what}: {v} part(s) a rank under pipeline_parallel_schedule {schedule!r}: tuner models "
                          "1F1B with one part a rank and Interleaved1F1B with more")
    return v, (None if len(set(counts)) == 1 else counts)


def _torchtitan_split(layers: int, plan: ParallelPlan) -> tuple[int, int, int]:
    """(``pipeline_parallel_layers_per_stage``, first / last stage's fewer layers) that make torchtitan split
    ``layers`` as ``plan`` does; :class:`LaunchError` for a split it cannot make."""
    stages = plan.pp * plan.virtual_stages_effective
    if plan.stage_layers is None:
        return layers // stages, 0, 0
    tries = [(1, 1)] + [(a, b) for a in range(4) for b in range(4) if (a, b) != (1, 1)]  # torchtitan's default first
    for first, last in tries:
        per = -(-(layers + first + last) // stages)
        try:
            if torchtitan_stage_layers(layers, stages, first, last) == plan.stage_layers and \
                    math.ceil((layers + first + last) / per) == stages:
                return per, first, last
        except ValueError:
            continue
    raise LaunchError(f"stage_layers {list(plan.stage_layers)}: torchtitan splits a pipeline evenly but for fewer "
                      "layers on its first and last stage")


def torchtitan_toml(spec: TransformerSpec, plan: ParallelPlan, *, platform: str | None = None,
                    devices_per_node: int | None = None, predicted_s: float | None = None) -> str:
    """The TOML job config (``[job]``, ``[training]``, ``[parallelism]``, ``[activation_checkpoint]``) of ``plan``."""
    t = torchtitan_plan(plan, spec)
    meta, where = launch_meta(torchtitan_spec(spec), plan, platform, devices_per_node)  # the model it trains
    said = f", predicted {predicted_s:.4f} s/iteration by tuner (as torchtitan runs it)" if predicted_s else ""
    lines = [f"# torchtitan job config (TOML, v0.2 schema) of {spec.name} plan {t.label()}{where}{said}",
             "# [model] name / flavor: the torchtitan model of this shape (tuner's shape is on the next line)",
             header_line(meta)]
    if spec.dtype == "fp16":
        lines.append("# torchtitan trains in bfloat16 or float32: the fp16 model is written as bfloat16")
    if plan.tp > 1 and not plan.sequence_parallel:
        lines.append("# torchtitan's tensor parallelism is sequence parallel: the plan above runs with it")
    if plan.optimizer_state != "fp32":
        lines.append("# torchtitan's AdamW keeps an fp32 state: the plan's 16-bit optimizer state is not written")
    lines += [f"# {n}" for n in torchtitan_dropped(spec)]
    if t.distributed_optimizer:
        lines.append("# FSDP shards parameters and gradients too; with PP or experts tuner models its "
                     "sharded optimizer states only")
    lines.append("")
    lines += toml_section("job", {"description": f"{spec.name} {t.label()} (tuner)"})
    if spec.fp8_linear:
        lines += ["[model]", 'converters = ["float8"]', ""]
    if spec.fp8_linear and spec.fp8_params:
        lines += toml_section("quantize.linear.float8", {"enable_fsdp_float8_all_gather": True})
    training = {"local_batch_size": plan.micro_batch if plan.pp == 1 else plan.global_batch // plan.dp,
                "global_batch_size": plan.global_batch, "seq_len": spec.seq,
                "mixed_precision_param": TORCHTITAN_DTYPES[spec.dtype], "mixed_precision_reduce": "float32"}
    lines += toml_section("training", training)
    par = {**parallelism_fields(spec, plan), "enable_async_tensor_parallel": plan.tp_comm_overlap}
    if plan.pp > 1:
        par["pipeline_parallel_microbatch_size"] = plan.micro_batch
    lines += toml_section("parallelism", par)
    ac: dict = {"mode": "selective" if t.recompute == "op" or t.recompute_layers is not None else t.recompute}
    if t.recompute == "op":
        ac["selective_ac_option"] = "op"
    elif t.recompute_layers is not None:
        ac["selective_ac_option"] = str(plan.chunk_layers(spec.layers) // t.recompute_layers)
    lines += toml_section("activation_checkpoint", ac)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- TOML -> plan
def _load_toml(text: str, source: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise LaunchError(f"{source}: reading TOML needs Python 3.11 or the tomli package") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LaunchError(f"{source}: TOML syntax error: {exc}") from None


def _int(table: dict, key: str, where: str, source: str, default: int) -> int:
    val = table.get(key, default)
    if isinstance(val, bool) or not isinstance(val, int):
        raise LaunchError(f"{source}: [{where}] {key} must be an integer (got {val!r})")
    return val


def spec_from_header(meta: dict, source: str) -> TransformerSpec | None:
    """The model shape on a '# tuner:' line (None when it has none); :class:`LaunchError` for one that is not a spec."""
    model = meta.get("model")
    if model is None:
        return None
    if not isinstance(model, dict):
        raise LaunchError(f"{source}: the model of the '# tuner:' line must be a JSON object")
    model = dict(model)
    moe = model.pop("moe", None)
    try:
        spec = TransformerSpec(**model, moe=MoESpec(**moe) if moe else None)
        for key in ("layers", "hidden", "heads", "seq", "vocab"):
            if isinstance(getattr(spec, key), bool) or not isinstance(getattr(spec, key), int):
                raise TypeError(f"{key} must be an integer")
        spec.validate()
        if not spec.param_count() > 0:
            raise ValueError("the shape gives no parameters")
        return spec
    except (TypeError, ValueError) as exc:
        raise LaunchError(f"{source}: the model of the '# tuner:' line is not a transformer spec ({exc})") from None


def world_and_data_parallel(degrees: dict[str, int], devices: int | None, meta: dict, source: str) -> tuple[int, int, int]:
    """(world size, dp, FSDP shard degree) of torchtitan's parallel degrees (``tp, pp, cp, ep, replicate,
    shard``; shard -1: the rest of the world). The world is ``devices`` if given, else the degrees' product
    when none is -1, else the ``# tuner:`` header's. Raises :class:`LaunchError` for degrees that do not
    fit it."""
    for key, val in degrees.items():
        if val < 1 and key != "shard":
            raise LaunchError(f"{source}: the {key} degree must be >= 1 (got {val})")
    tp, pp, cp, rep, shard = (degrees[k] for k in ("tp", "pp", "cp", "replicate", "shard"))
    world = devices if devices is not None else (tp * pp * cp * rep * shard if shard > 0 else
                                                 header_int(meta, "devices", source))
    if world is None:
        raise LaunchError(f"{source}: data_parallel_shard_degree = -1 and the world size is unknown: give --devices N")
    world = int(world)
    if world % (tp * pp * cp * rep):
        raise LaunchError(f"{source}: tp x pp x cp x replicate = {tp * pp * cp * rep} does not divide the world size "
                          f"{world}")
    if shard < 1:
        shard = world // (tp * pp * cp * rep)
    dp = rep * shard
    if tp * pp * cp * dp != world:
        raise LaunchError(f"{source}: the degrees multiply to {tp * pp * cp * dp} devices, not {world}")
    return world, dp, shard


def torchtitan_stage_layers(layers: int, stages: int, first_less: int = 1, last_less: int = 1) -> tuple[int, ...] | None:
    """Layers of each of ``stages`` virtual stages as torchtitan splits a decoder (its
    ``generate_llm_fqn_per_model_part``): the embedding and the output each weigh ``first_less`` /
    ``last_less`` layers, the weighted total goes out evenly, the first stages taking the remainder.
    None: an even split. :class:`ValueError` where torchtitan refuses it."""
    if stages == 1:
        return None
    total = layers + first_less + last_less
    per, extra = divmod(total, stages)
    if per == 0 or first_less > per or last_less > per:
        raise ValueError(f"{stages} stages over {layers} layers with the first / last {first_less} / {last_less} fewer "
                         "leave a stage empty or give the embedding / output more than a stage")
    out, placed = [], 0
    for i in range(stages):
        n = per + (i < extra) - (first_less if i == 0 else last_less if i == stages - 1 else 0)
        n = min(n, layers - placed)
        out.append(n)
        placed += n
    if placed != layers:
        raise ValueError(f"torchtitan's split of {layers} layers over {stages} stages leaves {layers - placed} out")
    return None if len(set(out)) == 1 else tuple(out)


def _check_schedule(schedule: str, source: str) -> None:
    """:class:`LaunchError` for a pipeline schedule tuner does not model (it models 1F1B and Interleaved1F1B)."""
    if schedule not in ("1F1B", "Interleaved1F1B"):
        raise LaunchError(f"{source}: pipeline_parallel_schedule {schedule!r}: tuner models 1F1B and Interleaved1F1B")


def pipeline_chunks(spec: TransformerSpec, pp: int, schedule: str, per_stage: int | None, first: int, last: int,
                    source: str) -> tuple[int, tuple[int, ...] | None]:
    """Model chunks a pipeline rank holds (``v``) under torchtitan's ``schedule`` with
    ``pipeline_parallel_layers_per_stage`` and the first / last stage's fewer layers, and the layers of
    each virtual stage (None: even); refuses schedules tuner does not model."""
    _check_schedule(schedule, source)
    if (per_stage is not None and per_stage < 1) or first < 0 or last < 0:
        raise LaunchError(f"{source}: pipeline_parallel_layers_per_stage must be >= 1 and the first / last stage's "
                          "fewer layers >= 0")
    if per_stage is None:
        v = 2 if schedule == "Interleaved1F1B" else 1
    else:
        v = max(1, math.ceil((spec.layers + first + last) / per_stage) // pp)
    try:
        return v, torchtitan_stage_layers(spec.layers, pp * v, first, last)
    except ValueError as err:
        raise LaunchError(f"{source}: {err}") from None


#: the note on torchtitan's async TP, priced as Megatron's overlap of TP communication
ASYNC_TP_NOTE = ("async TP priced as Megatron's overlap of TP communication, which hides more than torchtitan's "
                 "(torchtitan published +5.7 % from it on Llama 3.1 70B, FSDP 32 x TP 8 on 256 H100s)")


def reshard_after_forward(policy: object, pp: int, source: str) -> bool:
    """The plan's ``fsdp_reshard_after_forward`` from torchtitan's policy of that name: False for ``"never"``
    without pipeline parallelism, else True (torchtitan's ``"default"`` is True there; with PP tuner models its
    FSDP as the distributed optimizer, where the field does not apply). :class:`LaunchError` for a value
    torchtitan does not take."""
    if policy not in ("default", "always", "never"):
        raise LaunchError(f"{source}: fsdp_reshard_after_forward must be \"default\", \"always\" or \"never\" "
                          f"(got {policy!r})")
    return not (policy == "never" and pp == 1)


def hsdp_shard(replicate: int, shard: int, cp: int, pp: int, spec: TransformerSpec, notes: list[str]) -> int | None:
    """The plan's ``fsdp_shard`` of torchtitan's replicate x shard degrees: ``shard`` where both shard and
    replicate (HSDP) without PP in a dense model, else None (with a note where HSDP is read as sharding over
    every replica)."""
    if replicate == 1 or shard * cp == 1:
        return None
    if pp > 1 or spec.moe is not None:
        notes.append("HSDP (data_parallel_replicate_degree x data_parallel_shard_degree) read as sharding over every "
                     "data-parallel rank: tuner models HSDP for dense models without PP")
        return None
    return shard


#: the note on a torchtitan job that compiles its model (``[compile] enable``)
COMPILE_NOTE = ("torch.compile is not modelled: the eager program's kernels are priced (torchtitan's Llama 3.1 8B "
                "on 8 H100s ran 5,762 -> 6,667 tokens/s/GPU with it, +16 %; benchmarks/llama3_h100_202412)")
#: the note on a torchtitan job that compiles its loss (``[compile] components`` holding ``"loss"``)
LOSS_COMPILE_NOTE = "the compiled loss read as one fused cross-entropy (its fp32 logits not kept)"


def compiled_parts(compile_cfg: object, notes: list[str]) -> bool:
    """Whether torchtitan's ``[compile]`` section (a dict, or the main branch's config object) compiles the
    loss — read as a fused cross-entropy —, with the notes on what it compiles (``components`` defaults to
    the model and the loss)."""
    get = compile_cfg.get if isinstance(compile_cfg, dict) else (lambda k, d=None: getattr(compile_cfg, k, d))
    if get("enable", False) is not True:
        return False
    parts = get("components", ["model", "loss"])
    parts = list(parts) if isinstance(parts, (list, tuple)) else [parts]
    if "model" in parts:
        notes.append(COMPILE_NOTE)
    if "loss" in parts:
        notes.append(LOSS_COMPILE_NOTE)
    return "loss" in parts


#: the note on torchtitan's ``training.enable_cpu_offload``
CPU_OFFLOAD_NOTE = ("training.enable_cpu_offload: FSDP's CPU offload is not modelled; the prediction keeps the parameters, "
                    "gradients and optimizer on the GPU")


def sharding_notes(sharded: bool, pp: int, notes: list[str]) -> None:
    """Append how torchtitan's FSDP reads under pipeline parallelism, where tuner does not model it as FSDP."""
    if sharded and pp > 1:  # torchtitan's default under PP: fsdp_reshard_after_forward off
        notes.append("FSDP with PP read as the distributed optimizer: under PP torchtitan keeps a stage's weights "
                     "gathered across micro-batches and reduce-scatters the gradients once, as the distributed "
                     "optimizer holds and moves them")


def read_torchtitan_toml(text: str, source: str = "toml", *, devices: int | None = None,
                         spec: TransformerSpec | None = None) -> LaunchPlan:
    """A plan from a torchtitan TOML job config.

    The model is ``spec`` if given, else the shape in tuner's ``# tuner:`` line. The world size is
    ``devices`` if given, else the product of the degrees when none is ``-1``, else the header's.
    Raises :class:`LaunchError` (one line) for a file tuner cannot read or a plan it does not model.
    """
    meta = read_header(text, source)
    doc = _load_toml(text, source)
    for sec in ("training", "parallelism", "activation_checkpoint", "model"):
        if not isinstance(doc.get(sec, {}), dict):
            raise LaunchError(f"{source}: [{sec}] must be a table")
    tr, par, ac = doc.get("training", {}), doc.get("parallelism", {}), doc.get("activation_checkpoint", {})
    spec = spec or spec_from_header(meta, source)
    notes: list[str] = []
    if spec is None:
        model = doc.get("model", {})
        spec = flavor_spec(model.get("name", "") if model else None, model.get("flavor", ""),
                           _int(tr, "seq_len", "training", source, 2048), source, notes)
    seq = _int(tr, "seq_len", "training", source, spec.seq)
    if seq != spec.seq:
        spec = replace(spec, seq=seq)
    dtype = {"bfloat16": "bf16", "float32": "fp32"}.get(str(tr.get("mixed_precision_param", "bfloat16")))
    if dtype is None:
        raise LaunchError(f"{source}: [training] mixed_precision_param must be bfloat16 or float32 "
                          f"(got {tr['mixed_precision_param']!r})")
    spec = replace(spec, dtype=dtype)  # type: ignore[arg-type]
    converters = doc.get("model", {}).get("converters", [])
    if "float8" in (converters if isinstance(converters, list) else [converters]):
        spec = replace(spec, fp8_linear=True)
        notes.append("Float8 linears (torchao) read as tuner's FP8 linears (the layers' GEMMs at the fp8 peak)")
        # v0.1's [float8], v0.2's [quantize.linear.float8]: FSDP gathers the layers' weights in float8
        float8 = doc.get("float8") or ((doc.get("quantize") or {}).get("linear") or {}).get("float8") or {}
        if isinstance(float8, dict) and float8.get("enable_fsdp_float8_all_gather") is True:
            spec = replace(spec, fp8_params=True)
        recipe = float8.get("recipe_name") if isinstance(float8, dict) else None
        if recipe not in (None, "tensorwise"):  # rowwise, rowwise_with_gw_hp
            notes.append(f"float8 recipe_name {recipe}: priced as tensor-wise scaling (one cast per GEMM input at the "
                         "fp8 peak); row-wise scales' kernels are not modelled")
    tp = _int(par, "tensor_parallel_degree", "parallelism", source, 1)
    pp = _int(par, "pipeline_parallel_degree", "parallelism", source, 1)
    cp = _int(par, "context_parallel_degree", "parallelism", source, 1)
    ep = _int(par, "expert_parallel_degree", "parallelism", source, 1)
    rep = _int(par, "data_parallel_replicate_degree", "parallelism", source, 1)
    shard = _int(par, "data_parallel_shard_degree", "parallelism", source, -1)
    world, dp, shard = world_and_data_parallel(dict(tp=tp, pp=pp, cp=cp, ep=ep, replicate=rep, shard=shard),
                                               devices, meta, source)
    local = _int(tr, "local_batch_size", "training", source, 8)
    gb = _int(tr, "global_batch_size", "training", source, -1)
    if gb < 1:
        gb = local * dp
    sched, v, stage_layers = "1f1b", 1, None
    mb = local
    if pp > 1:
        mb = _int(par, "pipeline_parallel_microbatch_size", "parallelism", source, 1)
        per = par.get("pipeline_parallel_layers_per_stage")
        if per is not None:
            per = _int(par, "pipeline_parallel_layers_per_stage", "parallelism", source, 1)
        schedule = str(par.get("pipeline_parallel_schedule", "1F1B"))
        if par.get("module_fqns_per_model_part") is not None:
            v, stage_layers = part_chunks(spec.layers, pp, schedule, par["module_fqns_per_model_part"], source)
        else:
            v, stage_layers = pipeline_chunks(spec, pp, schedule, per,
                                              _int(par, "pipeline_parallel_first_stage_less_layers", "parallelism",
                                                   source, 1),
                                              _int(par, "pipeline_parallel_last_stage_less_layers", "parallelism",
                                                   source, 1),
                                              source)
        sched = "interleaved" if v > 1 else "1f1b"
        if local * dp != gb:
            notes.append("gradient accumulation over pipeline runs read as one pipeline of all micro-batches")
    mode = str(ac.get("mode", "selective"))
    if mode not in ("none", "selective", "full"):
        raise LaunchError(f"{source}: [activation_checkpoint] mode {mode!r}: tuner models none, selective and full")
    option = str(ac.get("selective_ac_option", "2"))  # torchtitan's default: every second layer
    recompute_layers = None
    if mode == "selective" and option == "op":
        mode = "op"
    elif mode == "selective":
        if not option.isdigit() or int(option) < 1:
            raise LaunchError(f"{source}: [activation_checkpoint] selective_ac_option must be \"op\" or a positive "
                              f"integer (got {option!r})")
        every = int(option)
        count = (max(stage_layers) if stage_layers else spec.layers // (pp * v)) // every  # every n-th layer of a chunk
        mode = "full" if count else "none"
        recompute_layers = count if count and every > 1 else None
    sharding_notes(shard * cp > 1, pp, notes)
    if tr.get("enable_cpu_offload", False):
        notes.append(CPU_OFFLOAD_NOTE)
    if isinstance(doc.get("compile"), dict) and compiled_parts(doc["compile"], notes):
        spec = replace(spec, fused_loss=True)
    if par.get("enable_async_tensor_parallel", False) and tp > 1:
        notes.append(ASYNC_TP_NOTE)
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, micro_batch=mb, global_batch=gb, schedule=sched,  # type: ignore[arg-type]
                        virtual_stages=v if v > 1 else 2, recompute=mode, ep=ep,  # type: ignore[arg-type]
                        recompute_layers=recompute_layers, stage_layers=stage_layers,
                        expert_tp=_expert_tp(par, tp, source) if spec.moe is not None else None,
                        distributed_optimizer=shard * cp > 1, cp=cp,
                        tp_comm_overlap=bool(par.get("enable_async_tensor_parallel", False)),
                        fsdp_reshard_after_forward=reshard_after_forward(
                            par.get("fsdp_reshard_after_forward", "default"), pp, source),
                        fsdp_shard=hsdp_shard(rep, shard, cp, pp, spec, notes))
    # as torchtitan runs it, with the checkpointing the file names (torchtitan_plan turns selective into op)
    return LaunchPlan(spec, replace(torchtitan_plan(plan, spec), recompute=plan.recompute,
                                    recompute_layers=plan.recompute_layers), world, header_str(meta, "platform", source),
                      header_int(meta, "devices_per_node", source), (), tuple(notes))


def _expert_tp(par: dict, tp: int, source: str) -> int | None:
    """``expert_tensor_parallel_degree`` of a TOML of the torchtitan versions that had it (None where absent:
    :func:`torchtitan_plan` places an MoE model's experts as torchtitan does)."""
    if "expert_tensor_parallel_degree" not in par:
        return None
    name = "expert_tensor_parallel_degree"
    return expert_tp_degree(_int(par, name, "parallelism", source, 1), tp, name, source)


def read_torchtitan_file(path: Path, *, devices: int | None = None, spec: TransformerSpec | None = None) -> LaunchPlan:
    """:func:`read_torchtitan_toml` of a file; raises :class:`LaunchError` for a missing or binary file."""
    text = read_launch_text(path, "a TOML file")
    return read_torchtitan_toml(text, str(path), devices=devices, spec=spec)
