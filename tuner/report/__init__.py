"""Outputs of each search space (one module per space) and what they share.

``results.json`` is always written last and atomically (:func:`atomic_write_text`: temporary
file + rename), so a killed run never leaves one that looks complete.
"""

from __future__ import annotations

import numpy as np

from predictor.files import atomic_write_text

__all__ = ["atomic_write_text", "json_default"]


def json_default(x: object) -> object:
    """``json.dumps(default=...)`` for numpy scalars and arrays (everything the reports hold)."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
