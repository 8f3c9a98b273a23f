"""Reports of a sharding search: each task's best plan by default, every task and batch size with --all-traces."""

from __future__ import annotations

import json

import yaml
from spaces import SMALL_SHARDING
from typer.testing import CliRunner

from tuner.cli import app

SPACE = SMALL_SHARDING


def _search(tmp_path, *extra):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["search", str(space), "--out", str(out), "--workers", "0", "--quiet", *extra])
    assert result.exit_code == 0, result.output
    return out, json.loads((out / "results.json").read_text())


def test_default_reports_write_each_tasks_best_plan(tmp_path):
    out, res = _search(tmp_path)
    assert [p.name for p in (out / "figures").glob("*.png")] == ["best_plans.png"]
    traces = sorted(p.name for p in (out / "traces").glob("*.json"))
    assert len(traces) == 2  # one per task: its batch size of most samples per second
    for task in {t["task"] for t in res["tasks"]}:
        rows = [t for t in res["tasks"] if t["task"] == task]
        best = max(rows, key=lambda t: t["batch_size"] / t["best_predicted_iteration_s"])
        assert f"{task}_b{best['batch_size']}_{best['best']}.json" in traces
    assert "figures/best_plans.png" in (out / "report.md").read_text()


def test_all_traces_writes_every_task_and_batch(tmp_path):
    out, _ = _search(tmp_path, "--all-traces")
    assert len(list((out / "figures").glob("*.png"))) == 2  # a chart per task
    assert len(list((out / "traces").glob("*.json"))) == 4  # the best sharder of every task and batch size
