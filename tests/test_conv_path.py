"""The conv2d model's code-path indicator agrees with the path PyTorch picks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from predictor.timing.calibration.base import BenchContext
from predictor.timing.calibration.conv2d import Conv2dBenchmark
from predictor.timing.calibration.timing import Timer
from predictor.timing.kernels.features import conv_align_features, conv_native, feature_matrix
from predictor.timing.platforms.cpu_local import fp32_lanes

SHAPES = list(itertools.product((1, 2, 15, 16, 17), (1, 3, 8), (4, 12, 60), (1, 3, 5)))  # images, C_in, H=W, kh


def _columns() -> dict[str, np.ndarray]:
    n, c, hw, kh = (np.array(x, dtype=float) for x in zip(*SHAPES, strict=True))
    return {"batch": n, "k": c * kh * kh, "m": hw * hw, "dim": kh}


@pytest.mark.skipif(not hasattr(torch._C, "_select_conv_backend"), reason="torch has no backend query")
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_native_matches_pytorchs_choice(threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        picked = []
        for n, c, hw, kh in SHAPES:
            x, w, b = torch.empty(n, c, hw, hw), torch.empty(8, c, kh, kh), torch.empty(8)
            backend = torch._C._select_conv_backend(x, w, b, [1, 1], [kh // 2] * 2, [1, 1], False, [0, 0], 1, None)
            picked.append("Mkldnn" not in str(backend))
    finally:
        torch.set_num_threads(before)
    ours = conv_native(_columns(), single_thread=threads == 1)
    assert ours.tolist() == picked
    assert 0 < sum(picked) < len(picked)  # the grid straddles the edge


def test_conv_spec_takes_the_path_of_its_thread_count() -> None:
    def spec(threads: int):
        ctx = BenchContext(device=torch.device("cpu"), level="tiny", rng=np.random.default_rng(0),
                           timer=Timer("cpu"), threads=threads)
        (s,) = Conv2dBenchmark().specs(ctx)
        return s

    assert "conv_native" in spec(1).features and "conv_native" in spec(1).raw_features
    assert "conv_native_mt" in spec(4).features and "conv_native" not in spec(4).features
    cols = _columns()
    m = feature_matrix(cols, ["conv_native", "conv_native_mt"], len(SHAPES))
    assert set(np.unique(m)) <= {0.0, 1.0}
    assert (m[:, 1] <= m[:, 0]).all()  # more threads: fewer native convolutions


def test_a_conv_model_with_the_path_indicator_recovers_a_slower_native_path():
    """Synthetic convolutions whose native path runs 2x slower at the same FLOPs: the fit puts the known
    factor 2 on the indicator, and a graph task reaches the feature through the routed model."""
    from predictor.timing.kernels.base import TaskView
    from predictor.timing.kernels.learned import MLPKernelModel
    from predictor.timing.kernels.mlp import MLPConfig, fit_mlp
    from predictor.timing.platforms import get_platform

    rng = np.random.default_rng(0)
    n_samples = 500
    kh = rng.choice([1.0, 3.0], n_samples)
    cols = {"batch": np.round(np.exp(rng.uniform(0, np.log(64), n_samples))),
            "k": np.round(np.exp(rng.uniform(np.log(8), np.log(256), n_samples))) * kh * kh,
            "m": np.round(np.exp(rng.uniform(np.log(16), np.log(4096), n_samples))),
            "n": np.round(np.exp(rng.uniform(np.log(8), np.log(256), n_samples))), "dim": kh}
    native = conv_native(cols)
    flops = 2 * cols["m"] * cols["n"] * cols["k"] * cols["batch"]
    seconds = (2e-6 + flops / 5e10) * np.where(native, 2.0, 1.0)
    feats = ("m", "n", "k", "batch", "dim", "conv_native")
    raw = feature_matrix(cols, feats, n_samples)
    net = fit_mlp(raw[:400], seconds[:400], feats, log_features=feats[:-1], work=("m", "n", "k", "batch"),
                  grid=[MLPConfig(3, 32, "adam", 1e-2)], epochs=800, seed=0)
    model = MLPKernelModel("mlp-conv2d", ("conv2d",), {"conv2d/fp32": net}, router="dtype", prefix="conv2d",
                           fallback="analytic-gemm")
    view = TaskView.from_columns("conv2d", **{c: v[400:] for c, v in cols.items()},
                                      dtype_bytes=np.full(100, 4.0))
    pred = model.predict(view, get_platform("cpu-local"))
    err = np.abs(pred / seconds[400:] - 1)
    assert np.median(err) < 0.15 and native[400:].any() and (~native[400:]).any()
    assert np.median(err[native[400:]]) < 0.25
    # the parameter recovered: the same shapes with the indicator flipped cost half (native) or twice
    flipped = raw[400:].copy()
    flipped[:, -1] = 1.0 - flipped[:, -1]
    ratio = net.predict(raw[400:]) / net.predict(flipped)
    assert 1.7 < np.median(ratio[native[400:]]) < 2.3
    assert 1.7 < 1.0 / np.median(ratio[~native[400:]]) < 2.3


def test_channel_alignment_inputs_mark_channel_counts_on_a_vector_boundary() -> None:
    # C_out = n; C_in = k / kh^2
    cols = {"n": np.array([16.0, 24.0, 32.0, 8.0]), "k": np.array([16.0 * 9, 8.0 * 9, 3.0, 48.0 * 25]),
            "dim": np.array([3.0, 3.0, 1.0, 5.0])}
    m = feature_matrix(cols, ["cout_al16", "cin_al16", "cout_al8", "cin_al8"], 4)
    assert m[:, 0].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert m[:, 1].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert m[:, 2].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert m[:, 3].tolist() == [1.0, 1.0, 0.0, 1.0]


def test_conv_spec_takes_the_alignment_inputs_on_avx512_only() -> None:
    assert fp32_lanes("AVX512") == 16 and fp32_lanes("AVX2") == 8 and fp32_lanes("DEFAULT") == 4
    assert fp32_lanes(None) == 16  # packs without the field were all calibrated on AVX-512 machines
    assert conv_align_features(16) == ("cout_al16", "cin_al16") and conv_align_features(8) == ()

    def spec(lanes: int):
        ctx = BenchContext(device=torch.device("cpu"), level="tiny", rng=np.random.default_rng(0),
                           timer=Timer("cpu"), threads=1, simd_lanes=lanes)
        (s,) = Conv2dBenchmark().specs(ctx)
        return s

    wide, narrow = spec(16), spec(8)
    assert wide.features[-2:] == ("cout_al16", "cin_al16") and {"cout_al16", "cin_al16"} <= set(wide.raw_features)
    assert not set(narrow.features) & {"cout_al16", "cin_al16", "cout_al8", "cin_al8"}
    assert not wide.optional_features  # plain inputs: the optional group was 0.7 points worse


def test_a_conv_model_with_the_alignment_inputs_recovers_a_faster_aligned_path() -> None:
    """Synthetic convolutions whose output channels on a 16-boundary run 1.25x faster at the same FLOPs: the fit
    recovers the factor through ``cout_al16``."""
    from predictor.timing.kernels.mlp import MLPConfig, fit_mlp

    rng = np.random.default_rng(1)
    n_samples = 600
    kh = rng.choice([1.0, 3.0], n_samples)
    cols = {"batch": np.round(np.exp(rng.uniform(0, np.log(32), n_samples))),
            "k": 8.0 * rng.integers(1, 32, n_samples) * kh * kh,
            "m": np.round(np.exp(rng.uniform(np.log(16), np.log(4096), n_samples))),
            "n": 8.0 * rng.integers(1, 32, n_samples), "dim": kh}
    aligned = np.mod(cols["n"], 16) == 0
    flops = 2 * cols["m"] * cols["n"] * cols["k"] * cols["batch"]
    seconds = (2e-6 + flops / 5e10) / np.where(aligned, 1.25, 1.0)
    feats = ("m", "n", "k", "batch", "dim", "cout_al16", "cin_al16")
    raw = feature_matrix(cols, feats, n_samples)
    net = fit_mlp(raw, seconds, feats, log_features=feats[:5], work=("m", "n", "k", "batch"),
                  grid=[MLPConfig(3, 32, "adam", 1e-2)], epochs=800, seed=0)
    flipped = raw.copy()
    flipped[:, 5] = 1.0 - flipped[:, 5]
    ratio = net.predict(flipped) / net.predict(raw)  # aligned rows made ragged: slower by the factor
    assert 1.15 < np.median(ratio[aligned]) < 1.35
    assert 1.15 < 1.0 / np.median(ratio[~aligned]) < 1.35
