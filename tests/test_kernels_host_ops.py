"""Kernel models of host ops no calibration benchmarks: dense embedding lookups and gradients, fills and
reductions (composed of a timing's data-movement and element-wise models), and how a what-if uses them."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.composite import MemoryPassModel, host_op_models
from predictor.timing.kernels.embedding import DenseEmbeddingModel
from predictor.timing.kernels.timing import ModelTiming
from predictor.timing.platforms import get_platform


@pytest.fixture(scope="module")
def timing():
    return ModelTiming(get_platform("cpu-local"))


def _view(kind: str, **cols) -> TaskView:
    return TaskView.from_columns(kind, **{k: np.asarray(v, dtype=float) for k, v in cols.items()})


SIZES = np.array([1.0, 4.0, 16.0, 64.0, 256.0, 1024.0])


def _cases():
    """(kind, view over growing sizes) of every kind the host-op models claim."""
    s = SIZES
    return [
        ("embedding", _view("embedding", elements=4096 * s * 64, dim=np.full(s.size, 64.0),
                            rows=np.full(s.size, 1000.0), dtype_bytes=np.full(s.size, 4.0))),
        ("embedding_bwd", _view("embedding_bwd", elements=4096 * s * 64, dim=np.full(s.size, np.nan),
                                rows=np.full(s.size, np.nan), dtype_bytes=np.full(s.size, 4.0))),
        ("embedding_bag_bwd_dense", _view("embedding_bag_bwd_dense", batch=32 * s, pooling=np.full(s.size, 10.0),
                                          dim=np.full(s.size, 16.0), dtype_bytes=np.full(s.size, 4.0))),
        ("fill", _view("fill", elements=8192 * s, dtype_bytes=np.full(s.size, 4.0))),
        ("reduce", _view("reduce", elements=8192 * s, dtype_bytes=np.full(s.size, 4.0))),
    ]


@pytest.mark.parametrize("kind,view", _cases(), ids=[c[0] for c in _cases()])
def test_host_op_models_are_positive_and_monotone(timing, kind, view):
    model = next(m for m in host_op_models(timing.model_for) if kind in m.kinds)
    t = model.predict(view, timing.platform)
    assert t.shape == (SIZES.size,) and np.all(np.isfinite(t))
    assert np.all(t >= timing.platform.kernel_floor_s)
    assert np.all(np.diff(t) > 0)  # more lookups / elements: more time


@pytest.mark.parametrize("kind,view", _cases(), ids=[c[0] for c in _cases()])
def test_host_op_models_grow_linearly_above_the_floor(timing, kind, view):
    """Every term grows with the lookups (elements): far above the floor, 4x the size is 4x the time less
    the floor's share (the models price bytes with the data-movement roofline)."""
    model = next(m for m in host_op_models(timing.model_for) if kind in m.kinds)
    t = model.predict(view, timing.platform) - timing.platform.kernel_floor_s
    assert t[-1] / t[-2] == pytest.approx(4.0, rel=0.02)


def test_dense_embedding_traffic():
    m = DenseEmbeddingModel(lambda kind: None)
    fwd = m.traffic_bytes(_view("embedding", elements=[640.0], dim=[64.0], dtype_bytes=[4.0]))
    assert fwd[0] == pytest.approx(2 * 640 * 4 + 10 * 8)  # rows read, output written, 10 int64 indices
    bwd = m.traffic_bytes(_view("embedding_bwd", elements=[640.0], dim=[64.0], rows=[100.0], dtype_bytes=[4.0]))
    assert bwd[0] == pytest.approx(3 * 640 * 4 + 10 * 8 + 100 * 64 * 4)  # + zeroing the table gradient
    bag = m.traffic_bytes(_view("embedding_bag_bwd_dense", batch=[2.0], pooling=[5.0], dim=[4.0], dtype_bytes=[4.0]))
    assert bag[0] == pytest.approx(2 * 4 * 4 + 2 * 10 * 4 * 4 + 10 * 8)


def test_missing_parameters_price_the_floor(timing):
    m = DenseEmbeddingModel(timing.model_for)
    t = m.predict(_view("embedding_bag_bwd_dense", batch=[np.nan], dim=[16.0]), timing.platform)
    assert t[0] == pytest.approx(timing.platform.kernel_floor_s)
    assert MemoryPassModel(timing.model_for).predict(_view("fill", elements=[np.nan]), timing.platform)[0] > 0


def test_what_if_timing_prices_the_host_kinds_with_models(timing):
    """The what-if timing claims the host kinds its timing's models do not (no work-ratio fallback) but the
    dense bag backward, which keeps the calibrated sparse backward's ratio; a kernel whose traced time was
    all profiler cost (corrected to 0) still grows by the model's increment."""
    from predictor.whatif.timing import RATIO_ALIAS, WhatIfTiming, anchored_time

    wt = WhatIfTiming(timing, "anchored")
    for kind in ("embedding", "embedding_bwd", "fill", "reduce"):
        assert wt.has_model(kind)
    assert not wt.has_model("embedding_bag_bwd_dense") and "embedding_bag_bwd_dense" in RATIO_ALIAS
    out = anchored_time(np.array([0.0]), np.array([5e-4]), np.array([1e-5]), np.array([3e-5]))
    assert out[0] == pytest.approx(2e-5)
