"""Host probes of a CPU calibration that fit no kernel model: page faults, the embedding step-reuse curve,
host contention and the lockstep factor of K processes; and their estimates again from stored rows."""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable

from predictor.timing.calibrate.options import CONTENTION_ROUNDS, CONTENTION_SLOT_S
from predictor.timing.calibration.base import Level
from predictor.timing.platforms.schema import Platform

__all__ = ["STEP_REUSE_ESTIMATOR", "STEP_REUSE_POOLING_ESTIMATOR", "burst_rounds", "contention_again",
           "host_probe_burst", "lockstep_again", "lockstep_probe", "pooled_rounds", "with_page_faults",
           "with_step_reuse", "with_step_reuse_rows"]

#: how the step-reuse curve is estimated from the probe's rows
STEP_REUSE_ESTIMATOR = "median over rounds of the step sum / the cold sum, per working set"
#: how the per-pooling surface is estimated from the probe's rows
STEP_REUSE_POOLING_ESTIMATOR = "median over rounds of the step / cold ratio of the tables of each pooling, per working set"


def with_page_faults(base: Platform, level: Level) -> Platform:
    """``base`` with the measured cost of a page fault and, under glibc, its fresh-mapping ceiling
    (:mod:`predictor.timing.calibration.page_faults`); other C libraries keep ``fresh_mapping_bytes`` 0."""
    import platform as _pyplatform

    from predictor.timing.calibration.page_faults import FAULT_SIZES, measure_page_fault_s
    from predictor.timing.platforms.host import GLIBC_MMAP_CEILING_BYTES

    # nine alternations at every level (tiny: one size, ~0.5 s): with three, a seconds-long burst of a shared
    # host's interference slowing two of the kept writes read as a fault costing nothing
    fault_s, _ = measure_page_fault_s(repeats=9, sizes=FAULT_SIZES[:1] if level == "tiny" else FAULT_SIZES)
    glibc = _pyplatform.libc_ver()[0] == "glibc"
    src = f"tuner calibrate {_dt.date.today().isoformat()}"
    sources = {**base.sources, "page_fault_s": f"{src}: fresh blocks written vs a kept one "
               "(predictor/timing/calibration/page_faults.py)"}
    if glibc:
        sources["fresh_mapping_bytes"] = "glibc DEFAULT_MMAP_THRESHOLD_MAX on 64-bit Linux (malloc/malloc.c)"
    return base.model_copy(update={"page_fault_s": fault_s, "sources": sources,
                                   "fresh_mapping_bytes": float(GLIBC_MMAP_CEILING_BYTES) if glibc else 0.0})


def with_step_reuse(base: Platform, level: Level, llc_bytes: float, seed: int,
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
    return with_step_reuse_rows(base, rows, f"tuner calibrate {_dt.date.today().isoformat()}"), rows


def with_step_reuse_rows(base: Platform, rows: list[dict], src: str) -> Platform:
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


def lockstep_probe(world_size: int, threads: int, level: Level, rounds: int) -> list[dict]:
    """The lockstep probe (:mod:`predictor.timing.calibration.lockstep`) for ``rounds`` rounds (tiny: short segments)."""
    from predictor.timing.calibration.lockstep import probe_lockstep

    kw = {"segment_s": 0.002, "segments": 10} if level == "tiny" else {}
    return probe_lockstep(world_size, threads, rounds=rounds, **kw)


def burst_rounds(total: int, bursts: int, index: int) -> int:
    """Rounds of burst ``index`` (0-based) when ``total`` rounds are spread over ``bursts`` bursts as evenly as
    they go, the earlier bursts taking the remainder (5 over 3: 2, 2, 1)."""
    return total // bursts + (1 if index < total % bursts else 0)


def pooled_rounds(rows: list[dict], burst: list[dict]) -> list[dict]:
    """Per process, each key's per-round list of ``rows`` followed by the same process's in ``burst``."""
    if not rows:
        return [dict(b) for b in burst]
    return [{k: list(r[k]) + list(b[k]) for k in r} for r, b in zip(rows, burst, strict=True)]


def host_probe_burst(p: int, passes: int, world_size: int, threads: int, level: Level, llc_bytes: float,
                     contention_rows: list | None, lockstep_rows: list | None,
                     log: Callable[[str], None]) -> tuple[list, list]:
    """After round ``p`` of ``passes``: this round's share of the host-contention probe's rounds
    (:data:`~.options.CONTENTION_ROUNDS`) and of the lockstep probe's (``LOCKSTEP_ROUNDS``), appended per
    process to the rounds of the earlier bursts (None: that probe is not wanted). Returns both row lists."""
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
        contention_rows = pooled_rounds(contention_rows, burst)
        done.append(f"contention {n} round(s) (" + ", ".join(
            f"{k} x{v:.2f}" for k, v in factors(burst, CONTENTION_ESTIMATOR).items()) + ")")
    if lockstep_rows is not None and (n := burst_rounds(LOCKSTEP_ROUNDS[level], passes, p)):
        from predictor.timing.calibration.lockstep import lockstep_factor

        burst = lockstep_probe(world_size, threads, level, n)
        lockstep_rows = pooled_rounds(lockstep_rows, burst)
        done.append(f"lockstep {n} round(s) (x{lockstep_factor(burst):.3f})")
    if done:  # each burst's own factors: how much the host moved during the calibration
        log(f"  {'host probes':<14} {world_size} processes: " + "; ".join(done)
            + f" ({time.perf_counter() - t0:.1f} s)")
    return contention_rows or [], lockstep_rows or []


def contention_again(m: dict, world_size: int, contention: dict[str, float], refit_info: dict) -> dict[str, float]:
    """A refit's host-contention factors: estimated again from the pack's raw probe timings with
    today's estimator when the pack stores them, else the stored factors.
    When the estimator differs from the one the pack's probe record names, the record in ``m`` (the
    manifest the refit writes again) is set to today's and ``refit_info`` says so."""
    from predictor.timing.calibration.contention import CONTENTION_ESTIMATOR, factors

    probe = m.get("host_contention_probe") or {}
    if int(probe.get("world", 0)) != world_size or not probe.get("per_process"):
        return contention
    again = {**contention, **factors(probe["per_process"], CONTENTION_ESTIMATOR)}  # sync: lockstep_again
    if probe.get("estimator") != CONTENTION_ESTIMATOR:
        refit_info["host_contention"] = f"estimated again from the stored probe ({CONTENTION_ESTIMATOR})"
        m["host_contention_probe"] = {**probe, "estimator": CONTENTION_ESTIMATOR}
    return again


def lockstep_again(m: dict, world_size: int, contention: dict[str, float]) -> dict[str, float]:
    """``contention`` with its ``sync`` factor estimated again from the manifest's lockstep probe rows
    (when ``m`` stores them for ``world_size`` processes)."""
    from predictor.timing.calibration.lockstep import lockstep_factor

    probe = m.get("lockstep_probe") or {}
    if int(probe.get("world", 0)) != world_size or not probe.get("per_process"):
        return contention
    return {**contention, "sync": lockstep_factor(probe["per_process"])}
