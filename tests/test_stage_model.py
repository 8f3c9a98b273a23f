"""Stage-latency networks: training reduces the L1 loss on a tiny synthetic set; save/load round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from predictor.stage import StageGraph, StageLatencyModel, TrainConfig
from predictor.stage.batching import collate_dense, collate_sparse, prepare
from predictor.stage.graph import MAX_RANK
from predictor.stage.model import fit_work_anchor

_COST = {"mm": 4e-9, "add": 1e-9, "gelu": 2e-9}  # seconds per output element (synthetic ground truth)


def _random_graph(rng: np.random.Generator) -> tuple[StageGraph, float]:
    n = int(rng.integers(6, 18))
    ops = ["input"] + [str(rng.choice(list(_COST))) for _ in range(n - 2)] + ["output"]
    kind = [0] + [2] * (n - 2) + [3]
    shape = np.zeros((n, MAX_RANK), dtype=np.int64)
    shape[:, 2:] = rng.choice([64, 128, 256, 512], size=(n, 2))
    edges = {(int(rng.integers(0, j)), j) for j in range(1, n) for _ in range(int(rng.integers(1, 3)))}
    edges.add((n - 2, n - 1))
    latency = sum(_COST[o] * float(shape[i, 2] * shape[i, 3]) for i, o in enumerate(ops) if o in _COST)
    g = StageGraph(ops, np.array(kind), shape, ["float32"] * n, np.array(sorted(edges)))
    return g, 1e-5 + latency


@pytest.fixture(scope="module")
def synthetic():
    rng = np.random.default_rng(0)
    pairs = [_random_graph(rng) for _ in range(96)]
    return [p[0] for p in pairs], np.array([p[1] for p in pairs])


@pytest.mark.parametrize(
    ("kind", "kwargs"),
    [
        ("dag_transformer", {"dim": 16, "layers": 2, "heads": 2, "pool_scale": 0.1}),
        ("dag_transformer", {"dim": 16, "layers": 2, "heads": 2, "pool_scale": 0.1, "hop_bias": 3}),
        ("dag_transformer", {"dim": 16, "layers": 2, "heads": 2, "pool_scale": 0.1, "local": True}),
        ("gcn", {"dim": 32, "layers": 2, "pool_scale": 0.1}),
        ("gat", {"dim": 16, "layers": 2, "pool_scale": 0.1}),
    ],
)
def test_training_reduces_l1_loss(synthetic, kind, kwargs):
    graphs, y = synthetic
    torch.set_num_threads(1)
    model = StageLatencyModel(kind, TrainConfig(epochs=100, patience=100, seed=1, lr=3e-3), **kwargs)
    rep = model.fit(graphs, y)
    assert rep.history[-1] < 0.5 * rep.history[0]
    pred = model.predict(graphs)
    mre = float(np.mean(np.abs(pred - y) / y))
    const = float(np.mean(np.abs(np.exp(np.mean(np.log(y))) - y) / y))
    assert mre < 0.6 * const  # far better than predicting the mean


def test_save_load_round_trip(synthetic, tmp_path):
    graphs, y = synthetic
    model = StageLatencyModel("dag_transformer", TrainConfig(epochs=3, seed=0), dim=16, layers=1, heads=2)
    model.fit(graphs[:40], y[:40])
    path = tmp_path / "m.pt"
    model.save(path)
    again = StageLatencyModel.load(path)
    assert np.allclose(model.predict(graphs), again.predict(graphs), rtol=1e-6)
    assert isinstance(again.predict(graphs[0]), float)
    (tmp_path / "junk.pt").write_text("not a model")
    with pytest.raises(ValueError, match="not a stage latency model"):
        StageLatencyModel.load(tmp_path / "junk.pt")


def test_ensemble_averages_its_networks_and_round_trips(synthetic, tmp_path):
    graphs, y = synthetic
    torch.set_num_threads(1)
    cfg = dict(epochs=4, seed=3, anchor="geomean", target="linear")
    single = StageLatencyModel("gcn", TrainConfig(**cfg), dim=16, layers=2)
    single.fit(graphs[:40], y[:40])
    ens = StageLatencyModel("gcn", TrainConfig(ensemble=3, **cfg), dim=16, layers=2)
    ens.fit(graphs[:40], y[:40])
    assert len(ens.members) == 3 and ens.net is ens.members[0]
    # member 0 is trained exactly as the single network; the others start from other weights
    assert np.allclose(single.predict(graphs), _member_predictions(ens, 0, graphs), rtol=1e-5)
    each = np.stack([_member_predictions(ens, k, graphs) for k in range(3)])
    assert not np.allclose(each[0], each[1])
    assert np.allclose(ens.predict(graphs), each.mean(axis=0), rtol=1e-5)
    ens.save(tmp_path / "e.pt")
    assert np.allclose(StageLatencyModel.load(tmp_path / "e.pt").predict(graphs), ens.predict(graphs), rtol=1e-6)
    with pytest.raises(ValueError, match="ensemble"):
        StageLatencyModel("gcn", TrainConfig(ensemble=0))


def _member_predictions(model: StageLatencyModel, k: int, graphs) -> np.ndarray:
    """Predictions of member ``k`` alone (seconds): the model with only that network."""
    members = model.members
    try:
        model.members = [members[k]]
        return np.asarray(model.predict(graphs))
    finally:
        model.members = members


@pytest.mark.parametrize(("hop_bias", "local"), [(0, False), (3, False), (0, True)])
def test_padding_does_not_change_predictions(synthetic, hop_bias, local):
    # a graph predicted alone and in a padded batch with larger graphs gives the same output
    graphs, y = synthetic
    model = StageLatencyModel("dag_transformer", TrainConfig(epochs=2), dim=16, layers=2, heads=2, hop_bias=hop_bias,
                               local=local)
    model.fit(graphs[:20], y[:20])
    if hop_bias:
        with torch.no_grad():
            for layer in model.net.layers:
                layer.bias.normal_()  # a non-trivial hop bias must not leak into padding either
    small = min(graphs, key=lambda g: g.n_nodes)
    big = max(graphs, key=lambda g: g.n_nodes)
    items = [prepare(g, model.mean, model.std) for g in (small, big)]
    with torch.no_grad():
        alone = model.net(collate_dense(items[:1]))[0]
        padded = model.net(collate_dense(items))[0]
    assert torch.allclose(alone, padded, atol=1e-5)
    sb = collate_sparse(items)
    assert sb.x.shape[0] == small.n_nodes + big.n_nodes and int(sb.edges.max()) < sb.x.shape[0]


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown stage model kind"):
        StageLatencyModel("mlp")
    g, _ = _random_graph(np.random.default_rng(3))
    with pytest.raises(ValueError, match="> 0"):
        StageLatencyModel().fit([g], [0.0])
    with pytest.raises(RuntimeError, match="not trained"):
        StageLatencyModel().predict(g)


def test_work_anchor_recovers_a_linear_cost_and_the_network_learns_the_rest():
    rng = np.random.default_rng(3)
    graphs, y = [], []
    for _ in range(60):
        g, _ = _random_graph(rng)
        g.flops = np.where(np.array(g.op) == "mm", rng.uniform(1e6, 1e8, g.n_nodes), 0.0)
        graphs.append(g)
        flops, nbytes, ops = g.work()
        y.append(2e-10 * flops + 5e-11 * nbytes + 1e-6 * ops)  # seconds, exact in the anchor's terms
    y = np.array(y)
    assert fit_work_anchor(graphs, y) == pytest.approx([2e-10, 5e-11, 1e-6], rel=1e-3)
    model = StageLatencyModel("gcn", TrainConfig(epochs=30, seed=0, anchor="work"), dim=16, layers=2)
    model.fit(graphs, y)
    pred = model.predict(graphs)
    assert float(np.mean(np.abs(pred - y) / y)) < 0.05  # the network only has to output ~1
    assert "anchor=work" in model.describe()
    with pytest.raises(ValueError, match="anchor"):
        StageLatencyModel("gcn", TrainConfig(anchor="flops"))


def test_lr_factor_warms_up_then_follows_the_per_epoch_cosine():
    from predictor.stage.model import lr_factor

    # no warm-up: PredTOP's cosine, one value per epoch
    assert lr_factor(0, 10, 4) == 1.0 and lr_factor(9, 10, 4) == 1.0
    assert lr_factor(10, 10, 4) == pytest.approx(0.5 * (1 + np.cos(np.pi / 4)))
    assert lr_factor(40, 10, 4) == pytest.approx(0.0)
    # warm-up: a linear ramp over the first steps, multiplied into the cosine
    assert lr_factor(0, 10, 4, warmup_steps=20) == pytest.approx(1 / 20)
    assert lr_factor(9, 10, 4, warmup_steps=20) == pytest.approx(10 / 20)
    assert lr_factor(14, 10, 4, warmup_steps=20) == pytest.approx(15 / 20 * lr_factor(14, 10, 4))
    assert lr_factor(25, 10, 4, warmup_steps=20) == lr_factor(25, 10, 4)


def test_weight_average_and_clipping_change_what_is_kept(synthetic, tmp_path):
    graphs, y = synthetic
    torch.set_num_threads(1)
    cfg = dict(epochs=6, patience=6, seed=2)

    def fitted(**extra):
        m = StageLatencyModel("gcn", TrainConfig(**cfg, **extra), dim=16, layers=2)
        m.fit(graphs[:48], y[:48])
        return m

    plain = fitted().predict(graphs)
    # an average with decay 0 is the current weights: same network as no average at all
    assert np.allclose(fitted(ema_decay=0.0).predict(graphs), plain, rtol=1e-5)
    # a real average keeps other weights; so does clipping the gradient hard
    ema = fitted(ema_decay=0.9)
    assert not np.allclose(ema.predict(graphs), plain, rtol=1e-3)
    assert not np.allclose(fitted(clip_norm=1e-3).predict(graphs), plain, rtol=1e-3)
    # a huge clip norm never clips
    assert np.allclose(fitted(clip_norm=1e9).predict(graphs), plain, rtol=1e-5)
    # the settings travel with the saved model
    ema.save(tmp_path / "ema.pt")
    again = StageLatencyModel.load(tmp_path / "ema.pt")
    assert again.config.ema_decay == 0.9
    assert np.allclose(again.predict(graphs), ema.predict(graphs), rtol=1e-6)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (dict(warmup_steps=-1), "warmup_steps must be >= 0"),
        (dict(clip_norm=0.0), "clip_norm must be > 0"),
        (dict(ema_decay=1.0), r"ema_decay must be in \[0, 1\)"),
        (dict(ema_decay=-0.1), r"ema_decay must be in \[0, 1\)"),
    ],
)
def test_bad_stabiliser_settings_are_refused(setting, message):
    with pytest.raises(ValueError, match=message):
        StageLatencyModel("gcn", TrainConfig(**setting))
