"""Analytic kernel models: units, monotonicity, the piecewise collective's continuity, routing."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.graph import Category, GraphBuilder, Overhead, ProcKind
from predictor.timing.kernels import (
    AnalyticEmbedding,
    AnalyticGemm,
    ModelTiming,
    PiecewiseCollective,
    PiecewiseSigmoid,
    Roofline,
    TaskView,
)
from predictor.timing.kernels.collective import alpha_beta
from predictor.timing.kernels.embedding import RF_COLUMNS, repeat_fraction_from_rf
from predictor.timing.platforms import get_platform

A100 = get_platform("a100-80gb")
LINE_A100 = A100.model_copy(update={"interconnect": A100.interconnect.model_copy(update={"collective_model": "line"})})


def test_gemm_large_reaches_its_ceiling_small_does_not():
    g = AnalyticGemm()
    big = g.predict_one(A100, m=8192, n=8192, k=8192)
    flops = 2 * 8192**3
    achieved = flops / big
    ceiling = A100.flops_for("fp32") * A100.gemm_efficiency_max
    assert 0.9 * ceiling < achieved <= ceiling
    small = g.predict_one(A100, m=64, n=64, k=64)
    assert 2 * 64**3 / small < 0.05 * ceiling  # tiny GEMMs are far from peak
    assert small >= A100.kernel_floor_s


def test_gemm_time_grows_with_size_and_is_faster_in_bf16():
    g = AnalyticGemm()
    sizes = [128, 256, 512, 1024, 2048, 4096]
    t = [g.predict_one(A100, m=s, n=s, k=s) for s in sizes]
    assert all(a < b for a, b in zip(t, t[1:], strict=False))
    assert g.predict_one(A100, m=4096, n=4096, k=4096, dtype_bytes=2) < t[-1] / 5


def test_roofline_is_bandwidth_bound_for_elementwise():
    r = Roofline()
    t = r.predict(TaskView.single("relu", elements=1e9, dtype_bytes=4), A100)[0]
    expected = 2 * 4e9 / (A100.memory_bandwidth * A100.memory_efficiency) + A100.kernel_floor_s
    assert t == pytest.approx(expected)


def test_embedding_reuse_lowers_forward_time_and_backward_costs_more():
    e = AnalyticEmbedding()
    base = dict(batch=4096, rows=1e6, dim=64, pooling=20, dtype_bytes=4)
    no_reuse = np.zeros(17)
    no_reuse[0] = 1.0  # every row looked up once
    heavy = np.zeros(17)
    heavy[6] = 1.0  # rows looked up ~48 times
    def fwd(rf):
        return e.predict(TaskView.single("embedding_bag_fwd", **base, **dict(zip(RF_COLUMNS, rf, strict=True))), A100)[0]
    assert fwd(heavy) < 0.5 * fwd(no_reuse)
    bwd = e.predict(TaskView.single("embedding_bag_bwd", **base, **dict(zip(RF_COLUMNS, no_reuse, strict=True))), A100)[0]
    assert bwd > fwd(no_reuse)
    assert repeat_fraction_from_rf(no_reuse[None])[0] == pytest.approx(0.0)
    assert repeat_fraction_from_rf(heavy[None])[0] == pytest.approx(1 - 1 / 48)


def _host(page_fault_s: float = 1.5e-6, ceiling: float = 32 * 2**20):
    return A100.model_copy(update={"page_fault_s": page_fault_s, "fresh_mapping_bytes": ceiling})


def test_output_blocks_from_the_ceiling_up_fault_every_page():
    from predictor.timing.kernels.host_memory import allocation_fault_seconds

    # embedding gradients of 16, 32 (exactly the ceiling) and 64 MiB: batch x pooling x dim x 4 bytes
    tv = TaskView.from_columns("embedding_bag_bwd", batch=[1024.0, 4096.0, 4096.0], pooling=[64.0, 32.0, 64.0],
                               dim=[64.0, 64.0, 64.0], dtype_bytes=[4.0, 4.0, 4.0])
    np.testing.assert_allclose(allocation_fault_seconds(tv, _host()), [0.0, 8192 * 1.5e-6, 16384 * 1.5e-6])
    # a GEMM's product (4096 x 2364 fp32: 37 MiB, DLRM's interaction gradient) and a concatenation
    mm = TaskView.from_columns("mm", m=[4096.0, 64.0], n=[2364.0, 64.0], k=[256.0, 64.0], dtype_bytes=[4.0, 4.0])
    np.testing.assert_allclose(allocation_fault_seconds(mm, _host()), [np.ceil(4096 * 2364 * 4 / 4096) * 1.5e-6, 0])
    bmm = TaskView.from_columns("bmm", batch=[8.0], m=[1024.0], n=[1024.0], k=[64.0], dtype_bytes=[4.0])
    assert allocation_fault_seconds(bmm, _host())[0] == pytest.approx(8192 * 1.5e-6)  # 8 x 4 MiB
    cat = TaskView.from_columns("concat", elements=[4096.0 * 2364], dtype_bytes=[4.0])
    assert allocation_fault_seconds(cat, _host())[0] == pytest.approx(np.ceil(4096 * 2364 * 4 / 4096) * 1.5e-6)
    # memory-bound kinds that write a new block of `elements`: an add of 16 M fp32 elements (64 MiB), a
    # log-softmax backward just under the ceiling, a transpose that carries only its shape
    add = TaskView.from_columns("add", elements=[16 * 2**20], dtype_bytes=[4.0])
    assert allocation_fault_seconds(add, _host())[0] == pytest.approx(16384 * 1.5e-6)
    lsm = TaskView.from_columns("log_softmax_bwd", elements=[8 * 2**20 - 1024], dtype_bytes=[4.0])
    assert allocation_fault_seconds(lsm, _host())[0] == 0.0
    tr = TaskView.from_columns("transpose", batch=[16.0], m=[1024.0], n=[1024.0], dtype_bytes=[4.0])
    assert allocation_fault_seconds(tr, _host())[0] == pytest.approx(16384 * 1.5e-6)
    # forward lookups and in-place kinds, hosts without a measured cost, and devices that keep their blocks
    # pay nothing
    fwd = TaskView.from_columns("embedding_bag_fwd", **{k: v for k, v in tv.columns.items()})
    opt = TaskView.from_columns("optimizer", elements=[1e9], dtype_bytes=[4.0])
    assert not allocation_fault_seconds(fwd, _host()).any() and not allocation_fault_seconds(opt, _host()).any()
    assert not allocation_fault_seconds(tv, A100).any() and not allocation_fault_seconds(tv, _host(ceiling=0.0)).any()
    # the analytic embedding model adds exactly that term to the backward
    e = AnalyticEmbedding()
    np.testing.assert_allclose(e.predict(tv, _host()) - e.predict(tv, A100), allocation_fault_seconds(tv, _host()))


def test_piecewise_sigmoid_regions_and_continuity():
    c = PiecewiseSigmoid.continuous(ts=10e-6, bw_max=100e9, m1=1e4, m2=1e7)
    assert c(np.array([4.0, 1e3]))== pytest.approx([10e-6, 10e-6])
    assert c(np.array([1e9]))[0] == pytest.approx(10e-6 + 1e9 / 100e9)
    for edge in (1e4, 1e7):  # no jump at the region boundaries
        assert c(np.array([edge * (1 - 1e-9)]))[0] == pytest.approx(c(np.array([edge * (1 + 1e-9)]))[0], rel=1e-6)
    m = np.logspace(0, 10, 200)
    t = c(m)
    assert np.all(np.diff(t) >= -1e-15)  # latency never falls as messages grow


def test_collective_depends_on_world_and_node_boundary():
    model = PiecewiseCollective()
    # the latency-bandwidth line of the raw link rates (the catalog's A100 uses NCCL's model, tests/test_collective_nccl.py)
    A100 = LINE_A100
    def t(world, m=256e6):
        return model.predict(TaskView.single("all_reduce", msg_bytes=m, world=world), A100)[0]
    assert t(1) == 0.0
    assert t(2) < t(8)  # 2(n-1)/n grows with n
    # 16 ranks span 2 nodes: 8 rings side by side, each through one 25 GB/s NIC -> 200 GB/s bus < 300 NVLink
    assert t(16) > 1.4 * t(8)
    ring = 2 * 7 / 8 * 256e6 / A100.interconnect.intra_node_bandwidth_bytes_per_s
    assert t(8) == pytest.approx(alpha_beta("all_reduce", 8, 1, A100)[0] + ring)
    # a fitted curve replaces the line for single-node groups of its size only
    fitted = PiecewiseSigmoid.continuous(ts=1e-3, bw_max=1e9, m1=1e3, m2=1e6)
    cal = PiecewiseCollective({("all_reduce", 8): fitted})
    assert cal.predict(TaskView.single("all_reduce", msg_bytes=256e6, world=8), A100)[0] == pytest.approx(fitted(256e6))
    two_nodes = cal.predict(TaskView.single("all_reduce", msg_bytes=256e6, world=8, nodes=2), A100)[0]
    assert two_nodes == pytest.approx(sum(alpha_beta("all_reduce", 8, 2, A100)[:1]) + 256e6 / alpha_beta("all_reduce", 8, 2, A100)[1])


def test_model_timing_routes_overheads_and_kinds():
    b = GraphBuilder()
    cpu = b.processor(0, ProcKind.CPU_THREAD, "cpu")
    gpu = b.processor(0, ProcKind.GPU_STREAM, "s")
    b.task(cpu, "T1", "overhead", Category.CPU, overhead=Overhead.T1)
    b.task(cpu, "launch", "launch", Category.CPU, overhead=Overhead.T4)
    b.task(gpu, "mm", "gemm", Category.COMPUTE, params={"m": 1024, "n": 1024, "k": 1024})
    b.task(gpu, "odd", "some_new_kernel", Category.MEMORY, bytes=1e9)
    b.task(gpu, "measured", "gemm", Category.COMPUTE, duration=1.0, params={"m": 8, "n": 8, "k": 8})
    g = b.build()
    d = ModelTiming(A100).durations(g)
    assert d[0] == A100.overheads.t1_s and d[1] == A100.overheads.t4_s
    assert d[2] == pytest.approx(AnalyticGemm().predict_one(A100, m=1024, n=1024, k=1024))
    assert d[3] == pytest.approx(1e9 / (A100.memory_bandwidth * A100.memory_efficiency) + A100.kernel_floor_s)
    assert d[4] < 1e-3  # predicted, measured value ignored by default
    assert ModelTiming(A100, keep_measured=True).durations(g)[4] == 1.0


def test_taskview_rejects_unknown_parameters():
    with pytest.raises(ValueError, match="unknown kernel parameter"):
        TaskView.single("gemm", mm=3)


def test_backward_kinds_fall_back_to_their_forward_model_until_calibrated():
    from predictor.timing.kernels.roofline_fit import FittedRoofline, fit_roofline

    platform = get_platform("a100-80gb")
    moved = np.logspace(3, 8, 20)
    gelu = fit_roofline(moved, 1e-6 + moved / 50e9)
    gelu_bwd = fit_roofline(moved, 1e-6 + moved / 20e9)
    # a pack calibrated before backward kernels: gelu_bwd tasks are timed by gelu's fit, log-softmax's
    # backward by softmax's model (its forward kind is not its name less "_bwd")
    old = ModelTiming(platform, [FittedRoofline({"gelu": gelu, "softmax": gelu})])
    assert old.timed_kind("gelu_bwd") == "gelu" and old.timed_kind("log_softmax_bwd") == "softmax"
    assert old.timed_kind("gelu") == "gelu" and old.timed_kind("relu_bwd") == "relu"
    new = ModelTiming(platform, [FittedRoofline({"gelu": gelu, "gelu_bwd": gelu_bwd})])
    assert new.timed_kind("gelu_bwd") == "gelu_bwd"
    b = GraphBuilder()
    cpu = b.processor(0, ProcKind.CPU_THREAD, "cpu")
    for kind in ("gelu", "gelu_bwd"):
        b.task(cpu, kind, kind, Category.MEMORY, bytes=3e6, params={"elements": 2.5e5, "dtype_bytes": 4})
    g = b.build()
    d_old, d_new = old.durations(g), new.durations(g)
    assert d_old[1] == pytest.approx(gelu(np.array([3e6]))[0])  # same bytes, the forward's fit
    assert d_new[1] == pytest.approx(gelu_bwd(np.array([3e6]))[0]) and d_new[1] > 2 * d_new[0]
