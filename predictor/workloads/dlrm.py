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
Units: bytes, elements, seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from predictor.graph import Category, ExecutionGraph, GraphBuilder
from predictor.kernels.embedding import RF_COLUMNS
from predictor.workloads.dlrm_tables import EmbeddingTables
from predictor.workloads.emit import ExecMode, OpEmitter, eltwise, gemm

__all__ = ["DLRMSpec", "build_dlrm_graph", "dlrm_memory_per_rank", "all_to_all_message_bytes"]

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


def dlrm_memory_per_rank(spec: DLRMSpec, assignment: np.ndarray, n_ranks: int) -> np.ndarray:
    """Device memory each rank needs (bytes): tables (+ optimizer state), MLP weights, gradients,
    optimizer state and DDP buckets, and the iteration's activations and communication buffers."""
    dt = spec.dtype_bytes
    t = spec.tables
    table_bytes = t.rows.astype(float) * t.dim * t.dtype_bytes
    if spec.optimizer == "adagrad":
        table_bytes = table_bytes + t.rows.astype(float) * 4  # row-wise adagrad state
    per_rank_tables = np.bincount(assignment, weights=table_bytes, minlength=n_ranks)
    params = spec.mlp_param_count() * dt
    opt_state = params if spec.optimizer == "adagrad" else 0
    dense = params * 3 + opt_state  # weights, grads, DDP bucket copies
    b = spec.batch_size / n_ranks
    acts = sum(b * (i + 2 * o) * dt for _, i, o in spec.mlp_layers())
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
    e.op(f"{name}.act.backward", [eltwise(f"{name}.relu_bwd", "relu", b_local * o, dt, rw=3.0)])
    kernels = [gemm(f"{name}.wgrad", o, i, b_local, dt), eltwise(f"{name}.bias_grad", "elementwise", b_local * o, dt, rw=1.0)]
    if not first:
        kernels.insert(0, gemm(f"{name}.dgrad", b_local, i, o, dt))
    ks = e.op(f"{name}.linear.backward", kernels)
    bi = ddp.bucket_of[name]
    ddp.bucket_last[bi] = ks[-1]
    if name == ddp.buckets[bi][-1] and ddp.n_ranks > 1:  # bucket complete: DDP launches its all-reduce
        params = {"msg_bytes": ddp.bucket_bytes[bi], "world": ddp.n_ranks, "dtype_bytes": dt}
        ddp.all_reduces.extend(
            e.op(f"ddp.all_reduce[{bi}]", [("all_reduce", "all_reduce", Category.COMMUNICATION, params)],
                 comm=True, async_op=True, after=[ddp.bucket_last[bi]], group=ddp.groups[bi])
        )


def build_dlrm_graph(spec: DLRMSpec, assignment: np.ndarray, n_ranks: int, mode: ExecMode = "device") -> ExecutionGraph:
    """The per-rank ExecutionGraph of one training iteration under ``assignment`` (table -> rank).

    ``mode``: ``"device"`` for accelerators (async kernels on streams), ``"host"`` for CPU
    platforms (ops run on the calling thread; DDP all-reduce on gloo's thread) — see
    :mod:`predictor.workloads.emit`.
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
    dt = spec.dtype_bytes
    B = float(spec.batch_size)
    b_local = B / n_ranks
    layers = spec.mlp_layers()
    n_bottom = len(spec.bottom_mlp)
    rf = t.reuse if t.reuse is not None else None
    a2a_bytes = all_to_all_message_bytes(spec, assignment, n_ranks) if n_ranks > 1 else 0.0
    comm_params = {"msg_bytes": a2a_bytes, "world": n_ranks, "dtype_bytes": dt}

    gb = GraphBuilder()
    g_a2a_fwd = gb.new_group()
    # DDP buckets are formed in backward order (top MLP last layer first), same on every rank
    grad_layers = [(name, i * o + o) for name, i, o in reversed(layers)]
    buckets: list[list[str]] = [[]]
    acc = 0
    for name, count in grad_layers:
        if acc and acc + count * dt > spec.ddp_bucket_bytes:
            buckets.append([])
            acc = 0
        buckets[-1].append(name)
        acc += count * dt
    bucket_bytes = [sum(c for n, c in grad_layers if n in names) * dt for names in buckets]
    bucket_of = {name: i for i, names in enumerate(buckets) for name in names}
    g_buckets = [gb.new_group() for _ in buckets]
    g_a2a_bwd = gb.new_group()

    for r in range(n_ranks):
        e = OpEmitter(gb, r, mode)
        local = np.flatnonzero(assignment == r)
        # ------------------------------------------------------------ forward
        emb_fwd: list[int] = []
        for ti in local:
            p = {"batch": B, "rows": float(t.rows[ti]), "dim": float(t.dim[ti]), "pooling": float(t.pooling[ti]),
                 "dtype_bytes": float(t.dtype_bytes)}
            if rf is not None:
                p.update({c: float(v) for c, v in zip(RF_COLUMNS, rf[ti], strict=True)})
            emb_fwd += e.op(f"embedding_bag[{ti}]", [(f"embedding_bag_fwd[{ti}]", "embedding_bag_fwd", Category.MEMORY, p)])
        a2a_f = e.op("all_to_all_fwd", [("all_to_all", "all_to_all", Category.COMMUNICATION, dict(comm_params))],
                     comm=True, after=emb_fwd[-1:], group=g_a2a_fwd if n_ranks > 1 else -1)
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
            e.op("interaction", [eltwise("interaction.cat", "concat", b_local * width, dt)], after=a2a_f)
        for name, i, o in layers[n_bottom:]:
            e.op(f"{name}.linear", [gemm(f"{name}.addmm", b_local, o, i, dt)])
            e.op(f"{name}.act", [eltwise(f"{name}.relu", "relu", b_local * o, dt)])
        e.op("loss", [eltwise("bce_loss", "loss", b_local, dt, rw=4.0)])
        # ------------------------------------------------------------ backward
        e.op("loss.backward", [eltwise("bce_loss_bwd", "loss", b_local, dt, rw=4.0)])
        bucket_last: dict[int, int] = {}
        ar_kernels: list[int] = []
        a2a_b: list[int] = []

        ddp = _DDPState(buckets, bucket_of, bucket_bytes, g_buckets, n_ranks, dt, bucket_last, ar_kernels)
        for name, i, o in reversed(layers[n_bottom:]):
            _backward_layer(e, ddp, name, i, o, b_local, first=False)
        inter_b = e.op("interaction.backward", [eltwise("interaction_bwd", "interaction", b_local * width, dt, rw=3.0)])
        if n_ranks > 1:
            a2a_b = e.op("all_to_all_bwd", [("all_to_all", "all_to_all", Category.COMMUNICATION, dict(comm_params))],
                         comm=True, after=inter_b, group=g_a2a_bwd)
        for li, (name, i, o) in enumerate(reversed(layers[:n_bottom])):
            _backward_layer(e, ddp, name, i, o, b_local, first=li == n_bottom - 1)
        first_emb = True
        for ti in local:
            p = {"batch": B, "rows": float(t.rows[ti]), "dim": float(t.dim[ti]), "pooling": float(t.pooling[ti]),
                 "dtype_bytes": float(t.dtype_bytes)}
            if rf is not None:
                p.update({c: float(v) for c, v in zip(RF_COLUMNS, rf[ti], strict=True)})
            e.op(f"embedding_bag_backward[{ti}]",
                 [(f"embedding_bag_bwd[{ti}]", "embedding_bag_bwd", Category.MEMORY, p)],
                 after=a2a_b if first_emb else ())
            first_emb = False
        n_params = spec.mlp_param_count()
        rw = 5.0 if spec.optimizer == "adagrad" else 3.0
        e.op("optimizer.step", [eltwise("sgd_update", "optimizer", n_params, dt, rw=rw)], after=ar_kernels)
    gb.meta.update({"workload": "dlrm", "n_ranks": n_ranks, "batch_size": spec.batch_size, "label": spec.label})
    return gb.build()
