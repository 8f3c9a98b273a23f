"""How to time a memory-bound kernel *cold* on a CPU: a lone call after a cache flush vs data cold, code warm.

Both forms evict the last-level cache before each timed sample (a training step does not find a
memory-bound kernel's operands in cache). They differ in what else is cold:

* ``lone``: ``Timer.measure(..., cold=True)``: one call per flush. The flush also evicts PyTorch's
  dispatch path, the allocator's state and the kernel's code, which a step keeps warm.
* ``warm code``: ``Timer.measure_cold`` (what ``tuner calibrate`` uses): after the flush one
  untimed call on a spare instance warms the code path, then up to 16 fresh instances (their own
  buffers, untouched since the flush) run back to back; a sample is their mean.
* ``warm``: ``Timer.measure``, repeated calls on the same buffers, for reference.

Cases are drawn from the calibration's own quick grids (element-wise, layer norm, softmax family,
data movement), and the three forms are interleaved case by case, each timed ``--rounds`` times, so
all see the same machine state. Reported per kernel: the median time ratio to ``lone`` and the
round-to-round spread (slowest / fastest round - 1: the noise a held-out sample carries).
Writes ``benchmarks/results/cold_timing.md`` and ``.json``.

    flock /tmp/tuner-measure.lock python benchmarks/cold_timing.py
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.timing.calibration import make_benchmarks  # noqa: E402
from predictor.timing.calibration.base import BenchContext  # noqa: E402
from predictor.timing.calibration.timing import Timer  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "cold_timing"
FORMS = ("lone", "warm_code", "warm")


def _spread(values: list[float]) -> float:
    return float(max(values) / min(values) - 1.0)


def measure(cases_per_family: int, rounds: int, seed: int, log=print) -> pd.DataFrame:
    """Time sampled cases of the memory-bound families in the three forms; one row per case."""
    timer = Timer("cpu", warmup=2, repeats=7, cold_repeats=5, cache_bytes=32 * 2**20)
    rng = np.random.default_rng(seed)
    rows = []
    for bench in make_benchmarks(1):
        if not bench.memory_bound:
            continue
        name = bench.name
        ctx = BenchContext(device=torch.device("cpu"), level="quick", rng=np.random.default_rng(seed),
                           timer=timer, budget_s=1e9, llc_bytes=32 * 2**20, log=lambda _m: None)
        cases = bench.cases(ctx)
        pick = rng.choice(len(cases), min(cases_per_family, len(cases)), replace=False)
        t0 = time.perf_counter()
        for j in pick:
            row, build = cases[int(j)]
            got: dict[str, list[float]] = {f: [] for f in FORMS}
            cost = dict.fromkeys(FORMS, 0.0)
            for _ in range(rounds):
                for form in FORMS:
                    t = time.perf_counter()
                    if form == "warm_code":
                        got[form].append(timer.measure_cold(build).seconds)
                    else:
                        fn, setup = build()
                        got[form].append(timer.measure(fn, setup, cold=form == "lone").seconds)
                        del fn, setup
                    cost[form] += time.perf_counter() - t
            rows.append({"family": name, "kernel": row["kernel"], "bytes": row.get("bytes", float("nan")),
                         **{f"{f}_s": float(np.median(v)) for f, v in got.items()},
                         **{f"{f}_spread": _spread(v) for f, v in got.items()},
                         **{f"{f}_cost_s": cost[f] / rounds for f in FORMS}})
        log(f"  {name}: {len(pick)} cases in {time.perf_counter() - t0:.0f} s")
    return pd.DataFrame(rows)


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    """Per kernel: median time ratios to the lone call, median spreads (%)."""
    df = df.assign(code_over_lone=df.warm_code_s / df.lone_s, warm_over_lone=df.warm_s / df.lone_s)
    agg = df.groupby("kernel", sort=False).agg(
        cases=("kernel", "size"),
        code_over_lone=("code_over_lone", "median"), warm_over_lone=("warm_over_lone", "median"),
        lone_spread=("lone_spread", "median"), warm_code_spread=("warm_code_spread", "median"),
        warm_spread=("warm_spread", "median"))
    for c in ("lone_spread", "warm_code_spread", "warm_spread"):
        agg[c] *= 100.0
    return agg


def write(df: pd.DataFrame, args: argparse.Namespace, wall_s: float, out: Path) -> str:
    per = summarise(df)
    small = df.lone_s < 1e-4
    md = [
        "# Timing memory-bound kernels cold on this CPU: lone call vs data cold, code warm",
        "",
        f"{_dt.date.today().isoformat()}, {platform.machine()} {torch.get_num_threads()} torch thread(s), "
        f"torch {torch.__version__}; {len(df)} cases from the quick calibration grids of the memory-bound "
        f"families, each form timed {args.rounds} times, interleaved case by case (same machine state); "
        f"wall time {wall_s:.0f} s.",
        f"Reproduce: `flock /tmp/tuner-measure.lock python benchmarks/cold_timing.py --cases {args.cases} "
        f"--rounds {args.rounds} --seed {args.seed}`",
        "",
        "Forms (module doc of `benchmarks/cold_timing.py`): `lone` = one call after the flush (the calibration "
        "until 2026-11-23); `warm code` = flush, an untimed call on a spare instance, then up to 16 fresh "
        "instances back to back (`Timer.measure_cold`, the calibration now); `warm` = repeats on cached buffers. "
        "Spread = slowest / fastest of the rounds - 1, the noise one sample carries.",
        "",
        "| | cases | warm code / lone | warm / lone | spread lone % | spread warm code % | spread warm % | "
        "seconds per case lone / warm code |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, part in (("all", df), ("lone call < 100 us", df[small]), ("lone call >= 100 us", df[~small])):
        if part.empty:
            continue
        md.append(
            f"| **{label}** | {len(part)} | {np.median(part.warm_code_s / part.lone_s):.2f} | "
            f"{np.median(part.warm_s / part.lone_s):.2f} | {100 * part.lone_spread.median():.1f} | "
            f"{100 * part.warm_code_spread.median():.1f} | {100 * part.warm_spread.median():.1f} | "
            f"{part.lone_cost_s.mean():.3f} / {part.warm_code_cost_s.mean():.3f} |")
    md += ["", "Per kernel (medians over its cases):", "",
           "| kernel | cases | warm code / lone | warm / lone | spread lone % | spread warm code % | spread warm % |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for k, r in per.iterrows():
        md.append(f"| {k} | {int(r.cases)} | {r.code_over_lone:.2f} | {r.warm_over_lone:.2f} | {r.lone_spread:.1f} | "
                  f"{r.warm_code_spread:.1f} | {r.warm_spread:.1f} |")
    text = "\n".join(md) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"date": _dt.date.today().isoformat(), "rounds": args.rounds, "seed": args.seed,
                               "wall_s": wall_s, "cases": df.to_dict(orient="records")}, indent=1))
    tmp.replace(out.with_suffix(".json"))
    out.with_suffix(".md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=30, help="cases drawn per family")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    df = measure(args.cases, args.rounds, args.seed)
    print(write(df, args, time.perf_counter() - t0, args.out))


if __name__ == "__main__":
    main()
