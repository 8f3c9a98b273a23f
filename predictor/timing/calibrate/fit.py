"""Fitting: every kernel model on a random 80 % of its samples, scored on the other 20 %.

Per kernel a seeded split (:func:`holdout_split`) holds out :data:`~.options.HOLDOUT_FRACTION` of the
samples; the model of the kernel (MLP with the grid search of Lin et al. 2022 Table II, fitted roofline, or
piecewise sigmoid) is fitted on the rest, in worker processes (:func:`fit_jobs`), and its error on the
held-out samples is reported as Table I of the paper does (:func:`~.report.held_out_errors`).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from predictor.graph import PARAM_COLUMNS
from predictor.timing.calibrate.options import (
    HOLDOUT_FRACTION,
    MLP_MEMBERS,
    MLP_SETTINGS,
    TARGET_COLUMN,
    CalibrationError,
    target_column,
)
from predictor.timing.calibrate.report import held_out_errors
from predictor.timing.calibration.base import Level, ModelSpec
from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.kernels.collective import PiecewiseCollective, fit_piecewise_sigmoid
from predictor.timing.kernels.features import DERIVED_FEATURES, ROUTE_FEATURES, feature_matrix, route_columns
from predictor.timing.kernels.host_memory import KNOWN_TERM_KINDS
from predictor.timing.kernels.learned import MLPKernelModel
from predictor.timing.kernels.mlp import fit_mlp
from predictor.timing.kernels.roofline_fit import FittedRoofline, fit_roofline
from predictor.timing.kernels.state import FIT_TARGETS, StateScaled, fits_fastest, state_factor
from predictor.timing.kernels.timing import models_by_kind
from predictor.timing.platforms.schema import Platform

__all__ = ["MIN_LEARNED_FRACTION", "POOL_PREFIX", "fit_job", "fit_jobs", "fit_models", "fit_workers",
           "holdout_split", "learned_seconds", "pooled_jobs", "state_scaled", "task_view"]

#: a sample keeps at least this fraction of its measured time as the MLP's target when its page
#: faults are taken out (guards a fault cost measured while the machine ran faster than for the sample)
MIN_LEARNED_FRACTION = 0.1
#: job key prefix of a pooled fit (:func:`pooled_jobs`)
POOL_PREFIX = "pool:"


def holdout_split(n: int, seed: int, kernel: str) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices with ``HOLDOUT_FRACTION`` held out (at least one of each when n >= 2).

    The permutation is seeded by ``(seed, kernel)`` alone, so one kernel's held-out set does not
    move when another kernel gains or loses samples.
    """
    rng = np.random.default_rng([seed + 1, zlib.crc32(kernel.encode())])
    perm = rng.permutation(n)
    n_test = int(round(HOLDOUT_FRACTION * n))
    n_test = min(max(n_test, 1 if n >= 2 else 0), max(n - 1, 0))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def task_view(frame: pd.DataFrame, kind: str) -> TaskView:
    """The benchmark rows ``frame`` as tasks of op kind ``kind`` (their parameter, ``flops`` and ``bytes``
    columns), what a kernel model predicts."""
    allowed = set(PARAM_COLUMNS) | {"flops", "bytes"}
    cols = {c: frame[c].to_numpy(dtype=np.float64) for c in frame.columns if c in allowed}
    return TaskView.from_columns(kind, **cols)


def learned_seconds(frame: pd.DataFrame, platform: Platform, column: str = "seconds") -> np.ndarray:
    """The fitting target of each benchmark row (MLPs and fitted rooflines), seconds: the measured time,
    less the page faults the sample paid (its ``faults`` column x ``platform.page_fault_s``) for kinds
    whose model adds its output block's faults back from platform facts
    (:func:`~predictor.timing.kernels.host_memory.known_seconds`: embedding backward, GEMMs, memory-bound kinds
    with a new output block); at least :data:`MIN_LEARNED_FRACTION` of the measured time.

    The faults are the ones counted, not the ones the model assumes: whether a benchmark's large
    output is a fresh mapping depends on the calibration process's allocation history (glibc reuses
    a free heap block when one is large enough). Rows without a count (packs calibrated before the
    timer counted faults) are fitted as measured. ``column``: the time estimate fitted (``seconds``, the
    median of the rounds; ``median_s``, the fastest round: :data:`~.options.TARGET_COLUMN`)."""
    seconds = frame[column].to_numpy(dtype=np.float64)
    if "faults" not in frame or platform.page_fault_s <= 0:
        return seconds
    paid = np.nan_to_num(frame["faults"].to_numpy(dtype=np.float64), nan=0.0) * platform.page_fault_s
    priced = frame["kind"].isin(KNOWN_TERM_KINDS).to_numpy()
    return np.where(priced, np.maximum(seconds - paid, MIN_LEARNED_FRACTION * seconds), seconds)


def fit_job(job: dict) -> tuple[object, float]:
    """One kernel's fit (a worker process's task): :func:`fit_mlp` for ``method`` "mlp", the piecewise
    sigmoid of a collective (:func:`fit_piecewise_sigmoid`) for "sigmoid"; the fitted model and its
    seconds of fitting."""
    t0 = time.perf_counter()
    if job["method"] == "sigmoid":
        fitted = fit_piecewise_sigmoid(job["msg_bytes"], job["seconds"])
    else:
        fitted = fit_mlp(job["raw"], job["seconds"], job["features"], **job["kwargs"])
    return fitted, time.perf_counter() - t0


def fit_jobs(jobs: dict[str, dict], workers: int, log: Callable[[str], None]) -> dict[str, object]:
    """Every kernel's fitted model (:func:`fit_job`), in ``workers`` spawned processes (1: in this
    process), the collectives' sigmoid searches first (an uneven all-to-all's takes ~50 s on a 2-core CPU).
    Each fit is seeded and single-threaded, so the models do not depend on the number of workers."""
    done: dict[str, object] = {}

    def report(kernel: str, fitted, seconds: float) -> None:
        done[kernel] = fitted
        if jobs[kernel]["method"] == "sigmoid":
            log(f"    {kernel:<20} piecewise sigmoid (8 params)  ({seconds:.1f} s)")
            return
        c = fitted.config
        log(f"    {kernel:<20} MLP {c['layers']}x{c['width']} x{c.get('members', 1)}  ({seconds:.1f} s)")

    order = sorted(jobs, key=lambda k: jobs[k]["method"] != "sigmoid")  # stable: sigmoids first
    if workers <= 1 or len(jobs) <= 1:
        for kernel in order:
            report(kernel, *fit_job(jobs[kernel]))
        return done
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(fit_job, jobs[kernel]): kernel for kernel in order}
        for fut in as_completed(futures):
            report(futures[fut], *fut.result())
    return done


def fit_workers(level: Level, jobs: int) -> int:
    """Processes that fit MLPs: one per CPU core (at most one per job); the tiny level (tests) fits
    in-process, where starting workers would cost more than it saves."""
    import os

    if level == "tiny":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, jobs))


@dataclass
class _Fits:
    """The state of one :func:`fit_models` call: per kernel its (train, test) samples, its job for the worker
    processes, its fitted rooflines and curves, and the model description of the error table."""

    splits: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = field(default_factory=dict)
    jobs: dict[str, dict] = field(default_factory=dict)
    roof_fits: dict = field(default_factory=dict)
    curves: dict = field(default_factory=dict)
    methods: dict[str, str] = field(default_factory=dict)
    nets: dict[str, dict[str, object]] = field(default_factory=dict)
    mlp_specs: dict[str, ModelSpec] = field(default_factory=dict)


def _check_target(data: dict[str, pd.DataFrame], target: str) -> None:
    """CalibrationError unless ``target`` is a fit target the benchmark tables ``data`` have the column of."""
    if target not in FIT_TARGETS:
        raise CalibrationError(f"fit target {target!r}: expected one of {', '.join(FIT_TARGETS)}")
    fastest = TARGET_COLUMN["fastest_round"]
    missing = sorted(f for f, frame in data.items() if fits_fastest(target, f) and fastest not in frame.columns)
    if missing:
        raise CalibrationError(f"fit target {target}: the benchmark data of {', '.join(missing)} have no "
                               f"{fastest} column (measured before the calibration kept it)")


def _prepare(fits: _Fits, data: dict[str, pd.DataFrame], specs: list[tuple[str, ModelSpec]], level: Level,
             seed: int, platform: Platform, log: Callable[[str], None], scale: float, target: str) -> None:
    """Split each kernel's samples; fit the rooflines here and queue the MLPs and sigmoids as jobs."""
    grid, epochs, budget = MLP_SETTINGS[level]
    budget *= max(1.0, scale)  # grid-search seconds per kernel: more samples train slower
    for family, spec in specs:
        frame = data[family]
        sub = frame[frame["kernel"] == spec.kernel].reset_index(drop=True)
        if len(sub) < 5:
            log(f"    {spec.kernel}: only {len(sub)} samples, not fitted")
            continue
        lacking = [f for f in spec.features
                   if f not in DERIVED_FEATURES and f not in ROUTE_FEATURES and f not in sub.columns]
        if lacking:
            log(f"    {spec.kernel}: not fitted, its benchmark data lack column(s) {', '.join(lacking)} "
                "(measured before the benchmark recorded them)")
            continue
        tr, te = holdout_split(len(sub), seed, spec.kernel)
        train, test = sub.iloc[tr], sub.iloc[te]
        fits.splits[spec.kernel] = (train, test)
        column = target_column(target, family)
        t0 = time.perf_counter()
        if spec.method == "mlp":
            cols = {c: train[c].to_numpy(dtype=np.float64) for c in train.columns
                    if pd.api.types.is_numeric_dtype(train[c])}
            if any(f in ROUTE_FEATURES for f in spec.features):
                cols.update(route_columns(spec.route or spec.kernel, len(train)))
            fits.jobs[spec.kernel] = {
                "method": "mlp",
                "raw": feature_matrix(cols, spec.features, len(train)),
                "seconds": learned_seconds(train, platform, column),
                "features": spec.features,
                "kwargs": {"log_features": [f for f in spec.features if f not in spec.raw_features],
                           "work": spec.work, "grid": grid, "epochs": epochs, "seed": seed, "budget_s": budget,
                           "optional": spec.optional_features, "members": MLP_MEMBERS[level]},
            }
            continue
        if spec.method == "roofline":
            for kind in spec.kinds:
                fits.roof_fits[kind] = fit_roofline(train["bytes"].to_numpy(), learned_seconds(train, platform, column))
            f = fits.roof_fits[spec.kinds[0]]
            fits.methods[spec.kernel] = (f"roofline, {len(f.bandwidths)} regime(s), "
                                         f"peak {f.peak_bandwidth / 1e9:.1f} GB/s")
        else:
            fits.jobs[spec.kernel] = {"method": "sigmoid", "msg_bytes": train["msg_bytes"].to_numpy(),
                                      "seconds": train[column].to_numpy()}
            continue
        log(f"    {spec.kernel:<20} {fits.methods[spec.kernel]}  ({time.perf_counter() - t0:.1f} s)")


def _run_jobs(fits: _Fits, specs: list[tuple[str, ModelSpec]], level: Level, log: Callable[[str], None]) -> None:
    """Run the queued jobs (pools of kernels as one net each) and file each result as a net or a curve."""
    jobs, pools = pooled_jobs(fits.jobs, {s.kernel: s for _f, s in specs if s.kernel in fits.jobs})
    fitted = fit_jobs(jobs, fit_workers(level, len(jobs)), log)
    for pool, members in pools.items():
        net = fitted.pop(pool)
        fitted.update(dict.fromkeys(members, net))
        jobs.update({k: jobs[pool] for k in members})
    for _family, spec in specs:
        if spec.kernel not in fitted:
            continue
        if jobs[spec.kernel]["method"] == "sigmoid":
            fits.curves[(spec.kinds[0], int(fits.splits[spec.kernel][0]["world"].iloc[0]))] = fitted[spec.kernel]
            fits.methods[spec.kernel] = "piecewise sigmoid (8 params)"
            continue
        net = fitted[spec.kernel]
        fits.nets.setdefault(spec.model_key, {})[spec.route] = net
        fits.mlp_specs.setdefault(spec.model_key, spec)
        c = net.config
        method = f"MLP {c['layers']}x{c['width']} {c['optimizer']} lr={c['lr']:g}"
        if c.get("members", 1) > 1:
            method += f", {c['members']} nets"
        if c.get("optional", {}).get("used"):
            method += " + " + ", ".join(c["optional"]["features"])
        if POOL_PREFIX + spec.pool in pools:
            method += f", one net over {', '.join(pools[POOL_PREFIX + spec.pool])}"
        fits.methods[spec.kernel] = method


def _models(fits: _Fits, specs: list[tuple[str, ModelSpec]], target: str) -> dict[str, KernelModel]:
    """The kernel models by key from the fitted nets, rooflines and curves; the models of the families
    fitted to their fastest rounds carry their kinds' typical-state factors."""
    models: dict[str, KernelModel] = {}
    for key, by_route in fits.nets.items():
        s = fits.mlp_specs[key]
        models[key] = MLPKernelModel(f"mlp-{key}", s.kinds, by_route, router=s.router, prefix=s.prefix, fill=s.fill,
                                     fallback=s.fallback)
    if fits.roof_fits:
        models["roofline"] = FittedRoofline(fits.roof_fits, generic="add" if "add" in fits.roof_fits else None)
    if fits.curves:
        models["collectives"] = PiecewiseCollective(fits.curves)
    fast = [s for f, s in specs if s.kernel in fits.splits and fits_fastest(target, f)]
    fast_kinds = {k for s in fast for k in s.kinds}
    models.update(state_scaled({key: m for key, m in models.items() if fast_kinds & set(m.kinds)},
                               [fits.splits[s.kernel][0] for s in fast]))
    return models


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0)


def _error_table(fits: _Fits, models: dict[str, KernelModel], specs: list[tuple[str, ModelSpec]],
                 platform: Platform, target: str) -> list[dict]:
    """The held-out error table, one row per fitted kernel, predicted through the KernelModel API (the path
    predictions take)."""
    by_kind = models_by_kind(models.values())
    table: list[dict] = []
    for family, spec in specs:
        if spec.kernel not in fits.splits:
            continue
        train, test = fits.splits[spec.kernel]
        parts = list(test.groupby("kind", sort=False)) if len(test) else []
        row = {"kernel": spec.kernel, "family": family, "samples": int(len(train) + len(test)),
               "test": int(len(test))}
        column = target_column(target, family)
        if fits_fastest(target, family):
            preds = [by_kind[kind].predict(task_view(part, kind), platform) for kind, part in parts]
            # the inner model's prediction is the scaled one over the kind's factor (no second prediction pass)
            pred = _cat([p / by_kind[kind].factor(kind) for p, (kind, _) in zip(preds, parts, strict=True)])
            row.update(held_out_errors(pred, _cat([part[column].to_numpy() for _, part in parts])))
            typical_errors = held_out_errors(_cat(preds), _cat([part["seconds"].to_numpy() for _, part in parts]))
            row["typical"] = {k: typical_errors[k] for k in ("gmae_pct", "gmae_ci90_pct", "mape_pct", "max_pct")}
            row["state_factor"] = by_kind[spec.kinds[0]].factor(spec.kinds[0])
        else:
            pred = _cat([by_kind[kind].predict(task_view(part, kind), platform) for kind, part in parts])
            row.update(held_out_errors(pred, _cat([part["seconds"].to_numpy() for _, part in parts])))
        row["model"] = fits.methods[spec.kernel]
        table.append(row)
    return table


def fit_models(data: dict[str, pd.DataFrame], specs: list[tuple[str, ModelSpec]], level: Level, seed: int,
               platform: Platform, log: Callable[[str], None],
               scale: float = 1.0, target: str = "typical") -> tuple[dict[str, KernelModel], list[dict]]:
    """Fit every kernel model on a random 80 % of its samples and score it on the other 20 %: (models by
    key, the held-out error table). ``target`` (:data:`~predictor.timing.kernels.state.FIT_TARGETS`): ``typical``
    fits each sample's median over its rounds; ``fastest_round`` fits its fastest round and wraps every
    model in :class:`~predictor.timing.kernels.state.StateScaled` with each op kind's measured typical-state
    factor; its table scores the inner model against the held-out fastest rounds (``gmae_pct`` ...) and
    the wrapped model against the held-out medians of rounds (``typical``)."""
    _check_target(data, target)
    fits = _Fits()
    _prepare(fits, data, specs, level, seed, platform, log, scale, target)
    _run_jobs(fits, specs, level, log)
    models = _models(fits, specs, target)
    return models, _error_table(fits, models, specs, platform, target)


def pooled_jobs(jobs: dict[str, dict], specs: dict[str, ModelSpec]) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """``jobs`` with the MLP jobs of each pool of two or more kernels (``ModelSpec.pool``) merged into one job
    (key ``"pool:" + pool``) on the union of their training samples, its grid-search budget the sum of
    theirs; and the member kernels of each merged job. A pool of one stays its kernel's own job."""
    groups: dict[str, list[str]] = {}
    for kernel, spec in specs.items():
        if spec.pool and jobs[kernel]["method"] == "mlp":
            groups.setdefault(spec.pool, []).append(kernel)
    out = dict(jobs)
    pools: dict[str, list[str]] = {}
    for pool, members in groups.items():
        if len(members) < 2:
            continue
        first = specs[members[0]]
        for k in members[1:]:
            s = specs[k]
            if (s.features, s.raw_features, s.optional_features, s.work) != (
                    first.features, first.raw_features, first.optional_features, first.work):
                raise CalibrationError(f"pooled kernel models {members[0]} and {k} (pool {pool!r}) differ in "
                                       "their features or work: one net needs one input layout")
        parts = [out.pop(k) for k in members]
        kwargs = dict(parts[0]["kwargs"])
        if kwargs.get("budget_s") is not None:
            kwargs["budget_s"] = sum(p["kwargs"]["budget_s"] for p in parts)
        out[POOL_PREFIX + pool] = {"method": "mlp", "raw": np.concatenate([p["raw"] for p in parts]),
                                   "seconds": np.concatenate([p["seconds"] for p in parts]),
                                   "features": parts[0]["features"], "kwargs": kwargs}
        pools[POOL_PREFIX + pool] = members
    return out, pools


def state_scaled(models: dict[str, KernelModel], trains: list[pd.DataFrame]) -> dict[str, KernelModel]:
    """Every model wrapped in :class:`~predictor.timing.kernels.state.StateScaled` with the typical-state factor
    of each of its kinds (:func:`~predictor.timing.kernels.state.state_factor` over the kind's training samples;
    ``"*"``, for kinds a model times without data of their own, the median of its kinds' factors)."""
    rows = pd.concat(trains, ignore_index=True) if trains else pd.DataFrame()
    out: dict[str, KernelModel] = {}
    for key, model in models.items():
        factors = {}
        for kind in model.kinds:
            part = rows[rows["kind"] == kind] if len(rows) else rows
            if len(part):
                factors[kind] = state_factor(part["seconds"].to_numpy(), part[TARGET_COLUMN["fastest_round"]].to_numpy(),
                                             part["rounds"].to_numpy() if "rounds" in part else None)
        factors["*"] = float(np.median(list(factors.values()))) if factors else 1.0
        out[key] = StateScaled(model, factors)
    return out
