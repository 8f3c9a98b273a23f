"""``space: rent`` — what to rent: accelerator, device count and plan, for a training job, priced.

Example (``search_spaces/rent.yaml``)::

    space: rent
    model:
      transformer: {name: gpt3-13b, layers: 40, hidden: 5120, heads: 40, seq: 2048, vocab: 51200}
    training: {tokens: 300B, global_batch: 1024}
    accelerators: [a100-80gb, h100-sxm, gaudi2, tpu-v5p, v100-sxm2-32gb]
    devices: {min: 8, max: 1024}              # 8, 16, 32, ..., 1024
    deadline_days: 60
    budget_usd: 600000
    pricing: {column: on_demand}              # or spot / reserved_1y with pricing.prices

One candidate is one accelerator x device count x plan: a TP/PP/DP/micro-batch/schedule/recompute/
sequence-parallel plan of a transformer (:mod:`tuner.search.parallel`'s enumeration and
evaluation), a global batch of a DLRM whose tables the sharding search's sharders place
(:mod:`tuner.search.sharding`), or Centimani's batch choice for an ``nn.Module``
(:mod:`tuner.search.accelerators`). Its evaluation (:mod:`tuner.search.rent_eval`) predicts the
iteration, and from the training work the time to train, the dollars, the device-hours and the
memory per device. Out-of-memory plans and plans that miss the deadline or the budget are
``infeasible`` with the reason; the answer (:mod:`tuner.search.rent_answer`) never picks them.

Two objectives, time to train and cost: ``grid`` evaluates every candidate (``auto`` up to
``search.grid_limit``), ``nsga2`` lets Optuna's NSGA-II sampler pick ``search.trials`` candidates
(:class:`tuner.search.rent_nsga.NSGAProposer`; with ``search.per_accelerator`` one sampler per accelerator). The study records each outcome with value =
time to train in hours; both objectives are in the record.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial
from pydantic import Field, field_validator, model_validator

from tuner.search.accelerators import DEFAULT_BATCH_SIZES
from tuner.search.core import Candidate, Evaluator, Exhaustive, Outcome, Proposer, SearchResult, SearchSpace
from tuner.search.parallel import SEARCHED, ModelSection, PlanOptions, RangesSection
from tuner.search.schema import PositiveInt, Seed, SpaceError, StrictModel
from tuner.search.sharding import SHARDER_NAMES, DenseModel, TableSpec
from tuner.search.study import fingerprint

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

__all__ = ["RentSpace", "RentModel", "DLRMModel", "GeneratedTables", "ModuleModel", "Training", "DeviceRange",
           "Pricing", "RentSearchOptions", "RentSearch", "parse_amount", "device_counts"]

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_amount(value: object) -> float:
    """A count given as a number or as text with a suffix (``300B``, ``1.5T``, ``4e9``) -> float."""
    if isinstance(value, bool):
        raise ValueError("must be a number or text such as 300B")
    if isinstance(value, int | float):
        out = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*", value)
        if not m:
            raise ValueError(f"must be a number or text such as 300B (got {value!r})")
        out = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    else:
        raise ValueError(f"must be a number or text such as 300B (got {type(value).__name__})")
    if not out > 0:
        raise ValueError(f"must be positive (got {out:g})")
    return out


Amount = Annotated[float, Field(gt=0)]


# ----------------------------------------------------------------------------- schema
class GeneratedTables(StrictModel):
    """One random DLRM table set drawn as in Lin et al. 2024 §IV-B (a heavy task)."""

    seed: Seed = 0
    dataset: Literal["2021", "2022", "both"] = "both"
    reference_devices: PositiveInt = Field(default=8, description="tables: 13 x this x U(0.7, 1.3)")


class DLRMModel(StrictModel):
    """A DLRM: its embedding tables (generated or explicit), dense part, sharders, global batches."""

    generate: GeneratedTables | None = None
    tables: list[TableSpec] | None = Field(default=None, min_length=1)
    dense: DenseModel = DenseModel()
    sharders: list[Literal[SHARDER_NAMES]] = Field(  # type: ignore[valid-type]
        default=["size_greedy", "lookup_greedy", "size_lookup_greedy"], min_length=1)
    memory_fraction: float = Field(default=0.8, gt=0, le=1, description="share of device memory tables may use")
    model_guided_evals: PositiveInt = Field(default=40, description="simulations of the model-guided sharder")
    batch_sizes: list[PositiveInt] = Field(min_length=1, description="global batch sizes (samples per iteration)")

    @model_validator(mode="after")
    def _one_source(self) -> DLRMModel:
        if (self.generate is None) == (self.tables is None):
            raise ValueError("give exactly one of 'generate' and 'tables'")
        return self


class ModuleModel(StrictModel):
    """A built-in model spec or ``package.module:callable``, data parallel, batch by Centimani eq. 5."""

    name: str = Field(min_length=1, description="built-in spec name or 'package.module:callable'")
    input: str | None = Field(default=None, description="'package.module:callable' (batch size -> model arguments)")
    input_shape: list[PositiveInt] | None = None
    precision: Literal["fp32", "bf16", "fp16", "amp_bf16", "amp_fp16"] = "bf16"
    optimizer: Literal["adamw", "adam", "sgd", "none"] = "adamw"
    batch_sizes: list[PositiveInt] = Field(default=DEFAULT_BATCH_SIZES, min_length=1,
                                           description="candidate per-device batch sizes")
    batch_policy: Literal["eq5", "best_throughput"] = "eq5"
    memory_fraction: float = Field(default=0.95, gt=0, le=1)


class RentModel(StrictModel):
    """Exactly one of: a transformer spec, a DLRM spec, a module."""

    transformer: ModelSection | None = None
    dlrm: DLRMModel | None = None
    module: ModuleModel | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> RentModel:
        given = [k for k in ("transformer", "dlrm", "module") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of transformer, dlrm, module (got {', '.join(given) or 'none'})")
        return self

    @property
    def kind(self) -> str:
        """``transformer``, ``dlrm`` or ``module``."""
        return "transformer" if self.transformer else ("dlrm" if self.dlrm else "module")


class Training(StrictModel):
    """The work: tokens (transformer), or samples x epochs (any model)."""

    tokens: Amount | None = Field(default=None, description="tokens to train on (transformer), e.g. 300B")
    samples: Amount | None = Field(default=None, description="samples per epoch, e.g. 4B")
    epochs: float = Field(default=1.0, gt=0)
    global_batch: PositiveInt | None = Field(default=None, description="transformer: sequences per iteration")

    @field_validator("tokens", "samples", mode="before")
    @classmethod
    def _amount(cls, v: object) -> object:
        return None if v is None else parse_amount(v)


class DeviceRange(StrictModel):
    """Device counts ``min, min x factor, ...`` up to ``max``."""

    min: PositiveInt
    max: PositiveInt
    factor: Annotated[int, Field(ge=2)] = 2

    @model_validator(mode="after")
    def _ordered(self) -> DeviceRange:
        if self.max < self.min:
            raise ValueError(f"max={self.max} is below min={self.min}")
        return self


class Pricing(StrictModel):
    """Which price column to pay (USD per device-hour) and per-accelerator prices by column.

    ``on_demand`` defaults to the catalog's dated price; any other column (``spot``,
    ``reserved_1y``...) must be given for every accelerator in ``prices``. A list of columns
    makes each accelerator one offer per column (``a100-80gb@spot``), compared in one search.
    """

    column: str | list[str] = Field(default="on_demand", min_length=1)
    prices: dict[str, dict[str, Annotated[float, Field(ge=0)]]] = {}

    @property
    def columns(self) -> list[str]:
        """The price columns, in the order given."""
        return [self.column] if isinstance(self.column, str) else list(self.column)

    @model_validator(mode="after")
    def _distinct(self) -> Pricing:
        if len(set(self.columns)) != len(self.columns) or not all(self.columns):
            raise ValueError("column lists a name twice or an empty name")
        return self


class RentSearchOptions(StrictModel):
    """How to search: every candidate (grid) or Optuna NSGA-II over ``trials`` candidates."""

    strategy: Literal["auto", "grid", "nsga2"] = "auto"
    grid_limit: PositiveInt = Field(default=600, description="auto: grid up to this many candidates, else NSGA-II")
    trials: PositiveInt = Field(default=400, description="candidates NSGA-II evaluates")
    population: Annotated[int, Field(ge=2)] = Field(default=40, description="NSGA-II population size")
    polish: Annotated[int, Field(ge=0)] = Field(default=150, description="NSGA-II: evaluations after it to "
                                                                         "hill-climb each accelerator's best plans")
    per_accelerator: bool = Field(default=False, description="NSGA-II: one sampler per accelerator, equal shares "
                                                             "of the trials (each accelerator's best searched alike)")
    seed: Seed = 0
    top: PositiveInt = Field(default=12, description="front points shown in the table")
    # stage-level graphs: 13B plans agree with kernel-level ones within 0.04 % and build 3-5x faster
    detail: Literal["auto", "kernel", "stage"] = "stage"


class RentSpace(StrictModel):
    """``space: rent`` — the accelerator, device count and plan that train a model by a deadline, on a budget."""

    space: Literal["rent"]
    model: RentModel
    training: Training
    accelerators: list[str] = Field(min_length=1, description="catalog keys (asset packs too for a DLRM or a module)")
    devices: list[PositiveInt] | DeviceRange = Field(description="device counts, or {min, max, factor}")
    deadline_days: float | None = Field(default=None, gt=0)
    deadline_hours: float | None = Field(default=None, gt=0, description="the deadline in hours (or deadline_days)")
    budget_usd: float | None = Field(default=None, gt=0)
    pricing: Pricing = Pricing()
    catalog: str | None = Field(default=None, description="user YAML overriding or adding catalog entries")
    ranges: RangesSection = RangesSection()
    options: PlanOptions = PlanOptions()
    search: RentSearchOptions = RentSearchOptions()

    @field_validator("accelerators")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        keys = [x.strip() for x in v]
        if len({k.lower() for k in keys}) != len(keys):
            raise ValueError("accelerators lists a name twice")
        return keys

    @model_validator(mode="after")
    def _work(self) -> RentSpace:
        t = self.training
        if self.model.kind == "transformer":
            if t.global_batch is None:
                raise ValueError("training.global_batch (sequences per iteration) is required for a transformer")
            if (t.tokens is None) == (t.samples is None):
                raise ValueError("give exactly one of training.tokens and training.samples (sequences)")
        else:
            if t.samples is None:
                raise ValueError(f"training.samples is required for a {self.model.kind} model")
            if t.tokens is not None or t.global_batch is not None:
                raise ValueError(f"training.tokens and training.global_batch are for transformers, not {self.model.kind}")
        if self.deadline_days is not None and self.deadline_hours is not None:
            raise ValueError("give deadline_days or deadline_hours, not both")
        if isinstance(self.devices, list) and len(set(self.devices)) != len(self.devices):
            raise ValueError("devices lists a count twice")
        return self

    @property
    def deadline_h(self) -> float | None:
        """The deadline in hours, if any."""
        return self.deadline_hours if self.deadline_days is None else 24.0 * self.deadline_days


def device_counts(devices: list[int] | DeviceRange) -> list[int]:
    """The device counts of a list or a range, ascending."""
    if isinstance(devices, list):
        return sorted(devices)
    out, d = [], devices.min
    while d <= devices.max:
        out.append(d)
        d *= devices.factor
    return out


# ----------------------------------------------------------------------------- the space
class RentSearch(SearchSpace):
    """The rent space plugged into the search core (grid or NSGA-II)."""

    kind = "rent"

    def __init__(self, spec: RentSpace) -> None:
        from tuner.search.rent_eval import build_rent_context, enumerate_rent

        self.spec = spec
        self.context = build_rent_context(spec)  # SpaceError on bad input
        self.traces: dict[str, object] = {}  # a module model's trace, shipped to workers once as a part
        self._candidates, self.invalid = enumerate_rent(self.context)
        if not self._candidates:
            why = self.invalid[0][1] if self.invalid else "the ranges are empty"
            raise SpaceError(f"no valid candidate in the space (e.g. {why})")
        self._by_key = {c.key: c for c in self._candidates}
        strategy = spec.search.strategy
        if strategy == "auto":
            strategy = "grid" if len(self._candidates) <= spec.search.grid_limit else "nsga2"
        self.strategy = strategy

    def study_name(self) -> str:
        # the parts of the space that change results (not search.top, strategy, trials or population)
        d = self.spec.model_dump(mode="json")
        d["search"] = {"detail": d["search"]["detail"]}
        return f"rent-{self.strategy}-{fingerprint(d)}"

    def distributions(self) -> dict[str, CategoricalDistribution]:
        d = {"accelerator": CategoricalDistribution(list(self.context.offers)),
             "devices": CategoricalDistribution(list(self.context.devices))}
        if self.context.kind == "transformer":
            d.update({name: CategoricalDistribution(list(getattr(self.spec.ranges, name))) for name in SEARCHED})
        elif self.context.kind == "dlrm":
            assert self.spec.model.dlrm is not None
            d["batch_size"] = CategoricalDistribution(list(self.spec.model.dlrm.batch_sizes))
        return d

    def candidates(self) -> list[Candidate]:
        return self._candidates

    def evaluator(self) -> Evaluator:
        from tuner.search.rent_eval import evaluate_rent

        return evaluate_rent

    def worker_context(self) -> object:
        return self.context

    def part(self, name: str) -> object:
        return self.traces[name]

    def prepare(self, todo: list[Candidate]) -> list[Callable[[], None]]:
        """A module model is traced once (fake tensors), in the driver, before its candidates run."""
        if self.context.kind != "module" or not todo:
            return []
        from tuner.search.rent_eval import trace_module

        def trace() -> None:
            self.traces["module"] = trace_module(self.context)

        return [trace]

    def failed(self, candidate: Candidate, reason: str) -> list[Outcome]:
        from tuner.search.rent_eval import failed_outcome

        return [failed_outcome(self.context, candidate, reason)]

    def resolve(self, params: dict) -> Candidate | None:
        """The candidate that sampled values make (with them as its trial parameters), or ``None``."""
        from tuner.search.rent_eval import candidate_key

        key = candidate_key(self.context, params)
        if key is None or key not in self._by_key:
            return None
        c = self._by_key[key]
        return Candidate(c.key, {**c.params, "raw": params}, part=c.part)

    def proposer(self, candidates: list[Candidate], done: dict[str, list[Outcome]], history: list[FrozenTrial],
                 workers: int) -> Proposer:
        if self.strategy == "grid":
            return Exhaustive(candidates, done)
        from tuner.search.rent_nsga import NSGAProposer, PolishProposer

        s = self.spec.search
        nsga = NSGAProposer(self.distributions(), self.resolve, target=min(s.trials, len(candidates)),
                            batch_size=max(2 * workers, 1), seed=s.seed, population=s.population, history=history,
                            group="accelerator" if s.per_accelerator else None)
        if not s.polish:
            return nsga
        trades = (("tp", "pp"),) if self.context.kind == "transformer" else ()
        return PolishProposer(nsga, self.distributions(), self.resolve, budget=s.polish, trades=trades)

    def write_outputs(self, result: SearchResult, out: Path) -> dict:
        from tuner.report.rent import write_rent_outputs

        return write_rent_outputs(result, out)

    def print_table(self, payload: dict, console: Console) -> None:
        from tuner.report.rent import print_rent_table

        print_rent_table(payload, console, top=self.spec.search.top)

    def summary(self, result: SearchResult, payload: dict, out: Path) -> str:
        from tuner.search.rent_eval import duration

        n = payload["counts"]
        pick = payload["picks"].get("cheapest")
        tail = (f"cheapest feasible: {pick['accelerator']} x {pick['devices']}, {duration(pick['time_to_train_h'])}, "
                f"${pick['usd']:,.2f}" if pick else "no candidate meets memory, deadline and budget")
        return (f"{n['evaluated']} of {n['candidates']} candidates ({self.strategy}; {result.evaluated} new, "
                f"{result.reused} from the study), {n['front']} on the front; {tail} -> {out}/results.json, report.html")
