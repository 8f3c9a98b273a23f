"""Calibration model fitting recovers known parameters from synthetic data (no benchmarks run)."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.sources.synth.dlrm_tables import reuse_profiles, thin_reuse
from predictor.timing.calibration.embedding_bag import indices_for_reuse, reuse_factors
from predictor.timing.kernels import TaskView
from predictor.timing.kernels.collective import PiecewiseCollective, PiecewiseSigmoid, fit_piecewise_sigmoid
from predictor.timing.kernels.features import uniform_reuse_factors
from predictor.timing.kernels.learned import MLPKernelModel
from predictor.timing.kernels.mlp import MLPConfig, MLPNet, fit_mlp
from predictor.timing.kernels.roofline_fit import FittedRoofline, RooflineFit, fit_roofline
from predictor.timing.kernels.serialize import model_from_dict, model_to_dict
from predictor.timing.platforms import get_platform

SIZES = 4.0 * 2.0 ** np.arange(27)  # 4 B .. 256 MiB, doubling (Lin et al. 2024 §III-C)


def test_piecewise_sigmoid_recovers_exact_parameters():
    true = PiecewiseSigmoid.continuous(ts=25e-6, bw_max=6e9, m1=2.0**10, m2=2.0**20)
    fit = fit_piecewise_sigmoid(SIZES, true(SIZES))
    assert fit.ts == pytest.approx(true.ts, rel=1e-6)
    assert fit.bw_max == pytest.approx(true.bw_max, rel=1e-6)
    assert (fit.m1, fit.m2) == (true.m1, true.m2)
    for name in ("L", "x0", "k", "b"):
        assert getattr(fit, name) == pytest.approx(getattr(true, name), rel=1e-3, abs=1e-6)
    assert np.max(np.abs(fit(SIZES) / true(SIZES) - 1)) < 1e-6


def test_piecewise_sigmoid_under_noise_stays_within_noise():
    rng = np.random.default_rng(3)
    true = PiecewiseSigmoid.continuous(ts=60e-6, bw_max=2e9, m1=2.0**12, m2=2.0**22, steepness=6.0)
    noisy = true(SIZES) * np.exp(rng.normal(0.0, 0.02, SIZES.size))
    fit = fit_piecewise_sigmoid(SIZES, noisy)
    assert fit.ts == pytest.approx(true.ts, rel=0.03)
    assert fit.bw_max == pytest.approx(true.bw_max, rel=0.05)
    assert np.max(np.abs(fit(SIZES) / true(SIZES) - 1)) < 0.06


def test_piecewise_sigmoid_rejects_too_few_points():
    with pytest.raises(ValueError, match="at least 4"):
        fit_piecewise_sigmoid(np.array([4.0, 8.0, 16.0]), np.array([1e-5, 1e-5, 1e-5]))


def test_roofline_recovers_bandwidth_and_floor():
    rng = np.random.default_rng(0)
    moved = np.exp(rng.uniform(np.log(1e3), np.log(1e9), 120))
    t = 3e-6 + moved / 20e9
    fit = fit_roofline(moved, t)
    assert fit.peak_bandwidth == pytest.approx(20e9, rel=0.01)
    assert fit.floor_s == pytest.approx(3e-6, rel=0.02)
    assert np.max(np.abs(fit(moved) / t - 1)) < 0.01


def test_roofline_finds_a_cache_regime():
    rng = np.random.default_rng(1)
    moved = np.exp(rng.uniform(np.log(1e3), np.log(1e9), 200))
    bw = np.where(moved <= 2**20, 80e9, 15e9)
    t = (2e-6 + moved / bw) * np.exp(rng.normal(0, 0.01, moved.size))
    fit = fit_roofline(moved, t)
    assert len(fit.edges) >= 1
    assert any(abs(np.log2(e) - 20) <= 1.0 for e in fit.edges)
    assert fit.peak_bandwidth == pytest.approx(80e9, rel=0.1)
    assert fit(np.array([5e8]))[0] == pytest.approx(2e-6 + 5e8 / 15e9, rel=0.03)


def _gemm_like(m, n, k):
    """A smooth, GEMM-shaped function: floor + work at a size-dependent rate (seconds)."""
    work = 2.0 * m * n * k
    rate = 2e11 * work / (work + 5e6)
    return 2e-6 + work / rate


def test_mlp_fits_a_known_smooth_function_within_5_percent():
    rng = np.random.default_rng(0)
    x = np.exp(rng.uniform(np.log(8), np.log(2048), size=(320, 3)))
    t = _gemm_like(x[:, 0], x[:, 1], x[:, 2])
    train, test = slice(0, 256), slice(256, None)
    net = fit_mlp(x[train], t[train], ("m", "n", "k"), work=("m", "n", "k"),
                  grid=[MLPConfig(3, 32, "adam", 1e-2)], epochs=1500, seed=0)
    err = np.abs(net.predict(x[test]) / t[test] - 1) * 100
    assert np.exp(np.mean(np.log(np.maximum(err, 1e-3)))) < 5.0
    assert np.median(err) < 5.0


def test_mlp_grid_search_keeps_the_better_config_and_extrapolates_by_work():
    rng = np.random.default_rng(1)
    x = np.exp(rng.uniform(np.log(16), np.log(1024), size=(200, 3)))
    t = _gemm_like(x[:, 0], x[:, 1], x[:, 2])
    grid = [MLPConfig(3, 32, "adam", 1e-2), MLPConfig(3, 32, "adam", 1e-7)]  # the second cannot learn
    net = fit_mlp(x, t, ("m", "n", "k"), work=("m", "n", "k"), grid=grid, epochs=600, seed=0)
    assert net.config["lr"] == 1e-2 and net.config["tried"] == 2
    big = np.array([[4096.0, 1024.0, 1024.0]])  # 4x the largest m benchmarked
    edge = np.array([[1024.0, 1024.0, 1024.0]])
    assert net.predict(big)[0] == pytest.approx(4.0 * net.predict(edge)[0], rel=1e-9)


def test_mlp_residual_is_clamped_to_its_training_range():
    # samples on two edges of the (m, n) box only: the corner where both are large is inside the
    # feature box but away from every sample, where an unclamped net may invent any correction
    rng = np.random.default_rng(2)
    small = np.exp(rng.uniform(np.log(4), np.log(16), size=120))
    large = np.exp(rng.uniform(np.log(4), np.log(4096), size=120))
    x = np.vstack([np.column_stack([small, large]), np.column_stack([large, small])])
    t = 1e-6 + 1e-9 * x[:, 0] * x[:, 1] * (1.0 + 0.3 * np.sin(np.log(x[:, 0] * x[:, 1])))
    net = fit_mlp(x, t, ("m", "n"), grid=[MLPConfig(4, 64, "adam", 1e-2)], epochs=800, seed=0)
    assert net.res_lo is not None and net.res_lo < net.res_hi
    z = (net.transform(x) - net.x_mean) / net.x_std
    ws = [w.astype(np.float32) for w in net.weights]
    bs = [b.astype(np.float32) for b in net.biases]
    res = MLPNet._residual(z, ws, bs)
    assert res.min() == pytest.approx(net.res_lo) and res.max() == pytest.approx(net.res_hi)
    # at the far corner the log2 prediction stays within the skip's trend plus the residual range
    corner = np.array([[2000.0, 2000.0]])
    zc = (net.transform(corner) - net.x_mean) / net.x_std
    skip = float((zc @ net.lin_w + net.lin_b)[0])
    got = np.log2(net.predict(corner)[0])
    lo, hi = (skip + net.res_lo) * net.y_std + net.y_mean, (skip + net.res_hi) * net.y_std + net.y_mean
    assert lo - 1e-6 <= got <= hi + 1e-6
    # the bounds survive serialisation; a net stored without them (older packs) is not clamped
    back = MLPNet.from_dict(net.to_dict())
    assert (back.res_lo, back.res_hi) == (net.res_lo, net.res_hi)
    np.testing.assert_allclose(back.predict(x[:5]), net.predict(x[:5]))
    old = net.to_dict()
    del old["res_lo"], old["res_hi"]
    unclamped = MLPNet.from_dict(old)
    assert unclamped.res_lo is None
    free = (MLPNet._residual(zc, ws, bs)[0] + skip) * net.y_std + net.y_mean
    assert np.log2(unclamped.predict(corner)[0]) == pytest.approx(free, rel=1e-6)


def test_uniform_reuse_factors_match_random_draws():
    rng = np.random.default_rng(0)
    for lookups, rows in ((5000, 100000), (20000, 2000), (4096, 64)):
        measured = np.mean([reuse_factors(rng.integers(0, rows, lookups)) for _ in range(5)], axis=0)
        expected = uniform_reuse_factors(np.array([lookups]), np.array([rows]))[0]
        assert expected.sum() == pytest.approx(1.0)
        assert np.abs(measured - expected).sum() < 0.05


def test_indices_follow_a_target_reuse_profile():
    rng = np.random.default_rng(0)
    target = thin_reuse(reuse_profiles()[0], 0.05)
    idx = indices_for_reuse(target, 40000, 10_000_000, rng)
    assert idx.size == 40000 and idx.min() >= 0 and idx.max() < 10_000_000
    assert np.abs(reuse_factors(idx) - target).sum() < 0.1


def test_calibrated_models_survive_serialisation():
    platform = get_platform("a100-80gb")
    rng = np.random.default_rng(0)
    x = np.exp(rng.uniform(np.log(8), np.log(512), size=(60, 3)))
    net = fit_mlp(x, _gemm_like(*x.T), ("m", "n", "k"), work=("m", "n", "k"),
                  grid=[MLPConfig(3, 16, "adam", 1e-2)], epochs=100)
    gemm = MLPKernelModel("mlp-gemm", ("gemm", "addmm"), {"addmm/fp32": net}, router="gemm",
                          fallback="analytic-gemm")
    roof = FittedRoofline({"add": RooflineFit(2e-6, (2.0**20,), (80e9, 15e9)), "relu": RooflineFit(1e-6, (), (30e9,))},
                          generic="add")
    coll = PiecewiseCollective({("all_reduce", 2): PiecewiseSigmoid.continuous(3e-5, 4e9, 2.0**10, 2.0**20)})
    tv = TaskView.from_columns("gemm", m=[64.0, 100.0], n=[32.0, 7.0], k=[128.0, 900.0], dtype_bytes=[4.0, 4.0])
    tv_fp64 = TaskView.from_columns("gemm", m=[64.0], n=[32.0], k=[128.0], dtype_bytes=[8.0])
    ev = TaskView.from_columns("optimizer", bytes=[1e3, 1e7])
    cv = TaskView.from_columns("all_reduce", msg_bytes=[4.0, 1e6, 1e9], world=[2.0, 2.0, 2.0])
    for model, view in ((gemm, tv), (gemm, tv_fp64), (roof, ev), (coll, cv)):
        again = model_from_dict(model_to_dict(model))
        a, b = model.predict(view, platform), again.predict(view, platform)
        assert np.all(np.isfinite(a)) and np.all(a > 0)
        np.testing.assert_allclose(a, b, rtol=1e-6)
    # a dtype without a net falls back to the analytic GEMM model
    from predictor.timing.kernels import AnalyticGemm

    np.testing.assert_allclose(gemm.predict(tv_fp64, platform), AnalyticGemm().predict(tv_fp64, platform))


def test_embedding_fit_takes_out_the_page_faults_and_prediction_adds_them_back():
    """Synthetic backward times = a smooth function of the work + 1.5 us per fault the timer counted:
    one per page of every gradient of at least 32 MiB, except where the calibration process happened
    to reuse a free heap block (no faults). The net learns only the smooth part, and the model gives
    back the smooth part plus the faults of a fresh mapping."""
    import pandas as pd

    from predictor.timing.calibrate.fit import learned_seconds
    from predictor.timing.kernels.host_memory import allocation_fault_seconds

    host = get_platform("a100-80gb").model_copy(update={"page_fault_s": 1.5e-6, "fresh_mapping_bytes": 32 * 2**20})
    rng = np.random.default_rng(0)
    n = 300
    cols = {"batch": 2.0 ** rng.integers(8, 13, n), "pooling": np.exp(rng.uniform(0, np.log(200), n)),
            "dim": rng.choice([32.0, 64.0, 128.0], n), "rows": np.full(n, 1e5), "dtype_bytes": np.full(n, 4.0)}
    work = cols["batch"] * cols["pooling"] * cols["dim"]
    smooth = 5e-6 + work * 4.0 / 5e9
    tv = TaskView.from_columns("embedding_bag_bwd", **cols)
    faults = allocation_fault_seconds(tv, host)
    assert 0 < (faults > 0).sum() < n  # both sides of the ceiling are in the data
    counted = np.ceil(cols["batch"] * cols["pooling"] * cols["dim"] * 4.0 / 4096) * (faults > 0)
    counted[np.flatnonzero(faults > 0)[::3]] = 0.0  # a third of them served from a free heap block
    frame = pd.DataFrame({**cols, "kind": "embedding_bag_bwd", "seconds": smooth + counted * 1.5e-6,
                          "faults": counted})
    target = learned_seconds(frame, host)
    np.testing.assert_allclose(target, smooth)  # the fit sees only the smooth part
    # without a fault count (packs calibrated before the timer counted them) the times are fitted as measured
    np.testing.assert_array_equal(learned_seconds(frame.drop(columns="faults"), host), frame["seconds"])
    feats = ("batch", "pooling", "dim")
    x = np.stack([cols[f] for f in feats], axis=1)
    net = fit_mlp(x[:240], target[:240], feats, work=feats, grid=[MLPConfig(3, 32, "adam", 1e-2)], epochs=1500, seed=0)
    model = MLPKernelModel("mlp-embedding_bag_bwd", ("embedding_bag_bwd",), {"": net}, fallback="analytic-embedding")
    test = TaskView.from_columns("embedding_bag_bwd", **{k: v[240:] for k, v in cols.items()})
    pred = model.predict(test, host)
    err = np.abs(pred / (smooth + faults)[240:] - 1) * 100
    assert np.median(err) < 5.0
    # the term is added back: the same model on a host without faults predicts the smooth part only
    np.testing.assert_allclose(pred - model.predict(test, get_platform("a100-80gb")), faults[240:], rtol=1e-9)
    # concatenations, GEMMs and element-wise ops likewise (their fitted models add the term back); kinds whose
    # output the model does not know (in-place updates) keep their measured time
    other = pd.DataFrame({"kind": ["concat", "mm", "optimizer"], "elements": [1e7, np.nan, 1e7],
                          "m": [np.nan, 4096.0, np.nan], "n": [np.nan, 4096.0, np.nan], "dtype_bytes": 4.0,
                          "seconds": 0.05, "faults": 1000.0})
    np.testing.assert_allclose(learned_seconds(other, host), [0.05 - 1.5e-3, 0.05 - 1.5e-3, 0.05])
    roof = FittedRoofline({"concat": RooflineFit(2e-6, (), (20e9,))})
    cat = TaskView.from_columns("concat", elements=[1e7, 1e3], dtype_bytes=[4.0, 4.0])
    np.testing.assert_allclose(roof.predict(cat, host) - roof.predict(cat, get_platform("a100-80gb")),
                               [np.ceil(4e7 / 4096) * 1.5e-6, 0.0])
    # the target never drops below a tenth of the measurement (a fault cost measured while the machine ran faster)
    over = host.model_copy(update={"page_fault_s": 1.0})
    assert (learned_seconds(frame, over) >= 0.1 * frame["seconds"].to_numpy() - 1e-18).all()


def test_rounds_merge_keeps_the_median_round_and_spread():
    import pandas as pd

    from predictor.timing.calibrate.run import merge_rounds

    a = pd.DataFrame({"kernel": ["x", "x", "y"], "case": [0, 1, 0], "m": [1, 2, 3], "seconds": [1.0, 2.0, 3.0]})
    b = pd.DataFrame({"kernel": ["x", "y"], "case": [1, 0], "m": [2, 3], "seconds": [1.5, 4.5]})
    c = pd.DataFrame({"kernel": ["y"], "case": [0], "m": [3], "seconds": [9.0]})
    merged = merge_rounds([a, b, c]).set_index(["kernel", "case"])
    # the typical round, not the fastest: a step runs in the machine's typical state
    assert merged.loc[("x", 1), "seconds"] == pytest.approx(1.75) and merged.loc[("y", 0), "seconds"] == 4.5
    assert merged.loc[("x", 0), "seconds"] == 1.0 and merged.loc[("y", 0), "rounds"] == 3
    assert merged.loc[("x", 1), "pass_spread"] == pytest.approx(2.0 / 1.5 - 1)
    assert np.isnan(merged.loc[("x", 0), "pass_spread"])  # timed in one round only


def test_calibrated_cpu_collective_is_used_for_local_gloo_ranks():
    """CPU ranks are processes of one host: a group of K ranks without a ``nodes`` column is the
    single-host group ``tuner calibrate --world-size K`` measured (regression: with the CPU's
    devices_per_node = 1 such groups were taken as K nodes and timed by the analytic line)."""
    cpu = get_platform("a100-80gb").model_copy(update={"kind": "cpu", "devices_per_node": 1})
    curve = PiecewiseSigmoid.continuous(1e-4, 2e9, 1024.0, 2.0**20)
    model = PiecewiseCollective({("all_to_all", 2): curve})
    m = np.array([64.0, 4096.0, 2.0**22])
    tv = TaskView.from_columns("all_to_all", msg_bytes=m, world=np.full(3, 2.0))
    np.testing.assert_allclose(model.predict(tv, cpu), curve(m))
    # an explicit span of two hosts still takes the analytic line
    tv2 = TaskView.from_columns("all_to_all", msg_bytes=m, world=np.full(3, 2.0), nodes=np.full(3, 2.0))
    assert not np.allclose(model.predict(tv2, cpu), curve(m))


def test_ld_aligned_feature_marks_16_byte_rows():
    from predictor.timing.kernels.features import feature_matrix

    cols = {"n": np.array([1024.0, 1023.0, 1024.0, 4.0, 6.0]), "k": np.array([64.0, 64.0, 63.0, 4.0, 8.0]),
            "dtype_bytes": np.array([2.0, 2.0, 2.0, 4.0, np.nan])}
    got = feature_matrix(cols, ["ld_aligned"], 5)[:, 0]
    # bf16 1024 x 64: aligned; a ragged n or k: not; fp32 4 x 4 = 16 bytes: aligned; NaN dtype reads as fp32
    assert got.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]


def test_roofline_peak_ignores_floor_dominated_regimes():
    from predictor.timing.kernels.roofline_fit import RooflineFit

    # a launch floor of 5 us: the first regime's "bandwidth" moves its 1 KB in 1 ns, pure floor
    fit = RooflineFit(floor_s=5e-6, edges=(1e3, 1e8), bandwidths=(1e15, 3e12, 2.5e12))
    assert fit.peak_bandwidth == 3e12


def test_held_out_split_of_a_kernel_does_not_depend_on_other_kernels():
    from predictor.timing.calibrate.fit import HOLDOUT_FRACTION, holdout_split

    tr, te = holdout_split(100, 0, "relu")
    assert len(te) == round(HOLDOUT_FRACTION * 100) and len(tr) + len(te) == 100
    assert not set(tr) & set(te)
    # the same kernel, seed and count: the same split, whatever was split before it
    holdout_split(2045, 0, "addmm/fp32")
    tr2, te2 = holdout_split(100, 0, "relu")
    assert np.array_equal(te, te2) and np.array_equal(tr, tr2)
    assert not np.array_equal(te, holdout_split(100, 0, "gelu")[1])  # kernels get their own permutations
    assert not np.array_equal(te, holdout_split(100, 1, "relu")[1])  # and the pack seed matters


def _ragged_or_aligned(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 3) GEMM shapes, half rounded to multiples of 16 (as the calibration draws them)."""
    x = np.round(np.exp(rng.uniform(np.log(16), np.log(1024), size=(n, 3))))
    half = rng.random(n) < 0.5
    x[half] = np.maximum(16.0, np.round(x[half] / 16.0) * 16.0)
    return x


def _fit_with_alignment(x: np.ndarray, t: np.ndarray):
    from predictor.timing.kernels.features import ALIGN16_FEATURES, feature_matrix

    feats = ("m", "n", "k", *ALIGN16_FEATURES)
    raw = feature_matrix({"m": x[:, 0], "n": x[:, 1], "k": x[:, 2]}, feats, len(x))
    return fit_mlp(raw, t, feats, log_features=("m", "n", "k"), work=("m", "n", "k"),
                   grid=[MLPConfig(3, 32, "adam", 1e-2)], epochs=800, seed=0, optional=ALIGN16_FEATURES), feats


def test_alignment_features_are_kept_where_ragged_shapes_run_slower():
    # a BLAS-like cost: a shape with a ragged n pays a tail that doubles its time
    rng = np.random.default_rng(3)
    x = _ragged_or_aligned(rng, 400)
    t = _gemm_like(x[:, 0], x[:, 1], x[:, 2]) * np.where(x[:, 1] % 16 == 0, 1.0, 2.0)
    net, feats = _fit_with_alignment(x[:320], t[:320])
    assert net.config["optional"]["used"] and net.features == feats
    from predictor.timing.kernels.features import feature_matrix

    test = feature_matrix({"m": x[320:, 0], "n": x[320:, 1], "k": x[320:, 2]}, net.features, 80)
    err = np.abs(net.predict(test) / t[320:] - 1) * 100
    assert np.median(err) < 10.0  # without the indicator half the shapes are off by ~33-50 %


def test_alignment_features_are_dropped_where_they_do_not_matter():
    rng = np.random.default_rng(4)
    x = _ragged_or_aligned(rng, 320)
    net, _ = _fit_with_alignment(x, _gemm_like(x[:, 0], x[:, 1], x[:, 2]))
    assert not net.config["optional"]["used"]
    assert net.features == ("m", "n", "k")
    # the net keeps only the columns it was trained on, and a routed model feeds it exactly those
    assert net.predict(x[:4]).shape == (4,)


def test_optional_features_must_be_among_the_features():
    x = np.exp(np.random.default_rng(5).uniform(1, 5, size=(20, 3)))
    with pytest.raises(ValueError, match="optional features"):
        fit_mlp(x, x.prod(axis=1), ("m", "n", "k"), grid=[MLPConfig(3, 8, "adam", 1e-2)], epochs=5,
                optional=("m_al16",))


def test_align16_features_mark_multiples_of_16():
    from predictor.timing.kernels.features import feature_matrix

    cols = {"m": np.array([16.0, 17.0, 1024.0]), "n": np.array([8.0, 32.0, 48.0]), "k": np.array([0.0, 160.0, 5.0])}
    got = feature_matrix(cols, ["m_al16", "n_al16", "k_al16"], 3)
    assert got.tolist() == [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def test_gemm_shape_features_count_bytes_and_atens_small_bmm_path():
    from predictor.timing.kernels.features import feature_matrix

    cols = {"m": np.array([1.0, 7.0, 8.0, 512.0]), "n": np.array([453.0, 7.0, 7.0, 64.0]),
            "k": np.array([185.0, 8.0, 8.0, 32.0]), "batch": np.array([265.0, 1.0, np.nan, 4.0]),
            "dtype_bytes": np.array([4.0, 2.0, 4.0, np.nan])}
    got = feature_matrix(cols, ["gemm_bytes", "bmm_naive"], 4)
    # bytes of A (m k), B (k n) and C (m n) per batch entry; a missing batch is one entry, a missing dtype fp32
    want_bytes = [4 * 265 * (185 + 185 * 453 + 453), 2 * (56 + 56 + 49), 4 * (64 + 56 + 56), 4 * 4 * (512 * 32 + 32 * 64 + 512 * 64)]
    assert got[:, 0].tolist() == want_bytes
    # ATen's per-entry loop runs a bmm whose m n k is below 400: 392 is, 448 is not
    assert got[:, 1].tolist() == [0.0, 1.0, 0.0, 0.0]
    # a 3x3 "same" convolution of 2 images, 8 -> 16 channels on 10 x 10: input 2*8*100, weight 16*72, output 2*16*100
    conv = {"m": np.array([100.0]), "n": np.array([16.0]), "k": np.array([72.0]), "batch": np.array([2.0]),
            "dim": np.array([3.0]), "dtype_bytes": np.array([4.0])}
    assert feature_matrix(conv, ["conv_bytes"], 1)[0, 0] == 4 * (2 * 8 * 100 + 16 * 72 + 2 * 16 * 100)


def test_cpu_gemm_grid_has_aligned_bmm_shapes_and_optional_alignment_features():
    import torch

    from predictor.timing.calibration.base import BenchContext
    from predictor.timing.calibration.gemm import GemmBenchmark
    from predictor.timing.calibration.timing import Timer

    bench = GemmBenchmark()
    ctx = BenchContext(device=torch.device("cpu"), level="quick", rng=np.random.default_rng(0), timer=Timer("cpu"))
    shapes = bench._shapes(ctx, "bmm", 200, 2048, bench.flop_cap(ctx))
    aligned = [s for s in shapes if s[0] % 16 == 0 and s[1] % 16 == 0 and s[2] % 16 == 0]
    assert 0.3 < len(aligned) / len(shapes) < 0.7
    assert max(max(s[:3]) for s in shapes) <= 2048 // 4 + 16
    for spec in bench.specs(ctx):
        # fp32 also tries n on 8- and 4-element steps; bf16 the 16-element flags alone
        want = {"m_al16", "n_al16", "k_al16"} | ({"n_al8", "n_al4"} if spec.kernel.endswith("/fp32") else set())
        assert set(spec.optional_features) == want <= set(spec.raw_features)


def test_large_gemm_shapes_keep_their_drawn_flops_inside_the_dim_bounds() -> None:
    """A dim clipped to the grid's top hands its excess to the others, so the top of the FLOP range is
    sampled (clipping alone left ~1 % of a quick grid above 1e9 FLOPs)."""
    from predictor.timing.calibration.gemm import LARGE_RANGE, large_gemm_shape

    rng = np.random.default_rng(3)
    cap, top = 2.5e9, 2048
    shapes = [large_gemm_shape(rng, 4, top, cap, mult) for mult in (1, 16) for _ in range(400)]
    flops = np.array([2.0 * m * n * k for m, n, k in shapes])
    assert all(4 <= d <= top for s in shapes for d in s)
    assert flops.max() <= cap
    assert all(d % 16 == 0 for s in shapes[400:] for d in s)
    # log-uniform over [cap / LARGE_RANGE, cap]: about a fifth above 1e9 (log 2.5 / log 64), none far below
    assert 0.12 < np.mean(flops > 1e9) < 0.3
    assert np.mean(flops < 0.5 * cap / LARGE_RANGE) < 0.02
