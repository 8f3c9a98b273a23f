"""Error metrics as the papers report them (percentages)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["abs_pct_errors", "geomean_abs_pct_error", "geomean_abs_pct_error_interval", "mean_abs_pct_error",
           "max_abs_pct_error"]


def abs_pct_errors(predicted: Sequence[float], actual: Sequence[float]) -> np.ndarray:
    """|predicted - actual| / actual, in percent, element-wise."""
    p = np.asarray(predicted, dtype=float)
    a = np.asarray(actual, dtype=float)
    return np.abs(p - a) / a * 100.0


def geomean_abs_pct_error(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Geometric mean of the absolute percentage errors (GMAE of Lin et al.); zeros clipped to 1e-3 %."""
    err = np.maximum(abs_pct_errors(predicted, actual), 1e-3)
    return float(math.exp(np.mean(np.log(err)))) if err.size else float("nan")


def geomean_abs_pct_error_interval(predicted: Sequence[float], actual: Sequence[float], level: float = 0.9,
                                   resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval (``level``, two-sided) of the GMAE over the samples, in percent.

    A held-out set of a few dozen samples pins its GMAE down only to a couple of points; the interval
    says which kernels lie clearly above or below a target and which cannot be told apart from it.
    ``(nan, nan)`` with fewer than two samples.
    """
    err = np.maximum(abs_pct_errors(predicted, actual), 1e-3)
    if err.size < 2:
        return float("nan"), float("nan")
    logs = np.log(err)
    idx = np.random.default_rng(seed).integers(0, err.size, size=(resamples, err.size))
    boot = np.exp(logs[idx].mean(axis=1))
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(boot, [tail, 100.0 - tail])
    return float(lo), float(hi)


def mean_abs_pct_error(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Arithmetic mean of the absolute percentage errors (MAPE)."""
    err = abs_pct_errors(predicted, actual)
    return float(err.mean()) if err.size else float("nan")


def max_abs_pct_error(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Largest absolute percentage error."""
    err = abs_pct_errors(predicted, actual)
    return float(err.max()) if err.size else float("nan")
