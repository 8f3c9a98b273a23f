"""Re-measuring placements of a sharding run (experiments/placement_recheck.py): the parts that need no
measurement — reading the run file, summarising passes, the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.placement_recheck import load_run, markdown, run_args, summarise

REPO = Path(__file__).resolve().parents[1]


def _pass(rank0: list[float], rank1: list[float], emb: float) -> dict:
    phases = [[{"emb_fwd": emb, "a2a_fwd": 0.001} for _ in rank0], [{"emb_fwd": emb / 2} for _ in rank1]]
    return {"times": [rank0, rank1], "phases": phases, "background_cores": 0.01}


def test_summary_takes_the_slowest_rank_per_iteration_and_medians_over_passes() -> None:
    passes = [_pass([0.010, 0.012, 0.011], [0.013, 0.009, 0.011], 0.004),
              _pass([0.020, 0.020, 0.020], [0.010, 0.010, 0.010], 0.006)]
    s = summarise([0.011, 0.009], [{"emb_fwd": 0.005, "a2a_fwd": 0.001}, {"emb_fwd": 0.002}], passes)
    slowest = [0.013, 0.012, 0.011, 0.020, 0.020, 0.020]
    assert s["measured_s"] == pytest.approx(float(np.median(slowest)))
    assert s["measured_p10_s"] == pytest.approx(float(np.quantile(slowest, 0.1)))
    assert s["pass_medians_s"] == pytest.approx([0.012, 0.020])
    assert s["measured_rank_s"] == pytest.approx([float(np.median([0.010, 0.012, 0.011, 0.02, 0.02, 0.02])),
                                                  float(np.median([0.013, 0.009, 0.011, 0.01, 0.01, 0.01]))])
    assert s["predicted_s"] == pytest.approx(0.011)
    emb0 = next(x for x in s["phases"] if (x["rank"], x["phase"]) == (0, "emb_fwd"))
    assert emb0["measured_s"] == pytest.approx(0.005) and emb0["predicted_s"] == pytest.approx(0.005)
    # a phase neither the measurement nor the simulation has on a rank gets no row
    assert not [x for x in s["phases"] if (x["rank"], x["phase"]) == (1, "a2a_fwd")]


def test_report_names_every_placement_and_its_rank_split() -> None:
    passes = [_pass([0.010, 0.012], [0.011, 0.009], 0.004)]
    p = summarise([0.011, 0.009], [{"emb_fwd": 0.005}, {"emb_fwd": 0.002}], passes)
    out = {"meta": {"task": "task03", "run_file": "r.json", "run_date": "2026-11-25", "platform": "cpu-local-avx2",
                    "passes": 1, "iters": 2, "measured_at": "now"},
           "placements": {"a": {**p, "assignment": [0, 1, 1], "run_predicted_s": 0.01, "run_measured_s": 0.012},
                          "b": {**p, "assignment": [0, 0, 1], "run_predicted_s": 0.01, "run_measured_s": 0.012}}}
    md = markdown(out, "python experiments/placement_recheck.py ...")
    assert "| a | 1 / 2 |" in md and "| b | 2 / 1 |" in md and "emb_fwd" in md


def test_run_arguments_default_the_thread_count_and_take_a_platform() -> None:
    run = {"meta": {"args": {"threads": None, "platform": "cpu-local"}}}
    a = run_args(run, "cpu-local-avx2")
    assert a.threads_used == 1 and a.platform == "cpu-local-avx2"


def test_a_foreign_or_missing_run_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"rows": []}))
    for path in (bad, tmp_path / "missing.json"):
        r = subprocess.run([sys.executable, "experiments/placement_recheck.py", "--run-file", str(path), "--task", "0",
                            "--out", str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        load_run(bad)


def test_tables_are_cut_from_the_marks_and_set_beside_alone_and_predicted() -> None:
    from experiments.placement_recheck import table_rows, tables_markdown

    # rank 0 holds tables 0 and 2: forwards in table order, backwards in reverse after the gradient arrives
    marks0 = [("start", 0.0), ("emb_fwd_table", 1.0), ("emb_fwd_table", 3.0), ("emb_grad", 10.0),
              ("emb_bwd", 14.0), ("emb_bwd", 15.0)]
    marks1 = [("start", 0.0), ("emb_fwd_table", 0.5), ("emb_grad", 9.0), ("emb_bwd", 11.0)]
    passes = [{"marks": [[marks0, marks0], [marks1, marks1]]}]
    predicted = {"embedding_bag_fwd[0]": 1.5, "embedding_bag_bwd[0]": 2.0, "embedding_bag_fwd[2]": 2.5,
                 "embedding_bag_bwd[2]": 3.0, "embedding_bag_fwd[1]": 0.4, "embedding_bag_bwd[1]": 1.0}
    alone = {"fwd": [1.1, 0.6, 2.2], "bwd": [0.9, 1.9, 4.1]}
    rows = table_rows(np.array([0, 1, 0]), passes, predicted, alone)
    by = {x["table"]: x for x in rows}
    assert by[0]["fwd_insitu_s"] == pytest.approx(1.0) and by[2]["fwd_insitu_s"] == pytest.approx(2.0)
    assert by[2]["bwd_insitu_s"] == pytest.approx(4.0) and by[0]["bwd_insitu_s"] == pytest.approx(1.0)
    assert by[1]["rank"] == 1 and by[1]["bwd_insitu_s"] == pytest.approx(2.0)
    assert by[2]["bwd_predicted_s"] == 3.0 and by[2]["bwd_alone_s"] == 4.1
    md = "\n".join(tables_markdown({"placements": {"a": {"tables": rows}}}))
    assert "| a | 0 | 2 | 3000.0 | 3300.0 | 4000.0 | 5000.0 | 5000.0 | 5000.0 |" in md
    # a run without a cold check: alone times unknown, not zero
    assert np.isnan(table_rows(np.array([0, 1, 0]), passes, predicted, {})[0]["fwd_alone_s"])
