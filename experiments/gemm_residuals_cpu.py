"""Where a pack's GEMM model errs on samples it never saw, and how far two timings of one grid agree.

Two questions that decide what is left to gain on a learned GEMM kernel (session 48, bmm fp32):

* **Timing noise.** ``--repeat A B``: two calibrations of the same seed (the same shapes; e.g. ``tuner calibrate
  ... --kernels bmm/fp32 --seed 25`` twice) — the GMAE between their times of each common shape, after dividing out
  the spells' overall ratio. A model cannot be scored below this on such samples.
* **Shape error.** ``--pack P --data D...``: the pack's predictions of every sample of each data pack (divided by the
  median prediction / sample ratio of that pack, as ``cross_pack_heldout.py`` does), grouped: aligned (m, n, k all
  multiples of 16) or ragged, small ``k``, and the median signed error per ``n mod 16`` — the vector dimension of a
  row-major GEMM, whose tail a BLAS kernel pays for.

Writes ``OUT.md`` and ``OUT.json``. No measuring. Example (the session-48 figures)::

    python experiments/gemm_residuals_cpu.py --kernel bmm/fp32 \\
        --repeat benchmarks/results/data/packs/cpu-s48b4r12 benchmarks/results/data/packs/cpu-s48b4r12-rep \\
        --pack assets/cpu-local-zen4 --data benchmarks/results/data/packs/cpu-s48b4r12d \\
        --out experiments/results/s48/gemm_residuals_bmm
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.common import fail, write_results  # noqa: E402
from predictor.metrics import geomean_abs_pct_error  # noqa: E402
from predictor.timing.calibrate import CalibrationError, _read_benchmark_table, _view  # noqa: E402
from predictor.timing.kernels.timing import models_by_kind  # noqa: E402
from predictor.timing.platforms.assets import AssetPackError, load_asset_pack  # noqa: E402

SHAPE = ["m", "n", "k", "batch"]


def gemm_rows(pack_dir: str, kernel: str) -> pd.DataFrame:
    """The stored samples of ``kernel`` (``"bmm/fp32"``) in a pack's ``data/gemm.csv``; one line and exit 2 if
    there are none."""
    f = Path(pack_dir) / "data" / "gemm.csv"
    if not f.is_file():
        fail(f"{pack_dir}: no GEMM benchmark table ({f})")
    try:
        frame = _read_benchmark_table(f, pack_dir)
    except CalibrationError as exc:
        fail(str(exc))
    rows = frame[frame["kernel"] == kernel].reset_index(drop=True) if "kernel" in frame else frame.iloc[0:0]
    if rows.empty:
        fail(f"{pack_dir}: no {kernel} samples")
    return rows


def repeat_agreement(a: pd.DataFrame, b: pd.DataFrame) -> dict:
    """GMAE (percent) between two timings of the shapes common to ``a`` and ``b``, the second divided by the median
    ratio of the two first; overall, aligned and ragged."""
    j = a.merge(b, on=SHAPE, suffixes=("_a", "_b"))
    if j.empty:
        fail("--repeat: the two packs share no shape (not the same seed?)")
    level = float(np.median(j["seconds_b"] / j["seconds_a"]))
    aligned = ((j[["m", "n", "k"]] % 16) == 0).all(axis=1).to_numpy()
    out = {"common": int(len(j)), "a": int(len(a)), "b": int(len(b)), "level": level}
    for name, mask in (("all", np.ones(len(j), bool)), ("aligned", aligned), ("ragged", ~aligned)):
        if mask.any():
            out[name] = {"n": int(mask.sum()), "gmae_pct": geomean_abs_pct_error(
                j["seconds_b"].to_numpy()[mask] / level, j["seconds_a"].to_numpy()[mask])}
    return out


def residuals(pack, rows: pd.DataFrame, kernel: str) -> pd.DataFrame:
    """``rows`` with the pack's level-corrected prediction ``pred`` and ``log_ratio`` = log(pred / seconds)."""
    op = kernel.split("/", 1)[0]
    by_kind = models_by_kind(pack.models)
    if op not in by_kind:
        fail(f"the pack has no model of {op!r}")
    pred = by_kind[op].predict(_view(rows, op), pack.platform)
    level = float(np.median(pred / rows["seconds"].to_numpy()))
    return rows.assign(pred=pred / level, log_ratio=np.log(pred / level / rows["seconds"].to_numpy()), level=level)


def groups(r: pd.DataFrame) -> list[dict]:
    """GMAE and median signed error (percent) of the residuals ``r`` per group of shapes."""
    aligned = ((r[["m", "n", "k"]] % 16) == 0).all(axis=1)
    small = r[["m", "n", "k"]].min(axis=1) < 8
    out = []
    for name, mask in (("all", np.ones(len(r), bool)), ("aligned (m, n, k multiples of 16)", aligned),
                       ("ragged", ~aligned), ("k < 8", r["k"] < 8), ("a dimension < 8", small)):
        mask = np.asarray(mask, bool)
        if mask.any():
            out.append({"group": name, "n": int(mask.sum()),
                        "gmae_pct": geomean_abs_pct_error(r["pred"].to_numpy()[mask], r["seconds"].to_numpy()[mask]),
                        "median_signed_pct": float(np.expm1(np.median(r["log_ratio"].to_numpy()[mask])) * 100)})
    return out


def by_n_mod16(r: pd.DataFrame) -> list[dict]:
    """Median signed error (percent) per ``n mod 16``."""
    return [{"n_mod_16": int(b), "n": int(len(g)), "median_signed_pct": float(np.expm1(g["log_ratio"].median()) * 100)}
            for b, g in r.groupby(r["n"] % 16)]


def markdown(result: dict, argv: list[str]) -> str:
    lines = [f"# GEMM residuals: {result['kernel']}", "",
             "Reproduce: `python experiments/gemm_residuals_cpu.py " + " ".join(argv) + "`", ""]
    rep = result.get("repeat")
    if rep:
        lines += ["## Two timings of one grid", "",
                  f"`{rep['packs'][0]}` and `{rep['packs'][1]}`: {rep['common']} common shapes (of {rep['a']} / "
                  f"{rep['b']}), the second spell at x{rep['level']:.3f} of the first.", "",
                  "| shapes | n | GMAE between the timings % |", "|---|---:|---:|"]
        lines += [f"| {k} | {rep[k]['n']} | {rep[k]['gmae_pct']:.2f} |" for k in ("all", "aligned", "ragged") if k in rep]
        lines.append("")
    if result.get("residuals"):
        res = result["residuals"]
        lines += [f"## `{res['pack']}` on every sample of {', '.join(f'`{d}`' for d in res['data'])}", "",
                  "Each data pack's predictions divided by their median ratio to its samples first (level: "
                  + ", ".join(f"{x:.3f}" for x in res["levels"]) + ").", "",
                  "| shapes | n | GMAE % | median signed % |", "|---|---:|---:|---:|"]
        lines += [f"| {g['group']} | {g['n']} | {g['gmae_pct']:.2f} | {g['median_signed_pct']:+.1f} |"
                  for g in res["groups"]]
        lines += ["", "Median signed error by `n mod 16` (`n`: the result's columns, the vector dimension):", "",
                  "| n mod 16 | " + " | ".join(str(b["n_mod_16"]) for b in res["by_n_mod16"]) + " |",
                  "|---|" + "---:|" * len(res["by_n_mod16"]),
                  "| samples | " + " | ".join(str(b["n"]) for b in res["by_n_mod16"]) + " |",
                  "| median % | " + " | ".join(f"{b['median_signed_pct']:+.1f}" for b in res["by_n_mod16"]) + " |", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="bmm/fp32", help="the GEMM kernel, e.g. bmm/fp32, mm/fp32")
    ap.add_argument("--repeat", nargs=2, metavar=("A", "B"), help="two data packs of the same seed")
    ap.add_argument("--pack", help="the asset pack folder whose model is scored")
    ap.add_argument("--data", nargs="+", default=[], help="data packs whose every sample is predicted")
    ap.add_argument("--out", required=True, help="output path without suffix (.md and .json are written)")
    args = ap.parse_args(argv)
    if not args.repeat and not args.pack:
        fail("give --repeat A B, or --pack P --data D ..., or both")
    if args.pack and not args.data:
        fail("--pack needs --data")
    result: dict = {"kernel": args.kernel}
    if args.repeat:
        result["repeat"] = {"packs": list(args.repeat), **repeat_agreement(gemm_rows(args.repeat[0], args.kernel),
                                                                        gemm_rows(args.repeat[1], args.kernel))}
    if args.pack:
        try:
            pack = load_asset_pack(args.pack)
        except AssetPackError as exc:
            fail(f"--pack {args.pack}: {exc}")
        parts = [residuals(pack, gemm_rows(d, args.kernel), args.kernel) for d in args.data]
        r = pd.concat(parts, ignore_index=True)
        if args.kernel.startswith("bmm/"):
            r = r[r["m"] * r["n"] * r["k"] >= 400]  # ATen's naive per-entry loop below that: an edge of its own
        result["residuals"] = {"pack": args.pack, "data": list(args.data), "levels": [float(p["level"].iloc[0])
                                                                                      for p in parts],
                               "groups": groups(r), "by_n_mod16": by_n_mod16(r)}
    write_results(Path(args.out), result, markdown(result, argv))


if __name__ == "__main__":
    main()
