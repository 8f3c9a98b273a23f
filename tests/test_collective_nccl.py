"""NCCL's cost model for collectives (ring / tree, LL / LL128 / Simple) and the catalog's network fields."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec, build_transformer_graph
from predictor.sources.synth.transformer_emitter import GroupLayout
from predictor.timing.kernels import PiecewiseCollective
from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.collective import alpha_beta, group_links, nccl_candidates, nccl_seconds
from predictor.timing.platforms import get_platform

A100 = get_platform("a100-80gb")
H100 = get_platform("h100-sxm")
NETWORK_FIELDS = ("collective_model", "nics_per_node", "nic_bandwidth_bytes_per_s", "network_efficiency",
                  "intra_node_bus_bandwidth_bytes_per_s", "tree_bus_bandwidth_bytes_per_s", "ll128")


def _line(p):
    return p.model_copy(update={"interconnect": p.interconnect.model_copy(update={"collective_model": "line"})})


@pytest.mark.parametrize("key", ["a100-40gb", "a100-80gb", "h100-sxm", "h200"])
def test_catalog_network_fields_have_sources(key):
    p = get_platform(key)
    assert p.interconnect.collective_model == "nccl"
    for f in NETWORK_FIELDS:
        assert p.sources.get(f"interconnect.{f}"), f"{key}: interconnect.{f} has no source"
    assert p.interconnect.nics_per_node == 8  # DGX A100 / H100: one compute NIC per GPU


def test_single_node_ring_reaches_the_nvlink_bus_bandwidth():
    m = 1e9
    t = nccl_seconds("all_reduce", 8, 1, np.array([m]), A100)[0]
    algbw = 235e9 * 8 / 14  # ring: bus bandwidth x n / 2(n-1)
    assert m / t == pytest.approx(algbw, rel=0.02)
    # all-gather moves half the bytes of an all-reduce per rank
    assert nccl_seconds("all_gather", 8, 1, np.array([m]), A100)[0] < 0.55 * t


def test_small_messages_take_the_low_latency_protocol_and_time_grows_with_size():
    m = np.logspace(2, 9, 50)
    t = nccl_seconds("all_reduce", 16, 2, m, A100)
    assert np.all(np.diff(t) >= 0)
    cands = nccl_candidates("all_reduce", 16, 2, 1e3, A100)
    best = min(cands, key=lambda k: cands[k][0] + 1e3 / cands[k][1])
    assert best[1] == "LL"  # a few KB: LL's latency wins over Simple's bandwidth
    # NCCL's model is far below the line model's 2(n-1) network hops for tiny messages
    ts, _ = alpha_beta("all_reduce", 16, 2, A100)
    assert t[0] < ts


def test_groups_spanning_nodes_are_bound_by_their_share_of_the_nics():
    ln = group_links(16, 2, A100)
    assert ln.net_bus == pytest.approx(8 * 25e9 * 0.95)  # 8 ranks per node, one NIC each
    assert ln.net_bus < ln.intra_bus
    one = nccl_seconds("all_reduce", 8, 1, np.array([2.5e8]), A100)[0]
    two = nccl_seconds("all_reduce", 16, 2, np.array([2.5e8]), A100)[0]
    assert two > 1.3 * one
    # one rank per node (a data-parallel group of TP=8 replicas) rides a single NIC
    assert group_links(8, 8, A100).net_bus == pytest.approx(25e9 * 0.95)


def test_tree_wins_across_many_nodes_for_medium_messages():
    cands = nccl_candidates("all_reduce", 512, 64, 4e6, A100)
    best = min(cands, key=lambda k: cands[k][0] + 4e6 / cands[k][1])
    assert best[0] == "tree"
    # the ring still wins for huge messages on few nodes (bandwidth, no tree cap)
    cands = nccl_candidates("all_reduce", 16, 2, 1e9, A100)
    best = min(cands, key=lambda k: cands[k][0] + 1e9 / cands[k][1])
    assert best[0] == "ring"


def test_nic_sharing_slows_network_bound_collectives():
    m = np.array([5e8])
    alone = nccl_seconds("all_reduce", 16, 2, m, A100)[0]
    shared = nccl_seconds("all_reduce", 16, 2, m, A100, nic_share=2.0)[0]
    assert shared == pytest.approx(2 * alone, rel=0.05)
    # inside one node there is no NIC to share
    assert nccl_seconds("all_reduce", 8, 1, m, A100, nic_share=2.0)[0] == pytest.approx(
        nccl_seconds("all_reduce", 8, 1, m, A100)[0])
    model = PiecewiseCollective()
    view = TaskView.from_columns("all_reduce", msg_bytes=[5e8, 5e8], world=[16, 16], nodes=[2, 2], nic_share=[1.0, 2.0])
    t = model.predict(view, A100)
    assert t[1] == pytest.approx(2 * t[0], rel=0.05)


def test_send_recv_and_all_to_all_across_nodes_use_the_nic():
    m = np.array([1e8])
    p2p = nccl_seconds("send_recv", 2, 2, m, A100)[0]
    assert m[0] / p2p == pytest.approx(25e9 * 0.95, rel=0.01)
    a2a = nccl_seconds("all_to_all", 16, 2, m, A100)[0]
    assert a2a == pytest.approx(8 / 16 * 1e8 / (25e9 * 0.95) + 22.4e-6, rel=0.01)  # + NCCL's base and one hop


def test_line_model_is_kept_for_platforms_that_ask_for_it():
    line = _line(A100)
    model = PiecewiseCollective()
    t = model.predict(TaskView.single("all_reduce", msg_bytes=2.5e8, world=16, nodes=2), line)[0]
    ts, bw = alpha_beta("all_reduce", 16, 2, line)
    assert t == pytest.approx(ts + 2.5e8 / bw)
    assert get_platform("mi300x").interconnect.collective_model == "line"  # no network fields: the line


def test_h100_network_is_twice_the_a100s():
    assert group_links(16, 2, H100).net_bus == pytest.approx(2 * group_links(16, 2, A100).net_bus)


def test_group_layout_counts_tp_and_dp_sharing_the_nics():
    assert GroupLayout.of(ParallelPlan(tp=16, dp=4, global_batch=8), 8).tp_share == 2.0  # both cross nodes
    assert GroupLayout.of(ParallelPlan(tp=16, dp=4, global_batch=8, overlap_grad_reduce=False), 8).tp_share == 1.0
    lay = GroupLayout.of(ParallelPlan(tp=8, dp=4, global_batch=8), 8)
    assert (lay.tp_share, lay.dp_share) == (1.0, 1.0)  # TP stays on NVLink


def test_fp8_linear_runs_the_layer_linears_in_one_byte():
    spec = TransformerSpec(layers=2, hidden=256, heads=4, seq=128, vocab=1024, fp8_linear=True)
    g = build_transformer_graph(spec, ParallelPlan(global_batch=1), detail="kernel")
    df = g.tasks_frame()
    df["dtype_bytes"] = g.params["dtype_bytes"]
    gemm = df[df.kind == "gemm"]
    linear = gemm[gemm.name.str.contains(r"\.(?:qkv|attn_proj|fc1|fc2)\.")]
    assert len(linear) and (linear.dtype_bytes == 1).all()
    rest = gemm[gemm.name.str.contains(r"lm_head|attn_scores|attn_context")]
    assert len(rest) and (rest.dtype_bytes == 2).all()
    # Transformer Engine's cast-transposes: 4 linear inputs forward, 4 output gradients backward, per layer
    casts = df[df.name.str.contains("fp8_cast") & (df.category == "memory")]
    assert len(casts) == 8 * spec.layers
    plain = build_transformer_graph(TransformerSpec(layers=2, hidden=256, heads=4, seq=128, vocab=1024),
                                    ParallelPlan(global_batch=1), detail="kernel").tasks_frame()
    assert not plain.name.str.contains("fp8_cast").any()
