"""What the what-if transforms share: the error type, phase codes, aux-column helpers."""

from __future__ import annotations

import numpy as np

from predictor.graph import ExecutionGraph, ProcKind
from predictor.graph.edit import AUX_DEFAULTS, AUX_KEY, GraphEditor, aux_of
from predictor.sources.traces.batch_dependence import PARAM_EXP_COLUMNS as EXP_COLS

__all__ = ["WhatIfError", "PHASE_FWD", "PHASE_BWD", "PHASE_OPT", "MIB", "EXP_COLS", "aux_col", "ensure_aux",
           "copy_all", "with_meta", "main_procs"]

#: phases of the annotated tasks (see predictor.sources.traces.step_graphs)
PHASE_FWD, PHASE_BWD, PHASE_OPT = 1, 2, 3
MIB = float(1 << 20)


class WhatIfError(ValueError):
    """A what-if change that cannot be applied or parsed (one line naming the problem)."""


def aux_col(g: ExecutionGraph, name: str) -> np.ndarray:
    col = aux_of(g).get(name)
    return col if col is not None else np.full(g.n_tasks, AUX_DEFAULTS.get(name, np.nan))


def ensure_aux(g: ExecutionGraph, name: str) -> np.ndarray:
    """Aux column ``name`` of ``g`` (created with its default if missing), writable in place."""
    aux = g.meta.setdefault(AUX_KEY, {})
    if name not in aux:
        aux[name] = np.full(g.n_tasks, AUX_DEFAULTS.get(name, np.nan))
    return aux[name]


def copy_all(g: ExecutionGraph) -> tuple[GraphEditor, np.ndarray]:
    ed = GraphEditor(g)
    idx = np.arange(g.n_tasks)
    new = ed.copy(idx, idx.astype(np.float64))
    if g.n_edges:
        ed.edges(new[g.edge_src], new[g.edge_dst], g.edge_kind)
    return ed, new


def with_meta(g: ExecutionGraph, **kv) -> ExecutionGraph:
    g.meta.setdefault("whatif", {}).update(kv)
    return g


def main_procs(g: ExecutionGraph) -> dict[int, int]:
    """Per rank: the CPU thread holding the step markers (else its busiest CPU thread)."""
    out: dict[int, int] = {}
    marker = g.kind_mask("marker")
    for r in np.unique(g.rank).tolist():
        on = (g.rank == r) & (g.proc_kind[g.proc] == ProcKind.CPU_THREAD)
        m = np.flatnonzero(on & marker)
        if m.size:
            out[r] = int(g.proc[m[0]])
        elif on.any():
            out[r] = int(np.bincount(g.proc[on]).argmax())
    return out
