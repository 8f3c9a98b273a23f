"""Batch-size change: scale every batch-dependent kernel parameter by ``s ** exponent``."""

from __future__ import annotations

import numpy as np

from predictor.graph import ExecutionGraph
from predictor.graph.edit import AUX_KEY
from predictor.whatif.common import EXP_COLS, WhatIfError, copy_all, with_meta

__all__ = ["scale_batch"]


def scale_batch(g: ExecutionGraph, factor: float) -> ExecutionGraph:
    """Scale the batch size by ``factor``: every parameter column with a batch exponent ``x``
    is multiplied by ``factor ** x`` (also ``flops``, ``bytes``, ``act_bytes``); those tasks
    are marked changed and their work ratio updated."""
    if factor <= 0:
        raise WhatIfError(f"batch factor must be positive (got {factor})")
    ed, _ = copy_all(g)
    out = ed.build()
    aux = out.meta[AUX_KEY]
    work = np.nan_to_num(aux.get("x_work", np.zeros(out.n_tasks)), nan=0.0)
    dep = work != 0
    for c in EXP_COLS:
        x = aux.get(f"x_{c}")
        if x is None or c not in out.params:
            continue
        x = np.nan_to_num(x, nan=0.0)
        sel = x != 0
        out.params[c][sel] = np.round(out.params[c][sel] * factor ** x[sel], 6)
        dep |= sel
    for c, col in (("flops", out.flops), ("bytes", out.bytes)):
        x = np.nan_to_num(aux.get(f"x_{c}", np.zeros(out.n_tasks)), nan=0.0)
        sel = x != 0
        col[sel] = col[sel] * factor ** x[sel]
    if "act_bytes" in aux:
        xa = np.nan_to_num(aux.get("x_act", np.zeros(out.n_tasks)), nan=0.0)
        aux["act_bytes"] = aux["act_bytes"] * factor ** xa
    aux["ratio"] = aux.get("ratio", np.ones(out.n_tasks)) * factor ** work
    ch = aux.get("changed", np.zeros(out.n_tasks))
    ch[dep] = 1.0
    aux["changed"] = ch
    prev = g.meta.get("whatif", {}).get("batch_factor", 1.0)
    return with_meta(out, batch_factor=prev * factor, batch_changed_tasks=int(dep.sum()))
