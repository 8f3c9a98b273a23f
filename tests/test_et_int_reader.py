"""The execution-trace reader's integer path (ids, parents and attributes typed, tensor values decoded as their
first element) yields the same columns as columnising the parsed document, and declines to the general path
for what it does not decode; a Kineto file's sibling execution trace reads the same way, its errors in one line."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from predictor.sources.traces.errors import TraceError
from predictor.sources.traces.et import et_from_bytes, et_from_json
from predictor.sources.traces.load import load_traces

_COLUMNS = ("id", "parent", "rf_id", "tid", "name", "in_ptr", "in_ids", "out_ptr", "out_ids")


def _tensor(i: int) -> list:
    return [i, i + 1000, 0, 8, 4, "cuda:0"]


def _attrs(rf: int, tid: int) -> list[dict]:
    return [{"name": "rf_id", "type": "uint64", "value": rf}, {"name": "fw_parent", "type": "uint64", "value": 0},
            {"name": "seq_id", "type": "int64", "value": -1}, {"name": "tid", "type": "uint64", "value": tid},
            {"name": "op_schema", "type": "string", "value": "aten::x(Tensor self) -> Tensor"}]


def _doc() -> dict:
    """Nodes as PyTorch's observer writes them, out of id order, with tensor lists, empty and short values,
    scalars that are arrays, a repeated rf_id and a node without inputs."""
    nodes = [
        {"id": 5, "name": "aten::cat", "ctrl_deps": 2,
         "inputs": {"values": [[_tensor(1), _tensor(2), 7], 0], "shapes": [[[8], [8]], []],
                    "types": ["GenericList[Tensor(float),Tensor(float)]", "Int"]},
         "outputs": {"values": [_tensor(3)], "shapes": [[16]], "types": ["Tensor(float)"]}, "attrs": _attrs(7, 1)},
        {"id": 2, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 1,
         "inputs": {"values": [], "shapes": [], "types": []}, "outputs": {"values": [], "shapes": [], "types": []},
         "attrs": _attrs(0, 1)},
        {"id": 6, "name": "aten::mm", "ctrl_deps": 5,
         "inputs": {"values": [_tensor(3), _tensor(4), 2.5, [-1], []], "shapes": [[4, 4], [4, 4], [], [[]], []],
                    "types": ["Tensor(float)", "Tensor(float)", "Double", "GenericList[Int]", "Tensor(float)"]},
         "outputs": {"values": [_tensor(9)], "types": ["Tensor(float)"]}, "attrs": _attrs(8, 2)},
        {"id": 7, "name": "no inputs, rf_id twice", "inputs": None,
         "attrs": [*_attrs(3, 1), {"name": "rf_id", "type": "uint64", "value": 11}]},
        {"id": 9, "name": "short values", "inputs": {"values": [_tensor(5)], "types": ["Tensor(float)", "Tensor(int)"]},
         "attrs": []},
        {"id": 8, "name": "aten::mm", "ctrl_deps": 5,
         "inputs": {"values": [_tensor(9), {"k": [1]}, "s", None, True], "shapes": [[4, 4], [], [], [], []],
                    "types": ["Tensor(float)", "Tensor(float)", "Tensor(float)", "Tensor(float)", "Tensor(float)"]},
         "outputs": {"values": [[True, 2]], "types": ["Tensor(float)"]}, "attrs": _attrs(9, 2)},
    ]
    return {"schema": "1.0.3-chakra.0.0.4", "pid": 42, "time": "t", "start_ts": 1, "nodes": nodes, "finish_ts": 2}


def _same(a, b) -> None:
    for c in _COLUMNS:
        np.testing.assert_array_equal(getattr(a, c), getattr(b, c), err_msg=c)
        assert getattr(a, c).dtype == getattr(b, c).dtype, c
    assert a.names == b.names and a.schema == b.schema and a.pid == b.pid and a.meta == b.meta
    for c in ("input_shapes", "input_types", "output_shapes"):
        assert [getattr(a, c)[i] for i in range(a.n_nodes)] == [getattr(b, c)[i] for i in range(b.n_nodes)], c


def _variants():
    yield "observer", _doc()
    doc = _doc()
    doc["nodes"][0]["outputs"]["values"] = 3  # values that are no JSON array
    yield "values not an array", doc
    doc = _doc()
    doc["nodes"][2]["attrs"][0]["value"] = "8"  # an rf_id as text
    yield "rf_id as text", doc
    doc = _doc()
    doc["nodes"][3]["ctrl_deps"] = 2.0
    yield "parent as a float", doc
    doc = _doc()
    doc["nodes"][4]["attrs"] = [{"name": "pg_name", "type": "string", "value": "0"}]
    yield "another attribute", doc


@pytest.mark.parametrize("doc", [d for _, d in _variants()], ids=[n for n, _ in _variants()])
def test_int_reader_matches_parsed_document(doc):
    text = json.dumps(doc).encode()
    fast = et_from_bytes(text, "x.et.json")
    assert fast is not None
    _same(fast, et_from_json(json.loads(text), "x.et.json"))


def test_int_reader_columns():
    et = et_from_bytes(json.dumps(_doc()).encode(), "x")
    assert et is not None
    assert et.id.tolist() == [2, 5, 6, 7, 8, 9]
    assert et.rf_id.tolist() == [0, 7, 8, 11, 9, -1] and et.tid.tolist() == [1, 1, 2, 1, 2, 0]
    assert et.inputs_of(1).tolist() == [1, 2] and et.outputs_of(1).tolist() == [3]
    assert et.inputs_of(2).tolist() == [3, 4] and et.inputs_of(4).tolist() == [9]
    assert et.outputs_of(4).tolist() == [1]  # a tensor value's first element, as the parsed document reads it
    assert et.inputs_of(5).tolist() == [5] and et.inputs_of(3).tolist() == []


def _write_pair(tmp_path, et_text: bytes):
    kineto = {"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 42, "tid": 1, "ts": 10.0, "dur": 5.0,
         "args": {"Record function id": 8}}]}
    k = tmp_path / "run.kineto.json.gz"
    k.write_bytes(gzip.compress(json.dumps(kineto).encode()))
    (tmp_path / "run.et.json.gz").write_bytes(et_text)
    return k


def test_sibling_execution_trace_reads_as_parsed(tmp_path):
    k = _write_pair(tmp_path, gzip.compress(json.dumps(_doc()).encode()))
    ts = load_traces(k)
    assert ts.ranks[0].et is not None
    _same(ts.ranks[0].et, et_from_json(_doc(), "x"))
    assert any("execution traces from" in n for n in ts.notes)
    assert load_traces(k, use_et=False).ranks[0].et is None


def test_sibling_errors_are_one_line(tmp_path):
    k = _write_pair(tmp_path, gzip.compress(json.dumps(_doc()).encode())[:-20])
    with pytest.raises(TraceError, match="run.et.json.gz: (truncated|corrupt) gzip"):
        load_traces(k)
    k = _write_pair(tmp_path, b"not gzip")
    with pytest.raises(TraceError, match="run.et.json.gz: not a gzip file"):
        load_traces(k)
