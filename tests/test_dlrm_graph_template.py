"""The vectorised DLRM device graph (:class:`DLRMGraphTemplate`) against the op-by-op emission of every rank.

``_reference_graph`` below is the task-by-task builder the template replaced (each rank's program emitted
op by op through :class:`OpEmitter`); the template must give the same tasks in the same order, the same
edges and groups, and so the same simulated iteration.
"""

from __future__ import annotations

import numpy as np
import pytest

from predictor.graph import Category, GraphBuilder
from predictor.simulate import simulate
from predictor.sources.synth.dlrm import (
    DLRMGraphTemplate,
    DLRMSpec,
    all_to_all_message_bytes,
    build_dlrm_graph,
)
from predictor.sources.synth.dlrm_tables import EmbeddingTables, generate_tasks
from predictor.sources.synth.emit import OpEmitter, column_sum, concat, eltwise, foreach, gemm
from predictor.sources.synth.mlp import backward_entry, layer_tensors, linear_grad_nodes
from predictor.timing.kernels import ModelTiming
from predictor.timing.kernels.embedding import RF_COLUMNS
from predictor.timing.platforms import get_platform

A100 = get_platform("a100-80gb")


# ------------------------------------------------------------------ the op-by-op reference
def _kernel(spec, ti, phase):
    t = spec.tables
    p = {"batch": float(spec.batch_size), "rows": float(t.rows[ti]), "dim": float(t.dim[ti]),
         "pooling": float(t.pooling[ti]), "dtype_bytes": float(t.dtype_bytes)}
    if t.reuse is not None:
        p.update({c: float(v) for c, v in zip(RF_COLUMNS, t.reuse[ti], strict=True)})
    return (f"embedding_bag_{phase}[{ti}]", f"embedding_bag_{phase}", Category.MEMORY, p)


def _buckets(spec):
    dt = spec.dtype_bytes
    grad = [(name, i * o + o) for name, i, o in reversed(spec.mlp_layers())]
    buckets, acc = [[]], 0
    for name, count in grad:
        if acc and acc + count * dt > spec.ddp_bucket_bytes:
            buckets.append([])
            acc = 0
        buckets[-1].append(name)
        acc += count * dt
    return buckets, [sum(c for n, c in grad if n in names) * dt for names in buckets]


def _reference_graph(spec, assignment, n_ranks):
    dt, t = spec.dtype_bytes, spec.tables
    a2a = {"msg_bytes": all_to_all_message_bytes(spec, assignment, n_ranks) if n_ranks > 1 else 0.0,
           "world": n_ranks, "dtype_bytes": dt}
    gb = GraphBuilder()
    g_fwd = gb.new_group()
    buckets, bucket_bytes = _buckets(spec)
    bucket_of = {name: i for i, names in enumerate(buckets) for name in names}
    g_buckets = [gb.new_group() for _ in buckets]
    g_bwd = gb.new_group()
    b_local = float(spec.batch_size) / n_ranks
    layers, n_bottom = spec.mlp_layers(), len(spec.bottom_mlp)
    for r in range(n_ranks):
        e = OpEmitter(gb, r, "device")
        local = np.flatnonzero(assignment == r)
        last: dict[int, int] = {}
        all_reduces: list[int] = []

        def backward_layer(name, i, o, first, e=e, last=last, all_reduces=all_reduces):
            e.op(f"{name}.act.backward", [eltwise(f"{name}.relu_bwd", "relu_bwd", b_local * o, dt, rw=3.0)])
            kernels = [gemm(f"{name}.wgrad", o, i, b_local, dt, k_strided=True), column_sum(f"{name}.bias_grad", b_local, o, dt)]
            if not first:
                kernels.insert(0, gemm(f"{name}.dgrad", b_local, i, o, dt))
            ks = e.op(f"{name}.linear.backward", kernels)
            linear_grad_nodes(e, name)
            bi = bucket_of[name]
            last[bi] = ks[-1]
            if name == buckets[bi][-1] and n_ranks > 1:
                params = {"msg_bytes": bucket_bytes[bi], "world": n_ranks, "dtype_bytes": dt}
                all_reduces.extend(e.op(f"ddp.all_reduce[{bi}]", [("all_reduce", "all_reduce", Category.COMMUNICATION,
                                                                   params)], comm=True, after=[last[bi]],
                                        group=g_buckets[bi]))

        e.node("optimizer.zero_grad")
        emb = []
        for ti in local:
            emb += e.op(f"embedding_bag[{ti}]", [_kernel(spec, int(ti), "fwd")])
        a2a_f = e.op("all_to_all_fwd", [("all_to_all", "all_to_all", Category.COMMUNICATION, dict(a2a))],
                     comm=True, after=emb[-1:], group=g_fwd if n_ranks > 1 else -1)
        for name, i, o in layers[:n_bottom]:
            e.op(f"{name}.linear", [gemm(f"{name}.addmm", b_local, o, i, dt)])
            e.op(f"{name}.relu", [eltwise(f"{name}.relu", "relu", b_local * o, dt)])
        width = spec.interaction_width()
        if spec.interaction == "dot":
            tt, d = len(t) + 1, int(spec.bottom_mlp[-1])
            e.op("interaction", [("interaction.bmm", "gemm", Category.COMPUTE,
                                  {"m": tt, "n": tt, "k": d, "batch": b_local, "dtype_bytes": dt,
                                   "flops": 2.0 * tt * tt * d * b_local}),
                                 eltwise("interaction.tril", "interaction", b_local * width, dt)], after=a2a_f)
        else:
            e.op("interaction", [concat("interaction.cat", b_local, width, len(t) + 1, dt)], after=a2a_f)
        for name, i, o in layers[n_bottom:]:
            e.op(f"{name}.linear", [gemm(f"{name}.addmm", b_local, o, i, dt)])
            e.op(f"{name}.act", [eltwise(f"{name}.relu", "relu", b_local * o, dt)])
        e.op("loss", [eltwise("bce_loss", "loss", b_local, dt, rw=4.0)])
        backward_entry(e, dt)
        e.op("loss.backward", [eltwise("bce_loss_bwd", "loss", b_local, dt, rw=4.0)])
        a2a_b = []
        for name, i, o in reversed(layers[n_bottom:]):
            backward_layer(name, i, o, False)
        inter_b = e.op("interaction.backward", [eltwise("interaction_bwd", "interaction", b_local * width, dt, rw=3.0)])
        if n_ranks > 1:
            a2a_b = e.op("all_to_all_bwd", [("all_to_all", "all_to_all", Category.COMMUNICATION, dict(a2a))],
                         comm=True, after=inter_b, group=g_bwd)
        for li, (name, i, o) in enumerate(reversed(layers[:n_bottom])):
            backward_layer(name, i, o, li == n_bottom - 1)
        for j, ti in enumerate(local):
            e.op(f"embedding_bag_backward[{ti}]", [_kernel(spec, int(ti), "bwd")], after=a2a_b if j == 0 else ())
            e.op(f"embedding_bag[{ti}].accumulate_grad", [(f"embedding_bag_update[{ti}]", "embedding_bag_update",
                                                           Category.MEMORY, {"elements": 0.0, "bytes": 0.0})])
            e.sparse_table(f"embedding_bag[{ti}].sparse_host")
        adagrad = spec.optimizer == "adagrad"
        e.op("optimizer.step", foreach("sgd_update", "optimizer", [n for _, n in layer_tensors(layers)], dt,
                                       lists=3 if adagrad else 2, rw=5.0 if adagrad else 3.0), after=all_reduces)
    gb.meta.update({"workload": "dlrm", "n_ranks": n_ranks, "batch_size": spec.batch_size, "label": spec.label})
    return gb.build()


# ------------------------------------------------------------------ the comparison
def assert_same_graph(new, old):
    """Same tasks (strings resolved), processors, parameters, edges in the same order, groups and meta."""
    assert new.n_tasks == old.n_tasks and new.n_edges == old.n_edges
    for col in ("rank", "proc", "category", "overhead", "group"):
        np.testing.assert_array_equal(getattr(new, col), getattr(old, col), err_msg=col)
    for col in ("duration", "flops", "bytes"):
        np.testing.assert_array_equal(getattr(new, col), getattr(old, col), err_msg=col)
    assert [new.names[i] for i in new.name] == [old.names[i] for i in old.name]
    assert [new.kinds[i] for i in new.kind] == [old.kinds[i] for i in old.kind]
    assert sorted(new.params) == sorted(old.params)
    for key in old.params:
        np.testing.assert_array_equal(new.params[key], old.params[key], err_msg=key)
    np.testing.assert_array_equal(new.proc_rank, old.proc_rank)
    np.testing.assert_array_equal(new.proc_kind, old.proc_kind)
    assert new.proc_names == old.proc_names
    for col in ("edge_src", "edge_dst", "edge_kind"):
        np.testing.assert_array_equal(getattr(new, col), getattr(old, col), err_msg=col)
    assert new.meta == old.meta
    new.validate()


def _cases():
    tasks = generate_tasks(4, n_tasks=4, seed=3, device_memory_bytes=A100.memory_bytes, dataset="both")
    rng = np.random.default_rng(0)
    out = []
    for i, tables in enumerate(tasks):
        n_ranks = (4, 2, 4, 1)[i]
        a = rng.integers(0, n_ranks, len(tables))
        out.append((f"task{i}-{n_ranks}ranks", DLRMSpec(tables=tables, batch_size=1024 * (i + 1)), a, n_ranks))
    dot = EmbeddingTables(rows=np.full(5, 1000), dim=np.full(5, 128), pooling=np.linspace(1, 5, 5))
    out.append(("dot-empty-rank", DLRMSpec(tables=dot, batch_size=512, optimizer="adagrad"), np.array([0, 0, 2, 2, 0]),
                4))
    return out


@pytest.mark.parametrize("name,spec,assignment,n_ranks", _cases(), ids=[c[0] for c in _cases()])
def test_template_graph_equals_op_by_op_emission(name, spec, assignment, n_ranks):
    new = build_dlrm_graph(spec, assignment, n_ranks)
    old = _reference_graph(spec, assignment, n_ranks)
    assert_same_graph(new, old)
    timing = ModelTiming(A100)
    d_new, d_old = timing.durations(new), timing.durations(old)
    np.testing.assert_array_equal(d_new, d_old)
    assert simulate(new, d_new).iteration_s == simulate(old, d_old).iteration_s


def test_one_template_serves_every_placement():
    tables = generate_tasks(4, n_tasks=1, seed=1, device_memory_bytes=A100.memory_bytes)[0]
    spec = DLRMSpec(tables=tables, batch_size=2048)
    template = DLRMGraphTemplate(spec, 4)
    rng = np.random.default_rng(1)
    for _ in range(5):
        a = rng.integers(0, 4, len(tables))
        assert_same_graph(template.graph(a), _reference_graph(spec, a, 4))


def test_thousand_tables_on_64_ranks():
    tables = generate_tasks(64, n_tasks=1, seed=17, device_memory_bytes=A100.memory_bytes, dataset="2021")[0]
    assert len(tables) >= 1000
    spec = DLRMSpec(tables=tables, batch_size=65536)
    a = np.random.default_rng(2).integers(0, 64, len(tables))
    new = DLRMGraphTemplate(spec, 64).graph(a)
    assert_same_graph(new, _reference_graph(spec, a, 64))
    assert simulate(new, ModelTiming(A100)).iteration_s > 0
