"""Section 3e of ``experiments/centimani_tables.py``: predicted vs published MFU of LLM training, and the
GEMM ceilings fitted on published runs (Gaudi 2, MI300X, TPU v5p, Bow IPU), one constant on one run each, and
the ceiling the one published CS-2 run found would give (reported, not in the catalog).

Not run alone: ``python experiments/centimani_tables.py`` calls :func:`mfu_validation` and renders it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import golden_section  # noqa: E402
from predictor.sources.synth.decoupled import TimeOptions, predict_iteration  # noqa: E402
from predictor.sources.synth.models import MPT_SIZES, Bert, BertConfig, ModelSpec, mpt_spec  # noqa: E402
from predictor.sources.synth.op_trace import trace_training_step  # noqa: E402
from predictor.sources.synth.transformer_spec import ParallelPlan, TransformerSpec  # noqa: E402
from predictor.timing.platforms import get_platform  # noqa: E402
from predictor.timing.platforms.schema import Platform  # noqa: E402
from tuner.plans import predict_plan  # noqa: E402
from tuner.search.accelerators import AcceleratorSpace, build_context, evaluate_unit, trace_model  # noqa: E402

#: traced MPT steps by (size, micro-batch), shared with the MosaicML validation of centimani_tables
MPT_TRACES: dict[tuple[str, int], object] = {}


def log(msg: str) -> None:
    """One progress line, timestamped as centimani_tables' own."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------- 3e: MFU against published runs
#: published bf16 training of an MPT-7B-style GPT (seq 2048, FSDP, 8 devices): (MFU %, tokens/s/device
#: derived with llm-foundry's FLOPs per token, where, config). MFU = model FLOPs / the chip's dense bf16 peak.
PUBLISHED_MFU = {
    "a100-80gb": (64.23, "MosaicML llm-foundry benchmark table (MPT-7B, 8 GPUs, micro-batch 6, GA 2)"),
    "h100-sxm": (46.44, "MosaicML llm-foundry benchmark table (MPT-7B, 8 GPUs, micro-batch 6, GA 1)"),
    "gaudi2": (100.0 * 260.0 / 432.0, "Databricks, 'LLM Training and Inference with Intel Gaudi 2 AI Accelerators' "
               "(2024-01): over 260 TFLOP/s per device, MPT-7B on 8 Gaudi 2, BF16, SynapseAI 1.12; / 432 TFLOPS "
               "(Intel's Gaudi 2 BF16 peak); micro-batch not given, taken as the A100 run's 6, GA 2"),
    "mi300x": (None, "no published BF16 MFU found; one GPU, 8B model, BF16: H200 1.32-1.40x the MI300X's training "
               "throughput (github.com/alpharomercoma/MI300X-vs-H200, REPORT.md summary)"),
    "h200": (None, "no published MPT-7B run; GEMM ceiling = h100-sxm's (same GH100 die)"),
    "tpu-v5p": (None, "no published MPT-7B run; GEMM ceiling fitted on MaxText's 64B (below)"),
}
MFU_DEVICES = ("a100-80gb", "h100-sxm", "gaudi2", "mi300x", "h200", "tpu-v5p")
#: llm-foundry's attention on the MosaicML runs (submit_benchmarks.py --attn_impl default 'triton'): published
#: Triton FlashAttention speeds on A100 / H100 / H200, the GEMM path on chips without figures
MPT_ATTENTION = "flash_triton"
#: the H200 / MI300X benchmark trains through PyTorch SDPA, whose CUDA backend is FlashAttention-2
RATIO_ATTENTION = "flash2"
#: MaxText README (AI-Hypercomputer/maxtext, "Runtime Performance Results", TPU v5p table): the 64B model on a
#: v5p-128 slice (64 chips) at 3.23e+02 TFLOP/s per chip, 70.31 % MFU; MaxText/configs/v5p/64b.sh:
#: global_parameter_scale 64 (base.yml x 4: emb 8192, 64 heads x 128, SwiGLU mlp 28672, 64 layers, vocab
#: 32000), per_device_batch_size 3, ici_tensor_parallelism 4, ici_fsdp_parallelism -1 (16), remat minimal,
#: flash attention, seq 2048. (MFU %, TFLOP/s per chip, where)
MAXTEXT_V5P = (70.31, 323.0, "MaxText README, TPU v5p table: 64B on v5p-128 (64 chips), 3.23e+02 TFLOP/s/chip, "
               "70.31 % MFU (configs/v5p/64b.sh: TP 4 x FSDP 16, 3 sequences per chip, remat minimal, seq 2048)")
#: published single-GPU bf16 training of an 8B model: the H200 runs 1.32-1.40x the MI300X
#: (github.com/alpharomercoma/MI300X-vs-H200, REPORT.md summary); the MI300X ceiling is fitted to the midpoint
H200_OVER_MI300X = (1.32, 1.40)
#: Graphcore's published training throughput (graphcore.ai/performance-results, "Bow Platform - Training"
#: table): ResNet-50 v1.5 on a Bow Pod16 (16 Bow IPUs), pre-SDK 2.5, TensorFlow1, ImageNet2012, global batch
#: 1,920, FP16.16: 42,029 images/s. (images/s, IPUs, global batch, where)
GRAPHCORE_RESNET50_POD16 = (42029.0, 16, 1920, "Graphcore performance results, Bow Platform - Training: ResNet-50 "
                            "v1.5 on a Bow Pod16, pre-SDK 2.5, TensorFlow1, global batch 1,920, FP16.16, "
                            "42,029 images/s")
#: Graphcore's same table, held out from the fit: BERT-Large phase-1 pretraining (SL128) on a Bow Pod16, pre-SDK
#: 2.5, PopART, global batch 65,536, FP16.16: 5,179 sequences/s. (sequences/s, IPUs, where)
GRAPHCORE_BERT_POD16 = (5179.0, 16, "Graphcore performance results, Bow Platform - Training: BERT-Large phase 1 (SL128) "
                        "on a Bow Pod16, pre-SDK 2.5, PopART, global batch 65,536, FP16.16, 5,179 sequences/s")
#: BERT-large phase 1 (seq 128, global batch 1,024) on one CS-2, Cerebras R2.0.3 (weight streaming), in the ALCF
#: AI Testbed's "BERT-Large on Cerebras" example output (Argonne, run of 2024-03-14): "Processed 1024000 sample(s)
#: in 1025.603128781 seconds" (steady rate 1,100-1,390 samples/s). (samples, seconds, workers per CS-2, where)
CS2_BERT_LARGE = (1024000.0, 1025.603128781, 8, "ALCF AI Testbed example 'BERT-Large on Cerebras' (Cerebras R2.0.3, "
                  "1 CS-2, BERT-large MSL 128, batch 1,024, weight streaming): 1,024,000 samples in 1,025.6 s = "
                  "998 samples/s per CS-2")
#: micro-batches per step of the dataflow fits: the accelerator search's middle configuration (best-throughput
#: batch, 16 micro-batches); the published steps (1,920 over 16 IPUs; 1,024 on one CS-2) are of the same order
SEARCH_FIT_GA = 16


def foundry_flops_per_token(size: str, n_params: int, seq: int = 2048) -> float:
    """llm-foundry's MPT model FLOPs per token: 3 x (2 N + 4 L s d) (forward + backward, attention included)."""
    d, n_layer, _ = MPT_SIZES[size]
    return 3.0 * (2.0 * n_params + 4.0 * n_layer * seq * d)


def mpt7b_tokens_per_s(plat: Platform, path: str = "megatron", attention: str = MPT_ATTENTION) -> tuple[float, float]:
    """(predicted tokens/s/device, MFU %) of MPT-7B on 8 ``plat`` devices, FSDP, micro-batch 6, GA 2: through
    the Megatron/FSDP synthesiser that rent and parallel searches use (``megatron``, with ``attention``), or
    through the traced model and the decoupled model of the accelerator search (``decoupled``)."""
    spec = mpt_spec("7b")
    g = MPT_TRACES.get(("7b", 6)) or trace_training_step(spec.build, spec.make_batch, spec.loss, 6,
                                                          precision="amp_bf16", optimizer="adamw")
    MPT_TRACES[("7b", 6)] = g
    if path == "decoupled":
        pred, _, _ = predict_iteration(g, plat, None, TimeOptions(n_devices=8, gradient_accumulation=2,
                                                                  dp_mode="fsdp"))
        tps = pred.samples_per_s * spec.tokens_per_sample / 8
    else:
        d, n_layer, heads = MPT_SIZES["7b"]
        ts = TransformerSpec(layers=n_layer, hidden=d, heads=heads, seq=2048, vocab=50368, name="MPT-7B",
                             dtype="bf16", attention=attention, dropout=0.0,  # llm-foundry's MPT: pdrop 0,
                             program="eager", fused_loss=True)  # plain PyTorch modules, flash-attn's loss
        plan = ParallelPlan(tp=1, pp=1, dp=8, global_batch=96, micro_batch=6, recompute="none", fsdp=True,
                            overlap_grad_reduce=True, grad_reduce_dtype="fp32")
        res, _ = predict_plan(ts, plan, plat, devices=8)
        tps = 96 * 2048 / res["predicted_iteration_s"] / 8
    return tps, 100.0 * tps * foundry_flops_per_token("7b", g.n_params) / plat.flops_for("bf16")


def mfu_validation() -> dict:
    """Predicted MFU of MPT-7B (both paths) next to the published one; the Gaudi 2 and MI300X GEMM ceilings
    refitted on the Megatron/FSDP path, the path the catalog's A100 and H100 ceilings are fitted on."""
    rows = []
    for key in MFU_DEVICES:
        plat = get_platform(key)
        tps, mfu = mpt7b_tokens_per_s(plat)
        dtps, dmfu = mpt7b_tokens_per_s(plat, "decoupled")
        pub, where = PUBLISHED_MFU.get(key, (None, ""))
        rows.append({"accelerator": key, "peak_bf16_flops": plat.flops_for("bf16"), "predicted_tokens_per_s": tps,
                     "predicted_mfu_pct": mfu, "decoupled_tokens_per_s": dtps, "decoupled_mfu_pct": dmfu,
                     "published_mfu_pct": pub, "source": where, "gemm_efficiency_max": plat.gemm_efficiency_max})
        log(f"MPT-7B on 8 {key}: MFU {mfu:.1f}% (decoupled {dmfu:.1f}%, published {pub})")
    g2 = get_platform("gaudi2")
    target = PUBLISHED_MFU["gaudi2"][0]

    def miss(eff: float) -> float:
        return abs(mpt7b_tokens_per_s(g2.model_copy(update={"gemm_efficiency_max": eff}))[1] - target)

    fit, n = golden_section(miss, 0.4, 0.99, 0.002)
    mi = get_platform("mi300x")
    h200_tps, ratio = mpt7b_tokens_per_s(get_platform("h200"), attention=RATIO_ATTENTION)[0], sum(H200_OVER_MI300X) / 2

    def mi_tps(eff: float) -> float:
        return mpt7b_tokens_per_s(mi.model_copy(update={"gemm_efficiency_max": eff}), attention=RATIO_ATTENTION)[0]

    fit_mi, n_mi = golden_section(lambda eff: abs(h200_tps / mi_tps(eff) - ratio), 0.15, 0.99, 0.002)
    return {"rows": rows, "gaudi2_fit": {"gemm_efficiency_max": fit, "evaluations": n, "target_mfu_pct": target,
                                         "catalog": g2.gemm_efficiency_max},
            "mi300x_fit": {"gemm_efficiency_max": fit_mi, "evaluations": n_mi, "target_h200_over_mi300x": ratio,
                           "catalog": mi.gemm_efficiency_max, "attention": RATIO_ATTENTION},
            "h200_over_mi300x": h200_tps / mi_tps(mi.gemm_efficiency_max), "tpu_v5p_fit": tpu_v5p_fit(),
            "dataflow_fits": dataflow_fits()}


def maxtext_64b_mfu(plat: Platform) -> tuple[float, float]:
    """(MFU %, memory GiB per chip) of MaxText's 64B model on 64 ``plat`` chips (v5p-128) through the Megatron
    synthesiser: TP 4 x DP 16 with the distributed optimizer standing in for MaxText's TP 4 x FSDP 16, 12
    sequences per TP group (3 per chip), selective recomputation for remat 'minimal', the SwiGLU MLP as one
    of 1.5 x 28672 (same FLOPs and parameters). MFU with MaxText's FLOP count (non-causal attention, as the
    README's 70.31 % = 323 / 459 counts). The memory check is lifted (x 4 capacity): the synthesiser's Megatron
    memory model does not describe XLA's buffers, only the time is used."""
    emb, mlp, layers, seq, vocab = 8192, 28672, 64, 2048, 32000
    spec = TransformerSpec(layers=layers, hidden=emb, heads=64, seq=seq, vocab=vocab, ffn=mlp * 3 // 2,
                           name="maxtext-64b", dtype="bf16", attention="flash", tie_embeddings=False,
                           dropout=0.0, bias=False, position="rope")  # MaxText: dropout_rate 0, no biases, RoPE
    plan = ParallelPlan(tp=4, pp=1, dp=16, global_batch=192, micro_batch=12, recompute="selective",
                        sequence_parallel=True, distributed_optimizer=True, overlap_grad_reduce=True)
    roomy = plat.model_copy(update={"memory": [m.model_copy(update={"capacity_bytes": 4 * m.capacity_bytes})
                                               for m in plat.memory]})
    res, _ = predict_plan(spec, plan, roomy, devices=64)
    flops_per_token = 3.0 * (layers * (6 * emb * mlp + 8 * emb * emb + 4 * seq * emb) + 2 * emb * vocab)
    tokens_per_chip_s = 192 * seq / res["predicted_iteration_s"] / 64
    return 100.0 * tokens_per_chip_s * flops_per_token / plat.flops_for("bf16"), res["memory_bytes_per_device"] / 2**30


def tpu_v5p_fit() -> dict:
    """TPU v5p's GEMM ceiling fitted (one constant, one run) so that MaxText's 64B on v5p-128 runs at the
    README's 70.31 % MFU; the catalog's value and its MFU beside the fit."""
    tpu = get_platform("tpu-v5p")
    target = MAXTEXT_V5P[0]
    fit, n = golden_section(lambda eff: abs(maxtext_64b_mfu(tpu.model_copy(update={"gemm_efficiency_max": eff}))[0]
                                            - target), 0.4, 0.99, 0.002)
    mfu, mem = maxtext_64b_mfu(tpu)
    return {"gemm_efficiency_max": fit, "evaluations": n, "target_mfu_pct": target, "source": MAXTEXT_V5P[2],
            "catalog": tpu.gemm_efficiency_max, "catalog_mfu_pct": mfu, "memory_gib_per_chip": mem}



def bert_large_seq128() -> ModelSpec:
    """BERT-large (24 layers, d 1024, 16 heads, MLM head) at sequence length 128, the accelerator search's
    ``bert-large`` at the phase-1 pretraining length of the published runs."""
    c = BertConfig(24, 1024, 16, 4096, seq=128)

    def batch(b: int) -> tuple[tuple[torch.Tensor], torch.Tensor]:
        idx = torch.randint(0, c.vocab, (b, c.seq))
        return (idx,), idx

    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))

    return ModelSpec("bert-large", lambda: Bert(c), batch, loss, "sequences", c.seq, "BERT-large, seq 128")


def search_unit(accelerator: str, model: str, spec: ModelSpec | None = None) -> Callable[[float], dict]:
    """A function from a GEMM ceiling to the accelerator search's row of ``model`` on one ``accelerator`` device
    (best-throughput batch and pipeline depth, ``SEARCH_FIT_GA`` micro-batches); ``spec`` replaces the built-in
    model of that name (another sequence length)."""
    space = AcceleratorSpace(space="accelerators", models=[{"name": model}], accelerators=[accelerator],
                             devices=[1], precision="bf16", optimizer="adamw", batch_policy="best_throughput",
                             batch_sizes=[2 ** i for i in range(11)], gradient_accumulation=SEARCH_FIT_GA)
    ctx = build_context(space)
    if spec is not None:
        ctx.specs[model] = spec
    tr = trace_model(ctx, model)
    info, plat = ctx.info(model, tr.n_params), ctx.platforms[accelerator]
    return lambda eff: evaluate_unit(space, plat.model_copy(update={"gemm_efficiency_max": eff}), info, tr, 1)


def search_fit(accelerator: str, model: str, target_per_chip: float, spec: ModelSpec | None = None) -> dict:
    """One GEMM ceiling fitted so that ``model`` on ``accelerator`` through the accelerator search runs at
    ``target_per_chip`` samples/s per chip; the catalog's value and its samples/s per chip beside the fit."""
    row, catalog = search_unit(accelerator, model, spec), get_platform(accelerator).gemm_efficiency_max
    fit, n = golden_section(lambda eff: abs(row(eff)["samples_per_s_per_chip"] - target_per_chip), 0.05, 0.99, 0.002)
    cat, at_fit = row(catalog), row(fit)
    log(f"{accelerator} ceiling {fit:.3f}: {model} {at_fit['samples_per_s_per_chip']:.1f} samples/s per chip "
        f"(published {target_per_chip:.1f}; catalog {catalog:.3f}: {cat['samples_per_s_per_chip']:.1f})")
    return {"gemm_efficiency_max": fit, "evaluations": n, "target_per_chip": target_per_chip, "catalog": catalog,
            "catalog_per_chip": cat["samples_per_s_per_chip"], "fit_per_chip": at_fit["samples_per_s_per_chip"],
            "batch_size": at_fit["batch_size"], "pipeline_stages": at_fit.get("pipeline_stages"),
            "gradient_accumulation": SEARCH_FIT_GA}


def dataflow_fits() -> dict:
    """The Bow IPU's ceiling fitted on Graphcore's ResNet-50 Bow Pod16 run, with Graphcore's BERT-large run held
    out; the ceiling the CS-2 BERT-large example run would give (reported, not in the catalog)."""
    images_s, ipus, _, where = GRAPHCORE_RESNET50_POD16
    bow = search_fit("bow-pod16", "resnet50", images_s / ipus)
    seq_s, ipus_b, where_b = GRAPHCORE_BERT_POD16
    held = search_unit("bow-pod16", "bert-large", bert_large_seq128())(get_platform("bow-pod16").gemm_efficiency_max)
    samples, seconds, workers, where_cs2 = CS2_BERT_LARGE
    cs2 = search_fit("cs-2", "bert-large", samples / seconds / workers, bert_large_seq128())
    return {"bow-pod16": {**bow, "model": "resnet50", "source": where},
            "bow-pod16 held out": {"model": "bert-large (seq 128)", "published_per_chip": seq_s / ipus_b,
                                   "predicted_per_chip": held["samples_per_s_per_chip"], "source": where_b,
                                   "batch_size": held["batch_size"], "pipeline_stages": held.get("pipeline_stages")},
            "cs-2": {**cs2, "model": "bert-large (seq 128)", "source": where_cs2}}
