"""Writing the asset pack of a calibration (fitted, or its benchmarks alone) and reading its stored tables."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

from predictor.timing.calibrate.calibrated_platform import calibrated_platform
from predictor.timing.calibrate.fit import fit_models
from predictor.timing.calibrate.options import CalibrationError
from predictor.timing.calibrate.report import error_table_markdown
from predictor.timing.calibration.base import Level, ModelSpec
from predictor.timing.kernels.assets import (
    STORED_FLOAT_FORMAT,
    AssetPack,
    load_asset_pack,
    register_asset_pack,
    write_asset_pack,
)
from predictor.timing.platforms.schema import Platform

__all__ = ["as_stored", "fit_and_write", "read_benchmark_table", "write_unfitted"]


def as_stored(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as a pack stores it and reads it back (floats to
    :data:`~predictor.timing.kernels.assets.STORED_FLOAT_FORMAT`): a calibration fits exactly the samples it writes,
    so a :func:`~predictor.timing.calibrate.refit` of its pack reproduces its models and error table."""
    return pd.read_csv(io.StringIO(frame.to_csv(index=False, float_format=STORED_FLOAT_FORMAT)))


def fit_and_write(out: Path, pack_name: str, dev: torch.device, base: Platform, data: dict[str, pd.DataFrame],
                  specs: list[tuple[str, ModelSpec]], level: Level, seed: int, world_size: int, overheads: dict,
                  contention: dict[str, float], manifest_extra: dict, started: float,
                  log: Callable[[str], None], register: bool) -> AssetPack:
    """Fit every kernel model to ``data`` as the pack stores it (:func:`as_stored`: a refit whose ``--match-level``
    rescaled taken samples fits them rounded as written, so a later plain refit reproduces it), build the
    calibrated platform, write (and register) the pack. ``started``: ``time.perf_counter()`` at the start of
    the run."""
    data = {family: as_stored(frame) for family, frame in data.items()}
    t0 = time.perf_counter()
    models, table = fit_models(data, specs, level, seed, base, log, scale=float(manifest_extra.get("scale", 1.0)),
                               target=str(manifest_extra.get("fit_target", "typical")))
    log(f"  fitted {len(models)} kernel models in {time.perf_counter() - t0:.1f} s")
    platform = calibrated_platform(base, pack_name, data, models, overheads, world_size, contention)
    extra = {**manifest_extra, "calibration_s": round(time.perf_counter() - started, 1)}
    if contention:  # a refit may have estimated them again from the stored probe
        extra["host_contention"] = {str(world_size): dict(contention)}
    write_asset_pack(out, name=pack_name, device=str(dev), platform=platform, models=models, error_table=table,
                     data=data, manifest_extra=extra, errors_md=error_table_markdown(table))
    if register:
        register_asset_pack(pack_name, out)
    log(f"wrote asset pack {pack_name} to {out} in {time.perf_counter() - started:.0f} s")
    return load_asset_pack(out)


def write_unfitted(out: Path, pack_name: str, dev: torch.device, base: Platform, data: dict[str, pd.DataFrame],
                   manifest_extra: dict, started: float, log: Callable[[str], None]) -> AssetPack:
    """Write the benchmark data and the manifest of a pack whose models are fitted later by
    :func:`~predictor.timing.calibrate.refit`."""
    extra = {**manifest_extra, "fitted": False, "calibration_s": round(time.perf_counter() - started, 1)}
    write_asset_pack(out, name=pack_name, device=str(dev), platform=base, models={}, data=data,
                     manifest_extra=extra)
    log(f"wrote the benchmarks of {pack_name} to {out} in {time.perf_counter() - started:.0f} s, not fitted: "
        + (f"pool them into a pack with tuner calibrate --refit PACK --data-from FAMILY:KERNEL={out}"
           if manifest_extra.get("kernels") else f"tuner calibrate --refit {out}"))
    return load_asset_pack(out, allow_unfitted=True)


def read_benchmark_table(f: Path, context: str) -> pd.DataFrame:
    """A pack's stored benchmark table ``data/<family>.csv``; CalibrationError ``context: f: not a benchmark
    table`` when it does not parse."""
    try:
        return pd.read_csv(f)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{context}: {f}: not a benchmark table ({exc})") from None
