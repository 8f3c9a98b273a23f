"""Re-time a calibration's held-out shapes: is a kernel model's held-out error the model's or the samples'?

A calibration's error table scores each model against its held-out samples, and each sample is
itself a noisy timing (the median of three rounds minutes apart, on a shared machine). This script
takes a fitted pack that stores its benchmark data, rebuilds the very cases of its held-out 20 %
(the grids are seeded, and the data keep each sample's grid index; every rebuilt case is checked
against the stored row's shape), times them again in ``--rounds`` shuffled rounds, and compares,
per kernel, three estimates of each held-out shape's time:

* ``stored``: the calibration's sample (what the error table scores against);
* ``model``: the pack's prediction;
* ``now``: the median of this run's rounds, divided by the kernel's drift factor (median over its
  shapes of now / stored), so a machine that runs faster or slower as a whole since the calibration
  does not count as error.

``model vs stored`` is the table's GMAE; ``stored vs now`` is how far the calibration's samples lie
from a re-measurement of the same shapes (noise over the hours between the two); ``model vs now``
is the model against that re-measurement. If the model were only limited by the samples' noise, it
would score about as well against ``now`` as ``stored`` does, and both well under its table GMAE.
Embedding-bag shapes (tables of up to 1 GiB per case) and collectives (several processes) are not
re-timed.

    tuner calibrate --refit benchmarks/results/data/packs/cpu-s19x2 --out /tmp/p19x2
    flock /tmp/tuner-measure.lock python benchmarks/heldout_retime_cpu.py --pack /tmp/p19x2

writes ``benchmarks/results/heldout_retime_cpu.md`` and ``.json`` (about 10 minutes with 5 rounds).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.metrics import geomean_abs_pct_error  # noqa: E402
from predictor.timing.calibrate import _split, _view  # noqa: E402
from predictor.timing.calibration import FAMILIES as FAMILY_REGISTRY  # noqa: E402
from predictor.timing.calibration import make_benchmarks  # noqa: E402
from predictor.timing.calibration.base import BenchContext, time_case  # noqa: E402
from predictor.timing.calibration.timing import Timer  # noqa: E402
from predictor.timing.kernels.timing import models_by_kind  # noqa: E402
from predictor.timing.platforms.assets import AssetPackError, load_asset_pack  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "heldout_retime_cpu"
#: families timed from a case grid (as ``benchmarks/round_noise_cpu.py``)
FAMILIES = ("gemm", "conv2d", "elementwise", "layer_norm", "softmax", "data_movement")
#: shape columns a rebuilt case must share with its stored row
SHAPE_COLUMNS = ("m", "n", "k", "batch", "dim", "elements", "parts")


class RetimeError(ValueError):
    """A pack this script cannot use (one line)."""


def held_out_cases(pack_dir: Path, kernels: set[str] | None = None) -> tuple[list[dict], object]:
    """The held-out cases of a fitted pack: one dict per case (family, kernel, the stored row, its
    prediction, the rebuilt case and whether it is timed cold), and the pack."""
    try:
        pack = load_asset_pack(pack_dir)
    except AssetPackError as e:
        raise RetimeError(str(e)) from None
    m = pack.manifest
    if m.get("device") != "cpu":
        raise RetimeError(f"{pack_dir}: a {m.get('device')} pack; this script re-times CPU packs")
    if not (pack.path / "data").is_dir():
        raise RetimeError(f"{pack_dir}: the pack stores no benchmark data (data/)")
    seed, level, scale = int(m.get("seed", 0)), m.get("level", "quick"), float(m.get("scale") or 1.0)
    by_kind = models_by_kind(pack.models)
    llc = float(pack.platform.last_level_cache_bytes or 32 * 2**20)
    # the calibration drew one grid seed per family, in its families' order, from the pack's seed; packs
    # before the manifest kept that order ran every family or the ones their data hold
    present = [f for f in FAMILY_REGISTRY if (pack.path / "data" / f"{f}.csv").exists()]
    orders = [m["families"]] if m.get("families") else [list(FAMILY_REGISTRY), present]
    why = ""
    for order in orders:
        try:
            return _rebuild(pack, order, seed, level, scale, llc, kernels, by_kind), pack
        except RetimeError as e:
            why = str(e)
    raise RetimeError(f"{pack_dir}: {why}")


def _rebuild(pack, order: list[str], seed: int, level: str, scale: float, llc: float, kernels: set[str] | None,
             by_kind: dict) -> list[dict]:
    m = pack.manifest
    fitted = {r["kernel"] for r in pack.error_table}  # kernels with too few samples have no model
    rng = np.random.default_rng(seed)
    seeds = {name: int(rng.integers(2**62)) for name in order}
    out: list[dict] = []
    for bench in make_benchmarks(1, list(FAMILIES)):
        file = pack.path / "data" / f"{bench.name}.csv"
        if not file.exists() or bench.name not in seeds:
            continue
        ctx = BenchContext(device=torch.device("cpu"), level=level, rng=np.random.default_rng(seeds[bench.name]),
                           timer=Timer("cpu"), budget_s=1e9, llc_bytes=llc, log=lambda _m: None,
                           scale=scale if level != "tiny" else 1.0,
                           max_tensor_bytes=256 * 2**20 if level != "tiny" else 16 * 2**20,
                           cold_memory_bound=m.get("memory_bound_timing", "cold") == "cold",
                           cold_gemm=m.get("gemm_timing") == "cold", threads=int(m.get("threads") or 1))
        cases = bench.cases(ctx)
        cold = bool(bench.cold(ctx))
        frame = pd.read_csv(file)
        for kernel, sub in frame.groupby("kernel", sort=False):
            if (kernels and kernel not in kernels) or kernel not in fitted \
                    or not set(sub["kind"]) <= set(by_kind):
                continue
            sub = sub.reset_index(drop=True)
            _, te = _split(len(sub), seed, str(kernel))
            test = sub.iloc[te]
            pred = np.concatenate([by_kind[kind].predict(_view(part, kind), pack.platform)
                                   for kind, part in test.groupby("kind", sort=False)])
            stored = np.concatenate([part["seconds"].to_numpy() for _, part in test.groupby("kind", sort=False)])
            rows = pd.concat([part for _, part in test.groupby("kind", sort=False)])
            for (_, row), p, s in zip(rows.iterrows(), pred, stored, strict=True):
                i = int(row["case"])
                if i >= len(cases) or not _same_shape(cases[i][0], row):
                    raise RetimeError(f"{kernel} case {i} does not rebuild the stored shape (the benchmark "
                                      "grids changed since this pack was measured)")
                out.append({"family": bench.name, "kernel": str(kernel), "case": i, "stored_s": float(s),
                            "model_s": float(p), "build": cases[i][1], "cold": cold})
    return out


def _same_shape(built: dict, stored: pd.Series) -> bool:
    for c in SHAPE_COLUMNS:
        if c in built and c in stored and pd.notna(stored[c]) and not np.isclose(float(built[c]), float(stored[c])):
            return False
    return built.get("kernel") == stored["kernel"]


def retime(cases: list[dict], rounds: int, llc: float, log=print) -> np.ndarray:
    """(cases, rounds) seconds: every case timed as the calibration times it, shuffled each round."""
    timer = Timer("cpu", warmup=2, repeats=7, cold_repeats=5, cache_bytes=llc)
    out = np.full((len(cases), rounds), np.nan)
    rng = np.random.default_rng(0)
    for r in range(rounds):
        t0 = time.perf_counter()
        for i in rng.permutation(len(cases)):
            out[i, r] = time_case(timer, cases[i]["build"], cases[i]["cold"]).seconds
        log(f"  round {r + 1} of {rounds}: {len(cases)} cases in {time.perf_counter() - t0:.0f} s")
    return out


def summarise(cases: list[dict], times: np.ndarray) -> pd.DataFrame:
    """One row per kernel: the three GMAEs (percent), the drift factor and the round spread."""
    df = pd.DataFrame([{k: v for k, v in c.items() if k != "build"} for c in cases])
    df["now_raw_s"] = np.median(times, axis=1)
    df["spread"] = times.max(axis=1) / times.min(axis=1) - 1.0
    rows = []
    for kernel, g in df.groupby("kernel", sort=False):
        drift = float(np.median(g.now_raw_s / g.stored_s))
        now = g.now_raw_s / drift
        rows.append({"kernel": kernel, "family": g.family.iloc[0], "held_out": len(g), "drift": drift,
                     "model_vs_stored": geomean_abs_pct_error(g.model_s, g.stored_s),
                     "stored_vs_now": geomean_abs_pct_error(g.stored_s, now),
                     "model_vs_now": geomean_abs_pct_error(g.model_s, now),
                     "model_vs_now_raw": geomean_abs_pct_error(g.model_s, g.now_raw_s),
                     "round_spread_pct": float(np.median(g.spread) * 100.0)})
    return pd.DataFrame(rows)


def markdown(per: pd.DataFrame, pack_name: str, rounds: int, wall_s: float, command: str) -> str:
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# A calibration's held-out shapes, timed again",
        "",
        f"{now}; pack `{pack_name}`; {int(per.held_out.sum())} held-out shapes of {len(per)} kernels, "
        f"{rounds} rounds (shuffled), {wall_s:.0f} s. Reproduce: `{command}`",
        "",
        "GMAE % between three estimates of each held-out shape's time: `stored` (the calibration's sample, "
        "which the error table scores against), `model` (the pack's prediction) and `now` (the median of this "
        "run's rounds over the kernel's drift factor, median now / stored). `model vs stored` is the error "
        "table's figure. A model limited only by its samples' noise would score against `now` about as "
        "`stored` does.",
        "",
        "| kernel | held out | drift | model vs stored | stored vs now | model vs now | model vs now (no drift) "
        "| round spread % |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in per.itertuples():
        lines.append(f"| {r.kernel} | {r.held_out} | {r.drift:.3f} | {r.model_vs_stored:.2f} | {r.stored_vs_now:.2f} "
                     f"| {r.model_vs_now:.2f} | {r.model_vs_now_raw:.2f} | {r.round_spread_pct:.1f} |")
    over = per[per.model_vs_stored >= 5.0]
    lines += ["", f"Kernels at or above 5 % in the table: {len(over)} of {len(per)}; of them, "
              f"{int((over.model_vs_now < 5.0).sum())} score under 5 % against the re-measurement, and "
              f"for {int((over.stored_vs_now >= over.model_vs_now).sum())} of them the samples lie at least as far "
              "from it as the model does.", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", required=True, help="a fitted CPU asset pack that stores its benchmark data")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kernels", nargs="*", help="only these kernels (default: every re-timed kernel)")
    ap.add_argument("--out", default=str(RESULTS), help="results path without extension (.md and .json)")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        print("error: --rounds must be >= 1", file=sys.stderr)
        raise SystemExit(2)
    try:
        cases, pack = held_out_cases(Path(a.pack), set(a.kernels) if a.kernels else None)
    except RetimeError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if not cases:
        print("error: no held-out cases to re-time", file=sys.stderr)
        raise SystemExit(2)
    torch.set_num_threads(int(pack.manifest.get("threads") or 1))
    print(f"re-timing {len(cases)} held-out shapes of pack {pack.name} in {a.rounds} rounds")
    t0 = time.perf_counter()
    times = retime(cases, a.rounds, float(pack.platform.last_level_cache_bytes or 32 * 2**20))
    wall = time.perf_counter() - t0
    per = summarise(cases, times)
    command = f"flock /tmp/tuner-measure.lock python benchmarks/heldout_retime_cpu.py --pack {a.pack} --rounds {a.rounds}"
    if Path(a.out).resolve() != RESULTS.resolve():
        command += f" --out {a.out}"
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(markdown(per, pack.name, a.rounds, wall, command))
    raw = [{**{k: v for k, v in c.items() if k != "build"}, "rounds_s": times[i].tolist()} for i, c in enumerate(cases)]
    out.with_suffix(".json").write_text(json.dumps({"pack": pack.name, "rounds": a.rounds, "wall_s": wall,
                                                    "per_kernel": per.to_dict("records"), "cases": raw}))
    print(per.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
