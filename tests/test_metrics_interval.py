"""The GMAE's bootstrap interval and the error table's column for it."""

from __future__ import annotations

import math

import numpy as np

from predictor.metrics import geomean_abs_pct_error, geomean_abs_pct_error_interval
from predictor.timing.calibrate import error_table_markdown


def test_interval_brackets_the_gmae_and_narrows_with_samples():
    rng = np.random.default_rng(3)
    widths = []
    for n in (20, 80, 320):
        actual = np.ones(n)
        pred = 1.0 + rng.normal(0.0, 0.06, n)
        lo, hi = geomean_abs_pct_error_interval(pred, actual)
        assert lo < geomean_abs_pct_error(pred, actual) < hi
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]


def test_interval_is_seeded_and_nan_for_one_sample():
    p, a = [1.1, 0.95, 1.02, 0.9], [1.0] * 4
    assert geomean_abs_pct_error_interval(p, a) == geomean_abs_pct_error_interval(p, a)
    assert all(math.isnan(v) for v in geomean_abs_pct_error_interval([1.1], [1.0]))


def test_table_shows_the_interval_only_when_present():
    row = {"kernel": "k", "samples": 10, "test": 2, "gmae_pct": 4.0, "mape_pct": 5.0, "std_pct": 1.0,
           "max_pct": 9.0, "model": "m"}
    assert "interval" not in error_table_markdown([row])
    md = error_table_markdown([{**row, "gmae_ci90_pct": [3.1, 5.6]}, {**row, "kernel": "old"}])
    assert "| 3.1-5.6 |" in md and "GMAE 90 % interval" in md
