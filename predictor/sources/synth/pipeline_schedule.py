"""Pipeline schedules: the order in which one pipeline stage runs its forward and backward passes.

A schedule is a list of :class:`Step` ``(phase, micro_batch, chunk)`` for one stage (one
pipeline rank), in execution order. ``chunk`` is the model chunk (virtual stage) the step
belongs to: always 0 without interleaving; with ``v`` chunks per rank, chunk ``c`` of rank
``s`` is virtual stage ``c * p + s`` (Narayanan et al. SC21 §2.2.2).

* :func:`one_f_one_b` — PipeDream-Flush / 1F1B (Narayanan et al. SC21 §2.2.1): stage ``s`` of
  ``p`` runs ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one
  backward, then drains the remaining backwards.
* :func:`interleaved` — the interleaved 1F1B schedule (SC21 §2.2.2), ordered the way
  Megatron-LM's ``forward_backward_pipelining_with_interleaving`` orders it: virtual
  micro-batch ``k`` runs chunk ``(k mod p·v) div p`` (backwards in reverse chunk order), with
  ``2 (p - s - 1) + (v - 1) p`` warm-up forwards; it needs ``m`` divisible by ``p``.

:func:`peak_in_flight` counts the most forwards whose backward has not run yet — the number
of micro-batch activations a stage holds at once (1F1B: ``min(p - s, m)``), which the
memory model multiplies by the activation size of a chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = ["Step", "ScheduleError", "one_f_one_b", "interleaved", "schedule", "peak_in_flight", "bubble_fraction",
           "pipeline_latency"]


class ScheduleError(ValueError):
    """The schedule cannot be built for these sizes (one line naming the problem)."""


class Step(NamedTuple):
    """One pass of one micro-batch through one model chunk: ``phase`` is ``"F"`` or ``"B"``."""

    phase: str
    micro_batch: int
    chunk: int


def one_f_one_b(p: int, m: int, stage: int) -> list[Step]:
    """1F1B order of ``stage`` (0-based) in a ``p``-stage pipeline with ``m`` micro-batches."""
    _check(p, m, stage, 1)
    warm = min(p - stage - 1, m)
    out = [Step("F", i, 0) for i in range(warm)]
    for k in range(m - warm):
        out.append(Step("F", warm + k, 0))
        out.append(Step("B", k, 0))
    out += [Step("B", k, 0) for k in range(m - warm, m)]
    return out


def interleaved(p: int, m: int, v: int, stage: int) -> list[Step]:
    """Interleaved 1F1B order of ``stage`` with ``v`` model chunks per rank (Megatron-LM order)."""
    _check(p, m, stage, v)
    if v == 1:
        return one_f_one_b(p, m, stage)
    if m % p:
        raise ScheduleError(f"the interleaved schedule needs micro-batches ({m}) divisible by pipeline stages ({p})")
    total = m * v
    # with m == p Megatron runs every forward first, then every backward
    warm = total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)

    def fwd(k: int) -> Step:
        return Step("F", (k // (p * v)) * p + k % p, (k % (p * v)) // p)

    def bwd(k: int) -> Step:
        return Step("B", (k // (p * v)) * p + k % p, v - 1 - (k % (p * v)) // p)

    out = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        out.append(fwd(warm + k))
        out.append(bwd(k))
    out += [bwd(k) for k in range(total - warm, total)]
    return out


def schedule(kind: str, p: int, m: int, stage: int, v: int = 1) -> list[Step]:
    """The order of ``stage`` under ``kind`` (``"1f1b"`` or ``"interleaved"``)."""
    if kind == "1f1b":
        return one_f_one_b(p, m, stage)
    if kind == "interleaved":
        return interleaved(p, m, v, stage)
    raise ScheduleError(f"unknown pipeline schedule {kind!r}; known: 1f1b, interleaved")


def peak_in_flight(steps: list[Step]) -> int:
    """Most forwards (micro-batch x chunk) alive at once: run, backward not yet run."""
    alive = peak = 0
    for st in steps:
        alive += 1 if st.phase == "F" else -1
        peak = max(peak, alive)
    return peak


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Idle share of the ideal pipeline, ``(p - 1) / (v m)`` relative to compute (SC21 §2.2)."""
    return (p - 1) / (v * m)


def _check(p: int, m: int, stage: int, v: int) -> None:
    if p < 1 or m < 1 or v < 1:
        raise ScheduleError(f"pipeline sizes must be positive (stages={p}, micro-batches={m}, chunks={v})")
    if not 0 <= stage < p:
        raise ScheduleError(f"stage {stage} is outside 0..{p - 1}")


def pipeline_latency(stage_latencies_s: Sequence[float], n_micro: int) -> float:
    """PredTOP eq. 4 and Alpa's inter-operator objective: ``sum(t) + (n_micro - 1) * max(t)`` seconds."""
    t = np.asarray(stage_latencies_s, dtype=float)
    if t.size == 0:
        raise ValueError("a pipeline needs at least one stage")
    if n_micro < 1:
        raise ValueError(f"n_micro must be >= 1, got {n_micro}")
    if np.any(t < 0) or not np.all(np.isfinite(t)):
        raise ValueError("stage latencies must be finite and >= 0 seconds")
    return float(t.sum() + (n_micro - 1) * t.max())
