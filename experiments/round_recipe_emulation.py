"""Does the calibration's round recipe move the end-to-end predictions? (Offline, CPU.)

Since session 16 the rounds after a calibration's first re-time the shapes the first round reached,
so every sample is the median of three timings; before, each round drew its shapes afresh until its
budget ran out and a sample was the median of one, two or three timings at random. Packs calibrated
with the new recipe predicted their e2e windows low (DLRM most), so this script asks whether the
recipe itself, rather than the machine's state while they were calibrated, lowers the predictions.

A merged sample keeps its fastest round (``median_s``), the median of its rounds (``seconds``) and
their spread (``pass_spread`` = slowest / fastest - 1), so the three round values of a three-round
sample are known. The script keeps each round with probability ``--keep`` (at least one; the old
recipe's rounds each reached ~62 % of a quick grid), sets ``seconds`` to the median of the kept
rounds, refits both packs and scores both against every archived e2e window
(``experiments/e2e_windows.py``). Embedding tables and collectives, whose rounds did not change,
are left as they are.

Writes ``benchmarks/results/round_recipe_emulation.{md,json}``.

    python experiments/round_recipe_emulation.py [--pack benchmarks/results/data/packs/cpu-allrounds16x2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.common import fail  # noqa: E402

#: families timed by ``run_cases``, whose rounds the recipe changed
RECIPE_FAMILIES = ("gemm", "conv2d", "elementwise", "layer_norm", "softmax", "data_movement")


def emulate_fresh_rounds(data_dir: Path, keep: float, seed: int) -> list[str]:
    """Rewrite the three-round samples of ``data_dir``'s recipe families as the old recipe would have
    merged them; returns one summary line per family."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    lines = []
    for fam in RECIPE_FAMILIES:
        f = data_dir / f"{fam}.csv"
        if not f.exists():
            continue
        frame = pd.read_csv(f)
        if not {"median_s", "seconds", "pass_spread", "rounds"} <= set(frame.columns):
            fail(f"{f}: no round columns (median_s, seconds, pass_spread, rounds); not a merged calibration table")
        three = (frame["rounds"] == 3).to_numpy()
        lo = frame["median_s"].to_numpy(dtype=float)
        vals = np.stack([lo, frame["seconds"].to_numpy(dtype=float),
                         lo * (1.0 + np.nan_to_num(frame["pass_spread"].to_numpy(dtype=float)))], axis=1)
        kept = rng.random(vals.shape) < keep
        none = ~kept.any(axis=1)
        kept[none, rng.integers(0, 3, int(none.sum()))] = True
        new = np.array([np.median(v[k]) for v, k in zip(vals, kept, strict=True)])
        ratio = new[three] / vals[three, 1]
        frame.loc[three, "seconds"] = new[three]
        frame.loc[three, "rounds"] = kept.sum(axis=1)[three]
        frame.to_csv(f, index=False)
        counts = np.bincount(kept.sum(axis=1)[three], minlength=4)[1:]
        lines.append(f"| {fam} | {int(three.sum())} | {counts[0]} / {counts[1]} / {counts[2]} | "
                     f"{float(np.exp(np.mean(np.log(ratio)))):.4f} | {float(np.std(np.log(ratio))) * 100:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", type=Path, default=REPO / "benchmarks/results/data/packs/cpu-allrounds16x2",
                    help="a pack calibrated with the new recipe (manifest later_rounds: reached)")
    ap.add_argument("--keep", type=float, default=0.62, help="probability that the old recipe timed a shape in a round")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/round_recipe_emulation")
    args = ap.parse_args(argv)
    from predictor.timing.platforms.assets import AssetPackError, load_asset_pack

    try:
        manifest = load_asset_pack(args.pack, allow_unfitted=True).manifest
    except AssetPackError as exc:
        fail(f"--pack {args.pack}: {exc}")
    if not (args.pack / "data").is_dir():
        fail(f"--pack {args.pack}: the pack stores no benchmark data (data/)")
    if manifest.get("later_rounds") != "reached":
        fail(f"--pack {args.pack}: not calibrated with every round re-timing the first round's shapes "
             "(manifest later_rounds is not 'reached')")
    if not 0.0 < args.keep <= 1.0:
        fail(f"--keep {args.keep}: must be in (0, 1]")
    from experiments import e2e_windows
    from tuner.report import atomic_write_text

    with tempfile.TemporaryDirectory(prefix="tuner-recipe-") as tmp:
        as_measured = Path(tmp) / "as-measured"
        fresh = Path(tmp) / "fresh-rounds"
        for d in (as_measured, fresh):
            shutil.copytree(args.pack, d, ignore=shutil.ignore_patterns("models", "errors.md"))
        lines = emulate_fresh_rounds(fresh / "data", args.keep, args.seed)
        e2e_windows.main(["--platform", f"refit:{as_measured}", "--compare", f"refit:{fresh}", "--out", str(args.out)])
    md = args.out.with_suffix(".md")
    rel = args.pack.resolve().relative_to(REPO) if args.pack.resolve().is_relative_to(REPO) else args.pack
    head = [
        "# The round recipe and the end-to-end predictions",
        "",
        f"Pack `{rel}` (every sample the median of three rounds) refitted as measured (`as-measured`) and "
        f"with its three-round samples merged as the old recipe would have (`fresh-rounds`: each round kept with "
        f"probability {args.keep:g}, at least one, `seconds` = median of the kept rounds; seed {args.seed}). "
        "Reproduce: `python experiments/round_recipe_emulation.py"
        + (f" --pack {rel}" if args.pack.resolve() != (REPO / "benchmarks/results/data/packs/cpu-allrounds16x2") else "")
        + "`.",
        "",
        "| family | three-round samples | kept 1 / 2 / 3 rounds | geomean new / old seconds | std of log ratio % |",
        "|---|---:|---:|---:|---:|",
        *lines,
        "",
        "The two packs' e2e scores below differ only by the estimator of the recipe families' samples.",
        "",
    ]
    atomic_write_text(md, "\n".join(head) + md.read_text().split("\n", 1)[1])
    print("\n".join(head))


if __name__ == "__main__":
    main()
