"""``space: sharding`` — rank embedding-table sharders for DLRM training tasks (Lin et al. 2024 §IV-B).

One candidate is one task at one global batch size; its evaluation places the tables with
every sharder of the space (the model-guided sharder starts from the heuristic sharders'
placements, so they are evaluated together) and predicts each placement's iteration time with
:class:`tuner.cost.DLRMShardingJob`. Each sharder's result is one outcome (one trial): ok
(value = predicted seconds per iteration), infeasible (the placement does not fit, with the
reason) or failed (the error).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
from optuna.distributions import CategoricalDistribution
from pydantic import Field, field_validator, model_validator

from predictor.sources.synth.dlrm import DLRMSpec
from predictor.sources.synth.dlrm_sharding import ShardedPlacement
from predictor.sources.synth.dlrm_tables import EmbeddingTables, generate_tasks
from predictor.timing.kernels import ModelTiming
from predictor.timing.kernels.assets import AssetPackError, ResolvedPlatform, resolve_platform
from predictor.timing.platforms import CatalogError, UnknownPlatformError
from predictor.timing.platforms.schema import Platform
from tuner.cost import DLRMShardingJob
from tuner.plans import missing_peak
from tuner.search.core import (
    AUTO,
    Candidate,
    Evaluator,
    Outcome,
    Progress,
    SearchResult,
    SearchSpace,
    run_search,
)
from tuner.search.schema import Seed, SpaceError, StrictModel, at_most, bounded_int
from tuner.search.study import fingerprint
from tuner.sharders import InfeasibleShardingError, ModelGuidedSharder, get_sharder
from tuner.sharders.sharding_types import TypedShardingJob

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["ShardingSpace", "ShardingContext", "ShardingSearch", "build_sharding_context", "evaluate_sharding_unit",
           "run_sharding_search", "SHARDER_NAMES", "HEURISTIC_SHARDERS"]

HEURISTIC_SHARDERS = ("naive", "random", "size_greedy", "lookup_greedy", "norm_lookup_greedy", "size_lookup_greedy")
SHARDER_NAMES = (*HEURISTIC_SHARDERS, "model_guided")
#: sharders a space may list besides the default ones: TorchRec's planner (needs the torchrec extra)
OPTIONAL_SHARDERS = ("torchrec",)
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
#: an explicit task's name is part of output file names: no path separators, no leading dot
TASK_NAME = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$"
#: tables of one task: 10^4 tables x 4096 GPUs stays a graph of tens of millions of tasks
MAX_TABLES = 10_000
MAX_GPUS = 4096
#: tables x GPUs of one task: the graph grows with both; 16x the measured 1004 x 64 (0.57 GiB), ~9 GiB if linear
MAX_TABLE_RANKS = 2**20
#: a layer width of the dense MLPs (elements)
Width = Annotated[int, Field(gt=0), at_most(2**20, "a layer of a million units")]


# ----------------------------------------------------------------------------- schema
class TableSpec(StrictModel):
    """One embedding table."""

    rows: bounded_int(1, 10**11, "rows x dim x 8 bytes stays an exact int64") = Field(  # type: ignore[valid-type]
        description="rows E, 1 .. 10^11")
    dim: bounded_int(1, 65536, "rows x dim x 8 bytes stays an exact int64") = Field(  # type: ignore[valid-type]
        description="embedding dimension D, 1 .. 65536")
    pooling: Annotated[float, Field(gt=0), at_most(1e6, "lookups per sample beyond any DLRM data set")] = Field(
        description="mean lookups per sample L, > 0 .. 10^6")
    reuse: list[float] | None = Field(default=None, description="17-bin reuse-factor histogram")
    name: str | None = None

    @field_validator("reuse")
    @classmethod
    def _seventeen_bins(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (len(v) != 17 or min(v) < 0 or sum(v) <= 0):
            raise ValueError("reuse must be 17 non-negative numbers with a positive sum")
        return v


class ExplicitTask(StrictModel):
    """A task given table by table."""

    name: str = Field(pattern=TASK_NAME, description="file-name safe: letters, digits, '.', '_', '-' (1 .. 64)")
    tables: list[TableSpec] = Field(min_length=1, max_length=MAX_TABLES,
                                    description=f"1 .. {MAX_TABLES} tables (each a task of every rank's graph)")


class GeneratedTasks(StrictModel):
    """Random tasks as Lin et al. 2024 §IV-B: half heavy, half normal."""

    count: bounded_int(1, 1000, "each task is a candidate per batch size") = 20  # type: ignore[valid-type]
    seed: Seed = 0
    dataset: Literal["2021", "2022", "both"] = "both"


class TorchRecTask(StrictModel):
    """A task whose tables come from a TorchRec model: ``package.module:callable`` returning an
    ``EmbeddingBagCollection`` (or a module holding them), optionally with ``ParameterConstraints``
    and a ``Topology`` (see :mod:`tuner.integrations.torchrec_io`)."""

    model: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$", description="package.module:callable")
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
    pooling: float | None = Field(default=None, gt=0, le=1e6,
                                  description="pooling factor of tables without ParameterConstraints")


class TasksSpec(StrictModel):
    """Where the tasks come from: generated, given explicitly, or read from TorchRec models."""

    generate: GeneratedTasks | None = None
    explicit: list[ExplicitTask] | None = Field(default=None, max_length=1000, description="1 .. 1000 tasks")
    torchrec: list[TorchRecTask] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TasksSpec:
        if not self.generate and not self.explicit and not self.torchrec:
            raise ValueError("give 'generate', 'explicit' or 'torchrec' tasks")
        names = [t.name.lower() for t in self.explicit or []]  # names are file names: case-insensitive file systems
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"explicit task names must be unique (file names derive from them): {', '.join(twice)}")
        return self


class DenseModel(StrictModel):
    """The dense part of DLRM (layer widths in elements)."""

    dense_features: Width = 13
    bottom_mlp: list[Width] = Field(default=[512, 256, 128], min_length=1, max_length=64)
    top_mlp: list[Width] = Field(default=[1024, 1024, 512, 256, 1], min_length=1, max_length=64)
    optimizer: Literal["sgd", "adagrad"] = "sgd"
    dtype: Literal["fp32", "fp16", "bf16"] = "fp32"


class ModelGuidedOptions(StrictModel):
    """Budget of the model-guided sharder, and whether it may shard tables other than table-wise."""

    sharding_types: bool = Field(default=False, description="also try row-, column-wise and data-parallel per table")
    type_evals: int = Field(default=24, ge=1, le=100_000, description="simulations spent on sharding types")

    max_evals: bounded_int(1, 100_000, "simulations per unit; a unit is one transaction") = Field(  # type: ignore[valid-type]
        default=60, description="simulations per task and batch size, 1 .. 100000")


class ShardingSpace(StrictModel):
    """``space: sharding`` — rank embedding-table sharders for DLRM training tasks."""

    space: Literal["sharding"]
    platform: str = Field(description="catalog key, e.g. a100-80gb")
    catalog: str | None = Field(default=None, description="user YAML that overrides or adds catalog entries")
    n_gpus: bounded_int(1, MAX_GPUS, "every GPU is a rank of the simulated graph") = Field(  # type: ignore[valid-type]
        description=f"GPUs, 1 .. {MAX_GPUS}")
    batch_sizes: list[bounded_int(1, 2**24, "a global batch of 16 M samples")] = Field(  # type: ignore[valid-type]
        min_length=1, max_length=64, description="global batch sizes, 1 .. 2^24")
    tasks: TasksSpec
    model: DenseModel = DenseModel()
    sharders: list[Literal[(*SHARDER_NAMES, *OPTIONAL_SHARDERS)]] = Field(  # type: ignore[valid-type]
        default=list(SHARDER_NAMES), min_length=1)
    objective: Literal["iteration_time"] = "iteration_time"
    memory_fraction: float = Field(default=0.8, gt=0, le=1, description="share of device memory tables may use")
    model_guided: ModelGuidedOptions = ModelGuidedOptions()
    seed: Seed = 0

    @model_validator(mode="after")
    def _batches_divide(self) -> ShardingSpace:
        for b in self.batch_sizes:
            if b % self.n_gpus:
                raise ValueError(f"batch size {b} is not divisible by n_gpus={self.n_gpus}")
        if len(set(self.sharders)) != len(self.sharders):
            raise ValueError("sharders lists a name twice")
        return self


# ----------------------------------------------------------------------------- context
@dataclass
class ShardingContext:
    """Everything a worker needs to evaluate a task at a batch size (picklable)."""

    space: ShardingSpace
    platform: Platform
    tasks: list[EmbeddingTables]
    resolved: ResolvedPlatform  # the platform's kernel models: an asset pack's, or the analytic ones
    #: per task: TorchRec module path of each table (tasks read from a TorchRec model) and its Topology
    table_paths: list[dict[str, str]] | None = None
    topologies: list | None = None

    @property
    def timing_source(self) -> str:
        """Where the kernel times come from (an asset pack, or the analytic models)."""
        return self.resolved.source

    def spec(self, task_index: int, batch_size: int) -> DLRMSpec:
        """The DLRM training step of one task at one global batch size."""
        m = self.space.model
        return DLRMSpec(
            tables=self.tasks[task_index],
            batch_size=batch_size,
            dense_features=m.dense_features,
            bottom_mlp=tuple(m.bottom_mlp),
            top_mlp=tuple(m.top_mlp),
            dtype_bytes=DTYPE_BYTES[m.dtype],
            optimizer=m.optimizer,
            label=self.tasks[task_index].label,
        )

    def job(self, task_index: int, batch_size: int) -> DLRMShardingJob:
        """The cost of placements of one task at one global batch size."""
        pack = self.resolved.pack
        threads = int((pack.manifest.get("threads") if pack is not None else None) or 1)
        return DLRMShardingJob(self.spec(task_index, batch_size), self.space.n_gpus, self.platform, self.timing(),
                               threads_per_rank=threads)

    def timing(self) -> ModelTiming:
        """Kernel timing on the space's platform (calibrated models when it has an asset pack)."""
        return self.resolved.timing()


def _explicit_tables(space: ShardingSpace) -> list[EmbeddingTables]:
    tasks = []
    for t in space.tasks.explicit or []:
        reuse = None
        if all(x.reuse is not None for x in t.tables):
            reuse = np.asarray([x.reuse for x in t.tables], dtype=float)
        tasks.append(
            EmbeddingTables(
                rows=np.asarray([x.rows for x in t.tables]),
                dim=np.asarray([x.dim for x in t.tables]),
                pooling=np.asarray([x.pooling for x in t.tables], dtype=float),
                reuse=reuse,
                name=[x.name or f"t{i}" for i, x in enumerate(t.tables)],
                label=t.name,
            )
        )
    return tasks


def build_sharding_context(space: ShardingSpace) -> ShardingContext:
    """Resolve the platform and materialise the tasks; raises :class:`SpaceError` on bad input."""
    try:
        resolved = resolve_platform(space.platform, space.catalog)
    except (UnknownPlatformError, AssetPackError, CatalogError) as exc:
        raise SpaceError(f"platform: {exc.args[0]}") from None
    except FileNotFoundError:
        raise SpaceError(f"catalog: no such file {space.catalog}") from None
    platform = resolved.platform
    missing = missing_peak(platform, space.model.dtype) if resolved.pack is None else None
    if missing:  # an asset pack times GEMMs by its calibrated models, not the peak
        raise SpaceError(f"platform: {missing}; or set model.dtype to one it lists")
    tasks: list[EmbeddingTables] = []
    if space.tasks.explicit:
        tasks = _explicit_tables(space)
    elif space.tasks.generate:
        gen = space.tasks.generate
        tasks = generate_tasks(
            space.n_gpus,
            n_tasks=gen.count,
            seed=gen.seed,
            device_memory_bytes=platform.memory_bytes,
            memory_fraction=space.memory_fraction,
            dataset=gen.dataset,
        )
    paths: list[dict[str, str]] = [{} for _ in tasks]
    topologies: list = [None for _ in tasks]
    if space.tasks.torchrec or "torchrec" in space.sharders:
        from tuner.integrations.torchrec_space import require_torchrec, torchrec_tasks

        require_torchrec("sharders: torchrec")
        for tables, table_paths, topology in torchrec_tasks(space.tasks.torchrec or [], space.n_gpus):
            tasks.append(tables)
            paths.append(table_paths)
            topologies.append(topology)
    widest = max((len(t) for t in tasks), default=0)
    if widest * space.n_gpus > MAX_TABLE_RANKS:
        raise SpaceError(f"a task of {widest} tables on n_gpus={space.n_gpus}: {widest * space.n_gpus:,} tables x GPUs, "
                         f"at most {MAX_TABLE_RANKS:,} (every table is simulated on every GPU; 1004 x 64 took "
                         "0.57 GiB and 36 s, benchmarks/results/scale_bench.md)")
    return ShardingContext(space, platform, tasks, resolved, paths, topologies)


# ----------------------------------------------------------------------------- evaluation
def _placed(name: str, job: DLRMShardingJob, placement: np.ndarray | ShardedPlacement) -> dict:
    """A placement's result; one with sharding types other than table-wise has ``assignment`` None and
    its tables' shards in ``sharding``."""
    res, _ = TypedShardingJob(job).evaluate(placement)
    d = res.as_dict()
    tw = not isinstance(placement, ShardedPlacement) or placement.is_table_wise()
    assignment = (placement.assignment() if isinstance(placement, ShardedPlacement) else placement) if tw else None
    d.update({"sharder": name, "status": "ok" if res.feasible else "infeasible",
              "assignment": None if assignment is None else [int(x) for x in assignment]})
    if not tw:
        d["sharding"] = placement.as_records()
    return d


def _not_placed(name: str, status: str, reason: str) -> dict:
    return {"sharder": name, "status": status, "feasible": False, "reason": reason, "predicted_iteration_s": None,
            "per_rank_s": None, "memory_bytes_per_rank": None, "assignment": None}


def evaluate_sharding_unit(ctx: ShardingContext, task_index: int, batch_size: int, sharders: list[str]) -> list[dict]:
    """Evaluate ``sharders`` on one task at one global batch size; one result dict per sharder.

    Never raises for a single sharder: an infeasible placement is ``status="infeasible"`` with
    its reason, an unexpected error ``status="failed"`` with the error text.
    """
    job = ctx.job(task_index, batch_size)
    capacity = job.table_capacity_bytes(ctx.space.memory_fraction)
    rng_seed = ctx.space.seed * 1_000_003 + task_index * 101 + batch_size
    out: dict[str, dict] = {}
    starts: dict[str, tuple[np.ndarray, float]] = {}
    heuristics = [s for s in HEURISTIC_SHARDERS if s in sharders or "model_guided" in sharders]
    for name in heuristics:
        try:
            a = get_sharder(name).shard(job.spec.tables, job.n_ranks, capacity, rng=np.random.default_rng(rng_seed))
            placed = _placed(name, job, a)
            if placed["feasible"]:
                starts[name] = (a, placed["predicted_iteration_s"])
            out[name] = placed
        except InfeasibleShardingError as exc:
            out[name] = _not_placed(name, "infeasible", str(exc))
        except Exception as exc:  # recorded, the search goes on
            out[name] = _not_placed(name, "failed", f"{type(exc).__name__}: {exc}")
    if "model_guided" in sharders:
        try:
            mg = ctx.space.model_guided
            sharder = ModelGuidedSharder(job, starts, max_evals=mg.max_evals, seed=rng_seed,
                                         type_evals=mg.type_evals if mg.sharding_types else 0)
            placement = sharder.place(capacity)
            placed = _placed("model_guided", job, placement.sharded or placement.assignment)
            placed["search"] = placement.info
            out["model_guided"] = placed
        except InfeasibleShardingError as exc:
            out["model_guided"] = _not_placed("model_guided", "infeasible", str(exc))
        except Exception as exc:
            out["model_guided"] = _not_placed("model_guided", "failed", f"{type(exc).__name__}: {exc}")
    if "torchrec" in sharders:
        try:
            from tuner.integrations.torchrec_estimator import torchrec_placement

            topology = ctx.topologies[task_index] if ctx.topologies else None
            p, info = torchrec_placement(job.spec, job.n_ranks, job.platform, ctx.space.memory_fraction,
                                         topology=topology)
            out["torchrec"] = _placed("torchrec", job, p)
            out["torchrec"]["search"] = info
        except Exception as exc:  # TorchRec's PlannerError (no plan fits) included: recorded, the search goes on
            out["torchrec"] = _not_placed("torchrec", "failed", f"{type(exc).__name__}: {str(exc)[:500]}")
    return [out[s] for s in sharders]


def _outcomes(ctx: ShardingContext, candidate: Candidate, results: list[dict]) -> list[Outcome]:
    ti, b = candidate.params["task"], candidate.params["batch_size"]
    label = ctx.tasks[ti].label
    return [Outcome(key, {"task": label, "batch_size": b, "sharder": r["sharder"]}, r,
                    r["predicted_iteration_s"] if r["status"] == "ok" else None)
            for key, r in zip(candidate.keys, results, strict=True)]


def evaluate_sharding(ctx: ShardingContext, candidate: Candidate, part: object = None) -> list[Outcome]:
    """The evaluation of one candidate (a task at a batch size): one outcome per sharder."""
    p = candidate.params
    return _outcomes(ctx, candidate, evaluate_sharding_unit(ctx, p["task"], p["batch_size"], list(ctx.space.sharders)))


# ----------------------------------------------------------------------------- the space
class ShardingSearch(SearchSpace):
    """The sharding space plugged into the search core."""

    kind = "sharding"

    def __init__(self, spec: ShardingSpace) -> None:
        self.spec = spec
        self.context = build_sharding_context(spec)
        sharders = list(spec.sharders)
        self._candidates = [
            Candidate(f"{ti}/{b}", {"task": ti, "batch_size": b}, tuple(f"{ti}/{b}/{s}" for s in sharders))
            for ti in range(len(self.context.tasks)) for b in spec.batch_sizes
        ]

    def study_name(self) -> str:
        return f"sharding-{fingerprint(self.spec.model_dump(mode='json'))}"

    def distributions(self) -> dict[str, CategoricalDistribution]:
        return {
            "task": CategoricalDistribution([t.label for t in self.context.tasks]),
            "batch_size": CategoricalDistribution(list(self.spec.batch_sizes)),
            "sharder": CategoricalDistribution(list(self.spec.sharders)),
        }

    def candidates(self) -> list[Candidate]:
        return self._candidates

    def evaluator(self) -> Evaluator:
        return evaluate_sharding

    def worker_context(self) -> ShardingContext:
        return self.context

    def failed(self, candidate: Candidate, reason: str) -> list[Outcome]:
        return _outcomes(self.context, candidate, [_not_placed(s, "failed", reason) for s in self.spec.sharders])

    def write_outputs(self, result: SearchResult, out: Path) -> dict:
        from tuner.report.sharding import write_sharding_outputs

        return write_sharding_outputs(result, out)

    def print_table(self, payload: dict, console: Console) -> None:
        from tuner.report.sharding import print_sharding_table

        print_sharding_table(payload, console)

    def summary(self, result: SearchResult, payload: dict, out: Path) -> str:
        n_eval = sum(len(o) for o in result.outcomes.values())
        return (f"{n_eval} evaluations ({result.evaluated} new, {result.reused} from the study) "
                f"-> {out}/results.json, report.md, traces/")


def run_sharding_search(
    space: ShardingSpace,
    *,
    storage: str,
    workers: int = AUTO,
    address: str | None = None,
    resume: bool = False,
    progress: Progress | None = None,
) -> SearchResult:
    """Evaluate every (task, batch size, sharder) of ``space``; see :func:`tuner.search.core.run_search`."""
    return run_search(ShardingSearch(space), storage=storage, workers=workers, address=address, resume=resume,
                      progress=progress)
