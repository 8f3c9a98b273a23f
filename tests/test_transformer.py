"""The transformer synthesiser: schedules, graph structure, FLOPs, symmetry, detail levels, memory, bad plans."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from predictor.simulate import simulate
from predictor.sources.synth.pipeline_schedule import ScheduleError, interleaved, one_f_one_b, peak_in_flight
from predictor.sources.synth.transformer import (
    MoESpec,
    ParallelPlan,
    PlanError,
    TransformerSpec,
    build_stage_graph,
    build_transformer_graph,
    check_plan,
    group_span,
    transformer_timing,
)
from predictor.sources.synth.transformer_memory import (
    activation_bytes_per_layer,
    expert_params_per_device,
    head_loss_bytes,
    memory_per_stage,
)
from predictor.sources.synth.transformer_steps import ADAM_BYTES_PER_PARAM, adam_bytes_per_param
from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.collective import PiecewiseCollective, alpha_beta
from predictor.timing.platforms import get_platform

A100 = get_platform("a100-80gb")
TIMING = transformer_timing(A100)
SMALL = TransformerSpec(layers=8, hidden=512, heads=8, seq=256, vocab=1000, attention="unfused", name="small")


def _plan(**kw) -> ParallelPlan:
    base = dict(tp=2, pp=2, dp=2, micro_batch=2, global_batch=16)
    base.update(kw)
    return ParallelPlan(**base)


# --------------------------------------------------------------------------- schedules
@pytest.mark.parametrize(("p", "m"), [(1, 4), (4, 8), (4, 2), (8, 8)])
def test_one_f_one_b_order_and_in_flight(p, m):
    for s in range(p):
        steps = one_f_one_b(p, m, s)
        assert sorted((st.phase, st.micro_batch) for st in steps) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        pos = {(st.phase, st.micro_batch): i for i, st in enumerate(steps)}
        assert all(pos[("F", i)] < pos[("B", i)] for i in range(m))
        assert peak_in_flight(steps) == min(p - s, m)  # PipeDream-Flush stashes at most p - s micro-batches


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 8, 3), (4, 4, 2)])
def test_interleaved_covers_every_chunk_and_matches_korthikanti_peak(p, m, v):
    for s in range(p):
        steps = interleaved(p, m, v, s)
        assert len(steps) == 2 * m * v
        assert len(set(steps)) == 2 * m * v
        pos = {st: i for i, st in enumerate(steps)}
        for mb in range(m):
            for c in range(v):
                assert pos[("F", mb, c)] < pos[("B", mb, c)]
    if m > p:  # Korthikanti §4.2.3: the first stage holds p*v + p - 1 chunks of L/(p v) layers
        assert peak_in_flight(interleaved(p, m, v, 0)) == p * v + p - 1


def test_interleaved_needs_divisible_micro_batches():
    with pytest.raises(ScheduleError, match="divisible"):
        interleaved(4, 6, 2, 0)


# --------------------------------------------------------------------------- graph structure
def test_one_rank_per_stage_and_cross_stage_groups():
    g = build_transformer_graph(SMALL, _plan(), detail="kernel")
    assert g.n_ranks == 2  # pp=2 stages; tp x dp peers are symmetric and not simulated
    df = g.tasks_frame()
    grouped = df[df.group >= 0]
    sizes = grouped.groupby("group")["rank"].nunique()
    p2p = grouped[grouped.kind == "send_recv"].groupby("group")["rank"].agg(["nunique", "size"])
    assert (p2p["nunique"] == 2).all() and (p2p["size"] == 2).all()
    m = _plan().micro_batches
    assert len(p2p) == 2 * m  # one activation and one gradient per micro-batch across the one link
    assert sizes.max() == 2
    norm = grouped[grouped.name == "grad_norm.all_reduce"]
    assert norm["rank"].nunique() == 2 and norm.group.nunique() == 1
    tied = grouped[grouped.name == "embedding_grad.all_reduce"]
    assert sorted(tied["rank"]) == [0, 1]
    tl = simulate(g, TIMING)
    assert tl.iteration_s > 0 and np.isfinite(tl.iteration_s)


def test_gemm_flops_match_the_megatron_formula():
    """Sum of GEMM FLOPs on all devices = SC21 eq. 3 accounting (3 or 4 passes over the layers)."""
    for rec in ("none", "full"):
        plan = _plan(recompute=rec)
        g = build_transformer_graph(SMALL, plan, detail="kernel")
        gemm = g.kind_mask("gemm")
        per_replica = np.nansum(g.flops[gemm]) * plan.tp  # one graph rank per stage, tp devices each
        total = per_replica * plan.dp
        expected = SMALL.iteration_flops(plan.global_batch, rec)
        pad = SMALL.padded_vocab(plan.tp) / SMALL.vocab  # the head runs on the padded vocabulary
        head = 3 * plan.global_batch * 2 * SMALL.seq * SMALL.hidden * SMALL.vocab
        assert total == pytest.approx(expected + head * (pad - 1), rel=1e-6)


#: a small Llama-shaped model: grouped-query attention (2 key/value heads of 8) and a SwiGLU MLP
GQA = TransformerSpec(layers=8, hidden=512, heads=8, kv_heads=2, seq=256, vocab=1000, ffn=1408, mlp="swiglu", attention="unfused",
                      tie_embeddings=False, name="small-llama")


def test_llama_parameter_counts_match_the_published_models():
    """Llama 2 7B / 70B and Llama 3 8B (grouped-query attention, SwiGLU): within 0.5 % of their published
    parameter counts (tuner adds learned position embeddings and biases, which Llama lacks)."""
    llama = dict(mlp="swiglu", tie_embeddings=False)
    for spec, published in (
        (TransformerSpec(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000, ffn=11008, **llama), 6_738_415_616),
        (TransformerSpec(layers=80, hidden=8192, heads=64, kv_heads=8, seq=4096, vocab=32000, ffn=28672, **llama),
         68_976_648_192),
        (TransformerSpec(layers=32, hidden=4096, heads=32, kv_heads=8, seq=8192, vocab=128256, ffn=14336, **llama),
         8_030_261_248),
    ):
        assert spec.param_count() == pytest.approx(published, rel=5e-3)
    gelu = TransformerSpec(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000, ffn=11008, tie_embeddings=False)
    assert gelu.param_count() < 0.8 * published  # a GeLU MLP of the same width has 2/3 of the MLP weights


def test_gqa_swiglu_gemm_flops_and_gradient_buckets():
    """The Llama shape's GEMMs carry the spec's FLOPs (QKV of hidden + 2 kv_heads x head_dim, fc1 of 2 ffn)
    and the data-parallel buckets every gradient once."""
    for rec in ("none", "full"):
        plan = _plan(recompute=rec, overlap_grad_reduce=True)
        g = build_transformer_graph(GQA, plan, detail="kernel")
        total = np.nansum(g.flops[g.kind_mask("gemm")]) * plan.tp * plan.dp
        pad = GQA.padded_vocab(plan.tp) / GQA.vocab
        head = 3 * plan.global_batch * 2 * GQA.seq * GQA.hidden * GQA.vocab
        assert total == pytest.approx(GQA.iteration_flops(plan.global_batch, rec) + head * (pad - 1), rel=1e-6)
    df = g.tasks_frame()
    dp = df[df.name == "dp_grad.all_reduce"]
    for r, m in enumerate(memory_per_stage(GQA, plan)):
        assert dp[dp["rank"] == r].msg_bytes.sum() == pytest.approx(m.params * 2, rel=1e-9)
    qkv = df[df.name == "layer[0].qkv.addmm"].flops.iloc[0]
    T = plan.micro_batch * GQA.seq
    assert qkv == pytest.approx(2 * T * GQA.hidden * (512 + 2 * 2 * 64) / plan.tp)
    # slower than the same widths as multi-head attention and a GeLU MLP, which have fewer FLOPs
    base = TransformerSpec(layers=8, hidden=512, heads=8, seq=256, vocab=1000, ffn=1408, tie_embeddings=False,
                           attention="unfused")
    assert GQA.iteration_flops(16) > base.iteration_flops(16)
    assert simulate(build_transformer_graph(GQA, _plan(), detail="kernel"), TIMING).iteration_s > \
        simulate(build_transformer_graph(base, _plan(), detail="kernel"), TIMING).iteration_s


def test_gqa_swiglu_activation_memory():
    """K and V shrink with the key/value heads; SwiGLU's activation keeps gate and up (6 f bytes a token)."""
    s, b, h, t = GQA.seq, 2, GQA.hidden, 2
    sbh, f = s * b * h, GQA.ffn_size
    expect = 10 * sbh + ((4 + 4 * 2 / 8) * sbh + 6 * s * b * f) / t + 4 * GQA.heads * s * b / t
    flash = TransformerSpec(**{**GQA.to_dict(), "attention": "flash"})
    assert activation_bytes_per_layer(flash, _plan(tp=t)) == pytest.approx(expect)


def test_tensor_and_sequence_parallel_collectives():
    g = build_transformer_graph(SMALL, _plan(tp=1, dp=4), detail="kernel")
    names = g.tasks_frame().name
    assert not names.str.contains("attn_output_all_reduce").any()
    g = build_transformer_graph(SMALL, _plan(), detail="kernel")
    df = g.tasks_frame()
    assert (df.name == "layer[0].attn_output_all_reduce").sum() > 0
    g = build_transformer_graph(SMALL, _plan(sequence_parallel=True), detail="kernel")
    df = g.tasks_frame()
    layer = df[df.name.str.startswith("layer[")]
    assert not (layer.kind == "all_reduce").any()  # SP turns every layer all-reduce into RS + AG
    assert (layer.kind == "reduce_scatter").any() and (layer.kind == "all_gather").any()
    assert (df[df.kind.isin(["reduce_scatter", "all_gather"])].world == 2).all()


def test_tp_comm_overlap_runs_sequence_parallel_collectives_beside_their_gemms():
    """With sequence parallelism, --tp-comm-overlap puts every layer all-gather / reduce-scatter on the TP
    stream beside the GEMM that reads or writes it: same kernels, a shorter iteration, and slower links
    move it less than they move the plan without overlap."""
    mid = TransformerSpec(layers=4, hidden=2048, heads=16, seq=1024, vocab=8000, name="mid")
    plan = ParallelPlan(tp=4, pp=1, dp=1, micro_batch=2, global_batch=4, sequence_parallel=True)
    over = ParallelPlan(**{**plan.to_dict(), "tp_comm_overlap": True})
    graphs = {p.tp_comm_overlap: build_transformer_graph(mid, p, detail="kernel") for p in (plan, over)}
    frames = {k: g.tasks_frame() for k, g in graphs.items()}
    for k in ("all_gather", "reduce_scatter"):
        assert (frames[False].kind == k).sum() == (frames[True].kind == k).sum() > 0
    layer_ag = frames[True][frames[True].name == "layer[0].qkv_input_all_gather"]
    gemm = frames[True][frames[True].name == "layer[0].qkv.addmm"]
    assert layer_ag.processor.iloc[0] != gemm.processor.iloc[0]  # the TP stream, not the compute stream
    net = A100.interconnect
    slow = A100.model_copy(update={"interconnect": net.model_copy(update={
        "intra_node_bandwidth_bytes_per_s": net.intra_node_bandwidth_bytes_per_s / 4,
        "intra_node_bus_bandwidth_bytes_per_s": (net.intra_node_bus_bandwidth_bytes_per_s
                                                 or net.intra_node_bandwidth_bytes_per_s) / 4})})
    t = {(k, name): simulate(g, transformer_timing(pl)).iteration_s
         for k, g in graphs.items() for name, pl in (("fast", A100), ("slow", slow))}
    assert t[(True, "fast")] < t[(False, "fast")]
    assert t[(True, "slow")] - t[(True, "fast")] < t[(False, "slow")] - t[(False, "fast")]


def test_context_parallelism_splits_tokens_and_passes_keys_and_values_round():
    """cp = 2 on the same devices: each rank computes the same FLOPs (half the tokens of twice the
    micro-batches), its attention exchanges K and V round the cp ranks, gradients reduce over dp x cp,
    and a micro-batch's activations halve."""
    spec = TransformerSpec(layers=4, hidden=1024, heads=16, kv_heads=4, seq=2048, vocab=8000, ffn=2816, mlp="swiglu",
                           name="cp")
    base = ParallelPlan(tp=2, pp=1, dp=4, micro_batch=1, global_batch=8)
    ctx = ParallelPlan(tp=2, pp=1, dp=2, cp=2, micro_batch=1, global_batch=8)
    check_plan(spec, ctx, 8)
    frames = {p.cp: build_transformer_graph(spec, p, detail="kernel").tasks_frame() for p in (base, ctx)}
    for kinds in (["gemm"], ["bmm"]):  # the linear layers, the fused attention
        per_rank = {k: float(np.nansum(f.flops[f.kind.isin(kinds)])) for k, f in frames.items()}
        assert per_rank[2] == pytest.approx(per_rank[1], rel=1e-9)
    f = frames[2]
    ring = f[f.name.str.endswith("cp_kv_all_gather")]
    kv = 2 * 1 * 2048 * (4 / 2) * 64 * 2  # K and V of the sequence: b x s x kv_heads / tp x head_dim x bf16
    assert len(ring) == 2 * 4 * 4 and (ring.world == 2).all() and (ring.msg_bytes == kv).all()  # fwd + bwd, 4 layers, 4 mbs
    assert (f[f.name.str.endswith("cp_dkv_reduce_scatter")].world == 2).all()
    assert not frames[1].name.str.contains("cp_kv").any()
    assert (f[f.name == "dp_grad.all_reduce"].world == 4).all()
    assert activation_bytes_per_layer(spec, ctx) == pytest.approx(activation_bytes_per_layer(spec, base) / 2)
    assert simulate(build_transformer_graph(spec, ctx, detail="kernel"), TIMING).iteration_s > 0


def test_op_level_checkpointing_recomputes_every_second_matmul():
    """torchtitan's op-level checkpointing: in the backward, wk, wo and w3 (SwiGLU's up projection) run again
    — more GEMM FLOPs than none, fewer than full — and a layer keeps its input, wq, wv, attention, w1 and w2."""
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=1, global_batch=2)
    spec = TransformerSpec(**{**GQA.to_dict(), "attention": "flash"})
    flops = {}
    for rec in ("none", "op", "full"):
        g = build_transformer_graph(spec, ParallelPlan(**{**plan.to_dict(), "recompute": rec}), detail="kernel")
        flops[rec] = float(np.nansum(g.flops[g.kind_mask("gemm")]))
        if rec == "op":
            names = set(g.tasks_frame().name)
    T, h, kv, f = 256.0, 512.0, 2 * 64.0, 1408.0
    again = 2 * T * h * (kv + h + f) * 8 * 2  # wk, wo, w3 forward: 8 layers, 2 micro-batches
    assert flops["op"] - flops["none"] == pytest.approx(again)
    assert flops["none"] < flops["op"] < flops["full"]
    assert {"layer[0].recompute.wk.mm", "layer[0].recompute.wo.mm", "layer[0].recompute.w3.mm",
            "layer[0].recompute.swiglu"} <= names
    op = activation_bytes_per_layer(spec, ParallelPlan(**{**plan.to_dict(), "recompute": "op"}))
    assert op == pytest.approx(T * 2 * (h + h + kv + h + f + h) + 4 * 8 * T)
    assert op < activation_bytes_per_layer(spec, plan)


def test_partial_full_recomputation_recomputes_the_first_layers_of_each_chunk():
    """recompute_layers = 3 of 8: three layers replayed (GEMM FLOPs 3/8 of full's extra) and kept as inputs,
    the other five keep everything."""
    base = dict(tp=1, pp=1, dp=1, micro_batch=2, global_batch=2)
    flops, acts = {}, {}
    for name, kw in (("none", {}), ("part", dict(recompute="full", recompute_layers=3)), ("full", dict(recompute="full"))):
        plan = ParallelPlan(**base, **kw)
        g = build_transformer_graph(SMALL, plan, detail="kernel")
        flops[name] = float(np.nansum(g.flops[g.kind_mask("gemm")]))
        acts[name] = memory_per_stage(SMALL, plan)[0].activations_bytes
        if name == "part":
            names = set(g.tasks_frame().name)
    assert flops["part"] - flops["none"] == pytest.approx(3 / 8 * (flops["full"] - flops["none"]))
    assert "layer[2].recompute.qkv.addmm" in names and "layer[3].recompute.qkv.addmm" not in names
    layer = activation_bytes_per_layer(SMALL, ParallelPlan(**base))
    ckpt = activation_bytes_per_layer(SMALL, ParallelPlan(**base, recompute="full"))
    assert acts["part"] - acts["full"] == pytest.approx(5 * (layer - ckpt))
    assert ParallelPlan(**base, recompute="full", recompute_layers=3).label().endswith("-full3")


def test_eager_loss_holds_three_fp32_logit_tensors_at_its_peak():
    """Megatron's vocab-parallel loss keeps fp32 logits once; plain PyTorch's cross_entropy(logits.float())
    holds the saved log-softmax and two gradients of it: 12 bytes a logit, the last stage's peak."""
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=2, global_batch=2)
    fused = replace(SMALL, vocab=SMALL.padded_vocab(1))  # a vocabulary both programs keep as it is
    T, h, V = 2 * fused.seq, fused.hidden, fused.vocab
    assert head_loss_bytes(fused, plan) == pytest.approx(4 * T * h * (1 + V / h))
    eager = replace(fused, program="eager")
    assert head_loss_bytes(eager, plan) == pytest.approx(12 * T * V + 4 * T * h)
    gap = memory_per_stage(eager, plan)[0].total_bytes - memory_per_stage(fused, plan)[0].total_bytes
    assert gap == pytest.approx(8 * T * V)


def test_data_parallel_buckets_carry_every_gradient():
    plan = _plan(overlap_grad_reduce=True)
    g = build_transformer_graph(SMALL, plan, detail="kernel")
    df = g.tasks_frame()
    dp = df[df.name == "dp_grad.all_reduce"]
    mem = memory_per_stage(SMALL, plan)
    for r in range(plan.pp):
        got = dp[dp["rank"] == r].msg_bytes.sum()
        assert got == pytest.approx(mem[r].params * 2, rel=1e-9)  # bf16 gradients, every parameter once
        assert (dp[dp["rank"] == r].world == plan.dp).all()
    # overlapped: launched inside the last backward steps, before the optimizer
    opt = df[df.name == "adam.multi_tensor_apply"].index
    assert dp.index.max() < opt.max()


def test_kernel_and_stage_detail_agree():
    """Stage detail (one task per step, timed by simulating the step's kernels) = kernel detail for
    GPU-bound steps (launch-bound toy models differ by a few % at step boundaries)."""
    mid = TransformerSpec(layers=8, hidden=2048, heads=16, seq=1024, vocab=8000, attention="unfused", name="mid")
    for kw in ({}, {"schedule": "interleaved", "virtual_stages": 2, "global_batch": 32},
               {"recompute": "full", "pp": 4, "dp": 1}, {"sequence_parallel": True}):
        plan = _plan(**kw)
        gk = build_transformer_graph(mid, plan, detail="kernel")
        gs = build_transformer_graph(mid, plan, detail="stage", timing=TIMING)
        assert gs.n_tasks < gk.n_tasks / 3
        assert simulate(gs, TIMING).iteration_s == pytest.approx(simulate(gk, TIMING).iteration_s, rel=0.01), kw


def test_graph_does_not_grow_with_data_parallelism_and_1024_gpus_stay_small():
    a = build_transformer_graph(SMALL, _plan(dp=1, global_batch=8), detail="kernel")
    b = build_transformer_graph(SMALL, _plan(dp=16, global_batch=128), detail="kernel")
    assert b.n_ranks == a.n_ranks == 2
    assert abs(b.n_tasks - a.n_tasks) < 0.05 * a.n_tasks  # only the DP buckets differ
    big = TransformerSpec(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200, name="gpt3-175b")
    plan = ParallelPlan(tp=8, pp=8, dp=16, micro_batch=1, global_batch=1536, recompute="full")
    assert plan.devices == 1024
    g = build_transformer_graph(big, plan, timing=TIMING, detail="auto")
    assert g.n_ranks == 8 and g.meta["detail"] == "stage"
    # stage detail keeps it to tens of thousands of tasks (27.5k here); its build time is not asserted
    # (a wall-clock bound is flaky on a loaded 2-core host)
    assert g.n_tasks < 60_000
    assert simulate(g, TIMING).iteration_s > 0


def test_moe_all_to_all_over_the_expert_group():
    spec = TransformerSpec(layers=4, hidden=512, heads=8, seq=256, vocab=1000, moe=MoESpec(experts=8, top_k=2))
    plan = ParallelPlan(tp=2, pp=1, dp=4, ep=2, micro_batch=2, global_batch=16)
    g = build_transformer_graph(spec, plan, detail="kernel")
    df = g.tasks_frame()
    a2a = df[df.kind == "all_to_all"]
    assert len(a2a) == 4 * 4 * plan.micro_batches  # dispatch + combine, forward and backward, per layer
    assert (a2a.world == 2).all()
    edp = df[df.name == "expert_dp_grad.all_reduce"]
    assert len(edp) and (edp.world == 2).all()  # expert gradients reduce over dp / ep replicas
    experts = (8 / 2) * (2 * 512 * 2048 + 2048 + 512) * 4 / plan.tp  # each expert split over the TP ranks
    assert edp.msg_bytes.sum() == pytest.approx(experts * 2)
    # the routed tokens gathered over the TP ranks before the experts and reduce-scattered after, both passes
    gathers = df[df.name.str.contains("moe_tokens_") & df.kind.isin(["all_gather", "reduce_scatter"])]
    assert len(gathers) == 4 * 4 * plan.micro_batches and (gathers.world == plan.tp).all()
    assert simulate(g, TIMING).iteration_s > 0


def test_moe_with_context_parallelism_shards_expert_states_over_dp_x_cp_over_ep():
    """Megatron-core's experts with CP: the ranks holding the same experts are dp x cp / ep; the distributed
    optimizer shards the experts' states over those, the rest over dp x cp."""
    spec = TransformerSpec(layers=4, hidden=512, heads=8, seq=512, vocab=1000, attention="flash",
                           moe=MoESpec(experts=8, top_k=2))
    plan = ParallelPlan(tp=1, pp=1, dp=4, cp=2, ep=2, micro_batch=1, global_batch=8, distributed_optimizer=True)
    check_plan(spec, plan, 8)
    df = build_transformer_graph(spec, plan, detail="kernel").tasks_frame()
    edp = df[df.name.str.startswith("expert_dp_grad") & (df.kind == "reduce_scatter")]
    assert len(edp) and (edp.world == 4).all()
    mem = memory_per_stage(spec, plan)[0]
    experts = expert_params_per_device(spec, plan, 0)
    dense_shard, expert_shard = (mem.params - experts) / 8, experts / 4
    assert mem.optimizer_bytes == pytest.approx(12.0 * (dense_shard + expert_shard))

def test_experts_whole_on_every_tp_rank_hold_tp_times_the_weights_and_skip_the_tp_gather():
    spec = TransformerSpec(layers=4, hidden=512, heads=8, seq=256, vocab=1000, moe=MoESpec(experts=8, top_k=2))
    split = ParallelPlan(tp=2, pp=1, dp=4, ep=2, micro_batch=2, global_batch=16)
    whole = replace(split, expert_tp=1)  # torchtitan's expert_tensor_parallel_degree 1
    assert whole.label().endswith("-etp1") and split.etp == 2
    frames = [build_transformer_graph(spec, p, detail="kernel").tasks_frame() for p in (split, whole)]
    edp = [f[f.name == "expert_dp_grad.all_reduce"].msg_bytes.sum() for f in frames]
    assert edp[1] == pytest.approx(2 * edp[0])
    assert not frames[1].name.str.contains("moe_tokens_").any()
    flops = [f[f.name.str.contains("experts.fc") & (f.category == "compute")].flops.sum() for f in frames]
    assert flops[0] == pytest.approx(flops[1])  # the same expert work, split by width or by tokens
    with pytest.raises(PlanError, match="expert_tp"):
        check_plan(spec, replace(split, tp=4, dp=2, ep=2, expert_tp=2))


def test_whole_experts_fold_the_tp_ranks_into_expert_parallelism():
    """Megatron-core's MoE parallel folding (and torchtitan's EP with expert_tensor_parallel_degree 1): with the
    experts whole, ``ep`` neighbouring ranks of a stage's tp x dp hold ``experts / ep`` each, so ep may exceed dp;
    the rest of tp x dp hold the same experts and reduce their gradients together."""
    spec = TransformerSpec(layers=4, hidden=512, heads=8, seq=256, vocab=1000, moe=MoESpec(experts=8, top_k=2))
    folded = ParallelPlan(tp=2, pp=1, dp=2, ep=4, micro_batch=1, global_batch=4, sequence_parallel=True,
                          expert_tp=1, distributed_optimizer=True)
    check_plan(spec, folded, 4)
    with pytest.raises(PlanError, match="must divide dp=2"):
        check_plan(spec, replace(folded, expert_tp=None), 4)  # experts split over TP: EP within dp only
    df = build_transformer_graph(spec, folded, detail="kernel").tasks_frame()
    a2a = df[df.kind == "all_to_all"]
    assert len(a2a) and (a2a.world == 4).all()
    assert not df.name.str.startswith("expert_dp_grad").any()  # every rank holds experts of its own
    assert expert_params_per_device(spec, folded, 0) == pytest.approx(4 * (8 / 4) * (2 * 512 * 2048 + 2048 + 512))
    # ep dividing dp: the TP ranks beside each other hold the same experts and reduce their gradients together
    side = replace(folded, dp=4, ep=2)
    edp = build_transformer_graph(spec, side, detail="kernel").tasks_frame()
    edp = edp[edp.name.str.startswith("expert_dp_grad") & (edp.kind == "reduce_scatter")]
    assert len(edp) and (edp.world == 4).all()
    assert simulate(build_transformer_graph(spec, folded, detail="kernel"), TIMING).iteration_s > 0


def test_moe_layers_run_megatrons_all_to_all_dispatcher():
    """Megatron's all-to-all dispatcher: the token copies permuted by expert before the all-to-all, the received
    chunks sorted by local expert (with more than one) and both undone after the experts, each a pass over
    the copies, in both directions; FP8 experts cast their inputs and output gradients."""
    spec = TransformerSpec(layers=2, hidden=512, heads=8, seq=256, vocab=1000, moe=MoESpec(experts=8, top_k=2),
                           fp8_linear=True)
    plan = ParallelPlan(tp=1, pp=1, dp=4, ep=4, micro_batch=1, global_batch=4)
    names = set(build_transformer_graph(spec, plan, detail="kernel").tasks_frame().name)
    passes = {f"layer[0].{n}" for n in ("moe_permute", "moe_sort_chunks", "moe_restore_chunks", "moe_unpermute")}
    assert passes | {f"{n}.backward" for n in passes} <= names
    assert {"layer[0].experts.fc1.fp8_cast", "layer[0].experts.fc2.grad_fp8_cast"} <= names
    one_each = set(build_transformer_graph(spec, replace(plan, ep=4), detail="kernel").tasks_frame().name)
    assert "layer[0].moe_sort_chunks" in one_each
    alone = set(build_transformer_graph(replace(spec, moe=MoESpec(experts=4, top_k=2)), plan,
                                        detail="kernel").tasks_frame().name)
    assert "layer[0].moe_sort_chunks" not in alone and "layer[0].moe_permute" in alone  # one local expert


def test_the_host_waits_for_the_token_counts_before_the_all_to_all():
    """Megatron's dropless dispatcher and torchtitan's expert parallelism need the token counts on the CPU: the
    counts exchanged over the expert-parallel group, then a CUDA sync each MoE layer's forward (torchtitan
    without expert parallelism keeps them on the GPU, no sync)."""
    spec = TransformerSpec(layers=2, hidden=512, heads=8, seq=256, vocab=1000, moe=MoESpec(experts=8, top_k=2))

    def frame(program: str, ep: int):
        g = build_transformer_graph(replace(spec, program=program), ParallelPlan(tp=1, pp=1, dp=4, ep=ep, micro_batch=1,
                                                                                  global_batch=4), detail="kernel")
        return g, g.tasks_frame()

    g, df = frame("megatron", 4)
    sync = df[df.name == "layer[0].moe_token_counts.synchronize"]
    counts = df[(df.name == "layer[0].moe_token_counts") & (df.category == "communication")]
    assert len(sync) == 1 and len(counts) == 1 and (counts.world == 4).all()
    tl = simulate(g, TIMING)
    assert tl.start[sync.index[0]] >= tl.end[counts.index[0]] - 1e-12  # the CPU waits for the counts
    assert (frame("megatron", 1)[1].name == "layer[0].moe_token_counts.synchronize").any()
    assert not (frame("eager", 1)[1].name == "layer[0].moe_token_counts.synchronize").any()
    assert (frame("eager", 4)[1].name == "layer[0].moe_token_counts.synchronize").any()


def test_grouped_experts_run_four_gemms_at_a_time_under_transformer_engine():
    """Transformer Engine's grouped linear issues one GEMM per expert over 4 streams, so many small experts
    saturate the GPU less than one batched kernel of the same FLOPs (eager's torch._grouped_mm)."""
    spec = TransformerSpec(layers=2, hidden=512, heads=8, seq=256, vocab=1000, moe=MoESpec(experts=64, top_k=2))
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1)
    times = {}
    for program in ("megatron", "eager"):
        g = build_transformer_graph(replace(spec, program=program), plan, detail="kernel")
        df = g.tasks_frame()
        fc1 = (df.name == "layer[0].experts.fc1") & (df.category == "compute")
        streams = df[fc1].get("streams")
        assert (streams == 4).all() if program == "megatron" else streams is None or streams.isna().all()
        times[program] = float(np.asarray(TIMING.durations(g))[fc1.to_numpy()].sum())
        # the host launches each expert's GEMM (one kernel task stands for them): one launch call per GEMM
        launches = int((df.name == "cudaLaunchKernel").sum())
        device = df[df.category.isin(["compute", "memory", "communication"])]
        apart = device["batch"].fillna(1.0)[device.get("streams", pd.Series(np.nan, index=device.index)).notna()]
        assert launches == len(device) + int((apart - 1).sum())
        assert (launches > len(device)) == (program == "megatron")
    assert times["megatron"] > times["eager"]


def test_recompute_full_adds_a_forward_and_selective_only_attention():
    none = build_transformer_graph(SMALL, _plan(), detail="kernel").tasks_frame()
    full = build_transformer_graph(SMALL, _plan(recompute="full"), detail="kernel").tasks_frame()
    sel = build_transformer_graph(SMALL, _plan(recompute="selective"), detail="kernel").tasks_frame()
    assert not none.name.str.contains("recompute").any()
    assert full.name.str.contains(r"recompute\.qkv").any()
    rec = sel[sel.name.str.contains("recompute")]
    assert len(rec) and rec.name.str.contains("attn_|softmax|dropout").all()
    assert not rec.name.str.contains("qkv|fc1").any()


# --------------------------------------------------------------------------- collectives across nodes
def test_group_span_and_cross_node_collectives_are_slower():
    assert group_span(np.arange(2) * 8, 8) == (2, 2)  # DP peers of a TP=8 group: one per node
    assert group_span(np.arange(8), 8) == (8, 1)
    model = PiecewiseCollective()
    one = model.predict(TaskView.from_columns("all_reduce", msg_bytes=[1e8], world=[2], nodes=[1]), A100)[0]
    two = model.predict(TaskView.from_columns("all_reduce", msg_bytes=[1e8], world=[2], nodes=[2]), A100)[0]
    assert two > 5 * one  # InfiniBand (25 GB/s) against NVLink (300 GB/s)
    ts, bw = alpha_beta("all_reduce", 16, 2, A100)
    assert bw == pytest.approx(min(300e9, 8 * 25e9) / (2 * 15 / 16))  # 8 rings side by side, one NIC each


# --------------------------------------------------------------------------- memory
def test_activation_memory_follows_korthikanti():
    s, b, h, a, t = SMALL.seq, 2, SMALL.hidden, SMALL.heads, 2
    sbh = s * b * h
    f = activation_bytes_per_layer
    assert f(SMALL, _plan(tp=t)) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))  # eq. 2
    assert f(SMALL, _plan(tp=t, sequence_parallel=True)) == pytest.approx(sbh / t * (34 + 5 * a * s / h))  # eq. 4
    assert f(SMALL, _plan(tp=t, sequence_parallel=True, recompute="selective")) == pytest.approx(34 * sbh / t)  # eq. 6
    assert f(SMALL, _plan(tp=t, recompute="full")) == pytest.approx(2 * sbh)


def test_stage_memory_in_flight_and_model_states():
    plan = ParallelPlan(tp=1, pp=4, dp=1, micro_batch=1, global_batch=16, grad_reduce_dtype="fp32")
    mem = memory_per_stage(SMALL, plan)
    assert [m.in_flight for m in mem] == [4, 3, 2, 1]
    assert mem[0].activations_bytes > mem[-1].activations_bytes - 4 * SMALL.seq * SMALL.hidden * (1 + 1024 / 512)
    m1 = mem[1]
    assert m1.weights_bytes + m1.grads_bytes + m1.optimizer_bytes == pytest.approx(18 * m1.params)
    # --grad-reduce-in-bf16: Megatron's gradient buffer is bf16, 16 bytes a parameter
    bf16 = memory_per_stage(SMALL, ParallelPlan(**{**plan.to_dict(), "grad_reduce_dtype": "bf16"}))[1]
    assert bf16.weights_bytes + bf16.grads_bytes + bf16.optimizer_bytes == pytest.approx(16 * m1.params)
    zero = memory_per_stage(SMALL, ParallelPlan(tp=1, pp=4, dp=4, micro_batch=1, global_batch=16,
                                                distributed_optimizer=True))[1]
    assert zero.optimizer_bytes == pytest.approx(12 * zero.params / 4)


@pytest.mark.parametrize(("state", "per_param"), [("fp32", 12), ("bf16_moments", 8), ("bf16", 6)])
def test_optimizer_state_dtype_sets_bytes_and_adam_traffic(state, per_param):
    """16-bit Adam moments (and master copy) shrink the sharded optimizer state and the Adam step's bytes."""
    plan = ParallelPlan(tp=1, pp=1, dp=4, micro_batch=1, global_batch=8, distributed_optimizer=True,
                        optimizer_state=state)
    m = memory_per_stage(SMALL, plan)[0]
    assert m.optimizer_bytes == pytest.approx(per_param * m.params / 4)
    fp32_training = memory_per_stage(replace(SMALL, dtype="fp32"), plan)[0]
    assert fp32_training.optimizer_bytes == pytest.approx((8 if state == "fp32" else 4) * m.params / 4)
    df = build_transformer_graph(SMALL, plan, detail="kernel").tasks_frame()
    adam = df[df.name == "adam.multi_tensor_apply"]
    assert len(adam) == 1 and adam.bytes.iloc[0] == pytest.approx(adam_bytes_per_param(plan) * m.params / 4)
    assert adam_bytes_per_param(plan) == ADAM_BYTES_PER_PARAM - 2 * (12 - per_param)



def test_deepspeed_bf16_optimizer_all_reduces_fp32_gradients_and_holds_a_bf16_copy():
    """DeepSpeed's BF16 optimizer: the sharded state of the distributed optimizer, but the fp32 gradients
    all-reduced whole (twice a reduce-scatter's traffic) and 2 bytes a parameter more for the bf16 gradients."""
    megatron = ParallelPlan(tp=1, pp=2, dp=4, micro_batch=1, global_batch=16, distributed_optimizer=True,
                            grad_reduce_dtype="fp32", overlap_grad_reduce=False)
    deepspeed = ParallelPlan(**{**megatron.to_dict(), "deepspeed_bf16": True})
    assert deepspeed.label() == megatron.label() + "-dsbf16"
    m, d = memory_per_stage(SMALL, megatron)[0], memory_per_stage(SMALL, deepspeed)[0]
    assert d.grads_bytes - m.grads_bytes == pytest.approx(2 * m.params)
    assert d.optimizer_bytes == m.optimizer_bytes == pytest.approx(12 * m.params / 4)
    kinds = {}
    for name, plan in (("megatron", megatron), ("deepspeed", deepspeed)):
        df = build_transformer_graph(SMALL, plan, detail="kernel").tasks_frame()
        grads = df[df.name.str.startswith("dp_grad") & (df.kind != "cpu_op")]  # the collectives, not their launches
        kinds[name] = (set(grads.kind), grads.bytes.sum())
        assert (df.name == "param.all_gather").sum() >= 1  # each rank's updated shard gathered back
    assert kinds["megatron"][0] == {"reduce_scatter"} and kinds["deepspeed"][0] == {"all_reduce"}
    assert kinds["deepspeed"][1] == pytest.approx(kinds["megatron"][1])  # the same fp32 gradients go in
    t = {k: simulate(build_transformer_graph(SMALL, p, detail="kernel"), TIMING).iteration_s
         for k, p in (("megatron", megatron), ("deepspeed", deepspeed))}
    assert t["deepspeed"] > t["megatron"]
    # without the distributed optimizer the switch changes nothing: plain all-reduce, no bf16 copy
    plain = ParallelPlan(**{**deepspeed.to_dict(), "distributed_optimizer": False})
    assert not plain.deepspeed_bf16_grads and memory_per_stage(SMALL, plain)[0].grads_bytes == pytest.approx(
        4 * m.params)

# --------------------------------------------------------------------------- bad plans
@pytest.mark.parametrize(
    ("plan", "devices", "message"),
    [
        (dict(tp=3), None, "8 attention heads are not divisible by tp=3"),
        (dict(tp=4, dp=1), None, "2 key/value heads are not divisible by tp=4"),
        (dict(cp=3, tp=1, dp=1, global_batch=4), None, "seq 256 is not divisible"),
        (dict(cp=2, tp=1), None, "context parallelism needs a fused attention"),
        (dict(recompute_layers=2), None, "recompute_layers needs recompute: full"),
        (dict(recompute="full", recompute_layers=5, pp=2), None, "recompute_layers must be 1 .. 4"),
        (dict(pp=16, tp=1, dp=1), None, "pp=16 pipeline stages but the model has only 8 layers"),
        (dict(tp=2, pp=2, dp=2), 16, "tp x pp x dp = 2 x 2 x 2 = 8, but the cluster has 16 devices"),
        (dict(pp=3, tp=1, dp=1, global_batch=6), None, "8 layers cannot be split evenly over pp=3"),
        (dict(global_batch=10), None, "global batch 10 is not divisible by dp x micro_batch = 2 x 2"),
        (dict(ep=2), None, "ep=2 needs a MoE model"),
        (dict(schedule="interleaved", virtual_stages=2, global_batch=6, micro_batch=2, dp=1), None,
         "micro-batches per replica (3) divisible by pp=2"),
    ],
)
def test_bad_plans_say_what_is_wrong(plan, devices, message):
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_plan(GQA if "key/value" in message else SMALL, _plan(**plan), devices)


def test_stage_graph_for_alpa():
    g = build_stage_graph(SMALL, ParallelPlan(tp=2, micro_batch=2), 3, with_embedding=True, with_head=False)
    df = g.tasks_frame()
    assert g.n_ranks == 1
    assert (df.name == "layer[2].qkv.addmm").sum() == 1 and (df.name == "layer[3].qkv.addmm").sum() == 0
    assert (df.name == "word_embedding.gather").sum() == 1 and (df.name == "lm_head.mm").sum() == 0
    assert not df.kind.isin(["send_recv", "optimizer"]).any()
    with pytest.raises(PlanError):
        build_stage_graph(SMALL, ParallelPlan(tp=3), 2, with_embedding=False, with_head=False)


def test_host_mode_builds_and_simulates():
    cpu = get_platform("a100-80gb").model_copy(update={"kind": "cpu"})
    g = build_transformer_graph(SMALL, _plan(), detail="kernel", mode="host")
    assert not g.is_gpu().any()
    assert simulate(g, transformer_timing(cpu)).iteration_s > 0


def test_pipeline_bubble_shrinks_with_micro_batches_and_interleaving():
    mid = TransformerSpec(layers=8, hidden=2048, heads=16, seq=1024, vocab=8000, name="mid")

    def per_sample(**kw):
        plan = ParallelPlan(tp=1, pp=4, dp=1, micro_batch=1, **kw)
        return simulate(build_transformer_graph(mid, plan, detail="stage", timing=TIMING), TIMING).iteration_s / plan.global_batch

    few, many = per_sample(global_batch=4), per_sample(global_batch=32)
    assert many < few  # bubble (p-1)/m: 3/4 of the work vs 3/32
    assert few / many == pytest.approx((1 + 3 / 4) / (1 + 3 / 32), rel=0.15)
    assert per_sample(global_batch=8, schedule="interleaved", virtual_stages=2) < per_sample(global_batch=8)


def test_eager_program_has_pytorchs_extra_kernels_and_host_ops():
    """program="eager": the plain-PyTorch GPT (separate dropout / residual add, bias-gradient sums,
    3-kernel layer-norm backward, reshape copies, log-softmax + NLL, AccumulateGrad host ops, foreach
    grad norm + fused Adam); the same GEMM FLOPs as Megatron's program."""
    import dataclasses

    spec = TransformerSpec(layers=2, hidden=256, heads=4, seq=128, vocab=2048, dtype="fp32", attention="unfused")
    plan = ParallelPlan(micro_batch=4, global_batch=4)
    platform = get_platform("h100-sxm")
    graphs = {}
    for prog in ("megatron", "eager"):
        g = build_transformer_graph(dataclasses.replace(spec, program=prog), plan, detail="kernel", mode="device")
        g.validate()
        graphs[prog] = g
        assert simulate(g, transformer_timing(platform)).iteration_s > 0
    meg, eag = graphs["megatron"], graphs["eager"]
    assert eag.is_gpu().sum() > 1.5 * meg.is_gpu().sum()
    names = set(eag.names)
    assert "log_softmax" in names and "adam.fused" in names and "vocab_parallel_cross_entropy" not in names
    # one AccumulateGrad per parameter tensor: 12 per layer, token + position tables, final norm's two
    acc = [n for n in eag.tasks_frame()["name"] if ".accumulate_grad[" in n]
    assert len(acc) == 12 * spec.layers + 4
    gemm_kinds = ["gemm", "addmm", "mm", "bmm"]  # eager names the ATen op, Megatron's program "gemm"
    gemm_flops = {p: float(np.nansum(g.flops[g.tasks_frame()["kind"].isin(gemm_kinds).to_numpy()]))
                  for p, g in graphs.items()}
    assert set(eag.tasks_frame()["kind"]) & set(gemm_kinds) == {"addmm", "mm", "bmm"}
    assert gemm_flops["eager"] == pytest.approx(gemm_flops["megatron"])
    # host mode builds too (the kernels run on the thread)
    build_transformer_graph(dataclasses.replace(spec, program="eager"), plan, detail="kernel", mode="host").validate()


def test_uneven_pipeline_split_prices_each_stage_by_its_layers():
    """A 10-layer model on 4 stages: the stage holding most layers paces the pipeline; its memory follows its layers."""
    spec = replace(SMALL, layers=10, attention="flash")
    plan = ParallelPlan(tp=1, pp=4, dp=1, micro_batch=1, global_batch=8)
    with pytest.raises(PlanError, match="stage_layers splits them unevenly"):
        check_plan(spec, plan)
    balanced, lopsided = replace(plan, stage_layers=(2, 3, 3, 2)), replace(plan, stage_layers=[1, 4, 4, 1])
    assert lopsided.stage_layers == (1, 4, 4, 1) and balanced.label() != lopsided.label()
    assert balanced.label().endswith("-layers2,3x2,2")
    times = [simulate(build_transformer_graph(spec, p, detail="kernel"), TIMING).iteration_s for p in (balanced, lopsided)]
    assert times[1] > 1.15 * times[0]  # the 4-layer stages pace the pipeline
    mem = memory_per_stage(spec, balanced)
    assert [m.params for m in mem][1] > [m.params for m in mem][3] - spec.padded_vocab(1) * spec.hidden
    assert mem[1].activations_bytes > mem[2].activations_bytes  # 3 layers each, more micro-batches in flight
    even = replace(SMALL, layers=12, attention="flash")
    assert build_transformer_graph(even, replace(plan, stage_layers=(3, 3, 3, 3)), detail="kernel").n_tasks == \
        build_transformer_graph(even, plan, detail="kernel").n_tasks


@pytest.mark.parametrize("layers, match", [((2, 3, 3), "one per virtual pipeline stage"),
                                           ((2, 3, 3, 3), "adds up to 11"), ((5, 0, 3, 2), "at least one layer")])
def test_stage_layers_that_do_not_split_the_model_are_refused(layers, match):
    spec = replace(SMALL, layers=10, attention="flash")
    with pytest.raises(PlanError, match=match):
        check_plan(spec, ParallelPlan(tp=1, pp=4, dp=1, micro_batch=1, global_batch=8, stage_layers=layers))


def test_memory_fraction_leaves_headroom_on_each_device():
    """``options.memory_fraction``: a plan must fit in that share of the device; the reason says so."""
    from tuner.plans import predict_plan

    spec = TransformerSpec(layers=4, hidden=512, heads=8, seq=512, vocab=1000)
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1)
    a100 = get_platform("a100-80gb")
    whole, _ = predict_plan(spec, plan, a100)
    need = whole["memory_bytes_per_device"] / a100.memory_bytes
    fits, _ = predict_plan(spec, plan, a100, memory_fraction=min(1.0, need * 1.01))
    short, _ = predict_plan(spec, plan, a100, memory_fraction=need * 0.99)
    assert whole["feasible"] and fits["feasible"] and "usable_memory_bytes" not in whole
    assert not short["feasible"] and short["predicted_iteration_s"] is None and "% usable" in short["reason"]
    assert short["usable_memory_bytes"] == pytest.approx(need * 0.99 * a100.memory_bytes)
