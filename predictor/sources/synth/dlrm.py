"""DLRM synthesiser: one data-parallel + table-wise model-parallel training iteration per rank.

Given a :class:`DLRMSpec` (MLPs, embedding tables, global batch) and a sharding (table ->
rank), :func:`build_dlrm_graph` emits the ExecutionGraph the way PyTorch runs DLRM with
table-wise sharded embeddings and DDP MLPs (Lin et al. 2024 §IV-B; TorchRec's pipeline):

forward
    embedding-bag lookups of the rank's tables for the *global* batch -> all-to-all of the pooled
    embeddings (comm stream) -> bottom MLP on the local batch (overlaps the all-to-all) ->
    interaction (waits for the all-to-all: intra-rank sync) -> top MLP -> loss
backward
    top MLP (dgrad + wgrad GEMMs; DDP all-reduce of each full gradient bucket on the comm
    stream) -> interaction backward -> all-to-all of embedding gradients -> bottom MLP
    backward (its buckets) -> embedding backward with fused SGD (waits for the all-to-all)
    -> optimizer step of the MLPs (waits for every all-reduce).

Every framework op is a CPU op (overheads T1, T2, one T4 launch per kernel, T5 between
launches, T3) whose launches feed GPU kernels; the simulator derives idle time from that.

``mode="host"`` (CPU platforms) is a different program, eager PyTorch on CPU with gloo, as
``experiments/dlrm_gloo.py`` runs it: ops on the calling thread, collectives on gloo's worker
threads, the blocking all-to-all, DDP's real buckets, SGD fused into the embedding backward
(see :func:`_build_host_graph`). Units: bytes, elements, seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from predictor.graph import Category, DepKind, ExecutionGraph, GraphBuilder, Overhead, ProcKind
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.sources.synth.emit import ExecMode, OpEmitter, column_sum, concat, eltwise, foreach, gemm
from predictor.sources.synth.mlp import backward_entry, layer_tensors, linear_grad_nodes
from predictor.timing.kernels.embedding import RF_COLUMNS

__all__ = ["DLRMSpec", "DLRMGraphTemplate", "build_dlrm_graph", "dlrm_memory_per_rank", "dlrm_dense_memory", "all_to_all_message_bytes", "ddp_buckets"]

DDP_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP default bucket_cap_mb=25


@dataclass(frozen=True)
class DLRMSpec:
    """A DLRM training job. ``batch_size`` is the global batch (samples per iteration)."""

    tables: EmbeddingTables
    batch_size: int
    dense_features: int = 13
    bottom_mlp: Sequence[int] = (512, 256, 128)
    top_mlp: Sequence[int] = (1024, 1024, 512, 256, 1)
    dtype_bytes: int = 4
    optimizer: str = "sgd"  # "sgd" or "adagrad" (row-wise state for embeddings)
    ddp_bucket_bytes: int = DDP_BUCKET_BYTES
    label: str = field(default="")

    @property
    def interaction(self) -> str:
        """'dot' when every table's dim equals the bottom MLP's output, else 'cat'."""
        dims = np.unique(self.tables.dim)
        return "dot" if dims.size == 1 and int(dims[0]) == int(self.bottom_mlp[-1]) else "cat"

    def interaction_width(self) -> int:
        """Width of the top MLP's input."""
        t = len(self.tables)
        if self.interaction == "dot":
            return int(self.bottom_mlp[-1] + (t + 1) * t // 2)
        return int(self.bottom_mlp[-1] + int(self.tables.dim.sum()))

    def mlp_layers(self) -> list[tuple[str, int, int]]:
        """(name, in, out) of every MLP layer, bottom then top."""
        layers = []
        width = self.dense_features
        for i, w in enumerate(self.bottom_mlp):
            layers.append((f"bot{i}", width, int(w)))
            width = int(w)
        width = self.interaction_width()
        for i, w in enumerate(self.top_mlp):
            layers.append((f"top{i}", width, int(w)))
            width = int(w)
        return layers

    def mlp_param_count(self) -> int:
        return sum(i * o + o for _, i, o in self.mlp_layers())


def all_to_all_message_bytes(spec: DLRMSpec, assignment: np.ndarray, n_ranks: int) -> float:
    """Per-rank message of the pooled-embedding all-to-all by the "max of max" rule (bytes).

    Rank r sends its tables' pooled vectors for the whole batch (``B * sum(D_r)``) and receives
    every table's vectors for its local batch (``B/N * sum(D)``); the collective is timed at the
    largest of these over all ranks (Lin et al. 2024 §III-C).
    """
    dims_per_rank = np.bincount(assignment, weights=spec.tables.dim.astype(float), minlength=n_ranks)
    sent = spec.batch_size * dims_per_rank * spec.dtype_bytes
    recv = spec.batch_size / n_ranks * float(spec.tables.dim.sum()) * spec.dtype_bytes
    return float(max(sent.max(), recv))


def dlrm_dense_memory(spec: DLRMSpec, n_ranks: int) -> tuple[float, float]:
    """Bytes every rank holds whatever the placement: (MLP weights, gradients, optimizer state and DDP
    buckets; the MLPs' activations of the local batch)."""
    dt = spec.dtype_bytes
    params = spec.mlp_param_count() * dt
    opt_state = params if spec.optimizer == "adagrad" else 0
    dense = params * 3 + opt_state  # weights, grads, DDP bucket copies
    b = spec.batch_size / n_ranks
    acts = sum(b * (i + 2 * o) * dt for _, i, o in spec.mlp_layers())
    return dense, acts


def dlrm_memory_per_rank(spec: DLRMSpec, assignment: np.ndarray, n_ranks: int,
                         dense_memory: tuple[float, float] | None = None) -> np.ndarray:
    """Device memory each rank needs (bytes): tables (+ optimizer state), MLP weights, gradients,
    optimizer state and DDP buckets, and the iteration's activations and communication buffers.
    ``dense_memory``: :func:`dlrm_dense_memory` of the spec, when the caller keeps it."""
    dt = spec.dtype_bytes
    t = spec.tables
    table_bytes = t.rows.astype(float) * t.dim * t.dtype_bytes
    if spec.optimizer == "adagrad":
        table_bytes = table_bytes + t.rows.astype(float) * 4  # row-wise adagrad state
    per_rank_tables = np.bincount(assignment, weights=table_bytes, minlength=n_ranks)
    dense, acts = dense_memory or dlrm_dense_memory(spec, n_ranks)
    dims_per_rank = np.bincount(assignment, weights=t.dim.astype(float), minlength=n_ranks)
    pooled = spec.batch_size * dims_per_rank * dt  # lookups' outputs for the global batch
    a2a = 2 * all_to_all_message_bytes(spec, assignment, n_ranks)  # send + receive buffers
    return per_rank_tables + dense + acts + 2 * pooled + a2a


@dataclass
class _DDPState:
    """DDP gradient buckets of one rank: which layer closes which bucket, and the kernels so far."""

    buckets: list[list[str]]
    bucket_of: dict[str, int]
    bucket_bytes: list[int]
    groups: list[int]
    n_ranks: int
    dtype_bytes: int
    bucket_last: dict[int, int]
    all_reduces: list[int]


def _backward_layer(e: OpEmitter, ddp: _DDPState, name: str, i: int, o: int, b_local: float, first: bool) -> None:
    """Activation backward, dgrad (unless ``first`` layer), wgrad + bias grad; launch the DDP
    all-reduce when this layer completes its bucket."""
    dt = ddp.dtype_bytes
    e.op(f"{name}.act.backward", [eltwise(f"{name}.relu_bwd", "relu_bwd", b_local * o, dt, rw=3.0)])
    kernels = [gemm(f"{name}.wgrad", o, i, b_local, dt, k_strided=True), column_sum(f"{name}.bias_grad", b_local, o, dt)]
    if not first:
        kernels.insert(0, gemm(f"{name}.dgrad", b_local, i, o, dt))
    ks = e.op(f"{name}.linear.backward", kernels)
    linear_grad_nodes(e, name)
    bi = ddp.bucket_of[name]
    ddp.bucket_last[bi] = ks[-1]
    if name == ddp.buckets[bi][-1] and ddp.n_ranks > 1:  # bucket complete: DDP launches its all-reduce
        params = {"msg_bytes": ddp.bucket_bytes[bi], "world": ddp.n_ranks, "dtype_bytes": dt}
        ddp.all_reduces.extend(
            e.op(f"ddp.all_reduce[{bi}]", [("all_reduce", "all_reduce", Category.COMMUNICATION, params)],
                 comm=True, async_op=True, after=[ddp.bucket_last[bi]], group=ddp.groups[bi])
        )


def build_dlrm_graph(spec: DLRMSpec, assignment: np.ndarray, n_ranks: int, mode: ExecMode = "device",
                     comm_threads: bool = True) -> ExecutionGraph:
    """The per-rank ExecutionGraph of one training iteration under ``assignment`` (table -> rank).

    ``mode``: ``"device"`` for accelerators (async kernels on streams), ``"host"`` for CPU
    platforms (eager PyTorch on the calling thread, gloo collectives on the process group's
    worker threads; see :func:`_build_host_graph`). ``comm_threads`` (host mode): False when
    the host has no spare core for gloo's threads
    (:func:`predictor.timing.platforms.host.comm_thread_has_core`); collectives then run on the main
    thread and serialise with compute.
    """
    assignment = np.asarray(assignment, dtype=np.int64)
    t = spec.tables
    if assignment.shape != (len(t),):
        raise ValueError(f"sharding assigns {assignment.shape[0]} tables, the task has {len(t)}")
    if n_ranks < 1:
        raise ValueError("n_ranks must be >= 1")
    if len(t) and (assignment.min() < 0 or assignment.max() >= n_ranks):
        raise ValueError(f"sharding places a table on a rank outside 0..{n_ranks - 1}")
    if spec.batch_size % n_ranks:
        raise ValueError(f"global batch {spec.batch_size} is not divisible by {n_ranks} ranks")
    if mode == "host":
        return _build_host_graph(spec, assignment, n_ranks, comm_threads)
    return _build_device_graph(spec, assignment, n_ranks, mode)


def _device_ddp_buckets(spec: DLRMSpec) -> tuple[list[list[str]], list[int]]:
    """DDP buckets of the device graph (layer names, backward order: top MLP last layer first; the
    same on every rank) and their bytes."""
    dt = spec.dtype_bytes
    grad_layers = [(name, i * o + o) for name, i, o in reversed(spec.mlp_layers())]
    buckets: list[list[str]] = [[]]
    acc = 0
    for name, count in grad_layers:
        if acc and acc + count * dt > spec.ddp_bucket_bytes:
            buckets.append([])
            acc = 0
        buckets[-1].append(name)
        acc += count * dt
    bucket_bytes = [sum(c for n, c in grad_layers if n in names) * dt for names in buckets]
    return buckets, bucket_bytes


def _build_device_graph(spec: DLRMSpec, assignment: np.ndarray, n_ranks: int, mode: ExecMode) -> ExecutionGraph:
    """Device mode: per rank, kernels launched onto the compute stream, the all-to-alls and DDP's
    bucket all-reduces on the communication stream (assembled by :class:`DLRMGraphTemplate`)."""
    return DLRMGraphTemplate(spec, n_ranks, mode).graph(assignment)


class DLRMGraphTemplate:
    """The device-mode iteration of one :class:`DLRMSpec` on ``n_ranks`` ranks, for any table placement.

    Every rank runs the same program but for its tables: the head (``zero_grad``), one forward
    piece per local table (the lookup op), the dense middle (forward all-to-all, MLPs, interaction,
    loss, backward with DDP's bucket all-reduces, backward all-to-all), one backward piece per local
    table (lookup backward, its sparse update) and the tail (the dense optimizer step). The
    constructor emits these once, op by op on rank 0, as a *pool* holding every table's pieces;
    :meth:`graph` lays out each rank's copy of them in program order with one gather per column
    (about 0.1 ms for 4 ranks x 60 tables, against 20 ms emitting the tasks one by one), and is
    task for task the graph the op-by-op emission of every rank gives.
    """

    def __init__(self, spec: DLRMSpec, n_ranks: int, mode: ExecMode = "device") -> None:
        if n_ranks < 1:
            raise ValueError("n_ranks must be >= 1")
        self.spec, self.n_ranks = spec, n_ranks
        n_tables = len(spec.tables)
        pb = GraphBuilder()
        g_a2a_fwd = pb.new_group()
        buckets, bucket_bytes = _device_ddp_buckets(spec)
        bucket_of = {name: i for i, names in enumerate(buckets) for name in names}
        g_buckets = [pb.new_group() for _ in buckets]
        g_a2a_bwd = pb.new_group()
        e = OpEmitter(pb, 0, mode)
        a2a = {"msg_bytes": 0.0, "world": n_ranks, "dtype_bytes": spec.dtype_bytes}  # msg_bytes set per placement
        e.node("optimizer.zero_grad")
        self.head = pb.n_tasks
        fwd_kernels = [_table_forward(e, spec, ti) for ti in range(n_tables)]
        self.fwd_end = pb.n_tasks
        ddp = _DDPState(buckets, bucket_of, bucket_bytes, g_buckets, n_ranks, spec.dtype_bytes, {}, [])
        a2a_f, a2a_b = _dense_step(e, spec, n_ranks, a2a, g_a2a_fwd if n_ranks > 1 else -1, g_a2a_bwd, ddp)
        self.mid_end = pb.n_tasks
        bwd_kernels = [_table_backward(e, spec, ti, after=()) for ti in range(n_tables)]
        self.bwd_end = pb.n_tasks
        e.op("optimizer.step", _optimizer_kernels(spec), after=ddp.all_reduces)
        self.pool = pb.build()
        n_pool = self.pool.n_tasks
        #: tasks of one table's forward / backward piece, and its (first) kernel inside the piece
        self.nf = (self.fwd_end - self.head) // n_tables if n_tables else 0
        self.nb = (self.bwd_end - self.mid_end) // n_tables if n_tables else 0
        self.kf = fwd_kernels[0] - self.head if n_tables else 0
        self.kb = bwd_kernels[0] - self.mid_end if n_tables else 0
        self.a2a = [a2a_f[0] - self.fwd_end] + ([a2a_b[0] - self.fwd_end] if a2a_b else [])  # in the middle
        # pool edges by the region of their source: the fixed ones (head, middle, tail; replicated per rank,
        # position = rank base + offset + tables on the rank x coefficient) and those of the table pieces
        src, dst, kind = self.pool.edge_src.astype(np.int64), self.pool.edge_dst.astype(np.int64), self.pool.edge_kind
        in_fwd = (src >= self.head) & (src < self.fwd_end)
        in_bwd = (src >= self.mid_end) & (src < self.bwd_end)
        fixed = ~(in_fwd | in_bwd)
        off, coef = self._fixed_layout(n_pool)
        #: the head, middle and tail pool tasks, their offsets in a rank's segment and their table coefficients
        self.fixed_pool = np.concatenate([np.arange(self.head), np.arange(self.fwd_end, self.mid_end),
                                          np.arange(self.bwd_end, n_pool)])
        self.fixed_off, self.fixed_coef = off[self.fixed_pool], coef[self.fixed_pool]
        self.fixed_edges = (off[src[fixed]], coef[src[fixed]], off[dst[fixed]], coef[dst[fixed]], kind[fixed])
        self.fwd_edges = self._piece_edges(src[in_fwd], dst[in_fwd], kind[in_fwd], self.head, self.nf, n_tables)
        self.bwd_edges = self._piece_edges(src[in_bwd], dst[in_bwd], kind[in_bwd], self.mid_end, self.nb, n_tables)
        self.params = np.stack(list(self.pool.params.values())) if self.pool.params else np.zeros((0, n_pool))
        self.param_keys = list(self.pool.params)

    def _fixed_layout(self, n_pool: int) -> tuple[np.ndarray, np.ndarray]:
        """Offset in a rank's segment of each head / middle / tail pool task, and the per-local-table
        tasks that precede it (0 for the head, one forward piece per table for the middle, both pieces
        for the tail)."""
        off = np.zeros(n_pool, dtype=np.int64)
        coef = np.zeros(n_pool, dtype=np.int64)
        mid = np.arange(self.fwd_end, self.mid_end)
        tail = np.arange(self.bwd_end, n_pool)
        off[: self.head] = np.arange(self.head)
        off[mid] = mid - self.fwd_end + self.head
        coef[mid] = self.nf
        off[tail] = tail - self.bwd_end + self.head + (self.mid_end - self.fwd_end)
        coef[tail] = self.nf + self.nb
        return off, coef

    @staticmethod
    def _piece_edges(src: np.ndarray, dst: np.ndarray, kind: np.ndarray, start: int, size: int,
                     n_tables: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The edges of one table's piece (offsets inside it): every table's piece has the same."""
        per = src.size // n_tables if n_tables else 0
        if per * n_tables != src.size:
            raise AssertionError("table pieces differ in their edges")
        return (src[:per] - start, dst[:per] - start, kind[:per])

    def graph(self, assignment: np.ndarray) -> ExecutionGraph:
        """The iteration graph of ``assignment`` (table -> rank)."""
        return self.assemble(assignment)[0]

    def processor_seconds(self, pool_seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Busy seconds of each processor of a rank (CPU thread, compute stream, communication stream) given
        the pool's task durations: (what every rank runs, shape (3,); what each table adds to its rank,
        shape (tables, 3)). The all-to-alls count with the pool's durations."""
        pool = self.pool
        n_procs, n_tables = pool.n_procs, len(self.spec.tables)
        fixed = np.ones(pool.n_tasks, dtype=bool)
        fixed[self.head:self.fwd_end] = False
        fixed[self.mid_end:self.bwd_end] = False
        base = np.bincount(pool.proc[fixed], weights=pool_seconds[fixed], minlength=n_procs)
        per_table = np.zeros((n_tables, n_procs))
        for start, size in ((self.head, self.nf), (self.mid_end, self.nb)):
            if n_tables and size:
                rows = start + size * np.arange(n_tables)[:, None] + np.arange(size)
                for p in range(n_procs):
                    per_table[:, p] += np.where(pool.proc[rows] == p, pool_seconds[rows], 0.0).sum(axis=1)
        return base, per_table

    def assemble(self, assignment: np.ndarray, *, params: bool = True) -> tuple[ExecutionGraph, np.ndarray, np.ndarray]:
        """The iteration graph of ``assignment`` (table -> rank), the pool task each of its tasks copies,
        and its all-to-all tasks (the only tasks whose parameters depend on the placement).
        ``params=False`` leaves out the kernel parameters (a graph to simulate with known durations)."""
        spec, n, pool = self.spec, self.n_ranks, self.pool
        a = np.asarray(assignment, dtype=np.int64)
        n_tables = len(spec.tables)
        counts = np.bincount(a, minlength=n)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        order = np.argsort(a, kind="stable")  # tables by rank, in index order on each
        k = np.empty(n_tables, dtype=np.int64)
        k[order] = np.arange(n_tables) - first[a[order]]  # place of each table among its rank's
        mid = self.mid_end - self.fwd_end
        size = self.head + mid + (pool.n_tasks - self.bwd_end) + (self.nf + self.nb) * counts
        base = np.concatenate([[0], np.cumsum(size)[:-1]])
        total = int(size.sum())
        sel = np.empty(total, dtype=np.int64)  # pool task of every task of the graph
        sel[(base[:, None] + self.fixed_off + counts[:, None] * self.fixed_coef).ravel()] = np.tile(self.fixed_pool, n)
        pos_f = base[a] + self.head + self.nf * k  # first task of each table's forward piece
        pos_b = base[a] + self.head + self.nf * counts[a] + mid + self.nb * k
        tables = np.arange(n_tables)[:, None]
        sel[(pos_f[:, None] + np.arange(self.nf)).ravel()] = (self.head + self.nf * tables + np.arange(self.nf)).ravel()
        sel[(pos_b[:, None] + np.arange(self.nb)).ravel()] = (self.mid_end + self.nb * tables + np.arange(self.nb)).ravel()
        rank = np.repeat(np.arange(n, dtype=np.int32), size)
        n_procs = pool.n_procs
        # edges: fixed ones per rank, the table pieces', then the placement's own (after the launch edge of their
        # target, as emitted), ordered by target as the op-by-op emission appends them
        fo_s, fc_s, fo_d, fc_d, fk = self.fixed_edges
        srcs = [(base[:, None] + fo_s + counts[:, None] * fc_s).ravel(), (pos_f[:, None] + self.fwd_edges[0]).ravel(),
                (pos_b[:, None] + self.bwd_edges[0]).ravel()]
        dsts = [(base[:, None] + fo_d + counts[:, None] * fc_d).ravel(), (pos_f[:, None] + self.fwd_edges[1]).ravel(),
                (pos_b[:, None] + self.bwd_edges[1]).ravel()]
        kinds = [np.tile(fk, n), np.tile(self.fwd_edges[2], n_tables), np.tile(self.bwd_edges[2], n_tables)]
        holding = np.flatnonzero(counts)
        a2a_pos = base[:, None] + self.head + self.nf * counts[:, None] + np.asarray(self.a2a)[None, :]
        if holding.size:  # the forward all-to-all after the rank's last lookup; the first backward lookup after
            last = order[first[holding] + counts[holding] - 1]  # the backward all-to-all
            srcs.append(pos_f[last] + self.kf)
            dsts.append(a2a_pos[holding, 0])
            kinds.append(np.full(holding.size, int(DepKind.GPU_GPU), dtype=np.int8))
            if len(self.a2a) > 1:
                srcs.append(a2a_pos[holding, 1])
                dsts.append(pos_b[order[first[holding]]] + self.kb)
                kinds.append(np.full(holding.size, int(DepKind.GPU_GPU), dtype=np.int8))
        src, dst, ekind = np.concatenate(srcs), np.concatenate(dsts), np.concatenate(kinds)
        by_dst = np.argsort(dst, kind="stable")
        cols = dict(zip(self.param_keys, self.params[:, sel], strict=True)) if params else {}
        a2a_tasks = a2a_pos.ravel()
        if "msg_bytes" in cols:
            cols["msg_bytes"][a2a_tasks] = all_to_all_message_bytes(spec, a, n) if n > 1 else 0.0
        graph = ExecutionGraph(
            rank=rank,
            proc=pool.proc[sel] + n_procs * rank,
            name=pool.name[sel],
            kind=pool.kind[sel],
            category=pool.category[sel],
            overhead=pool.overhead[sel],
            duration=pool.duration[sel],
            flops=pool.flops[sel],
            bytes=pool.bytes[sel],
            group=pool.group[sel],
            params=cols,
            proc_rank=np.repeat(np.arange(n, dtype=np.int32), n_procs),
            proc_kind=np.tile(pool.proc_kind, n),
            proc_names=list(pool.proc_names) * n,
            edge_src=src[by_dst].astype(np.int32),
            edge_dst=dst[by_dst].astype(np.int32),
            edge_kind=ekind[by_dst].astype(np.int8),
            names=list(pool.names),
            kinds=list(pool.kinds),
            meta={"workload": "dlrm", "n_ranks": n, "batch_size": spec.batch_size, "label": spec.label},
        )
        return graph, sel, a2a_tasks


def _table_forward(e: OpEmitter, spec: DLRMSpec, ti: int) -> int:
    """The lookup op of table ``ti`` (global batch); returns its kernel."""
    return e.op(f"embedding_bag[{ti}]", [_table_kernel(spec, ti, "fwd")])[0]


def _table_backward(e: OpEmitter, spec: DLRMSpec, ti: int, after: Sequence[int]) -> int:
    """The backward of table ``ti`` with its sparse update; returns the backward kernel."""
    k = e.op(f"embedding_bag_backward[{ti}]", [_table_kernel(spec, ti, "bwd")], after=after)[0]
    if e.mode == "device":
        # AccumulateGrad and SGD's ``add_`` of the sparse gradient (the update is in a post-accumulate
        # hook, or in the optimizer's per-tensor loop): one op launching the row update, whose time is
        # already inside embedding_bag_bwd's (calibrated as backward + row update)
        e.op(f"embedding_bag[{ti}].accumulate_grad", [(f"embedding_bag_update[{ti}]", "embedding_bag_update",
                                                       Category.MEMORY, {"elements": 0.0, "bytes": 0.0})])
        e.sparse_table(f"embedding_bag[{ti}].sparse_host")
    return k


def _dense_step(e: OpEmitter, spec: DLRMSpec, n_ranks: int, a2a: dict, group_fwd: int, group_bwd: int,
                ddp: _DDPState) -> tuple[list[int], list[int]]:
    """One rank's work between its lookups and its lookups' backward: the forward all-to-all, bottom MLP,
    interaction (after the all-to-all), top MLP, loss, and the backward of all of them with DDP's
    bucket all-reduces and the gradient all-to-all; returns the two all-to-alls' tasks."""
    dt, t = spec.dtype_bytes, spec.tables
    b_local = float(spec.batch_size) / n_ranks
    layers = spec.mlp_layers()
    n_bottom = len(spec.bottom_mlp)
    a2a_f = e.op("all_to_all_fwd", [("all_to_all", "all_to_all", Category.COMMUNICATION, dict(a2a))],
                 comm=True, group=group_fwd)
    for name, i, o in layers[:n_bottom]:
        e.op(f"{name}.linear", [gemm(f"{name}.addmm", b_local, o, i, dt)])
        e.op(f"{name}.relu", [eltwise(f"{name}.relu", "relu", b_local * o, dt)])
    width = spec.interaction_width()
    if spec.interaction == "dot":
        tt = len(t) + 1
        d = int(spec.bottom_mlp[-1])
        e.op("interaction", [("interaction.bmm", "gemm", Category.COMPUTE,
                              {"m": tt, "n": tt, "k": d, "batch": b_local, "dtype_bytes": dt,
                               "flops": 2.0 * tt * tt * d * b_local}),
                             eltwise("interaction.tril", "interaction", b_local * width, dt)],
             after=a2a_f)
    else:
        e.op("interaction", [concat("interaction.cat", b_local, width, len(t) + 1, dt)], after=a2a_f)
    for name, i, o in layers[n_bottom:]:
        e.op(f"{name}.linear", [gemm(f"{name}.addmm", b_local, o, i, dt)])
        e.op(f"{name}.act", [eltwise(f"{name}.relu", "relu", b_local * o, dt)])
    e.op("loss", [eltwise("bce_loss", "loss", b_local, dt, rw=4.0)])
    backward_entry(e, dt)
    e.op("loss.backward", [eltwise("bce_loss_bwd", "loss", b_local, dt, rw=4.0)])
    a2a_b: list[int] = []
    for name, i, o in reversed(layers[n_bottom:]):
        _backward_layer(e, ddp, name, i, o, b_local, first=False)
    inter_b = e.op("interaction.backward", [eltwise("interaction_bwd", "interaction", b_local * width, dt, rw=3.0)])
    if n_ranks > 1:
        a2a_b = e.op("all_to_all_bwd", [("all_to_all", "all_to_all", Category.COMMUNICATION, dict(a2a))],
                     comm=True, after=inter_b, group=group_bwd)
    for li, (name, i, o) in enumerate(reversed(layers[:n_bottom])):
        _backward_layer(e, ddp, name, i, o, b_local, first=li == n_bottom - 1)
    return a2a_f, a2a_b


def _optimizer_kernels(spec: DLRMSpec) -> list:
    """The dense parameters' update: one foreach op (multi_tensor_apply launches), the optimizer's
    default on a device; adagrad's state is a third tensor list (read and written)."""
    adagrad = spec.optimizer == "adagrad"
    return foreach("sgd_update", "optimizer", [n for _, n in layer_tensors(spec.mlp_layers())], spec.dtype_bytes,
                   lists=3 if adagrad else 2, rw=5.0 if adagrad else 3.0)


# ============================================================================ host mode (CPU)
#: gloo's ProcessGroupGloo runs collectives on this many worker threads (PyTorch default)
GLOO_WORKER_THREADS = 2
#: DDP's first gradient bucket closes at 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``)
DDP_FIRST_BUCKET_BYTES = 2**20


def ddp_buckets(layers: Sequence[tuple[str, int, int]], dtype_bytes: int, cap_bytes: int,
                first_bytes: int = DDP_FIRST_BUCKET_BYTES) -> list[list[str]]:
    """DDP's gradient buckets (layer names, backward order) after its first-iteration rebuild.

    Parameters are taken in the order their gradients become ready (last layer first; bias,
    then weight) and a bucket closes as soon as it holds at least its limit: ``first_bytes``
    for the first bucket, ``cap_bytes`` after (``Reducer`` / ``_compute_bucket_assignment_by_size``).
    A layer whose bias and weight straddle a boundary is put whole in the bucket its weight lands
    in (both gradients come from the same backward op).
    """
    buckets: list[list[str]] = [[]]
    acc = 0
    limit = first_bytes
    for name, i, o in reversed(list(layers)):
        buckets[-1].append(name)
        acc += (i * o + o) * dtype_bytes
        if acc >= limit:
            buckets.append([])
            acc = 0
            limit = cap_bytes
    return [bk for bk in buckets if bk]


def _build_host_graph(spec: DLRMSpec, assignment: np.ndarray, n_ranks: int, comm_threads: bool = True) -> ExecutionGraph:
    """Host mode: what ``experiments/dlrm_gloo.py`` runs on CPU, op by op (eager PyTorch).

    Every op runs on the rank's main thread (T1 before it, its kernels after). Collectives run
    on gloo's worker threads (:data:`GLOO_WORKER_THREADS`, taken round-robin in issue order,
    which is how its FIFO work queue hands them out while earlier ones are still running); a
    blocking collective (the all-to-all) makes the main thread wait for it. Without
    ``comm_threads`` (no spare core for them) every collective runs on the main thread. With one rank
    there is no DDP and no all-to-all. Per rank:

    forward
        ``EmbeddingBag`` of each local table for the global batch; (``n > 1``) ``cat`` of the
        pooled vectors -> all-to-all (the main thread waits for it); bottom MLP (``addmm`` +
        ReLU) on the local batch; interaction ``cat`` of the bottom output with every table's
        vectors; top MLP (ReLU, sigmoid last); BCE loss.
    backward (autograd order: the most recently created node first)
        loss; top MLP layers (activation backward, ``AddmmBackward0``: dgrad ``mm``, wgrad
        ``mm``, bias sum); DDP copies each gradient into its bucket scaled by ``1/n`` (``mul``)
        and, when a bucket is full, all-reduces it asynchronously; the interaction's backward
        (views, no kernel); the bottom MLP likewise (it was created after the all-to-all, so it
        runs before it); (``n > 1``) the split's backward packs the embedding gradients
        (``cat``), the all-to-all of gradients (blocking); each table's backward with its SGD
        row update fused (the calibrated ``embedding_bag_bwd``), last table first; DDP waits
        for every all-reduce and copies the buckets back into the gradients (``memcpy``).
    optimizer
        SGD single-tensor loop over the MLP parameters (one ``add_`` each).
    """
    from predictor.sources.synth.mlp import activation_forward, layer_tensors, linear_forward, sgd_step

    t = spec.tables
    dt = spec.dtype_bytes
    B = float(spec.batch_size)
    b = B / n_ranks
    layers = spec.mlp_layers()
    n_bottom = len(spec.bottom_mlp)
    width = spec.interaction_width()
    dims_per_rank = np.bincount(assignment, weights=t.dim.astype(float), minlength=n_ranks)
    multi = n_ranks > 1
    #: embedding blocks the interaction concatenates: one per table (one rank), else one per rank
    #: holding tables (the all-to-all's output split by source)
    cat_blocks = int(np.count_nonzero(dims_per_rank)) if multi else len(t)
    a2a_params = {"msg_bytes": all_to_all_message_bytes(spec, assignment, n_ranks) if multi else 0.0,
                  "world": n_ranks, "dtype_bytes": dt}
    buckets = ddp_buckets(layers, dt, spec.ddp_bucket_bytes) if multi else []
    gb = GraphBuilder()
    g_a2a_fwd, g_a2a_bwd = (gb.new_group(), gb.new_group()) if multi else (-1, -1)
    g_buckets = [gb.new_group() for _ in buckets]

    for r in range(n_ranks):
        h = _HostRank(gb, r, n_ranks, spec, buckets, g_buckets, comm_threads)
        e = h.e
        local = np.flatnonzero(assignment == r)
        # ------------------------------------------------------------ forward
        for ti in local:
            e.op(f"embedding_bag[{ti}]", [_table_kernel(spec, int(ti), "fwd")])
        wait: list[int] = []
        if multi:
            e.op("cat(pooled)", [concat("cat_pooled", B, dims_per_rank[r], max(len(local), 1), dt)])
            wait = [h.collective("all_to_all_fwd", "all_to_all", dict(a2a_params), g_a2a_fwd, [])]
        for li, (name, i, o) in enumerate(layers):
            if li == n_bottom:
                # inputs: the bottom MLP's output and one block per table (one rank) or per rank
                # holding tables (the all-to-all's output, split by source rank)
                e.op("interaction", [concat("interaction.cat", b, width, 1 + cat_blocks, dt)])
            # the all-to-all blocks the main thread: the bottom MLP starts after it
            linear_forward(e, name, b, i, o, dt, after=wait if li == 0 else ())
            activation_forward(e, name, h.activation(li), b * o, dt)
        e.op("bce_loss", [eltwise("bce_loss", "loss", b, dt, rw=3.0)])
        # ------------------------------------------------------------ backward
        e.op("bce_loss.backward", [eltwise("bce_loss_bwd", "loss", b, dt, rw=4.0)])
        for li in reversed(range(len(layers))):  # top MLP, then bottom (created after the all-to-all)
            h.layer_backward(li)
        wait = []
        if multi:
            pack = e.op("split.backward", [concat("pack_embedding_grads", b, float(t.dim.sum()), n_ranks, dt)])
            wait = [h.collective("all_to_all_bwd", "all_to_all", dict(a2a_params), g_a2a_bwd, pack)]
        for j, ti in enumerate(local[::-1]):
            e.op(f"embedding_bag_backward[{ti}]", [_table_kernel(spec, int(ti), "bwd")], after=wait if j == 0 else ())
        after_ddp: list[int] = [] if len(local) else list(wait)
        for bi, names in enumerate(buckets):
            n_b = float(sum(h.layer_params[nm] for nm in names))
            after_ddp = e.op(f"ddp.copy_bucket_to_grad[{bi}]",
                             [eltwise(f"copy_bucket_to_grad[{bi}]", "memcpy", n_b, dt, rw=2.0)],
                             after=h.all_reduces + after_ddp)
        sgd_step(e, layer_tensors(layers), dt, after=after_ddp)
    gb.meta.update({"workload": "dlrm", "n_ranks": n_ranks, "batch_size": spec.batch_size, "label": spec.label,
                    "mode": "host"})
    return gb.build()


def embedding_bag_kernel(spec: DLRMSpec, ti: int, phase: str, batch: float, rows: float, dim: float,
                         pooling: float) -> tuple:
    """The embedding-bag kernel of (a shard of) table ``ti``: ``batch`` samples, ``rows`` x ``dim``
    elements, ``pooling`` lookups per sample, the table's reuse profile (``phase``: fwd or bwd)."""
    t = spec.tables
    p = {"batch": float(batch), "rows": float(rows), "dim": float(dim), "pooling": float(pooling),
         "dtype_bytes": float(t.dtype_bytes)}
    if t.reuse is not None:
        p.update({c: float(v) for c, v in zip(RF_COLUMNS, t.reuse[ti], strict=True)})
    return (f"embedding_bag_{phase}[{ti}]", f"embedding_bag_{phase}", Category.MEMORY, p)


def _table_kernel(spec: DLRMSpec, ti: int, phase: str) -> tuple:
    """The embedding-bag kernel of table ``ti`` for the global batch (``phase``: fwd or bwd)."""
    t = spec.tables
    return embedding_bag_kernel(spec, ti, phase, spec.batch_size, t.rows[ti], t.dim[ti], t.pooling[ti])


class GlooIssuer:
    """A host rank's collectives as gloo runs them: the main thread issues each one (a T1 overhead)
    onto the next of gloo's worker threads, round-robin, or runs it itself when the workers have no
    core of their own (``comm_threads`` False)."""

    def __init__(self, gb: GraphBuilder, rank: int, cpu: int, comm_threads: bool) -> None:
        self.gb, self.cpu, self.comm_threads = gb, cpu, comm_threads
        self.workers = [gb.processor(rank, ProcKind.CPU_THREAD, f"gloo worker {w}") for w in range(GLOO_WORKER_THREADS)]
        self.issued = 0

    def issue(self, name: str, kind: str, params: dict, group: int, after: Sequence[int]) -> int:
        """One collective task (after ``after`` and its issue overhead); returns its task id."""
        gb = self.gb
        issue = gb.task(self.cpu, "T1", "overhead", Category.CPU, overhead=Overhead.T1)
        w = self.workers[self.issued % len(self.workers)] if self.comm_threads else self.cpu
        self.issued += 1
        k = gb.task(w, name, kind, Category.COMMUNICATION, group=group, params=params)
        gb.edge(issue, k, DepKind.CPU_CPU)
        for a in after:
            gb.edge(a, k, DepKind.CPU_CPU)
        return k


class _HostRank:
    """One rank of the host-mode DLRM graph: its main thread, gloo workers and DDP state."""

    def __init__(self, gb: GraphBuilder, rank: int, n_ranks: int, spec: DLRMSpec, buckets: list[list[str]],
                 groups: list[int], comm_threads: bool = True) -> None:
        self.gb, self.spec, self.buckets, self.groups = gb, spec, buckets, groups
        self.world = n_ranks
        self.e = OpEmitter(gb, rank, "host")
        self.gloo = GlooIssuer(gb, rank, self.e.cpu, comm_threads)
        self.layers = spec.mlp_layers()
        self.layer_params = {name: i * o + o for name, i, o in self.layers}
        self.bucket_of = {name: i for i, names in enumerate(buckets) for name in names}
        self.ready: dict[int, float] = {}
        self.all_reduces: list[int] = []
        self.b_local = spec.batch_size / n_ranks

    def activation(self, li: int) -> str:
        return "sigmoid" if li == len(self.layers) - 1 else "relu"

    def collective(self, name: str, kind: str, params: dict, group: int, after: Sequence[int]) -> int:
        """Issue a collective from the main thread onto the next gloo worker (round-robin), or run
        it on the main thread when the workers have no core of their own."""
        return self.gloo.issue(name, kind, params, group, after)

    def layer_backward(self, li: int) -> None:
        """Activation backward, ``AddmmBackward0``; with DDP the gradient goes into its bucket and a
        full bucket is all-reduced."""
        from predictor.sources.synth.mlp import activation_backward, linear_backward

        e, dt = self.e, self.spec.dtype_bytes
        name, i, o = self.layers[li]
        world, b = self.world, self.b_local
        activation_backward(e, name, self.activation(li), b * o, dt)
        ks = linear_backward(e, name, b, i, o, dt, input_grad=li > 0)
        if world == 1:
            return
        n_p = float(self.layer_params[name])
        ks = e.op(f"{name}.ddp_grad_to_bucket", [eltwise(f"{name}.grad_to_bucket", "mul", n_p, dt, rw=2.0)],
                  after=ks[-1:])
        bi = self.bucket_of[name]
        self.ready[bi] = self.ready.get(bi, 0.0) + n_p
        if name == self.buckets[bi][-1]:
            msg = {"msg_bytes": self.ready[bi] * dt, "world": world, "dtype_bytes": dt}
            self.all_reduces.append(self.collective(f"ddp.all_reduce[{bi}]", "all_reduce", msg, self.groups[bi],
                                                    ks[-1:]))
