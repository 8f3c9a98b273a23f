"""One net pooled over several GEMM kernels (``ModelSpec.pool``): fitted on their union, routed per op."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from predictor.timing.calibrate import CalibrationError
from predictor.timing.calibrate.fit import fit_models, holdout_split
from predictor.timing.calibration.base import BenchContext
from predictor.timing.calibration.gemm import GemmBenchmark
from predictor.timing.calibration.timing import Timer
from predictor.timing.kernels import TaskView
from predictor.timing.kernels.features import feature_matrix, route_columns
from predictor.timing.kernels.learned import MLPKernelModel
from predictor.timing.platforms import get_platform

CPU = get_platform("cpu-local")
#: seconds per FLOP of the synthetic GEMMs, and the per-call cost of each op (seconds)
RATE = {"addmm": 1 / 40e9, "mm": 1 / 40e9, "bmm": 1 / 20e9}
CALL = {"addmm": 6e-6, "mm": 5e-6, "bmm": 8e-6}


def _cpu_specs():
    import torch

    ctx = BenchContext(device=torch.device("cpu"), level="tiny", rng=np.random.default_rng(0),
                       timer=Timer(torch.device("cpu")))
    return [("gemm", s) for s in GemmBenchmark().specs(ctx) if s.kernel.endswith("/fp32")]


def _gemm_frame(n_each: int = 90, seed: int = 0) -> pd.DataFrame:
    """Synthetic fp32 addmm / mm / bmm samples: per-call cost + FLOPs at the op's rate."""
    rng = np.random.default_rng(seed)
    rows = []
    for op in ("addmm", "mm", "bmm"):
        for _ in range(n_each):
            m, n, k = (int(v) for v in np.exp2(rng.uniform(2, 10, 3)).round())
            b = int(np.exp2(rng.uniform(0, 6)).round()) if op == "bmm" else 1
            flops = 2.0 * m * n * k * b
            rows.append({"kernel": f"{op}/fp32", "kind": op, "m": m, "n": n, "k": k, "batch": b, "dtype_bytes": 4,
                         "flops": flops, "seconds": CALL[op] + flops * RATE[op]})
    return pd.DataFrame(rows)


def test_cpu_gemm_specs_pool_the_three_ops_of_a_dtype_with_route_inputs():
    specs = [s for _f, s in _cpu_specs()]
    assert {s.pool for s in specs} == {"gemm/fp32"}
    assert all(("is_addmm" in s.features and "is_bmm" in s.features and "batch" in s.features) for s in specs)
    assert len({(s.features, s.work) for s in specs}) == 1


def test_pooled_fit_is_one_net_under_every_route_and_scores_each_kernel_on_its_own_split():
    frame = _gemm_frame()
    models, table = fit_models({"gemm": frame}, _cpu_specs(), "tiny", 0, CPU, log=lambda s: None)
    nets = models["gemm"].nets
    assert nets["addmm/fp32"] is nets["mm/fp32"] is nets["bmm/fp32"]
    rows = {r["kernel"]: r for r in table}
    assert set(rows) == {"addmm/fp32", "mm/fp32", "bmm/fp32"}
    for kernel, r in rows.items():
        _, te = holdout_split(int((frame["kernel"] == kernel).sum()), 0, kernel)
        assert r["test"] == len(te)  # each kernel's own held-out 20 %
        assert "one net over addmm/fp32, mm/fp32, bmm/fp32" in r["model"]
        assert r["gmae_pct"] < 25.0  # a smooth synthetic law: the pooled net learns all three ops
    # the op inputs tell the ops apart: one shape, three routes, three times
    view = TaskView.from_columns("addmm", m=[256.0], n=[256.0], k=[256.0], dtype_bytes=[4.0])
    t_addmm = models["gemm"].predict(view, CPU)[0]
    t_bmm = models["gemm"].predict(TaskView.from_columns("bmm", m=[256.0], n=[256.0], k=[256.0], batch=[1.0],
                                                         dtype_bytes=[4.0]), CPU)[0]
    truth = {op: CALL[op] + 2 * 256**3 * RATE[op] for op in ("addmm", "bmm")}
    assert t_addmm == pytest.approx(truth["addmm"], rel=0.3)
    assert t_bmm == pytest.approx(truth["bmm"], rel=0.3)
    assert t_bmm > 1.3 * t_addmm


def test_a_task_without_a_batch_column_is_timed_by_the_pooled_net_not_the_fallback():
    models, _ = fit_models({"gemm": _gemm_frame()}, _cpu_specs(), "tiny", 0, CPU, log=lambda s: None)
    model: MLPKernelModel = models["gemm"]
    view = TaskView.from_columns("linear", m=[128.0], n=[512.0], k=[256.0], dtype_bytes=[4.0])
    got = model.predict(view, CPU)[0]
    net = model.nets["addmm/fp32"]
    cols = {"m": np.array([128.0]), "n": np.array([512.0]), "k": np.array([256.0]), "batch": np.array([1.0]),
            "dtype_bytes": np.array([4.0]), **route_columns("addmm/fp32", 1)}
    assert got == pytest.approx(net.predict(feature_matrix(cols, net.features, 1))[0], rel=1e-9)
    assert got != pytest.approx(model.fallback.predict(view, CPU)[0], rel=1e-3)


def test_pooled_kernels_must_share_one_input_layout():
    specs = _cpu_specs()
    specs[2] = (specs[2][0], dataclasses.replace(specs[2][1], features=(*specs[2][1].features, "gemm_bytes")))
    with pytest.raises(CalibrationError, match="one input layout"):
        fit_models({"gemm": _gemm_frame()}, specs, "tiny", 0, CPU, log=lambda s: None)


def test_a_pool_of_one_is_that_kernels_own_fit():
    frame = _gemm_frame()
    spec = _cpu_specs()[2]  # bmm/fp32 alone
    models, table = fit_models({"gemm": frame}, [spec], "tiny", 0, CPU, log=lambda s: None)
    assert list(models["gemm"].nets) == ["bmm/fp32"]
    assert "one net over" not in table[0]["model"]


def test_route_columns_read_the_op_of_the_route():
    assert {k: v.tolist() for k, v in route_columns("addmm/bf16", 2).items()} == {"is_addmm": [1.0, 1.0],
                                                                                  "is_bmm": [0.0, 0.0]}
    assert {k: v.tolist() for k, v in route_columns("bmm/fp32", 1).items()} == {"is_addmm": [0.0], "is_bmm": [1.0]}
    assert {k: v.tolist() for k, v in route_columns("mm/fp32", 1).items()} == {"is_addmm": [0.0], "is_bmm": [0.0]}


def test_a_pooled_net_is_stored_once_and_shared_again_when_read():
    from predictor.timing.kernels.serialize import model_from_dict, model_to_dict

    models, _ = fit_models({"gemm": _gemm_frame()}, _cpu_specs(), "tiny", 0, CPU, log=lambda s: None)
    d = model_to_dict(models["gemm"])
    assert sum("same_as" in v for v in d["nets"].values()) == 2
    back = model_from_dict(d)
    assert back.nets["addmm/fp32"] is back.nets["mm/fp32"] is back.nets["bmm/fp32"]
    view = TaskView.from_columns("bmm", m=[64.0], n=[32.0], k=[128.0], batch=[8.0], dtype_bytes=[4.0])
    assert back.predict(view, CPU)[0] == pytest.approx(models["gemm"].predict(view, CPU)[0], rel=1e-6)
    d["nets"]["mm/fp32"] = {"same_as": "no/such"}
    with pytest.raises(KeyError, match="no/such"):
        model_from_dict(d)


def test_onednn_gemm_marks_where_aten_hands_a_bf16_gemm_to_onednn():
    # ATen's checksize: batch x m x n x k > 16^3 (strictly); an unbatched task (no or NaN batch) counts as 1
    cols = {"m": np.array([16.0, 16, 2, 16, 1]), "n": np.array([16.0, 16, 2, 16, 4097]),
            "k": np.array([16.0, 16, 2, 16, 1]), "batch": np.array([1.0, 2, 517, np.nan, np.nan])}
    got = feature_matrix(cols, ["onednn_gemm"], 5)[:, 0]
    assert got.tolist() == [0.0, 1.0, 1.0, 0.0, 1.0]
    no_batch = {k: v for k, v in cols.items() if k != "batch"}
    assert feature_matrix(no_batch, ["onednn_gemm"], 5)[:, 0].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_only_the_cpu_bf16_gemm_nets_take_the_onednn_edge():
    import torch

    ctx = BenchContext(device=torch.device("cpu"), level="tiny", rng=np.random.default_rng(0),
                       timer=Timer(torch.device("cpu")))
    for s in GemmBenchmark().specs(ctx):
        has = "onednn_gemm" in s.features
        assert has == s.kernel.endswith("/bf16") and has == ("onednn_gemm" in s.raw_features), s.kernel


def test_bmm_naive_marks_only_the_bmm_rows_of_a_pooled_net():
    cols = {"m": np.array([4.0, 4, 20]), "n": np.array([4.0, 4, 20]), "k": np.array([4.0, 4, 20]),
            "batch": np.array([8.0, 1, 8])}
    assert feature_matrix(cols, ["bmm_naive"], 3)[:, 0].tolist() == [1.0, 1.0, 0.0]  # a bmm net alone
    pooled = {**cols, **{"is_addmm": np.array([0.0, 1, 0]), "is_bmm": np.array([1.0, 0, 1])}}
    assert feature_matrix(pooled, ["bmm_naive"], 3)[:, 0].tolist() == [1.0, 0.0, 0.0]


def test_bmm_intensity_and_the_fine_n_steps():
    """``bmm_intensity`` is log2 of a bmm's FLOPs per operand and result byte on bmm rows and 0 elsewhere; ``n_al8``
    / ``n_al4`` mark ``n`` on 8- / 4-element steps; the CPU fp32 GEMM net takes all three, the bf16 net none."""
    cols = {"m": np.array([16.0, 16, 64]), "n": np.array([16.0, 24, 36]), "k": np.array([16.0, 16, 2]),
            "batch": np.array([8.0, 1, 8]), "dtype_bytes": np.array([4.0, 4, 4]),
            "is_addmm": np.array([0.0, 1, 0]), "is_bmm": np.array([1.0, 0, 1])}
    got = feature_matrix(cols, ["bmm_intensity", "n_al8", "n_al4", "n_al16"], 3)
    # 16^3: 2*4096 FLOPs over 4*(3*256) bytes = 8/3; 64 x 36 x 2: 9216 FLOPs over 4*(128+72+2304) bytes
    np.testing.assert_allclose(got[:, 0], [np.log2(8192 / 3072), 0.0, np.log2(9216 / (4 * 2504))])
    assert got[:, 1].tolist() == [1.0, 1.0, 0.0] and got[:, 2].tolist() == [1.0, 1.0, 1.0]
    assert got[:, 3].tolist() == [1.0, 0.0, 0.0]
    import torch

    ctx = BenchContext(device=torch.device("cpu"), level="tiny", rng=np.random.default_rng(0),
                       timer=Timer(torch.device("cpu")))
    for s in GemmBenchmark().specs(ctx):
        fp32 = s.kernel.endswith("/fp32")
        for f in ("bmm_intensity", "n_al8", "n_al4"):
            assert (f in s.features) == fp32 and (f in s.raw_features) == fp32, (s.kernel, f)
        assert ("n_al8" in s.optional_features) == fp32


def test_short_rows_marks_rows_shorter_than_one_vector():
    cols = {"m": np.array([4.0, 4, 4, 4]), "n": np.array([8.0, 15, 16, 8]), "dtype_bytes": np.array([4.0, 4, 4, 8])}
    assert feature_matrix(cols, ["short_rows"], 4)[:, 0].tolist() == [1.0, 1.0, 0.0, 0.0]
