"""Collective microbenchmarks over ``K`` local processes: gloo on CPU, NCCL on GPUs.

``world_size`` processes are spawned on 127.0.0.1 (``torch.multiprocessing`` spawn, a free
TCP port, no torchrun). Every rank sweeps per-rank message sizes from 4 bytes, doubling, up
to the level's cap (Lin et al. 2024 §III-C: "starting from 4 bytes on each device and
doubling it"), for all-reduce, all-to-all, all-gather and reduce-scatter. The message size
``msg_bytes`` of a row is the largest buffer a rank sends or receives — for all-to-all with
uneven splits "the maximum of (the maximum of sent/received message size per device) across
all devices" of the paper — so:

* all-reduce: the tensor;
* all-gather: the gathered output (``K x`` the input);
* reduce-scatter: the input (``K x`` the output);
* all-to-all: with equal splits the per-rank buffer; the uneven-split points (random split
  matrix shared by all ranks) use the max-of-max rule.

A sample is one call, started right after a barrier; its time is the slowest rank's (the
collective ends together on all ranks). Rank 0 writes the table to a file the parent reads.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from predictor.calibration.base import BenchContext, Benchmark, ModelSpec

__all__ = ["CollectivesBenchmark", "COLLECTIVE_KINDS", "CollectiveError"]

COLLECTIVE_KINDS = ("all_reduce", "all_to_all", "all_gather", "reduce_scatter")


class CollectiveError(RuntimeError):
    """The collective benchmark processes failed (one-line message)."""


class CollectivesBenchmark(Benchmark):
    """all-reduce / all-to-all / all-gather / reduce-scatter on ``world_size`` local ranks."""

    name = "collectives"

    def __init__(self, world_size: int) -> None:
        self.world_size = int(world_size)

    def specs(self, ctx: BenchContext) -> list[ModelSpec]:
        return [ModelSpec(kernel=f"{k}/w{self.world_size}", kinds=(k,), method="piecewise") for k in COLLECTIVE_KINDS]

    def max_bytes(self, ctx: BenchContext) -> int:
        if ctx.is_cuda:
            return {"tiny": 2**20, "quick": 2**28, "full": 2**31}[ctx.level]
        return {"tiny": 2**14, "quick": 2**24, "full": 2**28}[ctx.level]

    def run(self, ctx: BenchContext) -> pd.DataFrame:
        if self.world_size < 2:
            return pd.DataFrame()
        backend = "nccl" if ctx.is_cuda else "gloo"
        if ctx.is_cuda and torch.cuda.device_count() < self.world_size:
            raise CollectiveError(
                f"--world-size {self.world_size} needs {self.world_size} GPUs, this machine has "
                f"{torch.cuda.device_count()}; NCCL collectives need one GPU per rank"
            )
        repeats = {"tiny": 3, "quick": 9, "full": 20}[ctx.level]
        cfg = {
            "backend": backend,
            "max_bytes": self.max_bytes(ctx),
            "repeats": repeats,
            "warmup": 2,
            "seed": int(ctx.rng.integers(2**31)),
            "threads": torch.get_num_threads(),
            "budget_s": ctx.budget_s,
        }
        with tempfile.TemporaryDirectory(prefix="tuner-coll-") as tmp:
            out = Path(tmp) / "rank0.json"
            port = _free_port()
            ctx_mp = torch.multiprocessing.get_context("spawn")
            procs = [ctx_mp.Process(target=_worker, args=(r, self.world_size, port, cfg, str(out)), daemon=True)
                     for r in range(self.world_size)]
            for p in procs:
                p.start()
            deadline = time.monotonic() + max(120.0, 4 * ctx.budget_s)
            for p in procs:
                p.join(timeout=max(1.0, deadline - time.monotonic()))
            alive = [p for p in procs if p.is_alive()]
            for p in alive:
                p.kill()
            codes = [p.exitcode for p in procs]
            if alive or any(c != 0 for c in codes) or not out.exists():
                why = "timed out" if alive else f"exit codes {codes}"
                raise CollectiveError(f"{backend} collective benchmark over {self.world_size} ranks failed ({why})")
            rows = json.loads(out.read_text())
        df = pd.DataFrame(rows)
        df["kernel"] = df["kind"] + f"/w{self.world_size}"
        return df


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, cfg: dict, out: str) -> None:
    """One rank: init the process group, sweep every collective, rank 0 writes the rows."""
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(max(1, int(cfg["threads"]) // world))
    backend = cfg["backend"]
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        rows = _sweep(dist, rank, world, device, cfg)
        if rank == 0:
            tmp = out + ".tmp"
            Path(tmp).write_text(json.dumps(rows))
            os.replace(tmp, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _sweep(dist, rank: int, world: int, device: torch.device, cfg: dict) -> list[dict]:
    rng = np.random.default_rng(cfg["seed"])  # same seed on every rank: same split matrices
    sizes = [4 * 2**i for i in range(int(np.log2(cfg["max_bytes"] // 4)) + 1)]
    rows: list[dict] = []
    start = time.perf_counter()
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    for kind in ("all_reduce", "all_to_all", "all_gather", "reduce_scatter"):
        for size in sizes:
            elems = max(1, size // 4)
            if kind == "all_reduce":
                x = torch.ones(elems, device=device)
                ops = [(lambda x=x: dist.all_reduce(x), float(4 * elems), False)]
            elif kind == "all_gather":
                x = torch.ones(elems, device=device)
                y = torch.empty(elems * world, device=device)
                ops = [(lambda x=x, y=y: gather(y, x), float(4 * elems * world), False)]
            elif kind == "reduce_scatter":
                per = max(1, elems // world)
                x = torch.ones(per * world, device=device)
                y = torch.empty(per, device=device)
                ops = [(lambda x=x, y=y: scatter(y, x), float(4 * per * world), False)]
            else:
                per = max(1, elems // world)
                x = torch.ones(per * world, device=device)
                y = torch.empty(per * world, device=device)
                ops = [(lambda x=x, y=y: dist.all_to_all_single(y, x), float(4 * per * world), False)]
                # uneven splits: S[i, j] elements rank i sends to rank j (same matrix on every rank)
                s = np.maximum(1, np.round(per * rng.uniform(0.25, 1.75, size=(world, world)))).astype(int)
                sent, recv = s.sum(axis=1), s.sum(axis=0)
                xin = torch.ones(int(sent[rank]), device=device)
                xout = torch.empty(int(recv[rank]), device=device)
                max_of_max = float(4 * max(sent.max(), recv.max()))
                ops.append((lambda xin=xin, xout=xout, s=s: dist.all_to_all_single(
                    xout, xin, output_split_sizes=s[:, rank].tolist(), input_split_sizes=s[rank].tolist()),
                    max_of_max, True))
            for fn, msg, uneven in ops:
                t = _time_collective(dist, fn, device, cfg["warmup"], cfg["repeats"], world)
                if rank == 0:
                    rows.append({"kind": kind, "msg_bytes": msg, "world": world, "uneven": uneven,
                                 "seconds": float(np.quantile(t, 0.25)), "median_s": float(np.median(t)),
                                 "min_s": float(t.min())})
        if time.perf_counter() - start > 4 * cfg["budget_s"]:
            break
    return rows


def _time_collective(dist, fn, device: torch.device, warmup: int, repeats: int, world: int) -> np.ndarray:
    """Per-sample seconds of the slowest rank, each sample started after a barrier."""
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    own = np.empty(repeats)
    for i in range(repeats):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        own[i] = time.perf_counter() - t0
    mine = torch.tensor(own, dtype=torch.float64, device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return mine.cpu().numpy()
