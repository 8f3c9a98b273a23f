"""Search throughput: the shipped ``search_spaces/sharding.yaml`` end to end.

Times the whole search (context, Ray start-up, every evaluation, study writes) with
``--workers`` in {0 (in-process), 2 (local Ray)}, plus the single-candidate cost (build the
DLRM graph, time it with the kernel models, simulate) on its own, and writes
``benchmarks/results/search_bench.md`` and ``.json``.

Run: ``python benchmarks/search_bench.py``
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

from predictor.simulate import simulate
from predictor.sources.synth.dlrm import build_dlrm_graph
from tuner.search import default_storage
from tuner.search.registry import load_space
from tuner.search.sharding import build_sharding_context, run_sharding_search

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def single_candidate(space) -> dict:
    """Median seconds of build / time / simulate for one candidate of the space's first task."""
    ctx = build_sharding_context(space)
    job = ctx.job(0, max(space.batch_sizes))
    a = np.arange(len(ctx.tasks[0])) % space.n_gpus
    build, timing, sim = [], [], []
    for _ in range(30):
        t0 = time.perf_counter()
        g = build_dlrm_graph(job.spec, a, job.n_ranks)
        t1 = time.perf_counter()
        d = job.timing.durations(g)
        t2 = time.perf_counter()
        simulate(g, d)
        t3 = time.perf_counter()
        build.append(t1 - t0)
        timing.append(t2 - t1)
        sim.append(t3 - t2)
    return {"tasks_in_graph": g.n_tasks, "build_s": float(np.median(build)), "timing_s": float(np.median(timing)),
            "simulate_s": float(np.median(sim))}


def main(argv: list[str] | None = None) -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options; --help
    space = load_space(REPO / "search_spaces" / "sharding.yaml")
    rows = []
    for workers in (0, 2):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            out = run_sharding_search(space, storage=default_storage(Path(tmp)), workers=workers)
            wall = time.perf_counter() - t0
        n = sum(len(c) for c in out.outcomes.values())
        rows.append({"workers": workers, "evaluations": n, "wall_s": wall, "evaluations_per_s": n / wall})
    one = single_candidate(space)
    meta = {"date": date.today().isoformat(), "cpus": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "note": "2-core VM shared with other work; wall times include Ray start-up"}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "search_bench.json").write_text(json.dumps({"meta": meta, "runs": rows, "single_candidate": one}, indent=2))
    lines = [
        "# Search throughput — `tuner search search_spaces/sharding.yaml`",
        "",
        f"`python benchmarks/search_bench.py`, {meta['date']}, {meta['cpus']} cores ({meta['note']}).",
        "20 tasks x 4 batch sizes x 7 sharders on 4 A100s; the model-guided sharder runs up to 40 extra "
        "simulations per task and batch.",
        "",
        "| workers | evaluations reported | wall s | evaluations/s |",
        "|---:|---:|---:|---:|",
    ]
    for r in rows:
        mode = "0 (in-process)" if r["workers"] == 0 else f"{r['workers']} (local Ray)"
        lines.append(f"| {mode} | {r['evaluations']} | {r['wall_s']:.1f} | {r['evaluations_per_s']:.1f} |")
    lines += [
        "",
        f"One candidate ({one['tasks_in_graph']} tasks, 4 ranks, batch {max(space.batch_sizes)}): build "
        f"{one['build_s'] * 1e3:.2f} ms, kernel timing {one['timing_s'] * 1e3:.2f} ms, simulate {one['simulate_s'] * 1e3:.3f} ms "
        "(medians of 30).",
    ]
    (RESULTS / "search_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
