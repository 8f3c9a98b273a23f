"""Data parallelism: replicas with DDP's bucketed gradient all-reduce, or re-timed collectives."""

from __future__ import annotations

import numpy as np

from predictor.graph import Category, DepKind, ExecutionGraph, ProcKind
from predictor.graph.edit import GraphEditor
from predictor.whatif.common import (
    MIB,
    PHASE_BWD,
    PHASE_OPT,
    WhatIfError,
    aux_col,
    copy_all,
    ensure_aux,
    main_procs,
    with_meta,
)

__all__ = ["scale_dp", "ddp_buckets"]


def ddp_buckets(nbytes: np.ndarray, first_cap: float, cap: float) -> np.ndarray:
    """Bucket index per gradient (in ready order): a bucket closes once it holds >= its cap."""
    out = np.zeros(nbytes.size, dtype=np.int64)
    b, acc = 0, 0.0
    for i, x in enumerate(nbytes.tolist()):
        out[i] = b
        acc += x
        if acc >= (first_cap if b == 0 else cap):
            b += 1
            acc = 0.0
    return out


def scale_dp(g: ExecutionGraph, dp: int, *, bucket_bytes: float = 25 * MIB, first_bucket_bytes: float = 1 * MIB,
             issue_s: float = 5e-6, replicas: int | None = None, comm_overlap: bool = True) -> ExecutionGraph:
    """Data parallelism of degree ``dp`` (see the module docstring). ``issue_s``: host time to
    issue one bucket's all-reduce (seconds). ``replicas``: how many of the ``dp`` identical
    replicas to simulate (default ``min(dp, 4)``; collectives are timed for ``dp`` ranks).
    ``comm_overlap``: host mode, the all-reduce runs on a thread of its own (a free core);
    False when the gloo thread has to share the rank's core with the compute thread — then it
    runs on the main thread where it is issued (the two serialise)."""
    if dp < 1:
        raise WhatIfError(f"dp must be >= 1 (got {dp})")
    if g.kind_mask("all_reduce", "all_gather", "reduce_scatter").any():
        return _retime_collectives(g, dp)
    if dp == 1:
        return g
    n_rep = min(dp, 4) if replicas is None else max(1, min(replicas, dp))
    ranks = sorted(np.unique(g.rank).tolist())
    n_r = len(ranks)
    main = main_procs(g)
    ddp = _Ddp(g, dp, bucket_bytes, first_bucket_bytes, issue_s, comm_overlap)
    ed = ddp.ed
    # processors of every replica
    proc_maps = [np.arange(g.n_procs)]
    for d in range(1, n_rep):
        pm = np.asarray([ed.processor(int(g.proc_rank[p]) + d * n_r, ProcKind(int(g.proc_kind[p])), g.proc_names[p])
                         for p in range(g.n_procs)], dtype=np.int64)
        proc_maps.append(pm)
    idx = np.arange(g.n_tasks)
    n_buckets_total = 0
    for d in range(n_rep):
        pm = proc_maps[d]
        new = ed.copy(idx, idx.astype(np.float64), proc=pm[g.proc])
        if g.n_edges:
            ed.edges(new[g.edge_src], new[g.edge_dst], g.edge_kind)
        for r in ranks:
            mp = main.get(r)
            if mp is not None:
                n_buckets_total = max(n_buckets_total, ddp.replica_rank(r, r + d * n_r, mp, int(pm[mp]), new))
    out = ed.build()
    return with_meta(out, dp_mode="DDP buckets added", dp=dp, dp_replicas_simulated=n_rep,
                      ddp_buckets=n_buckets_total, ddp_comm="own thread" if comm_overlap or not ddp.host else
                      "shares the rank's core (serialised with compute)")


def _retime_collectives(g: ExecutionGraph, dp: int) -> ExecutionGraph:
    """A graph that already synchronises gradients: its collectives re-timed for ``dp`` ranks."""
    ed, new = copy_all(g)
    out = ed.build()
    sel = out.kind_mask("all_reduce", "all_gather", "reduce_scatter")
    if "world" not in out.params:
        out.params["world"] = np.full(out.n_tasks, np.nan)
    out.params["world"][sel] = float(dp)
    ensure_aux(out, "changed")[sel] = 1.0
    return with_meta(out, dp_mode="re-timed existing collectives", dp=dp, dp_retimed=int(sel.sum()))


class _Ddp:
    """DDP's bucketed all-reduce added to the replicas of a graph being edited (``self.ed``)."""

    def __init__(self, g: ExecutionGraph, dp: int, bucket_bytes: float, first_bucket_bytes: float, issue_s: float,
                 comm_overlap: bool) -> None:
        self.g, self.dp, self.issue_s, self.comm_overlap = g, dp, issue_s, comm_overlap
        self.bucket_bytes, self.first_bucket_bytes = bucket_bytes, first_bucket_bytes
        self.grad = aux_col(g, "grad_bytes")
        self.phase = aux_col(g, "phase")
        self.host = not g.is_gpu().any()
        self.ed = GraphEditor(g)
        self.groups_of: dict[tuple[int, int], int] = {}  # (rank, bucket) -> collective group of all replicas

    def replica_rank(self, r: int, rr: int, mp: int, main_new: int, new: np.ndarray) -> int:
        """Buckets, all-reduces and the end-of-backward wait of rank ``r``'s replica ``rr`` (main processor
        ``mp``, ``main_new`` in the copy; ``new``: the copy's task indices); returns its bucket count."""
        g, ed, host, grad = self.g, self.ed, self.host, self.grad
        on = np.flatnonzero((g.rank == r) & np.isfinite(grad))
        if on.size == 0:
            raise WhatIfError("no gradients found (AccumulateGrad ops) to build DDP buckets from")
        nb = grad[on]
        bk = ddp_buckets(nb, self.first_bucket_bytes, self.bucket_bytes)
        comm_proc = (main_new if host and not self.comm_overlap else
                     ed.processor(rr, ProcKind.CPU_THREAD if host else ProcKind.GPU_STREAM,
                                  "gloo comm thread" if host else "stream ddp comm"))
        elems = nb / 4.0
        if host:  # the reducer copies each gradient into its bucket (divided by the world size)
            mul = ed.add(main_new, "torch::distributed::reducer::mul_out", "mul", Category.MEMORY, on + 0.5,
                         params={"elements": elems, "dtype_bytes": 4.0}, nbytes=3.0 * nb,
                         aux={"phase": float(PHASE_BWD)})
        else:
            mul = new[on]
        ar_tasks = self._all_reduces(r, on, nb, bk, main_new, comm_proc, mul)
        # end of backward: wait for every bucket, copy back into the gradients
        bwd = np.flatnonzero((g.rank == r) & (self.phase == PHASE_BWD) & (g.proc == mp))
        end_bwd = int(bwd.max()) if bwd.size else int(on.max())
        if host:
            wait = ed.add(main_new, "ddp finalize (wait)", "sync", Category.SYNC, end_bwd + 0.9, duration=0.0,
                          aux={"phase": float(PHASE_BWD)})
            if comm_proc != main_new:
                ed.edges(np.asarray(ar_tasks), np.full(len(ar_tasks), wait[0]), DepKind.CPU_CPU)
            ed.add(main_new, ["torch.distributed.ddp.reducer::copy_bucket_to_grad"] * on.size, "memcpy",
                   Category.MEMORY, end_bwd + 0.9 + 0.09 * (np.arange(on.size) + 1) / (on.size + 1),
                   params={"elements": elems, "dtype_bytes": 4.0}, nbytes=2.0 * nb, aux={"phase": float(PHASE_BWD)})
        else:
            opt = np.flatnonzero((g.rank == r) & (self.phase == PHASE_OPT) & g.is_gpu())
            target = new[opt[0]] if opt.size else new[np.flatnonzero(g.rank == r)[-1]]
            ed.edges(np.asarray(ar_tasks), np.full(len(ar_tasks), target), DepKind.GPU_GPU)
        return int(bk.max()) + 1

    def _all_reduces(self, r: int, on: np.ndarray, nb: np.ndarray, bk: np.ndarray, main_new: int, comm_proc: int,
                     mul: np.ndarray) -> list[int]:
        """One all-reduce per bucket on ``comm_proc``, issued after the bucket's last gradient is ready."""
        ed, host = self.ed, self.host
        ar_tasks = []
        for b in range(int(bk.max()) + 1):
            members = np.flatnonzero(bk == b)
            last = int(on[members[-1]])
            key = (r, b)
            if key not in self.groups_of:
                self.groups_of[key] = int(ed.new_groups(1)[0])
            if host:
                issue = ed.add(main_new, "c10d::allreduce_", "collective_issue", Category.CPU, last + 0.75,
                               duration=self.issue_s, aux={"phase": float(PHASE_BWD)})
                src_task = issue
            else:
                src_task = mul[members[-1]:members[-1] + 1]
            ar = ed.add(comm_proc, f"all_reduce bucket {b}", "all_reduce", Category.COMMUNICATION, last + 0.8,
                        group=self.groups_of[key], nbytes=float(nb[members].sum()),
                        params={"msg_bytes": float(nb[members].sum()), "world": float(self.dp), "dtype_bytes": 4.0},
                        aux={"phase": float(PHASE_BWD)})
            if comm_proc != main_new:
                ed.edges(src_task, ar, DepKind.CPU_CPU if host else DepKind.GPU_GPU)
            ar_tasks.append(int(ar[0]))
        return ar_tasks
