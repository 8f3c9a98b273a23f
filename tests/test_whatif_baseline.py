"""Which unprofiled iterations a what-if baseline is solved against: the minimum on a CPU capture (a step's
wall time holds the slices other processes took), the median on a GPU capture."""

from __future__ import annotations

from predictor.whatif.annotate import unprofiled_statistic


def test_cpu_captures_use_the_fastest_unprofiled_iteration():
    assert unprofiled_statistic("median", host_mode=True) == "min"
    assert unprofiled_statistic("none", host_mode=True) == "min"


def test_gpu_captures_keep_the_median_unless_min_is_asked():
    assert unprofiled_statistic("median", host_mode=False) == "median"
    assert unprofiled_statistic("min", host_mode=False) == "min"
