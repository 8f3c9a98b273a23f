"""Search-space files: schema and validation (one clear line per bad field).

A space file is YAML with a ``space:`` key naming its kind. This module validates it with
pydantic (unknown keys are errors) and turns every problem into a :class:`SpaceError` whose
message is ``"FILE: field.path: problem"`` — the CLI prints it and exits with code 2.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = ["SpaceError", "ShardingSpace", "load_space", "format_validation_error"]

SHARDER_NAMES = (
    "naive",
    "random",
    "size_greedy",
    "lookup_greedy",
    "norm_lookup_greedy",
    "size_lookup_greedy",
    "model_guided",
)


class SpaceError(ValueError):
    """A search-space file cannot be used; the message names the file, field and problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


PositiveInt = Annotated[int, Field(gt=0)]


class TableSpec(_Strict):
    """One embedding table."""

    rows: PositiveInt = Field(description="rows E")
    dim: PositiveInt = Field(description="embedding dimension D")
    pooling: float = Field(gt=0, description="mean lookups per sample L")
    reuse: list[float] | None = Field(default=None, description="17-bin reuse-factor histogram")
    name: str | None = None

    @field_validator("reuse")
    @classmethod
    def _seventeen_bins(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (len(v) != 17 or min(v) < 0 or sum(v) <= 0):
            raise ValueError("reuse must be 17 non-negative numbers with a positive sum")
        return v


class ExplicitTask(_Strict):
    name: str
    tables: list[TableSpec] = Field(min_length=1)


class GeneratedTasks(_Strict):
    """Random tasks as Lin et al. 2024 §IV-B: half heavy, half normal."""

    count: PositiveInt = 20
    seed: int = 0
    dataset: Literal["2021", "2022", "both"] = "both"


class TasksSpec(_Strict):
    generate: GeneratedTasks | None = None
    explicit: list[ExplicitTask] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TasksSpec:
        if not self.generate and not self.explicit:
            raise ValueError("give 'generate' or 'explicit' tasks")
        return self


class DenseModel(_Strict):
    """The dense part of DLRM."""

    dense_features: PositiveInt = 13
    bottom_mlp: list[PositiveInt] = Field(default=[512, 256, 128], min_length=1)
    top_mlp: list[PositiveInt] = Field(default=[1024, 1024, 512, 256, 1], min_length=1)
    optimizer: Literal["sgd", "adagrad"] = "sgd"
    dtype: Literal["fp32", "fp16", "bf16"] = "fp32"


class ModelGuidedOptions(_Strict):
    max_evals: PositiveInt = Field(default=60, description="simulations per task and batch size")


class ShardingSpace(_Strict):
    """``space: sharding`` — rank embedding-table sharders for DLRM training tasks."""

    space: Literal["sharding"]
    platform: str = Field(description="catalog key, e.g. a100-80gb")
    catalog: str | None = Field(default=None, description="user YAML that overrides or adds catalog entries")
    n_gpus: PositiveInt
    batch_sizes: list[PositiveInt] = Field(min_length=1, description="global batch sizes")
    tasks: TasksSpec
    model: DenseModel = DenseModel()
    sharders: list[Literal[SHARDER_NAMES]] = Field(default=list(SHARDER_NAMES), min_length=1)  # type: ignore[valid-type]
    objective: Literal["iteration_time"] = "iteration_time"
    memory_fraction: float = Field(default=0.8, gt=0, le=1, description="share of device memory tables may use")
    model_guided: ModelGuidedOptions = ModelGuidedOptions()
    seed: int = 0

    @model_validator(mode="after")
    def _batches_divide(self) -> ShardingSpace:
        for b in self.batch_sizes:
            if b % self.n_gpus:
                raise ValueError(f"batch size {b} is not divisible by n_gpus={self.n_gpus}")
        if len(set(self.sharders)) != len(self.sharders):
            raise ValueError("sharders lists a name twice")
        return self


#: space kind -> schema, as "module:Class" (imported when a file of that kind is loaded)
SPACES: dict[str, str] = {"sharding": "tuner.spaces:ShardingSpace"}
SPACES["parallel"] = "tuner.parallel.space:ParallelSpace"
SPACES["accelerators"] = "tuner.accelerators.space:AcceleratorSpace"


def space_schema(kind: str) -> type[BaseModel]:
    """The pydantic schema registered for a space kind."""
    module, attr = SPACES[kind].split(":")
    return getattr(importlib.import_module(module), attr)


def format_validation_error(err: ValidationError) -> str:
    """The first problem of a pydantic error as ``field.path: message``."""
    first = err.errors()[0]
    loc = ".".join(str(x) for x in first["loc"] if not str(x).startswith("function-after")) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "missing":
        msg = "required field is missing"
    msg = msg.removeprefix("Value error, ")
    more = len(err.errors()) - 1
    return f"{loc}: {msg}" + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")


def load_space(path: str | Path) -> BaseModel:
    """Read and validate a space file; raises :class:`SpaceError` with one clear line."""
    path = Path(path)
    if not path.exists():
        raise SpaceError(f"{path}: no such file")
    if path.is_dir():
        raise SpaceError(f"{path}: is a directory, expected a YAML file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpaceError(f"{path}: YAML syntax error{where}: {problem}") from None
    except UnicodeDecodeError:
        raise SpaceError(f"{path}: not a text file") from None
    if not isinstance(data, dict):
        raise SpaceError(f"{path}: expected a mapping with a 'space:' key at the top level")
    kind = data.get("space")
    if kind not in SPACES:
        raise SpaceError(f"{path}: space: must be one of {', '.join(sorted(SPACES))} (got {kind!r})")
    try:
        return space_schema(kind).model_validate(data)
    except ValidationError as err:
        raise SpaceError(f"{path}: {format_validation_error(err)}") from None
