"""Replay of the real GPU traces in ../shared/data/traces (skipped when absent).

Ground truth is the ProfilerStep duration recorded in each trace by its authors (see
shared/data/SOURCES.md). Target: under 5 % error on every step.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from _trace_fixtures import TRACES, needs_traces

from predictor.graph import DepKind
from predictor.simulate.replay import replay
from predictor.sources.traces.load import load_traces

pytestmark = needs_traces


def _check_steps(res, n_steps: int, max_err: float = 5.0):
    df = res.steps()
    assert len(df) == n_steps
    assert np.all(df["measured_s"] > 0) and np.all(df["predicted_s"] > 0)
    assert df["error_pct"].abs().max() < max_err, df
    return df


def test_resnet50_ddp_with_et():
    res = replay(TRACES / "resnet50_ddp_a100_rank0of2.kineto.json.gz")
    df = _check_steps(res, 3)
    assert list(df["name"]) == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    rg = res.graph
    assert rg.world_size == 2 and rg.graph.n_ranks == 1
    assert any("joined 14388 of 14388" in n and "rf_id" in n for n in rg.notes)
    g = rg.graph
    for kind in (DepKind.CPU_CPU, DepKind.CPU_GPU, DepKind.GPU_CPU, DepKind.GPU_GPU, DepKind.DATA):
        assert (g.edge_kind == kind).any(), kind
    # GEMM shapes from the execution trace are kept for what-if transforms
    gemm = g.kind_mask("addmm", "mm")
    assert gemm.any() and np.isfinite(g.param("m")[gemm]).mean() > 0.9
    conv = g.kind_mask("conv2d")
    assert np.isfinite(g.param("k")[conv]).mean() > 0.5
    # single-rank trace of a 2-rank job: no collective groups, all-reduce kernels keep their durations
    assert g.n_groups == 0 and g.kind_mask("all_reduce").sum() > 0


def test_dlrm_eight_ranks_group_collectives():
    res = replay(TRACES / "dlrm_v100_8ranks.kineto.tar.gz")
    df = _check_steps(res, 8)
    assert sorted(df["rank"]) == list(range(8))
    # 12.5 .. 19.9 ms measured, as the source says
    assert df["measured_s"].min() == pytest.approx(12.509e-3) and df["measured_s"].max() == pytest.approx(19.901e-3)
    g = res.graph.graph
    assert g.n_groups == 8
    sizes = np.bincount(g.group[g.group >= 0])
    assert np.all(sizes == 8)
    tl = res.timeline
    for grp in range(g.n_groups):
        members = np.flatnonzero(g.group == grp)
        assert np.ptp(tl.end[members]) < 1e-12
    assert sum("joined" in n and "name and order" in n for n in res.graph.notes) == 8


def test_cli_replay_json(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "replay", str(TRACES / "dlrm_v100_8ranks.kineto.tar.gz"), "--json",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # nothing but the JSON on stdout
    assert doc["ranks"] == 8
    assert {"name", "measured_s", "predicted_s"} <= set(doc["steps"][0])
    assert doc["predicted_iteration_s"] == pytest.approx(19.9e-3, rel=0.05)
    assert set(doc["breakdown"]) >= {"exposed_compute_s", "exposed_communication_s", "overlap_s", "idle_s"}
    for name in ("replay_trace.json", "gpu_utilization.png", "replay.json"):
        assert (tmp_path / name).stat().st_size > 0
    trace = json.loads((tmp_path / "replay_trace.json").read_text())
    assert any(e.get("name") == "process_name" and "measured" in e["args"]["name"] for e in trace["traceEvents"])


@pytest.mark.slow
@pytest.mark.parametrize("name,n_steps", [("recsys_a100_rank3of8.kineto.json.gz", 6),
                                          ("mlp21_rtx2080ti.kineto.json.gz", 39)])
def test_other_real_traces(name, n_steps):
    res = replay(load_traces(TRACES / name))
    _check_steps(res, n_steps)
