"""Collectives in a trace of one rank of a multi-rank job: a recorded NCCL kernel's wait for the absent
peers does not survive into the simulated duration when modelled (the default); it is reported per step
as the peer wait, and ``--collectives measured`` keeps it. With every rank's trace nothing is re-priced."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from _trace_fixtures import op, runtime

from predictor.graph import Category
from predictor.simulate.replay import replay
from predictor.sources.traces.build import build_graph
from predictor.sources.traces.collectives import platform_for_devices, price_collectives
from predictor.sources.traces.load import load_traces
from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.collective import PiecewiseCollective

NCCL_US = 5000.0  # the recorded all-reduce: a 4 MB transfer (tens of µs on A100 NVLink) and the wait
NELEMS = 1 << 20  # floats


def _rank_trace(path, rank: int, world: int, *, device: str = "NVIDIA A100-SXM4-40GB", nelems: int | None = NELEMS,
                nccl_us: float = NCCL_US):
    """One rank's step: a GEMM, an all-reduce of ``nelems`` floats lasting ``nccl_us``, a device sync."""
    ev = [op("aten::mm", 1, 100.0, 20.0), runtime("cudaLaunchKernel", 1, 105.0, 5.0, corr=1),
          {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 112.0, "dur": 50.0,
           "args": {"stream": 7, "device": 0, "correlation": 1}},
          op("nccl:all_reduce", 1, 130.0, 20.0), runtime("cudaLaunchKernel", 1, 135.0, 5.0, corr=2)]
    nccl_args = {"stream": 9, "device": 0, "correlation": 2, "dtype": "Float", "Group size": world}
    if nelems is not None:
        nccl_args["In msg nelems"] = nelems
    ev.append({"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", "pid": 0,
               "tid": 9, "ts": 165.0, "dur": nccl_us, "args": nccl_args})
    end = 165.0 + nccl_us
    ev.append(runtime("cudaDeviceSynchronize", 1, 155.0, end + 3.0 - 155.0, corr=3))
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 100, "tid": 1, "ts": 90.0,
               "dur": end + 10.0 - 90.0, "args": {}})
    doc = {"schemaVersion": 1, "traceEvents": ev, "distributedInfo": {"rank": rank, "world_size": world},
           "deviceProperties": [{"id": 0, "name": device}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _nccl(res) -> int:
    g = res.graph.graph
    return int(np.flatnonzero(g.category == Category.COMMUNICATION)[0])


def _modelled_s(res) -> float:
    g = res.graph.graph
    i = _nccl(res)
    view = TaskView.from_graph(g, np.asarray([i]), "all_reduce")
    return float(PiecewiseCollective().predict(view, platform_for_devices(["NVIDIA A100-SXM4-40GB"]))[0])


def test_single_rank_wait_does_not_survive_when_modelled(tmp_path):
    path = _rank_trace(tmp_path / "rank0of2.kineto.json", 0, 2)
    res = replay(path)  # modelled is the default
    i = _nccl(res)
    sim = res.timeline.end[i] - res.timeline.start[i]
    model = _modelled_s(res)
    assert 1e-6 < model < 2e-4  # a 4 MB all-reduce over NVLink, not the 5 ms recorded
    assert sim == pytest.approx(model, rel=1e-9)
    assert res.graph.graph.duration[i] == pytest.approx(NCCL_US * 1e-6)  # the graph keeps what was measured
    df = res.steps()
    assert df["peer_wait_s"].iloc[0] == pytest.approx(NCCL_US * 1e-6 - model, rel=1e-9)
    # the host waits on the device: the simulated step is shorter than measured by about the wait
    assert df["measured_s"].iloc[0] - df["predicted_s"].iloc[0] == pytest.approx(df["peer_wait_s"].iloc[0], rel=0.01)
    summary = res.summary()
    assert summary["collectives"]["mode"] == "modelled" and summary["collectives"]["priced"] == 1
    assert summary["steps"][0]["peer_wait_s"] == pytest.approx(df["peer_wait_s"].iloc[0])


def test_measured_mode_keeps_the_recorded_duration(tmp_path):
    path = _rank_trace(tmp_path / "rank0of2.kineto.json", 0, 2)
    res = replay(path, collectives="measured")
    i = _nccl(res)
    assert res.timeline.end[i] - res.timeline.start[i] == pytest.approx(NCCL_US * 1e-6)
    df = res.steps()
    assert abs(df["error_pct"].iloc[0]) < 0.5
    assert df["peer_wait_s"].iloc[0] == pytest.approx(NCCL_US * 1e-6 - _modelled_s(res), rel=1e-9)  # reported too


def test_all_ranks_present_nothing_repriced(tmp_path):
    for r in (0, 1):
        _rank_trace(tmp_path / "run" / f"rank{r}.kineto.json", r, 2, nccl_us=NCCL_US if r == 0 else 40.0)
    res = replay(tmp_path / "run")
    assert res.graph.graph.n_groups == 1 and res.collectives is not None and res.collectives.tasks.size == 0
    assert np.all(res.steps()["peer_wait_s"] == 0.0)


def test_without_message_size_or_known_gpu_measured_is_kept(tmp_path):
    for kw, why in (({"nelems": None}, "no message size"), ({"device": "Acme NPU 9000"}, "not in the catalog")):
        res = replay(_rank_trace(tmp_path / f"{why[:2]}.kineto.json", 0, 2, **kw))
        i = _nccl(res)
        assert res.timeline.end[i] - res.timeline.start[i] == pytest.approx(NCCL_US * 1e-6)
        assert res.collectives.unpriced == 1 and any(why in n for n in res.summary()["notes"])


def test_model_never_exceeds_measured(tmp_path):
    rg = build_graph(load_traces(_rank_trace(tmp_path / "short.kineto.json", 0, 2, nccl_us=1.0)))
    cp = price_collectives(rg.graph, rg.world_size, rg.devices)
    assert cp.tasks.size == 1 and cp.priced_s[0] == pytest.approx(1e-6) and cp.wait_s[0] == 0.0
    with pytest.raises(ValueError, match="collectives mode"):
        price_collectives(rg.graph, rg.world_size, rg.devices, mode="both")


def test_platform_for_devices():
    assert platform_for_devices(["NVIDIA A100-PG509-200"]).name.startswith("NVIDIA A100")
    assert "V100" in platform_for_devices(["Tesla V100-SXM2-32GB"]).name
    assert platform_for_devices(["Intel(R) Xeon(R) CPU"]) is None and platform_for_devices([]) is None


def test_cli_collectives_option(tmp_path):
    path = _rank_trace(tmp_path / "rank0of2.kineto.json", 0, 2)
    bad = subprocess.run([sys.executable, "-m", "tuner.cli", "replay", str(path), "--collectives", "both", "--out",
                          str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--collectives" in bad.stderr
    ok = subprocess.run([sys.executable, "-m", "tuner.cli", "replay", str(path), "--collectives", "measured", "--json",
                         "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["collectives"]["mode"] == "measured" and doc["steps"][0]["peer_wait_s"] > 4e-3
