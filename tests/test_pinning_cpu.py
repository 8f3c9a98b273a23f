"""experiments/pinning_cpu.py: steps and ratios per pass from phase frames, and the stored-pass paths (no measuring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.pinning_cpu import step_rows, summary

REPO = Path(__file__).resolve().parents[1]


def _phases(one: float, two: tuple[float, float], batch: int = 256) -> pd.DataFrame:
    """A dlrm_phases_cpu phase frame with only the iteration rows (medians in ms; simulated 40 / 30, 31)."""
    rows = [{"batch": batch, "ranks": 1, "rank": 0, "phase": "iteration", "median_ms": one, "simulated_ms": 40.0}]
    rows += [{"batch": batch, "ranks": 2, "rank": r, "phase": "iteration", "median_ms": t, "simulated_ms": 30.0 + r}
             for r, t in enumerate(two)]
    rows.append({"batch": batch, "ranks": 2, "rank": 0, "phase": "dense_fwd", "median_ms": 99.0, "simulated_ms": 1.0})
    return pd.DataFrame(rows)


def test_a_pass_takes_the_slower_rank_and_the_ratio_is_per_pass() -> None:
    steps = pd.DataFrame(step_rows(_phases(40.0, (30.0, 36.0)), "unpinned", 0)
                         + step_rows(_phases(50.0, (35.0, 34.0)), "unpinned", 1))
    two = steps[steps["ranks"] == 2].set_index("run")["measured_ms"]
    assert two.tolist() == [36.0, 35.0]
    s = summary(steps).iloc[0]
    assert s["passes"] == 2
    assert s["ratio"] == pytest.approx((36 / 40 + 35 / 50) / 2)  # median of two passes' own ratios
    assert s["ratio_range"] == pytest.approx([0.7, 0.9])
    assert s["sim_ratio"] == pytest.approx(31 / 40)
    assert s["err_two_pct"] == pytest.approx(100 * (31 / 35.5 - 1))
    assert s["err_ratio_pct"] == pytest.approx(100 * (31 / 40 / 0.8 - 1))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "experiments/pinning_cpu.py", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_passes_from_phase_files_and_from_a_stored_result(tmp_path: Path) -> None:
    files = []
    for k, (one, two) in enumerate([(40.0, (30.0, 36.0)), (44.0, (31.0, 30.0))]):
        p = tmp_path / f"phases{k}.json"
        p.write_text(json.dumps({"phases": _phases(one, two).to_dict(orient="records")}))
        files.append(p)
    out = tmp_path / "pin"
    r = _run("--phases-json", f"unpinned={files[0]}", f"pinned={files[1]}", "--out", str(out))
    assert r.returncode == 0, r.stderr
    stored = json.loads(out.with_suffix(".json").read_text())
    assert {s["mode"] for s in stored["summary"]} == {"unpinned", "pinned"}
    assert "| pinned | 256 | 1 |" in out.with_suffix(".md").read_text()
    assert "a pool of 2 index batches" in out.with_suffix(".md").read_text()
    again = tmp_path / "again"
    r = _run("--from-json", str(out.with_suffix(".json")), "--out", str(again))
    assert r.returncode == 0, r.stderr
    assert json.loads(again.with_suffix(".json").read_text())["summary"] == stored["summary"]


@pytest.mark.parametrize("args", [["--phases-json", "fast=x.json"], ["--from-json", "missing.json"],
                                  ["--pairs", "0"], ["--batch-pool", "0"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    r = _run(*args, "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    assert r.stderr.startswith("error:") and "Traceback" not in r.stderr
    assert not (tmp_path / "o.md").exists()
