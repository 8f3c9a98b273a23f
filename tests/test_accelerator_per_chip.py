"""Pipelined dataflow rows counted per chip: the accelerator report's "x base" column and the rent search's
price and memory of a module split over several chips of a dataflow system."""

from __future__ import annotations

import math

import pytest
import yaml
from typer.testing import CliRunner

from predictor.sources.synth.models import get_model_spec
from predictor.sources.synth.op_trace import trace_scalable
from predictor.timing.platforms import get_platform
from tuner.cli import app
from tuner.report.accelerators import build_payload
from tuner.search.accelerators import AcceleratorSpace, ModelInfo
from tuner.search.rent import RentSpace
from tuner.search.rent_eval import build_rent_context, enumerate_rent, evaluate_rent, trace_module

STUDY = {"name": "s", "storage": "mem", "evaluated": 2, "reused_from_study": 0}


def _row(acc: str, samples_per_s: float, chips: int, usd_h: float) -> dict:
    return {"model": "m", "accelerator": acc, "devices": 1, "status": "ok", "objective": chips / samples_per_s,
            "samples_per_s": samples_per_s, "chips": chips, "pipeline_stages": chips,
            "samples_per_s_per_chip": samples_per_s / chips, "price_performance": samples_per_s / usd_h}


def test_x_base_divides_one_chip_by_one_baseline_device():
    space = AcceleratorSpace(space="accelerators", models=[{"name": "gpt2-tiny"}], accelerators=["a100-40gb", "bow-pod16"])
    plats = {k: get_platform(k) for k in space.accelerators}
    infos = {"m": ModelInfo("m", "tiny", "sequences", 128)}
    # a 16-IPU pipeline with 4x one A100's whole-system throughput is 0.25 A100 per chip
    rows = [_row("a100-40gb", 10.0, 1, 4.0), _row("bow-pod16", 40.0, 16, 16 * 1.21)]
    payload = build_payload(space, plats, infos, rows, STUDY)
    by = {r["accelerator"]: r for r in payload["rows"]}
    assert by["a100-40gb"]["normalised_throughput"] == pytest.approx(1.0)
    assert by["bow-pod16"]["normalised_throughput"] == pytest.approx(0.25)
    assert by["bow-pod16"]["normalised_price_performance"] == pytest.approx((40 / (16 * 1.21)) / (10 / 4.0))


@pytest.fixture(scope="module")
def tiny_weights() -> float:
    spec = get_model_spec("gpt2-tiny")
    tr = trace_scalable(spec.build, spec.make_batch, spec.loss, precision="bf16", optimizer="adamw")
    return float(tr.lo.nbytes[tr.lo.baseline].sum())  # weights, fp32 masters and Adam state


def test_rent_prices_every_chip_of_a_pipeline_and_memory_per_chip(tmp_path, tiny_weights):
    pod = get_platform("bow-pod16")
    mem = [m.model_dump(mode="json") for m in pod.memory]
    mem[0]["capacity_bytes"] = int(0.1 * tiny_weights)  # weights + gradients (1/4 of it) need several IPUs
    cat = tmp_path / "small_sram.yaml"
    cat.write_text(yaml.safe_dump({"bow-pod16": {"memory": mem}}))
    space = RentSpace.model_validate({
        "space": "rent", "catalog": str(cat),
        "model": {"module": {"name": "gpt2-tiny", "batch_sizes": [1, 2, 4], "precision": "bf16"}},
        "training": {"samples": "1M"}, "accelerators": ["bow-pod16"], "devices": [1, 8]})
    ctx = build_rent_context(space)
    trace = trace_module(ctx)
    cands, _ = enumerate_rent(ctx)
    recs = {c.params["devices"]: evaluate_rent(ctx, c, trace)[0].record for c in cands}
    one, eight = recs[1], recs[8]
    assert one["status"] == "infeasible" and "pipeline of" in one["reason"]
    assert eight["status"] == "ok", eight.get("reason")
    stages, replicas = eight["fields"]["pipeline_stages"], eight["fields"]["replicas"]
    assert stages >= 2 and stages * replicas == 8 and f"pp{stages}" in eight["plan"]
    # the 8 rented chips are priced, not the replicas
    assert eight["usd"] == pytest.approx(eight["time_to_train_h"] * 8 * eight["usd_per_device_hour"])
    assert eight["device_hours"] == pytest.approx(eight["time_to_train_h"] * 8)
    assert eight["global_batch"] == eight["fields"]["batch_size"] * replicas
    # memory per chip: the pipeline's DDR use split over its stages, within one chip's DDR
    assert 0 < eight["memory_bytes_per_device"] <= pod.memory_bytes
    assert math.isfinite(eight["constraints"]["memory"]) and eight["constraints"]["memory"] <= 0


def test_rent_refuses_dataflow_systems_for_megatron_plans(tmp_path):
    space = {"space": "rent", "model": {"transformer": {"name": "t", "layers": 4, "hidden": 512, "heads": 8,
                                                        "seq": 512, "vocab": 1024}},
             "training": {"tokens": "1B", "global_batch": 64}, "accelerators": ["a100-80gb", "sn30"],
             "devices": [8]}
    p = tmp_path / "rent.yaml"
    p.write_text(yaml.safe_dump(space))
    res = CliRunner().invoke(app, ["search", str(p), "--out", str(tmp_path / "out"), "--workers", "0"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "accelerators[1]: sn30" in lines[0]
    assert "model: module" in lines[0] and "Traceback" not in res.output
