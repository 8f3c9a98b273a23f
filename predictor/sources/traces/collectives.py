"""Collectives of a single-rank trace of a multi-rank job, priced without the absent peers' waits.

In a trace of one rank out of N (``recsys_a100_rank3of8``, ``resnet50_ddp_a100_rank0of2``) each NCCL
kernel's measured duration is its transfer plus the time it waited for the slowest peer to arrive
(and, where it shares the SMs with compute, the slowdown of that). With every rank's trace the
replay recomputes the wait (collective groups end together); without them it cannot, so a measured
duration would carry a wait into the simulation. :func:`price_collectives` re-prices each such
kernel from its message size with the collective model (:class:`PiecewiseCollective`: NCCL's cost
model on the trace's GPU from the catalog), capped by the measured duration (the transfer happened
inside that kernel); the rest — measured minus priced — is the *peer wait*, reported per step.

Modes (``tuner replay --collectives``):

* ``modelled`` (default): the simulated kernel lasts the priced transfer; every duration the replay
  keeps is a kernel's or a host compute segment's, never a wait.
* ``measured``: the kernels keep their measured durations, waits included (the replay reproduces
  the measured step; the peer wait is still reported).

A kernel whose message size the trace does not record (older Kineto, no ``In msg nelems``) or whose
GPU is not in the catalog keeps its measured duration, with a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from predictor.graph import Category, ExecutionGraph

if TYPE_CHECKING:  # the catalog (pydantic) loads only for a trace that needs it: 0.1 s of a replay's imports
    from predictor.timing.platforms.schema import Platform

__all__ = ["COLLECTIVE_MODES", "CollectivePricing", "platform_for_devices", "price_collectives"]

#: ``tuner replay --collectives`` values; the first is the default
COLLECTIVE_MODES = ("modelled", "measured")
#: parts of a catalog key that name a memory size or a form factor, not the chip
_VARIANT_PARTS = ("sxm", "sxm2", "sxm4", "sxm5", "pcie", "nvl")


@dataclass
class CollectivePricing:
    """The collectives of a replay graph that have no peers in the traces, priced by the collective model.

    ``tasks``: their task indices; ``measured_s`` / ``priced_s``: measured duration and the priced transfer
    (model time capped by the measured one), seconds; ``model_s``: the model's own time; ``platform``: the
    catalog key used (None: none found); ``unpriced``: such collectives that keep their measured duration
    (no message size, or no platform).
    """

    mode: str
    platform: str | None
    tasks: np.ndarray
    measured_s: np.ndarray
    priced_s: np.ndarray
    model_s: np.ndarray
    unpriced: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def wait_s(self) -> np.ndarray:
        """Per priced task, measured minus priced seconds: the wait for the peers (>= 0)."""
        return self.measured_s - self.priced_s

    def durations(self, base: np.ndarray) -> np.ndarray:
        """``base`` (seconds per task) with the priced transfers in place of the measured durations in
        ``modelled`` mode; ``base`` itself in ``measured`` mode."""
        if self.mode != "modelled" or not self.tasks.size:
            return base
        out = base.copy()
        out[self.tasks] = self.priced_s
        return out

    def as_dict(self) -> dict:
        """JSON-ready summary (``tuner replay --json``: ``collectives``)."""
        return {"mode": self.mode, "platform": self.platform, "priced": int(self.tasks.size),
                "unpriced": int(self.unpriced), "measured_s": float(self.measured_s.sum()),
                "priced_s": float(self.priced_s.sum()), "peer_wait_s": float(self.wait_s.sum()),
                "notes": list(self.notes)}


def platform_for_devices(names: list[str]) -> Platform | None:
    """The catalog GPU whose key's chip parts all appear in the first device name (``NVIDIA
    A100-PG509-200`` -> ``a100-40gb``; a memory size in the key breaks ties), else None."""
    from predictor.timing.platforms import load_catalog

    if not names:
        return None
    dev = names[0].lower()
    flat = dev.replace(" ", "")
    best: tuple[int, int] | None = None
    choice = None
    for i, (key, p) in enumerate(load_catalog().items()):
        if p.kind != "gpu":
            continue
        parts = key.split("-")
        chip = [t for t in parts if t not in _VARIANT_PARTS and not t.endswith("gb")]
        if not chip or not all(t in flat for t in chip):
            continue
        score = (sum(t in flat for t in parts if t not in chip), -i)
        if best is None or score > best:
            best, choice = score, p
    return choice


def price_collectives(graph: ExecutionGraph, world_size: int, devices: list[str], *, mode: str = "modelled",
                      platform: Platform | None = None) -> CollectivePricing:
    """The :class:`CollectivePricing` of ``graph`` (built from traces of a ``world_size``-rank job whose GPU
    is named ``devices``); ``platform`` overrides the catalog GPU found from ``devices``."""
    if mode not in COLLECTIVE_MODES:
        raise ValueError(f"collectives mode {mode!r}: expected one of {', '.join(COLLECTIVE_MODES)}")
    g = graph
    alone = g.is_gpu() & (g.category == Category.COMMUNICATION) & (g.group < 0)
    if world_size <= g.n_ranks:  # every rank's trace is here: the simulator recomputes the waits
        alone &= False
    idx = np.flatnonzero(alone)
    empty = np.zeros(0)
    if not idx.size:
        return CollectivePricing(mode, None, idx, empty, empty, empty)
    msg = g.param("msg_bytes")[idx]
    plat = platform or platform_for_devices(devices)
    notes: list[str] = []
    known = np.isfinite(msg) & (msg > 0)
    if plat is None:
        notes.append(f"{idx.size} collectives without their peers keep their measured durations: the GPU "
                     f"{devices[0] if devices else '(unnamed)'!r} is not in the catalog")
        known &= False
    elif not known.all():
        notes.append(f"{int((~known).sum())} collectives without their peers keep their measured durations: "
                     "the trace records no message size for them (no 'In msg nelems')")
    priced = idx[known]
    measured = g.duration[priced].copy()
    model = _model_seconds(g, priced, plat) if priced.size else empty
    return CollectivePricing(mode, plat.name if plat is not None and priced.size else None, priced, measured,
                             np.minimum(model, measured), model, unpriced=int(idx.size - priced.size), notes=notes)


def _model_seconds(g: ExecutionGraph, idx: np.ndarray, platform: Platform) -> np.ndarray:
    """The collective model's seconds for tasks ``idx`` of ``g`` (grouped by op kind, as the timing layer
    calls a model)."""
    from predictor.timing.kernels.base import TaskView
    from predictor.timing.kernels.collective import PiecewiseCollective

    model = PiecewiseCollective()
    out = np.empty(idx.size)
    kinds = g.kind[idx]
    for k in np.unique(kinds).tolist():
        sel = kinds == k
        out[sel] = model.predict(TaskView.from_graph(g, idx[sel], g.kinds[k]), platform)
    return out
