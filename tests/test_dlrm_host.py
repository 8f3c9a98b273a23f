"""Host mode (CPU) of the DLRM synthesiser: the program of a real gloo DLRM job, op by op."""

from __future__ import annotations

import numpy as np
import pytest
from _pinned_cpu import bare_cpu

from predictor.simulate import simulate
from predictor.sources.synth.dlrm import GLOO_WORKER_THREADS, DLRMSpec, build_dlrm_graph, ddp_buckets
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.timing.kernels import ModelTiming

CPU = bare_cpu()  # cpu-local without host refinements: each test sets its own


def _spec(n_tables=4, dim=64, batch=512, bottom=(32, 64), top=(64, 1)):
    t = EmbeddingTables(rows=np.full(n_tables, 10_000), dim=np.full(n_tables, dim),
                        pooling=np.linspace(1, 20, n_tables))
    return DLRMSpec(tables=t, batch_size=batch, bottom_mlp=bottom, top_mlp=top)


def _frame(g):
    df = g.tasks_frame()
    return df[df.kind != "overhead"].reset_index()


def test_ddp_buckets_follow_the_reducer_rule():
    # DLRM of the sharding experiment with a 2264-wide interaction: PyTorch 2.13's DDP (2 gloo ranks,
    # after its bucket rebuild) makes [top2, top1, top0] (612865 params >= 1 MiB) and [bottom]
    layers = [("bot0", 13, 256), ("bot1", 256, 128), ("bot2", 128, 64), ("top0", 2264, 256), ("top1", 256, 128),
              ("top2", 128, 1)]
    assert ddp_buckets(layers, 4, 25 * 2**20) == [["top2", "top1", "top0"], ["bot2", "bot1", "bot0"]]
    # a 164-wide interaction: 120001 params, under 1 MiB -> one bucket
    small = [*layers[:3], ("top0", 164, 256), *layers[4:]]
    assert ddp_buckets(small, 4, 25 * 2**20) == [["top2", "top1", "top0", "bot2", "bot1", "bot0"]]


def test_one_rank_has_no_collectives_and_no_ddp():
    spec = _spec()
    g = build_dlrm_graph(spec, np.zeros(4, dtype=int), 1, mode="host")
    df = _frame(g)
    assert not g.is_gpu().any()
    assert set(df.processor) == {"cpu"}
    assert not df.kind.isin(["all_to_all", "all_reduce", "memcpy", "mul"]).any()
    assert (df.kind == "embedding_bag_fwd").sum() == 4 and (df.kind == "embedding_bag_bwd").sum() == 4
    layers = spec.mlp_layers()
    assert (df.kind == "addmm").sum() == len(layers)
    assert (df.kind == "mm").sum() == 2 * len(layers) - 1  # no input gradient for the first layer
    assert (df.kind == "add").sum() == 2 * len(layers)  # SGD: one add_ per parameter tensor
    # one thread, no waits: the iteration is the sum of its tasks
    tl = simulate(g, ModelTiming(CPU))
    assert tl.iteration_s == pytest.approx(float(tl.duration.sum()), rel=1e-9)


def test_two_ranks_gloo_workers_blocking_all_to_all_and_ddp():
    spec = _spec()
    g = build_dlrm_graph(spec, np.array([0, 1, 0, 1]), 2, mode="host")
    df = _frame(g)
    names = list(df.name)
    coll = df[df.kind.isin(["all_to_all", "all_reduce"])]
    assert set(coll.processor) <= {f"gloo worker {w}" for w in range(GLOO_WORKER_THREADS)}
    assert set(df[~df.kind.isin(["all_to_all", "all_reduce"])].processor) == {"cpu"}
    # every collective group has one member per rank
    grouped = df[df.group >= 0]
    assert (grouped.groupby("group")["rank"].nunique() == 2).all()
    assert (grouped.groupby("group").size() == 2).all()
    waits = set(zip(g.edge_src.tolist(), g.edge_dst.tolist(), strict=True))
    r0 = df[df["rank"] == 0]
    idx = {n: int(i) for n, i in zip(r0.name, r0["index"], strict=True)}
    # the all-to-all blocks the main thread: the bottom MLP starts after it
    assert (idx["all_to_all_fwd"], idx["bot0.addmm"]) in waits
    # autograd order: the bottom MLP's backward runs before the all-to-all of the gradients
    r0_names = list(r0.name)
    assert r0_names.index("bot0.wgrad") < r0_names.index("pack_embedding_grads")
    assert (idx["all_to_all_bwd"], int(r0[r0.kind == "embedding_bag_bwd"]["index"].iloc[0])) in waits
    # DDP: one all-reduce per bucket; SGD waits for the copies back, which wait for every all-reduce
    n_buckets = len(ddp_buckets(spec.mlp_layers(), 4, spec.ddp_bucket_bytes))
    assert (r0.kind == "all_reduce").sum() == n_buckets
    copy = int(r0[r0.kind == "memcpy"]["index"].iloc[0])
    for ar in r0[r0.kind == "all_reduce"]["index"]:
        assert (int(ar), copy) in waits
    assert names.count("sgd.bot0.weight.add_") == 2
    tl = simulate(g, ModelTiming(CPU))
    assert tl.iteration_s > 0 and tl.per_rank_s.size == 2


def test_unbalanced_sharding_is_slower_in_host_mode():
    t = EmbeddingTables(rows=np.full(6, 200_000), dim=np.full(6, 64), pooling=np.full(6, 40.0))
    spec = DLRMSpec(tables=t, batch_size=1024, bottom_mlp=(32, 64), top_mlp=(64, 1))
    timing = ModelTiming(CPU)
    balanced = simulate(build_dlrm_graph(spec, np.arange(6) % 2, 2, mode="host"), timing).iteration_s
    piled = simulate(build_dlrm_graph(spec, np.zeros(6, dtype=int), 2, mode="host"), timing).iteration_s
    assert piled > balanced * 1.2


def test_without_spare_cores_collectives_serialise_with_compute():
    from predictor.timing.platforms.host import comm_thread_has_core

    # 2 ranks x (1 compute + 1 gloo thread) need 4 cores
    assert comm_thread_has_core(2, 1, cores=4) and not comm_thread_has_core(2, 1, cores=2)
    spec = _spec(bottom=(256, 256), top=(512, 512, 1))  # DDP all-reduces long enough to matter
    a = np.array([0, 1, 0, 1])
    timing = ModelTiming(CPU)
    overlapped = build_dlrm_graph(spec, a, 2, mode="host")
    serial = build_dlrm_graph(spec, a, 2, mode="host", comm_threads=False)
    df = _frame(serial)
    comm = df[df.kind.isin(["all_to_all", "all_reduce"])]
    assert len(comm) and set(comm.processor) == {"cpu"}
    assert not df.processor.str.startswith("gloo").any()
    t_over, t_serial = simulate(overlapped, timing), simulate(serial, timing)
    # the same tasks and durations; only the overlap of the all-reduces with backward is gone
    assert t_serial.iteration_s > t_over.iteration_s
    assert float(t_serial.duration.sum()) == pytest.approx(float(t_over.duration.sum()), rel=1e-9)
