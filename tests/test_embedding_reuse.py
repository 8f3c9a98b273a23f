"""experiments/embedding_reuse_cpu.py: one rank's share of the e2e tables, the step-order timing and the
summary's per-pass ratios (tiny sizes; no measuring of the real tables)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.embedding_reuse_cpu import local_job, sequence_seconds, summary

REPO = Path(__file__).resolve().parents[1]


def test_the_ranks_shares_are_the_e2e_placement_of_the_tables() -> None:
    one, spec, mine = local_job(256, 1, 0, 1)
    assert len(mine) == len(one.rows) == len(spec.tables.rows)
    r0, _, m0 = local_job(256, 2, 0, 1)
    r1, _, m1 = local_job(256, 2, 1, 1)
    assert sorted([*m0, *m1]) == list(range(len(one.rows)))  # each table on exactly one rank
    assert r0.rows == tuple(one.rows[t] for t in m0) and r0.n_ranks == 1 and set(r0.assignment) == {0}


def test_sequence_times_every_tables_forward_and_backward() -> None:
    job, _, _ = local_job(256, 2, 0, 1)
    small = replace(job, rows=(50, 80), dim=(8, 4), pooling=(2.0, 3.0), reuse=(), assignment=(0, 0))
    fwd, bwd = sequence_seconds(small, iters=2)
    assert fwd.shape == bwd.shape == (2,)
    assert np.all(fwd > 0) and np.all(bwd > 0)


def test_summary_sums_tables_per_pass_and_takes_the_median_ratio() -> None:
    rows = []
    for p, scale in enumerate((0.8, 0.6)):
        for t in range(2):
            row = {"pass": p, "batch": 256, "ranks": 1, "rank": 0, "table": t}
            for kind in ("fwd", "bwd"):
                row.update({f"{kind}_cold_s": 1.0, f"{kind}_sequence_s": scale, f"{kind}_flushed_s": 1.5,
                            f"{kind}_predicted_s": 1.1})
            rows.append(row)
    s = summary(pd.DataFrame(rows)).set_index("kind").loc["bwd"]
    assert s["tables"] == 2 and s["passes"] == 2
    assert s["cold_ms"] == pytest.approx(2000.0) and s["predicted_ms"] == pytest.approx(2200.0)
    assert s["sequence_over_cold"] == pytest.approx(0.7) and s["sequence_range"] == pytest.approx([0.6, 0.8])
    assert s["flushed_over_cold"] == pytest.approx(1.5)


def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "experiments/embedding_reuse_cpu.py", "--passes", "0", "--out",
                        str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error:")
    assert not (tmp_path / "o.md").exists()
