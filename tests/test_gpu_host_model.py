"""``experiments/gpu_host_model.py``: the T-scaling reading on the committed H200 pack and a measured row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import gpu_host_model  # noqa: E402


@pytest.mark.skipif(not (REPO / "assets" / "h200-cal" / "manifest.json").exists(), reason="needs the h200-cal pack")
def test_scaling_the_ts_lowers_a_host_bound_prediction_and_renders(monkeypatch):
    monkeypatch.setitem(gpu_host_model.FILES, "h200-cal", ["e2e_h200_measured_b.json"])
    ratio, rows = gpu_host_model.scaled_rows("h200-cal", ["e2e_h200_measured_b.json"])
    assert 0.3 < ratio < 1.0  # a profiled step is slower than an unprofiled one
    small = next(r for r in rows if r["model"] == "mlp" and r["batch"] == 256)
    assert small["scaled_s"] < small["as_is_s"]  # host-bound: its time is the host's
    big = next(r for r in rows if r["model"] == "mlp" and r["batch"] == 16384)
    assert big["scaled_s"] == pytest.approx(big["as_is_s"], rel=0.02)  # GPU-bound: the host hides behind it
    res = {"date": "d", "packs": {"h200-cal": {"ratio": ratio, "rows": rows, "ops": [
        {"model": "mlp", "batch": 4096, "synthesised": {"T1": 25, "T2": 25, "T4": 33, "T5": 8},
         "traced": {"T1": 32, "T2": 19, "T4": 35, "T5": 16}}]}}}
    md = gpu_host_model.markdown(res)
    assert "e2e_h200_measured_b.json" in md and "| mlp | 4096 | 25 / 32 | 25 / 19 | 33 / 35 | 8 / 16 |" in md
