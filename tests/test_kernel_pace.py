"""The platform's kernel pace: measured from the windows' drift probes, applied per kernel class."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from predictor.graph import Category, GraphBuilder, ProcKind
from predictor.timing.calibration.pace import (
    MIN_WINDOWS,
    PaceError,
    pace_from_windows,
    probe_reference,
    probe_rows,
    read_windows,
    window_drift,
)
from predictor.timing.kernels.assets import load_asset_pack
from predictor.timing.kernels.timing import ModelTiming
from predictor.timing.platforms import get_platform
from tuner.cli import app

CPU = {"vendor": "AMD", "family": "25", "model": "17", "model_name": "AMD EPYC"}
CREATED = "2026-11-26T06:49:35+00:00"


def _window(i: int, gemm: tuple[float, float] | None, memory: tuple[float, float] | None = None,
            created: str = CREATED, cpu: dict | None = None, reference: str | None = None) -> dict:
    gd = {}
    if gemm:
        ref = {"reference": reference} if reference else {}
        gd |= {"before": {"ratio_geomean": gemm[0], **ref}, "after": {"ratio_geomean": gemm[1], **ref}}
    if memory:
        gd |= {"memory_before": {"ratio_geomean": memory[0]}, "memory_after": {"ratio_geomean": memory[1]}}
    return {"measured_at": f"2026-11-27T{i:02d}:00:00+00:00", "pack_created": created, "cpu": cpu or CPU,
            "gemm_drift": gd, "rows": []}


def test_a_windows_drift_is_the_geomean_of_before_and_after():
    w = _window(0, (1.0, 1.21), (0.81, None))
    assert window_drift(w, "compute") == pytest.approx(1.1)
    assert window_drift(w, "memory") == pytest.approx(0.81)
    assert window_drift(_window(1, None), "compute") is None


def test_the_pace_is_the_median_over_this_packs_windows_only():
    gemm = [1.0 + 0.01 * i for i in range(MIN_WINDOWS + 1)]  # median 1.05
    mine = [_window(i, (g, g), (1.2, 1.2)) for i, g in enumerate(gemm)]
    others = [_window(20, (3.0, 3.0), (3.0, 3.0), created="2026-11-20T00:00:00+00:00"),
              _window(21, (3.0, 3.0), (3.0, 3.0), cpu={**CPU, "model": "1"})]
    pace, record = pace_from_windows(mine + others, CREATED, CPU)
    assert pace == pytest.approx({"compute": 1.05})  # the memcpy probe's drift is recorded, not applied
    assert record["classes"]["memory"]["median"] == pytest.approx(1.2) and not record["classes"]["memory"]["applied"]
    assert record["classes"]["compute"]["windows"] == MIN_WINDOWS + 1
    assert record["classes"]["compute"]["first"] < record["classes"]["compute"]["last"]


def test_a_class_with_too_few_windows_is_not_recorded_and_none_at_all_is_refused():
    wins = [_window(i, (1.1, 1.1), (1.3, 1.3) if i < 2 else None) for i in range(MIN_WINDOWS)]
    pace, record = pace_from_windows(wins, CREATED, CPU)
    assert pace == pytest.approx({"compute": 1.1}) and "memory" not in record["classes"]
    with pytest.raises(PaceError, match="fewer than"):
        pace_from_windows(wins[: MIN_WINDOWS - 1], CREATED, CPU)
    with pytest.raises(PaceError, match="0 of"):
        pace_from_windows(wins, "another pack", CPU)


def test_windows_of_the_packs_current_probe_reference_take_over_once_there_are_enough():
    legacy = [_window(i, (1.10, 1.10)) for i in range(MIN_WINDOWS)]
    other = [_window(i, (3.0, 3.0), reference="old") for i in range(MIN_WINDOWS)]
    few = [_window(i, (1.00, 1.00), reference="new") for i in range(3)]
    pace, record = pace_from_windows(legacy + other + few, CREATED, CPU, references={"compute": "new"})
    assert pace["compute"] == pytest.approx(1.10)  # 3 current + 10 legacy; another reference never counts
    assert record["classes"]["compute"]["windows"] == MIN_WINDOWS + 3
    assert record["classes"]["compute"]["reference"] == "before references"
    enough = [_window(i, (1.00, 1.00), reference="new") for i in range(MIN_WINDOWS)]
    pace, record = pace_from_windows(legacy + other + enough, CREATED, CPU, references={"compute": "new"})
    assert pace["compute"] == pytest.approx(1.00) and record["classes"]["compute"]["reference"] == "new"


def test_the_probe_rows_and_their_reference():
    table = pd.DataFrame({"kernel": ["mm/fp32", "addmm/fp32", "bmm/fp32", "mm/fp32"], "m": [1, 2, 3, 4],
                          "n": 1, "k": 1, "flops": [1.0, 2.0, 9.0, 3.0], "seconds": [1.0, 2.0, 3.0, 4.0]})
    rows = probe_rows(table, "compute")
    assert sorted(rows["m"]) == [2, 4]  # fp32 addmm / mm only, the larger half by FLOPs
    same = probe_reference(rows)
    assert same == probe_reference(probe_rows(table, "compute"))
    table.loc[3, "seconds"] = 4.5
    assert probe_reference(probe_rows(table, "compute")) != same


@pytest.mark.parametrize("text", ["{not json", json.dumps({"windows": []}), json.dumps([1, 2])])
def test_a_windows_file_that_is_not_a_list_of_windows_is_refused(tmp_path: Path, text: str):
    f = tmp_path / "w.json"
    f.write_text(text)
    with pytest.raises(PaceError, match="--pace-from"):
        read_windows(f)


def _two_class_graph():
    b = GraphBuilder()
    proc = b.processor(0, ProcKind.CPU_THREAD, "main")
    gemm = b.task(proc, "mm", "mm", Category.COMPUTE, flops=2 * 512.0**3, bytes=3 * 4 * 512.0**2,
                  params={"m": 512, "n": 512, "k": 512})
    ew = b.task(proc, "add", "add", Category.MEMORY, bytes=3 * 4e6, params={"elements": 1e6})
    return b.build(), gemm, ew


def test_the_pace_scales_each_classes_predicted_kernels():
    base = get_platform("a100-80gb")
    graph, gemm, ew = _two_class_graph()
    plain = ModelTiming(base).durations(graph)
    paced = ModelTiming(base.model_copy(update={"kernel_pace": {"compute": 1.05}})).durations(graph)
    assert paced[gemm] == pytest.approx(plain[gemm] * 1.05)
    assert paced[ew] == pytest.approx(plain[ew])
    both = ModelTiming(base.model_copy(update={"kernel_pace": {"compute": 1.05, "memory": 1.2}})).durations(graph)
    assert both[ew] == pytest.approx(plain[ew] * 1.2)
    assert np.all(plain > 0)


def test_an_unknown_pace_class_is_refused():
    base = get_platform("a100-80gb")
    with pytest.raises(ValueError, match="unknown kernel class"):
        type(base).model_validate({**base.model_dump(), "kernel_pace": {"gpu": 1.1}})


def test_refit_pace_from_windows_and_its_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    runner = CliRunner()
    src = tmp_path / "src"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(src), "--threads", "1",
                              "--families", "elementwise"])
    assert res.exit_code == 0, res.output
    m = json.loads((src / "manifest.json").read_text())
    wins = [_window(i, (1.04, 1.06), (1.1, 1.1), created=m["created"], cpu=m["cpu"]) for i in range(MIN_WINDOWS)]
    f = tmp_path / "windows.json"
    f.write_text(json.dumps(wins))
    res = runner.invoke(app, ["calibrate", "--refit", str(src), "--pace-from", str(f)])
    assert res.exit_code == 0, res.output
    p = load_asset_pack(src)
    assert p.platform.kernel_pace["compute"] == pytest.approx(float(np.sqrt(1.04 * 1.06)))
    assert "memory" not in p.platform.kernel_pace and "not applied" in p.platform.sources["kernel_pace"]
    assert p.source == f"asset pack src (kernel pace compute x{np.sqrt(1.04 * 1.06):.3f})"  # outputs say it
    assert p.manifest["refit"]["pace_from"]["classes"]["memory"]["windows"] == MIN_WINDOWS
    res = runner.invoke(app, ["calibrate", "--refit", str(src)])  # a later refit keeps the stored pace
    assert res.exit_code == 0, res.output
    assert load_asset_pack(src).platform.kernel_pace["compute"] == pytest.approx(float(np.sqrt(1.04 * 1.06)))
    f.write_text(json.dumps(wins[:3]))
    out = tmp_path / "out"
    res = runner.invoke(app, ["calibrate", "--refit", str(src), "--out", str(out), "--pace-from", str(f)])
    assert res.exit_code == 2 and "fewer than 10 windows" in res.output and "Traceback" not in res.output
    assert not out.exists()
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(out), "--pace-from", str(f)])
    assert res.exit_code == 2 and "--pace-from goes with --refit" in res.output
