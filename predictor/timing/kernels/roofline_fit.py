"""Fitted rooflines: per op kind a floor (seconds) and an effective bandwidth per working-set regime (bytes/s),
fitted by :func:`fit_roofline` to measured (bytes moved, seconds) samples; :class:`FittedRoofline` is the
roofline model with these measured bandwidths."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.elementwise import Roofline
from predictor.timing.kernels.host_memory import known_seconds
from predictor.timing.platforms.schema import Platform

__all__ = ["FittedRoofline", "RooflineFit", "fit_roofline"]


@dataclass(frozen=True)
class RooflineFit:
    """``t = floor_s + bytes / bandwidth[regime]``; regime ``i`` covers ``edges[i-1] < bytes <= edges[i]``.

    ``edges`` (bytes, ascending) split the working-set sizes into ``len(edges) + 1`` regimes
    (in cache, main memory, ...); ``bandwidths`` are bytes/s, one per regime.
    """

    floor_s: float
    edges: tuple[float, ...]
    bandwidths: tuple[float, ...]

    def __call__(self, moved: np.ndarray) -> np.ndarray:
        moved = np.asarray(moved, dtype=np.float64)
        regime = np.searchsorted(np.asarray(self.edges), moved, side="left")
        bw = np.asarray(self.bandwidths)[regime]
        return self.floor_s + moved / bw

    @property
    def peak_bandwidth(self) -> float:
        """Largest fitted bandwidth, bytes/s (the "corrected peak" of Lin et al. 2022), over the
        regimes where moving the bytes takes at least as long as the floor at the regime's upper
        edge (the last regime always counts). On a GPU the smallest regimes are all launch floor:
        their fitted slope is noise, and their "bandwidth" (hundreds of TB/s) no memory's."""
        bws = [bw for i, bw in enumerate(self.bandwidths)
               if i == len(self.bandwidths) - 1 or self.edges[i] / bw >= self.floor_s]
        return float(max(bws))


def _solve_roofline(moved: np.ndarray, t: np.ndarray, edges: Sequence[float]) -> tuple[RooflineFit, float]:
    """Relative-error least squares for (floor, 1/bw per regime) with non-negativity."""
    from scipy.optimize import nnls

    regime = np.searchsorted(np.asarray(edges), moved, side="left")
    n_reg = len(edges) + 1
    a = np.zeros((moved.size, 1 + n_reg))
    a[:, 0] = 1.0
    a[np.arange(moved.size), 1 + regime] = moved
    w = 1.0 / t
    coef, _ = nnls(a * w[:, None], np.ones_like(t))
    inv = coef[1:]
    # an empty regime or a zero slope: borrow the neighbour's bandwidth (never infinite)
    for i in range(n_reg):
        if inv[i] <= 0:
            nz = [inv[j] for j in range(n_reg) if inv[j] > 0]
            inv[i] = min(nz) if nz else 1e-12
    fit = RooflineFit(float(coef[0]), tuple(float(e) for e in edges), tuple(float(1.0 / u) for u in inv))
    err = float(np.mean(np.log(fit(moved) / t) ** 2))
    return fit, err


def fit_roofline(moved: np.ndarray, seconds: np.ndarray, *, max_edges: int = 3, min_points: int = 4) -> RooflineFit:
    """Fit a :class:`RooflineFit` to measured (bytes moved, seconds) points.

    Regime edges are chosen greedily among the half-octave points of the measured byte range
    (up to ``max_edges``, each regime keeping at least ``min_points`` samples); an edge is kept
    only if it lowers the mean squared log error by more than 2 %.

    Raises:
        ValueError: fewer than ``min_points`` valid samples.
    """
    moved = np.asarray(moved, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    ok = np.isfinite(moved) & np.isfinite(t) & (moved > 0) & (t > 0)
    moved, t = moved[ok], t[ok]
    if moved.size < min_points:
        raise ValueError(f"fit_roofline needs at least {min_points} samples, got {moved.size}")
    lo, hi = np.log2(moved.min()), np.log2(moved.max())
    candidates = [2.0**x for x in np.arange(np.ceil(lo * 2) / 2, hi, 0.5)]
    edges: list[float] = []
    best, err = _solve_roofline(moved, t, edges)
    for _ in range(max_edges):
        trial = None
        for c in candidates:
            if c in edges:
                continue
            e = sorted([*edges, c])
            counts = np.bincount(np.searchsorted(np.asarray(e), moved, side="left"), minlength=len(e) + 1)
            if counts.min() < min_points:
                continue
            fit, f_err = _solve_roofline(moved, t, e)
            if trial is None or f_err < trial[1]:
                trial = (fit, f_err, e)
        if trial is None or trial[1] > err * 0.98:
            break
        best, err, edges = trial
    return best


class FittedRoofline(Roofline):
    """Roofline with measured bandwidths: one :class:`RooflineFit` per op kind.

    Bytes moved come from the task's ``bytes`` (or ``2 x elements x dtype_bytes``). Kinds
    without their own fit use ``generic`` (the fit of a streaming binary op).
    """

    name = "fitted-roofline"

    def __init__(self, fits: Mapping[str, RooflineFit], generic: str | None = None) -> None:
        super().__init__()
        self.fits = dict(fits)
        self.generic = generic if generic in self.fits else (next(iter(self.fits)) if self.fits else None)
        self.kinds = tuple(dict.fromkeys([*self.fits, *Roofline.kinds]))
        #: calibrated parameters
        self.params = self.fits  # type: ignore[assignment]

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        fit = self.fits.get(tasks.kind) or (self.fits.get(self.generic) if self.generic else None)
        if fit is None:
            return super().predict(tasks, platform)
        moved = tasks.get("bytes")
        elems = tasks.get("elements")
        dt = tasks.get("dtype_bytes", 4.0)
        moved = np.nan_to_num(np.where(np.isnan(moved), 2.0 * elems * dt, moved), nan=0.0)
        return fit(moved) + known_seconds(tasks, platform)
