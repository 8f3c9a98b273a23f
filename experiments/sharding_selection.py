"""Sharding selection for real on this machine — Table IV of Lin et al. 2024, redone.

For random DLRM tasks (heavy and normal, generated as the paper's §IV-B, scaled to fit this
machine's memory) on ``--ranks`` local gloo processes: every sharder's placement is
*predicted* by the simulator on the calibrated CPU platform and *measured* by really training
the job (experiments/dlrm_gloo.py: table-wise EmbeddingBag, all-to-all, DDP MLPs). Reports,
per task: predicted fastest sharder, its actual time, the actual fastest, the error of the
prediction, and whether the choice meets the paper's criterion (the actual fastest, or within
10% of it); and the model-guided sharder's measured time against the best of the six.

Measurement: each distinct placement is trained for ``--iters`` timed iterations after a
warm-up (median of the per-iteration slowest rank), with the torch thread count the asset
pack was calibrated at per rank. This VM has 2 cores shared with other users, so every run
waits for the machine to be quiet and records the cores other processes used during it
(:mod:`experiments.measure_env`; a run beside too much load is repeated). To tell real
differences from noise, every distinct placement is measured ``--passes`` times (the passes
interleaved); its time is the median over every timed iteration of every pass, and the spread
of the pass medians is reported as the measurement spread. Each measured run is put first in the
data set ``benchmarks/data/sharding_runs.json``.

On this shared VM one placement's measured iteration moves by tens of percent between runs hours
apart, so one run's criterion count says as much about its window as about the model. The stored
runs of one CPU with identical tasks and heuristic placements (the tasks are seeded; the heuristic
placements depend on the tables only) are therefore pooled: each heuristic placement's ground truth
is the median of its measured times over the runs (each run's times divided by its window factor
first), and the criterion and P = AF are evaluated on it with the predictions of the asset packs
and of each run (made with the pack of its day); each run's model-guided sharder is compared with
its own time of the pooled-fastest placement (its placement depends on the pack, so it is measured
in one run only). ``--rescore`` does only that, measuring nothing (seconds).

Run (measurement lock, ~30 min):
    flock /tmp/tuner-measure.lock python experiments/sharding_selection.py --tasks 10
Score the stored runs again: ``python experiments/sharding_selection.py --rescore``.
Writes experiments/results/sharding_selection.md and .json (the pooled scores and the newest run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import sys
import time
import types
from datetime import date, datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments.common import fail, host_check, host_line, previous_latest, repo_relative  # noqa: E402
from experiments.dlrm_gloo import (  # noqa: E402
    LEGACY_BATCH_POOL,
    DLRMJobSpec,
    EmbeddingOverride,
    batch_reuse_histogram,
    cold_embedding_seconds,
    measure_dlrm,
    predicted_embedding_seconds,
    table_batch,
)
from experiments.measure_env import measure_quietly  # noqa: E402
from predictor.metrics import abs_pct_errors, geomean_abs_pct_error  # noqa: E402
from predictor.sources.synth.dlrm import DLRMSpec  # noqa: E402
from predictor.sources.synth.dlrm_tables import EmbeddingTables, generate_tasks  # noqa: E402
from tuner.cost import DLRMShardingJob  # noqa: E402
from tuner.sharders import InfeasibleShardingError, get_sharder, model_guided_shard  # noqa: E402

SIX = ("naive", "random", "size_greedy", "lookup_greedy", "norm_lookup_greedy", "size_lookup_greedy")


def resolve_timing(name: str):
    """(platform, timing, pack manifest or None) for ``--platform``: the calibrated asset pack when
    one is found, else the analytic models (``timing.source`` says which)."""
    from predictor.timing.kernels.assets import resolve_platform

    res = resolve_platform(name)
    timing = res.timing()
    return timing.platform, timing, (res.pack.manifest if res.pack is not None else None)


def _iteration_times(spec: DLRMJobSpec) -> list[float]:
    """Seconds of each timed iteration: the slowest rank's (ranks start each iteration together)."""
    per_rank = np.asarray(measure_dlrm(spec)["times"])
    return [float(x) for x in per_rank.max(axis=0)]


def run_tasks(args) -> list[EmbeddingTables]:
    """The tasks of a run with these arguments (seeded: the same tables in every run that shares them)."""
    return generate_tasks(args.ranks, n_tasks=args.tasks, seed=args.seed,
                          device_memory_bytes=args.table_memory_gib * 2**30, batch_size=args.batch)


def run_args(run: dict, platform: str | None = None, pack_threads: int = 1) -> types.SimpleNamespace:
    """A results file's arguments as :func:`run_tasks` and :func:`task_job` read them (``platform``
    overrides the run's; ``pack_threads``: the torch threads per rank of a run that recorded none)."""
    a = dict(run["meta"]["args"])
    if platform:
        a["platform"] = platform
    a.setdefault("threads_used", a.get("threads") or pack_threads)
    a.setdefault("batch_pool", LEGACY_BATCH_POOL)
    return types.SimpleNamespace(**a)


def rebuilt_tasks(run: dict, args) -> list[EmbeddingTables]:
    """:func:`run_tasks` for a results file's ``args`` (:func:`run_args`); one line and exit 2 when a
    rebuilt task is not the run's (the task generator changed since the run)."""
    tasks = run_tasks(args)
    for tables, row in zip(tasks, run["rows"], strict=False):  # a run may keep fewer rows
        if tables.label != row["task"]:
            fail(f"rebuilt task {tables.label!r} is not the run's {row['task']!r} (task generator changed since the run)")
    return tasks


def task_job(ti: int, tables: EmbeddingTables, args, platform, timing) -> tuple[DLRMJobSpec, DLRMShardingJob]:
    """The measured program (every table on rank 0: callers set ``assignment``) and the predicted
    sharding job of task ``ti``; the predictor sees the reuse factors of the real batches."""
    n = args.ranks
    base = DLRMJobSpec(rows=tuple(int(x) for x in tables.rows), dim=tuple(int(x) for x in tables.dim),
                       pooling=tuple(float(x) for x in tables.pooling), assignment=tuple([0] * len(tables)),
                       n_ranks=n, batch_size=args.batch, bottom_mlp=tuple(args.bottom), top_mlp=tuple(args.top),
                       warmup=args.warmup, iters=args.iters, threads=args.threads_used, seed=ti,
                       reuse=tuple(tuple(float(v) for v in row) for row in tables.reuse),
                       batch_pool=args.batch_pool)
    # the real batches follow the task's reuse profiles; the predictor sees the reuse factors of
    # the real batch, as in the paper
    rf = np.stack([batch_reuse_histogram(table_batch(base, t, 0)[0]) for t in range(len(tables))])
    tables = EmbeddingTables(rows=tables.rows, dim=tables.dim, pooling=tables.pooling, reuse=rf, label=tables.label)
    job = DLRMShardingJob(DLRMSpec(tables=tables, batch_size=args.batch, bottom_mlp=tuple(args.bottom),
                                   top_mlp=tuple(args.top)), n, platform, timing, threads_per_rank=args.threads_used)
    return base, job


def run_task(ti: int, tables: EmbeddingTables, args, platform, timing) -> dict:
    n = args.ranks
    base, job = task_job(ti, tables, args, platform, timing)
    tables = job.spec.tables
    capacity = job.table_capacity_bytes(0.8)
    placements: dict[str, np.ndarray] = {}
    predicted: dict[str, float] = {}
    for name in SIX:
        try:
            a = get_sharder(name).shard(tables, n, capacity, rng=np.random.default_rng(ti))
        except InfeasibleShardingError:
            continue
        placements[name] = a
        predicted[name] = job.objective(a)
    starts = {k: (placements[k], predicted[k]) for k in placements}
    a, cost, info = model_guided_shard(job, capacity, starts, max_evals=args.max_evals, seed=ti)
    placements["model_guided"], predicted["model_guided"] = a, cost
    runs: dict[tuple, list[dict]] = {}  # placement -> measured runs

    def measure(key: tuple) -> None:
        spec = DLRMJobSpec(**{**base.__dict__, "assignment": key})
        m = measure_quietly(lambda: _iteration_times(spec), max_background=args.max_background,
                            retries=args.retries, quiet_timeout_s=args.quiet_timeout)
        runs.setdefault(key, []).append({"median_s": m.median_s, "times": m.times,
                                         "background_cores": m.background_cores, "attempts": m.attempts})

    keys = {name: tuple(int(x) for x in a) for name, a in placements.items()}
    # every distinct placement measured ``passes`` times, the passes interleaved
    for _ in range(args.passes):
        for key in dict.fromkeys(keys.values()):
            measure(key)

    def measured_of() -> dict[str, float]:
        # median over every timed iteration of every run of the placement
        return {name: float(np.median([t for r in runs[k] for t in r["times"]])) for name, k in keys.items()}

    six = [s for s in SIX if s in placements]
    p_best = min(six, key=predicted.__getitem__)
    measured = measured_of()
    a_best = min(six, key=measured.__getitem__)
    repeat = {}
    for name, k in keys.items():
        med = [r["median_s"] for r in runs[k]]
        if len(med) > 1:
            repeat[name] = 100 * (max(med) - min(med)) / float(np.mean(med))
    cold = {}
    if args.cold_embedding_check:
        from predictor.simulate import simulate

        fwd, bwd = cold_embedding_seconds(base)
        pf, pb = predicted_embedding_seconds(timing, job.spec)
        override = EmbeddingOverride(timing, fwd, bwd)
        oracle = {name: float(simulate(job.graph(a), override).iteration_s) for name, a in placements.items()}
        po = min(six, key=oracle.__getitem__)
        cold = {"predicted_s": oracle, "predicted_fastest": po,
                "meets_criterion": measured[po] <= 1.10 * measured[a_best],
                "choice_gap_pct": 100 * (measured[po] / measured[a_best] - 1),
                "embedding_fwd_s": fwd.tolist(), "embedding_bwd_s": bwd.tolist(),
                "predicted_fwd_s": pf.tolist(), "predicted_bwd_s": pb.tolist()}
    return {
        "cold_embedding_check": cold,
        "task": tables.label,
        "heavy": bool(tables.heavy_mask().all()),
        "n_tables": len(tables),
        "predicted_s": predicted,
        "measured_s": measured,
        "predicted_fastest": p_best,
        "predicted_fastest_actual_s": measured[p_best],
        "actual_fastest": a_best,
        "actual_fastest_s": measured[a_best],
        "choice_gap_pct": 100 * (measured[p_best] / measured[a_best] - 1),
        "meets_criterion": measured[p_best] <= 1.10 * measured[a_best],
        "prediction_error_pct": float(abs_pct_errors([predicted[p_best]], [measured[p_best]])[0]),
        "model_guided_actual_s": measured["model_guided"],
        "model_guided_vs_best_six_pct": 100 * (measured["model_guided"] / measured[a_best] - 1),
        "model_guided_search": info,
        "run_to_run_pct": repeat,
        "placements": {name: list(k) for name, k in keys.items()},
        "runs": {",".join(map(str, k)): v for k, v in runs.items()},
        "background_cores_max": float(max(r["background_cores"] for v in runs.values() for r in v)),
    }


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rescore", action="store_true",
                    help="measure nothing: score the stored runs on their pooled measurements (seconds)")
    ap.add_argument("--compare", nargs="*", default=[],
                    help="--rescore: more packs (names or folders) whose predictions are scored beside --platform's")
    ap.add_argument("--cpu", choices=("pack", "host", "all"), default="pack",
                    help="--rescore: pool the runs measured on the CPU of the --platform pack (default), on this "
                         "host's CPU, or every run")
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--bottom", type=int, nargs="+", default=[256, 128, 64])
    ap.add_argument("--top", type=int, nargs="+", default=[256, 128, 1])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--passes", type=int, default=2, help="measurements of every placement, interleaved")
    ap.add_argument("--batch-pool", type=int, default=8,
                    help="index batches each job cycles (8: a batch's rows are no longer cached when it comes "
                         "back, as in a real input stream; 2 as the oldest stored runs)")
    ap.add_argument("--cold-embedding-check", action="store_true",
                    help="diagnosis: also predict with every table's embedding kernels measured alone, cache evicted")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per rank (default: the asset pack's)")
    ap.add_argument("--max-background", type=float, default=0.3,
                    help="re-measure a run beside more than this many cores of other processes")
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--quiet-timeout", type=float, default=300.0,
                    help="seconds to wait for the machine to be quiet before each run")
    ap.add_argument("--max-evals", type=int, default=40)
    ap.add_argument("--table-memory-gib", type=float, default=1.0, help="per-rank memory the generator sizes tables for")
    ap.add_argument("--platform", default="cpu-local")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--data", type=Path, default=RUNS_FILE, help="the stored runs (a JSON data set)")
    ap.add_argument("--no-archive", action="store_true", help="do not append the measured run to --data")
    ap.add_argument("--out", type=Path, default=OUT, help="results path without suffix (OUT.md and OUT.json)")
    return ap


def measure_run(args) -> dict:
    """Measure every task (:func:`run_task`) and return the run: ``meta``, ``summary``, ``rows``."""
    platform, timing, manifest = resolve_timing(args.platform)
    host = host_check(manifest)
    args.threads_used = args.threads or int((manifest or {}).get("threads", 1))
    tasks = run_tasks(args)
    rows = []
    t0 = time.perf_counter()
    for ti, t in enumerate(tasks):
        r = run_task(ti, t, args, platform, timing)
        rows.append(r)
        print(f"{r['task']}: predicted {r['predicted_fastest']} ({r['predicted_fastest_actual_s'] * 1e3:.1f} ms actual), "
              f"actual fastest {r['actual_fastest']} ({r['actual_fastest_s'] * 1e3:.1f} ms), "
              f"criterion {'met' if r['meets_criterion'] else 'MISSED'}, model-guided {r['model_guided_actual_s'] * 1e3:.1f} ms",
              flush=True)
    summary = summarize(rows, timing, platform, args, manifest, time.perf_counter() - t0)
    keep = ("tasks", "ranks", "batch", "bottom", "top", "warmup", "iters", "passes", "batch_pool",
            "cold_embedding_check", "threads", "max_evals", "table_memory_gib", "platform", "seed", "threads_used")
    meta = {"date": date.today().isoformat(), "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{os.cpu_count()}-core {pyplatform.machine()} VM",
            "args": {k: getattr(args, k) for k in keep}, **host}
    return {"meta": meta, "summary": summary, "rows": rows}


def summarize(rows: list[dict], timing, platform, args, manifest: dict | None, wall: float) -> dict:
    """A run's summary: the criterion count, model-guided against the best of six, prediction errors."""
    met = sum(r["meets_criterion"] for r in rows)
    all_pred = [v for r in rows for v in r["predicted_s"].values()]
    all_meas = [r["measured_s"][k] for r in rows for k in r["predicted_s"]]
    mg_vs = [r["model_guided_vs_best_six_pct"] for r in rows]
    spread = [v for r in rows for v in r["run_to_run_pct"].values()]
    summary = {
        "tasks": len(rows),
        "criterion_met": met,
        "criterion_rate": met / len(rows),
        "picked_actual_fastest": sum(r["predicted_fastest"] == r["actual_fastest"] for r in rows),
        "mean_choice_gap_pct": float(np.mean([abs(r["choice_gap_pct"]) for r in rows])),
        "prediction_gmae_pct_all_sharders": geomean_abs_pct_error(all_pred, all_meas),
        "prediction_max_err_pct_all_sharders": float(abs_pct_errors(all_pred, all_meas).max()),
        "model_guided_vs_best_six_mean_pct": float(np.mean(mg_vs)),
        "model_guided_at_least_as_good_on_average": bool(np.mean(mg_vs) <= 0.0),
        "run_to_run_median_pct": float(np.median(spread)) if spread else float("nan"),
        "run_to_run_max_pct": float(np.max(spread)) if spread else float("nan"),
        "background_cores_max": float(max(r["background_cores_max"] for r in rows)),
        "timing_source": getattr(timing, "source", "analytic"),
        "co_run_contention": bool(getattr(timing, "co_run", False)),
        "step_reuse_capped": bool(getattr(timing, "cap_step_reuse", False)),
        "platform": platform.key,
        "threads_per_rank": args.threads_used,
        "pack_threads": (manifest or {}).get("threads"),
        "wall_s": wall,
    }
    checked = [r for r in rows if r["cold_embedding_check"]]
    if checked:
        c_pred = [v for r in checked for v in r["cold_embedding_check"]["predicted_s"].values()]
        c_meas = [r["measured_s"][k] for r in checked for k in r["cold_embedding_check"]["predicted_s"]]
        summary["cold_embedding_check"] = {
            "criterion_met": sum(r["cold_embedding_check"]["meets_criterion"] for r in checked),
            "tasks": len(checked),
            "prediction_gmae_pct_all_sharders": geomean_abs_pct_error(c_pred, c_meas),
            "prediction_max_err_pct_all_sharders": float(abs_pct_errors(c_pred, c_meas).max()),
        }
        for ph in ("fwd", "bwd"):
            p_k = [v for r in checked for v in r["cold_embedding_check"][f"predicted_{ph}_s"]]
            m_k = [v for r in checked for v in r["cold_embedding_check"][f"embedding_{ph}_s"]]
            summary["cold_embedding_check"][f"kernel_{ph}"] = {
                "tables": len(p_k), "gmae_pct": geomean_abs_pct_error(p_k, m_k),
                "max_err_pct": float(abs_pct_errors(p_k, m_k).max()),
                "predicted_sum_s": float(np.sum(p_k)), "measured_sum_s": float(np.sum(m_k))}
    return summary


def run_markdown(run: dict) -> str:
    """A measured run (:func:`measure_run`) as markdown: Table IV of the paper, task by task."""
    meta, sm, rows = run["meta"], run["summary"], run["rows"]
    args = types.SimpleNamespace(**{**vars(_parser().parse_args([])), "batch_pool": LEGACY_BATCH_POOL,
                                    **meta["args"]})
    met = sm["criterion_met"]
    wall = sm["wall_s"]
    platform_key = sm["platform"]
    lines = [
        "# Sharding selection, measured on this machine (Lin et al. 2024 Table IV, redone)",
        "",
        f"{meta['date']}, {meta['machine']} (shared with other users); {args.ranks} gloo ranks x {args.threads_used} "
        f"torch thread(s) (the asset pack was calibrated at {sm['pack_threads']}), global batch {args.batch}, "
        f"{args.iters} timed iterations after {args.warmup} warm-up per pass (the per-iteration slowest rank), "
        f"each job cycling {args.batch_pool} index batches. "
        f"Prediction: `{sm['timing_source']}` on `{platform_key}` (host-mode DLRM graph, simulated).",
        "Reproduce: `flock /tmp/tuner-measure.lock python experiments/sharding_selection.py "
        f"--tasks {args.tasks} --ranks {args.ranks} --batch {args.batch}"
        + (f" --platform {args.platform}" if args.platform != "cpu-local" else "")
        + (" --cold-embedding-check" if args.cold_embedding_check else "")
        + (f" --batch-pool {args.batch_pool}" if args.batch_pool != 8 else "")
        + "`",
        host_line(meta),
        "",
        "Columns as Table IV of the paper: P = predicted fastest of the six sharders, AF = actual (measured) fastest, "
        "P vs AF = |time(P) - time(AF)| / time(AF) (0 when P is AF); criterion: P is AF or within 10 %. "
        f"Every placement is measured {args.passes} times (interleaved passes); its time is the median over all "
        "of them; `passes P / AF` = spread of the pass medians (max - min) / mean. MG = the model-guided sharder.",
        "",
        "| task | heavy | tables | P | P pred. ms | P actual ms | AF | AF ms | P vs AF | criterion | pred. err of P | "
        "MG ms | MG vs AF | passes P / AF |",
        "|---|---|---:|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        rr = r["run_to_run_pct"]
        lines.append(
            f"| {r['task']} | {'yes' if r['heavy'] else 'no'} | {r['n_tables']} | {r['predicted_fastest']} | "
            f"{r['predicted_s'][r['predicted_fastest']] * 1e3:.1f} | {r['predicted_fastest_actual_s'] * 1e3:.1f} | "
            f"{r['actual_fastest']} | {r['actual_fastest_s'] * 1e3:.1f} | {abs(r['choice_gap_pct']):.1f}% | "
            f"{'✓' if r['meets_criterion'] else '✗'} | {r['prediction_error_pct']:.1f}% | "
            f"{r['model_guided_actual_s'] * 1e3:.1f} | {r['model_guided_vs_best_six_pct']:+.1f}% | "
            f"{rr.get(r['predicted_fastest'], float('nan')):.1f}% / {rr.get(r['actual_fastest'], float('nan')):.1f}% |"
        )
    lines += [
        "",
        f"Criterion met in **{met}/{len(rows)}** tasks ({100 * met / len(rows):.0f}%; paper: 85%, target >= 95%); "
        f"the predicted fastest was the measured fastest in {sm['picked_actual_fastest']}/{len(rows)}, "
        f"mean P vs AF {sm['mean_choice_gap_pct']:.2f}%.",
        f"Model-guided sharder, measured: {sm['model_guided_vs_best_six_mean_pct']:+.2f}% vs the actual best of the six "
        "on average (negative = faster; target <= 0).",
        f"Prediction error over every (task, sharder): GMAE {sm['prediction_gmae_pct_all_sharders']:.2f}%, "
        f"max {sm['prediction_max_err_pct_all_sharders']:.2f}%.",
        f"Measurement spread: the pass medians of a placement differ by {sm['run_to_run_median_pct']:.2f}% "
        f"(median over placements), {sm['run_to_run_max_pct']:.2f}% at most; other processes used at most "
        f"{sm['background_cores_max']:.2f} cores during any kept run.",
        f"Wall time {wall:.0f} s.",
    ]
    checked = [r for r in rows if r["cold_embedding_check"]]
    if checked:
        cs = sm["cold_embedding_check"]
        lines += [
            "",
            "## Diagnosis: the same simulation with the embedding kernels measured cold",
            "",
            "Not a prediction (it uses measured kernel times): every table's embedding-bag forward and backward "
            "(+ SGD update) on its real batch, timed alone after evicting the last-level cache, replaces the asset "
            "pack's embedding models; everything else is unchanged. It tells how much of the selection error "
            "the embedding models explain.",
            "",
            "The asset pack's embedding models on these tables (one table alone, predicted vs measured cold): "
            + "; ".join(f"{name} GMAE {cs[f'kernel_{ph}']['gmae_pct']:.1f}%, max {cs[f'kernel_{ph}']['max_err_pct']:.1f}%, "
                        f"sum {cs[f'kernel_{ph}']['predicted_sum_s'] * 1e3:.0f} vs {cs[f'kernel_{ph}']['measured_sum_s'] * 1e3:.0f} ms "
                        f"over {cs[f'kernel_{ph}']['tables']} tables"
                        for ph, name in (("fwd", "forward"), ("bwd", "backward + SGD update"))) + ".",
            "",
            f"Criterion met in **{cs['criterion_met']}/{cs['tasks']}** tasks; prediction error over every (task, "
            f"sharder): GMAE {cs['prediction_gmae_pct_all_sharders']:.2f}%, max "
            f"{cs['prediction_max_err_pct_all_sharders']:.2f}% (asset pack alone: "
            f"{sm['prediction_gmae_pct_all_sharders']:.2f}%, {sm['prediction_max_err_pct_all_sharders']:.2f}%).",
            "",
            "| task | P (cold embeddings) | its actual ms | P vs AF | criterion |",
            "|---|---|---:|---:|---|",
        ]
        for r in checked:
            c = r["cold_embedding_check"]
            lines.append(f"| {r['task']} | {c['predicted_fastest']} | "
                         f"{r['measured_s'][c['predicted_fastest']] * 1e3:.1f} | {abs(c['choice_gap_pct']):.1f}% | "
                         f"{'✓' if c['meets_criterion'] else '✗'} |")
    lines += [
        "",
        "## Every sharder, predicted / measured ms",
        "",
        "| task | " + " | ".join([*SIX, "model_guided"]) + " |",
        "|---|" + "---:|" * (len(SIX) + 1),
    ]
    for r in rows:
        cells = []
        for name in [*SIX, "model_guided"]:
            if name in r["predicted_s"]:
                cells.append(f"{r['predicted_s'][name] * 1e3:.1f} / {r['measured_s'][name] * 1e3:.1f}")
            else:
                cells.append("infeasible")
        lines.append(f"| {r['task']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- scoring the stored runs
#: every measured run, appended by the measuring mode and re-scored by ``--rescore`` (newest first)
RUNS_FILE = REPO / "benchmarks" / "data" / "sharding_runs.json"
#: where the results go (``OUT.md`` and ``OUT.json``)
OUT = REPO / "experiments" / "results" / "sharding_selection"
CRITERION = 0.10


def load_runs(path: Path) -> list[dict]:
    """The stored runs, newest first; one line and exit 2 on a missing or malformed data set."""
    if not path.exists():
        fail(f"{path}: no stored runs (run experiments/sharding_selection.py first)")
    try:
        runs = json.loads(path.read_text())
        for run in runs:
            str(run["run"]), dict(run["meta"]["args"])
            for r in run["rows"]:
                str(r["task"]), dict(r["placements"]), dict(r["measured_s"]), dict(r["predicted_s"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        fail(f"{path}: not a data set of sharding runs ({type(exc).__name__}: {exc})")
    if not runs:
        fail(f"{path}: no run stored")
    return runs


def archive_run(path: Path, run: dict) -> None:
    """Put a measured run first in the data set ``path`` (named by its UTC time of measurement)."""
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.insert(0, {"run": run["meta"]["measured_at"][:16], **run})
    from predictor.files import atomic_write_text

    atomic_write_text(path, json.dumps(runs, separators=(",", ":"), default=float) + "\n")


def same_placements(a: dict, b: dict) -> bool:
    """Two runs measured the same tasks with the same heuristic placements."""
    if [r["task"] for r in a["rows"]] != [r["task"] for r in b["rows"]]:
        return False
    return all(ra["placements"].get(s) == rb["placements"].get(s)
               for ra, rb in zip(a["rows"], b["rows"], strict=True) for s in SIX)


def batch_pool(run: dict) -> int:
    """The index batches a run's jobs cycled (``--batch-pool``; :data:`LEGACY_BATCH_POOL` when it records none)."""
    return int(run.get("meta", {}).get("args", {}).get("batch_pool", LEGACY_BATCH_POOL))


def window_factors(runs: list[dict]) -> list[float]:
    """Each run's speed relative to all runs: the geomean over its 60 heuristic placements of its
    measured time over the placement's geomean across runs (> 1: a slow window)."""
    logs = np.array([[np.log(float(r["measured_s"][s])) for r in run["rows"] for s in SIX] for run in runs])
    return [float(np.exp(v)) for v in (logs - logs.mean(axis=0)).mean(axis=1)]


def pooled_truth(runs: list[dict]) -> dict[str, dict[str, float]]:
    """task -> sharder -> median over the runs of the measured seconds, each run's divided by its
    window factor (:func:`window_factors`), so a slow window does not outvote the placements'
    relative times (heuristic sharders)."""
    factors = window_factors(runs)
    out: dict[str, dict[str, float]] = {}
    for r0 in runs[0]["rows"]:
        out[r0["task"]] = {}
        for s in SIX:
            vals = [float(r["measured_s"][s]) / f for run, f in zip(runs, factors, strict=True) for r in run["rows"]
                    if r["task"] == r0["task"] and s in r["measured_s"]]
            if vals:
                out[r0["task"]][s] = float(np.median(vals))
    return out


def score(pred: dict[str, dict[str, float]], truth: dict[str, dict[str, float]]) -> dict:
    """Criterion, P = AF and prediction error of ``pred`` (task -> sharder -> s) on ``truth``."""
    met = exact = 0
    gaps, p_all, m_all = [], [], []
    for task, meas in truth.items():
        cand = {s: pred[task][s] for s in meas if s in pred.get(task, {})}
        if not cand:
            continue
        p = min(cand, key=cand.get)
        af = min(meas, key=meas.get)
        gap = meas[p] / meas[af] - 1.0
        gaps.append(gap)
        met += gap <= CRITERION
        exact += p == af
        p_all += [cand[s] for s in cand]
        m_all += [meas[s] for s in cand]
    return {"tasks": len(gaps), "criterion_met": int(met), "p_is_af": int(exact),
            "mean_gap_pct": 100.0 * float(np.mean(gaps)) if gaps else float("nan"),
            "prediction_gmae_pct": geomean_abs_pct_error(p_all, m_all)}


def mg_vs_pooled_best(run: dict, truth: dict[str, dict[str, float]]) -> float:
    """Mean % of the run's model-guided time over the same run's time of the pooled-truth fastest
    heuristic placement: free of the selection bias of the run's own best of six (the minimum of six
    noisy measurements is lower than the fastest placement's typical time). NaN without MG data."""
    gaps = []
    for r in run["rows"]:
        mg = r.get("model_guided_actual_s")
        best = min(truth[r["task"]], key=truth[r["task"]].get)
        if mg is not None and best in r["measured_s"]:
            gaps.append(float(mg) / float(r["measured_s"][best]) - 1.0)
    return 100.0 * float(np.mean(gaps)) if gaps else float("nan")


def repredict(run: dict, plat) -> dict[str, dict[str, float]]:
    """task -> heuristic sharder -> seconds predicted by the resolved platform ``plat`` for ``run``'s placements
    (the tasks rebuilt from the run's arguments, as the measuring mode built them)."""
    timing = plat.timing()
    args = run_args(run, pack_threads=int((plat.pack.manifest if plat.pack else {}).get("threads", 1)))
    out: dict[str, dict[str, float]] = {}
    for ti, (tables, row) in enumerate(zip(rebuilt_tasks(run, args), run["rows"], strict=False)):
        _, job = task_job(ti, tables, args, timing.platform, timing)
        out[row["task"]] = {s: float(job.objective(np.asarray(row["placements"][s])))
                            for s in SIX if s in row["placements"]}
    return out


def run_summary(run: dict) -> dict:
    s = run.get("summary", {})
    return {"date": run.get("meta", {}).get("date"), "criterion_met": s.get("criterion_met"),
            "tasks": len(run["rows"]), "model_guided_vs_best_six_pct": s.get("model_guided_vs_best_six_mean_pct")}


def pooled_runs(args, stored: list[dict]) -> tuple[list[dict], list[str], str]:
    """(the runs pooled, the labels of those left out and why, a note on the CPU): the runs of ``--cpu`` and
    ``--batch-pool`` whose tasks and heuristic placements are the newest such run's."""
    from predictor.timing.kernels.assets import AssetPackError, resolve_platform
    from predictor.timing.platforms.cpu_local import cpu_signature, describe_cpu, same_cpu

    try:
        plat = resolve_platform(args.platform)
    except (AssetPackError, KeyError, ValueError) as exc:
        fail(f"--platform {args.platform}: {exc}")
    cpu = cpu_signature() if args.cpu == "host" else (plat.pack.manifest.get("cpu") if plat.pack else None)
    note = "every CPU" if args.cpu == "all" else describe_cpu(cpu) if cpu else "unrecorded (the oldest runs' CPU)"
    runs, skipped = [], []
    for run in stored:
        if args.cpu != "all" and not same_cpu(run["meta"].get("cpu"), cpu):
            continue
        if batch_pool(run) != args.batch_pool:
            skipped.append(f"{run['run']} (a pool of {batch_pool(run)} index batches)")
        elif not runs or same_placements(runs[0], run):
            runs.append(run)
        else:
            skipped.append(f"{run['run']} (other placements)")
    if not runs:
        fail(f"{repo_relative(args.data)}: no run measured on {note} with --batch-pool {args.batch_pool}")
    return runs, skipped, note


def rescore(args) -> dict:
    """The stored runs of ``args`` pooled (:func:`pooled_runs`) and every run's own predictions, and those of
    ``--platform`` and ``--compare``, scored on the pooled truth."""
    from predictor.timing.kernels.assets import AssetPackError, resolve_platform

    runs, skipped, cpu_note = pooled_runs(args, load_runs(args.data))
    truth = pooled_truth(runs)
    labels = [r["run"] for r in runs]
    own = [score({r["task"]: {k: float(v) for k, v in r["predicted_s"].items()} for r in run["rows"]}, truth)
           for run in runs]
    packs = {}
    for spec in [args.platform, *args.compare]:
        try:
            plat = resolve_platform(spec)
        except (AssetPackError, KeyError, ValueError) as exc:
            fail(f"--compare {spec}: {exc}")
        packs[plat.pack.name if plat.pack is not None else spec] = score(repredict(runs[0], plat), truth)
    spread = [max(v) / min(v) - 1.0 for task in truth for s in SIX
              for v in [[float(r["measured_s"][s]) for run in runs for r in run["rows"] if r["task"] == task]]
              if len(v) > 1]
    return {"date": date.today().isoformat(), "cpu": cpu_note, "batch_pool": args.batch_pool, "runs": labels,
            "skipped": skipped, "spread": spread, "window_factors": window_factors(runs), "pooled_truth_s": truth,
            "scored": dict(zip(labels, own, strict=True)),
            "reported": {lb: run_summary(r) for lb, r in zip(labels, runs, strict=True)},
            "model_guided_vs_pooled_best_pct": {lb: mg_vs_pooled_best(r, truth) for lb, r in zip(labels, runs, strict=True)},
            "packs": packs, "command": _rescore_command(args)}


def _rescore_command(args) -> str:
    cmd = "python experiments/sharding_selection.py --rescore"
    for flag, value, default in (("--platform", args.platform, "cpu-local"), ("--cpu", args.cpu, "pack"),
                                 ("--batch-pool", args.batch_pool, 8)):
        if value != default:
            cmd += f" {flag} {value}"
    if args.compare:
        cmd += " --compare " + " ".join(args.compare)
    if args.data != RUNS_FILE:
        cmd += f" --data {repo_relative(args.data)}"
    if args.out != OUT:
        cmd += f" --out {repo_relative(args.out)}"
    return cmd


def pooled_markdown(doc: dict) -> str:
    """The scores of :func:`rescore` as markdown."""
    labels, sp = doc["runs"], doc["spread"]
    lines = [
        "# Sharding selection over every stored run (Lin et al. 2024 Table IV on a pooled ground truth)",
        "",
        f"{doc['date']}; {len(labels)} runs of `experiments/sharding_selection.py` measured on {doc['cpu']} with "
        f"identical tasks and heuristic placements, each job cycling {doc['batch_pool']} index batches "
        f"(`{repo_relative(RUNS_FILE)}`"
        + (f"; left out: {', '.join(doc['skipped'])}" if doc["skipped"] else "") + f"). Reproduce: `{doc['command']}`.",
        "",
        (f"How much one placement's measurement moves between runs: median {100 * float(np.median(sp)):.1f} %, "
         f"max {100 * max(sp):.1f} % (slowest / fastest run - 1)." if sp else
         "One run only: how much a placement's measurement moves between runs is not known from it."),
        "",
        "Ground truth: each of the 60 heuristic placements' median measured time over the runs, each run's "
        "times divided first by its window factor (the geomean of its 60 placements' times over their geomean "
        "across runs: " + ", ".join(f"{f:.2f}" for f in doc["window_factors"]) + ").",
        "",
        "The placements predicted by the asset packs, on the pooled truth:",
        "",
        "| pack | criterion met | P = AF | mean P vs AF % | prediction GMAE % |", "|---|---:|---:|---:|---:|",
    ]
    lines += [f"| `{spec}` | {j['criterion_met']}/{j['tasks']} | {j['p_is_af']}/{j['tasks']} | "
              f"{j['mean_gap_pct']:.1f} | {j['prediction_gmae_pct']:.1f} |" for spec, j in doc["packs"].items()]
    lines += [
        "",
        "Each run's own predictions (made with the asset pack of its day), on the pooled truth, and the run as "
        "it reported itself:",
        "",
        "| predictions of run | criterion met (pooled truth) | P = AF | mean P vs AF % | prediction GMAE % | "
        "as reported in its run: criterion | its model-guided vs its best of six % | its model-guided vs its "
        "time of the pooled fastest % |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fair = doc["model_guided_vs_pooled_best_pct"]
    for label in labels:
        j, rs = doc["scored"][label], doc["reported"][label]
        mg = rs["model_guided_vs_best_six_pct"]
        lines.append(f"| {label} | {j['criterion_met']}/{j['tasks']} | {j['p_is_af']}/{j['tasks']} | "
                     f"{j['mean_gap_pct']:.1f} | {j['prediction_gmae_pct']:.1f} | {rs['criterion_met']}/{rs['tasks']} | "
                     + (f"{mg:+.2f}" if mg is not None else "-") + f" | {fair[label]:+.2f} |")
    mgs = [m for lb in labels if (m := doc["reported"][lb]["model_guided_vs_best_six_pct"]) is not None]
    lines += ["", f"Model-guided sharder (its placement depends on the run's pack, so it is measured in one run "
              f"only), mean over the runs: {float(np.mean(mgs)):+.2f} % against the run's measured best of the six "
              f"(the minimum of six noisy measurements: biased against any single placement), "
              f"{float(np.nanmean(list(fair.values()))):+.2f} % against the same run's time of the placement that is "
              "fastest on the pooled truth (target <= 0).",
              "", "Target: criterion met in at least 95 % of tasks (paper: 85 %); model-guided at least "
              "as good as the best of the six on average."]
    return "\n".join(lines) + "\n"


def write_results(out: Path, pooled: dict, latest: dict | None) -> str:
    """``OUT.md`` and ``OUT.json`` (JSON last): the scores over the stored runs and, when there is one, the
    newest measured run task by task. Returns the markdown."""
    from predictor.files import atomic_write_text

    text = pooled_markdown(pooled)
    if latest:
        text += "\n" + "\n".join("#" + ln if ln.startswith("#") else ln
                                 for ln in run_markdown(latest).splitlines()) + "\n"
    atomic_write_text(out.with_suffix(".md"), text)
    atomic_write_text(out.with_suffix(".json"), json.dumps({"pooled": pooled, "latest": latest}, indent=1,
                                                           default=float))
    return text


def main(argv: list[str] | None = None) -> None:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.iters < 10:
        ap.error("--iters must be >= 10")
    if args.passes < 1:
        ap.error("--passes must be >= 1")
    if args.batch_pool < 1:
        ap.error("--batch-pool must be >= 1")
    if args.out.suffix in (".md", ".json"):
        ap.error(f"--out {args.out}: the results path without suffix (OUT.md and OUT.json are written)")
    if args.rescore:
        print(write_results(args.out, rescore(args), previous_latest(args.out)))
        return
    latest = measure_run(args)
    print(run_markdown(latest))
    if not args.no_archive:
        archive_run(args.data, latest)
    print(write_results(args.out, rescore(args), latest))


if __name__ == "__main__":
    main()
