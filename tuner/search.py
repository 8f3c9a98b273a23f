"""Ray-parallel evaluation of a search space, recorded in a persistent Optuna study.

The driver enumerates the space's evaluation units, skips the ones the study already holds
(``--resume``), evaluates the rest in Ray tasks (a local Ray started on demand, or the
cluster at ``address``), and records every evaluation as an Optuna trial as soon as its unit
returns — COMPLETE (feasible, value = predicted seconds), PRUNED (infeasible, with the reason)
or FAIL (the evaluation raised; the error is kept). A killed search therefore loses at most
the units in flight. A Ray worker that dies is retried by Ray (``max_retries``).

The storage is any Optuna storage URL; by default a SQLite file in the output folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from predictor.sources.synth.dlrm import DLRMSpec
from predictor.sources.synth.dlrm_tables import EmbeddingTables, generate_tasks
from tuner.sharders import InfeasibleShardingError, get_sharder, model_guided_shard
from predictor.timing.kernels import ModelTiming
from predictor.timing.platforms import CatalogError, UnknownPlatformError
from predictor.timing.platforms.assets import AssetPackError, ResolvedPlatform, resolve_platform
from predictor.timing.platforms.schema import Platform
from tuner.cost import DLRMShardingJob
from tuner.spaces import ShardingSpace, SpaceError

__all__ = ["ShardingContext", "build_sharding_context", "evaluate_sharding_unit", "run_sharding_search", "SearchOutcome"]

HEURISTIC_SHARDERS = ("naive", "random", "size_greedy", "lookup_greedy", "norm_lookup_greedy", "size_lookup_greedy")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


# ----------------------------------------------------------------------------- context
@dataclass
class ShardingContext:
    """Everything a worker needs to evaluate a unit (picklable)."""

    space: ShardingSpace
    platform: Platform
    tasks: list[EmbeddingTables]
    resolved: ResolvedPlatform  # the platform's kernel models: an asset pack's, or the analytic ones

    @property
    def timing_source(self) -> str:
        return self.resolved.source

    def spec(self, task_index: int, batch_size: int) -> DLRMSpec:
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
        pack = self.resolved.pack
        threads = int((pack.manifest.get("threads") if pack is not None else None) or 1)
        return DLRMShardingJob(self.spec(task_index, batch_size), self.space.n_gpus, self.platform, self.timing(),
                               threads_per_rank=threads)

    def timing(self) -> ModelTiming:
        """Kernel timing on the space's platform (calibrated models when it has an asset pack)."""
        return self.resolved.timing()


def build_sharding_context(space: ShardingSpace) -> ShardingContext:
    """Resolve the platform and materialise the tasks; raises :class:`SpaceError` on bad input."""
    try:
        resolved = resolve_platform(space.platform, space.catalog)
    except (UnknownPlatformError, AssetPackError, CatalogError) as exc:
        raise SpaceError(f"platform: {exc.args[0]}") from None
    platform = resolved.platform
    if space.tasks.explicit:
        tasks = []
        for t in space.tasks.explicit:
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
    else:
        gen = space.tasks.generate
        assert gen is not None
        tasks = generate_tasks(
            space.n_gpus,
            n_tasks=gen.count,
            seed=gen.seed,
            device_memory_bytes=platform.memory_bytes,
            memory_fraction=space.memory_fraction,
            dataset=gen.dataset,
        )
    return ShardingContext(space, platform, tasks, resolved)


# ----------------------------------------------------------------------------- one unit
def _candidate(name: str, job: DLRMShardingJob, assignment: np.ndarray) -> dict:
    res, _ = job.evaluate(assignment)
    d = res.as_dict()
    d.update({"sharder": name, "status": "ok" if res.feasible else "infeasible", "assignment": [int(x) for x in assignment]})
    return d


def _failed(name: str, status: str, reason: str) -> dict:
    return {"sharder": name, "status": status, "feasible": False, "reason": reason, "predicted_iteration_s": None,
            "per_rank_s": None, "memory_bytes_per_rank": None, "assignment": None}


def evaluate_sharding_unit(ctx: ShardingContext, task_index: int, batch_size: int, sharders: Iterable[str]) -> list[dict]:
    """Evaluate ``sharders`` on one task at one batch size; one dict per sharder.

    Never raises for a single sharder: an infeasible placement is ``status="infeasible"`` with
    its reason, an unexpected error ``status="failed"`` with the error text.
    """
    sharders = list(sharders)
    job = ctx.job(task_index, batch_size)
    capacity = job.table_capacity_bytes(ctx.space.memory_fraction)
    rng_seed = ctx.space.seed * 1_000_003 + task_index * 101 + batch_size
    out: dict[str, dict] = {}
    starts: dict[str, tuple[np.ndarray, float]] = {}
    heuristics = [s for s in HEURISTIC_SHARDERS if s in sharders or "model_guided" in sharders]
    for name in heuristics:
        try:
            a = get_sharder(name).shard(job.spec.tables, job.n_ranks, capacity, rng=np.random.default_rng(rng_seed))
            cand = _candidate(name, job, a)
            if cand["feasible"]:
                starts[name] = (a, cand["predicted_iteration_s"])
            out[name] = cand
        except InfeasibleShardingError as exc:
            out[name] = _failed(name, "infeasible", str(exc))
        except Exception as exc:  # recorded, the search goes on
            out[name] = _failed(name, "failed", f"{type(exc).__name__}: {exc}")
    if "model_guided" in sharders:
        try:
            a, _, info = model_guided_shard(job, capacity, starts, max_evals=ctx.space.model_guided.max_evals, seed=rng_seed)
            cand = _candidate("model_guided", job, a)
            cand["search"] = info
            out["model_guided"] = cand
        except InfeasibleShardingError as exc:
            out["model_guided"] = _failed("model_guided", "infeasible", str(exc))
        except Exception as exc:
            out["model_guided"] = _failed("model_guided", "failed", f"{type(exc).__name__}: {exc}")
    return [out[s] for s in sharders]


# ----------------------------------------------------------------------------- study
def space_fingerprint(space: ShardingSpace) -> str:
    """Stable short hash of a space (the study name changes when the space does)."""
    blob = json.dumps(space.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def _distributions(ctx: ShardingContext) -> dict[str, CategoricalDistribution]:
    return {
        "task": CategoricalDistribution([t.label for t in ctx.tasks]),
        "batch_size": CategoricalDistribution(list(ctx.space.batch_sizes)),
        "sharder": CategoricalDistribution(list(ctx.space.sharders)),
    }


def _trial_for(ctx: ShardingContext, task_index: int, batch: int, cand: dict) -> optuna.trial.FrozenTrial:
    params = {"task": ctx.tasks[task_index].label, "batch_size": batch, "sharder": cand["sharder"]}
    attrs = {"key": f"{task_index}/{batch}/{cand['sharder']}", "result": json.dumps(cand)}
    if cand["status"] == "ok":
        return create_trial(params=params, distributions=_distributions(ctx), value=cand["predicted_iteration_s"], user_attrs=attrs)
    state = TrialState.PRUNED if cand["status"] == "infeasible" else TrialState.FAIL
    attrs["error"] = cand.get("reason", "")
    return create_trial(params=params, distributions=_distributions(ctx), state=state, user_attrs=attrs)


def open_study(name: str, storage: str, resume: bool) -> optuna.Study:
    """Create (or with ``resume`` load) the study; without ``resume`` an old one is replaced."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        if not resume:
            with contextlib.suppress(KeyError):
                optuna.delete_study(study_name=name, storage=storage)
        return optuna.create_study(study_name=name, storage=storage, direction="minimize", load_if_exists=True)
    except (ImportError, ValueError, optuna.exceptions.OptunaError) as exc:
        raise ValueError(f"storage {storage!r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    except Exception as exc:  # SQLAlchemy connection and URL errors
        if type(exc).__module__.startswith("sqlalchemy"):
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(f"storage {storage!r}: {first}") from None
        raise


def finished_results(study: optuna.Study) -> dict[str, dict]:
    """Evaluations already recorded (feasible or infeasible) by key ``task/batch/sharder``."""
    done = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        key = t.user_attrs.get("key")
        if key and "result" in t.user_attrs:
            done[key] = json.loads(t.user_attrs["result"])
    return done


# ----------------------------------------------------------------------------- executors
def _ray_init(workers: int, address: str | None) -> None:
    import ray

    if ray.is_initialized():
        return
    kwargs: dict = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR,
                    "configure_logging": True}
    if address:
        import predictor
        import tuner

        kwargs["address"] = address
        kwargs["runtime_env"] = {"py_modules": [os.path.dirname(predictor.__file__), os.path.dirname(tuner.__file__)]}
    else:
        kwargs["num_cpus"] = max(workers, 1)
    ray.init(**kwargs)


def _run_units_ray(ctx, units, sharders, workers, address, on_result: Callable) -> None:
    import ray

    _ray_init(workers, address)
    remote_eval = ray.remote(max_retries=2, num_cpus=1)(evaluate_sharding_unit)
    ctx_ref = ray.put(ctx)
    pending: dict = {}
    queue = list(units)
    limit = max(workers, 1) * 2
    while queue or pending:
        while queue and len(pending) < limit:
            u = queue.pop(0)
            pending[remote_eval.remote(ctx_ref, u[0], u[1], sharders)] = u
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            u = pending.pop(ref)
            try:
                on_result(u, ray.get(ref))
            except ray.exceptions.RayError as exc:
                msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                on_result(u, [_failed(s, "failed", f"worker error: {msg}") for s in sharders])


def _run_units_local(ctx, units, sharders, on_result: Callable) -> None:
    for u in units:
        try:
            res = evaluate_sharding_unit(ctx, u[0], u[1], sharders)
        except Exception as exc:  # pragma: no cover - evaluate_sharding_unit catches per sharder
            traceback.print_exc(file=sys.stderr)
            res = [_failed(s, "failed", f"{type(exc).__name__}: {exc}") for s in sharders]
        on_result(u, res)


# ----------------------------------------------------------------------------- driver
@dataclass
class SearchOutcome:
    """What a search produced: every evaluation, by unit, plus study bookkeeping."""

    ctx: ShardingContext
    results: dict[tuple[int, int], list[dict]]
    study_name: str
    storage: str
    evaluated: int
    reused: int


def run_sharding_search(
    space: ShardingSpace,
    *,
    storage: str,
    workers: int = 2,
    address: str | None = None,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SearchOutcome:
    """Evaluate every (task, batch size, sharder) of ``space``; record each in the study.

    ``workers=0`` evaluates in this process (no Ray) — for tests and tiny spaces.
    ``progress(done_units, total_units)`` is called as units finish.
    """
    ctx = build_sharding_context(space)
    name = f"sharding-{space_fingerprint(space)}"
    study = open_study(name, storage, resume)
    done = finished_results(study) if resume else {}
    sharders = list(space.sharders)
    all_units = [(ti, b) for ti in range(len(ctx.tasks)) for b in space.batch_sizes]
    results: dict[tuple[int, int], list[dict]] = {}
    todo = []
    for ti, b in all_units:
        keys = [f"{ti}/{b}/{s}" for s in sharders]
        if all(k in done for k in keys):
            results[(ti, b)] = [done[k] for k in keys]
        else:
            todo.append((ti, b))
    reused = len(all_units) - len(todo)
    if progress:
        progress(reused, len(all_units))

    def on_result(unit: tuple[int, int], cands: list[dict]) -> None:
        results[unit] = cands
        study.add_trials([_trial_for(ctx, unit[0], unit[1], c) for c in cands])
        if progress:
            progress(len(results), len(all_units))

    if todo:
        if workers <= 0:
            _run_units_local(ctx, todo, sharders, on_result)
        else:
            _run_units_ray(ctx, todo, sharders, workers, address, on_result)
    ordered = {u: results[u] for u in all_units}
    return SearchOutcome(ctx, ordered, name, storage, evaluated=len(todo) * len(sharders), reused=reused * len(sharders))


def default_storage(out: Path) -> str:
    """SQLite study file in the output folder (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(out / 'study.db').resolve()}"
