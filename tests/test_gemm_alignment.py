"""Tensor-core alignment in the analytic GEMM model, and the vocabulary an eager program keeps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from predictor.sources.synth.transformer_spec import ParallelPlan, TransformerSpec
from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.gemm import AnalyticGemm, GemmParams
from predictor.timing.platforms import get_platform
from tuner.plans import predict_plan

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "results" / "multinode_validation.json"


def _seconds(platform: str, m: float, n: float, k: float, dtype_bytes: float = 2.0, kind: str = "addmm",
             params: GemmParams | None = None) -> float:
    cols = {"m": np.array([m]), "n": np.array([n]), "k": np.array([k]), "batch": np.array([1.0]),
            "dtype_bytes": np.array([dtype_bytes]), "flops": np.array([np.nan]), "bytes": np.array([np.nan])}
    return float(AnalyticGemm(params).predict(TaskView(cols, 1, kind), get_platform(platform))[0])


def test_an_unaligned_n_or_k_runs_at_the_unaligned_ceiling_and_m_does_not_matter():
    aligned = _seconds("h100-sxm", 12288, 50304, 768)
    assert _seconds("h100-sxm", 12288, 50257, 768) > 3 * aligned  # GPT-2's vocabulary as the output width
    assert _seconds("h100-sxm", 12288, 768, 50257) > 3 * _seconds("h100-sxm", 12288, 768, 50304)  # as the reduction
    assert _seconds("h100-sxm", 50257, 768, 12288) == pytest.approx(_seconds("h100-sxm", 50304, 768, 12288), rel=0.01)
    ratio = _seconds("h100-sxm", 12288, 50257, 768) / aligned
    plat = get_platform("h100-sxm")
    assert ratio == pytest.approx(plat.gemm_efficiency_max / GemmParams().unaligned_efficiency, rel=0.05)


def test_a_weight_gradient_reducing_over_an_odd_token_count_stays_aligned():
    """grad.t() @ x reduces over the tokens, along which neither operand is contiguous: an odd token count (an MoE
    expert's mean share, 1025.02 tokens) keeps the aligned rate, and an MoE plan's step moves smoothly with it."""
    from dataclasses import replace

    from predictor.sources.synth.transformer_spec import MoESpec

    cols = {"m": np.array([1536.0] * 2), "n": np.array([4096.0] * 2), "k": np.array([1025.02] * 2),
            "batch": np.array([1.0] * 2), "dtype_bytes": np.array([2.0] * 2), "flops": np.array([np.nan] * 2),
            "bytes": np.array([np.nan] * 2), "k_strided": np.array([1.0, np.nan])}
    strided, contiguous = AnalyticGemm().predict(TaskView(cols, 2, "mm"), get_platform("h100-sxm"))
    assert contiguous > 2 * strided
    assert strided == pytest.approx(_seconds("h100-sxm", 1536, 4096, 1032, kind="mm"), rel=0.02)
    spec = TransformerSpec(layers=4, hidden=1024, heads=8, seq=1024, vocab=32000, mlp="swiglu",
                           moe=MoESpec(experts=16, top_k=2, ffn=512))
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=8)
    h100 = get_platform("h100-sxm")
    t = [predict_plan(replace(spec, moe=replace(spec.moe, capacity_factor=c)), plan, h100)[0]["predicted_iteration_s"]
         for c in (1.0, 1.001, 1.01)]
    assert t[0] <= t[1] <= t[2] < 1.01 * t[0]


def test_fused_attention_priced_as_a_gemm_has_no_alignment_cliff():
    """attention: flash (FlashAttention at the GEMM rate) pads its own tiles: a 2047-token sequence costs what 2048
    tokens do per token (it cost 3.9x on the attention kernels when priced as an unaligned bmm)."""
    from dataclasses import replace

    spec = TransformerSpec(layers=2, hidden=2048, heads=16, seq=2048, vocab=32000, mlp="swiglu", ffn=5632)
    plan = ParallelPlan(tp=2, pp=1, dp=4, micro_batch=2, global_batch=8, sequence_parallel=True)
    h100 = get_platform("h100-sxm")
    per_token = [predict_plan(replace(spec, seq=s), plan, h100)[0]["predicted_iteration_s"] / s for s in (2047, 2048)]
    assert per_token[0] == pytest.approx(per_token[1], rel=0.01)


def test_only_tensor_core_gemms_on_nvidia_gpus_pay_for_alignment():
    # fp32 without TF32 runs on the CUDA cores; with TF32 it needs 4-element alignment
    assert _seconds("h100-sxm", 4096, 4099, 4096, 4.0) == pytest.approx(_seconds("h100-sxm", 4096, 4100, 4096, 4.0),
                                                                         rel=0.01)
    tf32 = GemmParams(allow_tf32=True)
    assert _seconds("h100-sxm", 4096, 4099, 4096, 4.0, params=tf32) > 2 * _seconds("h100-sxm", 4096, 4100, 4096, 4.0,
                                                                                 params=tf32)
    for other in ("mi300x", "cpu-local"):  # no measurements of other vendors' or CPUs' alignment cliffs
        assert _seconds(other, 4096, 4099, 4096) == pytest.approx(_seconds(other, 4096, 4104, 4096), rel=0.01)


def test_an_eager_program_keeps_gpt2s_vocabulary_and_padding_it_pays():
    """nanoGPT pads GPT-2's 50,257 tokens to 50,304 "for efficiency" (its train.py); Megatron pads by itself."""
    plan = ParallelPlan(dp=8, micro_batch=12, global_batch=8 * 12 * 4)
    steps = {}
    for program in ("eager", "megatron"):
        for vocab in (50257, 50304):
            spec = TransformerSpec(name="gpt2", layers=12, hidden=768, heads=12, seq=1024, vocab=vocab,
                                   attention="flash2", program=program, dropout=0.0)
            steps[program, vocab] = predict_plan(spec, plan, get_platform("a100-40gb"), devices=8)[0][
                "predicted_iteration_s"]
    assert TransformerSpec(layers=1, hidden=64, heads=1, seq=8, vocab=50257, program="eager").padded_vocab(2) == 50258
    assert steps["eager", 50257] > 1.1 * steps["eager", 50304]
    assert steps["megatron", 50257] == steps["megatron", 50304]


def test_the_model_carries_the_measured_unaligned_ceiling():
    """``unaligned_efficiency`` is the fit the validation script records on the H100 pack."""
    fitted = json.loads(RESULTS.read_text())["gemm_alignment"]["unaligned_ceiling"]
    assert GemmParams().unaligned_efficiency == pytest.approx(fitted, abs=5e-4)
