"""Error metrics as the papers report them (percentages)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["abs_pct_errors", "geomean_abs_pct_error", "mean_abs_pct_error", "max_abs_pct_error"]


def abs_pct_errors(predicted: Sequence[float], actual: Sequence[float]) -> np.ndarray:
    """|predicted - actual| / actual, in percent, element-wise."""
    p = np.asarray(predicted, dtype=float)
    a = np.asarray(actual, dtype=float)
    return np.abs(p - a) / a * 100.0


def geomean_abs_pct_error(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Geometric mean of the absolute percentage errors (GMAE of Lin et al.); zeros clipped to 1e-3 %."""
    err = np.maximum(abs_pct_errors(predicted, actual), 1e-3)
    return float(math.exp(np.mean(np.log(err)))) if err.size else float("nan")


def mean_abs_pct_error(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Arithmetic mean of the absolute percentage errors (MAPE)."""
    err = abs_pct_errors(predicted, actual)
    return float(err.mean()) if err.size else float("nan")


def max_abs_pct_error(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Largest absolute percentage error."""
    err = abs_pct_errors(predicted, actual)
    return float(err.max()) if err.size else float("nan")
