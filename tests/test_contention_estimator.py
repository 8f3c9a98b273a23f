"""experiments/contention_estimator_cpu.py: the reference ratios and scoring stored probe runs (no measuring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.contention_estimator_cpu import reference_ratios

REPO = Path(__file__).resolve().parents[1]


def _recheck(tmp: Path) -> Path:
    tables = [{"table": 0, "rank": 0, "fwd_insitu_s": 2.0, "fwd_alone_s": 1.0, "fwd_predicted_s": 1.5,
               "bwd_insitu_s": 6.0, "bwd_alone_s": 5.0, "bwd_predicted_s": 7.0},
              {"table": 1, "rank": 0, "fwd_insitu_s": 1.0, "fwd_alone_s": 1.0, "fwd_predicted_s": 1.0,
               "bwd_insitu_s": 3.0, "bwd_alone_s": 5.0, "bwd_predicted_s": 4.0},
              {"table": 2, "rank": 1, "fwd_insitu_s": 1.0, "fwd_alone_s": 1.0, "fwd_predicted_s": 1.0,
               "bwd_insitu_s": 1.0, "bwd_alone_s": 1.0, "bwd_predicted_s": 1.0}]
    p = tmp / "recheck.json"
    p.write_text(json.dumps({"meta": {"task": "t0"}, "placements": {"naive": {"tables": tables}}}))
    return p


def test_reference_is_each_ranks_in_situ_sum_over_its_alone_sum(tmp_path: Path) -> None:
    rows = reference_ratios([_recheck(tmp_path)])
    r0 = next(r for r in rows if r["rank"] == 0)
    assert r0["tables"] == 2
    assert r0["fwd"] == pytest.approx(3.0 / 2.0) and r0["bwd"] == pytest.approx(9.0 / 10.0)
    assert r0["both"] == pytest.approx(12.0 / 12.0)
    assert next(r for r in rows if r["rank"] == 1)["both"] == pytest.approx(1.0)


def test_stored_probe_runs_are_scored_again_without_measuring(tmp_path: Path) -> None:
    proc = {c: [[1.0, 1.2], [1.0, 1.4]] for c in ("embedding", "memory", "compute")}
    other = {c: [[1.0, 1.0], [1.0, 1.0]] for c in ("embedding", "memory", "compute")}
    stored = tmp_path / "old.json"
    stored.write_text(json.dumps({"meta": {"measured_at": "then", "host": {}, "repeats": 1, "world": 2,
                                           "threads": 1, "rounds": 2, "slot_s": 0.5},
                                  "probe_runs": [[proc, other]]}))
    out = tmp_path / "res"
    r = subprocess.run([sys.executable, "experiments/contention_estimator_cpu.py", "--from-json", str(stored),
                        "--rechecks", str(_recheck(tmp_path)), "--out", str(out)], cwd=REPO, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["probe_median"]["slowest"]["embedding"] == pytest.approx(1.3)
    assert res["probe_median"]["mean"]["embedding"] == pytest.approx(1.15)
    assert "| mean | x1.150 |" in out.with_suffix(".md").read_text()


def test_a_foreign_json_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = subprocess.run([sys.executable, "experiments/contention_estimator_cpu.py", "--from-json", str(bad),
                        "--out", str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "not a contention_estimator_cpu results file" in r.stderr
    assert "Traceback" not in r.stderr
