"""Accelerator selection (Centimani): fake-tensor tracing, the memory model, eq. 5, the decoupled
time model, and `tuner search` on an accelerators space (outputs, bad input)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from predictor.memory import (
    LevelUsage,
    MemoryTimeline,
    eq5_objective,
    measure_training_peak,
    memory_timeline,
    place,
    select_batch_size,
)
from predictor.sources.synth.decoupled import TimeOptions, predict_iteration
from predictor.sources.synth.models import ModelImportError, get_model_spec, parameter_count
from predictor.sources.synth.op_trace import trace_scalable, trace_training_step
from predictor.sources.synth.opgraph import OP_KINDS, Phase, TensorCategory, TraceError
from predictor.timing.platforms import get_platform
from tuner.cli import app

MIB = 2**20


@pytest.fixture(scope="module")
def tiny_gpt():
    spec = get_model_spec("gpt2-tiny")
    return spec, trace_scalable(spec.build, spec.make_batch, spec.loss, precision="fp32")


# --------------------------------------------------------------------------- tracing
def test_builtin_specs_have_their_published_sizes():
    # ResNet-50: 25,557,032 parameters (He et al. 2016 / torchvision); GPT-2 XL 1.5B with tied embeddings
    assert parameter_count(get_model_spec("resnet50")) == 25_557_032
    assert parameter_count(get_model_spec("gpt2-1.5b")) == 1_557_611_200
    assert 330e6 < parameter_count(get_model_spec("bert-large")) < 340e6


def test_trace_records_phases_kinds_and_gemm_shapes(tiny_gpt):
    _, sg = tiny_gpt
    g = sg.lo
    assert set(np.unique(g.phase)) >= {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER}
    gemm = g.kind == OP_KINDS.index("gemm")
    assert gemm.any() and np.all(np.isfinite(g.m[gemm])) and np.all(g.flops[gemm] > 0)
    # every GEMM FLOP count is 2 m n k (batch)
    np.testing.assert_allclose(g.flops[gemm], 2 * g.m[gemm] * g.n[gemm] * g.k[gemm] * g.gemm_batch[gemm])
    assert (g.kind == OP_KINDS.index("attention")).sum() == 8  # 4 layers x (forward + backward)
    assert g.param_elems[gemm].max() > 0
    # weights: fp32 parameters; AdamW state (2 fp32 tensors per parameter) is algorithm-related
    weights = g.nbytes[g.baseline & (g.category == TensorCategory.WEIGHTS)].sum()
    algo = g.nbytes[g.baseline & (g.category == TensorCategory.ALGORITHM)].sum()
    assert weights == pytest.approx(4 * g.n_params, rel=1e-6)
    assert algo == 8 * g.n_params + 4 * g.grad_bytes.size  # exp_avg, exp_avg_sq + a 4-byte step per tensor


def test_interpolated_trace_equals_a_real_trace(tiny_gpt):
    spec, sg = tiny_gpt
    real = trace_training_step(spec.build, spec.make_batch, spec.loss, 7, precision="fp32")
    est = sg.at(7)
    np.testing.assert_array_equal(est.ev_tensor, real.ev_tensor)
    np.testing.assert_allclose(est.nbytes, real.nbytes)
    np.testing.assert_allclose(np.nan_to_num(est.flops), np.nan_to_num(real.flops), rtol=1e-9)
    assert memory_timeline(est).peak_bytes == pytest.approx(memory_timeline(real).peak_bytes)


def test_mixed_precision_categories():
    spec = get_model_spec("mlp")
    g = trace_training_step(spec.build, spec.make_batch, spec.loss, 4, precision="bf16")
    w = g.nbytes[g.baseline & (g.category == TensorCategory.WEIGHTS)].sum()
    a = g.nbytes[g.baseline & (g.category == TensorCategory.ALGORITHM)].sum()
    assert w == pytest.approx(2 * g.n_params, rel=1e-6)  # bf16 weights
    assert a == 12 * g.n_params + 4 * g.grad_bytes.size  # fp32 master + AdamW m, v (+ step counters)


@pytest.mark.parametrize(("name", "batch", "precision"), [("gpt2-tiny", 6, "fp32"), ("mlp", 256, "fp32"),
                                                          ("bert-mini", 5, "amp_bf16")])
def test_predicted_peak_matches_measured_cpu_peak(name, batch, precision):
    """Prediction from traces at batch 2 and 3 (no real allocation) vs a real run's allocator peak."""
    spec = get_model_spec(name)
    sg = trace_scalable(spec.build, spec.make_batch, spec.loss, precision=precision)
    predicted = memory_timeline(sg.at(batch)).peak_bytes
    measured = measure_training_peak(spec.build, spec.make_batch, spec.loss, batch, precision=precision)
    assert abs(predicted - measured["peak_bytes"]) / measured["peak_bytes"] < 0.05


def test_untraceable_model_is_a_trace_error():
    import torch

    def bad_batch(b):
        return (torch.randn(b, 7),), None  # the MLP expects 1024 features

    spec = get_model_spec("mlp")
    with pytest.raises(TraceError, match="cannot trace"):
        trace_training_step(spec.build, bad_batch, lambda o, t: o.sum(), 2)


# --------------------------------------------------------------------------- memory model
def _timeline(weights: float, acts: float) -> MemoryTimeline:
    """Two rows: baseline (weights) and peak (weights + activations)."""
    lv = np.zeros((2, 5))
    lv[:, TensorCategory.WEIGHTS] = weights
    lv[1, TensorCategory.INPUT_OUTPUT] = acts
    return MemoryTimeline(lv, np.array([0, 1]), 1)


def test_policies_map_categories_to_levels():
    gpu, cs2, ipu = get_platform("a100-80gb"), get_platform("cs-2"), get_platform("bow-ipu")
    u = place(_timeline(1 * 2**30, 2 * 2**30), gpu)
    assert u.on_chip_bytes == 0 and u.off_chip_bytes == 3 * 2**30 and u.feasible
    # Cerebras: weights pinned on-chip (5 GiB per worker) - 6 GiB of weights cannot fit at any batch
    bad = place(_timeline(6 * 2**30, 1), cs2)
    assert not bad.feasible and "on-chip" in bad.reason
    ok = place(_timeline(2 * 2**30, 10 * 2**30), cs2)
    assert ok.on_chip_bytes == pytest.approx(cs2.on_chip_bytes) and ok.off_chip_bytes == pytest.approx(
        12 * 2**30 - cs2.on_chip_bytes)
    # onchip_first fills on-chip with activations first
    f = place(_timeline(2 * 2**30, 100 * MIB), ipu)
    assert f.on_chip_share["input_output"] == 1.0 and 0 < f.on_chip_share["weights"] < 1


def test_eq5_picks_the_largest_feasible_and_explains_failure():
    gpu = get_platform("a100-40gb")

    def est(b: int) -> LevelUsage:
        return place(_timeline(2 * 2**30, b * 1 * 2**30), gpu, usable_fraction=0.95)

    choice = select_batch_size(est, [1, 2, 4, 8, 16, 32, 64])
    assert choice.batch == 32  # 2 + 32 GiB fits 38 GiB, 2 + 64 does not
    assert [c["feasible"] for c in choice.candidates] == [True] * 6 + [False]
    objs = [c["objective"] for c in choice.candidates if c["feasible"]]
    assert objs == sorted(objs, reverse=True)
    assert eq5_objective(choice.usage) == pytest.approx(objs[-1])
    none = select_batch_size(lambda b: place(_timeline(50 * 2**30, b), gpu), [1, 2])
    assert none.batch is None and "batch 1 does not fit" in none.reason


# --------------------------------------------------------------------------- time model
def test_time_model_orders_devices_and_accounts_stages(tiny_gpt):
    _, sg = tiny_gpt
    g = sg.at(16)
    a100, h100 = get_platform("a100-80gb"), get_platform("h100-sxm")
    pa, graph, tl = predict_iteration(g, a100, None)
    ph, _, _ = predict_iteration(g, h100, None)
    assert ph.compute_s < pa.compute_s
    assert ph.iteration_s <= pa.iteration_s  # at batch 16 both are bound by eager host dispatch
    assert pa.iteration_s == pytest.approx(pa.host_overhead_s, rel=0.05)
    big_a, _, _ = predict_iteration(sg.at(1024), a100, None)
    big_h, _, _ = predict_iteration(sg.at(1024), h100, None)
    assert big_h.iteration_s < 0.8 * big_a.iteration_s
    assert pa.iteration_s >= max(pa.compute_s, pa.host_overhead_s) - 1e-12
    assert pa.communication_s == 0 and "simulator" in pa.methods["iteration"]
    on_chip = graph.meta["on_chip_bytes"]
    assert np.all(on_chip <= np.nan_to_num(graph.bytes) + 1e-6)
    # data parallel: buckets all-reduce; gradient accumulation amortises the optimizer step
    p8, _, _ = predict_iteration(g, a100, None, TimeOptions(n_devices=8))
    assert p8.communication_s > 0 and p8.samples_per_s > 7 * pa.samples_per_s
    ga, _, _ = predict_iteration(g, a100, None, TimeOptions(gradient_accumulation=4))
    assert ga.samples_per_s > pa.samples_per_s
    assert ga.iteration_s < 4 * pa.iteration_s


# --------------------------------------------------------------------------- CLI
SPACE = {
    "space": "accelerators",
    "models": [{"name": "gpt2-tiny"}],
    "accelerators": ["a100-40gb", "h100-sxm", "bow-ipu"],
    "devices": [1, 2],
    "batch_sizes": [1, 4, 16, 64],
    "precision": "fp32",
}


def _run(tmp_path: Path, space: dict, *extra: str) -> tuple[int, str]:
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(space))
    res = CliRunner().invoke(app, ["search", str(p), "--out", str(tmp_path / "out"), "--workers", "0", *extra])
    return res.exit_code, res.output


def test_fp32_on_a_chip_without_an_fp32_peak_is_refused(tmp_path):
    """The SN30 lists a bf16 peak only: fp32 GEMMs would be priced at it (15x the A100's fp32)."""
    code, out = _run(tmp_path, {**SPACE, "accelerators": ["a100-40gb", "sn30"]})
    text = " ".join(out.split())
    assert code == 2 and "accelerators[1]: sn30 has no fp32 peak" in text and "precision: bf16" in text, out


def test_search_writes_table_json_and_self_contained_html(tmp_path):
    code, out = _run(tmp_path, SPACE)
    assert code == 0, out
    payload = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = payload["rows"]
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
    base = [r for r in rows if r["accelerator"] == "a100-40gb"]
    assert all(r["normalised_throughput"] == pytest.approx(1.0) for r in base)
    assert {r["rank"] for r in rows if r["devices"] == 1} == {1, 2, 3}
    assert all(r["batch_size"] in SPACE["batch_sizes"] and "memory" in r and r["methods"] for r in rows)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<svg" in html and "<script" not in html and "src=\"http" not in html
    assert "How each number was produced" in html
    assert "gpt2-tiny x 1 device" in out
    # resume: nothing re-evaluated
    code, out = _run(tmp_path, SPACE, "--resume")
    assert code == 0 and "0 new, 6 from the study" in out


def test_unknown_accelerator_lists_valid_names(tmp_path):
    code, out = _run(tmp_path, {**SPACE, "accelerators": ["a100-40gb", "tpu-v9"]})
    assert code == 2
    assert "accelerators[1]" in out and "tpu-v9" in out and "h100-sxm" in out and "Traceback" not in out
    assert not (tmp_path / "out" / "results.json").exists()


def test_module_that_does_not_import_is_one_line(tmp_path):
    code, out = _run(tmp_path, {**SPACE, "models": [{"name": "no_such_pkg.models:make", "input_shape": [8]}]})
    assert code == 2 and "cannot import 'no_such_pkg.models'" in out and "Traceback" not in out
    with pytest.raises(ModelImportError, match="unknown model"):
        get_model_spec("gpt5")


def test_user_module_and_infeasible_device(tmp_path, monkeypatch):
    (tmp_path / "usermodels.py").write_text(
        "import torch.nn as nn\n\ndef make():\n    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))\n")
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({"tiny-gpu": {
        **{k: v for k, v in get_platform("a100-40gb").model_dump(mode="json").items() if k not in ("key", "sources")},
        "memory": [{"name": "hbm", "capacity_bytes": 1024, "bandwidth_bytes_per_s": 1e12, "on_chip": False}]}}))
    monkeypatch.chdir(tmp_path)
    space = {**SPACE, "models": [{"name": "usermodels:make", "input_shape": [8]}], "accelerators": ["a100-40gb",
             "tiny-gpu"], "catalog": str(tmp_path / "tiny.yaml"), "devices": [1]}
    code, out = _run(tmp_path, space)
    assert code == 0, out
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    by = {r["accelerator"]: r for r in rows}
    assert by["a100-40gb"]["status"] == "ok"
    assert by["tiny-gpu"]["status"] == "infeasible" and "does not fit" in by["tiny-gpu"]["reason"]
    assert os.path.exists(tmp_path / "out" / "report.html")
