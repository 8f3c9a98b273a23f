"""The Llama 3 configurations tuner starts its recipes from, with upstream's training and parallelism values."""

from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.trainer import Trainer


def llama3_8b() -> Trainer.Config:
    return Trainer.Config(model_spec=ModelSpec("llama3", "8B"),
                          training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=8192,
                                                  max_context_length=8192, steps=1000),
                          activation_checkpoint=SelectiveAC.Config())


def llama3_70b() -> Trainer.Config:
    return Trainer.Config(model_spec=ModelSpec("llama3", "70B"),
                          training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=8 * 8192,
                                                  max_context_length=8192, steps=1000),
                          parallelism=ParallelismConfig(tensor_parallel_degree=8),
                          activation_checkpoint=FullAC.Config())


def llama3_405b() -> Trainer.Config:
    return Trainer.Config(model_spec=ModelSpec("llama3", "405B"),
                          training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=2 * 8192,
                                                  max_context_length=8192, steps=3000),
                          parallelism=ParallelismConfig(tensor_parallel_degree=8),
                          compile=CompileConfig(enable=True, enable_async_tensor_parallel=True),
                          activation_checkpoint=FullAC.Config())
