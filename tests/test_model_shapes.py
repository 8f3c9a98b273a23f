"""Shapes of models tuner did not write: fine-grained MoE (each expert's own FFN width, a shared expert:
DeepSeek, Qwen MoE) and heads wider than hidden / heads (kv_channels: Qwen3, Gemma)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from predictor.sources.synth.transformer import (
    MLASpec,
    MoESpec,
    ParallelPlan,
    PlanError,
    TransformerSpec,
    build_transformer_graph,
    check_plan,
)
from predictor.sources.synth.transformer_matmuls import layer_matmuls
from predictor.sources.synth.transformer_memory import (
    activation_bytes_per_layer,
    expert_params_per_device,
    fp8_weight_params,
    layer_norm_params,
    layer_param_count,
    memory_per_stage,
)
from predictor.timing.platforms import get_platform
from tuner.launch import LaunchError, megatron_args, read_megatron_args
from tuner.plans import predict_plan

#: Qwen1.5-MoE-A2.7B (its model card and config.json: 24 layers, hidden 2048, 16 heads, vocab 151936, 60 experts
#: of width 1408, top 4, a shared expert of width 5632, SwiGLU, untied output): 14.3B parameters, 2.7B activated
QWEN_MOE = TransformerSpec(layers=24, hidden=2048, heads=16, seq=8192, vocab=151936, mlp="swiglu",
                           tie_embeddings=False, moe=MoESpec(experts=60, top_k=4, ffn=1408, shared_ffn=5632))
#: Qwen3-30B-A3B (its config.json: 48 layers, hidden 2048, 32 heads of 128 with 4 key/value heads, 128 experts of
#: width 768, top 8, vocab 151936, untied output): 30.5B parameters, 3.3B activated
QWEN3_MOE = TransformerSpec(layers=48, hidden=2048, heads=32, kv_heads=4, kv_channels=128, seq=4096, vocab=151936,
                            mlp="swiglu", tie_embeddings=False, moe=MoESpec(experts=128, top_k=8, ffn=768))
H100 = get_platform("h100-sxm")
SMALL = TransformerSpec(layers=4, hidden=512, heads=8, seq=256, vocab=1000, mlp="swiglu",
                        moe=MoESpec(experts=8, top_k=2, ffn=256, shared_ffn=768))


def test_published_parameter_counts():
    assert QWEN_MOE.param_count() == pytest.approx(14.3e9, rel=5e-3)
    h = QWEN_MOE.hidden
    per_layer = 4 * h * h + 4 * QWEN_MOE.mlp_param_count(1408) + QWEN_MOE.mlp_param_count(5632) + 60 * h
    assert 24 * per_layer + 2 * QWEN_MOE.vocab * h == pytest.approx(2.7e9, rel=5e-3)  # activated


def test_heads_wider_than_hidden_over_heads():
    spec = QWEN3_MOE
    assert spec.param_count() == pytest.approx(30.5e9, rel=5e-3)
    h = spec.hidden
    per_layer = h * spec.qkv_size + spec.attn_size * h + 8 * spec.mlp_param_count(768) + 128 * h
    assert 48 * per_layer + 2 * spec.vocab * h == pytest.approx(3.3e9, rel=2e-2)  # activated
    assert (spec.qkv_size, spec.attn_size) == (32 * 128 + 2 * 4 * 128, 32 * 128)
    small = TransformerSpec(layers=2, hidden=512, heads=8, kv_channels=128, seq=256, vocab=1000)
    plan = ParallelPlan(tp=2, pp=1, dp=1, micro_batch=1, global_batch=1)
    df = build_transformer_graph(small, plan, detail="kernel").tasks_frame()
    df = df[(df["rank"] == 0) & (df.processor != "cpu")]
    T = small.seq
    assert df[df.name == "layer[0].qkv.addmm"].flops.iloc[0] == pytest.approx(2 * T * 512 * 3 * 8 * 128 / 2)
    assert df[df.name == "layer[0].attn_proj.mm"].flops.iloc[0] == pytest.approx(2 * T * 512 * 8 * 128 / 2)
    base = replace(small, kv_channels=None)  # 64-wide heads
    assert memory_per_stage(small, plan)[0].activations_bytes > memory_per_stage(base, plan)[0].activations_bytes
    args = megatron_args(small, plan)
    assert args[args.index("--kv-channels") + 1] == "128"
    assert read_megatron_args(args, devices=2).spec.kv_channels == 128
    assert read_megatron_args(megatron_args(base, plan), devices=2).spec.kv_channels is None
    assert "--kv-channels" not in megatron_args(base, plan)


def test_expert_and_shared_gemms_carry_their_widths_and_tp_splits_only_the_shared_one():
    plan = ParallelPlan(tp=2, pp=1, dp=4, ep=2, micro_batch=2, global_batch=16, sequence_parallel=True)
    df = build_transformer_graph(SMALL, plan, detail="kernel").tasks_frame()
    df = df[(df["rank"] == 0) & (df.processor != "cpu")]  # the kernels (their launches carry the name too)
    T = plan.micro_batch * SMALL.seq
    routed = T / plan.tp * SMALL.moe.top_k  # TP ranks split the tokens they route
    fc1 = df[df.name == "layer[0].experts.fc1"].flops.iloc[0]  # one micro-batch
    assert fc1 == pytest.approx(2 * routed * SMALL.hidden * 2 * 256)  # gate and up of width 256
    shared = df[df.name == "layer[0].shared_expert.fc1.addmm"].flops.iloc[0]
    assert shared == pytest.approx(2 * T * SMALL.hidden * 2 * 768 / plan.tp)
    assert (df.name == "layer[0].shared_expert.mlp_output_reduce_scatter").any()
    # parameters a device holds: local experts whole, the shared expert split over TP
    h = SMALL.hidden
    mlp = 8 * h + 8 / 2 * SMALL.mlp_param_count(256) + (SMALL.mlp_param_count(768) - h) / 2 + h
    assert layer_param_count(SMALL, 2, 2) == pytest.approx(SMALL.hidden * SMALL.qkv_size / 2 + SMALL.qkv_size / 2
                                                           + h * h / 2 + h + 4 * h + mlp)


def test_wider_experts_or_a_shared_expert_cost_time_and_memory():
    plat = get_platform("h100-sxm")
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=8)
    base = replace(SMALL, moe=MoESpec(experts=8, top_k=2, ffn=256))
    times, mems = [], []
    for spec in (base, replace(SMALL, moe=MoESpec(experts=8, top_k=2, ffn=512)), SMALL):
        r, _ = predict_plan(spec, plan, plat, detail="kernel")
        times.append(r["predicted_iteration_s"])
        mems.append(max(m.total_bytes for m in memory_per_stage(spec, plan)))
    assert times[1] > times[0] and times[2] > times[0]
    assert mems[1] > mems[0] and mems[2] > mems[0]


def test_megatron_flags_round_trip_and_bad_widths():
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=4, micro_batch=1, global_batch=8)
    args = megatron_args(SMALL, plan)
    assert args[args.index("--moe-ffn-hidden-size") + 1] == "256"
    assert args[args.index("--moe-shared-expert-intermediate-size") + 1] == "768"
    back = read_megatron_args(args, devices=8)
    assert back.spec == replace(SMALL, name="megatron-model") and back.plan == plan
    freq = read_megatron_args(args + ["--moe-layer-freq", "([0]+[1]*3)"], devices=8)
    assert freq.spec.moe.dense_layers == 1 and not any("--moe-layer-freq" in n for n in freq.notes)
    # without --moe-grouped-gemm Megatron runs its SequentialMLP: one expert's GEMM after another
    assert "--moe-grouped-gemm" in args
    loop = read_megatron_args([a for a in args if a != "--moe-grouped-gemm"], devices=8).spec
    assert not loop.moe.grouped_gemm and "--moe-grouped-gemm" not in megatron_args(loop, plan)
    qwen = replace(QWEN3_MOE, layers=4)  # 16 experts of width 768 a rank: small GEMMs, one at a time or four
    times = [predict_plan(replace(qwen, moe=replace(qwen.moe, grouped_gemm=g)), plan, H100, devices=8)[0]
             ["predicted_iteration_s"] for g in (True, False)]
    assert times[1] > times[0]
    with pytest.raises(PlanError, match="expert widths"):
        replace(SMALL, moe=MoESpec(experts=8, ffn=0)).validate()


def test_first_layers_dense():
    """An MoE model's first layers with a dense MLP (DeepSeek's first_k_dense_replace): their weights, GEMMs,
    gradient buckets and the memory of the stages holding them, on however many pipeline chunks they span."""
    dense2 = replace(SMALL, moe=replace(SMALL.moe, dense_layers=2))
    h = SMALL.hidden
    dense_mlp, moe_mlp = SMALL.mlp_param_count(SMALL.ffn_size), (8 * h + 8 * SMALL.mlp_param_count(256)
                                                                 + SMALL.mlp_param_count(768))
    assert dense2.param_count() - SMALL.param_count() == pytest.approx(2 * (dense_mlp - moe_mlp))
    plan = ParallelPlan(tp=1, pp=2, dp=2, ep=2, micro_batch=1, global_batch=4)
    df = build_transformer_graph(dense2, plan, detail="kernel").tasks_frame()
    names = set(df.name)
    assert {"layer[0].fc1.addmm", "layer[1].fc1.addmm", "layer[0].experts.fc1"} <= names  # stage 1's layer[0]
    first = df[(df["rank"] == 0) & (df.processor != "cpu")]
    assert not first.name.str.startswith("layer[0].experts").any() and (first.name == "layer[0].fc1.addmm").any()
    plain, mixed = memory_per_stage(SMALL, plan), memory_per_stage(dense2, plan)
    assert mixed[0].params != plain[0].params and mixed[1].params == plain[1].params
    # three dense layers span both stages (DeepSeek-V3's under a flexible layout): stage 1's first layer is dense
    dense3 = replace(SMALL, moe=replace(SMALL.moe, dense_layers=3))
    df3 = build_transformer_graph(dense3, plan, detail="kernel").tasks_frame()
    second = df3[(df3["rank"] == 1) & (df3.processor != "cpu")]
    assert (second.name == "layer[0].fc1.addmm").any() and not second.name.str.startswith("layer[0].experts").any()
    assert second.name.str.startswith("layer[1].experts").any()
    assert memory_per_stage(dense3, plan)[1].params != plain[1].params
    args = megatron_args(dense2, plan)
    assert args[args.index("--moe-layer-freq") + 1] == "([0]*2+[1]*2)"
    assert read_megatron_args(args, devices=4).spec == replace(dense2, name="megatron-model")
    i = args.index("--moe-layer-freq")
    interleaved = read_megatron_args(args[:i + 1] + ["([1]*1+[0]*1)*2"] + args[i + 2:], devices=4)
    assert interleaved.spec.moe.dense_layers == 0 and any("--moe-layer-freq" in n for n in interleaved.notes)
    # Megatron's integer n (MoE at layers 0, n, 2n, ...) and that list: every n-th layer, the count in the note
    assert (interleaved.spec.moe.dense_layers, interleaved.spec.moe.every) == (0, 2)
    every2 = read_megatron_args(args[:i + 1] + ["2"] + args[i + 2:], devices=4)
    assert (every2.spec.moe.dense_layers, every2.spec.moe.every) == (0, 2)
    assert any("MoE at layers 0, 2, 4, ... (2 of 4) priced as layers 1, 3, ... (2)" in n for n in every2.notes)
    odd = read_megatron_args(args[:i + 1] + ["[1,1,0,1]"] + args[i + 2:], devices=4)
    assert odd.spec.moe.every == 1 and any("read as every layer an MoE layer" in n for n in odd.notes)


def test_deepseek_v3_without_its_latent_attention():
    """DeepSeek-V3 (its config.json: 61 layers, hidden 7168, 128 heads, 256 experts of width 2048, top 8, one
    shared expert of 2048, the first 3 layers dense with ffn 18432, vocab 129280): 671B parameters, 37B
    activated. Read with multi-head attention of the same width in place of its multi-latent attention (a
    spec without ``mla``), the total holds within 0.5 % and the activated within 5 %."""
    spec = TransformerSpec(layers=61, hidden=7168, heads=128, seq=4096, vocab=129280, mlp="swiglu", ffn=18432,
                           tie_embeddings=False,
                           moe=MoESpec(experts=256, top_k=8, ffn=2048, shared_ffn=2048, dense_layers=3))
    assert spec.param_count() == pytest.approx(671e9, rel=5e-3)
    h = spec.hidden
    attn = h * spec.qkv_size + spec.attn_size * h
    active = (58 * (attn + 9 * spec.mlp_param_count(2048) + 256 * h) + 3 * (attn + spec.mlp_param_count(18432))
              + 2 * spec.vocab * h)
    assert active == pytest.approx(37e9, rel=5e-2)


def test_multi_latent_attention():
    """DeepSeek's multi-latent attention: four projections (the down ones whole on every TP rank), query/key
    heads of qk + rope width and value heads of their own; DeepSeek-V3 and V2-Lite parameter counts."""
    v3 = TransformerSpec(layers=61, hidden=7168, heads=128, seq=4096, vocab=129280, mlp="swiglu", ffn=18432,
                         tie_embeddings=False, mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512),
                         moe=MoESpec(experts=256, top_k=8, ffn=2048, shared_ffn=2048, dense_layers=3))
    assert v3.param_count() == pytest.approx(671e9, rel=1e-3)
    # DeepSeek-V2-Lite (config.json: 27 layers, hidden 2048, 16 heads, no query latent, kv latent 512, 64 experts
    # of 1408, top 6, 2 shared experts of 1408, the first layer dense with ffn 10944, vocab 102400): 15.7 B
    lite = TransformerSpec(layers=27, hidden=2048, heads=16, seq=4096, vocab=102400, mlp="swiglu", ffn=10944,
                           tie_embeddings=False, mla=MLASpec(q_lora_rank=0, kv_lora_rank=512),
                           moe=MoESpec(experts=64, top_k=6, ffn=1408, shared_ffn=2816, dense_layers=1))
    assert lite.param_count() == pytest.approx(15.7e9, rel=5e-3)
    small = TransformerSpec(layers=2, hidden=512, heads=8, seq=256, vocab=1000, mla=MLASpec(q_lora_rank=128,
                            kv_lora_rank=64, qk_head_dim=32, rope_head_dim=16, v_head_dim=32))
    plan = ParallelPlan(tp=2, pp=1, dp=1, micro_batch=1, global_batch=1, sequence_parallel=True)
    df = build_transformer_graph(small, plan, detail="kernel").tasks_frame()
    df = df[(df["rank"] == 0) & (df.processor != "cpu")]
    T = small.seq
    assert df[df.name == "layer[0].mla_down.mm"].flops.iloc[0] == pytest.approx(2 * T * 512 * (64 + 16 + 128))
    assert df[df.name == "layer[0].kv_up.mm"].flops.iloc[0] == pytest.approx(2 * T * 64 * 8 * (32 + 32) / 2)
    attn = df[df.name == "layer[0].flash_attn_fwd"].flops.iloc[0]
    assert attn == pytest.approx(2 * T * T * 8 / 2 * (48 + 32) * 0.5)  # causal, 4 local heads
    assert df[df.name == "layer[0].attn_proj.mm"].flops.iloc[0] == pytest.approx(2 * T * 512 * 8 * 32 / 2)
    wider = replace(small, mla=replace(small.mla, qk_head_dim=64))
    assert memory_per_stage(wider, plan)[0].activations_bytes > memory_per_stage(small, plan)[0].activations_bytes
    args = megatron_args(small, plan)
    assert read_megatron_args(args, devices=2).spec == replace(small, name="megatron-model")
    with pytest.raises(PlanError, match="fused attention"):
        replace(small, attention="unfused").validate()


@pytest.mark.parametrize("program", ["megatron", "eager"])
def test_no_dropout_runs_no_dropout_kernel_and_stores_no_mask(program):
    """Llama, Qwen and MPT train without dropout: no dropout kernels or mask multiplies, and per layer two
    ``s b h`` masks fewer (the scores' mask and output too, unfused)."""
    base = TransformerSpec(layers=2, hidden=512, heads=8, seq=256, vocab=1000, program=program, attention="unfused")
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=2, global_batch=2)

    def kinds(spec):
        df = build_transformer_graph(spec, plan, detail="kernel").tasks_frame()
        return df[(df["rank"] == 0) & (df.processor != "cpu")]

    with_dropout, without = kinds(base), kinds(replace(base, dropout=0.0))
    assert (with_dropout.kind == "dropout").sum() > 0 and (without.kind == "dropout").sum() == 0
    assert (without.kind == "mul").sum() < (with_dropout.kind == "mul").sum()
    s, b, h, a = 256, 2, 512, 8
    saved = memory_per_stage(base, plan)[0].activations_bytes - memory_per_stage(replace(base, dropout=0.0), plan)[0].activations_bytes
    per_layer = 2 * s * b * h + 3 * a * s * s * b  # two hidden masks; the scores' mask (1 byte) and output (2)
    assert saved == pytest.approx(2 * per_layer + s * b * h)  # and the embedding's mask
    plat = get_platform("a100-80gb")
    t = [predict_plan(spec, plan, plat)[0]["predicted_iteration_s"] for spec in (base, replace(base, dropout=0.0))]
    assert t[1] < t[0]
    with pytest.raises(PlanError, match="dropout must be a probability"):
        replace(base, dropout=1.0).validate()


def test_linears_without_bias_sum_no_bias_gradient():
    """Eager autograd sums a bias gradient per linear layer (a column sum); Llama's bias-free linears have none."""
    base = TransformerSpec(layers=2, hidden=512, heads=8, seq=256, vocab=1000, program="eager")
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1)
    names = [build_transformer_graph(spec, plan, detail="kernel").tasks_frame().name
             for spec in (base, replace(base, bias=False))]
    assert names[0].str.endswith("bias_grad").sum() == 2 * 4 and names[1].str.endswith("bias_grad").sum() == 0
    assert (names[1] == "layer[0].qkv.mm").any() and not names[1].str.endswith(".addmm").any()


def test_megatron_dropout_and_bias_flags_round_trip():
    spec = replace(SMALL, moe=None, dropout=0.0, bias=False)
    plan = ParallelPlan(tp=2, pp=1, dp=4, micro_batch=1, global_batch=8)
    args = megatron_args(spec, plan)
    assert "--disable-bias-linear" in args and args[args.index("--hidden-dropout") + 1] == "0"
    back = read_megatron_args(args, devices=8)
    assert (back.spec.dropout, back.spec.bias) == (0.0, False)
    default = read_megatron_args(megatron_args(replace(spec, dropout=0.1, bias=True), plan), devices=8)
    assert (default.spec.dropout, default.spec.bias) == (0.1, True)  # Megatron's defaults, written as nothing
    mixed = read_megatron_args(args + ["--attention-dropout", "0.1"], devices=8)
    assert any("--attention-dropout 0.1 read as --hidden-dropout's 0" in n for n in mixed.notes)
    with pytest.raises(LaunchError, match="--hidden-dropout must be a probability"):
        read_megatron_args(args + ["--hidden-dropout", "1.5"], devices=8)


@pytest.mark.parametrize("program", ["megatron", "eager"])
def test_rotary_embeddings_rotate_queries_and_keys_and_drop_the_position_table(program):
    """Llama's rotary embeddings: a pass over each layer's queries and keys (Megatron's fused kernel; eager's fp32
    copy, complex multiply and copy back) forward and backward, and no learned position table or its add."""
    base = TransformerSpec(layers=2, hidden=512, heads=8, kv_heads=2, seq=256, vocab=1000, program=program,
                           mlp="swiglu", attention="flash")
    rope = replace(base, position="rope")
    plan = ParallelPlan(tp=2, pp=1, dp=1, micro_batch=2, global_batch=2)
    df = build_transformer_graph(rope, plan, detail="kernel").tasks_frame()
    df = df[(df["rank"] == 0) & (df.processor != "cpu")]
    kernels = df[df.name.str.contains(r"\.rope")]
    per_pass = 3 if program == "eager" else 1
    assert len(kernels) == 2 * 2 * per_pass  # two layers, forward and backward
    qk = 2 * 256 * (8 + 2) * 64 / 2  # tokens x (query + key heads) x head width / tp
    rw = 10.0 if program == "eager" else 2.0
    assert kernels[~kernels.name.str.contains("backward")].bytes.sum() == pytest.approx(2 * rw * qk * 2)
    assert not df.name.str.startswith("position_embedding").any()
    assert rope.param_count() == base.param_count() - 256 * 512
    assert memory_per_stage(rope, plan)[0].weights_bytes < memory_per_stage(base, plan)[0].weights_bytes
    args = megatron_args(rope, plan)
    assert args[args.index("--position-embedding-type") + 1] == "rope"
    assert read_megatron_args(args, devices=2).spec.position == "rope"
    mrope = read_megatron_args(args[:args.index("--position-embedding-type")] + ["--position-embedding-type", "mrope"]
                               + args[args.index("--position-embedding-type") + 2:], devices=2)
    assert mrope.spec.position == "rope" and any("mrope read as rope" in n for n in mrope.notes)
    alibi = read_megatron_args(args + ["--position-embedding-type", "alibi"], devices=2)  # Megatron-DeepSpeed's
    assert alibi.spec.position == "none" and any("alibi read as none" in n for n in alibi.notes)
    with pytest.raises(LaunchError, match="--position-embedding-type must be one of"):
        read_megatron_args(args + ["--position-embedding-type", "sinusoidal"], devices=2)


def test_eager_swiglu_runs_silu_and_the_multiply_and_keeps_silus_output():
    """torchtitan's ``w2(F.silu(w1(x)) * w3(x))``: two kernels forward, three backward, and the multiply keeps
    silu's output for its backward; Megatron's program fuses them."""
    eager = TransformerSpec(layers=2, hidden=512, heads=8, seq=256, vocab=1000, program="eager", mlp="swiglu")
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1)
    df = build_transformer_graph(eager, plan, detail="kernel").tasks_frame()
    names = set(df[df.processor != "cpu"].name)
    assert {"layer[0].swiglu.silu", "layer[0].swiglu.mul", "layer[0].swiglu.mul_bwd_up", "layer[0].swiglu.silu_bwd"} <= names
    fused = replace(eager, program="megatron")
    f = eager.ffn_size
    extra = memory_per_stage(eager, plan)[0].activations_bytes - memory_per_stage(fused, plan)[0].activations_bytes
    assert extra >= 2 * 2 * 256 * f  # silu(gate), 2 bytes a token per FFN unit, both layers


def test_eager_fused_loss_runs_one_kernel_a_pass_and_keeps_the_logits_once():
    """llm-foundry's MPT computes its loss with flash-attn's fused cross-entropy: one kernel forward, one
    backward, the logits kept once (Megatron's accounting), where ``cross_entropy(logits.float())`` runs
    log-softmax and NLL and holds 12 bytes a logit."""
    plain = TransformerSpec(layers=2, hidden=512, heads=8, seq=256, vocab=4000, program="eager")
    fused = replace(plain, fused_loss=True)
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=4, global_batch=4)

    def names(spec):
        df = build_transformer_graph(spec, plan, detail="kernel").tasks_frame()
        return set(df[df.processor != "cpu"].name)

    assert "log_softmax" in names(plain) and "log_softmax" not in names(fused)
    assert {"vocab_parallel_cross_entropy", "vocab_parallel_cross_entropy_bwd"} <= names(fused)
    saved = memory_per_stage(plain, plan)[0].activations_bytes - memory_per_stage(fused, plan)[0].activations_bytes
    tokens, vocab = 4 * 256, plain.padded_vocab(1)
    assert saved == pytest.approx(12 * tokens * vocab - 4 * tokens * vocab, rel=0.02)


def test_moe_layers_every_nth_layer():
    """MoE layers between dense ones (moe.every; Llama 4 Maverick alternates them): each layer's kernels are
    its kind's, each pipeline stage holds its own layers' experts, and Megatron's --moe-layer-freq list reads
    and writes the pattern. Llama 4 Maverick reads as 400.8 B parameters (its model card: 400 B)."""
    spec = TransformerSpec(layers=6, hidden=512, heads=8, seq=256, vocab=1000, mlp="swiglu", ffn=1024,
                           moe=MoESpec(experts=8, top_k=2, ffn=256, dense_layers=1, every=2))
    assert [spec.is_moe_layer(j) for j in range(6)] == [False, False, True, False, True, False]
    assert spec.moe_layer_count == 2
    plan = ParallelPlan(tp=1, pp=2, dp=2, ep=2, micro_batch=1, global_batch=4)
    names = set(build_transformer_graph(spec, plan, detail="kernel").tasks_frame().name)
    assert "layer[2].experts.fc1" in names  # stage 0 holds layers 0-2: the third is MoE
    assert "layer[1].experts.fc1" in names  # stage 1 holds layers 3-5: the second (layer 4) is MoE
    assert "layer[0].experts.fc1" not in names  # neither stage's first layer (0, 3) is
    mem = memory_per_stage(spec, plan)  # two dense layers and one MoE layer each; stage 0 the position table,
    assert mem[0].params - mem[1].params == pytest.approx(spec.position_params - 2 * 512)  # stage 1 the final norm
    assert expert_params_per_device(spec, plan, 0) == expert_params_per_device(spec, plan, 1) > 0
    args = megatron_args(spec, plan)
    assert args[args.index("--moe-layer-freq") + 1] == "([0]*1+([0]*1+[1])*2+[0]*1)"
    assert read_megatron_args(args, devices=4).spec.moe == spec.moe
    maverick = TransformerSpec(layers=48, hidden=5120, heads=40, kv_heads=8, seq=8192, vocab=202048, mlp="swiglu",
                               ffn=16384, tie_embeddings=False,
                               moe=MoESpec(experts=128, top_k=1, ffn=8192, shared_ffn=8192, every=2))
    assert maverick.param_count() / 1e9 == pytest.approx(400.0, rel=0.01)


def test_selective_recomputation_of_modules():
    """Megatron-core's --recompute-modules: each module named keeps less and re-runs in the backward —
    the norms' outputs, MLA's up projections, the whole MoE layer (its all-to-alls too), the experts'
    activation, the shared expert; read from a launch, written back; refused where it cannot apply."""
    spec = TransformerSpec(layers=4, hidden=512, heads=8, seq=256, vocab=1000, mlp="swiglu", ffn=1024,
                           mla=MLASpec(q_lora_rank=64, kv_lora_rank=64, qk_head_dim=32, rope_head_dim=16, v_head_dim=32),
                           moe=MoESpec(experts=8, top_k=2, ffn=256, shared_ffn=256))
    base = ParallelPlan(tp=2, pp=1, dp=4, ep=4, micro_batch=1, global_batch=4, sequence_parallel=True,
                        recompute="selective")

    def acts(*mods: str) -> float:
        return activation_bytes_per_layer(spec, replace(base, recompute_modules=mods))

    sbh = 256 * 512
    assert acts("core_attn") == acts()  # the default
    assert acts("layernorm") == pytest.approx(acts() - 4.0 * sbh / 2)  # both norms' 16-bit outputs, SP-split
    for mod in ("mla_up_proj", "moe", "moe_act", "shared_experts"):
        assert acts(mod) < acts(), mod
    assert acts("moe") < acts("moe_act") and acts("moe") < acts("shared_experts")
    names = set(build_transformer_graph(spec, replace(base, recompute_modules=("layernorm", "mla_up_proj", "moe")),
                                        detail="kernel").tasks_frame().name)
    assert {"layer[0].recompute.norms", "layer[0].recompute.mla_up", "layer[0].recompute.experts.fc1",
            "layer[0].recompute.moe_dispatch"} <= names
    times = [predict_plan(spec, replace(base, recompute_modules=m), H100, devices=8)[0]["predicted_iteration_s"]
             for m in ((), ("moe",))]
    assert times[1] > times[0]
    plan = replace(base, recompute_modules=("mla_up_proj", "moe"))
    args = megatron_args(spec, plan)
    assert args[args.index("--recompute-modules") + 1:args.index("--recompute-modules") + 3] == ["mla_up_proj", "moe"]
    assert read_megatron_args(args, devices=8).plan == plan
    assert read_megatron_args(args + ["--recompute-modules", "core_attn"], devices=8).plan.recompute_modules == ()
    dense = replace(spec, moe=None, mla=None)
    words = megatron_args(dense, replace(base, ep=1)) + ["--recompute-modules", "moe", "mla_up_proj"]
    none = read_megatron_args(words, devices=8)  # no MoE layer, no MLA: nothing of this model is recomputed
    assert none.plan.recompute == "none" and any("--recompute-modules moe mla_up_proj" in n for n in none.notes)
    with pytest.raises(PlanError, match="needs recompute: selective"):
        check_plan(spec, replace(base, recompute="full", recompute_modules=("moe",)), 8)
    with pytest.raises(PlanError, match="tuner models core_attn"):
        check_plan(spec, replace(base, recompute_modules=("mhc",)), 8)
    with pytest.raises(PlanError, match="mla_up_proj needs multi-latent attention"):
        check_plan(dense, replace(base, ep=1, recompute_modules=("mla_up_proj",)), 8)


def test_eager_multi_latent_attention_assembles_queries_and_keys():
    """torchtitan's DeepSeek-V3 runs multi-latent attention as plain PyTorch: the same projections as
    Megatron's, plus the copies torch.cat makes of each head's plain and rotary parts (forward and backward)."""
    small = TransformerSpec(layers=2, hidden=512, heads=8, seq=256, vocab=1000, mlp="swiglu", position="rope",
                            mla=MLASpec(q_lora_rank=0, kv_lora_rank=64, qk_head_dim=32, rope_head_dim=16,
                                        v_head_dim=32), attention="flex")
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1)
    names = {p: set(build_transformer_graph(replace(small, program=p), plan, detail="kernel").tasks_frame().name)
             for p in ("megatron", "eager")}
    cat = {"layer[0].mla_q_cat", "layer[0].mla_k_cat", "layer[0].mla_q_cat_bwd", "layer[0].mla_k_cat_bwd"}
    assert cat <= names["eager"] and not cat & names["megatron"]
    assert {"layer[0].mla_down.mm", "layer[0].q_proj.mm", "layer[0].kv_up.mm"} <= names["eager"]


def test_op_checkpointing_of_moe_layers_recomputes_the_routed_experts():
    """torchtitan's op-level checkpointing saves every second plain matmul, the attention and the all-to-alls;
    its routed experts (grouped GEMMs) run again in the backward, so an MoE layer keeps none of their
    activations and replays their FLOPs; the parity of the matmul count continues through MLA's projections."""
    spec = replace(QWEN3_MOE, layers=4, seq=1024, program="eager", attention="flash2")
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=8, fsdp=True)
    op = replace(plan, recompute="op")
    g = build_transformer_graph(spec, op, detail="kernel").tasks_frame()
    names = set(g.name)
    assert {"layer[0].recompute.experts.fc1", "layer[0].recompute.experts.fc2", "layer[0].recompute.wk.mm",
            "layer[0].recompute.wo.mm"} <= names
    assert "layer[0].recompute.router.mm" not in names  # the 5th matmul: saved
    assert "layer[0].recompute.moe_dispatch" not in names  # all-to-all outputs are saved
    none, full = (memory_per_stage(spec, replace(plan, recompute=r))[0].activations_bytes for r in ("none", "full"))
    assert full < memory_per_stage(spec, op)[0].activations_bytes < none
    t = {r: predict_plan(spec, replace(plan, recompute=r), H100, devices=8)[0]["predicted_iteration_s"]
         for r in ("none", "op")}
    assert t["op"] > t["none"]
    fp8 = set(build_transformer_graph(replace(spec, fp8_linear=True), op, detail="kernel").tasks_frame().name)
    assert {"layer[0].recompute.experts.fc1.fp8_cast", "layer[0].recompute.experts.fc2.fp8_cast",
            "layer[0].recompute.wk.fp8_cast"} <= fp8
    assert not any(n.endswith("fp8_cast") for n in names)
    v3 = TransformerSpec(layers=4, hidden=512, heads=8, seq=256, vocab=1000, mlp="swiglu", ffn=1024,
                         mla=MLASpec(q_lora_rank=128, kv_lora_rank=64, qk_head_dim=32, rope_head_dim=16, v_head_dim=32),
                         moe=MoESpec(experts=8, top_k=2, ffn=256, shared_ffn=256, dense_layers=1))
    order = [mm.name for mm in layer_matmuls(v3, 1, dense=False)]
    assert order == ["wq_a", "wq_b", "wkv_a", "wkv_b", "wo", "router", "shared_expert.w1", "shared_expert.w3",
                     "shared_expert.w2"]
    assert [mm.name for mm in layer_matmuls(v3, 1, dense=True)][-3:] == ["w1", "w3", "w2"]


def test_multi_token_prediction_prices_its_layer_head_and_embedding_copy():
    """DeepSeek-V3's multi-token prediction (--mtp-num-layers 1): one more layer of the last layer's kind, a 2h -> h
    projection, norms and another output layer and loss, on the last stage, which also holds a copy of the input
    embedding and all-reduces its gradient with the first stage. DeepSeek-V3's MTP module: its model card's 14 B
    (685 B on Hugging Face less the 671 B main model; the checkpoint stores the embedding and head again)."""
    v3 = TransformerSpec(layers=61, hidden=7168, heads=128, seq=4096, vocab=129280, mlp="swiglu", ffn=18432,
                         tie_embeddings=False, mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512),
                         moe=MoESpec(experts=256, top_k=8, ffn=2048, shared_ffn=2048, dense_layers=3))
    module = replace(v3, mtp_layers=1).param_count() - v3.param_count() + 2 * v3.vocab * v3.hidden
    assert module == pytest.approx(14e9, rel=0.05)
    spec = replace(SMALL, tie_embeddings=False)
    mtp = replace(spec, mtp_layers=1)
    plan = ParallelPlan(tp=2, pp=2, dp=2, ep=2, micro_batch=1, global_batch=8, sequence_parallel=True,
                        distributed_optimizer=True)
    plain, more = memory_per_stage(spec, plan), memory_per_stage(mtp, plan)
    assert more[0].params == plain[0].params and more[1].params > plain[1].params
    assert more[1].activations_bytes > plain[1].activations_bytes
    a, _ = predict_plan(spec, plan, H100)
    b, _ = predict_plan(mtp, plan, H100)
    assert b["predicted_iteration_s"] > a["predicted_iteration_s"]
    assert mtp.iteration_flops(8) > spec.iteration_flops(8)
    df = build_transformer_graph(mtp, plan, detail="kernel").tasks_frame()
    last = df[(df["rank"] == 1) & (df.processor != "cpu")]
    T, h = SMALL.seq, SMALL.hidden
    assert last[last.name == "mtp[0].eh_proj.mm"].flops.iloc[0] == pytest.approx(2 * T * (h / 2) * 2 * h)
    assert {"mtp[0].lm_head.mm", "mtp[0].layer.experts.fc1", "embedding_grad.all_reduce"} <= set(last.name)
    assert not df[df["rank"] == 0].name.str.startswith("mtp").any()
    fsdp = ParallelPlan(tp=1, pp=1, dp=4, ep=2, micro_batch=1, global_batch=8, fsdp=True)
    assert predict_plan(mtp, fsdp, H100)[0]["predicted_iteration_s"] > predict_plan(spec, fsdp, H100)[0][
        "predicted_iteration_s"]
    args = megatron_args(mtp, plan)
    assert args[args.index("--mtp-num-layers") + 1] == "1"
    assert read_megatron_args(args, devices=8).spec == replace(mtp, name="megatron-model")
    with pytest.raises(PlanError, match="mtp_layers"):
        replace(SMALL, mtp_layers=-1).validate()


def test_multi_token_prediction_weights_are_fp8_under_fp8_params():
    """Under --fp8-param-gather the MTP depth's layer and projection are stored (and gathered) in one byte a weight,
    as the model's layers are: the last stage's weights shrink by the depth's linears' second byte."""
    spec = replace(SMALL, tie_embeddings=False, dtype="bf16", fp8_linear=True)
    plan = ParallelPlan(tp=2, pp=2, dp=2, micro_batch=1, global_batch=8, distributed_optimizer=True)
    plain = replace(spec, fp8_params=True)
    mtp = replace(plain, mtp_layers=1)
    depth = layer_param_count(spec, 2, 1, expert_tp=plan.etp) - layer_norm_params(spec) + 2 * spec.hidden ** 2 / 2
    assert fp8_weight_params(mtp, plan, 1) - fp8_weight_params(plain, plan, 1) == pytest.approx(depth)
    assert fp8_weight_params(mtp, plan, 0) == fp8_weight_params(plain, plan, 0)
    bf16 = memory_per_stage(replace(spec, mtp_layers=1), plan)[1].weights_bytes
    fp8 = memory_per_stage(mtp, plan)[1].weights_bytes
    assert bf16 - fp8 == pytest.approx(fp8_weight_params(mtp, plan, 1))
