"""Lin et al. 2022 overhead types measured from traces; shared table round trip and reuse."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from _trace_fixtures import TRACES, kernel, needs_traces, op, runtime, write_trace

from predictor.graph import Overhead
from predictor.sources.traces.build import build_graph
from predictor.sources.traces.load import load_traces
from predictor.sources.traces.overheads import (
    LIN2022_CPU_COST_S,
    LIN2022_RUNTIME_COST_S,
    OverheadTable,
    extract_overheads,
)
from predictor.timing.platforms.schema import CpuOverheads


def _handmade(tmp_path):
    # two top-level ops 10 µs apart; the first launches twice: T2 = 5, T5 = 7, T3 = 8 (µs, before
    # profiler costs); launches take 3 µs
    ev = [
        op("aten::linear", 1, 0, 26),
        runtime("cudaLaunchKernel", 1, 5, 3, corr=1),
        runtime("cudaLaunchKernel", 1, 15, 3, corr=2),
        kernel("k1", 7, 9, 4, corr=1),
        kernel("k2", 7, 19, 4, corr=2),
        op("aten::relu", 1, 36, 4),
    ]
    return write_trace(tmp_path / "h.json", ev)


def test_types_by_hand_without_profiler_removal(tmp_path):
    tab = extract_overheads(load_traces(_handmade(tmp_path)), remove_profiler=False)
    us = 1e-6
    assert tab.by_op["aten::linear"]["T2"].mean_s == pytest.approx(5 * us)
    assert tab.by_op["aten::linear"]["T5"].mean_s == pytest.approx(7 * us)
    assert tab.by_op["aten::linear"]["T3"].mean_s == pytest.approx(8 * us)
    assert tab.by_op["aten::relu"]["T1"].mean_s == pytest.approx(10 * us)
    assert tab.by_op["aten::relu"]["cpu"].mean_s == pytest.approx(4 * us)
    assert tab.by_runtime["cudaLaunchKernel"].mean_s == pytest.approx(3 * us)


def test_profiler_costs_subtracted(tmp_path):
    tab = extract_overheads(load_traces(_handmade(tmp_path)))
    # too few samples in a tiny trace: Lin et al.'s constants
    assert tab.profiler_cost_s == {"cpu_op": LIN2022_CPU_COST_S, "runtime_call": LIN2022_RUNTIME_COST_S}
    assert tab.by_op["aten::relu"]["T1"].mean_s == pytest.approx(8e-6)  # 10 - 2
    assert tab.by_runtime["cudaLaunchKernel"].mean_s == pytest.approx(0.0)  # 3 - 4, clipped


def test_json_round_trip_merge_and_reuse_on_a_graph(tmp_path):
    tab = extract_overheads(load_traces(_handmade(tmp_path)), remove_profiler=False)
    doc = json.loads(json.dumps(tab.to_json()))
    again = OverheadTable.from_json(doc)
    assert again.seconds("T5", op="aten::linear") == tab.seconds("T5", op="aten::linear")
    path = tab.save(tmp_path / "overheads.json")
    assert OverheadTable.load(path).seconds("T1") == pytest.approx(tab.seconds("T1"))
    merged = OverheadTable.merge([tab, again])
    assert merged.by_type["T2"].count == 2 * tab.by_type["T2"].count
    assert merged.seconds("T2") == pytest.approx(tab.seconds("T2"))
    # unknown op -> the type-wide mean; unknown type -> NaN
    assert tab.seconds("T2", op="aten::nothing") == pytest.approx(tab.seconds("T2"))
    assert math.isnan(tab.seconds("T4", runtime="cudaNothing")) is False
    # reuse: time a graph's overhead tasks from the table
    rg = build_graph(load_traces(tmp_path / "h.json"))
    d = tab.durations(rg.graph)
    has = rg.graph.overhead != Overhead.NONE
    assert np.all(np.isfinite(d[has])) and np.all(np.isnan(d[~has]))
    cpu = CpuOverheads(**tab.type_means_s())
    assert cpu.t5_s == pytest.approx(7e-6)


@needs_traces
def test_real_trace_overheads_are_plausible():
    tab = extract_overheads(load_traces(TRACES / "dlrm_v100_8ranks.kineto.tar.gz", use_et=False))
    assert len(tab.sources) == 8
    for k in ("T1", "T2", "T3", "T4", "T5"):
        s = tab.by_type[k]
        assert s.count > 100 and 0.0 <= s.mean_s < 100e-6, (k, s)
    assert 1e-6 < tab.seconds("T4", runtime="cudaLaunchKernel") < 30e-6


def test_unprofiled_step_costs_grow_with_the_tensors_and_layers():
    """The step-level host probes (recorded as ``unprofiled_step_s`` on CUDA; here on the CPU for the code
    path): every probe at both sizes, positive, and more tensors / layers cost more."""
    import torch

    from predictor.timing.calibration.overheads import STEP_PROBE_SIZES, unprofiled_step_seconds

    out = unprofiled_step_seconds(torch.device("cpu"), calls=30, rounds=2)
    lo, hi = STEP_PROBE_SIZES
    assert set(out) == {f"{k}_{n}" for k in ("foreach_add", "sgd_step", "backward") for n in STEP_PROBE_SIZES}
    for kind in ("foreach_add", "sgd_step", "backward"):
        assert 0 < out[f"{kind}_{lo}"] < out[f"{kind}_{hi}"]
    assert out[f"sgd_step_{hi}"] > out[f"foreach_add_{hi}"]  # the optimizer's Python around its foreach op
