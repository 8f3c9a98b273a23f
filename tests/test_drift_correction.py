"""The offline drift-correction experiment (experiments/drift_correction_cpu.py), without measuring."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.drift_correction_cpu import DriftScaled, drift_ratios, main
from predictor.sources.synth.mlp import MLPSpec, build_mlp_graph
from predictor.timing.kernels import timing_for


def test_drift_ratios_take_the_geometric_mean_of_the_probes() -> None:
    w = {"gemm_drift": {"before": {"ratio_geomean": 0.81}, "after": {"ratio_geomean": 1.0},
                        "memory_before": {"ratio_geomean": 1.44}, "memory_after": {"ratio_geomean": 1.0}}}
    assert drift_ratios(w) == pytest.approx((0.9, 1.2))
    assert drift_ratios({"gemm_drift": {"before": {"ratio_geomean": 1.21}, "after": {"ratio_geomean": 1.0}}}) == \
        pytest.approx((1.1, 1.0))  # no memory probe: memory unscaled
    assert drift_ratios({"rows": []}) is None


def test_scaling_touches_compute_and_memory_kernels_only() -> None:
    g = build_mlp_graph(MLPSpec(input_dim=64, hidden=(128,), classes=10, batch_size=32), mode="host")
    base = timing_for("cpu-local")
    d0 = np.asarray(base.durations(g))
    d = np.asarray(DriftScaled(base, 2.0, 3.0).durations(g))
    kinds = np.asarray(g.kinds)[g.kind]
    gemm = np.isin(kinds, ["addmm", "mm", "linear", "gemm", "matmul", "bmm"])
    assert gemm.any()
    np.testing.assert_allclose(d[gemm], 2.0 * d0[gemm])
    assert (d >= d0).all()


def test_an_archive_without_probes_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    arch = tmp_path / "w.json"
    arch.write_text(json.dumps([{"measured_at": "x", "rows": [{"model": "mlp", "batch": 64, "measured_s": 0.01}]}]))
    with pytest.raises(SystemExit) as e:
        main(["--archive", str(arch), "--out", str(tmp_path / "out")])
    assert e.value.code == 2 and "no window with drift probes" in capsys.readouterr().err
    assert not (tmp_path / "out.md").exists()
