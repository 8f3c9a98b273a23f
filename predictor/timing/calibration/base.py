"""The microbenchmark contract: a family of kernels, a shape grid, a table of timings.

A :class:`Benchmark` (one module per family: :mod:`.gemm`, :mod:`.conv2d`,
:mod:`.embedding_bag`, :mod:`.elementwise`, :mod:`.layer_norm`, :mod:`.softmax`,
:mod:`.data_movement`, :mod:`.collectives`) does two things:

* ``run(ctx)`` times its kernels over a log-spaced shape grid on ``ctx.device`` and returns a
  :class:`pandas.DataFrame` with one row per configuration: ``kernel`` (the row label of the
  error table, e.g. ``"addmm/fp32"``), ``kind`` (the :class:`~predictor.graph.ExecutionGraph`
  op kind the fitted model will time), the kernel parameters it set (columns of
  :data:`~predictor.graph.PARAM_COLUMNS`, plus ``bytes``/``flops`` where known), the
  timing columns ``seconds`` (the estimate used for fitting), ``median_s``, ``min_s``,
  ``pass_spread`` (slowest / fastest pass - 1) and ``case`` (a stable id of the shape: two
  runs with the same ``rng`` seed produce the same cases, so their rows can be merged);
* ``specs`` says how each kernel is modelled (:class:`ModelSpec`): an MLP on log features, a
  fitted roofline or the piecewise sigmoid, with which feature columns.

Grid sizes come from ``ctx.level``: ``"tiny"`` (tests, seconds), ``"quick"`` (a few minutes
on a 2-core CPU), ``"full"`` (real devices; wide grids).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
import torch

from predictor.timing.calibration.timing import Measurement, Timer, typical

__all__ = ["Level", "BenchContext", "ModelSpec", "Benchmark", "Case", "run_cases", "time_case", "keep_typical",
           "log_uniform_int", "TIMING_COLUMNS"]

Level = Literal["tiny", "quick", "full"]
Method = Literal["mlp", "roofline", "piecewise"]

TIMING_COLUMNS = ("seconds", "median_s", "min_s")


@dataclass(frozen=True)
class ModelSpec:
    """How one benchmarked kernel is modelled.

    Attributes:
        kernel: row label (``"addmm/fp32"``); the benchmark's ``kernel`` column value.
        kinds: graph op kinds the fitted model times.
        method: ``"mlp"`` (Lin et al. 2022 §III-B2), ``"roofline"`` (bytes over a measured
            bandwidth, §III-B1), or ``"piecewise"`` (collectives, Lin et al. 2024 eq. 2-4).
        features: parameter columns fed to an MLP; ``log`` ones are log2-transformed,
            the others (reuse-factor fractions) are used as they are.
        raw_features: the subset of ``features`` used without the log transform.
        optional_features: the subset of ``features`` that the fit tries on and off as one group,
            keeping them only if they lower the validation error (see ``fit_mlp(optional=)``).
        work: columns whose product measures the kernel's work (used to extrapolate beyond the
            benchmarked range: time scales with work outside it).
        route: for families with several MLPs behind one model (GEMM by op and dtype), the key.
        model: key of the kernel model this spec's fit goes into (several specs may share one:
            all GEMM nets form one routed model); default: the kernel name.
        router: how that model picks a net per task (see ``MLPKernelModel``).
        prefix: the router's op prefix (``"dtype"`` router).
        fill: fill-in rule for tasks lacking features (``"rows_by_width"``, ``"reuse"``).
        fallback: analytic model for tasks the MLP cannot time (``"analytic-gemm"``, ...).
        pool: specs of one family with the same non-empty pool are fitted as one MLP (a multi-task
            fit) on the union of their training samples, each kernel keeping its own 80/20 split, its
            route and its row of the error table; they must agree on method, features and work. With
            the route inputs of :data:`~predictor.timing.kernels.features.ROUTE_FEATURES` among its features the
            net tells the pooled kernels apart (GEMMs: ``is_addmm``, ``is_bmm``).
    """

    kernel: str
    kinds: tuple[str, ...]
    method: Method
    features: tuple[str, ...] = ()
    raw_features: tuple[str, ...] = ()
    optional_features: tuple[str, ...] = ()
    work: tuple[str, ...] = ()
    route: str = ""
    model: str = ""
    router: str = "single"
    prefix: str = ""
    fill: str = ""
    fallback: str = "roofline"
    pool: str = ""

    @property
    def model_key(self) -> str:
        return self.model or self.kernel.replace("/", "_")


@dataclass
class BenchContext:
    """What a benchmark needs: device, grid level, a seeded RNG, a timer, a time budget."""

    device: torch.device
    level: Level
    rng: np.random.Generator
    timer: Timer
    #: soft wall-clock budget of one family, seconds (a benchmark stops adding shapes after it)
    budget_s: float = 60.0
    #: progress callback (one line per family)
    log: Callable[[str], None] = print
    #: the platform's last-level cache, bytes (sizes grids around it)
    llc_bytes: float = 32 * 2**20
    #: memory a single benchmark tensor may take, bytes
    max_tensor_bytes: float = 256 * 2**20
    #: passes over a family's grid (shuffled order each pass); a shape keeps its fastest pass
    passes: int = 2
    #: seed of the shuffled order (None: drawn from ``rng``); lets repeated runs of one grid
    #: (same ``rng`` seed, so the same shapes) visit the shapes in different orders
    shuffle_seed: int | None = None
    #: memory-bound families (element-wise, layer norm, softmax family, data movement) time every
    #: case *cold*, data evicted from the last-level cache but the code path warm
    #: (:meth:`Timer.measure_cold`): in a training step their operands were written ops earlier and
    #: other kernels ran since, so a warm repeat, which finds them in cache, runs them 1.5-4x faster
    #: than the step does (timed in situ)
    cold_memory_bound: bool = False
    #: GEMMs are timed cold too (``tuner calibrate --gemm-timing cold``): on a quiet 2-core VM a step
    #: runs a small GEMM 1.1-1.2x slower than a warm repeat, and a pack with cold GEMMs predicted that
    #: machine's MLP and GPT steps within 5 % where the warm one was 4-18 % low; off by default
    cold_gemm: bool = False
    #: ``(k, n)``: time only the cases whose index is ``k`` mod ``n`` (round ``k`` of a family with
    #: :attr:`Benchmark.spread_rounds`); None: every case
    part: tuple[int, int] | None = None
    #: grid indices to time (None: every case): rounds after the first of a calibration time only
    #: the cases the first round reached, so every sample is the median of all rounds; drawn afresh,
    #: each round reached ~2/3 of the grid and a third of the samples had a single timing, which
    #: fitted 25-45 % worse than the three-round ones
    only: frozenset[int] | None = None
    #: kernel labels to time (``tuner calibrate --kernels``; None: every kernel of the family): the others'
    #: cases are left out of the grid, so the family's whole time budget goes to these (a timing-only run of
    #: one kernel, e.g. medians of 12 rounds of ``bmm/fp32``, to pool with ``--refit --data-from``)
    kernels: frozenset[str] | None = None
    #: multiple of the level's sample counts (:meth:`count`; ``tuner calibrate --scale``)
    scale: float = 1.0
    #: fp32 lanes of the calibrating CPU's vector registers (:func:`~predictor.timing.platforms.cpu_local.fp32_lanes`;
    #: a refit reads it from the pack's recorded CPU): the channel block of oneDNN's convolutions there
    simd_lanes: int = 16
    #: torch intra-op threads the CPU benchmarks run on (the pack's ``threads``); some kernel
    #: libraries pick their code path by it (PyTorch's CPU convolution: see :mod:`.conv2d`)
    threads: int = 1
    extra: dict = field(default_factory=dict)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def range_level(self) -> Level:
        """The level whose *shape ranges* a family draws from: on a GPU ``--quick`` keeps the quick
        sample counts but covers the full ranges (a GPU runs the largest shapes in milliseconds, and
        a model clamped to a CPU-sized range mis-predicts every large kernel of a real model)."""
        return "full" if self.is_cuda and self.level == "quick" else self.level

    def count(self, tiny: int, quick: int, full: int) -> int:
        """A sample count by level, times :attr:`scale` (at least 1)."""
        return max(1, round({"tiny": tiny, "quick": quick, "full": full}[self.level] * self.scale))

    def timed_loop(self, items: list) -> Iterator:
        """Yield ``items`` until the family's budget is spent (always at least a few)."""
        start = time.perf_counter()
        for i, item in enumerate(items):
            if i >= 4 and time.perf_counter() - start > self.budget_s:
                self.log(f"    budget of {self.budget_s:.0f} s reached after {i} of {len(items)} shapes")
                return
            yield item


def log_uniform_int(rng: np.random.Generator, lo: float, hi: float, size: int, multiple: int = 1) -> np.ndarray:
    """Integers log-uniform on ``[lo, hi]``, rounded to ``multiple`` (at least ``multiple``)."""
    x = np.exp(rng.uniform(np.log(lo), np.log(hi), size))
    return np.maximum(multiple, np.round(x / multiple).astype(np.int64) * multiple)


#: a benchmark case: the row (kernel, kind, parameters) and a builder that allocates the inputs and
#: returns ``(fn, setup)`` (``setup`` may be None), see :meth:`Timer.measure`
Case = tuple[dict, Callable[[], tuple[Callable[[], object], Callable[[], object] | None]]]


def time_fair_order(order: list[int], kernels: list[str], spent: dict[str, float]) -> Iterator[int]:
    """``order`` (case indices, already shuffled) served kernel by kernel: each step yields a case of
    the kernel with the least time in ``spent`` (seconds per kernel, which the caller adds to between
    steps; ties go to the kernel first seen in ``order``), each kernel's cases in ``order``'s order.
    One kernel: ``order`` as it is."""
    queues: dict[str, list[int]] = {}
    for i in order:
        queues.setdefault(kernels[i], []).append(i)
    for q in queues.values():
        q.reverse()  # pop() from the end serves them in order
    while live := [k for k, q in queues.items() if q]:
        yield queues[min(live, key=lambda name: spent.get(name, 0.0))].pop()


def run_cases(ctx: BenchContext, cases: list[Case], family: str, *, cold: bool | None = None,
              time_fair: bool = False) -> pd.DataFrame:
    """Time every case, ``ctx.passes`` times in a fresh random order, within the family budget.

    A case keeps the median of its passes' ``seconds`` (:func:`~.timing.typical`). The first
    pass stops adding cases once the budget is spent; later passes run only while budget
    remains, over the cases the first pass reached. ``cold`` (:meth:`Benchmark.cold`): True times
    every case cold, False warm, both writing the column ``cold``; None times warm without it.
    ``time_fair`` (:attr:`Benchmark.time_fair`): the first pass gives each kernel of the family an
    equal share of the time (:func:`time_fair_order`) instead of taking the shuffled grid in order.
    """
    start = time.perf_counter()
    column = cold is not None
    cold = bool(cold)
    best: dict[int, dict] = {}
    seen: dict[int, list[float]] = {}
    order = [i for i in range(len(cases)) if (ctx.part is None or i % ctx.part[1] == ctx.part[0])
             and (ctx.only is None or i in ctx.only)]
    kernels = [str(c[0].get("kernel", "")) for c in cases]
    if ctx.kernels is not None:
        order = [i for i in order if kernels[i] in ctx.kernels]
    shuffler = ctx.rng if ctx.shuffle_seed is None else np.random.default_rng(ctx.shuffle_seed)
    spent: dict[str, float] = {}  # seconds per kernel in the first pass (time_fair)
    pace: dict[str, list[float]] = {}  # kernel -> [wall seconds, work] of its cases timed so far
    skipped = 0
    for p in range(max(1, ctx.passes)):
        if p and time.perf_counter() - start > ctx.budget_s:
            break
        shuffler.shuffle(order)
        fair = p == 0 and time_fair
        sequence = time_fair_order(order, kernels, spent) if fair else iter(order)
        for done, i in enumerate(sequence):
            if p == 0 and done >= 4 and time.perf_counter() - start > ctx.budget_s:
                ctx.log(f"    {family}: budget of {ctx.budget_s:.0f} s reached after {done} of {len(order)} shapes")
                order = [j for j in order if j in best]
                break
            if p and i not in best:
                continue
            row, build = cases[i]
            t_case = time.perf_counter()
            if p == 0 and done >= 4 and would_overrun(row, pace.get(kernels[i]), t_case - start, ctx.budget_s):
                skipped += 1
                continue
            m = time_case(ctx.timer, build, cold)
            took = time.perf_counter() - t_case
            if fair:
                spent[kernels[i]] = spent.get(kernels[i], 0.0) + took
            if (w := case_work(row)) > 0:
                acc = pace.setdefault(kernels[i], [0.0, 0.0])
                acc[0] += took
                acc[1] += w
            seen.setdefault(i, []).append(m.seconds)
            if i not in best or m.seconds < best[i]["seconds"]:
                best[i] = {**record(row, m), "case": i, **({"cold": int(cold)} if column else {})}
    if skipped:
        ctx.log(f"    {family}: {skipped} shape(s) left out that would have overrun the budget")
    for i, row in best.items():
        keep_typical(row, seen[i])
    return pd.DataFrame([best[i] for i in sorted(best)])


def case_work(row: dict) -> float:
    """A case's work, the unit its time grows with: FLOPs (``flops``) where the row has them, else bytes
    moved (``bytes``); 0 where it has neither."""
    for key in ("flops", "bytes"):
        v = row.get(key)
        if v is not None and math.isfinite(float(v)) and float(v) > 0:
            return float(v)
    return 0.0


def would_overrun(row: dict, pace: list[float] | None, elapsed_s: float, budget_s: float) -> bool:
    """Whether a case, at its kernel's pace so far (``pace`` = [wall seconds, work] of the kernel's
    timed cases, warm-ups and repeats included), would end after the family's budget. A single call
    can take seconds (bf16 GEMMs of ~1e9 FLOPs on a CPU without native bf16: ~2 GFLOP/s), and the
    budget is checked between cases, so one such case near the end overran it by its whole time."""
    w = case_work(row)
    if not pace or pace[1] <= 0 or w <= 0:
        return False
    return elapsed_s + w * pace[0] / pace[1] > budget_s


def time_case(timer: Timer, build: Callable[[], tuple[Callable[[], object], Callable[[], object] | None]],
              cold: bool) -> Measurement:
    """Time one benchmark case from its builder: data cold and code warm (:meth:`Timer.measure_cold`,
    which builds its own instances) or warm (one instance, :meth:`Timer.measure`)."""
    if cold:
        return timer.measure_cold(build)
    fn, setup = build()
    return timer.measure(fn, setup)


def keep_typical(row: dict, values: list[float], faults: list[float] | None = None) -> dict:
    """``row`` (the record of a case's fastest pass) with ``seconds`` set to the typical time of all
    its passes (:func:`~.timing.typical`), ``pass_spread`` to their spread and, given the passes'
    page faults per call, ``faults`` to their typical count; returns ``row``."""
    row["pass_spread"] = pass_spread(values)
    row["seconds"] = typical(values)
    if faults:
        row["faults"] = typical(faults)
    return row


def pass_spread(values: list[float]) -> float:
    """Slowest over fastest pass minus one (NaN with one pass): the timing noise of one shape."""
    return float(max(values) / min(values) - 1.0) if len(values) > 1 and min(values) > 0 else float("nan")


def record(row: dict, m: Measurement) -> dict:
    """``row`` with the timing columns of ``m`` added."""
    return {**row, "seconds": m.seconds, "median_s": m.median_s, "lq_s": m.lq_s, "min_s": m.min_s,
            "faults": m.faults}


class Benchmark(ABC):
    """A family of microbenchmarks (see the module docstring for the contract)."""

    #: family name, e.g. ``"gemm"``
    name: str = "benchmark"
    #: the family's kernels are memory-bound: :func:`run_cases` times them cold when
    #: ``ctx.cold_memory_bound``
    memory_bound: bool = False
    #: each round of the calibration times its own share of the grid (case ``i`` in round ``i mod
    #: rounds``), so every shape is timed once and the family's timings still spread over the whole
    #: calibration; more shapes for the same budget where one timing is close to a shape's typical
    #: time (``benchmarks/round_noise_cpu.py``). No family sets it: on the 2-core VM the GEMMs timed
    #: this way came out 8 % below their median-of-rounds times (``GemmBenchmark``)
    spread_rounds: bool = False
    #: the family's :meth:`run` honours ``ctx.only`` (:func:`run_cases` does), so ``calibrate`` has
    #: rounds after the first re-time the cases the first round reached; a family with its own
    #: sequence (embedding tables, collective passes inside their ranks) sets False
    retimes_first_round: bool = True
    #: the first round shares the family's time equally between its kernels (:func:`time_fair_order`)
    #: rather than taking the shuffled grid in order: where one kernel runs far slower than the rest
    #: (bf16 GEMMs on a CPU without native bf16: ~2 GFLOP/s on an AVX2 VM, where they took ~99 % of the
    #: GEMM budget and left 16-20 samples per kernel), the others still get theirs
    time_fair: bool = False

    def cold(self, ctx: BenchContext) -> bool | None:
        """Whether :func:`run_cases` times this family cold: memory-bound families as
        ``ctx.cold_memory_bound`` says, others warm (None: no ``cold`` column)."""
        return ctx.cold_memory_bound if self.memory_bound else None

    @abstractmethod
    def specs(self, ctx: BenchContext) -> list[ModelSpec]:
        """How each kernel of the family is modelled."""

    def cases(self, ctx: BenchContext) -> list[Case]:
        """The family's grid of benchmark cases (families timed by :func:`run_cases`)."""
        raise NotImplementedError(f"{self.name}: times its kernels in run(), it has no case grid")

    def run(self, ctx: BenchContext) -> pd.DataFrame:
        """Time the family's kernels; one row per configuration (see the module docstring)."""
        return run_cases(ctx, self.cases(ctx), self.name, cold=self.cold(ctx), time_fair=self.time_fair)
