"""experiments/dlrm_process_context_cpu.py: the table from per-round rows and bad arguments (no measuring)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

from experiments.dlrm_process_context_cpu import MODES, markdown

REPO = Path(__file__).resolve().parents[1]


def test_each_configuration_is_the_median_over_rounds_against_fresh() -> None:
    per_round = {"fresh": (100.0, 110.0, 90.0), "after_mlp_gpt": (80.0, 95.0, 85.0), "phase_marks": (120.0, 100.0, 130.0)}
    rows = [{"round": r + 1, "mode": m, "batch": 1024, "median_ms": t[r], "user_ms": t[r] - 1, "system_ms": 0.5,
             "minor_faults": 10.0 * (r + 1)} for m, t in per_round.items() for r in range(3)]
    text = markdown(pd.DataFrame(rows), {1024: 118.0}, {"date": "d", "platform": "p", "rounds": 3, "batch_pool": 8,
                                                      "command": "c"})
    assert "| 1024 | fresh | 100.0 [90.0-110.0] | +0.0% | 99.0 | 0.5 | 20 | 118.0 |" in text
    assert "| 1024 | after_mlp_gpt | 85.0 [80.0-95.0] | -15.0% |" in text
    assert "| 1024 | phase_marks | 120.0 [100.0-130.0] | +20.0% |" in text
    assert "| 2 | 1024 | 110.0 | 95.0 | 100.0 |" in text  # the per-round table keeps the order of MODES
    assert MODES == ("fresh", "after_mlp_gpt", "phase_marks")


def test_bad_rounds_is_one_line_and_exit_2(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "experiments/dlrm_process_context_cpu.py", "--rounds", "0",
                        "--out", str(tmp_path / "x.md")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "--rounds" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.md").exists()
