"""One evaluation unit of an accelerator search: a model on one accelerator at one device count.

The model is traced once (two fake-tensor traces, :func:`predictor.sources.synth.opgraph.trace_scalable`)
in the driver; every unit gets that trace and

1. picks the per-device batch size by eq. 5 over the candidate set (:mod:`predictor.memory`),
   honouring the on-chip and off-chip capacities of the accelerator's memory policy;
2. builds the iteration graph of the decoupled time model (:mod:`predictor.sources.synth.decoupled`) at
   that batch and costs it with :func:`tuner.cost.evaluate_graph` (the simulator, the memory
   check, the price);
3. returns a JSON-ready row: batch, memory per level and per category, iteration time,
   throughput, price-performance, and the method behind each number.

A model that does not fit at any candidate batch is an ``infeasible`` row with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from predictor.memory import BatchChoice, LevelUsage, MemoryExtras, memory_timeline, place, select_batch_size
from predictor.sources.synth.decoupled import TimeOptions, prepare_iteration, summarize_iteration
from predictor.sources.synth.models import ModelImportError, ModelSpec, get_model_spec
from predictor.sources.synth.opgraph import ScalableOpGraph, TraceError, trace_scalable
from predictor.timing.platforms import CatalogError, UnknownPlatformError, get_platform
from predictor.timing.platforms.schema import Platform
from tuner.accelerators.space import AcceleratorSpace
from tuner.cost import evaluate_graph
from tuner.spaces import SpaceError

__all__ = ["AcceleratorContext", "ModelInfo", "build_context", "trace_model", "evaluate_unit", "unit_key"]

MIB = 2.0**20


@dataclass(frozen=True)
class ModelInfo:
    """What the report needs to know about a model (picklable, unlike its spec)."""

    name: str
    description: str
    sample_unit: str
    tokens_per_sample: int
    n_params: int = 0


@dataclass
class AcceleratorContext:
    """The resolved space: platforms by key and model specs by name (specs stay in the driver)."""

    space: AcceleratorSpace
    platforms: dict[str, Platform]
    specs: dict[str, ModelSpec]

    def info(self, name: str, n_params: int = 0) -> ModelInfo:
        s = self.specs[name]
        return ModelInfo(name, s.description, s.sample_unit, s.tokens_per_sample, n_params)


def unit_key(model: str, accelerator: str, devices: int) -> str:
    """Study key of a unit."""
    return f"{model}/{accelerator}/{devices}"


def build_context(space: AcceleratorSpace) -> AcceleratorContext:
    """Resolve accelerators and models; raises :class:`SpaceError` with one line on bad input."""
    platforms: dict[str, Platform] = {}
    for i, key in enumerate(space.accelerators):
        try:
            platforms[key] = get_platform(key, space.catalog)
        except UnknownPlatformError as exc:
            raise SpaceError(f"accelerators[{i}]: {exc}") from None
        except (CatalogError, FileNotFoundError) as exc:
            raise SpaceError(f"catalog: {exc}") from None
    specs: dict[str, ModelSpec] = {}
    for i, m in enumerate(space.models):
        try:
            specs[m.name] = get_model_spec(m.name, input=m.input, input_shape=m.input_shape)
        except ModelImportError as exc:
            raise SpaceError(f"models[{i}].name: {exc}") from None
    return AcceleratorContext(space, platforms, specs)


def trace_model(ctx: AcceleratorContext, name: str) -> ScalableOpGraph:
    """The model's scalable trace in the space's precision and optimizer (fake tensors only)."""
    spec = ctx.specs[name]
    try:
        return trace_scalable(spec.build, spec.make_batch, spec.loss, precision=ctx.space.precision,
                              optimizer=ctx.space.optimizer)
    except TraceError as exc:
        raise SpaceError(f"model {name!r}: {exc}") from None


def _extras(space: AcceleratorSpace, trace: ScalableOpGraph, devices: int) -> MemoryExtras:
    grads = float(trace.lo.grad_bytes[trace.lo.grad_ready_op >= 0].sum())
    return MemoryExtras(workspace_bytes=space.workspace_mib * MIB, comm_buffer_bytes=grads if devices > 1 else 0.0)


def _options(space: AcceleratorSpace, devices: int) -> TimeOptions:
    return TimeOptions(
        n_devices=devices,
        host_samples_per_s=space.data_loading.host_samples_per_s,
        host_link_bytes_per_s=space.data_loading.host_link_gb_per_s * 1e9,
        overlap_data_loading=space.data_loading.overlap,
        bucket_bytes=space.communication.bucket_mib * MIB,
        compression_ratio=space.communication.compression_ratio,
        gradient_accumulation=space.gradient_accumulation,
    )


def _objective(space: AcceleratorSpace, samples_per_s: float, usd_per_hour: float | None) -> float:
    """Value the study minimises: seconds per sample, or USD per million samples."""
    if samples_per_s <= 0:
        return float("inf")
    if space.objective == "throughput_per_dollar":
        if usd_per_hour is None:
            return float("inf")
        return usd_per_hour / (samples_per_s * 3600.0) * 1e6
    return 1.0 / samples_per_s


def _predict(space, platform, info: ModelInfo, trace: ScalableOpGraph, batch: int, usage: LevelUsage, devices: int):
    g = trace.at(batch)
    opts = _options(space, devices)
    graph, timing, calibrated = prepare_iteration(g, platform, usage, opts)
    cost, tl = evaluate_graph(graph, timing, [usage.off_chip_bytes], platform, n_devices=devices)
    pred = summarize_iteration(g, platform, graph, tl, opts, calibrated=calibrated, source=timing.source)
    return pred, cost


def evaluate_unit(
    space: AcceleratorSpace,
    platform: Platform,
    info: ModelInfo,
    trace: ScalableOpGraph,
    devices: int,
) -> dict:
    """Evaluate one (model, accelerator, device count); never raises for a model that does not fit."""
    extras = _extras(space, trace, devices)

    def estimate(b: int) -> LevelUsage:
        return place(memory_timeline(trace.at(b), extras), platform, usable_fraction=space.memory_fraction)

    choice: BatchChoice = select_batch_size(estimate, space.batch_sizes)
    price = platform.price_per_device_hour_usd
    row: dict = {
        "model": info.name,
        "accelerator": platform.key,
        "accelerator_name": platform.name,
        "devices": devices,
        "precision": space.precision,
        "memory_policy": platform.memory_policy,
        "price_per_device_hour_usd": price,
        "price_date": platform.price_date,
        "eq5_batch": choice.batch,
        "candidates": choice.candidates,
    }
    if not choice.feasible:
        row.update({"status": "infeasible", "reason": choice.reason, "batch_size": None})
        return row
    chosen = choice.batch
    usage = choice.usage
    usd_h = None if price is None else price * devices
    if space.batch_policy == "best_throughput":
        best = None
        for cand in choice.candidates:
            if not cand["feasible"]:
                continue
            u = estimate(cand["batch"])
            pred, _ = _predict(space, platform, info, trace, cand["batch"], u, devices)
            cand["samples_per_s"] = pred.samples_per_s
            obj = _objective(space, pred.samples_per_s, usd_h)
            if best is None or obj < best[0]:
                best = (obj, cand["batch"], u)
        assert best is not None
        _, chosen, usage = best
    pred, cost = _predict(space, platform, info, trace, chosen, usage, devices)
    ga = space.gradient_accumulation
    thr = pred.samples_per_s
    row.update(
        {
            "status": "ok" if cost.feasible else "infeasible",
            "reason": cost.reason,
            "batch_size": chosen,
            "global_batch": chosen * devices * ga,
            "gradient_accumulation": ga,
            "memory": usage.as_dict(),
            "iteration_s": pred.iteration_s,
            "samples_per_s": thr,
            "tokens_per_s": thr * info.tokens_per_sample,
            "usd_per_hour": usd_h,
            "price_performance": None if usd_h is None else thr / usd_h,
            "samples_per_usd": None if usd_h is None else thr * 3600.0 / usd_h,
            "usd_per_iteration": cost.usd_per_iteration,
            "objective": _objective(space, thr, usd_h),
            "prediction": pred.as_dict(),
            "timing_source": cost.timing_source,
            "methods": {
                **pred.methods,
                "batch_size": (pred.methods["batch_size"] if space.batch_policy == "eq5" else
                               "best objective among the candidates that fit (memory model), time model per candidate"),
                "price": f"catalog price per device-hour ({platform.price_date or 'undated'})"
                if price is not None else "no price in the catalog",
            },
        }
    )
    return row
