"""Plans that launch: Megatron-LM arguments and torchtitan TOML written, read back, and scored by `tuner predict`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from predictor.sources.synth.transformer import MoESpec, ParallelPlan, TransformerSpec
from predictor.timing.platforms import get_platform
from tuner.cli import app
from tuner.launch import (
    LaunchError,
    megatron_args,
    megatron_launch_text,
    read_megatron_args,
    read_torchtitan_toml,
    torchtitan_plan,
    torchtitan_toml,
    write_launch_files,
)
from tuner.launch.megatron_split import megatron_stage_layers
from tuner.plans import predict_plan

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
SPEC = TransformerSpec(layers=8, hidden=1024, heads=16, seq=1024, vocab=8000, name="gpt-small")
A100 = get_platform("a100-80gb")
H100 = get_platform("h100-sxm")

PLANS = [
    ParallelPlan(tp=2, pp=2, dp=2, micro_batch=2, global_batch=32, schedule="interleaved", virtual_stages=2,
                 sequence_parallel=True, recompute="selective"),
    ParallelPlan(tp=4, pp=1, dp=2, micro_batch=4, global_batch=64, recompute="full", distributed_optimizer=True,
                 overlap_grad_reduce=False, grad_reduce_dtype="fp32"),
    ParallelPlan(tp=1, pp=4, dp=2, micro_batch=1, global_batch=16, schedule="interleaved", virtual_stages=2,
                 tp_comm_overlap=True),
    ParallelPlan(tp=2, pp=2, dp=2, micro_batch=2, global_batch=32),
    ParallelPlan(tp=1, pp=1, dp=8, micro_batch=2, global_batch=32, fsdp=True, recompute="full"),
    ParallelPlan(tp=1, pp=1, dp=8, micro_batch=2, global_batch=32, fsdp=True, fsdp_reshard_after_forward=False),
    ParallelPlan(tp=2, pp=1, dp=8, micro_batch=1, global_batch=32, fsdp=True, fsdp_shard=4),
    ParallelPlan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=32, fsdp=True, fsdp_fp32_params=True),
    ParallelPlan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=32, distributed_optimizer=True),
    ParallelPlan(tp=2, pp=1, dp=4, micro_batch=1, global_batch=32, distributed_optimizer=True,
                 optimizer_state="bf16_moments"),
    ParallelPlan(tp=1, pp=2, dp=4, micro_batch=1, global_batch=32, distributed_optimizer=True, optimizer_state="bf16"),
]


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.label())
def test_megatron_arguments_read_back_to_the_same_spec_and_plan(plan):
    text = megatron_launch_text(SPEC, plan, platform="a100-80gb", devices_per_node=8)
    back = read_megatron_args(text, "f")
    # Megatron-FSDP has neither SHARD_GRAD_OP, HSDP nor FSDP1's fp32 shards: such a plan is written (and said) as
    # Megatron-FSDP's full sharding
    ran = replace(plan, fsdp_reshard_after_forward=True, fsdp_shard=None, fsdp_fp32_params=False)
    assert ("has no Megatron-LM flag: written as" in text) == (ran != plan)
    assert (back.spec, back.plan, back.devices, back.platform) == (SPEC, ran, plan.devices, "a100-80gb")
    # the bare argument list needs the world size from the caller
    bare = read_megatron_args(megatron_args(SPEC, plan), devices=plan.devices)
    assert bare.plan == ran and bare.spec == replace(SPEC, name="megatron-model")


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.label())
def test_torchtitan_toml_reads_back_to_the_plan_torchtitan_runs(plan):
    text = torchtitan_toml(SPEC, plan, platform="a100-80gb", devices_per_node=8)
    doc = tomllib.loads(text)
    assert set(doc) == {"job", "training", "parallelism", "activation_checkpoint"}
    par = doc["parallelism"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (plan.tp, plan.pp)
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == plan.dp
    back = read_torchtitan_toml(text, "f")
    assert back.spec == SPEC and back.plan == torchtitan_plan(plan, SPEC) and back.devices == plan.devices
    if plan.tp > 1:
        assert back.plan.sequence_parallel  # torchtitan's TP is sequence parallel
    # torchtitan shards data parallelism with FSDP: tuner's fsdp when there is no PP (TP inside it)
    sharded = plan.fsdp or plan.distributed_optimizer
    assert back.plan.fsdp == (sharded and plan.pp == 1) == back.plan.fsdp2  # torchtitan shards with fully_shard
    assert back.plan.distributed_optimizer == (sharded and not back.plan.fsdp)


def test_moe_and_dtype_flags_round_trip():
    spec = replace(SPEC, moe=MoESpec(experts=8, top_k=2, capacity_factor=1.25), tie_embeddings=False, dtype="fp16",
                   ffn=3072, attention="unfused")
    plan = ParallelPlan(tp=2, pp=1, dp=4, micro_batch=2, global_batch=64, ep=2, grad_reduce_dtype="fp32")
    args = megatron_args(spec, plan)
    assert "--fp16" in args and "--untie-embeddings-and-output-weights" in args and "--accumulate-allreduce-grads-in-fp32" in args
    back = read_megatron_args(megatron_launch_text(spec, plan, platform="h100", devices_per_node=8), "f")
    assert back.spec == spec and back.plan == plan
    assert "--expert-tensor-parallel-size" not in args  # Megatron's default: the experts split as the TP degree
    whole = replace(plan, expert_tp=1)
    args = megatron_args(spec, whole)
    assert args[args.index("--expert-tensor-parallel-size") + 1] == "1"
    back = read_megatron_args(megatron_launch_text(spec, whole, platform="h100", devices_per_node=8), "f")
    assert back.plan == whole
    as_tp = megatron_launch_text(spec, plan, platform="h100", devices_per_node=8) + " --expert-tensor-parallel-size 2"
    assert read_megatron_args(as_tp, "f").plan.expert_tp is None
    with pytest.raises(LaunchError, match="expert-tensor-parallel-size 4"):
        read_megatron_args(megatron_launch_text(spec, plan, platform="h100", devices_per_node=8)
                           + " --expert-tensor-parallel-size 4", "f")


def test_torchtitan_runs_its_experts_whole_on_every_tp_rank():
    plan = ParallelPlan(tp=2, pp=1, dp=4, micro_batch=2, global_batch=64, ep=2)
    moe = replace(SPEC, moe=MoESpec(experts=8, top_k=2))
    assert torchtitan_plan(plan, moe).expert_tp == 1 and torchtitan_plan(replace(plan, expert_tp=2), moe).expert_tp == 2
    assert torchtitan_plan(plan, SPEC).expert_tp is None  # a dense model has no experts to place


def test_megatron_script_with_foreign_flags_and_torchrun():
    script = """#!/bin/bash
# a user's launch script
GPUS_PER_NODE=8
torchrun --nproc_per_node 8 --nnodes 2 --node_rank $NODE_RANK pretrain_gpt.py \\
    --num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 \\
    --tensor-model-parallel-size=2 --pipeline-model-parallel-size 2 --micro-batch-size 2 \\
    --global-batch-size 64 --lr 6.0e-5 --train-iters 500 --data-path $DATA --vocab-file gpt2-vocab.json \\
    --recompute-activations --bf16 --use-distributed-optimizer --swiglu --num-query-groups 4
"""
    back = read_megatron_args(script, "run.sh")
    assert back.devices == 16 and back.devices_per_node == 8
    assert (back.plan.tp, back.plan.pp, back.plan.dp, back.plan.recompute) == (2, 2, 4, "selective")
    assert back.plan.distributed_optimizer and back.spec.vocab == 50257
    assert any("50257" in n for n in back.notes)
    # --swiglu without --ffn-hidden-size: Megatron's 2/3 x 4h, down to a multiple of 64
    assert back.spec.mlp == "swiglu" and back.spec.ffn_size == 2688
    assert back.spec.kv_heads is None and any("without --group-query-attention" in n for n in back.notes)
    assert {"--lr", "--train-iters", "--data-path", "--vocab-file"} <= set(back.ignored)


def test_megatron_llama_flags_round_trip():
    """Grouped-query attention and SwiGLU are read from Megatron's flags and written back."""
    spec = TransformerSpec(layers=80, hidden=8192, heads=64, kv_heads=8, seq=4096, vocab=32000, ffn=28672,
                           mlp="swiglu", tie_embeddings=False, name="llama2-70b")
    plan = ParallelPlan(tp=4, pp=4, dp=4, micro_batch=1, global_batch=128, schedule="interleaved", virtual_stages=5)
    args = megatron_args(spec, plan)
    assert args[args.index("--num-query-groups") + 1] == "8" and "--group-query-attention" in args and "--swiglu" in args
    back = read_megatron_args(megatron_launch_text(spec, plan, platform="h100", devices_per_node=8), "f")
    assert back.spec == spec and back.plan == plan and not back.notes
    cp = ParallelPlan(tp=4, pp=1, dp=2, cp=2, micro_batch=1, global_batch=16, sequence_parallel=True)
    cp_args = megatron_args(spec, cp)
    assert cp_args[cp_args.index("--context-parallel-size") + 1] == "2"
    assert read_megatron_args(cp_args, devices=16).plan == cp
    titan = read_torchtitan_toml(torchtitan_toml(spec, replace(cp, fsdp=True, tp=1, dp=4)), "t", devices=8)
    assert (titan.plan.cp, titan.plan.dp, titan.plan.fsdp) == (2, 4, True)
    bad = " ".join(args).replace("--num-query-groups 8", "--num-query-groups 7")
    with pytest.raises(LaunchError, match="not a multiple of --num-query-groups 7"):
        read_megatron_args(bad, devices=64)


def test_partial_full_recomputation_round_trips():
    """Megatron's --recompute-method block --recompute-num-layers N is N layers of each chunk recomputed;
    torchtitan writes it as every n-th layer (n = chunk / N) and reads it back."""
    plan = ParallelPlan(tp=2, pp=2, dp=2, micro_batch=2, global_batch=32, recompute="full", recompute_layers=2)
    args = megatron_args(SPEC, plan)
    assert args[args.index("--recompute-method") + 1] == "block" and args[args.index("--recompute-num-layers") + 1] == "2"
    assert read_megatron_args(args, devices=8).plan == plan
    doc = tomllib.loads(torchtitan_toml(SPEC, plan))
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "2"}
    back = read_torchtitan_toml(torchtitan_toml(SPEC, plan), "f")
    assert back.plan == torchtitan_plan(plan, SPEC) and back.plan.recompute_layers == 2
    uniform = read_megatron_args(args[:args.index("--recompute-method")] + ["--recompute-method", "uniform",
                                 "--recompute-num-layers", "2"] + args[args.index("--recompute-num-layers") + 2:],
                                 devices=8)
    assert uniform.plan.recompute_layers is None and any("uniform" in n for n in uniform.notes)


def test_megatron_fp8_format_is_transformer_engine_fp8():
    """--fp8-format hybrid / e4m3: Transformer Engine's FP8 linears (fp8_linear), written back as hybrid."""
    spec = replace(SPEC, fp8_linear=True)
    plan = ParallelPlan(tp=2, pp=1, dp=4, micro_batch=2, global_batch=32, sequence_parallel=True)
    args = megatron_args(spec, plan)
    assert args[args.index("--fp8-format") + 1] == "hybrid"
    assert read_megatron_args(args, devices=8).spec == replace(spec, name="megatron-model")
    titan = read_torchtitan_toml(torchtitan_toml(spec, plan), "f")
    assert titan.spec.fp8_linear and any("Float8" in n for n in titan.notes)
    e4m3 = [a if a != "hybrid" else "e4m3" for a in args]
    assert read_megatron_args(e4m3, devices=8).spec.fp8_linear
    with pytest.raises(LaunchError, match="--fp8-format must be hybrid or e4m3"):
        read_megatron_args([a if a != "hybrid" else "mxfp8" for a in args], devices=8)


def test_megatron_moe_routing_note_unless_forced_balanced_or_capped():
    """tuner prices balanced experts: a dropless run with a learned router says so (and how to price the skew);
    --moe-router-force-load-balancing or a capacity factor is what tuner prices, without the note."""
    moe = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
           "--vocab-size 8000 --global-batch-size 16 --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2 ")
    assert any(n.startswith("routing priced as balanced") for n in read_megatron_args(moe, devices=8).notes)
    for extra in ("--moe-router-force-load-balancing", "--moe-expert-capacity-factor 1.25"):
        lp = read_megatron_args(moe + extra, devices=8)
        assert not any(n.startswith("routing priced") for n in lp.notes) and extra.split()[0] not in lp.ignored
    # the merged 1F1B schedule's all-to-all hiding: read, and said not to be modelled (17.6 s against 19.7 s)
    lp = read_megatron_args(moe + "--overlap-moe-expert-parallel-comm", devices=8)
    assert "--overlap-moe-expert-parallel-comm" not in lp.ignored
    assert any(n.startswith("--overlap-moe-expert-parallel-comm not modelled") for n in lp.notes)


def test_megatron_block_scaled_fp8_recipe_is_read_with_a_note():
    """--fp8-recipe mxfp8 / blockwise: priced as per-tensor scaling, said so; delayed and tensorwise are what tuner
    prices (no note)."""
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --micro-batch-size 1 "
            "--global-batch-size 8 --vocab-size 1000 --bf16 --fp8-format hybrid ")
    for recipe, noted in (("blockwise", True), ("mxfp8", True), ("tensorwise", False), ("delayed", False)):
        lp = read_megatron_args(base + f"--fp8-recipe {recipe}", devices=8)
        assert any(n.startswith(f"--fp8-recipe {recipe}: priced as per-tensor") for n in lp.notes) == noted
        assert "--fp8-recipe" not in lp.ignored and lp.spec.fp8_linear


def test_megatron_flag_one_typo_from_a_read_one_is_refused():
    """Megatron's argparse (no abbreviations) refuses --pipeline-model-paralel-size; tuner would otherwise skip it and
    price one pipeline stage. Flags it does not read are listed; Megatron's own near-twins (--fp4-param-gather,
    --no-align-param-gather) and torchrun's abbreviations are not typos."""
    shape = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
             "--vocab-size 8000 --global-batch-size 16 ")
    with pytest.raises(LaunchError, match=r"unknown flag --pipeline-model-paralel-size \(did you mean "
                                          r"--pipeline-model-parallel-size\?\)"):
        read_megatron_args(shape + "--pipeline-model-paralel-size 4", devices=8)
    lp = read_megatron_args(shape + "--fp4-param-gather --align-param-gather --lr 3e-4 --frobnicate 7", devices=8)
    assert {"--fp4-param-gather", "--align-param-gather", "--lr", "--frobnicate"} <= set(lp.ignored)
    assert read_megatron_args("torchrun --nnode 1 --nproc-per-node 8 pretrain_gpt.py " + shape, devices=8).plan.dp == 8


def test_megatron_uneven_pipeline_splits_read_write_and_price():
    """--decoder-first/last-pipeline-num-layers and --account-for-embedding/loss-in-pipeline-split are Megatron-core's
    uneven splits: read as stage_layers, written back, and a 126-layer model splits over 8 stages."""
    shape = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
             "--vocab-size 8000 --global-batch-size 16 --pipeline-model-parallel-size 4 ")
    ends = read_megatron_args(shape + "--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1",
                              devices=4)
    assert ends.plan.stage_layers == (1, 3, 3, 1) and not ends.notes
    counted = read_megatron_args(shape.replace("--num-layers 8", "--num-layers 10") +
                                 "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
                                 devices=4)
    assert counted.plan.stage_layers == (2, 3, 3, 2)  # (10 + 2) / 4, the first and last one fewer
    # layers per virtual stage count the embedding and the loss too: (22 + 2) / (4 x 3) = 2 chunks a rank
    chunks = read_megatron_args(shape.replace("--num-layers 8", "--num-layers 22") +
                                "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
                                "--num-layers-per-virtual-pipeline-stage 3", devices=4)
    assert chunks.plan.virtual_stages_effective == 2 and chunks.plan.stage_layers == (2, 3, 3, 3, 3, 3, 3, 2)
    with pytest.raises(LaunchError, match="do not split over 8 virtual stages"):
        read_megatron_args(shape + "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
                           "--num-virtual-stages-per-pipeline-rank 2", devices=4)
    for back in (ends, counted):
        args = megatron_args(back.spec, back.plan)
        again = read_megatron_args(megatron_launch_text(back.spec, back.plan, platform="h100", devices_per_node=8), "f")
        assert any(a.startswith(("--decoder-first", "--account-for")) for a in args) and again.plan == back.plan
    big = replace(SPEC, layers=126)
    assert megatron_stage_layers(126, 8, embedding=True, loss=True) == (15, 16, 16, 16, 16, 16, 16, 15)
    plan = ParallelPlan(tp=1, pp=8, dp=1, micro_batch=1, global_batch=16,
                        stage_layers=megatron_stage_layers(126, 8, embedding=True, loss=True))
    args = megatron_args(big, plan)
    assert "--account-for-embedding-in-pipeline-split" in args and "--account-for-loss-in-pipeline-split" in args
    # a split neither form gives is written as Megatron-core's layout, and reads back to it
    odd = replace(plan, stage_layers=(14, 17, 16, 16, 16, 16, 16, 15))
    args = megatron_args(big, odd)
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*14|t*17|(t*16|)*5t*15L"
    assert read_megatron_args(args, devices=8).plan == odd
    with pytest.raises(LaunchError, match="does not go with"):
        read_megatron_args(shape + "--decoder-first-pipeline-num-layers 2 --account-for-loss-in-pipeline-split",
                           devices=4)

def test_megatron_pipeline_layout_reads_writes_and_refuses():
    """--pipeline-model-parallel-layout (Megatron-core's flexible layout, the DeepSeek-V3 recipes' "Et|(tt|)*30mL"):
    each stage's decoder layers t, the virtual stages from the stage count, MTP layers m in a note; a layout
    Megatron refuses, or beside another split flag, is one error line."""
    shape = ("--num-layers 61 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
             "--vocab-size 8000 --global-batch-size 64 --pipeline-model-parallel-size 16 ")
    ds = read_megatron_args(shape + '--pipeline-model-parallel-layout "Et|(tt|)*30mL" --mtp-num-layers 1', devices=16)
    assert ds.plan.schedule == "interleaved" and ds.plan.virtual_stages_effective == 2
    assert ds.plan.stage_layers == (1,) + (2,) * 30 + (0,)
    assert ds.spec.mtp_layers == 1  # priced on the last virtual stage, where the layout puts it
    args = megatron_args(ds.spec, ds.plan)
    assert args[args.index("--mtp-num-layers") + 1] == "1"
    assert "--num-virtual-stages-per-pipeline-rank" not in args  # the layout names the virtual stages
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et|(tt|)*30mL"
    assert read_megatron_args(args, devices=16).plan == ds.plan
    text = megatron_launch_text(ds.spec, ds.plan, platform="h100-sxm", devices_per_node=8)
    assert read_megatron_args(text, "f").plan == ds.plan  # quoted for the shell, read back
    flat = read_megatron_args(shape + "--pipeline-model-parallel-layout 'Et*4|(tttt|)*14tmL' --mtp-num-layers 1",
                              devices=16)
    assert flat.plan.schedule == "1f1b" and flat.plan.stage_layers == (4,) * 15 + (1,)
    for extra, match in (("--pipeline-model-parallel-layout Et|(tt|)*30mL", "places 1 MTP layer"),
                         ("--pipeline-model-parallel-layout Et|(tt|)*30mX", "unknown layer character"),
                         ("--pipeline-model-parallel-layout Et|(tt|)*30tL", "names 62 decoder layers"),
                         ("--pipeline-model-parallel-layout E|(tt|)*29tL", "stages do not divide"),
                         ("--pipeline-model-parallel-layout Et|(tt|)*30mL --num-virtual-stages-per-pipeline-rank 2",
                          "does not go with --num-virtual-stages-per-pipeline-rank"),
                         ("--pipeline-model-parallel-layout Et|(tt|)*30mL --account-for-loss-in-pipeline-split",
                          "does not go with --account-for-loss")):
        with pytest.raises(LaunchError, match=match):
            read_megatron_args(shape + extra, devices=16)


def test_torchtitan_splits_its_first_and_last_stage_one_layer_short():
    """torchtitan's pipeline_parallel_first/last_stage_less_layers (1 each by default): a 32-layer model on 4 stages
    runs 8, 9, 8, 7 layers; its TOML carries the split and reads back to it."""
    from tuner.launch.torchtitan import torchtitan_stage_layers

    assert torchtitan_stage_layers(32, 4) == (8, 9, 8, 7) and torchtitan_stage_layers(32, 4, 0, 0) is None
    spec = replace(SPEC, layers=32)
    plan = ParallelPlan(tp=1, pp=4, dp=2, micro_batch=1, global_batch=16, stage_layers=(8, 9, 8, 7))
    text = torchtitan_toml(spec, plan, platform="a100-80gb", devices_per_node=8)
    par = tomllib.loads(text)["parallelism"]
    assert (par["pipeline_parallel_first_stage_less_layers"], par["pipeline_parallel_last_stage_less_layers"]) == (1, 1)
    assert read_torchtitan_toml(text, "f").plan.stage_layers == (8, 9, 8, 7)
    default = text.replace("pipeline_parallel_first_stage_less_layers = 1\n", "").replace(
        "pipeline_parallel_last_stage_less_layers = 1\n", "")
    assert read_torchtitan_toml(default, "f").plan.stage_layers == (8, 9, 8, 7)  # torchtitan's defaults
    # a split the fewer-layers keys do not make: each model part's modules by name, read back
    odd = torchtitan_toml(spec, replace(plan, stage_layers=(2, 10, 10, 10)), platform="a100-80gb")
    parts = tomllib.loads(odd)["parallelism"]["module_fqns_per_model_part"]
    assert parts[0][:2] == ["tok_embeddings", "layers.0"] and parts[-1][-2:] == ["norm", "output"]
    assert read_torchtitan_toml(odd, "f").plan.stage_layers == (2, 10, 10, 10)
    looped = read_torchtitan_toml(odd.replace('pipeline_parallel_degree = 4', 'pipeline_parallel_degree = 2').replace(
        '"1F1B"', '"Interleaved1F1B"'), "f", devices=4)
    assert looped.plan.virtual_stages_effective == 2 and looped.plan.stage_layers == (2, 10, 10, 10)
    for edit, match in (((", 'layers.1']", "]"), "once each, in order"),
                        (("'tok_embeddings', ", ""), "tok_embeddings in the first part"),
                        (('"1F1B"', '"Interleaved1F1B"'), "tuner models 1F1B with one part a rank")):
        with pytest.raises(LaunchError, match=match):
            read_torchtitan_toml(odd.replace(*edit), "f")

def test_megatron_precision_aware_optimizer_flags():
    """--use-precision-aware-optimizer with 16-bit moments (and master copy) is tuner's 16-bit optimizer state;
    a partly 16-bit state or dtypes without the switch read as fp32 with a note; a bad dtype is one error."""
    shape = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
             "--vocab-size 8000 --use-distributed-optimizer ")
    moments = "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype fp16 "
    assert read_megatron_args(shape + moments, devices=8).plan.optimizer_state == "bf16_moments"
    both = read_megatron_args(shape + moments + "--main-params-dtype fp16", devices=8)
    assert both.plan.optimizer_state == "bf16" and not both.notes
    half = read_megatron_args(shape + "--use-precision-aware-optimizer --exp-avg-dtype bf16", devices=8)
    assert half.plan.optimizer_state == "fp32" and half.notes
    plan_flags = read_megatron_args(shape + "--normalization RMSNorm --normalization RMSNorm", devices=8)
    assert len(plan_flags.notes) == 1  # one note per meaning
    gather = read_megatron_args(shape + "--overlap-param-gather", devices=8)
    assert gather.plan.overlap_param_gather and gather.plan.gathers_params_in_forward and not gather.notes
    assert "--overlap-param-gather" in megatron_args(SPEC, gather.plan) and gather.plan.align_param_gather
    lazy = read_megatron_args(shape + "--overlap-param-gather --no-align-param-gather "
                              "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2", devices=8)
    assert not lazy.plan.align_param_gather and "--no-align-param-gather" in megatron_args(SPEC, lazy.plan)
    relu2 = read_megatron_args(shape + "--squared-relu", devices=8)  # Nemotron's MLP: two GEMMs, as GeLU's
    assert relu2.spec.mlp == "gelu" and any("squared ReLU" in n for n in relu2.notes)
    unswitched = read_megatron_args(shape + "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", devices=8)
    assert unswitched.plan.optimizer_state == "fp32" and unswitched.notes
    with pytest.raises(LaunchError, match="--main-params-dtype must be one of fp32, fp16"):
        read_megatron_args(shape + moments + "--main-params-dtype bf16", devices=8)
    toml = torchtitan_toml(SPEC, both.plan)
    assert "fp32 state" in toml and read_torchtitan_toml(toml, "f").plan.optimizer_state == "fp32"


def test_megatron_script_variables_and_bash_arrays_are_expanded():
    """Megatron-LM's example scripts: sizes in shell variables (with ${X:-default} and $(( )) arithmetic),
    arguments in bash arrays, the vocabulary from --tokenizer-type."""
    script = """#!/bin/bash
GPUS_PER_NODE=8
NNODES=${SLURM_NNODES:-"2"}
export TP=2
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))
MB=$(cat micro_batch.txt)
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes ${NNODES}
)
MODEL_ARGS=(
    --num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
    --tokenizer-type Llama2Tokenizer
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]} \\
    --tensor-model-parallel-size $TP --micro-batch-size 1 --global-batch-size $((4*WORLD_SIZE))
"""
    back = read_megatron_args(script, "run.sh")
    assert (back.devices, back.plan.tp, back.plan.dp, back.spec.vocab) == (16, 2, 8, 32000)
    assert any("Llama2Tokenizer" in n for n in back.notes)
    # a command substitution is not run: its variable stays unset and is named in the error
    with pytest.raises(LaunchError, match="a shell variable the file does not set"):
        read_megatron_args(script.replace("--micro-batch-size 1", "--micro-batch-size $MB"), "run.sh")


@pytest.mark.parametrize(("model", "vocab"), [("meta-llama/Meta-Llama-3.1-8B", 128256),
                                              ("/models/Llama-2-7b-hf", 32000), ("my-org/tokenizer", 50257),
                                              ("deepseek-ai/DeepSeek-V3", 129280), ("Qwen/Qwen3-30B-A3B", 151936),
                                              ("meta-llama/Llama-4-Scout-17B-16E", 202048)])
def test_a_hugging_face_tokenizer_known_by_name_gives_its_vocabulary(model, vocab):
    args = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "128",
            "--micro-batch-size", "1", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", model]
    back = read_megatron_args(args, devices=1)
    assert back.spec.vocab == vocab and any(model in n or "GPT-2" in n for n in back.notes)
    assert read_megatron_args([*args, "--vocab-size", "1000"], devices=1).spec.vocab == 1000


def test_attention_without_a_megatron_backend_is_written_as_flash_with_a_comment():
    text = megatron_launch_text(replace(SPEC, attention="flex"), PLANS[3], platform="h100-sxm", devices_per_node=8)
    assert "# attention flex has no Megatron-LM backend" in text and "--attention-backend flash" in text
    assert "no Megatron-LM backend" not in megatron_launch_text(SPEC, PLANS[3], platform="h100-sxm", devices_per_node=8)


def test_megatron_fsdp_flags():
    shape = "--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
    torch_fsdp2 = read_megatron_args(shape + "--use-torch-fsdp2", devices=8)
    assert torch_fsdp2.plan.fsdp and torch_fsdp2.plan.fsdp2
    assert "--use-torch-fsdp2" in megatron_args(torch_fsdp2.spec, torch_fsdp2.plan)
    megatron_fsdp = read_megatron_args(shape + "--use-megatron-fsdp", devices=8)  # optim_grads_params by default
    assert megatron_fsdp.plan.fsdp and not megatron_fsdp.plan.fsdp2
    zero = read_megatron_args(shape + "--use-megatron-fsdp --data-parallel-sharding-strategy optim", devices=8)
    assert not zero.plan.fsdp and zero.plan.distributed_optimizer and zero.notes


@pytest.mark.parametrize("text, expected", [
    ("--num-layers 8 --hidden-size 1024", "--num-attention-heads is missing"),
    ("--num-layers x --hidden-size 1024", "--num-layers expects an integer"),
    ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 64 --micro-batch-size 1",
     "world size is unknown"),
    ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 64 --micro-batch-size 1 "
     "--context-parallel-size 0", "--context-parallel-size must be >= 1"),
    ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 64 --micro-batch-size 1 "
     "--recompute-granularity some", "must be selective or full"),
])
def test_bad_megatron_arguments_raise_one_line(text, expected):
    with pytest.raises(LaunchError, match=expected):
        read_megatron_args(text, "f")


def test_bad_torchtitan_files_raise_one_line():
    with pytest.raises(LaunchError, match="TOML syntax error"):
        read_torchtitan_toml("[training\n", "f")
    with pytest.raises(LaunchError, match="tuner knows llama3 / 8B.*give its shape: --workload"):
        read_torchtitan_toml('[model]\nname = "gpt_oss"\nflavor = "20b"\n', "f")
    with pytest.raises(LaunchError, match="shard_degree = -1"):
        read_torchtitan_toml("[training]\nlocal_batch_size = 2\n", "f", spec=SPEC)
    with pytest.raises(LaunchError, match="ZeroBubble"):
        read_torchtitan_toml('[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = '
                             '"InterleavedZeroBubble"\n', "f", spec=SPEC, devices=4)
    with pytest.raises(LaunchError, match="must be an integer"):
        read_torchtitan_toml('[parallelism]\ntensor_parallel_degree = "2"\n', "f", spec=SPEC, devices=4)
    with pytest.raises(LaunchError, match="fsdp_reshard_after_forward must be"):
        read_torchtitan_toml('[parallelism]\nfsdp_reshard_after_forward = "sometimes"\n', "f", spec=SPEC, devices=4)
    kept = read_torchtitan_toml('[parallelism]\nfsdp_reshard_after_forward = "never"\n', "f", spec=SPEC, devices=4)
    assert kept.plan.fsdp and not kept.plan.fsdp_reshard_after_forward
    # HSDP: FSDP inside each group of shard-degree ranks, replicated across; with PP read as sharding over all
    hsdp = read_torchtitan_toml("[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n",
                                "f", spec=SPEC, devices=8)
    assert (hsdp.plan.dp, hsdp.plan.fsdp, hsdp.plan.fsdp_shard) == (8, True, 4)
    piped = read_torchtitan_toml("[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 2\n"
                                 "pipeline_parallel_degree = 2\n", "f", spec=SPEC, devices=8)
    assert piped.plan.fsdp_shard is None and any("HSDP" in n for n in piped.notes)
    offload = read_torchtitan_toml("[training]\nenable_cpu_offload = true\n", "f", spec=SPEC, devices=8)
    assert any("CPU offload is not modelled" in n for n in offload.notes)
    # torchtitan's defaults: FSDP over every device (shard degree -1), local batch 8, selective checkpointing
    # of every second layer: 4 of the 8 layers recomputed in full
    plan = read_torchtitan_toml("", "f", spec=SPEC, devices=4).plan
    assert (plan.dp, plan.fsdp, plan.micro_batch, plan.recompute, plan.recompute_layers) == (4, True, 8, "full", 4)
    every_8th = read_torchtitan_toml('[activation_checkpoint]\nselective_ac_option = "8"\n', "f", spec=SPEC, devices=4)
    assert (every_8th.plan.recompute, every_8th.plan.recompute_layers) == ("full", 1)
    with pytest.raises(LaunchError, match="selective_ac_option must be"):
        read_torchtitan_toml('[activation_checkpoint]\nselective_ac_option = "half"\n', "f", spec=SPEC, devices=4)


LLAMA3_8B_TOML = """
[model]
name = "llama3"
flavor = "8B"
hf_assets_path = "./assets/hf/Llama-3.1-8B"

[training]
local_batch_size = 1
seq_len = 8192

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""


def test_torchtitan_llama3_flavors_need_no_workload():
    """A torchtitan Llama 3 job config (as in its train_configs) reads with the flavor's shape."""
    read = read_torchtitan_toml(LLAMA3_8B_TOML, "llama3_8b.toml", devices=8)
    s = read.spec
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.ffn_size, s.vocab, s.seq) == (32, 4096, 32, 8, 14336, 128256, 8192)
    assert s.mlp == "swiglu" and not s.tie_embeddings and s.program == "eager"
    assert s.param_count() == pytest.approx(8_030_261_248, rel=5e-3)  # Llama 3.1 8B's published count
    assert (read.plan.dp, read.plan.fsdp, read.plan.micro_batch) == (8, True, 1)
    assert any("RMSNorm" in n for n in read.notes) and read.plan.recompute == "op"  # op-level checkpointing
    big = read_torchtitan_toml(LLAMA3_8B_TOML.replace('"8B"', '"405B"'), "f", devices=512).spec
    assert (big.layers, big.hidden, big.ffn_size) == (126, 16384, 53248)
    assert big.param_count() == pytest.approx(405.85e9, rel=5e-3)


def test_written_files_score_the_same_prediction(tmp_path):
    plan = PLANS[0]
    want, _ = predict_plan(SPEC, plan, A100, devices=plan.devices)
    tt_want, _ = predict_plan(SPEC, torchtitan_plan(plan), A100, devices=plan.devices)
    payload = write_launch_files(tmp_path, SPEC, plan, platform="a100-80gb", devices_per_node=8,
                                 predicted_s=want["predicted_iteration_s"])
    assert payload["torchtitan_changes"] == {"grad_reduce_dtype": ["bf16", "fp32"], "recompute": ["selective", "op"]}
    code, out = _cli("predict", "--megatron-args", str(tmp_path / "megatron_args.txt"), "--json")
    assert code == 0, out
    assert json.loads(out)["predicted_iteration_s"] == want["predicted_iteration_s"]
    code, out = _cli("predict", "--torchtitan", str(tmp_path / "torchtitan.toml"), "--json")
    assert code == 0, out
    assert json.loads(out)["predicted_iteration_s"] == tt_want["predicted_iteration_s"]


def test_predict_workload_writes_launch_files(tmp_path):
    model = tmp_path / "m.yaml"
    model.write_text("model: {name: m, layers: 8, hidden: 1024, heads: 16, seq: 1024, vocab: 8000}\n"
                     "cluster: {platform: a100-80gb, nodes: 1}\nglobal_batch: 32\n")
    code, out = _cli("predict", "--workload", str(model), "--set", "tp=2", "--set", "pp=2", "--launch",
                     str(tmp_path / "launch"), "--json")
    assert code == 0, out
    res = json.loads(out)
    assert res["launch"]["files"] == ["megatron_args.txt", "torchtitan.toml", "torchtitan_recipe.py"]
    assert "--tensor-model-parallel-size" in res["launch"]["megatron_args"]
    code, again = _cli("predict", "--megatron-args", str(tmp_path / "launch" / "megatron_args.txt"), "--json")
    assert code == 0 and json.loads(again)["predicted_iteration_s"] == res["predicted_iteration_s"]
    # tp=2 without sequence parallelism: torchtitan runs it with SP and fp32 gradients, predicted separately
    assert res["launch"]["torchtitan_changes"]["sequence_parallel"] == [False, True]
    code, tt = _cli("predict", "--torchtitan", str(tmp_path / "launch" / "torchtitan.toml"), "--json")
    assert code == 0 and json.loads(tt)["predicted_iteration_s"] == res["launch"]["torchtitan_predicted_iteration_s"]


@pytest.mark.parametrize("args, expected", [
    (["--megatron-args", "nope.txt"], "no such file"),
    (["--torchtitan", "{toml}"], "TOML syntax error"),
    (["--megatron-args", "{txt}"], "no Megatron-LM arguments"),
    (["--megatron-args", "{txt}", "--torchtitan", "{toml}"], "give one of"),
    (["--torchtitan", "{model_only}"], "give its shape: --workload MODEL.yaml"),
    (["--torchtitan", "{bad_header}"], "is not JSON"),
    (["--torchtitan", "{bad_shape}"], "not a transformer spec"),
    (["--megatron-args", "{bad_devices}"], "devices must be a positive integer"),
    (["--megatron-args", "{var}"], "a shell variable the file does not set"),
    (["--megatron-args", "{heads}", "--devices", "4"], "not divisible by 6 attention heads"),
])
def test_predict_bad_launch_files_exit_2_with_one_line(tmp_path, args, expected):
    files = {k: tmp_path / f"f{i}" for i, k in enumerate(
        ["{toml}", "{txt}", "{model_only}", "{bad_header}", "{bad_shape}", "{bad_devices}", "{var}", "{heads}"])}
    model = '"model": {"layers": "eight", "hidden": 64, "heads": 4, "seq": 8, "vocab": 10}'
    shape = "--num-layers 2 --hidden-size 64 --seq-length 8 --micro-batch-size 1"
    files["{toml}"].write_text("[parallelism\n")
    files["{txt}"].write_text("just words\n")
    files["{model_only}"].write_text('[model]\nname = "llama3"\n')
    files["{bad_header}"].write_text("# tuner: {oops\n[training]\n")
    files["{bad_shape}"].write_text("# tuner: {" + model + "}\n")
    files["{bad_devices}"].write_text('# tuner: {"devices": "x"}\n' + shape + " --num-attention-heads 4\n")
    files["{var}"].write_text(shape + " --num-attention-heads $HEADS\n")
    files["{heads}"].write_text(shape + " --num-attention-heads 6 --tensor-model-parallel-size 4\n")
    code, out = _cli("predict", *[str(files.get(a, a)) for a in args])
    assert code == 2
    assert "error:" in out and expected in out and "Traceback" not in out


@pytest.mark.slow
def test_parallel_example_best_plan_round_trips_to_the_same_prediction(tmp_path):
    """The example search's best plan -> megatron_args.txt / torchtitan.toml -> tuner predict: same seconds."""
    out = tmp_path / "out"
    code, text = _cli("search", str(REPO / "search_spaces" / "parallel.yaml"), "--out", str(out), "--workers", "0")
    assert code == 0, text
    res = json.loads((out / "results.json").read_text())
    best, launch = res["best"], res["launch"]
    assert launch["files"] == ["megatron_args.txt", "torchtitan.toml", "torchtitan_recipe.py"]
    code, mt = _cli("predict", "--megatron-args", str(out / "megatron_args.txt"), "--json")
    assert code == 0, mt
    mt = json.loads(mt)
    assert ParallelPlan(**mt["params"]) == ParallelPlan(**best["fields"])
    assert mt["predicted_iteration_s"] == best["predicted_iteration_s"]
    code, tt = _cli("predict", "--torchtitan", str(out / "torchtitan.toml"), "--json")
    assert code == 0, tt
    assert json.loads(tt)["predicted_iteration_s"] == launch["torchtitan_predicted_iteration_s"]


@pytest.mark.parametrize(("attention", "backend"), [("flash2", "flash"), ("flash_triton", "flash"), ("cudnn", "fused"),
                                                  ("te", "auto")])
def test_megatron_arguments_name_a_backend_megatron_accepts(attention, backend):
    args = megatron_args(replace(SPEC, attention=attention), PLANS[0])
    assert args[args.index("--attention-backend") + 1] == backend
    if attention in ("cudnn", "te"):  # Transformer Engine's fused backend is cuDNN's; auto is TE's choice
        assert read_megatron_args(args, devices=PLANS[0].devices).spec.attention == attention
    if attention == "te":  # Megatron's default backend is auto: a script without the flag runs TE's choice
        i = args.index("--attention-backend")
        assert read_megatron_args(args[:i] + args[i + 2:], devices=PLANS[0].devices).spec.attention == "te"


#: BigScience's tr11-176B-ml.slurm (BLOOM), its Megatron-DeepSpeed arguments with the shell variables expanded
BLOOM_ARGS = """pretrain_gpt.py --tensor-model-parallel-size 4 --pipeline-model-parallel-size 12
    --pp-partition-method 'type:transformer|embedding' --num-layers 70 --hidden-size 14336 --num-attention-heads 112
    --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 2 --rampup-batch-size 192 16 9_765_625
    --global-batch-size 2048 --tokenizer-type PretrainedFromHF --embed-layernorm --bf16
    --position-embedding-type alibi --checkpoint-activations --pad-vocab-size-to 250880 --optimizer adam
    --deepspeed --deepspeed_config ds_config.json --zero-stage 0 --deepspeed-activation-checkpointing"""


def test_megatron_deepspeed_launch_reads_as_bloom_ran():
    read = read_megatron_args(BLOOM_ARGS, "tr11-176B-ml.slurm", devices=384)
    s, p = read.spec, read.plan
    assert (s.layers, s.hidden, s.heads, s.seq, s.vocab) == (70, 14336, 112, 2048, 250880)
    assert s.position == "none" and s.attention == "unfused" and s.dtype == "bf16" and s.dropout == 0.1
    assert (p.tp, p.pp, p.dp, p.micro_batch, p.global_batch, p.recompute) == (4, 12, 8, 2, 2048, "full")
    # the embedding and the tied output layer take a layer's slot each: 72 slots, 6 a stage
    assert p.stage_layers == (5, *[6] * 10, 5)
    assert p.distributed_optimizer and p.deepspeed_bf16 and not p.fsdp and not p.pp_scatter_gather
    assert not p.overlap_grad_reduce and p.grad_reduce_dtype == "fp32"
    notes = " ".join(read.notes)
    assert "alibi read as none" in notes and "BF16 optimizer" in notes and "whole activation" in notes
    assert "--rampup-batch-size" in read.ignored and "--deepspeed_config" in read.ignored


@pytest.mark.parametrize("flags, shard, fsdp, bf16_optimizer", [
    ("--deepspeed --zero-stage 1 --fp16", True, False, False), ("--deepspeed --zero-stage 2 --bf16", True, False, False),
    ("--deepspeed --zero-stage 3 --bf16", False, True, False), ("--deepspeed --fp16", False, False, False),
    ("--deepspeed --bf16", True, False, True), ("--zero-stage 1 --bf16", False, False, False)])
def test_deepspeed_zero_stages_shard_as_deepspeed_does(flags, shard, fsdp, bf16_optimizer):
    base = "--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --micro-batch-size 1 "
    read = read_megatron_args(base + flags, devices=8)
    assert (read.plan.distributed_optimizer, read.plan.fsdp, read.plan.deepspeed_bf16_grads) == (shard, fsdp,
                                                                                                bf16_optimizer)
    if bf16_optimizer:  # Megatron-LM has no such optimizer: written as its distributed optimizer, with a comment
        text = megatron_launch_text(read.spec, read.plan, platform="a100-80gb", devices_per_node=8)
        assert "DeepSpeed's BF16 optimizer has no Megatron-LM flag" in text and "--use-distributed-optimizer" in text
    assert read.plan.pp_scatter_gather  # no pipeline: nothing to send
    piped = read_megatron_args(base + flags + " --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2",
                               devices=8)
    assert piped.plan.pp_scatter_gather == ("--deepspeed" not in flags)
    other = read_megatron_args(base + "--deepspeed --pp-partition-method parameters --pipeline-model-parallel-size 2",
                               devices=8)
    assert other.plan.stage_layers is None and any("parameters read as an even split" in n for n in other.notes)
    with pytest.raises(LaunchError, match="--zero-stage must be 0, 1, 2 or 3"):
        read_megatron_args(base + "--deepspeed --zero-stage 4", devices=8)


def test_bloom_launch_predicts_as_the_validations_bloom_row(tmp_path, multinode_validation):
    # the user's path (launch script + a catalog file naming the cluster's network) and the validation's row
    # (experiments/multinode_published.yaml, bigscience_176b) give one prediction
    import yaml

    row = next(r for r in multinode_validation.load_rows() if r.model == "BLOOM-176B" and r.spec["heads"] == 112
               and r.plan["global_batch"] == 2048)
    (tmp_path / "args.txt").write_text(BLOOM_ARGS)
    (tmp_path / "net.yaml").write_text(yaml.safe_dump({"a100-80gb": {"interconnect": row.network}}))
    out = CliRunner().invoke(app, ["predict", "--megatron-args", str(tmp_path / "args.txt"), "--devices", "384",
                                   "--catalog", str(tmp_path / "net.yaml"), "--json"])
    assert out.exit_code == 0, out.output
    predicted = json.loads(out.output)["predicted_iteration_s"]
    assert predicted == pytest.approx(multinode_validation.predict([row], "nccl", {})[0], rel=1e-9)  # the catalog's GEMM ceiling
    assert abs(predicted / row.measured_s - 1) < 0.10  # logged 104.70 s


def test_arguments_kept_in_string_variables_read_as_their_words():
    # BigScience's scripts: GPT_ARGS="..." and DEEPSPEED_ARGS="..." strings, joined in CMD="... $GPT_ARGS ..."
    script = """NLAYERS=70
NHIDDEN=14336
GPT_ARGS=" \\
    --pp-partition-method 'type:transformer|embedding' \\
    --num-layers $NLAYERS --hidden-size $NHIDDEN --num-attention-heads 112 \\
    --seq-length 2048 --micro-batch-size 2 --global-batch-size 2048 --bf16 --pad-vocab-size-to 250880 \\
    "
DEEPSPEED_ARGS=" --deepspeed --zero-stage 1 "
export CMD=" pretrain_gpt.py --tensor-model-parallel-size 4 --pipeline-model-parallel-size 12 $GPT_ARGS $DEEPSPEED_ARGS "
srun bash -c "$LAUNCHER $CMD"
"""
    read = read_megatron_args(script, "tr11.slurm", devices=384)
    assert (read.spec.layers, read.spec.hidden, read.spec.vocab, read.plan.tp, read.plan.pp) == (70, 14336, 250880, 4, 12)
    assert read.plan.stage_layers == (5, *[6] * 10, 5) and read.plan.distributed_optimizer
    with pytest.raises(LaunchError, match="cannot split into shell words"):
        read_megatron_args("GPT_ARGS=\"--num-layers 2 'unbalanced\"\n", devices=8)


def test_world_size_from_slurms_allocation_when_torchrun_reads_it_from_the_environment():
    from tuner.launch.megatron import slurm_allocation

    args = ("--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --micro-batch-size 1 "
            "--tensor-model-parallel-size 2")
    script = f"""#!/bin/bash
#SBATCH --job-name=x
#SBATCH --nodes=3            # three nodes
#SBATCH --gres=gpu:a100:8
NNODES=$SLURM_NNODES
srun torchrun --nproc_per_node 4 --nnodes $NNODES pretrain_gpt.py {args}
"""
    read = read_megatron_args(script, "job.slurm")
    assert read.devices == 12 and read.plan.dp == 6 and read.devices_per_node == 4  # torchrun's 4 per node
    assert any("Slurm's 3 nodes" in n for n in read.notes)
    no_torchrun = read_megatron_args(f"#SBATCH -N 2\n#SBATCH --gpus-per-node=8\npython pretrain_gpt.py {args}\n")
    assert no_torchrun.devices == 16 and no_torchrun.devices_per_node == 8
    assert slurm_allocation("#SBATCH --nodes=2-4\n#SBATCH --gres=gpu:0\n") == {}  # a range, no GPUs: not read
    with pytest.raises(LaunchError, match="world size is unknown"):
        read_megatron_args(f"#SBATCH --nodes=2-4\npython pretrain_gpt.py {args}\n")


def test_cpu_offloading_is_named_as_not_modelled():
    args = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "128",
            "--micro-batch-size", "1", "--vocab-size", "1000", "--cpu-offloading", "--cpu-offloading-num-layers", "2"]
    notes = read_megatron_args(args, devices=1).notes
    assert sum("--cpu-offloading is not modelled" in n for n in notes) == 1


def test_the_local_transformer_implementation_runs_megatrons_own_attention():
    args = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "128",
            "--micro-batch-size", "1", "--vocab-size", "1000"]
    assert read_megatron_args(args, devices=1).spec.attention == "te"
    assert read_megatron_args([*args, "--transformer-impl", "local"], devices=1).spec.attention == "unfused"
    assert read_megatron_args([*args, "--transformer-impl", "local", "--use-flash-attn"], devices=1).spec.attention \
        == "flash2"
    assert read_megatron_args([*args, "--transformer-impl", "local", "--attention-backend", "flash"],
                              devices=1).spec.attention == "flash"
    with pytest.raises(LaunchError, match="--transformer-impl must be"):
        read_megatron_args([*args, "--transformer-impl", "fast"], devices=1)


@pytest.mark.parametrize(("flags", "note"), [(["--cp-comm-type", "a2a"], "--cp-comm-type a2a"),
                                             (["--cp-comm-type", "p2p"], None),
                                             (["--moe-token-dispatcher-type", "allgather"], "dispatcher-type allgather"),
                                             (["--moe-token-dispatcher-type", "alltoall"], None)])
def test_communication_kinds_tuner_prices_otherwise_are_named(flags, note):
    args = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "128",
            "--micro-batch-size", "1", "--vocab-size", "1000", *flags]
    notes = read_megatron_args(args, devices=1).notes
    assert any(note in n for n in notes) if note else not any(flags[0] in n for n in notes)


def test_a_compiled_torchtitan_job_says_compilation_is_not_modelled():
    from tuner.launch.torchtitan import COMPILE_NOTE, LOSS_COMPILE_NOTE, read_torchtitan_toml

    job = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n'
           '[parallelism]\ndata_parallel_shard_degree = -1\n')

    def read(compile_section: str):
        return read_torchtitan_toml(job + "[compile]\n" + compile_section, "j.toml", devices=8)

    both = read("enable = true\n")  # torchtitan compiles the model and the loss by default
    assert COMPILE_NOTE in both.notes and LOSS_COMPILE_NOTE in both.notes and both.spec.fused_loss
    assert not read("enable = false\n").spec.fused_loss and COMPILE_NOTE not in read("enable = false\n").notes
    loss = read('enable = true\ncomponents = ["loss"]\n')  # the DeepSeek-V3 and Llama 4 configs' choice
    assert loss.spec.fused_loss and COMPILE_NOTE not in loss.notes
    model = read('enable = true\ncomponents = ["model"]\n')
    assert not model.spec.fused_loss and COMPILE_NOTE in model.notes
    # the compiled loss keeps its logits once: less memory than eager's fp32 log-softmax
    mem = {r.spec.fused_loss: predict_plan(r.spec, r.plan, H100, devices=8)[0]["memory_bytes_per_device"]
           for r in (loss, model)}
    assert mem[True] < mem[False]


#: the model cards' parameter counts, billions (Llama 4 Scout's text model; DeepSeek-V3 without its MTP module)
MOE_FLAVORS = {("qwen3", "30B-A3B"): 30.5, ("qwen3", "235B-A22B"): 235.0, ("deepseek_v3", "16B"): 15.7,
               ("deepseek_v3", "236B"): 236.0, ("deepseek_v3", "671B"): 671.0, ("llama4", "17bx16e"): 109.0,
               ("llama4", "17bx128e"): 400.0}


@pytest.mark.parametrize("name,flavor", list(MOE_FLAVORS))
def test_torchtitan_moe_flavors_read_with_their_shape(name, flavor):
    """torchtitan v0.2.2's mixture-of-experts flavors: the TOMLs it ships read with the flavor's experts (and
    DeepSeek's multi-latent attention), their parameter counts within 2 % of the model cards."""
    toml = (f'[model]\nname = "{name}"\nflavor = "{flavor}"\n[training]\nlocal_batch_size = 1\nseq_len = 4096\n'
            '[parallelism]\ndata_parallel_shard_degree = -1\nexpert_parallel_degree = 8\n'
            '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "op"\n')
    read = read_torchtitan_toml(toml, "moe.toml", devices=64)
    spec = read.spec
    assert spec.moe is not None and (spec.mla is not None) == (name == "deepseek_v3") and spec.program == "eager"
    assert spec.param_count() / 1e9 == pytest.approx(MOE_FLAVORS[name, flavor], rel=0.02)
    assert read.plan.ep == 8 and read.plan.recompute == "op" and read.plan.etp == 1
    assert any("torchtitan's flavor" in n for n in read.notes)


def test_torchtitan_deepseek_v3_16b_predicts_from_its_own_toml():
    """torchtitan's deepseek_v3_16b.toml (v0.2.2: FSDP with EP 8, op-level checkpointing, FlexAttention, the
    loss compiled) on 8 H100s; slower kernels make it slower."""
    toml = ('[model]\nname = "deepseek_v3"\nflavor = "16B"\n[training]\nlocal_batch_size = 4\nseq_len = 4096\n'
            '[parallelism]\ndata_parallel_shard_degree = -1\nexpert_parallel_degree = 8\n'
            'expert_tensor_parallel_degree = 1\n[activation_checkpoint]\nmode = "selective"\n'
            'selective_ac_option = "op"\n[compile]\nenable = true\ncomponents = ["loss"]\n')
    read = read_torchtitan_toml(toml, "deepseek_v3_16b.toml", devices=8)
    assert read.spec.attention == "flex" and read.spec.fused_loss and read.spec.mla.q_lora_rank == 0
    out, _ = predict_plan(read.spec, read.plan, H100, devices=8)
    assert out["feasible"] and out["predicted_iteration_s"] > 0.0
    slow = H100.model_copy(update={"peak_flops": {k: v / 2 for k, v in H100.peak_flops.items()}})
    assert predict_plan(read.spec, read.plan, slow, devices=8)[0]["predicted_iteration_s"] > out["predicted_iteration_s"]


def test_launch_of_an_mtp_model_predicts_torchtitan_without_it(tmp_path):
    """torchtitan trains no multi-token prediction: its launch drops the MTP layer and its prediction prices the model
    without it, as the written TOML reads back."""
    model = tmp_path / "m.yaml"
    model.write_text("model: {name: m, layers: 8, hidden: 1024, heads: 16, seq: 1024, vocab: 8000, mtp_layers: 1,\n"
                     "        tie_embeddings: false}\ncluster: {platform: a100-80gb, nodes: 1}\nglobal_batch: 32\n")
    code, out = _cli("predict", "--workload", str(model), "--set", "tp=2", "--set", "sequence_parallel=true",
                     "--set", "grad_reduce_dtype=fp32", "--launch", str(tmp_path / "launch"), "--json")
    assert code == 0, out
    res = json.loads(out)
    assert res["launch"]["torchtitan_changes"]["mtp_layers"] == [1, 0]
    assert res["launch"]["torchtitan_predicted_iteration_s"] < res["predicted_iteration_s"]
    code, tt = _cli("predict", "--torchtitan", str(tmp_path / "launch" / "torchtitan.toml"), "--json")
    assert code == 0 and json.loads(tt)["predicted_iteration_s"] == res["launch"]["torchtitan_predicted_iteration_s"]
