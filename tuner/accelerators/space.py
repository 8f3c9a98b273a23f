"""Schema of ``space: accelerators`` search-space files (validated by :func:`tuner.spaces.load_space`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["AcceleratorSpace", "ModelEntry", "DataLoading", "Communication", "DEFAULT_BATCH_SIZES"]

PositiveInt = Annotated[int, Field(gt=0)]
DEFAULT_BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelEntry(_Strict):
    """A built-in spec (``gpt2-1.5b``, ``bert-large``, ``resnet50``, ``dlrm``, ...) or ``package.module:callable``."""

    name: str = Field(min_length=1, description="built-in spec name or 'package.module:callable' returning an nn.Module")
    input: str | None = Field(default=None, description="'package.module:callable' (batch size -> model arguments)")
    input_shape: list[PositiveInt] | None = Field(default=None, description="shape of one sample of a float input")


class DataLoading(_Strict):
    """Data loading / pre-processing stage (Centimani §4.3.1)."""

    host_samples_per_s: float | None = Field(default=None, gt=0, description="samples/s one host loads and pre-processes")
    host_link_gb_per_s: float = Field(default=25.0, gt=0, description="host-to-device bandwidth, GB/s")
    overlap: bool = Field(default=True, description="loading of the next batch overlaps the current iteration")


class Communication(_Strict):
    """Data-parallel gradient synchronisation (Centimani §4.3.3)."""

    bucket_mib: float = Field(default=25.0, gt=0, description="gradient bucket size, MiB (DDP default 25)")
    compression_ratio: float = Field(default=1.0, gt=0, le=1, description="compressed/uncompressed gradient bytes")


class AcceleratorSpace(_Strict):
    """``space: accelerators`` — rank accelerators of the catalog for training one or more models."""

    space: Literal["accelerators"]
    models: list[ModelEntry] = Field(min_length=1)
    accelerators: list[str] = Field(min_length=1, description="catalog keys (`tuner catalog` lists them)")
    catalog: str | None = Field(default=None, description="user YAML that overrides or adds catalog entries")
    devices: list[PositiveInt] = Field(default=[1], min_length=1, description="data-parallel device counts")
    precision: Literal["fp32", "bf16", "fp16", "amp_bf16", "amp_fp16"] = "bf16"
    optimizer: Literal["adamw", "adam", "sgd", "none"] = "adamw"
    batch_sizes: list[PositiveInt] = Field(default=DEFAULT_BATCH_SIZES, min_length=1,
                                           description="candidate per-device batch sizes (eq. 5 candidate set)")
    batch_policy: Literal["eq5", "best_throughput"] = Field(
        default="eq5", description="eq5: the batch that fills memory most (Centimani eq. 5); "
                                   "best_throughput: the feasible candidate with the best objective")
    memory_fraction: float = Field(default=0.95, gt=0, le=1, description="usable share of each memory level")
    workspace_mib: float = Field(default=32.0, ge=0, description="math-library workspace per device, MiB")
    gradient_accumulation: PositiveInt = 1
    objective: Literal["throughput", "throughput_per_dollar"] = "throughput"
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
        return self.baseline or self.accelerators[0]
