"""Kernel models fitted to a machine's undisturbed state, and the measured factor of its typical state.

A calibration times every shape in several rounds minutes apart. On a shared host the rounds
differ because of what else the machine runs (other tenants' memory traffic, frequency, the
state of the hypervisor), not because of the shape: of a sample's rounds, the fastest is the
shape's time with the least disturbance, the median is the time the machine typically gives.
Two ways to fit a model follow:

* **typical** (the default): fit each shape's median over the
  rounds. The fitting target carries the rounds' noise, and so does the held-out error.
* **fastest round**: fit each shape's fastest round (``median_s`` of the stored data: the median
  of the repeats of the fastest round). The model learns how time depends on shape from
  steadier samples; one factor per op kind, measured by the same calibration, brings its
  predictions back to the machine's typical state:

  ``factor = exp(median over the kind's training samples with >= 2 rounds of ln(median of rounds / fastest round))``

  so a step, which runs in the typical state, is not under-predicted (the plain fastest-round
  estimator read -12.8 % median on the e2e windows).

:class:`StateScaled` is that model: any calibrated :class:`~predictor.timing.kernels.base.KernelModel`
(``inner``, the fastest-round fit) times its per-kind factor (``factors``; ``"*"`` for kinds not
listed). :meth:`StateScaled.predict_undisturbed` is the inner model's prediction (seconds in the
undisturbed state), which the calibration's error table scores against each held-out shape's
fastest round.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.platforms.schema import Platform

__all__ = ["FIT_TARGETS", "FASTEST_FAMILIES", "StateScaled", "fits_fastest", "state_factor", "unwrap"]

#: what a calibration fits each benchmark row to: ``typical`` (the median of its rounds, column
#: ``seconds``), ``fastest_round`` (its fastest round, column ``median_s``, plus a state factor), or
#: ``fastest_collectives`` (the collectives' fastest passes with their state factor, every other family
#: typical: the gloo collectives' passes scatter most, and their sigmoids fit the fastest far better)
FIT_TARGETS = ("typical", "fastest_round", "fastest_collectives")
#: the benchmark families each target fits to the fastest round (None: all)
FASTEST_FAMILIES: dict[str, frozenset[str] | None] = {
    "typical": frozenset(), "fastest_round": None, "fastest_collectives": frozenset({"collectives"}),
}


def fits_fastest(target: str, family: str) -> bool:
    """Whether fit target ``target`` fits benchmark family ``family`` to its fastest round."""
    families = FASTEST_FAMILIES[target]
    return families is None or family in families


def state_factor(typical_s: np.ndarray, fastest_s: np.ndarray, rounds: np.ndarray | None = None) -> float:
    """The typical-state factor of one op kind: ``exp(median(ln(typical / fastest)))`` over its samples
    timed in at least two rounds (``rounds``; all samples when None); 1.0 when none qualifies.

    Args:
        typical_s: each sample's median over its rounds, seconds.
        fastest_s: each sample's fastest round, seconds.
        rounds: rounds each sample was timed in (a one-round sample's two estimates coincide and say
            nothing about the state; NaN where not recorded: kept).
    """
    t = np.asarray(typical_s, dtype=np.float64)
    f = np.asarray(fastest_s, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(f) & (t > 0) & (f > 0)
    if rounds is not None:
        r = np.asarray(rounds, dtype=np.float64)
        ok &= ~(r < 2)  # NaN: not recorded (collectives keep every pass), kept
    if not ok.any():
        return 1.0
    return float(max(1.0, np.exp(np.median(np.log(t[ok] / f[ok])))))


class StateScaled(KernelModel):
    """A kernel model fitted to the fastest round (``inner``) times the measured typical-state factor of
    each op kind (``factors``, ``"*"`` the default; 1.0 where neither is given)."""

    def __init__(self, inner: KernelModel, factors: Mapping[str, float]) -> None:
        bad = {k: v for k, v in factors.items() if not (np.isfinite(v) and v > 0)}
        if bad:
            raise ValueError(f"state factors must be positive and finite, got {bad}")
        self.inner = inner
        self.factors = {str(k): float(v) for k, v in factors.items()}
        self.kinds = tuple(inner.kinds)
        self.name = inner.name

    def factor(self, kind: str) -> float:
        """The typical-state factor applied to op kind ``kind``."""
        return self.factors.get(kind, self.factors.get("*", 1.0))

    def predict_undisturbed(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        """Seconds per task in the machine's undisturbed state (the inner model alone)."""
        return self.inner.predict(tasks, platform)

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        return self.inner.predict(tasks, platform) * self.factor(tasks.kind)


def unwrap(model: KernelModel) -> KernelModel:
    """The model under any :class:`StateScaled` wrapper (the model itself otherwise)."""
    while isinstance(model, StateScaled):
        model = model.inner
    return model
