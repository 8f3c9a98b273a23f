"""Evaluation of ``space: rent`` candidates: the offers (accelerator + price), the candidates, the cost.

:func:`build_rent_context` resolves each accelerator (a catalog key or an asset pack) and its price
per device-hour in the space's price column; :func:`enumerate_rent` lists the candidates (one per
accelerator x device count x plan); :func:`evaluate_rent` predicts one and turns the iteration into
the time to train, the dollars and the device-hours (:func:`finish_record`), marking it infeasible
when it does not fit in memory or misses the deadline or the budget.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from predictor.sources.synth.decoupled import DATAFLOW_KINDS
from predictor.sources.synth.dlrm_tables import EmbeddingTables, generate_tasks
from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec
from predictor.timing.kernels.assets import AssetPackError, ResolvedPlatform, resolve_platform
from predictor.timing.platforms import CatalogError, UnknownPlatformError
from predictor.timing.platforms.schema import Platform
from tuner.plans import missing_peak, unsupported_precision
from tuner.search.accelerators import (
    AcceleratorContext,
    AcceleratorSpace,
    ModelInfo,
    evaluate_chips,
    trace_model,
    unit_timeline,
)
from tuner.search.core import Candidate, Outcome
from tuner.search.parallel import (
    ParallelContext,
    ParallelSpace,
    enumerate_candidates,
    evaluate_candidate,
    normalise,
)
from tuner.search.rent import RentSpace, device_counts
from tuner.search.schema import SpaceError
from tuner.search.sharding import ShardingContext, ShardingSpace, evaluate_sharding_unit

__all__ = ["Offer", "RentContext", "build_rent_context", "enumerate_rent", "candidate_key", "evaluate_rent",
           "finish_record", "failed_outcome", "trace_module", "timeline_of", "duration", "TIME_VALUE"]

#: the persistent study's single value: time to train, hours (both objectives are in each record)
TIME_VALUE = "time_to_train_h"


@dataclass(frozen=True)
class Offer:
    """One accelerator as rented: its platform, kernel models and price per device-hour (USD)."""

    key: str
    resolved: ResolvedPlatform
    usd_per_device_hour: float
    price_column: str
    price_source: str

    @property
    def platform(self) -> Platform:
        """The accelerator's platform."""
        return self.resolved.platform

    def nodes(self, devices: int) -> int:
        """Nodes that hold ``devices`` devices."""
        return math.ceil(devices / self.platform.devices_per_node)


@dataclass
class RentContext:
    """What every rent evaluation receives (picklable)."""

    space: RentSpace
    kind: str  # transformer | dlrm | module
    offers: dict[str, Offer]
    devices: list[int]
    total_samples: float  # sequences (transformer) or samples x epochs to train on
    spec: TransformerSpec | None = None
    parallel: ParallelSpace | None = None
    tables: EmbeddingTables | None = None
    module: AcceleratorSpace | None = None
    module_info: ModelInfo | None = None
    module_context: AcceleratorContext | None = field(default=None, repr=False)


def _price(space: RentSpace, key: str, platform: Platform, col: str) -> tuple[float, str]:
    """(USD per device-hour, where it comes from) in price column ``col``; SpaceError if absent."""
    given = {k.lower(): v for k, v in space.pricing.prices.items()}.get(key.lower(), {})
    if col in given:
        return float(given[col]), f"pricing.prices.{key}.{col}"
    if col == "on_demand" and platform.price_per_device_hour_usd is not None:
        return float(platform.price_per_device_hour_usd), f"catalog on-demand ({platform.price_date or 'undated'})"
    where = "no on-demand price in the catalog" if col == "on_demand" else f"no {col!r} price"
    raise SpaceError(f"pricing: {key} has {where}; give pricing.prices.{key}.{col}")


def _offers(space: RentSpace) -> dict[str, Offer]:
    offers: dict[str, Offer] = {}
    for i, key in enumerate(space.accelerators):
        try:
            resolved = resolve_platform(key, space.catalog)
        except (UnknownPlatformError, AssetPackError, CatalogError) as exc:
            raise SpaceError(f"accelerators[{i}]: {exc.args[0]}") from None
        except FileNotFoundError:
            raise SpaceError(f"catalog: no such file {space.catalog}") from None
        cols = space.pricing.columns
        for col in cols:
            usd, source = _price(space, key, resolved.platform, col)
            name = key if len(cols) == 1 else f"{key}@{col}"  # one offer per price column
            offers[name] = Offer(name, resolved, usd, col, source)
    unknown = sorted(set(k.lower() for k in space.pricing.prices) - {k.lower() for k in space.accelerators})
    if unknown:
        raise SpaceError(f"pricing.prices: {', '.join(unknown)} is not one of the accelerators")
    return offers


def _tables(space: RentSpace, offers: dict[str, Offer]) -> EmbeddingTables:
    d = space.model.dlrm
    assert d is not None
    if d.generate is not None:
        smallest = min(o.platform.memory_bytes for o in offers.values())
        return generate_tasks(d.generate.reference_devices, n_tasks=1, seed=d.generate.seed,
                              device_memory_bytes=smallest, memory_fraction=d.memory_fraction,
                              dataset=d.generate.dataset)[0]
    tabs = d.tables or []
    reuse = np.asarray([t.reuse for t in tabs], dtype=float) if all(t.reuse is not None for t in tabs) else None
    return EmbeddingTables(rows=np.asarray([t.rows for t in tabs]), dim=np.asarray([t.dim for t in tabs]),
                           pooling=np.asarray([t.pooling for t in tabs], dtype=float), reuse=reuse,
                           name=[t.name or f"t{i}" for i, t in enumerate(tabs)], label="dlrm")


def _runs_plans(space: RentSpace, offers: dict[str, Offer], kind: str, spec: TransformerSpec | None) -> None:
    """A transformer or DLRM plan is a GPU-style program (Megatron-LM, TorchRec): refuse a dataflow system
    (SN30, Bow IPU, CS-2), which runs a compiled graph that only ``model: module`` describes, and an asset pack
    for a transformer. Any model: a catalog chip without a peak for its GEMMs' dtype (fp32 GEMMs priced at a
    bf16 peak otherwise) or, for a transformer with FP8 linears, without an FP8 peak."""
    program = {"transformer": "Megatron-LM plans", "dlrm": "DLRM sharding plans"}.get(kind)
    # the GEMMs' dtype of a DLRM or module and the field that sets it (a transformer: unsupported_precision)
    dtype, field = None, ""
    if kind == "dlrm" and space.model.dlrm is not None:
        dtype, field = space.model.dlrm.dense.dtype, "model.dlrm.dense.dtype to a format it lists"
    elif kind == "module" and space.model.module is not None and space.model.module.precision == "fp32":
        dtype, field = "fp32", "model.module.precision: bf16"
    for i, key in enumerate(space.accelerators):
        offer = next(o for o in offers.values() if o.key.split("@")[0] == key)
        plat = offer.platform
        if kind == "transformer" and offer.resolved.pack is not None:
            raise SpaceError(f"accelerators[{i}]: {key} is an asset pack: a transformer is priced on catalog entries, "
                             "whose GEMM ceilings are fitted to published runs (--catalog FILE adds a device)")
        if program is not None and plat.kind in DATAFLOW_KINDS:
            raise SpaceError(f"accelerators[{i}]: {key} is a dataflow system ({plat.kind}) that runs a compiled graph, "
                             f"not {program}; rent it with model: module")
        if spec is not None:
            refused = unsupported_precision(spec, plat)
        else:  # a pack times GEMMs by its calibrated models, not the peak
            refused = missing_peak(plat, dtype) if dtype and offer.resolved.pack is None else None
            refused = refused and f"{refused}, set {field}"
        if refused:
            raise SpaceError(f"accelerators[{i}]: {refused}; or leave it out")


def build_rent_context(space: RentSpace) -> RentContext:
    """Resolve offers, device counts and the model; raises :class:`SpaceError` with one line on bad input."""
    offers = _offers(space)
    kind = space.model.kind
    m = space.model.transformer
    spec = m.to_spec() if kind == "transformer" and m is not None else None
    _runs_plans(space, offers, kind, spec)
    t = space.training
    ctx = RentContext(space, kind, offers, device_counts(space.devices), 0.0)
    if kind == "transformer":
        assert m is not None and t.global_batch is not None
        ctx.spec = spec
        ctx.total_samples = t.tokens / m.seq if t.tokens is not None else float(t.samples or 0)
        ctx.total_samples *= t.epochs
        ctx.parallel = ParallelSpace.model_validate({
            "space": "parallel", "model": m.model_dump(mode="json"), "cluster": {"platform": space.accelerators[0]},
            "global_batch": t.global_batch, "ranges": space.ranges.model_dump(mode="json"),
            "options": space.options.model_dump(mode="json"), "search": {"detail": space.search.detail}})
    else:
        ctx.total_samples = float(t.samples or 0) * t.epochs
    if kind == "dlrm":
        ctx.tables = _tables(space, offers)
    if kind == "module":
        from predictor.sources.synth.models import ModelImportError, get_model_spec

        m = space.model.module
        assert m is not None
        ctx.module = AcceleratorSpace.model_validate({
            "space": "accelerators", "models": [{"name": m.name, "input": m.input, "input_shape": m.input_shape}],
            "accelerators": [k.lower() for k in offers], "devices": ctx.devices, "precision": m.precision,
            "optimizer": m.optimizer, "batch_sizes": m.batch_sizes, "batch_policy": m.batch_policy,
            "memory_fraction": m.memory_fraction})
        try:
            spec = get_model_spec(m.name, input=m.input, input_shape=m.input_shape)
        except ModelImportError as exc:
            raise SpaceError(f"model.module.name: {exc}") from None
        ctx.module_context = AcceleratorContext(ctx.module, {}, {m.name: spec})
    return ctx


def trace_module(ctx: RentContext) -> Any:
    """Trace the module model once (fake tensors); sets ``ctx.module_info``; returns the scalable trace."""
    assert ctx.module_context is not None and ctx.space.model.module is not None
    name = ctx.space.model.module.name
    trace = trace_model(ctx.module_context, name)
    ctx.module_info = ctx.module_context.info(name, trace.n_params)
    return trace


# ----------------------------------------------------------------------------- candidates
def _key(acc: str, devices: int, plan: str | None) -> str:
    return f"{acc}/{devices}" + (f"/{plan}" if plan else "")


def enumerate_rent(ctx: RentContext) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """Every candidate (accelerator x devices x plan) and the invalid combinations with their reason."""
    out: list[Candidate] = []
    invalid: list[tuple[str, str]] = []
    for acc in ctx.offers:
        for dev in ctx.devices:
            base = {"accelerator": acc, "devices": dev}
            if ctx.kind == "transformer":
                assert ctx.parallel is not None
                cands, bad = enumerate_candidates(ctx.parallel, dev)
                out += [Candidate(_key(acc, dev, c.key), {**base, "fields": c.params["fields"],
                                                          "raw": {**base, **c.params["raw"]}}) for c in cands]
                invalid += [(_key(acc, dev, k), r) for k, r in bad]
            elif ctx.kind == "dlrm":
                assert ctx.space.model.dlrm is not None
                for b in ctx.space.model.dlrm.batch_sizes:
                    if b % dev:
                        invalid.append((_key(acc, dev, f"b{b}"), f"batch {b} is not divisible by {dev} devices"))
                        continue
                    out.append(Candidate(_key(acc, dev, f"b{b}"), {**base, "batch_size": b,
                                                                   "raw": {**base, "batch_size": b}}))
            else:
                out.append(Candidate(_key(acc, dev, None), {**base, "raw": dict(base)}, part="module"))
    return out, invalid


def candidate_key(ctx: RentContext, params: dict) -> str | None:
    """The key of the candidate that trial parameters make, or ``None`` when they make none."""
    acc, dev = params["accelerator"], params["devices"]
    if ctx.kind == "transformer":
        assert ctx.parallel is not None
        key, _ = normalise(ctx.parallel, dev, {k: v for k, v in params.items() if k not in ("accelerator", "devices")})
        return None if key is None else _key(acc, dev, key)
    if ctx.kind == "dlrm":
        return _key(acc, dev, f"b{params['batch_size']}")
    return _key(acc, dev, None)


# ----------------------------------------------------------------------------- evaluation
def duration(hours: float) -> str:
    """Hours as text in the unit that reads best: ``40 s``, ``42 min``, ``5.2 h``, ``54.3 days``."""
    if hours < 1.0:
        return f"{3600 * hours:.0f} s" if hours < 1.0 / 60 else f"{60 * hours:.0f} min"
    return f"{hours:.1f} h" if hours < 48.0 else f"{hours / 24:.1f} days"


def finish_record(ctx: RentContext, offer: Offer, devices: int, rec: dict) -> dict:
    """Add time to train (h, days), USD, device-hours and the constraint values; mark misses infeasible.

    ``rec`` holds ``status``, ``iteration_s`` (s, None unless simulated), ``global_batch``
    (samples per iteration) and ``memory_bytes_per_device``. Constraint values are ``need /
    limit - 1`` (<= 0 is met), the form Optuna's constrained NSGA-II reads.
    """
    space = ctx.space
    cap = offer.platform.memory_bytes
    rec.update(accelerator=offer.key, platform=offer.platform.key, accelerator_name=offer.platform.name,
               devices=devices,
               nodes=offer.nodes(devices), devices_per_node=offer.platform.devices_per_node,
               usd_per_device_hour=offer.usd_per_device_hour, price_column=offer.price_column,
               device_memory_bytes=cap)
    mem = rec.get("memory_bytes_per_device")
    cons: dict[str, float] = {}
    if mem is not None and cap:
        cons["memory"] = mem / rec.get("usable_memory_bytes", cap) - 1.0
    it = rec.get("iteration_s")
    if it is None or rec.get("global_batch") is None:
        rec["constraints"] = cons
        return rec
    iterations = math.ceil(ctx.total_samples / rec["global_batch"])
    hours = iterations * it / 3600.0
    rec.update(iterations=iterations, time_to_train_h=hours, time_to_train_days=hours / 24.0,
               device_hours=hours * devices, usd=hours * devices * offer.usd_per_device_hour,
               samples_per_s=rec["global_batch"] / it if it > 0 else None)
    misses = []
    if space.deadline_h is not None:
        cons["deadline"] = hours / space.deadline_h - 1.0
        if cons["deadline"] > 0:
            misses.append(f"deadline: {duration(hours)} > {duration(space.deadline_h)}")
    if space.budget_usd is not None:
        cons["budget"] = rec["usd"] / space.budget_usd - 1.0
        if cons["budget"] > 0:
            misses.append(f"budget: ${rec['usd']:,.0f} > ${space.budget_usd:,.0f}")
    rec["constraints"] = cons
    if rec["status"] == "ok" and misses:
        rec.update(status="infeasible", reason="; ".join(misses))
    return rec


#: plan-result fields a rent record leaves out (its cost comes from the space's price column, not the catalog's)
_DROP = ("memory_per_stage", "per_stage_s", "params", "graph", "key", "usd_per_iteration")


def _transformer(ctx: RentContext, offer: Offer, devices: int, fields: dict) -> dict:
    assert ctx.parallel is not None and ctx.spec is not None
    pctx = ParallelContext(ctx.parallel, offer.platform, ctx.spec, offer.platform.devices_per_node, devices)
    res = evaluate_candidate(pctx, ParallelPlan(**fields).label(), fields)
    rec = {k: v for k, v in res.items() if k not in _DROP}
    rec["iteration_s"] = rec.pop("predicted_iteration_s", None)
    rec["global_batch"] = fields["global_batch"]
    if rec["status"] == "infeasible" and rec.get("reason") and not rec["reason"].startswith("memory"):
        rec["reason"] = f"memory: {rec['reason']}"
    return rec


def _sharding(ctx: RentContext, offer: Offer, devices: int, batch: int) -> ShardingContext:
    """The sharding search's context for the space's tables on ``devices`` devices of ``offer``."""
    d = ctx.space.model.dlrm
    assert d is not None and ctx.tables is not None
    sspace = ShardingSpace.model_validate({
        "space": "sharding", "platform": offer.key, "n_gpus": devices, "batch_sizes": [batch],
        "tasks": {"generate": {"count": 1}}, "model": d.dense.model_dump(mode="json"), "sharders": list(d.sharders),
        "memory_fraction": d.memory_fraction, "model_guided": {"max_evals": d.model_guided_evals}})
    return ShardingContext(sspace, offer.platform, [ctx.tables], offer.resolved)


def _dlrm(ctx: RentContext, offer: Offer, devices: int, batch: int) -> dict:
    d = ctx.space.model.dlrm
    assert d is not None and ctx.tables is not None
    results = evaluate_sharding_unit(_sharding(ctx, offer, devices, batch), 0, batch, list(d.sharders))
    ok = [r for r in results if r["status"] == "ok"]
    by = {r["sharder"]: (r["predicted_iteration_s"] if r["status"] == "ok" else r["status"]) for r in results}
    rec: dict = {"global_batch": batch, "sharders": by, "timing_source": offer.resolved.source,
                 "plan": f"b{batch}"}
    if not ok:
        first = next((r for r in results if r["status"] == "infeasible"), results[0])
        rec.update(status=first["status"], reason=f"memory: {first['reason']}" if first["status"] == "infeasible"
                   else first["reason"], iteration_s=None,
                   memory_bytes_per_device=max(first.get("memory_bytes_per_rank") or [0.0]) or None)
        return rec
    best = min(ok, key=lambda r: r["predicted_iteration_s"])
    rec.update(status="ok", reason="", iteration_s=best["predicted_iteration_s"], plan=f"b{batch}-{best['sharder']}",
               fields={"global_batch": batch, "sharder": best["sharder"], "assignment": best["assignment"]},
               memory_bytes_per_device=max(best["memory_bytes_per_rank"]), breakdown=best.get("breakdown"))
    return rec


def _module(ctx: RentContext, offer: Offer, devices: int, trace: Any) -> dict:
    """A module on ``devices`` rented chips; on a dataflow system they may run as pipelines of several chips
    (replicas = devices / stages), priced as the ``devices`` chips and with memory per chip."""
    assert ctx.module is not None and ctx.module_info is not None
    row = evaluate_chips(ctx.module, offer.platform, ctx.module_info, trace, devices)
    stages = int(row.get("pipeline_stages") or 1)
    replicas = int(row.get("devices") or devices)
    plan = f"dp{replicas}" + (f"-pp{stages}" if stages > 1 else "") + f"-b{row.get('batch_size')}"
    rec: dict = {"status": row.get("status", "failed"), "reason": row.get("reason") or "",
                 "iteration_s": row.get("iteration_s"), "global_batch": row.get("global_batch"),
                 "timing_source": row.get("timing_source"), "plan": plan, "pipeline_stages": stages,
                 "fields": {"batch_size": row.get("batch_size"), "global_batch": row.get("global_batch"),
                            "pipeline_stages": stages, "replicas": replicas}}
    mem = row.get("memory") or {}
    # the placement target of a pipeline holds all its chips' memory (pipeline_platform): one chip holds 1/stages
    off = mem.get("off_chip_bytes")
    rec["memory_bytes_per_device"] = None if off is None else off / stages
    if rec["status"] == "infeasible":
        rec["reason"] = f"memory: {rec['reason']}"
    return rec


def evaluate_rent(ctx: RentContext, candidate: Candidate, part: Any = None) -> list[Outcome]:
    """The evaluation of one candidate: one outcome (value = time to train, h, when feasible)."""
    p = candidate.params
    offer = ctx.offers[p["accelerator"]]
    dev = p["devices"]
    try:
        if ctx.kind == "transformer":
            rec = _transformer(ctx, offer, dev, p["fields"])
        elif ctx.kind == "dlrm":
            rec = _dlrm(ctx, offer, dev, p["batch_size"])
        else:
            rec = _module(ctx, offer, dev, part)
    except Exception as exc:  # recorded, the search goes on
        rec = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}", "iteration_s": None,
               "traceback": traceback.format_exc(limit=3)}
    rec["key"] = candidate.key
    rec["kind"] = ctx.kind
    rec = finish_record(ctx, offer, dev, rec)
    return [Outcome(candidate.key, p["raw"], rec, rec.get(TIME_VALUE) if rec["status"] == "ok" else None)]


def failed_outcome(ctx: RentContext, candidate: Candidate, reason: str) -> Outcome:
    """A ``failed`` outcome of a candidate whose evaluation raised or whose worker died."""
    p = candidate.params
    rec = finish_record(ctx, ctx.offers[p["accelerator"]], p["devices"],
                        {"status": "failed", "reason": reason, "iteration_s": None, "key": candidate.key,
                         "kind": ctx.kind})
    return Outcome(candidate.key, p["raw"], rec, None)


def timeline_of(ctx: RentContext, record: dict, trace: Any = None) -> Any:
    """The predicted timeline of a feasible record (a :class:`~predictor.simulate.Timeline`), or ``None``.

    The plan is simulated again with the evaluation's inputs; a module plan needs the model's
    ``trace`` (``None``: no timeline).
    """
    offer = ctx.offers[record["accelerator"]]
    f = record.get("fields") or {}
    if ctx.kind == "transformer" and f:
        from tuner.plans import predict_plan

        assert ctx.spec is not None
        _, tl = predict_plan(ctx.spec, ParallelPlan(**f), offer.platform, devices_per_node=offer.platform.devices_per_node,
                             devices=record["devices"], detail=ctx.space.search.detail, keep_timeline=True)
        return tl
    if ctx.kind == "dlrm" and f.get("assignment") is not None:
        job = _sharding(ctx, offer, record["devices"], f["global_batch"]).job(0, f["global_batch"])
        return job.evaluate(np.asarray(f["assignment"]))[1]
    if ctx.kind == "module" and trace is not None and f.get("batch_size") and ctx.module is not None:
        return unit_timeline(ctx.module, offer.platform, trace, f["batch_size"], f.get("replicas", record["devices"]),
                             f.get("pipeline_stages"))
    return None
