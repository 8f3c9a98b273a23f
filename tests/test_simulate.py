"""The simulator on small hand-built graphs whose answers are worked out by hand (seconds)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictor.graph import Category, DepKind, GraphBuilder, GraphError, ProcKind
from predictor.simulate import simulate, union_length

C, M, X = Category.COMPUTE, Category.COMMUNICATION, Category.CPU


def _streams(b: GraphBuilder, rank: int):
    return (
        b.processor(rank, ProcKind.CPU_THREAD, "cpu"),
        b.processor(rank, ProcKind.GPU_STREAM, "compute"),
        b.processor(rank, ProcKind.GPU_STREAM, "comm"),
    )


def test_compute_communication_overlap():
    # one rank: a 10 s kernel on the compute stream and a 6 s collective on the comm stream,
    # launched together at t=0 -> they overlap for 6 s; iteration 10 s.
    b = GraphBuilder()
    _, cp, cm = _streams(b, 0)
    b.task(cp, "gemm", "gemm", C, duration=10.0)
    b.task(cm, "all_reduce", "all_reduce", M, duration=6.0)
    tl = simulate(b.build())
    assert tl.iteration_s == pytest.approx(10.0)
    bd = tl.breakdown(0)
    assert bd.overlap == pytest.approx(6.0)
    assert bd.exposed_compute == pytest.approx(4.0)
    assert bd.exposed_communication == pytest.approx(0.0)
    assert bd.idle == pytest.approx(0.0)
    assert tl.kernel_sum_s() == pytest.approx(10.0)


def test_fast_rank_waits_for_slow_rank_at_collective():
    # rank 0 computes 5 s, rank 1 computes 9 s, then a 2 s all-reduce in one group:
    # both ranks leave the collective at 9 + 2 = 11 s.
    b = GraphBuilder()
    g = b.new_group()
    ends = []
    for r, work in ((0, 5.0), (1, 9.0)):
        _, cp, cm = _streams(b, r)
        k = b.task(cp, "fwd", "gemm", C, duration=work)
        ar = b.task(cm, "all_reduce", "all_reduce", M, duration=2.0, group=g)
        b.edge(k, ar, DepKind.GPU_GPU)
        ends.append(ar)
    tl = simulate(b.build())
    assert tl.end[ends[0]] == pytest.approx(11.0)
    assert tl.end[ends[1]] == pytest.approx(11.0)
    assert tl.per_rank_s == pytest.approx([11.0, 11.0])
    # the fast rank's collective occupies its stream from 5 s: 4 s of waiting shows as communication
    bd0 = tl.breakdown(0)
    assert bd0.exposed_communication == pytest.approx(6.0)
    # kernel-sum baseline (max over streams of summed kernels) sees only the 9 s stream
    assert tl.kernel_sum_s() == pytest.approx(9.0)
    # the critical path runs through the slow rank's compute
    path = tl.critical_path()
    assert tl.graph.rank[path[0]] == 1


def test_intra_rank_sync_on_last_collective():
    # comm stream: all-to-all 8 s; compute stream: k1 3 s, then k2 (2 s) needs the all-to-all's
    # output -> k2 starts at 8, iteration 10 s. The kernel-sum baseline says max(8, 5) = 8.
    b = GraphBuilder()
    _, cp, cm = _streams(b, 0)
    a2a = b.task(cm, "all_to_all", "all_to_all", M, duration=8.0)
    b.task(cp, "k1", "gemm", C, duration=3.0)
    k2 = b.task(cp, "k2", "gemm", C, duration=2.0)
    b.edge(a2a, k2, DepKind.GPU_GPU)
    tl = simulate(b.build())
    assert tl.start[k2] == pytest.approx(8.0)
    assert tl.iteration_s == pytest.approx(10.0)
    assert tl.kernel_sum_s() == pytest.approx(8.0)
    assert tl.kernel_sum_s() < tl.iteration_s
    bd = tl.breakdown(0)
    assert bd.overlap == pytest.approx(3.0)
    assert bd.exposed_communication == pytest.approx(5.0)
    assert bd.exposed_compute == pytest.approx(2.0)


def test_cpu_bound_stretch_leaves_gpu_idle():
    # CPU: three 5 s launch calls (T4), each launching a 1 s kernel that may start half-way
    # through its launch (T4/2): kernels run at 2.5, 7.5, 12.5 -> end 13.5; CPU ends at 15.
    b = GraphBuilder()
    cpu, cp, _ = _streams(b, 0)
    kernels = []
    for i in range(3):
        launch = b.task(cpu, "cudaLaunchKernel", "launch", X, duration=5.0)
        k = b.task(cp, f"k{i}", "relu", Category.MEMORY, duration=1.0)
        b.edge(launch, k, DepKind.CPU_GPU)
        kernels.append(k)
    tl = simulate(b.build())
    assert [tl.start[k] for k in kernels] == pytest.approx([2.5, 7.5, 12.5])
    assert tl.iteration_s == pytest.approx(15.0)
    assert tl.kernel_sum_s() == pytest.approx(3.0)
    bd = tl.breakdown(0)
    assert bd.idle == pytest.approx(12.0)
    # the critical path is the CPU thread
    path = tl.critical_path()
    assert all(tl.graph.category[i] == X for i in path)


def test_gpu_to_cpu_blocking_sync():
    # CPU launches a 10 s kernel (launch 1 s), then cudaStreamSynchronize waits for it, then 1 s op.
    b = GraphBuilder()
    cpu, cp, _ = _streams(b, 0)
    launch = b.task(cpu, "cudaLaunchKernel", "launch", X, duration=1.0)
    k = b.task(cp, "k", "gemm", C, duration=10.0)
    b.edge(launch, k, DepKind.CPU_GPU)
    sync = b.task(cpu, "cudaStreamSynchronize", "sync", Category.SYNC, duration=0.0)
    b.edge(k, sync, DepKind.GPU_CPU)
    after = b.task(cpu, "op", "cpu_op", X, duration=1.0)
    tl = simulate(b.build())
    assert tl.end[k] == pytest.approx(10.5)
    assert tl.start[after] == pytest.approx(10.5)
    assert tl.iteration_s == pytest.approx(11.5)


def test_cycle_is_reported():
    b = GraphBuilder()
    _, cp, cm = _streams(b, 0)
    a = b.task(cp, "a", "gemm", C, duration=1.0)
    c = b.task(cm, "c", "all_reduce", M, duration=1.0)
    b.edge(a, c, DepKind.GPU_GPU)
    b.edge(c, a, DepKind.GPU_GPU)
    with pytest.raises(GraphError, match="can never start"):
        simulate(b.build())


def test_collective_order_mismatch_deadlocks_clearly():
    # rank 0 issues group A then B on one stream, rank 1 issues B then A: a real deadlock.
    b = GraphBuilder()
    ga, gb = b.new_group(), b.new_group()
    _, _, cm0 = _streams(b, 0)
    _, _, cm1 = _streams(b, 1)
    b.task(cm0, "A", "all_reduce", M, duration=1.0, group=ga)
    b.task(cm0, "B", "all_reduce", M, duration=1.0, group=gb)
    b.task(cm1, "B", "all_reduce", M, duration=1.0, group=gb)
    b.task(cm1, "A", "all_reduce", M, duration=1.0, group=ga)
    with pytest.raises(GraphError, match="different orders"):
        simulate(b.build())


def test_bad_durations_rejected():
    b = GraphBuilder()
    _, cp, _ = _streams(b, 0)
    b.task(cp, "a", "gemm", C, duration=1.0)
    g = b.build()
    with pytest.raises(GraphError, match="finite"):
        simulate(g, np.array([-1.0]))
    with pytest.raises(GraphError, match="durations for 1 tasks"):
        simulate(g, np.array([1.0, 2.0]))


def test_chrome_trace_export(tmp_path):
    b = GraphBuilder()
    _, cp, cm = _streams(b, 0)
    b.task(cp, "gemm", "gemm", C, duration=1e-3)
    b.task(cm, "all_reduce", "all_reduce", M, duration=2e-3)
    tl = simulate(b.build())
    out = tl.write_chrome_trace(tmp_path / "t.json")
    events = json.loads(out.read_text())["traceEvents"]
    x = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in x} == {"gemm", "all_reduce"}
    assert max(e["ts"] + e["dur"] for e in x) == pytest.approx(2000.0)


def test_union_length():
    assert union_length(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0])) == pytest.approx(4.0)
    assert union_length(np.array([]), np.array([])) == 0.0
    assert union_length(np.array([0.0, 0.5]), np.array([10.0, 1.0])) == pytest.approx(10.0)
