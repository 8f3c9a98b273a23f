"""The kernel-table report's collective noise floor and the model-variants report (no benchmarks run)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from benchmarks.kernels_cpu import _data_from_sentence, _kernel_pace_sentence, collective_floor
from experiments.kernel_model_variants import markdown


def _pack(tmp_path: Path, frame: pd.DataFrame) -> SimpleNamespace:
    (tmp_path / "data").mkdir()
    frame.to_csv(tmp_path / "data" / "collectives.csv", index=False)
    return SimpleNamespace(path=tmp_path)


def test_collective_floor_compares_odd_and_even_passes(tmp_path):
    # odd passes 1 ms, even passes 2 ms at every size: the halves differ by 50 % (against the even half)
    frame = pd.DataFrame({"kernel": "all_reduce/w2", "msg_bytes": [4.0, 8.0, 16.0],
                          "pass_s": ["0.001;0.002;0.001;0.002"] * 3})
    assert collective_floor(_pack(tmp_path, frame)) == {"all_reduce/w2": pytest.approx(50.0 / np.sqrt(2.0))}


def test_collective_floor_is_empty_without_recorded_passes(tmp_path):
    frame = pd.DataFrame({"kernel": "all_reduce/w2", "msg_bytes": [4.0], "seconds": [1e-3]})
    assert collective_floor(_pack(tmp_path, frame)) == {}


def test_data_from_sentence_names_each_pooled_source():
    one = {"pack": "packs/a", "created": "T1", "level": "quick", "scale": 8.0, "samples": 100,
           "pace": {"transpose": 0.918}}
    single = _data_from_sentence("data_movement:transpose", one)
    assert "`packs/a`, created T1, quick level at scale 8.0, 100 samples brought to this pack's pace" in single
    assert "transpose x0.918)." in single
    pooled = {"pack": "packs/a, packs/b", "created": "T1, T2", "samples": 300,
              "sources": [one, {"pack": "packs/b", "created": "T2", "level": "quick", "scale": 3.0, "samples": 200,
                                "pace": {"transpose": 1.05}}]}
    text = _data_from_sentence("data_movement:transpose", pooled)
    assert "None" not in text
    assert "pooled over 2 other calibrations" in text and "300 samples" in text
    assert "`packs/b` (created T2, quick level at scale 3.0, 200 samples, divided by transpose x1.050)" in text


def test_the_kernel_pace_is_named_and_said_not_to_touch_the_table():
    assert _kernel_pace_sentence({}) == ""
    text = _kernel_pace_sentence({"compute": 1.0502})
    assert "compute x1.050" in text and "not this table" in text


def test_variants_report_has_one_column_per_pack():
    df = pd.DataFrame({"pack": ["a", "a", "b", "b"], "kernel": "concat",
                       "variant": ["current", "roofline", "current", "roofline"], "samples": [100, 100, 200, 200],
                       "gmae_pct": [4.0, 15.0, 5.0, 16.0], "mape_pct": 0.0, "max_pct": 0.0, "model": ""})
    text = markdown(df, "cmd")
    assert "| variant | a | b | mean |" in text
    assert "| current | 4.00 | 5.00 | 4.50 |" in text and "| roofline | 15.00 | 16.00 | 15.50 |" in text
    assert "Samples per pack: a 100, b 200" in text and "Reproduce: `cmd`" in text


def test_variants_report_averages_over_seeds():
    df = pd.DataFrame({"pack": ["a"] * 4, "kernel": "mm/fp32", "variant": ["current", "x"] * 2, "seed": [1, 1, 2, 2],
                       "samples": 100, "gmae_pct": [4.0, 6.0, 6.0, 5.0], "mape_pct": 0.0, "max_pct": 0.0, "model": ""})
    text = markdown(df, "cmd")
    assert "mean over seeds 1, 2" in text
    assert "| current | 5.00 (4.00 / 6.00) | 5.00 |" in text and "| x | 5.50 (6.00 / 5.00) | 5.50 |" in text


def test_gemm_layouts_scores_a_packs_predictions_against_measured_times():
    from experiments.gemm_layouts_cpu import score_pack
    from predictor.timing.kernels import TaskView, timing_for

    model = timing_for("cpu-local").model_for("mm")
    platform = timing_for("cpu-local").platform
    rows = []
    for m, n, k in ((64, 64, 64), (1024, 1024, 1024)):
        t = model.predict(TaskView.from_columns("mm", m=[float(m)], n=[float(n)], k=[float(k)], batch=[1.0],
                                                dtype_bytes=[4.0]), platform)[0]
        rows.append({"op": "mm", "m": m, "n": n, "k": k, "NN_s": 2.0 * t})  # measured twice the prediction
    s = score_pack("cpu-local", rows)
    assert s["by_time"] == pytest.approx(0.5) and s["geomean_all"] == pytest.approx(0.5)
    assert s["geomean_large"] == pytest.approx(0.5)  # only the 2.1 GFLOP shape is above 5e7 FLOPs
