"""Pipeline formulas worked out by hand (seconds)."""

from __future__ import annotations

import pytest

from predictor.stage import gpipe, one_f_one_b, pipeline_latency
from predictor.stage.pipeline import one_f_one_b_order


def test_predtop_eq4_by_hand():
    # sum = 1 + 3 + 2 = 6, (B - 1) * max = 3 * 3 = 9
    assert pipeline_latency([1.0, 3.0, 2.0], 4) == pytest.approx(15.0)
    assert pipeline_latency([2.5], 1) == pytest.approx(2.5)


def test_one_f_one_b_order():
    order = one_f_one_b_order(4, 6, 0)
    assert order == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("F", 3),
        ("B", 0),
        ("F", 4),
        ("B", 1),
        ("F", 5),
        ("B", 2),
        ("B", 3),
        ("B", 4),
        ("B", 5),
    ]
    assert one_f_one_b_order(4, 6, 3)[:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]


def test_one_f_one_b_uniform_matches_formula():
    # (B + S - 1)(f + b) = (6 + 4 - 1) * 3 = 27
    sched = one_f_one_b([1.0] * 4, [2.0] * 4, 6)
    assert sched.iteration_s == pytest.approx(27.0)
    assert sched.iteration_s == pytest.approx(pipeline_latency([3.0] * 4, 6))
    assert sched.bubble_fraction == pytest.approx(1 - 18 / 27)


def test_one_f_one_b_two_unequal_stages_by_hand():
    # f = [1, 2], b = [1, 3], 2 micro-batches. Stage 0: F0 0-1, F1 1-2, B0 6-7, B1 11-12;
    # stage 1: F0 1-3, B0 3-6, F1 6-8, B1 8-11 -> 12 s (= eq. 4 with t = [2, 5]: 7 + 5).
    sched = one_f_one_b([1.0, 2.0], [1.0, 3.0], 2)
    assert sched.iteration_s == pytest.approx(12.0)
    ops = {(s, m, k): (a, b) for s, m, k, a, b in sched.ops}
    assert ops[(0, 0, "B")] == (6.0, 7.0) and ops[(1, 1, "F")] == (6.0, 8.0)


def test_p2p_delay_and_gpipe():
    # one micro-batch, two stages of f = b = 1, transfer 0.5 each way: 1 + .5 + 1 + 1 + .5 + 1 = 5
    assert one_f_one_b([1, 1], [1, 1], 1, p2p_s=0.5).iteration_s == pytest.approx(5.0)
    # GPipe with uniform stages has the same makespan as 1F1B
    assert gpipe([1.0] * 3, [2.0] * 3, 4).iteration_s == pytest.approx(
        one_f_one_b([1.0] * 3, [2.0] * 3, 4).iteration_s
    )


def test_bad_input():
    with pytest.raises(ValueError):
        pipeline_latency([], 3)
    with pytest.raises(ValueError):
        pipeline_latency([1.0], 0)
    with pytest.raises(ValueError):
        one_f_one_b([1.0, 2.0], [1.0], 2)
