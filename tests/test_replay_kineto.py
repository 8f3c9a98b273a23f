"""The simulated timeline in the Kineto schema, and CPU-only captures replayed.

The export is checked for the schema fields other tools read (``cat``, ``args.stream``,
``args.correlation``, ``ac2g`` flow pairs), re-read through tuner's own Kineto reader (the re-read
trace's measured steps are the simulated ones) and, when HolisticTraceAnalysis is installed, loaded by
HTA. A CPU-only capture of a small MLP (``torch.profiler``, CPU activity only) replays with its host ops
as compute and no GPU chart.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
from _trace_fixtures import TRACES, needs_traces
from test_replay_perturb import gpu_bound_trace

from predictor.simulate.kineto_export import write_kineto
from predictor.simulate.replay import replay


def _events(path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def _check_schema(events: list[dict]) -> None:
    cats = {e.get("cat") for e in events if e.get("ph") == "X"}
    assert {"cpu_op", "cuda_runtime", "kernel", "user_annotation"} <= cats, cats
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert all(isinstance(e["args"]["stream"], int) and "correlation" in e["args"] for e in kernels)
    runtime_corr = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime"}
    assert {e["args"]["correlation"] for e in kernels} <= runtime_corr  # every kernel has its launch
    starts = {e["id"] for e in events if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    finishes = {e["id"] for e in events if e.get("ph") == "f" and e.get("cat") == "ac2g"}
    assert starts and starts == finishes


def test_export_schema_and_reread(tmp_path):
    res = replay(gpu_bound_trace(tmp_path / "gpu_bound.kineto.json"))
    (path,) = write_kineto(res, tmp_path / "out")
    assert path.name == "simulated.kineto.json.gz"
    _check_schema(_events(path))
    again = replay(path).steps()
    # the re-read trace's ProfilerSteps are the simulated ones
    np.testing.assert_allclose(again["measured_s"], res.steps()["predicted_s"], rtol=1e-6, atol=2e-9)
    assert list(again["name"]) == list(res.steps()["name"])


@needs_traces
def test_export_of_eight_ranks_rereads(tmp_path):
    res = replay(TRACES / "dlrm_v100_8ranks.kineto.tar.gz", use_et=False)
    files = write_kineto(res, tmp_path)
    assert len(files) == 8 and all(f.parent.name == "simulated_kineto" for f in files)
    _check_schema(_events(files[0]))
    again = replay(files[0].parent, use_et=False).steps().sort_values("rank")
    # µs timestamps near 1e15 keep a quarter µs in float64
    np.testing.assert_allclose(again["measured_s"], res.steps().sort_values("rank")["predicted_s"], atol=1e-6)


def test_hta_loads_the_simulated_trace(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("hta")
    if int(pd.__version__.split(".")[0]) >= 3:
        # HTA 0.5.0 calls DataFrame.drop(axis=1, columns=[...]), which pandas 3 rejects
        original = pd.DataFrame.drop

        def drop(self, labels=None, *, axis=0, index=None, columns=None, **kw):
            if columns is not None or index is not None:
                return original(self, labels, index=index, columns=columns, **kw)
            return original(self, labels, axis=axis, **kw)

        mp = pytest.MonkeyPatch()
        mp.setattr(pd.DataFrame, "drop", drop)
    else:
        mp = None
    try:
        from hta.trace_analysis import TraceAnalysis

        res = replay(gpu_bound_trace(tmp_path / "gpu_bound.kineto.json"))
        write_kineto(res, tmp_path / "sim")
        ta = TraceAnalysis(trace_dir=str(tmp_path / "sim"))
        df = ta.t.get_trace(0)
        names = ta.t.symbol_table.get_sym_table()
        kernels = df[df["stream"] >= 0]
        # HTA keeps the kernels of the steps it assigns to iterations: the 100 µs sgemm kernels
        assert len(kernels) >= 60 and {names[i] for i in kernels["name"].unique()} == {"sgemm"}
        np.testing.assert_allclose(kernels["dur"], 100.0, atol=1e-3)
        assert (df["correlation"][kernels.index] > 0).all()
    finally:
        if mp is not None:
            mp.undo()


def _cpu_capture(path) -> None:
    """Three profiled SGD steps of a small MLP, CPU activity only (a child process: the profiler stays out of
    the test process)."""
    code = f"""
import torch
from torch.profiler import ProfilerActivity, profile, schedule
torch.manual_seed(0); torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3), record_shapes=True,
             on_trace_ready=lambda p: p.export_chrome_trace({str(path)!r})) as prof:
    for _ in range(4):
        loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(); loss.backward(); opt.step(); prof.step()
"""
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=240)


def test_cpu_capture_breakdown_shows_compute_and_no_gpu_chart(tmp_path):
    trace = tmp_path / "mlp_cpu.json"
    _cpu_capture(trace)
    res = replay(trace)
    assert not res.graph.graph.is_gpu().any()
    b = res.breakdown("predicted")
    # the host ops are compute (at least the busiest thread's op time per step), not idle
    steps = res.steps()
    assert np.all(steps["kernel_sum_s"] > 0)
    assert b.exposed_compute >= 0.99 * steps["kernel_sum_s"].sum(), (b, steps)
    assert b.exposed_communication == 0.0
    out = tmp_path / "out"
    out.mkdir()
    (out / "gpu_utilization.png").write_bytes(b"stale")
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", "replay", str(trace), "--json", "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["breakdown"]["exposed_compute_s"] >= 0.99 * sum(st["kernel_sum_s"] for st in doc["steps"])
    assert not (out / "gpu_utilization.png").exists()
    assert any("no GPU" in n for n in doc["notes"])
    assert (out / "simulated.kineto.json.gz").stat().st_size > 0
