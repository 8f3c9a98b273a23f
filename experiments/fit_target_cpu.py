"""Fit target of the CPU kernel models: the median of a sample's rounds, or its fastest round times a
measured typical-state factor? (Offline: stored calibrations and archived e2e windows, no measuring.)

Every stored calibration keeps, per benchmark sample, the median over its rounds (``seconds``, what
packs have been fitted to) and the median of the repeats of its fastest round (``median_s``). On the
shared VMs one shape's rounds differ by 5-45 % (``benchmarks/results/round_noise_cpu.md``), mostly
from what else the host runs. ``fit_target="fastest_round"`` (:mod:`predictor.timing.kernels.state`) fits the
fastest rounds, which repeat better, and multiplies every prediction by its op kind's factor of the
typical state over the fastest (measured on the same calibration's training samples), so a step is
still priced in the machine's typical state.

For each stored pack the script refits it with each fit target (:data:`TARGETS`; the third,
``fastest_collectives``, fits only the collectives to their fastest passes) with the calibration's own code
(:func:`predictor.timing.calibrate.refit`: same 80/20 split, grids, ensembles) and reports

* per kernel, held-out GMAE: the typical fit against the held-out medians of rounds (the committed
  tables' figure); the fastest-round fit against the held-out fastest rounds (what it models); and the
  fastest-round fit with its state factor against the held-out medians of rounds (the same samples as
  the first column);
* end to end: every refit's predictions of the 12 e2e configurations against every archived e2e window
  measured on the pack's CPU (``benchmarks/results/e2e_cpu_windows.json``; geomean and max error against
  each configuration's median over the windows, and the pooled error over every window), as
  ``experiments/e2e_windows.py`` scores them.

Writes ``experiments/results/fit_target_cpu.{md,json}``.

    python experiments/fit_target_cpu.py [--packs DIR ...] [--batch-pool 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.common import fail  # noqa: E402
from predictor.timing.kernels.state import FIT_TARGETS  # noqa: E402

PACKS = REPO / "benchmarks" / "results" / "data" / "packs"
#: stored AVX-512 calibrations of sessions 16-19 (the e2e windows of that host are unrecorded), the
#: committed AVX2 pack's data, and this session's
DEFAULT_PACKS = ("cpu-allrounds16x2", "cpu-large17x2", "cpu-nb18x2", "cpu-s19x2", "cpu-avx2-s25x2", "cpu-s30x4")
RESULTS = REPO / "experiments" / "results" / "fit_target_cpu"
TARGET = 5.0
#: the fit targets refitted: all of them; ``fastest_collectives`` changes only the collectives' models, so it is
#: scored end to end only (its kernel rows are the other two targets')
TARGETS = FIT_TARGETS


def refit_all(pack: Path, work: Path) -> dict[str, Path]:
    """``pack`` refitted with each fit target of :data:`TARGETS` into ``work``: {target: pack folder}."""
    from predictor.timing.calibrate import CalibrationError, refit

    out = {}
    for target in TARGETS:
        dest = work / f"{pack.name}-{target}"
        try:
            refit(pack, dest, log=lambda _m: None, register=False, fit_target=target)
        except CalibrationError as exc:
            fail(f"{pack}: {exc}")
        out[target] = dest
    return out


def kernel_rows(typical: Path, fastest: Path) -> list[dict]:
    """Per kernel: the three held-out GMAEs (module docstring) and the state factor."""
    from predictor.timing.platforms.assets import load_asset_pack

    t = {r["kernel"]: r for r in load_asset_pack(typical).error_table}
    rows = []
    for r in load_asset_pack(fastest).error_table:
        base = t.get(r["kernel"])
        if base is None:
            continue
        rows.append({"kernel": r["kernel"], "test": r["test"], "state_factor": r["state_factor"],
                     "typical_fit": base["gmae_pct"], "fastest_fit_vs_fastest": r["gmae_pct"],
                     "fastest_fit_vs_typical": r["typical"]["gmae_pct"]})
    return rows


def e2e_scores(packs: dict[str, Path], batch_pool: int | None) -> dict:
    """Both packs scored on the archived windows of their CPU (every batch pool when ``batch_pool`` is None)."""
    from experiments.e2e_cpu import RESULTS as E2E_RESULTS
    from experiments.e2e_cpu import WINDOWS_FILE
    from experiments.e2e_windows import (
        load_windows,
        predict_rows,
        rank_ratios,
        resolve_pack,
        score,
        windows_of_cpu,
    )

    windows = [w for w in load_windows(E2E_RESULTS / WINDOWS_FILE) if w.get("allocator", "default") == "default"]
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for target, path in packs.items():
            plat, _source = resolve_pack(str(path), Path(tmp) / target)
            mine = windows_of_cpu(windows, plat.pack.manifest.get("cpu") if plat.pack else None)
            by_pool: dict[int, list[dict]] = {}
            for w in mine:
                by_pool.setdefault(int(w.get("batch_pool", 2)), []).append(w)
            pred = predict_rows(plat.timing())
            out[target] = {str(pool): {"windows": len(ws), **{k: v for k, v in score(pred, ws).items() if k != "windows"},
                                       "rank_ratio": rank_ratios(pred, ws)}
                           for pool, ws in sorted(by_pool.items()) if batch_pool is None or pool == batch_pool}
    return out


def markdown(results: dict, started: str) -> str:
    lines = [
        "# Fit target of the CPU kernel models: median of rounds vs fastest round x state factor",
        "",
        f"{started}; offline (stored calibrations, archived e2e windows). Reproduce: "
        "`python experiments/fit_target_cpu.py`. Each pack's samples are refitted once per fit target by `predictor.timing.calibrate.refit` "
        "(same split, grids and ensembles): `typical` fits each sample's median over its rounds (every committed "
        "pack); `fastest` fits its fastest round and multiplies predictions by the op kind's typical-state factor "
        "(`predictor/timing/kernels/state.py`); `collectives fastest` (`fastest_collectives`) fits only the collectives so "
        "and every other family typical (end to end only: its kernel rows are the other two's). Columns: **typical fit** = held-out GMAE % against the held-out medians of "
        "rounds (the committed tables' figure); **fastest vs fastest** = the fastest-round model against the "
        "held-out fastest rounds (what it models); **fastest x state vs typical** = the same model with its factor "
        "against the held-out medians of rounds (the first column's samples).",
        "",
    ]
    summary = ["| pack | kernels | typical fit < 5 % | fastest vs fastest < 5 % | fastest x state vs typical < 5 % | "
               "median GMAE typical / fastest x state % |", "|---|---:|---:|---:|---:|---:|"]
    for name, res in results.items():
        k = res["kernels"]
        n = len(k)
        a = sum(r["typical_fit"] < TARGET for r in k)
        b = sum(r["fastest_fit_vs_fastest"] < TARGET for r in k)
        c = sum(r["fastest_fit_vs_typical"] < TARGET for r in k)
        summary.append(f"| {name} | {n} | {a} | {b} | {c} | {np.median([r['typical_fit'] for r in k]):.2f} / "
                       f"{np.median([r['fastest_fit_vs_typical'] for r in k]):.2f} |")
    lines += ["## Kernels (held-out 20 %)", "", *summary, ""]
    label = {"typical": "typical", "fastest_round": "fastest x state", "fastest_collectives": "collectives fastest"}
    shown = [t for t in TARGETS if any(t in res["e2e"] for res in results.values())]
    e2e = ["| pack | batch pool | windows | " + " | ".join(f"{label[t]}: geomean / max % vs medians" for t in shown)
           + " | " + " | ".join(f"{label[t]} pooled geomean %" for t in shown) + " |",
           "|---|---:|---:|" + "---:|" * (2 * len(shown))]
    for name, res in results.items():
        for pool in res["e2e"].get("typical", {}):
            cells = [res["e2e"].get(t, {}).get(pool) for t in shown]
            if not all(cells):
                continue
            e2e.append(f"| {name} | {pool} | {cells[0]['windows']} | " + " | ".join(
                f"{c['vs_median_of_windows']['geomean_abs_pct']:.2f} / {c['vs_median_of_windows']['max_abs_pct']:.1f}"
                for c in cells) + " | " + " | ".join(f"{c['pooled']['geomean_abs_pct']:.2f}" for c in cells) + " |")
    lines += ["## End to end (12 configurations: MLP, GPT, DLRM on 1 and 2 gloo ranks; windows of the pack's CPU)", "",
              *e2e, ""]
    for name, res in results.items():
        lines += [f"### {name}", "", "| kernel | held out | state x | typical fit | fastest vs fastest | "
                  "fastest x state vs typical |", "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['kernel']} | {r['test']} | {r['state_factor']:.3f} | {r['typical_fit']:.2f} | "
                  f"{r['fastest_fit_vs_fastest']:.2f} | {r['fastest_fit_vs_typical']:.2f} |" for r in res["kernels"]]
        lines.append("")
        for target, by_pool in res["e2e"].items():
            for pool, s in by_pool.items():
                cfg = ", ".join(f"{k} {v:+.1f}" for k, v in s["per_config_vs_median"].items())
                lines.append(f"- {target}, batch pool {pool}: per configuration vs its median over {s['windows']} "
                             f"windows (%): {cfg}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packs", nargs="+", type=Path, default=[PACKS / p for p in DEFAULT_PACKS])
    ap.add_argument("--batch-pool", type=int, default=None, help="score only windows of this batch pool (default: each)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    for p in args.packs:
        if not (p / "manifest.json").is_file():
            fail(f"--packs {p}: not a stored calibration (no manifest.json)")
    from predictor.files import atomic_write_text

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pack in args.packs:
            t0 = time.perf_counter()
            fitted = refit_all(pack, Path(tmp))
            results[pack.name] = {"kernels": kernel_rows(fitted["typical"], fitted["fastest_round"]),
                                  "e2e": e2e_scores(fitted, args.batch_pool)}
            print(f"{pack.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps({"date": started, "packs": results}, indent=1))
    text = markdown(results, started)
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
