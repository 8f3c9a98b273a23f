"""Predicted vs published iteration times of Megatron-LM training on A100 clusters.

Ground truth (numbers measured by others, cited row by row below):

* **Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", SC21 (arXiv:2104.04473), Table 1** — the weak-scaling GPT runs, 1.7B to 1T
  parameters, on Selene (DGX A100 80GB nodes, 8 x 200 Gb/s HDR InfiniBand per node). The table
  gives the achieved teraFLOP/s per GPU ``X``; the iteration time follows from the paper's own
  FLOP count (its eq. 3, which assumes activation recomputation):
  ``F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))`` and ``t = F / (n X)``.
  All models: sequence ``s = 2048``, vocabulary ``V = 51,200``.
* **Narayanan et al. SC21, Table 2, the PTD-P rows** — the 174.6B (t=8, p=12) and 529.6B
  (t=8, p=35) models at three GPU counts each (micro-batch 1); same conversion. These are
  several plans of the same model.
* **Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
  MLSys 2023 (arXiv:2205.05198), Table 5** — end-to-end iteration seconds of the 22B, 175B,
  530B and 1T models with full recomputation and with sequence parallelism + selective
  recomputation, on the configurations of their Table 3 (22B: t=8, p=1, batch 4, micro-batch
  4; 175B: t=8, p=8, batch 64; 530B: t=8, p=35, batch 280; 1T: t=8, p=64, batch 512;
  micro-batch 1, data-parallel size 1). The same eight numbers are Calculon's validation set
  (Isaev et al., SC23; ``calculon/megatron/validation.py`` of github.com/calculon-ai/calculon,
  which reports 3.65% mean error on them).

Settings the tables do not state, fixed before looking at any error and the same for every
row: fp16, unfused attention (the pre-FlashAttention Megatron kernels these runs used),
Megatron's scatter/gather p2p optimisation, no overlap of the data-parallel gradient
all-reduce with backward (Megatron-LM's local DDP of 2021-22), micro-batch 1 for SC21 Table 1
(Table 2's PTD-P rows use 1), and the non-interleaved 1F1B schedule for SC21 (its default).
For Korthikanti's 175B and 530B runs we take the interleaved schedule with 3 model chunks
per stage and for 1T none, as in Calculon's validation configurations
(``validation/{175B,530B,1T}_{full,seqsel}.json``).

Calibration: the catalog's A100 entry with the script's starting GEMM ceiling
(``STARTING_GEMM_EFFICIENCY``, Centimani's 1k GEMM: the catalog's value before it carried the
multi-node validation's fit) is the "uncalibrated" prediction. Then ONE global
constant, the GEMM efficiency ceiling ``gemm_efficiency_max``, is fitted (golden-section
search on the mean absolute error) on SC21 Table 1 only and evaluated on the held-out rows
(Korthikanti Table 5 and SC21 Table 2). No per-row tuning.

Run: ``python experiments/megatron_validation.py`` (writes
``experiments/results/megatron_validation.md`` and ``.json``; a few minutes on 2 cores).
"""

from __future__ import annotations

import json
import platform as _pyplatform
import sys
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau, spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import golden_section  # noqa: E402
from predictor.metrics import geomean_abs_pct_error, max_abs_pct_error, mean_abs_pct_error  # noqa: E402
from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec  # noqa: E402
from predictor.timing.platforms import get_platform  # noqa: E402
from tuner.plans import predict_plan  # noqa: E402

OUT = ROOT / "experiments" / "results"
SEQ, VOCAB = 2048, 51200


@dataclass(frozen=True)
class Row:
    """One published measurement and the configuration it was measured at."""

    source: str  #: table and row
    model: str
    params_b: float  #: parameters (billions) as published
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    micro_batch: int
    measured_s: float  #: iteration seconds (published, or converted from published TFLOP/s)
    tflops_per_gpu: float | None = None  #: published achieved TFLOP/s per GPU (SC21)
    recompute: str = "full"
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    virtual_stages: int = 2
    split: str = "fit"

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)


def sc21_iteration_s(batch: int, layers: int, hidden: int, gpus: int, tflops: float) -> float:
    """SC21 eq. 3 FLOPs per iteration / (GPUs x achieved FLOP/s per GPU), seconds."""
    s, h, n_l, V = SEQ, hidden, layers, VOCAB
    flops = 96.0 * batch * s * n_l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * n_l * h))
    return flops / (gpus * tflops * 1e12)


def _sc21(source, params, heads, hidden, layers, tp, pp, gpus, batch, tflops, split, mb=1) -> Row:
    t = sc21_iteration_s(batch, layers, hidden, gpus, tflops)
    return Row(source, f"GPT {params}B", params, heads, hidden, layers, tp, pp, gpus, batch, mb, t, tflops, split=split)


ROWS: list[Row] = [
    # Narayanan et al. SC21 Table 1: params (B), heads, hidden, layers, t, p, GPUs, batch, achieved TFLOP/s per GPU
    _sc21("SC21 Tab.1", 1.7, 24, 2304, 24, 1, 1, 32, 512, 137, "fit"),
    _sc21("SC21 Tab.1", 3.6, 32, 3072, 30, 2, 1, 64, 512, 138, "fit"),
    _sc21("SC21 Tab.1", 7.5, 32, 4096, 36, 4, 1, 128, 512, 142, "fit"),
    _sc21("SC21 Tab.1", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, "fit"),
    _sc21("SC21 Tab.1", 39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, "fit"),
    _sc21("SC21 Tab.1", 76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, "fit"),
    _sc21("SC21 Tab.1", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, "fit"),
    _sc21("SC21 Tab.1", 310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, "fit"),
    _sc21("SC21 Tab.1", 529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, "fit"),
    _sc21("SC21 Tab.1", 1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, "fit"),
    # Narayanan et al. SC21 Table 2, PTD-P rows: params, model-parallel size t x p, batch, GPUs, micro-batch 1, TFLOP/s
    _sc21("SC21 Tab.2 PTD-P", 174.6, 96, 12288, 96, 8, 12, 384, 1536, 153, "held-out"),
    _sc21("SC21 Tab.2 PTD-P", 174.6, 96, 12288, 96, 8, 12, 768, 1536, 149, "held-out"),
    _sc21("SC21 Tab.2 PTD-P", 174.6, 96, 12288, 96, 8, 12, 1536, 1536, 141, "held-out"),
    _sc21("SC21 Tab.2 PTD-P", 529.6, 128, 20480, 105, 8, 35, 560, 2240, 171, "held-out"),
    _sc21("SC21 Tab.2 PTD-P", 529.6, 128, 20480, 105, 8, 35, 1120, 2240, 167, "held-out"),
    _sc21("SC21 Tab.2 PTD-P", 529.6, 128, 20480, 105, 8, 35, 2240, 2240, 159, "held-out"),
]
# Korthikanti et al. 2022 Table 5 (iteration seconds) on their Table 3 configurations
_KORTH = [
    # model, params, heads, hidden, layers, tp, pp, gpus, batch, micro-batch, full-recompute s, SP+selective s, chunks
    ("22B", 22, 64, 6144, 48, 8, 1, 8, 4, 4, 1.42, 1.10, 1),
    ("175B", 175, 96, 12288, 96, 8, 8, 64, 64, 1, 18.13, 13.75, 3),
    ("530B", 530, 128, 20480, 105, 8, 35, 280, 280, 1, 49.05, 37.83, 3),
    ("1T", 1000, 160, 25600, 128, 8, 64, 512, 512, 1, 94.42, 71.49, 1),
]
for name, params, heads, hidden, layers, tp, pp, gpus, batch, mb, full_s, sel_s, chunks in _KORTH:
    sched = "interleaved" if chunks > 1 else "1f1b"
    for rec, sp, t in (("full", False, full_s), ("selective", True, sel_s)):
        ROWS.append(Row("Korthikanti Tab.5", f"{name} {'full recompute' if rec == 'full' else 'SP + selective'}",
                        params, heads, hidden, layers, tp, pp, gpus, batch, mb, t, None, rec, sp, sched,
                        max(chunks, 2), "held-out"))


def spec_of(r: Row) -> TransformerSpec:
    return TransformerSpec(layers=r.layers, hidden=r.hidden, heads=r.heads, seq=SEQ, vocab=VOCAB, dtype="fp16",
                           attention="unfused", name=r.model)


def plan_of(r: Row) -> ParallelPlan:
    return ParallelPlan(tp=r.tp, pp=r.pp, dp=r.dp, micro_batch=r.micro_batch, global_batch=r.batch,
                        schedule=r.schedule, virtual_stages=r.virtual_stages, recompute=r.recompute,  # type: ignore[arg-type]
                        sequence_parallel=r.sequence_parallel, overlap_grad_reduce=False, pp_scatter_gather=True,
                        grad_reduce_dtype="fp16")


#: the uncalibrated GEMM ceiling: Centimani Table 3, 1k fp16 GEMM 291.83 of 312 TFLOP/s (the catalog's A100
#: value before it carried experiments/multinode_validation.py's fit)
STARTING_GEMM_EFFICIENCY = 0.93


def predict_rows(rows: list[Row], gemm_eff: float = STARTING_GEMM_EFFICIENCY) -> list[dict]:
    plat = get_platform("a100-80gb").model_copy(update={"gemm_efficiency_max": gemm_eff})
    out = []
    for r in rows:
        res, _ = predict_plan(spec_of(r), plan_of(r), plat, devices=r.gpus)
        out.append(res)
    return out


def errors(rows: list[Row], preds: list[dict]) -> np.ndarray:
    p = np.asarray([x["predicted_iteration_s"] if x["predicted_iteration_s"] is not None else np.nan for x in preds])
    m = np.asarray([r.measured_s for r in rows])
    return (p - m) / m * 100.0


def fit_gemm_efficiency(rows: list[Row], lo: float = 0.5, hi: float = 0.99, tol: float = 0.004) -> tuple[float, int]:
    """Golden-section search of the mean |error| over ``rows``; returns (efficiency, evaluations)."""
    def f(x: float) -> float:
        return float(np.nanmean(np.abs(errors(rows, predict_rows(rows, x)))))

    return golden_section(f, lo, hi, tol)


def _summary(rows: list[Row], err: np.ndarray, mask: np.ndarray) -> dict:
    p = np.asarray([r.measured_s for r in rows]) * (1 + err / 100)
    m = np.asarray([r.measured_s for r in rows])
    sel = mask & np.isfinite(err)
    return {
        "rows": int(sel.sum()),
        "mean_abs_pct": mean_abs_pct_error(p[sel], m[sel]),
        "geomean_abs_pct": geomean_abs_pct_error(p[sel], m[sel]),
        "max_abs_pct": max_abs_pct_error(p[sel], m[sel]),
        "mean_signed_pct": float(err[sel].mean()),
    }


def rank_checks(rows: list[Row], preds: list[dict]) -> dict:
    """Rank agreement between predicted and measured plans of the same model."""
    pred_t = np.asarray([x["predicted_iteration_s"] for x in preds], dtype=float)
    meas_t = np.asarray([r.measured_s for r in rows])
    out: dict = {}
    # Korthikanti: full recompute vs SP + selective for each model (2 plans per model)
    pairs = []
    for name, *_ in _KORTH:
        idx = [i for i, r in enumerate(rows) if r.source == "Korthikanti Tab.5" and r.model.startswith(name + " ")]
        if len(idx) == 2:
            full, sel = idx
            pairs.append({"model": name, "measured_speedup": meas_t[full] / meas_t[sel],
                          "predicted_speedup": pred_t[full] / pred_t[sel],
                          "same_order": bool((pred_t[full] > pred_t[sel]) == (meas_t[full] > meas_t[sel]))})
    out["korthikanti_pairs"] = pairs
    k = [i for i, r in enumerate(rows) if r.source == "Korthikanti Tab.5"]
    out["korthikanti_pooled"] = {"spearman": float(spearmanr(pred_t[k], meas_t[k])[0]),
                                 "kendall": float(kendalltau(pred_t[k], meas_t[k])[0]), "n": len(k)}
    # SC21 Table 2 PTD-P: three GPU counts per model -> per-GPU throughput ranks (non-trivial) and time ranks
    per_model = []
    for params in (174.6, 529.6):
        idx = [i for i, r in enumerate(rows) if r.source == "SC21 Tab.2 PTD-P" and r.params_b == params]
        meas_tp = np.asarray([rows[i].tflops_per_gpu for i in idx])
        pred_tp = meas_tp * meas_t[idx] / pred_t[idx]  # same FLOP count: throughput scales with 1/time
        per_model.append({
            "model": f"GPT {params}B", "gpus": [rows[i].gpus for i in idx],
            "measured_tflops_per_gpu": meas_tp.tolist(), "predicted_tflops_per_gpu": pred_tp.round(1).tolist(),
            "spearman_throughput": float(spearmanr(pred_tp, meas_tp)[0]),
            "kendall_throughput": float(kendalltau(pred_tp, meas_tp)[0]),
            "spearman_time": float(spearmanr(pred_t[idx], meas_t[idx])[0]),
        })
    out["sc21_table2"] = per_model
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT / "megatron_validation",
                    help="results path without suffix (OUT.md and OUT.json)")
    out = ap.parse_args(argv).out
    t0 = time.perf_counter()
    rows = ROWS
    fit_mask = np.asarray([r.split == "fit" for r in rows])
    base = get_platform("a100-80gb")
    uncal = predict_rows(rows)
    err_u = errors(rows, uncal)
    t_fit = time.perf_counter()
    eff, n_evals = fit_gemm_efficiency([r for r in rows if r.split == "fit"])
    t_fit = time.perf_counter() - t_fit
    cal = predict_rows(rows, eff)
    err_c = errors(rows, cal)
    ranks_u, ranks_c = rank_checks(rows, uncal), rank_checks(rows, cal)
    summ = {
        "uncalibrated": {"all": _summary(rows, err_u, np.ones(len(rows), bool)), "fit": _summary(rows, err_u, fit_mask),
                         "held_out": _summary(rows, err_u, ~fit_mask)},
        "calibrated": {"all": _summary(rows, err_c, np.ones(len(rows), bool)), "fit": _summary(rows, err_c, fit_mask),
                       "held_out": _summary(rows, err_c, ~fit_mask)},
    }
    korth = np.asarray([r.source == "Korthikanti Tab.5" for r in rows])
    summ["uncalibrated"]["korthikanti"] = _summary(rows, err_u, korth)
    summ["calibrated"]["korthikanti"] = _summary(rows, err_c, korth)
    elapsed = time.perf_counter() - t0
    payload = {
        "date": date.today().isoformat(),
        "machine": f"{_pyplatform.machine()} VM, 2 cores (predictions only: no timing measured here)",
        "platform": "a100-80gb (catalog)",
        "catalog_gemm_efficiency_max": base.gemm_efficiency_max,
        "starting_gemm_efficiency_max": STARTING_GEMM_EFFICIENCY,
        "fitted_gemm_efficiency_max": eff,
        "fit_evaluations": n_evals,
        "fit_seconds": t_fit,
        "elapsed_s": elapsed,
        "summary": summ,
        "rank_correlation": {"uncalibrated": ranks_u, "calibrated": ranks_c},
        "rows": [
            {"source": r.source, "model": r.model, "tp": r.tp, "pp": r.pp, "dp": r.dp, "gpus": r.gpus, "batch": r.batch,
             "micro_batch": r.micro_batch, "recompute": r.recompute, "sequence_parallel": r.sequence_parallel,
             "schedule": r.schedule if r.schedule == "1f1b" else f"interleaved x{r.virtual_stages}", "split": r.split,
             "published_tflops_per_gpu": r.tflops_per_gpu, "measured_s": r.measured_s,
             "predicted_s_uncalibrated": u["predicted_iteration_s"], "error_pct_uncalibrated": float(eu),
             "predicted_s_calibrated": c["predicted_iteration_s"], "error_pct_calibrated": float(ec),
             "memory_gib_per_device": u["memory_bytes_per_device"] / 2**30, "graph": u.get("graph")}
            for r, u, c, eu, ec in zip(rows, uncal, cal, err_u, err_c, strict=True)
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    out.with_suffix(".md").write_text(render(payload))
    print(render(payload))


def render(p: dict) -> str:
    s = p["summary"]
    lines = [
        "# Megatron-LM iteration times on A100: predicted vs published",
        "",
        f"`python experiments/megatron_validation.py` — {p['date']}, {p['machine']}; {p['elapsed_s']:.0f} s.",
        "Predictions from each run's configuration with the `a100-80gb` catalog entry (analytic kernel models,",
        "span-aware collectives, one simulated rank per pipeline stage). Sources and the settings the tables do",
        "not state are in the script's docstring.",
        "",
        f"**Uncalibrated** (starting `gemm_efficiency_max` = {p['starting_gemm_efficiency_max']}): mean |error| "
        f"{s['uncalibrated']['all']['mean_abs_pct']:.1f}% over all {s['uncalibrated']['all']['rows']} rows "
        f"(geomean {s['uncalibrated']['all']['geomean_abs_pct']:.1f}%, max {s['uncalibrated']['all']['max_abs_pct']:.1f}%, "
        f"mean signed {s['uncalibrated']['all']['mean_signed_pct']:+.1f}%); Korthikanti Table 5: "
        f"{s['uncalibrated']['korthikanti']['mean_abs_pct']:.1f}% mean, {s['uncalibrated']['korthikanti']['max_abs_pct']:.1f}% max.",
        "",
        f"**Calibrated** — one global constant, `gemm_efficiency_max` = {p['fitted_gemm_efficiency_max']:.3f}, fitted on "
        f"SC21 Table 1 only ({p['fit_evaluations']} golden-section evaluations): fit rows "
        f"{s['calibrated']['fit']['mean_abs_pct']:.1f}% mean |error|; **held-out rows (Korthikanti Table 5 + SC21 "
        f"Table 2) {s['calibrated']['held_out']['mean_abs_pct']:.1f}% mean, "
        f"{s['calibrated']['held_out']['max_abs_pct']:.1f}% max** (geomean {s['calibrated']['held_out']['geomean_abs_pct']:.1f}%); "
        f"Korthikanti Table 5 alone {s['calibrated']['korthikanti']['mean_abs_pct']:.1f}% mean "
        f"(Calculon reports 3.65% on these eight). Target: mean under 10%.",
        "",
        "| source | model | t | p | d | GPUs | batch | mb | recompute | SP | schedule | split | measured s | "
        "pred. s (uncal.) | err % | pred. s (cal.) | err % | GiB/GPU |",
        "|---|---|--:|--:|--:|--:|--:|--:|---|---|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in p["rows"]:
        lines.append(
            f"| {r['source']} | {r['model']} | {r['tp']} | {r['pp']} | {r['dp']} | {r['gpus']} | {r['batch']} | "
            f"{r['micro_batch']} | {r['recompute']} | {'y' if r['sequence_parallel'] else ''} | {r['schedule']} | "
            f"{r['split']} | {r['measured_s']:.2f} | {r['predicted_s_uncalibrated']:.2f} | "
            f"{r['error_pct_uncalibrated']:+.1f} | {r['predicted_s_calibrated']:.2f} | {r['error_pct_calibrated']:+.1f} | "
            f"{r['memory_gib_per_device']:.1f} |")
    lines += ["", "SC21 rows: measured seconds = SC21 eq. 3 FLOPs / (GPUs x published TFLOP/s per GPU).", ""]
    lines += ["## Summary", "", "| timing | rows | mean abs % | geomean abs % | max abs % | mean signed % |",
              "|---|---|--:|--:|--:|--:|"]
    for tag in ("uncalibrated", "calibrated"):
        for part in ("fit", "held_out", "korthikanti", "all"):
            x = s[tag][part]
            lines.append(f"| {tag} | {part} ({x['rows']}) | {x['mean_abs_pct']:.1f} | {x['geomean_abs_pct']:.1f} | "
                         f"{x['max_abs_pct']:.1f} | {x['mean_signed_pct']:+.1f} |")
    lines += ["", "## Rank correlation between plans of the same model", ""]
    for tag in ("uncalibrated", "calibrated"):
        rc = p["rank_correlation"][tag]
        lines.append(f"**{tag}.** Korthikanti Table 5, full recompute vs SP + selective (2 plans per model):")
        lines.append("")
        lines.append("| model | measured speed-up | predicted speed-up | same order |")
        lines.append("|---|--:|--:|---|")
        for x in rc["korthikanti_pairs"]:
            lines.append(f"| {x['model']} | {x['measured_speedup']:.3f} | {x['predicted_speedup']:.3f} | "
                         f"{'yes' if x['same_order'] else 'no'} |")
        kp = rc["korthikanti_pooled"]
        lines.append("")
        lines.append(f"Pooled over the {kp['n']} Korthikanti rows (different models, so dominated by size): "
                     f"Spearman {kp['spearman']:.3f}, Kendall {kp['kendall']:.3f}.")
        lines.append("")
        lines.append("SC21 Table 2 PTD-P, one model at three GPU counts (ranks of per-GPU throughput — the non-trivial "
                     "order; iteration time falls with GPUs in both):")
        lines.append("")
        lines.append("| model | GPUs | measured TFLOP/s/GPU | predicted TFLOP/s/GPU | Spearman | Kendall | Spearman (time) |")
        lines.append("|---|---|---|---|--:|--:|--:|")
        for x in rc["sc21_table2"]:
            lines.append(f"| {x['model']} | {x['gpus']} | {x['measured_tflops_per_gpu']} | {x['predicted_tflops_per_gpu']} | "
                         f"{x['spearman_throughput']:.2f} | {x['kendall_throughput']:.2f} | {x['spearman_time']:.2f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
