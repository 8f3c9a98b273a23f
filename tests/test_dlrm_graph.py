"""The DLRM synthesiser: structure of the per-rank graph, memory, the all-to-all size rule."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.graph import Category, DepKind
from predictor.simulate import simulate
from predictor.sources.synth.dlrm import (
    DLRMSpec,
    all_to_all_message_bytes,
    build_dlrm_graph,
    dlrm_memory_per_rank,
)
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.timing.kernels import ModelTiming
from predictor.timing.platforms import get_platform

A100 = get_platform("a100-80gb")


def _tables(n=6, dim=64):
    return EmbeddingTables(rows=np.full(n, 100_000), dim=np.full(n, dim), pooling=np.linspace(1, 30, n))


def test_graph_structure_per_rank():
    spec = DLRMSpec(tables=_tables(), batch_size=1024, bottom_mlp=(64, 64), top_mlp=(128, 1))
    g = build_dlrm_graph(spec, np.array([0, 0, 1, 1, 1, 0]), 2)
    assert g.n_ranks == 2
    df = g.tasks_frame()
    # each rank looks up its own tables forward and backward
    for r, n_local in ((0, 3), (1, 3)):
        on = df[df["rank"] == r]
        assert (on.kind == "embedding_bag_fwd").sum() == n_local
        assert (on.kind == "embedding_bag_bwd").sum() == n_local
        assert (on.kind == "all_to_all").sum() == 2  # pooled forward, gradients backward
    # collectives: every group has exactly one member per rank
    grouped = df[df.group >= 0]
    assert (grouped.groupby("group")["rank"].nunique() == 2).all()
    assert (grouped.groupby("group").size() == 2).all()
    # the interaction waits for the forward all-to-all (intra-rank sync)
    kinds = np.asarray(g.kinds)[g.kind]
    a2a = np.flatnonzero(kinds == "all_to_all")
    gg = g.edge_kind == DepKind.GPU_GPU
    targets = set(g.edge_dst[gg & np.isin(g.edge_src, a2a)])
    names = np.asarray(g.names)[g.name]
    assert any(names[t].startswith("interaction") for t in targets)
    # every kernel is launched by a CPU task
    launched = set(g.edge_dst[g.edge_kind == DepKind.CPU_GPU])
    assert launched == set(np.flatnonzero(g.is_gpu()))
    assert set(np.unique(g.category)) >= {Category.COMPUTE, Category.MEMORY, Category.COMMUNICATION, Category.CPU}


def test_all_to_all_uses_max_of_max():
    spec = DLRMSpec(tables=_tables(4, dim=32), batch_size=1000)
    lopsided = np.array([0, 0, 0, 1])
    sent0 = 1000 * 3 * 32 * 4
    assert all_to_all_message_bytes(spec, lopsided, 2) == pytest.approx(sent0)
    balanced = np.array([0, 0, 1, 1])
    recv = 1000 / 2 * 4 * 32 * 4
    assert all_to_all_message_bytes(spec, balanced, 2) == pytest.approx(max(1000 * 2 * 32 * 4, recv))


def test_imbalanced_sharding_predicts_slower_and_memory_follows_tables():
    t = EmbeddingTables(rows=np.full(8, 2_000_000), dim=np.full(8, 128), pooling=np.full(8, 40.0))
    spec = DLRMSpec(tables=t, batch_size=4096)
    timing = ModelTiming(A100)
    balanced = np.arange(8) % 4
    piled = np.zeros(8, dtype=int)
    tb = simulate(build_dlrm_graph(spec, balanced, 4), timing).iteration_s
    tl = simulate(build_dlrm_graph(spec, piled, 4), timing)
    assert tl.iteration_s > tb * 1.05
    g = tl.graph
    work = (g.category == Category.COMPUTE) | (g.category == Category.MEMORY)
    per_rank = np.bincount(g.rank[work], weights=tl.duration[work], minlength=4)
    assert np.argmax(per_rank) == 0  # the rank holding every table does the most device work
    mem = dlrm_memory_per_rank(spec, piled, 4)
    table_bytes = 8 * 2_000_000 * 128 * 4
    assert mem[0] - mem[1] == pytest.approx(table_bytes, rel=0.05)


def test_single_rank_has_no_collectives():
    spec = DLRMSpec(tables=_tables(3), batch_size=256)
    g = build_dlrm_graph(spec, np.zeros(3, dtype=int), 1)
    assert not (g.category == Category.COMMUNICATION).any() or (g.group < 0).all()
    assert simulate(g, ModelTiming(A100)).iteration_s > 0


@pytest.mark.parametrize(
    ("assignment", "n", "batch", "match"),
    [([0, 0], 2, 1024, "assigns 2 tables"), ([0, 0, 2], 2, 1024, "outside"), ([0, 1, 1], 2, 1023, "not divisible")],
)
def test_bad_sharding_inputs(assignment, n, batch, match):
    spec = DLRMSpec(tables=_tables(3), batch_size=batch)
    with pytest.raises(ValueError, match=match):
        build_dlrm_graph(spec, np.asarray(assignment), n)


# host mode (CPU): tests/test_dlrm_host.py
