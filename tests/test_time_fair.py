"""run_cases' time-fair first round: every kernel of a family gets an equal share of the time."""

from __future__ import annotations

import time

import numpy as np
import torch

from predictor.calibration.base import BenchContext, run_cases, time_fair_order
from predictor.calibration.gemm import GemmBenchmark
from predictor.calibration.timing import Timer


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
