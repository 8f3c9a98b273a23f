"""Stage-latency prediction (PredTOP): stage graphs, the DAG Transformer, GCN/GAT baselines,
measured CPU training data, and the pipeline formulas that turn stage latencies into an
iteration time.

Typical use (seconds throughout)::

    from predictor.stage import GPTSpec, StageSpec, stage_graph, StageLatencyModel, load_dataset, load_graphs

    samples, _ = load_dataset()                      # measured CPU stage latencies
    graphs = load_graphs([s.spec for s in samples])  # traced, pruned stage DAGs
    model = StageLatencyModel("dag_transformer")
    model.fit(graphs, [s.latency_s for s in samples])
    model.predict(stage_graph(StageSpec(GPTSpec(256, 8, 128, 8192, 8, 2), 2, 5, tp=2)))

Modules: ``gpt`` (the stage as a torch module), ``graph`` (tracing, pruning, features,
reachability, depth), ``batching``, ``dag_transformer``, ``gnn_baselines``, ``model``
(``StageLatencyModel``), ``alpa_adapter`` (``LearnedStagePredictor`` for ``tuner.alpa``),
``dataset`` (measurement and the committed data), ``pipeline``.
"""

from .alpa_adapter import LearnedStagePredictor
from .dataset import DEFAULT_DATASET, DEFAULT_MODELS, StageSample, load_dataset, load_graphs, measure_stage
from .gpt import GPTSpec, StageSpec, StageSpecError
from .graph import SHAPE_ONLY_OPS, StageGraph, graph_from_fx, stage_graph, trace_stage
from .model import DEFAULT_NETWORKS, KINDS, FitReport, StageLatencyModel, TrainConfig
from .pipeline import PipelineSchedule, gpipe, one_f_one_b, pipeline_latency

__all__ = [
    "DEFAULT_DATASET",
    "DEFAULT_MODELS",
    "DEFAULT_NETWORKS",
    "KINDS",
    "SHAPE_ONLY_OPS",
    "FitReport",
    "GPTSpec",
    "LearnedStagePredictor",
    "PipelineSchedule",
    "StageGraph",
    "StageLatencyModel",
    "StageSample",
    "StageSpec",
    "StageSpecError",
    "TrainConfig",
    "gpipe",
    "graph_from_fx",
    "load_dataset",
    "load_graphs",
    "measure_stage",
    "one_f_one_b",
    "pipeline_latency",
    "stage_graph",
    "trace_stage",
]
