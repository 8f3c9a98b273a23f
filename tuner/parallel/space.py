"""``space: parallel`` — search TP/PP/DP plans for training one transformer on one cluster.

Example (``search_spaces/parallel.yaml``)::

    space: parallel
    model: {name: gpt3-13b, layers: 40, hidden: 5120, heads: 40, seq: 2048, vocab: 51200}
    cluster: {platform: a100-80gb, nodes: 8}          # devices_per_node from the catalog
    global_batch: 512
    ranges: {tp: [1, 2, 4, 8], pp: [1, 2, 4, 8], micro_batch: [1, 2, 4],
             schedule: [1f1b, interleaved], recompute: [none, selective, full]}
    search: {strategy: auto, trials: 60}

``dp`` is derived (every device is used: ``dp = devices / (tp * pp)``) unless ``ranges.dp``
restricts it. Combinations that cannot run (heads not divisible by ``tp``, layers not
divisible by the pipeline chunks, batch not divisible...) are not candidates; plans that run
out of memory are evaluated as infeasible. The same file works as ``tuner predict --workload``.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from predictor.sources.synth.transformer import MoESpec, ParallelPlan, PlanError, TransformerSpec, check_plan

__all__ = ["ParallelSpace", "ModelSection", "ClusterSection", "PlanOptions", "Candidate", "SEARCHED", "normalise",
           "enumerate_candidates"]

PositiveInt = Annotated[int, Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MoESection(_Strict):
    """Mixture-of-experts MLP."""

    experts: PositiveInt
    top_k: PositiveInt = 2
    capacity_factor: float = Field(default=1.0, gt=0)


class ModelSection(_Strict):
    """A GPT-style transformer (sizes are element counts)."""

    name: str = "transformer"
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    seq: PositiveInt
    vocab: PositiveInt
    ffn: PositiveInt | None = Field(default=None, description="FFN width (default ffn_mult x hidden)")
    ffn_mult: float = Field(default=4.0, gt=0)
    moe: MoESection | None = None
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    attention: Literal["flash", "unfused"] = "flash"
    causal: bool = True
    tie_embeddings: bool = True

    @model_validator(mode="after")
    def _shape(self) -> ModelSection:
        if self.hidden % self.heads:
            raise ValueError(f"hidden size {self.hidden} is not divisible by {self.heads} heads")
        if self.moe is not None and self.moe.top_k > self.moe.experts:
            raise ValueError(f"moe.top_k={self.moe.top_k} exceeds moe.experts={self.moe.experts}")
        return self

    def to_spec(self) -> TransformerSpec:
        d = self.model_dump()
        moe = d.pop("moe")
        return TransformerSpec(**d, moe=MoESpec(**moe) if moe else None)


class ClusterSection(_Strict):
    """The devices: an accelerator of the catalog, devices per node, nodes."""

    platform: str = Field(description="catalog key, e.g. a100-80gb (`tuner catalog` lists them)")
    nodes: PositiveInt = 1
    devices_per_node: PositiveInt | None = Field(default=None, description="default: the catalog entry's")
    catalog: str | None = Field(default=None, description="user YAML overriding or adding catalog entries")


class PlanOptions(_Strict):
    """Plan settings that are not searched (Megatron-LM switches)."""

    overlap_grad_reduce: bool = True
    tp_comm_overlap: bool = False
    pp_scatter_gather: bool = True
    grad_reduce_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"


class RangesSection(_Strict):
    """Values to try for each plan dimension."""

    tp: list[PositiveInt] = Field(default=[1, 2, 4, 8], min_length=1)
    pp: list[PositiveInt] = Field(default=[1, 2, 4, 8], min_length=1)
    dp: list[PositiveInt] | None = Field(default=None, description="default: devices / (tp x pp)")
    micro_batch: list[PositiveInt] = Field(default=[1, 2, 4], min_length=1)
    schedule: list[Literal["1f1b", "interleaved"]] = Field(default=["1f1b"], min_length=1)
    virtual_stages: list[Annotated[int, Field(ge=2)]] = Field(default=[2], min_length=1)
    recompute: list[Literal["none", "selective", "full"]] = Field(default=["none", "selective", "full"], min_length=1)
    sequence_parallel: list[bool] = Field(default=[False], min_length=1)
    ep: list[PositiveInt] = Field(default=[1], min_length=1)
    distributed_optimizer: list[bool] = Field(default=[False], min_length=1)


class SearchSection(_Strict):
    """How to search: every candidate (grid) or an Optuna TPE study of ``trials`` plans."""

    strategy: Literal["auto", "grid", "tpe"] = "auto"
    grid_limit: PositiveInt = Field(default=256, description="auto: grid up to this many candidates, else TPE")
    trials: PositiveInt = Field(default=80, description="plans TPE evaluates")
    seed: int = 0
    top: PositiveInt = Field(default=10, description="plans shown in the table")
    detail: Literal["auto", "kernel", "stage"] = "auto"


class ParallelSpace(_Strict):
    """``space: parallel`` — the fastest feasible TP/PP/DP plan for one model on one cluster."""

    space: Literal["parallel"]
    model: ModelSection
    cluster: ClusterSection
    global_batch: PositiveInt = Field(description="sequences per iteration")
    ranges: RangesSection = RangesSection()
    options: PlanOptions = PlanOptions()
    search: SearchSection = SearchSection()

    def devices(self, devices_per_node: int) -> int:
        return self.cluster.nodes * devices_per_node


class Candidate(BaseModel):
    """One plan to evaluate: ``fields`` of a :class:`ParallelPlan`; ``raw`` the range values that made it."""

    key: str
    fields: dict
    raw: dict


#: plan dimensions a search varies (each a list in ``ranges``)
SEARCHED = ("tp", "pp", "micro_batch", "schedule", "virtual_stages", "recompute", "sequence_parallel", "ep",
            "distributed_optimizer")


def normalise(space: ParallelSpace, devices: int, raw: dict) -> tuple[str, dict] | tuple[None, str]:
    """(key, plan fields) of the range values ``raw``, or (None, reason) when they cannot make a plan."""
    tp, pp = raw["tp"], raw["pp"]
    if devices % (tp * pp):
        return None, f"tp x pp = {tp * pp} does not divide {devices} devices"
    dp = devices // (tp * pp)
    if space.ranges.dp is not None and dp not in space.ranges.dp:
        return None, f"dp={dp} is not in ranges.dp"
    sched = raw["schedule"] if pp > 1 else "1f1b"
    fields = dict(tp=tp, pp=pp, dp=dp, micro_batch=raw["micro_batch"], global_batch=space.global_batch,
                  schedule=sched, virtual_stages=raw["virtual_stages"] if sched == "interleaved" else 2,
                  recompute=raw["recompute"], sequence_parallel=bool(raw["sequence_parallel"] and tp > 1),
                  ep=raw["ep"], distributed_optimizer=bool(raw["distributed_optimizer"] and dp > 1),
                  **space.options.model_dump())
    return ParallelPlan(**fields).label(), fields


def enumerate_candidates(space: ParallelSpace, devices: int) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """Every valid plan of the ranges on ``devices`` devices, and the invalid combinations with their reason."""
    r = space.ranges
    spec = space.model.to_spec()
    seen: dict[str, Candidate] = {}
    invalid: dict[str, str] = {}
    for values in itertools.product(*(getattr(r, name) for name in SEARCHED)):
        raw = dict(zip(SEARCHED, values, strict=True))
        key, fields = normalise(space, devices, raw)
        if key is None:
            invalid.setdefault(f"tp{raw['tp']}-pp{raw['pp']}", fields)  # type: ignore[arg-type]
            continue
        if key in seen or key in invalid:
            continue
        try:
            check_plan(spec, ParallelPlan(**fields), devices)
        except PlanError as exc:
            invalid[key] = str(exc)
            continue
        seen[key] = Candidate(key=key, fields=fields, raw=raw)
    return list(seen.values()), sorted(invalid.items())
