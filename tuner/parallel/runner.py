"""``space: parallel`` runner: evaluate TP/PP/DP plans in Ray tasks, record them in an Optuna study.

Strategy (``search.strategy``):

* ``grid`` — every valid candidate of the ranges (``auto`` picks it up to ``search.grid_limit``
  candidates);
* ``tpe`` — an Optuna TPE study over the range dimensions (tp, pp, micro-batch, schedule,
  virtual stages, recomputation, sequence parallelism, ep, distributed optimizer) that
  evaluates ``search.trials`` distinct plans, ``workers`` at a time; combinations that cannot
  form a plan are told as FAIL at no cost, repeats reuse the first evaluation.

Every evaluation is an Optuna trial as soon as it returns — COMPLETE (value = predicted
seconds per iteration), PRUNED (does not fit in memory, with the reason) or FAIL — with the
plan key and the whole result in its user attributes, so ``--resume`` skips what the study
already holds (:func:`tuner.search.finished_results`). Ray start-up and the study helpers are
those of :mod:`tuner.search`.
"""

from __future__ import annotations

import hashlib
import json
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from predictor.sources.synth.transformer import ParallelPlan, PlanError, TransformerSpec
from predictor.timing.platforms import UnknownPlatformError, get_platform
from predictor.timing.platforms.schema import Platform
from tuner.parallel.job import predict_plan
from tuner.parallel.space import SEARCHED, Candidate, ParallelSpace, enumerate_candidates, normalise
from tuner.report import json_default
from tuner.search import _ray_init, finished_results, open_study
from tuner.search_runners import SearchRequest
from tuner.spaces import SpaceError

__all__ = ["ParallelContext", "build_context", "evaluate_candidate", "run_parallel_search", "ParallelOutcome", "run"]


@dataclass
class ParallelContext:
    """What a worker needs to evaluate a plan (picklable)."""

    space: ParallelSpace
    platform: Platform
    spec: TransformerSpec
    devices_per_node: int
    devices: int


def build_context(space: ParallelSpace) -> ParallelContext:
    """Resolve the platform and the device count; raises :class:`SpaceError` on bad input."""
    try:
        platform = get_platform(space.cluster.platform, space.cluster.catalog)
    except UnknownPlatformError as exc:
        raise SpaceError(f"cluster.platform: {exc}") from None
    except FileNotFoundError:
        raise SpaceError(f"cluster.catalog: no such file {space.cluster.catalog}") from None
    dpn = space.cluster.devices_per_node or platform.devices_per_node
    spec = space.model.to_spec()
    return ParallelContext(space, platform, spec, dpn, space.cluster.nodes * dpn)


def evaluate_candidate(ctx: ParallelContext, key: str, fields: dict) -> dict:
    """Predict one plan; never raises (an error becomes ``status="failed"`` with its text)."""
    try:
        res, _ = predict_plan(ctx.spec, ParallelPlan(**fields), ctx.platform, devices_per_node=ctx.devices_per_node,
                              devices=ctx.devices, detail=ctx.space.search.detail)
    except PlanError as exc:
        res = {"status": "invalid", "feasible": False, "reason": str(exc), "predicted_iteration_s": None}
    except Exception as exc:  # recorded, the search goes on
        res = {"status": "failed", "feasible": False, "predicted_iteration_s": None,
               "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=3)}
    res["key"] = key
    res["fields"] = fields
    return res


# ----------------------------------------------------------------------------- study records
def space_fingerprint(space: ParallelSpace) -> str:
    """Stable short hash of the parts of a space that change results (not ``search.top``)."""
    d = space.model_dump(mode="json")
    d["search"] = {k: v for k, v in d["search"].items() if k in ("detail",)}
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def _distributions(space: ParallelSpace) -> dict[str, CategoricalDistribution]:
    return {name: CategoricalDistribution(list(getattr(space.ranges, name))) for name in SEARCHED}


def _state(res: dict) -> TrialState:
    if res["status"] == "ok":
        return TrialState.COMPLETE
    return TrialState.PRUNED if res["status"] == "infeasible" else TrialState.FAIL


def _attrs(res: dict) -> dict:
    return {"key": res["key"], "result": json.dumps(res, default=json_default), "error": res.get("reason", "")}




# ----------------------------------------------------------------------------- executors
def _evaluate_many(ctx: ParallelContext, cands: list[Candidate], workers: int, address: str | None,
                   on_result: Callable[[Candidate, dict], None]) -> None:
    if workers <= 0:
        for c in cands:
            on_result(c, evaluate_candidate(ctx, c.key, c.fields))
        return
    import ray

    _ray_init(workers, address)
    remote_eval = ray.remote(max_retries=2, num_cpus=1)(evaluate_candidate)
    ctx_ref = ray.put(ctx)
    queue = list(cands)
    pending: dict = {}
    limit = max(workers, 1) * 2
    while queue or pending:
        while queue and len(pending) < limit:
            c = queue.pop(0)
            pending[remote_eval.remote(ctx_ref, c.key, c.fields)] = c
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            c = pending.pop(ref)
            try:
                res = ray.get(ref)
            except ray.exceptions.RayError as exc:
                msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                res = {"status": "failed", "feasible": False, "predicted_iteration_s": None,
                       "reason": f"worker error: {msg}", "key": c.key, "fields": c.fields}
            on_result(c, res)


# ----------------------------------------------------------------------------- driver
@dataclass
class ParallelOutcome:
    """Every evaluated plan (by key), the invalid combinations, and study bookkeeping."""

    ctx: ParallelContext
    results: dict[str, dict]
    invalid: list[tuple[str, str]]
    n_candidates: int
    strategy: str
    study_name: str
    storage: str
    evaluated: int
    reused: int


def run_parallel_search(
    space: ParallelSpace,
    *,
    storage: str,
    workers: int = 2,
    address: str | None = None,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> ParallelOutcome:
    """Search ``space``; ``workers=0`` evaluates in this process (no Ray)."""
    ctx = build_context(space)
    cands, invalid = enumerate_candidates(space, ctx.devices)
    if not cands:
        why = invalid[0][1] if invalid else "the ranges are empty"
        raise SpaceError(f"no valid plan in the ranges for {ctx.devices} devices (e.g. {why})")
    strategy = space.search.strategy
    if strategy == "auto":
        strategy = "grid" if len(cands) <= space.search.grid_limit else "tpe"
    name = f"parallel-{strategy}-{space_fingerprint(space)}"
    study = open_study(name, storage, resume)
    done = finished_results(study) if resume else {}
    by_key = {c.key: c for c in cands}
    results: dict[str, dict] = {k: v for k, v in done.items() if k in by_key}
    reused = len(results)
    dists = _distributions(space)
    evaluated = 0

    if strategy == "grid":
        todo = [c for c in cands if c.key not in results]
        total = len(cands)
        if progress:
            progress(len(results), total)

        def on_result(c: Candidate, res: dict) -> None:
            nonlocal evaluated
            results[c.key] = res
            evaluated += 1
            state = _state(res)
            value = res["predicted_iteration_s"] if state == TrialState.COMPLETE else None
            study.add_trial(create_trial(params=c.raw, distributions=dists, value=value, state=state, user_attrs=_attrs(res)))
            if progress:
                progress(len(results), total)

        _evaluate_many(ctx, todo, workers, address, on_result)
    else:
        target = min(space.search.trials, len(cands))
        # TPE runs on an in-memory study (an ask costs ~10 SQLite commits); every evaluation is
        # copied to the persistent study as soon as it is told, so resume sees it
        sampler = optuna.samplers.TPESampler(seed=space.search.seed, multivariate=True,
                                             n_startup_trials=max(4, min(16, target // 4)))
        mem = optuna.create_study(direction="minimize", sampler=sampler)
        for old in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            if set(old.params) == set(dists):
                mem.add_trial(old)
        if progress:
            progress(min(len(results), target), target)
        asks, max_asks = 0, 30 * target + 100
        batch_size = max(workers, 1)
        while len(results) < target and asks < max_asks:
            batch: list[tuple[optuna.trial.Trial, Candidate]] = []
            keys_in_batch: set[str] = set()
            while len(batch) < batch_size and asks < max_asks and len(results) + len(batch) < target:
                trial = mem.ask(dists)
                asks += 1
                key, fields = normalise(space, ctx.devices, trial.params)
                if key is None or key not in by_key:
                    mem.tell(trial, state=TrialState.FAIL)
                    continue
                if key in results or key in keys_in_batch:  # a repeat: reuse the evaluation
                    prev = results.get(key)
                    if prev is None:
                        mem.tell(trial, state=TrialState.FAIL)
                    elif _state(prev) == TrialState.COMPLETE:
                        mem.tell(trial, prev["predicted_iteration_s"])
                    else:
                        mem.tell(trial, state=_state(prev))
                    continue
                keys_in_batch.add(key)
                batch.append((trial, by_key[key]))
            if not batch:
                continue
            trials = {c.key: t for t, c in batch}
            told: list[optuna.trial.FrozenTrial] = []

            def on_result(c: Candidate, res: dict, trials=trials, told=told) -> None:
                nonlocal evaluated
                results[c.key] = res
                evaluated += 1
                t = trials[c.key]
                for k, v in _attrs(res).items():
                    t.set_user_attr(k, v)
                state = _state(res)
                if state == TrialState.COMPLETE:
                    told.append(mem.tell(t, res["predicted_iteration_s"]))
                else:
                    told.append(mem.tell(t, state=state))
                if progress:
                    progress(min(len(results), target), target)

            _evaluate_many(ctx, [c for _, c in batch], workers, address, on_result)
            study.add_trials(told)
    return ParallelOutcome(ctx, results, invalid, len(cands), strategy, name, storage, evaluated, reused)


def run(req: SearchRequest) -> str:
    """``space: parallel`` — rank TP/PP/DP plans; writes results.json (last), results.csv, the best trace."""
    from tuner.parallel.report import print_parallel_table, write_parallel_outputs

    outcome = run_parallel_search(req.spec, storage=req.storage, workers=req.workers, address=req.address,  # type: ignore[arg-type]
                                  resume=req.resume, progress=req.progress)
    payload = write_parallel_outputs(outcome, req.out)
    if not req.quiet:
        print_parallel_table(payload, req.console, top=req.spec.search.top)  # type: ignore[attr-defined]
    best = payload["best"]
    tail = (f"best {best['plan']}: {best['predicted_iteration_s']:.3f} s/iteration" if best else "no plan fits in memory")
    return (f"{len(outcome.results)} plans of {outcome.n_candidates} candidates ({outcome.strategy}; {outcome.evaluated} new, "
            f"{outcome.reused} from the study); {tail} -> {req.out}/results.json")
