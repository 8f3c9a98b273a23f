"""What-if transforms on hand-built graphs whose answers can be checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.graph import Category, DepKind, GraphBuilder, ProcKind
from predictor.graph.edit import AUX_KEY, topological_ok
from predictor.simulate import simulate
from predictor.whatif.apply import (
    WhatIfError,
    WhatIfTiming,
    detect_layers,
    move_platform,
    parse_sets,
    restage_pp,
    scale_batch,
    scale_dp,
    set_layers,
    speed_up,
)

FWD, BWD, OPT = 1, 2, 3
US = 1e-6


def _graph(ops, *, extra_thread_edge: bool = False):
    """One CPU thread: start marker, ``ops`` (dicts), end marker; aux columns as annotate writes them."""
    b = GraphBuilder()
    cpu = b.processor(0, ProcKind.CPU_THREAD, "cpu tid 1")
    aux: dict[str, list[float]] = {}

    def put(**kv):
        for k in set(aux) | set(kv):
            aux.setdefault(k, [np.nan] * (b.n_tasks - 1)).append(kv.get(k, np.nan))

    b.task(cpu, "ProfilerStep#1", "marker", Category.CPU, duration=0.0)
    put(op=-1, phase=0, sig=-1)
    for i, o in enumerate(ops):
        b.task(cpu, o["name"], o.get("kind", "cpu_op"), o.get("cat", Category.CPU), duration=o.get("dur", 10 * US),
               params=o.get("params"), flops=o.get("flops", np.nan))
        put(op=float(i), phase=float(o["phase"]), sig=float(o["sig"]), measured_raw=o.get("dur", 10 * US),
            **{f"x_{k}": v for k, v in o.get("x", {}).items()}, **o.get("aux", {}))
    end = b.task(cpu, "ProfilerStep#1", "marker", Category.CPU, duration=0.0)
    put(op=-1, phase=0, sig=-1)
    if extra_thread_edge:  # a helper thread that waits for the first op and feeds the end marker
        other = b.processor(0, ProcKind.CPU_THREAD, "cpu tid 2")
        h = b.task(other, "helper", "cpu_op", Category.CPU, duration=5 * US)
        put(op=-1, phase=0, sig=-1)
        b.edge(1, h, DepKind.CPU_CPU)
        b.edge(h, end, DepKind.CPU_CPU)
    g = b.build()
    g.meta[AUX_KEY] = {k: np.asarray(v, dtype=np.float64) for k, v in aux.items()}
    return g


def _layered(n_layers: int = 3):
    """prefix op, n x (gemm, relu) forward; loss; n x (grad-input gemm, acc-grad) backward; n optimizer adds."""
    ops = [dict(name="embed", kind="elementwise", cat=Category.MEMORY, phase=FWD, sig=0,
                params={"elements": 512.0}, x={"elements": 1.0, "work": 1.0}, aux={"act_bytes": 2048.0, "x_act": 1.0})]
    for _ in range(n_layers):
        ops.append(dict(name="aten::addmm", kind="addmm", cat=Category.COMPUTE, phase=FWD, sig=1, dur=40 * US,
                        params={"m": 32.0, "n": 64.0, "k": 64.0}, x={"m": 1.0, "work": 1.0},
                        aux={"act_bytes": 8192.0, "x_act": 1.0}))
        ops.append(dict(name="aten::relu", kind="relu", cat=Category.MEMORY, phase=FWD, sig=2,
                        params={"elements": 2048.0}, x={"elements": 1.0, "work": 1.0}))
    ops.append(dict(name="loss", kind="loss", cat=Category.MEMORY, phase=FWD, sig=3, params={"elements": 32.0},
                    x={"elements": 1.0, "work": 1.0}))
    for _ in range(n_layers):
        ops.append(dict(name="aten::mm", kind="mm", cat=Category.COMPUTE, phase=BWD, sig=4, dur=30 * US,
                        params={"m": 64.0, "n": 64.0, "k": 32.0}, x={"k": 1.0, "work": 1.0}))
        ops.append(dict(name="AccumulateGrad", phase=BWD, sig=5, aux={"grad_bytes": 64 * 64 * 4.0}))
    ops.append(dict(name="embed backward", kind="elementwise", cat=Category.MEMORY, phase=BWD, sig=6,
                    params={"elements": 512.0}, x={"elements": 1.0, "work": 1.0}))
    for _ in range(n_layers):
        ops.append(dict(name="aten::add_", kind="add", cat=Category.MEMORY, phase=OPT, sig=7,
                        params={"elements": 4096.0}))
    return _graph(ops)


def _col(g, name):
    from predictor.graph.edit import AUX_DEFAULTS

    return g.meta[AUX_KEY].get(name, np.full(g.n_tasks, AUX_DEFAULTS.get(name, np.nan)))


# ----------------------------------------------------------------------------- batch
def test_batch_scaling_rescales_only_batch_dimensions():
    g = _layered()
    before = {k: v.copy() for k, v in g.params.items()}
    g2 = scale_batch(g, 4.0)
    gemm = g2.kind_mask("addmm")
    assert np.all(g2.params["m"][gemm] == 128.0)  # the batch rows
    assert np.all(g2.params["n"][gemm] == 64.0) and np.all(g2.params["k"][gemm] == 64.0)
    wgrad = g2.kind_mask("mm")  # weight gradient: the batch is the reduction dimension
    assert np.all(g2.params["k"][wgrad] == 128.0) and np.all(g2.params["m"][wgrad] == 64.0)
    relu = g2.kind_mask("relu")
    assert np.all(g2.params["elements"][relu] == 8192.0)
    opt = g2.kind_mask("add")  # optimizer updates do not depend on the batch
    assert np.all(g2.params["elements"][opt] == 4096.0)
    changed = _col(g2, "changed") > 0
    assert changed[gemm].all() and not changed[opt].any()
    assert np.allclose(_col(g2, "ratio")[relu], 4.0)
    assert np.allclose(_col(g2, "act_bytes")[gemm], 4 * 8192.0)
    # the input graph is untouched
    for k, v in before.items():
        assert np.array_equal(g.params[k], v, equal_nan=True)
    assert not (_col(g, "changed") > 0).any()
    with pytest.raises(WhatIfError):
        scale_batch(g, 0.0)


# ----------------------------------------------------------------------------- layers
def test_layer_detection_finds_the_repeated_blocks():
    info = detect_layers(_layered(3))
    assert info.count == 3 and info.period == 2
    assert len(info.blocks[BWD]) == 3 and len(info.blocks[OPT]) == 3
    with pytest.raises(WhatIfError, match="no repeated layer blocks"):
        detect_layers(_layered(1))


def test_layer_duplication_doubles_layer_tasks_and_stays_acyclic():
    g = _layered(3)
    g2 = set_layers(g, 6)
    names = np.asarray(g2.names, dtype=object)[g2.name]
    assert (names == "aten::addmm").sum() == 6 and (names == "aten::relu").sum() == 6
    assert (names == "aten::mm").sum() == 6 and (names == "AccumulateGrad").sum() == 6
    assert (names == "aten::add_").sum() == 6
    assert (names == "embed").sum() == 1 and (names == "loss").sum() == 1  # prefix and suffix once
    assert topological_ok(g2)
    assert g2.meta["whatif"]["layers_from"] == 3 and g2.meta["whatif"]["layers_to"] == 6
    # the copies sit right after the last block: forward order is still prefix, layers, loss
    order = [n for n in names if n in ("embed", "aten::addmm", "loss")]
    assert order[0] == "embed" and order[-1] == "loss"
    t1 = simulate(g).iteration_s
    t2 = simulate(g2).iteration_s
    assert t2 > t1
    # and back down: two layers
    g3 = set_layers(g, 2)
    assert (np.asarray(g3.names, dtype=object)[g3.name] == "aten::addmm").sum() == 2
    assert topological_ok(g3) and simulate(g3).iteration_s < t1


def test_layer_duplication_replicates_edges_of_other_threads():
    g = _graph([dict(name="x", phase=FWD, sig=9)] + [
        dict(name="blk", phase=FWD, sig=1), dict(name="blk2", phase=FWD, sig=2)] * 2 + [
        dict(name="b", phase=BWD, sig=3), dict(name="b2", phase=BWD, sig=4)] * 2, extra_thread_edge=True)
    g2 = set_layers(g, 4)
    assert topological_ok(g2)
    assert (np.asarray(g2.names, dtype=object)[g2.name] == "blk").sum() == 4
    simulate(g2)


# ----------------------------------------------------------------------------- data parallel
def test_dp_scaling_adds_grouped_all_reduce_per_bucket():
    g = _layered(3)  # 3 gradients of 16 KiB
    g2 = scale_dp(g, 2, bucket_bytes=20 * 1024, first_bucket_bytes=10 * 1024)
    assert sorted(np.unique(g2.rank).tolist()) == [0, 1]
    ar = np.flatnonzero(g2.kind_mask("all_reduce"))
    # buckets: [16 KiB] (first cap 10 KiB), [16 + 16 KiB] (cap 20 KiB) -> 2 per replica
    assert ar.size == 4
    groups = g2.group[ar]
    for grp in np.unique(groups):
        members = ar[groups == grp]
        assert members.size == 2 and set(g2.rank[members].tolist()) == {0, 1}
    assert np.all(g2.params["world"][ar] == 2.0)
    assert sorted(g2.params["msg_bytes"][ar].tolist()) == [16384.0, 16384.0, 32768.0, 32768.0]
    # the reducer's copies in and out of the buckets, on each replica
    names = np.asarray(g2.names, dtype=object)[g2.name]
    assert (names == "torch::distributed::reducer::mul_out").sum() == 6
    assert (names == "torch.distributed.ddp.reducer::copy_bucket_to_grad").sum() == 6
    assert topological_ok(g2)
    from predictor.timing.kernels import timing_for

    wt = WhatIfTiming(timing_for("cpu-local"))
    tl = simulate(g2, wt)
    assert tl.iteration_s > simulate(g).iteration_s
    assert wt.counts["new_model"] >= 4
    # a graph that already has gradient all-reduces keeps its ranks; the world size changes
    g3 = scale_dp(g2, 8)
    assert g3.n_tasks == g2.n_tasks and np.all(g3.params["world"][g3.kind_mask("all_reduce")] == 8.0)


def test_dp_needs_gradients():
    g = _graph([dict(name="a", phase=FWD, sig=1)])
    with pytest.raises(WhatIfError, match="no gradients"):
        scale_dp(g, 2)


# ----------------------------------------------------------------------------- pipeline
def test_pp_restaging_runs_1f1b_with_paired_send_recv():
    g = _layered(4)
    g2 = restage_pp(g, 2, 4)
    assert sorted(np.unique(g2.rank).tolist()) == [0, 1]
    assert topological_ok(g2)
    names = np.asarray(g2.names, dtype=object)[g2.name]
    # 4 micro-batches x 2 layers per stage x (addmm, relu) on each stage
    for r in (0, 1):
        on = g2.rank == r
        assert ((names == "aten::addmm") & on).sum() == 8
    comm = np.flatnonzero(g2.kind_mask("send_recv"))
    assert comm.size == 2 * 2 * 4  # fwd + bwd, send + recv, 4 micro-batches
    for grp in np.unique(g2.group[comm]):
        m = comm[g2.group[comm] == grp]
        assert m.size == 2 and set(g2.rank[m].tolist()) == {0, 1}
    # micro-batch GEMMs run a quarter of the batch
    assert np.all(g2.params["m"][g2.kind_mask("addmm")] == 8.0)
    assert g2.meta["whatif"]["pp_layers_per_stage"] == [2, 2]
    simulate(g2)
    with pytest.raises(WhatIfError, match="at least 8"):
        restage_pp(g, 8)


# ----------------------------------------------------------------------------- platform, speed-up, timing
def test_move_host_graph_to_a_device_launches_kernels_on_a_stream():
    g = _layered(2)
    g2 = move_platform(g, True)
    kernels = np.isin(g.category, (Category.COMPUTE, Category.MEMORY))
    assert g2.is_gpu().sum() == kernels.sum()
    assert (g2.edge_kind == DepKind.CPU_GPU).sum() == kernels.sum()
    assert (g2.edge_kind == DepKind.GPU_CPU).sum() == 1  # the step end waits for the stream
    assert topological_ok(g2)
    with pytest.raises(WhatIfError):
        move_platform(g2, False)


def test_speed_up_and_timing_paths():
    from predictor.timing.kernels import timing_for

    g = scale_batch(_layered(2), 2.0)
    wt = WhatIfTiming(timing_for("cpu-local"))
    d = wt.durations(g)
    unchanged = _col(g, "changed") == 0
    assert np.allclose(d[unchanged], g.duration[unchanged])
    loss = g.kind_mask("loss")  # the roofline claims "loss": a model time
    assert wt.counts["model"] >= 4
    g2 = speed_up(g, "addmm", 4.0)
    d2 = WhatIfTiming(timing_for("cpu-local")).durations(g2)
    mm = g.kind_mask("addmm")
    assert np.allclose(d2[mm], d[mm] / 4.0) and np.allclose(d2[loss], d[loss])
    with pytest.raises(WhatIfError, match="no task of kind"):
        speed_up(g, "conv2d", 2.0)


# ----------------------------------------------------------------------------- the --set spec
@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["colour=blue"], "--set colour: unknown key"),
        (["batch_size"], "expected key=value"),
        (["batch_size=abc"], "--set batch_size: expected a number or a factor like x2"),
        (["batch_size=-4"], "--set batch_size: must be positive"),
        (["dp=0"], "--set dp: Input should be greater than or equal to 1"),
        (["retime=sometimes"], "--set retime:"),
        (["speedup.mm=fast"], "--set speedup.mm: expected a number"),
        (["speedup.mm=-1"], "must be a positive number"),
    ],
)
def test_bad_sets_are_one_line_errors(items, expected):
    with pytest.raises(WhatIfError) as exc:
        parse_sets(items)
    assert expected in str(exc.value) and "\n" not in str(exc.value)


def test_good_sets_parse():
    spec = parse_sets(["batch_size=x2", "layers=12", "dp=4", "pp=2", "speedup.mm=1.5", "retime=anchored"])
    assert spec.target("batch_size", 16) == 32 and spec.target("layers", 6) == 12
    assert spec.speedup == {"mm": 1.5} and spec.retime == "anchored"


@pytest.mark.parametrize("item", ["colour=blue", "dp=two", "batch_size=0x"])
def test_cli_bad_set_exits_2_with_one_line(tmp_path, item):
    from typer.testing import CliRunner

    from tuner.cli import app

    r = CliRunner().invoke(app, ["predict", str(tmp_path), "--set", item])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_kernels_of_one_op_share_its_model_time_on_another_platform():
    from predictor.whatif.timing import share_per_op

    t = np.array([200e-6, 200e-6, 100e-6, 50e-6])  # the model's time of each kernel's op
    measured = np.array([95e-6, 5e-6, 80e-6, 40e-6])
    ops = np.array([7.0, 7.0, 8.0, np.nan])  # a split-K GEMM (two kernels), a lone kernel, no recorded op
    out = share_per_op(t, measured, ops, np.zeros(4, dtype=bool))
    assert out == pytest.approx([190e-6, 10e-6, 100e-6, 50e-6])
    # new tasks (no measurement) keep the model's time
    out = share_per_op(t, measured, ops, np.array([False, True, False, False]))
    assert out == pytest.approx(t)


def test_a_moved_gpu_trace_prices_a_split_k_gemm_once():
    """The H200 MLP trace's weight-gradient GEMMs run split-K (a GEMM and cuBLASLt's reduce kernel): moved to
    another GPU, the op's two kernels cost the model's time of one mm, not two."""
    from pathlib import Path

    from predictor.whatif.apply import parse_sets, predict_trace

    trace = Path(__file__).resolve().parents[1] / "benchmarks" / "traces" / "h200-2" / "traces-mlp-b4096.tar.gz"
    res = predict_trace(trace, parse_sets(["captured_on=h200-cal"]), "h100")
    tl = res.timeline
    g = tl.graph
    d = tl.end - tl.start
    mm = g.is_gpu() & (g.kind == g.kinds.index("mm"))
    reduce = mm & np.array(["splitKreduce" in g.names[j] for j in g.name])
    assert reduce.sum() == 3
    assert (d[reduce] < 20e-6).all()  # each ~5 % of its op, where it was priced as the whole mm before
    assert g.meta[AUX_KEY]["launch_op"][mm].size == mm.sum()
