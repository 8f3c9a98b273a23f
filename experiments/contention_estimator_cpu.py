"""Which host-contention estimator matches what a sharding job's embedding tables do in situ?

``tuner calibrate --world-size K`` runs the probe of :mod:`predictor.timing.calibration.contention`
(K processes, alone / all-at-once slots) and stores one factor per kernel class, which the
simulator applies to *every* rank's kernels before it takes the slowest rank at each collective.
The calibration's estimator is, per round, the slowest process's ratio: the simulator's own max
over ranks then counts the noise's max-of-K a second time. This script runs the probe
``--repeats`` times, keeps every process's raw ratios, and scores estimators of the embedding
factor against the reference no model produced: each rank's embedding tables in situ (phase marks
of a real 2-rank job) over the same tables timed alone after a cache eviction, from the
``placement_recheck.py`` results given with ``--rechecks``.

    flock /tmp/tuner-measure.lock python experiments/contention_estimator_cpu.py --repeats 6 \\
        --rechecks experiments/results/avx2/recheck_task*.json --out experiments/results/avx2/contention_estimator

Writes ``OUT.md`` and ``OUT.json`` (raw per-process ratios included, so other estimators can be
scored later without measuring).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments.common import fail, host_check, host_line, repo_relative, write_results  # noqa: E402
from predictor.timing.calibration.contention import CLASSES, ESTIMATORS, factors, probe_host_contention  # noqa: E402


def reference_ratios(paths: list[Path]) -> list[dict]:
    """Per (task, sharder, rank) of each recheck: the tables' in-situ sum over their alone-cold sum
    (forward, backward, both), and the in-situ and simulated-graph sums of both (seconds)."""
    rows = []
    for p in paths:
        try:
            d = json.loads(p.read_text())
            task, places = d["meta"]["task"], d["placements"]
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            fail(f"{p}: not a placement_recheck results file ({type(exc).__name__}: {exc})")
        for sharder, pl in places.items():
            if "tables" not in pl:  # a recheck from before the per-table rows (2026-11-25 02:00)
                continue
            for r in sorted({t["rank"] for t in pl["tables"]}):
                ts = [t for t in pl["tables"] if t["rank"] == r]

                def s(key: str, ts=ts) -> float:
                    return float(sum(t[key] for t in ts))

                rows.append({"task": task, "sharder": sharder, "rank": r, "tables": len(ts),
                             "fwd": s("fwd_insitu_s") / s("fwd_alone_s"), "bwd": s("bwd_insitu_s") / s("bwd_alone_s"),
                             "both": (s("fwd_insitu_s") + s("bwd_insitu_s")) / (s("fwd_alone_s") + s("bwd_alone_s")),
                             "insitu_s": s("fwd_insitu_s") + s("bwd_insitu_s"),
                             "graph_s": s("fwd_predicted_s") + s("bwd_predicted_s")})
    return rows


def run_probe(repeats: int, world: int, threads: int, llc_bytes: float, slot_s: float, rounds: int) -> list:
    """``repeats`` probe runs: each a list (per process) of class -> [[alone_s, together_s], ...]."""
    out = []
    for i in range(repeats):
        out.append(probe_host_contention(world, threads, llc_bytes, slot_s, rounds))
        est = {e: factors(out[-1], e)["embedding"] for e in ESTIMATORS}
        print(f"  probe {i + 1}/{repeats}: embedding " + ", ".join(f"{e} x{v:.3f}" for e, v in est.items()),
              flush=True)
    return out


def markdown(out: dict, command: str) -> str:
    m = out["meta"]
    lines = [
        "# Host-contention estimators against the embedding tables in situ",
        "",
        f"{m['measured_at']}; {host_line(m['host'])}; {m['repeats']} probe runs of {m['rounds']} rounds, "
        f"{m['world']} processes, {m['slot_s']} s slots, {m['threads']} thread(s) each.",
        f"Reproduce (measures): `{m.get('command', command)}`"
        + (f"; scored again from the stored probe runs: `{command}`" if m.get("command", command) != command else ""),
        "",
        "Estimators of one class's factor from the probe (per round, then the median over rounds): "
        "`slowest` = the slowest process's ratio (the calibration's until 2026-11-25; a round's ratio is, for "
        "`embedding`, each process's own together / alone, for `memory` / `compute` together over the mean "
        "alone); `mean` = the mean over processes of the same ratios (the simulator takes the slowest rank "
        "itself); `slowest-dense` = `slowest` for `memory` / `compute`, `mean` for `embedding` (the "
        "calibration's since 2026-11-25; `predictor.timing.calibration.contention.factors`).",
        "",
        "## Probe runs",
        "",
        "| run | " + " | ".join(f"{c} {e}" for c in CLASSES for e in ESTIMATORS) + " |",
        "|---:|" + "---:|" * (len(CLASSES) * len(ESTIMATORS)),
    ]
    for i, f in enumerate(out["probe_factors"]):
        lines.append(f"| {i + 1} | " + " | ".join(f"{f[e][c]:.3f}" for c in CLASSES for e in ESTIMATORS) + " |")
    med = out["probe_median"]
    lines.append("| median | " + " | ".join(f"{med[e][c]:.3f}" for c in CLASSES for e in ESTIMATORS) + " |")
    ref = out["reference"]
    if ref:
        lines += ["", "## Reference: each rank's tables in situ over the same tables alone (cold)", "",
                  "From `placement_recheck.py` results: in situ = phase marks of the real 2-rank job (median "
                  "over its timed iterations); alone = the sharding run's cold check (one table, its real "
                  "batch, after a cache eviction, nothing else running).", "",
                  "| task | sharder | rank | tables | fwd | bwd | fwd + bwd |", "|---|---|---:|---:|---:|---:|---:|"]
        for r in ref:
            lines.append(f"| {r['task']} | {r['sharder']} | {r['rank']} | {r['tables']} | {r['fwd']:.3f} | "
                         f"{r['bwd']:.3f} | {r['both']:.3f} |")
        s = out["reference_summary"]
        lines += ["", f"fwd + bwd over {len(ref)} rank-placements: geomean **x{s['geomean']:.3f}**, median "
                  f"x{s['median']:.3f}, range x{s['min']:.3f}-x{s['max']:.3f} (time-weighted: x{s['weighted']:.3f}).",
                  "", "| estimator | embedding factor (median of runs) | vs reference geomean |", "|---|---:|---:|"]
        for e in ESTIMATORS:
            v = med[e]["embedding"]
            lines.append(f"| {e} | x{v:.3f} | {100 * (v / s['geomean'] - 1):+.1f} % |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=6, help="probe runs")
    ap.add_argument("--world", type=int, default=2, help="processes (the job's ranks)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--rounds", type=int, default=6, help="rounds per probe run (the quick calibration's)")
    ap.add_argument("--slot-s", type=float, default=0.75, help="seconds per slot (the quick calibration's)")
    ap.add_argument("--llc-mib", type=float, default=32.0, help="last-level cache, MiB (sizes the probes)")
    ap.add_argument("--rechecks", type=Path, nargs="*", default=[], help="placement_recheck.py JSON results")
    ap.add_argument("--from-json", type=Path, help="score the probe runs stored in an earlier OUT.json (no measuring)")
    ap.add_argument("--out", type=Path, required=True, help="output stem (writes OUT.md and OUT.json)")
    a = ap.parse_args()
    if a.repeats < 1 or a.world < 2 or a.rounds < 1:
        fail("--repeats and --rounds must be >= 1 and --world >= 2")
    ref = reference_ratios(a.rechecks)
    command = "python experiments/contention_estimator_cpu.py " + " ".join(sys.argv[1:])
    if a.from_json:
        try:
            old = json.loads(a.from_json.read_text())
            runs, meta = old["probe_runs"], old["meta"]
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            fail(f"{a.from_json}: not a contention_estimator_cpu results file ({type(exc).__name__}: {exc})")
    else:
        runs = run_probe(a.repeats, a.world, a.threads, a.llc_mib * 2**20, a.slot_s, a.rounds)
        meta = {"measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "host": host_check(None),
                "repeats": a.repeats, "world": a.world, "threads": a.threads, "rounds": a.rounds, "slot_s": a.slot_s,
                "command": command}
    probe_factors = [{e: factors(r, e) for e in ESTIMATORS} for r in runs]
    median = {e: {c: float(np.median([f[e][c] for f in probe_factors])) for c in CLASSES} for e in ESTIMATORS}
    summary = {}
    if ref:
        both, w = np.array([r["both"] for r in ref]), np.array([r["insitu_s"] for r in ref])
        summary = {"geomean": float(np.exp(np.log(both).mean())), "median": float(np.median(both)),
                   "min": float(both.min()), "max": float(both.max()), "weighted": float((both * w).sum() / w.sum())}
    out = {"meta": meta, "probe_runs": runs, "probe_factors": probe_factors, "probe_median": median,
           "reference": ref, "reference_summary": summary,
           "rechecks": [repo_relative(p) for p in a.rechecks]}
    write_results(a.out, out, markdown(out, command))


if __name__ == "__main__":
    main()
