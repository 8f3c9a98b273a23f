"""FP8 linears' memory (fp8 saved inputs) and FP8 parameters (``fp8_params``: fp8 weights, gathered in fp8)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec, build_transformer_graph
from predictor.sources.synth.transformer_memory import (
    activation_bytes_per_layer,
    fp8_weight_params,
    memory_per_stage,
)
from predictor.sources.synth.transformer_spec import PlanError
from predictor.timing.platforms import get_platform
from tuner.launch import LaunchError
from tuner.launch.megatron import megatron_args, read_megatron_args

LLAMA = TransformerSpec(layers=8, hidden=4096, heads=32, kv_heads=8, ffn=14336, mlp="swiglu", seq=8192, vocab=128256,
                        dropout=0.0, bias=False, position="rope", attention="te")
FP8 = replace(LLAMA, fp8_linear=True)
PLAN = ParallelPlan(tp=1, pp=1, dp=8, global_batch=64, distributed_optimizer=True, overlap_param_gather=True)


def test_fp8_linears_keep_their_inputs_in_one_byte():
    s, h, f = LLAMA.seq, LLAMA.hidden, LLAMA.ffn_size
    saved = activation_bytes_per_layer(LLAMA, PLAN) - activation_bytes_per_layer(FP8, PLAN)
    assert saved == pytest.approx(s * (2 * h + LLAMA.attn_size + f))  # QKV, FC1, projection and FC2 inputs
    sp = replace(PLAN, tp=4, dp=2, sequence_parallel=True)
    saved_sp = activation_bytes_per_layer(LLAMA, sp) - activation_bytes_per_layer(FP8, sp)
    assert saved_sp == pytest.approx(saved / 4)
    full = replace(PLAN, recompute="full")  # the layer input alone, 16-bit either way
    assert activation_bytes_per_layer(FP8, full) == activation_bytes_per_layer(LLAMA, full)


def test_fp8_parameters_store_the_layers_weights_in_one_byte():
    params = replace(FP8, fp8_params=True)
    before, after = memory_per_stage(FP8, PLAN)[0], memory_per_stage(params, PLAN)[0]
    fp8 = fp8_weight_params(params, PLAN, 0)
    assert 0.7 * after.params < fp8 < after.params  # the layers' weights; the embeddings and norms stay 16-bit
    assert before.weights_bytes - after.weights_bytes == pytest.approx(fp8)
    assert before.optimizer_bytes == after.optimizer_bytes and before.grads_bytes == after.grads_bytes
    assert fp8_weight_params(FP8, PLAN, 0) == 0.0
    with pytest.raises(PlanError, match="fp8_params needs fp8_linear"):
        replace(LLAMA, fp8_params=True).validate()


@pytest.mark.parametrize("overlap", [True, False])
def test_fp8_parameters_are_gathered_in_fp8(overlap):
    plat = get_platform("h100-sxm")
    from predictor.sources.synth.transformer import transformer_timing

    def gathered(spec: TransformerSpec) -> float:
        g = build_transformer_graph(spec, replace(PLAN, overlap_param_gather=overlap), detail="stage",
                                    timing=transformer_timing(plat))
        names = np.asarray(g.names, dtype=object)[g.name].astype(str)
        return float(np.nansum(g.params["msg_bytes"][names == "param.all_gather"]))  # host tasks: NaN

    bf16, fp8 = gathered(FP8), gathered(replace(FP8, fp8_params=True))
    stage = memory_per_stage(FP8, PLAN)[0]
    assert fp8 == pytest.approx(bf16 - fp8_weight_params(replace(FP8, fp8_params=True), PLAN, 0), rel=1e-6)
    assert fp8 < 0.7 * bf16 and bf16 == pytest.approx(2.0 * stage.params, rel=1e-6)


def test_megatron_reads_and_writes_fp8_param_gather():
    args = ["--num-layers", "8", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "8192",
            "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16", "--fp8-format", "hybrid",
            "--fp8-param-gather", "--use-distributed-optimizer"]
    plan = read_megatron_args(args, devices=8)
    assert plan.spec.fp8_linear and plan.spec.fp8_params
    assert "--fp8-param-gather" in megatron_args(plan.spec, plan.plan)
    assert not read_megatron_args([a for a in args if a != "--fp8-param-gather"], devices=8).spec.fp8_params
    with pytest.raises(LaunchError, match="--fp8-param-gather needs --fp8-format"):
        read_megatron_args([a for a in args if a not in ("--fp8-format", "hybrid")], devices=8)


#: the model, precision and plan flags of Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh (d98e8a6),
#: its arrays as the script writes them (FP8 and data flags quoted, each with its value)
LLAMA3_8B_H100_FP8 = """\
GPUS_PER_NODE=8
NUM_NODES=1
SEQ_LENGTH=8192
DISTRIBUTED_ARGS=(--nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES)
MODEL_ARGS=(--use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
    --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128
    --seq-length $SEQ_LENGTH --position-embedding-type rope --attention-dropout 0.0 --hidden-dropout 0.0
    --swiglu --normalization RMSNorm --attention-backend fused --untie-embeddings-and-output-weights
    --disable-bias-linear)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 128 --bf16 --grad-reduce-in-bf16
    --cross-entropy-loss-fusion --tensor-model-parallel-size 1 --context-parallel-size 1 --sequence-parallel
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
DTYPE_ARGS=("--fp8-format hybrid" "--fp8-amax-history-len 1024" "--fp8-amax-compute-algo max" "--fp8-param-gather")
DATA_ARGS_LIST=("--mock-data" "--tokenizer-type NullTokenizer" "--vocab-size 128256" "--split '99,1,0'")
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${DTYPE_ARGS[@]} \\
    ${DATA_ARGS_LIST[@]}
"""


def test_megatron_lms_llama3_8b_fp8_example_fits_its_8_h100s():
    """Megatron-LM ships this plan for one 8-GPU H100 node: read as written (FP8 linears, FP8 weights, 128,256
    tokens) it fits; the same plan with 16-bit saved inputs and weights would not."""
    plat = get_platform("h100-sxm")
    lp = read_megatron_args(LLAMA3_8B_H100_FP8, "train_llama3_8b_h100_fp8.sh")
    assert (lp.devices, lp.spec.vocab, lp.spec.fp8_linear, lp.spec.fp8_params) == (8, 128256, True, True)
    fits = memory_per_stage(lp.spec, lp.plan)[0].total_bytes
    as_bf16 = memory_per_stage(replace(lp.spec, fp8_linear=False, fp8_params=False), lp.plan)[0].total_bytes
    assert fits < 0.9 * plat.memory_bytes < plat.memory_bytes < as_bf16


def test_torchaos_float8_linears_keep_their_16_bit_inputs():
    """The eager program's FP8 linears (torchao's Float8Linear, torchtitan) save the high-precision input."""
    eager = replace(LLAMA, program="eager")
    assert activation_bytes_per_layer(replace(eager, fp8_linear=True), PLAN) == activation_bytes_per_layer(eager, PLAN)


def test_fsdp_gathers_the_layers_weights_in_fp8():
    """torchtitan's enable_fsdp_float8_all_gather (and Megatron-FSDP's --fp8-param-gather): each layer's weights
    gathered and held in fp8, the root unit (embedding, head) and the sharded master weights as before."""
    from predictor.sources.synth.transformer import transformer_timing

    eager = replace(FP8, program="eager")
    plan = ParallelPlan(dp=8, global_batch=64, fsdp=True, fsdp2=True)
    plat = get_platform("h100-sxm")

    def gathered(spec: TransformerSpec) -> tuple[float, float]:
        g = build_transformer_graph(spec, plan, detail="kernel", timing=transformer_timing(plat))
        names = np.asarray(g.names, dtype=object)[g.name].astype(str)
        msg = g.params["msg_bytes"]
        layers = np.char.startswith(names, "fsdp.layer") & (np.char.find(names, "all_gather") >= 0)
        return float(np.nansum(msg[layers])), float(np.nansum(msg[names == "fsdp.root.all_gather"]))

    (bf16_layers, bf16_root), (fp8_layers, fp8_root) = gathered(eager), gathered(replace(eager, fp8_params=True))
    assert fp8_root == bf16_root > 0 and 0.5 * bf16_layers < fp8_layers < 0.51 * bf16_layers
    before, after = memory_per_stage(eager, plan)[0], memory_per_stage(replace(eager, fp8_params=True), plan)[0]
    assert after.buffers_bytes < before.buffers_bytes and after.weights_bytes == before.weights_bytes


def test_torchtitan_reads_and_writes_fsdp_float8_all_gather():
    from tuner.launch.torchtitan import read_torchtitan_toml, torchtitan_toml

    job = ('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n[training]\nlocal_batch_size = 1\n'
           'seq_len = 8192\n[parallelism]\ndata_parallel_shard_degree = -1\n')
    for section in ("[float8]", "[quantize.linear.float8]"):  # torchtitan v0.1's and v0.2's
        lp = read_torchtitan_toml(job + f"{section}\nenable_fsdp_float8_all_gather = true\n", "j.toml", devices=8)
        assert lp.spec.fp8_linear and lp.spec.fp8_params
        assert "enable_fsdp_float8_all_gather = true" in torchtitan_toml(lp.spec, lp.plan)
    assert not read_torchtitan_toml(job, "j.toml", devices=8).spec.fp8_params
    rowwise = read_torchtitan_toml(job + '[quantize.linear.float8]\nrecipe_name = "rowwise"\n', "j.toml", devices=8)
    assert any(n.startswith("float8 recipe_name rowwise: priced as tensor-wise") for n in rowwise.notes)
    assert not any("recipe_name" in n for n in read_torchtitan_toml(job, "j.toml", devices=8).notes)


def test_fp8_linears_need_a_chip_with_an_fp8_peak():
    from tuner.plans import predict_plan

    with pytest.raises(PlanError, match="a100-80gb has no FP8 peak"):
        predict_plan(FP8, PLAN, get_platform("a100-80gb"), devices=8)
    res, _ = predict_plan(FP8, PLAN, get_platform("h100-sxm"), devices=8)
    assert res["predicted_iteration_s"] > 0
