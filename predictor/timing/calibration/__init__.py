"""Microbenchmarks for calibration, one module per kernel family (see :mod:`.base` for the contract).

| family | module | kernels | model |
|---|---|---|---|
| ``gemm`` | :mod:`.gemm` | addmm, mm, bmm x fp32/bf16 (+fp16 on CUDA) | MLP per (op, dtype) |
| ``conv2d`` | :mod:`.conv2d` | conv2d forward | MLP |
| ``embedding_bag`` | :mod:`.embedding_bag` | forward, backward (+SGD) | MLP on B, E, L, D + 17 reuse factors |
| ``elementwise`` | :mod:`.elementwise` | relu, gelu, tanh, add, mul; dropout | fitted roofline; MLP |
| ``layer_norm`` | :mod:`.layer_norm` | layer-norm forward | MLP |
| ``softmax`` | :mod:`.softmax` | softmax forward | MLP |
| ``data_movement`` | :mod:`.data_movement` | memcpy; concat, transpose | fitted roofline; MLP |
| ``collectives`` | :mod:`.collectives` | all-reduce, all-to-all, all-gather, reduce-scatter | piecewise sigmoid |
| ``reduction`` | :mod:`.reduction` | column sum (a linear layer's bias gradient) | MLP |

Host overheads T1..T5 come from a profiled run (:mod:`.overheads`); the shared timer is
:mod:`.timing`. :func:`predictor.timing.calibrate.calibrate` runs them all and fits the models.
"""

from __future__ import annotations

from predictor.timing.calibration.base import BenchContext, Benchmark, ModelSpec
from predictor.timing.calibration.timing import Measurement, Timer

__all__ = ["Benchmark", "BenchContext", "ModelSpec", "Measurement", "Timer", "FAMILIES", "make_benchmarks"]

#: family name -> "module:Class" (lazy, like the search-space registry)
FAMILIES: dict[str, str] = {
    "gemm": "predictor.timing.calibration.gemm:GemmBenchmark",
    "conv2d": "predictor.timing.calibration.conv2d:Conv2dBenchmark",
    "embedding_bag": "predictor.timing.calibration.embedding_bag:EmbeddingBagBenchmark",
    "elementwise": "predictor.timing.calibration.elementwise:ElementwiseBenchmark",
    "layer_norm": "predictor.timing.calibration.layer_norm:LayerNormBenchmark",
    "softmax": "predictor.timing.calibration.softmax:SoftmaxBenchmark",
    "data_movement": "predictor.timing.calibration.data_movement:DataMovementBenchmark",
    "collectives": "predictor.timing.calibration.collectives:CollectivesBenchmark",
    "reduction": "predictor.timing.calibration.reduction:ReductionBenchmark",
}


def make_benchmarks(world_size: int, families: list[str] | None = None) -> list[Benchmark]:
    """Instantiate the benchmark of each family (collectives need the world size)."""
    import importlib

    out: list[Benchmark] = []
    for name in families or list(FAMILIES):
        if name not in FAMILIES:
            raise KeyError(f"unknown benchmark family {name!r}; known: {', '.join(FAMILIES)}")
        module, cls_name = FAMILIES[name].split(":")
        cls = getattr(importlib.import_module(module), cls_name)
        out.append(cls(world_size) if name == "collectives" else cls())
    return out
