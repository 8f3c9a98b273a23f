"""A tuner plan as Megatron-LM command-line arguments, and such arguments read back as a plan.

The flags are those of Megatron-LM's ``megatron/training/arguments.py`` (and the config dataclasses
it turns into flags: ``ModelParallelConfig``, ``TransformerConfig``, ``TrainingConfig``), checked
against its main branch of 2026-08. :func:`megatron_args` is the argument list of one plan;
:func:`megatron_launch_text` adds a ``torchrun`` line and tuner's comment header;
:func:`read_megatron_args` parses a launch script or argument list (flags it does not model are
skipped and listed) into a :class:`~tuner.launch.common.LaunchPlan`.

Mapping (tuner field -> flag): ``tp`` ``--tensor-model-parallel-size``; ``pp``
``--pipeline-model-parallel-size``; ``dp`` = world size / (tp x pp) (Megatron derives it);
interleaved ``virtual_stages`` ``--num-layers-per-virtual-pipeline-stage`` = layers / (pp x v)
(``--num-virtual-stages-per-pipeline-rank`` v with an uneven split); ``stage_layers``
``--decoder-first/last-pipeline-num-layers`` or ``--account-for-embedding/loss-in-pipeline-split``
(:func:`~tuner.launch.megatron_split.megatron_stage_layers`);
``recompute`` ``--recompute-granularity selective`` or ``full`` with ``--recompute-method uniform
--recompute-num-layers 1``; ``fsdp`` ``--use-megatron-fsdp --data-parallel-sharding-strategy
optim_grads_params`` (``--use-torch-fsdp2`` reads as it too); ``grad_reduce_dtype`` bf16 ``--grad-reduce-in-bf16`` (fp32 is
Megatron's default for bf16 training); ``optimizer_state`` ``--use-precision-aware-optimizer`` with
bf16 moments (``--exp-avg-dtype``, ``--exp-avg-sq-dtype``) and, for ``"bf16"``,
``--main-params-dtype fp16``. ``pp_scatter_gather`` has no flag in current Megatron-LM and reads
back as tuner's default.

Megatron-DeepSpeed launches (BigScience's BLOOM scripts and their descendants) read too:
``--checkpoint-activations`` is full recomputation of every layer; ``--position-embedding-type alibi``
reads as no position embedding (ALiBi's bias enters the attention scores, no kernel of its own);
``--pad-vocab-size-to`` is the vocabulary; attention is Megatron's unfused path (FlashAttention-2 with
``--use-flash-attn``); ``--pp-partition-method 'type:transformer|embedding'`` counts
the embedding and the tied output layer as pipeline layers (Megatron's embedding-and-loss split);
``--deepspeed`` with ``--zero-stage`` 1 or 2 shards the optimizer state (tuner's distributed optimizer), 0
with ``--bf16`` is DeepSpeed's BF16 optimizer (``deepspeed_bf16``), stage 3 reads as FSDP, and with ``pp``
> 1 its pipeline engine sends each TP rank's whole activation (``pp_scatter_gather`` off).
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from predictor.sources.synth.transformer import MLASpec, ParallelPlan, TransformerSpec
from predictor.sources.synth.transformer_spec import RECOMPUTE_MODULES
from tuner.launch.common import (
    OFFLOAD_NOTE,
    LaunchError,
    LaunchPlan,
    expert_tp_degree,
    fp8_recipe_note,
    header_int,
    header_line,
    header_str,
    read_header,
    read_launch_text,
    tokenizer_vocab,
)
from tuner.launch.megatron_moe import (
    MOE_FLOAT_FLAGS,
    MOE_INT_FLAGS,
    MOE_STR_FLAGS,
    MOE_SWITCHES,
    moe_args,
    read_moe,
)
from tuner.launch.megatron_split import (
    LAYOUT_FLAG,
    PP_PARTITIONS,
    counted_ends,
    layout_stage_layers,
    megatron_stage_layers,
    split_flags,
)
from tuner.launch.shell import shell_words

__all__ = ["megatron_args", "megatron_command", "megatron_launch_text", "read_megatron_args", "read_megatron_file",
           "slurm_allocation", "GPT2_VOCAB"]

#: Megatron-LM's GPT examples tokenise with GPT-2 BPE: the vocabulary when no --vocab-size is given
GPT2_VOCAB = 50257
#: Megatron-LM's --hidden-dropout and --attention-dropout default
MEGATRON_DROPOUT = 0.1
#: the vocabulary of Megatron-LM's --tokenizer-type values whose size is fixed (others read their files)
TOKENIZER_VOCAB = {"GPT2BPETokenizer": GPT2_VOCAB, "Llama2Tokenizer": 32000}

# flags that take a value (everything else starting with -- is a switch)
_INT_FLAGS = {
    "--num-layers": "layers", "--hidden-size": "hidden", "--ffn-hidden-size": "ffn",
    "--num-attention-heads": "heads", "--seq-length": "seq", "--vocab-size": "vocab",
    "--tensor-model-parallel-size": "tp", "--pipeline-model-parallel-size": "pp",
    "--num-layers-per-virtual-pipeline-stage": "layers_per_virtual_stage",
    "--num-virtual-stages-per-pipeline-rank": "virtual_stages",
    "--micro-batch-size": "micro_batch", "--global-batch-size": "global_batch",
    "--expert-model-parallel-size": "ep", "--expert-tensor-parallel-size": "expert_tp",
    "--kv-channels": "kv_channels", "--q-lora-rank": "q_lora_rank", "--kv-lora-rank": "kv_lora_rank",
    "--qk-head-dim": "qk_head_dim", "--qk-pos-emb-head-dim": "rope_head_dim", "--v-head-dim": "v_head_dim",
    "--recompute-num-layers": "recompute_num_layers", "--context-parallel-size": "cp",
    "--max-position-embeddings": "max_positions", "--data-parallel-size": "dp", "--num-query-groups": "kv_heads",
    "--decoder-first-pipeline-num-layers": "first_stage_layers", "--decoder-last-pipeline-num-layers": "last_stage_layers",
    "--pad-vocab-size-to": "pad_vocab", "--zero-stage": "zero_stage", "--checkpoint-num-layers": "checkpoint_num_layers",
    "--mtp-num-layers": "mtp_layers", **MOE_INT_FLAGS,
}
_FLOAT_FLAGS = {"--hidden-dropout": "hidden_dropout", "--attention-dropout": "attention_dropout", **MOE_FLOAT_FLAGS}
_STR_FLAGS = {"--recompute-granularity": "recompute", "--recompute-method": "recompute_method",
              "--attention-backend": "attention_backend", "--data-parallel-sharding-strategy": "dp_sharding",
              "--fp8-format": "fp8_format", "--fp8-recipe": "fp8_recipe", "--main-params-dtype": "main_params_dtype",
              "--exp-avg-dtype": "exp_avg_dtype", "--exp-avg-sq-dtype": "exp_avg_sq_dtype",
              "--tokenizer-type": "tokenizer", "--tokenizer-model": "tokenizer_model",
              "--position-embedding-type": "position", "--pp-partition-method": "pp_partition",
              "--transformer-impl": "transformer_impl", "--cp-comm-type": "cp_comm_type",
              LAYOUT_FLAG: "pp_layout", **MOE_STR_FLAGS}
_SWITCHES = {"--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce", "--tp-comm-overlap",
             "--overlap-param-gather", "--no-align-param-gather",
             "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32", "--bf16", "--fp16", "--fp8-param-gather",
             "--untie-embeddings-and-output-weights", "--use-flash-attn", "--recompute-activations",
             "--use-megatron-fsdp", "--use-torch-fsdp2", "--swiglu", "--group-query-attention",
             "--use-precision-aware-optimizer", "--multi-latent-attention", "--disable-bias-linear",
             "--add-bias-linear", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
             "--checkpoint-activations", "--deepspeed", "--no-pipeline-parallel", *MOE_SWITCHES}
_TORCHRUN_INT = {"--nnodes": "nnodes", "--nproc-per-node": "nproc", "--nproc_per_node": "nproc"}
# flags tuner does not model: read as the nearest model or plan it does, with a note
_APPROXIMATED = {
    "--normalization": "the normalisation read as LayerNorm",
    "--squared-relu": "squared ReLU read as GeLU (the same two-matrix MLP)",
    "--cpu-offloading": f"--cpu-offloading {OFFLOAD_NOTE}",
    "--cpu-offloading-num-layers": f"--cpu-offloading {OFFLOAD_NOTE}",
    "--fine-grained-activation-offloading": "--fine-grained-activation-offloading is not modelled: activations "
                                            "priced as kept on the GPU",
}
_KINDS: dict[str, type] = {**dict.fromkeys(_INT_FLAGS, int), **dict.fromkeys(_FLOAT_FLAGS, float),
                           **dict.fromkeys(_STR_FLAGS, str), **dict.fromkeys(_TORCHRUN_INT, int)}
_VALUE_KEYS = {**_INT_FLAGS, **_FLOAT_FLAGS, **_STR_FLAGS}


# ----------------------------------------------------------------------------- uneven pipeline splits
def _stage_layers(values: dict, layers: int, pp: int, v: int, source: str, notes: list[str]) -> tuple[int, ...] | None:
    """The split the launch's flags ask for (None: even)."""
    method = values.get("pp_partition")
    if PP_PARTITIONS.get(method or "type:transformer") is None:
        notes.append(f"--pp-partition-method {method} read as an even split of the transformer layers")
    first = _positive(values, "first_stage_layers", "--decoder-first-pipeline-num-layers", source) \
        if "first_stage_layers" in values else None
    last = _positive(values, "last_stage_layers", "--decoder-last-pipeline-num-layers", source) \
        if "last_stage_layers" in values else None
    embedding, loss = counted_ends(values)
    try:
        return megatron_stage_layers(layers, pp, v, first=first, last=last, embedding=embedding, loss=loss)
    except ValueError as err:
        raise LaunchError(f"{source}: {err}") from None


# ----------------------------------------------------------------------------- plan -> arguments
def megatron_args(spec: TransformerSpec, plan: ParallelPlan) -> list[str]:
    """Megatron-LM's arguments for training ``spec`` with ``plan`` (model shape, parallelism, batch, memory)."""
    a = ["--num-layers", str(spec.layers), "--hidden-size", str(spec.hidden), "--ffn-hidden-size", str(spec.ffn_size),
         "--num-attention-heads", str(spec.heads), "--seq-length", str(spec.seq), "--max-position-embeddings",
         str(spec.seq), "--vocab-size", str(spec.vocab), "--attention-backend",
         {"unfused": "unfused", "cudnn": "fused", "te": "auto"}.get(spec.attention, "flash")]
    if spec.kv_heads_count != spec.heads:
        a += ["--group-query-attention", "--num-query-groups", str(spec.kv_heads_count)]
    if spec.kv_channels:
        a += ["--kv-channels", str(spec.kv_channels)]
    if spec.mla is not None:
        m = spec.mla
        a += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim", str(m.qk_head_dim),
              "--qk-pos-emb-head-dim", str(m.rope_head_dim), "--v-head-dim", str(m.v_head_dim)]
        if m.q_lora_rank:
            a += ["--q-lora-rank", str(m.q_lora_rank)]
    if spec.mlp == "swiglu":
        a.append("--swiglu")
    if not spec.bias:
        a.append("--disable-bias-linear")
    if spec.position != "learned":
        a += ["--position-embedding-type", spec.position]
    if spec.dropout != MEGATRON_DROPOUT:
        a += ["--hidden-dropout", f"{spec.dropout:g}", "--attention-dropout", f"{spec.dropout:g}"]
    if spec.fp8_linear:
        a += ["--fp8-format", "hybrid"]
    if spec.fp8_params:
        a.append("--fp8-param-gather")
    if not spec.tie_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if spec.dtype != "fp32":
        a.append(f"--{spec.dtype}")
    a += moe_args(spec, plan)
    if spec.mtp_layers:
        a += ["--mtp-num-layers", str(spec.mtp_layers)]
    a += ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp)]
    if plan.cp > 1:
        a += ["--context-parallel-size", str(plan.cp)]
    v = plan.virtual_stages_effective
    split = split_flags(spec.layers, plan, spec.mtp_layers)
    if v > 1 and LAYOUT_FLAG not in split:  # a layout names the virtual stages itself (Megatron takes no VP flag with it)
        a += (["--num-layers-per-virtual-pipeline-stage", str(plan.chunk_layers(spec.layers))]
              if plan.stage_layers is None else ["--num-virtual-stages-per-pipeline-rank", str(v)])
    a += split
    if plan.sequence_parallel and plan.tp > 1:
        a.append("--sequence-parallel")
    a += ["--micro-batch-size", str(plan.micro_batch), "--global-batch-size", str(plan.global_batch)]
    if plan.recompute in ("selective", "op"):  # Megatron has no op-level checkpointing: its selective
        a += ["--recompute-granularity", "selective"]
        if plan.recompute_modules:
            a += ["--recompute-modules", *plan.recompute_modules]
    elif plan.recompute == "full" and plan.recompute_layers is not None:
        a += ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
              str(plan.recompute_layers)]
    elif plan.recompute == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if plan.distributed_optimizer:
        a.append("--use-distributed-optimizer")
    if plan.fsdp2:
        a.append("--use-torch-fsdp2")
    elif plan.fsdp:
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
    if plan.overlap_grad_reduce:
        a.append("--overlap-grad-reduce")
    if plan.gathers_params_in_forward:
        a.append("--overlap-param-gather")
        if not plan.align_param_gather and plan.virtual_stages_effective > 1:
            a.append("--no-align-param-gather")
    if plan.tp_comm_overlap:
        a.append("--tp-comm-overlap")
    if plan.optimizer_state != "fp32":
        a += ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
        if plan.optimizer_state == "bf16":  # Megatron's only 16-bit master copy
            a += ["--main-params-dtype", "fp16"]
    if plan.grad_reduce_dtype == "bf16":
        a.append("--grad-reduce-in-bf16")
    elif plan.grad_reduce_dtype == "fp32" and spec.dtype == "fp16":
        a.append("--accumulate-allreduce-grads-in-fp32")
    return a


def megatron_command(spec: TransformerSpec, plan: ParallelPlan, devices_per_node: int,
                     script: str = "pretrain_gpt.py") -> list[str]:
    """``torchrun`` over ``plan.devices`` devices (``devices_per_node`` per node) running ``script`` with the plan."""
    # torchrun starts the same count on every node: the largest that divides the world and fits a node
    nproc = math.gcd(plan.devices, max(devices_per_node, 1))
    nodes = plan.devices // nproc
    return ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(nproc), script, *megatron_args(spec, plan)]


def megatron_launch_text(spec: TransformerSpec, plan: ParallelPlan, *, platform: str, devices_per_node: int,
                         predicted_s: float | None = None) -> str:
    """The ``megatron_args.txt`` file: comments (plan, prediction, tuner's header) and the torchrun command,
    one flag per line."""
    cmd = megatron_command(spec, plan, devices_per_node)
    said = f", predicted {predicted_s:.4f} s/iteration by tuner" if predicted_s is not None else ""
    lines = [f"# Megatron-LM launch of {spec.name} plan {plan.label()} on {plan.devices} x {platform}{said}",
             header_line({"model_name": spec.name, "platform": platform, "devices_per_node": devices_per_node,
                          "devices": plan.devices})]
    if plan.recompute == "op":
        lines.insert(1, "# torchtitan's op-level checkpointing has no Megatron-LM flag: written as selective "
                        "recomputation, which reads back as tuner's selective")
    if spec.attention in ("flex", "flash_triton"):
        lines.insert(1, f"# attention {spec.attention} has no Megatron-LM backend: written as --attention-backend "
                        "flash (FlashAttention-2)")
    if plan.fsdp and plan.fsdp_fp32_params and not plan.fsdp2:
        lines.insert(1, "# PyTorch FSDP1 (fp32 parameter shards as the master weights) has no Megatron-LM flag: "
                        "written as Megatron-FSDP, which reads back as that")
    if plan.fsdp and plan.fsdp_shard is not None:
        lines.insert(1, f"# HSDP (shard over {plan.fsdp_shard} data-parallel ranks, replicate across) has no Megatron-LM "
                        "flag: written as full sharding, which reads back as that")
    if plan.fsdp_sharded and not plan.fsdp_reshard_after_forward:
        lines.insert(1, "# FSDP keeping each layer's parameters gathered to its backward (SHARD_GRAD_OP) has no "
                        "Megatron-LM flag: written as full sharding, which reads back as that")
    if plan.deepspeed_bf16_grads:
        lines.insert(1, "# DeepSpeed's BF16 optimizer has no Megatron-LM flag: written as Megatron's distributed "
                        "optimizer, and read back as that (reduce-scattered gradients, no bf16 copy)")
    head = shlex.join(cmd[:6])
    rest = cmd[6:]
    parts = [head]
    i = 0
    while i < len(rest):
        takes_value = i + 1 < len(rest) and not rest[i + 1].startswith("--")
        parts.append(shlex.join(rest[i:i + 2] if takes_value else rest[i:i + 1]))
        i += 2 if takes_value else 1
    lines.append(" \\\n    ".join(parts))
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- arguments -> plan
#: a shell word assigning a string that holds flags (``GPT_ARGS="--num-layers 70 ..."``, ``CMD="... $GPT_ARGS"``)
_ASSIGNED_FLAGS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=(.*--[a-z].*)$", re.DOTALL)


def _tokens(text: str, source: str) -> list[str]:
    """Shell words of a launch script (:func:`tuner.launch.shell.shell_words`); a variable holding arguments as
    one string, as BigScience's Megatron-DeepSpeed scripts keep them, stands for its words."""
    try:
        words = shell_words(text)
        out: list[str] = []
        for w in words:
            m = _ASSIGNED_FLAGS.match(w)
            out += shlex.split(m.group(1)) if m else [w]
        return out
    except ValueError as exc:
        raise LaunchError(f"{source}: cannot split into shell words ({exc})") from None


def _parse(tokens: Sequence[str], source: str) -> tuple[dict, dict, list[str]]:
    """(Megatron values, torchrun values, skipped flags) of the argument words."""
    values: dict = {}
    launcher: dict = {}
    skipped: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            i += 1
            continue
        name, eq, inline = tok.partition("=")
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        has_next = nxt is not None and not nxt.startswith("--")
        if name in _KINDS:
            raw = inline if eq else (nxt if has_next else None)
            if raw is None:
                raise LaunchError(f"{source}: {name} needs a value")
            try:
                val = _KINDS[name](raw)
            except ValueError:
                if name in _TORCHRUN_INT:  # torchrun's gpu / auto / min:max and shell variables: size unknown
                    i += 1 if eq else 2
                    continue
                what = {int: "an integer", float: "a number", str: "a word"}[_KINDS[name]]
                hint = " (a shell variable the file does not set)" if raw.startswith("$") else ""
                raise LaunchError(f"{source}: {name} expects {what} (got {raw!r}){hint}") from None
            key = _VALUE_KEYS.get(name)
            if key is not None:
                values[key] = val
            else:
                launcher[_TORCHRUN_INT[name]] = val
            i += 1 if eq else 2
            continue
        if name == "--recompute-modules":  # a list of words, up to the next flag
            words = inline.split() if eq else []
            j = i + 1
            while not eq and j < len(tokens) and not tokens[j].startswith("--"):
                words.append(tokens[j])
                j += 1
            values["recompute_modules"] = tuple(words)  # argparse: the last occurrence wins
            i = i + 1 if eq else j
            continue
        if name in _SWITCHES:
            values[name] = True
        else:
            skipped.append(name)
        # an unknown flag's value (if any) is skipped with it
        i += 1 if eq or not has_next else 2
    return values, launcher, skipped


#: every Megatron flag the reader takes a value or a switch from (torchrun's, which it abbreviates, aside)
_READ_FLAGS = (*_VALUE_KEYS, *_SWITCHES, "--recompute-modules")


def _refuse_misspelt(skipped: list[str], source: str) -> None:
    """LaunchError for a flag tuner skips that is one typo away from one it reads (Megatron's argparse, without
    abbreviations, refuses such a flag; read as skipped it would silently leave the default in place)."""
    def variant(a: str, b: str) -> bool:
        """Megatron's own near-twins: ``--fp4-param-gather`` / ``--fp8-...``, ``--x`` / ``--no-x``."""
        bare = (re.sub(r"\d", "", a), re.sub(r"\d", "", b))
        return bare[0] == bare[1] or any(x.replace("--", f"--{neg}-", 1) == y for x, y in ((a, b), (b, a))
                                         for neg in ("no", "disable"))

    for flag in skipped:
        close = difflib.get_close_matches(flag, _READ_FLAGS, n=1, cutoff=0.92)
        if close and close[0] != flag and not variant(flag, close[0]):
            raise LaunchError(f"{source}: unknown flag {flag} (did you mean {close[0]}?)")


def _positive(values: dict, key: str, flag: str, source: str, default: int | None = None) -> int:
    val = values.get(key, default)
    if val is None:
        raise LaunchError(f"{source}: {flag} is missing (tuner needs the model shape and the micro-batch)")
    if val < 1:
        raise LaunchError(f"{source}: {flag} must be >= 1 (got {val})")
    return int(val)


def _spec(values: dict, source: str, name: str, notes: list[str]) -> TransformerSpec:
    layers = _positive(values, "layers", "--num-layers", source)
    hidden = _positive(values, "hidden", "--hidden-size", source)
    heads = _positive(values, "heads", "--num-attention-heads", source)
    seq = _positive(values, "seq", "--seq-length", source)
    tokenizer, tokenizer_model = values.get("tokenizer"), values.get("tokenizer_model")
    default_vocab = TOKENIZER_VOCAB.get(tokenizer, GPT2_VOCAB)
    known = tokenizer_vocab(tokenizer_model) if tokenizer not in TOKENIZER_VOCAB and tokenizer_model else None
    if "vocab" not in values and "pad_vocab" in values:  # Megatron-DeepSpeed: the tokenizer's size padded to this
        default_vocab = _positive(values, "pad_vocab", "--pad-vocab-size-to", source)
    elif "vocab" not in values and tokenizer in TOKENIZER_VOCAB:
        notes.append(f"no --vocab-size: {tokenizer}'s {default_vocab} tokens")
    elif "vocab" not in values and known is not None:  # a Hugging Face tokenizer tuner knows by name
        default_vocab = known
        notes.append(f"no --vocab-size: --tokenizer-model {tokenizer_model}'s {known} tokens")
    elif "vocab" not in values:
        told = f" (--tokenizer-type {tokenizer}: its size is in its files)" if tokenizer else ""
        notes.append(f"no --vocab-size: GPT-2 BPE's {GPT2_VOCAB} tokens assumed{told}")
    vocab = _positive(values, "vocab", "--vocab-size", source, default_vocab)
    ffn = values.get("ffn")
    mlp = "swiglu" if values.get("--swiglu") else "gelu"
    if ffn is None and mlp == "swiglu":  # Megatron's SwiGLU default: 2/3 of 4 h, down to a multiple of 64
        ffn = int(4 * hidden * 2 / 3 / 64) * 64
    kv_heads = None
    if values.get("--group-query-attention"):
        kv_heads = _positive(values, "kv_heads", "--num-query-groups", source, 1)
        if heads % kv_heads:
            raise LaunchError(f"{source}: --num-attention-heads {heads} is not a multiple of --num-query-groups {kv_heads}")
    elif "kv_heads" in values:
        notes.append("--num-query-groups without --group-query-attention: Megatron runs multi-head attention")
    dtype = "bf16" if values.get("--bf16") else "fp16" if values.get("--fp16") else "fp32"
    backend = values.get("attention_backend")
    # fused: Transformer Engine's FusedAttention, cuDNN's kernels; auto (Megatron's default): TE's choice
    attention = {"unfused": "unfused", "local": "unfused", "fused": "cudnn", "flash": "flash"}.get(backend or "auto",
                                                                                                   "te")
    impl = values.get("transformer_impl", "transformer_engine")
    if impl not in ("transformer_engine", "local"):
        raise LaunchError(f"{source}: --transformer-impl must be transformer_engine or local (got {impl!r})")
    if backend is None and (values.get("--deepspeed") or impl == "local"):  # no Transformer Engine: Megatron's own
        attention = "flash2" if values.get("--use-flash-attn") else "unfused"  # core attention, or flash-attn's
    if values.get("cp_comm_type", "p2p") != "p2p":  # a2a, allgather, a2a+p2p
        notes.append(f"--cp-comm-type {values['cp_comm_type']}: context parallelism priced as the p2p ring of keys "
                     "and values (Megatron's default)")
    moe = read_moe(values, layers, source, notes)
    fp8 = values.get("fp8_format")
    if fp8 is not None and fp8 not in ("hybrid", "e4m3"):
        raise LaunchError(f"{source}: --fp8-format must be hybrid or e4m3 (got {fp8!r})")
    if values.get("--fp8-param-gather") and fp8 is None:
        raise LaunchError(f"{source}: --fp8-param-gather needs --fp8-format (fp8 weights are FP8 linears' own)")
    recipe = fp8_recipe_note("--fp8-recipe", values.get("fp8_recipe")) if fp8 is not None else None
    if recipe:
        notes.append(recipe)
    kv_channels = _positive(values, "kv_channels", "--kv-channels", source) if "kv_channels" in values else None
    if kv_channels is not None and heads * kv_channels == hidden:
        kv_channels = None  # Megatron's default, hidden / heads
    return TransformerSpec(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, fp8_linear=fp8 is not None,
                           fp8_params=bool(values.get("--fp8-param-gather")),
                           kv_channels=kv_channels, mla=_mla(values, source),
                           ffn=None if ffn is None or ffn == 4 * hidden else int(ffn), moe=moe, dtype=dtype,
                           kv_heads=None if kv_heads in (None, heads) else kv_heads, mlp=mlp,
                           attention=attention, tie_embeddings=not values.get("--untie-embeddings-and-output-weights"),
                           dropout=_dropout(values, source, notes), bias=not values.get("--disable-bias-linear"),
                           position=_position(values.get("position", "learned_absolute"), source, notes), name=name,
                           mtp_layers=values.get("mtp_layers", 0))


#: Megatron-LM's --position-embedding-type values -> tuner's position
POSITIONS = {"learned_absolute": "learned", "rope": "rope", "none": "none"}
#: the values tuner does not model -> the nearest position it does (read with a note)
NEAREST_POSITIONS = {"mrope": "rope", "relative": "none", "alibi": "none"}


def _position(value: str, source: str, notes: list[str]) -> str:
    """tuner's ``position`` of Megatron's ``--position-embedding-type``."""
    if value in NEAREST_POSITIONS:
        notes.append(f"--position-embedding-type {value} read as {NEAREST_POSITIONS[value]}")
        return NEAREST_POSITIONS[value]
    if value not in POSITIONS:
        known = ", ".join([*POSITIONS, *NEAREST_POSITIONS])
        raise LaunchError(f"{source}: --position-embedding-type must be one of {known} (got {value!r})")
    return POSITIONS[value]


def _dropout(values: dict, source: str, notes: list[str]) -> float:
    """The model's dropout probability: ``--hidden-dropout`` (Megatron's default 0.1); a different
    ``--attention-dropout`` is noted, as tuner prices one probability."""
    hidden = values.get("hidden_dropout", MEGATRON_DROPOUT)
    attention = values.get("attention_dropout", MEGATRON_DROPOUT)
    for flag, p in (("--hidden-dropout", hidden), ("--attention-dropout", attention)):
        if not 0.0 <= p < 1.0:
            raise LaunchError(f"{source}: {flag} must be a probability in [0, 1) (got {p:g})")
    if (hidden > 0) != (attention > 0):
        notes.append(f"--attention-dropout {attention:g} read as --hidden-dropout's {hidden:g} "
                     "(one dropout probability for the model)")
    return float(hidden)


#: Megatron-LM's multi-latent attention defaults (MLATransformerConfig): kv_lora_rank 32, qk_head_dim 128,
#: qk_pos_emb_head_dim 64, v_head_dim 128, no query latent
MLA_DEFAULTS = {"kv_lora_rank": ("--kv-lora-rank", 32), "qk_head_dim": ("--qk-head-dim", 128),
                "rope_head_dim": ("--qk-pos-emb-head-dim", 64), "v_head_dim": ("--v-head-dim", 128)}


def _mla(values: dict, source: str) -> MLASpec | None:
    """Multi-latent attention of ``--multi-latent-attention`` and its sizes (Megatron's defaults where absent)."""
    if not values.get("--multi-latent-attention"):
        return None
    sizes = {k: _positive(values, k, flag, source, d) for k, (flag, d) in MLA_DEFAULTS.items()}
    q = _positive(values, "q_lora_rank", "--q-lora-rank", source) if "q_lora_rank" in values else 0
    return MLASpec(q_lora_rank=q, **sizes)


def _recompute(values: dict, source: str, notes: list[str]) -> str:
    gran = values.get("recompute")
    if gran is None and values.get("--checkpoint-activations"):  # Megatron-LM before 2022, Megatron-DeepSpeed
        if values.get("checkpoint_num_layers", 1) != 1:
            notes.append("--checkpoint-num-layers > 1 read as every layer recomputed, each from its own input")
        return "full"
    if gran is None:  # Megatron reads --recompute-activations as selective granularity
        return "selective" if values.get("--recompute-activations") else "none"
    if gran not in ("selective", "full"):
        raise LaunchError(f"{source}: --recompute-granularity must be selective or full (got {gran!r})")
    return gran


def _recompute_modules(values: dict, recompute: str, spec: TransformerSpec, notes: list[str]) -> tuple[str, ...]:
    """The modules ``--recompute-modules`` names that apply to ``spec`` under selective recomputation (the rest in a
    note: Megatron applies them to none of this model's modules, or tuner does not model them)."""
    named = tuple(dict.fromkeys(values.get("recompute_modules", ())))
    if not named:
        return ()
    if recompute != "selective":
        notes.append("--recompute-modules without --recompute-granularity selective: Megatron ignores it")
        return ()
    applies = {"mla_up_proj": spec.mla is not None, "moe": spec.moe is not None, "moe_act": spec.moe is not None,
               "shared_experts": spec.moe is not None and spec.moe.shared_ffn > 0}
    kept = tuple(m for m in named if m in RECOMPUTE_MODULES and applies.get(m, True))
    rest = [m for m in named if m not in kept]
    if rest:
        notes.append(f"--recompute-modules {' '.join(rest)}: not modules of this model tuner recomputes; their "
                     "activations priced as kept")
    return () if kept == ("core_attn",) else kept  # Megatron's default, the plan's empty list


def _optimizer_state(values: dict, source: str, notes: list[str]) -> str:
    """tuner's ``optimizer_state`` of Megatron's precision-aware optimizer flags (fp32 without the switch)."""
    names = ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
    allowed = {"main_params_dtype": ("fp32", "fp16"), "exp_avg_dtype": ("fp32", "fp16", "bf16", "fp8"),
               "exp_avg_sq_dtype": ("fp32", "fp16", "bf16", "fp8")}
    for k in names:
        if k in values and values[k] not in allowed[k]:
            flag = "--" + k.replace("_", "-")
            raise LaunchError(f"{source}: {flag} must be one of {', '.join(allowed[k])} (got {values[k]!r})")
    if not values.get("--use-precision-aware-optimizer"):
        if any(k in values for k in names):
            notes.append("optimizer dtypes without --use-precision-aware-optimizer: Megatron keeps an fp32 state")
        return "fp32"
    moments = [values.get(k, "fp32") for k in names[1:]]
    if "fp8" in moments:
        notes.append("fp8 Adam moments read as 16-bit ones")
    if any(m == "fp32" for m in moments):
        if any(m != "fp32" for m in moments) or values.get("main_params_dtype", "fp32") != "fp32":
            notes.append("a partly 16-bit optimizer state read as tuner's fp32 one (both moments must be 16-bit)")
        return "fp32"
    return "bf16" if values.get("main_params_dtype") == "fp16" else "bf16_moments"


def _fsdp(values: dict, notes: list[str]) -> tuple[bool, bool, bool]:
    """(FSDP full shard, optimizer sharding, PyTorch's FSDP2) of Megatron-FSDP's or torch FSDP2's flags."""
    if values.get("--use-torch-fsdp2"):
        return True, False, True
    if not values.get("--use-megatron-fsdp"):
        return False, False, False
    strategy = values.get("dp_sharding", "optim_grads_params")  # Megatron's default for training
    if strategy == "optim_grads_params":
        return True, False, False
    if strategy in ("optim", "optim_grads"):
        notes.append(f"Megatron-FSDP {strategy} sharding read as the distributed optimizer")
        return False, True, False
    return False, False, False


def _deepspeed(values: dict, pp: int, dtype: str, source: str,
               notes: list[str]) -> tuple[bool, bool, bool, bool]:
    """(optimizer state sharded, FSDP, pipeline scatter / gather, DeepSpeed's BF16 optimizer) of
    Megatron-DeepSpeed's ``--deepspeed`` and ``--zero-stage`` (the DeepSpeed config file is not read)."""
    if not values.get("--deepspeed"):
        return False, False, True, False
    stage = int(values.get("zero_stage", 0))
    if stage not in (0, 1, 2, 3):
        raise LaunchError(f"{source}: --zero-stage must be 0, 1, 2 or 3 (got {stage})")
    notes.append(f"DeepSpeed's ZeRO stage {stage} from --zero-stage (the DeepSpeed config file is not read)")
    pipeline = pp > 1 and not values.get("--no-pipeline-parallel")
    if pipeline:
        notes.append("DeepSpeed's pipeline engine: each tensor-parallel rank sends its whole activation")
    if stage == 3:
        notes.append("ZeRO stage 3 read as FSDP (parameters, gradients and optimizer state sharded)")
        return False, True, not pipeline, False
    if stage == 2:
        notes.append("ZeRO stage 2 read as the distributed optimizer (its gradient shards not modelled)")
    bf16_optimizer = stage == 0 and dtype == "bf16"
    if bf16_optimizer:
        notes.append("ZeRO stage 0 with --bf16 is DeepSpeed's BF16 optimizer: the optimizer state sharded, the fp32 "
                     "gradients all-reduced whole, the bf16 gradients held beside them (deepspeed_bf16)")
    return stage > 0 or bf16_optimizer, False, not pipeline, bf16_optimizer


_SBATCH = re.compile(r"^\s*#SBATCH\s+(.*)$", re.MULTILINE)
_SBATCH_NODES = re.compile(r"^(?:--nodes=?|-N=?)(\d+)$")
_SBATCH_GPUS = re.compile(r"^(?:--gres=gpu:|--gpus-per-node=)(?:[A-Za-z0-9_-]+:)?(\d+)$")


def slurm_allocation(text: str) -> dict[str, int]:
    """Slurm's allocation in a batch script's ``#SBATCH`` lines: ``nodes`` (``--nodes`` / ``-N``, a plain
    count; a range is left out) and ``gpus_per_node`` (``--gres=gpu:[type:]K``, ``--gpus-per-node=[type:]K``)."""
    out: dict[str, int] = {}
    for line in _SBATCH.findall(text):
        words = line.split("#")[0].split()
        for i, w in enumerate(words):
            if w in ("--nodes", "-N", "--gres", "--gpus-per-node") and i + 1 < len(words):
                w = w + ("=" if w.startswith("--") else "") + words[i + 1]
            if m := _SBATCH_NODES.match(w):
                out["nodes"] = int(m.group(1))
            elif m := _SBATCH_GPUS.match(w):
                out["gpus_per_node"] = int(m.group(1))
    return {k: v for k, v in out.items() if v > 0}


def read_megatron_args(text: str | Sequence[str], source: str = "arguments", *, devices: int | None = None,
                       meta: dict | None = None) -> LaunchPlan:
    """A plan from Megatron-LM arguments: a launch script's text or a list of argument words.

    The world size is ``devices`` if given, else ``torchrun --nnodes x --nproc-per-node`` in the
    text, else Slurm's ``#SBATCH --nodes`` times torchrun's ``--nproc-per-node`` (or ``#SBATCH
    --gres=gpu:K`` / ``--gpus-per-node``), else the ``devices`` of tuner's header. Raises
    :class:`LaunchError` (one line) when the model shape, the micro-batch or the world size is
    missing, or a value is not a number.
    """
    slurm: dict[str, int] = {}
    if isinstance(text, str):
        meta = {**read_header(text, source), **(meta or {})}
        slurm = slurm_allocation(text)
        tokens = _tokens(text, source)
    else:
        meta = dict(meta or {})
        tokens = list(text)
    values, launcher, skipped = _parse(tokens, source)
    _refuse_misspelt(skipped, source)
    notes: list[str] = list(dict.fromkeys(_APPROXIMATED[f] for f in skipped if f in _APPROXIMATED))
    spec = _spec(values, source, header_str(meta, "model_name", source) or "megatron-model", notes)
    recompute = _recompute(values, source, notes)
    modules = _recompute_modules(values, recompute, spec, notes)
    if recompute == "selective" and values.get("recompute_modules") and not modules:
        recompute = "none"  # the named modules are none of this model's: nothing is recomputed
    tp = _positive(values, "tp", "--tensor-model-parallel-size", source, 1)
    pp = _positive(values, "pp", "--pipeline-model-parallel-size", source, 1)
    cp = _positive(values, "cp", "--context-parallel-size", source, 1)
    mb = _positive(values, "micro_batch", "--micro-batch-size", source)
    world = devices
    if world is None and "nnodes" in launcher and "nproc" in launcher:
        world = launcher["nnodes"] * launcher["nproc"]
    per_node = launcher.get("nproc", slurm.get("gpus_per_node"))
    if world is None and "nodes" in slurm and per_node is not None:  # torchrun's --nnodes $SLURM_NNODES
        world = slurm["nodes"] * per_node
        notes.append(f"world size {world}: Slurm's {slurm['nodes']} nodes (#SBATCH) x {per_node} GPUs each")
    if world is None and "dp" in values:
        world = values["dp"] * tp * pp * cp
    if world is None:
        world = header_int(meta, "devices", source)
    if world is None:
        raise LaunchError(f"{source}: the world size is unknown (no torchrun --nnodes/--nproc-per-node, no #SBATCH --nodes): give --devices N")
    if world % (tp * pp * cp):
        what = "tp x pp x cp" if cp > 1 else "tp x pp"
        raise LaunchError(f"{source}: {what} = {tp * pp * cp} does not divide the world size {world}")
    dp = world // (tp * pp * cp)
    gb = _positive(values, "global_batch", "--global-batch-size", source, mb * dp)
    v = 1
    layout = _layout(values, spec.layers, pp, source, notes)
    if layout is not None:
        stage_layers, v = layout
    elif pp > 1 and "layers_per_virtual_stage" in values:
        per = _positive(values, "layers_per_virtual_stage", "--num-layers-per-virtual-pipeline-stage", source)
        counted = spec.layers + sum(counted_ends(values))  # the embedding and loss as layers, where counted
        if counted % (pp * per):
            raise LaunchError(f"{source}: {counted} layers do not split into pp={pp} ranks of "
                              f"{per}-layer virtual stages")
        v = counted // (pp * per)
    elif pp > 1 and "virtual_stages" in values:
        v = _positive(values, "virtual_stages", "--num-virtual-stages-per-pipeline-rank", source)
    sched = "interleaved" if v > 1 else "1f1b"
    if layout is None:
        stage_layers = _stage_layers(values, spec.layers, pp, v, source, notes)
    recompute_layers = None
    if recompute == "full" and values.get("recompute_method") == "block":
        recompute_layers = _positive(values, "recompute_num_layers", "--recompute-num-layers", source)
        per_chunk = max(stage_layers) if stage_layers else spec.layers // (pp * v)
        if recompute_layers >= per_chunk:
            recompute_layers = None  # every layer of a chunk
    elif recompute == "full" and values.get("recompute_num_layers", 1) != 1:
        notes.append("--recompute-method uniform with --recompute-num-layers > 1 read as every layer recomputed, "
                     "each from its own input")
    fsdp, zero, fsdp2 = _fsdp(values, notes)
    ds_shard, ds_fsdp, scatter_gather, ds_bf16 = _deepspeed(values, pp, spec.dtype, source, notes)
    zero, fsdp = zero or ds_shard, fsdp or ds_fsdp
    reduce = ("bf16" if values.get("--grad-reduce-in-bf16") else "fp32"
              if values.get("--accumulate-allreduce-grads-in-fp32") or spec.dtype != "fp16" else "fp16")
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, micro_batch=mb, global_batch=gb, schedule=sched,  # type: ignore[arg-type]
                        virtual_stages=v if v > 1 else 2, sequence_parallel=bool(values.get("--sequence-parallel")),
                        recompute=recompute, recompute_modules=modules,  # type: ignore[arg-type]
                        ep=int(values.get("ep", 1)),
                        expert_tp=_expert_tp(values, tp, source), stage_layers=stage_layers,
                        distributed_optimizer=bool(values.get("--use-distributed-optimizer")) or zero, fsdp=fsdp,
                        fsdp2=fsdp2,
                        overlap_grad_reduce=bool(values.get("--overlap-grad-reduce")),
                        overlap_param_gather=bool(values.get("--overlap-param-gather")),
                        align_param_gather=not values.get("--no-align-param-gather"),
                        tp_comm_overlap=bool(values.get("--tp-comm-overlap")),
                        grad_reduce_dtype=reduce, cp=cp, recompute_layers=recompute_layers,  # type: ignore[arg-type]
                        optimizer_state=_optimizer_state(values, source, notes),  # type: ignore[arg-type]
                        pp_scatter_gather=scatter_gather, deepspeed_bf16=ds_bf16)
    dpn = header_int(meta, "devices_per_node", source) or per_node
    return LaunchPlan(spec, plan, world, header_str(meta, "platform", source), dpn,
                      tuple(sorted(set(skipped))), tuple(notes))


def _layout(values: dict, layers: int, pp: int, source: str, notes: list[str]) -> tuple[tuple[int, ...] | None, int] | None:
    """(decoder layers per virtual stage, virtual stages per rank) of ``--pipeline-model-parallel-layout`` (None
    without it), with a note on the MTP layers it places; :class:`LaunchError` where Megatron refuses it beside
    another split flag, or it does not fit the model."""
    text = values.get("pp_layout")
    if text is None:
        return None
    others = [f for f, k in (("--num-layers-per-virtual-pipeline-stage", "layers_per_virtual_stage"),
                             ("--num-virtual-stages-per-pipeline-rank", "virtual_stages"),
                             ("--decoder-first-pipeline-num-layers", "first_stage_layers"),
                             ("--decoder-last-pipeline-num-layers", "last_stage_layers")) if k in values]
    others += [f for f in ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
               if values.get(f)]
    if others:
        raise LaunchError(f"{source}: {LAYOUT_FLAG} does not go with {', '.join(others)} (Megatron takes one split)")
    try:
        stage_layers, v, mtp, last = layout_stage_layers(text, layers, pp)
    except ValueError as err:
        raise LaunchError(f"{source}: {LAYOUT_FLAG}: {err}") from None
    if mtp != values.get("mtp_layers", 0):
        raise LaunchError(f"{source}: {LAYOUT_FLAG} places {mtp} MTP layer(s) m, --mtp-num-layers says "
                          f"{values.get('mtp_layers', 0)}")
    if mtp and not last:
        notes.append(f"{LAYOUT_FLAG}: the MTP layers priced on the last virtual stage")
    return stage_layers, v


def _expert_tp(values: dict, tp: int, source: str) -> int | None:
    """``--expert-tensor-parallel-size``: None where it is the TP degree (Megatron's default), 1 for whole experts;
    tuner models no other."""
    if "expert_tp" not in values:
        return None
    flag = "--expert-tensor-parallel-size"
    etp = expert_tp_degree(_positive(values, "expert_tp", flag, source), tp, flag, source)
    return None if etp == tp else etp


def read_megatron_file(path: Path, *, devices: int | None = None) -> LaunchPlan:
    """:func:`read_megatron_args` of a file; raises :class:`LaunchError` for a missing or binary file."""
    src = str(path)
    text = read_launch_text(path, "a launch script or argument list")
    if not re.search(r"--[a-z]", text):
        raise LaunchError(f"{src}: no Megatron-LM arguments (--flag value ...) in the file")
    return read_megatron_args(text, src, devices=devices)
