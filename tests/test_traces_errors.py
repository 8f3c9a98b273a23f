"""Broken input -> one-line TraceError, and ``tuner replay`` exits 2 with one ``error:`` line."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest
from _trace_fixtures import kernel, op, runtime, write_trace

from predictor.sources.traces.build import build_graph
from predictor.sources.traces.errors import TraceError
from predictor.sources.traces.load import load_traces


def _good_events():
    return [op("aten::mm", 1, 0, 50), runtime("cudaLaunchKernel", 1, 10, 5, corr=1), kernel("gemm", 7, 20, 30, corr=1)]


def _broken(tmp_path, kind: str):
    if kind == "truncated_gz":
        data = gzip.compress(json.dumps({"traceEvents": _good_events()}).encode())
        p = tmp_path / "cut.json.gz"
        p.write_bytes(data[: len(data) // 2])
    elif kind == "truncated_json":
        p = tmp_path / "cut.json"
        p.write_text(json.dumps({"traceEvents": _good_events()})[:-40])
    elif kind == "not_a_trace":
        p = tmp_path / "config.json"
        p.write_text(json.dumps({"model": "resnet", "layers": 50}))
    elif kind == "garbage":
        p = tmp_path / "garbage.json.gz"
        p.write_bytes(bytes(range(256)) * 8)
    elif kind == "garbage_json":
        p = tmp_path / "garbage.json"
        p.write_bytes(bytes(range(256)) * 8)
    elif kind == "empty_trace":
        p = write_trace(tmp_path / "empty.json", [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 5,
             "args": {}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
        ])
    elif kind == "missing_rank":
        p = tmp_path / "run"
        for r in (0, 1, 3):
            write_trace(p / f"rank{r}.kineto.json.gz", _good_events(), rank=r, world=4)
    elif kind == "duplicate_rank":
        p = tmp_path / "run2"
        write_trace(p / "a.kineto.json", _good_events(), rank=0, world=2)
        write_trace(p / "b.kineto.json", _good_events(), rank=0, world=2)
    elif kind == "empty_folder":
        p = tmp_path / "nothing"
        p.mkdir()
    elif kind == "truncated_tar":
        import io
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            data = json.dumps({"traceEvents": _good_events()}).encode()
            info = tarfile.TarInfo("x/rank0.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        p = tmp_path / "cut.tar.gz"
        p.write_bytes(buf.getvalue()[:60])
    elif kind == "missing":
        p = tmp_path / "nope.json.gz"
    else:  # pragma: no cover
        raise ValueError(kind)
    return p


CASES = {
    "truncated_gz": "truncated gzip",
    "truncated_json": "truncated JSON",
    "not_a_trace": "not a trace",
    "garbage": "not a gzip file",
    "garbage_json": "binary data",
    "empty_trace": "no CPU ops and no GPU kernels",
    "missing_rank": "rank 2 missing",
    "duplicate_rank": "two traces claim rank 0",
    "empty_folder": "no trace files",
    "truncated_tar": "archive",
    "missing": "no such file",
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_broken_inputs_raise_one_line_trace_error(tmp_path, kind):
    p = _broken(tmp_path, kind)
    with pytest.raises(TraceError) as info:
        build_graph(load_traces(p))
    msg = str(info.value)
    assert "\n" not in msg
    assert CASES[kind] in msg, msg
    assert str(p.name) in msg or str(p) in msg


def test_execution_trace_given_as_kineto_is_named(tmp_path):
    p = tmp_path / "x.et.json"
    p.write_text(json.dumps({"schema": "1.0.3-chakra.0.0.4", "nodes": [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]"}]}))
    with pytest.raises(TraceError, match="execution traces only"):
        load_traces(p)


def test_unknown_et_schema(tmp_path):
    k = write_trace(tmp_path / "a.kineto.json", _good_events())
    e = tmp_path / "a.et.json"
    e.write_text(json.dumps({"schema": "9.9.9", "nodes": [{"id": 1, "name": "x"}]}))
    with pytest.raises(TraceError, match="schema '9.9.9' is not supported"):
        load_traces(k)


@pytest.mark.parametrize("kind", ["truncated_gz", "not_a_trace", "missing_rank", "garbage"])
def test_cli_replay_bad_input_exits_2_with_one_line(tmp_path, kind):
    p = _broken(tmp_path, kind)
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", "replay", str(p), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o" / "replay.json").exists()
