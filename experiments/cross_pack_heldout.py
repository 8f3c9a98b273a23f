"""Kernel models of one calibration scored on another calibration's held-out samples (no measuring).

A pack's error table scores its models on the held-out 20 % of its own benchmark data: samples timed in
the same spell as the training samples, on a grid drawn by the same code. When two calibrations of one
machine are at hand (say the committed pack and a longer single-family one), each model set can also be
scored on the *other* pack's held-out samples: shapes it never saw, timed hours apart. Two figures per
kernel and pair:

* ``GMAE``: geometric mean of the absolute % errors of the predictions against the samples' times;
* ``level-corrected GMAE``: the same after dividing the predictions by their median ratio to the samples
  (``level``), so a machine that ran a few % faster or slower as a whole in one spell than in the other
  does not count as shape error. That is the figure to compare across spells; the raw one is what a user
  of the pack would see in that spell.

    python experiments/cross_pack_heldout.py \\
        --models assets/cpu-local-zen4 /tmp/candidate \\
        --data assets/cpu-local-zen4 benchmarks/results/data/packs/cpu-s37x8 \\
        --families gemm conv2d data_movement --out experiments/results/s37/cross_pack_heldout

``--models`` takes what ``experiments/e2e_windows.py --compare`` takes (a pack folder or name,
``git:REV[:NAME]``, ``refit:DIR``); ``--data`` takes pack folders that store benchmark data (fitted or
written with ``--no-fit``), or ``git:REV[:NAME]`` for a committed pack's data as of a revision. The held-out split of a data pack is the calibration's own
(:func:`predictor.timing.calibrate._split` with the pack's seed), so scoring a pack's models on its own data
reproduces its error table. Writes ``OUT.md`` and ``OUT.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import fail, write_results  # noqa: E402
from predictor.metrics import geomean_abs_pct_error, mean_abs_pct_error  # noqa: E402
from predictor.timing.calibrate import _split, _view  # noqa: E402
from predictor.timing.kernels.timing import models_by_kind  # noqa: E402
from predictor.timing.platforms.assets import AssetPackError, load_asset_pack  # noqa: E402


def held_out(data_dir: Path, families: list[str], everything: bool = False) -> dict[str, pd.DataFrame]:
    """``kernel -> held-out rows`` of the data pack ``data_dir`` (its calibration's split and seed) for the
    kernels of ``families``; every row with ``everything`` (a fresh calibration that no model set was fitted
    on); one line and exit 2 when the folder is not a pack with those tables."""
    try:
        seed = int(load_asset_pack(data_dir, allow_unfitted=True).manifest.get("seed", 0))
    except AssetPackError as exc:
        fail(f"--data {data_dir}: not an asset pack ({exc})")
    out: dict[str, pd.DataFrame] = {}
    for family in families:
        f = data_dir / "data" / f"{family}.csv"
        if not f.is_file():
            fail(f"--data {data_dir}: no benchmark table for family {family!r} ({f.name})")
        try:
            frame = pd.read_csv(f)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            fail(f"--data {data_dir}: {f.name} is not a benchmark table ({exc})")
        for kernel, sub in frame.groupby("kernel", sort=False):
            sub = sub.reset_index(drop=True)
            _tr, te = _split(len(sub), seed, str(kernel))
            out[str(kernel)] = sub if everything else sub.iloc[te]
    return out


def score(pack, by_kind: dict, rows: pd.DataFrame) -> dict | None:
    """Errors of ``pack``'s models (``by_kind``: :func:`~predictor.timing.kernels.timing.models_by_kind` of them) on
    ``rows`` (one kernel's samples): GMAE, the level (median prediction / sample) and the GMAE after dividing
    the predictions by that level; None when the pack has no model for a kind of the rows."""
    parts = list(rows.groupby("kind", sort=False))
    if not parts or any(kind not in by_kind for kind, _ in parts):
        return None
    pred = np.concatenate([by_kind[kind].predict(_view(part, kind), pack.platform) for kind, part in parts])
    actual = np.concatenate([part["seconds"].to_numpy(dtype=np.float64) for _, part in parts])
    level = float(np.median(pred / actual))
    return {"n": int(len(actual)), "gmae_pct": geomean_abs_pct_error(pred, actual),
            "mape_pct": mean_abs_pct_error(pred, actual), "level": level, "gmae_level_pct": geomean_abs_pct_error(pred / level, actual)}


def markdown(results: list[dict], models: list[str], data: list[str], argv: list[str], note: str = "",
             everything: bool = False) -> str:
    which = "every sample" if everything else "held-out samples"
    lines = [f"# Kernel models scored on another calibration's {which}", "",
             "Each row: one kernel; each column pair: one model set (`--models`) on one data pack's held-out 20 % "
             "(the calibration's own split; with `--all-samples`, every sample). `GMAE` is against the samples as timed; `lc` divides the "
             "predictions by their median ratio to the samples first (`level`, shown in brackets), so a spell "
             "that ran the machine faster or slower as a whole is not counted as shape error. No measuring.", "",
             f"Reproduce: `python experiments/cross_pack_heldout.py {' '.join(argv)}`", ""]
    if note:
        lines += [note, ""]
    for d in data:
        lines += [f"## {which} of `{d}`", ""]
        head = "| kernel | n | " + " | ".join(f"`{m}` GMAE % | lc % (level)" for m in models) + " |"
        lines += [head, "|---|---:|" + "---:|---:|" * len(models)]
        kernels = list(dict.fromkeys(r["kernel"] for r in results if r["data"] == d))
        sums = {m: [] for m in models}
        for k in kernels:
            cells, n = [], ""
            for m in models:
                r = next((r for r in results if r["data"] == d and r["models"] == m and r["kernel"] == k), None)
                if r is None:
                    cells.append("— | —")
                    continue
                n = str(r["n"])
                sums[m].append((r["gmae_pct"], r["gmae_level_pct"]))
                cells.append(f"{r['gmae_pct']:.2f} | {r['gmae_level_pct']:.2f} ({r['level']:.3f})")
            lines.append(f"| {k} | {n} | " + " | ".join(cells) + " |")
        mean = [f"{np.mean([a for a, _ in sums[m]]):.2f} | {np.mean([b for _, b in sums[m]]):.2f}"
                if sums[m] else "— | —" for m in models]
        lines += ["| **mean** | | " + " | ".join(mean) + " |", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", required=True, help="model sets: pack folders/names, git:REV[:NAME], refit:DIR")
    ap.add_argument("--data", nargs="+", required=True,
                    help="pack folders (or git:REV[:NAME]) whose stored held-out samples score them")
    ap.add_argument("--families", nargs="+", required=True, help="benchmark families (data/<family>.csv)")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "cross_pack_heldout")
    ap.add_argument("--all-samples", action="store_true",
                    help="score on every sample of the --data packs, not only their held-out 20 %% (for a fresh "
                         "calibration that none of the --models was fitted on)")
    ap.add_argument("--note", default="", help="a paragraph for the report (e.g. how a candidate pack was made)")
    args = ap.parse_args(argv)

    from experiments.e2e_windows import materialise

    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="cross-pack-") as tmp:
        packs = {}
        for i, spec in enumerate(args.models):
            path = materialise(spec, Path(tmp) / f"m{i}")
            try:
                pack = load_asset_pack(path)
            except AssetPackError as exc:
                fail(f"--models {spec}: {exc}")
            packs[spec] = (pack, models_by_kind(pack.models))
        for i, d in enumerate(args.data):
            rows = held_out(Path(materialise(d, Path(tmp) / f"d{i}")), args.families, args.all_samples)
            for spec, (pack, by_kind) in packs.items():
                for kernel, sub in rows.items():
                    r = score(pack, by_kind, sub)
                    if r is not None:
                        results.append({"models": spec, "data": d, "kernel": kernel, **r})
    out = args.out if args.out.is_absolute() else ROOT / args.out
    write_results(out, {"argv": argv, "models": args.models, "data": args.data, "rows": results},
                  markdown(results, args.models, args.data, argv, args.note, args.all_samples))


if __name__ == "__main__":
    main()
