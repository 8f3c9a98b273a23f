"""The DLRM iteration under any TorchRec sharding type (table-, column-, row-, table-row-wise, data-parallel).

:func:`build_sharded_dlrm_graph` is :func:`predictor.sources.synth.dlrm.build_dlrm_graph` for a
:class:`~predictor.sources.synth.dlrm_sharding.ShardedPlacement`: the same dense program (MLPs, DDP
buckets, loss, optimizer) around an embedding exchange with one collective per pattern, as TorchRec
runs them:

forward
    each rank's lookups (:func:`~predictor.sources.synth.dlrm_sharding.lookup_shards`: all-to-all
    shards, row-wise shards, data-parallel replicas) -> the pooled all-to-all of table- and
    column-wise shards; one reduce-scatter per row-wise group -> bottom MLP -> interaction (waits
    for both) -> top MLP -> loss
backward
    top MLP (DDP buckets) -> interaction -> gradient all-to-all and the row-wise all-gathers ->
    bottom MLP -> the shards' backward (each waits for its exchange); data-parallel replicas'
    dense gradients are all-reduced and applied with the dense optimizer step.

``mode="host"`` mirrors ``experiments/dlrm_gloo.py``'s ``ShardedEmbeddings`` (blocking all-to-all
and reduce-scatter on gloo's threads, the replicas' all-reduce issued from their gradient hook and
waited for before the optimizer). Units: bytes, elements, seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from predictor.graph import Category, ExecutionGraph, GraphBuilder
from predictor.sources.synth.dlrm import DLRMSpec, GlooIssuer, ddp_buckets, embedding_bag_kernel
from predictor.sources.synth.dlrm_sharding import LookupShard, ShardedPlacement, lookup_shards, sharded_comm
from predictor.sources.synth.emit import ExecMode, OpEmitter, column_sum, concat, eltwise, foreach, gemm
from predictor.sources.synth.mlp import (
    activation_backward,
    activation_forward,
    backward_entry,
    layer_tensors,
    linear_backward,
    linear_forward,
    linear_grad_nodes,
    sgd_step,
)

__all__ = ["build_sharded_dlrm_graph"]

OUT_ORDER = {"a2a": 0, "reduce_scatter": 1, "local": 2}


def _lookup_kernel(spec: DLRMSpec, s: LookupShard, phase: str) -> tuple:
    """The embedding-bag kernel of one shard (``phase``: fwd or bwd)."""
    return embedding_bag_kernel(spec, s.table, phase, s.batch, s.rows, s.cols, s.pooling)


class _Rank:
    """One rank's emitter, collectives (device: comm stream; host: gloo's worker threads, round-robin,
    or the main thread without a core for them) and DDP buckets."""

    def __init__(self, gb: GraphBuilder, rank: int, spec: DLRMSpec, n: int, mode: ExecMode, comm_threads: bool,
                 buckets: list[list[str]], groups: list[int]) -> None:
        self.gb, self.spec, self.n, self.mode = gb, spec, n, mode
        self.e = OpEmitter(gb, rank, mode)
        self.gloo = GlooIssuer(gb, rank, self.e.cpu, comm_threads) if mode == "host" else None
        self.buckets, self.groups = buckets, groups
        self.bucket_of = {name: i for i, names in enumerate(buckets) for name in names}
        self.layers = spec.mlp_layers()
        self.params = {name: i * o + o for name, i, o in self.layers}
        self.ready: dict[int, float] = {}
        self.all_reduces: list[int] = []

    def collective(self, name: str, kind: str, msg: float, group: int, after: Sequence[int], world: int) -> list[int]:
        """One collective; device: on the comm stream after ``after``; host: issued by the main thread."""
        params = {"msg_bytes": float(msg), "world": world, "dtype_bytes": self.spec.dtype_bytes}
        if self.mode == "device":
            return self.e.op(name, [(name, kind, Category.COMMUNICATION, params)], comm=True, after=after, group=group)
        return [self.gloo.issue(name, kind, params, group, after)]

    def activation(self, li: int) -> str:
        return "sigmoid" if self.mode == "host" and li == len(self.layers) - 1 else "relu"

    def layer_forward(self, li: int, after: Sequence[int]) -> None:
        e, dt, b = self.e, self.spec.dtype_bytes, self.spec.batch_size / self.n
        name, i, o = self.layers[li]
        if self.mode == "host":
            linear_forward(e, name, b, i, o, dt, after=after)
            activation_forward(e, name, self.activation(li), b * o, dt)
        else:
            e.op(f"{name}.linear", [gemm(f"{name}.addmm", b, o, i, dt)], after=after)
            e.op(f"{name}.relu", [eltwise(f"{name}.relu", "relu", b * o, dt)])

    def layer_backward(self, li: int) -> None:
        """Activation and linear backward; the gradient into its DDP bucket, a full bucket all-reduced."""
        e, dt, b = self.e, self.spec.dtype_bytes, self.spec.batch_size / self.n
        name, i, o = self.layers[li]
        if self.mode == "host":
            activation_backward(e, name, self.activation(li), b * o, dt)
            ks = linear_backward(e, name, b, i, o, dt, input_grad=li > 0)
        else:
            e.op(f"{name}.act.backward", [eltwise(f"{name}.relu_bwd", "relu_bwd", b * o, dt, rw=3.0)])
            kernels = [gemm(f"{name}.wgrad", o, i, b, dt, k_strided=True), column_sum(f"{name}.bias_grad", b, o, dt)]
            if li > 0:
                kernels.insert(0, gemm(f"{name}.dgrad", b, i, o, dt))
            ks = e.op(f"{name}.linear.backward", kernels)
            linear_grad_nodes(e, name)
        if self.n == 1:
            return
        if self.mode == "host":
            ks = e.op(f"{name}.ddp_grad_to_bucket", [eltwise(f"{name}.grad_to_bucket", "mul", self.params[name], dt,
                                                             rw=2.0)], after=ks[-1:])
        bi = self.bucket_of[name]
        self.ready[bi] = self.ready.get(bi, 0.0) + self.params[name]
        if name == self.buckets[bi][-1]:
            self.all_reduces += self.collective(f"ddp.all_reduce[{bi}]", "all_reduce", self.ready[bi] * dt,
                                                self.groups[bi], ks[-1:], self.n)


def _device_buckets(spec: DLRMSpec) -> list[list[str]]:
    """DDP buckets of the device program (layer names, last layer first, ``ddp_bucket_bytes`` each)."""
    buckets: list[list[str]] = [[]]
    acc = 0
    for name, i, o in reversed(spec.mlp_layers()):
        if acc and acc + (i * o + o) * spec.dtype_bytes > spec.ddp_bucket_bytes:
            buckets.append([])
            acc = 0
        buckets[-1].append(name)
        acc += (i * o + o) * spec.dtype_bytes
    return buckets


def build_sharded_dlrm_graph(spec: DLRMSpec, placement: ShardedPlacement, n_ranks: int, mode: ExecMode = "device",
                             comm_threads: bool = True) -> ExecutionGraph:
    """The per-rank ExecutionGraph of one training iteration under ``placement`` (see the module)."""
    if len(placement) != len(spec.tables):
        raise ValueError(f"sharding places {len(placement)} tables, the task has {len(spec.tables)}")
    if spec.batch_size % n_ranks:
        raise ValueError(f"global batch {spec.batch_size} is not divisible by {n_ranks} ranks")
    t, dt, n = spec.tables, spec.dtype_bytes, n_ranks
    B, b = float(spec.batch_size), spec.batch_size / n_ranks
    shards = sorted(lookup_shards(t, placement, n, spec.batch_size), key=lambda s: (s.rank, OUT_ORDER[s.output]))
    comm = sharded_comm(t, placement, n, spec.batch_size, dt)
    cols = comm["a2a_cols"]
    multi = n > 1
    a2a_msg = float(max((B * cols * dt).max(), b * cols.sum() * dt)) if multi else 0.0
    has_a2a = multi and cols.sum() > 0
    layers = spec.mlp_layers()
    n_bottom = len(spec.bottom_mlp)
    width = spec.interaction_width()
    buckets = (ddp_buckets(layers, dt, spec.ddp_bucket_bytes) if mode == "host" else _device_buckets(spec)) if multi else []
    gb = GraphBuilder()
    g_a2a = (gb.new_group(), gb.new_group()) if has_a2a else (-1, -1)
    g_rs = [(group, msg, gb.new_group(), gb.new_group()) for group, msg in comm["reduce_scatter"] if len(group) > 1]
    g_buckets = [gb.new_group() for _ in buckets]
    g_dp = gb.new_group() if multi and comm["dp_all_reduce_bytes"] > 0 else -1
    for r in range(n):
        h = _Rank(gb, r, spec, n, mode, comm_threads, buckets, g_buckets)
        e = h.e
        mine = [s for s in shards if s.rank == r]
        by_out = {k: [s for s in mine if s.output == k] for k in OUT_ORDER}
        my_rs = [x for x in g_rs if r in x[0]]
        e.node("optimizer.zero_grad")
        # ------------------------------------------------------------ forward
        last: dict[str, list[int]] = {}
        for s in mine:
            last[s.output] = e.op(f"embedding_bag[{s.table}]", [_lookup_kernel(spec, s, "fwd")])
        wait: list[int] = []
        if has_a2a:
            after = last.get("a2a", [])[-1:]
            if mode == "host":
                after = e.op("cat(pooled)", [concat("cat_pooled", B, cols[r], max(len(by_out["a2a"]), 1), dt)])
            wait += h.collective("all_to_all_fwd", "all_to_all", a2a_msg, g_a2a[0], after, n)
        for group, msg, g_f, _ in my_rs:
            after = last.get("reduce_scatter", [])[-1:]
            if mode == "host":
                w_rs = float(sum(s.cols for s in by_out["reduce_scatter"]))
                after = e.op("cat(row_wise)", [concat("cat_row_wise", B, w_rs, max(len(by_out["reduce_scatter"]), 1),
                                                      dt)])
            wait += h.collective("reduce_scatter_fwd", "reduce_scatter", msg, g_f, after, len(group))
        # the host's blocking collectives hold the main thread; a device's interaction waits for them
        blocks = int(np.count_nonzero(cols)) + len(my_rs) + len(by_out["local"]) if multi else len(t)
        for li in range(len(layers)):
            if li == n_bottom:
                if mode == "device" and spec.interaction == "dot":
                    tt = len(t) + 1
                    d = int(spec.bottom_mlp[-1])
                    e.op("interaction", [("interaction.bmm", "gemm", Category.COMPUTE,
                                          {"m": tt, "n": tt, "k": d, "batch": b, "dtype_bytes": dt,
                                           "flops": 2.0 * tt * tt * d * b}),
                                         eltwise("interaction.tril", "interaction", b * width, dt)], after=wait)
                elif mode == "device":
                    e.op("interaction", [concat("interaction.cat", b, width, len(t) + 1, dt)], after=wait)
                else:
                    e.op("interaction", [concat("interaction.cat", b, width, 1 + blocks, dt)])
            h.layer_forward(li, wait if (li == 0 and mode == "host") else ())
        if mode == "host":
            e.op("bce_loss", [eltwise("bce_loss", "loss", b, dt, rw=3.0)])
        else:
            e.op("loss", [eltwise("bce_loss", "loss", b, dt, rw=4.0)])
        # ------------------------------------------------------------ backward
        backward_entry(e, dt)
        e.op("bce_loss.backward" if mode == "host" else "loss.backward", [eltwise("bce_loss_bwd", "loss", b, dt, rw=4.0)])
        for li in reversed(range(n_bottom, len(layers))):
            h.layer_backward(li)
        if mode == "device":
            inter_b = e.op("interaction.backward", [eltwise("interaction_bwd", "interaction", b * width, dt, rw=3.0)])
        else:
            for li in reversed(range(n_bottom)):  # created after the exchange: its backward runs first
                h.layer_backward(li)
            inter_b = []
        got: dict[str, list[int]] = {}
        for group, msg, _, g_b in my_rs:  # created after the all-to-all: its backward runs first
            got["reduce_scatter"] = h.collective("all_gather_bwd", "all_gather", msg, g_b, inter_b, len(group))
        if has_a2a:
            after = inter_b
            if mode == "host":
                after = e.op("split.backward", [concat("pack_embedding_grads", b, float(cols.sum()), n, dt)])
            got["a2a"] = h.collective("all_to_all_bwd", "all_to_all", a2a_msg, g_a2a[1], after, n)
        if mode == "device":
            for li in reversed(range(n_bottom)):
                h.layer_backward(li)
        dp_grads: list[int] = []
        # autograd runs the lookups' backward last created first: replicas, row-wise, all-to-all shards
        for k in ("local", "reduce_scatter", "a2a") if mode == "host" else ("a2a", "reduce_scatter", "local"):
            todo = by_out[k][::-1] if mode == "host" else by_out[k]
            for j, s in enumerate(todo):
                ks = e.op(f"embedding_bag_backward[{s.table}]", [_lookup_kernel(spec, s, "bwd")],
                          after=got.get(k, []) if j == 0 else ())
                if k == "local":
                    # a replica's gradient is dense: zero-filled, then its rows accumulated
                    ks = e.op(f"embedding_bag[{s.table}].dense_grad",
                              [eltwise(f"dense_grad_fill[{s.table}]", "fill", s.rows * s.cols, dt, rw=1.0)], after=ks)
                    dp_grads += ks
                elif mode == "device":
                    e.op(f"embedding_bag[{s.table}].accumulate_grad",
                         [(f"embedding_bag_update[{s.table}]", "embedding_bag_update", Category.MEMORY,
                           {"elements": 0.0, "bytes": 0.0})])
                    e.sparse_table(f"embedding_bag[{s.table}].sparse_host")
        dp_elems = float(sum(s.rows * s.cols for s in by_out["local"]))
        dp_done = (h.collective("dp.all_reduce", "all_reduce", comm["dp_all_reduce_bytes"], g_dp, dp_grads[-1:], n)
                   if g_dp >= 0 and dp_grads else dp_grads[-1:])
        tensors = layer_tensors(layers) + ([("replicas", dp_elems)] if dp_elems else [])
        if mode == "device":
            e.op("optimizer.step", foreach("sgd_update", "optimizer", [x for _, x in tensors], dt,
                                           lists=3 if spec.optimizer == "adagrad" else 2,
                                           rw=5.0 if spec.optimizer == "adagrad" else 3.0),
                 after=h.all_reduces + dp_done)
            continue
        after_ddp: list[int] = [] if (by_out["a2a"] or by_out["reduce_scatter"]) else list(got.get("a2a", []))
        for bi, names in enumerate(buckets):
            n_b = float(sum(h.params[nm] for nm in names))
            after_ddp = e.op(f"ddp.copy_bucket_to_grad[{bi}]", [eltwise(f"copy_bucket_to_grad[{bi}]", "memcpy", n_b,
                                                                         dt, rw=2.0)], after=h.all_reduces + after_ddp)
        if dp_elems:
            after_ddp = e.op("replicas.sgd", [("replicas.add_", "add", Category.MEMORY,
                                               {"elements": dp_elems, "dtype_bytes": dt, "bytes": 3.0 * dp_elems * dt})],
                             after=after_ddp + dp_done)
        sgd_step(e, layer_tensors(layers), dt, after=after_ddp)
    gb.meta.update({"workload": "dlrm", "n_ranks": n, "batch_size": spec.batch_size, "label": spec.label,
                    "mode": mode, "sharding": "typed"})
    return gb.build()
