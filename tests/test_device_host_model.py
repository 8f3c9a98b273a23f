"""The device host model: the host work of an eager device step (kernel-less nodes, foreach optimizers, the
step's framework cost STEP), the calibration that prices it, and the pace of an unsynchronised loop."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.graph import Category, DepKind, GraphBuilder, Overhead, ProcKind
from predictor.simulate import simulate
from predictor.sources.synth.dlrm import DLRMSpec, build_dlrm_graph
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.sources.synth.emit import MTA_CHUNK_ELEMENTS, MTA_MAX_BLOCKS, foreach
from predictor.sources.synth.mlp import MLPSpec, build_mlp_graph
from predictor.timing.calibration.step_graph import calibration_step_graph, device_overheads, profiler_ratio
from predictor.timing.kernels import ModelTiming
from predictor.timing.platforms import get_platform
from predictor.timing.platforms.schema import CpuOverheads

H100 = get_platform("h100-sxm")


def _launch_elements(kernels) -> list[float]:
    return [k[3]["elements"] for k in kernels]


def test_foreach_packs_launches_as_multi_tensor_apply():
    # small tensors: one launch until the tensor limit of two lists (64), then the next
    assert _launch_elements(foreach("f", "add", [10.0] * 64, 4)) == [640.0]
    assert _launch_elements(foreach("f", "add", [10.0] * 65, 4)) == [640.0, 10.0]
    assert len(foreach("f", "add", [10.0] * 65, 4, lists=1)) == 1  # one list takes 110
    # a large tensor fills a launch's blocks and continues in the next
    big = float(MTA_MAX_BLOCKS * MTA_CHUNK_ELEMENTS + 5)
    assert _launch_elements(foreach("f", "add", [big, 7.0], 4)) == [MTA_MAX_BLOCKS * MTA_CHUNK_ELEMENTS, 12.0]
    assert sum(_launch_elements(foreach("f", "add", [3e6, 1e5, 17.0], 4))) == pytest.approx(3e6 + 1e5 + 17.0)
    k = foreach("f", "add", [100.0], 2, rw=3.0)[0]
    assert k[1] == "add" and k[2] == Category.MEMORY and k[3]["bytes"] == 600.0


def _names(g) -> list[str]:
    return [g.names[i] for i in g.name]


def test_device_mlp_has_the_eager_host_work_the_cpu_graph_keeps_in_its_ts():
    spec = MLPSpec(input_dim=20, hidden=(64, 32), classes=5, batch_size=16)
    dev = build_mlp_graph(spec, mode="device")
    host = build_mlp_graph(spec, mode="host")
    names = _names(dev)
    assert int((dev.overhead == Overhead.STEP).sum()) == 1
    # three linear layers: AccumulateGrad of weight and bias and TBackward0 each, and zero_grad
    assert sum(n.endswith(".accumulate_grad") for n in names) == 6
    assert sum(n.endswith(".t_backward") for n in names) == 3 and "optimizer.zero_grad" in names
    # SGD is one foreach op (one launch for six small tensors), not one op per tensor
    assert names.count("sgd.foreach_add_[0]") == 1 and not any(n.startswith("sgd.fc") for n in names)
    assert "backward.ones_like" in names
    # the CPU graph is unchanged: no STEP, no nodes, the per-tensor SGD loop
    hn = _names(host)
    assert not (host.overhead == Overhead.STEP).any() and not any(n.endswith(".accumulate_grad") for n in hn)
    assert sum(n.startswith("sgd.fc") and n.endswith(".add_") for n in hn) == 6


def test_a_kernel_less_node_costs_t1_plus_t3_and_step_s_is_charged_once():
    spec = MLPSpec(input_dim=20, hidden=(64,), classes=5, batch_size=16)
    g = build_mlp_graph(spec, mode="device")
    base = dict(t1_s=1e-6, t2_s=10e-6, t3_s=3e-6, t4_s=2e-6, t5_s=4e-6)
    t0 = simulate(g, ModelTiming(H100, overheads=CpuOverheads(**base))).iteration_s
    t1 = simulate(g, ModelTiming(H100, overheads=CpuOverheads(**base, step_s=500e-6))).iteration_s
    assert t1 - t0 == pytest.approx(500e-6, rel=1e-6)  # host-bound: STEP adds its cost once
    dur = ModelTiming(H100, overheads=CpuOverheads(**base)).durations(g)
    node = _names(g).index("fc0.weight.accumulate_grad")
    assert dur[node] == pytest.approx(3e-6) and dur[node - 1] == pytest.approx(1e-6)  # T3 after a T1 gap


def test_device_dlrm_has_per_table_update_ops_and_a_foreach_dense_update():
    tables = EmbeddingTables(rows=np.full(5, 10_000), dim=np.full(5, 16), pooling=np.linspace(1, 20, 5))
    spec = DLRMSpec(tables=tables, batch_size=256, bottom_mlp=(64, 16), top_mlp=(64, 1))
    g = build_dlrm_graph(spec, np.zeros(len(spec.tables), dtype=np.int64), 1, mode="device")
    names = _names(g)
    n = len(spec.tables)
    assert sum(x.startswith("embedding_bag_update[") for x in names) == n
    assert sum(x.startswith("sgd_update[") for x in names) == 1  # the dense MLPs' parameters: one launch
    assert int((g.overhead == Overhead.STEP).sum()) == 1
    host = build_dlrm_graph(spec, np.zeros(n, dtype=np.int64), 1, mode="host")
    assert not any(x.startswith("embedding_bag_update[") for x in _names(host))


def test_calibration_step_graph_and_its_closure():
    g = calibration_step_graph()
    names = _names(g)
    assert sum(x.startswith("embedding_bag_fwd[") for x in names) == 4
    assert sum(x.startswith("sgd.") and x.endswith(".add_") for x in names) == 14  # sparse grads: per-tensor loop
    assert int((g.overhead == Overhead.STEP).sum()) == 1
    measured = dict(t1_s=2e-6, t2_s=30e-6, t3_s=15e-6, t4_s=8e-6, t5_s=16e-6,
                    iteration_s_unprofiled=3.0e-3, iteration_s_profiled=5.0e-3)
    assert profiler_ratio(measured) == pytest.approx(0.6)
    d = device_overheads(measured, ModelTiming(H100))
    assert d["t2_s"] == pytest.approx(18e-6) and d["profiler_ratio"] == pytest.approx(0.6)
    # the closure: with step_s the simulated calibration step is the measured one
    t = ModelTiming(H100, overheads=CpuOverheads(**{k: d[k] for k in ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s", "step_s")}))
    assert d["step_s"] > 0 and simulate(g, t).iteration_s == pytest.approx(3.0e-3, rel=1e-6)
    # a step measured faster than its ops closes at zero, not below
    fast = device_overheads({**measured, "iteration_s_unprofiled": 1e-4}, ModelTiming(H100))
    assert fast["step_s"] == 0.0
    assert profiler_ratio({"t1_s": 1.0}) == 1.0


def test_old_platform_overheads_load_without_step_s():
    o = CpuOverheads(t1_s=1e-6, t2_s=1e-6, t3_s=1e-6, t4_s=1e-6, t5_s=1e-6)
    assert o.step_s == 0.0
    assert ModelTiming(H100, overheads=o).overhead_seconds().shape == (len(Overhead),)


def test_loop_pace_is_the_bottleneck_not_one_steps_latency():
    def graph(host_s: float, kernel_s: float):
        b = GraphBuilder()
        cpu = b.processor(0, ProcKind.CPU_THREAD, "cpu")
        gpu = b.processor(0, ProcKind.GPU_STREAM, "stream")
        b.task(cpu, "ops", "cpu_op", Category.CPU, duration=host_s / 2)
        launch = b.task(cpu, "launch", "launch", Category.CPU, duration=host_s / 2)
        b.edge(launch, b.task(gpu, "k", "gemm", Category.COMPUTE, duration=kernel_s), DepKind.CPU_GPU)
        return b.build()

    from predictor.simulate import MeasuredTiming

    tl = simulate(graph(1.0, 0.8), MeasuredTiming())  # the kernel starts halfway through its launch
    assert tl.iteration_s == pytest.approx(1.55) and tl.loop_pace_s() == pytest.approx(1.0)  # host-bound
    tl = simulate(graph(1.0, 3.0), MeasuredTiming())
    assert tl.iteration_s == pytest.approx(3.75) and tl.loop_pace_s() == pytest.approx(3.0)  # device-bound
    host = simulate(build_mlp_graph(MLPSpec(8, (16,), 2, 4)), ModelTiming(get_platform("cpu-local")))
    assert host.loop_pace_s() == host.iteration_s


def test_calibration_step_graph_follows_the_calibrations_model():
    from predictor.timing.calibration.overheads import SmallDLRM
    from predictor.timing.calibration.step_graph import BATCH, DENSE

    g = calibration_step_graph()
    model = SmallDLRM()
    dense = [p.numel() for n, p in model.named_parameters() if not n.startswith("emb.")]
    updates = [float(e) for n, e in zip(_names(g), g.params["elements"], strict=True)
               if n.startswith("sgd.") and n.endswith(".add_") and not n.startswith("sgd.emb")]
    assert updates == [float(x) for x in dense]  # one add_ per dense tensor, in parameters() order
    assert sum(1 for n, _ in model.named_parameters() if n.startswith("emb.")) == 4
    assert model.bottom[0].in_features == DENSE and BATCH == 256
    dense_g = calibration_step_graph(tables=0)
    upd = sum(float(e) for n, e in zip(_names(dense_g), dense_g.params["elements"], strict=True)
              if n.startswith("sgd.foreach_add_["))
    assert upd == sum(p.numel() for p in SmallDLRM(tables=0).parameters())


def test_a_dense_only_calibration_step_separates_the_sparse_tables_cost():
    full, dense = calibration_step_graph(), calibration_step_graph(tables=0)
    assert int((full.overhead == Overhead.SPARSE_TABLE).sum()) == 4
    assert not (dense.overhead == Overhead.SPARSE_TABLE).any()
    dn = _names(dense)
    assert not any(n.startswith("embedding_bag") for n in dn) and "sgd.foreach_add_[0]" in dn  # foreach SGD
    base = dict(t1_s=2e-6, t2_s=30e-6, t3_s=15e-6, t4_s=8e-6, t5_s=16e-6, iteration_s_profiled=5.0e-3)
    one = device_overheads({**base, "iteration_s_unprofiled": 3.0e-3}, ModelTiming(H100))
    assert one["sparse_table_s"] == 0.0 and "simulated_dense_step_s" not in one
    # the dense step closes step_s; the full step's remainder over the four tables is sparse_table_s
    sim_dense = device_overheads({**base, "iteration_s_unprofiled": 3.0e-3, "iteration_s_unprofiled_dense": 1.0},
                                 ModelTiming(H100))["simulated_dense_step_s"]
    two = device_overheads({**base, "iteration_s_unprofiled": 3.0e-3, "iteration_s_unprofiled_dense": sim_dense + 2e-4},
                           ModelTiming(H100))
    assert two["step_s"] == pytest.approx(2e-4)
    assert two["sparse_table_s"] == pytest.approx((3.0e-3 - two["simulated_step_s"] - 2e-4) / 4)
    t = ModelTiming(H100, overheads=CpuOverheads(**{k: two[k] for k in ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s",
                                                                          "step_s", "sparse_table_s")}))
    assert simulate(full, t).iteration_s == pytest.approx(3.0e-3, rel=1e-6)
    assert simulate(dense, t).iteration_s == pytest.approx(sim_dense + 2e-4, rel=1e-6)


def test_device_dlrm_charges_each_local_table_once():
    tables = EmbeddingTables(rows=np.full(4, 10_000), dim=np.full(4, 16), pooling=np.linspace(1, 20, 4))
    spec = DLRMSpec(tables=tables, batch_size=256, bottom_mlp=(64, 16), top_mlp=(64, 1))
    g = build_dlrm_graph(spec, np.array([0, 1, 1, 1]), 2, mode="device")
    per_rank = np.bincount(g.rank[g.overhead == Overhead.SPARSE_TABLE], minlength=2)
    assert per_rank.tolist() == [1, 3]


def test_loop_pace_of_a_multi_rank_step_is_its_latency():
    tables = EmbeddingTables(rows=np.full(4, 10_000), dim=np.full(4, 16), pooling=np.linspace(1, 20, 4))
    spec = DLRMSpec(tables=tables, batch_size=256, bottom_mlp=(64, 16), top_mlp=(64, 1))
    tl = simulate(build_dlrm_graph(spec, np.array([0, 1, 0, 1]), 2, mode="device"), ModelTiming(H100))
    assert tl.loop_pace_s() == tl.iteration_s
