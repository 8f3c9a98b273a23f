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
of the pass medians is reported as the measurement spread.

Run (measurement lock):
    flock /tmp/tuner-measure.lock python experiments/sharding_selection.py --tasks 10
Writes experiments/results/sharding_selection.md and .json (last).
"""

from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import sys
import time
import types
from datetime import date
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments.common import fail, host_check, host_line, repo_relative  # noqa: E402
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
RESULTS = REPO / "experiments" / "results"


def resolve_timing(name: str):
    """(platform, timing, pack manifest or None) for ``--platform``: the calibrated asset pack when
    one is found, else the analytic models (``timing.source`` says which)."""
    from predictor.timing.platforms.assets import resolve_platform

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--bottom", type=int, nargs="+", default=[256, 128, 64])
    ap.add_argument("--top", type=int, nargs="+", default=[256, 128, 1])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--passes", type=int, default=2, help="measurements of every placement, interleaved")
    ap.add_argument("--batch-pool", type=int, default=2,
                    help="index batches each job cycles (2 as every run before the option; 8: a batch's rows are "
                         "no longer cached when it comes back, as in a real input stream)")
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
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.iters < 10:
        ap.error("--iters must be >= 10")
    if args.passes < 1:
        ap.error("--passes must be >= 1")
    if args.batch_pool < 1:
        ap.error("--batch-pool must be >= 1")

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
    wall = time.perf_counter() - t0
    met = sum(r["meets_criterion"] for r in rows)
    all_pred = [v for r in rows for v in r["predicted_s"].values()]
    all_meas = [r["measured_s"][k] for r in rows for k in r["predicted_s"]]
    mg_vs = [r["model_guided_vs_best_six_pct"] for r in rows]
    spread = [v for r in rows for v in r["run_to_run_pct"].values()]
    gaps_p = [abs(r["choice_gap_pct"]) for r in rows]
    summary = {
        "tasks": len(rows),
        "criterion_met": met,
        "criterion_rate": met / len(rows),
        "picked_actual_fastest": sum(r["predicted_fastest"] == r["actual_fastest"] for r in rows),
        "mean_choice_gap_pct": float(np.mean(gaps_p)),
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
    meta = {"date": date.today().isoformat(), "machine": f"{os.cpu_count()}-core {pyplatform.machine()} VM",
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, **host}
    sm = summary
    lines = [
        "# Sharding selection, measured on this machine (Lin et al. 2024 Table IV, redone)",
        "",
        f"{meta['date']}, {meta['machine']} (shared with other users); {args.ranks} gloo ranks x {args.threads_used} "
        f"torch thread(s) (the asset pack was calibrated at {sm['pack_threads']}), global batch {args.batch}, "
        f"{args.iters} timed iterations after {args.warmup} warm-up per pass (the per-iteration slowest rank), "
        f"each job cycling {args.batch_pool} index batches. "
        f"Prediction: `{sm['timing_source']}` on `{platform.key}` (host-mode DLRM graph, simulated).",
        "Reproduce: `flock /tmp/tuner-measure.lock python experiments/sharding_selection.py "
        f"--tasks {args.tasks} --ranks {args.ranks} --batch {args.batch}"
        + (f" --platform {args.platform}" if args.platform != "cpu-local" else "")
        + (" --cold-embedding-check" if args.cold_embedding_check else "")
        + (f" --batch-pool {args.batch_pool}" if args.batch_pool != 2 else "")
        + (f" --out {repo_relative(args.out)}" if Path(args.out).resolve() != RESULTS.resolve() else "") + "`",
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
        cs = summary["cold_embedding_check"]
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
    from tuner.report import atomic_write_text

    atomic_write_text(args.out / "sharding_selection.md", "\n".join(lines) + "\n")
    atomic_write_text(args.out / "sharding_selection.json",
                      json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1, default=float))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
