"""The sharding search's fast paths give what the full computation gives: a placement's durations gathered
from the job's template equal the kernel models' on the whole graph, the closed-form bound never exceeds the
simulated time, and the local search takes the same steps (same plan, same evaluations) with the bound."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.search.registry import load_space
from tuner.search.sharding import build_sharding_context
from tuner.sharders import ModelGuidedSharder, get_sharder
from tuner.sharders.local_search import local_search

SPACE = "search_spaces/sharding.yaml"


@pytest.fixture(scope="module")
def ctx():
    space = load_space(SPACE)
    space = space.model_copy(update={"tasks": space.tasks.model_copy(
        update={"generate": space.tasks.generate.model_copy(update={"count": 6})})})
    return build_sharding_context(space)


def test_template_durations_equal_full_timing(ctx):
    rng = np.random.default_rng(0)
    for ti in range(len(ctx.tasks)):
        for b in (512, 4096):
            job = ctx.job(ti, b)
            for _ in range(3):
                a = rng.integers(0, job.n_ranks, len(ctx.tasks[ti]))
                g, d = job.timed_graph(a)
                np.testing.assert_array_equal(d, job.timing.durations(g))
                assert job.objective(a) == job.evaluate(a)[0].objective


def test_lower_bound_never_exceeds_the_simulation(ctx):
    rng = np.random.default_rng(1)
    for ti in range(len(ctx.tasks)):
        job = ctx.job(ti, 2048)
        for _ in range(10):
            a = rng.integers(0, job.n_ranks, len(ctx.tasks[ti]))
            c = job.objective(a)
            assert job.lower_bound(a) <= c
            assert job.lower_bound(a) > 0.5 * c  # and it is tight enough to prune


def test_local_search_takes_the_same_steps_with_the_bound(ctx):
    pruned = 0
    for ti in range(len(ctx.tasks)):
        for b in (1024, 4096):
            job = ctx.job(ti, b)
            cap = job.table_capacity_bytes(ctx.space.memory_fraction)
            start = get_sharder("size_lookup_greedy").shard(job.spec.tables, job.n_ranks, cap)
            calls = [0, 0]

            def plain(a, calls=calls, job=job):
                calls[0] += 1
                return job.objective(a)

            def bounded(a, calls=calls, job=job):
                calls[1] += 1
                return job.objective(a)

            without = local_search(start, job.n_ranks, job.spec.tables, cap, plain, max_evals=40, rng=ti)
            with_ = local_search(start, job.n_ranks, job.spec.tables, cap, bounded, max_evals=40, rng=ti,
                                 lower_bound=job.lower_bound)
            np.testing.assert_array_equal(without[0], with_[0])
            assert without[1:] == with_[1:]
            pruned += calls[0] - calls[1]
    assert pruned > 0


def test_model_guided_places_as_without_the_bound(ctx, monkeypatch):
    placements = []
    for bound in (True, False):
        if not bound:
            monkeypatch.setattr(type(ctx.job(0, 512)), "lower_bound", lambda self, a: 0.0)
        out = []
        for ti in range(3):
            job = ctx.job(ti, 4096)
            p = ModelGuidedSharder(job, max_evals=30, seed=ti).place(job.table_capacity_bytes(0.8))
            out.append((tuple(p.assignment), p.predicted_s, p.info["evaluations"]))
        placements.append(out)
    assert placements[0] == placements[1]
