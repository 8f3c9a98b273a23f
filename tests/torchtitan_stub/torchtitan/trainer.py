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

        def __post_init__(self):
            if self.compile.enable_async_tensor_parallel and not (
                    self.compile.enable and "model" in self.compile.components):
                raise ValueError("Async TP requires 'model' in --compile.components and --compile.enable")
