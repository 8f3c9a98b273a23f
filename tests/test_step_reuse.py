"""The embedding step-reuse term: its probe, the curve it fits, and how ModelTiming applies it."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from predictor.calibration.step_reuse import probe_step_reuse, reuse_curve, reuse_factor
from predictor.kernels import ModelTiming
from predictor.kernels.embedding import RF_BINS, repeat_fraction_from_rf
from predictor.platforms import get_platform
from predictor.workloads.dlrm import DLRMSpec, build_dlrm_graph
from predictor.workloads.dlrm_tables import EmbeddingTables

CPU = get_platform("cpu-local")
LLC = CPU.last_level_cache_bytes


def _graph(n_ranks: int, batch: int = 512, rows: int = 200_000):
    t = EmbeddingTables(rows=np.full(4, rows), dim=np.full(4, 64), pooling=np.linspace(1, 20, 4))
    spec = DLRMSpec(tables=t, batch_size=batch, bottom_mlp=(32, 64), top_mlp=(64, 1))
    return build_dlrm_graph(spec, np.arange(4) % n_ranks, n_ranks, mode="host")


def _kinds(g) -> np.ndarray:
    return np.asarray(g.kinds, dtype=object)[g.kind]


def test_the_curve_is_the_median_ratio_per_working_set():
    rows = []
    for r, (fwd, bwd) in enumerate(((0.9, 0.8), (0.7, 0.6), (1.1, 0.7))):  # three rounds at one size
        rows.append({"round": r, "fraction": 0.25, "ws_bytes": 0.25 * LLC, "llc_bytes": LLC,
                     "fwd_cold_s": 2.0, "bwd_cold_s": 4.0, "fwd_step_s": 2.0 * fwd, "bwd_step_s": 4.0 * bwd})
        rows.append({"round": r, "fraction": 2.0, "ws_bytes": 2.0 * LLC, "llc_bytes": LLC,
                     "fwd_cold_s": 1.0, "bwd_cold_s": 1.0, "fwd_step_s": 1.0, "bwd_step_s": 1.2})
    curve = reuse_curve(rows)
    assert curve == [pytest.approx([0.25, 0.9, 0.7]), pytest.approx([2.0, 1.0, 1.2])]
    # linear in log2(working set) between the points, the end points' factors beyond them
    assert reuse_factor(curve, 0.25, "bwd") == pytest.approx(0.7)
    assert reuse_factor(curve, np.sqrt(0.25 * 2.0), "bwd") == pytest.approx(0.95)  # halfway in log2
    assert reuse_factor(curve, 0.01, "fwd") == pytest.approx(0.9)
    assert reuse_factor(curve, 100.0, "bwd") == pytest.approx(1.2)
    assert reuse_factor([], 0.5, "bwd") == 1.0


def test_timing_scales_only_the_embedding_kernels_by_the_curve():
    g = _graph(1)
    flat = [[0.01, 0.5, 0.25], [100.0, 0.5, 0.25]]  # the same factors at every working set
    plain = ModelTiming(CPU).durations(g)
    reused = ModelTiming(CPU.model_copy(update={"embedding_step_reuse": flat})).durations(g)
    kinds = _kinds(g)
    fwd, bwd = kinds == "embedding_bag_fwd", kinds == "embedding_bag_bwd"
    assert fwd.any() and bwd.any()
    np.testing.assert_allclose(reused[fwd], 0.5 * plain[fwd])
    np.testing.assert_allclose(reused[bwd], 0.25 * plain[bwd])
    np.testing.assert_allclose(reused[~(fwd | bwd)], plain[~(fwd | bwd)])


def test_the_factor_follows_the_step_working_set():
    curve = [[1e-4, 1.0, 0.5], [10.0, 1.0, 1.5]]
    t = ModelTiming(CPU.model_copy(update={"embedding_step_reuse": curve}))
    small, large = t.step_reuse_factors(_graph(1, batch=64)), t.step_reuse_factors(_graph(1, batch=8192))
    assert small[-1][1] < large[-1][1]
    # the working set by hand: expected distinct rows x dim x 4 bytes over the tables, over the LLC
    g = _graph(1, batch=512)
    kinds = _kinds(g)
    fwd = np.flatnonzero(kinds == "embedding_bag_fwd")
    b, e, L = (g.params[k][fwd] for k in ("batch", "rows", "pooling"))
    rf = np.stack([g.params[f"rf{i}"][fwd] for i in range(RF_BINS)], axis=1)  # the spec's reuse histogram
    distinct = np.minimum(b * L * (1 - repeat_fraction_from_rf(rf)), e)
    x = float((distinct * 64 * 4).sum()) / LLC
    assert t.step_reuse_factors(g)[-1][1] == pytest.approx(reuse_factor(curve, x, "bwd"))


def test_ranks_of_a_cpu_host_share_the_cache_and_gpus_do_not():
    curve = [[0.01, 1.0, 0.5], [10.0, 1.0, 1.5]]
    cpu = ModelTiming(CPU.model_copy(update={"embedding_step_reuse": curve}))
    # one host: the working set of both ranks together, the same tables and batch as on one rank
    assert cpu.step_reuse_factors(_graph(2)) == {-1: pytest.approx(cpu.step_reuse_factors(_graph(1))[-1])}
    gpu = get_platform("a100-80gb").model_copy(update={"embedding_step_reuse": curve})
    per_rank = ModelTiming(gpu).step_reuse_factors(_graph(2))
    assert set(per_rank) == {0, 1}
    assert all(f[1] < ModelTiming(gpu).step_reuse_factors(_graph(1))[0][1] for f in per_rank.values())


def test_no_curve_or_unknown_tables_leave_the_kernels_alone():
    g = _graph(1)
    assert ModelTiming(CPU).step_reuse_factors(g) == {}
    t = ModelTiming(CPU.model_copy(update={"embedding_step_reuse": [[0.1, 0.5, 0.5]]}))
    g.params["rows"][:] = np.nan  # a trace that did not record the tables' sizes
    assert t.step_reuse_factors(g) == {}


@pytest.mark.parametrize("point", [[0.5, 0.9], [0.5, -1.0, 0.9], [0.0, 1.0, 1.0], [0.5, float("nan"), 1.0]])
def test_a_malformed_curve_is_refused(point):
    with pytest.raises(ValidationError, match="working set / LLC"):
        CPU.model_copy(update={}).model_validate({**CPU.model_dump(), "embedding_step_reuse": [point]})


def test_the_probe_times_both_protocols_at_each_working_set():
    rows = probe_step_reuse(2 * 2**20, 1, fractions=(0.25, 1.0), iters=1)
    assert [r["fraction"] for r in rows] == [0.25, 1.0]
    for r in rows:
        for k in ("fwd_cold_s", "bwd_cold_s", "fwd_step_s", "bwd_step_s"):
            assert np.isfinite(r[k]) and r[k] > 0
        # nearly every lookup a distinct row: the working set is about the asked fraction of the cache
        assert 0.5 * r["fraction"] < r["ws_bytes"] / r["llc_bytes"] < 1.5 * r["fraction"]
    assert len(reuse_curve(rows)) == 2
