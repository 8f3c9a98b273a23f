"""How much the C allocator alone moves a CPU training step: fresh processes of one program.

A training step on a CPU allocates its activations and gradients with glibc's malloc. Depending
on the sizes and order of everything the process allocated before, glibc returns freed memory
to the OS (heap trimming, unmapping blocks above its mmap threshold) and the next step faults it
in again, page by page. This runs each e2e program (``experiments/e2e_cpu.py``'s MLP and GPT
steps) in ``--processes`` fresh processes per allocator mode and records, per process, the
minor page faults and the wall time of every step after the warm-up:

* ``default``: glibc as it comes;
* ``no_trim``: glibc never returns freed memory (:func:`predictor.timing.platforms.host.allocator_env`).

The spread between processes under ``default`` is what a prediction of the step cannot know (it
depends on the process's history, not on the model); under ``no_trim`` the faults are gone.
A replay of a step's traced allocations through the real allocator (tried in session 13) gave
one of these trajectories, not their spread, so it was not kept as a predictor.

Run:  flock /tmp/tuner-measure.lock python experiments/allocator_spread_cpu.py
      (writes benchmarks/results/allocator_spread_cpu.{md,json}; about 4 minutes)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.common import fail  # noqa: E402
from experiments.insitu_cpu import CONFIGS  # noqa: E402  (the same e2e rows)
from predictor.timing.platforms.host import ALLOCATORS, with_allocator  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
#: seconds of one 4 KiB fault on this VM (benchmarks/results/page_faults_cpu.md, wall time)
FAULT_S_NOTE = "1.5 us"


def child(model: str, batch: int, warmup: int, steps: int) -> dict:
    """One process: ``warmup`` + ``steps`` training steps; per timed step its faults and seconds."""
    import torch

    from experiments.e2e_cpu import GPT, MLP, gpt_step, mlp_step
    from predictor.sources.synth.mlp import MLPSpec

    torch.set_num_threads(1)
    if model == "mlp":
        step = mlp_step(MLPSpec(**{**dataclasses.asdict(MLP), "batch_size": batch}))
    else:
        step = gpt_step(GPT, batch)
    for _ in range(warmup):
        step()
    faults, wall = [], []
    for _ in range(steps):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        step()
        wall.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
    return {"faults": faults, "wall_s": wall}


def run_process(model: str, batch: int, allocator: str, warmup: int, steps: int) -> dict:
    env = with_allocator(dict(os.environ), allocator)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", model, str(batch),
                          str(warmup), str(steps)], capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        fail(f"{model} batch {batch} ({allocator}): the measuring process failed: {tail}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def summarise(procs: list[dict]) -> dict:
    mean_faults = [float(np.mean(p["faults"])) for p in procs]
    med_ms = [1e3 * float(np.median(p["wall_s"])) for p in procs]
    zero = [float(np.mean(np.asarray(p["faults"]) < 50)) for p in procs]
    return {"mean_faults": mean_faults, "median_step_ms": med_ms, "share_steps_without_faults": zero,
            "step_spread_pct": 100.0 * (max(med_ms) / min(med_ms) - 1.0)}


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# The C allocator's share of a CPU training step: fresh processes of one program",
        "",
        f"{meta['date']}, {meta['machine']}, torch {meta['torch']}, 1 torch thread. Each row: "
        f"{meta['processes']} fresh processes of `experiments/e2e_cpu.py`'s training step per allocator mode, "
        f"{meta['warmup']} warm-up steps, then {meta['steps']} timed steps; per process the mean minor page faults "
        "per step and the median step. `default` = glibc as it comes; `no_trim` = glibc never hands freed memory "
        "back to the OS (`MALLOC_TRIM_THRESHOLD_` / `MALLOC_MMAP_THRESHOLD_`, "
        "`predictor.timing.platforms.host.allocator_env`). A fault costs about " + FAULT_S_NOTE + " of wall time here "
        "(`benchmarks/results/page_faults_cpu.md`).",
        f"Reproduce: `flock /tmp/tuner-measure.lock {meta['command']}` ({meta['wall_s']:.0f} s).",
        "",
        "| model | batch | allocator | faults / step, per process | steps without faults | median step ms, "
        "per process | spread between processes |",
        "|---|---:|---|---|---|---|---:|",
    ]
    for r in rows:
        for a in ALLOCATORS:
            s = r[a]
            lines.append(
                f"| {r['model']} | {r['batch']} | {a} | {', '.join(f'{x:.0f}' for x in s['mean_faults'])} | "
                f"{', '.join(f'{100 * x:.0f}%' for x in s['share_steps_without_faults'])} | "
                f"{', '.join(f'{x:.2f}' for x in s['median_step_ms'])} | {s['step_spread_pct']:.1f}% |")
    lines += [
        "",
        "Under `default` the same program pays a different number of faults in every process (and from step to "
        "step: most processes alternate between steps with none and steps with thousands), because whether glibc "
        "trims depends on where earlier allocations left its heap. A prediction from the model alone cannot know "
        "this history; `experiments/e2e_cpu.py --allocator no_trim` measures the programs without it.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        model, batch, warmup, steps = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
        print(json.dumps(child(model, batch, warmup, steps)))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=RESULTS / "allocator_spread_cpu")
    args = ap.parse_args(argv)
    if args.processes < 2 or args.steps < 5 or args.warmup < 0:
        fail("--processes must be >= 2, --steps >= 5, --warmup >= 0")
    if not sys.platform.startswith("linux"):
        fail(f"needs Linux with glibc (this is {sys.platform})")
    import torch

    t0 = time.perf_counter()
    rows = []
    for model, batch in CONFIGS:
        row = {"model": model, "batch": batch}
        for a in ALLOCATORS:
            procs = [run_process(model, batch, a, args.warmup, args.steps) for _ in range(args.processes)]
            row[a] = {**summarise(procs), "processes": procs}
            s = row[a]
            print(f"{model} b{batch} {a:>8}: faults/step {[round(x) for x in s['mean_faults']]}, "
                  f"median step ms {[round(x, 2) for x in s['median_step_ms']]}", flush=True)
        rows.append(row)
    import platform as pyplatform

    from tuner.report import atomic_write_text

    meta = {"date": dt.date.today().isoformat(), "machine": f"{os.cpu_count()}-core {pyplatform.machine()} VM",
            "torch": torch.__version__, "processes": args.processes, "warmup": args.warmup, "steps": args.steps,
            "wall_s": time.perf_counter() - t0,
            "command": "python experiments/allocator_spread_cpu.py " + " ".join(argv)}
    text = markdown(rows, meta)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps({"meta": meta, "rows": rows}, indent=1))
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
