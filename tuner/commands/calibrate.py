"""``tuner calibrate``: microbenchmark the local device, fit the kernel models, write an asset pack.

A calibration run times every benchmark family on the device, fits a model per kernel and writes the pack.
With ``--no-fit`` it only times (a timing-only run, kept as data): ``--refit PACK`` fits it later, anywhere,
and ``--refit PACK --data-from FAMILY=RUN`` pools such runs into an existing pack.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from tuner.commands.common import console, err_console, fail

#: environment variable that selects the test-sized grids (seconds instead of minutes); tests only
TINY_ENV = "TUNER_CALIBRATE_TINY"


def calibrate(
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N"),
    out: Path = typer.Option(None, "--out", help="asset pack folder to write, e.g. assets/cpu-local "
                             "(required unless --refit, which defaults to rewriting the pack it refits)"),
    quick: bool = typer.Option(False, "--quick", help="small grids: under 10 minutes on a 2-core CPU"),
    world_size: int = typer.Option(1, "--world-size", help="local processes for the collective benchmarks "
                                   "(gloo on CPU, NCCL on GPUs); 1 skips collectives"),
    threads: int = typer.Option(None, "--threads", help="torch intra-op threads for CPU benchmarks "
                                "(default: torch's current setting)"),
    name: str = typer.Option(None, "--name", help="pack / platform name (default: the --out folder name)"),
    seed: int = typer.Option(0, "--seed", help="seed of the shape grids and the held-out split"),
    families: str = typer.Option(None, "--families", help="comma-separated benchmark families (default: all): "
                                 "gemm, conv2d, embedding_bag, elementwise, layer_norm, softmax, data_movement, "
                                 "collectives, reduction; and the CPU probes step_reuse (embedding tables in a step's "
                                 "order vs cold; runs with embedding_bag too) and lockstep (K processes waiting for "
                                 "each other; needs --world-size 2 or more; runs with collectives too)"),
    kernels: str = typer.Option(None, "--kernels", help="comma-separated kernels of the run families to time, "
                                "e.g. bmm/fp32 (default: all): they get their families' whole time budgets; needs "
                                "--no-fit, and the run is data to pool into a pack with --refit PACK --data-from "
                                "FAMILY:KERNEL=OUT"),
    memory_bound: str = typer.Option(None, "--memory-bound", help="how element-wise, layer-norm, softmax, reduction and "
                                     "data-movement kernels are timed: cold (cache evicted before each call, as a "
                                     "training step finds them; default on CPU) or warm (repeated; default on GPU)"),
    gemm_timing: str = typer.Option("warm", "--gemm-timing", help="how GEMMs are timed: warm (repeated on "
                                    "cached operands) or cold (cache evicted first, as memory-bound kernels)"),
    scale: float = typer.Option(1.0, "--scale", help="K times the level's shapes, time budgets and collective "
                                "passes: a longer calibration whose learned models see more data (--quick --scale 4: "
                                "about 40 minutes on a 2-core CPU)"),
    rounds: int = typer.Option(None, "--rounds", help="timed rounds over every grid, minutes apart; a sample keeps "
                               "the median of its rounds (default: the level's, 3; more rounds of fewer shapes suit "
                               "families with few-parameter models, e.g. the element-wise rooflines)"),
    fit_target: str = typer.Option(None, "--fit-target", help="what each benchmark sample's model is fitted to: "
                                   "typical (the median of its rounds; default), fastest_round (its least disturbed "
                                   "round, times each op kind's measured typical-state factor) or fastest_collectives "
                                   "(the collectives so, the rest typical); with --refit, default: the pack's own"),
    tiny: bool = typer.Option(False, "--tiny", hidden=True, help="test-sized grids"),
    refit: Path = typer.Option(None, "--refit", help="fit an existing pack's models again from the benchmark data "
                               "it stores (no device needed; e.g. after a model change, for a GPU no longer at hand)"),
    no_fit: bool = typer.Option(False, "--no-fit", help="a timing-only calibration run: write the measurements "
                                "without fitting (e.g. on a rented device) and keep them as data; fit them later, "
                                "anywhere, with --refit OUT, or pool them into a pack with --data-from"),
    overheads: Path = typer.Option(None, "--overheads", help="with --refit: a JSON of the host overheads T1..T5 "
                                   "measured since on the device (python -m predictor.timing.calibration.overheads "
                                   "--device cuda --out FILE)"),
    data_from: list[str] = typer.Option(None, "--data-from", help="with --refit, repeatable: FAMILY=DIR fits that "
                                        "family on the benchmarks stored in DIR (another calibration run of the "
                                        "same machine, e.g. --families gemm --scale 4, or a timing-only --no-fit "
                                        "run) instead of the pack's own; FAMILY:KERNEL,KERNEL=DIR takes only those "
                                        "kernels' samples, e.g. data_movement:transpose=DIR; the same "
                                        "FAMILY[:KERNEL,...] given for several DIRs pools their samples; "
                                        "step_reuse=DIR takes DIR's step-reuse probe; lockstep=DIR, given for "
                                        "several DIRs, pools their lockstep probes' rounds"),
    match_level: bool = typer.Option(False, "--match-level", help="with --data-from: bring each taken kernel's "
                                     "samples to the refitted pack's pace first (divided by the median ratio of "
                                     "their times to the pack's own model), so a run timed while the machine was "
                                     "faster or slower adds its shapes, not its pace"),
    pace_from: Path = typer.Option(None, "--pace-from", help="with --refit: set the platform's kernel pace (how "
                                   "much slower the machine typically runs compute kernels than during the pack's "
                                   "calibration) to the median GEMM drift of the measurement windows in FILE taken "
                                   "against this pack, at least 10 (e.g. benchmarks/data/e2e_cpu_windows.json; the "
                                   "memcpy drift is recorded, not applied)"),
) -> None:
    """Benchmark this machine's device, fit every kernel model, print the held-out error table,
    and write an asset pack that `--platform NAME` then uses.

    A timing-only run (`--no-fit`) writes the measurements without models, kept as data: fit
    it later with `--refit DIR`, or pool it into an existing pack with
    `--refit PACK --data-from FAMILY=DIR`.

    `--platform cpu-local` picks the pack calibrated on this CPU (a pack named cpu-local or
    cpu-local-*); `TUNER_CPU_PACK=NAME` (or a pack folder) makes cpu-local that pack on any
    host, `TUNER_CPU_PACK=none` the measured CPU with analytic models.
    """

    from predictor.timing.calibrate import (
        CalibrationError,
        CalibrationOptions,
    )
    from predictor.timing.calibrate import calibrate as run_calibration
    from predictor.timing.calibration.collectives import CollectiveError
    from predictor.timing.calibration.contention import ContentionError

    tiny = tiny or os.environ.get(TINY_ENV, "") not in ("", "0")
    _check_ranges(seed=seed)
    _refuse_mixed_flags(out=out, refit=refit, memory_bound=memory_bound, gemm_timing=gemm_timing, no_fit=no_fit,
                        scale=scale, rounds=rounds, kernels=kernels, overheads=overheads, data_from=data_from,
                        pace_from=pace_from, match_level=match_level)
    sources = _data_sources(data_from)
    _refuse_foreign_out(out if out is not None else refit)
    try:
        if refit is not None:
            from predictor.timing.calibrate import refit as run_refit

            pack = run_refit(refit, out, overheads=overheads, data_from=sources, fit_target=fit_target,
                             level_match=match_level, pace_from=pace_from,
                             log=lambda line: err_console.print(line, highlight=False))
        else:
            fams = [f.strip() for f in families.split(",") if f.strip()] if families else None
            options = CalibrationOptions(device=device, out=out, quick=quick, world_size=world_size, tiny=tiny,
                                         threads=threads, name=name, seed=seed, families=fams,
                                         memory_bound=memory_bound, gemm_timing=gemm_timing, fit=not no_fit,
                                         scale=scale, rounds=rounds,
                                         kernels=kernels.split(",") if kernels is not None else None,
                                         fit_target=fit_target or "typical")
            pack = run_calibration(options, log=lambda line: err_console.print(line, highlight=False))
    except (CalibrationError, CollectiveError, ContentionError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"--out {out}: {exc.strerror or exc}")
    if no_fit:
        only = pack.manifest.get("kernels")
        how = (f"pool them into a pack (no device needed) with: tuner calibrate --refit PACK --data-from "
               f"FAMILY:{','.join(only)}={pack.path}" if only else
               f"fit them (no device needed) with: tuner calibrate --refit {pack.path}")
        console.print(f"benchmarks of [bold]{pack.name}[/] written to {pack.path}, not fitted; {how}", highlight=False)
        return

    _print_pack(pack)


def _check_ranges(*, seed: int) -> None:
    """Exit 2 with one line when a number is outside its range (--world-size, --threads, --scale and --rounds
    are checked with the calibration's options)."""
    if not 0 <= seed <= 2**32 - 1:
        fail(f"--seed must be 0 .. 2^32-1, got {seed}")


def _refuse_foreign_out(out: Path) -> None:
    """Exit 2 unless ``out`` is new, an empty folder or an asset pack (writing a pack replaces the folder)."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        fail(f"--out {out}: exists and is not a folder; the asset pack is written as a folder, choose another path")
    if (out / "manifest.json").is_file() or not any(out.iterdir()):
        return
    fail(f"--out {out}: a folder that is not an asset pack (no manifest.json) and not empty; writing the pack "
         "would replace it, choose a new or empty folder")


def _refuse_mixed_flags(*, out: Path | None, refit: Path | None, memory_bound: str | None, gemm_timing: str,
                        no_fit: bool, scale: float, rounds: int | None, kernels: str | None, overheads: Path | None,
                        data_from: list[str] | None, pace_from: Path | None, match_level: bool) -> None:
    """Exit 2 with one line when flags of a fresh calibration meet --refit, or the other way round."""
    if out is None and refit is None:
        fail("--out is required (the asset pack folder to write), unless --refit PACK is given")
    if memory_bound is not None and refit is not None:
        fail("--memory-bound goes with a fresh calibration (--refit reuses the pack's stored timings)")
    if gemm_timing != "warm" and refit is not None:
        fail("--gemm-timing goes with a fresh calibration (--refit reuses the pack's stored timings)")
    if no_fit and refit is not None:
        fail("--no-fit goes with a fresh calibration (--refit fits a pack's stored benchmarks)")
    if scale != 1.0 and refit is not None:
        fail("--scale goes with a fresh calibration (--refit reuses the pack's stored timings)")
    if rounds is not None and refit is not None:
        fail("--rounds goes with a fresh calibration (--refit reuses the pack's stored timings)")
    if kernels is not None and refit is not None:
        fail("--kernels goes with a fresh calibration (--refit reuses the pack's stored timings)")
    if overheads is not None and refit is None:
        fail("--overheads goes with --refit PACK (a fresh calibration measures its own overheads)")
    if data_from and refit is None:
        fail("--data-from goes with --refit PACK (a fresh calibration measures every family it fits)")
    if pace_from is not None and refit is None:
        fail("--pace-from goes with --refit PACK (it sets a calibrated pack's kernel pace)")
    if match_level and not data_from:
        fail("--match-level goes with --data-from FAMILY=PACK (it rescales the samples taken from PACK)")


def _data_sources(data_from: list[str] | None) -> dict[str, list[str]]:
    """``--data-from`` values as ``FAMILY[:KERNEL,...] -> [DIR, ...]`` (one key given for several runs: refit pools
    them); exit 2 on a malformed one."""
    sources: dict[str, list[str]] = {}  # one key given for several packs: refit pools them
    for item in data_from or []:
        family, sep, src = item.partition("=")
        family, src = family.strip(), src.strip()
        if not sep or not family or not src:
            fail(f"--data-from {item!r}: expected FAMILY=PACK or FAMILY:KERNEL[,KERNEL...]=PACK, e.g. "
                 "gemm=DIR")
        sources.setdefault(family, []).append(src)
    return sources


def _print_pack(pack) -> None:
    """The held-out error table, the timing noise, the overheads and where the pack went."""
    from rich.table import Table

    from predictor.timing.calibrate import NOISY_ROUND_SPREAD_PCT, compute_round_spread, round_spreads

    spreads = round_spreads(pack.path)
    table = Table(title=f"Kernel models of {pack.name}: error on the held-out 20% (Lin et al. 2022 Table I layout)")
    typ = any(r.get("typical") for r in pack.error_table)
    cols = ("kernel", "samples", "GMAE %", "90 % interval", "MAPE %", "std %", "max %",
            *(("state x", "typical GMAE %") if typ else ()), "round spread %", "model")
    for col in cols:
        table.add_column(col, justify="left" if col in ("kernel", "model") else "right")
    for r in pack.error_table:
        ci = r.get("gmae_ci90_pct")
        spread = spreads.get(r["kernel"])
        t = r.get("typical")
        state = ((f"{r['state_factor']:.3f}", f"{t['gmae_pct']:.2f}") if t else ("", "")) if typ else ()
        table.add_row(r["kernel"], str(r["samples"]), f"{r['gmae_pct']:.2f}", f"{ci[0]:.1f}-{ci[1]:.1f}" if ci else "",
                      f"{r['mape_pct']:.2f}", f"{r['std_pct']:.2f}", f"{r['max_pct']:.1f}", *state,
                      f"{spread:.0f}" if spread is not None else "", r["model"])
    console.print(table)
    if typ:
        console.print("fitted to each sample's fastest round: GMAE .. max % score the models against the held-out "
                      "fastest rounds; 'state x' is the measured factor of the machine's typical state over its "
                      "fastest, applied to every prediction; 'typical GMAE %' scores the scaled models against the "
                      "held-out medians of rounds", highlight=False)
    if spreads:
        console.print("round spread: median over a kernel's samples of slowest / fastest round - 1 (the timing noise "
                      "of one shape, not a model error)", highlight=False)
    noise = compute_round_spread(spreads)
    if noise is not None and noise > NOISY_ROUND_SPREAD_PCT:
        err_console.print(f"warning: the machine was noisy during these benchmarks: one fp32 GEMM / conv2d shape's "
                          f"rounds differ by a median {noise:.0f} % (a quiet machine: under "
                          f"{NOISY_ROUND_SPREAD_PCT:.0f} %); the models can be no better than their samples, so "
                          "calibrate again when the machine is quiet", highlight=False)
    o = pack.platform.overheads
    console.print(f"overheads: T1 {o.t1_s * 1e6:.2f} us, T2 {o.t2_s * 1e6:.2f} us, T3 {o.t3_s * 1e6:.2f} us, "
                  f"T4 {o.t4_s * 1e6:.2f} us, T5 {o.t5_s * 1e6:.2f} us", highlight=False)
    if o.step_s or o.sparse_table_s:  # a device's host model (predictor/timing/calibration/step_graph.py)
        console.print(f"device host model: T's x the profiled step's unprofiled / profiled time; per step "
                      f"{o.step_s * 1e6:.0f} us of framework work, per sparse-gradient table "
                      f"{o.sparse_table_s * 1e6:.0f} us", highlight=False)
    for world, waits in sorted(pack.platform.collective_wait_s.items()):  # what a step's collectives pay beyond
        console.print(f"collective waits, {world} ranks (mean call - typical call, added to a step's collectives): "
                      + ", ".join(f"{k.replace('_', '-')} {v * 1e3:.2f} ms" for k, v in sorted(waits.items())),
                      highlight=False)
    cpu = pack.manifest.get("cpu")
    if cpu:  # what the timings belong to: another CPU (ISA, model) runs other kernels
        from predictor.timing.platforms.cpu_local import describe_cpu

        console.print(f"measured on: {describe_cpu(cpu)}", highlight=False)
    console.print(f"asset pack [bold]{pack.name}[/] written to {pack.path}; use it with --platform {pack.name} "
                  f"(or --platform {pack.path})", highlight=False)
