"""A captured run prepared for what-if transforms: per-step graphs with the profiler's cost removed.

:func:`annotate` cuts a captured run into per-step graphs whose tasks know their shapes
(:func:`~predictor.sources.traces.step_graphs.step_graphs`) and removes what the profiler added to each
task (:mod:`~predictor.sources.traces.profiler_cost`). When the capture recorded unprofiled iterations,
the per-event cost is the one whose removal makes the simulated step meet them (:func:`solve_cost`);
else the trace's own estimates stand. :func:`combine_captures` does the same over several captures of
one configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from predictor.graph import ExecutionGraph
from predictor.graph.edit import AUX_KEY
from predictor.simulate import simulate
from predictor.sources.traces.build import ReplayGraph
from predictor.sources.traces.errors import TraceError
from predictor.sources.traces.load import TraceSet
from predictor.sources.traces.profiler_cost import (
    HOST_TIME_KINDS,
    ProfilerCost,
    corrected_durations,
    gap_cost,
    profiled_extra_faults,
    remove_profiler,
    step_records,
    unprofiled_iteration_s,
)
from predictor.sources.traces.step_graphs import StepGraphs, combine_steps, step_graphs

__all__ = ["AnnotatedTrace", "annotate", "combine_captures", "solve_cost", "captures_unprofiled_s",
           "HOST_BOUND_RATIO", "FAULT_NOTE_SHARE", "faults_worth_noting"]


@dataclass
class AnnotatedTrace:
    """Per-step graphs of a captured run, ready for :mod:`predictor.whatif.apply`.

    ``steps``: one graph per ProfilerStep (all ranks), task durations profiler-corrected;
    ``step_names``; ``measured_step_s``: traced (profiled) step time, slowest rank;
    ``unprofiled_s``: median wall time of the capture's unprofiled iterations (None if it
    recorded none); ``profiler_cost_s``: per-event cost removed and ``profiler_cost_source``;
    ``base_batch`` and ``batch_source``; ``host_mode``: the ranks ran on the CPU;
    ``counts``: kernel tasks by how their batch dependence was found; ``notes``;
    ``combined``: when every step has the same tasks, one graph with the per-task ``combine``
    statistic (``median`` by default, robust to a disturbed step; ``min``) of the measured
    durations — and then the unprofiled iterations use the same statistic.
    """

    source: str
    steps: list[ExecutionGraph]
    step_names: list[str]
    measured_step_s: list[float]
    unprofiled_s: float | None
    profiler_cost_s: float
    profiler_cost_source: str
    base_batch: int | None
    batch_source: str
    host_mode: bool
    world_size: int
    launch_fraction: float
    counts: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    torch_threads: int | None = None
    combined: ExecutionGraph | None = None
    combine: str = "none"
    profiler_cost: ProfilerCost | None = None
    inside_estimate_s: float = 0.0
    #: the statistic of the unprofiled iterations (over captures: :func:`captures_unprofiled_s`)
    unprofiled_stat: str = "median"
    #: a CPU capture's page faults per profiled step beyond an unprofiled one, and their time (seconds)
    extra_faults_per_step: float = 0.0
    extra_fault_s: float = 0.0

    def graphs(self) -> list[ExecutionGraph]:
        """The graphs a prediction runs on: the combined step if the steps agree, else every step."""
        return [self.combined] if self.combined is not None else self.steps


def annotate(trace_set: TraceSet, rg: ReplayGraph | None = None, *, base_batch: int | None = None,
             profiler_cost_s: float | None = None, combine: str = "median") -> AnnotatedTrace:
    """Split, parameterise and annotate the steps of a captured run, and remove the profiler's cost.

    ``rg``: its replay graph (default: built); ``base_batch``: the captured batch size (default:
    detected); ``profiler_cost_s``: a given per-event cost (seconds; default: solved or estimated);
    ``combine``: ``median``, ``min`` or ``none``.

    Raises:
        TraceError: the trace has no ProfilerStep, or a step holds no tasks.
    """
    sg = step_graphs(trace_set, rg, base_batch=base_batch, combine=combine)
    stat = "min" if combine == "min" else "median"
    records = step_records(trace_set)
    unprof, threads = unprofiled_iteration_s(records, stat)
    pc = _profiler_cost(sg, trace_set, unprof, stat, profiler_cost_s)
    steps = [remove_profiler(g, pc) for g in sg.steps]
    combined = remove_profiler(sg.combined, pc) if sg.combined is not None else None
    notes = list(sg.notes)
    extra, fault_s = profiled_extra_faults(records) if sg.host_mode else (0.0, 0.0)
    if sg.measured_step_s and faults_worth_noting(fault_s, float(np.median(sg.measured_step_s))):
        notes.append(f"the profiled steps faulted {extra:.0f} more pages a step than the unprofiled ones (about "
                     f"{fault_s * 1e3:.1f} ms of a {float(np.median(sg.measured_step_s)) * 1e3:.1f} ms step); that "
                     "time stays in the kernels that wrote fresh memory, and a batch change scales it with them")
    return AnnotatedTrace(
        source=sg.source, steps=steps, step_names=sg.step_names, measured_step_s=sg.measured_step_s,
        unprofiled_s=unprof, profiler_cost_s=pc.per_event_s, profiler_cost_source=pc.source,
        base_batch=sg.base_batch, batch_source=sg.batch_source, host_mode=sg.host_mode,
        world_size=sg.world_size, launch_fraction=sg.launch_fraction, counts=sg.counts, notes=notes, torch_threads=threads,
        combined=combined, combine=combine if combined is not None else "none", profiler_cost=pc,
        inside_estimate_s=sg.inside_estimate_s, unprofiled_stat=stat, extra_faults_per_step=extra,
        extra_fault_s=fault_s,
    )


def captures_unprofiled_s(per_capture_s: list[float], how: str, host_mode: bool) -> float:
    """The unprofiled iteration (seconds) several captures of one configuration are solved against: the
    ``min`` over the captures' own statistic for ``how="min"`` or CPU captures, else their median.

    A CPU capture's unprofiled iterations are wall times of the whole step, which hold every slice the
    scheduler gave other processes while it ran; a 12-40 ms step on a shared 2-core VM at load 5 is
    preempted in most of them, so a capture taken during a burst reads slower throughout, while the
    per-task medians over all captures' steps drop the preempted tasks. A target that high leaves profiler
    cost in the host tasks, which do not grow with the batch: the least disturbed capture is the consistent
    target (GRU batch x4 ratio error -28.0 % -> +2.0 % on one kept run of ``whatif_models.py``)."""
    return float(min(per_capture_s) if how == "min" or host_mode else np.median(per_capture_s))


def _profiler_cost(sg: StepGraphs, trace_set: TraceSet, unprof: float | None, stat: str,
                   given_s: float | None) -> ProfilerCost:
    """The per-event profiler cost: given; solved against the unprofiled iterations; else estimated."""
    inside = sg.inside_estimate_s
    if given_s is not None:
        return ProfilerCost(0.0, float(given_s), source="given")
    if unprof is not None:
        pool = [sg.combined] if sg.combined is not None else sg.steps
        fits = [solve_cost(g, unprof, sg.launch_fraction, inside) for g in pool]
        pc = fits[len(fits) // 2]
        return ProfilerCost(pc.inside_s, pc.before_s, pc.host_scale,
                            f"(P - U) / events: profiled step P vs the capture's unprofiled iterations U "
                            f"({stat} {unprof * 1e3:.3f} ms); "
                            f"{pc.inside_s * 1e6:.2f} µs of it inside an event, the rest before it")
    if sg.host_mode:
        return ProfilerCost(inside, gap_cost(trace_set),
                            source="estimated from the trace (trivial leaf ops inside "
                            "an event + sibling gaps before it): no unprofiled iterations recorded")
    return ProfilerCost(gap_cost(trace_set), 0.0,
                        source="per-CPU-op cost of extract_overheads (sibling gaps; "
                        "Lin et al. 2022 fallback): no unprofiled iterations recorded")


#: a CPU capture's extra page-fault time under the profiler is noted when above this share of the profiled step
FAULT_NOTE_SHARE = 0.05


def faults_worth_noting(fault_s: float, profiled_step_s: float) -> bool:
    """Whether ``fault_s`` seconds of extra page faults a profiled step of ``profiled_step_s`` are worth saying
    (above :data:`FAULT_NOTE_SHARE` of the step)."""
    return fault_s > FAULT_NOTE_SHARE * profiled_step_s

#: a GPU capture's replay above its unprofiled step is taken for profiler time left on the host (and removed
#: past the mean per-event cost) only when the host's span exceeds this multiple of the busiest stream's
#: kernel time; nearer balance the excess may be the simulated GPU tail
HOST_BOUND_RATIO = 1.5


def _bisect(exceeds, lo: float, hi: float, steps: int = 30) -> tuple[float, float]:
    """Narrow ``[lo, hi]`` (``exceeds(lo)`` True, ``exceeds(hi)`` False) by ``steps`` halvings."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if exceeds(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def solve_cost(g: ExecutionGraph, target_s: float, launch_fraction: float, inside_s: float) -> ProfilerCost:
    """The :class:`ProfilerCost` whose removal makes the simulated step last ``target_s``:
    ``(P - U) / E`` per event over the events of the thread holding the step markers, of which
    ``inside_s`` (at most) inside the event and the rest before it; where clipping at zero
    leaves some in place, both are raised together (at most 3x, bisection), and what is still
    left comes off the host-time tasks. With GPU streams the cost is found by bisection on the
    simulated step up to ``(P - U) / E``; beyond it only when the step is clearly host-bound (the
    host's span over :data:`HOST_BOUND_RATIO` x the busiest stream's kernel time at the mean cost, and
    with the main thread's host-time tasks removed the step falls below ``U``), as above but with the
    host-time scale also found by bisection (host time overlaps the streams); otherwise the GPU (or
    the simulated GPU tail) bounds the step and the mean cost stays."""
    aux = g.meta[AUX_KEY]

    def it(pc: ProfilerCost) -> float:
        return simulate(g, corrected_durations(g, pc), launch_fraction=launch_fraction).iteration_s

    p_s = it(ProfilerCost(0.0, 0.0))
    if p_s <= target_s:
        return ProfilerCost(0.0, 0.0)
    marker = g.kind_mask("marker")
    main = int(g.proc[np.flatnonzero(marker)[0]]) if marker.any() else int(np.bincount(g.proc).argmax())
    events = float(aux["prof_events"][g.proc == main].sum())
    c0 = (p_s - target_s) / max(events, 1.0)
    inside = min(max(inside_s, 0.0), c0)

    def split(c: float) -> ProfilerCost:
        share = inside / c0 if c0 > 0 else 0.0
        return ProfilerCost(c * share, c * (1.0 - share))

    host = g.kind_mask(*HOST_TIME_KINDS) & (g.proc == main)
    gpu = bool(g.is_gpu().any())
    pc = split(c0)
    tl = simulate(g, corrected_durations(g, pc), launch_fraction=launch_fraction)  # the step at the mean cost
    if gpu:
        if tl.iteration_s <= target_s:
            lo, hi = _bisect(lambda c: it(split(c)) > target_s, 0.0, c0)
            return split(0.5 * (lo + hi))
        floor = corrected_durations(g, split(3.0 * c0))
        floor[host] = 0.0
        if (tl.host_span_s() <= HOST_BOUND_RATIO * tl.kernel_sum_s()
                or simulate(g, floor, launch_fraction=launch_fraction).iteration_s >= target_s):
            return pc  # the GPU (or what the correction cannot touch) bounds the step: keep the mean cost
        # clearly host-bound: clipping at zero left profiler time on the host; as on a CPU graph below
    if tl.iteration_s > target_s:
        # clipping at zero left some cost in place (events cheaper than the mean): raise the
        # per-event cost until the step meets U (bisection, at most 3x), then host time
        if it(split(3.0 * c0)) > target_s:
            pc = split(3.0 * c0)
        else:
            pc = split(_bisect(lambda c: it(split(c)) > target_s, c0, 3.0 * c0)[1])
    left = it(pc) - target_s
    if left > 1e-9:
        if gpu:  # host time overlaps the streams: the scale that meets U, by bisection
            def scaled(s: float) -> ProfilerCost:
                return ProfilerCost(pc.inside_s, pc.before_s, s)

            return scaled(_bisect(lambda s: it(scaled(s)) <= target_s, 0.0, 1.0)[0])
        d = corrected_durations(g, pc)
        hs = float(d[host].sum())
        if hs > 0:
            pc = ProfilerCost(pc.inside_s, pc.before_s, max(0.0, 1.0 - left / hs))
    return pc


def combine_captures(traces: list[AnnotatedTrace], how: str = "median") -> AnnotatedTrace:
    """One :class:`AnnotatedTrace` from several captures of the same configuration: the
    per-task ``how`` (median or min) of the measured durations over every step of every
    capture, and the same statistic of their unprofiled iterations, with the profiler cost
    solved again on that graph.

    Raises:
        TraceError: the captures' steps do not have the same tasks.
    """
    if not traces:
        raise TraceError("nothing to combine")
    if len(traces) == 1:
        return traces[0]
    steps = [g for t in traces for g in t.steps]
    combined = combine_steps(steps, how)
    if combined is None:
        raise TraceError("the captures differ in their tasks; they cannot be combined")
    unprof = [t.unprofiled_s for t in traces if t.unprofiled_s is not None]
    first = traces[0]
    if unprof:
        u = captures_unprofiled_s(unprof, how, first.host_mode)
        pc = solve_cost(combined, u, first.launch_fraction, first.inside_estimate_s)
        pc = ProfilerCost(pc.inside_s, pc.before_s, pc.host_scale,
                          f"(P - U) / events over {len(traces)} captures (U = {how} unprofiled iteration, "
                          f"{u * 1e3:.3f} ms); {pc.inside_s * 1e6:.2f} µs of it inside an event, the rest before it")
    else:
        u, pc = None, first.profiler_cost
    combined = remove_profiler(combined, pc)
    return AnnotatedTrace(
        source=first.source, steps=[remove_profiler(g, pc) for g in steps],
        step_names=[n for t in traces for n in t.step_names],
        measured_step_s=[m for t in traces for m in t.measured_step_s], unprofiled_s=u, profiler_cost_s=pc.per_event_s,
        profiler_cost_source=pc.source, base_batch=first.base_batch, batch_source=first.batch_source,
        host_mode=first.host_mode, world_size=first.world_size, launch_fraction=first.launch_fraction,
        counts=dict(first.counts), notes=list(first.notes) + [f"combined {len(traces)} captures"],
        torch_threads=first.torch_threads, combined=combined, combine=how, profiler_cost=pc,
        inside_estimate_s=first.inside_estimate_s,
        unprofiled_stat=f"{first.unprofiled_stat} of the fastest capture" if first.host_mode and how != "min"
        else first.unprofiled_stat,
        extra_faults_per_step=float(np.median([t.extra_faults_per_step for t in traces])),
        extra_fault_s=float(np.median([t.extra_fault_s for t in traces])),
    )
