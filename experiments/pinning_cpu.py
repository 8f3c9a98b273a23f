"""The e2e DLRM step with its ranks left to the OS scheduler and pinned one per core, alternated (CPU).

Diagnosis for issue 4's 2-rank DLRM rows. The simulation gives each rank a core of its own (a pinned job);
the e2e and sharding programs leave their ranks unpinned, as a plain user job runs. This runs
:func:`experiments.dlrm_phases_cpu.run` (the e2e rows' real program with phase marks, 1 and 2 ranks)
``--pairs`` times unpinned then pinned (``DLRMJobSpec.pin``: rank r and the threads it starts on CPU r), and
sets per pass the 1-rank step, the 2-rank step (its slower rank) and their ratio — the ratio of one pass
cancels the machine's drift between passes — beside the simulated ones.

    flock /tmp/tuner-measure.lock python experiments/pinning_cpu.py --platform cpu-local --pairs 2

writes ``experiments/results/pinning_cpu.md`` and ``.json`` (about 1 minute per pass). ``--from-json OUT.json``
writes the tables again from stored passes; ``--phases-json MODE=FILE...`` takes passes from
``dlrm_phases_cpu.py`` result files (``MODE`` is ``unpinned`` or ``pinned``).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import fail, repo_relative, write_results  # noqa: E402
from experiments.dlrm_gloo import LEGACY_BATCH_POOL  # noqa: E402

MODES = ("unpinned", "pinned")


def step_rows(phases: pd.DataFrame, mode: str, run: int) -> list[dict]:
    """One pass's steps from a ``dlrm_phases_cpu.run`` phase frame: per batch and rank count, the slowest
    rank's median iteration (measured) and simulated iteration, in ms."""
    it = phases[phases["phase"] == "iteration"]
    rows = []
    for (batch, ranks), g in it.groupby(["batch", "ranks"]):
        rows.append({"mode": mode, "run": run, "batch": int(batch), "ranks": int(ranks),
                     "measured_ms": float(g["median_ms"].max()), "simulated_ms": float(g["simulated_ms"].max())})
    return rows


def summary(steps: pd.DataFrame) -> pd.DataFrame:
    """Per mode and batch: median over passes of the 1-rank and 2-rank steps and of each pass's 2-rank /
    1-rank ratio, their ranges, the simulated ones, and the simulation's error on each (percent)."""
    out = []
    for (mode, batch), g in steps.groupby(["mode", "batch"], sort=False):
        one = g[g["ranks"] == 1].set_index("run")
        two = g[g["ranks"] == 2].set_index("run")
        runs = one.index.intersection(two.index)
        if runs.empty:
            continue
        ratio = two.loc[runs, "measured_ms"] / one.loc[runs, "measured_ms"]
        m1, m2, r = (float(one.loc[runs, "measured_ms"].median()), float(two.loc[runs, "measured_ms"].median()),
                     float(ratio.median()))
        s1, s2 = float(one["simulated_ms"].iloc[0]), float(two["simulated_ms"].iloc[0])
        out.append({"mode": mode, "batch": int(batch), "passes": len(runs),
                    "one_rank_ms": m1, "one_rank_range": [float(one.loc[runs, "measured_ms"].min()),
                                                          float(one.loc[runs, "measured_ms"].max())],
                    "two_rank_ms": m2, "two_rank_range": [float(two.loc[runs, "measured_ms"].min()),
                                                          float(two.loc[runs, "measured_ms"].max())],
                    "ratio": r, "ratio_range": [float(ratio.min()), float(ratio.max())],
                    "sim_one_ms": s1, "sim_two_ms": s2, "sim_ratio": s2 / s1,
                    "err_one_pct": 100 * (s1 / m1 - 1), "err_two_pct": 100 * (s2 / m2 - 1),
                    "err_ratio_pct": 100 * (s2 / s1 / r - 1)})
    return pd.DataFrame(out)


def markdown(summ: pd.DataFrame, steps: pd.DataFrame, meta: dict) -> str:
    """The result file: the summary table, then every pass."""
    rng = lambda v, d=1: f"[{v[0]:.{d}f}-{v[1]:.{d}f}]"  # noqa: E731
    lines = ["# The e2e DLRM step unpinned and pinned (CPU, 1 and 2 ranks)", "",
             f"{meta['date']}{' (written; the passes are from the files under `source`)' if meta.get('sources') else ''}, "
             f"prediction `{meta['platform']}`; the DLRM cycles a pool of {meta.get('batch_pool', LEGACY_BATCH_POOL)} index batches "
             f"(`--batch-pool`). Reproduce: `{meta['command']}`", "",
             "Per mode, median over passes (range), ms: the 1-rank step, the 2-rank step (its slower rank's median "
             "iteration) and the 2-rank / 1-rank ratio of each pass (the machine's drift between passes cancels); "
             "simulated beside them (the simulation gives each rank a core: a pinned job), error % = simulated / "
             "measured - 1.", "",
             "| mode | batch | passes | 1 rank | simulated (err %) | 2 ranks | simulated (err %) | ratio | simulated "
             "(err %) |", "|---|---:|---:|---|---|---|---|---|---|"]
    for s in summ.itertuples():
        lines.append(f"| {s.mode} | {s.batch} | {s.passes} | {s.one_rank_ms:.1f} {rng(s.one_rank_range)} | "
                     f"{s.sim_one_ms:.1f} ({s.err_one_pct:+.1f}) | {s.two_rank_ms:.1f} {rng(s.two_rank_range)} | "
                     f"{s.sim_two_ms:.1f} ({s.err_two_pct:+.1f}) | {s.ratio:.3f} {rng(s.ratio_range, 3)} | "
                     f"{s.sim_ratio:.3f} ({s.err_ratio_pct:+.1f}) |")
    lines += ["", "Every pass (ms; `source` is where the pass's phase tables are):", "",
              "| pass | mode | batch | 1 rank | 2 ranks | ratio | source |", "|---:|---|---:|---:|---:|---:|---|"]
    piv = steps.pivot_table(index=["run", "mode", "batch"], columns="ranks", values="measured_ms").reset_index()
    sources = meta.get("sources", {})
    for r in piv.itertuples(index=False):
        one, two = r[3], r[4]
        lines.append(f"| {r.run} | {r.mode} | {r.batch} | {one:.1f} | {two:.1f} | {two / one:.3f} | "
                     f"{sources.get(str(r.run), 'this run')} |")
    return "\n".join(lines) + "\n"


def load_phase_files(specs: list[str]) -> tuple[list[dict], dict]:
    """Passes from ``MODE=FILE`` specs of ``dlrm_phases_cpu.py`` JSON results: (step rows, pass -> file)."""
    steps, sources = [], {}
    for run, spec in enumerate(specs):
        mode, _, path = spec.partition("=")
        if mode not in MODES or not path:
            fail(f"--phases-json takes MODE=FILE with MODE one of {', '.join(MODES)}; got {spec!r}")
        try:
            phases = pd.DataFrame(json.loads(Path(path).read_text())["phases"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            fail(f"{path}: not a dlrm_phases_cpu.py result ({e})")
        steps += step_rows(phases, mode, run)
        sources[str(run)] = repo_relative(path)
    return steps, sources


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", default="cpu-local", help="pack spec to predict with (as e2e_windows.py takes it)")
    ap.add_argument("--pairs", type=int, default=2, help="unpinned-then-pinned pairs of passes")
    ap.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--batch-pool", type=int, default=2,
                    help="index batches the DLRM cycles (e2e_cpu.py --batch-pool; 8 = fresh rows each iteration)")
    ap.add_argument("--from-json", help="a result of this script: write its tables again, measure nothing")
    ap.add_argument("--phases-json", nargs="+", metavar="MODE=FILE",
                    help="passes from dlrm_phases_cpu.py results instead of measuring")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "pinning_cpu"))
    a = ap.parse_args()
    out = Path(a.out).with_suffix("")
    if a.pairs < 1:
        fail(f"--pairs must be at least 1, got {a.pairs}")
    if a.batch_pool < 1:
        fail(f"--batch-pool must be at least 1, got {a.batch_pool}")
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "platform": a.platform,
            "batch_pool": a.batch_pool,
            "command": "flock /tmp/tuner-measure.lock python experiments/pinning_cpu.py " + " ".join(sys.argv[1:])}
    if a.from_json:
        try:
            stored = json.loads(Path(a.from_json).read_text())
            steps = pd.DataFrame(stored["steps"])
            meta = stored["meta"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            fail(f"{a.from_json}: not a pinning_cpu.py result ({e})")
    elif a.phases_json:
        rows, meta["sources"] = load_phase_files(a.phases_json)
        steps = pd.DataFrame(rows)
    else:
        from experiments.dlrm_phases_cpu import run

        rows = []
        for pair in range(a.pairs):
            for k, mode in enumerate(MODES):
                phases = run([a.platform], a.batches, [1, 2], a.iters, pin=mode == "pinned", batch_pool=a.batch_pool)[0]
                rows += step_rows(phases, mode, 2 * pair + k)
        steps = pd.DataFrame(rows)
    summ = summary(steps)
    write_results(out, {"meta": meta, "steps": steps.to_dict(orient="records"),
                        "summary": summ.to_dict(orient="records")}, markdown(summ, steps, meta))


if __name__ == "__main__":
    main()
