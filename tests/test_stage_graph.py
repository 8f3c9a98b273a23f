"""Stage graphs: reachability mask, depth, pruning of shape-only ops, features (hand-made DAGs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from predictor.stage import GPTSpec, StageSpec, StageSpecError, graph_from_fx, stage_graph
from predictor.stage.dag_transformer import depth_encoding
from predictor.stage.graph import MAX_RANK, N_FEATURES, OP_VOCAB, SHAPE_ONLY_OPS, StageGraph


def _diamond() -> StageGraph:
    # 0 -> 1 -> 3 -> 4,  0 -> 2 -> 3,  5 isolated (a constant nobody uses)
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]
    ops = ["input", "mm", "gelu", "add", "output", "literal"]
    kind = [0, 2, 2, 2, 3, 1]
    shape = [[0, 0, 4, 8]] * 6
    return StageGraph(ops, np.array(kind), np.array(shape), ["float32"] * 6, np.array(edges))


def test_reachability_is_transitive_closure_not_neighbours():
    g = _diamond()
    r = g.reachability()
    expected = {(0, 1), (0, 2), (0, 3), (0, 4), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)}
    got = {(int(u), int(v)) for u, v in zip(*np.nonzero(r), strict=True)}
    assert got == expected
    m = g.attention_mask()
    assert m[0, 4] and m[4, 0]  # a path of 3 edges: attended both ways
    assert not m[1, 2] and not m[2, 1]  # siblings: no path either way
    assert m[5, 5] and m[5].sum() == 1  # isolated node attends only to itself
    assert np.array_equal(m, m.T)


def test_hop_distance_is_shortest_path():
    d = _diamond().hop_distance()
    assert d[0].tolist() == [0, 1, 1, 2, 3, -1]  # 0 -> 4: the shortest of the two 3-edge paths
    assert d[4, 0] == -1 and d[1, 2] == -1  # against the edges / siblings: no path
    assert np.array_equal(d >= 1, _diamond().reachability())
    from predictor.stage.batching import prepare

    prepared = prepare(_diamond())
    hops = prepared.hops
    assert hops[0, 3] == 2 and hops[3, 0] == -2 and hops[1, 2] == 0  # signed, upstream negative
    assert np.array_equal(prepared.mask, _diamond().attention_mask())  # the mask, from the same pass


def test_depth_is_longest_path():
    assert _diamond().depth().tolist() == [0, 1, 1, 2, 3, 0]


def test_depth_encoding_distinguishes_depths():
    enc = depth_encoding(torch.tensor([0, 1, 2, 50]), 16)
    assert enc.shape == (4, 16)
    assert torch.allclose(enc[0, 0::2], torch.zeros(8)) and torch.allclose(enc[0, 1::2], torch.ones(8))
    d = torch.cdist(enc, enc)
    assert (d + torch.eye(4) * 1e3).min() > 0.1  # all encodings differ


def test_edges_must_be_topological():
    with pytest.raises(ValueError):
        StageGraph(["a", "b"], np.array([2, 2]), np.zeros((2, MAX_RANK)), ["float32"] * 2, np.array([[1, 0]]))


def _toy(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = x.view(4, 8).t().contiguous()  # shape-only chain between input and mm
    z = torch.mm(y, w)
    a, b = z.split(2, dim=1)  # split + getitem: shape-only
    return torch.relu(a).reshape(-1) + b.reshape(-1).to(torch.float32)


def test_pruning_removes_shape_only_ops_and_keeps_connectivity():
    gm = make_fx(_toy)(torch.randn(32), torch.randn(4, 4))
    full = graph_from_fx(gm, prune=False)
    pruned = graph_from_fx(gm, prune=True)
    assert any(o in SHAPE_ONLY_OPS for o in full.op)
    assert not any(o in SHAPE_ONLY_OPS for o in pruned.op)
    assert pruned.n_nodes < full.n_nodes
    kept = [i for i, o in enumerate(full.op) if o not in SHAPE_ONLY_OPS]
    assert [full.op[i] for i in kept] == pruned.op
    # reachability between kept nodes is exactly what it was before pruning
    assert np.array_equal(full.reachability()[np.ix_(kept, kept)], pruned.reachability())
    mm = pruned.op.index("mm")
    assert pruned.reachability()[0, mm]  # input x still feeds the mm through the pruned view chain
    assert pruned.shape[mm].tolist() == [0, 0, 8, 4]


def test_gpt_stage_graph_structure_and_features():
    model = GPTSpec(hidden=32, heads=4, seq=16, vocab=64, n_layers=3, micro_batch=2)
    g1 = stage_graph(StageSpec(model, 1, 1))
    g2 = stage_graph(StageSpec(model, 1, 2))
    head = stage_graph(StageSpec(model, 2, 2))
    tp = stage_graph(StageSpec(model, 1, 1, tp=2))
    assert not any(o in SHAPE_ONLY_OPS for o in g1.op)
    assert g1.op.count("output") == 1 and "mm" in g1.op
    assert any(o.startswith("_scaled_dot_product") for o in g1.op)
    assert g2.n_nodes > g1.n_nodes
    assert "nll_loss_forward" in head.op and "nll_loss_forward" not in g1.op
    # TP changes shapes, not structure
    assert tp.op == g1.op and np.array_equal(tp.edges, g1.edges)
    assert not np.array_equal(tp.shape, g1.shape)
    x = g1.features()
    assert x.shape == (g1.n_nodes, N_FEATURES)
    assert np.allclose(x[:, : len(OP_VOCAB)].sum(axis=1), 1.0)
    assert np.all(g1.edges[:, 0] < g1.edges[:, 1])
    # every node but the output reaches the output (no dangling op after pruning)
    r = g1.reachability()
    out = g1.op.index("output")
    assert r[:out, out].all()


def test_round_trip_dict():
    g = _diamond()
    h = StageGraph.from_dict(g.to_dict())
    assert h.op == g.op and np.array_equal(h.edges, g.edges) and np.array_equal(h.shape, g.shape)


def test_bad_stage_specs():
    m = GPTSpec(hidden=48, heads=6, seq=8, vocab=30, n_layers=2)
    with pytest.raises(StageSpecError, match="heads 6 is not divisible by tp=4"):
        StageSpec(m, 0, 1, tp=4)
    with pytest.raises(StageSpecError, match="outside"):
        StageSpec(m, 1, 2)


def test_alpa_query_maps_to_stage_position():
    from types import SimpleNamespace

    from predictor.stage.alpa_adapter import spec_from_query

    t = SimpleNamespace(hidden=64, heads=4, seq=16, vocab=128, ffn_size=256, moe=None)
    cfg = SimpleNamespace(dp=2, tp=2)

    def q(emb, head):
        return SimpleNamespace(
            spec=t, n_layers=3, with_embedding=emb, with_head=head, config=cfg, micro_batch=4
        )

    mid = spec_from_query(q(False, False))
    assert (mid.n_layers, mid.has_embedding, mid.has_head, mid.tp, mid.dp, mid.batch) == (
        3,
        False,
        False,
        2,
        2,
        2,
    )
    first, last, whole = (
        spec_from_query(q(True, False)),
        spec_from_query(q(False, True)),
        spec_from_query(q(True, True)),
    )
    assert first.has_embedding and not first.has_head and first.n_layers == 3
    assert last.has_head and not last.has_embedding and last.n_layers == 3
    assert whole.has_embedding and whole.has_head and whole.model.n_layers == 3
    with pytest.raises(ValueError, match="MoE"):
        spec_from_query(
            SimpleNamespace(
                **{**vars(q(True, True)), "spec": SimpleNamespace(**{**vars(t), "moe": object()})}
            )
        )
    with pytest.raises(ValueError, match="GeLU MLP"):
        spec_from_query(
            SimpleNamespace(
                **{**vars(q(True, True)), "spec": SimpleNamespace(**{**vars(t), "mlp": "swiglu"})}
            )
        )


def test_flops_counted_from_the_fx_inputs():
    gm = make_fx(_toy)(torch.randn(32), torch.randn(4, 4))
    g = graph_from_fx(gm)
    mm = g.op.index("mm")
    assert g.flops[mm] == 2.0 * 8 * 4 * 4  # (8 x 4) @ (4 x 4)
    assert g.flops.sum() == g.flops[mm]  # relu / add are not counted as FLOPs
    work = g.work()
    assert work[0] == g.flops[mm] and work[2] == sum(1 for k in g.kind if k == 2)
    assert work[1] > 0
    h = StageGraph.from_dict(g.to_dict())
    assert np.array_equal(h.flops, g.flops)


def test_gpt_stage_flops_match_the_closed_form():
    model = GPTSpec(hidden=32, heads=4, seq=16, vocab=64, n_layers=3, micro_batch=2)
    one, two = (stage_graph(StageSpec(model, 1, last)) for last in (1, 2))
    tokens, h = 16 * 2, 32
    # one middle layer: QKV, projection, FC1, FC2 GEMMs forward (24 T h^2) and twice that backward
    gemm = 3 * 24 * tokens * h * h
    attn = one.flops[[i for i, o in enumerate(one.op) if "scaled_dot_product" in o]].sum()
    assert attn > 0
    assert one.flops.sum() - attn == pytest.approx(gemm, rel=0.01)
    assert two.flops.sum() > one.flops.sum()
