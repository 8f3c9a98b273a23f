"""The error report of a calibration: held-out errors of each kernel model (Lin et al. 2022 Table I layout) and
the timing noise of the samples (the spread between a shape's rounds)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from predictor.metrics import (
    geomean_abs_pct_error,
    geomean_abs_pct_error_interval,
    max_abs_pct_error,
    mean_abs_pct_error,
)

__all__ = ["NOISY_ROUND_SPREAD_PCT", "compute_round_spread", "error_table_markdown", "held_out_errors",
           "round_spreads"]

#: median round spread (percent) of the fp32 GEMM and conv2d samples above which ``tuner calibrate`` says
#: the machine was noisy: on a quiet 2-core VM these kernels' spreads were 4-10 %, on a noisy one 18-25 %
#: (and their models came out at 11-14 % GMAE)
NOISY_ROUND_SPREAD_PCT = 15.0


def _finite_or_none(interval: tuple[float, float]) -> list[float] | None:
    return list(interval) if all(math.isfinite(v) for v in interval) else None


def held_out_errors(pred: np.ndarray, actual: np.ndarray) -> dict:
    """Lin et al. 2022 Table I errors of ``pred`` against ``actual`` (seconds), in percent: GMAE, its 90 %
    bootstrap interval over the samples (None with fewer than two), MAPE, std and max of the absolute errors."""
    err = np.abs(pred - actual) / actual * 100.0
    return {
        "gmae_pct": geomean_abs_pct_error(pred, actual),
        "gmae_ci90_pct": _finite_or_none(geomean_abs_pct_error_interval(pred, actual)),
        "mape_pct": mean_abs_pct_error(pred, actual),
        "std_pct": float(err.std()) if err.size else float("nan"),
        "max_pct": max_abs_pct_error(pred, actual),
    }


def round_spreads(pack_dir: str | Path) -> dict[str, float]:
    """Per kernel, the median over its samples of the spread between its rounds' timings (slowest /
    fastest - 1, percent) from a pack's stored benchmark data (``data/*.csv``, column ``pass_spread``);
    kernels whose samples have a single timing, or packs without data, are left out."""
    out: dict[str, float] = {}
    for csv in sorted((Path(pack_dir) / "data").glob("*.csv")):
        try:
            frame = pd.read_csv(csv)
        except (OSError, ValueError, pd.errors.ParserError):
            continue
        if "pass_spread" not in frame or "kernel" not in frame:
            continue
        for kernel, part in frame.groupby("kernel", sort=False):
            v = pd.to_numeric(part["pass_spread"], errors="coerce").dropna()
            if len(v):
                out[str(kernel)] = float(v.median() * 100.0)
    return out


def compute_round_spread(spreads: dict[str, float]) -> float | None:
    """The median of :func:`round_spreads` over the fp32 GEMM and conv2d kernels (the steadiest
    timings a calibration takes: their spread is the machine's noise, not a kernel's), percent, or None."""
    keys = [k for k in spreads if k.endswith("/fp32") and k.split("/")[0] in ("addmm", "mm", "bmm", "conv2d")]
    return float(np.median([spreads[k] for k in keys])) if keys else None


def error_table_markdown(table: list[dict]) -> str:
    """The held-out error table as Markdown (Lin et al. 2022 Table I layout plus samples and max). A pack
    fitted to the fastest round (rows with ``typical``) scores its models against the held-out fastest
    rounds in the first columns, and adds the state factor and the scaled model against the held-out
    medians of rounds (``typical GMAE %``, ``typical max %``)."""
    ci = any(r.get("gmae_ci90_pct") for r in table)
    typ = any(r.get("typical") for r in table)
    lines = [
        "| kernel | samples | held out | GMAE % |" + (" GMAE 90 % interval |" if ci else "")
        + " MAPE % | std % | max % |" + (" state x | typical GMAE % | typical max % |" if typ else "") + " model |",
        "|---|---:|---:|---:|" + ("---:|" if ci else "") + "---:|---:|---:|" + ("---:|---:|---:|" if typ else "") + "---|",
    ]
    for r in table:
        interval = r.get("gmae_ci90_pct")
        cell = (f" {interval[0]:.1f}-{interval[1]:.1f} |" if interval else " |") if ci else ""
        t = r.get("typical")
        extra = (f" {r['state_factor']:.3f} | {t['gmae_pct']:.2f} | {t['max_pct']:.1f} |" if t else " | | |") if typ else ""
        lines.append(
            f"| {r['kernel']} | {r['samples']} | {r['test']} | {r['gmae_pct']:.2f} |{cell} {r['mape_pct']:.2f} | "
            f"{r['std_pct']:.2f} | {r['max_pct']:.1f} |{extra} {r['model']} |"
        )
    return "\n".join(lines) + "\n"
