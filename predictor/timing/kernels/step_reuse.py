"""The embedding step-reuse term of a prediction: a step's embedding working set, and the factor the platform's
measured step-reuse curve (or per-pooling surface) gives a table's kernels at that working set
(:mod:`predictor.timing.calibration.step_reuse` measures them). Sizes in bytes.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["reuse_factor", "reuse_factors_by_pooling", "step_working_set_bytes"]


def step_working_set_bytes(distinct_rows: np.ndarray, dim: np.ndarray, dtype_bytes: np.ndarray | float = 4.0) -> float:
    """A step's embedding working set: distinct rows x row bytes summed over its tables, bytes."""
    return float(np.sum(np.asarray(distinct_rows, float) * np.asarray(dim, float) * np.asarray(dtype_bytes, float)))


def reuse_factor(curve, x: float, which: str) -> float:
    """The step / cold factor of ``which`` (``"fwd"`` or ``"bwd"``) at a working set of ``x`` x the LLC:
    linear in log2(x) between the curve's points, the end points' factors beyond them; 1 without a curve."""
    if not curve or not math.isfinite(x) or x <= 0:
        return 1.0
    pts = np.asarray(sorted(curve), dtype=float)
    col = 1 if which == "fwd" else 2
    return float(np.interp(math.log2(x), np.log2(pts[:, 0]), pts[:, col]))


def reuse_factors_by_pooling(surface, x: float, pooling: np.ndarray, which: str) -> np.ndarray:
    """The step / cold factor of ``which`` (``"fwd"`` or ``"bwd"``) for tables of ``pooling`` lookups per
    sample in a step whose working set is ``x`` x the LLC: per pooling of the surface linear in log2(x) as
    :func:`reuse_factor`, then linear in log2(pooling) between the surface's poolings (the nearest end's
    factor outside them, and for a pooling of 0 or unknown). Ones without a surface."""
    pooling = np.asarray(pooling, dtype=float)
    if not surface or not math.isfinite(x) or x <= 0:
        return np.ones(pooling.shape)
    pts = np.asarray(surface, dtype=float)
    col = 2 if which == "fwd" else 3
    levels = np.unique(pts[:, 1])
    at_x = np.array([reuse_factor([[r[0], r[col], r[col]] for r in pts[pts[:, 1] == p]], x, "fwd")
                     for p in levels])
    p = np.where(np.isfinite(pooling) & (pooling > 0), pooling, levels[0])
    return np.interp(np.log2(np.clip(p, levels[0], levels[-1])), np.log2(levels), at_x)
