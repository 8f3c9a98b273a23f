"""Held-out error and fitting time of the kernel MLPs trained in float64 against float32 (fused AdamW).

``tuner calibrate --quick`` spends minutes fitting its MLPs (293 s of the 887 s on the AVX2 VM of
session 22: 1500 full-batch epochs per configuration, the grid searched twice where a kernel has
optional alignment features, then a 5-net ensemble). The nets are stored in float32 anyway, so
training them in float32 is a question of accuracy: this script refits every MLP kernel of stored
calibration data with :data:`predictor.kernels.learned.TRAIN_DTYPE` set to each precision, by the
calibration's own code (:func:`experiments.kernel_model_variants.fit_spec`: same split, grid, ensemble,
prediction path, one process), and reports held-out GMAE and wall seconds per fit.

    python experiments/fit_precision.py --packs benchmarks/results/data/packs/cpu-s19x2 \\
        benchmarks/results/data/packs/cpu-avx2-q22 [--kernels addmm/fp32 ...]

writes ``experiments/results/fit_precision.md`` (a few minutes per pack; fit times are of the host
that runs it, so run it on a quiet machine and compare within one run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import predictor.kernels.learned as learned  # noqa: E402
from experiments.common import fail, host_line  # noqa: E402
from experiments.kernel_model_variants import _specs, fit_spec  # noqa: E402
from predictor.platforms.assets import AssetPackError, load_asset_pack  # noqa: E402

PRECISIONS = ("float64", "float32")


def run(packs: list[Path], kernels: set[str] | None, log=print) -> pd.DataFrame:
    """One row per (pack, kernel, precision): held-out GMAE / max (percent), fit seconds, model."""
    rows: list[dict] = []
    saved = learned.TRAIN_DTYPE
    try:
        for path in packs:
            try:
                pack = load_asset_pack(path, allow_unfitted=True)
            except AssetPackError as exc:
                fail(f"{path}: {exc}")
            data = {f.stem: pd.read_csv(f) for f in sorted((pack.path / "data").glob("*.csv"))}
            for fam, spec in _specs(pack.manifest, list(data)):
                if spec.method != "mlp" or (kernels is not None and spec.kernel not in kernels):
                    continue
                for precision in PRECISIONS:
                    learned.TRAIN_DTYPE = precision
                    t0 = time.perf_counter()
                    _, r = fit_spec(pack, fam, data[fam], spec)
                    took = time.perf_counter() - t0
                    if r is None:
                        continue
                    rows.append({"pack": pack.name, "kernel": spec.kernel, "precision": precision,
                                 "samples": r["samples"], "gmae_pct": r["gmae_pct"], "max_pct": r["max_pct"],
                                 "fit_s": took, "model": r["model"]})
                    log(f"{pack.name:<16} {spec.kernel:<18} {precision:<8} GMAE {r['gmae_pct']:6.2f} %  "
                        f"max {r['max_pct']:6.1f} %  {took:5.1f} s")
    finally:
        learned.TRAIN_DTYPE = saved
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame, command: str, host: str) -> str:
    lines = ["# Kernel MLPs trained in float64 and float32", "",
             "Each MLP kernel of each pack refitted by the calibration's own code with "
             "`predictor.kernels.learned.TRAIN_DTYPE` set to each precision (float32 uses PyTorch's fused AdamW); "
             "held-out GMAE on the pack's own 20 % and the wall seconds of the fit (grid search + 5-net ensemble, "
             "one process).", "", f"Reproduce: `{command}`", "", host, ""]
    for pack, part in df.groupby("pack", sort=False):
        wide = part.pivot_table(index="kernel", columns="precision", values=["gmae_pct", "fit_s"], sort=False)
        lines += [f"## {pack}", "", "| kernel | samples | GMAE % f64 | GMAE % f32 | fit s f64 | fit s f32 |",
                  "|---|---:|---:|---:|---:|---:|"]
        for kernel in wide.index:
            n = int(part[part.kernel == kernel].samples.iloc[0])
            g, s = wide.loc[kernel, "gmae_pct"], wide.loc[kernel, "fit_s"]
            lines.append(f"| {kernel} | {n} | {g.get('float64', np.nan):.2f} | {g.get('float32', np.nan):.2f} | "
                         f"{s.get('float64', np.nan):.1f} | {s.get('float32', np.nan):.1f} |")
        g64, g32 = wide["gmae_pct"]["float64"], wide["gmae_pct"]["float32"]
        lines += ["", f"Geomean of the kernels' GMAE: float64 {np.exp(np.log(g64).mean()):.2f} %, float32 "
                  f"{np.exp(np.log(g32).mean()):.2f} %; fitting {wide['fit_s']['float64'].sum():.0f} s against "
                  f"{wide['fit_s']['float32'].sum():.0f} s.", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", nargs="+", required=True, help="asset packs that store benchmark data")
    ap.add_argument("--kernels", nargs="*", help="only these kernels (default: every MLP kernel)")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "fit_precision.md")
    a = ap.parse_args(argv)
    df = run([Path(p) for p in a.packs], set(a.kernels) if a.kernels else None)
    if df.empty:
        fail("no MLP kernel was fitted (check --packs / --kernels)")
    command = "python experiments/fit_precision.py --packs " + " ".join(
        str(Path(p).resolve().relative_to(ROOT)) if Path(p).resolve().is_relative_to(ROOT) else p for p in a.packs)
    if a.kernels:
        command += " --kernels " + " ".join(a.kernels)
    from predictor.platforms.cpu_local import cpu_signature
    from tuner.report import atomic_write_text

    atomic_write_text(a.out, markdown(df, command, host_line({"cpu": cpu_signature()})))
    df.to_csv(a.out.with_suffix(".csv"), index=False)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
