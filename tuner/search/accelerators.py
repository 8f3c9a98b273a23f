"""``space: accelerators`` — which accelerator (and batch size) trains a model fastest or cheapest.

Centimani (Xie et al., USENIX ATC 2024) as a search. The driver traces each model once under
fake tensors (:func:`predictor.sources.synth.op_trace.trace_scalable`); one candidate is one
model on one accelerator at one data-parallel device count, and its evaluation

1. picks the per-device batch size by eq. 5 over the candidate set (:mod:`predictor.memory`),
   honouring the on-chip and off-chip capacities of the accelerator's memory policy;
2. builds the iteration graph of the decoupled time model (:mod:`predictor.sources.synth.decoupled`)
   at that batch and costs it with :func:`tuner.cost.evaluate_graph` (the simulator, the memory
   check, the price);
3. returns a JSON-ready row: batch, memory per level and per category, iteration time,
   throughput, price-performance, and the method behind each number.

Each row is one outcome: ok (value = seconds per sample, or USD per million samples for
``objective: throughput_per_dollar``), infeasible (does not fit at any candidate batch, with
the reason) or failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from optuna.distributions import CategoricalDistribution
from pydantic import Field, field_validator, model_validator

from predictor.memory import BatchChoice, LevelUsage, MemoryExtras, memory_timeline, place, select_batch_size
from predictor.simulate import Timeline
from predictor.sources.synth.decoupled import (
    DATAFLOW_KINDS,
    IterationPrediction,
    TimeOptions,
    pipeline_iteration,
    pipeline_platform,
    pipeline_stages_for,
    prepare_iteration,
    summarize_iteration,
)
from predictor.sources.synth.models import ModelImportError, ModelSpec, get_model_spec
from predictor.sources.synth.op_trace import trace_scalable
from predictor.sources.synth.opgraph import ScalableOpGraph, TraceError
from predictor.timing.platforms import CatalogError, UnknownPlatformError, get_platform
from predictor.timing.platforms.schema import Platform
from tuner.cost import CostResult, evaluate_graph
from tuner.plans import missing_peak
from tuner.search.core import Candidate, Evaluator, Outcome, SearchResult, SearchSpace
from tuner.search.schema import SpaceError, StrictModel, at_most, bounded_int
from tuner.search.study import fingerprint

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["AcceleratorSpace", "ModelEntry", "DataLoading", "Communication", "DEFAULT_BATCH_SIZES",
           "AcceleratorContext", "ModelInfo", "build_context", "trace_model", "evaluate_unit", "evaluate_chips", "unit_key",
           "unit_timeline", "unit_targets", "AcceleratorSearch"]

DEFAULT_BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
MIB = 2.0**20


class ModelEntry(StrictModel):
    """A built-in spec (``gpt2-1.5b``, ``bert-large``, ``resnet50``, ``dlrm``, ...) or ``package.module:callable``."""

    name: str = Field(min_length=1, description="built-in spec name or 'package.module:callable' returning an nn.Module")
    input: str | None = Field(default=None, description="'package.module:callable' (batch size -> model arguments)")
    input_shape: list[bounded_int(1, 2**20, "one dimension of a sample")] | None = Field(  # type: ignore[valid-type]
        default=None, max_length=8, description="shape of one sample of a float input (up to 8 dimensions of 1 .. 2^20)")


class DataLoading(StrictModel):
    """Data loading / pre-processing stage (Centimani §4.3.1)."""

    host_samples_per_s: Annotated[float, Field(gt=0), at_most(1e9, "samples per second of one host")] | None = Field(
        default=None, description="samples/s one host loads and pre-processes, > 0 .. 10^9")
    host_link_gb_per_s: Annotated[float, Field(gt=0), at_most(1e4, "a host link of 10 TB/s")] = Field(
        default=25.0, description="host-to-device bandwidth, GB/s, > 0 .. 10^4")
    overlap: bool = Field(default=True, description="loading of the next batch overlaps the current iteration")


class Communication(StrictModel):
    """Data-parallel gradient synchronisation (Centimani §4.3.3)."""

    bucket_mib: Annotated[float, Field(gt=0), at_most(1e6, "a bucket of 1 TiB")] = Field(
        default=25.0, description="gradient bucket size, MiB (DDP default 25), > 0 .. 10^6")
    compression_ratio: float = Field(default=1.0, gt=0, le=1, description="compressed/uncompressed gradient bytes")


class AcceleratorSpace(StrictModel):
    """``space: accelerators`` — rank accelerators of the catalog for training one or more models."""

    space: Literal["accelerators"]
    models: list[ModelEntry] = Field(min_length=1)
    accelerators: list[str] = Field(min_length=1, description="catalog keys (`tuner catalog` lists them)")
    catalog: str | None = Field(default=None, description="user YAML that overrides or adds catalog entries")
    devices: list[bounded_int(1, 65536, "devices of the largest clusters")] = Field(  # type: ignore[valid-type]
        default=[1], min_length=1, max_length=64, description="data-parallel device counts, 1 .. 65536")
    precision: Literal["fp32", "bf16", "fp16", "amp_bf16", "amp_fp16"] = "bf16"
    optimizer: Literal["adamw", "adam", "sgd", "none"] = "adamw"
    batch_sizes: list[bounded_int(1, 2**20, "samples per device")] = Field(  # type: ignore[valid-type]
        default=DEFAULT_BATCH_SIZES, min_length=1, max_length=64,
        description="candidate per-device batch sizes (eq. 5 candidate set), 1 .. 2^20")
    batch_policy: Literal["eq5", "best_throughput"] = Field(
        default="eq5", description="eq5: the batch that fills memory most (Centimani eq. 5); "
                                   "best_throughput: the feasible candidate with the best objective")
    memory_fraction: float = Field(default=0.95, gt=0, le=1, description="usable share of each memory level")
    workspace_mib: Annotated[float, Field(ge=0), at_most(1e6, "a workspace of 1 TiB")] = Field(
        default=32.0, description="math-library workspace per device, MiB, 0 .. 10^6")
    gradient_accumulation: bounded_int(1, 65536, "micro-steps per iteration") = 1  # type: ignore[valid-type]
    objective: Literal["throughput", "throughput_per_dollar"] = "throughput"
    dataflow_pipeline: bool = Field(
        default=True, description="on dataflow chips (SN30, IPU, CS-2) split a model whose weights and gradients "
                                  "do not fit one chip's SRAM over up to a system's chips as a pipeline")
    baseline: str | None = Field(default=None, description="accelerator the charts are normalised to (default: the first)")
    data_loading: DataLoading = DataLoading()
    communication: Communication = Communication()

    @field_validator("accelerators")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        keys = [x.strip().lower() for x in v]
        if len(set(keys)) != len(keys):
            raise ValueError("accelerators lists a name twice")
        return keys

    @model_validator(mode="after")
    def _baseline_listed(self) -> AcceleratorSpace:
        if self.baseline is not None:
            self.baseline = self.baseline.strip().lower()
            if self.baseline not in self.accelerators:
                raise ValueError(f"baseline {self.baseline!r} is not one of the accelerators")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("models lists a name twice")
        return self

    @property
    def baseline_key(self) -> str:
        """The accelerator the charts divide by."""
        return self.baseline or self.accelerators[0]


# ----------------------------------------------------------------------------- evaluation
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
        """What the report needs to know about model ``name`` with ``n_params`` parameters."""
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
        missing = missing_peak(platforms[key], "fp32") if space.precision == "fp32" else None
        if missing:
            raise SpaceError(f"accelerators[{i}]: {missing}; or set precision: bf16")
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


def _objective(space: AcceleratorSpace, samples_per_s: float, usd_per_hour: float | None, stages: int = 1) -> float:
    """Value the study minimises: seconds per sample (x the chips of one pipeline, so that a unit is
    compared per chip), or USD per million samples."""
    if samples_per_s <= 0:
        return float("inf")
    if space.objective == "throughput_per_dollar":
        if usd_per_hour is None:
            return float("inf")
        return usd_per_hour / (samples_per_s * 3600.0) * 1e6
    return stages / samples_per_s


def _predict(space: AcceleratorSpace, platform: Platform, trace: ScalableOpGraph, batch: int, usage: LevelUsage,
             devices: int, stages: int = 1) -> tuple[IterationPrediction, CostResult]:
    """The decoupled time model at one per-device batch, costed by the one cost function.

    ``platform`` is the placement target (:func:`pipeline_platform` for ``stages`` > 1 chips in a
    pipeline: one micro-batch is simulated, then composed into the pipeline's iteration)."""
    g = trace.at(batch)
    opts = _options(space, devices)
    one = replace(opts, gradient_accumulation=1) if stages > 1 else opts
    graph, timing, calibrated = prepare_iteration(g, platform, usage, one)
    cost, tl = evaluate_graph(graph, timing, [usage.off_chip_bytes], platform, n_devices=devices * stages)
    pred = summarize_iteration(g, platform, graph, tl, one, calibrated=calibrated, source=timing.source)
    if stages > 1:
        pred = pipeline_iteration(g, platform, graph, tl, pred, opts, stages)
    return pred, cost


def unit_targets(space: AcceleratorSpace, platform: Platform, trace: ScalableOpGraph,
                 devices: int) -> list[tuple[Platform, int]]:
    """Placement targets and chips of one pipeline to try for this unit: on dataflow chips, from the
    fewest chips whose SRAM holds weights + gradients (:func:`pipeline_stages_for`) up to the whole
    system, each as :func:`pipeline_platform`; ``[(platform, 1)]`` elsewhere or with ``dataflow_pipeline: false``."""
    if not space.dataflow_pipeline:
        return [(platform, 1)]
    cats = place(memory_timeline(trace.lo, _extras(space, trace, devices)), platform,
                 usable_fraction=space.memory_fraction).by_category
    resident = cats.get("weights", 0.0) + cats.get("gradients", 0.0)
    stages = pipeline_stages_for(platform, resident, space.memory_fraction)
    out = []
    while True:
        fits = resident <= platform.on_chip_bytes * space.memory_fraction * stages
        out.append((pipeline_platform(platform, stages, pin_weights=fits), stages))
        if platform.kind not in DATAFLOW_KINDS or stages * 2 > platform.devices_per_node:
            return out
        stages *= 2


def unit_timeline(space: AcceleratorSpace, platform: Platform, trace: ScalableOpGraph, batch: int,
                  devices: int, stages: int | None = None) -> Timeline:
    """The simulated iteration of ``trace`` at per-device ``batch`` on ``devices`` devices (as evaluated; in a
    pipeline of dataflow chips, one micro-batch through the whole model; ``stages``: that pipeline's depth,
    default the shallowest)."""
    targets = unit_targets(space, platform, trace, devices)
    platform = next((t for t, s in targets if s == stages), targets[0][0])
    usage = place(memory_timeline(trace.at(batch), _extras(space, trace, devices)), platform,
                  usable_fraction=space.memory_fraction)
    graph, timing, _ = prepare_iteration(trace.at(batch), platform, usage, _options(space, devices))
    return evaluate_graph(graph, timing, [usage.off_chip_bytes], platform, n_devices=devices)[1]


def _best_throughput_batch(space: AcceleratorSpace, platform: Platform, trace: ScalableOpGraph, devices: int,
                           choice: BatchChoice, estimate: Callable[[int], LevelUsage],
                           usd_h: float | None, stages: int = 1) -> tuple[int, LevelUsage]:
    """The feasible candidate batch with the best objective (each one through the time model)."""
    best = None
    for cand in choice.candidates:
        if not cand["feasible"]:
            continue
        u = estimate(cand["batch"])
        pred, _ = _predict(space, platform, trace, cand["batch"], u, devices, stages)
        cand["samples_per_s"] = pred.samples_per_s
        obj = _objective(space, pred.samples_per_s, usd_h, stages)
        if best is None or obj < best[0]:
            best = (obj, cand["batch"], u)
    assert best is not None
    return best[1], best[2]


def _predicted_fields(space: AcceleratorSpace, platform: Platform, info: ModelInfo, devices: int, chosen: int,
                      usage: LevelUsage, pred: IterationPrediction, cost: CostResult, usd_h: float | None) -> dict:
    """The row fields of a predicted iteration: time (s), throughput, price-performance, methods."""
    ga = space.gradient_accumulation
    thr = pred.samples_per_s
    price = platform.price_per_device_hour_usd
    chips = devices * pred.pipeline_stages
    return {
        "status": "ok" if cost.feasible else "infeasible",
        "reason": cost.reason,
        "batch_size": chosen,
        "global_batch": chosen * devices * ga,
        "gradient_accumulation": ga,
        "pipeline_stages": pred.pipeline_stages,
        "chips": chips,
        "samples_per_s_per_chip": thr / chips,
        "memory": usage.as_dict(),
        "iteration_s": pred.iteration_s,
        "samples_per_s": thr,
        "tokens_per_s": thr * info.tokens_per_sample,
        "usd_per_hour": usd_h,
        "price_performance": None if usd_h is None else thr / usd_h,
        "samples_per_usd": None if usd_h is None else thr * 3600.0 / usd_h,
        "usd_per_iteration": None if usd_h is None else pred.iteration_s * usd_h / 3600.0,
        "objective": _objective(space, thr, usd_h, pred.pipeline_stages),
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


def evaluate_unit(
    space: AcceleratorSpace,
    platform: Platform,
    info: ModelInfo,
    trace: ScalableOpGraph,
    devices: int,
) -> dict:
    """Evaluate one (model, accelerator, device count); never raises for a model that does not fit.

    On a dataflow chip every pipeline depth of :func:`unit_targets` is evaluated and the one with the
    best objective per chip is kept (the vendor's compiler picks the split that runs fastest)."""
    rows = [_evaluate_target(space, platform, target, stages, info, trace, devices)
            for target, stages in unit_targets(space, platform, trace, devices)]
    ok = [r for r in rows if r.get("status") == "ok"]
    return min(ok, key=lambda r: r["objective"]) if ok else rows[0]


def evaluate_chips(space: AcceleratorSpace, platform: Platform, info: ModelInfo, trace: ScalableOpGraph,
                   chips: int) -> dict:
    """Evaluate a model on ``chips`` rented chips in all (the rent search's count); never raises.

    A pipeline of ``s`` chips (:func:`unit_targets`) runs as ``chips / s`` data-parallel replicas, for
    every depth ``s`` that divides ``chips``; the row with the most samples/s is kept (the chips and so
    the price are the same for every depth). The row's ``devices`` are the replicas, ``chips`` the chips."""
    targets = unit_targets(space, platform, trace, chips)
    rows = [_evaluate_target(space, platform, target, stages, info, trace, chips // stages)
            for target, stages in targets if chips % stages == 0]
    ok = [r for r in rows if r.get("status") == "ok"]
    if ok:
        return max(ok, key=lambda r: r["samples_per_s"])
    if rows:
        return rows[0]
    need = min(stages for _, stages in targets)
    return {"model": info.name, "accelerator": platform.key, "accelerator_name": platform.name, "devices": chips,
            "status": "infeasible", "batch_size": None, "pipeline_stages": need,
            "reason": f"the weights need a pipeline of {need} chips; {chips} chips are not a multiple of it"}


def _evaluate_target(space: AcceleratorSpace, platform: Platform, target: Platform, stages: int, info: ModelInfo,
                     trace: ScalableOpGraph, devices: int) -> dict:
    """One unit on ``devices`` replicas of a ``stages``-chip pipeline placed on ``target``."""
    extras = _extras(space, trace, devices)

    def estimate(b: int) -> LevelUsage:
        return place(memory_timeline(trace.at(b), extras), target, usable_fraction=space.memory_fraction)

    choice: BatchChoice = select_batch_size(estimate, space.batch_sizes)
    price = platform.price_per_device_hour_usd
    row: dict = {
        "model": info.name,
        "accelerator": platform.key,
        "accelerator_name": platform.name,
        "devices": devices,
        "precision": space.precision,
        "memory_policy": target.memory_policy,
        "price_per_device_hour_usd": price,
        "price_date": platform.price_date,
        "eq5_batch": choice.batch,
        "candidates": choice.candidates,
        "pipeline_stages": stages,
    }
    if not choice.feasible:
        row.update({"status": "infeasible", "reason": choice.reason, "batch_size": None})
        return row
    chosen = choice.batch
    usage = choice.usage
    usd_h = None if price is None else price * devices * stages
    if space.batch_policy == "best_throughput":
        chosen, usage = _best_throughput_batch(space, target, trace, devices, choice, estimate, usd_h, stages)
    pred, cost = _predict(space, target, trace, chosen, usage, devices, stages)
    row.update(_predicted_fields(space, platform, info, devices, chosen, usage, pred, cost, usd_h))
    return row


# ----------------------------------------------------------------------------- the space
@dataclass
class WorkerContext:
    """What every accelerator evaluation receives: the space, the platforms by key, the models' infos."""

    space: AcceleratorSpace
    platforms: dict[str, Platform]
    infos: dict[str, ModelInfo]


def _row_outcome(candidate: Candidate, row: dict, info: ModelInfo) -> Outcome:
    row["n_params"] = info.n_params
    value = float(row["objective"]) if row.get("status") == "ok" else None
    return Outcome(candidate.key, dict(candidate.params), row, value)


def evaluate_accelerator(ctx: WorkerContext, candidate: Candidate, trace: ScalableOpGraph) -> list[Outcome]:
    """The evaluation of one candidate (a model on an accelerator at a device count): one outcome."""
    p = candidate.params
    info = ctx.infos[p["model"]]
    row = evaluate_unit(ctx.space, ctx.platforms[p["accelerator"]], info, trace, p["devices"])
    return [_row_outcome(candidate, row, info)]


class AcceleratorSearch(SearchSpace):
    """The accelerator space plugged into the search core; each model is traced once, in the driver."""

    kind = "accelerators"

    def __init__(self, spec: AcceleratorSpace) -> None:
        self.spec = spec
        self.context = build_context(spec)  # SpaceError on bad input
        self.traces: dict[str, ScalableOpGraph] = {}
        self.infos: dict[str, ModelInfo] = {}
        self._candidates = [Candidate(unit_key(m.name, a, d), {"model": m.name, "accelerator": a, "devices": d},
                                      part=m.name)
                            for m in spec.models for a in spec.accelerators for d in spec.devices]

    def study_name(self) -> str:
        return f"accelerators-{fingerprint(self.spec.model_dump(mode='json'))}"

    def distributions(self) -> dict[str, CategoricalDistribution]:
        return {
            "model": CategoricalDistribution([m.name for m in self.spec.models]),
            "accelerator": CategoricalDistribution(list(self.spec.accelerators)),
            "devices": CategoricalDistribution(list(self.spec.devices)),
        }

    def candidates(self) -> list[Candidate]:
        return self._candidates

    def evaluator(self) -> Evaluator:
        return evaluate_accelerator

    def worker_context(self) -> WorkerContext:
        return WorkerContext(self.spec, self.context.platforms, self.infos)

    def part(self, name: str) -> ScalableOpGraph:
        return self.traces[name]

    def prepare(self, todo: list[Candidate]) -> list[Callable[[], None]]:
        """One step per model to evaluate: its trace (fake tensors) and its info."""
        def step(model: str) -> Callable[[], None]:
            def trace() -> None:
                self.traces[model] = trace_model(self.context, model)
                self.infos[model] = self.context.info(model, self.traces[model].n_params)
            return trace

        return [step(m) for m in dict.fromkeys(c.params["model"] for c in todo)]

    def failed(self, candidate: Candidate, reason: str) -> list[Outcome]:
        p = candidate.params
        platform = self.context.platforms[p["accelerator"]]
        row = {"model": p["model"], "accelerator": platform.key, "accelerator_name": platform.name,
               "devices": p["devices"], "status": "failed", "reason": reason, "batch_size": None}
        return [_row_outcome(candidate, row, self.infos[p["model"]])]

    def write_outputs(self, result: SearchResult, out: Path) -> dict:
        from tuner.report.accelerators import build_payload, write_outputs

        rows = [outs[0].record for _, outs in result.ordered()]
        infos = dict(self.infos)
        for m in self.spec.models:  # models reused from the study: their size from a stored row
            if m.name not in infos:
                prior = next((r for r in rows if r["model"] == m.name), {})
                infos[m.name] = self.context.info(m.name, int(prior.get("n_params", 0) or 0))
        payload = build_payload(self.spec, self.context.platforms, infos, rows, result.study_info())
        write_outputs(payload, out)
        return payload

    def print_table(self, payload: dict, console: Console) -> None:
        from tuner.report.accelerators import print_table

        print_table(payload, console)

    def summary(self, result: SearchResult, payload: dict, out: Path) -> str:
        return (f"{len(payload['rows'])} evaluations ({result.evaluated} new, {result.reused} from the study) "
                f"-> {out}/results.json, report.html")
