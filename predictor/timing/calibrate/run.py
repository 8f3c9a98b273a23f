"""Running a calibration: every benchmark family over its shape grid in rounds, the host probes and overheads,
then the fit (:mod:`.fit`) and the pack (:mod:`.pack`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from predictor.timing.calibrate.calibrated_platform import base_platform
from predictor.timing.calibrate.options import (
    BUDGETS,
    HOLDOUT_FRACTION,
    LATER_ROUND_SLACK,
    MAX_ROUNDS,
    MAX_SCALE,
    MIN_SCALE,
    PASSES,
    PROBES,
    CalibrationError,
    CalibrationOptions,
    check_fit_target,
    collective_passes,
    parse_device,
)
from predictor.timing.calibrate.pack import fit_and_write, write_unfitted
from predictor.timing.calibrate.probes import (
    STEP_REUSE_ESTIMATOR,
    host_probe_burst,
    with_page_faults,
    with_step_reuse,
)
from predictor.timing.calibration import make_benchmarks
from predictor.timing.calibration.base import BenchContext, Benchmark, Level, ModelSpec
from predictor.timing.calibration.timing import ESTIMATOR, Timer, typical
from predictor.timing.kernels.assets import AssetPack
from predictor.timing.platforms.cpu_local import cpu_model, cpu_signature, fp32_lanes
from predictor.timing.platforms.schema import Platform

__all__ = ["calibrate", "kernel_subset", "merge_rounds"]


def kernel_subset(kernels: list[str] | None, benches: list, fit: bool, ctx: BenchContext) -> frozenset[str] | None:
    """``--kernels`` checked against the run families: each label must be a kernel of one of them that is timed
    by the generic case loop (:func:`~predictor.timing.calibration.base.run_cases`), and the run must not be
    fitted (its other kernels have no samples). None: no subset."""
    if kernels is None:
        return None
    wanted = [k.strip() for k in kernels if k.strip()]
    if not wanted:
        raise CalibrationError("--kernels: names no kernel")
    if fit:
        raise CalibrationError(f"--kernels {','.join(wanted)}: a timing-only run of some kernels is data to pool, "
                               "not a pack; add --no-fit and merge it with --refit PACK --data-from FAMILY:KERNEL=THIS")
    narrowable = {s.kernel for b in benches if type(b).run is Benchmark.run for s in b.specs(ctx)}
    for k in wanted:
        if k not in narrowable:
            raise CalibrationError(f"--kernels: {k!r} is no kernel of the families run that can be timed alone; "
                                   f"known: {', '.join(sorted(narrowable)) or 'none'}")
    return frozenset(wanted)


def merge_rounds(frames: list[pd.DataFrame]) -> pd.DataFrame:
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


@dataclass
class _Setup:
    """The checked options of a run and what follows from them."""

    dev: torch.device
    level: Level
    out: Path
    pack_name: str
    bench_families: list[str] | None
    n_threads: int
    cpu_sig: dict[str, str] | None
    simd_lanes: int


def _setup(opts: CalibrationOptions) -> _Setup:
    """``opts`` checked (CalibrationError on the first bad one); sets torch's threads when asked."""
    from predictor.timing.calibration import FAMILIES

    dev = parse_device(opts.device)
    level = opts.level
    world_size, families = opts.world_size, opts.families
    if world_size < 1:
        raise CalibrationError(f"--world-size {world_size}: must be >= 1")
    if dev.type == "cuda" and world_size > torch.cuda.device_count():
        raise CalibrationError(
            f"--world-size {world_size}: NCCL needs one GPU per rank and this machine has "
            f"{torch.cuda.device_count()}; use --world-size 1 (the pack then keeps the analytic collective model)"
        )
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
    if bench_families == [] and opts.fit:
        raise CalibrationError(f"--families {','.join(families or [])}: measures no kernels to fit; add --no-fit "
                               "and merge it into a pack with --refit PACK --data-from PROBE=THIS")
    out = Path(opts.out)
    pack_name = (opts.name or out.name).strip().lower()
    if not pack_name:
        raise CalibrationError(f"--out {out}: cannot derive a pack name; pass --name")
    if dev.type == "cpu" and opts.threads is not None:
        if opts.threads < 1:
            raise CalibrationError(f"--threads {opts.threads}: must be >= 1")
        torch.set_num_threads(opts.threads)
    cpu_sig = cpu_signature() if dev.type == "cpu" else None  # the manifest records it too
    if opts.memory_bound not in (None, "cold", "warm"):
        raise CalibrationError(f"--memory-bound {opts.memory_bound}: expected cold or warm")
    if opts.gemm_timing not in ("cold", "warm"):
        raise CalibrationError(f"--gemm-timing {opts.gemm_timing}: expected cold or warm")
    if not (math.isfinite(opts.scale) and MIN_SCALE <= opts.scale <= MAX_SCALE):
        raise CalibrationError(f"--scale {opts.scale}: must be between {MIN_SCALE:g} and {MAX_SCALE:g}")
    check_fit_target(opts.fit_target)
    if opts.rounds is not None and not 1 <= opts.rounds <= MAX_ROUNDS:
        raise CalibrationError(f"--rounds {opts.rounds}: must be between 1 and {MAX_ROUNDS}")
    return _Setup(dev=dev, level=level, out=out, pack_name=pack_name, bench_families=bench_families,
                  n_threads=torch.get_num_threads(), cpu_sig=cpu_sig,
                  simd_lanes=fp32_lanes(cpu_sig["torch_capability"]) if cpu_sig is not None else 16)


@dataclass
class _Rounds:
    """What the benchmark rounds measured: merged tables by family, model specs, the host probes' rows."""

    data: dict[str, pd.DataFrame]
    specs: list[tuple[str, ModelSpec]]
    contention_probe: list
    lockstep_probe: list
    passes: int


def _run_rounds(s: _Setup, opts: CalibrationOptions, benches: list[Benchmark], timer: Timer, base: Platform,
                only_kernels: frozenset[str] | None, log: Callable[[str], None], started: float) -> _Rounds:
    """Each grid timed ``passes`` times, every family once per round, so two timings of one shape lie minutes
    apart; a shape keeps the median of its rounds, and rounds after the first re-time the shapes the first
    reached. On a CPU with several ranks the host-contention and lockstep probes run in bursts, one after each
    round, so that they too sample the host over the whole calibration (a lockstep factor read x1.14 at the end
    of one calibration, x1.04-1.11 in six probes over the next two hours)."""
    level, dev, world_size, families = s.level, s.dev, opts.world_size, opts.families
    llc_bytes = base.last_level_cache_bytes or 32 * 2**20
    # CPU: memory-bound kernels are timed cold (see BenchContext.cold_memory_bound); on a GPU they
    # stay warm by default (not validated there: its caches and the sizes of a step's tensors differ)
    cold_memory = opts.memory_bound == "cold" or (opts.memory_bound is None and dev.type == "cpu")
    budgets = BUDGETS[level]
    # one benchmark tensor: 256 MiB on a CPU; on a GPU 2 GiB or a 16th of its memory, whichever is
    # smaller (embedding tables reach 4x this: 8 GiB on an 80 GB H100, 4 GiB on a 16 GB card)
    max_tensor = 256 * 2**20 if dev.type != "cuda" else \
        min(2 * 2**30, torch.cuda.get_device_properties(dev).total_memory / 16)
    rng = np.random.default_rng(opts.seed)
    seeds = {b.name: int(rng.integers(2**62)) for b in benches}
    passes = int(opts.rounds) if opts.rounds is not None else PASSES[level]
    host_ranks = dev.type == "cpu" and world_size >= 2
    with_collectives = families is None or "collectives" in families
    want_contention = host_ranks and with_collectives
    want_lockstep = host_ranks and (with_collectives or "lockstep" in families)  # alone: merged with --data-from
    got = _Rounds(data={}, specs=[], contention_probe=[], lockstep_probe=[], passes=passes)
    runs: dict[str, list[pd.DataFrame]] = {}
    spent: dict[str, float] = {}
    reached: dict[str, frozenset[int]] = {}  # grid indices each family's first round reached
    for p in range(passes):
        for bench in benches:
            if bench.name == "collectives" and p:
                continue  # its ranks make their own passes
            ctx = BenchContext(
                device=dev, level=level, rng=np.random.default_rng(seeds[bench.name]), timer=timer,
                budget_s=opts.scale * budgets.get(bench.name, budgets["default"]) / passes
                * (LATER_ROUND_SLACK if p and bench.name in reached else 1.0), log=log,
                llc_bytes=llc_bytes,
                max_tensor_bytes=max_tensor if level != "tiny" else 16 * 2**20,
                passes=collective_passes(level, opts.scale) if bench.name == "collectives" else 1,
                scale=opts.scale if level != "tiny" else 1.0,
                shuffle_seed=seeds[bench.name] + 1 + p,
                cold_memory_bound=cold_memory,
                cold_gemm=opts.gemm_timing == "cold",
                part=(p, passes) if bench.spread_rounds else None,
                only=reached.get(bench.name) if p else None,
                kernels=only_kernels,
                threads=s.n_threads,
                simd_lanes=s.simd_lanes,
            )
            t0 = time.perf_counter()
            frame = bench.run(ctx)
            spent[bench.name] = spent.get(bench.name, 0.0) + time.perf_counter() - t0
            if frame is not None and not frame.empty:
                runs.setdefault(bench.name, []).append(frame)
                if p == 0 and bench.retimes_first_round and not bench.spread_rounds and "case" in frame:
                    reached[bench.name] = frozenset(int(c) for c in frame["case"])
                if p == 0:
                    got.specs += [(bench.name, spec) for spec in bench.specs(ctx)]
        if want_contention or want_lockstep:
            got.contention_probe, got.lockstep_probe = host_probe_burst(
                p, passes, world_size, s.n_threads, level, llc_bytes,
                got.contention_probe if want_contention else None,
                got.lockstep_probe if want_lockstep else None, log)
        log(f"  round {p + 1} of {passes} done ({time.perf_counter() - started:.0f} s)")
    for bench in benches:
        if bench.name not in runs:
            log(f"  {bench.name:<14} skipped" + (" (world size 1)" if bench.name == "collectives" else ""))
            continue
        got.data[bench.name] = merge_rounds(runs[bench.name])
        log(f"  {bench.name:<14} {len(got.data[bench.name]):5d} samples, {spent[bench.name]:6.1f} s")
    return got


def _host_facts(s: _Setup, opts: CalibrationOptions, base: Platform, got: _Rounds,
                log: Callable[[str], None]) -> tuple[Platform, dict, list[dict], dict[str, float]]:
    """After the rounds: the overheads T1..T5, on a CPU the page faults and the embedding step-reuse curve, and
    the host-contention and lockstep factors from the probes' rows. Returns (the platform with them, the
    overheads, the step-reuse probe rows, the contention factors)."""
    from predictor.timing.calibration.overheads import measure_overheads

    dev, level, world_size, families = s.dev, s.level, opts.world_size, opts.families
    t0 = time.perf_counter()
    overheads = measure_overheads(dev, iterations=4 if level == "tiny" else 12)
    log(f"  {'overheads':<14} T1..T5 from a profiled run in {time.perf_counter() - t0:6.1f} s")
    if dev.type == "cpu":
        t0 = time.perf_counter()
        base = with_page_faults(base, level)
        log(f"  {'page faults':<14} {base.page_fault_s * 1e6:.2f} us per 4 KiB fault; blocks >= "
            f"{base.fresh_mapping_bytes / 2**20:.0f} MiB mapped afresh ({time.perf_counter() - t0:.1f} s)")
    step_reuse_probe: list[dict] = []
    if dev.type == "cpu" and (families is None or "embedding_bag" in families or "step_reuse" in families):
        t0 = time.perf_counter()
        base, step_reuse_probe = with_step_reuse(base, level, base.last_level_cache_bytes or 32 * 2**20,
                                                 opts.seed, log)
        log(f"  {'step reuse':<14} embedding step / cold at working sets / LLC "
            + ", ".join(f"{x:.2g}: x{f:.2f} / x{b:.2f}" for x, f, b in base.embedding_step_reuse)
            + f" ({time.perf_counter() - t0:.1f} s)")
        if base.embedding_step_reuse_pooling:
            log(f"  {'':<14} backward per pooling (lookups per sample) at each working set: " + "; ".join(
                f"{x:.2g}: " + " ".join(f"{p:g}:x{b:.2f}" for x2, p, _, b in base.embedding_step_reuse_pooling
                                        if x2 == x) for x in sorted({q[0] for q in base.embedding_step_reuse_pooling})))
    contention: dict[str, float] = {}
    if got.contention_probe:
        from predictor.timing.calibration.contention import CONTENTION_ESTIMATOR, factors

        contention = factors(got.contention_probe, CONTENTION_ESTIMATOR)
        log(f"  {'contention':<14} {world_size} processes at once: "
            + ", ".join(f"{k} x{v:.2f}" for k, v in contention.items())
            + f" (median of {len(got.contention_probe[0]['compute'])} rounds in {got.passes} burst(s))")
    if got.lockstep_probe:
        from predictor.timing.calibration.lockstep import lockstep_factor

        contention["sync"] = lockstep_factor(got.lockstep_probe)
        log(f"  {'lockstep':<14} {world_size} processes in lockstep: x{contention['sync']:.3f} "
            f"(median of {len(got.lockstep_probe[0]['free_s'])} rounds in {got.passes} burst(s))")
    return base, overheads, step_reuse_probe, contention


def _manifest(s: _Setup, opts: CalibrationOptions, benches: list[Benchmark], only_kernels: frozenset[str] | None,
              base: Platform, overheads: dict, got: _Rounds, step_reuse_probe: list[dict],
              contention: dict[str, float], started: float) -> dict:
    """The manifest fields of the run (see :mod:`predictor.timing.kernels.assets` for the others)."""
    dev = s.dev
    probes: dict = {}
    if got.contention_probe:
        from predictor.timing.calibration.contention import CONTENTION_ESTIMATOR

        # the contention probe's raw timings (per process, per class, [alone_s, together_s] per round),
        # so that a refit can estimate the factors again (contention.factors)
        probes["host_contention_probe"] = {"world": opts.world_size, "estimator": CONTENTION_ESTIMATOR,
                                           "per_process": got.contention_probe}
    if got.lockstep_probe:  # the lockstep probe's raw timings per process and round: the ``sync`` factor
        probes["lockstep_probe"] = {"world": opts.world_size, "per_process": got.lockstep_probe}
    if step_reuse_probe:  # the step-reuse probe's raw sums, per round and working set
        probes["embedding_step_reuse_probe"] = {"estimator": STEP_REUSE_ESTIMATOR, "rows": step_reuse_probe}
    return {
        "cpu_model": cpu_model() if dev.type == "cpu" else torch.cuda.get_device_name(dev),
        **({"cpu": s.cpu_sig} if s.cpu_sig is not None else {}),
        "threads": s.n_threads,
        "level": s.level,
        "world_size": opts.world_size,
        "seed": opts.seed,
        "holdout_fraction": HOLDOUT_FRACTION,
        "timing_estimator": ESTIMATOR,
        "rounds": got.passes,  # rounds over every grid; families that time each shape once, spread over the rounds
        "scale": opts.scale,  # multiple of the level's shapes, budgets and collective passes (``--scale``)
        # what each sample's model is fitted to (predictor/timing/kernels/state.py)
        "fit_target": opts.fit_target,
        "spread_rounds": [b.name for b in benches if b.spread_rounds],
        # families whose first round shares its time equally between their kernels (Benchmark.time_fair)
        "time_fair": [b.name for b in benches if b.time_fair],
        # the benchmark families in the order their grid seeds were drawn from ``seed``
        "families": [b.name for b in benches],
        # the kernels timed when ``--kernels`` narrowed the families (absent: every kernel of each)
        **({"kernels": sorted(only_kernels)} if only_kernels is not None else {}),
        # what rounds after the first time: "reached" = the shapes the first round reached ("fresh": drawn anew)
        "later_rounds": "reached",
        # how the memory-bound families were timed: "cold" (cache evicted before each call) or "warm"
        "memory_bound_timing": "cold" if (opts.memory_bound == "cold" or (opts.memory_bound is None
                                                                           and dev.type == "cpu")) else "warm",
        # how the GEMMs were timed: "warm" (repeated on one instance) or "cold" (as memory-bound ones)
        "gemm_timing": opts.gemm_timing,
        # the untimed embedding-bag call between the cache eviction and a timed one: "neighbour" = a typical
        # other table's (calibration.embedding_bag.neighbour_warmers); "tiny": the same op on a 256-row table
        "embedding_warmup": "neighbour",
        # wall seconds of one minor page fault (CPU; 0: not measured) and the allocation size from which
        # every step's block faults afresh, bytes (see predictor/timing/calibration/page_faults.py)
        "page_fault_s": base.page_fault_s,
        "fresh_mapping_bytes": base.fresh_mapping_bytes,
        "overheads": overheads,
        "host_contention": {str(opts.world_size): contention} if contention else {},
        **probes,
        # seconds of benchmarking (and overhead / contention measurement), before any fitting
        "benchmark_s": round(time.perf_counter() - started, 1),
    }


def calibrate(options: CalibrationOptions | None = None, *, log: Callable[[str], None] = print,
              register: bool = True) -> AssetPack:
    """Benchmark ``options.device``, fit every kernel model, write the asset pack ``options.out``; return it
    loaded (unfitted when ``options.fit`` is false).

    Args:
        options: what to measure and how (:class:`~.options.CalibrationOptions`; default: all its defaults).
        log: progress lines.
        register: remember the pack's location so ``--platform NAME`` finds it anywhere.

    Raises:
        CalibrationError: bad device, world size, ``memory_bound``, ``gemm_timing``, ``scale``, ``rounds``,
            ``fit_target`` or ``kernels``.
    """
    opts = options if options is not None else CalibrationOptions()
    s = _setup(opts)
    started = time.perf_counter()
    base = base_platform(s.dev, s.level)
    llc_bytes = base.last_level_cache_bytes or 32 * 2**20
    timer = Timer(s.dev, warmup=2, repeats={"tiny": 3, "quick": 7, "full": 15}[s.level],
                  cold_repeats={"tiny": 2, "quick": 5, "full": 9}[s.level], cache_bytes=llc_bytes)
    benches = make_benchmarks(opts.world_size, s.bench_families) if s.bench_families != [] else []
    kernels = list(opts.kernels) if opts.kernels is not None else None
    only_kernels = kernel_subset(kernels, benches, opts.fit, BenchContext(device=s.dev, level=s.level,
                                 rng=np.random.default_rng(0), timer=timer))
    log(f"calibrating {s.dev} ({s.level} grids" + (f" x{opts.scale:g}" if opts.scale != 1 else "")
        + (f", {opts.rounds} rounds" if opts.rounds is not None else "")
        + (f", only {','.join(sorted(only_kernels))}" if only_kernels else "")
        + f", {s.n_threads} torch thread(s), world size {opts.world_size}) -> {s.out}")
    got = _run_rounds(s, opts, benches, timer, base, only_kernels, log, started)
    base, overheads, step_reuse_probe, contention = _host_facts(s, opts, base, got, log)
    manifest_extra = _manifest(s, opts, benches, only_kernels, base, overheads, got, step_reuse_probe,
                               contention, started)
    if not opts.fit:  # the pack writes its data as stored; the fit below fits them so (fit_and_write)
        return write_unfitted(s.out, s.pack_name, s.dev, base, got.data, manifest_extra, started, log)
    return fit_and_write(s.out, s.pack_name, s.dev, base, got.data, got.specs, s.level, opts.seed,
                         opts.world_size, overheads, contention, manifest_extra, started, log, register)
