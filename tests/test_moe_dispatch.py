"""DeepEP's dispatcher and node-limited routing: the bytes they move, their price, and Megatron's flags."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from predictor.sources.synth.transformer import MoESpec, ParallelPlan, PlanError, TransformerSpec
from predictor.sources.synth.transformer_kernels import deepep_bytes
from predictor.timing.platforms import get_platform
from tuner.launch import LaunchError, launch_payload, megatron_args, read_megatron_args
from tuner.plans import predict_plan

H100 = get_platform("h100-sxm")
V3 = MoESpec(experts=256, top_k=8, ffn=2048, dispatcher="deepep")
SPEC = TransformerSpec(layers=4, hidden=2048, heads=16, seq=2048, vocab=32000, mlp="swiglu",
                       moe=MoESpec(experts=64, top_k=8, ffn=1024))
SHAPE = ("--num-layers 4 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 "
         "--vocab-size 32000 --global-batch-size 64 --swiglu --num-experts 64 --moe-router-topk 8 "
         "--moe-ffn-hidden-size 1024 --expert-model-parallel-size 32 --moe-expert-capacity-factor 1 ")


def test_deepep_sends_a_token_once_per_destination_node_and_gpu():
    """DeepSeek-V3 (256 experts, top 8) over EP 64 on 8 nodes: 5.3 of 8 nodes hold one of a token's experts
    (4.6 of them remote, against the all-to-all's 7 remote copies); with 8 groups, top 4, at most 4 nodes
    (3.5 remote). Inside one node only GPU copies count: 8 experts over 8 GPUs reach 5.3 of them."""
    def none_of(held: int) -> float:  # a token's 8 experts of 256 avoid ``held`` given experts
        return math.comb(256 - held, 8) / math.comb(256, 8)

    nvl, net = deepep_bytes(V3, 64, 8)
    assert net == pytest.approx(8 * (1 - none_of(32)) * 7 / 8) and 4.5 < net < 4.7
    assert nvl == pytest.approx(64 * (1 - none_of(4)) * (1 - 8 / 64))
    assert deepep_bytes(replace(V3, router_groups=8, router_group_topk=4), 64, 8)[1] == pytest.approx(3.5)
    nvl1, net1 = deepep_bytes(V3, 8, 1)
    assert net1 == 0.0 and nvl1 == pytest.approx(8 * (1 - none_of(32)) * 7 / 8)
    assert deepep_bytes(replace(V3, experts=8, top_k=8), 8, 8) == (0.0, pytest.approx(7.0))  # a GPU a node


def test_deepep_prices_cross_node_expert_parallelism_below_the_all_to_all():
    plan = ParallelPlan(tp=1, pp=1, dp=32, ep=32, micro_batch=1, global_batch=32, distributed_optimizer=True)

    def step(**moe) -> float:
        return predict_plan(replace(SPEC, moe=replace(SPEC.moe, **moe)), plan, H100)[0]["predicted_iteration_s"]

    a2a, deepep = step(), step(dispatcher="deepep")
    limited = step(dispatcher="deepep", router_groups=4, router_group_topk=2)
    assert limited < deepep < 0.9 * a2a
    one = replace(plan, ep=1)
    assert predict_plan(replace(SPEC, moe=replace(SPEC.moe, dispatcher="deepep")), one, H100)[0][
        "predicted_iteration_s"] == predict_plan(SPEC, one, H100)[0]["predicted_iteration_s"]  # no exchange


def test_megatron_flex_dispatcher_and_group_routing_read_and_written():
    deepep = read_megatron_args(SHAPE + "--moe-token-dispatcher-type flex", devices=32).spec.moe
    assert deepep.dispatcher == "deepep"
    old = read_megatron_args(SHAPE + "--moe-token-dispatcher-type flex --moe-enable-deepep", devices=32)
    assert old.spec.moe.dispatcher == "deepep"
    hybrid = read_megatron_args(SHAPE + "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep",
                                devices=32)
    assert hybrid.spec.moe.dispatcher == "deepep" and any("hybridep" in n for n in hybrid.notes)
    grouped = read_megatron_args(SHAPE + "--moe-router-num-groups 4 --moe-router-group-topk 2", devices=32).spec
    assert (grouped.moe.router_groups, grouped.moe.router_group_topk, grouped.moe.dispatcher) == (4, 2, "alltoall")
    spec = replace(SPEC, moe=replace(SPEC.moe, dispatcher="deepep", router_groups=4, router_group_topk=2))
    plan = ParallelPlan(tp=1, pp=1, dp=32, ep=32, micro_batch=1, global_batch=64)
    args = megatron_args(spec, plan)
    assert "--moe-flex-dispatcher-backend" in args
    assert read_megatron_args(args, devices=32).spec == replace(spec, name="megatron-model")
    with pytest.raises(LaunchError, match="go together"):
        read_megatron_args(SHAPE + "--moe-router-num-groups 4", devices=32)
    with pytest.raises(LaunchError, match="--moe-router-num-groups 3 must divide"):
        read_megatron_args(SHAPE + "--moe-router-num-groups 3 --moe-router-group-topk 1", devices=32)
    changes = launch_payload(spec, plan, platform="h100-sxm", devices_per_node=8)["torchtitan_changes"]
    assert changes["moe.dispatcher"] == ["deepep", "alltoall"] and changes["moe.router_group_topk"] == [2, 0]


@pytest.mark.parametrize(("moe", "match"), [
    ({"dispatcher": "nccl"}, "moe.dispatcher must be alltoall or deepep"),
    ({"router_groups": 64, "router_group_topk": 2}, "groups holding at least top_k"),
    ({"router_groups": 4, "router_group_topk": 5}, "router_group_topk 5"),
])
def test_bad_routing_is_a_plan_error(moe, match):
    with pytest.raises(PlanError, match=match):
        replace(SPEC, moe=replace(SPEC.moe, **moe)).validate()


def test_space_files_name_the_dispatcher_and_the_routing_groups():
    from pydantic import ValidationError

    from tuner.search.parallel import MoESection

    moe = MoESection(experts=64, top_k=8, dispatcher="deepep", router_groups=8, router_group_topk=4)
    assert (moe.dispatcher, moe.router_groups, moe.router_group_topk) == ("deepep", 8, 4)
    with pytest.raises(ValidationError):
        MoESection(experts=64, dispatcher="nccl")
