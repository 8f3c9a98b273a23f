"""Host overheads T1..T5 from a profiled run: the profiler's start-up steps can be discarded."""

from __future__ import annotations

import torch

from predictor.timing.calibration.overheads import measure_overheads


def test_discarded_profiler_steps_keep_ops_as_roots():
    """With a profiler schedule every iteration sits under a ProfilerStep range; the ops below it,
    not the range, are the top-level ops (one T2 sample per op with a launch, not one per iteration)."""
    plain = measure_overheads(torch.device("cpu"), iterations=3, warmup=1, batch=32)
    steady = measure_overheads(torch.device("cpu"), iterations=3, warmup=1, batch=32, profiler_warmup=2)
    assert steady["profiler_warmup"] == 2 and plain["profiler_warmup"] == 0
    assert steady["samples"]["t2_s"] > 5 * steady["iterations"]
    assert 0.5 < steady["samples"]["t2_s"] / plain["samples"]["t2_s"] < 2.0
    for k in ("t1_s", "t2_s", "t3_s"):
        assert steady[k] >= 0.0
