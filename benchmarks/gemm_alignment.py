"""CPU GEMM models with and without the multiple-of-16 indicators: held-out error on stored benchmarks.

For every GEMM kernel (``addmm``, ``mm``, ``bmm`` x fp32 / bf16) of the given measurement files,
this fits the calibration's MLP twice on the same 80 % of the samples (the split
``tuner calibrate`` uses): once on log2 ``m, n, k[, batch]`` alone, once with ``m_al16, n_al16,
k_al16`` added (1 when that dimension is a multiple of 16). It reports both held-out errors
(GMAE, max), both validation MSEs, and which one the calibration keeps
(:data:`predictor.timing.kernels.learned.OPTIONAL_GAIN`: the indicators stay only if they bring the
validation MSE below that share of the MSE without them). Nothing is measured: the inputs are
timings already taken (an asset pack's ``data/gemm.csv``), so the figures are reproducible on
any machine.

Run:  python benchmarks/gemm_alignment.py
      (the committed pack and the quiet-VM GEMM timings of session 11; about 2 minutes)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: measurement files compared by default: label -> gemm.csv (repo-relative)
DEFAULT_SOURCES = {
    "cpu-local (the committed pack)": "assets/cpu-local/data/gemm.csv",
    "quiet VM (session 11, pack not committed)": "benchmarks/results/data/gemm_cpu_quiet.csv",
}


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def compare(csv: Path) -> list[dict]:
    """Per GEMM kernel of ``csv``: held-out and validation errors with and without the indicators.

    Raises:
        ValueError: ``csv`` is malformed, lacks the benchmark columns, or holds other kernels.
    """
    import numpy as np
    import pandas as pd
    import torch

    from predictor.metrics import geomean_abs_pct_error, max_abs_pct_error
    from predictor.timing.calibrate import MLP_SETTINGS, _split
    from predictor.timing.calibration.base import BenchContext
    from predictor.timing.calibration.gemm import GemmBenchmark
    from predictor.timing.calibration.timing import Timer
    from predictor.timing.kernels.learned import feature_matrix, fit_mlp, keeps_optional

    # the CPU calibration's own model specs: features, which of them are optional, log or raw, work
    ctx = BenchContext(device=torch.device("cpu"), level="quick", rng=np.random.default_rng(0), timer=Timer("cpu"))
    specs = {s.kernel: s for s in GemmBenchmark().specs(ctx)}
    grid, epochs, budget = MLP_SETTINGS["quick"]
    frame = pd.read_csv(csv)  # a malformed file raises a ValueError (pandas' parser errors are ones)
    need = {"kernel", "m", "n", "k", "batch", "seconds"}
    if not need <= set(frame.columns):
        raise ValueError(f"lacks the GEMM benchmark columns {sorted(need - set(frame.columns))}")
    if frame[sorted(need)].isna().any().any():
        raise ValueError("rows with empty GEMM columns (a truncated file?)")
    foreign = sorted(set(frame["kernel"].astype(str)) - set(specs))
    if foreign:
        raise ValueError(f"kernels {foreign} are not CPU GEMM kernels ({', '.join(specs)})")
    rows = []
    for kernel, sub in frame.groupby("kernel", sort=False):
        spec = specs[str(kernel)]
        sub = sub.reset_index(drop=True)
        tr, te = _split(len(sub), 0, str(kernel))
        train, test = sub.iloc[tr], sub.iloc[te]
        cols = {c: train[c].to_numpy(dtype=np.float64) for c in ("m", "n", "k", "batch")}
        tcols = {c: test[c].to_numpy(dtype=np.float64) for c in ("m", "n", "k", "batch")}
        actual = test["seconds"].to_numpy()
        base = tuple(f for f in spec.features if f not in spec.optional_features)
        logs = [f for f in spec.features if f not in spec.raw_features]
        row: dict = {"kernel": kernel, "samples": len(sub), "held_out": len(te),
                     "aligned_share": float(((sub.m % 16 == 0) & (sub.n % 16 == 0) & (sub.k % 16 == 0)).mean())}
        for tag, feats in (("without", base), ("with", spec.features)):
            net = fit_mlp(feature_matrix(cols, feats, len(train)), train["seconds"].to_numpy(), feats,
                          log_features=[f for f in feats if f in logs], work=spec.work, grid=grid, epochs=epochs,
                          seed=0, budget_s=budget)
            pred = net.predict(feature_matrix(tcols, feats, len(test)))
            row[f"gmae_{tag}_pct"] = geomean_abs_pct_error(pred, actual)
            row[f"max_{tag}_pct"] = max_abs_pct_error(pred, actual)
            row[f"val_mse_{tag}"] = net.config["val_mse_log2"]
        row["kept"] = keeps_optional(row["val_mse_without"], row["val_mse_with"])
        row["gmae_calibrated_pct"] = row["gmae_with_pct"] if row["kept"] else row["gmae_without_pct"]
        rows.append(row)
    return rows


def render(results: dict[str, list[dict]]) -> str:
    from predictor.timing.kernels.learned import OPTIONAL_GAIN

    lines = [
        "# CPU GEMM models with and without multiple-of-16 indicators",
        "",
        "Same stored timings, same 80/20 split as `tuner calibrate` (seed 0), same MLP grid (`--quick`); the "
        "only change is three 0/1 inputs `m_al16, n_al16, k_al16`. Errors are on the held-out 20 %. "
        f"`kept`: the calibration keeps the indicators when their validation MSE (log2 s, on a split of the "
        f"training 80 %) is below {OPTIONAL_GAIN} x the MSE without them; the held-out set plays no part in "
        "that choice. `aligned` = share of samples with m, n and k all multiples of 16 (the grid rounds half "
        "its shapes; the stored bmm grids predate the fix that keeps bmm's rounded half aligned).",
        "",
        "Reproduce: `python benchmarks/gemm_alignment.py`.",
        "",
    ]
    for label, rows in results.items():
        lines += [f"## {label}", "",
                  "| kernel | samples | held out | aligned | GMAE % without | GMAE % with | max % without | "
                  "max % with | val MSE without | val MSE with | kept | calibrated GMAE % |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
        for r in rows:
            lines.append(
                f"| {r['kernel']} | {r['samples']} | {r['held_out']} | {r['aligned_share']:.0%} | "
                f"{r['gmae_without_pct']:.2f} | {r['gmae_with_pct']:.2f} | {r['max_without_pct']:.0f} | "
                f"{r['max_with_pct']:.0f} | {r['val_mse_without']:.4f} | {r['val_mse_with']:.4f} | "
                f"{'yes' if r['kept'] else 'no'} | {r['gmae_calibrated_pct']:.2f} |")
        lines.append("")
    lines += [
        "## End to end",
        "",
        "The committed pack refitted with the indicators is judged on the archived training-step windows in "
        "`benchmarks/results/e2e_windows_align16.md` (`tuner calibrate --refit assets/cpu-local --out "
        "/tmp/cpu-local-al16`, then `python experiments/e2e_windows.py --platform cpu-local --compare "
        "/tmp/cpu-local-al16 --out benchmarks/results/e2e_windows_align16.md`).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", nargs="*", default=None, help="gemm.csv files (default: the two in DEFAULT_SOURCES)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gemm_alignment"))
    args = ap.parse_args()
    sources = {Path(p).as_posix(): ROOT / p for p in args.csv} if args.csv else \
        {k: ROOT / v for k, v in DEFAULT_SOURCES.items()}
    missing = [str(p) for p in sources.values() if not p.is_file()]
    if missing:
        _fail(f"no such measurement file: {', '.join(missing)}")

    from predictor.files import atomic_write_text

    results = {}
    for label, path in sources.items():
        try:
            results[label] = compare(path)
        except (ValueError, UnicodeDecodeError) as exc:  # before anything is written
            _fail(f"{path}: not a GEMM benchmark file of a CPU calibration: {exc}")
    out = Path(args.out)
    atomic_write_text(out.with_suffix(".json"), json.dumps(results, indent=1, default=float))
    text = render(results)
    atomic_write_text(out.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
