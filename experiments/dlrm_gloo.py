"""A real DLRM training job on this machine: table-wise sharded embeddings, gloo, K local processes.

This is the *measured* side of the sharding experiment (Lin et al. 2024 §IV-B, Table IV):
each rank owns whole ``nn.EmbeddingBag`` tables (sparse gradients, SGD fused into the backward),
looks them up for the global batch, exchanges the pooled vectors with ``all_to_all_single`` (and
their gradients backward), runs the bottom and top MLPs data-parallel under DDP (gloo), and
steps SGD. With one process there is no DDP and no all-to-all. It mirrors
:func:`predictor.sources.synth.dlrm.build_dlrm_graph` in host mode op for op, so prediction and
measurement describe the same program.

:func:`measure_dlrm` spawns the processes and returns the per-iteration wall time (seconds;
median over timed iterations, max over ranks) and the reuse-factor histogram of each
table's real batch, which the predictor takes as input, as the paper does. Index batches are
drawn to each table's reuse profile (``DLRMJobSpec.reuse``, the task's), with the generator
the calibration's embedding benchmark uses.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from experiments.measure_env import cpu_accounting
from predictor.timing.calibration.collectives import free_port

__all__ = ["DLRMJobSpec", "measure_dlrm", "batch_reuse_histogram", "table_batch", "cold_embedding_seconds",
           "EmbeddingOverride"]


@dataclass(frozen=True)
class DLRMJobSpec:
    """What to run. ``batch_size`` is global; tables are (rows, dim, pooling)."""

    rows: tuple[int, ...]
    dim: tuple[int, ...]
    pooling: tuple[float, ...]
    assignment: tuple[int, ...]
    n_ranks: int
    batch_size: int
    dense_features: int = 13
    bottom_mlp: tuple[int, ...] = (512, 256, 128)
    top_mlp: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    warmup: int = 3
    iters: int = 10
    threads: int = 1
    seed: int = 0
    #: per table, the 17-bin lookup-weighted reuse histogram the index batches are drawn to
    #: (the task's reuse profile, Lin et al. 2024 §III-E); empty: uniformly random rows
    reuse: tuple[tuple[float, ...], ...] = ()
    #: when set, 3 more iterations run under torch.profiler after the timed ones (diagnosis;
    #: never part of the timed iterations); rank r writes ``rank{r}.trace.json`` there
    trace_dir: str = ""
    #: when set, every timed iteration records the wall clock at its phase boundaries
    #: (:data:`PHASES`; a few ``perf_counter`` calls, no profiler), returned as ``phases``
    phases: bool = False
    #: diagnosis: pin rank r (and the threads it starts, gloo's included) to CPU ``r mod cores``
    #: before it joins the group; the default leaves placement to the scheduler, as a user's job does
    pin: bool = False
    #: distinct index batches the timed iterations cycle through. 2 (the oldest stored runs): a
    #: batch's rows come back two iterations later, still cached while two batches' rows fit in the
    #: LLC, which a real input stream does not give; 8 or more: each iteration's rows as fresh as the
    #: reuse profile makes them
    batch_pool: int = 2
    #: sharding types beyond table-wise: per table ``(sharding_type, ranks, sizes, offsets)`` as
    #: :meth:`predictor.sources.synth.dlrm_sharding.TableShards.as_dict` holds them (tuples); when set it
    #: replaces ``assignment`` (see :class:`ShardedEmbeddings`)
    shards: tuple = ()


#: the index batches a stored run or window cycled when its record names none (the oldest ones, measured
#: before the ``--batch-pool`` option existed, cycled 2).
LEGACY_BATCH_POOL = DLRMJobSpec.batch_pool


#: phase boundaries one timed iteration records with ``DLRMJobSpec.phases``, in order: the
#: embedding lookups, their all-to-all (with the packing ``cat``), the dense forward and loss, the
#: dense backward (top, then bottom MLP, DDP's bucket copies; up to the all-to-all of gradients),
#: the all-to-all of gradients, the tables' backward with their SGD row updates, the end of
#: ``backward()`` (DDP waits for its all-reduces and copies the buckets back) and the optimizer step.
#: One process: no all-to-all phases.
PHASES = ("emb_fwd", "a2a_fwd", "dense_fwd", "dense_bwd", "a2a_bwd", "emb_bwd", "ddp_tail", "optimizer")
#: the running iteration's ``(label, perf_counter seconds)`` marks (set in a rank process with ``phases``)
_MARKS: list[tuple[str, float]] | None = None


def _mark(label: str) -> None:
    if _MARKS is not None:
        _MARKS.append((label, time.perf_counter()))


def phase_seconds(marks: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds of each of :data:`PHASES` in one iteration's marks (phases it lacks are left out)."""
    at: dict[str, list[float]] = {}
    for label, t in marks:
        at.setdefault(label, []).append(t)
    ends = {"start": at["start"][0], "emb_fwd": at["emb_fwd"][0], "a2a_fwd": at.get("a2a_fwd", [None])[0],
            "dense_fwd": at["dense_fwd"][0],
            "dense_bwd": (at.get("a2a_bwd_start") or at.get("emb_grad") or at["backward"])[0],
            "a2a_bwd": at.get("a2a_bwd_end", [None])[0],
            "emb_bwd": max(at.get("emb_bwd") or at.get("emb_grad") or at["backward"]),
            "ddp_tail": at["backward"][0], "optimizer": at["optimizer"][0]}
    return phase_durations(ends, ends["start"])


def phase_durations(ends: dict[str, float | None], start: float) -> dict[str, float]:
    """Seconds of each of :data:`PHASES` from the time each one ends (``None``: the iteration lacks
    it) and the iteration's start (seconds, one clock)."""
    out: dict[str, float] = {}
    prev = start
    for name in PHASES:
        if ends.get(name) is None:
            continue
        out[name] = ends[name] - prev
        prev = ends[name]
    return out


def batch_reuse_histogram(indices: np.ndarray, bins: int = 17) -> np.ndarray:
    """Lookup-weighted reuse-factor histogram of one batch of indices (Lin et al. 2024 Fig. 6):
    fraction of lookups whose row is accessed (0,1], (1,2], (2,4], ... times in the batch."""
    if indices.size == 0:
        h = np.zeros(bins)
        h[0] = 1.0
        return h
    _, counts = np.unique(indices, return_counts=True)
    edges = [0, 1, 2] + [2**j for j in range(2, bins)]
    b = np.searchsorted(np.asarray(edges[1:], dtype=float), counts, side="left")
    b = np.minimum(b, bins - 1)
    h = np.bincount(b, weights=counts.astype(float), minlength=bins)
    return h / h.sum()


def _lookups(rng: np.random.Generator, batch: int, rows: int, pooling: float,
             reuse: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Indices and offsets of one batch: per-sample bag sizes ``floor(L)`` or ``ceil(L)`` with mean
    ``pooling``; the rows are drawn so the batch's reuse histogram follows ``reuse`` (the
    calibration's generator, :func:`predictor.timing.calibration.embedding_bag.indices_for_reuse`), or
    uniformly at random without one."""
    from predictor.timing.calibration.embedding_bag import indices_for_reuse

    lo = int(np.floor(pooling))
    counts = lo + (rng.random(batch) < (pooling - lo)).astype(np.int64)
    total = int(counts.sum())
    if reuse is not None and total:
        idx = indices_for_reuse(np.asarray(reuse, dtype=float), total, rows, rng)
    else:
        idx = rng.integers(0, rows, size=total)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return idx.astype(np.int64), offsets.astype(np.int64)


def table_batch(spec: DLRMJobSpec, table: int, which: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Batch ``which`` of table ``table``: the same whichever rank owns the table."""
    rng = np.random.default_rng([spec.seed, table, which])
    reuse = np.asarray(spec.reuse[table]) if spec.reuse else None
    return _lookups(rng, spec.batch_size, int(spec.rows[table]), float(spec.pooling[table]), reuse)


class _AllToAll(torch.autograd.Function):
    """Pooled embeddings of my tables for the global batch -> every table's vectors for my local batch."""

    @staticmethod
    def forward(ctx, x, send_split, recv_split):  # noqa: D401 - torch signature
        ctx.send_split, ctx.recv_split = send_split, recv_split
        out = x.new_empty(sum(recv_split))
        _mark("a2a_fwd_start")
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv_split, input_split_sizes=send_split)
        _mark("a2a_fwd")
        return out

    @staticmethod
    def backward(ctx, grad):
        _mark("a2a_bwd_start")
        out = grad.new_empty(sum(ctx.send_split))
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=ctx.send_split, input_split_sizes=ctx.recv_split)
        _mark("a2a_bwd_end")
        return out, None, None


SPARSE_LR = 0.01


def _mark_grad(grad: torch.Tensor) -> None:
    _mark("emb_grad")


def sgd_in_backward(w: torch.Tensor) -> None:
    """SGD row update of a table as soon as its sparse gradient is accumulated."""
    with torch.no_grad():
        w.add_(w.grad, alpha=-SPARSE_LR)
    w.grad = None
    _mark("emb_bwd")


def _timed_allreduce_hook(state, bucket):
    """DDP's default hook (all-reduce of the bucket divided by the world size) with a mark when each
    bucket's all-reduce is issued (``ar_issue``, on the main thread) and when it completes
    (``ar_done``, on gloo's thread), so the phases show the all-reduces in situ."""
    _mark("ar_issue")
    fut = allreduce_hook(state, bucket)

    def done(f):
        _mark("ar_done")
        return f.value()

    return fut.then(done)


def mlp(sizes: list[int], sigmoid_last: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        layers.append(nn.Sigmoid() if (sigmoid_last and i == len(sizes) - 2) else nn.ReLU())
    return nn.Sequential(*layers)


class Dense(nn.Module):
    """Bottom MLP, concatenation with the embeddings, top MLP: the part DDP replicates."""

    def __init__(self, bottom: nn.Module, top: nn.Module) -> None:
        super().__init__()
        self.bottom, self.top = bottom, top

    def forward(self, x: torch.Tensor, embs: list[torch.Tensor]) -> torch.Tensor:
        # the interaction: one concatenation of the bottom MLP's output with every table's vectors
        return self.top(torch.cat([self.bottom(x), *embs], dim=1))


class _ReduceScatter(torch.autograd.Function):
    """Row-wise partial sums ``[B, W]`` -> my local batch's sums ``[B/N, W]``; backward: all-gather."""

    @staticmethod
    def forward(ctx, x, n):  # noqa: D401 - torch signature
        out = x.new_empty(x.shape[0] // n, x.shape[1])
        dist.reduce_scatter_tensor(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        full = grad.new_empty(grad.shape[0] * dist.get_world_size(), grad.shape[1])
        dist.all_gather_into_tensor(full, grad.contiguous())
        return full, None


def _bucket(idx: np.ndarray, off: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The ids of a batch that fall in rows ``[lo, hi)``, rebased to the shard, with per-sample offsets."""
    counts = np.diff(np.append(off, idx.size))
    sample = np.repeat(np.arange(off.size), counts)
    keep = (idx >= lo) & (idx < hi)
    n_per = np.bincount(sample[keep], minlength=off.size)
    return (idx[keep] - lo).astype(np.int64), np.concatenate([[0], np.cumsum(n_per)[:-1]]).astype(np.int64)


class ShardedEmbeddings(nn.Module):
    """One rank's embeddings under ``spec.shards``, run as TorchRec runs each sharding type.

    table-wise and column-wise shards: ``EmbeddingBag`` of the shard's columns for the global batch, the
    pooled vectors through the all-to-all; row-wise (and table-row-wise, one host): the global batch's
    ids in my rows, partial sums through a reduce-scatter (backward: all-gather); data-parallel: a replica
    looked up for my samples, its dense gradient all-reduced (asynchronously, from the gradient hook)
    and SGD applied by :meth:`finish`. Sparse shards update in the backward as the table-wise program.
    """

    def __init__(self, spec: DLRMJobSpec, rank: int) -> None:
        super().__init__()
        self.spec, self.rank, self.n = spec, rank, spec.n_ranks
        self.a2a: list[tuple[int, int, int]] = []  # (table, rows, cols) of my all-to-all shards
        self.rw: list[tuple[int, int, int, int]] = []  # (table, row offset, rows, dim)
        self.dp: list[int] = []
        cols_of = [0] * self.n
        mods: dict[str, list[nn.Module]] = {"a2a": [], "rw": [], "dp": []}
        for t, (kind, ranks, sizes, offsets) in enumerate(spec.shards):
            for r, (rows, cols), (r0, _) in zip(ranks, sizes, offsets, strict=True):
                if kind in ("table_wise", "column_wise"):
                    cols_of[r] += cols
                    if r == rank:
                        self.a2a.append((t, rows, cols))
                        mods["a2a"].append(nn.EmbeddingBag(rows, cols, mode="sum", sparse=True))
                elif kind in ("row_wise", "table_row_wise") and r == rank and rows > 0:
                    self.rw.append((t, r0, rows, cols))
                    mods["rw"].append(nn.EmbeddingBag(rows, cols, mode="sum", sparse=True))
            if kind == "data_parallel":
                self.dp.append(t)
                mods["dp"].append(nn.EmbeddingBag(*sizes[rank], mode="sum", sparse=False))
        # bags in lookup order: all-to-all shards, row-wise shards, data-parallel replicas
        self.bags = nn.ModuleList(mods["a2a"] + mods["rw"] + mods["dp"])
        self.dims_of_rank = cols_of
        self.works: list = []
        b = spec.batch_size // self.n
        self.send_split = [b * cols_of[rank]] * self.n
        self.recv_split = [b * cols_of[q] for q in range(self.n)]
        for k, m in enumerate(self.bags):
            if k < len(self.a2a) + len(self.rw):
                m.weight.register_post_accumulate_grad_hook(sgd_in_backward)
            else:
                m.weight.register_post_accumulate_grad_hook(self._all_reduce)

    def _all_reduce(self, w: torch.Tensor) -> None:
        self.works.append(dist.all_reduce(w.grad, async_op=True))

    def batch(self, which: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Index batch ``which`` of every bag (drawn before timing, as the table-wise program)."""
        b = self.spec.batch_size // self.n
        out = []
        for t, _, _ in self.a2a:
            i, o = table_batch(self.spec, t, which)
            out.append((torch.as_tensor(i), torch.as_tensor(o)))
        for t, r0, rows, _ in self.rw:
            i, o = table_batch(self.spec, t, which)
            i, o = _bucket(i, o, r0, r0 + rows)
            out.append((torch.as_tensor(i), torch.as_tensor(o)))
        for t in self.dp:
            i, o = table_batch(self.spec, t, which)
            lo, hi = int(o[self.rank * b]), int(o[(self.rank + 1) * b]) if self.rank + 1 < self.n else i.size
            out.append((torch.as_tensor(i[lo:hi]), torch.as_tensor(o[self.rank * b:(self.rank + 1) * b] - lo)))
        return out

    def forward(self, lookups: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """The embedding blocks of my local batch: all-to-all blocks by source rank, the row-wise sums,
        the data-parallel tables."""
        b = self.spec.batch_size // self.n
        pooled = [self.bags[k](i, o) for k, (i, o) in enumerate(lookups)]
        _mark("emb_fwd")
        n_a2a, n_rw = len(self.a2a), len(self.rw)
        embs: list[torch.Tensor] = []
        if sum(self.dims_of_rank):
            send = torch.cat(pooled[:n_a2a], dim=1) if n_a2a else torch.zeros(self.spec.batch_size, 0)
            recv = _AllToAll.apply(send.reshape(-1), self.send_split, self.recv_split)
            embs += [blk.view(b, self.dims_of_rank[q]) for q, blk in enumerate(torch.split(recv, self.recv_split))
                     if self.recv_split[q]]
        if n_rw:
            embs.append(_ReduceScatter.apply(torch.cat(pooled[n_a2a:n_a2a + n_rw], dim=1), self.n))
        embs += pooled[n_a2a + n_rw:]
        return embs

    def finish(self) -> None:
        """Wait for the data-parallel gradients' all-reduces and apply SGD to the replicas."""
        for w in self.works:
            w.wait()
        self.works = []
        with torch.no_grad():
            for m in self.bags[len(self.a2a) + len(self.rw):]:
                m.weight.add_(m.weight.grad, alpha=-SPARSE_LR)
                m.weight.grad = None


def _worker(rank: int, spec: DLRMJobSpec, port: int, out_dir: str) -> None:
    if spec.pin:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(spec.threads)
    dist.init_process_group("gloo", rank=rank, world_size=spec.n_ranks)
    n = spec.n_ranks
    b = spec.batch_size // n
    assignment = np.asarray(spec.assignment)
    mine = np.flatnonzero(assignment == rank)
    dims = np.asarray(spec.dim)
    torch.manual_seed(spec.seed + rank)
    sharded = ShardedEmbeddings(spec, rank) if spec.shards else None
    if sharded is not None:
        mine = np.asarray([t for t, _, _ in sharded.a2a] + [t for t, _, _, _ in sharded.rw], dtype=np.int64)
    tables = nn.ModuleList(nn.EmbeddingBag(int(spec.rows[t]), int(dims[t]), mode="sum", sparse=True)
                           for t in (mine if sharded is None else []))
    bottom = mlp([spec.dense_features, *spec.bottom_mlp], sigmoid_last=False)
    width = spec.bottom_mlp[-1] + int(dims.sum())
    top = mlp([width, *spec.top_mlp], sigmoid_last=True)
    dense = Dense(bottom, top)
    # one process: plain training (no DDP, no all-to-all), as the synthesiser's 1-rank graph
    ddp = nn.parallel.DistributedDataParallel(dense) if n > 1 else dense
    if n > 1 and spec.phases:
        ddp.register_comm_hook(None, _timed_allreduce_hook)
    opt_dense = torch.optim.SGD(ddp.parameters(), lr=0.01)
    # tables: SGD fused into the backward, as FBGEMM's backward-SGD kernel does on GPUs (and as the
    # calibrated embedding_bag_bwd kernel is timed): the row update runs as soon as a table's
    # sparse gradient is ready, then the gradient is dropped
    for w in tables.parameters():
        w.register_post_accumulate_grad_hook(sgd_in_backward)
    # received layout: rank q's tables (in table order) for my samples, rank-major; every rank
    # sees the same layout, so the top MLP's input columns mean the same thing on every rank
    dims_of_rank = [int(dims[assignment == q].sum()) for q in range(n)]
    my_dims = dims_of_rank[rank]
    send_split = [b * my_dims] * n
    recv_split = [b * dims_of_rank[q] for q in range(n)]
    # a fixed pool of batches (drawing inputs is not what we time)
    batches = []
    for which in range(max(1, spec.batch_pool)):
        if sharded is not None:
            batches.append((sharded.batch(which), torch.randn(b, spec.dense_features), torch.rand(b, 1)))
            continue
        lookups = [table_batch(spec, int(t), which) for t in mine]
        batches.append(([(torch.as_tensor(i), torch.as_tensor(o)) for i, o in lookups],
                        torch.randn(b, spec.dense_features), torch.rand(b, 1)))
    loss_fn = nn.BCELoss()
    times: list[float] = []

    def step(it: int) -> None:
        lookups, x, y = batches[it % len(batches)]
        if sharded is not None:
            loss = loss_fn(ddp(x, sharded(lookups)), y)
            _mark("dense_fwd")
            opt_dense.zero_grad(set_to_none=True)
            loss.backward()
            sharded.finish()
            _mark("backward")
            opt_dense.step()
            _mark("optimizer")
            return
        pooled = []
        for k, (i, o) in enumerate(lookups):
            pooled.append(tables[k](i, o))
            _mark("emb_fwd_table")
        _mark("emb_fwd")
        if _MARKS is not None:  # a pooled vector's gradient arrives just before its table's backward
            for p in pooled:
                p.register_hook(_mark_grad)
        if n > 1:
            send = torch.cat(pooled, dim=1) if pooled else torch.zeros(spec.batch_size, 0)
            # rows q*b:(q+1)*b go to rank q
            recv = _AllToAll.apply(send.reshape(-1), send_split, recv_split)
            embs = [blk.view(b, dims_of_rank[q]) for q, blk in enumerate(torch.split(recv, recv_split)) if recv_split[q]]
        else:
            embs = pooled
        logits = ddp(x, embs)
        loss = loss_fn(logits, y)
        _mark("dense_fwd")
        opt_dense.zero_grad(set_to_none=True)
        loss.backward()
        _mark("backward")
        opt_dense.step()
        _mark("optimizer")

    global _MARKS
    phases: list[dict[str, float]] = []
    marks: list[list[tuple[str, float]]] = []
    starts: list[float] = []  # perf_counter (CLOCK_MONOTONIC: one clock for every process of the host)
    for it in range(spec.warmup + spec.iters):
        if it == spec.warmup:
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
        if n > 1:
            dist.barrier()
        if spec.phases and it >= spec.warmup:
            _MARKS = []
        t0 = time.perf_counter()
        _mark("start")
        step(it)
        dt = time.perf_counter() - t0
        if it >= spec.warmup:
            times.append(dt)
        if _MARKS is not None:
            phases.append(phase_seconds(_MARKS))
            marks.append([(label, t - _MARKS[0][1]) for label, t in _MARKS])
            starts.append(_MARKS[0][1])
            _MARKS = None
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    # per timed iteration (barriers included): CPU time of all this rank's threads, page faults, and
    # involuntary context switches (the rank's threads pre-empted on a full host)
    system = {"wall_s": sum(times) / spec.iters, **cpu_accounting(ru0, ru1, spec.iters)}
    if spec.trace_dir:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for it in range(3):
                if n > 1:
                    dist.barrier()
                step(it)
        prof.export_chrome_trace(str(Path(spec.trace_dir) / f"rank{rank}.trace.json"))
    rf = {int(t): batch_reuse_histogram(batches[0][0][k][0].numpy()).tolist() for k, t in enumerate(mine)
          if sharded is None}
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"times": times, "rf": rf, "system": system,
                                                                "phases": phases, "marks": marks,
                                                                "starts": starts}))
    dist.barrier()
    dist.destroy_process_group()


def measure_dlrm(spec: DLRMJobSpec) -> dict:
    """Run the job; returns ``{"iteration_s", "per_rank_s", "times", "rf", "system", "phases"}``: the
    median iteration per rank (seconds), its max over ranks, every timed iteration of every rank, the
    reuse histograms, per rank the CPU accounting of a timed iteration (user / system seconds, minor
    page faults, involuntary context switches; see :func:`_worker`) and (``spec.phases``) per rank and
    timed iteration the seconds of each of :data:`PHASES` (:func:`phase_seconds`), its raw
    ``(label, seconds since the iteration's start)`` marks and (``starts``) the start's
    ``perf_counter`` reading (CLOCK_MONOTONIC on Linux, comparable across the ranks' processes)."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(spec, free_port(), tmp), nprocs=spec.n_ranks, join=True, start_method="fork")
        per_rank = []
        times = []
        rf: dict[int, list[float]] = {}
        system = []
        phases = []
        marks = []
        starts = []
        for r in range(spec.n_ranks):
            d = json.loads((Path(tmp) / f"rank{r}.json").read_text())
            system.append(d["system"])
            phases.append(d["phases"])
            marks.append(d["marks"])
            starts.append(d.get("starts", []))
            per_rank.append(float(np.median(d["times"])))
            times.append([float(t) for t in d["times"]])
            rf.update({int(k): v for k, v in d["rf"].items()})
    return {"iteration_s": max(per_rank), "per_rank_s": per_rank, "times": times, "rf": rf, "system": system,
            "phases": phases, "marks": marks, "starts": starts}


# ----------------------------------------------------------------------------- diagnosis
class EmbeddingOverride:
    """Diagnosis only: ``base`` timing with every embedding-bag task's duration replaced by a
    measured one (``fwd_s[table]`` / ``bwd_s[table]``, seconds, timed alone in one process),
    matched by task name. A K-rank graph's measured times are slowed by the platform's embedding
    host-contention factor for K ranks, as ``base`` slows its predicted ones, so the diagnosis
    swaps the embedding *models* only."""

    def __init__(self, base, fwd_s: np.ndarray, bwd_s: np.ndarray) -> None:
        self.base, self.fwd_s, self.bwd_s = base, fwd_s, bwd_s
        self.source = f"{base.source} + embedding kernels measured cold"

    def durations(self, graph) -> np.ndarray:
        d = self.base.durations(graph)
        factors = getattr(self.base, "contention_factors", lambda _n: {})(graph.n_ranks)
        for kind, table in (("embedding_bag_fwd", self.fwd_s), ("embedding_bag_bwd", self.bwd_s)):
            idx, tables = _embedding_tasks(graph, kind)
            d[idx] = table[tables] * factors.get("embedding", 1.0)
        return d


def _embedding_tasks(graph, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Indices of ``graph``'s tasks of ``kind`` and the table each looks up (from its name ``...[t]``)."""
    idx = np.flatnonzero(np.asarray(graph.kinds)[graph.kind] == kind)
    names = np.asarray(graph.names)[graph.name[idx]]
    return idx, np.array([int(n.rsplit("[", 1)[1].rstrip("]")) for n in names], dtype=np.int64)


def predicted_embedding_seconds(timing, spec) -> tuple[np.ndarray, np.ndarray]:
    """Every table's embedding-bag forward and backward as ``timing`` predicts them alone (one rank,
    no host contention), seconds: the counterpart of :func:`cold_embedding_seconds`."""
    from predictor.sources.synth.dlrm import build_dlrm_graph

    g = build_dlrm_graph(spec, np.zeros(len(spec.tables), dtype=np.int64), 1, mode="host")
    d = timing.durations(g)
    out = []
    for kind in ("embedding_bag_fwd", "embedding_bag_bwd"):
        idx, tables = _embedding_tasks(g, kind)
        arr = np.zeros(len(spec.tables))
        arr[tables] = d[idx]
        out.append(arr)
    return out[0], out[1]


def cold_embedding_seconds(base: DLRMJobSpec, n_calls: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Every table's embedding-bag forward and backward (+ SGD row update) on its real batch, timed
    alone with the last-level cache evicted before each call and another table's call in between
    (seconds; as the calibration times them: :func:`~predictor.timing.calibration.embedding_bag.neighbour_warmers`)."""
    import torch.nn.functional as F

    from experiments.measure_env import llc_flush_buffer, time_call
    from predictor.timing.calibration.embedding_bag import neighbour_warmers, neighbour_weight

    torch.set_num_threads(base.threads)
    flush = llc_flush_buffer()
    neighbour = neighbour_weight(torch.device("cpu"))
    fwd, bwd = np.zeros(len(base.rows)), np.zeros(len(base.rows))
    for t in range(len(base.rows)):
        idx, off = table_batch(base, t, 0)
        it, ot = torch.as_tensor(idx), torch.as_tensor(off)
        w = nn.Parameter(torch.rand(int(base.rows[t]), int(base.dim[t])))
        out = F.embedding_bag(it, w, ot, mode="sum", sparse=True)
        grad = torch.randn_like(out)

        def backward(out=out, grad=grad, w=w) -> None:
            out.backward(grad, retain_graph=True)
            with torch.no_grad():
                w.add_(w.grad, alpha=-0.01)
            w.grad = None

        warm_fwd, warm_bwd = neighbour_warmers(base.batch_size, neighbour)
        fwd[t] = time_call(lambda it=it, w=w, ot=ot: F.embedding_bag(it, w, ot, mode="sum", sparse=True),
                           lambda warm=warm_fwd: (flush(), warm()), n=n_calls, warmup=1)
        bwd[t] = time_call(backward, lambda warm=warm_bwd: (flush(), warm()), n=n_calls, warmup=1)
        del w, out
    return fwd, bwd
