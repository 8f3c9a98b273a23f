"""Page faults of profiled CPU steps: the capture counts them per iteration and times one fault on the
host; the what-if annotation says when the profiled steps faulted much more than the unprofiled ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _trace_fixtures import capture_steps

from predictor.sources.traces.capture import read_step_times


def _rewrite_faults(csv: Path, active: int, after: int, cost_s: float) -> None:
    """Set every active iteration's fault count to ``active``, every later one's to ``after``."""
    rows = []
    for line in csv.read_text().splitlines():
        if line.startswith("# page_fault_s="):
            continue
        parts = line.split(",")
        if len(parts) == 4 and parts[0] != "step":
            parts[3] = str(active if parts[2] == "active" else after)
        rows.append(",".join(parts))
    csv.write_text(f"# page_fault_s={cost_s:.4e}\n" + "\n".join(rows) + "\n")


def test_steps_csv_old_and_new_columns(tmp_path):
    old = tmp_path / "old.csv"
    old.write_text("# torch_threads=1\nstep,wall_s,window\n0,0.010,active\n1,0.008,after\n")
    d = read_step_times(old)
    assert d["wall_s"] == [0.010, 0.008] and d["window"] == ["active", "after"]
    assert np.isnan(d["minor_faults"]).all() and d["page_fault_s"] is None
    new = tmp_path / "new.csv"
    new.write_text("# page_fault_s=1.5000e-06\nstep,wall_s,window,minor_faults\n0,0.010,active,900\n1,0.008,after,12\n")
    d = read_step_times(new)
    assert d["minor_faults"] == [900.0, 12.0] and d["page_fault_s"] == pytest.approx(1.5e-6)


@pytest.fixture(scope="module")
def mlp_capture(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    return capture_steps(tmp_path_factory.mktemp("faults") / "mlp", model, lambda m: m(x).square().mean(),
                         steps=8, active=3)


def test_capture_counts_faults_and_times_one(mlp_capture):
    d = read_step_times(mlp_capture / "rank0.steps.csv")
    assert len(d["minor_faults"]) == len(d["wall_s"]) == 8
    assert all(f >= 0 and f == int(f) for f in d["minor_faults"])
    assert d["page_fault_s"] is not None and 1e-8 < d["page_fault_s"] < 1e-4


def test_fault_excess_is_measured_and_noted(mlp_capture, tmp_path):
    """3 000 extra faults a profiled step at 1 µs each: 3 ms, reported in the annotation's notes (the
    captured steps last a few ms); the same capture without the excess gets no note, and the profiler
    correction is the same for both."""
    import shutil

    from predictor.sources.traces.load import load_traces
    from predictor.sources.traces.profiler_cost import profiled_extra_faults, step_records
    from predictor.whatif.annotate import annotate

    plain = tmp_path / "plain"
    faulted = tmp_path / "faulted"
    shutil.copytree(mlp_capture, plain)
    shutil.copytree(mlp_capture, faulted)
    _rewrite_faults(plain / "rank0.steps.csv", 500, 500, 1e-6)
    _rewrite_faults(faulted / "rank0.steps.csv", 3500, 500, 1e-6)
    assert profiled_extra_faults(step_records(load_traces(plain))) == (0.0, 0.0)
    extra, secs = profiled_extra_faults(step_records(load_traces(faulted)))
    assert extra == 3000 and secs == pytest.approx(3e-3)

    a, b = annotate(load_traces(plain)), annotate(load_traces(faulted))
    assert not any("faulted" in n for n in a.notes)
    assert any("faulted 3000 more pages a step" in n for n in b.notes)
    assert b.profiler_cost_s == pytest.approx(a.profiler_cost_s)
    assert b.extra_faults_per_step == 3000 and b.extra_fault_s == pytest.approx(3e-3)

    # `tuner predict` shows it beside the profiler cost
    from typer.testing import CliRunner

    from tuner.cli import app

    res = CliRunner().invoke(app, ["predict", str(faulted), "--set", "batch_size=x2"], env={"COLUMNS": "240"})
    assert res.exit_code == 0, res.output
    assert "profiled steps' extra page faults" in res.output and "3000 a step" in res.output
    res = CliRunner().invoke(app, ["predict", str(plain), "--set", "batch_size=x2"], env={"COLUMNS": "240"})
    assert res.exit_code == 0 and "extra page faults" not in res.output
