"""Multi-node GPT training: predicted vs published iteration times under the line and the NCCL collective models.

The published rows (A100 and H100 clusters, 8 to 3072 GPUs; Megatron-LM, NeMo and NVIDIA's DGX Cloud
recipes, MosaicML's and torchtitan's FSDP runs, BigScience's Megatron-DeepSpeed plan search for BLOOM; GPT,
MPT, BLOOM, Llama, Nemotron and Grok-1 models) and their sources are in
``experiments/multinode_published.yaml``; a source on its own network names it (``network``: interconnect
fields over the catalog entry's). For each
communication model — ``line`` (every collective on the latency-bandwidth line of the raw link
rates) and ``nccl`` (NCCL's ring / tree / protocol cost model on the
catalog's network fields) — the script

1. predicts every row from the script's own starting point (uncalibrated): the catalog with the
   GEMM ceilings it had before any fit (``STARTING_GEMM_EFFICIENCY``: Centimani's 1k GEMM for the
   A100, cuBLAS microbenchmarks for the H100, the H100's for the B200), since the catalog now carries this
   script's fit;
2. fits ONE constant per chip, its ``gemm_efficiency_max`` (golden-section search on the mean
   |error|), on ONE source: the A100's (both catalog entries, one GA100 die) on SC21 Table 1, the
   H100's on MosaicML's H100 BF16 table, the B200's on Megatron-Bridge's Llama 3 8B FP8 rows; predicts
   every row again;
3. reports mean / max |error| over the held-out rows, Spearman rank correlation of per-GPU
   throughput within each model that has several rows (headline: the held-out models whose
   measured per-GPU throughput spreads by more than ``SPREAD_PCT``; beside it, all held-out
   models), and per row the error of both models;
4. checks the orderings SC21 §5.4 states in its text for 64-GPU sweeps of tensor vs pipeline and
   tensor vs data parallelism (Takeaways #1-#2): the predicted throughput must peak at t = 8 for
   the 162.2B model (Fig. 13) and fall as t grows past one node for the 5.9B model (Fig. 15),
   and fall as p grows (Fig. 14);
5. predicts the rows of Llama-shaped models (SwiGLU, grouped-query attention: Llama, Nemotron, Grok-1)
   again as a GPT of the same widths, the reading tuner had before it modelled either; sets the FP8
   speed-up over BF16 of the runs published in both beside its prediction, the step-time growth
   of recipes published at three cluster sizes or more, and the rows of sources on their own network
   predicted again on the catalog's;
6. predicts the peak memory per GPU of the runs whose memory is published (the file's ``memory``, a row's
   ``memory_gib``) and of the plans a source published as out of memory (its ``out_of_memory``);
7. reports, beside the validation, runs outside tuner's model (the file's ``reported``: torch.compile,
   power-capped chips) against tuner's prediction;
8. measures two GEMM-model questions on the H100 kernel pack, the H200 pack held out: whether shape
   terms explain small-model GEMM rates, and the rate of GEMMs without tensor-core alignment (the
   analytic model's ``unaligned_efficiency``).

Run: ``python experiments/multinode_validation.py`` (writes
``experiments/results/multinode_validation.md`` and ``.json``; about 4 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import platform as _pyplatform
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import golden_section  # noqa: E402
from predictor.sources.synth.transformer import MoESpec, ParallelPlan, TransformerSpec  # noqa: E402
from predictor.timing.kernels.gemm import GemmParams  # noqa: E402
from predictor.timing.platforms import get_platform, override_platform  # noqa: E402
from predictor.timing.platforms.schema import Platform  # noqa: E402
from tuner.plans import predict_plan  # noqa: E402
from tuner.search.parallel import split_layers  # noqa: E402

OUT = ROOT / "experiments" / "results"
DATA = ROOT / "experiments" / "multinode_published.yaml"
MODELS = ("line", "nccl")


@dataclass
class Row:
    """One published run: its source, model, plan and measured iteration seconds."""

    key: str  #: the source's key in the data file
    source: str
    platform: str
    split: str
    model: str
    spec: dict
    plan: dict
    gpus: int
    measured_s: float
    tokens: float  #: tokens per iteration
    extra: dict = field(default_factory=dict)
    network: dict = field(default_factory=dict)  #: the source's own network, over the catalog entry's


def sc21_flops(batch: int, layers: int, hidden: int, seq: int, vocab: int) -> float:
    """SC21 eq. 3: FLOPs of one iteration with activation recomputation."""
    return 96.0 * batch * seq * layers * hidden**2 * (1.0 + seq / (6.0 * hidden) + vocab / (16.0 * layers * hidden))


def megatron_flops(batch: int, seq: int, layers: int, hidden: int, heads: int, vocab: int,
                   kv_heads: int | None = None, ffn: int | None = None, swiglu: bool = False) -> float:
    """Model FLOPs of one iteration as Megatron-LM logs them (``num_floating_point_operations`` of
    megatron/training/training.py, 2024: no recomputation, the scores counted whole under a causal mask)."""
    groups = (kv_heads or heads) / heads
    mlp = (ffn or 4 * hidden) / hidden * (1.5 if swiglu else 1.0)
    return 12.0 * batch * seq * layers * hidden**2 * ((1.0 + groups + seq / hidden) + mlp
                                                       + vocab / (2.0 * layers * hidden))


def load_rows(path: Path = DATA, *, out_of_memory: bool = False) -> list[Row]:
    """The published rows of ``path`` with their plans and measured iteration seconds; with ``out_of_memory``,
    instead the plans a source published as out of memory (a source's ``out_of_memory`` rows: its row format
    without the measured value; their ``measured_s`` is NaN)."""
    doc = yaml.safe_load(path.read_text())["sources"]
    rows: list[Row] = []
    for key, src in doc.items():
        published = [[*r, float("nan")] for r in src.get("out_of_memory") or []] if out_of_memory else src["rows"]
        d = dict(src["defaults"])
        src_seq, src_vocab = d.pop("seq", None), d.pop("vocab", None)
        spec_keys = {"dtype", "attention", "fp8_linear", "fp8_params", "mlp", "tie_embeddings", "program", "dropout",
                     "bias", "position", "fused_loss", "moe"}
        spec_d = {k: d.pop(k) for k in list(d) if k in spec_keys}
        for r in published:
            row_spec: dict = {}
            row_plan: dict = {}
            row_extra: dict = {}
            if isinstance(r[-1], dict):  # the row's model fields (ffn, kv_heads), plan fields (cp, ep, ...), memory
                row_spec, r = dict(r[-1]), r[:-1]
                row_plan = {k: row_spec.pop(k) for k in list(row_spec)
                            if k in ("cp", "ep", "expert_tp", "recompute", "recompute_modules", "optimizer_state",
                                     "pipeline_split", "fsdp_reshard_after_forward")}
                row_extra = {k: row_spec.pop(k) for k in list(row_spec) if k == "memory_gib"}
            seq, vocab = row_spec.pop("seq", src_seq), row_spec.pop("vocab", src_vocab)
            if key.startswith("sc21"):
                params, heads, hidden, layers, tp, pp, gpus, batch, tf = r
                t = sc21_flops(batch, layers, hidden, seq, vocab) / (gpus * tf * 1e12)
                plans = [(f"GPT {params}B", dict(tp=tp, pp=pp, global_batch=batch, **d), t, {"tflops_per_gpu": tf})]
            elif key.startswith("korthikanti"):
                name, params, heads, hidden, layers, tp, pp, gpus, batch, mb, chunks, full_s, sel_s = r
                sched = dict(schedule="interleaved", virtual_stages=chunks) if chunks > 1 else dict(schedule="1f1b")
                base = dict(tp=tp, pp=pp, global_batch=batch, micro_batch=mb, **sched, **d)
                plans = [(f"{name} full recompute", dict(base, recompute="full"), full_s, {}),
                         (f"{name} SP + selective", dict(base, recompute="selective", sequence_parallel=True), sel_s, {})]
            elif key.startswith("mosaic"):
                name, hidden, layers, heads, gpus, mb, ga, ckpt, tps = r
                gbs = gpus * mb * ga
                t = gbs * seq / (tps * gpus)
                plans = [(name, dict(tp=1, pp=1, global_batch=gbs, micro_batch=mb,
                                     recompute="full" if ckpt else "none", **d), t, {"tokens_per_s_per_gpu": tps})]
            elif key.startswith("torchtitan"):
                name, seq, vocab, hidden, layers, heads, kv_heads, ffn, gpus, mb, ac, tps = r
                row_spec = {"ffn": ffn, "kv_heads": None if kv_heads == heads else kv_heads}
                t = mb * seq / tps  # WPS is each rank's tokens per second
                # "layerN": torchtitan checkpoints every N-th layer, tuner's full recomputation of layers / N
                rec = dict(recompute="full", recompute_layers=layers // int(ac[5:])) if ac.startswith("layer") \
                    else dict(recompute=ac)
                plans = [(name, dict(tp=1, pp=1, global_batch=gpus * mb, micro_batch=mb, **rec, **d), t,
                          {"tokens_per_s_per_gpu": tps})]
            else:
                name, heads, hidden, layers, gpus, gbs, mbs, tp, pp, vp, value = r
                sched = dict(schedule="interleaved", virtual_stages=vp) if vp > 1 else dict(schedule="1f1b")
                kind = {"step_s": "step_s", "megatron_tflops": "tflops_per_gpu"}.get(src.get("published"),
                                                                                   "tokens_per_s_per_gpu")
                if kind == "step_s":
                    t = value
                elif kind == "tflops_per_gpu":
                    f = megatron_flops(gbs, seq, layers, hidden, heads, vocab, row_spec.get("kv_heads"),
                                       row_spec.get("ffn"), spec_d.get("mlp") == "swiglu")
                    t = f / (gpus * value * 1e12)
                else:
                    t = gbs * seq / (value * gpus)
                plans = [(name, dict(tp=tp, pp=pp, global_batch=gbs, micro_batch=mbs, **sched, **d), t, {kind: value})]
            for model, plan, t, extra in plans:
                plan = dict(plan, **row_plan)
                plan["dp"] = gpus // (plan["tp"] * plan["pp"] * plan.get("cp", 1))
                v = plan.get("virtual_stages", 1) if plan.get("schedule") == "interleaved" else 1
                split = split_layers(plan.pop("pipeline_split", "even"), layers, plan["pp"], v)
                if split is not None:  # Megatron's --account-for-embedding/loss-in-pipeline-split
                    plan["stage_layers"] = split
                if plan.get("tp", 1) == 1:
                    plan.pop("sequence_parallel", None)
                spec = dict(dict(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, name=model, **spec_d),
                            **row_spec)
                if isinstance(spec.get("moe"), dict):
                    spec["moe"] = MoESpec(**spec["moe"])
                rows.append(Row(key, src["cite"], src["platform"], src["split"], model, spec, plan, gpus, float(t),
                                float(plan["global_batch"] * seq), {**extra, **row_extra},
                                dict(src.get("network") or {})))
    return rows


def platform_for(key: str, comm: str, gemm_eff: float | None = None, network: dict | None = None) -> Platform:
    """The catalog entry ``key`` with collective model ``comm`` (and a GEMM ceiling and the source's own
    network fields, if given)."""
    base = get_platform(key)
    if network:  # merged and validated as a user catalog file's interconnect fields are
        base = override_platform(base, {"interconnect": network}, DATA.name)
    upd: dict = {"interconnect": base.interconnect.model_copy(update={"collective_model": comm})}
    if comm == "nccl" and base.interconnect.collective_model != "nccl":
        upd.pop("interconnect")  # no network fields in the catalog: the line model stays
    if gemm_eff is not None:
        upd["gemm_efficiency_max"] = gemm_eff
    return base.model_copy(update=upd)


#: one fitted constant per chip: (the source it is fitted on, the catalog entries of that chip)
FITS = {"A100": ("sc21_t1", ("a100-80gb", "a100-40gb")), "H100": ("mosaic_h100", ("h100-sxm",)),
        "B200": ("mbridge_b200_fit", ("b200",))}
#: the GEMM ceilings the uncalibrated column starts from: the catalog's values before it carried this
#: script's fit (A100: Centimani Table 3, 1k fp16 GEMM 291.83 of 312 TFLOP/s; H100: public cuBLAS BF16
#: microbenchmarks, ~0.75 of dense peak)
STARTING_GEMM_EFFICIENCY = {"a100-80gb": 0.93, "a100-40gb": 0.93, "h100-sxm": 0.75, "b200": 0.75}
#: the ceiling's search interval where it is not (0.5, 0.99): the B200's fit source runs FP8 linears, whose whole
#: step sustains less than half of the FP8 peak per GEMM FLOP
FIT_RANGE = {"B200": (0.3, 0.99)}
#: a model's rows order its per-GPU throughput only when the published values spread by more than this, %
SPREAD_PCT = 5.0


def predict(rows: list[Row], comm: str, eff: dict[str, float]) -> np.ndarray:
    """Predicted iteration seconds of ``rows`` (NaN where ``tuner predict`` finds the plan out of memory)."""
    out = np.full(len(rows), np.nan)
    for i, r in enumerate(rows):
        plat = platform_for(r.platform, comm, eff.get(r.platform), r.network)
        spec, plan = TransformerSpec(**r.spec), ParallelPlan(**r.plan)
        res, _ = predict_plan(spec, plan, plat, devices=r.gpus)
        if res["predicted_iteration_s"] is not None:
            out[i] = res["predicted_iteration_s"]
    return out


def fit_chip(rows: list[Row], comm: str, chip: str, tol: float = 0.004) -> tuple[float, int]:
    """Golden-section search of ``chip``'s GEMM ceiling on the mean |error| of its fit source's rows."""
    source, keys = FITS[chip]
    fit = [r for r in rows if r.key == source]
    meas = np.asarray([r.measured_s for r in fit])
    def f(x: float) -> float:
        return float(np.nanmean(np.abs(predict(fit, comm, dict.fromkeys(keys, x)) / meas - 1)))

    return golden_section(f, *FIT_RANGE.get(chip, (0.5, 0.99)), tol)


def summary(err: np.ndarray, mask: np.ndarray) -> dict:
    """Mean / max / signed mean of |error| % over ``mask`` (finite rows)."""
    sel = mask & np.isfinite(err)
    e = err[sel]
    return {"rows": int(sel.sum()), "missing": int((mask & ~np.isfinite(err)).sum()),
            "mean_abs_pct": float(np.mean(np.abs(e))) if e.size else None,
            "max_abs_pct": float(np.max(np.abs(e))) if e.size else None,
            "mean_signed_pct": float(np.mean(e)) if e.size else None}


def within_model_ranks(rows: list[Row], pred: np.ndarray) -> list[dict]:
    """Spearman of per-GPU token throughput, predicted vs measured, for each model with >= 2 rows."""
    out = []
    base = [(r.source, r.model.split(" full")[0].split(" SP")[0]) for r in rows]
    for key in dict.fromkeys(base):
        model = key[1]
        idx = [i for i, b in enumerate(base) if b == key and np.isfinite(pred[i])]
        if len(idx) < 2:
            continue
        meas = np.asarray([rows[i].tokens / rows[i].measured_s / rows[i].gpus for i in idx])
        prd = np.asarray([rows[i].tokens / pred[i] / rows[i].gpus for i in idx])
        rho = float(spearmanr(prd, meas)[0]) if len(idx) > 2 else float(np.sign(prd[1] - prd[0]) * np.sign(meas[1] - meas[0]))
        out.append({"model": model, "rows": len(idx), "split": rows[idx[0]].split, "spearman": rho,
                    "measured_spread_pct": float((meas.max() / meas.min() - 1) * 100),
                    "predicted_spread_pct": float((prd.max() / prd.min() - 1) * 100)})
    return out


def spearman_summary(ranks: list[dict]) -> dict:
    """Mean and min Spearman over the held-out models: those whose measured spread exceeds ``SPREAD_PCT``
    (the headline: the others' order is within the published runs' noise) and all of them."""
    held = [x for x in ranks if x["split"] == "held-out"]
    spread = [x for x in held if x["measured_spread_pct"] > SPREAD_PCT]
    out = {}
    for name, sel in (("spread", spread), ("all", held)):
        rho = [x["spearman"] for x in sel]
        out[name] = {"models": len(sel), "mean": float(np.mean(rho)) if rho else None,
                     "min": float(np.min(rho)) if rho else None, "below_0_9": int(sum(r < 0.9 for r in rho))}
    return out


#: measured GEMMs of the H100 asset pack (fit) and the H200 pack (held out), same GH100 die (989 TFLOP/s bf16 dense)
GEMM_PACKS = (ROOT / "assets" / "h100" / "data" / "gemm.csv", ROOT / "assets" / "h200-cal" / "data" / "gemm.csv")


def saturation(flops: np.ndarray, peak: float) -> np.ndarray:
    """The analytic GEMM model's share of its ceiling a GEMM of ``flops`` reaches: ``f / (f + peak x t_half)``."""
    return flops / (flops + peak * GemmParams().t_half_s)


def gemm_shape_terms(min_flops: float = 2e10, peak: float = 989e12, sms: int = 132) -> list[dict]:
    """Does GEMM shape explain the small-model bias? The unbatched bf16 GEMMs of at least ``min_flops`` with
    dimensions divisible by 8 of the H100 pack, fitted (least squares on log rate) with the analytic model's
    ceiling x saturation ``f / (f + peak x 8 us)`` alone, times a reduction-loop term ``k / (k + k_half)``,
    and times wave quantisation of output tiles over ``sms`` SMs; mean |error| %, H200 pack held out."""
    def load(path: Path) -> tuple[np.ndarray, ...]:
        d = pd.read_csv(path)
        d = d[(d.dtype_bytes == 2) & (d.batch == 1) & (d.flops >= min_flops)
              & (d.m % 8 == 0) & (d.n % 8 == 0) & (d.k % 8 == 0)]
        return (d.m.to_numpy(float), d.n.to_numpy(float), d.k.to_numpy(float), d.flops.to_numpy(float),
                (d.flops / d.median_s / peak).to_numpy(float))

    fit, held = load(GEMM_PACKS[0]), load(GEMM_PACKS[1])

    def rate(p: np.ndarray, m, n, k, f, variant: str) -> np.ndarray:
        r = p[0] * saturation(f, peak)
        if variant == "k_loop":
            r = r * k / (k + p[1])
        elif variant.startswith("waves"):
            tm, tn = (int(x) for x in variant.split("_")[1].split("x"))
            tiles = np.ceil(m / tm) * np.ceil(n / tn)
            r = r * tiles / (np.ceil(tiles / sms) * sms)
        return r

    out = []
    for variant, x0 in (("ceiling", [0.8]), ("k_loop", [0.8, 100.0]), ("waves_128x128", [0.8]), ("waves_128x256", [0.8])):
        lo, hi = [0.05] + [0.0] * (len(x0) - 1), [2.0] + [1e5] * (len(x0) - 1)
        res = least_squares(lambda p, v=variant: np.log(rate(p, *fit[:4], v)) - np.log(fit[4]), x0, bounds=(lo, hi))
        err = [float(np.mean(np.abs(rate(res.x, *d[:4], variant) / d[4] - 1)) * 100) for d in (fit, held)]
        out.append({"variant": variant, "params": [float(v) for v in res.x], "fit_rows": int(fit[0].size),
                    "held_out_rows": int(held[0].size), "fit_mean_abs_pct": err[0], "held_out_mean_abs_pct": err[1]})
    return out


def gemm_alignment(min_flops: float = 1e9, peak: float = 989e12) -> dict:
    """Tensor-core alignment: the bf16 GEMMs (mm, addmm, bmm) of at least ``min_flops`` in the H100 pack whose
    n or k (the row-major operands' leading dimensions) is not a multiple of 8, fitted (least squares on log
    rate) with the analytic model's ``u x saturation``; the H200 pack held out. Mean |error| % of the rate of
    those GEMMs at the ceiling fitted on the aligned ones (what the analytic model did before) and at ``u``."""
    def load(path: Path, aligned: bool) -> tuple[np.ndarray, np.ndarray]:
        d = pd.read_csv(path)
        d = d[(d.dtype_bytes == 2) & (d.flops >= min_flops)]
        ok = (d.n % 8 == 0) & (d.k % 8 == 0)
        d = d[ok if aligned else ~ok]
        return d.flops.to_numpy(float), (d.flops / d.median_s / peak).to_numpy(float)

    def fit(f: np.ndarray, r: np.ndarray) -> float:
        res = least_squares(lambda p: np.log(p[0] * saturation(f, peak)) - np.log(r), [0.5], bounds=([0.01], [2.0]))
        return float(res.x[0])

    def err(c: float, f: np.ndarray, r: np.ndarray) -> float:
        return float(np.mean(np.abs(c * saturation(f, peak) / r - 1)) * 100)

    aligned, unaligned = fit(*load(GEMM_PACKS[0], True)), fit(*load(GEMM_PACKS[0], False))
    out = {"min_flops": min_flops, "aligned_ceiling": aligned, "unaligned_ceiling": unaligned}
    for split, path in (("fit", GEMM_PACKS[0]), ("held_out", GEMM_PACKS[1])):
        f, r = load(path, False)
        out[split] = {"rows": int(f.size), "mean_abs_pct_at_aligned_ceiling": err(aligned, f, r),
                      "mean_abs_pct_at_unaligned_ceiling": err(unaligned, f, r)}
    return out


def attention_shares(rows: list[Row], comm: str, eff: dict[str, float]) -> dict:
    """Is the MosaicML miss attention? Per MosaicML row: the predicted share of the iteration in the fused
    attention kernels (forward, backward; the data file's implementation), the error with attention priced as a
    GEMM of its FLOPs at the chip's ceiling (``attention: flash``) and with the data file's implementation;
    Pearson r of the GEMM-priced error with the attention share, over all rows and within rows with and
    without activation checkpointing."""
    out = []
    for r in rows:
        if not r.key.startswith("mosaic"):
            continue
        plat = platform_for(r.platform, comm, eff.get(r.platform), r.network)
        plan = ParallelPlan(**r.plan)
        res, tl = predict_plan(TransformerSpec(**r.spec), plan, plat, devices=r.gpus, detail="kernel", keep_timeline=True)
        flash, _ = predict_plan(TransformerSpec(**dict(r.spec, attention="flash")), plan, plat, devices=r.gpus)
        if tl is None or flash["predicted_iteration_s"] is None:
            continue
        names = np.asarray(tl.graph.names, dtype=object)[tl.graph.name]
        it = tl.iteration_s
        fwd = float(tl.duration[np.char.endswith(names.astype(str), "flash_attn_fwd")].sum())
        bwd = float(tl.duration[np.char.endswith(names.astype(str), "flash_attn_bwd")].sum())
        out.append({"platform": r.platform, "model": r.model, "gpus": r.gpus, "split": r.split,
                    "attention": r.spec.get("attention", "flash"), "checkpointing": r.plan.get("recompute") == "full",
                    "attn_fwd_share_pct": fwd / it * 100, "attn_bwd_share_pct": bwd / it * 100,
                    "error_pct_gemm_priced": (flash["predicted_iteration_s"] / r.measured_s - 1) * 100,
                    "error_pct": (it / r.measured_s - 1) * 100})

    def pearson(sel: list[dict]) -> float | None:
        if len(sel) < 3:
            return None
        share = [x["attn_fwd_share_pct"] + x["attn_bwd_share_pct"] for x in sel]
        return float(np.corrcoef(share, [x["error_pct_gemm_priced"] for x in sel])[0, 1])

    groups = {"all": out, "checkpointing": [x for x in out if x["checkpointing"]],
              "no checkpointing": [x for x in out if not x["checkpointing"]]}
    return {"rows": out, "groups": {k: {"rows": len(v), "pearson_share_vs_error": pearson(v),
                                        "mean_share_pct": float(np.mean([x["attn_fwd_share_pct"] + x["attn_bwd_share_pct"] for x in v])),
                                        "mean_error_pct_gemm_priced": float(np.mean([x["error_pct_gemm_priced"] for x in v])),
                                        "mean_error_pct": float(np.mean([x["error_pct"] for x in v]))}
                                    for k, v in groups.items() if v}}


#: the model fields a GPT reading of a Llama row drops (tuner read Megatron's --swiglu and --num-query-groups so)
LLAMA_FIELDS = ("mlp", "kv_heads")


def precision_pairs(rows: list[Row], pred: np.ndarray) -> list[dict]:
    """Rows published in both BF16 and FP8 (names ending ``bf16`` / ``fp8``, same source, GPUs and plan): the
    measured and predicted speed-up of FP8 (BF16 step seconds over FP8's)."""
    by: dict[tuple, dict[str, int]] = {}
    for i, r in enumerate(rows):
        base, _, tag = r.model.rpartition(" ")
        if tag in ("bf16", "fp8"):
            by.setdefault((r.source, base, r.gpus, json.dumps(r.plan, sort_keys=True)), {})[tag] = i
    out = []
    for (source, model, gpus, _), idx in by.items():
        if len(idx) == 2 and np.isfinite(pred[idx["bf16"]]) and np.isfinite(pred[idx["fp8"]]):
            meas = rows[idx["bf16"]].measured_s / rows[idx["fp8"]].measured_s
            prd = pred[idx["bf16"]] / pred[idx["fp8"]]
            out.append({"source": source, "model": model, "gpus": gpus, "measured_speedup": float(meas),
                        "predicted_speedup": float(prd), "error_pct": float((prd / meas - 1) * 100)})
    return out


def weak_scaling(rows: list[Row], pred: np.ndarray) -> list[dict]:
    """Recipes published at several cluster sizes with one plan per GPU (step seconds, ``published: step_s``): the
    step time's growth from the smallest to the largest cluster, measured and predicted, %."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        if "step_s" in r.extra and np.isfinite(pred[i]):
            plan = {k: v for k, v in r.plan.items() if k not in ("dp", "global_batch")}
            key = (r.source, r.model, json.dumps(plan, sort_keys=True), json.dumps(r.spec, sort_keys=True, default=str))
            groups.setdefault(key, []).append(i)
    out = []
    for (source, model, *_), idx in groups.items():
        if len({rows[i].gpus for i in idx}) >= 3:
            lo, hi = min(idx, key=lambda i: rows[i].gpus), max(idx, key=lambda i: rows[i].gpus)
            out.append({"source": source, "model": model, "gpus": [rows[lo].gpus, rows[hi].gpus],
                        "measured_growth_pct": (rows[hi].measured_s / rows[lo].measured_s - 1) * 100,
                        "predicted_growth_pct": float((pred[hi] / pred[lo] - 1) * 100)})
    return out


def gpt_reading(rows: list[Row], meas: np.ndarray, pred: np.ndarray, comm: str, eff: dict[str, float]) -> list[dict]:
    """The rows of gated-MLP / grouped-query models, their predictions ``pred`` beside those as a GPT of the
    same widths (GeLU MLP of the same ``ffn``, multi-head attention): error % of each."""
    idx = [i for i, r in enumerate(rows) if any(r.spec.get(k) not in (None, "gelu") for k in LLAMA_FIELDS)]
    gpt = [Row(**{**rows[i].__dict__, "spec": {k: v for k, v in rows[i].spec.items() if k not in LLAMA_FIELDS}})
           for i in idx]
    as_is = pred[idx]
    as_gpt = predict(gpt, comm, eff)
    return [{"source": rows[i].source, "model": rows[i].model, "gpus": rows[i].gpus, "split": rows[i].split,
             "error_pct": float((a / meas[i] - 1) * 100), "error_pct_as_gpt": float((g / meas[i] - 1) * 100)}
            for i, a, g in zip(idx, as_is, as_gpt, strict=True)]


def job_toml(src: dict, *, model: dict | None = None, parallelism: dict | None = None) -> str:
    """The torchtitan TOML job config of a published run of the data file (its ``model: [name, flavor]`` and
    ``toml`` sections), with the ``model`` and ``parallelism`` keys given added."""
    from tuner.launch.torchtitan import toml_section

    name, flavor = src["model"]
    sections = {sec: dict(items) for sec, items in src["toml"].items()}
    sections["model"] = {"name": name, "flavor": flavor, **sections.get("model", {}), **(model or {})}
    sections["parallelism"] = {**sections.get("parallelism", {}), **(parallelism or {})}
    return "\n".join(line for sec, items in sections.items() for line in toml_section(sec, items))


def memory_check(path: Path = DATA) -> list[dict]:
    """Published peak memory per GPU against tuner's, each run read as its torchtitan job config."""
    from predictor.sources.synth.transformer_memory import memory_per_stage
    from tuner.launch.torchtitan import read_torchtitan_toml

    out = []
    for key, src in (yaml.safe_load(path.read_text()).get("memory") or {}).items():
        text = job_toml(src)
        for gpus, gib in src["rows"]:
            read = read_torchtitan_toml(text, key, devices=gpus)
            pred = max(m.total_bytes for m in memory_per_stage(read.spec, read.plan)) / 2**30
            out.append({"source": src["cite"], "model": read.spec.name, "plan": read.plan.label(), "gpus": gpus,
                        "published_gib": gib, "predicted_gib": pred, "error_pct": (pred / gib - 1) * 100})
    return out


def own_network(rows: list[Row], pred: np.ndarray, comm: str, eff: dict[str, float]) -> list[dict]:
    """The rows of sources on their own network predicted again on the catalog entry's: what the source's
    network costs each run, as tuner predicts it (step seconds on each, %)."""
    idx = [i for i, r in enumerate(rows) if r.network]
    catalog = predict([Row(**{**rows[i].__dict__, "network": {}}) for i in idx], comm, eff)
    return [{"source": rows[i].source, "model": rows[i].model, "plan": ParallelPlan(**rows[i].plan).label(),
             "predicted_s": float(pred[i]), "predicted_s_catalog_network": float(c),
             "own_network_slower_pct": float((pred[i] / c - 1) * 100)} for i, c in zip(idx, catalog, strict=True)]


def source_memory(rows: list[Row], out_of_memory: list[Row]) -> list[dict]:
    """Per-GPU memory a source publishes beside its timed rows (a row's ``memory_gib``) and the plans it
    published as out of memory, against tuner's predicted peak (the fullest pipeline stage), GiB."""
    from predictor.sources.synth.transformer_memory import memory_per_stage

    out = []
    for r in [x for x in rows if "memory_gib" in x.extra] + out_of_memory:
        plan = ParallelPlan(**r.plan)
        pred = max(m.total_bytes for m in memory_per_stage(TransformerSpec(**r.spec), plan)) / 2**30
        device = get_platform(r.platform).memory_bytes / 2**30
        pub = r.extra.get("memory_gib")
        out.append({"source": r.source, "model": r.model, "heads": r.spec["heads"], "plan": plan.label(),
                    "gpus": r.gpus, "published_gib": pub, "predicted_gib": pred, "device_gib": device,
                    "error_pct": None if pub is None else (pred / pub - 1) * 100, "predicted_fits": pred <= device})
    return out


def reported_checks(path: Path = DATA) -> list[dict]:
    """Published tokens/s per GPU of runs outside tuner's model (the file's ``reported``) against tuner's,
    each run read as its torchtitan job config and predicted on the catalog's platform."""
    from tuner.launch.torchtitan import read_torchtitan_toml

    out = []
    for key, src in (yaml.safe_load(path.read_text()).get("reported") or {}).items():
        plat = get_platform(src["platform"])
        if "hbm" in src:  # the source's own HBM (capacity bytes, bytes/s) in place of the catalog entry's
            hbm = src["hbm"]
            plat = plat.model_copy(update={"memory": [
                m if m.on_chip else m.model_copy(update={"capacity_bytes": hbm[0], "bandwidth_bytes_per_s": hbm[1]})
                for m in plat.memory]})
        for gpus, async_tp, float8, tps in src["rows"]:
            text = job_toml(src, model={"converters": ["float8"]} if float8 else None,
                            parallelism={"enable_async_tensor_parallel": async_tp})
            read = read_torchtitan_toml(text, key, devices=gpus)
            res, _ = predict_plan(read.spec, read.plan, plat, devices=gpus)
            pred = read.plan.global_batch * read.spec.seq / res["predicted_iteration_s"] / gpus
            out.append({"source": src["cite"], "model": read.spec.name, "plan": read.plan.label(), "gpus": gpus,
                        "async_tp": bool(async_tp), "float8": bool(float8), "published_tokens_per_s_per_gpu": tps,
                        "predicted_tokens_per_s_per_gpu": pred, "error_pct": (pred / tps - 1) * 100})
    return out


def sweep_checks(comm: str, eff: float) -> list[dict]:
    """SC21 §5.4's orderings (64 A100s, micro-batch 1, batch 128 / 512): predicted TFLOP/s per GPU."""
    plat = platform_for("a100-80gb", comm, eff)
    out = []
    for fig, (layers, hidden, heads, batch), grid, claim in (
        ("Fig. 13", (32, 20480, 128, 128), [(t, 64 // t, 1) for t in (2, 4, 8, 16, 32)], "peak at t = 8"),
        ("Fig. 14", (32, 3840, 32, 512), [(1, p, 64 // p) for p in (2, 4, 8, 16, 32)], "falls as p grows"),
        ("Fig. 15", (32, 3840, 32, 512), [(t, 1, 64 // t) for t in (2, 4, 8, 16, 32)], "falls as t grows"),
    ):
        spec = TransformerSpec(layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=51200, dtype="fp16",
                               attention="unfused")
        tf = []
        for t, p, d in grid:
            plan = ParallelPlan(tp=t, pp=p, dp=d, micro_batch=1, global_batch=batch, recompute="full",
                                overlap_grad_reduce=False, grad_reduce_dtype="fp16")
            res, _ = predict_plan(spec, plan, plat, devices=64)
            s = res["predicted_iteration_s"]
            tf.append(sc21_flops(batch, layers, hidden, 2048, 51200) / 64 / s / 1e12 if s else float("nan"))
        tf_a = np.asarray(tf)
        if fig == "Fig. 13":
            ok = bool(np.nanargmax(tf_a) == 2)
        else:
            ok = bool(np.all(np.diff(tf_a[np.isfinite(tf_a)]) < 0))
        out.append({"figure": fig, "claim": claim, "grid_t_p_d": grid, "predicted_tflops_per_gpu": [round(x, 1) for x in tf],
                    "holds": ok})
    return out


def say(text: str) -> None:  # progress on stderr: the run takes minutes, stdout carries the report
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run(rows: list[Row], comm: str) -> dict:
    meas = np.asarray([r.measured_s for r in rows])
    held = np.asarray([r.split != "fit" for r in rows])
    t0 = time.perf_counter()
    say(f"{comm}: {len(rows)} rows uncalibrated, one GEMM ceiling fitted per chip, the rows calibrated, the checks")
    unc = predict(rows, comm, STARTING_GEMM_EFFICIENCY)
    fitted = {chip: fit_chip(rows, comm, chip) for chip in FITS}
    eff = {key: fitted[chip][0] for chip, (_, keys) in FITS.items() for key in keys}
    cal = predict(rows, comm, eff)
    ranks = within_model_ranks(rows, cal)
    err_u, err_c = (unc / meas - 1) * 100, (cal / meas - 1) * 100
    by_source = {}
    for src in dict.fromkeys(r.source for r in rows):
        m = np.asarray([r.source == src for r in rows])
        by_source[src] = summary(err_c, m)
    return {
        "fitted_gemm_efficiency_max": {chip: {"value": v, "source": FITS[chip][0], "platforms": list(FITS[chip][1]),
                                              "evaluations": n} for chip, (v, n) in fitted.items()},
        "uncalibrated": {"held_out": summary(err_u, held), "fit": summary(err_u, ~held)},
        "calibrated": {"held_out": summary(err_c, held), "fit": summary(err_c, ~held), "by_source": by_source},
        "within_model_spearman": ranks,
        "spearman_held_out": spearman_summary(ranks),
        "sc21_sweeps": sweep_checks(comm, eff["a100-80gb"]),
        "attention": attention_shares(rows, comm, eff) if comm == "nccl" else None,
        "gpt_reading": gpt_reading(rows, meas, cal, comm, eff),
        "precision_pairs": precision_pairs(rows, cal), "weak_scaling": weak_scaling(rows, cal),
        "own_network": own_network(rows, cal, comm, eff) if comm == "nccl" else None,
        "predicted_s": cal.tolist(), "error_pct": err_c.tolist(), "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT / "multinode_validation", help="results path without suffix")
    ap.add_argument("--comm", choices=MODELS, nargs="+", default=list(MODELS), help="communication models to run")
    args = ap.parse_args(argv)
    rows = load_rows()
    res = {comm: run(rows, comm) for comm in args.comm}
    say("GEMM shape and alignment terms, memory peaks, reported runs")
    payload = {
        "date": date.today().isoformat(),
        "machine": f"{_pyplatform.machine()} VM (predictions only: nothing is timed here)",
        "data": str(DATA.relative_to(ROOT)),
        "models": res,
        "gemm_shape_terms": gemm_shape_terms(),
        "gemm_alignment": gemm_alignment(),
        "memory": memory_check(),
        "source_memory": source_memory(rows, load_rows(out_of_memory=True)),
        "reported": reported_checks(),
        "rows": [{"source": r.source, "platform": r.platform, "split": r.split, "model": r.model, "gpus": r.gpus,
                  "plan": r.plan, "measured_s": r.measured_s, **r.extra,
                  **{f"predicted_s_{c}": res[c]["predicted_s"][i] for c in res},
                  **{f"error_pct_{c}": res[c]["error_pct"][i] for c in res}} for i, r in enumerate(rows)],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    args.out.with_suffix(".md").write_text(render(payload))
    print(render(payload))


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "—" if x is None or not np.isfinite(x) else fmt.format(x)


def render(p: dict) -> str:
    ms = list(p["models"])
    L = ["# Multi-node GPT and Llama training: predicted vs published", "",
         f"`python experiments/multinode_validation.py` — {p['date']}, {p['machine']}. Published rows and their "
         f"sources: `{p['data']}`. One constant fitted per chip, the GEMM ceiling: the A100's (both catalog entries) "
         "on SC21 Table 1, the H100's on MosaicML's H100 table, the B200's on Megatron-Bridge's B200 Llama 3 8B FP8 "
         "rows; every other source held out. Uncalibrated: the "
         f"starting ceilings {STARTING_GEMM_EFFICIENCY['a100-80gb']} (A100) / {STARTING_GEMM_EFFICIENCY['h100-sxm']} (H100) "
         f"/ {STARTING_GEMM_EFFICIENCY['b200']} (B200). "
         f"Spearman: per-GPU throughput within each held-out model, mean (min) over the models whose published "
         f"throughput spreads by more than {SPREAD_PCT:.0f} %, and over all of them.", "",
         "| communication model | GEMM ceiling fitted (A100 / H100 / B200) | held-out rows | held-out mean abs % | held-out max abs % "
         "| mean signed % | Spearman, spread > 5 % | Spearman, all | fit rows mean abs % | uncalibrated held-out mean abs % |",
         "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for c in ms:
        x = p["models"][c]
        h, f, u = x["calibrated"]["held_out"], x["calibrated"]["fit"], x["uncalibrated"]["held_out"]
        fe = x["fitted_gemm_efficiency_max"]
        sp = {k: f"{_f(v['mean'], '{:+.2f}')} ({_f(v['min'], '{:+.2f}')}, {v['models']} models)"
              for k, v in x["spearman_held_out"].items()}
        L.append(f"| {c} | {fe['A100']['value']:.3f} / {fe['H100']['value']:.3f} / {fe['B200']['value']:.3f} | {h['rows']} (+{h['missing']} out of memory) | "
                 f"{_f(h['mean_abs_pct'])} | {_f(h['max_abs_pct'])} | {_f(h['mean_signed_pct'], '{:+.1f}')} | "
                 f"{sp['spread']} | {sp['all']} | {_f(f['mean_abs_pct'])} | {_f(u['mean_abs_pct'])} |")
    L += ["", "## By source (calibrated)", "", "| source | " + " | ".join(f"{c}: mean / max abs %" for c in ms) + " |",
          "|---|" + "--:|" * len(ms)]
    for src in p["models"][ms[0]]["calibrated"]["by_source"]:
        cells = [f"{_f(p['models'][c]['calibrated']['by_source'][src]['mean_abs_pct'])} / "
                 f"{_f(p['models'][c]['calibrated']['by_source'][src]['max_abs_pct'])}" for c in ms]
        L.append(f"| {src} | " + " | ".join(cells) + " |")
    L += ["", "## Spearman of per-GPU throughput within each model (calibrated)", "",
          "Spread: max / min - 1 of the measured per-GPU throughput over the model's rows (MosaicML's runs at "
          "8-128 GPUs differ by a few percent, so their order is mostly noise).", "",
          "| model | rows | split | measured spread % | " + " | ".join(ms) + " |", "|---|--:|---|--:|" + "--:|" * len(ms)]
    for i, x in enumerate(p["models"][ms[0]]["within_model_spearman"]):
        L.append(f"| {x['model']} | {x['rows']} | {x['split']} | {x['measured_spread_pct']:.1f} | "
                 + " | ".join(f"{p['models'][c]['within_model_spearman'][i]['spearman']:+.2f}" for c in ms) + " |")
    for c in ms:
        sp = [x for x in p["models"][c]["within_model_spearman"] if x["split"] == "held-out" and x["rows"] >= 3]
        if sp:
            L.append(f"\n{c}: mean Spearman over the {len(sp)} held-out models with >= 3 rows "
                     f"{np.mean([x['spearman'] for x in sp]):+.2f}; over those whose measured spread exceeds 5 % "
                     f"{_f(np.mean([x['spearman'] for x in sp if x['measured_spread_pct'] > 5]) if any(x['measured_spread_pct'] > 5 for x in sp) else None, '{:+.2f}')}.")
    L += ["", "## GEMM shape terms, measured (H100 pack fitted, H200 pack held out)", "",
          "Whether small hidden sizes lose GEMM rate to shape: unbatched bf16 GEMMs of >= 2e10 FLOP with dimensions "
          "divisible by 8, fitted with the analytic ceiling x saturation alone, with a reduction-loop term "
          "k / (k + k_half), or with wave quantisation of output tiles over 132 SMs.", "",
          "| variant | fitted parameters | fit rows | fit mean abs % | held-out rows | held-out mean abs % |",
          "|---|---|--:|--:|--:|--:|"]
    for g in p.get("gemm_shape_terms", []):
        L.append(f"| {g['variant']} | {', '.join(f'{v:.3g}' for v in g['params'])} | {g['fit_rows']} | "
                 f"{g['fit_mean_abs_pct']:.1f} | {g['held_out_rows']} | {g['held_out_mean_abs_pct']:.1f} |")
    ga = p.get("gemm_alignment")
    if ga:
        L += ["", "## GEMM alignment, measured (H100 pack fitted, H200 pack held out)", "",
              f"bf16 GEMMs of >= {ga['min_flops']:.0e} FLOP whose n or k is not a multiple of 8 (tensor-core alignment), "
              f"rate as the analytic saturation times a ceiling: the ceiling fitted on the aligned ones "
              f"({ga['aligned_ceiling']:.3f}; what the analytic model applied to every GEMM before) against one fitted "
              f"on the unaligned ones ({ga['unaligned_ceiling']:.3f}; the analytic model's `unaligned_efficiency`).", "",
              "| split | unaligned GEMMs | mean abs % at the aligned ceiling | mean abs % at the unaligned ceiling |",
              "|---|--:|--:|--:|"]
        for split in ("fit", "held_out"):
            g = ga[split]
            L.append(f"| {split.replace('_', '-')} | {g['rows']} | {g['mean_abs_pct_at_aligned_ceiling']:.1f} | "
                     f"{g['mean_abs_pct_at_unaligned_ceiling']:.1f} |")
    att = next((p["models"][c]["attention"] for c in ms if p["models"][c].get("attention")), None)
    if att:
        L += ["", "## Attention share of the MosaicML rows (NCCL model, fitted ceilings)", "",
              "Every MosaicML table ran llm-foundry's `attn_impl: triton`. Attention share: the predicted fused attention "
              "kernels (forward incl. the recomputed one, backward) over the iteration, priced at the data file's "
              "implementation's published speed. Error GEMM-priced: the same row with attention timed as a GEMM of its "
              "FLOPs at the chip's ceiling (`attention: flash`). Pearson r: attention share against the GEMM-priced error.", "",
              "| rows | n | mean attention share % | Pearson r (share, GEMM-priced error) | mean error % GEMM-priced | mean error % |",
              "|---|--:|--:|--:|--:|--:|"]
        for k, g in att["groups"].items():
            L.append(f"| {k} | {g['rows']} | {g['mean_share_pct']:.1f} | {_f(g['pearson_share_vs_error'], '{:+.2f}')} | "
                     f"{g['mean_error_pct_gemm_priced']:+.1f} | {g['mean_error_pct']:+.1f} |")
        L += ["", "| platform | model | GPUs | split | checkpointing | attention | fwd share % | bwd share % | error % GEMM-priced | error % |",
              "|---|---|--:|---|---|---|--:|--:|--:|--:|"]
        for x in att["rows"]:
            L.append(f"| {x['platform']} | {x['model']} | {x['gpus']} | {x['split']} | {'yes' if x['checkpointing'] else 'no'} | "
                     f"{x['attention']} | {x['attn_fwd_share_pct']:.1f} | {x['attn_bwd_share_pct']:.1f} | "
                     f"{x['error_pct_gemm_priced']:+.1f} | {x['error_pct']:+.1f} |")
    llama = {c: p["models"][c].get("gpt_reading") or [] for c in ms}
    if any(llama.values()):
        L += ["", "## SwiGLU and grouped-query rows: the model as it is, and read as a GPT (calibrated)", "",
              "SwiGLU MLP and grouped-query attention modelled, against the same rows read as a GPT of the same "
              "widths (GeLU MLP of the same FFN width, multi-head attention).", "",
              "| source | model | GPUs | " + " | ".join(f"{c} err % | {c} err % as GPT" for c in ms) + " |",
              "|---|---|--:|" + "--:|--:|" * len(ms)]
        for i, x in enumerate(llama[ms[0]]):
            L.append(f"| {x['source'].split(',')[0]} | {x['model']} | {x['gpus']} | "
                     + " | ".join(f"{llama[c][i]['error_pct']:+.1f} | {llama[c][i]['error_pct_as_gpt']:+.1f}" for c in ms)
                     + " |")
        for c in ms:
            e = np.abs([x["error_pct"] for x in llama[c]])
            g = np.abs([x["error_pct_as_gpt"] for x in llama[c]])
            L.append(f"\n{c}: mean / max abs % {e.mean():.1f} / {e.max():.1f} as modelled, {g.mean():.1f} / {g.max():.1f} "
                     "read as a GPT.")
    pairs = p["models"]["nccl" if "nccl" in ms else ms[0]].get("precision_pairs") or []
    if pairs:
        L += ["", "## FP8 against BF16 on the same plan (NCCL model)", "",
              "BF16 step seconds over FP8's, for the runs a source published in both.", "",
              "| source | model | GPUs | measured speed-up | predicted | error % |", "|---|---|--:|--:|--:|--:|"]
        L += [f"| {x['source'].split(',')[0]} | {x['model']} | {x['gpus']} | {x['measured_speedup']:.3f} | "
              f"{x['predicted_speedup']:.3f} | {x['error_pct']:+.1f} |" for x in pairs]
    scaling = p["models"]["nccl" if "nccl" in ms else ms[0]].get("weak_scaling") or []
    if scaling:
        L += ["", "## Growing the cluster with the plan fixed (NCCL model)", "",
              "Step time from the smallest to the largest cluster of a recipe published at three sizes or more, the "
              "global batch growing with the GPUs.", "",
              "| source | model | GPUs | measured growth % | predicted growth % |", "|---|---|---|--:|--:|"]
        L += [f"| {x['source'].split(',')[0]} | {x['model']} | {x['gpus'][0]} -> {x['gpus'][1]} | "
              f"{x['measured_growth_pct']:+.1f} | {x['predicted_growth_pct']:+.1f} |" for x in scaling]
    if p.get("memory"):
        L += ["", "## Peak memory per GPU: published vs predicted", "",
              "Each run read as its torchtitan job config (the flavor's shape, the plan); published: torchtitan's "
              "max reserved memory.", "",
              "| source | model | plan | GPUs | published GiB | predicted GiB | error % |", "|---|---|---|--:|--:|--:|--:|"]
        for x in p["memory"]:
            L.append(f"| {x['source'].split(',')[0]} | {x['model']} | {x['plan']} | {x['gpus']} | {x['published_gib']:.1f} | "
                     f"{x['predicted_gib']:.1f} | {x['error_pct']:+.1f} |")
    own = p["models"].get("nccl", {}).get("own_network") or []
    if own:
        L += ["", "## Sources on their own network: the same runs on the catalog's (NCCL model)", "",
              "Each row of a source that names its network (the data file's `network`) predicted again on the catalog "
              "entry's network: how much slower the source's own network makes the run, as tuner predicts it.", "",
              "| source | model | plan | predicted s | on the catalog's network s | own network slower % |",
              "|---|---|---|--:|--:|--:|"]
        L += [f"| {x['source'].split(',')[0]} | {x['model']} | {x['plan']} | {x['predicted_s']:.2f} | "
              f"{x['predicted_s_catalog_network']:.2f} | {x['own_network_slower_pct']:+.1f} |" for x in own]
    if p.get("source_memory"):
        L += ["", "## Memory beside the timed rows: published vs predicted", "",
              "The per-GPU memory a source gives beside its step times (BigScience: nvidia-smi's largest use, "
              "which counts the CUDA context and the allocator's cache besides the tensors tuner predicts) and the "
              "plans it published as out of memory; predicted: tuner's peak of the fullest pipeline stage.", "",
              "| source | model | heads | plan | published GiB | predicted GiB | error % | predicted to fit |",
              "|---|---|--:|---|--:|--:|--:|---|"]
        for x in p["source_memory"]:
            pub = "out of memory" if x["published_gib"] is None else f"{x['published_gib']:.0f}"
            L.append(f"| {x['source'].split(',')[0]} | {x['model']} | {x['heads']} | {x['plan']} | {pub} | "
                     f"{x['predicted_gib']:.1f} | {_f(x['error_pct'], '{:+.1f}')} | "
                     f"{'yes' if x['predicted_fits'] else 'no'} ({x['device_gib']:.0f} GiB) |")
    if p.get("reported"):
        L += ["", "## Reported beside the validation: runs outside tuner's model", "",
              "torch.compile (tuner prices the eager program) on H100s capped at 500 W (the catalog's H100 at its "
              "700 W peak); read as their torchtitan job config. Not in the headline figures.", "",
              "| source | model | plan | Float8 | async TP | GPUs | published tokens/s/GPU | predicted | error % |",
              "|---|---|---|---|---|--:|--:|--:|--:|"]
        for x in p["reported"]:
            L.append(f"| {x['source'].split(',')[0]} | {x['model']} | {x['plan']} | {'yes' if x['float8'] else 'no'} | "
                     f"{'yes' if x['async_tp'] else 'no'} | "
                     f"{x['gpus']} | "
                     f"{x['published_tokens_per_s_per_gpu']:.0f} | {x['predicted_tokens_per_s_per_gpu']:.0f} | "
                     f"{x['error_pct']:+.1f} |")
    L += ["", "## SC21 §5.4 orderings (64 A100s; text claims, no published numbers)", "",
          "| figure | claim | (t, p, d) | " + " | ".join(f"{c}: TFLOP/s/GPU" for c in ms) + " | " +
          " | ".join(f"{c} holds" for c in ms) + " |", "|---|---|---|" + "---|" * (2 * len(ms))]
    for i, x in enumerate(p["models"][ms[0]]["sc21_sweeps"]):
        sw = [p["models"][c]["sc21_sweeps"][i] for c in ms]
        L.append(f"| {x['figure']} | {x['claim']} | {x['grid_t_p_d']} | " + " | ".join(str(s["predicted_tflops_per_gpu"]) for s in sw)
                 + " | " + " | ".join("yes" if s["holds"] else "no" for s in sw) + " |")
    L += ["", "## Rows", "", "| source | model | GPUs | t | p | c | d | split | measured s | "
          + " | ".join(f"{c} s | {c} err %" for c in ms) + " |", "|---|---|--:|--:|--:|--:|--:|---|--:|" + "--:|--:|" * len(ms)]
    for r in p["rows"]:
        pl = r["plan"]
        L.append(f"| {r['source'].split(',')[0]} | {r['model']} | {r['gpus']} | {pl['tp']} | {pl['pp']} | "
                 f"{pl.get('cp', 1)} | {pl['dp']} | "
                 f"{r['split']} | {r['measured_s']:.2f} | "
                 + " | ".join(f"{_f(r[f'predicted_s_{c}'], '{:.2f}')} | {_f(r[f'error_pct_{c}'], '{:+.1f}')}" for c in ms) + " |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
