"""What a page fault costs on this CPU, and how much of a training step's system time it explains.

The e2e runs (``experiments/e2e_cpu.py``) record per training step the system CPU time and the minor
page faults of each process (``getrusage``). This measures the cost of one fault where nothing else
happens: a fresh process allocates a tensor above glibc's mmap threshold, writes it once (every 4 KiB
page faults, the kernel zero-fills it) and frees it (glibc unmaps it), ``--repeats`` times per size;
against the same write into a buffer kept mapped, the difference per fault is the fault's cost,
and the system time per fault is read from ``getrusage`` too. It then prices each e2e row's faults
at that cost and compares with the row's measured system time: where they agree, the system time
of a step is page faults (a host-memory model would need only the bytes faulted per step); where
the measured system time is far larger, it is something else (gloo's socket calls on 2 ranks).

The fault cost is measured by :func:`predictor.timing.calibration.page_faults.measure_page_fault_s`, which
``tuner calibrate`` runs too (the platform's ``page_fault_s``, priced into the embedding backward);
this script's own results feed no prediction.

Run:  flock /tmp/tuner-measure.lock python experiments/page_faults_cpu.py
      (writes benchmarks/results/page_faults_cpu.{md,json}; a few seconds)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.common import fail  # noqa: E402

#: a step's system time below this (seconds) is too small to apportion
MIN_SYSTEM_S = 1e-4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--e2e", default=str(REPO / "benchmarks" / "results" / "e2e_cpu.json"),
                    help="an e2e_cpu.py result whose rows carry per-step system time and faults")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "page_faults_cpu"))
    args = ap.parse_args()
    if args.repeats < 3:
        fail("--repeats must be >= 3")
    e2e_path = Path(args.e2e)
    try:
        rows = json.loads(e2e_path.read_text(encoding="utf-8"))["rows"]
        steps = [(r["model"], r["batch"], r["ranks"], r["system"]) for r in rows if r.get("system")]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        fail(f"--e2e {e2e_path}: not a readable e2e_cpu.py result ({exc})")

    import torch

    from predictor.timing.calibration.page_faults import measure_page_fault_s
    from predictor.timing.kernels.host_memory import PAGE_BYTES

    wall_fault, costs = measure_page_fault_s(args.repeats)
    sys_fault = statistics.median(c["system_per_fault_s"] for c in costs)
    priced = []
    for model, batch, ranks, s in steps:
        faults, system = float(s["minor_faults"]), float(s["system_s"])
        priced.append({"model": model, "batch": batch, "ranks": ranks, "wall_s": s["wall_s"], "system_s": system,
                       "faults": faults, "faults_priced_s": faults * sys_fault,
                       "explained": (faults * sys_fault / system) if system >= MIN_SYSTEM_S else None})

    from predictor.files import atomic_write_text

    out = Path(args.out)
    meta = {"date": dt.date.today().isoformat(), "torch": torch.__version__, "repeats": args.repeats,
            "e2e": str(e2e_path.relative_to(REPO) if e2e_path.is_relative_to(REPO) else e2e_path)}
    atomic_write_text(out.with_suffix(".json"), json.dumps(
        {"meta": meta, "fault_cost": costs, "wall_per_fault_s": wall_fault, "system_per_fault_s": sys_fault,
         "steps": priced}, indent=1))
    lines = [
        "# Page faults on this CPU: their cost, and the system time of a training step",
        "",
        f"{meta['date']}, torch {meta['torch']}, 1 thread. Reproduce: `flock /tmp/tuner-measure.lock python "
        "experiments/page_faults_cpu.py` (module doc: what is measured).",
        "",
        "## One fault alone",
        "",
        "| tensor MiB | faults per allocation | pages | fresh write ms | kept-buffer write ms | wall us per fault "
        "| system us per fault |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in costs:
        lines.append(f"| {c['size_bytes'] / 2**20:.0f} | {c['faults_per_alloc']:.0f} | {c['pages']:.0f} | "
                     f"{c['fresh_wall_s'] * 1e3:.2f} | {c['kept_wall_s'] * 1e3:.2f} | {c['wall_per_fault_s'] * 1e6:.2f} | "
                     f"{c['system_per_fault_s'] * 1e6:.2f} |")
    lines += [
        "",
        f"Median: **{wall_fault * 1e6:.2f} us of wall time, {sys_fault * 1e6:.2f} us of system time per fault** "
        f"({PAGE_BYTES / sys_fault / 1e9:.1f} GB/s of freshly faulted memory).",
        "",
        f"## Training steps (`{meta['e2e']}`, per step)",
        "",
        "`explained` = faults x the system time per fault above, over the step's measured system time "
        "('-': under 0.1 ms of system time).",
        "",
        "| model | batch | ranks | step ms | system ms | faults | faults priced ms | explained |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in priced:
        expl = "-" if p["explained"] is None else f"{p['explained']:.0%}"
        lines.append(f"| {p['model']} | {p['batch']} | {p['ranks']} | {p['wall_s'] * 1e3:.2f} | "
                     f"{p['system_s'] * 1e3:.2f} | {p['faults']:.0f} | {p['faults_priced_s'] * 1e3:.2f} | {expl} |")
    lines.append("")
    atomic_write_text(out.with_suffix(".md"), "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
