"""A trained :class:`~predictor.stage.model.StageLatencyModel` as the stage predictor of ``tuner/alpa.py``.

``tuner.alpa.stage_cost_tensors(..., predictor=LearnedStagePredictor(model))`` fills Alpa's
``compute_cost[L, L, S, C]`` with the stage model's predictions instead of simulations or
profiling (PredTOP's integration with Alpa). The predictor speaks ``tuner.alpa``'s protocol
structurally — ``stage_latency(query) -> seconds`` — and reads only the query's fields, so
``predictor`` still never imports ``tuner``.

A query (``n_layers`` transformer layers, with or without the embedding / head, a mesh config
``dp x tp`` and a micro-batch) becomes a :class:`~predictor.stage.gpt.StageSpec` of a GPT whose
layer count places the stage at the start, middle or end of the model; its graph is traced
once and cached. The model predicts what it was trained on: these latencies are CPU (float32,
one thread) seconds unless the model was trained on another device's measurements.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .gpt import GPTSpec, StageSpec
from .graph import StageGraph, stage_graph
from .model import StageLatencyModel

__all__ = ["LearnedStagePredictor", "spec_from_query"]


def spec_from_query(query: object) -> StageSpec:
    """The :class:`StageSpec` of a ``tuner.alpa.StageQuery`` (ValueError for what the GPT cannot express)."""
    t = query.spec  # type: ignore[attr-defined]
    if getattr(t, "moe", None) is not None:
        raise ValueError("the learned stage model covers dense GPT stages only (this spec is MoE)")
    if getattr(t, "mlp", "gelu") != "gelu" or getattr(t, "kv_heads_count", t.heads) != t.heads:
        raise ValueError("the learned stage model covers GPT stages only (multi-head attention, GeLU MLP)")
    ffn = int(t.ffn_size)
    if ffn % int(t.hidden):
        raise ValueError(f"FFN size {ffn} is not a multiple of hidden {t.hidden}")
    n = int(query.n_layers)  # type: ignore[attr-defined]
    emb, head = bool(query.with_embedding), bool(query.with_head)  # type: ignore[attr-defined]
    total = n + (0 if emb else 1) + (0 if head else 1)
    first = 0 if emb else 1
    model = GPTSpec(
        hidden=int(t.hidden),
        heads=int(t.heads),
        seq=int(t.seq),
        vocab=int(t.vocab),
        n_layers=total,
        micro_batch=int(query.micro_batch),
        ffn_mult=ffn // int(t.hidden),
    )  # type: ignore[attr-defined]
    cfg = query.config  # type: ignore[attr-defined]
    return StageSpec(model, first, first + n - 1, tp=int(cfg.tp), dp=int(cfg.dp))


class LearnedStagePredictor:
    """``stage_latency(query) -> seconds`` from a trained stage model; graphs cached per stage spec."""

    def __init__(self, model: StageLatencyModel) -> None:
        self.model = model
        self._graphs: dict[StageSpec, StageGraph] = {}
        self.predictions = 0

    def graph(self, spec: StageSpec) -> StageGraph:
        g = self._graphs.get(spec)
        if g is None:
            g = self._graphs[spec] = stage_graph(spec)
        return g

    def stage_latency(self, query: object) -> float:
        self.predictions += 1
        return float(self.model.predict(self.graph(spec_from_query(query))))

    def predict_specs(self, specs: Sequence[StageSpec]) -> np.ndarray:
        """Seconds for many stage specs at once (one batched inference)."""
        return np.asarray(self.model.predict([self.graph(s) for s in specs]), dtype=float)
