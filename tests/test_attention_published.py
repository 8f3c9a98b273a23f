"""Fused attention implementations timed at their published speeds (predictor/timing/kernels/attention.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from predictor.simulate import simulate
from predictor.sources.synth.transformer import (
    ParallelPlan,
    PlanError,
    TransformerSpec,
    build_transformer_graph,
    check_plan,
    transformer_timing,
)
from predictor.sources.synth.transformer_memory import memory_per_stage
from predictor.timing.kernels import AnalyticGemm, TaskView
from predictor.timing.kernels.attention import FWD_BWD, SEQS, attention_kind, published_tflops
from predictor.timing.platforms import get_platform

DATA = Path(__file__).resolve().parents[1] / "experiments" / "multinode_published.yaml"
SPEC = TransformerSpec(layers=2, hidden=1024, heads=8, seq=2048, vocab=4096)  # head dim 128
PLAN = ParallelPlan(micro_batch=2, global_batch=2)


def test_figure_bars_are_returned_at_their_settings():
    # FlashAttention-2 paper, A100, causal, head dim 128, seqlen 2k: Triton 68, FlashAttention-2 155 TFLOP/s
    assert published_tflops("a100", "flash_triton", True, 128, 2048, backward=False) == 68
    assert published_tflops("a100", "flash2", True, 128, 2048, backward=True) == 155
    # H100 FlashAttention-2: the forward alone is published (FlashAttention-3 paper, 298 at 2k, causal, d 128)
    assert published_tflops("h100", "flash2", True, 128, 2048, backward=False) == 298


def test_h100_backward_rate_reproduces_the_published_forward_plus_backward():
    for seq in SEQS:
        fwd = published_tflops("h100", "flash2", True, 128, seq, backward=False)
        bwd = published_tflops("h100", "flash2", True, 128, seq, backward=True)
        both = FWD_BWD[("h100", "flash2", True, 128)][SEQS.index(seq)]
        assert 3.5 / (1 / fwd + 2.5 / bwd) == pytest.approx(both)


def test_rates_interpolate_in_log_seqlen_and_head_dim_and_hold_at_the_ends():
    mid = published_tflops("a100", "flash2", True, 128, 2 ** 10.5, backward=False)
    assert mid == pytest.approx((133 + 155) / 2)
    d96 = published_tflops("a100", "flash_triton", True, 96, 2048, backward=False)
    assert d96 == pytest.approx((79 + 68) / 2)
    assert published_tflops("a100", "flash2", True, 128, 128, backward=False) == 99
    assert published_tflops("a100", "flash2", True, 256, 65536, backward=False) == 189
    # bars hidden under the figure's legend are skipped, not read as zero
    assert published_tflops("a100", "flash2", False, 128, 512, backward=False) == 187


def _attn_task(platform_key: str, kind: str, dtype_bytes: float = 2.0) -> float:
    b, s, h, d = 2, 2048, 8, 128
    flops = 4.0 * b * s * s * h * d * 0.5 * (2.5 if kind.endswith("_bwd") else 1.0)
    view = TaskView.single(kind, m=s, n=s, k=d, batch=b * h, dtype_bytes=dtype_bytes, flops=flops,
                           bytes=4.0 * b * s * h * d * 2)
    return float(AnalyticGemm().predict(view, get_platform(platform_key))[0]), flops


def test_cudnn_passes_are_published_apart_and_the_causal_backward_scales_as_the_forward():
    # FlashAttention-3 paper, H100, cuDNN bars, head dim 128, seqlen 4k: forward 609 (no mask) / 518 (causal),
    # backward 499 (no mask); causal backward = 499 x 518 / 609
    assert published_tflops("h100", "cudnn", False, 128, 4096, backward=False) == 609
    assert published_tflops("h100", "cudnn", True, 128, 4096, backward=False) == 518
    assert published_tflops("h100", "cudnn", False, 128, 4096, backward=True) == 499
    assert published_tflops("h100", "cudnn", True, 128, 4096, backward=True) == pytest.approx(499 * 518 / 609)
    # cuDNN runs faster than FlashAttention-2 at every length of the figures, both passes
    for seq in SEQS:
        for bwd in (False, True):
            assert published_tflops("h100", "cudnn", True, 64, seq, bwd) > published_tflops("h100", "flash2", True,
                                                                                             64, seq, bwd)
    # no cuDNN figure for the A100: its kernel is GEMM-priced there
    assert _attn_task("a100-80gb", attention_kind("cudnn", False))[0] == pytest.approx(_attn_task("a100-80gb", "bmm")[0])
    assert _attn_task("h100-sxm", attention_kind("cudnn", False))[0] != pytest.approx(_attn_task("h100-sxm", "bmm")[0])


def test_te_runs_cudnn_on_hopper_and_flashattention2_on_the_a100():
    for bwd in (False, True):
        te = attention_kind("te", bwd)
        assert _attn_task("h100-sxm", te)[0] == _attn_task("h100-sxm", attention_kind("cudnn", bwd))[0]
        assert _attn_task("h200", te)[0] == _attn_task("h200", attention_kind("cudnn", bwd))[0]
        assert _attn_task("a100-80gb", te)[0] == _attn_task("a100-80gb", attention_kind("flash2", bwd))[0]
    assert _attn_task("mi300x", attention_kind("te", False))[0] == pytest.approx(_attn_task("mi300x", "bmm")[0])


def test_flex_attention_runs_at_the_published_share_of_flashattention2():
    # PyTorch blog (2024-08-07): FlexAttention at 90 % of FlashAttention-2 forward, 85 % backward
    for chip in ("a100", "h100"):
        for bwd, share in ((False, 0.90), (True, 0.85)):
            assert published_tflops(chip, "flex", True, 128, 4096, backward=bwd) == pytest.approx(
                share * published_tflops(chip, "flash2", True, 128, 4096, backward=bwd))
    assert _attn_task("h200", attention_kind("flex", True))[0] > _attn_task("h200", attention_kind("flash2", True))[0]
    assert _attn_task("mi300x", attention_kind("flex", False))[0] == pytest.approx(_attn_task("mi300x", "bmm")[0])
    assert _iteration("flash2") < _iteration("flex") < _iteration("flash_triton")


def test_attention_masked_per_document_spans_the_document():
    # torchtitan's block-causal attention over packed documents: seq / doc_len kernels' worth of doc_len-long
    # attention, doc_len / seq of the FLOPs, each at the published rate of doc_len tokens
    spec = TransformerSpec(layers=2, hidden=1024, heads=8, seq=8192, vocab=4096, attention="flash2")
    plan = ParallelPlan(micro_batch=1, global_batch=1)

    def attention(doc_len):
        g = build_transformer_graph(replace(spec, doc_len=doc_len), plan, detail="kernel")
        df = g.tasks_frame()
        fwd = df[df.kind == "attn_flash2"]
        return float(fwd.flops.sum()), fwd.iloc[0]

    full, whole = attention(None)
    quarter, doc = attention(2048)
    assert quarter == pytest.approx(full / 4)
    assert (doc.m, doc.n, doc.batch) == (2048, 2048, whole.batch * 4)
    assert attention(8192)[0] == full  # one document the length of the sequence: no change
    timing = transformer_timing(get_platform("a100-80gb"))
    t_full, t_doc = (simulate(build_transformer_graph(replace(spec, doc_len=x), plan, timing=timing), timing).iteration_s
                     for x in (None, 2048))
    assert t_doc < t_full
    with pytest.raises(PlanError, match="doc_len"):
        replace(spec, doc_len=9000).validate()
    with pytest.raises(PlanError, match="context parallelism"):
        check_plan(replace(spec, doc_len=2048), ParallelPlan(cp=2, micro_batch=1, global_batch=1))


def test_kernel_time_is_flops_over_the_published_rate():
    plat = get_platform("a100-80gb")
    t, flops = _attn_task("a100-80gb", attention_kind("flash_triton", False))
    assert t == pytest.approx(flops / 68e12 + plat.kernel_floor_s)
    t_bwd, flops_bwd = _attn_task("h100-sxm", attention_kind("flash2", True))
    rate = published_tflops("h100", "flash2", True, 128, 2048, backward=True)
    assert t_bwd == pytest.approx(flops_bwd / (rate * 1e12) + get_platform("h100-sxm").kernel_floor_s)
    # the H200 is timed with the H100's figures (same die)
    assert _attn_task("h200", attention_kind("flash2", True))[0] == pytest.approx(t_bwd, rel=0.05)


def test_platforms_without_figures_and_fp32_fall_back_to_the_gemm_path():
    gemm_priced = _attn_task("mi300x", "bmm")[0]
    assert _attn_task("mi300x", attention_kind("flash_triton", False))[0] == pytest.approx(gemm_priced)
    fp32_gemm = _attn_task("a100-80gb", "bmm", dtype_bytes=4.0)[0]
    assert _attn_task("a100-80gb", attention_kind("flash2", False), dtype_bytes=4.0)[0] == pytest.approx(fp32_gemm)


def _iteration(attention: str, key: str = "a100-80gb") -> float:
    spec = TransformerSpec(**{**SPEC.to_dict(), "attention": attention, "moe": None})
    timing = transformer_timing(get_platform(key))
    return simulate(build_transformer_graph(spec, PLAN, detail="kernel", timing=timing), timing).iteration_s


def test_implementations_order_an_iteration_as_their_published_speeds():
    # A100 ceiling x peak > FlashAttention-2's 155 > Triton's 68 TFLOP/s at this shape
    flash, flash2, triton = (_iteration(a) for a in ("flash", "flash2", "flash_triton"))
    assert flash < flash2 < triton


def test_fused_implementations_share_flash_attentions_memory_and_kernels():
    mem = {a: memory_per_stage(TransformerSpec(**{**SPEC.to_dict(), "attention": a, "moe": None}), PLAN)[0].total_bytes
           for a in ("flash", "flash2", "flash_triton", "unfused")}
    assert mem["flash"] == mem["flash2"] == mem["flash_triton"] < mem["unfused"]
    g = build_transformer_graph(TransformerSpec(**{**SPEC.to_dict(), "attention": "flash2", "moe": None}), PLAN,
                                detail="kernel")
    kinds = np.asarray(g.kinds, dtype=object)[g.kind]
    assert (kinds == "attn_flash2").sum() == (kinds == "attn_flash2_bwd").sum() == SPEC.layers


def test_unknown_attention_is_one_plan_error():
    with pytest.raises(PlanError, match="attention must be one of"):
        TransformerSpec(**{**SPEC.to_dict(), "attention": "flash3", "moe": None}).validate()


def test_mosaicml_sources_ran_llm_foundrys_triton_attention():
    # the 2023 tables ran attn_impl triton throughout; the large-scale H100 table names it per model (its sweep.py)
    doc = yaml.safe_load(DATA.read_text())["sources"]
    for key, src in doc.items():
        if key.startswith("mosaic") and key != "mosaic_h100_large":
            assert src["defaults"]["attention"] == "flash_triton", key
