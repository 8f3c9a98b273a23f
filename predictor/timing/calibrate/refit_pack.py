"""Refitting a stored pack: its kernel models fitted again from the benchmark data it stores, no device needed."""

from __future__ import annotations

import datetime as _dt
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from predictor.timing.calibrate.options import BUDGETS, CalibrationError, check_fit_target
from predictor.timing.calibrate.pack import fit_and_write, read_benchmark_table
from predictor.timing.calibrate.pool import family_data_from, match_level, parse_data_source
from predictor.timing.calibrate.probes import (
    STEP_REUSE_ESTIMATOR,
    contention_again,
    lockstep_again,
    with_step_reuse_rows,
)
from predictor.timing.calibration import make_benchmarks
from predictor.timing.calibration.base import BenchContext, Level
from predictor.timing.calibration.timing import Timer
from predictor.timing.kernels.assets import AssetPack, load_asset_pack
from predictor.timing.platforms.cpu_local import fp32_lanes
from predictor.timing.platforms.schema import Platform

__all__ = ["read_overheads", "refit"]

_OVERHEADS = ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s")


def read_overheads(path: Path) -> dict:
    """T1..T5 (seconds) from a JSON written by ``python -m predictor.timing.calibration.overheads``."""
    import json

    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"--overheads {path}: not a readable JSON file ({exc})") from None
    if not isinstance(d, dict):
        raise CalibrationError(f"--overheads {path}: expected a JSON object with t1_s..t5_s")
    for k in _OVERHEADS:
        v = d.get(k)
        if not isinstance(v, int | float) or not np.isfinite(v) or v < 0:
            raise CalibrationError(f"--overheads {path}: {k} must be a non-negative number of seconds, got {v!r}")
    return d


def _load(pack: str | Path) -> tuple[AssetPack, Level, dict[str, pd.DataFrame]]:
    """The pack to refit, its level and its stored benchmark tables by family."""
    from predictor.timing.calibration import FAMILIES
    from predictor.timing.kernels.assets import AssetPackError

    try:
        old = load_asset_pack(pack, allow_unfitted=True)
    except AssetPackError as exc:
        raise CalibrationError(f"--refit: {exc}") from None
    m = old.manifest
    if m.get("kernels"):
        raise CalibrationError(f"--refit {pack}: it holds a timing-only run of {', '.join(m['kernels'])} "
                               "(--kernels), not a pack to fit; pool it into one with --refit PACK "
                               "--data-from FAMILY:KERNEL=THIS")
    level: Level = m.get("level", "quick")
    if level not in BUDGETS:
        raise CalibrationError(f"--refit {pack}: manifest level {level!r} is not one of {', '.join(BUDGETS)}")
    data: dict[str, pd.DataFrame] = {}
    for family in FAMILIES:
        f = old.path / "data" / f"{family}.csv"
        if f.exists():
            data[family] = read_benchmark_table(f, "--refit")
    if not data:
        raise CalibrationError(f"--refit {pack}: the pack stores no benchmark data (data/*.csv)")
    return old, level, data


def _take_data(old: AssetPack, pack: str | Path, data: dict[str, pd.DataFrame],
               data_from: Mapping[str, str | Path | Sequence[str | Path]], level_match: bool
               ) -> tuple[dict, list | None, list | None]:
    """``data`` (updated in place) with the families and kernels taken from other packs, each pack's samples
    first brought to the refitted pack's pace when ``level_match``: (the record of where each came from, the
    step-reuse probe rows taken or None, the lockstep probe rows taken or None)."""
    replaced, data_record, selected, part_records = family_data_from(old.manifest, data_from)
    step_reuse_rows = replaced.pop("step_reuse", None)
    lockstep_rows = replaced.pop("lockstep", None)
    if level_match:
        if not old.models:
            raise CalibrationError(f"--match-level: {pack} has no fitted models to take the pace from")
        for family, table in replaced.items():
            if isinstance(table, pd.DataFrame):  # each pack's samples to the pack's pace apart (runs differ)
                matched = []
                for part, piece in table.groupby("_part", sort=True):
                    piece, levels = match_level(piece, old.models, old.platform)
                    matched.append(piece)
                    part_records[int(part)]["pace"] = {k: round(v, 4) for k, v in levels.items()}
                replaced[family] = pd.concat(matched).sort_index()
    replaced = {f: t.drop(columns="_part") if isinstance(t, pd.DataFrame) else t for f, t in replaced.items()}
    for family, kernels in selected.items():  # only some kernels taken: the pack keeps its other rows
        if family in data:
            own = data[family]
            replaced[family] = pd.concat([own[~own["kernel"].astype(str).isin(kernels)], replaced[family]],
                                         ignore_index=True)
    data.update(replaced)
    return data_record, step_reuse_rows, lockstep_rows


def _with_pace(base: Platform, old: AssetPack, pace_from: str | Path, refit_info: dict) -> Platform:
    """``base`` with its kernel pace set from the measurement windows in ``pace_from``
    (:func:`predictor.timing.calibration.pace.pace_from_windows`); the record goes to ``refit_info``."""
    from predictor.timing.calibration.pace import (
        PaceError,
        pace_from_windows,
        pack_references,
        read_windows,
    )

    m = old.manifest
    try:
        pace, pace_record = pace_from_windows(read_windows(pace_from), str(m.get("created", "")), m.get("cpu"),
                                              source=str(pace_from), references=pack_references(old.path))
    except PaceError as exc:
        raise CalibrationError(str(exc)) from None
    classes = pace_record["classes"]
    note = "; ".join(f"{c} x{v['median']:.3f} over {v['windows']} windows {v['first'][:10]}..{v['last'][:10]} "
                     f"(quartiles {v['quartiles'][0]:.3f}-{v['quartiles'][1]:.3f})"
                     + ("" if v["applied"] else ", recorded, not applied") for c, v in classes.items())
    refit_info["pace_from"] = pace_record
    return base.model_copy(update={
        "kernel_pace": pace,
        "sources": {**base.sources, "kernel_pace": f"median drift of the pack's own GEMM (compute) and memcpy "
                    f"(memory) shapes re-timed in later measurement windows ({pace_from}; "
                    f"predictor/timing/calibration/pace.py): {note}"}})


def _data_from_record(m: dict, data_record: dict) -> dict:
    """The ``refit.data_from`` record: this refit's entries over those of earlier refits whose data the pack
    still stores (a whole family taken anew drops earlier records of some of its kernels; a kernel taken
    anew, the record that named it)."""
    earlier = dict((m.get("refit") or {}).get("data_from") or {})
    for key in data_record:
        family, kernels = parse_data_source(key)
        for old_key in list(earlier):
            old_family, old_kernels = parse_data_source(old_key)
            if old_family == family and (not kernels or old_key == key or set(old_kernels) <= set(kernels)):
                del earlier[old_key]
    return {**earlier, **data_record}


def refit(pack: str | Path, out: str | Path | None = None, *, overheads: str | Path | None = None,
          platform_facts: dict | None = None,
          data_from: Mapping[str, str | Path | Sequence[str | Path]] | None = None,
          log: Callable[[str], None] = print, register: bool = True, fit_target: str | None = None,
          level_match: bool = False, pace_from: str | Path | None = None) -> AssetPack:
    """Fit a pack's kernel models again from the benchmark data it stores; no device needed.

    The models, the held-out error table and the calibrated platform are rebuilt by the same code
    ``calibrate`` runs after its benchmarks, with the pack's own level, seed, world size, measured
    overheads and host contention, so a change to the models (a feature, a grid) reaches a pack
    calibrated on hardware one no longer holds (a lent GPU, say).

    Args:
        pack: the pack folder (or name) to refit.
        out: the folder to write; default ``pack`` (replaced atomically).
        overheads: a JSON of T1..T5 measured since (``python -m predictor.timing.calibration.overheads
            --device cuda --out FILE`` on the device) to use instead of the pack's.
        platform_facts: platform fields measured since, set before fitting (``{"page_fault_s": ...,
            "fresh_mapping_bytes": ...}`` for a CPU pack calibrated before calibration measured page faults).
        data_from: ``family -> pack`` whose stored benchmarks of that family replace the refitted pack's (or add
            a family it lacks); each must have been timed as this pack's were
            (:data:`~.pool.TIMING_FIELDS`) on the same CPU. A key ``family:kernel,kernel`` replaces only those
            kernels' samples (:func:`~.pool.parse_data_source`). A key may map to a list of packs: their
            samples are pooled; ``lockstep`` may map to a list of packs: their probes' rounds are pooled. The
            written pack records where each family came from (manifest ``refit.data_from``).
        log: progress lines.
        register: remember the pack's location so ``--platform NAME`` finds it anywhere.
        fit_target: fit the samples' median of rounds (``"typical"``) or fastest round (``"fastest_round"``)
            instead of what the pack recorded (default: the pack's ``fit_target``, ``"typical"`` when absent).
        level_match: bring each taken kernel's samples to the refitted pack's pace first
            (:func:`~.pool.match_level`; recorded per kernel as ``pace`` under ``refit.data_from``).
        pace_from: an archive of measurement windows whose drift probes against this pack set the platform's
            ``kernel_pace`` (:func:`predictor.timing.calibration.pace.pace_from_windows`); without it a refit
            keeps the pack's stored pace.

    Raises:
        CalibrationError: ``pack`` is not a loadable asset pack, or stores no benchmark data.
    """
    started = time.perf_counter()
    old, level, data = _load(pack)
    m = old.manifest
    data_record, step_reuse_rows, lockstep_rows = _take_data(old, pack, data, data_from or {}, level_match)
    dev = torch.device(str(m.get("device", "cpu")))
    world_size = int(m.get("world_size", 1))
    seed = int(m.get("seed", 0))
    ctx = BenchContext(device=dev, level=level, rng=np.random.default_rng(seed),
                       timer=Timer(torch.device("cpu")), log=log, threads=int(m.get("threads") or 1),
                       simd_lanes=fp32_lanes((m.get("cpu") or {}).get("torch_capability")))
    specs = [(b.name, s) for b in make_benchmarks(world_size, list(data)) for s in b.specs(ctx)]
    base = old.platform.model_copy(update={"name": re.sub(r" \(calibrated [0-9-]+\)$", "", old.platform.name)})
    if platform_facts:
        try:
            base = Platform.model_validate({**base.model_dump(), **platform_facts})
        except ValueError as exc:
            raise CalibrationError(f"--refit {pack}: bad platform facts {platform_facts}: {exc}") from None
    contention = {k: float(v) for k, v in (m.get("host_contention") or {}).get(str(world_size), {}).items()}
    refit_info = {"date": _dt.date.today().isoformat(), "from": str(old.path)}
    contention = contention_again(m, world_size, contention, refit_info)
    if lockstep_rows is not None:
        if world_size != int(data_record["lockstep"]["world"] or 0):
            raise CalibrationError(f"--data-from lockstep={data_record['lockstep']['pack']}: probed over "
                                   f"{data_record['lockstep']['world']} processes, the refitted pack's world size "
                                   f"is {world_size}")
        m["lockstep_probe"] = {"world": world_size, "per_process": lockstep_rows}
    contention = lockstep_again(m, world_size, contention)
    if step_reuse_rows is not None:
        rec = data_record["step_reuse"]
        base = with_step_reuse_rows(base, step_reuse_rows, f"tuner calibrate {rec['created']} ({rec['pack']})")
        m["embedding_step_reuse_probe"] = {"estimator": STEP_REUSE_ESTIMATOR, "rows": step_reuse_rows}
    if pace_from is not None:
        base = _with_pace(base, old, pace_from, refit_info)
    if platform_facts:
        refit_info["platform_facts"] = dict(platform_facts)
    data_from_all = _data_from_record(m, data_record)
    if data_from_all:
        refit_info["data_from"] = data_from_all
    if overheads is not None:
        refit_info["overheads_from"] = str(overheads)
        overheads = read_overheads(Path(overheads))
    else:
        overheads = dict(m.get("overheads") or {})
        for k in _OVERHEADS:
            overheads.setdefault(k, float(getattr(old.platform.overheads, k)))
    out = Path(out) if out is not None else old.path
    pack_name = old.name if out == old.path else out.name.strip().lower()
    extra = _manifest(m, data, overheads, refit_info, fit_target, base if platform_facts else None)
    log(f"refitting {old.name} ({dev}, {level} grids) from its stored benchmarks -> {out}")
    return fit_and_write(out, pack_name, dev, base, data, specs, level, seed, world_size, overheads, contention,
                         extra, started, log, register)


def _manifest(m: dict, data: dict[str, pd.DataFrame], overheads: dict, refit_info: dict, fit_target: str | None,
              facts_from: Platform | None) -> dict:
    """The manifest fields the refitted pack keeps or sets (``facts_from``: the platform whose page-fault
    facts were set by ``platform_facts``)."""
    from predictor.timing.calibration import FAMILIES

    extra = {k: v for k, v in m.items() if k not in ("name", "device", "calibration_s", "refit", "fitted")}
    if "families" in m:  # a family taken from another pack (--data-from) that this one never measured joins the list
        extra["families"] = [*m["families"], *(f for f in FAMILIES if f in data and f not in m["families"])]
    extra["overheads"] = overheads
    extra["refit"] = refit_info
    if fit_target is not None:
        extra["fit_target"] = check_fit_target(fit_target)
    if facts_from is not None:
        extra.update({k: getattr(facts_from, k) for k in ("page_fault_s", "fresh_mapping_bytes")})
    return extra
