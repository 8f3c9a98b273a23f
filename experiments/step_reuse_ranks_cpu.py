"""Does the embedding step-reuse factor change when K processes share the last-level cache? (CPU, diagnosis.)

The calibration's step-reuse probe (:mod:`predictor.timing.calibration.step_reuse`) runs in one process, and the
simulator applies its factor at the working set of every rank sharing the LLC (one cache domain per CPU
host). On the AVX2 VM the e2e 2-rank DLRM rows read 7-10 % under the simulation and the 1-rank rows 7-17 %
over: one explanation would be that two ranks running their tables at once evict each other's rows, so a
table's backward finds fewer of its forward's rows still cached than one process alone does. This runs the
same probe in K processes started together (a barrier), each at 1/K of the working set, so the K processes
together span the same total working set (1/8 to 2x the LLC) as one process does alone; each process's
``step / cold`` ratio is relative to its own cold timings taken while the other processes run (the host
contention factor prices cold-under-contention apart). K = 1 and K = 2 alternate ``--reps`` times.

    flock /tmp/tuner-measure.lock python experiments/step_reuse_ranks_cpu.py \\
        --out experiments/results/avx2/step_reuse_ranks_cpu

writes that ``.md`` and a ``.json`` beside it (about 75 s with the defaults). Sizes in bytes, times in
seconds; nothing waits for a quiet machine: run it alone.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import fail, host_check, host_line, repo_relative, write_results  # noqa: E402

#: total working sets over the LLC the K processes span together
FRACTIONS = (0.125, 0.25, 0.5, 1.0, 2.0)


def _worker(k: int, world: int, llc_bytes: float, rounds: int, seed: int, barrier, queue) -> None:
    """One of ``world`` processes: the probe at 1/world of each working set, started with the others."""
    import torch

    from predictor.timing.calibration.step_reuse import probe_step_reuse

    torch.set_num_threads(1)
    barrier.wait()
    rows = probe_step_reuse(llc_bytes / world, rounds, fractions=FRACTIONS, seed=seed + 100 * k)
    queue.put((k, rows))


def run_world(world: int, llc_bytes: float, rounds: int, seed: int) -> list[dict]:
    """The probe in ``world`` processes at once; each row tagged with its ``world`` and ``process``, its
    working set given as the processes' total (``ws_bytes`` x ``world``) over the whole LLC."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(world), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(k, world, llc_bytes, rounds, seed, barrier, queue))
             for k in range(world)]
    for p in procs:
        p.start()
    got = [queue.get() for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            fail(f"a probe process exited with code {p.exitcode}")
    rows = []
    for k, rr in got:
        for r in rr:
            rows.append({**r, "world": world, "process": k, "ws_bytes": r["ws_bytes"] * world,
                         "llc_bytes": float(llc_bytes)})
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per (world, fraction): the total working set over the LLC, the median over rounds and processes
    of the forward and backward step / cold sums, and the backward factor per pooling
    (:func:`predictor.timing.calibration.step_reuse.reuse_surface` over that world's rows)."""
    from predictor.timing.calibration.step_reuse import reuse_surface

    out = []
    for world in sorted({r["world"] for r in rows}):
        mine = [r for r in rows if r["world"] == world]
        surface = reuse_surface(mine)
        for fraction in sorted({r["fraction"] for r in mine}):
            at = [r for r in mine if r["fraction"] == fraction]
            x = float(np.median([r["ws_bytes"] / r["llc_bytes"] for r in at]))
            out.append({"world": world, "fraction": fraction, "ws_over_llc": x, "samples": len(at),
                        "fwd": float(np.median([r["fwd_step_s"] / r["fwd_cold_s"] for r in at])),
                        "bwd": float(np.median([r["bwd_step_s"] / r["bwd_cold_s"] for r in at])),
                        "bwd_by_pooling": {f"{p[1]:g}": p[3] for p in surface if abs(p[0] - x) < 1e-9}})
    return out


def markdown(summary: list[dict], meta: dict) -> str:
    poolings = sorted({float(p) for s in summary for p in s["bwd_by_pooling"]})
    lines = [
        "# Embedding step reuse with K processes sharing the LLC (CPU)", "",
        f"{meta['date']}; {meta['host']} Reproduce: `{meta['command']}`", "",
        "The calibration's step-reuse probe (`predictor/timing/calibration/step_reuse.py`: eight tables of pooling 1-64, "
        "cold vs in a step's order) in K processes started together, each at 1/K of the working set (the K "
        "together span the working set in the first column); each process's ratio is against its own cold "
        "timings taken while the others run. Median over rounds and processes; `samples` = rounds x "
        f"processes x {meta['reps']} repetitions (K = 1 and K = 2 alternated).", "",
        "| K | working set / LLC | samples | fwd step / cold | bwd step / cold | "
        + " | ".join(f"bwd L={p:g}" for p in poolings) + " |",
        "|---:|---:|---:|---:|---:|" + "---:|" * len(poolings),
    ]
    for s in summary:
        per = [s["bwd_by_pooling"].get(f"{p:g}") for p in poolings]
        lines.append(f"| {s['world']} | {s['ws_over_llc']:.3f} | {s['samples']} | {s['fwd']:.2f} | {s['bwd']:.2f} | "
                     + " | ".join("" if v is None else f"{v:.2f}" for v in per) + " |")
    by = {(s["world"], s["fraction"]): s for s in summary}
    diffs = [by[(2, f)]["bwd"] - by[(1, f)]["bwd"] for (w, f) in by if w == 2 and (1, f) in by]
    if diffs:
        lines += ["", f"Backward step / cold, K = 2 minus K = 1 at the same total working set: "
                  f"{', '.join(f'{d:+.2f}' for d in diffs)} (median {np.median(diffs):+.2f})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="probe rounds per process and repetition")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of K = 1 then K = 2")
    ap.add_argument("--llc-mib", type=float, default=None, help="last-level cache (default: this host's, measured)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments/results/step_reuse_ranks_cpu")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.reps < 1:
        fail("--rounds and --reps must be at least 1")
    if args.out.suffix in (".md", ".json"):
        fail(f"--out {args.out}: give the results' stem (OUT.md and OUT.json are written)")
    if args.llc_mib is not None and args.llc_mib <= 0:
        fail("--llc-mib must be > 0")
    if args.llc_mib is None:
        from predictor.timing.platforms.cpu_local import measure_cpu_local

        llc = float(measure_cpu_local().last_level_cache_bytes)
    else:
        llc = args.llc_mib * 2**20
    rows: list[dict] = []
    for rep in range(args.reps):
        for world in (1, 2):
            got = run_world(world, llc, args.rounds, args.seed + 1000 * rep)
            rows += [{**r, "rep": rep} for r in got]
            print(f"rep {rep + 1}/{args.reps}: K = {world} done", flush=True)
    summary = summarise(rows)
    cmd = "python experiments/step_reuse_ranks_cpu.py" + (f" --rounds {args.rounds}" if args.rounds != 4 else "") \
        + (f" --reps {args.reps}" if args.reps != 2 else "") + f" --out {repo_relative(args.out)}"
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "host": host_line(host_check(None)),
            "command": f"flock /tmp/tuner-measure.lock {cmd}", "reps": args.reps, "rounds": args.rounds,
            "llc_bytes": llc}
    write_results(args.out, {"meta": meta, "summary": summary, "rows": rows}, markdown(summary, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
