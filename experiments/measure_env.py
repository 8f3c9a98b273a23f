"""How busy the machine is while we measure: other processes' CPU use, and a gate that waits for quiet.

This VM has 2 cores shared with other engineers; a process that is not ours (a model fit, a test
run) slows a measured training iteration by up to 2x. Measurements therefore (1) wait until the
other processes use little CPU (:func:`wait_for_quiet`), and (2) record how many cores the other
processes used *during* the measurement (:class:`BackgroundLoad`), so a reader can weigh each
number; scripts re-measure a row that ran beside too much background load.

"Other processes' CPU" = busy CPU time of the whole machine (``/proc/stat``: user, nice, system,
irq, softirq, steal) minus the CPU time of this process and its reaped children
(``getrusage``), divided by the wall time: cores' worth of work that was not ours.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["machine_busy_s", "own_cpu_s", "BackgroundLoad", "wait_for_quiet", "QUIET_CORES", "Measured",
           "measure_quietly", "time_call", "llc_flush_buffer", "gemm_drift", "memory_drift", "cpu_accounting"]

#: other processes may use at most this many cores' worth of CPU for a machine to count as quiet
QUIET_CORES = 0.25
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores; NaN where /proc/stat is absent)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return float("nan")
    # cpu user nice system idle iowait irq softirq steal ...
    vals = [int(x) for x in fields[1:]]
    busy = vals[0] + vals[1] + vals[2] + sum(vals[5:8])
    return busy / _TICK


def cpu_accounting(before, after, iters: int) -> dict:
    """Per iteration between two ``resource.getrusage(resource.RUSAGE_SELF)`` snapshots taken around
    ``iters`` iterations: user and system CPU seconds (all of this process's threads), minor page
    faults and involuntary context switches (threads pre-empted on a full host)."""
    return {"user_s": (after.ru_utime - before.ru_utime) / iters,
            "system_s": (after.ru_stime - before.ru_stime) / iters,
            "minor_faults": (after.ru_minflt - before.ru_minflt) / iters,
            "involuntary_switches": (after.ru_nivcsw - before.ru_nivcsw) / iters}


def own_cpu_s() -> float:
    """CPU seconds used by this process and its reaped children."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


@dataclass
class BackgroundLoad:
    """Context manager: cores' worth of CPU other processes used while the block ran.

    ``with BackgroundLoad() as bg: run()`` then ``bg.cores`` (0 = nothing else ran; 1 = one
    core fully used by others) and ``bg.wall_s``.
    """

    cores: float = float("nan")
    wall_s: float = float("nan")

    def __enter__(self) -> BackgroundLoad:
        self._t0 = time.perf_counter()
        self._busy0 = machine_busy_s()
        self._own0 = own_cpu_s()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._t0
        others = (machine_busy_s() - self._busy0) - (own_cpu_s() - self._own0)
        self.wall_s = wall
        self.cores = max(0.0, others / wall) if wall > 0 else float("nan")


def wait_for_quiet(max_cores: float = QUIET_CORES, window_s: float = 2.0, timeout_s: float = 900.0,
                   log=None) -> float:
    """Block until other processes use at most ``max_cores`` over a ``window_s`` window.

    Returns the load of the last window (cores). Gives up after ``timeout_s`` seconds and
    returns the last load seen (the caller records it next to the measurement).
    """
    start = time.perf_counter()
    warned = False
    while True:
        with BackgroundLoad() as bg:
            time.sleep(window_s)
        if bg.cores <= max_cores or time.perf_counter() - start > timeout_s:
            return bg.cores
        if log is not None and not warned:
            log(f"  waiting for the machine to be quiet (other processes use {bg.cores:.2f} cores)")
            warned = True


@dataclass
class Measured:
    """One measurement: per-iteration seconds and the background load it ran beside."""

    times: list[float]
    background_cores: float
    attempts: int = 1
    attempt_medians: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return float(np.median(self.times))

    @property
    def p10_p90_s(self) -> tuple[float, float]:
        return float(np.percentile(self.times, 10)), float(np.percentile(self.times, 90))


def measure_quietly(run: Callable[[], list[float]], max_background: float = 0.3, retries: int = 2, log=print,
                    quiet_timeout_s: float = 300.0) -> Measured:
    """Wait (up to ``quiet_timeout_s``) for a quiet machine, run, and re-run (up to ``retries``
    times) while other processes used more than ``max_background`` cores during the run; the
    quietest attempt is kept. ``run`` returns the seconds of each timed iteration."""
    best: Measured | None = None
    medians = []
    for attempt in range(retries + 1):
        if quiet_timeout_s > 0:
            wait_for_quiet(timeout_s=quiet_timeout_s, log=log)
        with BackgroundLoad() as bg:
            times = run()
        medians.append(float(np.median(times)))
        m = Measured(times, bg.cores, attempt + 1)
        if best is None or m.background_cores < best.background_cores:
            best = m
        if bg.cores <= max_background:
            break
        log(f"  other processes used {bg.cores:.2f} cores during the run; measuring again")
    assert best is not None
    best.attempts = len(medians)
    best.attempt_medians = medians
    return best


def llc_flush_buffer(nbytes: int = 64 * 2**20):
    """A callable that evicts the last-level cache by writing ``nbytes`` (default 64 MiB, twice this
    machine's 32 MiB L3): the calibration timer's :class:`~predictor.timing.calibration.timing.CacheFlusher`."""
    import torch

    from predictor.timing.calibration.timing import CacheFlusher

    return CacheFlusher(torch.device("cpu"), nbytes / 2)


def time_call(fn: Callable[[], object], flush: Callable[[], None] | None = None, n: int = 10, warmup: int = 2) -> float:
    """Median seconds of ``n`` calls of ``fn`` after ``warmup`` untimed ones. With ``flush`` (see
    :func:`llc_flush_buffer`) the cache is evicted before every call (a *cold* kernel, as in a
    training step where other ops ran since it last touched its data); without, the kernel
    repeats on cache-resident inputs (*warm*, as microbenchmarks time it)."""
    out = []
    for i in range(n + warmup):
        if flush is not None:
            flush()
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return float(np.median(out))


def _pack_table(pack_path, name: str, what: str, columns: tuple[str, ...]):
    """The pack's ``data/<name>`` as a DataFrame (None if absent); ValueError naming the file when it
    is not ``what`` (unreadable, or a column missing)."""
    from pathlib import Path

    import pandas as pd

    f = Path(pack_path) / "data" / name
    if not f.exists():
        return None
    try:
        d = pd.read_csv(f)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ValueError(f"{f}: not a {what} ({exc})") from None
    missing = [c for c in columns if c not in d.columns]
    if missing:
        raise ValueError(f"{f}: not a {what} (no column {missing[0]!r})")
    return d


def _ratios(ratios: list[float], reference: str) -> dict:
    """Geomean, min and max of now / then time ratios, and the probe rows' reference
    (:func:`predictor.timing.calibration.pace.probe_reference`)."""
    lr = np.log(ratios)
    return {"ratio_geomean": float(np.exp(lr.mean())), "ratio_min": float(np.min(ratios)),
            "ratio_max": float(np.max(ratios)), "cases": len(ratios), "reference": reference}


def _timed_cold(row) -> bool:
    """Whether the pack timed this benchmark row cold (its data column ``cold`` is 1; packs and
    families without the column were timed warm)."""
    return bool(getattr(row, "cold", 0) == 1)


def gemm_drift(pack_path, cases: int = 24, seed: int = 0) -> dict:
    """How fast this machine runs GEMMs now compared with when the asset pack was calibrated.

    Re-times ``cases`` of the pack's own fp32 ``addmm`` / ``mm`` microbenchmark shapes (the larger
    half by FLOPs, where a training step spends its time), with the calibration's timer and
    statistic, warm or cold as the pack timed them (its data column ``cold``: ``--gemm-timing
    cold``), and compares with the times recorded in the pack (``data/gemm.csv``); timed warm against a
    cold-timed pack it read x0.72-0.80 where the machine had not changed. A shared VM's speed drifts by
    tens of percent within an hour; this separates that drift from model error.

    Returns ``{"ratio_geomean": now / then, "ratio_min", "ratio_max", "cases"}`` (ratio > 1: the
    machine is slower now), or ``{}`` when the pack has no GEMM data.

    Raises:
        ValueError: ``data/gemm.csv`` is not a GEMM benchmark table (one line naming the file).
    """
    import torch

    from predictor.timing.calibration.base import time_case
    from predictor.timing.calibration.gemm import gemm_builder
    from predictor.timing.calibration.pace import probe_reference, probe_rows
    from predictor.timing.calibration.timing import Timer

    d = _pack_table(pack_path, "gemm.csv", "GEMM benchmark table", ("kernel", "kind", "m", "n", "k", "flops", "seconds"))
    if d is None:
        return {}
    d = probe_rows(d, "compute", cases, seed)
    if d.empty:
        return {}
    timer = Timer("cpu")
    ratios = []
    for r in d.itertuples():
        build = gemm_builder(str(r.kind), int(r.m), int(r.n), int(r.k), 1, torch.float32, torch.device("cpu"))
        ratios.append(time_case(timer, build, cold=_timed_cold(r)).seconds / float(r.seconds))
    return _ratios(ratios, probe_reference(d))


def memory_drift(pack_path, cases: int = 16, seed: int = 0) -> dict:
    """:func:`gemm_drift` for the memory system: the pack's own ``memcpy`` microbenchmarks (the larger
    half by bytes) re-timed as the pack timed them (cold, data cold and code warm, where its data
    column ``cold`` says so). On this VM memory-bound kernels switch between a fast and a 2-4x
    slower state for minutes (other tenants of the host), which GEMMs barely see.

    Returns ``{"ratio_geomean", "ratio_min", "ratio_max", "cases"}`` (> 1: slower now), or ``{}``
    when the pack has no memcpy data.

    Raises:
        ValueError: ``data/data_movement.csv`` is not a data-movement benchmark table.
    """
    import torch

    from predictor.timing.calibration.base import time_case
    from predictor.timing.calibration.data_movement import _copy
    from predictor.timing.calibration.pace import probe_reference, probe_rows
    from predictor.timing.calibration.timing import Timer

    d = _pack_table(pack_path, "data_movement.csv", "data-movement benchmark table",
                    ("kernel", "elements", "bytes", "seconds"))
    if d is None:
        return {}
    d = probe_rows(d, "memory", cases, seed)
    if d.empty:
        return {}
    timer = Timer("cpu")
    ratios = []
    for r in d.itertuples():
        build = _copy(int(r.elements), torch.device("cpu"))
        ratios.append(time_case(timer, build, cold=_timed_cold(r)).seconds / float(r.seconds))
    return _ratios(ratios, probe_reference(d))
