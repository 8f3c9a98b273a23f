"""experiments/step_reuse_ranks_cpu.py: the summary per K and working set, its table, bad arguments."""

from __future__ import annotations

import pytest

from experiments.step_reuse_ranks_cpu import main, markdown, summarise

LLC = 32 * 2**20


def _row(world: int, process: int, fraction: float, bwd: float) -> dict:
    """A probe row whose pooling-1 and pooling-64 tables run ``bwd`` and 1.0 x their cold backward."""
    per = {"pooling": [1.0, 64.0], "fwd_cold_s": [1.0, 1.0], "bwd_cold_s": [1.0, 1.0],
           "fwd_step_s": [0.9, 0.9], "bwd_step_s": [bwd, 1.0]}
    return {"world": world, "process": process, "round": 0, "fraction": fraction, "ws_bytes": fraction * LLC,
            "llc_bytes": LLC, "fwd_cold_s": 2.0, "bwd_cold_s": 2.0, "fwd_step_s": 1.8, "bwd_step_s": bwd + 1.0,
            "per_table": per}


def test_the_summary_is_per_world_and_working_set_with_the_pooling_factors():
    rows = [_row(1, 0, 0.25, 0.6), _row(2, 0, 0.25, 0.8), _row(2, 1, 0.25, 1.0)]
    got = summarise(rows)
    assert [(s["world"], s["fraction"], s["samples"]) for s in got] == [(1, 0.25, 1), (2, 0.25, 2)]
    assert got[0]["bwd"] == pytest.approx(0.8) and got[1]["bwd"] == pytest.approx(0.95)
    assert got[1]["bwd_by_pooling"] == {"1": pytest.approx(0.9), "64": pytest.approx(1.0)}
    assert got[0]["fwd"] == pytest.approx(0.9)
    text = markdown(got, {"date": "d", "host": "h", "command": "c", "reps": 1})
    assert "| 2 | 0.250 | 2 | 0.90 | 0.95 | 0.90 | 1.00 |" in text
    assert "K = 2 minus K = 1 at the same total working set: +0.15" in text


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--out", "x.md"], ["--llc-mib", "-1"]])
def test_bad_arguments_exit_2_before_measuring(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
