"""The gloo probe plumbing the experiment scripts share (two forked local ranks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

_PROBE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from experiments.common import run_gloo_ranks, span_after_last_arrival

def probe(dist, rank, cfg):
    import torch
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x)
    dist.barrier()
    if rank == 1:  # arrives later: the span counts from its start
        time.sleep(cfg["late_s"])
    start = time.perf_counter()
    dist.barrier()
    end = time.perf_counter()
    return [{"rank": rank, "sum": float(x[0]), "span": span_after_last_arrival(dist, start, end),
             "world": dist.get_world_size()}]

print(json.dumps(run_gloo_ranks(probe, {"late_s": 0.3})))
"""


@pytest.mark.slow
def test_run_gloo_ranks_returns_rank_0s_rows_and_spans_start_at_the_last_arrival():
    # in a fresh interpreter, as the DLRM job test does: a fork of the test process can deadlock in the child
    res = subprocess.run([sys.executable, "-c", _PROBE, str(REPO)], capture_output=True, text=True, timeout=300,
                         check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(res.stdout.strip().splitlines()[-1])
    assert rows == [{"rank": 0, "sum": 3.0, "span": rows[0]["span"], "world": 2}]
    assert 0.0 <= rows[0]["span"] < 0.25  # rank 0 waited ~0.3 s in the barrier; that is not counted


@pytest.mark.parametrize("module,args", [
    ("experiments.contention_sizes_cpu", ["--llc-mib", "0"]),
    ("experiments.comm_overlap_cpu", ["--rounds", "0"]),
    ("experiments.comm_overlap_cpu", ["--batches", "7"]),
    ("experiments.collective_protocol_cpu", ["--work-ms", "-1"]),
    ("experiments.gloo_call_times_cpu", ["--calls", "100"]),
    ("experiments.gloo_call_times_cpu", ["--batch", "0"]),
])
def test_the_gloo_probes_refuse_bad_arguments_with_exit_2_before_measuring(module, args, tmp_path, monkeypatch):
    import importlib

    out = tmp_path / "r.md"
    monkeypatch.setattr(sys, "argv", [module, *args, "--out", str(out)])
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(module).main()
    assert exc.value.code == 2
    assert not out.exists() and not out.with_suffix(".json").exists()


def test_gloo_call_times_summary_counts_tick_waits_and_compares_estimators():
    from experiments.gloo_call_times_cpu import BATCHES, PASSES, old_label, summarise

    rng = np.random.default_rng(0)
    rate = np.repeat(rng.uniform(0.0, 0.4, 60), 105)  # waits come in bursts: a rate per 105 calls
    calls = np.where(rng.uniform(size=6300) < rate, 4e-3, 3e-4) + rng.uniform(0, 2e-5, 6300)
    s = summarise(calls, 630, 7, 2e-3)
    assert s["chunks"] == 10 and s["slow_share"] == pytest.approx(0.2, abs=0.02)
    assert 3.9 < s["slow_quartiles_ms"][1] < 4.1 and 0.29 < s["quantiles_ms"]["0.5"] < 0.33
    est = s["estimators"]
    single = est["median of single calls (since session 44)"]["rel_std_pct"]
    assert single < 5 < est["mean per call"]["rel_std_pct"]  # the waits move the mean, not the median
    # the old label: median over passes of the median batch mean
    flat = np.arange(PASSES * BATCHES * 2, dtype=float)
    assert old_label(flat, 2) == pytest.approx(np.median([np.median(flat[p * 30:(p + 1) * 30].reshape(15, 2).mean(1))
                                                          for p in range(PASSES)]))
