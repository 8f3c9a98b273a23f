"""Trace readers: Kineto + PyTorch execution traces -> ExecutionGraph (replay: :mod:`predictor.simulate.replay`).

Public face (imported lazily, so ``import predictor.sources.traces`` stays cheap):

* :func:`load_traces` — a Kineto file, folder or ``.tar.gz`` of per-rank files (+ ETs) -> :class:`TraceSet`
* :func:`read_kineto`, :func:`read_et` — one file -> :class:`KinetoTrace` / :class:`ExecutionTrace`
* :func:`build_graph` — TraceSet -> :class:`ReplayGraph` (ExecutionGraph with the Lumos dependency kinds)
* :func:`extract_overheads` — the five CPU overhead types of Lin et al. 2022 -> :class:`OverheadTable`
* :func:`capture` — record a training loop (Kineto + ET per rank)
* :class:`TraceError` — every reader error, one line
"""

from __future__ import annotations

from importlib import import_module

from predictor.sources.traces.errors import TraceError

_EXPORTS = {
    "load_traces": "predictor.sources.traces.load",
    "TraceSet": "predictor.sources.traces.load",
    "RankTrace": "predictor.sources.traces.load",
    "read_kineto": "predictor.sources.traces.kineto",
    "KinetoTrace": "predictor.sources.traces.kineto",
    "EventCat": "predictor.sources.traces.kineto",
    "read_et": "predictor.sources.traces.et",
    "ExecutionTrace": "predictor.sources.traces.et",
    "build_graph": "predictor.sources.traces.build",
    "ReplayGraph": "predictor.sources.traces.build",
    "extract_overheads": "predictor.sources.traces.overheads",
    "OverheadTable": "predictor.sources.traces.overheads",
    "capture": "predictor.sources.traces.capture",
    "Capture": "predictor.sources.traces.capture",
}

__all__ = ["TraceError", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'predictor.sources.traces' has no attribute {name!r}")
    return getattr(import_module(module), name)
