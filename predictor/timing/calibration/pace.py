"""The machine's typical pace against the pace of its calibration run (``Platform.kernel_pace``).

A shared VM runs one kernel several percent faster or slower from hour to hour (other tenants, the
host's clocks). A pack's kernel models are fitted to the hour its benchmarks were timed in, so a pack
whose models are right at that hour's pace predicts a step at a typical later hour too fast or too
slow by the machine's drift. The drift probe re-times some of the pack's own microbenchmark shapes as
calibrated and divides by the recorded times (``experiments/measure_env.py``: ``gemm_drift``, the larger
half of the fp32 ``addmm`` / ``mm`` shapes by FLOPs; ``memory_drift``, the larger half of the ``memcpy``
shapes by bytes). ``experiments/e2e_cpu.py`` takes it before and after every measurement window and
archives it with the window (``benchmarks/data/e2e_cpu_windows.json``).

:func:`pace_from_windows` turns those records into the platform's pace: per kernel class, the median
over the windows measured against this pack's data (same ``pack_created``, same CPU) of each window's
geomean of its before / after ratios. ``tuner calibrate --refit PACK --pace-from FILE`` writes it into the
pack. Only ``compute`` is applied (:data:`APPLIED_CLASSES`): the GEMM probe re-times the very samples the pack's
GEMM models are levelled on. The memcpy probe is recorded but not applied: its shapes are the larger half of the
pack's memcpy samples by bytes, which stream from DRAM, while a step's memory-bound kernels run mostly from the
last-level cache: on a Zen 4 VM applying its drift (a median x1.151 over 72 windows) as the memory pace moved
the e2e geomean / max error from 1.81 / 8.6 % to 2.11 / 9.7 % (75 windows). No probe times the embedding kernels, so that class has no pace.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["APPLIED_CLASSES", "MIN_WINDOWS", "PROBE_KEYS", "PROBE_ROWS", "PaceError", "pace_from_windows", "pack_references",
           "probe_reference", "probe_rows", "read_windows", "window_drift"]

#: kernel class -> the window record's drift keys (before, after) that re-time that class's shapes
PROBE_KEYS: dict[str, tuple[str, str]] = {"compute": ("before", "after"), "memory": ("memory_before", "memory_after")}
#: the classes whose measured drift becomes the platform's pace (the others are recorded only; module docstring)
APPLIED_CLASSES: tuple[str, ...] = ("compute",)
#: fewest windows a class's pace is taken from: one hour's drift is not the machine's typical pace
MIN_WINDOWS = 10


#: kernel class -> (the pack's benchmark table, its kernels the probe draws from, the size column whose larger half
#: it draws from, shapes drawn): what ``experiments/measure_env.py`` re-times
PROBE_ROWS: dict[str, tuple[str, tuple[str, ...], str, int]] = {
    "compute": ("gemm.csv", ("addmm/fp32", "mm/fp32"), "flops", 24),
    "memory": ("data_movement.csv", ("memcpy",), "bytes", 16),
}


class PaceError(ValueError):
    """A windows file that cannot give a pace (unreadable, or too few windows of this pack)."""


def window_drift(window: Mapping, cls: str) -> float | None:
    """One window's drift of kernel class ``cls``: the geomean of its before / after ratios (now / at
    calibration), or None when it recorded neither."""
    gd = window.get("gemm_drift") or {}
    vals = [float(gd[k]["ratio_geomean"]) for k in PROBE_KEYS[cls] if (gd.get(k) or {}).get("ratio_geomean")]
    return float(np.exp(np.mean(np.log(vals)))) if vals else None


def probe_rows(table: pd.DataFrame, cls: str, cases: int | None = None, seed: int = 0) -> pd.DataFrame:
    """The rows of a pack's benchmark ``table`` (:data:`PROBE_ROWS`) that the drift probe of class ``cls``
    re-times: ``cases`` (default the class's) drawn, seeded, from its kernels' rows whose size column is at
    least its median."""
    _, kernels, column, n = PROBE_ROWS[cls]
    d = table[table["kernel"].isin(kernels)]
    d = d[d[column] >= d[column].median()]
    return d.sample(n=min(cases or n, len(d)), random_state=seed) if len(d) else d


def probe_reference(rows: pd.DataFrame) -> str:
    """A short fingerprint of the probe's rows (kernel, shape and recorded time): a window's drift is a ratio to
    these recorded times, so windows taken against other rows (a pack whose data were refitted from other
    calibration runs) measure against another reference."""
    cols = [c for c in ("kernel", "m", "n", "k", "elements", "seconds") if c in rows.columns]
    text = rows[cols].to_csv(index=False, float_format="%.6g")
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def pack_references(pack_dir: str | Path) -> dict[str, str]:
    """Per probed class, :func:`probe_reference` of the pack's probe rows ({} for a class whose table is
    missing or unreadable)."""
    out = {}
    for cls, (name, *_rest) in PROBE_ROWS.items():
        try:
            rows = probe_rows(pd.read_csv(Path(pack_dir) / "data" / name), cls)
        except (OSError, KeyError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
            continue
        if len(rows):
            out[cls] = probe_reference(rows)
    return out


def read_windows(path: str | Path) -> list[dict]:
    """The archived windows of ``path`` (a JSON list of window records); PaceError naming the file when it
    is unreadable or not such a list."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PaceError(f"--pace-from {path}: not a readable JSON file ({exc})") from None
    if not isinstance(data, list) or not all(isinstance(w, dict) for w in data):
        raise PaceError(f"--pace-from {path}: expected a JSON list of measurement windows "
                        "(as benchmarks/data/e2e_cpu_windows.json)")
    return data


def _same_cpu(a: Mapping | None, b: Mapping | None) -> bool:
    keys = ("vendor", "family", "model")
    return bool(a) and bool(b) and all(str(a.get(k)) == str(b.get(k)) for k in keys)


def _reference(window: Mapping, cls: str) -> str | None:
    """The probe reference a window's drift of ``cls`` was taken against (None: recorded before references)."""
    gd = window.get("gemm_drift") or {}
    return next((gd[k]["reference"] for k in PROBE_KEYS[cls] if (gd.get(k) or {}).get("reference")), None)


def pace_from_windows(windows: Sequence[Mapping], pack_created: str, cpu: Mapping | None,
                      source: str = "windows",
                      references: Mapping[str, str] | None = None) -> tuple[dict[str, float], dict]:
    """Per applied kernel class (:data:`APPLIED_CLASSES`), the median drift over the ``windows`` measured
    against the pack created at ``pack_created`` on ``cpu`` (:func:`window_drift`), and a record of what it was
    taken from (windows, first and last ``measured_at``, median and quartiles of every probed class; ``applied``
    says which became the pace). ``references``: the pack's probe references (:func:`pack_references`); where
    :data:`MIN_WINDOWS` windows were taken against the pack's current reference only those count, else the
    windows of the pack that recorded no reference and those of its current one.

    Raises:
        PaceError: no applied class has :data:`MIN_WINDOWS` windows of this pack and CPU.
    """
    mine = [w for w in windows if w.get("pack_created") == pack_created and _same_cpu(w.get("cpu"), cpu)]
    pace: dict[str, float] = {}
    record: dict = {"from": source, "pack_created": pack_created, "classes": {}}
    for cls in PROBE_KEYS:
        ref = (references or {}).get(cls)
        current = [w for w in mine if ref is not None and _reference(w, cls) == ref]
        chosen = current if len(current) >= MIN_WINDOWS else current + [w for w in mine if _reference(w, cls) is None]
        pairs = [(str(w.get("measured_at", "")), d) for w in chosen if (d := window_drift(w, cls)) is not None]
        if len(pairs) < MIN_WINDOWS:
            continue
        when, vals = zip(*sorted(pairs), strict=True)
        median = float(np.median(vals))
        if cls in APPLIED_CLASSES:
            pace[cls] = median
        record["classes"][cls] = {"windows": len(vals), "first": when[0], "last": when[-1],
                                  "median": round(median, 4), "applied": cls in APPLIED_CLASSES,
                                  "reference": ref if chosen is current else "before references",
                                  "quartiles": [round(float(q), 4) for q in np.percentile(vals, [25, 75])]}
    if not pace:
        raise PaceError(f"--pace-from {source}: fewer than {MIN_WINDOWS} windows with a drift record were measured "
                        f"against this pack (created {pack_created}) on its CPU ({len(mine)} of {len(windows)} "
                        "windows match)")
    return pace, record
