"""What a calibration run is asked to do (:class:`CalibrationOptions`), the settings of each grid level,
and the checks of the options that need no benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from predictor.timing.calibration.base import Level
from predictor.timing.kernels.mlp import QUICK_GRID, TABLE_II_GRID, TINY_GRID
from predictor.timing.kernels.state import FIT_TARGETS, fits_fastest

__all__ = [
    "BUDGETS",
    "CONTENTION_ROUNDS",
    "CONTENTION_SLOT_S",
    "HOLDOUT_FRACTION",
    "LATER_ROUND_SLACK",
    "MAX_ROUNDS",
    "MAX_SCALE",
    "MIN_SCALE",
    "MLP_MEMBERS",
    "MLP_SETTINGS",
    "PASSES",
    "PROBES",
    "TARGET_COLUMN",
    "CalibrationError",
    "CalibrationOptions",
    "check_fit_target",
    "collective_passes",
    "parse_device",
    "target_column",
]

#: share of each kernel's samples held out for the error table
HOLDOUT_FRACTION = 0.2
#: the benchmark-data column each fit target (:data:`~predictor.timing.kernels.state.FIT_TARGETS`) fits: the median
#: over a sample's rounds, or the median of the repeats of its fastest round
TARGET_COLUMN = {"typical": "seconds", "fastest_round": "median_s"}
#: wall-clock budget per benchmark family, seconds, by level
BUDGETS: dict[str, dict[str, float]] = {
    "tiny": {"default": 3.0, "collectives": 10.0},
    # quick: 370 s in all, so that with the fits and probes a calibration ends inside 10 minutes on a slower
    # 2-core CPU too (an AVX2 VM took 887 s with 500 s here)
    "quick": {"gemm": 66.0, "conv2d": 33.0, "embedding_bag": 122.0, "elementwise": 56.0, "layer_norm": 15.0,
              "softmax": 33.0, "data_movement": 22.0, "collectives": 23.0, "reduction": 12.0, "default": 22.0},
    "full": {"default": 1800.0},
}
#: rounds over every benchmark grid, by level (a shape keeps the median of its rounds; a family with
#: `Benchmark.spread_rounds` times each shape in one round only)
PASSES = {"tiny": 1, "quick": 3, "full": 3}
#: most rounds :attr:`CalibrationOptions.rounds` takes
MAX_ROUNDS = 15
#: MLP training: grid, epochs, seconds per kernel, by level
MLP_SETTINGS = {
    "tiny": (TINY_GRID, 150, 5.0),
    "quick": (QUICK_GRID, 1500, 45.0),
    "full": (TABLE_II_GRID, 3000, 1800.0),
}
#: networks per MLP, by level (:func:`~predictor.timing.kernels.mlp.fit_mlp` ``members``: the winning
#: configuration trained from that many initial seeds, their geometric mean predicted); quick keeps 3 so that
#: a quick calibration ends inside 10 minutes on a slower 2-core CPU
MLP_MEMBERS = {"tiny": 1, "quick": 3, "full": 5}
#: rounds after the first time only the cases the first round reached (every sample the median of
#: all rounds), with this multiple of their share of the family budget so they finish the set
LATER_ROUND_SLACK = 1.25
#: the host-contention probe by level: seconds of one time slot, and rounds (each 3 probes x (world + 1) slots)
CONTENTION_SLOT_S = {"tiny": 0.3, "quick": 0.75, "full": 1.0}
CONTENTION_ROUNDS = {"tiny": 1, "quick": 6, "full": 8}
#: probes :attr:`CalibrationOptions.families` may name besides the benchmark families (they fit no kernel model):
#: the embedding step-reuse curve (:mod:`predictor.timing.calibration.step_reuse`; also run with the embedding_bag
#: family) and the lockstep factor of K ranks (:mod:`predictor.timing.calibration.lockstep`; also run with the
#: collectives)
PROBES = ("step_reuse", "lockstep")
#: bounds of :attr:`CalibrationOptions.scale` (multiple of a level's shapes and time)
MIN_SCALE, MAX_SCALE = 0.25, 64.0


class CalibrationError(ValueError):
    """Bad calibration input (no such device, impossible world size): one-line message."""


@dataclass(frozen=True)
class CalibrationOptions:
    """What ``tuner calibrate`` (:func:`~predictor.timing.calibrate.calibrate`) measures and how.

    Attributes:
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        out: pack folder to write (replaced atomically if it exists).
        quick: the quick grids (minutes on a 2-core CPU) instead of the full ones.
        world_size: local processes for the collective benchmarks (1: no collectives; the
            pack then keeps the analytic collective model).
        tiny: test-sized grids (seconds); overrides ``quick``.
        threads: torch intra-op threads for the CPU benchmarks (default: torch's current).
        name: pack and platform name (default: the folder name of ``out``).
        seed: RNG seed of the shape grids and the held-out split.
        families: benchmark families (and :data:`PROBES`) to run (default: all).
        memory_bound: ``"cold"`` or ``"warm"``: how the memory-bound families are timed (see
            :attr:`~predictor.timing.calibration.base.BenchContext.cold_memory_bound`); default cold on a
            CPU, warm on a GPU.
        gemm_timing: ``"warm"`` (default) or ``"cold"``: how the GEMMs are timed (see
            :attr:`~predictor.timing.calibration.base.BenchContext.cold_gemm`).
        fit: ``False`` writes the benchmarks and overheads only (manifest ``"fitted": false``, no
            models): a timing-only calibration run kept as data, which
            :func:`~predictor.timing.calibrate.refit` fits later, anywhere. Such a pack cannot be used for
            predictions until it is refitted.
        scale: ``K`` times the level's shapes per grid (:meth:`~.calibration.base.BenchContext.count`),
            time budget per family, collective passes and MLP fitting budget: a longer calibration
            whose learned models see more data (``quick`` at scale 4: about 40 minutes on a 2-core CPU).
        fit_target: ``"typical"`` fits each sample's median over its rounds; ``"fastest_round"`` its fastest
            round, times each op kind's measured typical-state factor (:mod:`predictor.timing.kernels.state`);
            ``"fastest_collectives"`` the collectives so and every other family typical.
        rounds: timed rounds over every grid (default: the level's, :data:`PASSES`). A family's time budget is
            shared by its rounds, so more rounds time fewer shapes, each the median of more rounds.
        kernels: time only these kernels of the run families (labels as in the error table, e.g. ``bmm/fp32``),
            which then get their families' whole time budgets: a timing-only run of some kernels to pool into a
            pack with ``refit(data_from=...)``. Needs ``fit=False``; families with their own timing loop
            (embedding bags, collectives) cannot be narrowed.
    """

    device: str = "cpu"
    out: str | Path = "assets/cpu-local"
    quick: bool = False
    world_size: int = 1
    tiny: bool = False
    threads: int | None = None
    name: str | None = None
    seed: int = 0
    families: Sequence[str] | None = None
    memory_bound: str | None = None
    gemm_timing: str = "warm"
    fit: bool = True
    scale: float = 1.0
    fit_target: str = "typical"
    rounds: int | None = None
    kernels: Sequence[str] | None = None

    @property
    def level(self) -> Level:
        """The grid level: ``tiny`` (tests), ``quick`` or ``full``."""
        return "tiny" if self.tiny else ("quick" if self.quick else "full")


def target_column(target: str, family: str) -> str:
    """The data column fit target ``target`` fits family ``family`` to (:data:`TARGET_COLUMN`)."""
    return TARGET_COLUMN["fastest_round" if fits_fastest(target, family) else "typical"]


def check_fit_target(fit_target: str) -> str:
    """``fit_target`` if it is one of :data:`~predictor.timing.kernels.state.FIT_TARGETS`; else CalibrationError."""
    if fit_target not in FIT_TARGETS:
        raise CalibrationError(f"--fit-target {fit_target}: expected one of {', '.join(FIT_TARGETS)}")
    return fit_target


def collective_passes(level: Level, scale: float = 1.0) -> int:
    """Passes the collective ranks make over every size (their median is kept): the level's rounds,
    times ``scale`` (``--scale``), at least the level's rounds."""
    return max(PASSES[level], round(PASSES[level] * scale))


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
