"""Search speed: ``tuner search search_spaces/sharding.yaml`` end to end, this tree against a baseline.

The main job, ``tuner search search_spaces/sharding.yaml --workers 0``, runs in a fresh process
(``--driver``) that times its CPU (``time.process_time``) as a whole and in parts: evaluation, the
study writes (``SearchStudy.record``) and the reports (the space's ``write_outputs``). It runs twice
in one invocation: on this tree, and on this tree with the files of :data:`SPEED_FILES` as they are
at ``--baseline`` (the graph builder, the cost, the local search and the reports before the
vectorised templates), so both sides share every other file and the machine's load of the moment;
their best plans (sharder, assignment and predicted time of every task and batch size) must agree.
Then Ray throughput with 1 and 2 local workers (and 2 with one candidate per Ray task, the executor before
chunks) and, with ``--cluster``, on a Ray cluster joined
through ``RAY_ADDRESS`` (the one it names, else one this script starts with ``ray start --head`` on
loopback and stops after); and one candidate's build / timing / simulation. Writes ``benchmarks/results/search_bench.md`` and ``.json``.

Run: ``python benchmarks/search_bench.py [--repeat 3] [--cluster] [--baseline REV]``; ``--only-ray`` re-measures
only the Ray rows (local Ray with 1 and 2 workers, 2 workers with one candidate per task, and beside them the
default ``--workers auto`` and ``--workers 0``) and keeps the rest.
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
#: the fast-candidate Ray row: how many stand-in candidates, and the CPU seconds of each
FAST_CANDIDATES = 2000
FAST_SECONDS = 0.002


# ----------------------------------------------------------------------------- one run (child process)
def drive(out: Path, workers: int | str, extra: list[str], max_chunk: int | None = None) -> dict:
    """Run ``tuner search SPACE --out OUT --workers N --quiet`` in this process; CPU seconds by part, and the
    wall seconds of Ray's start or join (``ray_start_s``) and of the executor's runs (``executor_s``).
    ``max_chunk`` caps the candidates per Ray task (1: one candidate per task)."""
    from tuner import cli
    from tuner.report import sharding as report
    from tuner.search import executor, sharding, study

    if max_chunk is not None and hasattr(executor, "MAX_CHUNK"):
        executor.MAX_CHUNK = max_chunk
    spent = {"study_writes_s": 0.0, "reports_s": 0.0, "plan_files_s": 0.0, "ray_start_s": 0.0, "executor_s": 0.0,
             "ray_start_in_executor_s": 0.0}
    depth = dict.fromkeys(spent, 0)

    def timed(cls: object, attr: str, key: str, clock=time.process_time) -> None:
        inner = getattr(cls, attr, None)
        if inner is None:
            return

        def wrapper(*args, **kwargs):
            depth[key] += 1
            t0 = clock()
            try:
                return inner(*args, **kwargs)
            finally:
                depth[key] -= 1
                if not depth[key]:  # the outermost call counts (record may flush)
                    spent[key] += clock() - t0
                    if key == "ray_start_s" and depth["executor_s"]:  # Ray started inside an executor run
                        spent["ray_start_in_executor_s"] += clock() - t0

        setattr(cls, attr, wrapper)

    for attr in ("record", "flush"):
        timed(study.SearchStudy, attr, "study_writes_s")
    timed(sharding.ShardingSearch, "write_outputs", "reports_s")
    timed(report, "write_plan_files", "plan_files_s")  # TorchRec plan files: part of the reports where written
    timed(executor, "connect_ray", "ray_start_s", time.perf_counter)
    timed(executor.Executor, "run", "executor_s", time.perf_counter)
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


# ----------------------------------------------------------------------------- fast candidates (child process)
def spin_evaluate(ctx: dict, candidate, part: object = None) -> list:
    """A stand-in evaluation that spins ``ctx['seconds']`` of CPU and returns one ok outcome."""
    from tuner.search import Outcome

    t0 = time.process_time()
    while time.process_time() - t0 < ctx["seconds"]:
        pass
    return [Outcome(candidate.key, dict(candidate.params), {"status": "ok"}, 0.0)]


class SpinSpace:
    """The part of a search space the executor uses: ``n`` candidates of ``seconds`` CPU each."""

    def __init__(self, n: int, seconds: float) -> None:
        from tuner.search import Candidate

        self.ctx = {"seconds": seconds}
        self._candidates = [Candidate(f"c{i}", {"i": i}) for i in range(n)]

    def candidates(self) -> list:
        return self._candidates

    def evaluator(self):
        return spin_evaluate

    def worker_context(self) -> dict:
        return self.ctx

    def failed(self, candidate, reason: str) -> list:
        raise RuntimeError(reason)


def drive_fast(n: int, seconds: float, workers: int) -> dict:
    """Wall seconds of ``n`` candidates of ``seconds`` each on one local Ray: chunked, then one per task."""
    from tuner.search import executor

    space = SpinSpace(n, seconds)
    executor.connect_ray(workers)
    done: list[str] = []
    Executor = executor.Executor
    Executor(workers).run(space, space.candidates()[: 4 * workers], lambda c, o: None)  # workers started, warm
    out = {}
    for label, cap in (("chunks", executor.MAX_CHUNK), ("one_per_task", 1)):
        executor.MAX_CHUNK = cap
        t0 = time.perf_counter()
        Executor(workers).run(space, space.candidates(), lambda c, o: done.append(c.key))
        out[f"{label}_s"] = time.perf_counter() - t0
    if len(done) != 2 * n:
        raise RuntimeError(f"{len(done)} results of {2 * n}")
    return out | {"candidates": n, "seconds_each": seconds, "workers": workers,
                  "serial_s": n * seconds}


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


def ray_run(out: Path, workers: int | str, env: dict, mode: str, label: int | str | None, attempts: int = 2,
            max_chunk: int | None = None) -> dict:
    """A search on Ray; Ray's start-up can time out on a loaded VM: tried ``attempts`` times, else the error."""
    err = ""
    for _ in range(attempts):
        try:
            return run_child(REPO, out, workers, env=env, max_chunk=max_chunk) | {"mode": mode, "workers": label}
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


def run_child(tree: Path, out: Path, workers: int | str, extra: list[str] = (), env: dict | None = None,
              max_chunk: int | None = None) -> dict:
    """One ``--driver`` run on the packages of ``tree``."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--driver", str(out), "--workers", str(workers)]
    if max_chunk is not None:
        cmd.append(f"--max-chunk={max_chunk}")
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
    ap.add_argument("--only-ray", action="store_true",
                    help="run only the Ray rows; the main job's rows and the single candidate are kept from the "
                         "results file")
    ap.add_argument("--ray-repeat", type=int, default=1, help="runs of each Ray row (median)")
    ap.add_argument("--driver", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--max-chunk", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fast", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workers", default="0", help=argparse.SUPPRESS)
    ap.add_argument("--extra", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.driver:
        print(json.dumps(drive(args.driver, args.workers, args.extra, args.max_chunk)))
        return
    if args.fast:
        print(json.dumps(drive_fast(FAST_CANDIDATES, FAST_SECONDS, 2)))
        return
    if args.only_ray:
        doc = json.loads((RESULTS / "search_bench.json").read_text())
        with tempfile.TemporaryDirectory() as tmp_s:
            doc["ray"] = ray_rows(Path(tmp_s), doc["evaluations"], args.cluster, args.ray_repeat)
        write(doc)
        return
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        after = [run_child(REPO, tmp / f"after{i}", 0) for i in range(args.repeat)]
        before = None
        if not args.no_baseline:
            tree = baseline_tree(args.baseline, tmp / "baseline")
            before = run_child(tree, tmp / "before", 0)
        n_eval = sum(len(t["candidates"]) for t in after[0]["results"]["tasks"])
        ray = ray_rows(tmp, n_eval, args.cluster, args.ray_repeat)
    same = before is None or all(best_plans(r["results"]) == best_plans(before["results"]) for r in after)
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
        "ray": ray,
        "single_candidate": single_candidate(),
    }
    write(doc)


def ray_rows(tmp: Path, n_eval: int, cluster: bool, repeat: int = 1) -> list[dict]:
    """Searches on Ray: a local Ray with 1 and 2 workers, 2 workers with one candidate per task (the executor
    before chunks), and with ``cluster`` a Ray cluster; beside them the default ``--workers auto`` and
    ``--workers 0`` (in this process); wall seconds, Ray's start, the evaluation phase (medians of ``repeat``
    runs, the modes interleaved so the machine's load of the moment falls on each)."""
    modes: list[tuple[str, int | str, int | None]] = [("default `--workers auto`", "auto", None),
                                                      ("in this process, `--workers 0`", 0, None)]
    modes += [(f"local Ray, {w} worker(s)", w, None) for w in (1, 2)]
    modes.append(("local Ray, 2 worker(s), one candidate per task", 2, 1))
    runs: dict[str, list[dict]] = {}
    for i in range(repeat):
        for mode, w, chunk in modes:
            runs.setdefault(mode, []).append(ray_run(tmp / f"ray{i}-{w}-{chunk}", w, {"RAY_ADDRESS": ""}, mode, w,
                                                     max_chunk=chunk))
        if cluster:
            r = cluster_run(tmp / f"cluster{i}")
            runs.setdefault(r["mode"], []).append(r)
    rows = []
    fast = fast_rows(repeat)
    for mode, got in runs.items():
        ok = [r for r in got if "error" not in r]
        if not ok:
            rows.append(got[-1])
            continue
        # the executor's wall time after Ray is up (the search core starts Ray before its first claim, outside the
        # executor's runs)
        phase = [r["executor_s"] - r["ray_start_in_executor_s"] for r in ok]
        med = {k: statistics.median(r[k] for r in ok) for k in ("wall_s", "cpu_s", "ray_start_s")}
        rows.append({"mode": mode, "workers": ok[0]["workers"], "runs": len(ok), **med,
                     "evaluation_phase_s": statistics.median(phase), "wall_s_all": [r["wall_s"] for r in ok],
                     "evaluations_per_s": n_eval / med["wall_s"],
                     "evaluation_phase_evaluations_per_s": n_eval / statistics.median(phase)})
    return rows + fast


def fast_rows(repeat: int) -> list[dict]:
    """Fast candidates on a local Ray with 2 workers, chunked and one per task in one process (medians)."""
    runs, err = [], ""
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(REPO)}
    for _ in range(repeat):
        res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--fast"], cwd=REPO, env=env,
                             capture_output=True, text=True)
        if res.returncode:
            err = (res.stderr.strip().splitlines() or ["no output"])[-1]
            continue
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    mode = f"{FAST_CANDIDATES} stand-in candidates of {FAST_SECONDS * 1e3:.0f} ms CPU, local Ray, 2 workers"
    if not runs:
        return [{"mode": mode, "workers": 2, "error": err}]
    med = {k: statistics.median(r[k] for r in runs) for k in ("chunks_s", "one_per_task_s")}
    return [{"mode": mode, "workers": 2, "runs": len(runs), "fast": True, **med, "serial_s": runs[0]["serial_s"],
             "chunks_s_all": [r["chunks_s"] for r in runs], "one_per_task_s_all": [r["one_per_task_s"] for r in runs]}]


def write(doc: dict) -> None:
    """Write ``search_bench.json`` and ``.md`` and print the markdown."""
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
    lines += ["", "## Ray", "", f"Wall seconds of one `tuner search` process ({doc['evaluations']} evaluations); Ray's start "
              "(local) or join (cluster); the evaluation phase is the executor's time once Ray is up (`--workers auto` "
              "and `0`: all of it); medians of "
              f"{max((r.get('runs', 1) for r in doc['ray']), default=1)} runs, the modes interleaved.", "",
              "| where | wall s | Ray start s | evaluation phase s | evaluations/s (wall) | evaluations/s (phase) |",
              "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['mode']} | failed: {r['error']} | | | | |" if "error" in r else
              f"| {r['mode']} | {r['wall_s']:.1f} | {r['ray_start_s']:.1f} | {r['evaluation_phase_s']:.1f} | "
              f"{r['evaluations_per_s']:.1f} | {r['evaluation_phase_evaluations_per_s']:.0f} |"
              for r in doc["ray"] if "stand-in" not in r["mode"]]
    for r in doc["ray"]:
        if "fast" in r:
            lines += ["", f"Where candidates are fast ({r['mode']}, workers warm, medians of {r['runs']}): chunks "
                      f"{r['chunks_s']:.2f} s, one candidate per task {r['one_per_task_s']:.2f} s "
                      f"({r['one_per_task_s'] / r['chunks_s']:.1f}x); {r['serial_s']:.1f} s of evaluations in all."]
        elif "stand-in" in r["mode"]:
            lines += ["", f"{r['mode']}: failed: {r['error']}"]
    one = doc["single_candidate"]
    lines += ["", f"One candidate ({one['tasks_in_graph']} tasks, 4 ranks, largest batch): its graph from the job's template "
              f"{one['build_s'] * 1e3:.2f} ms; the graph without kernel parameters and its durations (gathered, "
              f"all-to-alls timed) {one['timed_graph_s'] * 1e3:.2f} ms; simulation {one['simulate_s'] * 1e3:.3f} ms "
              "(medians of 30)."]
    return lines


if __name__ == "__main__":
    main()
