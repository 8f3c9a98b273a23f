"""NIC sharing of overlapped traffic classes: the ``nic_share`` parameter column, set by the transformer
synthesiser for TP collectives and data-parallel buckets that meet on a node's NICs, read by the NCCL
collective model."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.graph import PARAM_COLUMNS, Category, GraphBuilder, ProcKind
from predictor.simulate import simulate
from predictor.sources.synth.transformer import (
    ParallelPlan,
    TransformerSpec,
    build_transformer_graph,
    transformer_timing,
)
from predictor.sources.synth.transformer_emitter import GroupLayout
from predictor.timing.kernels.base import TaskView
from predictor.timing.platforms import get_platform

A100 = get_platform("a100-80gb")
SPEC = TransformerSpec(layers=8, hidden=4096, heads=32, seq=1024, vocab=8192)
#: TP 16 spans two 8-GPU nodes; its DP-2 partner ranks sit on other nodes
CROSS = ParallelPlan(tp=16, dp=2, micro_batch=1, global_batch=2, overlap_grad_reduce=True)  # one micro-batch


def _graph(plan: ParallelPlan, spec: TransformerSpec = SPEC):
    return build_transformer_graph(spec, plan, detail="kernel")


def test_column_is_a_kernel_parameter():
    assert "nic_share" in PARAM_COLUMNS
    b = GraphBuilder()
    p = b.processor(0, ProcKind.GPU_STREAM, "stream comm")
    b.task(p, "ar", "all_reduce", Category.COMMUNICATION, params={"msg_bytes": 1e6, "world": 16, "nodes": 2,
                                                                 "nic_share": 2.0})
    assert b.build().params["nic_share"][0] == 2.0
    assert TaskView.single("all_reduce", nic_share=2.0).get("nic_share")[0] == 2.0


def test_layout_marks_shared_classes_only_when_both_cross_the_network():
    assert GroupLayout.of(CROSS, 8).tp_share == 2.0
    assert GroupLayout.of(ParallelPlan(tp=16, dp=2, global_batch=4, overlap_grad_reduce=False), 8).tp_share == 1.0
    assert GroupLayout.of(ParallelPlan(tp=8, dp=4, global_batch=4, overlap_grad_reduce=True), 8).tp_share == 1.0


def test_overlapped_dp_bucket_is_slower_with_tp_traffic_on_the_same_nics():
    g = _graph(CROSS)
    df = g.tasks_frame()
    share = g.params["nic_share"]
    timing = transformer_timing(A100)
    shared = timing.durations(g)
    alone_g = _graph(CROSS)
    del alone_g.params["nic_share"]
    alone = timing.durations(alone_g)
    kernel = (df.category == "communication").to_numpy() & (df.kind == "all_reduce").to_numpy()
    bucket = kernel & df.name.str.startswith("dp_grad").to_numpy()
    during = bucket & np.isfinite(share)
    assert during.any() and (bucket & ~during).any()  # the last bucket reduces after the backward, alone
    assert np.all((share[during] > 1.0) & (share[during] <= 2.0))
    assert np.all(shared[during] > alone[during] * 1.05)
    np.testing.assert_array_equal(shared[bucket & ~during], alone[bucket & ~during])
    # the TP collectives of the backward that launches the buckets share; the forward's do not
    tp = kernel & df.name.str.contains("grad_all_reduce").to_numpy()
    assert np.all(share[tp] == 2.0) and np.all(shared[tp] > alone[tp])
    fwd = kernel & df.name.str.endswith("_output_all_reduce").to_numpy()
    assert fwd.any() and not np.isfinite(share[fwd]).any()
    assert simulate(g, timing).iteration_s > simulate(alone_g, timing).iteration_s


def test_only_the_last_micro_batch_backward_shares():
    plan = ParallelPlan(tp=16, dp=2, micro_batch=1, global_batch=8, overlap_grad_reduce=True)
    g = _graph(plan, TransformerSpec(layers=2, hidden=1024, heads=16, seq=256, vocab=4096))
    df = g.tasks_frame()
    grads = (df.kind == "all_reduce").to_numpy() & df.name.str.contains("grad_all_reduce").to_numpy()
    shared = grads & np.isfinite(g.params["nic_share"])
    assert plan.micro_batches == 4
    assert 0 < shared.sum() == grads.sum() // plan.micro_batches


@pytest.mark.parametrize("plan", [
    ParallelPlan(tp=8, dp=1, micro_batch=1, global_batch=4, overlap_grad_reduce=True),  # one node
    ParallelPlan(tp=2, dp=4, micro_batch=1, global_batch=4, overlap_grad_reduce=True),  # one node
    ParallelPlan(tp=8, dp=4, micro_batch=1, global_batch=4, overlap_grad_reduce=True),  # TP inside each node
])
def test_plans_without_overlapping_network_classes_are_unchanged(plan):
    g = _graph(plan)
    assert "nic_share" not in g.params
    timing = transformer_timing(A100)
    before = timing.durations(g)
    g.params["nic_share"] = np.ones(g.n_tasks)  # every class alone on its NICs
    np.testing.assert_array_equal(timing.durations(g), before)
