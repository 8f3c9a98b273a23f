"""Pipeline iteration time from stage latencies (seconds): PredTOP's formula and a 1F1B schedule.

* :func:`pipeline_latency` — PredTOP eq. 4 (and Alpa's inter-operator objective):
  ``T = sum_i t_i + (B - 1) * max_i t_i`` for stage latencies ``t_i`` (forward + backward of one
  micro-batch) and ``B`` micro-batches; inter-stage communication ignored as in the paper.
* :func:`one_f_one_b` — the 1F1B (PipeDream-flush) schedule played out with separate forward
  and backward latencies per stage and an optional point-to-point transfer time between
  neighbouring stages: stage ``s`` of ``S`` runs ``min(S - s - 1, B)`` warm-up forwards, then
  alternates one forward / one backward, then drains the remaining backwards. ``F(s, m)``
  waits for ``F(s-1, m)``, ``B(s, m)`` for ``B(s+1, m)`` (and for ``F(s, m)``), each plus the
  transfer time. With equal stages (``f``, ``b``) and no transfer this gives
  ``(B + S - 1)(f + b)``, which is eq. 4 again.
* :func:`gpipe` — all forwards, then all backwards (for comparison).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from predictor.sources.synth.pipeline_schedule import one_f_one_b as schedule_1f1b
from predictor.sources.synth.pipeline_schedule import pipeline_latency

__all__ = ["PipelineSchedule", "gpipe", "one_f_one_b", "one_f_one_b_order", "pipeline_latency"]


@dataclass
class PipelineSchedule:
    """A played-out schedule: ``iteration_s``, and per op ``(stage, micro, 'F'|'B', start_s, end_s)``."""

    iteration_s: float
    ops: list[tuple[int, int, str, float, float]]
    busy_s: np.ndarray  #: per stage, seconds spent computing

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the stages' time between 0 and ``iteration_s``."""
        n = len(self.busy_s)
        return float(1.0 - self.busy_s.sum() / (n * self.iteration_s)) if self.iteration_s > 0 else 0.0


def one_f_one_b_order(n_stages: int, n_micro: int, stage: int) -> list[tuple[str, int]]:
    """The op order of ``stage`` under 1F1B: ``[('F', 0), ('F', 1), ('B', 0), ...]``
    (the order of :func:`predictor.sources.synth.pipeline_schedule.one_f_one_b`, without chunks)."""
    return [(st.phase, st.micro_batch) for st in schedule_1f1b(n_stages, n_micro, stage)]


def _play(
    fwd: np.ndarray, bwd: np.ndarray, orders: list[list[tuple[str, int]]], n_micro: int, p2p_s: float
) -> PipelineSchedule:
    s_count = len(fwd)
    done = {"F": np.full((s_count, n_micro), np.nan), "B": np.full((s_count, n_micro), np.nan)}
    ptr = [0] * s_count
    front = np.zeros(s_count)
    ops: list[tuple[int, int, str, float, float]] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(s_count):
            while ptr[s] < len(orders[s]):
                kind, m = orders[s][ptr[s]]
                if kind == "F":
                    dep = 0.0 if s == 0 else done["F"][s - 1, m] + p2p_s
                else:
                    dep = (
                        done["F"][s, m]
                        if s == s_count - 1
                        else max(done["B"][s + 1, m] + p2p_s, done["F"][s, m])
                    )
                if np.isnan(dep):
                    break
                start = max(front[s], dep)
                end = start + (fwd[s] if kind == "F" else bwd[s])
                done[kind][s, m] = end
                front[s] = end
                ops.append((s, m, kind, float(start), float(end)))
                ptr[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for the schedules built here
            raise RuntimeError("pipeline schedule deadlocked")
    busy = n_micro * (fwd + bwd)
    return PipelineSchedule(float(front.max()), ops, busy)


def _check(fwd_s: Sequence[float], bwd_s: Sequence[float], n_micro: int) -> tuple[np.ndarray, np.ndarray]:
    f = np.asarray(fwd_s, dtype=float)
    b = np.asarray(bwd_s, dtype=float)
    if f.shape != b.shape or f.ndim != 1 or f.size == 0:
        raise ValueError("fwd_s and bwd_s must be equal-length, non-empty sequences (one entry per stage)")
    if n_micro < 1:
        raise ValueError(f"n_micro must be >= 1, got {n_micro}")
    if np.any(f < 0) or np.any(b < 0):
        raise ValueError("stage latencies must be >= 0 seconds")
    return f, b


def one_f_one_b(
    fwd_s: Sequence[float], bwd_s: Sequence[float], n_micro: int, p2p_s: float = 0.0
) -> PipelineSchedule:
    """Play the 1F1B schedule for per-stage forward/backward seconds and ``n_micro`` micro-batches."""
    f, b = _check(fwd_s, bwd_s, n_micro)
    orders = [one_f_one_b_order(len(f), n_micro, s) for s in range(len(f))]
    return _play(f, b, orders, n_micro, p2p_s)


def gpipe(
    fwd_s: Sequence[float], bwd_s: Sequence[float], n_micro: int, p2p_s: float = 0.0
) -> PipelineSchedule:
    """Play GPipe: every stage runs all forwards, then all backwards (last micro-batch first)."""
    f, b = _check(fwd_s, bwd_s, n_micro)
    order = [("F", m) for m in range(n_micro)] + [("B", m) for m in reversed(range(n_micro))]
    return _play(f, b, [order] * len(f), n_micro, p2p_s)
