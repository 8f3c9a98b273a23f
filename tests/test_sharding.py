"""Tests of tuner.sharders: the Table III sharders and local_search."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from predictor.sources.synth.dlrm_tables import EmbeddingTables, generate_tasks
from tuner.sharders import (
    SHARDERS,
    GreedySharder,
    InfeasibleShardingError,
    Sharder,
    check_assignment,
    get_sharder,
    local_search,
    rank_loads,
)

GIB = 2**30


def _toy() -> EmbeddingTables:
    # bytes = rows * dim * 4
    return EmbeddingTables(
        rows=[1000, 100_000, 10_000, 100, 1_000_000],
        dim=[64, 32, 128, 16, 64],
        pooling=[30.0, 1.0, 5.0, 80.0, 2.0],
        name=["a", "b", "c", "d", "e"],
    )


def test_registry():
    assert list(SHARDERS) == [
        "naive",
        "random",
        "size_greedy",
        "lookup_greedy",
        "norm_lookup_greedy",
        "size_lookup_greedy",
    ]
    for name, cls in SHARDERS.items():
        s = get_sharder(name)
        assert isinstance(s, cls) and isinstance(s, Sharder) and s.name == name
    with pytest.raises(ValueError, match="size_lookup_greedy"):
        get_sharder("nope")
    assert issubclass(InfeasibleShardingError, ValueError)


@pytest.mark.parametrize("name", list(SHARDERS))
@pytest.mark.parametrize("n_gpus", [2, 4, 8])
def test_every_sharder_covers_tables_within_capacity(name, n_gpus):
    cap = 0.8 * 40 * GIB
    sharder = get_sharder(name)
    for t in generate_tasks(n_gpus, n_tasks=4, seed=n_gpus):
        a = sharder.shard(t, n_gpus, cap, rng=1)
        assert a.dtype == np.int32 and a.shape == (len(t),)
        assert a.min() >= 0 and a.max() < n_gpus
        mem = rank_loads(a, t.bytes_per_table(), n_gpus)
        assert np.all(mem <= cap)
        check_assignment(a, t, n_gpus, cap)


@pytest.mark.parametrize("name", [n for n in SHARDERS if n != "naive"])
def test_capacity_aware_sharders_under_tight_memory(name):
    # 8 equal tables of 1 GiB on 4 ranks of 2 GiB: only the 2-per-rank placement fits
    t = EmbeddingTables(rows=[2**26] * 8, dim=[4] * 8, pooling=np.linspace(1, 50, 8))
    assert t.bytes_per_table()[0] == GIB
    a = get_sharder(name).shard(t, 4, 2 * GIB, rng=0)
    assert np.bincount(a, minlength=4).tolist() == [2, 2, 2, 2]


def test_naive_placement_and_overflow():
    t = _toy()
    assert get_sharder("naive").shard(t, 2, GIB).tolist() == [0, 1, 0, 1, 0]
    # ranks of 0.3 GiB: table e (0.238 GiB) fits alone but rank 0 also holds a and c
    with pytest.raises(InfeasibleShardingError, match="rank 0"):
        get_sharder("naive").shard(t, 2, 0.24 * GIB)


def test_random_sharder_uses_rng():
    t = generate_tasks(4, n_tasks=1, seed=0)[0]
    s = get_sharder("random")
    a1 = s.shard(t, 4, 32 * GIB, rng=1)
    assert np.array_equal(a1, s.shard(t, 4, 32 * GIB, rng=np.random.default_rng(1)))
    assert not np.array_equal(a1, s.shard(t, 4, 32 * GIB, rng=2))
    assert len(np.unique(a1)) == 4


def test_greedy_costs_follow_table_iii():
    t = _toy()
    e, d, ll = t.rows.astype(float), t.dim.astype(float), t.pooling
    expect = {
        "size_greedy": e,
        "lookup_greedy": ll * d,
        "norm_lookup_greedy": ll / e,
        "size_lookup_greedy": ll * d * np.log10(e),
    }
    for name, c in expect.items():
        s = get_sharder(name)
        assert isinstance(s, GreedySharder)
        np.testing.assert_allclose(s.cost(t), c)


def test_greedy_hand_checked():
    t = _toy()
    cap = GIB
    # size_greedy, E = [1e3, 1e5, 1e4, 1e2, 1e6]: order e, b, c, a, d
    # e->0 (load 1e6); b->1 (1e5); c->1 (1.1e5); a->1 (1.11e5); d->1 (1.111e5 < 1e6)
    assert get_sharder("size_greedy").shard(t, 2, cap).tolist() == [1, 1, 1, 1, 0]
    # lookup_greedy, L*D = [1920, 32, 640, 1280, 128]: order a, d, c, e, b
    # a->0 (1920); d->1 (1280); c->1 (1920); e: tie on load 1920, rank 0 has fewer tables -> 0; b->1
    assert get_sharder("lookup_greedy").shard(t, 2, cap).tolist() == [0, 1, 1, 1, 0]
    # norm_lookup_greedy, L/E = [.03, 1e-5, 5e-4, .8, 2e-6]: order d, a, c, b, e
    # d->0; a->1 (.03); c->1 (.0305); b->1; e->1
    assert get_sharder("norm_lookup_greedy").shard(t, 2, cap).tolist() == [1, 1, 1, 0, 1]
    # three ranks, size_lookup_greedy, L*D*log10E = [5760, 160, 2560, 2560, 768]
    # order a, c, d (stable tie), e, b: a->0, c->1, d->2, e->1 (tie 2560, lower id), b->2
    assert get_sharder("size_lookup_greedy").shard(t, 3, cap).tolist() == [0, 2, 1, 2, 1]


def test_greedy_respects_memory_over_cost():
    # size_greedy costs E = [100, 10, 10]; bytes = [400, 40000, 40000]
    t = EmbeddingTables(rows=[100, 10, 10], dim=[1, 1000, 1000], pooling=[1.0, 1.0, 1.0])
    s = get_sharder("size_greedy")
    assert s.shard(t, 2, 1e9).tolist() == [0, 1, 1]  # t2 joins the cost-least rank 1
    # rank 1 has no room for t2 any more: it must go to rank 0 although rank 0 costs more
    assert s.shard(t, 2, 40_400).tolist() == [0, 1, 0]


@pytest.mark.parametrize("name", list(SHARDERS))
def test_oversized_table_raises(name):
    t = _toy()
    with pytest.raises(InfeasibleShardingError, match="'e'") as err:
        get_sharder(name).shard(t, 4, 0.1 * GIB, rng=0)
    assert "GiB" in str(err.value)


def test_greedy_raises_when_placement_cannot_fit():
    t = EmbeddingTables(rows=[2**26] * 5, dim=[4] * 5, pooling=[1.0] * 5)  # 5 x 1 GiB
    with pytest.raises(InfeasibleShardingError, match="fits on no rank"):
        get_sharder("size_lookup_greedy").shard(t, 2, 2 * GIB)


# ---- local search -----------------------------------------------------------------------------


def _weighted(w) -> EmbeddingTables:
    """Tables whose L * D * log10(E) proxy equals ``w``: E = 10, D = 1, L = w."""
    w = np.asarray(w, dtype=float)
    return EmbeddingTables(rows=[10] * len(w), dim=[1] * len(w), pooling=w)


def _max_load(w, n_ranks):
    w = np.asarray(w, dtype=float)
    return lambda a: float(rank_loads(a, w, n_ranks).max())


def _brute_force(cost, n, n_ranks):
    return min(cost(np.array(p)) for p in itertools.product(range(n_ranks), repeat=n))


@pytest.mark.parametrize(
    "w,n_ranks,start",
    [
        ([8, 7, 6, 5, 4], 2, [0, 0, 0, 0, 0]),  # optimum 15 | 15
        ([10, 8, 6, 5, 3, 2], 3, [0, 0, 0, 0, 0, 0]),  # optimum 12 | 11 | 11
        ([12, 11, 7, 6, 5, 4, 2, 1], 3, [0] * 8),  # optimum 16 | 16 | 16
        ([10, 10, 1, 1, 1, 1], 2, [0, 0, 1, 1, 1, 1]),  # two heavy tables stacked: several moves
    ],
)
def test_local_search_finds_optimum_on_toy(w, n_ranks, start):
    # (a local search: on other instances, e.g. [9, 7, 6, 5, 4, 3] on 3 ranks, it can stop at a
    # move/swap local optimum; these ones are checked against brute force)
    cost = _max_load(w, n_ranks)
    best, c, evals = local_search(np.array(start), n_ranks, _weighted(w), 1e12, cost, max_evals=500)
    assert c == _brute_force(cost, len(w), n_ranks)
    assert c == cost(best)
    assert best.dtype == np.int32
    assert 1 <= evals <= 500


def test_local_search_respects_capacity_and_budget():
    # 4 tables of 1 GiB and 2 ranks of 2 GiB: moves overflow, only swaps are legal
    t = EmbeddingTables(rows=[2**26] * 4, dim=[4] * 4, pooling=[10.0, 9.0, 2.0, 1.0])
    w = t.pooling
    calls = []

    def cost(a):
        calls.append(a)
        return float(rank_loads(a, w, 2).max())

    best, c, evals = local_search(np.array([0, 0, 1, 1]), 2, t, 2 * GIB, cost, max_evals=50)
    assert c == 11.0  # {10, 1} | {9, 2}
    for a in calls:
        check_assignment(a, t, 2, 2 * GIB)
    assert evals == len(calls) <= 50

    calls.clear()
    _, _, evals = local_search(np.array([0, 0, 1, 1]), 2, t, 2 * GIB, cost, max_evals=3)
    assert evals == len(calls) == 3

    with pytest.raises(InfeasibleShardingError):
        local_search(np.array([0, 0, 0, 1]), 2, t, 2 * GIB, cost)


def test_local_search_never_worsens_and_start_cost():
    rng = np.random.default_rng(0)
    for trial in range(30):
        n, n_ranks = int(rng.integers(3, 9)), int(rng.integers(2, 5))
        w = rng.integers(1, 30, n)
        # an arbitrary noisy cost, unrelated to the proxy
        salt = int(rng.integers(1 << 30))

        def cost(a, salt=salt):
            return float(np.random.default_rng([salt, *a.tolist()]).random())

        start = rng.integers(0, n_ranks, n)
        c0 = cost(start.astype(np.int32))
        best, c, evals = local_search(start, n_ranks, _weighted(w), 1e12, cost, max_evals=40, rng=trial)
        assert c <= c0 and c == cost(best) and evals <= 40

        _, c2, evals2 = local_search(
            start, n_ranks, _weighted(w), 1e12, cost, max_evals=40, start_cost=c0, rng=trial
        )
        assert c2 <= c0 and evals2 <= 40


def test_local_search_improves_naive_on_generated_task():
    t = generate_tasks(4, n_tasks=1, seed=5)[0]
    cap = 32 * GIB
    proxy = t.pooling * t.dim * np.log10(t.rows)
    cost = _max_load(proxy, 4)
    start = get_sharder("naive").shard(t, 4, cap)
    best, c, evals = local_search(start, 4, t, cap, cost, max_evals=200, rng=0)
    assert c < cost(start)
    assert evals <= 200
    check_assignment(best, t, 4, cap)


def test_model_guided_sharder_keeps_the_contract_and_beats_its_starts():
    from tuner.search.sharding import ShardingSpace, build_sharding_context
    from tuner.sharders import ModelGuidedSharder, model_guided_shard

    space = ShardingSpace.model_validate({"space": "sharding", "platform": "a100-80gb", "n_gpus": 2, "batch_sizes": [512],
                                          "tasks": {"generate": {"count": 1, "seed": 1}},
                                          "model": {"bottom_mlp": [64, 32], "top_mlp": [64, 1]}})
    job = build_sharding_context(space).job(0, 512)
    cap = job.table_capacity_bytes(0.8)
    naive = get_sharder("naive").shard(job.spec.tables, 2, cap)
    starts = {"naive": (naive, job.objective(naive))}
    sharder = ModelGuidedSharder(job, starts, max_evals=6, seed=3)
    assert isinstance(sharder, Sharder) and sharder.name == "model_guided"
    a = sharder.shard(job.spec.tables, 2, cap)
    check_assignment(a, job.spec.tables, 2, cap)
    placement = sharder.place(cap)
    assert np.array_equal(a, placement.assignment) and placement.predicted_s <= starts["naive"][1]
    assert placement.info["evaluations"] <= 6
    b, cost, info = model_guided_shard(job, cap, starts, max_evals=6, seed=3)
    assert np.array_equal(a, b) and cost == placement.predicted_s and info == placement.info
