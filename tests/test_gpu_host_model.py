"""``experiments/gpu_host_model.py``: the host model's three pricings on the committed H200 pack and a measured file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import gpu_host_model  # noqa: E402


@pytest.mark.skipif(not (REPO / "assets" / "h200-cal" / "manifest.json").exists(), reason="needs the h200-cal pack")
def test_the_pricings_order_a_host_bound_row_and_render(monkeypatch):
    monkeypatch.setitem(gpu_host_model.FILES, "h200-cal", ["e2e_h200_measured_b.json"])
    model, rows = gpu_host_model.scaled_rows("h200-cal", ["e2e_h200_measured_b.json"])
    assert 0.3 < model["profiler_ratio"] < 1.0  # a profiled step is slower than an unprofiled one
    assert model["step_s"] > 0  # the calibration step costs the host more than its ops
    small = next(r for r in rows if r["model"] == "mlp" and r["batch"] == 256)
    # host-bound: its pace is the host's; scaling lowers it, the step's framework cost raises it by step_s
    assert small["scaled_s"] < small["profiled_s"]
    assert small["host_model_s"] == pytest.approx(small["scaled_s"] + model["step_s"], rel=1e-6)
    big = next(r for r in rows if r["model"] == "mlp" and r["batch"] == 16384)
    assert big["host_model_s"] == pytest.approx(big["profiled_s"], rel=0.02)  # GPU-bound: the host hides behind it
    res = {"date": "d", "packs": {"h200-cal": {"model": model, "rows": rows, "ops": [
        {"model": "mlp", "batch": 4096, "synthesised": {"T1": 32, "T2": 19, "T4": 27, "T5": 8},
         "traced": {"T1": 32, "T2": 19, "T4": 35, "T5": 16}}]}}}
    md = gpu_host_model.markdown(res)
    assert "e2e_h200_measured_b.json" in md and "| mlp | 4096 | 32 / 32 | 19 / 19 | 27 / 35 | 8 / 16 |" in md
    assert f"| h200-cal | {model['profiler_ratio']:.3f} |" in md
