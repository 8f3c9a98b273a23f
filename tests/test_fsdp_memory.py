"""Memory of FSDP FULL_SHARD plans: model states sharded over the data-parallel group."""

from __future__ import annotations

import pytest

from predictor.sources.synth.transformer import MoESpec, ParallelPlan, TransformerSpec
from predictor.sources.synth.transformer_memory import (
    expert_params_per_device,
    layer_param_count,
    memory_per_stage,
)
from predictor.timing.platforms import get_platform
from tuner.plans import predict_plan

#: GPT-3 13B (Brown et al. Table 2.1): 40 layers, hidden 5120, 40 heads, 2048 tokens
GPT13B = TransformerSpec(layers=40, hidden=5120, heads=40, seq=2048, vocab=50257)
A100 = get_platform("a100-80gb")


def _plan(dp: int, fsdp: bool, **kw) -> ParallelPlan:
    return ParallelPlan(dp=dp, micro_batch=1, global_batch=dp, recompute="full", fsdp=fsdp, **kw)


def test_large_fsdp_plan_fits_only_with_sharding():
    # 13B parameters x 18 bytes = 234 GB unsharded: plain DP overflows 80 GiB, FSDP over 64 fits in half of it
    ddp = memory_per_stage(GPT13B, _plan(64, False))[0]
    zero1 = memory_per_stage(GPT13B, _plan(64, False, distributed_optimizer=True))[0]
    fsdp = memory_per_stage(GPT13B, _plan(64, True))[0]
    assert ddp.total_bytes > A100.memory_bytes
    assert fsdp.total_bytes < 0.5 * A100.memory_bytes < zero1.total_bytes  # ZeRO-1 keeps weights and gradients
    assert fsdp.params == pytest.approx(ddp.params)  # the stage's parameters; a device keeps 1/dp of them


def test_sharded_states_fall_as_one_over_dp_and_gathered_buffers_stay():
    m8, m32 = (memory_per_stage(GPT13B, _plan(dp, True))[0] for dp in (8, 32))
    for field in ("weights_bytes", "grads_bytes", "optimizer_bytes"):
        assert getattr(m8, field) / getattr(m32, field) == pytest.approx(4.0)
    states = m8.weights_bytes + m8.grads_bytes + m8.optimizer_bytes
    assert states == pytest.approx(m8.params * (2 + 4 + 12) / 8)
    assert m8.buffers_bytes == pytest.approx(m32.buffers_bytes)  # gathered root + 2 layers + 2 gradient buffers
    layer = layer_param_count(GPT13B, 1)
    root = GPT13B.padded_vocab(1) * 5120 + 2048 * 5120 + 2 * 5120
    no_fsdp = memory_per_stage(GPT13B, _plan(8, False))[0]
    assert m8.buffers_bytes - no_fsdp.buffers_bytes == pytest.approx(root * 4 + 4 * layer * 2)


def test_fsdp_with_tp_shards_each_tensor_parallel_ranks_states():
    # torchtitan's 2-D layout: the TP rank's parameters, sharded over dp; the gathered buffers are its share
    tp8 = memory_per_stage(GPT13B, _plan(8, True, tp=8, sequence_parallel=True))[0]
    dense = memory_per_stage(GPT13B, _plan(8, True))[0]
    assert tp8.params == pytest.approx(dense.params / 8, rel=0.01)
    assert tp8.weights_bytes == pytest.approx(tp8.params * 2 / 8)
    zero1 = memory_per_stage(GPT13B, _plan(8, False, tp=8, sequence_parallel=True, distributed_optimizer=True))[0]
    assert tp8.total_bytes < zero1.total_bytes  # ZeRO-1 keeps the TP rank's weights and gradients whole
    no_fsdp = memory_per_stage(GPT13B, _plan(8, False, tp=8, sequence_parallel=True))[0]
    layer = layer_param_count(GPT13B, 8)
    root = GPT13B.padded_vocab(8) * 5120 / 8 + 2048 * 5120 + 2 * 5120  # the rank's vocabulary rows
    assert tp8.buffers_bytes - no_fsdp.buffers_bytes == pytest.approx(root * 4 + 4 * layer * 2)


def test_fsdp_shards_routed_experts_over_the_ranks_holding_them():
    # torchtitan wraps an MoE layer's experts apart: sharded over dp / ep ranks, the rest over dp
    moe = TransformerSpec(layers=8, hidden=2048, heads=16, seq=2048, vocab=32000, mlp="swiglu",
                          moe=MoESpec(experts=16, top_k=2, ffn=1024, dense_layers=1))
    plan = ParallelPlan(dp=8, ep=2, micro_batch=1, global_batch=8, fsdp=True)
    m = memory_per_stage(moe, plan)[0]
    experts = expert_params_per_device(moe, plan, 0)
    assert 0 < experts < m.params
    assert m.weights_bytes == pytest.approx(((m.params - experts) / 8 + experts / 4) * 2)
    zero1 = memory_per_stage(moe, ParallelPlan(dp=8, ep=2, micro_batch=1, global_batch=8, distributed_optimizer=True))[0]
    assert m.total_bytes < zero1.total_bytes


def test_dp1_fsdp_is_plain_training():
    a, b = (memory_per_stage(GPT13B, _plan(1, f))[0] for f in (True, False))
    assert a.total_bytes == pytest.approx(b.total_bytes)


def test_predict_calls_the_fsdp_plan_feasible():
    # 6.7B parameters x 18 bytes = 120 GB: out of memory as DDP on 80 GB, fits as FSDP over 8
    spec = TransformerSpec(layers=8, hidden=8192, heads=64, seq=1024, vocab=32000)
    res_fsdp, _ = predict_plan(spec, _plan(8, True), A100, devices=8)
    res_ddp, _ = predict_plan(spec, _plan(8, False), A100, devices=8)
    assert res_fsdp["feasible"] and res_fsdp["predicted_iteration_s"] > 0
    assert not res_ddp["feasible"] and "GiB" in res_ddp["reason"]
