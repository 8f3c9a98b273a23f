"""tuner's sharders against TorchRec's planner, predicted on the shipped tasks and measured on this CPU.

Predicted (``--part predict``): the 20 generated tasks of ``search_spaces/sharding.yaml`` (4 A100s) at
each of its batch sizes. Candidates: the six heuristic sharders of Lin et al. 2024 (table-wise), the
model-guided sharder table-wise (``model_guided``) and with sharding types (``model_guided_types``),
TorchRec 1.8's ``EmbeddingShardingPlanner`` with its own estimators (``torchrec``) and with tuner's
shard estimator (``torchrec_tuner_est``). Every plan is scored by the same cost function (tuner's
simulator, :class:`tuner.sharders.sharding_types.TypedShardingJob`).

Measured (``--part measure``): the CPU tasks of ``experiments/sharding_selection.py`` (2 gloo ranks,
tables sized for 1 GiB per rank, global batch 1024) really trained with ``experiments/dlrm_gloo.py``:
every table-wise plan (six heuristics and model-guided), the model-guided plan with sharding types,
and TorchRec's plan for a CPU topology. Each placement runs ``--passes`` times, interleaved; its time
is the median over every timed iteration of every pass (the slowest rank's). Load from other
processes during each run is recorded (this VM is shared).

Needs the ``torchrec`` extra (docs/sharding.md). Writes experiments/results/torchrec_compare.{md,json}.
Run: ``python experiments/torchrec_compare.py`` (both parts; ``--part predict`` takes a few minutes,
``--part measure`` about 15 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments.common import fail, write_results  # noqa: E402
from experiments.dlrm_gloo import DLRMJobSpec, batch_reuse_histogram, measure_dlrm, table_batch  # noqa: E402
from experiments.measure_env import BackgroundLoad  # noqa: E402
from predictor.sources.synth.dlrm import DLRMSpec  # noqa: E402
from predictor.sources.synth.dlrm_sharding import ShardedPlacement, as_placement  # noqa: E402
from predictor.sources.synth.dlrm_tables import EmbeddingTables, generate_tasks  # noqa: E402
from predictor.timing.kernels.assets import resolve_platform  # noqa: E402
from tuner.cost import DLRMShardingJob  # noqa: E402
from tuner.sharders import InfeasibleShardingError, ModelGuidedSharder, get_sharder  # noqa: E402
from tuner.sharders.sharding_types import TypedShardingJob  # noqa: E402

SIX = ("naive", "random", "size_greedy", "lookup_greedy", "norm_lookup_greedy", "size_lookup_greedy")
OUT = REPO / "experiments" / "results" / "torchrec_compare"


def plans_for(job: DLRMShardingJob, capacity: float, seed: int, max_evals: int, type_evals: int,
              torchrec: bool = True) -> tuple[dict[str, ShardedPlacement], dict[str, float], dict]:
    """Every candidate's placement, its predicted seconds and notes (planner time, sharding types)."""
    from tuner.integrations.torchrec_estimator import torchrec_placement

    typed = TypedShardingJob(job)
    t = job.spec.tables
    plans: dict[str, ShardedPlacement] = {}
    pred: dict[str, float] = {}
    notes: dict[str, dict] = {}
    starts = {}
    for name in SIX:
        try:
            a = get_sharder(name).shard(t, job.n_ranks, capacity, rng=np.random.default_rng(seed))
        except InfeasibleShardingError:
            continue
        plans[name], pred[name] = ShardedPlacement.from_assignment(t, a), job.objective(a)
        starts[name] = (a, pred[name])
    t0 = time.perf_counter()
    mg = ModelGuidedSharder(job, starts, max_evals=max_evals, seed=seed, type_evals=type_evals).place(capacity)
    wall = time.perf_counter() - t0
    plans["model_guided"] = ShardedPlacement.from_assignment(t, mg.assignment)
    pred["model_guided"] = float(mg.info.get("table_wise_s", mg.predicted_s))
    plans["model_guided_types"] = mg.sharded or plans["model_guided"]
    pred["model_guided_types"] = float(mg.predicted_s)
    notes["model_guided_types"] = {"search_s": wall, "changes": mg.info.get("type_changes", [])}
    if torchrec:
        for name, timing in (("torchrec", None), ("torchrec_tuner_est", job.timing)):
            try:
                p, info = torchrec_placement(job.spec, job.n_ranks, job.platform, 0.8, timing=timing)
            except Exception as exc:  # recorded: TorchRec finds no plan (e.g. memory)
                notes[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                continue
            plans[name], pred[name] = p, typed.objective(p)
            notes[name] = info
    return plans, pred, notes


def predict_part(args) -> dict:
    """The shipped space's tasks on 4 A100s, every candidate predicted."""
    r = resolve_platform("a100-80gb")
    cap_bytes = r.platform.memory_bytes
    tasks = generate_tasks(4, n_tasks=args.tasks, seed=0, device_memory_bytes=cap_bytes, memory_fraction=0.8,
                           dataset="both")
    rows = []
    for ti, t in enumerate(tasks):
        for b in args.batches:
            job = DLRMShardingJob(DLRMSpec(tables=t, batch_size=b, label=t.label), 4, r.platform, r.timing())
            _, pred, notes = plans_for(job, 0.8 * cap_bytes, seed=ti * 101 + b, max_evals=40, type_evals=args.type_evals)
            tw = min(v for k, v in pred.items() if k in SIX or k == "model_guided")
            row = {"task": t.label, "batch_size": b, "n_tables": len(t), "predicted_s": pred, "best_table_wise_s": tw,
                   "notes": notes}
            rows.append(row)
            print(f"{t.label} b{b}: " + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in pred.items()) + " ms", flush=True)
    return {"platform": "a100-80gb", "n_gpus": 4, "timing_source": r.source, "rows": rows,
            "summary": predict_summary(rows)}


def predict_summary(rows: list[dict]) -> dict:
    """TorchRec's plans and the model-guided ones against the best table-wise tuner plan (ratios)."""
    out = {}
    for name in ("torchrec", "torchrec_tuner_est", "model_guided", "model_guided_types"):
        r = [row["predicted_s"][name] / row["best_table_wise_s"] for row in rows if name in row["predicted_s"]]
        if r:
            out[name] = {"vs_best_table_wise_geomean": float(np.exp(np.mean(np.log(r)))), "min": float(min(r)),
                         "max": float(max(r)), "n": len(r)}
    planner = [row["notes"]["torchrec"]["planner_s"] for row in rows if "planner_s" in row["notes"].get("torchrec", {})]
    if planner:
        out["torchrec_planner_s"] = {"median": float(np.median(planner)), "max": float(max(planner))}
    out["types_used"] = sum(1 for row in rows if row["notes"]["model_guided_types"]["changes"])
    return out


def cpu_job(ti: int, tables: EmbeddingTables, args, r) -> tuple[DLRMJobSpec, DLRMShardingJob]:
    """The measured program of a CPU task and its predicted job (reuse factors of the real batches)."""
    base = DLRMJobSpec(rows=tuple(int(x) for x in tables.rows), dim=tuple(int(x) for x in tables.dim),
                       pooling=tuple(float(x) for x in tables.pooling), assignment=tuple([0] * len(tables)),
                       n_ranks=2, batch_size=1024, bottom_mlp=(256, 128, 64), top_mlp=(256, 128, 1), warmup=3,
                       iters=args.iters, threads=1, seed=ti, batch_pool=8,
                       reuse=tuple(tuple(float(v) for v in row) for row in tables.reuse))
    rf = np.stack([batch_reuse_histogram(table_batch(base, t, 0)[0]) for t in range(len(tables))])
    tables = EmbeddingTables(rows=tables.rows, dim=tables.dim, pooling=tables.pooling, reuse=rf, label=tables.label)
    job = DLRMShardingJob(DLRMSpec(tables=tables, batch_size=1024, bottom_mlp=(256, 128, 64), top_mlp=(256, 128, 1)),
                          2, r.platform, r.timing(), threads_per_rank=1)
    return base, job


def measure_part(args) -> dict:
    """CPU tasks on 2 gloo ranks: the plans predicted and trained."""
    r = resolve_platform("cpu-local")
    tasks = generate_tasks(2, n_tasks=10, seed=7, device_memory_bytes=2**30, batch_size=1024)
    rows = []
    for ti in args.measure_tasks:
        base, job = cpu_job(ti, tasks[ti], args, r)
        plans, pred, notes = plans_for(job, job.table_capacity_bytes(0.8), seed=ti, max_evals=40,
                                       type_evals=args.type_evals)
        # one run per distinct placement (of the plans asked for)
        keys: dict[str, tuple] = {}
        for name, p in plans.items():
            if args.plans and name not in args.plans:
                continue
            keys[name] = tuple((s.sharding_type, s.ranks, s.sizes, s.offsets) for s in as_placement(job.spec.tables, p).tables)
        distinct = list(dict.fromkeys(keys.values()))
        times: dict[tuple, list[float]] = {k: [] for k in distinct}
        loads: dict[tuple, list[float]] = {k: [] for k in distinct}
        for _ in range(args.passes):
            for k in distinct:
                tw = all(s[0] == "table_wise" for s in k)
                spec = DLRMJobSpec(**{**base.__dict__, "assignment": tuple(s[1][0] for s in k) if tw else base.assignment,
                                      "shards": () if tw else k})
                with BackgroundLoad() as bg:
                    m = measure_dlrm(spec)
                times[k] += [float(x) for x in np.asarray(m["times"]).max(axis=0)]
                loads[k].append(float(bg.cores))
        measured = {name: float(np.median(times[k])) for name, k in keys.items()}
        spread = {name: float(np.max(loads[k])) for name, k in keys.items()}
        tw_names = [n for n in measured if n in SIX or n == "model_guided"]
        best_tw = min(tw_names, key=lambda n: measured[n]) if tw_names else None
        row = {"task": tasks[ti].label, "n_tables": len(tasks[ti]), "predicted_s": pred, "measured_s": measured,
               "background_cores_max": spread, "best_table_wise_measured": best_tw, "notes": notes,
               "types_beat_every_table_wise": "model_guided_types" in measured and len(tw_names) == len(SIX) + 1
               and measured["model_guided_types"] < min(measured[n] for n in tw_names)
               and bool(notes["model_guided_types"]["changes"])}
        rows.append(row)
        print(f"{tasks[ti].label}: " + ", ".join(f"{k} pred {pred[k] * 1e3:.1f} / meas {measured[k] * 1e3:.1f}"
                                                  for k in measured) + " ms", flush=True)
    return {"platform": "cpu-local", "timing_source": r.source, "ranks": 2, "batch_size": 1024, "passes": args.passes,
            "iters": args.iters, "rows": rows}


def markdown(doc: dict) -> str:
    lines = ["# tuner's sharders vs TorchRec's planner", "", f"TorchRec {doc.get('torchrec_version', '?')}.", ""]
    p = doc.get("predict")
    if p:
        s = p["summary"]
        lines += [f"## Predicted: shipped tasks, {p['n_gpus']} x {p['platform']} ({p['timing_source']})", "",
                  f"Reproduce: `{doc['predict_command']}`.", "",
                  "Ratio of each plan's predicted iteration time to the best table-wise tuner plan (six heuristics "
                  "and model-guided), over every task and batch size:", "",
                  "| plan | geomean | min | max | n |", "|---|---:|---:|---:|---:|"]
        for k in ("torchrec", "torchrec_tuner_est", "model_guided", "model_guided_types"):
            if k in s:
                v = s[k]
                lines.append(f"| {k} | {v['vs_best_table_wise_geomean']:.4f} | {v['min']:.4f} | {v['max']:.4f} | {v['n']} |")
        if "torchrec_planner_s" in s:
            lines += ["", f"TorchRec planner wall time: median {s['torchrec_planner_s']['median']:.2f} s, "
                          f"max {s['torchrec_planner_s']['max']:.2f} s per task and batch."]
        lines += [f"Model-guided changed sharding types in {s['types_used']} of {len(p['rows'])} task-batch pairs.", "",
                  "| task | batch | best table-wise ms | model_guided_types ms | torchrec ms | torchrec (tuner est.) ms |",
                  "|---|---:|---:|---:|---:|---:|"]
        for row in p["rows"]:
            ps = row["predicted_s"]

            def ms(k: str, ps: dict = ps) -> str:
                return f"{ps[k] * 1e3:.3f}" if k in ps else "—"

            lines.append(f"| {row['task']} | {row['batch_size']} | {row['best_table_wise_s'] * 1e3:.3f} | "
                         f"{ms('model_guided_types')} | {ms('torchrec')} | {ms('torchrec_tuner_est')} |")
        lines.append("")
    m = doc.get("measure")
    if m:
        lines += [f"## Measured: CPU tasks, {m['ranks']} gloo ranks, batch {m['batch_size']} ({m['timing_source']})", "",
                  f"Reproduce: `{doc['measure_command']}`.", "",
                  f"{m['passes']} interleaved passes of {m['iters']} timed iterations per placement; median of the "
                  "slowest rank's iterations. `bg` = most cores other processes used during a run of it.", ""]
        for row in m["rows"]:
            lines += [f"### {row['task']} ({row['n_tables']} tables)", "",
                      "| plan | predicted ms | measured ms | bg cores |", "|---|---:|---:|---:|"]
            for k, v in row["measured_s"].items():
                lines.append(f"| {k} | {row['predicted_s'][k] * 1e3:.1f} | {v * 1e3:.1f} | "
                             f"{row['background_cores_max'][k]:.2f} |")
            if len(row["measured_s"]) < len(row["predicted_s"]):
                lines += ["", "Not measured (predicted ms): " + ", ".join(
                    f"{k} {v * 1e3:.1f}" for k, v in row["predicted_s"].items() if k not in row["measured_s"]) + "."]
            ch = row["notes"]["model_guided_types"]["changes"]
            lines += ["", f"Sharding-type changes of model_guided_types: "
                          f"{', '.join(c['sharding_type'] + ' table ' + str(c['table']) for c in ch) or 'none'}. "
                          f"Beats every table-wise plan measured: **{row['types_beat_every_table_wise']}** "
                          f"(best table-wise: {row['best_table_wise_measured']}).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("predict", "measure", "both"), default="both")
    ap.add_argument("--tasks", type=int, default=20, help="shipped tasks predicted (the space has 20)")
    ap.add_argument("--batches", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--type-evals", type=int, default=24, help="simulations model-guided spends on sharding types")
    ap.add_argument("--measure-tasks", type=int, nargs="+", default=[7, 5], help="CPU task indices measured")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--plans", nargs="*", default=[], help="measure only these plans (default: every plan)")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    try:
        import torchrec
    except Exception:
        fail("torchrec is not installed: pip install -e .[torchrec] && pip install --no-deps torchrec==1.8.0")
    if not 1 <= args.tasks <= 20 or any(not 0 <= t < 10 for t in args.measure_tasks) or args.passes < 1:
        fail("--tasks is 1..20, --measure-tasks 0..9, --passes >= 1")
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    doc = {"command": "python experiments/torchrec_compare.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "torchrec_version": getattr(torchrec, "__version__", "?")}
    if args.part in ("predict", "both"):
        doc["predict"] = predict_part(args)
    if args.part in ("measure", "both"):
        doc["measure"] = measure_part(args)
    # the part not run now keeps its stored figures
    if args.out.with_suffix(".json").exists():
        import json

        old = json.loads(args.out.with_suffix(".json").read_text())
        for part in ("predict", "measure"):
            if part not in doc and part in old:
                doc[part] = old[part]
                doc[f"{part}_command"] = old.get(f"{part}_command", old.get("command"))
    for part in ("predict", "measure"):
        doc.setdefault(f"{part}_command", doc["command"])
    write_results(args.out, doc, markdown(doc))


if __name__ == "__main__":
    main()
