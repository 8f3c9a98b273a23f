"""Scale: a 1,000-table DLRM task on 64 GPUs, a GPT-3 175B plan space on 1,024 GPUs and the rent example.

Runs ``tuner search SPACE --workers 0 --quiet`` on each space of :data:`SPACES` in a fresh process
and records its wall time, CPU time (user + system) and peak resident memory (``os.wait4``), with
what the search found, against the targets: the sharding task's seven-sharder comparison under 60 s
and 4 GB, the plan space and ``search_spaces/rent.yaml`` each under 5 minutes (2 cores). Writes ``benchmarks/results/scale_bench.md`` and
``.json``.

Run: ``python benchmarks/scale_bench.py [--repeat 1]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
#: name -> (space file, wall-time limit s, peak-memory limit bytes or None)
SPACES = {
    "sharding_1000_tables_64_gpus": (REPO / "benchmarks" / "spaces" / "sharding_1000_tables_64_gpus.yaml", 60.0,
                                     4 * 2**30),
    "parallel_gpt3_175b_1024_gpus": (REPO / "benchmarks" / "spaces" / "parallel_gpt3_175b_1024_gpus.yaml", 300.0,
                                     None),
    "rent_gpt3_13b": (REPO / "search_spaces" / "rent.yaml", 300.0, None),
}


def run_search(space: Path, out: Path) -> dict:
    """One ``tuner search`` process: wall s, CPU s, peak RSS bytes, and its results document."""
    cmd = [sys.executable, "-m", "tuner.cli", "search", str(space), "--out", str(out), "--workers", "0", "--quiet"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}:\n{text[-3000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": usage.ru_maxrss * 1024,
            "summary": text.strip().splitlines()[-1] if text.strip() else "",
            "results": json.loads((out / "results.json").read_text())}


def found(results: dict) -> dict:
    """What the search found, in a few numbers."""
    if results["space"] == "sharding":
        t = results["tasks"][0]
        return {"tables": t["n_tables"], "n_gpus": results["n_gpus"], "batch_size": t["batch_size"],
                "sharders": len(t["candidates"]), "best": t["best"], "best_predicted_iteration_s": t["best_predicted_iteration_s"],
                "model_guided_evaluations": next((c.get("search", {}).get("evaluations") for c in t["candidates"]
                                                  if c["sharder"] == "model_guided"), None)}
    if results["space"] == "rent":
        n, picks = results["counts"], results["picks"]
        return {"candidates": n["candidates"], "evaluated": n["evaluated"], "front": n["front"],
                "cheapest": (picks.get("cheapest") or {}).get("key"), "fastest": (picks.get("fastest") or {}).get("key")}
    counts, best = results.get("counts") or {}, results.get("best") or {}
    return {"devices": results.get("devices"), "candidates": counts.get("candidates"), "ok": counts.get("ok"),
            "infeasible": counts.get("infeasible"), "best": best.get("plan"),
            "best_predicted_iteration_s": best.get("predicted_iteration_s")}


def markdown(doc: dict) -> list[str]:
    """The ``scale_bench.md`` lines of a results document."""
    lines = ["# Scale — `python benchmarks/scale_bench.py`", "",
             f"{doc['meta']['date']}, {doc['meta']['cpus']} cores ({doc['meta']['note']}).", "",
             "| space | wall s (limit) | CPU s | peak RSS GiB (limit) | found |", "|---|---:|---:|---:|---|"]
    for r in doc["spaces"].values():
        what = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r["found"].items()
                         if v is not None)
        mem_lim = f" ({r['peak_rss_limit_bytes'] / 2**30:.0f})" if r["peak_rss_limit_bytes"] else ""
        lines.append(f"| `{r['space']}` | {r['wall_s']:.1f} ({r['wall_limit_s']:.0f}) | {r['cpu_s']:.1f} | "
                     f"{r['peak_rss_bytes'] / 2**30:.2f}{mem_lim} | {what} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs per space (medians)")
    ap.add_argument("--only", choices=sorted(SPACES), help="one space")
    args = ap.parse_args(argv)
    previous = RESULTS / "scale_bench.json"
    # --only re-measures one space and keeps the others' stored rows
    rows = json.loads(previous.read_text())["spaces"] if args.only and previous.exists() else {}
    for name, (space, wall_limit, mem_limit) in SPACES.items():
        if args.only and name != args.only:
            continue
        runs = []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeat):
                runs.append(run_search(space, Path(tmp) / f"run{i}"))
        med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "cpu_s", "peak_rss_bytes")}
        rows[name] = {"space": str(space.relative_to(REPO)), **med, "runs": len(runs),
                      "wall_s_all": [r["wall_s"] for r in runs], "wall_limit_s": wall_limit,
                      "peak_rss_limit_bytes": mem_limit,
                      "within_limits": med["wall_s"] < wall_limit and (mem_limit is None or med["peak_rss_bytes"] < mem_limit),
                      "found": found(runs[-1]["results"]), "summary": runs[-1]["summary"]}
    doc = {"meta": {"date": date.today().isoformat(), "cpus": os.cpu_count(), "machine": platform.machine(),
                    "python": platform.python_version(),
                    "note": "2-core VM shared with other work; one process, --workers 0; wall includes start-up and reports"},
           "spaces": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scale_bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = markdown(doc)
    (RESULTS / "scale_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
