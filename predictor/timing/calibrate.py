"""Calibrate a device: run the microbenchmarks, fit every kernel model, write an asset pack.

``calibrate(device, out, quick, world_size)`` is what ``tuner calibrate`` runs:

1. the platform to refine: on CPU the measured ``cpu-local`` entry
   (:func:`~predictor.timing.platforms.cpu_local.measure_cpu_local`), on CUDA the catalog entry of
   the GPU's model;
2. every benchmark family of :mod:`predictor.timing.calibration` on the device (grid size by level:
   ``tiny`` for tests, ``quick`` for a few minutes on a 2-core CPU, ``full`` for real
   devices), collectives on ``world_size`` local processes (gloo on CPU, NCCL on GPUs), and
   the host overheads T1..T5 from a profiled training run;
3. per kernel a random 20 % of the samples is held out; the model of the kernel (MLP with
   the grid search of Lin et al. 2022 Table II, fitted roofline, or piecewise sigmoid) is
   fitted on the other 80 % and its error on the held-out 20 % is reported as Table I of the
   paper does: GMAE, MAPE and the standard deviation of the absolute percentage errors;
4. the calibrated platform (measured peak FLOP/s, bandwidths, collective latency, overheads)
   and the models are written as an asset pack (:mod:`predictor.timing.platforms.assets`) that
   ``--platform NAME`` then uses.
"""

from __future__ import annotations

import datetime as _dt
import io
import math
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from predictor.graph import PARAM_COLUMNS
from predictor.metrics import (
    geomean_abs_pct_error,
    geomean_abs_pct_error_interval,
    max_abs_pct_error,
    mean_abs_pct_error,
)
from predictor.timing.calibration import make_benchmarks
from predictor.timing.calibration.base import BenchContext, Benchmark, Level, ModelSpec
from predictor.timing.calibration.timing import ESTIMATOR, Timer, typical
from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.kernels.collective import (
    PiecewiseCollective,
    fit_piecewise_sigmoid,
    latency_steps,
    wire_factor,
)
from predictor.timing.kernels.learned import (
    DERIVED_FEATURES,
    KNOWN_TERM_KINDS,
    QUICK_GRID,
    ROUTE_FEATURES,
    TABLE_II_GRID,
    TINY_GRID,
    FittedRoofline,
    MLPKernelModel,
    feature_matrix,
    fit_mlp,
    fit_roofline,
    route_columns,
)
from predictor.timing.kernels.state import FIT_TARGETS, StateScaled, fits_fastest, state_factor, unwrap
from predictor.timing.kernels.timing import models_by_kind
from predictor.timing.platforms.assets import (
    AssetPack,
    load_asset_pack,
    register_asset_pack,
    write_asset_pack,
)
from predictor.timing.platforms.cpu_local import fp32_lanes
from predictor.timing.platforms.schema import Platform

__all__ = ["calibrate", "CalibrationError", "parse_device", "error_table_markdown", "HOLDOUT_FRACTION", "round_spreads",
           "compute_round_spread", "NOISY_ROUND_SPREAD_PCT"]

#: share of each kernel's samples held out for the error table
HOLDOUT_FRACTION = 0.2
#: the benchmark-data column each fit target (:data:`~predictor.timing.kernels.state.FIT_TARGETS`) fits: the median
#: over a sample's rounds, or the median of the repeats of its fastest round
TARGET_COLUMN = {"typical": "seconds", "fastest_round": "median_s"}


def _target_column(target: str, family: str) -> str:
    """The data column fit target ``target`` fits family ``family`` to (:data:`TARGET_COLUMN`)."""
    return TARGET_COLUMN["fastest_round" if fits_fastest(target, family) else "typical"]

#: wall-clock budget per benchmark family, seconds, by level
BUDGETS: dict[str, dict[str, float]] = {
    "tiny": {"default": 3.0, "collectives": 10.0},
    # quick: 370 s in all, so that with the fits, the contention probe and the overheads a calibration ends
    # inside 10 minutes on a slower 2-core CPU too (the AVX2 VM of session 22: 887 s with 500 s here, float64
    # fits, 5 nets and 8 contention rounds of 1 s slots; 635 s with 400 s, float32 fits, 0.75 s slots)
    "quick": {"gemm": 66.0, "conv2d": 33.0, "embedding_bag": 122.0, "elementwise": 56.0, "layer_norm": 15.0,
              "softmax": 33.0, "data_movement": 22.0, "collectives": 23.0, "reduction": 12.0, "default": 22.0},
    "full": {"default": 1800.0},
}
#: rounds over every benchmark grid, by level (a shape keeps the median of its rounds; a family with
#: `Benchmark.spread_rounds` times each shape in one round only)
PASSES = {"tiny": 1, "quick": 3, "full": 3}
#: most rounds ``calibrate(rounds=)`` takes
MAX_ROUNDS = 15
#: MLP training: grid, epochs, seconds per kernel, by level
MLP_SETTINGS = {
    "tiny": (TINY_GRID, 150, 5.0),
    "quick": (QUICK_GRID, 1500, 45.0),
    "full": (TABLE_II_GRID, 3000, 1800.0),
}
#: networks per MLP, by level (:func:`~predictor.timing.kernels.learned.fit_mlp` ``members``: the winning
#: configuration trained from that many initial seeds, their geometric mean predicted). Quick: 3 since
#: session 22 (5 before), for the 10-minute bound on a slower CPU; a refit of an older quick pack fits 3
MLP_MEMBERS = {"tiny": 1, "quick": 3, "full": 5}
#: rounds after the first time only the cases the first round reached (every sample the median of
#: all rounds), with this multiple of their share of the family budget so they finish the set
LATER_ROUND_SLACK = 1.25
#: the host-contention probe by level: seconds of one time slot, and rounds (each 3 probes x (world + 1) slots)
CONTENTION_SLOT_S = {"tiny": 0.3, "quick": 0.75, "full": 1.0}
CONTENTION_ROUNDS = {"tiny": 1, "quick": 6, "full": 8}
#: probes ``--families`` may name besides the benchmark families (they fit no kernel model): the embedding
#: step-reuse curve (:mod:`predictor.timing.calibration.step_reuse`; also run with the embedding_bag family) and
#: the lockstep factor of K ranks (:mod:`predictor.timing.calibration.lockstep`; also run with the collectives)
PROBES = ("step_reuse", "lockstep")
#: bounds of ``--scale`` (multiple of a level's shapes and time)
MIN_SCALE, MAX_SCALE = 0.25, 64.0


def _check_fit_target(fit_target: str) -> str:
    """``fit_target`` if it is one of :data:`~predictor.timing.kernels.state.FIT_TARGETS`; else CalibrationError."""
    if fit_target not in FIT_TARGETS:
        raise CalibrationError(f"--fit-target {fit_target}: expected one of {', '.join(FIT_TARGETS)}")
    return fit_target


def collective_passes(level: Level, scale: float = 1.0) -> int:
    """Passes the collective ranks make over every size (their median is kept): the level's rounds,
    times ``scale`` (``--scale``), at least the level's rounds."""
    return max(PASSES[level], round(PASSES[level] * scale))


class CalibrationError(ValueError):
    """Bad calibration input (no such device, impossible world size): one-line message."""


def parse_device(device: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` -> a torch device that exists here.

    Raises:
        CalibrationError: unknown device string, or CUDA requested on a machine without it.
    """
    d = device.strip().lower()
    if d == "cpu":
        return torch.device("cpu")
    if d == "cuda" or d.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise CalibrationError(f"--device {device}: CUDA is not available on this machine (torch {torch.__version__})")
        idx = 0
        if ":" in d:
            try:
                idx = int(d.split(":", 1)[1])
            except ValueError:
                raise CalibrationError(f"--device {device}: expected cuda:N with an integer N") from None
        if not 0 <= idx < torch.cuda.device_count():
            raise CalibrationError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return torch.device("cuda", idx)
    raise CalibrationError(f"--device {device}: expected cpu, cuda or cuda:N")


def _kernel_subset(kernels: list[str] | None, benches: list, fit: bool, ctx: BenchContext) -> frozenset[str] | None:
    """``--kernels`` checked against the run families: each label must be a kernel of one of them that is timed
    by the generic case loop (:func:`~predictor.timing.calibration.base.run_cases`), and the spell must not be fitted
    (its other kernels have no samples). None: no subset."""
    if kernels is None:
        return None
    wanted = [k.strip() for k in kernels if k.strip()]
    if not wanted:
        raise CalibrationError("--kernels: names no kernel")
    if fit:
        raise CalibrationError(f"--kernels {','.join(wanted)}: a spell of some kernels is data to pool, not a pack; "
                               "add --no-fit and merge it with --refit PACK --data-from FAMILY:KERNEL=THIS")
    narrowable = {s.kernel for b in benches if type(b).run is Benchmark.run for s in b.specs(ctx)}
    for k in wanted:
        if k not in narrowable:
            raise CalibrationError(f"--kernels: {k!r} is no kernel of the families run that can be timed alone; "
                                   f"known: {', '.join(sorted(narrowable)) or 'none'}")
    return frozenset(wanted)


def calibrate(
    device: str = "cpu",
    out: str | Path = "assets/cpu-local",
    quick: bool = False,
    world_size: int = 1,
    *,
    tiny: bool = False,
    threads: int | None = None,
    name: str | None = None,
    seed: int = 0,
    families: list[str] | None = None,
    memory_bound: str | None = None,
    gemm_timing: str = "warm",
    log: Callable[[str], None] = print,
    register: bool = True,
    fit: bool = True,
    scale: float = 1.0,
    fit_target: str = "typical",
    rounds: int | None = None,
    kernels: list[str] | None = None,
) -> AssetPack:
    """Benchmark ``device``, fit every kernel model, write the asset pack ``out``; return it loaded.

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        out: pack folder to write (replaced atomically if it exists).
        quick: the quick grids (minutes on a 2-core CPU) instead of the full ones.
        world_size: local processes for the collective benchmarks (1: no collectives; the
            pack then keeps the analytic collective model).
        tiny: test-sized grids (seconds); overrides ``quick``.
        threads: torch intra-op threads for the CPU benchmarks (default: torch's current).
        name: pack and platform name (default: the folder name of ``out``).
        seed: RNG seed of the shape grids and the held-out split.
        families: benchmark families to run (default: all).
        memory_bound: ``"cold"`` or ``"warm"``: how the memory-bound families are timed (see
            :attr:`~predictor.timing.calibration.base.BenchContext.cold_memory_bound`); default cold on a
            CPU, warm on a GPU.
        gemm_timing: ``"warm"`` (default) or ``"cold"``: how the GEMMs are timed (see
            :attr:`~predictor.timing.calibration.base.BenchContext.cold_gemm`).
        log: progress lines.
        register: remember the pack's location so ``--platform NAME`` finds it anywhere.
        fit: ``False`` writes the benchmarks and overheads only (manifest ``"fitted": false``, no
            models) and returns the pack unfitted; :func:`refit` fits it later, anywhere (the device
            time goes to measuring, the CPU time of fitting to a machine that costs nothing). Such a
            pack cannot be used for predictions until it is refitted.
        scale: ``K`` times the level's shapes per grid (:meth:`~.calibration.base.BenchContext.count`),
            time budget per family, collective passes and MLP fitting budget: a longer calibration
            whose learned models see more data (``--quick --scale 4``: about 40 minutes on the
            2-core VM; held-out GEMM error falls with more shapes, ``benchmarks/results/kernels_cpu.md``).
        fit_target: ``"typical"`` fits each sample's median over its rounds; ``"fastest_round"`` its fastest
            round, times each op kind's measured typical-state factor (:mod:`predictor.timing.kernels.state`);
            ``"fastest_collectives"`` the collectives so and every other family typical.
        rounds: timed rounds over every grid (default: the level's, :data:`PASSES`). A family's time budget is
            shared by its rounds, so more rounds time fewer shapes, each the median of more rounds: for families
            whose models have few parameters (the element-wise rooflines) a cleaner sample can be worth more
            than another shape.
        kernels: time only these kernels of the run families (labels as in the error table, e.g. ``bmm/fp32``),
            which then get their families' whole time budgets: a spell of one kernel to pool into a pack with
            ``refit(data_from=...)``. Needs ``fit=False``; families with their own timing loop (embedding bags,
            collectives) cannot be narrowed.

    Raises:
        CalibrationError: bad device, world size, ``memory_bound``, ``gemm_timing``, ``scale``, ``rounds``,
            ``fit_target`` or ``kernels``.
    """
    dev = parse_device(device)
    level: Level = "tiny" if tiny else ("quick" if quick else "full")
    if world_size < 1:
        raise CalibrationError(f"--world-size {world_size}: must be >= 1")
    if dev.type == "cuda" and world_size > torch.cuda.device_count():
        raise CalibrationError(
            f"--world-size {world_size}: NCCL needs one GPU per rank and this machine has "
            f"{torch.cuda.device_count()}; use --world-size 1 (the pack then keeps the analytic collective model)"
        )
    from predictor.timing.calibration import FAMILIES

    unknown = [f for f in families or [] if f not in FAMILIES and f not in PROBES]
    if unknown:
        raise CalibrationError(f"--families: unknown benchmark family {unknown[0]!r}; known: "
                               f"{', '.join([*FAMILIES, *PROBES])}")
    if families is not None and "lockstep" in families and (dev.type != "cpu" or world_size < 2):
        raise CalibrationError("--families lockstep: the lockstep probe runs K CPU processes in lockstep; it needs "
                               "--device cpu and --world-size 2 or more")
    if families is not None and "step_reuse" in families and dev.type != "cpu":
        raise CalibrationError("--families step_reuse: the step-reuse probe times a CPU's last-level cache; it needs "
                               "--device cpu")
    bench_families = None if families is None else [f for f in families if f in FAMILIES]
    if bench_families == [] and fit:
        raise CalibrationError(f"--families {','.join(families or [])}: measures no kernels to fit; add --no-fit "
                               "and merge it into a pack with --refit PACK --data-from PROBE=THIS")
    out = Path(out)
    pack_name = (name or out.name).strip().lower()
    if not pack_name:
        raise CalibrationError(f"--out {out}: cannot derive a pack name; pass --name")
    if dev.type == "cpu" and threads is not None:
        if threads < 1:
            raise CalibrationError(f"--threads {threads}: must be >= 1")
        torch.set_num_threads(threads)
    n_threads = torch.get_num_threads()
    cpu_sig = _cpu_signature() if dev.type == "cpu" else None  # the manifest records it too
    simd_lanes = fp32_lanes(cpu_sig["torch_capability"]) if cpu_sig is not None else 16
    if memory_bound not in (None, "cold", "warm"):
        raise CalibrationError(f"--memory-bound {memory_bound}: expected cold or warm")
    if gemm_timing not in ("cold", "warm"):
        raise CalibrationError(f"--gemm-timing {gemm_timing}: expected cold or warm")
    if not (math.isfinite(scale) and MIN_SCALE <= scale <= MAX_SCALE):
        raise CalibrationError(f"--scale {scale}: must be between {MIN_SCALE:g} and {MAX_SCALE:g}")
    _check_fit_target(fit_target)
    if rounds is not None and not 1 <= rounds <= MAX_ROUNDS:
        raise CalibrationError(f"--rounds {rounds}: must be between 1 and {MAX_ROUNDS}")
    started = time.perf_counter()

    base = _base_platform(dev, level)
    llc_bytes = base.last_level_cache_bytes or 32 * 2**20
    # CPU: memory-bound kernels are timed cold (see BenchContext.cold_memory_bound); on a GPU they
    # stay warm by default (not validated there: its caches and the sizes of a step's tensors differ)
    cold_memory = memory_bound == "cold" or (memory_bound is None and dev.type == "cpu")
    rng = np.random.default_rng(seed)
    timer = Timer(dev, warmup=2, repeats={"tiny": 3, "quick": 7, "full": 15}[level],
                  cold_repeats={"tiny": 2, "quick": 5, "full": 9}[level],
                  cache_bytes=llc_bytes)
    budgets = BUDGETS[level]
    # one benchmark tensor: 256 MiB on a CPU; on a GPU 2 GiB or a 16th of its memory, whichever is
    # smaller (embedding tables reach 4x this: 8 GiB on an 80 GB H100, 4 GiB on a 16 GB card)
    max_tensor = 256 * 2**20 if dev.type != "cuda" else \
        min(2 * 2**30, torch.cuda.get_device_properties(dev).total_memory / 16)
    data: dict[str, pd.DataFrame] = {}
    specs: list[tuple[str, ModelSpec]] = []
    benches = make_benchmarks(world_size, bench_families) if bench_families != [] else []
    only_kernels = _kernel_subset(kernels, benches, fit, BenchContext(device=dev, level=level,
                                  rng=np.random.default_rng(0), timer=timer))
    log(f"calibrating {dev} ({level} grids" + (f" x{scale:g}" if scale != 1 else "")
        + (f", {rounds} rounds" if rounds is not None else "")
        + (f", only {','.join(sorted(only_kernels))}" if only_kernels else "")
        + f", {n_threads} torch thread(s), world size {world_size}) -> {out}")
    seeds = {b.name: int(rng.integers(2**62)) for b in benches}
    passes = int(rounds) if rounds is not None else PASSES[level]
    # CPU with several ranks: the host-contention and lockstep probes run in bursts, one after each round,
    # so that, as the kernels' rounds, they sample the host over the whole calibration and not one minute of
    # it (on the Zen 4 VM the lockstep factor read x1.14 at the end of a calibration, x1.04-1.11 in six
    # probes over the next two hours)
    host_ranks = dev.type == "cpu" and world_size >= 2
    with_collectives = families is None or "collectives" in families
    want_contention = host_ranks and with_collectives
    want_lockstep = host_ranks and (with_collectives or "lockstep" in families)  # alone: merged with --data-from
    contention_probe: list = []
    lockstep_probe: list = []
    runs: dict[str, list[pd.DataFrame]] = {}
    spent: dict[str, float] = {}
    #: grid indices each family's first round reached; later rounds time these only
    reached: dict[str, frozenset[int]] = {}
    # each grid is run `passes` times, every family once per round, so two timings of one shape
    # lie minutes apart (the shared machine's slow spells last seconds to minutes); a shape
    # keeps the median of its rounds, and rounds after the first re-time the shapes the first reached
    for p in range(passes):
        for bench in benches:
            if bench.name == "collectives" and p:
                continue  # its ranks make their own passes
            ctx = BenchContext(
                device=dev, level=level, rng=np.random.default_rng(seeds[bench.name]), timer=timer,
                budget_s=scale * budgets.get(bench.name, budgets["default"]) / passes
                * (LATER_ROUND_SLACK if p and bench.name in reached else 1.0), log=log,
                llc_bytes=llc_bytes,
                max_tensor_bytes=max_tensor if level != "tiny" else 16 * 2**20,
                passes=collective_passes(level, scale) if bench.name == "collectives" else 1,
                scale=scale if level != "tiny" else 1.0,
                shuffle_seed=seeds[bench.name] + 1 + p,
                cold_memory_bound=cold_memory,
                cold_gemm=gemm_timing == "cold",
                part=(p, passes) if bench.spread_rounds else None,
                only=reached.get(bench.name) if p else None,
                kernels=only_kernels,
                threads=n_threads,
                simd_lanes=simd_lanes,
            )
            t0 = time.perf_counter()
            frame = bench.run(ctx)
            spent[bench.name] = spent.get(bench.name, 0.0) + time.perf_counter() - t0
            if frame is not None and not frame.empty:
                runs.setdefault(bench.name, []).append(frame)
                if p == 0 and bench.retimes_first_round and not bench.spread_rounds and "case" in frame:
                    reached[bench.name] = frozenset(int(c) for c in frame["case"])
                if p == 0:
                    specs += [(bench.name, s) for s in bench.specs(ctx)]
        if want_contention or want_lockstep:
            contention_probe, lockstep_probe = _host_probe_burst(
                p, passes, world_size, n_threads, level, llc_bytes, contention_probe if want_contention else None,
                lockstep_probe if want_lockstep else None, log)
        log(f"  round {p + 1} of {passes} done ({time.perf_counter() - started:.0f} s)")
    for bench in benches:
        if bench.name not in runs:
            log(f"  {bench.name:<14} skipped" + (" (world size 1)" if bench.name == "collectives" else ""))
            continue
        data[bench.name] = _merge_passes(runs[bench.name])
        log(f"  {bench.name:<14} {len(data[bench.name]):5d} samples, {spent[bench.name]:6.1f} s")

    from predictor.timing.calibration.overheads import measure_overheads

    t0 = time.perf_counter()
    overheads = measure_overheads(dev, iterations=4 if level == "tiny" else 12)
    log(f"  {'overheads':<14} T1..T5 from a profiled run in {time.perf_counter() - t0:6.1f} s")

    if dev.type == "cpu":
        t0 = time.perf_counter()
        base = _with_page_faults(base, level)
        log(f"  {'page faults':<14} {base.page_fault_s * 1e6:.2f} us per 4 KiB fault; blocks >= "
            f"{base.fresh_mapping_bytes / 2**20:.0f} MiB mapped afresh ({time.perf_counter() - t0:.1f} s)")

    step_reuse_probe: list[dict] = []
    if dev.type == "cpu" and (families is None or "embedding_bag" in families or "step_reuse" in families):
        t0 = time.perf_counter()
        base, step_reuse_probe = _with_step_reuse(base, level, llc_bytes, seed, log)
        log(f"  {'step reuse':<14} embedding step / cold at working sets / LLC "
            + ", ".join(f"{x:.2g}: x{f:.2f} / x{b:.2f}" for x, f, b in base.embedding_step_reuse)
            + f" ({time.perf_counter() - t0:.1f} s)")
        if base.embedding_step_reuse_pooling:
            log(f"  {'':<14} backward per pooling (lookups per sample) at each working set: " + "; ".join(
                f"{x:.2g}: " + " ".join(f"{p:g}:x{b:.2f}" for x2, p, _, b in base.embedding_step_reuse_pooling
                                        if x2 == x) for x in sorted({q[0] for q in base.embedding_step_reuse_pooling})))

    contention: dict[str, float] = {}
    if contention_probe:
        from predictor.timing.calibration.contention import CONTENTION_ESTIMATOR, factors

        contention = factors(contention_probe, CONTENTION_ESTIMATOR)
        log(f"  {'contention':<14} {world_size} processes at once: "
            + ", ".join(f"{k} x{v:.2f}" for k, v in contention.items())
            + f" (median of {len(contention_probe[0]['compute'])} rounds in {passes} burst(s))")
    if lockstep_probe:
        from predictor.timing.calibration.lockstep import lockstep_factor

        contention["sync"] = lockstep_factor(lockstep_probe)
        log(f"  {'lockstep':<14} {world_size} processes in lockstep: x{contention['sync']:.3f} "
            f"(median of {len(lockstep_probe[0]['free_s'])} rounds in {passes} burst(s))")

    manifest_extra = {
        "cpu_model": _cpu_model() if dev.type == "cpu" else torch.cuda.get_device_name(dev),
        **({"cpu": cpu_sig} if cpu_sig is not None else {}),
        "threads": n_threads,
        "level": level,
        "world_size": world_size,
        "seed": seed,
        "holdout_fraction": HOLDOUT_FRACTION,
        "timing_estimator": ESTIMATOR,
        #: rounds over every grid; families that time each shape once, spread over the rounds
        "rounds": passes,
        #: multiple of the level's shapes, budgets and collective passes (``--scale``)
        "scale": scale,
        #: what each sample's model is fitted to (predictor/timing/kernels/state.py): the median of its rounds
        #: ("typical") or its fastest round times the kind's typical-state factor ("fastest_round")
        "fit_target": fit_target,
        "spread_rounds": [b.name for b in benches if b.spread_rounds],
        #: families whose first round shares its time equally between their kernels (Benchmark.time_fair)
        "time_fair": [b.name for b in benches if b.time_fair],
        #: the benchmark families in the order their grid seeds were drawn from ``seed`` (a family's
        #: shapes can be rebuilt from it: ``benchmarks/heldout_retime_cpu.py``)
        "families": [b.name for b in benches],
        #: the kernels timed when ``--kernels`` narrowed the families (absent: every kernel of each)
        **({"kernels": sorted(only_kernels)} if only_kernels is not None else {}),
        #: what rounds after the first time: "reached" = the shapes the first round reached (every sample
        #: the median of all rounds; packs before session 16 drew each round afresh: "fresh")
        "later_rounds": "reached",
        #: how the memory-bound families were timed: "cold" (cache evicted before each call) or "warm"
        "memory_bound_timing": "cold" if cold_memory else "warm",
        #: how the GEMMs were timed: "warm" (repeated on one instance) or "cold" (as memory-bound ones)
        "gemm_timing": gemm_timing,
        #: the untimed embedding-bag call between the cache eviction and a timed one: "neighbour" = a
        #: typical other table's (calibration.embedding_bag.neighbour_warmers, since session 18); "tiny"
        #: (packs without the key): the same op on a 256-row table
        "embedding_warmup": "neighbour",
        #: wall seconds of one minor page fault (CPU; 0: not measured) and the allocation size from
        #: which every step's block faults afresh, bytes (see predictor/timing/calibration/page_faults.py)
        "page_fault_s": base.page_fault_s,
        "fresh_mapping_bytes": base.fresh_mapping_bytes,
        "overheads": overheads,
        "host_contention": {str(world_size): contention} if contention else {},
        #: the contention probe's raw timings (per process, per class, [alone_s, together_s] per round),
        #: so that a refit can estimate the factors again (contention.factors)
        **({"host_contention_probe": {"world": world_size, "estimator": CONTENTION_ESTIMATOR,
                                      "per_process": contention_probe}} if contention_probe else {}),
        #: the lockstep probe's raw timings per process and round (predictor/timing/calibration/lockstep.py): the
        #: ``sync`` factor of host_contention
        **({"lockstep_probe": {"world": world_size, "per_process": lockstep_probe}} if lockstep_probe else {}),
        #: the step-reuse probe's raw sums (predictor/timing/calibration/step_reuse.py), per round and working set
        **({"embedding_step_reuse_probe": {"estimator": STEP_REUSE_ESTIMATOR, "rows": step_reuse_probe}}
           if step_reuse_probe else {}),
        #: seconds of benchmarking (and overhead / contention measurement), before any fitting
        "benchmark_s": round(time.perf_counter() - started, 1),
    }
    if not fit:  # the pack writes its data as stored; the fit below fits them so (_fit_and_write)
        return _write_unfitted(out, pack_name, dev, base, data, manifest_extra, started, log)
    return _fit_and_write(out, pack_name, dev, base, data, specs, level, seed, world_size, overheads, contention,
                          manifest_extra, started, log, register)


def _read_overheads(path: Path) -> dict:
    """T1..T5 (seconds) from a JSON written by ``python -m predictor.timing.calibration.overheads``."""
    import json

    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"--overheads {path}: not a readable JSON file ({exc})") from None
    if not isinstance(d, dict):
        raise CalibrationError(f"--overheads {path}: expected a JSON object with t1_s..t5_s")
    for k in ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s"):
        v = d.get(k)
        if not isinstance(v, int | float) or not np.isfinite(v) or v < 0:
            raise CalibrationError(f"--overheads {path}: {k} must be a non-negative number of seconds, got {v!r}")
    return d


def as_stored(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as a pack stores it and reads it back (floats to
    :data:`~predictor.timing.platforms.assets.STORED_FLOAT_FORMAT`): a calibration fits exactly the samples it writes,
    so a :func:`refit` of its pack reproduces its models and error table."""
    from predictor.timing.platforms.assets import STORED_FLOAT_FORMAT

    return pd.read_csv(io.StringIO(frame.to_csv(index=False, float_format=STORED_FLOAT_FORMAT)))


def _fit_and_write(out: Path, pack_name: str, dev: torch.device, base: Platform, data: dict[str, pd.DataFrame],
                   specs: list[tuple[str, ModelSpec]], level: Level, seed: int, world_size: int, overheads: dict,
                   contention: dict[str, float], manifest_extra: dict, started: float,
                   log: Callable[[str], None], register: bool) -> AssetPack:
    """Fit every kernel model to ``data`` as the pack stores it (:func:`as_stored`: a refit whose ``--match-level``
    rescaled taken samples fits them rounded as written, so a later plain refit reproduces it), build the
    calibrated platform, write (and register) the pack."""
    data = {family: as_stored(frame) for family, frame in data.items()}
    t0 = time.perf_counter()
    models, table = _fit_all(data, specs, level, seed, base, log, scale=float(manifest_extra.get("scale", 1.0)),
                             target=str(manifest_extra.get("fit_target", "typical")))
    log(f"  fitted {len(models)} kernel models in {time.perf_counter() - t0:.1f} s")
    platform = _calibrated_platform(base, pack_name, data, models, overheads, world_size, contention)
    extra = {**manifest_extra, "calibration_s": round(time.perf_counter() - started, 1)}
    if contention:  # a refit may have estimated them again from the stored probe
        extra["host_contention"] = {str(world_size): dict(contention)}
    write_asset_pack(out, name=pack_name, device=str(dev), platform=platform, models=models, error_table=table,
                     data=data, manifest_extra=extra, errors_md=error_table_markdown(table))
    if register:
        register_asset_pack(pack_name, out)
    log(f"wrote asset pack {pack_name} to {out} in {time.perf_counter() - started:.0f} s")
    return load_asset_pack(out)


def _write_unfitted(out: Path, pack_name: str, dev: torch.device, base: Platform, data: dict[str, pd.DataFrame],
                    manifest_extra: dict, started: float, log: Callable[[str], None]) -> AssetPack:
    """Write the benchmark data and the manifest of a pack whose models are fitted later by :func:`refit`."""
    extra = {**manifest_extra, "fitted": False, "calibration_s": round(time.perf_counter() - started, 1)}
    write_asset_pack(out, name=pack_name, device=str(dev), platform=base, models={}, data=data,
                     manifest_extra=extra)
    log(f"wrote the benchmarks of {pack_name} to {out} in {time.perf_counter() - started:.0f} s, not fitted: "
        + (f"pool them into a pack with tuner calibrate --refit PACK --data-from FAMILY:KERNEL={out}"
           if manifest_extra.get("kernels") else f"tuner calibrate --refit {out}"))
    return load_asset_pack(out, allow_unfitted=True)


def _read_benchmark_table(f: Path, context: str) -> pd.DataFrame:
    """A pack's stored benchmark table ``data/<family>.csv``; CalibrationError ``context: f: not a benchmark
    table`` when it does not parse."""
    try:
        return pd.read_csv(f)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{context}: {f}: not a benchmark table ({exc})") from None


#: manifest fields that say how a pack's samples were timed: a family's data taken from another pack
#: (``refit(data_from=)``) must agree with the refitted pack's on each, or the fit mixes protocols
TIMING_FIELDS = ("device", "threads", "gemm_timing", "memory_bound_timing", "embedding_warmup", "timing_estimator")
#: what the lockstep probe depends on (its own fixed GEMM loop and one-float all-reduce per segment): a probe
#: calibrated with other kernel-timing flags still fits
LOCKSTEP_TIMING_FIELDS = ("device", "threads")
#: the timing fields that concern only some families: a softmax table from a calibration whose GEMMs were timed
#: warm was timed exactly as one from a cold-GEMM calibration (every other field concerns every family)
FIELD_FAMILIES: dict[str, tuple[str, ...]] = {
    "gemm_timing": ("gemm",),
    "memory_bound_timing": ("elementwise", "layer_norm", "softmax", "data_movement", "reduction"),
    "embedding_warmup": ("embedding_bag", "step_reuse"),
}


def timing_fields(family: str) -> tuple[str, ...]:
    """The manifest fields (:data:`TIMING_FIELDS`) on which ``family``'s samples depend: a pack whose data
    for ``family`` are taken into another (``refit(data_from=)``) must agree with it on these."""
    if family == "lockstep":
        return LOCKSTEP_TIMING_FIELDS
    return tuple(k for k in TIMING_FIELDS if family in FIELD_FAMILIES.get(k, (family,)))


def parse_data_source(key: str) -> tuple[str, tuple[str, ...]]:
    """``FAMILY`` or ``FAMILY:KERNEL[,KERNEL...]`` (a ``--data-from`` key): (the family, the kernels taken
    from the other pack; empty for the whole family)."""
    family, colon, sel = key.partition(":")
    kernels = tuple(dict.fromkeys(k.strip() for k in sel.split(",") if k.strip()))
    if colon and not kernels:
        raise CalibrationError(f"--data-from {key}: no kernel named after the colon (expected "
                               "FAMILY:KERNEL[,KERNEL...]=PACK)")
    return family.strip(), kernels


#: the columns of a benchmark table that hold a time per call (seconds): what :func:`match_level` rescales
TIME_COLUMNS = ("seconds", "median_s", "lq_s", "min_s", "mean_s", "call_mean_s")


def match_level(table: pd.DataFrame, models: Iterable[KernelModel], platform: Platform
                ) -> tuple[pd.DataFrame, dict[str, float]]:
    """``table`` (one family's samples from another calibration of the same machine) brought to the pace of the
    pack whose ``models`` and ``platform`` are given: each kernel's times divided by its ``level``, the median over
    its samples of measured time / the pack's own prediction. A shared VM runs some spells ~10 % slower as a whole
    (the Zen 4 VM's GEMMs re-timed x0.9-1.2 of their calibration over a day); a longer calibration from such a
    spell then contributes its shapes without moving every prediction by its spell's pace. Returns (the rescaled
    table, ``kernel -> level``). CalibrationError when the pack has no model for a kind of the table."""
    by_kind = models_by_kind(models)
    out = table.copy()
    levels: dict[str, float] = {}
    for kernel, idx in table.groupby("kernel", sort=False).groups.items():
        ratios = []
        for kind, part in table.loc[idx].groupby("kind", sort=False):
            model = by_kind.get(str(kind))
            if model is None:
                raise CalibrationError(f"--match-level: the refitted pack has no model of {kind!r} (kernel "
                                       f"{kernel!r}) to take the pace from")
            pred = np.asarray(model.predict(_view(part, str(kind)), platform), dtype=np.float64)
            ratios.append(part["seconds"].to_numpy(dtype=np.float64) / pred)
        r = np.concatenate(ratios)
        r = r[np.isfinite(r) & (r > 0)]
        if r.size == 0:
            raise CalibrationError(f"--match-level: no valid sample of kernel {kernel!r}")
        level = float(np.median(r))
        for col in TIME_COLUMNS:
            if col in out:
                out.loc[idx, col] = out.loc[idx, col].to_numpy(dtype=np.float64) / level
        levels[str(kernel)] = level
    return out, levels


def _family_data_from(m: dict, data_from: Mapping[str, str | Path | Sequence[str | Path]]
                      ) -> tuple[dict[str, pd.DataFrame | list], dict, dict[str, tuple[str, ...]], list[dict]]:
    """Benchmark tables of some families from other packs (``family -> pack``), checked to be measured
    the way the refitted pack's (manifest ``m``) were and on the same CPU: (tables by family, the record of
    where each came from, the kernels taken per family where only some are, the record of each table
    taken: ``parts[i]`` is the entry of the rows whose ``_part`` is ``i``); for a probe of :data:`PROBES`
    its raw rows (a list) instead of a table. A key ``family:k1,k2`` takes only those kernels' rows (the
    refitted pack keeps its other kernels' samples of the family): a longer calibration then replaces the
    kernels it measured better, not the family's noisier ones with them. One family may be named by
    several keys whose kernels do not overlap (``gemm:addmm/fp32=A`` and ``gemm:addmm/bf16=B``).
    A key may map to several packs (a list): their samples are pooled, so the models learn the kernel over
    several spells of the machine rather than one. Every table carries a ``_part`` column (one value per
    key and pack) that :func:`refit` uses to bring each spell to the pack's pace apart and then drops. The
    lockstep probe may come from several packs too: each process's rounds are pooled over them, so the factor
    is the median over probes taken in several spells of the machine rather than one minute of it.
    CalibrationError, naming the family and the pack, when one cannot be used."""
    from predictor.timing.calibration import FAMILIES
    from predictor.timing.platforms.assets import AssetPackError
    from predictor.timing.platforms.cpu_local import same_cpu

    tables, record, selected = {}, {}, {}
    items: list[tuple[str, str, tuple[str, ...], str | Path]] = []
    named: dict[str, list[tuple[str, tuple[str, ...]]]] = {}  # family -> its keys and their kernels
    for key, src in data_from.items():
        family, kernels = parse_data_source(key)
        many = list(src) if isinstance(src, list | tuple) else [src]
        if len(many) > 1 and family in PROBES and family != "lockstep":
            raise CalibrationError(f"--data-from {key}: given for {len(many)} packs; the {family} probe is taken "
                                   "from one")
        for other_key, other_kernels in named.get(family, []):
            shared = set(kernels) & set(other_kernels)
            if not kernels or not other_kernels or shared:
                what = f"kernel {sorted(shared)[0]!r}" if shared else f"family {family!r}"
                raise CalibrationError(f"--data-from: {what} given twice ({other_key} and {key}; several packs "
                                       "for one kernel are given under one key)")
        named.setdefault(family, []).append((key, kernels))
        items += [(key, family, kernels, one) for one in many]
    parts: dict[str, list[pd.DataFrame]] = {}  # family -> the tables taken for it, one per key and pack
    part_records: list[dict] = []  # the record entry of each of those tables, by its ``_part``
    key_records: dict[str, list[dict]] = {}  # key -> the entries of its packs, in the order given
    for key, family, kernels, src in items:
        if family not in FAMILIES and family not in PROBES:
            raise CalibrationError(f"--data-from {key}={src}: unknown family {family!r} "
                                   f"(one of {', '.join([*FAMILIES, *PROBES])})")
        if kernels and family in PROBES:
            raise CalibrationError(f"--data-from {key}={src}: {family} is a probe, taken whole (no kernels)")
        try:
            other = load_asset_pack(src, allow_unfitted=True)
        except AssetPackError as exc:
            raise CalibrationError(f"--data-from {key}={src}: {exc}") from None
        om = other.manifest
        for field in timing_fields(family):
            if om.get(field) != m.get(field):
                raise CalibrationError(f"--data-from {key}={src}: its {field} is {om.get(field)!r}, the refitted "
                                       f"pack's {m.get(field)!r}: samples timed another way")
        if str(m.get("device", "cpu")).startswith("cpu") and not same_cpu(om.get("cpu"), m.get("cpu")):
            raise CalibrationError(f"--data-from {key}={src}: measured on another CPU than the refitted pack")
        if family == "step_reuse":
            rows = (om.get("embedding_step_reuse_probe") or {}).get("rows")
            if not rows:
                raise CalibrationError(f"--data-from {key}={src}: the pack has no step-reuse probe "
                                       "(manifest embedding_step_reuse_probe)")
            tables[family] = rows
            record[family] = {"pack": str(other.path), "created": om.get("created"), "rows": len(rows)}
            continue
        if family == "lockstep":
            probe = om.get("lockstep_probe") or {}
            if not probe.get("per_process"):
                raise CalibrationError(f"--data-from {key}={src}: the pack has no lockstep probe "
                                       "(manifest lockstep_probe)")
            if family in tables:  # several probes (spells): each process's rounds pooled, in the order given
                if probe.get("world") != record[family]["world"]:
                    raise CalibrationError(f"--data-from {key}={src}: probed over {probe.get('world')} "
                                           f"processes, {record[family]['pack']} over {record[family]['world']}")
                tables[family] = _pooled(tables[family], probe["per_process"])
                record[family]["pack"] += f", {other.path}"
                record[family]["created"] += f", {om.get('created')}"
                record[family]["probes"] += 1
                continue
            tables[family] = probe["per_process"]
            record[family] = {"pack": str(other.path), "created": str(om.get("created")), "world": probe.get("world"),
                              "probes": 1}
            continue
        f = other.path / "data" / f"{family}.csv"
        if not f.exists():
            raise CalibrationError(f"--data-from {key}={src}: the pack has no {family} benchmarks ({f})")
        table = _read_benchmark_table(f, f"--data-from {key}={src}")
        if om.get("kernels") and not kernels:
            raise CalibrationError(f"--data-from {key}={src}: the pack timed only {', '.join(om['kernels'])} "
                                   f"(--kernels); take them by name, e.g. {family}:{om['kernels'][0]}={src}")
        if kernels:
            have = list(dict.fromkeys(table["kernel"].astype(str))) if "kernel" in table else []
            missing = [k for k in kernels if k not in have]
            if missing:
                raise CalibrationError(f"--data-from {key}={src}: the pack has no {family} samples of "
                                       f"{', '.join(map(repr, missing))} (it has {', '.join(have) or 'none'})")
            table = table[table["kernel"].astype(str).isin(kernels)].reset_index(drop=True)
            selected[family] = tuple(dict.fromkeys((*selected.get(family, ()), *kernels)))
        parts.setdefault(family, []).append(table.assign(_part=len(part_records)))
        one = {"pack": str(other.path), "created": om.get("created"), "level": om.get("level"),
               "scale": om.get("scale", 1.0), "samples": len(table)}
        part_records.append(one)
        sources = key_records.setdefault(key, [])
        sources.append(one)
        # several packs pooled under one key: each keeps its entry under ``sources``, the key sums them
        record[key] = one if len(sources) == 1 else {
            "pack": ", ".join(x["pack"] for x in sources), "created": ", ".join(str(x["created"]) for x in sources),
            "samples": sum(x["samples"] for x in sources), "sources": list(sources)}
    for family, taken in parts.items():
        tables[family] = pd.concat(taken, ignore_index=True)
    return tables, record, selected, part_records


def refit(pack: str | Path, out: str | Path | None = None, *, overheads: str | Path | None = None,
          platform_facts: dict | None = None,
          data_from: Mapping[str, str | Path | Sequence[str | Path]] | None = None,
          log: Callable[[str], None] = print, register: bool = True, fit_target: str | None = None,
          level_match: bool = False, pace_from: str | Path | None = None) -> AssetPack:
    """Fit a pack's kernel models again from the benchmark data it stores; no device needed.

    The models, the held-out error table and the calibrated platform are rebuilt by the same code
    ``calibrate`` runs after its benchmarks, with the pack's own level, seed, world size, measured
    overheads and host contention, so a change to the models (a feature, a grid) reaches a pack
    calibrated on hardware one no longer holds (a lent GPU, say). ``out`` defaults to ``pack``
    (replaced atomically). ``overheads``: a JSON of T1..T5 measured since
    (``python -m predictor.timing.calibration.overheads --device cuda --out FILE`` on the device) to use
    instead of the pack's. ``platform_facts``: platform fields measured since, set before fitting
    (``{"page_fault_s": ..., "fresh_mapping_bytes": ...}`` for a CPU pack calibrated before
    calibration measured page faults: its models then add the faults of output blocks of at least
    ``fresh_mapping_bytes``; the fit takes out only faults its samples were counted paying, and
    such a pack has no counts).
    ``data_from``: ``family -> pack`` whose stored benchmarks of that family replace the refitted
    pack's (or add a family it lacks), e.g. a one-family calibration at a larger ``--scale`` on the
    same machine; each must have been timed as this pack's were (:data:`TIMING_FIELDS`) on the same
    CPU. A key ``family:kernel,kernel`` replaces only those kernels' samples (:func:`parse_data_source`).
    ``level_match``: each taken kernel's samples are first brought to the refitted pack's pace
    (:func:`match_level`: divided by the median ratio of their times to the pack's own model; recorded per
    kernel as ``pace`` under ``refit.data_from``).
    A benchmark key may map to a list of packs: their samples of its kernels are pooled (with ``level_match``
    each pack's brought to the pace apart; recorded under the key's ``sources``).
    ``lockstep`` may map to a list of packs: their probes' rounds are pooled. The written pack stores the data it was fitted on and records where each family came from
    (manifest ``refit.data_from``). ``fit_target``: fit the samples' median of rounds (``"typical"``) or
    fastest round (``"fastest_round"``) instead of what the pack recorded (default: the pack's
    ``fit_target``, ``"typical"`` for packs before it was recorded). ``pace_from``: an archive of measurement
    windows (``benchmarks/results/e2e_cpu_windows.json``) whose drift probes against this pack set the
    platform's ``kernel_pace`` (:func:`predictor.timing.calibration.pace.pace_from_windows`); without it a refit keeps
    the pack's stored pace.

    Raises:
        CalibrationError: ``pack`` is not a loadable asset pack, or stores no benchmark data.
    """
    import re

    from predictor.timing.calibration import FAMILIES
    from predictor.timing.platforms.assets import AssetPackError

    started = time.perf_counter()
    try:
        old = load_asset_pack(pack, allow_unfitted=True)
    except AssetPackError as exc:
        raise CalibrationError(f"--refit: {exc}") from None
    m = old.manifest
    if m.get("kernels"):
        raise CalibrationError(f"--refit {pack}: it holds a spell of {', '.join(m['kernels'])} only (--kernels), "
                               "not a pack to fit; pool it into one with --refit PACK --data-from FAMILY:KERNEL=THIS")
    level: Level = m.get("level", "quick")
    if level not in BUDGETS:
        raise CalibrationError(f"--refit {pack}: manifest level {level!r} is not one of {', '.join(BUDGETS)}")
    data: dict[str, pd.DataFrame] = {}
    for family in FAMILIES:
        f = old.path / "data" / f"{family}.csv"
        if f.exists():
            data[family] = _read_benchmark_table(f, "--refit")
    if not data:
        raise CalibrationError(f"--refit {pack}: the pack stores no benchmark data (data/*.csv)")
    replaced, data_record, selected, part_records = _family_data_from(m, data_from or {})
    step_reuse_rows = replaced.pop("step_reuse", None)
    lockstep_rows = replaced.pop("lockstep", None)
    if level_match:
        if not old.models:
            raise CalibrationError(f"--match-level: {pack} has no fitted models to take the pace from")
        for family, table in replaced.items():
            if isinstance(table, pd.DataFrame):  # each pack's samples to the pack's pace apart (spells differ)
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
    contention = _contention_again(m, world_size, contention, refit_info)
    if lockstep_rows is not None:
        if world_size != int(data_record["lockstep"]["world"] or 0):
            raise CalibrationError(f"--data-from lockstep={data_record['lockstep']['pack']}: probed over "
                                   f"{data_record['lockstep']['world']} processes, the refitted pack's world size "
                                   f"is {world_size}")
        m["lockstep_probe"] = {"world": world_size, "per_process": lockstep_rows}
    contention = _lockstep_again(m, world_size, contention)
    if step_reuse_rows is not None:
        rec = data_record["step_reuse"]
        base = _with_step_reuse_rows(base, step_reuse_rows, f"tuner calibrate {rec['created']} ({rec['pack']})")
        m["embedding_step_reuse_probe"] = {"estimator": STEP_REUSE_ESTIMATOR, "rows": step_reuse_rows}
    if pace_from is not None:
        from predictor.timing.calibration.pace import (
            PaceError,
            pace_from_windows,
            pack_references,
            read_windows,
        )

        try:
            pace, pace_record = pace_from_windows(read_windows(pace_from), str(m.get("created", "")), m.get("cpu"),
                                                  source=str(pace_from), references=pack_references(old.path))
        except PaceError as exc:
            raise CalibrationError(str(exc)) from None
        classes = pace_record["classes"]
        note = "; ".join(f"{c} x{v['median']:.3f} over {v['windows']} windows {v['first'][:10]}..{v['last'][:10]} "
                         f"(quartiles {v['quartiles'][0]:.3f}-{v['quartiles'][1]:.3f})"
                         + ("" if v["applied"] else ", recorded, not applied") for c, v in classes.items())
        base = base.model_copy(update={
            "kernel_pace": pace,
            "sources": {**base.sources, "kernel_pace": f"median drift of the pack's own GEMM (compute) and memcpy "
                        f"(memory) shapes re-timed in later measurement windows ({pace_from}; "
                        f"predictor/timing/calibration/pace.py): {note}"}})
        refit_info["pace_from"] = pace_record
    if platform_facts:
        refit_info["platform_facts"] = dict(platform_facts)
    # the families an earlier refit took from other packs keep their record (the stored data are theirs)
    # (a whole family taken anew drops earlier records of some of its kernels; a kernel taken anew, the record
    # that named it)
    earlier = dict((m.get("refit") or {}).get("data_from") or {})
    for key in data_record:
        family, kernels = parse_data_source(key)
        for old_key in list(earlier):
            old_family, old_kernels = parse_data_source(old_key)
            if old_family == family and (not kernels or old_key == key or set(old_kernels) <= set(kernels)):
                del earlier[old_key]
    data_from_all = {**earlier, **data_record}
    if data_from_all:
        refit_info["data_from"] = data_from_all
    if overheads is not None:
        refit_info["overheads_from"] = str(overheads)
        overheads = _read_overheads(Path(overheads))
    else:
        overheads = dict(m.get("overheads") or {})
        for k in ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s"):
            overheads.setdefault(k, float(getattr(old.platform.overheads, k)))
    out = Path(out) if out is not None else old.path
    pack_name = old.name if out == old.path else out.name.strip().lower()
    extra = {k: v for k, v in m.items() if k not in ("name", "device", "calibration_s", "refit", "fitted")}
    if "families" in m:  # a family taken from another pack (--data-from) that this one never measured joins the list
        extra["families"] = [*m["families"], *(f for f in FAMILIES if f in data and f not in m["families"])]
    extra["overheads"] = overheads
    extra["refit"] = refit_info
    if fit_target is not None:
        extra["fit_target"] = _check_fit_target(fit_target)
    if platform_facts:
        extra.update({k: getattr(base, k) for k in ("page_fault_s", "fresh_mapping_bytes")})
    log(f"refitting {old.name} ({dev}, {level} grids) from its stored benchmarks -> {out}")
    return _fit_and_write(out, pack_name, dev, base, data, specs, level, seed, world_size, overheads, contention,
                          extra, started, log, register)


# ----------------------------------------------------------------------------- platform
def _cpu_model() -> str:
    from predictor.timing.platforms.cpu_local import _cpu_model as model

    return model()


def _cpu_signature() -> dict[str, str]:
    from predictor.timing.platforms.cpu_local import cpu_signature

    return cpu_signature()


def _base_platform(dev: torch.device, level: Level) -> Platform:
    """The platform calibration refines (measured cpu-local, or the GPU's catalog entry)."""
    if dev.type == "cpu":
        from predictor.timing.platforms.cpu_local import measure_cpu_local

        return measure_cpu_local(cache=level == "tiny")
    from predictor.timing.platforms import load_catalog

    gpu = torch.cuda.get_device_name(dev).lower()
    catalog = load_catalog()
    for key, p in catalog.items():
        tokens = [t for t in key.split("-") if t not in ("sxm", "sxm2", "pcie", "nvl")]
        if p.kind == "gpu" and tokens and all(t in gpu.replace(" ", "") or t in gpu for t in tokens):
            return p
    for key, p in catalog.items():  # model family only (e.g. "h100")
        if p.kind == "gpu" and key.split("-")[0] in gpu:
            return p
    raise CalibrationError(f"GPU {torch.cuda.get_device_name(dev)!r} is not in the catalog; add an entry to calibrate it")


def _with_page_faults(base: Platform, level: Level) -> Platform:
    """``base`` with the measured cost of a page fault and, under glibc, its fresh-mapping ceiling
    (:mod:`predictor.timing.calibration.page_faults`); other C libraries keep ``fresh_mapping_bytes`` 0."""
    import platform as _pyplatform

    from predictor.timing.calibration.page_faults import FAULT_SIZES, measure_page_fault_s
    from predictor.timing.platforms.host import GLIBC_MMAP_CEILING_BYTES

    # nine alternations at every level (tiny: one size, ~0.5 s): with three, a seconds-long burst of the shared
    # host's interference slowing two of the kept writes read as a fault costing nothing (a CI run, session 25)
    fault_s, _ = measure_page_fault_s(repeats=9, sizes=FAULT_SIZES[:1] if level == "tiny" else FAULT_SIZES)
    glibc = _pyplatform.libc_ver()[0] == "glibc"
    src = f"tuner calibrate {_dt.date.today().isoformat()}"
    sources = {**base.sources, "page_fault_s": f"{src}: fresh blocks written vs a kept one "
               "(predictor/timing/calibration/page_faults.py)"}
    if glibc:
        sources["fresh_mapping_bytes"] = "glibc DEFAULT_MMAP_THRESHOLD_MAX on 64-bit Linux (malloc/malloc.c)"
    return base.model_copy(update={"page_fault_s": fault_s, "sources": sources,
                                   "fresh_mapping_bytes": float(GLIBC_MMAP_CEILING_BYTES) if glibc else 0.0})


#: how the step-reuse curve is estimated from the probe's rows
STEP_REUSE_ESTIMATOR = "median over rounds of the step sum / the cold sum, per working set"
#: how the per-pooling surface is estimated from the probe's rows
STEP_REUSE_POOLING_ESTIMATOR = "median over rounds of the step / cold ratio of the tables of each pooling, per working set"


def _with_step_reuse(base: Platform, level: Level, llc_bytes: float, seed: int,
                     log: Callable[[str], None]) -> tuple[Platform, list[dict]]:
    """``base`` with its measured embedding step-reuse curve (:mod:`predictor.timing.calibration.step_reuse`)
    and the probe's raw rows."""
    from predictor.timing.calibration.step_reuse import (
        STEP_REUSE_FRACTIONS,
        STEP_REUSE_ROUNDS,
        probe_step_reuse,
    )

    fractions = STEP_REUSE_FRACTIONS if level != "tiny" else STEP_REUSE_FRACTIONS[:2]
    rows = probe_step_reuse(llc_bytes, STEP_REUSE_ROUNDS[level], fractions=fractions, seed=seed)
    return _with_step_reuse_rows(base, rows, f"tuner calibrate {_dt.date.today().isoformat()}"), rows


def _with_step_reuse_rows(base: Platform, rows: list[dict], src: str) -> Platform:
    """``base`` with the step-reuse curve estimated from probe ``rows`` (empty curve: ``base`` unchanged)."""
    from predictor.timing.calibration.step_reuse import reuse_curve, reuse_surface

    curve = reuse_curve(rows)
    if not curve:
        return base
    surface = reuse_surface(rows)
    sources = {**base.sources, "embedding_step_reuse": f"{src}: synthetic tables in a step's order vs timed cold "
               f"({STEP_REUSE_ESTIMATOR}; predictor/timing/calibration/step_reuse.py)"}
    if surface:
        sources["embedding_step_reuse_pooling"] = f"{src}: the same probe per pooling of its tables " \
                                                  f"({STEP_REUSE_POOLING_ESTIMATOR})"
    return base.model_copy(update={"embedding_step_reuse": curve, "embedding_step_reuse_pooling": surface,
                                   "sources": sources})


def _lockstep_probe(world_size: int, threads: int, level: Level, rounds: int) -> list[dict]:
    """The lockstep probe (:mod:`predictor.timing.calibration.lockstep`) for ``rounds`` rounds (tiny: short segments)."""
    from predictor.timing.calibration.lockstep import probe_lockstep

    kw = {"segment_s": 0.002, "segments": 10} if level == "tiny" else {}
    return probe_lockstep(world_size, threads, rounds=rounds, **kw)


def burst_rounds(total: int, bursts: int, index: int) -> int:
    """Rounds of burst ``index`` (0-based) when ``total`` rounds are spread over ``bursts`` bursts as evenly as
    they go, the earlier bursts taking the remainder (5 over 3: 2, 2, 1)."""
    return total // bursts + (1 if index < total % bursts else 0)


def _pooled(rows: list[dict], burst: list[dict]) -> list[dict]:
    """Per process, each key's per-round list of ``rows`` followed by the same process's in ``burst``."""
    if not rows:
        return [dict(b) for b in burst]
    return [{k: list(r[k]) + list(b[k]) for k in r} for r, b in zip(rows, burst, strict=True)]


def _host_probe_burst(p: int, passes: int, world_size: int, threads: int, level: Level, llc_bytes: float,
                      contention_rows: list | None, lockstep_rows: list | None,
                      log: Callable[[str], None]) -> tuple[list, list]:
    """After round ``p`` of ``passes``: this round's share of the host-contention probe's rounds
    (:data:`CONTENTION_ROUNDS`) and of the lockstep probe's (``LOCKSTEP_ROUNDS``), appended per process to
    the rounds of the earlier bursts (None: that probe is not wanted). Returns both row lists."""
    from predictor.timing.calibration.lockstep import LOCKSTEP_ROUNDS

    t0 = time.perf_counter()
    done = []
    if contention_rows is not None and (n := burst_rounds(CONTENTION_ROUNDS[level], passes, p)):
        from predictor.timing.calibration.contention import (
            CONTENTION_ESTIMATOR,
            factors,
            probe_host_contention,
        )

        burst = probe_host_contention(world_size, threads, llc_bytes, slot_s=CONTENTION_SLOT_S[level], rounds=n)
        contention_rows = _pooled(contention_rows, burst)
        done.append(f"contention {n} round(s) (" + ", ".join(
            f"{k} x{v:.2f}" for k, v in factors(burst, CONTENTION_ESTIMATOR).items()) + ")")
    if lockstep_rows is not None and (n := burst_rounds(LOCKSTEP_ROUNDS[level], passes, p)):
        from predictor.timing.calibration.lockstep import lockstep_factor

        burst = _lockstep_probe(world_size, threads, level, n)
        lockstep_rows = _pooled(lockstep_rows, burst)
        done.append(f"lockstep {n} round(s) (x{lockstep_factor(burst):.3f})")
    if done:  # each burst's own factors: how much the host moved during the calibration
        log(f"  {'host probes':<14} {world_size} processes: " + "; ".join(done)
            + f" ({time.perf_counter() - t0:.1f} s)")
    return contention_rows or [], lockstep_rows or []


def _contention_again(m: dict, world_size: int, contention: dict[str, float], refit_info: dict) -> dict[str, float]:
    """A refit's host-contention factors: estimated again from the pack's raw probe timings with
    today's estimator when the pack stores them (packs since 2026-11-25), else the stored factors.
    When the estimator differs from the one the pack's probe record names, the record in ``m`` (the
    manifest the refit writes again) is set to today's and ``refit_info`` says so."""
    from predictor.timing.calibration.contention import CONTENTION_ESTIMATOR, factors

    probe = m.get("host_contention_probe") or {}
    if int(probe.get("world", 0)) != world_size or not probe.get("per_process"):
        return contention
    again = {**contention, **factors(probe["per_process"], CONTENTION_ESTIMATOR)}  # sync: _lockstep_again
    if probe.get("estimator") != CONTENTION_ESTIMATOR:
        refit_info["host_contention"] = f"estimated again from the stored probe ({CONTENTION_ESTIMATOR})"
        m["host_contention_probe"] = {**probe, "estimator": CONTENTION_ESTIMATOR}
    return again


def _lockstep_again(m: dict, world_size: int, contention: dict[str, float]) -> dict[str, float]:
    """``contention`` with its ``sync`` factor estimated again from the manifest's lockstep probe rows
    (when ``m`` stores them for ``world_size`` processes)."""
    from predictor.timing.calibration.lockstep import lockstep_factor

    probe = m.get("lockstep_probe") or {}
    if int(probe.get("world", 0)) != world_size or not probe.get("per_process"):
        return contention
    return {**contention, "sync": lockstep_factor(probe["per_process"])}


def collective_wait(table: pd.DataFrame | None, world: int) -> dict[str, float] | None:
    """Per collective kind, seconds a call over ``world`` local ranks waits on average beyond its typical time:
    the median, over that kind's benchmarked sizes in ``table``, of ``call_mean_s - seconds`` (mean over all
    single calls minus their median; at least 0). None where the table has no single-call means (packs timed
    before session 44 kept batch means, whose median already mixes the waits in)."""
    if table is None or not {"call_mean_s", "world", "kind"} <= set(table.columns):
        return None
    rows = table[table["world"] == world]
    gap = pd.to_numeric(rows["call_mean_s"], errors="coerce") - pd.to_numeric(rows["seconds"], errors="coerce")
    waits = {str(k): float(max(0.0, np.median(g.dropna()))) for k, g in gap.groupby(rows["kind"]) if g.notna().any()}
    return waits or None


def _calibrated_platform(base: Platform, name: str, data: dict[str, pd.DataFrame], models: dict[str, KernelModel],
                         overheads: dict, world_size: int, contention: dict[str, float] | None = None) -> Platform:
    """``base`` with measured peaks, bandwidths, collective latency and overheads."""
    today = _dt.date.today().isoformat()
    src = f"tuner calibrate {today}"
    fields = base.model_dump(mode="json")
    sources = dict(fields.get("sources") or {})
    fields["key"] = name
    fields["name"] = f"{base.name} (calibrated {today})"
    gemm = data.get("gemm")
    if gemm is not None and len(gemm):
        peaks = dict(fields["peak_flops"])
        for dt_bytes, dtype in ((4, "fp32"), (2, "bf16")):
            sel = gemm[gemm["dtype_bytes"] == dt_bytes]
            if len(sel):
                peaks[dtype] = float((sel["flops"] / sel["seconds"]).max())
                sources[f"peak_flops.{dtype}"] = f"{src}: best achieved rate over the GEMM microbenchmarks"
        fields["peak_flops"] = peaks
    roof = unwrap(models["roofline"]) if "roofline" in models else None
    if isinstance(roof, FittedRoofline) and "memcpy" in roof.fits:
        fit = roof.fits["memcpy"]
        mem = [dict(m) for m in fields["memory"]]
        mem[-1]["bandwidth_bytes_per_s"] = float(fit.bandwidths[-1])
        sources[f"memory.{len(mem) - 1}.bandwidth_bytes_per_s"] = f"{src}: fitted memcpy roofline, largest sizes"
        if len(mem) > 1:
            mem[0]["bandwidth_bytes_per_s"] = max(float(fit.peak_bandwidth), mem[-1]["bandwidth_bytes_per_s"])
            sources["memory.0.bandwidth_bytes_per_s"] = f"{src}: fitted memcpy roofline, peak regime"
        fields["memory"] = mem
        fields["kernel_floor_s"] = float(min(f.floor_s for f in roof.fits.values()))
        sources["kernel_floor_s"] = f"{src}: smallest fitted roofline floor"
        fields["memory_efficiency"] = 1.0
    coll = unwrap(models["collectives"]) if "collectives" in models else None
    if isinstance(coll, PiecewiseCollective) and ("all_reduce", world_size) in coll.params:
        c = coll.params[("all_reduce", world_size)]
        ic = dict(fields["interconnect"])
        ic["intra_node_latency_s"] = float(c.ts / latency_steps("all_reduce", world_size))
        ic["intra_node_bandwidth_bytes_per_s"] = float(c.bw_max * wire_factor("all_reduce", world_size))
        fields["interconnect"] = ic
        sources["interconnect.intra_node_latency_s"] = f"{src}: fitted all-reduce start-up latency / ring steps"
        sources["interconnect.intra_node_bandwidth_bytes_per_s"] = f"{src}: fitted all-reduce bandwidth x ring factor"
    wait = collective_wait(data.get("collectives"), world_size) if base.kind == "cpu" else None
    if wait is not None:
        fields["collective_wait_s"] = {world_size: wait}
        sources["collective_wait_s"] = (f"{src}: per kind, median over the benchmarked sizes of the mean single "
                                        "call minus the median single call")
    elif data.get("collectives") is not None:  # curves from batch means (before session 44): no separate wait
        fields["collective_wait_s"] = {}
        sources.pop("collective_wait_s", None)
    if contention:
        hc = fields.get("host_contention") or {}
        stored = dict(hc.get(world_size) or hc.get(str(world_size)) or {})
        fields["host_contention"] = {world_size: dict(contention)}
        from predictor.timing.calibration.contention import CONTENTION_ESTIMATOR

        classes = {k: v for k, v in contention.items() if k != "sync"}
        kept = {k: v for k, v in stored.items() if k != "sync"} == classes
        if classes and not (kept and "host_contention" in sources):  # a refit keeping them keeps their source
            sources["host_contention"] = (f"{src}: probe kernels, {world_size} processes at once vs alone, "
                                          f"'{CONTENTION_ESTIMATOR}' estimator (predictor/timing/calibration/contention.py)")
        if "sync" in contention and not (stored.get("sync") == contention["sync"]
                                         and "host_contention.sync" in sources):
            sources["host_contention.sync"] = (f"{src}: {world_size} processes in lockstep vs at once "
                                               "(predictor/timing/calibration/lockstep.py)")
    fields["overheads"] = {k: float(overheads[k]) for k in ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s")}
    sources["overheads"] = f"{src}: profiled training run, whisker-trimmed means ({overheads.get('definition', '')})"
    fields["sources"] = sources
    note = "Calibrated by tuner calibrate; kernel models in the asset pack."
    if note not in (fields.get("notes") or ""):  # a refit starts from a calibrated platform
        fields["notes"] = ((fields.get("notes") or "") + " " + note).strip()
    platform = Platform.model_validate(fields)
    if _is_device(overheads) and overheads.get("iteration_s_unprofiled"):
        platform = _with_device_host_model(platform, models, overheads, src)
    return platform


def _is_device(overheads: dict) -> bool:
    """Whether the overheads were measured on an accelerator (CUDA runtime calls as launches)."""
    return str(overheads.get("device", "")).startswith("cuda") or "CUDA" in str(overheads.get("definition", ""))


def _with_device_host_model(platform: Platform, models: dict[str, KernelModel], overheads: dict, src: str) -> Platform:
    """``platform`` with the device host model (:mod:`predictor.timing.calibration.step_graph`): T1..T5 scaled by the
    calibration step's unprofiled / profiled ratio, ``step_s`` closed on that step with the fitted models."""
    from predictor.timing.calibration.step_graph import device_overheads
    from predictor.timing.kernels.timing import ModelTiming, analytic_models

    timing = ModelTiming(platform, [*models.values(), *analytic_models()])
    d = device_overheads(overheads, timing)
    fields = platform.model_dump()
    fields["overheads"] = {k: d[k] for k in ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s", "step_s", "sparse_table_s")}
    closure = (f"step_s = its unprofiled step {overheads['iteration_s_unprofiled'] * 1e3:.3f} ms - the simulated "
               f"{d['simulated_step_s'] * 1e3:.3f} ms")
    if "simulated_dense_step_s" in d:
        closure = (f"step_s = its dense-only step {overheads['iteration_s_unprofiled_dense'] * 1e3:.3f} ms - the "
                   f"simulated {d['simulated_dense_step_s'] * 1e3:.3f} ms; sparse_table_s = the full step's remainder "
                   f"({overheads['iteration_s_unprofiled'] * 1e3:.3f} ms measured, {d['simulated_step_s'] * 1e3:.3f} ms "
                   "simulated) over its 4 tables")
    fields["sources"] = {**fields["sources"], "overheads": (
        f"{src}: profiled training run, whisker-trimmed means x the step's unprofiled / profiled time "
        f"{d['profiler_ratio']:.3f}; {closure} (predictor/timing/calibration/step_graph.py)")}
    return Platform.model_validate(fields)


# ----------------------------------------------------------------------------- fitting
def _split(n: int, seed: int, kernel: str) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices with ``HOLDOUT_FRACTION`` held out (at least one of each when n >= 2).

    The permutation is seeded by ``(seed, kernel)`` alone, so one kernel's held-out set does not
    move when another kernel gains or loses samples (a sequential generator shifted every later
    kernel's split when the GEMM benchmark timed 55 fewer shapes).
    """
    rng = np.random.default_rng([seed + 1, zlib.crc32(kernel.encode())])
    perm = rng.permutation(n)
    n_test = int(round(HOLDOUT_FRACTION * n))
    n_test = min(max(n_test, 1 if n >= 2 else 0), max(n - 1, 0))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _view(frame: pd.DataFrame, kind: str) -> TaskView:
    allowed = set(PARAM_COLUMNS) | {"flops", "bytes"}
    cols = {c: frame[c].to_numpy(dtype=np.float64) for c in frame.columns if c in allowed}
    return TaskView.from_columns(kind, **cols)


def _merge_passes(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Rows of repeated runs (rounds) of one grid merged by ``case``: ``seconds`` is the median over
    the rounds (:func:`~predictor.timing.calibration.timing.typical`), the other columns come from the
    fastest round; ``pass_spread`` = slowest / fastest round - 1, ``rounds`` = rounds that reached
    the case."""
    if len(frames) == 1:
        return frames[0]
    allp = pd.concat(frames, ignore_index=True)
    keys = ["kernel", "case"] if "case" in allp else ["kernel"]
    by = allp.groupby(keys)["seconds"]
    spread = by.agg(lambda v: v.max() / v.min() - 1.0 if len(v) > 1 else np.nan)
    best = allp.loc[by.idxmin()].set_index(keys)
    best["pass_spread"] = spread
    best["seconds"] = by.agg(typical)
    if "faults" in allp:
        best["faults"] = allp.groupby(keys)["faults"].agg(typical)
    best["rounds"] = by.size()
    return best.reset_index().sort_values(keys, kind="stable").reset_index(drop=True)


#: a sample keeps at least this fraction of its measured time as the MLP's target when its page
#: faults are taken out (guards a fault cost measured in a faster spell than the sample)
_MIN_LEARNED_FRACTION = 0.1


def _learned_seconds(frame: pd.DataFrame, platform: Platform, column: str = "seconds") -> np.ndarray:
    """The fitting target of each benchmark row (MLPs and fitted rooflines): the measured seconds,
    less the page faults the sample paid (its ``faults`` column x ``platform.page_fault_s``) for kinds
    whose model adds its output block's faults back from platform facts
    (:func:`~predictor.timing.kernels.learned.known_seconds`: embedding backward, GEMMs, memory-bound kinds
    with a new output block); at least
    :data:`_MIN_LEARNED_FRACTION` of the measured time.

    The faults are the ones counted, not the ones the model assumes: whether a benchmark's large
    output is a fresh mapping depends on the calibration process's allocation history (glibc reuses
    a free heap block when one is large enough). Rows without a count (packs calibrated before the
    timer counted faults) are fitted as measured. ``column``: the time estimate fitted (``seconds``, the
    median of the rounds; ``median_s``, the fastest round: :data:`TARGET_COLUMN`)."""
    seconds = frame[column].to_numpy(dtype=np.float64)
    if "faults" not in frame or platform.page_fault_s <= 0:
        return seconds
    paid = np.nan_to_num(frame["faults"].to_numpy(dtype=np.float64), nan=0.0) * platform.page_fault_s
    priced = frame["kind"].isin(KNOWN_TERM_KINDS).to_numpy()
    return np.where(priced, np.maximum(seconds - paid, _MIN_LEARNED_FRACTION * seconds), seconds)


def _fit_job(job: dict) -> tuple[object, float]:
    """One kernel's fit (a worker process's task): :func:`fit_mlp` for ``method`` "mlp", the piecewise
    sigmoid of a collective (:func:`fit_piecewise_sigmoid`) for "sigmoid"; the fitted model and its
    seconds of fitting."""
    t0 = time.perf_counter()
    if job["method"] == "sigmoid":
        fitted = fit_piecewise_sigmoid(job["msg_bytes"], job["seconds"])
    else:
        fitted = fit_mlp(job["raw"], job["seconds"], job["features"], **job["kwargs"])
    return fitted, time.perf_counter() - t0


def _fit_jobs(jobs: dict[str, dict], workers: int, log: Callable[[str], None]) -> dict[str, object]:
    """Every kernel's fitted model (:func:`_fit_job`), in ``workers`` spawned processes (1: in this
    process), the collectives' sigmoid searches first (an uneven all-to-all's: ~50 s on session 22's
    AVX2 VM, which in-process had run before the MLPs started). Each fit is seeded and single-threaded,
    so the models do not depend on the number of workers."""
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
            report(kernel, *_fit_job(jobs[kernel]))
        return done
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_fit_job, jobs[kernel]): kernel for kernel in order}
        for fut in as_completed(futures):
            report(futures[fut], *fut.result())
    return done


def _fit_workers(level: Level, jobs: int) -> int:
    """Processes that fit MLPs: one per CPU core (at most one per job); the tiny level (tests) fits
    in-process, where starting workers would cost more than it saves."""
    import os

    if level == "tiny":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, jobs))


def _fit_all(data: dict[str, pd.DataFrame], specs: list[tuple[str, ModelSpec]], level: Level, seed: int,
             platform: Platform, log: Callable[[str], None],
             scale: float = 1.0, target: str = "typical") -> tuple[dict[str, KernelModel], list[dict]]:
    """Fit every kernel model on a random 80 % of its samples and score it on the other 20 %: (models by
    key, the held-out error table). ``target`` (:data:`~predictor.timing.kernels.state.FIT_TARGETS`): ``typical``
    fits each sample's median over its rounds; ``fastest_round`` fits its fastest round and wraps every
    model in :class:`~predictor.timing.kernels.state.StateScaled` with each op kind's measured typical-state
    factor; its table scores the inner model against the held-out fastest rounds (``gmae_pct`` ...) and
    the wrapped model against the held-out medians of rounds (``typical``)."""
    if target not in FIT_TARGETS:
        raise CalibrationError(f"fit target {target!r}: expected one of {', '.join(FIT_TARGETS)}")
    fastest = TARGET_COLUMN["fastest_round"]
    missing = sorted(f for f, frame in data.items() if fits_fastest(target, f) and fastest not in frame.columns)
    if missing:
        raise CalibrationError(f"fit target {target}: the benchmark data of {', '.join(missing)} have no "
                               f"{fastest} column (measured before the calibration kept it)")
    grid, epochs, budget = MLP_SETTINGS[level]
    budget *= max(1.0, scale)  # grid-search seconds per kernel: more samples train slower
    splits: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}
    nets: dict[str, dict[str, object]] = {}
    mlp_specs: dict[str, ModelSpec] = {}
    roof_fits: dict = {}
    curves: dict = {}
    methods: dict[str, str] = {}
    jobs: dict[str, dict] = {}  # kernel -> a fit for the worker processes (_fit_job)
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
        tr, te = _split(len(sub), seed, spec.kernel)
        train, test = sub.iloc[tr], sub.iloc[te]
        splits[spec.kernel] = (train, test)
        column = _target_column(target, family)
        t0 = time.perf_counter()
        if spec.method == "mlp":
            cols = {c: train[c].to_numpy(dtype=np.float64) for c in train.columns
                    if pd.api.types.is_numeric_dtype(train[c])}
            if any(f in ROUTE_FEATURES for f in spec.features):
                cols.update(route_columns(spec.route or spec.kernel, len(train)))
            jobs[spec.kernel] = {
                "method": "mlp",
                "raw": feature_matrix(cols, spec.features, len(train)),
                "seconds": _learned_seconds(train, platform, column),
                "features": spec.features,
                "kwargs": {"log_features": [f for f in spec.features if f not in spec.raw_features],
                           "work": spec.work, "grid": grid, "epochs": epochs, "seed": seed, "budget_s": budget,
                           "optional": spec.optional_features, "members": MLP_MEMBERS[level]},
            }
            continue
        if spec.method == "roofline":
            for kind in spec.kinds:
                roof_fits[kind] = fit_roofline(train["bytes"].to_numpy(), _learned_seconds(train, platform, column))
            f = roof_fits[spec.kinds[0]]
            methods[spec.kernel] = f"roofline, {len(f.bandwidths)} regime(s), peak {f.peak_bandwidth / 1e9:.1f} GB/s"
        else:
            jobs[spec.kernel] = {"method": "sigmoid", "msg_bytes": train["msg_bytes"].to_numpy(),
                                 "seconds": train[column].to_numpy()}
            continue
        log(f"    {spec.kernel:<20} {methods[spec.kernel]}  ({time.perf_counter() - t0:.1f} s)")
    jobs, pools = _pooled_jobs(jobs, {s.kernel: s for _f, s in specs if s.kernel in jobs})
    fitted = _fit_jobs(jobs, _fit_workers(level, len(jobs)), log)
    for pool, members in pools.items():
        net = fitted.pop(pool)
        fitted.update(dict.fromkeys(members, net))
        jobs.update({k: jobs[pool] for k in members})
    for _family, spec in specs:
        if spec.kernel not in fitted:
            continue
        if jobs[spec.kernel]["method"] == "sigmoid":
            curves[(spec.kinds[0], int(splits[spec.kernel][0]["world"].iloc[0]))] = fitted[spec.kernel]
            methods[spec.kernel] = "piecewise sigmoid (8 params)"
            continue
        net = fitted[spec.kernel]
        nets.setdefault(spec.model_key, {})[spec.route] = net
        mlp_specs.setdefault(spec.model_key, spec)
        c = net.config
        methods[spec.kernel] = f"MLP {c['layers']}x{c['width']} {c['optimizer']} lr={c['lr']:g}"
        if c.get("members", 1) > 1:
            methods[spec.kernel] += f", {c['members']} nets"
        if c.get("optional", {}).get("used"):
            methods[spec.kernel] += " + " + ", ".join(c["optional"]["features"])
        if POOL_PREFIX + spec.pool in pools:
            methods[spec.kernel] += f", one net over {', '.join(pools[POOL_PREFIX + spec.pool])}"

    models: dict[str, KernelModel] = {}
    for key, by_route in nets.items():
        s = mlp_specs[key]
        models[key] = MLPKernelModel(f"mlp-{key}", s.kinds, by_route, router=s.router, prefix=s.prefix, fill=s.fill,
                                     fallback=s.fallback)
    if roof_fits:
        models["roofline"] = FittedRoofline(roof_fits, generic="add" if "add" in roof_fits else None)
    if curves:
        models["collectives"] = PiecewiseCollective(curves)
    # the models of the families fitted to their fastest rounds carry their kinds' typical-state factors
    fast = [s for f, s in specs if s.kernel in splits and fits_fastest(target, f)]
    fast_kinds = {k for s in fast for k in s.kinds}
    models.update(_state_scaled({key: m for key, m in models.items() if fast_kinds & set(m.kinds)},
                                [splits[s.kernel][0] for s in fast]))

    # held-out errors through the KernelModel API (the path predictions take)
    by_kind = models_by_kind(models.values())
    table: list[dict] = []
    for family, spec in specs:
        if spec.kernel not in splits:
            continue
        train, test = splits[spec.kernel]
        parts = list(test.groupby("kind", sort=False)) if len(test) else []
        row = {"kernel": spec.kernel, "family": family, "samples": int(len(train) + len(test)),
               "test": int(len(test))}
        column = _target_column(target, family)
        if fits_fastest(target, family):
            preds = [by_kind[kind].predict(_view(part, kind), platform) for kind, part in parts]
            # the inner model's prediction is the scaled one over the kind's factor (no second prediction pass)
            pred = _cat([p / by_kind[kind].factor(kind) for p, (kind, _) in zip(preds, parts, strict=True)])
            row.update(_held_out_errors(pred, _cat([part[column].to_numpy() for _, part in parts])))
            typical_errors = _held_out_errors(_cat(preds), _cat([part["seconds"].to_numpy() for _, part in parts]))
            row["typical"] = {k: typical_errors[k] for k in ("gmae_pct", "gmae_ci90_pct", "mape_pct", "max_pct")}
            row["state_factor"] = by_kind[spec.kinds[0]].factor(spec.kinds[0])
        else:
            pred = _cat([by_kind[kind].predict(_view(part, kind), platform) for kind, part in parts])
            row.update(_held_out_errors(pred, _cat([part["seconds"].to_numpy() for _, part in parts])))
        row["model"] = methods[spec.kernel]
        table.append(row)
    return models, table


#: job key prefix of a pooled fit (:func:`_pooled_jobs`)
POOL_PREFIX = "pool:"


def _pooled_jobs(jobs: dict[str, dict], specs: dict[str, ModelSpec]) -> tuple[dict[str, dict], dict[str, list[str]]]:
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


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0)


def _held_out_errors(pred: np.ndarray, actual: np.ndarray) -> dict:
    """Lin et al. 2022 Table I errors of ``pred`` against ``actual`` (seconds): GMAE, its 90 % bootstrap
    interval over the samples (None with fewer than two), MAPE, std and max of the absolute % errors."""
    err = np.abs(pred - actual) / actual * 100.0
    return {
        "gmae_pct": geomean_abs_pct_error(pred, actual),
        "gmae_ci90_pct": _finite_or_none(geomean_abs_pct_error_interval(pred, actual)),
        "mape_pct": mean_abs_pct_error(pred, actual),
        "std_pct": float(err.std()) if err.size else float("nan"),
        "max_pct": max_abs_pct_error(pred, actual),
    }


def _state_scaled(models: dict[str, KernelModel], trains: list[pd.DataFrame]) -> dict[str, KernelModel]:
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


def _finite_or_none(interval: tuple[float, float]) -> list[float] | None:
    return list(interval) if all(math.isfinite(v) for v in interval) else None


#: median round spread (percent) of the fp32 GEMM and conv2d samples above which ``tuner calibrate`` says
#: the machine was noisy: over 14 calibrations on the shared 2-core VM (2026-11-23/24) these kernels'
#: spreads were 4-10 %; on the AVX2-only VM of session 21 the fp32 GEMMs' were 18-25 % and their
#: models came out 11-14 % GMAE (``experiments/results/learning_curve_gemm.md``)
NOISY_ROUND_SPREAD_PCT = 15.0


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
    timings a calibration takes: their spread is the machine's noise, not a kernel's), or None."""
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
