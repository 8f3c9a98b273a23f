"""``Trainer.Config``: the sections tuner reads."""

from dataclasses import dataclass, field

from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.protocols.model_spec import ModelSpec


class Trainer:
    @dataclass(kw_only=True, slots=True)
    class Config:
        model_spec: ModelSpec | None = None
        training: TrainingConfig = field(default_factory=TrainingConfig)
        parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
        activation_checkpoint: object = field(default_factory=SelectiveAC.Config)
        compile: CompileConfig = field(default_factory=CompileConfig)
