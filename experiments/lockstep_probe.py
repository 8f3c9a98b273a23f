"""How long a blocking gloo collective takes inside a training-like step on this host.

Diagnosis for the DLRM 2-rank end-to-end rows (issue 4): the collective microbenchmarks time
each call back to back after a barrier, with every other thread idle. Inside a step the ranks
first compute (a GEMM loop of ``work_ms``), then call the collective; DDP may have an
asynchronous all-reduce in flight. This script times, per rank and step:

* ``alone``: the collective after a barrier, nothing else running (what calibration measures);
* ``lockstep``: ``work_ms`` of GEMMs, then the collective — the collective's time counted from
  the *later* rank's arrival (each rank records its arrival and return; the excess over
  ``alone`` is what a simulator that already waits for the slower rank would miss);
* ``lockstep+ddp``: as above with an asynchronous all-reduce of ``ddp_bytes`` started before the
  GEMMs (DDP's gradient buckets in flight during the backward); the GEMM loop's own time, against
  ``lockstep``'s, says how much the gloo threads' work slows the compute sharing the cores.

Run: ``python experiments/lockstep_probe.py [--bytes 4718592] [--work-ms 20] [--steps 30]``
(writes ``experiments/results/lockstep_probe.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.files import atomic_write_text  # noqa: E402
from predictor.timing.calibration.collectives import free_port  # noqa: E402

WORLD = 2


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, tmp: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    n = int(args.bytes) // 4
    send, recv = torch.rand(n), torch.empty(n)
    grad = torch.rand(max(1, int(args.ddp_bytes) // 4))
    a, b = torch.rand(256, 256), torch.rand(256, 256)
    t0 = time.perf_counter()
    reps = 0
    while time.perf_counter() - t0 < 0.2:
        torch.mm(a, b)
        reps += 1
    per_mm = 0.2 / reps
    n_mm = max(1, int(args.work_ms * 1e-3 / per_mm * (1.0 + 0.1 * rank)))  # ranks a little unbalanced
    rows: dict[str, list[list[float]]] = {"alone": [], "lockstep": [], "lockstep+ddp": []}
    for step in range(args.steps + 3):
        for mode in rows:
            dist.barrier()
            work = None
            if mode == "lockstep+ddp":
                work = dist.all_reduce(grad, async_op=True)
            start = time.time()
            if mode != "alone":
                for _ in range(n_mm):
                    torch.mm(a, b)
            arrive = time.time()
            dist.all_to_all_single(recv, send)
            back = time.time()
            if work is not None:
                work.wait()
            if step >= 3:
                rows[mode].append([arrive, back, arrive - start])
    Path(tmp, f"r{rank}.json").write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=float, default=4718592, help="all-to-all message, bytes (DLRM b1024: 4718592)")
    ap.add_argument("--ddp-bytes", type=float, default=2295812, help="async all-reduce in flight, bytes")
    ap.add_argument("--work-ms", type=float, default=20.0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "lockstep_probe.json")
    args = ap.parse_args(argv)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(WORLD, free_port(), args, tmp), nprocs=WORLD, join=True,
                           start_method="fork")
        ranks = [json.loads(Path(tmp, f"r{r}.json").read_text()) for r in range(WORLD)]
    summary = {}
    for mode in ranks[0]:
        t = np.array([r[mode] for r in ranks])  # (rank, step, [arrive, back])
        last_arrival = t[:, :, 0].max(axis=0)
        from_last = (t[:, :, 1] - last_arrival[None, :]).max(axis=0)  # the slower rank's return
        work_ms = np.median(t[:, :, 2], axis=1) * 1e3  # per rank: the GEMM loop before the collective
        summary[mode] = {"median_ms": float(np.median(from_last) * 1e3),
                         "p90_ms": float(np.percentile(from_last, 90) * 1e3),
                         "max_ms": float(from_last.max() * 1e3),
                         "work_ms_per_rank": [float(w) for w in work_ms]}
        print(f"{mode:14s} collective from the later arrival: median {summary[mode]['median_ms']:.2f} ms, "
              f"p90 {summary[mode]['p90_ms']:.2f}, max {summary[mode]['max_ms']:.2f}; GEMM loop before it "
              f"{' / '.join(f'{w:.2f}' for w in work_ms)} ms")
    atomic_write_text(args.out, json.dumps({"bytes": args.bytes, "ddp_bytes": args.ddp_bytes, "work_ms": args.work_ms,
                                    "steps": args.steps, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
