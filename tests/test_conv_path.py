"""The conv2d model's code-path indicator agrees with the path PyTorch picks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from predictor.calibration.base import BenchContext
from predictor.calibration.conv2d import Conv2dBenchmark
from predictor.calibration.timing import Timer
from predictor.kernels.learned import conv_native, feature_matrix

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

    assert spec(1).features[-1] == "conv_native" and spec(1).raw_features == ("conv_native",)
    assert spec(4).features[-1] == "conv_native_mt"
    cols = _columns()
    m = feature_matrix(cols, ["conv_native", "conv_native_mt"], len(SHAPES))
    assert set(np.unique(m)) <= {0.0, 1.0}
    assert (m[:, 1] <= m[:, 0]).all()  # more threads: fewer native convolutions
