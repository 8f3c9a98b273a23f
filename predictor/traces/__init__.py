"""Trace readers and replay: Kineto + PyTorch execution traces -> ExecutionGraph -> simulate.

Public face (imported lazily, so ``import predictor.traces`` stays cheap):

* :func:`load_traces` — a Kineto file, folder or ``.tar.gz`` of per-rank files (+ ETs) -> :class:`TraceSet`
* :func:`read_kineto`, :func:`read_et` — one file -> :class:`KinetoTrace` / :class:`ExecutionTrace`
* :func:`build_graph` — TraceSet -> :class:`ReplayGraph` (ExecutionGraph with the Lumos dependency kinds)
* :func:`replay` — read, build, simulate -> :class:`ReplayResult` (per-step measured vs predicted)
* :func:`extract_overheads` — the five CPU overhead types of Lin et al. 2022 -> :class:`OverheadTable`
* :func:`capture` — record a training loop (Kineto + ET per rank)
* :class:`TraceError` — every reader error, one line
"""

from __future__ import annotations

from importlib import import_module

from predictor.traces.errors import TraceError

_EXPORTS = {
    "load_traces": "predictor.traces.load",
    "TraceSet": "predictor.traces.load",
    "RankTrace": "predictor.traces.load",
    "read_kineto": "predictor.traces.kineto",
    "KinetoTrace": "predictor.traces.kineto",
    "EventCat": "predictor.traces.kineto",
    "read_et": "predictor.traces.et",
    "ExecutionTrace": "predictor.traces.et",
    "build_graph": "predictor.traces.build",
    "ReplayGraph": "predictor.traces.build",
    "replay": "predictor.traces.replay",
    "ReplayResult": "predictor.traces.replay",
    "extract_overheads": "predictor.traces.overheads",
    "OverheadTable": "predictor.traces.overheads",
    "capture": "predictor.traces.capture",
    "Capture": "predictor.traces.capture",
}

__all__ = ["TraceError", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'predictor.traces' has no attribute {name!r}")
    return getattr(import_module(module), name)
