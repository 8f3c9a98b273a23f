"""Which unprofiled iteration several captures of one configuration are solved against: the fastest capture's
on a CPU (a step's wall time holds the slices other processes took), the median of the captures' on a GPU."""

from __future__ import annotations

import pytest

from predictor.whatif.annotate import captures_unprofiled_s


def test_cpu_captures_use_the_fastest_capture():
    assert captures_unprofiled_s([0.012, 0.010, 0.015], "median", host_mode=True) == pytest.approx(0.010)


def test_gpu_captures_use_the_median_unless_min_is_asked():
    assert captures_unprofiled_s([0.012, 0.010, 0.015], "median", host_mode=False) == pytest.approx(0.012)
    assert captures_unprofiled_s([0.012, 0.010, 0.015], "min", host_mode=False) == pytest.approx(0.010)
