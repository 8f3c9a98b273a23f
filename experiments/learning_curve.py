"""Held-out error of a kernel model against the number of training samples (stored calibration data).

For each pack and kernel the model is fitted by the calibration's own code
(:func:`predictor.timing.calibrate._fit_all`) on a random share of its training samples, and scored on the
same held-out 20 % the pack's error table uses, so the curve says how much a model gains from a
longer calibration (``--scale``) or from a larger share of its family's budget. The training subset
is drawn once per share (seed 1) from the pack's own training split.

    python experiments/learning_curve.py --packs benchmarks/results/data/packs/cpu-dm20x8 \\
        --kernels transpose concat memcpy --out experiments/results/learning_curve_data_movement.md

takes ~10-40 s per fit of an MLP kernel on this 2-core VM.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import repo_relative  # noqa: E402
from experiments.kernel_model_variants import _specs, fit_spec  # noqa: E402
from predictor.timing.platforms.assets import load_asset_pack  # noqa: E402

DEFAULT_SHARES = (0.1, 0.25, 0.5, 0.75, 1.0)


def run(packs: list[Path], kernels: list[str], shares: list[float],
        log: Callable[[str], None] = print) -> pd.DataFrame:
    """One row per (pack, kernel, share): training samples used and held-out GMAE / MAPE (percent)."""
    rows: list[dict] = []
    for path in packs:
        pack = load_asset_pack(path, allow_unfitted=True)
        m = pack.manifest
        data = {f.stem: pd.read_csv(f) for f in sorted((pack.path / "data").glob("*.csv"))}
        specs = {s.kernel: (fam, s) for fam, s in _specs(m, list(data))}
        for kernel in kernels:
            if kernel not in specs:
                log(f"{pack.name}: no {kernel} data, skipped")
                continue
            fam, spec = specs[kernel]
            for share in shares:
                used: list[int] = []

                def subset(train: np.ndarray, _share: float = share, _used: list[int] = used) -> np.ndarray:
                    keep = np.sort(np.random.default_rng(1).permutation(train)[: max(4, round(_share * len(train)))])
                    _used.append(len(keep))
                    return keep

                _, r = fit_spec(pack, fam, data[fam], spec, train=subset)
                if r is None:
                    continue
                rows.append({"pack": pack.name, "kernel": kernel, "share": share, "train": used[0] if used else 0,
                             "test": r["test"], "gmae_pct": r["gmae_pct"], "mape_pct": r["mape_pct"],
                             "model": r["model"]})
                log(f"{pack.name:<12} {kernel:<16} share {share:4.2f} ({rows[-1]['train']:4d} training samples): "
                    f"GMAE {r['gmae_pct']:6.2f} %")
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame, command: str) -> str:
    lines = ["# Kernel models: held-out error against training samples", "",
             "Each fit is the calibration's own (`predictor.timing.calibrate._fit_all`) on a random share of the pack's "
             "training split (seed 1), scored on the pack's held-out 20 %. MLP ensembles train from fixed seeds, "
             "but a refit can move a GMAE by about a point.", "", f"Reproduce: `{command}`", ""]
    for (pack, kernel), g in df.groupby(["pack", "kernel"], sort=False):
        lines += [f"## {kernel} (`{pack}`, {int(g.test.iloc[0])} held out)", "",
                  "| share | training samples | GMAE % | MAPE % |", "|---:|---:|---:|---:|"]
        lines += [f"| {r.share:.2f} | {r.train} | {r.gmae_pct:.2f} | {r.mape_pct:.2f} |" for r in g.itertuples()]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", nargs="+", required=True, help="asset packs that store benchmark data")
    ap.add_argument("--kernels", nargs="+", required=True)
    ap.add_argument("--shares", nargs="+", type=float, default=list(DEFAULT_SHARES))
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "learning_curve.md"))
    a = ap.parse_args(argv)
    bad = [s for s in a.shares if not 0.0 < s <= 1.0]
    if bad:
        print(f"error: --shares must lie in (0, 1], got {bad[0]:g}", file=sys.stderr)
        raise SystemExit(2)
    missing = [p for p in a.packs if not (Path(p) / "data").is_dir()]
    if missing:
        print(f"error: {missing[0]}: not a pack with stored benchmark data (data/)", file=sys.stderr)
        raise SystemExit(2)
    df = run([Path(p) for p in a.packs], a.kernels, a.shares)
    rel = [repo_relative(p) for p in a.packs]
    command = (f"python experiments/learning_curve.py --packs {' '.join(rel)} --kernels {' '.join(a.kernels)} "
               f"--shares {' '.join(f'{s:g}' for s in a.shares)}")
    if Path(a.out).resolve() != (ROOT / "experiments" / "results" / "learning_curve.md").resolve():
        command += f" --out {a.out}"
    Path(a.out).write_text(markdown(df, command))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
