"""Does the process a DLRM job is forked from change its step time? (CPU, 1 rank, diagnosis.)

The e2e windows (``experiments/e2e_cpu.py``) read the 1-rank DLRM rows 11-18 % under the simulation,
while ``experiments/dlrm_phases_cpu.py`` run beside them read the same job within -2…+5 % of it. The two
programs run the same job (:func:`experiments.e2e_cpu.dlrm_job`, ``measure_dlrm`` forking the rank) but
from different parents: the e2e parent has run the MLP and GPT training steps in-process before (its
C allocator's state and mmap threshold are inherited by the fork), the phases program has not, and it
records wall-clock marks at phase boundaries (``DLRMJobSpec.phases``). This measures the job, each
configuration in its own fresh parent process, interleaved round by round:

* ``fresh``: the parent only builds the job and forks;
* ``after_mlp_gpt``: the parent first runs the e2e MLP and GPT steps (5 warm-up + 20 iterations at each
  of their batches), as an e2e window's parent has before its DLRM rows;
* ``phase_marks``: a fresh parent, the job with ``phases=True`` (as ``dlrm_phases_cpu.py`` runs it).

Per configuration and batch: the median iteration and, per timed iteration, the rank's user and system
CPU time and minor page faults (``getrusage``), beside the simulated iteration of the pack.

    flock /tmp/tuner-measure.lock python experiments/dlrm_process_context_cpu.py --platform cpu-local-avx2 \
        --out experiments/results/avx2/dlrm_process_context_cpu.md

writes that ``.md`` and a ``.json`` beside it (about 5 minutes; default ``--out``
``experiments/results/dlrm_process_context_cpu.md``). Nothing waits for a quiet machine here: run it alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import fail, repo_relative, write_results  # noqa: E402

MODES = ("fresh", "after_mlp_gpt", "phase_marks")
#: the e2e DLRM rows' batches
BATCHES = (256, 1024, 4096)


def child(mode: str, batches: list[int], batch_pool: int) -> list[dict]:
    """One parent process's measurements (run as ``--child MODE``): the 1-rank job at each batch."""
    import torch

    from experiments.dlrm_gloo import measure_dlrm
    from experiments.e2e_cpu import (
        GPT,
        GPT_BATCHES,
        MLP,
        MLP_BATCHES,
        dlrm_job,
        dlrm_tables,
        gpt_step,
        mlp_step,
        time_steps,
    )

    torch.set_num_threads(1)
    if mode == "after_mlp_gpt":
        for bs in MLP_BATCHES:
            time_steps(mlp_step(replace(MLP, batch_size=bs)), 5, 20)
        for bs in GPT_BATCHES:
            time_steps(gpt_step(GPT, bs), 5, 20)
    rows = []
    for bs in batches:
        job = replace(dlrm_job(dlrm_tables(bs), bs, 1, 1, 3, 20, batch_pool), phases=mode == "phase_marks")
        m = measure_dlrm(job)
        s = m["system"][0]
        rows.append({"mode": mode, "batch": bs, "median_ms": m["iteration_s"] * 1e3, "user_ms": s["user_s"] * 1e3,
                     "system_ms": s["system_s"] * 1e3, "minor_faults": s["minor_faults"]})
    return rows


def simulated_ms(platform: str, batches: list[int], batch_pool: int) -> dict[int, float]:
    """The pack's simulated 1-rank iteration (ms) of the e2e DLRM row at each batch: the e2e rows' own
    prediction (:func:`experiments.e2e_cpu.build_cases`)."""
    import tempfile
    import types

    from experiments.e2e_cpu import build_cases
    from experiments.e2e_windows import resolve_spec

    with tempfile.TemporaryDirectory() as work:
        timing = resolve_spec(platform, Path(work))[0]
    args = types.SimpleNamespace(models=["dlrm"], dlrm_batches=list(batches), dlrm_ranks=[1], dlrm_warmup=3,
                                 iters=20, batch_pool=batch_pool)
    return {c.batch: c.predicted[0] * 1e3 for c in build_cases(args, timing, 1)}


def markdown(df: pd.DataFrame, sim: dict[int, float], meta: dict) -> str:
    """Per batch and configuration: median over rounds of the median iteration (range), CPU accounting."""
    lines = ["# 1-rank DLRM: does the parent process change the step? (CPU)", "",
             f"{meta['date']}, pack `{meta['platform']}`, {meta['rounds']} rounds, each configuration in its own fresh "
             f"parent per round, interleaved; DLRM cycling {meta['batch_pool']} index batches, 1 torch thread. "
             f"Reproduce: `{meta['command']}`", "",
             "`fresh`: the parent only forks the job; `after_mlp_gpt`: the parent ran the e2e MLP and GPT steps "
             "first (as an e2e window's parent); `phase_marks`: the job with `DLRMJobSpec.phases` (as "
             "`dlrm_phases_cpu.py`). ms = median over rounds of the job's median iteration [min-max over rounds]; "
             "user / system ms and page faults per timed iteration (getrusage of the rank), medians over rounds.",
             "", "| batch | configuration | iteration ms | vs fresh | user ms | system ms | page faults | simulated ms |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for bs, part in df.groupby("batch"):
        base = part[part["mode"] == "fresh"]["median_ms"].median()
        for mode in MODES:
            p = part[part["mode"] == mode]
            if p.empty:
                continue
            med = p["median_ms"].median()
            lines.append(f"| {bs} | {mode} | {med:.1f} [{p['median_ms'].min():.1f}-{p['median_ms'].max():.1f}] | "
                         f"{(med / base - 1) * 100:+.1f}% | {p['user_ms'].median():.1f} | {p['system_ms'].median():.1f} | "
                         f"{p['minor_faults'].median():.0f} | {sim[int(bs)]:.1f} |")
    lines += ["", "Per round (ms, in the order measured):", "", "| round | batch | " + " | ".join(MODES) + " |",
              "|---:|---:|" + "---:|" * len(MODES)]
    for (r, bs), part in df.groupby(["round", "batch"]):
        cells = [f"{part[part['mode'] == m]['median_ms'].iloc[0]:.1f}" if (part["mode"] == m).any() else "" for m in MODES]
        lines.append(f"| {r} | {bs} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", default="cpu-local", help="pack spec for the simulated column (as e2e_windows.py)")
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-pool", type=int, default=8, help="index batches the job cycles (8: fresh rows)")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "dlrm_process_context_cpu.md")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.batches, a.batch_pool)))
        return
    if a.rounds < 1 or a.batch_pool < 1:
        fail("--rounds and --batch-pool must be at least 1")
    sim = simulated_ms(a.platform, a.batches, a.batch_pool)
    rows = []
    for r in range(a.rounds):
        for mode in MODES:
            cmd = [sys.executable, __file__, "--child", mode, "--batch-pool", str(a.batch_pool),
                   "--batches", *map(str, a.batches)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                fail(f"--child {mode} failed (exit {done.returncode}): {last}")
            got = json.loads(done.stdout.strip().splitlines()[-1])
            for g in got:
                print(f"round {r + 1} {mode:<14} batch {g['batch']:>5}: {g['median_ms']:8.1f} ms "
                      f"(user {g['user_ms']:.1f}, system {g['system_ms']:.1f}, faults {g['minor_faults']:.0f})", flush=True)
            rows += [{"round": r + 1, **g} for g in got]
    df = pd.DataFrame(rows)
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "platform": a.platform,
            "rounds": a.rounds, "batch_pool": a.batch_pool,
            "command": "flock /tmp/tuner-measure.lock python experiments/dlrm_process_context_cpu.py "
                       + " ".join(x for x in (sys.argv[1:] if argv is None else argv))}
    write_results(a.out, {"meta": meta, "simulated_ms": {str(k): v for k, v in sim.items()},
                          "rows": df.to_dict(orient="records")}, markdown(df, sim, meta))
    print(f"see {repo_relative(a.out)}")


if __name__ == "__main__":
    main()
