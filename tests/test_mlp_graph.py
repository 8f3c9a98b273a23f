"""The MLP synthesiser: eager PyTorch's ops of one training iteration."""

from __future__ import annotations

import pytest

from predictor.graph import Category
from predictor.simulate import simulate
from predictor.sources.synth.mlp import MLPSpec, build_mlp_graph
from predictor.timing.kernels import ModelTiming
from predictor.timing.platforms import get_platform

CPU = get_platform("cpu-local")


def _kernels(g):
    df = g.tasks_frame()
    return df[df.kind != "overhead"]


def test_host_graph_has_pytorchs_gemms_and_sgd_loop():
    spec = MLPSpec(input_dim=20, hidden=(64, 32), classes=5, batch_size=16)
    g = build_mlp_graph(spec)
    df = _kernels(g)
    assert set(df.processor) == {"cpu"} and not g.is_gpu().any()
    gemms = df[df.kind.isin(["addmm", "mm"])]
    # forward addmm per layer; backward wgrad per layer, dgrad for all but the first
    assert list(gemms[gemms.kind == "addmm"].name) == ["fc0.addmm", "fc1.addmm", "fc2.addmm"]
    assert sorted(gemms[gemms.kind == "mm"].name) == sorted(
        ["fc2.dgrad", "fc2.wgrad", "fc1.dgrad", "fc1.wgrad", "fc0.wgrad"])
    shapes = {n: (m, nn, k) for n, m, nn, k in zip(df.name, g.params["m"][df.index], g.params["n"][df.index],
                                                   g.params["k"][df.index], strict=True) if n.startswith("fc")}
    assert shapes["fc1.addmm"] == (16, 32, 64)  # m = batch, n = out, k = in
    assert shapes["fc1.dgrad"] == (16, 64, 32)  # grad @ W
    assert shapes["fc1.wgrad"] == (32, 64, 16)  # grad^T @ input: [out x batch] @ [batch x in]
    assert (df.kind == "add").sum() == 6  # SGD add_ per weight and bias
    assert (df.kind == "relu").sum() == 2 and (df.kind == "relu_bwd").sum() == 2  # two activations, fwd and bwd
    # total FLOPs of the GEMMs: 3 passes minus the first layer's input gradient
    flops = sum(2 * spec.batch_size * i * o for _, i, o in spec.layers()) * 3 - 2 * spec.batch_size * 20 * 64
    assert float(g.flops[(g.category == Category.COMPUTE)].sum()) == pytest.approx(flops)


def test_host_iteration_is_the_serial_sum_and_grows_with_batch():
    timing = ModelTiming(CPU)
    small = simulate(build_mlp_graph(MLPSpec(256, (512, 512), 10, 64)), timing)
    big = simulate(build_mlp_graph(MLPSpec(256, (512, 512), 10, 1024)), timing)
    assert small.iteration_s == pytest.approx(float(small.duration.sum()), rel=1e-9)
    assert big.iteration_s > 4 * small.kernel_sum_s()
    assert small.kernel_sum_s() < small.iteration_s


def test_device_mode_builds():
    g = build_mlp_graph(MLPSpec(8, (16,), 2, 4, loss="mse"), mode="device")
    assert g.is_gpu().any()


@pytest.mark.parametrize("bad, match", [
    (dict(batch_size=0), ">= 1"),
    (dict(activation="swish"), "activation"),
    (dict(loss="hinge"), "loss"),
])
def test_bad_spec_is_one_clear_error(bad, match):
    spec = MLPSpec(**{**dict(input_dim=4, hidden=(8,), classes=2, batch_size=4), **bad})
    with pytest.raises(ValueError, match=match):
        build_mlp_graph(spec)
