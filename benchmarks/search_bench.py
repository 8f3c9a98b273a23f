"""Search speed: ``tuner search search_spaces/sharding.yaml`` end to end, this tree against a baseline.

The main job, ``tuner search search_spaces/sharding.yaml --workers 0``, runs in a fresh process
(``--driver``) that times its CPU (``time.process_time``) as a whole and in parts: evaluation, the
study writes (``SearchStudy.record``) and the reports (the space's ``write_outputs``). It runs twice
in one invocation: on this tree, and on this tree with the files of :data:`SPEED_FILES` as they are
at ``--baseline`` (the graph builder, the cost, the local search and the reports before the
vectorised templates), so both sides share every other file and the machine's load of the moment;
their best plans (sharder, assignment and predicted time of every task and batch size) must agree.
Then Ray throughput with 1 and 2 local workers and, with ``--cluster``, on a Ray cluster joined
through ``RAY_ADDRESS`` (the one it names, else one this script starts with ``ray start --head`` on
loopback and stops after); and one candidate's build / timing / simulation. Writes ``benchmarks/results/search_bench.md`` and ``.json``.

Run: ``python benchmarks/search_bench.py [--repeat 3] [--cluster] [--baseline REV]``
"""

from __future__ import annotations

import argparse
import contextlib
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
               "tuner/report/sharding.py")
#: (file, text of this tree, what the baseline side runs instead): the calls into what SPEED_FILES gained
BASELINE_EDITS = (("tuner/sharders/model_guided.py", "lower_bound=job.lower_bound,", ""),)


# ----------------------------------------------------------------------------- one run (child process)
def drive(out: Path, workers: int, extra: list[str]) -> dict:
    """Run ``tuner search SPACE --out OUT --workers N --quiet`` in this process; CPU seconds by part."""
    from tuner import cli
    from tuner.report import sharding as report
    from tuner.search import sharding, study

    spent = {"study_writes_s": 0.0, "reports_s": 0.0, "plan_files_s": 0.0}
    depth = {"study_writes_s": 0, "reports_s": 0, "plan_files_s": 0}

    def timed(cls: object, attr: str, key: str) -> None:
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
    timed(report, "write_plan_files", "plan_files_s")  # TorchRec plan files: part of the reports where written
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
    for f, here, there in BASELINE_EDITS:
        text = (dest / f).read_text()
        if here not in text:
            raise RuntimeError(f"{f} no longer has {here!r}: update BASELINE_EDITS")
        (dest / f).write_text(text.replace(here, there))
    return dest


def ray_run(out: Path, workers: int, env: dict, mode: str, label: int | None, attempts: int = 2) -> dict:
    """A search on Ray; Ray's start-up can time out on a loaded VM: tried ``attempts`` times, else the error."""
    err = ""
    for _ in range(attempts):
        try:
            return run_child(REPO, out, workers, env=env) | {"mode": mode, "workers": label}
        except RuntimeError as exc:
            err = str(exc).strip().splitlines()[-1]
            shutil.rmtree(out, ignore_errors=True)
    return {"mode": mode, "workers": label, "error": err}


def cluster_run(out: Path) -> dict:
    """A search on the cluster at ``RAY_ADDRESS``, else on one started here (``ray start --head``, 2 CPUs)."""
    address = os.environ.get("RAY_ADDRESS")
    if address:
        return ray_run(out, 2, {"RAY_ADDRESS": address}, f"cluster at {address}", None)
    mode = "cluster of ray start --head (2 CPUs), joined through RAY_ADDRESS"
    try:
        temp_dir, where = start_head()
    except RuntimeError as exc:  # a loaded 2-core VM: Ray's 30 s start-up window can pass
        return {"mode": mode, "workers": None, "error": str(exc)}
    try:
        return ray_run(out, 2, {"RAY_ADDRESS": where}, mode, None)
    finally:
        stop_head(temp_dir)


def start_head() -> tuple[str, str]:
    """``ray start --head`` with 2 CPUs in a fresh temp dir; returns (temp dir, the address it prints). Ray turns
    a loopback address into the machine's own when it joins, so the head listens there (its default)."""
    import re
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    temp_dir = tempfile.mkdtemp(prefix="sb", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}", "--num-cpus=2", f"--temp-dir={temp_dir}", "--include-dashboard=false",
           "--disable-usage-stats"]
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        stop_head(temp_dir)
        raise RuntimeError("ray start --head did not return within 300 s") from None
    if res.returncode:
        stop_head(temp_dir)
        raise RuntimeError(f"ray start --head failed: {res.stderr.strip().splitlines()[-1:]}")
    found = re.search(r"--address='([^']+)'", res.stdout + res.stderr)
    return temp_dir, found.group(1) if found else f"127.0.0.1:{port}"


def stop_head(temp_dir: str) -> None:
    """Kill the processes of the cluster started in ``temp_dir``, by pid (``ray stop`` would stop every Ray)."""
    import signal

    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="ignore")
        except OSError:
            continue
        if temp_dir in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)
    shutil.rmtree(temp_dir, ignore_errors=True)


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
    keys = ("cpu_s", "wall_s", "study_writes_s", "reports_s", "plan_files_s", "evaluation_s")
    return {k: statistics.median(r[k] for r in runs) for k in keys} | {"repeats": len(runs),
                                                                         "cpu_s_all": [r["cpu_s"] for r in runs]}


def single_candidate() -> dict:
    """Median seconds of one candidate of the space's first task (largest batch): its full graph, the graph the
    objective simulates with its durations, the simulation."""
    import numpy as np

    from predictor.simulate import simulate
    from tuner.search.registry import load_space
    from tuner.search.sharding import build_sharding_context

    space = load_space(SPACE)
    ctx = build_sharding_context(space)
    job = ctx.job(0, max(space.batch_sizes))
    a = np.arange(len(ctx.tasks[0])) % space.n_gpus
    job.timed_graph(a)  # the template and its pool's durations, once per job
    build, timed, sim = [], [], []
    for _ in range(30):
        t0 = time.perf_counter()
        job.graph(a)
        t1 = time.perf_counter()
        g, d = job.timed_graph(a, params=False)
        t2 = time.perf_counter()
        simulate(g, d)
        t3 = time.perf_counter()
        build.append(t1 - t0)
        timed.append(t2 - t1)
        sim.append(t3 - t2)
    return {"tasks_in_graph": g.n_tasks, "build_s": float(np.median(build)), "timed_graph_s": float(np.median(timed)),
            "simulate_s": float(np.median(sim))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of this tree's main job (median); the baseline runs once")
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the 'before' side")
    ap.add_argument("--no-baseline", action="store_true", help="skip the 'before' side")
    ap.add_argument("--cluster", action="store_true",
                    help="also search on a Ray cluster: the one at RAY_ADDRESS, else one started here with ray start --head")
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
        for w in (1, 2):
            ray.append(ray_run(tmp / f"ray{w}", w, {"RAY_ADDRESS": ""}, f"local Ray, {w} worker(s)", w))
        if args.cluster:
            ray.append(cluster_run(tmp / "cluster"))
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
                     "cpu_speedup_without_plan_files": None if before is None else
                     (before["cpu_s"] - before["plan_files_s"]) / (a["cpu_s"] - a["plan_files_s"]),
                     "same_best_plans": same},
        "ray": [r if "error" in r else {k: r[k] for k in ("mode", "workers", "wall_s", "cpu_s")}
                | {"evaluations_per_s": n_eval / r["wall_s"]} for r in ray],
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
        "| tree | total | evaluation | study writes | reports | of which TorchRec plan files | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| this tree (median of {a['repeats']}) | {a['cpu_s']:.1f} | {a['evaluation_s']:.1f} | {a['study_writes_s']:.2f} | "
        f"{a['reports_s']:.2f} | {a['plan_files_s']:.2f} | {a['wall_s']:.1f} |",
    ]
    if b:
        lines += [
            f"| baseline `{doc['meta']['baseline']}` for {', '.join(f'`{f}`' for f in doc['meta']['baseline_files'])} | "
            f"{b['cpu_s']:.1f} | {b['evaluation_s']:.1f} | {b['study_writes_s']:.2f} | {b['reports_s']:.2f} | "
            f"{b['plan_files_s']:.2f} | {b['wall_s']:.1f} |",
            "",
            f"CPU {m['cpu_speedup']:.1f}x less ({m['cpu_speedup_without_plan_files']:.1f}x without the TorchRec plan files, "
            f"which the baseline does not write); same best plans (sharder, assignment and predicted time of every "
            f"task and batch size): {'yes' if m['same_best_plans'] else 'NO'}.",
        ]
    lines += ["", "## Ray", "", "| where | wall s | evaluations/s |", "|---|---:|---:|"]
    lines += [f"| {r['mode']} | failed: {r['error']} | |" if "error" in r else
              f"| {r['mode']} | {r['wall_s']:.1f} | {r['evaluations_per_s']:.1f} |" for r in doc["ray"]]
    one = doc["single_candidate"]
    lines += ["", f"One candidate ({one['tasks_in_graph']} tasks, 4 ranks, largest batch): its graph from the job's template "
              f"{one['build_s'] * 1e3:.2f} ms; the graph without kernel parameters and its durations (gathered, "
              f"all-to-alls timed) {one['timed_graph_s'] * 1e3:.2f} ms; simulation {one['simulate_s'] * 1e3:.3f} ms "
              "(medians of 30)."]
    return lines


if __name__ == "__main__":
    main()
