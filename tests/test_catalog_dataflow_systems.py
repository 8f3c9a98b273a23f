"""Catalog entries of the systems Centimani measured and of Gaudi 2's kernel efficiency."""

from __future__ import annotations

import pytest

from predictor.sources.synth.models import MPT_SIZES
from predictor.sources.synth.transformer_spec import ParallelPlan, TransformerSpec
from predictor.timing.platforms import get_platform
from tuner.plans import predict_plan


def test_bow_pod16_is_sixteen_bow_ipus():
    chip, pod = get_platform("bow-ipu"), get_platform("bow-pod16")
    assert pod.devices_per_node == 16 and chip.devices_per_node == 4
    for field in ("kind", "peak_flops", "memory", "memory_policy", "overheads", "price_per_device_hour_usd",
                  "gemm_efficiency_max"):
        assert getattr(pod, field) == getattr(chip, field), field
    assert "Centimani" in pod.sources["devices_per_node"]


def test_gaudi2_peak_and_fitted_gemm_ceiling_are_sourced():
    p = get_platform("gaudi2")
    assert p.flops_for("bf16") == pytest.approx(432e12)
    assert "Intel" in p.sources["peak_flops.bf16"]
    assert "fitted" in p.sources["gemm_efficiency_max"] and "Databricks" in p.sources["gemm_efficiency_max"]


def _mpt7b_tokens_per_s(key: str) -> tuple[float, float]:
    """(tokens/s/device, MFU) of MPT-7B on 8 ``key`` devices, FSDP, micro-batch 6, GA 2 (Megatron/FSDP path)."""
    d, n_layer, heads = MPT_SIZES["7b"]
    spec = TransformerSpec(layers=n_layer, hidden=d, heads=heads, seq=2048, vocab=50368, dtype="bf16", attention="flash")
    plan = ParallelPlan(tp=1, pp=1, dp=8, global_batch=96, micro_batch=6, recompute="none", fsdp=True,
                        overlap_grad_reduce=True, grad_reduce_dtype="fp32")
    plat = get_platform(key)
    res, _ = predict_plan(spec, plan, plat, devices=8)
    tps = 96 * 2048 / res["predicted_iteration_s"] / 8
    n_params = 12 * n_layer * d * d + 50368 * d  # within 1 % of the traced MPT-7B
    return tps, tps * 3.0 * (2.0 * n_params + 4.0 * n_layer * 2048 * d) / plat.flops_for("bf16")


def test_gaudi2_mpt7b_mfu_near_the_published_run():
    """MPT-7B on 8 Gaudi 2 at the published ~60 % MFU, not the 85-90 % of a GEMM ceiling taken from a 1k
    microbenchmark; the H200 1.32-1.40x the MI300X on the same run."""
    _, mfu = _mpt7b_tokens_per_s("gaudi2")
    assert 0.55 < mfu < 0.66
    h200, _ = _mpt7b_tokens_per_s("h200")
    mi300x, _ = _mpt7b_tokens_per_s("mi300x")
    assert 1.28 < h200 / mi300x < 1.44


def test_mi300x_ceiling_is_fitted_to_a_published_training_ratio():
    p = get_platform("mi300x")
    assert 0.2 < p.gemm_efficiency_max < 0.5  # below the hipBLASLt microbenchmark's ~0.5, which tied it with the H200
    assert "fitted" in p.sources["gemm_efficiency_max"] and "1.32-1.40" in p.sources["gemm_efficiency_max"]
