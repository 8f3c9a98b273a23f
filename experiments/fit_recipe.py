"""Held-out error and fitting time of the kernel MLPs under variants of the fitting recipe.

``tuner calibrate --quick`` spends minutes fitting its MLPs (293 s of the 887 s on the AVX2 VM of
session 22: 1500 full-batch epochs per configuration, the grid searched twice where a kernel has
optional alignment features, then an ensemble of nets from several seeds). This script refits every
MLP kernel of stored calibration data under each recipe variant — training precision
(:data:`predictor.timing.kernels.learned.TRAIN_DTYPE`; float32 uses PyTorch's fused AdamW) and ensemble
size (:data:`predictor.timing.calibrate.MLP_MEMBERS` of the pack's level) — by the calibration's own code
(:func:`experiments.kernel_model_variants.fit_spec`: same split, grid, prediction path, one process),
and reports held-out GMAE and wall seconds per fit.

    python experiments/fit_recipe.py --packs benchmarks/results/data/packs/cpu-avx2-q22 \\
        [--variants float64x5 float32x5 float32x3] [--kernels addmm/fp32 ...]

writes ``experiments/results/fit_recipe.md`` and ``.csv`` (minutes per pack and variant; fit times are
of the host that runs it, so run it on a quiet machine and compare within one run).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import predictor.timing.calibrate as calibrate_mod  # noqa: E402
import predictor.timing.kernels.learned as learned  # noqa: E402
from experiments.common import fail, host_line, repo_relative  # noqa: E402
from experiments.kernel_model_variants import _specs, fit_spec  # noqa: E402
from predictor.timing.platforms.assets import AssetPackError, load_asset_pack  # noqa: E402

#: recipe variants: training precision x ensemble size, e.g. "float32x3"
DEFAULT_VARIANTS = ("float64x5", "float32x5", "float32x3")
_VARIANT = re.compile(r"(float32|float64)x([1-9][0-9]*)")


def parse_variant(text: str) -> tuple[str, int]:
    """``"float32x3"`` -> ``("float32", 3)``; one line and exit 2 on anything else."""
    m = _VARIANT.fullmatch(text.strip())
    if not m:
        fail(f"--variants {text}: expected PRECISIONxMEMBERS, e.g. float32x3 (precision float32 or float64)")
    return m.group(1), int(m.group(2))


def run(packs: list[Path], variants: list[str], kernels: set[str] | None, log=print) -> pd.DataFrame:
    """One row per (pack, kernel, variant): held-out GMAE / max (percent), fit seconds, model."""
    rows: list[dict] = []
    parsed = [(v, *parse_variant(v)) for v in variants]
    saved_dtype, saved_members = learned.TRAIN_DTYPE, dict(calibrate_mod.MLP_MEMBERS)
    try:
        for path in packs:
            try:
                pack = load_asset_pack(path, allow_unfitted=True)
            except AssetPackError as exc:
                fail(f"{path}: {exc}")
            level = pack.manifest.get("level", "quick")
            data = {f.stem: pd.read_csv(f) for f in sorted((pack.path / "data").glob("*.csv"))}
            for fam, spec in _specs(pack.manifest, list(data)):
                if spec.method != "mlp" or (kernels is not None and spec.kernel not in kernels):
                    continue
                for label, precision, members in parsed:
                    learned.TRAIN_DTYPE = precision
                    calibrate_mod.MLP_MEMBERS[level] = members
                    t0 = time.perf_counter()
                    _, r = fit_spec(pack, fam, data[fam], spec)
                    took = time.perf_counter() - t0
                    if r is None:
                        continue
                    rows.append({"pack": path.name, "kernel": spec.kernel, "variant": label,
                                 "samples": r["samples"], "gmae_pct": r["gmae_pct"], "max_pct": r["max_pct"],
                                 "fit_s": took, "model": r["model"]})
                    log(f"{path.name:<16} {spec.kernel:<18} {label:<10} GMAE {r['gmae_pct']:6.2f} %  "
                        f"max {r['max_pct']:6.1f} %  {took:5.1f} s")
    finally:
        learned.TRAIN_DTYPE = saved_dtype
        calibrate_mod.MLP_MEMBERS.update(saved_members)
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame, command: str, host: str) -> str:
    variants = list(dict.fromkeys(df["variant"]))
    lines = ["# Kernel MLPs under variants of the fitting recipe", "",
             "Each MLP kernel of each pack refitted by the calibration's own code under each variant: training "
             "precision (`predictor.timing.kernels.learned.TRAIN_DTYPE`; float32 with PyTorch's fused AdamW) x nets in the "
             "ensemble (`predictor.timing.calibrate.MLP_MEMBERS`). Held-out GMAE on the pack's own 20 % and the wall "
             "seconds of each fit (grid search + ensemble, one process).", "", f"Reproduce: `{command}`", "", host, ""]
    for pack, part in df.groupby("pack", sort=False):
        g = part.pivot_table(index="kernel", columns="variant", values="gmae_pct", sort=False)
        t = part.pivot_table(index="kernel", columns="variant", values="fit_s", sort=False)
        lines += [f"## {pack}", "", "| kernel | samples | " + " | ".join(f"GMAE % {v}" for v in variants) + " | "
                  + " | ".join(f"fit s {v}" for v in variants) + " |", "|---|---:|" + "---:|" * (2 * len(variants))]
        for kernel in g.index:
            n = int(part[part.kernel == kernel].samples.iloc[0])
            lines.append(f"| {kernel} | {n} | " + " | ".join(f"{g.loc[kernel].get(v, np.nan):.2f}" for v in variants)
                         + " | " + " | ".join(f"{t.loc[kernel].get(v, np.nan):.1f}" for v in variants) + " |")
        lines += ["", "Geomean of the kernels' GMAE: " + ", ".join(
            f"{v} {np.exp(np.log(g[v]).mean()):.2f} %" for v in variants if v in g) + "; fitting " + ", ".join(
            f"{v} {t[v].sum():.0f} s" for v in variants if v in t) + ".", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", nargs="+", required=True, help="asset packs that store benchmark data")
    ap.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS),
                    help="PRECISIONxMEMBERS, e.g. float32x3 (default: %(default)s)")
    ap.add_argument("--kernels", nargs="*", help="only these kernels (default: every MLP kernel)")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "fit_recipe.md")
    a = ap.parse_args(argv)
    for v in a.variants:
        parse_variant(v)
    df = run([Path(p) for p in a.packs], a.variants, set(a.kernels) if a.kernels else None)
    if df.empty:
        fail("no MLP kernel was fitted (check --packs / --kernels)")
    command = "python experiments/fit_recipe.py --packs " + " ".join(
        repo_relative(p) for p in a.packs)
    if list(a.variants) != list(DEFAULT_VARIANTS):
        command += " --variants " + " ".join(a.variants)
    if a.kernels:
        command += " --kernels " + " ".join(a.kernels)
    from predictor.timing.platforms.cpu_local import cpu_signature
    from tuner.report import atomic_write_text

    atomic_write_text(a.out, markdown(df, command, host_line({"cpu": cpu_signature()})))
    df.to_csv(a.out.with_suffix(".csv"), index=False)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
