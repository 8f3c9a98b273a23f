"""Runner of ``space: accelerators`` (registered in :data:`tuner.search_runners.RUNNERS`).

The driver resolves the space, traces each model once under fake tensors, then evaluates
every (model, accelerator, device count) unit in a Ray task (or in-process with
``--workers 0``). Each evaluation becomes an Optuna trial as soon as it returns — COMPLETE
(value: seconds per sample, or USD per million samples for ``throughput_per_dollar``),
PRUNED (does not fit at any candidate batch) or FAIL — in the study of ``--storage``;
``--resume`` skips units the study already holds (and does not re-trace their models).
The outputs are written by :mod:`tuner.accelerators.report`, ``results.json`` last.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable

from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from tuner.accelerators.evaluate import (
    AcceleratorContext,
    ModelInfo,
    build_context,
    evaluate_unit,
    trace_model,
    unit_key,
)
from tuner.accelerators.report import build_payload, print_table, write_outputs
from tuner.report import json_default
from tuner.search import _ray_init, finished_results, open_study, space_fingerprint
from tuner.search_runners import SearchRequest

__all__ = ["run", "run_accelerator_search"]

Unit = tuple[str, str, int]


def _failed(model: str, platform, devices: int, reason: str) -> dict:
    return {"model": model, "accelerator": platform.key, "accelerator_name": platform.name, "devices": devices,
            "status": "failed", "reason": reason, "batch_size": None}


def _trial(ctx: AcceleratorContext, unit: Unit, row: dict):
    params = {"model": unit[0], "accelerator": unit[1], "devices": unit[2]}
    dists = {
        "model": CategoricalDistribution([m.name for m in ctx.space.models]),
        "accelerator": CategoricalDistribution(list(ctx.space.accelerators)),
        "devices": CategoricalDistribution(list(ctx.space.devices)),
    }
    attrs = {"key": unit_key(*unit), "result": json.dumps(row, default=json_default)}
    if row.get("status") == "ok":
        return create_trial(params=params, distributions=dists, value=float(row["objective"]), user_attrs=attrs)
    attrs["error"] = row.get("reason", "")
    state = TrialState.PRUNED if row.get("status") == "infeasible" else TrialState.FAIL
    return create_trial(params=params, distributions=dists, state=state, user_attrs=attrs)




def _evaluate_local(ctx, units, traces, infos, on_result: Callable) -> None:
    for u in units:
        try:
            row = evaluate_unit(ctx.space, ctx.platforms[u[1]], infos[u[0]], traces[u[0]], u[2])
        except Exception as exc:  # recorded as a failed unit; the search goes on
            traceback.print_exc(file=sys.stderr)
            row = _failed(u[0], ctx.platforms[u[1]], u[2], f"{type(exc).__name__}: {exc}")
        on_result(u, row)


def _evaluate_ray(ctx, units, traces, infos, workers: int, address: str | None, on_result: Callable) -> None:
    import ray

    _ray_init(workers, address)
    remote = ray.remote(max_retries=2, num_cpus=1)(evaluate_unit)
    space_ref = ray.put(ctx.space)
    trace_refs = {m: ray.put(t) for m, t in traces.items()}
    pending: dict = {}
    queue = list(units)
    limit = max(workers, 1) * 2
    while queue or pending:
        while queue and len(pending) < limit:
            u = queue.pop(0)
            ref = remote.remote(space_ref, ctx.platforms[u[1]], infos[u[0]], trace_refs[u[0]], u[2])
            pending[ref] = u
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            u = pending.pop(ref)
            try:
                row = ray.get(ref)
            except ray.exceptions.RayError as exc:
                text = str(exc).strip()
                msg = text.splitlines()[-1] if text else type(exc).__name__
                row = _failed(u[0], ctx.platforms[u[1]], u[2], f"worker error: {msg}")
            on_result(u, row)


def run_accelerator_search(req: SearchRequest) -> tuple[dict, dict]:
    """Evaluate every unit of the space; returns ``(payload, study info)``."""
    space = req.spec
    ctx = build_context(space)  # SpaceError on bad input
    name = f"accelerators-{space_fingerprint(space)}"
    study = open_study(name, req.storage, req.resume)
    done = finished_results(study) if req.resume else {}
    units: list[Unit] = [(m.name, a, d) for m in space.models for a in space.accelerators for d in space.devices]
    results: dict[Unit, dict] = {}
    todo = []
    for u in units:
        key = unit_key(*u)
        if key in done:
            results[u] = done[key]
        else:
            todo.append(u)
    reused = len(units) - len(todo)
    total = len(units) + len({u[0] for u in todo})  # traces count as steps of the progress bar
    if req.progress:
        req.progress(reused, total)
    traces = {}
    infos: dict[str, ModelInfo] = {}
    for m in dict.fromkeys(u[0] for u in todo):
        traces[m] = trace_model(ctx, m)
        infos[m] = ctx.info(m, traces[m].n_params)
        if req.progress:
            req.progress(reused + len(traces), total)
    for m in space.models:
        if m.name not in infos:
            prior = next((r for u, r in results.items() if u[0] == m.name), {})
            infos[m.name] = ctx.info(m.name, int(prior.get("n_params", 0) or 0))

    def on_result(unit: Unit, row: dict) -> None:
        row["n_params"] = infos[unit[0]].n_params
        results[unit] = row
        study.add_trial(_trial(ctx, unit, row))
        if req.progress:
            req.progress(len(results) + len(traces), total)

    if todo:
        if req.workers <= 0:
            _evaluate_local(ctx, todo, traces, infos, on_result)
        else:
            _evaluate_ray(ctx, todo, traces, infos, req.workers, req.address, on_result)
    rows = [results[u] for u in units]
    study_info = {"name": name, "storage": req.storage, "evaluated": len(todo), "reused_from_study": reused}
    payload = build_payload(space, ctx.platforms, infos, rows, study_info)
    return payload, study_info


def run(req: SearchRequest) -> str:
    """``space: accelerators`` — per model, accelerator and device count: batch, time, throughput, price."""
    payload, info = run_accelerator_search(req)
    write_outputs(payload, req.out)
    if not req.quiet:
        print_table(payload, req.console)
    n = len(payload["rows"])
    return (f"{n} evaluations ({info['evaluated']} new, {info['reused_from_study']} from the study) "
            f"-> {req.out}/results.json, report.html")
