"""Host contention only while another rank of the host runs (predictor/timing/kernels/co_run.py)."""

from __future__ import annotations

import numpy as np
import pytest
from _pinned_cpu import bare_cpu

from predictor.graph import Category, GraphBuilder, ProcKind
from predictor.simulate import simulate
from predictor.sources.synth.dlrm import DLRMSpec, build_dlrm_graph
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.timing.kernels import ModelTiming
from predictor.timing.kernels.co_run import busy_union, busy_within, co_run_durations


def test_busy_union_and_the_busy_time_inside_windows() -> None:
    s, e = busy_union(np.array([5.0, 0.0, 1.0, 8.0]), np.array([6.0, 2.0, 3.0, 9.0]))
    np.testing.assert_allclose(s, [0.0, 5.0, 8.0])
    np.testing.assert_allclose(e, [3.0, 6.0, 9.0])
    got = busy_within(s, e, np.array([0.0, 2.5, 3.0, -1.0, 5.5]), np.array([10.0, 5.5, 5.0, 0.5, 5.5]))
    np.testing.assert_allclose(got, [5.0, 1.0, 0.0, 0.5, 0.0])
    assert busy_within(np.array([]), np.array([]), np.array([1.0]), np.array([2.0])).tolist() == [0.0]


def _two_kernels(d0: float, d1: float):
    """Rank 0 runs one memory-bound kernel of ``d0`` s, rank 1 one of ``d1`` s, both from t = 0."""
    b = GraphBuilder()
    for r, d in ((0, d0), (1, d1)):
        b.task(b.processor(r, ProcKind.CPU_THREAD, "main"), f"k{r}", "relu", Category.MEMORY, duration=d)
    return b.build()


def test_a_kernel_runs_slowed_only_while_the_other_rank_runs() -> None:
    """Factor 2: rank 1's 4 s kernel runs beside rank 0 throughout (8 s); rank 0's 10 s kernel does 4 s of
    its work in those 8 s and the other 6 s alone: 14 s, not the all-contended 20 s."""
    g = _two_kernels(10.0, 4.0)
    alone = np.array([10.0, 4.0])
    got = co_run_durations(g, alone, np.array([2.0, 2.0]), np.array([True, True]), simulate, iters=50, tol=1e-9)
    np.testing.assert_allclose(got, [14.0, 8.0], rtol=1e-6)
    # a rank whose co-runner loads nothing (busy False) runs at its own speed
    quiet = co_run_durations(g, alone, np.array([2.0, 2.0]), np.array([True, False]), simulate, iters=50, tol=1e-9)
    np.testing.assert_allclose(quiet, [10.0, 8.0], rtol=1e-6)
    # tasks without a factor keep their duration; one rank has no co-runner
    np.testing.assert_allclose(co_run_durations(g, alone, np.ones(2), np.array([True, True]), simulate), alone)


def _dlrm(assignment: np.ndarray):
    t = EmbeddingTables(rows=np.full(4, 100_000), dim=np.full(4, 64), pooling=np.array([2.0, 2.0, 60.0, 60.0]))
    spec = DLRMSpec(tables=t, batch_size=2048, bottom_mlp=(32, 64), top_mlp=(64, 1))
    return build_dlrm_graph(spec, assignment, 2, mode="host", comm_threads=False)


@pytest.mark.parametrize("assignment", [np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1])])
def test_co_run_lies_between_alone_and_contended_throughout(assignment) -> None:
    cpu = bare_cpu()
    factors = {"embedding": 1.5, "memory": 1.8, "compute": 1.2}
    contended = cpu.model_copy(update={"host_contention": {2: factors}})
    g = _dlrm(assignment)
    alone = ModelTiming(cpu).durations(g)
    throughout = ModelTiming(contended, co_run=False).durations(g)
    co = ModelTiming(contended).durations(g)
    assert np.all(co >= alone - 1e-15) and np.all(co <= throughout + 1e-15)
    t_alone, t_co, t_all = (simulate(g, d).iteration_s for d in (alone, co, throughout))
    assert t_alone < t_co <= t_all
    if assignment[1] == 0:  # the heavy tables on rank 1: its embedding backward runs alone at the end
        emb = g.kind_mask("embedding_bag_bwd") & (g.rank == 1)
        assert np.all(co[emb] < throughout[emb] * 0.999)
        assert t_co < 0.99 * t_all
