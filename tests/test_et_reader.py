"""The execution-trace fast reader (msgspec, shapes and types kept as text) yields the same columns as
columnising the fully parsed document, in both layouts, including odd and missing fields."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from predictor.sources.traces.errors import TraceError
from predictor.sources.traces.et import et_from_bytes, et_from_json, read_et

_COLUMNS = ("id", "parent", "rf_id", "tid", "name", "in_ptr", "in_ids", "out_ptr", "out_ids")


def _tensor(i: int) -> list:
    return [i, i + 100, 0, 8, 4, "cuda:0"]


def _nested_doc() -> dict:
    def attrs(rf, tid):
        return [{"name": "rf_id", "type": "uint64", "value": rf}, {"name": "seq_id", "type": "int64", "value": -1},
                {"name": "tid", "type": "uint64", "value": tid}, {"name": "op_schema", "type": "string", "value": ""}]
    nodes = [
        {"id": 5, "name": "aten::cat", "ctrl_deps": 2,
         "inputs": {"values": [[_tensor(1), _tensor(2)], 0], "shapes": [[[8], [8]], []],
                    "types": ["GenericList[Tensor(float),Tensor(float)]", "Int"]},
         "outputs": {"values": [_tensor(3)], "shapes": [[16]], "types": ["Tensor(float)"]}, "attrs": attrs(7, 1)},
        {"id": 2, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 1,
         "inputs": {"values": [], "shapes": [], "types": []}, "outputs": {"values": [], "shapes": [], "types": []},
         "attrs": attrs(0, 1)},
        {"id": 6, "name": "aten::mm", "ctrl_deps": 5,
         "inputs": {"values": [_tensor(3), _tensor(4), 2.5], "shapes": [[4, 4], [4, 4], []],
                    "types": ["Tensor(float)", "Tensor(float)", "Double"]},
         "outputs": {"values": [_tensor(9)], "types": ["Tensor(float)"]}, "attrs": attrs(8, 2)},
        {"id": 7, "name": "no inputs, rf_id twice", "inputs": None,
         "attrs": [*attrs(3, 1), {"name": "rf_id", "type": "uint64", "value": 11}]},
        {"id": 8, "name": "odd", "ctrl_deps": "x", "inputs": {"values": [_tensor(1)], "shapes": None, "types": "Tensor"},
         "outputs": {"values": 3, "types": ["Tensor(float)"]}, "attrs": [{"name": "tid", "value": "1"}]},
        {"id": 9, "name": "short values", "inputs": {"values": [_tensor(5)], "types": ["Tensor(float)", "Tensor(int)"]},
         "attrs": []},
    ]
    return {"schema": "1.0.3-chakra.0.0.4", "pid": 42, "time": "t", "start_ts": 1, "nodes": nodes, "finish_ts": 2}


def _flat_doc() -> dict:
    nodes = [
        {"name": "[pytorch|profiler|execution_graph|thread]", "id": 2, "rf_id": 0, "parent": 1, "tid": 1,
         "inputs": [], "input_shapes": [], "input_types": [], "outputs": [], "output_shapes": [], "output_types": []},
        {"name": "aten::add", "id": 4, "rf_id": 3, "parent": 2, "tid": 1,
         "inputs": [_tensor(1), _tensor(2), 1], "input_shapes": [[8], [8], []],
         "input_types": ["Tensor(float)", "Tensor(float)", "Int"],
         "outputs": [_tensor(3)], "output_shapes": [[8]], "output_types": ["Tensor(float)"]},
        {"name": "aten::relu", "id": 3, "parent": 2, "inputs": [_tensor(3)], "input_types": ["Tensor(float)"]},
    ]
    return {"schema": "1.0.1", "pid": 7, "nodes": nodes}


def _same(a, b) -> None:
    for c in _COLUMNS:
        np.testing.assert_array_equal(getattr(a, c), getattr(b, c), err_msg=c)
    assert a.names == b.names and a.schema == b.schema and a.pid == b.pid and a.meta == b.meta
    for c in ("input_shapes", "input_types", "output_shapes"):
        assert len(getattr(a, c)) == len(getattr(b, c))
        assert [getattr(a, c)[i] for i in range(a.n_nodes)] == [getattr(b, c)[i] for i in range(b.n_nodes)], c


@pytest.mark.parametrize("doc", [_nested_doc(), _flat_doc()], ids=["1.0.3", "1.0.1"])
def test_fast_reader_matches_parsed_document(doc):
    text = json.dumps(doc, indent=1).encode()
    fast = et_from_bytes(text, "x.et.json")
    assert fast is not None
    _same(fast, et_from_json(json.loads(text), "x.et.json"))
    _same(read_et(gzip.compress(text)), fast)


def _unknown_attr_doc() -> dict:
    doc = _nested_doc()
    doc["nodes"][0]["attrs"].append({"name": "pg_name", "type": "string", "value": "0"})
    return doc


def test_fast_reader_attribute_names():
    """Attributes named as PyTorch's observer names them decode by name; another name falls back to the
    general attribute decoding, with the same columns."""
    known = et_from_bytes(json.dumps(_nested_doc()).encode(), "x")
    other = et_from_bytes(json.dumps(_unknown_attr_doc()).encode(), "x")
    assert known is not None and other is not None
    _same(other, et_from_json(_unknown_attr_doc(), "x"))
    _same(other, known)


def test_fast_reader_columns():
    et = et_from_bytes(json.dumps(_nested_doc()).encode(), "x")
    assert et is not None
    assert et.id.tolist() == [2, 5, 6, 7, 8, 9]  # sorted by id
    assert et.rf_id.tolist() == [0, 7, 8, 11, -1, -1]  # the last rf_id attribute wins
    assert et.parent.tolist() == [1, 2, 5, -1, -1, -1]
    assert et.inputs_of(1).tolist() == [1, 2] and et.outputs_of(1).tolist() == [3]
    assert et.inputs_of(2).tolist() == [3, 4] and et.inputs_of(5).tolist() == [5]
    assert et.input_shapes[2] == [[4, 4], [4, 4], []] and et.input_shapes[4] == [] and et.output_shapes[2] == []
    assert et.input_types[4] == [] and et.input_shapes[1:3][1] == [[4, 4], [4, 4], []]


def test_fast_reader_declines_what_it_does_not_decode():
    doc = _nested_doc()
    doc["nodes"].append("not a node")
    text = json.dumps(doc).encode()
    assert et_from_bytes(text, "x") is None  # the parsed-document path reads it (and skips the string)
    assert read_et(text).n_nodes == 6
    assert et_from_bytes(b'{"traceEvents": []}', "x") is None
    assert et_from_bytes(b'{"schema": "9.9", "nodes": []}', "x") is None
    with pytest.raises(TraceError, match="schema '9.9' is not supported"):
        read_et(b'{"schema": "9.9", "nodes": []}')
    with pytest.raises(TraceError, match="no nodes"):
        et_from_bytes(b'{"schema": "1.0.1", "nodes": []}', "x")
