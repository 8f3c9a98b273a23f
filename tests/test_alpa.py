"""Alpa-compatible stage tensors and our stage-construction DP (checked against brute force)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from predictor.sources.synth.transformer import TransformerSpec
from predictor.timing.platforms import get_platform
from tuner.alpa import (
    MeshConfig,
    SimulatedStagePredictor,
    StageQuery,
    Submesh,
    alpa_submesh_choices,
    layer_groups,
    mesh_configs,
    pipeline_latency,
    stage_construction_dp,
    stage_cost_tensors,
)

A100 = get_platform("a100-80gb")
SPEC = TransformerSpec(layers=8, hidden=1024, heads=16, seq=512, vocab=8000, name="gpt-tiny")


def brute_force(cost, succ, sizes, n_devices, n_micro_batches):
    """Every split of the layers into contiguous stages x every (submesh, config) per stage."""
    L, _, S, C = cost.shape
    best = math.inf

    def rec(i, stages):
        nonlocal best
        if i == L:
            if sum(sizes[m] for _, _, m, _ in stages) != n_devices:
                return
            n = len(stages)
            if any(succ[a, b, m, c] < n - 1 - k for k, (a, b, m, c) in enumerate(stages)):
                return
            best = min(best, pipeline_latency([cost[a, b, m, c] for a, b, m, c in stages], n_micro_batches))
            return
        for j in range(i, L):
            for m in range(S):
                for c in range(C):
                    if np.isfinite(cost[i, j, m, c]):
                        rec(j + 1, [*stages, (i, j, m, c)])

    rec(0, [])
    return best


@pytest.mark.parametrize("seed", range(150))
def test_dp_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    L, S, C = int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
    sizes = np.sort(rng.choice([1, 2, 3, 4], S, replace=False))
    D, B = int(rng.integers(1, 9)), int(rng.integers(1, 12))
    cost = rng.uniform(0.1, 2.0, (L, L, S, C)).round(2)  # rounding makes ties, the hard case
    cost[rng.random(cost.shape) < 0.2] = np.inf
    cost[np.tril_indices(L, -1)] = np.inf
    succ = rng.integers(-1, 5, (L, L, S, C))
    expected = brute_force(cost, succ, sizes, D, B)
    plan = stage_construction_dp(cost, succ, sizes, D, B)
    if math.isinf(expected):
        assert plan is None
        return
    assert plan is not None
    assert plan.total_latency_s == pytest.approx(expected, rel=1e-12)
    # the returned stages are a valid split: contiguous, all layers, all devices, memory respected
    assert plan.stages[0].first == 0 and plan.stages[-1].last == L - 1
    assert all(a.last + 1 == b.first for a, b in zip(plan.stages, plan.stages[1:], strict=False))
    assert sum(int(sizes[s.submesh_index]) for s in plan.stages) == D
    n = len(plan.stages)
    assert all(succ[s.first, s.last, s.submesh_index, s.config_index] >= n - 1 - k for k, s in enumerate(plan.stages))
    lat = [cost[s.first, s.last, s.submesh_index, s.config_index] for s in plan.stages]
    assert plan.total_latency_s == pytest.approx(pipeline_latency(lat, B))


def test_dp_rejects_malformed_tensors():
    with pytest.raises(ValueError, match="do not fit"):
        stage_construction_dp(np.ones((2, 3, 1, 1)), np.ones((2, 3, 1, 1), int), [1], 1, 1)
    with pytest.raises(ValueError, match="do not fit"):
        stage_construction_dp(np.ones((2, 2, 2, 1)), np.ones((2, 2, 2, 1), int), [1], 1, 1)


def test_submeshes_and_configs_as_alpa():
    assert alpa_submesh_choices(3, 8) == [Submesh(1, 1), Submesh(1, 2), Submesh(1, 4), Submesh(1, 8), Submesh(2, 8)]
    assert alpa_submesh_choices(3, 8, "all")[-2:] == [Submesh(2, 8), Submesh(3, 8)]
    assert mesh_configs(Submesh(1, 4)) == [MeshConfig(4, 1), MeshConfig(2, 2), MeshConfig(1, 4)]
    assert layer_groups(10, 4).tolist() == [3, 3, 2, 2]


class _FakePredictor:
    """Latency = layers / tp + 0.5 (embedding) + 1 (head); counts its calls."""

    def __init__(self):
        self.calls = 0

    def stage_latency(self, q: StageQuery) -> float:
        self.calls += 1
        return q.n_layers / q.config.tp + 0.5 * q.with_embedding + 1.0 * q.with_head


def test_cost_tensor_shapes_infs_and_memory():
    subs = [Submesh(1, 1), Submesh(1, 2), Submesh(1, 4)]
    fake = _FakePredictor()
    c = stage_cost_tensors(SPEC, 4, subs, micro_batch=2, predictor=fake, memory_bytes=A100.memory_bytes)
    L, S, C = 4, 3, 3
    assert c.compute_cost.shape == (L, L, S, C) and c.max_n_succ_stages.shape == (L, L, S, C)
    assert np.isinf(c.compute_cost[np.tril_indices(L, -1)]).all()  # j < i is not a stage
    assert np.isinf(c.compute_cost[:, :, 0, 1:]).all()  # a 1-device submesh has one config: padding
    # (dp=4, tp=1) on 4 devices cannot split a micro-batch of 2: impossible
    assert c.configs[2][0] == MeshConfig(4, 1)
    assert np.isinf(c.compute_cost[:, :, 2, 0]).all() and (c.max_n_succ_stages[:, :, 2, 0] == -1).all()
    # layers 0..3 (all 8 layers, embedding and head) on one device, tp=1: 8 + 0.5 + 1
    assert c.compute_cost[0, 3, 0, 0] == pytest.approx(9.5)
    assert c.compute_cost[1, 2, 1, 1] == pytest.approx(4 / 2)  # 4 middle layers on tp=2
    # more layers -> no more successors fit; more devices in TP -> at least as many
    succ = c.max_n_succ_stages
    assert succ[0, 3, 0, 0] <= succ[0, 0, 0, 0]
    assert succ[1, 2, 1, 1] >= succ[1, 2, 0, 0]
    tight = stage_cost_tensors(SPEC, 4, subs, micro_batch=2, predictor=_FakePredictor(), memory_bytes=1e6)
    assert (tight.max_n_succ_stages == -1).all()  # 1 MB fits no stage
    assert stage_construction_dp(tight.compute_cost, tight.max_n_succ_stages, tight.submesh_sizes, 4, 8) is None


def test_heads_not_divisible_make_a_config_impossible():
    spec = TransformerSpec(layers=4, hidden=768, heads=12, seq=256, vocab=1000)
    c = stage_cost_tensors(spec, 2, [Submesh(1, 8)], micro_batch=8, predictor=_FakePredictor(), memory_bytes=8e10)
    tps = [cfg.tp for cfg in c.configs[0]]
    for k, tp in enumerate(tps):
        assert np.isinf(c.compute_cost[0, 1, 0, k]) == (12 % tp != 0)


def test_default_predictor_simulates_and_the_dp_picks_a_plan():
    subs = alpa_submesh_choices(1, 4)
    pred = SimulatedStagePredictor(A100)
    c = stage_cost_tensors(SPEC, 4, subs, micro_batch=4, platform=A100, predictor=pred)
    finite = np.isfinite(c.compute_cost)
    assert finite.any() and (c.compute_cost[finite] > 0).all()
    # homogeneous layers: one simulation per distinct (layers, embedding, head, config), not per (i, j)
    assert pred.simulations < finite.sum()
    # a longer stage takes longer on the same submesh config
    assert c.compute_cost[1, 2, 0, 0] > c.compute_cost[1, 1, 0, 0]
    plan = stage_construction_dp(c.compute_cost, c.max_n_succ_stages, c.submesh_sizes, 4, 8, costs=c)
    assert plan is not None
    assert sum(s.submesh.n_devices for s in plan.stages) == 4
    assert plan.max_stage_latency_s == max(s.latency_s for s in plan.stages)
