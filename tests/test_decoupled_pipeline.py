"""Dataflow systems as pipelines (Bow Pod16, SN30-8, CS-2 workers): the model split over chips so its
weights stay in SRAM, one micro-batch simulated and composed into the pipeline's iteration."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.sources.synth.decoupled import (
    TimeOptions,
    pipeline_iteration,
    pipeline_platform,
    pipeline_stages_for,
    predict_iteration,
    stage_split,
)
from predictor.sources.synth.models import get_model_spec
from predictor.sources.synth.op_trace import trace_scalable
from predictor.timing.platforms import get_platform
from tuner.search.accelerators import AcceleratorSpace, build_context, evaluate_unit


@pytest.fixture(scope="module")
def tiny_gpt():
    spec = get_model_spec("gpt2-tiny")
    return trace_scalable(spec.build, spec.make_batch, spec.loss, precision="bf16", optimizer="adamw")


def _sram(key: str, on_chip_bytes: float):
    """``key`` with its on-chip level cut to ``on_chip_bytes``."""
    p = get_platform(key)
    mem = [m.model_copy(update={"capacity_bytes": on_chip_bytes}) if m.on_chip else m for m in p.memory]
    return p.model_copy(update={"memory": mem})


def test_stage_split_minimises_the_slowest_group():
    t = np.ones(12)
    assert stage_split(t, 4).tolist() == [3.0, 3.0, 3.0, 3.0]
    lumpy = np.asarray([5.0, 1, 1, 1, 1, 1])
    g = stage_split(lumpy, 2)
    assert g.max() == 5.0 and g.sum() == pytest.approx(10.0)
    assert stage_split(np.asarray([1.0, 1.0]), 4).tolist() == [1.0, 1.0, 0.0, 0.0]  # fewer ops than chips


def test_stages_fit_weights_in_sram_up_to_the_system():
    pod = get_platform("bow-pod16")
    per_chip = pod.on_chip_bytes * 0.95
    assert pipeline_stages_for(pod, 0.5 * per_chip) == 1
    assert pipeline_stages_for(pod, 3.0 * per_chip) == 4
    assert pipeline_stages_for(pod, 100.0 * per_chip) == pod.devices_per_node  # the whole Pod16
    assert pipeline_stages_for(get_platform("a100-40gb"), 1e12) == 1  # GPUs are not split
    agg = pipeline_platform(pod, 4)
    assert agg.on_chip_bytes == pytest.approx(4 * pod.on_chip_bytes)
    assert agg.memory_policy == "weights_on_chip" and agg.memory_bandwidth == pod.memory_bandwidth
    assert pipeline_platform(pod, 4, pin_weights=False).memory_policy == pod.memory_policy


def test_pipeline_fills_with_micro_batches(tiny_gpt):
    g = tiny_gpt.at(8)
    chip = pipeline_platform(get_platform("bow-pod16"), 4)
    one = TimeOptions()
    pred, graph, tl = predict_iteration(g, chip, None, one)
    single = pipeline_iteration(g, chip, graph, tl, pred, TimeOptions(gradient_accumulation=1), 4)
    full = pipeline_iteration(g, chip, graph, tl, pred, TimeOptions(gradient_accumulation=64), 4)
    assert single.pipeline_stages == full.pipeline_stages == 4
    # one micro-batch visits the stages one after another: its forward and backward take as long as on
    # one chip; only the optimizer, each chip updating its quarter of the parameters, runs 4x faster
    opt = pred.time_by_kind["optimizer"]
    assert single.iteration_s - opt / 4 >= 0.95 * (pred.iteration_s - opt)
    # 64 micro-batches keep the 4 chips busy: per chip close to one chip running the whole model
    alone, _, _ = predict_iteration(g, chip, None, TimeOptions(gradient_accumulation=64))
    per_chip = full.samples_per_s / 4
    assert 0.5 * alone.samples_per_s < per_chip <= 1.1 * alone.samples_per_s
    assert "pipeline" in full.methods
    assert pipeline_iteration(g, chip, graph, tl, pred, one, 1) is pred


def test_accelerator_unit_pipelines_a_model_too_big_for_one_chip(tiny_gpt):
    space = AcceleratorSpace(space="accelerators", models=[{"name": "gpt2-tiny"}], accelerators=["bow-pod16"],
                             precision="bf16", batch_sizes=[1, 2, 4, 8], batch_policy="best_throughput",
                             gradient_accumulation=32)
    ctx = build_context(space)
    info = ctx.info("gpt2-tiny", tiny_gpt.n_params)
    weights = float(tiny_gpt.lo.nbytes[tiny_gpt.lo.baseline].sum())
    small = _sram("bow-pod16", 0.3 * weights)  # weights + gradients need several chips
    row = evaluate_unit(space, small, info, tiny_gpt, 1)
    assert row["status"] == "ok" and row["pipeline_stages"] >= 2
    assert row["chips"] == row["pipeline_stages"]
    assert row["usd_per_hour"] == pytest.approx(small.price_per_device_hour_usd * row["chips"])
    assert row["samples_per_s_per_chip"] == pytest.approx(row["samples_per_s"] / row["chips"])
    off = evaluate_unit(space.model_copy(update={"dataflow_pipeline": False}), small, info, tiny_gpt, 1)
    assert off["pipeline_stages"] == 1
    gpu = evaluate_unit(space, get_platform("a100-40gb"), info, tiny_gpt, 1)
    assert gpu["pipeline_stages"] == 1 and gpu["chips"] == 1
