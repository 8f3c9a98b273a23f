"""Communication of the transformer synthesiser across nodes: pipeline transfers share the sender's NICs
with its gradient buckets, and FSDP's gathers and reduce-scatters run on one NCCL stream in issue order."""

from __future__ import annotations

import numpy as np

from predictor.simulate import simulate
from predictor.sources.synth.transformer import (
    ParallelPlan,
    TransformerSpec,
    build_transformer_graph,
    transformer_timing,
)
from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.collective import PiecewiseCollective
from predictor.timing.platforms import get_platform

SPEC = TransformerSpec(layers=4, hidden=512, heads=8, seq=256, vocab=4096)
A100 = get_platform("a100-80gb")


def _sends(plan: ParallelPlan):
    df = build_transformer_graph(SPEC, plan, detail="kernel").tasks_frame()
    return df[(df.kind == "send_recv") & df.name.str.startswith("send")]


def test_p2p_after_the_senders_buckets_launch_shares_its_nics():
    # tp 8 x pp 2 x dp 2 on 8-GPU nodes: stage links and the dp group both cross nodes
    plan = ParallelPlan(tp=8, pp=2, dp=2, micro_batch=1, global_batch=8, overlap_grad_reduce=True)
    sends = _sends(plan)
    shared = sends[np.isfinite(sends.nic_share)]
    assert len(shared) >= 1 and (shared.nic_share == 2.0).all()
    # only transfers after the sender's last backward (its buckets in flight) share; the forward ones do not
    assert shared.name.str.startswith("send gradient").all()
    assert len(shared) < len(sends)


def test_p2p_shares_nothing_without_network_buckets():
    no_overlap = ParallelPlan(tp=8, pp=2, dp=2, micro_batch=1, global_batch=8, overlap_grad_reduce=False)
    one_replica = ParallelPlan(tp=8, pp=2, dp=1, micro_batch=1, global_batch=4, overlap_grad_reduce=True)
    for plan in (no_overlap, one_replica):
        sends = _sends(plan)
        assert "nic_share" not in sends or not np.isfinite(sends.nic_share).any()


def test_a_shared_p2p_transfer_takes_longer():
    model = PiecewiseCollective()
    view = TaskView.from_columns("send_recv", msg_bytes=np.asarray([64e6, 64e6]), world=np.asarray([2.0, 2.0]),
                                 nodes=np.asarray([2.0, 2.0]), nic_share=np.asarray([1.0, 2.0]))
    alone, shared = model.predict(view, A100)
    assert shared > 1.8 * alone


def test_fsdp_collectives_share_one_stream_in_fsdp_issue_order():
    plan = ParallelPlan(dp=16, micro_batch=2, global_batch=32, fsdp=True, overlap_grad_reduce=True)
    df = build_transformer_graph(SPEC, plan, detail="kernel").tasks_frame()
    fsdp = df[df.name.str.startswith("fsdp.") & df.kind.isin(["all_gather", "reduce_scatter"])]
    assert set(fsdp.processor) == {"stream comm"}
    names = fsdp.name.tolist()  # task ids follow issue order on the stream
    bwd = names[names.index("fsdp.layer[3].all_gather_bwd"):]
    # BACKWARD_PRE: layer i's backward prefetches layer i-1's gather, then its gradients reduce-scatter
    assert bwd[:4] == ["fsdp.layer[3].all_gather_bwd", "fsdp.layer[2].all_gather_bwd",
                       "fsdp.layer[3].reduce_scatter", "fsdp.layer[1].all_gather_bwd"]


def test_fsdp_reduce_scatters_and_gathers_never_overlap_in_time():
    timing = transformer_timing(A100)
    spec = TransformerSpec(layers=4, hidden=2048, heads=16, seq=1024, vocab=8192)
    plan = ParallelPlan(dp=64, micro_batch=1, global_batch=64, fsdp=True, overlap_grad_reduce=True)
    tl = simulate(build_transformer_graph(spec, plan, timing=timing, detail="kernel"), timing)
    df = tl.to_frame()
    comm = df[df.name.str.startswith("fsdp.") & df.kind.isin(["all_gather", "reduce_scatter"])].sort_values("start_s")
    start, end = comm.start_s.to_numpy(), comm.end_s.to_numpy()
    assert np.all(start[1:] >= end[:-1] - 1e-12)
