"""Outputs of each search space (one module per space) and what they share.

``results.json`` is always written last and atomically (:func:`atomic_write_text`: temporary
file + rename), so a killed run never leaves one that looks complete.
"""

from __future__ import annotations

import math

import numpy as np

from predictor.files import atomic_write_text

__all__ = ["atomic_write_text", "finite", "json_default"]


def json_default(x: object) -> object:
    """``json.dumps(default=...)`` for numpy scalars and arrays (everything the reports hold)."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def finite(x: object) -> object:
    """``x`` with non-finite floats (an objective without a price, an unbounded time) as None, in
    nested dicts and lists: results.json stays strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite(v) for v in x]
    return x
