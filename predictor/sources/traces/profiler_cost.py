"""Profiler cost removed from a captured run's task durations.

Every profiled event costs time the unprofiled run does not spend — about 10 µs per op with the
execution-trace observer on this CPU — partly inside its own interval, partly just before it starts
(:class:`ProfilerCost`). Task ``i`` loses ``inside * n_i + before * m_i`` (``n_i``: events starting in
``[a, b)``, ``m_i``: in ``(a, b]``). The total per event comes from the capture itself when it recorded
iterations after its window (``rank{R}.steps.csv`` of :mod:`~predictor.sources.traces.capture`):
``(P - U) / E`` for the profiled step ``P``, the unprofiled iteration ``U`` (:func:`unprofiled_iteration_s`)
and ``E`` events, solved against the simulator by :func:`predictor.whatif.annotate.solve_cost`;
``inside`` is the median duration of trivial leaf ops (views, ``detach``; :func:`inside_cost`). Without
those iterations the sibling-gap cost of
:func:`~predictor.sources.traces.overheads.extract_overheads` stands for ``before`` (:func:`gap_cost`).

Page faults are not a per-event cost. With the profiler on, a CPU run's heap can be returned to the
system and faulted in again every step where the unprofiled run reuses it (a small Hugging Face GPT-2
at batch 32: about 15 000 faults a profiled step more, some 20 ms of a 57 ms step). That time stays in
the ops writing fresh memory; :func:`profiled_extra_faults` measures it so predictions can say so. Taken off
the kernels by the bytes they move, it made held-out batch what-ifs of ResNet, ViT, an encoder and a
GRU worse (ResNet batch x4 -6.6 % -> -13.7 %): their larger configurations fault as much unprofiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from predictor.graph import ExecutionGraph
from predictor.graph.edit import AUX_KEY
from predictor.sources.traces.kineto import EventCat
from predictor.sources.traces.load import TraceSet
from predictor.sources.traces.op_tree import OpTree

__all__ = ["ProfilerCost", "HOST_TIME_KINDS", "step_records", "unprofiled_iteration_s", "profiled_extra_faults",
           "corrected_durations",
           "gap_cost", "inside_cost", "remove_profiler"]

#: leaf ops whose own work is negligible: their duration is the profiler's cost inside one event
_TRIVIAL = ("aten::as_strided", "aten::resolve_conj", "detach", "aten::alias", "aten::view", "aten::_reshape_alias")


def step_records(ts: TraceSet) -> list[dict]:
    """The ``steps.csv`` records of the ranks of ``ts`` that have one (:func:`read_step_times`), read once for
    :func:`unprofiled_iteration_s` and :func:`profiled_extra_faults`."""
    from predictor.sources.traces.capture import read_step_times
    from predictor.sources.traces.load import archive_member_texts

    src = Path(ts.source)
    folder = src if src.is_dir() else src.parent
    # a .tar.gz of a capture folder carries its steps.csv files inside
    packed = archive_member_texts(src, ".steps.csv") if src.is_file() else {}
    out = []
    for rt in ts.ranks:
        name = f"rank{rt.rank}.steps.csv"
        p = folder / name
        if name in packed:
            out.append(read_step_times(name, text=packed[name]))
        elif p.exists():
            out.append(read_step_times(p))
    return out


def _after(values: list[float], windows: list[str]) -> list[float]:
    """The values of the iterations after the window (the first skipped when there are more than 3)."""
    after = [v for v, win in zip(values, windows, strict=True) if win == "after"]
    return after[1:] if len(after) > 3 else after


def unprofiled_iteration_s(records: list[dict], stat: str = "median") -> tuple[float | None, int | None]:
    """Wall time (``min`` or ``median``) of the iterations each rank ran after the profiler window, from the
    ranks' :func:`step_records` (slowest rank; the first one after the window is skipped when there are more
    than 3), and the torch threads they ran with."""
    meds, threads = [], None
    for d in records:
        threads = d["torch_threads"] if threads is None else threads
        vals = _after(d["wall_s"], d["window"])
        if len(vals) >= 2:
            meds.append(float(np.min(vals) if stat == "min" else np.median(vals)))
    return (max(meds) if meds else None), threads


def profiled_extra_faults(records: list[dict]) -> tuple[float, float]:
    """(extra page faults, seconds) per step the profiled iterations spent faulting pages beyond the
    unprofiled ones, from the ranks' :func:`step_records`: median faults of an active iteration - median
    after the window, times the host's cost of one fault; the rank with the most seconds; (0, 0) where
    faults were not counted."""
    worst = (0.0, 0.0)
    for d in records:
        cost = d.get("page_fault_s")
        faults = np.asarray(d.get("minor_faults", []), dtype=float)
        if not cost or faults.size != len(d["window"]) or not np.isfinite(faults).all():
            continue
        active = [f for f, win in zip(faults.tolist(), d["window"], strict=True) if win == "active"]
        after = _after(faults.tolist(), d["window"])
        if active and len(after) >= 2:
            extra = float(np.median(active)) - float(np.median(after))
            worst = max(worst, (extra, extra * cost), key=lambda x: x[1])
    return worst


@dataclass(frozen=True)
class ProfilerCost:
    """What the profiler added to a traced run (seconds per profiled event).

    ``inside_s``: inside the event's own interval; ``before_s``: just before it starts (its
    entry callbacks), so charged to whatever task holds that instant (the gap before a
    top-level op, the parent op around a child); ``host_scale``: a last factor on the host-time
    tasks (framework time between kernels, gaps) that makes the corrected step meet the
    unprofiled one where clipping at zero left some of the cost in place.
    """

    inside_s: float
    before_s: float
    host_scale: float = 1.0
    source: str = ""

    @property
    def per_event_s(self) -> float:
        return self.inside_s + self.before_s


#: task kinds of host time (framework time between kernels, gaps): what ``host_scale`` scales
HOST_TIME_KINDS = ("cpu_op", "cpu_gap")


def corrected_durations(g: ExecutionGraph, pc: ProfilerCost) -> np.ndarray:
    """Task durations of ``g`` with the profiler cost ``pc`` removed from the traced ones (``measured_raw``)."""
    aux = g.meta[AUX_KEY]
    raw = aux["measured_raw"]
    d = g.duration.copy()
    ok = np.isfinite(raw)
    n = aux["prof_events"]
    m = aux.get("prof_events_next", n)
    d[ok] = np.maximum(raw[ok] - pc.inside_s * n[ok] - pc.before_s * np.nan_to_num(m[ok]), 0.0)
    if pc.host_scale != 1.0:
        host = g.kind_mask(*HOST_TIME_KINDS) & ok
        d[host] *= pc.host_scale
    return d


def gap_cost(ts: TraceSet) -> float:
    """Per-event profiler cost between sibling ops, as :func:`extract_overheads` measures it (s)."""
    from predictor.sources.traces.overheads import LIN2022_CPU_COST_S, extract_overheads

    try:
        return float(extract_overheads(ts).profiler_cost_s.get("cpu_op", LIN2022_CPU_COST_S))
    except (KeyError, ValueError, TypeError, IndexError):
        return LIN2022_CPU_COST_S


def inside_cost(tree: OpTree) -> float:
    """Median duration of trivial leaf ops (views, ``detach``): their own work is negligible, so
    this is the profiler's cost inside one event (seconds)."""
    kt = tree.kt
    leaf = [float(kt.dur[e]) for e in tree.events.tolist()
            if kt.cat[e] == EventCat.CPU_OP and e not in tree.children and kt.names[kt.name[e]] in _TRIVIAL]
    return float(np.median(leaf)) * 1e-6 if leaf else 0.0


def remove_profiler(g: ExecutionGraph, pc: ProfilerCost) -> ExecutionGraph:
    """``g`` with its durations corrected in place (:func:`corrected_durations`)."""
    g.duration[:] = corrected_durations(g, pc)
    return g
