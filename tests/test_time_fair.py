"""run_cases' time-fair first round: every kernel of a family gets an equal share of the time."""

from __future__ import annotations

import time

import numpy as np
import torch

from predictor.timing.calibration.base import BenchContext, run_cases, time_fair_order
from predictor.timing.calibration.gemm import GemmBenchmark
from predictor.timing.calibration.timing import Timer


def test_picker_serves_the_kernel_with_the_least_time():
    order = [3, 0, 4, 1, 2, 5]
    kernels = ["a", "a", "b", "a", "b", "b"]
    spent: dict[str, float] = {}
    got = []
    cost = {"a": 1.0, "b": 3.0}
    for i in time_fair_order(order, kernels, spent):
        got.append(i)
        spent[kernels[i]] = spent.get(kernels[i], 0.0) + cost[kernels[i]]
    # a (cheap) is served three times while b (3x dearer) runs once, each kernel's cases in shuffled order
    assert got == [3, 4, 0, 1, 2, 5]
    assert next(time_fair_order([2, 0, 1], ["x", "x", "x"], {})) == 2  # one kernel: the order as it is


def _slow_and_fast_cases():
    def build(seconds):
        def b():
            return (lambda: time.sleep(seconds)), None
        return b
    return ([({"kernel": "slow", "kind": "mm", "m": i}, build(0.02)) for i in range(40)]
            + [({"kernel": "fast", "kind": "mm", "m": i}, build(0.0005)) for i in range(40)])


def _ctx():
    return BenchContext(device=torch.device("cpu"), level="tiny", rng=np.random.default_rng(0),
                        timer=Timer(torch.device("cpu"), warmup=0, repeats=1, min_sample_s=0.0), budget_s=0.4)


def test_a_slow_kernel_does_not_starve_a_fast_one():
    fair = run_cases(_ctx(), _slow_and_fast_cases(), "t", time_fair=True)
    plain = run_cases(_ctx(), _slow_and_fast_cases(), "t")
    n_fair, n_plain = fair.groupby("kernel").size(), plain.groupby("kernel").size()
    assert n_fair["fast"] > 2 * n_plain.get("fast", 0)
    assert n_fair["fast"] > 3 * n_fair["slow"]


def test_the_gemm_family_is_time_fair():
    assert GemmBenchmark.time_fair


def test_a_case_that_would_overrun_the_budget_is_left_out():
    # 20 small cases (5 ms for 1 unit of work) and one whose work says it takes 100x as long (0.5 s)
    def build(seconds):
        def b():
            return (lambda: time.sleep(seconds)), None
        return b
    small = [({"kernel": "k", "kind": "mm", "flops": 1.0}, build(0.005)) for _ in range(20)]
    cases = [*small[:10], ({"kernel": "k", "kind": "mm", "flops": 100.0}, build(0.5)), *small[10:]]
    # a shuffle that brings the big case (index 10) after ten small ones, so its kernel has a pace
    seed = next(s for s in range(100) if list(np.random.default_rng(s).permutation(21)).index(10) >= 10)
    ctx = _ctx()
    ctx.budget_s, ctx.shuffle_seed = 0.3, seed
    frame = run_cases(ctx, cases, "t")
    # its kernel's pace (>= 5 ms per unit of work) says it would end at >= 0.55 s, past the 0.3 s budget
    assert 100.0 not in set(frame["flops"])
    assert (frame["flops"] == 1.0).sum() >= 10


def test_overrun_estimate_follows_the_kernels_pace():
    from predictor.timing.calibration.base import case_work, would_overrun

    assert case_work({"flops": 2e9}) == 2e9 and case_work({"bytes": 8.0}) == 8.0 and case_work({"m": 3}) == 0.0
    pace = [1.0, 1e9]  # 1 s per GFLOP so far
    assert would_overrun({"flops": 2e9}, pace, elapsed_s=9.0, budget_s=10.0)
    assert not would_overrun({"flops": 5e8}, pace, elapsed_s=9.0, budget_s=10.0)
    assert not would_overrun({"flops": 2e9}, None, elapsed_s=9.0, budget_s=10.0)  # no pace yet
    assert not would_overrun({"m": 4}, pace, elapsed_s=9.0, budget_s=10.0)  # no work measure
