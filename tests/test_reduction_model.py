"""The column-sum (bias-gradient) kernel: synthesisers emit it with its shape, the reduction family's MLP
learns a shape-dependent cost the bytes alone do not give, and a tiny calibration of the family runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from _trace_fixtures import capture_training

from predictor.sources.synth.emit import column_sum
from predictor.timing.calibrate import CalibrationOptions, calibrate, refit
from predictor.timing.calibrate.fit import fit_models
from predictor.timing.calibration.base import BenchContext
from predictor.timing.calibration.reduction import ReductionBenchmark
from predictor.timing.calibration.timing import Timer
from predictor.timing.kernels import TaskView
from predictor.timing.kernels.assets import load_asset_pack
from predictor.timing.platforms import get_platform

CPU = get_platform("cpu-local")


def test_column_sum_carries_its_shape():
    name, kind, _cat, p = column_sum("fc1.bias_grad", 64, 256, 4)
    assert (name, kind) == ("fc1.bias_grad", "sum")
    assert (p["m"], p["n"], p["elements"], p["bytes"]) == (64.0, 256.0, 64.0 * 256, (64.0 * 256 + 256) * 4)


def _bias_grads(g) -> pd.DataFrame:
    df = g.tasks_frame()
    df = df[df.name.str.endswith("bias_grad")]
    return df.assign(m=g.param("m")[df.index], n=g.param("n")[df.index])


def test_synthesisers_emit_bias_gradients_as_column_sums():
    from predictor.sources.synth.mlp import MLPSpec, build_mlp_graph
    from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec, build_transformer_graph

    mlp = _bias_grads(build_mlp_graph(MLPSpec(input_dim=32, hidden=(64,), classes=10, batch_size=16)))
    assert set(mlp.kind) == {"sum"} and sorted(mlp.n) == [10.0, 64.0] and set(mlp.m) == {16.0}
    spec = TransformerSpec(layers=2, hidden=64, heads=4, seq=32, vocab=100, attention="unfused", program="eager")
    g = build_transformer_graph(spec, ParallelPlan(micro_batch=2, global_batch=2), detail="kernel", mode="host")
    gpt = _bias_grads(g)
    # four linear layers per block (qkv, attention projection, fc1, fc2), 2 sequences of 32 tokens
    assert len(gpt) == 8 and set(gpt.kind) == {"sum"} and set(gpt.m) == {64.0}
    assert sorted(set(gpt.n)) == [64.0, 192.0, 256.0]


def _synthetic_sums(n: int, rng: np.random.Generator) -> pd.DataFrame:
    m = np.round(np.exp(rng.uniform(0, np.log(16384), n)))
    cols = np.round(np.exp(rng.uniform(np.log(8), np.log(4096), n)))
    elements = m * cols
    # known costs: 3 us per call, 2 ns per row (the strided walk), up to 15 GB/s on the input; narrow rows
    # leave vector lanes idle: the bandwidth is n / (n + 16) of that
    bw = 15e9 * cols / (cols + 16)
    seconds = 3e-6 + 2e-9 * m + 4.0 * elements / bw
    return pd.DataFrame({"kernel": "sum", "kind": "sum", "m": m, "n": cols, "elements": elements,
                         "dtype_bytes": 4.0, "bytes": 4.0 * elements, "seconds": seconds})


def _spec():
    ctx = BenchContext(device=torch.device("cpu"), level="tiny", rng=np.random.default_rng(0),
                       timer=Timer(torch.device("cpu")))
    return [("reduction", s) for s in ReductionBenchmark().specs(ctx)]


def test_sum_model_learns_the_shape_not_just_the_bytes():
    data = {"reduction": _synthetic_sums(400, np.random.default_rng(1))}
    models, table = fit_models(data, _spec(), "quick", 0, CPU, log=lambda s: None)
    row = table[0]
    assert row["kernel"] == "sum" and row["model"].startswith("MLP")
    assert row["gmae_pct"] < 8.0
    model = models["sum"]
    # same bytes: 4096 rows x 8 columns against 256 x 128
    narrow = TaskView.from_columns("sum", m=[4096.0], n=[8.0], elements=[32768.0], dtype_bytes=[4.0])
    wide = TaskView.from_columns("sum", m=[256.0], n=[128.0], elements=[32768.0], dtype_bytes=[4.0])
    t_narrow, t_wide = model.predict(narrow, CPU)[0], model.predict(wide, CPU)[0]
    true_narrow = 3e-6 + 2e-9 * 4096 + 4 * 32768 / (15e9 * 8 / 24)
    true_wide = 3e-6 + 2e-9 * 256 + 4 * 32768 / (15e9 * 128 / 144)
    assert t_narrow == pytest.approx(true_narrow, rel=0.2) and t_wide == pytest.approx(true_wide, rel=0.2)
    assert t_narrow > 2.0 * t_wide


def test_tiny_calibration_of_the_family_prices_sum_tasks(tmp_path):
    out = tmp_path / "p"
    calibrate(CalibrationOptions("cpu", out=out, tiny=True, threads=1, families=["reduction"]), register=False, log=lambda s: None)
    pack = load_asset_pack(out)
    assert pack.manifest["families"] == ["reduction"]
    assert (out / "data" / "reduction.csv").exists()
    assert "| sum |" in (out / "errors.md").read_text()
    model = next(m for m in pack.models if "sum" in m.kinds)
    tasks = TaskView.from_columns("sum", m=[128.0, 2048.0], n=[64.0, 512.0], elements=[8192.0, 2048 * 512.0],
                                  dtype_bytes=[4.0, 4.0], bytes=[32768.0, 4.0 * 2048 * 512])
    t = model.predict(tasks, pack.platform)
    assert np.all(np.isfinite(t)) and np.all(t > 0) and t[1] > t[0]
    # merged into a pack that never measured the family, it joins that pack's family list
    base = tmp_path / "base"
    calibrate(CalibrationOptions("cpu", out=base, tiny=True, threads=1, families=["layer_norm"]), register=False, log=lambda s: None)
    merged = tmp_path / "merged"
    refit(base, merged, data_from={"reduction": str(out)}, register=False, log=lambda s: None)
    m = load_asset_pack(merged).manifest
    assert m["families"] == ["layer_norm", "reduction"] and m["refit"]["data_from"]["reduction"]["pack"] == str(out)


def test_trace_bias_gradients_read_as_column_sums():
    from predictor.sources.traces.host_kernels import kernel_params, reduction_kind

    dims, types = [[1024, 256], [], [], []], ["float", "ScalarList", "Scalar", ""]
    assert reduction_kind("aten::sum", dims, ["", "[0]", "True", ""]) == "sum"
    p = kernel_params("sum", "aten::sum", dims, types, ["", "[0]", "True", ""])
    assert (p["m"], p["n"], p["elements"], p["bytes"]) == (1024.0, 256.0, 1024.0 * 256, (1024.0 * 256 + 256) * 4)
    assert kernel_params("sum", "aten::sum", [[8, 128, 64]], ["float"], ["", "[0, 1]"])["m"] == 1024.0
    # a full or trailing reduction, another reduce op or an unrecorded dim list stay generic reductions
    for name, d, c in (("aten::sum", [[1024, 256]], ["", "[1]"]), ("aten::sum", [[1024, 256]], ["", "[0, 1]"]),
                       ("aten::mean", [[1024, 256]], ["", "[0]"]), ("aten::sum", [[1024, 256]], None),
                       ("aten::sum", [[1024]], ["", "[0]"])):
        assert reduction_kind(name, d, c) == "reduce"


def test_a_captured_step_prices_its_bias_gradients_with_the_sum_model(tmp_path):
    from predictor.sources.traces.load import load_traces
    from predictor.whatif.annotate import annotate

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    capture_training(tmp_path / "run", model, lambda m: torch.nn.functional.cross_entropy(
        m(torch.randn(16, 32)), torch.randint(0, 4, (16,))), steps=4)
    g = annotate(load_traces(tmp_path / "run")).steps[0]
    df = g.tasks_frame()
    sums = df[df.kind == "sum"]
    # the step's two bias gradients, over its batch of 16
    assert len(sums) == 2 and set(g.param("m")[sums.index]) == {16.0}
    assert sorted(set(g.param("n")[sums.index])) == [4.0, 64.0]
