"""Re-measure some placements of one task of a sharding run, per rank and per phase.

A sharding run (``experiments/sharding_selection.py``) measures each placement twice; when one
placement lands far from its prediction (session 22's AVX2 run: task 03's model-guided placement
predicted 67.0 ms, measured 78.8 ms, while the six heuristics' placements were within 8 %), this
tells noise from model error: the named placements are measured again, ``--passes`` times
interleaved, with phase marks (:data:`experiments.dlrm_gloo.PHASES`, a clock reading at each
boundary, no profiler), and each rank's measured phases are set beside the simulated timeline's
(:func:`experiments.dlrm_phases_cpu.simulated_phases`).

    flock /tmp/tuner-measure.lock python experiments/placement_recheck.py \\
        --run-file experiments/results/avx2/sharding_selection.json --task 3 \\
        --sharders model_guided lookup_greedy naive --passes 4 --out experiments/results/avx2/recheck_task03

The task's tables and batches are rebuilt from the run's arguments (same seeds), the placements
read from the run file; the platform is the run's unless ``--platform`` names another. Writes
``OUT.md`` and ``OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments.common import fail, repo_relative, write_results  # noqa: E402
from experiments.dlrm_gloo import PHASES, measure_dlrm  # noqa: E402
from experiments.dlrm_phases_cpu import simulated_phases, table_seconds  # noqa: E402
from experiments.measure_env import measure_quietly  # noqa: E402
from experiments.sharding_selection import rebuilt_tasks, resolve_timing, run_args, task_job  # noqa: E402


def load_run(path: Path) -> dict:
    """A sharding run's results file; one line and exit 2 when it is missing or not one."""
    try:
        run = json.loads(path.read_text())
        run["meta"]["args"], run["rows"][0]["placements"]
    except FileNotFoundError:
        fail(f"{path}: no such file (a sharding_selection.json)")
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        fail(f"{path}: not a sharding_selection results file ({type(exc).__name__}: {exc})")
    return run


def summarise(pred_ranks: list[float], pred_phases: list[dict], passes: list[dict]) -> dict:
    """Per placement: predicted and measured seconds of the iteration (slowest rank per iteration),
    per rank and per (rank, phase); measured figures are medians over every timed iteration of
    every pass, with each pass's iteration median beside them."""
    n = len(pred_ranks)
    times = np.concatenate([np.asarray(p["times"]).max(axis=0) for p in passes])
    per_rank = [float(np.median(np.concatenate([p["times"][r] for p in passes]))) for r in range(n)]
    phases = []
    for r in range(n):
        for ph in PHASES:
            got = [it[ph] for p in passes for it in p["phases"][r] if ph in it]
            if got or ph in pred_phases[r]:
                phases.append({"rank": r, "phase": ph, "measured_s": float(np.median(got)) if got else float("nan"),
                               "predicted_s": float(pred_phases[r].get(ph, float("nan")))})
    return {"predicted_s": max(pred_ranks), "predicted_rank_s": pred_ranks, "measured_s": float(np.median(times)),
            "measured_p10_s": float(np.quantile(times, 0.1)), "measured_rank_s": per_rank,
            "pass_medians_s": [float(np.median(np.asarray(p["times"]).max(axis=0))) for p in passes],
            "background_cores": [p["background_cores"] for p in passes], "phases": phases}


def table_rows(assignment: np.ndarray, passes: list[dict], predicted: dict[str, float],
               alone: dict[str, list[float]]) -> list[dict]:
    """Per table: its embedding-bag forward and backward (+ SGD row update) in situ (median over every
    timed iteration of every pass, cut from the phase marks by :func:`~experiments.dlrm_phases_cpu.table_seconds`),
    as the simulation priced it (``predicted``: task name -> seconds) and, where the run timed it,
    alone after a cache flush (``alone``: ``fwd`` / ``bwd`` -> seconds per table, the run's cold check)."""
    out = []
    for r in range(int(assignment.max()) + 1):
        local = np.flatnonzero(assignment == r)
        cut = [table_seconds(mk, local) for p in passes for mk in p["marks"][r]]
        for t in (int(x) for x in local):
            row = {"table": t, "rank": r}
            for kind in ("fwd", "bwd"):
                got = [c[kind][t] for c in cut if t in c[kind]]
                row[f"{kind}_insitu_s"] = float(np.median(got)) if got else float("nan")
                row[f"{kind}_predicted_s"] = float(predicted.get(f"embedding_bag_{kind}[{t}]", float("nan")))
                vals = alone.get(kind) or []
                row[f"{kind}_alone_s"] = float(vals[t]) if t < len(vals) else float("nan")
            out.append(row)
    return out


def tables_markdown(out: dict) -> list[str]:
    """Per placement, rank and kernel: the tables' summed time in situ, alone after a cache flush (the run's
    cold check) and as predicted, ms."""
    lines = ["## Embedding tables per rank: in situ / alone cold / predicted (sum, ms)", "",
             "In situ: each table's forward (between consecutive lookups) and backward + SGD row update (from its "
             "input gradient's arrival to its update hook), median over every timed iteration; alone cold: the "
             "sharding run's cold-embedding check (one table on its real batch after evicting the cache); "
             "predicted: the pack's duration of the table's task in the simulated graph.", "",
             "| sharder | rank | tables | fwd in situ | fwd alone | fwd predicted | bwd in situ | bwd alone | bwd predicted |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, p in out["placements"].items():
        rows = p.get("tables") or []
        for r in sorted({x["rank"] for x in rows}):
            mine = [x for x in rows if x["rank"] == r]
            cells = [f"{1e3 * float(np.sum([x[f'{k}_{w}_s'] for x in mine])):.1f}"
                     for k in ("fwd", "bwd") for w in ("insitu", "alone", "predicted")]
            lines.append(f"| {name} | {r} | {len(mine)} | " + " | ".join(cells) + " |")
    return lines + [""]


def markdown(out: dict, command: str) -> str:
    m = out["meta"]
    lines = [f"# Placements of {m['task']} measured again, per rank and phase", "",
             f"{m['measured_at']}; run file `{m['run_file']}` (measured {m['run_date']}); prediction `{m['platform']}`; "
             f"{m['passes']} interleaved passes of {m['iters']} timed iterations per placement.",
             f"Reproduce: `{command}`", "",
             "Iteration: median over every timed iteration of every pass of the slowest rank; p10 beside it; "
             "`run` = the sharding run's figure for the same placement.", "",
             "| sharder | tables on rank 0 / 1 | predicted ms | measured ms | p10 ms | error | pass medians ms | "
             "run: predicted / measured ms |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for name, p in out["placements"].items():
        counts = " / ".join(str(c) for c in np.bincount(p["assignment"], minlength=len(p["predicted_rank_s"])))
        err = 100 * (p["predicted_s"] / p["measured_s"] - 1)
        lines.append(f"| {name} | {counts} | {p['predicted_s'] * 1e3:.1f} | {p['measured_s'] * 1e3:.1f} | "
                     f"{p['measured_p10_s'] * 1e3:.1f} | {err:+.1f}% | "
                     + ", ".join(f"{x * 1e3:.1f}" for x in p["pass_medians_s"])
                     + f" | {p['run_predicted_s'] * 1e3:.1f} / {p['run_measured_s'] * 1e3:.1f} |")
    lines += ["", "## Per rank and phase (ms; measured median / simulated)", "",
              "A phase ending in a collective (`a2a_*`, `ddp_tail`) includes the wait for the other rank.", ""]
    names = list(out["placements"])
    lines += ["| rank | phase | " + " | ".join(names) + " |", "|---:|---|" + "---|" * len(names)]
    keys = [(x["rank"], x["phase"]) for x in out["placements"][names[0]]["phases"]]
    for r, ph in keys:
        cells = []
        for name in names:
            x = next((y for y in out["placements"][name]["phases"] if (y["rank"], y["phase"]) == (r, ph)), None)
            cells.append("" if x is None else f"{x['measured_s'] * 1e3:.1f} / {x['predicted_s'] * 1e3:.1f}")
        lines.append(f"| {r} | {ph} | " + " | ".join(cells) + " |")
    lines.append("| all | iteration (per rank) | " + " | ".join(
        " ; ".join(f"{a * 1e3:.1f} / {b * 1e3:.1f}" for a, b in zip(out["placements"][n]["measured_rank_s"],
                                                                      out["placements"][n]["predicted_rank_s"],
                                                                      strict=True)) for n in names) + " |")
    if any(p.get("tables") for p in out["placements"].values()):
        lines += [""] + tables_markdown(out)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-file", type=Path, required=True, help="a sharding_selection.json")
    ap.add_argument("--task", type=int, required=True, help="task index in the run (0-based)")
    ap.add_argument("--sharders", nargs="+", default=["model_guided", "lookup_greedy"])
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--platform", default=None, help="default: the run's")
    ap.add_argument("--out", type=Path, required=True, help="OUT.md and OUT.json are written")
    args = ap.parse_args()
    run = load_run(args.run_file)
    if not 0 <= args.task < len(run["rows"]):
        fail(f"--task {args.task}: the run has tasks 0..{len(run['rows']) - 1}")
    row = run["rows"][args.task]
    unknown = [s for s in args.sharders if s not in row["placements"]]
    if unknown:
        fail(f"--sharders {' '.join(unknown)}: not in {row['task']} (has {', '.join(row['placements'])})")
    if args.passes < 1:
        fail("--passes must be >= 1")
    platform, timing, manifest = resolve_timing(args.platform or run["meta"]["args"]["platform"])
    ra = run_args(run, args.platform, pack_threads=int((manifest or {}).get("threads", 1)))
    base, job = task_job(args.task, rebuilt_tasks(run, ra)[args.task], ra, platform, timing)
    measured: dict[str, list[dict]] = {s: [] for s in args.sharders}
    for p in range(args.passes):
        for s in args.sharders:
            spec = replace(base, assignment=tuple(int(x) for x in row["placements"][s]), phases=True)
            attempts: list[tuple[list[float], dict]] = []

            def once(spec=spec, attempts=attempts) -> list[float]:
                m = measure_dlrm(spec)
                attempts.append(([float(x) for x in np.asarray(m["times"]).max(axis=0)], m))
                return attempts[-1][0]

            q = measure_quietly(once, max_background=ra.max_background, retries=ra.retries,
                                quiet_timeout_s=ra.quiet_timeout)
            kept = next(m for t, m in attempts if t == q.times)  # the quietest attempt
            measured[s].append({**kept, "background_cores": q.background_cores})
            print(f"pass {p + 1}: {s:<20} {q.median_s * 1e3:8.1f} ms", flush=True)
    out = {"meta": {"task": row["task"], "run_file": repo_relative(args.run_file), "run_date": run["meta"].get("date"),
                    "platform": ra.platform, "passes": args.passes, "iters": ra.iters,
                    "measured_at": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"},
           "placements": {}}
    for s in args.sharders:
        a = np.asarray(row["placements"][s])
        cost, tl = job.evaluate(a)
        pr = [float(x) for x in tl.per_rank_s]
        names = tl.graph.tasks_frame()["name"].astype(str).to_numpy()
        task_s: dict[str, float] = {}
        for name, d in zip(names, np.asarray(tl.duration, dtype=float), strict=True):
            task_s[name] = task_s.get(name, 0.0) + float(d)
        cold = row.get("cold_embedding_check") or {}
        alone = {"fwd": cold.get("embedding_fwd_s") or [], "bwd": cold.get("embedding_bwd_s") or []}
        out["placements"][s] = {"assignment": a.tolist(), "run_predicted_s": row["predicted_s"][s],
                                "run_measured_s": row["measured_s"][s],
                                **summarise(pr, [simulated_phases(tl, r) for r in range(len(pr))], measured[s]),
                                "predicted_s": cost.predicted_iteration_s,
                                "tables": table_rows(a, measured[s], task_s, alone)}
    command = "python experiments/placement_recheck.py " + " ".join(
        [f"--run-file {repo_relative(args.run_file)}", f"--task {args.task}", "--sharders " + " ".join(args.sharders),
         f"--passes {args.passes}", f"--out {repo_relative(args.out)}"]
        + ([f"--platform {args.platform}"] if args.platform else []))
    write_results(args.out, out, markdown(out, command))


if __name__ == "__main__":
    main()
