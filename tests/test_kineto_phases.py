"""The Kineto fast reader decodes events by phase (flow and other skipped phases without their fields) and
yields the same trace as columnising the parsed document; a trace with another phase, or an event without one,
decodes the general way with the same result."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictor.sources.traces.kineto import kineto_from_bytes, kineto_from_json

_COLUMNS = ("cat", "name", "pid", "tid", "ts", "dur", "corr", "ext", "rf", "stream", "device")


def _doc() -> dict:
    events = [
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "main"}},
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 1, "ts": 10.0, "dur": 5.0,
         "args": {"External id": 3, "Record function id": 8}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 1, "ts": 11.0, "dur": 2.0,
         "args": {"correlation": 40, "External id": 3}},
        {"ph": "s", "id": 40, "pid": 7, "tid": 1, "ts": 11.0, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 40, "pid": 0, "tid": 7, "ts": 20.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"cat": "kernel", "ph": "X", "name": "sgemm", "pid": 0, "tid": 7, "ts": 20.0, "dur": 4.0,
         "args": {"correlation": 40, "stream": 7, "device": 0}},
        {"ph": "X", "cat": "Kernel", "name": "odd", "pid": "0", "tid": "stream 7", "ts": 25, "dur": -1,
         "args": {"correlation": "41", "stream": "7"}},
        {"ph": "X", "cat": "cpu_op", "name": 5, "pid": 7, "tid": 1, "ts": "late", "dur": 1.0},
        {"ph": "X", "cat": "Trace", "name": "whole", "pid": 7, "tid": 1, "ts": 0.0, "dur": 100.0},
        {"ph": "i", "s": "t", "name": "mark", "pid": 7, "tid": 1, "ts": 30.0},
    ]
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}


def _same(a, b) -> None:
    for c in _COLUMNS:
        np.testing.assert_array_equal(getattr(a, c), getattr(b, c), err_msg=c)
        assert getattr(a, c).dtype == getattr(b, c).dtype, c
    assert a.names == b.names and a.args == b.args and a.thread_names == b.thread_names
    assert a.rank == b.rank and a.world_size == b.world_size and a.meta == b.meta


def _variants():
    yield "flow and instant events", _doc()
    doc = _doc()
    doc["traceEvents"].append({"ph": "Z", "name": "unknown phase", "pid": 7, "tid": 1, "ts": 1.0})
    yield "another phase", doc
    doc = _doc()
    doc["traceEvents"].append({"name": "no phase", "pid": 7, "tid": 1, "ts": 1.0, "cat": "cpu_op"})
    yield "an event without a phase", doc


@pytest.mark.parametrize("doc", [d for _, d in _variants()], ids=[n for n, _ in _variants()])
def test_fast_reader_matches_parsed_document(doc):
    text = json.dumps(doc).encode()
    fast = kineto_from_bytes(text, "x.json")
    assert fast is not None
    _same(fast, kineto_from_json(json.loads(text), "x.json"))
    assert fast.n_events == 4 and fast.meta["raw_events"] == len(doc["traceEvents"])
    assert fast.thread_names == {(7, 1): "main"}
