"""Search speed: ``tuner search search_spaces/sharding.yaml`` end to end, this tree against a baseline.

The main job, ``tuner search search_spaces/sharding.yaml --workers 0``, runs in a fresh process
(``--driver``) that times its CPU (``time.process_time``) as a whole and in parts: evaluation, the
study writes (``SearchStudy.record``) and the reports (the space's ``write_outputs``). It runs twice
in one invocation: on this tree, and on this tree with the files of :data:`SPEED_FILES` as they are
at ``--baseline`` (the graph builder, the cost, the local search and the reports before the
vectorised templates), so both sides share every other file and the machine's load of the moment;
their best plans (sharder, assignment and predicted time of every task and batch size) must agree.
Then Ray throughput with 1 and 2 local workers and, with ``--cluster``, on a cluster started with
``ray start --head`` (joined through ``RAY_ADDRESS``); and one candidate's build / timing /
simulation. Writes ``benchmarks/results/search_bench.md`` and ``.json``.

Run: ``python benchmarks/search_bench.py [--repeat 3] [--cluster] [--baseline REV]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SPACE = REPO / "search_spaces" / "sharding.yaml"
#: the commit before the vectorised DLRM templates, the incremental local search and best-only reports
BASELINE = "0170173"
#: the files that decide the main job's speed, taken from the baseline for the "before" side
SPEED_FILES = ("predictor/sources/synth/dlrm.py", "tuner/cost.py", "tuner/sharders/local_search.py",
               "tuner/sharders/model_guided.py", "tuner/report/sharding.py")


# ----------------------------------------------------------------------------- one run (child process)
def drive(out: Path, workers: int, extra: list[str]) -> dict:
    """Run ``tuner search SPACE --out OUT --workers N --quiet`` in this process; CPU seconds by part."""
    from tuner import cli
    from tuner.search import sharding, study

    spent = {"study_writes_s": 0.0, "reports_s": 0.0}
    depth = {"study_writes_s": 0, "reports_s": 0}

    def timed(cls: type, attr: str, key: str) -> None:
        inner = getattr(cls, attr, None)
        if inner is None:
            return

        def wrapper(*args, **kwargs):
            depth[key] += 1
            t0 = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                depth[key] -= 1
                if not depth[key]:  # the outermost call counts (record may flush)
                    spent[key] += time.process_time() - t0

        setattr(cls, attr, wrapper)

    for attr in ("record", "flush"):
        timed(study.SearchStudy, attr, "study_writes_s")
    timed(sharding.ShardingSearch, "write_outputs", "reports_s")
    argv = ["search", str(SPACE), "--out", str(out), "--workers", str(workers), "--quiet", *extra]
    t0, w0 = time.process_time(), time.perf_counter()
    sys.argv = ["tuner", *argv]
    try:
        cli.main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    return {"cpu_s": cpu, "wall_s": wall, **spent, "evaluation_s": cpu - spent["study_writes_s"] - spent["reports_s"],
            "tuner": str(Path(cli.__file__).resolve().parents[1])}


# ----------------------------------------------------------------------------- the parent
def baseline_tree(rev: str, dest: Path) -> Path:
    """This tree's packages with :data:`SPEED_FILES` as at ``rev`` (assets and spaces linked)."""
    for pkg in ("predictor", "tuner"):
        shutil.copytree(REPO / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for link in ("assets", "search_spaces"):
        (dest / link).symlink_to(REPO / link)
    for f in SPEED_FILES:
        text = subprocess.run(["git", "show", f"{rev}:{f}"], cwd=REPO, check=True, capture_output=True, text=True).stdout
        (dest / f).write_text(text)
    return dest


def run_child(tree: Path, out: Path, workers: int, extra: list[str] = (), env: dict | None = None) -> dict:
    """One ``--driver`` run on the packages of ``tree``."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--driver", str(out), "--workers", str(workers)]
    cmd += [f"--extra={e}" for e in extra]
    res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"driver failed ({res.returncode}):\n{res.stderr[-3000:]}")
    run = json.loads(res.stdout.strip().splitlines()[-1])
    if Path(run["tuner"]).resolve() != tree.resolve():
        raise RuntimeError(f"driver imported tuner from {run['tuner']}, not {tree}")
    run["results"] = json.loads((out / "results.json").read_text())
    return run


def best_plans(results: dict) -> list[tuple]:
    """(task, batch, best sharder, its predicted seconds, every candidate's assignment) per task and batch."""
    return [(t["task"], t["batch_size"], t["best"], t["best_predicted_iteration_s"],
             tuple(tuple(c.get("assignment") or ()) for c in t["candidates"])) for t in results["tasks"]]


def median_run(runs: list[dict]) -> dict:
    keys = ("cpu_s", "wall_s", "study_writes_s", "reports_s", "evaluation_s")
    return {k: statistics.median(r[k] for r in runs) for k in keys} | {"repeats": len(runs),
                                                                         "cpu_s_all": [r["cpu_s"] for r in runs]}


def single_candidate() -> dict:
    """Median seconds of build / time / simulate of one candidate of the space's first task (largest batch)."""
    import numpy as np

    from predictor.simulate import simulate
    from tuner.search.registry import load_space
    from tuner.search.sharding import build_sharding_context

    space = load_space(SPACE)
    ctx = build_sharding_context(space)
    job = ctx.job(0, max(space.batch_sizes))
    a = np.arange(len(ctx.tasks[0])) % space.n_gpus
    job.timed_graph(a)  # the template and its pool's durations, once per job
    build, timing, sim = [], [], []
    for _ in range(30):
        t0 = time.perf_counter()
        g = job.graph(a)
        t1 = time.perf_counter()
        _, d = job.timed_graph(a)
        t2 = time.perf_counter()
        simulate(g, d)
        t3 = time.perf_counter()
        build.append(t1 - t0)
        timing.append(t2 - t1 - (t1 - t0))
        sim.append(t3 - t2)
    return {"tasks_in_graph": g.n_tasks, "build_s": float(np.median(build)), "timing_s": max(float(np.median(timing)), 0.0),
            "simulate_s": float(np.median(sim))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of this tree's main job (median); the baseline runs once")
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the 'before' side")
    ap.add_argument("--no-baseline", action="store_true", help="skip the 'before' side")
    ap.add_argument("--cluster", action="store_true", help="also join the Ray cluster at RAY_ADDRESS")
    ap.add_argument("--driver", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--extra", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.driver:
        print(json.dumps(drive(args.driver, args.workers, args.extra)))
        return
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        after = [run_child(REPO, tmp / f"after{i}", 0) for i in range(args.repeat)]
        before = None
        if not args.no_baseline:
            tree = baseline_tree(args.baseline, tmp / "baseline")
            before = run_child(tree, tmp / "before", 0)
        ray = []
        env = {"RAY_ADDRESS": ""}
        for w in (1, 2):
            ray.append(run_child(REPO, tmp / f"ray{w}", w, env=env) | {"mode": f"local Ray, {w} worker(s)", "workers": w})
        if args.cluster:
            if not os.environ.get("RAY_ADDRESS"):
                raise SystemExit("error: --cluster needs RAY_ADDRESS (ray start --head prints it)")
            ray.append(run_child(REPO, tmp / "cluster", 2) | {"mode": f"cluster {os.environ['RAY_ADDRESS']}",
                                                              "workers": None})
    same = before is None or all(best_plans(r["results"]) == best_plans(before["results"]) for r in after)
    n_eval = sum(len(t["candidates"]) for t in after[0]["results"]["tasks"])
    a = median_run(after)
    doc = {
        "meta": {"date": date.today().isoformat(), "cpus": os.cpu_count(), "machine": platform.machine(),
                 "python": platform.python_version(), "baseline": None if before is None else args.baseline,
                 "baseline_files": list(SPEED_FILES),
                 "note": "2-core VM shared with other work: CPU seconds in-process (time.process_time)"},
        "evaluations": n_eval,
        "main_job": {"after": a, "before": None if before is None else median_run([before]),
                     "cpu_speedup": None if before is None else before["cpu_s"] / a["cpu_s"],
                     "same_best_plans": same},
        "ray": [{k: r[k] for k in ("mode", "workers", "wall_s", "cpu_s")} | {"evaluations_per_s": n_eval / r["wall_s"]}
                for r in ray],
        "single_candidate": single_candidate(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "search_bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = markdown(doc)
    (RESULTS / "search_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def markdown(doc: dict) -> list[str]:
    m = doc["main_job"]
    a, b = m["after"], m["before"]
    lines = [
        "# Search speed — `tuner search search_spaces/sharding.yaml`",
        "",
        f"`python benchmarks/search_bench.py`, {doc['meta']['date']}, {doc['meta']['cpus']} cores ({doc['meta']['note']}).",
        f"20 tasks x 4 batch sizes x 7 sharders on 4 A100s: {doc['evaluations']} evaluations.",
        "",
        "## Main job, `--workers 0` (CPU seconds in-process)",
        "",
        "| tree | total | evaluation | study writes | reports | wall s |",
        "|---|---:|---:|---:|---:|---:|",
        f"| this tree (median of {a['repeats']}) | {a['cpu_s']:.1f} | {a['evaluation_s']:.1f} | {a['study_writes_s']:.2f} | "
        f"{a['reports_s']:.2f} | {a['wall_s']:.1f} |",
    ]
    if b:
        lines += [
            f"| baseline `{doc['meta']['baseline']}` for {', '.join(f'`{f}`' for f in doc['meta']['baseline_files'])} | "
            f"{b['cpu_s']:.1f} | {b['evaluation_s']:.1f} | {b['study_writes_s']:.2f} | {b['reports_s']:.2f} | {b['wall_s']:.1f} |",
            "",
            f"CPU {m['cpu_speedup']:.1f}x less; same best plans (sharder, assignment and predicted time of every "
            f"task and batch size): {'yes' if m['same_best_plans'] else 'NO'}.",
        ]
    lines += ["", "## Ray", "", "| where | wall s | evaluations/s |", "|---|---:|---:|"]
    lines += [f"| {r['mode']} | {r['wall_s']:.1f} | {r['evaluations_per_s']:.1f} |" for r in doc["ray"]]
    one = doc["single_candidate"]
    lines += ["", f"One candidate ({one['tasks_in_graph']} tasks, 4 ranks, largest batch): build {one['build_s'] * 1e3:.2f} ms, "
              f"kernel timing {one['timing_s'] * 1e3:.2f} ms, simulate {one['simulate_s'] * 1e3:.3f} ms (medians of 30)."]
    return lines


if __name__ == "__main__":
    main()
