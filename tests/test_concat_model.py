"""Concatenations carry their inputs' layout (``batch`` = outer slices, ``parts`` = inputs) from traces
and synthesised graphs to the calibrated concat model, which learns the per-input and per-slice costs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictor.sources.synth.dlrm import DLRMSpec, build_dlrm_graph
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.sources.traces.host_kernels import kernel_params
from predictor.timing.calibrate.fit import fit_models
from predictor.timing.calibration.base import BenchContext
from predictor.timing.calibration.data_movement import DataMovementBenchmark
from predictor.timing.calibration.timing import Timer
from predictor.timing.kernels import TaskView
from predictor.timing.platforms import get_platform

ROOT = Path(__file__).resolve().parents[1]
CPU = get_platform("cpu-local")


def test_trace_concat_reads_inputs_and_outer_slices():
    # DLRM's interaction: torch.cat([dense (8 x 3), emb (8 x 5), emb (8 x 2)], dim=1)
    p = kernel_params("concat", "aten::cat", [[[8, 3], [8, 5], [8, 2]], []], ["TensorList", "Int"])
    assert (p["elements"], p["parts"], p["batch"], p["bytes"]) == (80.0, 3.0, 8.0, 640.0)
    # along dim 0 the inputs differ in their first dim: one contiguous slice each
    p = kernel_params("concat", "aten::cat", [[[3, 6], [5, 6]], []], ["TensorList", "Int"])
    assert (p["parts"], p["batch"]) == (2.0, 1.0)
    # equal shapes: the dim recorded by Kineto decides; without it the last dim is assumed
    equal = [[[4, 6], [4, 6]], []]
    assert kernel_params("concat", "aten::cat", equal, ["TensorList", "Int"], ["", "0"])["batch"] == 1.0
    assert kernel_params("concat", "aten::cat", equal, ["TensorList", "Int"], ["", "-1"])["batch"] == 4.0
    assert kernel_params("concat", "aten::cat", equal, ["TensorList", "Int"])["batch"] == 4.0


def _spec(n_tables: int = 5) -> DLRMSpec:
    t = EmbeddingTables(rows=np.full(n_tables, 1000), dim=np.full(n_tables, 16), pooling=np.full(n_tables, 4.0))
    return DLRMSpec(tables=t, batch_size=256, bottom_mlp=(8, 16), top_mlp=(32, 1))


def _concats(g) -> pd.DataFrame:
    df = g.tasks_frame()
    df = df[df.kind == "concat"]
    return df.assign(parts=g.param("parts")[df.index], batch=g.param("batch")[df.index])


def test_dlrm_host_concats_carry_their_inputs():
    one = _concats(build_dlrm_graph(_spec(), np.zeros(5, dtype=int), 1, mode="host"))
    inter = one[one.name == "interaction.cat"]
    assert list(inter.parts) == [6.0] and list(inter.batch) == [256.0]  # dense + one block per table
    two = _concats(build_dlrm_graph(_spec(), np.array([0, 1, 0, 1, 0]), 2, mode="host"))
    inter = two[two.name == "interaction.cat"]
    # dense + one block per rank holding tables (the all-to-all's output split by source)
    assert set(inter.parts) == {3.0} and set(inter.batch) == {128.0}
    pooled = two[two.name == "cat_pooled"].sort_values("rank")
    assert list(pooled.parts) == [3.0, 2.0] and set(pooled.batch) == {256.0}
    assert set(two[two.name == "pack_embedding_grads"].parts) == {2.0}


def _synthetic_concat(n: int, rng: np.random.Generator) -> pd.DataFrame:
    parts = rng.integers(2, 33, n).astype(float)
    batch = np.round(np.exp(rng.uniform(0, np.log(4096), n)))
    width = np.round(np.exp(rng.uniform(np.log(2), np.log(300), n)))
    elements = batch * parts * width
    # known costs: 2 us per call, 0.25 us per input, 1 ns per chunk, 20 GB/s
    seconds = 2e-6 + 0.25e-6 * parts + 1e-9 * batch * parts + 8.0 * elements / 20e9
    return pd.DataFrame({"kernel": "concat", "kind": "concat", "elements": elements, "batch": batch, "parts": parts,
                         "dtype_bytes": 4.0, "bytes": 8.0 * elements, "seconds": seconds})


def _concat_spec():
    ctx = BenchContext(device=__import__("torch").device("cpu"), level="tiny", rng=np.random.default_rng(0),
                       timer=Timer(__import__("torch").device("cpu")))
    return [("data_movement", s) for s in DataMovementBenchmark().specs(ctx) if s.kernel == "concat"]


def test_concat_model_learns_the_per_input_cost():
    data = {"data_movement": _synthetic_concat(300, np.random.default_rng(1))}
    models, table = fit_models(data, _concat_spec(), "quick", 0, CPU, log=lambda s: None)
    row = table[0]
    assert row["kernel"] == "concat" and row["model"].startswith("MLP")
    assert row["gmae_pct"] < 5.0
    model = models["concat"]
    # same bytes, 4 vs 32 inputs of 64 rows: the inputs' fixed costs (~7 us) show in the prediction
    few = TaskView.from_columns("concat", elements=[64 * 4 * 64.0], batch=[64.0], parts=[4.0], dtype_bytes=[4.0])
    many = TaskView.from_columns("concat", elements=[64 * 4 * 64.0], batch=[64.0], parts=[32.0], dtype_bytes=[4.0])
    t_few, t_many = model.predict(few, CPU)[0], model.predict(many, CPU)[0]
    true_few, true_many = (2e-6 + 0.25e-6 * p + 1e-9 * 64 * p + 8 * 16384 / 20e9 for p in (4, 32))
    assert t_few == pytest.approx(true_few, rel=0.15) and t_many == pytest.approx(true_many, rel=0.15)
    # a concatenation without layout reads as two inputs of one slice
    bare = TaskView.from_columns("concat", elements=[16384.0], dtype_bytes=[4.0])
    two = TaskView.from_columns("concat", elements=[16384.0], batch=[1.0], parts=[2.0], dtype_bytes=[4.0])
    assert model.predict(bare, CPU)[0] == pytest.approx(model.predict(two, CPU)[0])


def test_fit_skips_an_mlp_whose_data_lack_a_feature():
    data = {"data_movement": _synthetic_concat(40, np.random.default_rng(2)).drop(columns="parts")}
    lines: list[str] = []
    models, table = fit_models(data, _concat_spec(), "tiny", 0, CPU, log=lines.append)
    assert not table and "concat" not in models
    assert any("lack column(s) parts" in s for s in lines)


def test_committed_pack_times_concatenations_by_their_inputs():
    from predictor.timing.kernels import timing_for

    timing = timing_for(str(ROOT / "assets" / "cpu-local"))  # the AVX-512 VM's pack, where parts were validated
    model = timing.model_for("concat")
    assert type(model).__name__ == "MLPKernelModel"
    few = TaskView.from_columns("concat", elements=[4096 * 512.0], batch=[4096.0], parts=[2.0], dtype_bytes=[4.0])
    many = TaskView.from_columns("concat", elements=[4096 * 512.0], batch=[4096.0], parts=[30.0], dtype_bytes=[4.0])
    assert model.predict(many, timing.platform)[0] > 1.1 * model.predict(few, timing.platform)[0]
