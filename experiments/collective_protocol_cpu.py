"""How a gloo collective's time depends on how it is timed: the calibration's batched calls vs single calls
as a training step makes them (CPU, 2 local ranks).

Diagnosis for issue 4's 2-rank DLRM rows: inside the step (``experiments/dlrm_phases_cpu.py``, section
"Collectives in situ vs calibrated") the all-to-alls and DDP's all-reduces take longer, from the last rank's
arrival, than the calibrated piecewise model says. The calibration (:mod:`predictor.timing.calibration.collectives`)
times a batch of back-to-back calls after a barrier and keeps the slowest rank's mean per call. Here, at the
message sizes of the e2e DLRM step, each rank times the same collective under three protocols, interleaved
round by round so a slow spell of the VM hits them alike:

* ``batched``: the calibration's own timing (``_time_collective``: back-to-back calls, slowest rank's mean);
* ``single``: one call right after a barrier, from the last rank's arrival to the last rank's return;
* ``after_work``: one call after each rank ran ~``work_ms`` of GEMMs and wrote a buffer twice the LLC (as a
  step's compute leaves the host: gloo's threads asleep, caches full of other data), from the last rank's
  arrival (the ranks' clocks are one host clock) to the last return.

    flock /tmp/tuner-measure.lock python experiments/collective_protocol_cpu.py

writes ``experiments/results/collective_protocol_cpu.md`` and ``.json`` (about 1 minute).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import run_gloo_ranks, span_after_last_arrival  # noqa: E402
from predictor.timing.calibration.collectives import _time_collective  # noqa: E402

PROTOCOLS = ("batched", "single", "after_work")


def step_collectives(batch: int) -> dict[str, tuple[str, float]]:
    """Task name -> (kind, bytes per rank) of every collective of the e2e DLRM step on 2 ranks at ``batch``
    (rank 0's, in graph order): the all-to-alls (max-of-max message) and DDP's bucket all-reduces."""
    from experiments.e2e_cpu import dlrm_job, dlrm_spec_for, dlrm_tables
    from predictor.sources.synth.dlrm import build_dlrm_graph

    tables = dlrm_tables(batch)
    job = dlrm_job(tables, batch, 2, 1, 3, 5)
    g = build_dlrm_graph(dlrm_spec_for(job, tables), np.asarray(job.assignment), 2, mode="host", comm_threads=False)
    f = g.tasks_frame()
    f = f[(f["rank"] == 0) & f["kind"].isin(["all_to_all", "all_reduce"])]
    return {str(name): (str(kind), float(msg)) for name, kind, msg in zip(f["name"], f["kind"], f["msg_bytes"],
                                                                         strict=True)}


def step_sizes(batches: list[int]) -> list[tuple[str, float]]:
    """(kind, bytes per rank) of the e2e DLRM step's collectives on 2 ranks at each batch
    (:func:`step_collectives`; distinct sizes only)."""
    return list(dict.fromkeys(c for bs in batches for c in step_collectives(bs).values()))


def _call(dist, kind: str, nbytes: float):
    elems = max(1, int(nbytes) // 4)
    x = torch.ones(elems)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(x)
    world = dist.get_world_size()
    per = max(1, elems // world)
    src, dst = torch.ones(per * world), torch.empty(per * world)
    return lambda: dist.all_to_all_single(dst, src)


def _probe(dist, rank: int, cfg: dict) -> list[dict]:
    """One rank's side of the probe (:func:`experiments.common.run_gloo_ranks`); rank 0's rows are kept."""
    a, b = torch.rand(256, 256), torch.rand(256, 256)
    flush = torch.empty(int(2 * cfg["llc_bytes"]) // 4)
    rows = []
    calls = [(kind, nbytes, _call(dist, kind, nbytes)) for kind, nbytes in cfg["sizes"]]
    for fn in (c[2] for c in calls):
        fn()
    for rnd in range(cfg["rounds"]):
        for kind, nbytes, fn in calls:
            for proto in PROTOCOLS:
                if proto == "batched":
                    t = float(np.median(_time_collective(dist, fn, torch.device("cpu"), 1, 5, dist.get_world_size())))
                    rows.append({"round": rnd, "kind": kind, "bytes": nbytes, "protocol": proto, "seconds": t})
                    continue
                dist.barrier()
                if proto == "after_work":
                    end = time.perf_counter() + cfg["work_ms"] / 1e3
                    while time.perf_counter() < end:
                        torch.mm(a, b)
                    flush.fill_(1.0)
                t0 = time.perf_counter()
                fn()
                t1 = time.perf_counter()
                rows.append({"round": rnd, "kind": kind, "bytes": nbytes, "protocol": proto,
                             "seconds": span_after_last_arrival(dist, t0, t1)})
    return rows


def run(batches: list[int], rounds: int, work_ms: float, llc_bytes: float) -> pd.DataFrame:
    """One row per (round, kind, bytes, protocol): seconds of one call."""
    cfg = {"sizes": step_sizes(batches), "rounds": rounds, "work_ms": work_ms, "llc_bytes": llc_bytes}
    return pd.DataFrame(run_gloo_ranks(_probe, cfg))


def markdown(df: pd.DataFrame, command: str, work_ms: float) -> str:
    piv = df.groupby(["kind", "bytes", "protocol"])["seconds"].median().unstack("protocol") * 1e3
    lines = ["# gloo collectives: batched calls vs single calls (CPU, 2 ranks)", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, this 2-core VM. Reproduce: `{command}`", "",
             "Message sizes: the e2e DLRM step's all-to-all and DDP bucket all-reduces (batches 256, 1024, 4096). "
             "`batched`: the calibration's timing (back-to-back calls after a barrier, slowest rank's mean per "
             "call, median of 5 samples); `single`: one call after a barrier, last arrival to last return; "
             f"`after_work`: one call after {work_ms:g} ms of GEMMs and a write of twice the LLC on each rank, "
             "last arrival to last return. Median over the rounds (protocols interleaved per size and round), ms.",
             "", "| kind | bytes | batched ms | single ms | after_work ms | single / batched | after_work / batched |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for (kind, nbytes), x in piv.iterrows():
        lines.append(f"| {kind} | {nbytes:,.0f} | {x['batched']:.3f} | {x['single']:.3f} | {x['after_work']:.3f} | "
                     f"{x['single'] / x['batched']:.2f} | {x['after_work'] / x['batched']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--work-ms", type=float, default=5.0, help="GEMM work before each after_work call, ms")
    ap.add_argument("--llc-bytes", type=float, default=32 * 2**20)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "collective_protocol_cpu.md"))
    a = ap.parse_args()
    if a.rounds < 1 or a.work_ms < 0 or a.llc_bytes <= 0 or min(a.batches) < 2:
        ap.error("--rounds must be >= 1, --work-ms >= 0, --llc-bytes > 0 and every batch >= 2 (2 ranks)")
    df = run(a.batches, a.rounds, a.work_ms, a.llc_bytes)
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(df.to_dict(orient="records"), indent=1))
    cmd = "flock /tmp/tuner-measure.lock python experiments/collective_protocol_cpu.py"
    out.write_text(markdown(df, cmd, a.work_ms))
    print(out.read_text())


if __name__ == "__main__":
    main()
