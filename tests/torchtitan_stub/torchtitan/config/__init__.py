"""``torchtitan.config``: the sections of a ``Trainer.Config`` tuner sets (field names and defaults as upstream)."""

from dataclasses import dataclass, field


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    num_tokens_per_microbatch_per_dp_rank: int = 16384
    num_tokens_per_train_step: int = -1
    max_context_length: int = 2048
    steps: int = 10000
    disable_cuda_graphs: bool = False
    mixed_precision_param: str = "bfloat16"
    mixed_precision_reduce: str = "float32"
    enable_cpu_offload: bool = False


@dataclass(kw_only=True, slots=True)
class ParallelismConfig:
    data_parallel_replicate_degree: int = 1
    data_parallel_shard_degree: int = -1
    tensor_parallel_degree: int = 1
    enable_sequence_parallel: bool = True
    pipeline_parallel_degree: int = 1
    pipeline_parallel_first_stage_less_layers: int = 1
    pipeline_parallel_last_stage_less_layers: int = 1
    pipeline_parallel_layers_per_stage: int | None = None
    module_fqns_per_model_part: list[list[str]] | None = None
    pipeline_parallel_schedule: str = "1F1B"
    num_pp_microbatches: int = 1
    context_parallel_degree: int = 1
    expert_parallel_degree: int = 1
    fsdp_reshard_after_forward: str = "default"


@dataclass(kw_only=True, slots=True)
class CompileConfig:
    enable: bool = False
    enable_async_tensor_parallel: bool = False
    components: list[str] = field(default_factory=lambda: ["model", "loss"])
