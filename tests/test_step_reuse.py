"""The embedding step-reuse term: its probe, the curve it fits, and how ModelTiming applies it."""

from __future__ import annotations

import numpy as np
import pytest
from _pinned_cpu import bare_cpu
from pydantic import ValidationError

from predictor.sources.synth.dlrm import DLRMSpec, build_dlrm_graph
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.timing.calibration.step_reuse import (
    PROBE_POOLINGS,
    probe_step_reuse,
    reuse_curve,
    reuse_surface,
)
from predictor.timing.kernels import ModelTiming
from predictor.timing.kernels.embedding import RF_BINS, repeat_fraction_from_rf
from predictor.timing.kernels.step_reuse import reuse_factor, reuse_factors_by_pooling
from predictor.timing.platforms import get_platform

CPU = bare_cpu()  # cpu-local without host refinements: each test sets its own
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
    for r in rows:  # every table timed on its own, in a shuffled order; the sums are theirs
        t = r["per_table"]
        assert sorted(t["pooling"]) == sorted(float(p) for p in PROBE_POOLINGS)
        assert sum(t["bwd_step_s"]) == pytest.approx(r["bwd_step_s"])
        assert sum(t["fwd_cold_s"]) == pytest.approx(r["fwd_cold_s"])
    surface = reuse_surface(rows)
    assert len(surface) == 2 * len(set(PROBE_POOLINGS))


def _probe_row(r: int, fraction: float, per_pooling: dict[float, tuple[float, float]]) -> dict:
    """A probe row at ``fraction`` whose tables of each pooling run (fwd, bwd) x their cold time, two
    tables per pooling with cold times 1 and 3 (seconds)."""
    pooling, fc, bc, fs, bs = [], [], [], [], []
    for p, (f, b) in per_pooling.items():
        for cold in (1.0, 3.0):
            pooling.append(p)
            fc.append(cold)
            bc.append(2 * cold)
            fs.append(f * cold)
            bs.append(b * 2 * cold)
    return {"round": r, "fraction": fraction, "ws_bytes": fraction * LLC, "llc_bytes": LLC,
            "fwd_cold_s": sum(fc), "bwd_cold_s": sum(bc), "fwd_step_s": sum(fs), "bwd_step_s": sum(bs),
            "per_table": {"pooling": pooling, "fwd_cold_s": fc, "bwd_cold_s": bc, "fwd_step_s": fs, "bwd_step_s": bs}}


def test_the_surface_is_the_median_ratio_per_pooling_and_working_set():
    rows = [_probe_row(r, 0.25, {1.0: (0.9, b1), 16.0: (0.8, b16)})
            for r, (b1, b16) in enumerate(((0.9, 0.5), (0.7, 0.6), (0.8, 0.7)))]
    rows.append(_probe_row(0, 2.0, {1.0: (1.0, 1.0), 16.0: (1.0, 1.2)}))
    assert reuse_surface(rows) == [pytest.approx([0.25, 1.0, 0.9, 0.8]), pytest.approx([0.25, 16.0, 0.8, 0.6]),
                                   pytest.approx([2.0, 1.0, 1.0, 1.0]), pytest.approx([2.0, 16.0, 1.0, 1.2])]
    old = [{k: v for k, v in r.items() if k != "per_table"} for r in rows]  # a probe from before per_table
    assert reuse_surface(old) == []
    assert len(reuse_curve(old)) == 2


def test_the_pooling_factor_interpolates_in_log2_and_holds_its_ends():
    surface = [[0.25, 1.0, 0.9, 0.8], [0.25, 16.0, 0.8, 0.6], [2.0, 1.0, 1.0, 1.0], [2.0, 16.0, 1.0, 1.2]]
    got = reuse_factors_by_pooling(surface, 0.25, np.array([1.0, 4.0, 16.0, 64.0, 0.0, np.nan]), "bwd")
    np.testing.assert_allclose(got, [0.8, 0.7, 0.6, 0.6, 0.8, 0.8])  # 4 is halfway from 1 to 16 in log2
    # halfway in log2 between the working sets as well: the mean of the four corners
    np.testing.assert_allclose(reuse_factors_by_pooling(surface, np.sqrt(0.5), np.array([4.0]), "bwd"), [0.9])
    np.testing.assert_allclose(reuse_factors_by_pooling(surface, 100.0, np.array([1.0, 16.0]), "fwd"), [1.0, 1.0])
    np.testing.assert_allclose(reuse_factors_by_pooling([], 0.5, np.array([1.0, 2.0]), "bwd"), [1.0, 1.0])


def test_timing_takes_each_tables_pooling_factor_where_the_pack_has_the_surface():
    g = _graph(1)  # four tables of pooling 1, 7.33, 13.67, 20
    surface = [[0.01, 1.0, 0.9, 0.3], [0.01, 20.0, 0.9, 0.95], [100.0, 1.0, 0.9, 0.3], [100.0, 20.0, 0.9, 0.95]]
    plat = CPU.model_copy(update={"embedding_step_reuse": [[0.01, 0.5, 0.25], [100.0, 0.5, 0.25]],
                                  "embedding_step_reuse_pooling": surface})
    plain, reused = ModelTiming(CPU).durations(g), ModelTiming(plat).durations(g)
    kinds = _kinds(g)
    bwd = kinds == "embedding_bag_bwd"
    L = g.params["pooling"][bwd]
    expected = 0.3 + (0.95 - 0.3) * np.log2(L) / np.log2(20.0)
    np.testing.assert_allclose(reused[bwd] / plain[bwd], expected)
    fwd = kinds == "embedding_bag_fwd"
    np.testing.assert_allclose(reused[fwd], 0.9 * plain[fwd])  # the surface, not the sums' curve (0.5)
    np.testing.assert_allclose(reused[~(fwd | bwd)], plain[~(fwd | bwd)])


@pytest.mark.parametrize("point", [[0.5, 1.0, 0.9], [0.5, 0.0, 0.9, 1.0], [0.5, 4.0, float("inf"), 1.0]])
def test_a_malformed_pooling_surface_is_refused(point):
    with pytest.raises(ValidationError, match="pooling"):
        CPU.model_validate({**CPU.model_dump(), "embedding_step_reuse_pooling": [point]})


def test_a_step_never_makes_a_table_slower_than_the_cold_protocol():
    # a probe reading above 1 (noise of single short calls) leaves the kernel at its cold-fitted time
    g = _graph(1)
    plain = ModelTiming(CPU).durations(g)
    t = ModelTiming(CPU.model_copy(update={"embedding_step_reuse": [[1e-4, 1.4, 0.5], [10.0, 1.4, 0.5]]}))
    kinds = _kinds(g)
    fwd, bwd = kinds == "embedding_bag_fwd", kinds == "embedding_bag_bwd"
    got = t.durations(g)
    np.testing.assert_allclose(got[fwd], plain[fwd])
    np.testing.assert_allclose(got[bwd], 0.5 * plain[bwd])
    assert t.step_reuse_factors(g)[-1][0] == pytest.approx(1.4)  # the measured curve itself is kept as measured
    m = t.step_reuse_multipliers(g)
    assert m.max() <= 1.0
