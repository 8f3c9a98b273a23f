"""experiments/transpose_alignment_cpu.py: the stride hypotheses, the probe's scores, a run on a tiny
calibration, and bad input exiting 2."""

from __future__ import annotations

import numpy as np
import pytest

import predictor.timing.calibrate.fit as calibrate_mod
from experiments import transpose_alignment_cpu as ta
from predictor.timing.calibrate import CalibrationOptions, calibrate
from predictor.timing.calibrate.fit import holdout_split


def _l1(m, n, dtype_bytes=4):
    m = np.asarray(m, float)
    return ta.cache_conflict(m, np.asarray(n, float), np.full(m.size, float(dtype_bytes)), 4096, 8)


def test_conflict_counts_lines_over_the_sets_a_stride_maps_to():
    # fp32 rows 1 KiB apart use 4 of 64 sets: 32 lines fit, 64 rows are twice that
    assert _l1([16, 32, 64, 512], [256] * 4).tolist() == [0.0, 0.0, 1.0, 4.0]
    assert _l1([16, 16], [1024, 4096]).tolist() == [1.0, 1.0]  # one set (8 lines) from 4 KiB on
    assert _l1([512, 512], [255, 257]).tolist() == [0.0, 0.0]  # odd strides spread over every set
    assert _l1([64], [512], dtype_bytes=2).tolist() == [1.0]  # bf16 halves the stride
    nan = ta.cache_conflict(np.array([np.nan, 64.0]), np.array([256.0, np.nan]), np.array([4.0, 4.0]), 4096, 8)
    assert nan.tolist() == [0.0, 0.0]


def test_stride_alias_levels():
    n = np.array([100.0, 128.0, 256.0, 512.0, 1024.0, 4096.0])
    assert ta.stride_alias(n, np.full(n.size, 4.0)).tolist() == [0.0, 0.0, 1.0, 2.0, 3.0, 3.0]


def test_aligned_draws_are_powers_of_two_within_the_cap():
    draws = ta.aligned_transpose_draws(np.random.default_rng(3), 100, 2**24)
    assert len(draws) == 100
    assert all(n & (n - 1) == 0 and 4 <= n <= 4096 and 64 <= b * m * n <= 2**24 for b, m, n in draws)


def test_probe_scores_see_a_slowdown_only_where_there_is_one():
    shapes = ta.probe_shapes()
    assert len(shapes) == 3 * len(ta.PROBE_M) * len(ta.PROBE_N)
    measured = shapes["elements"].to_numpy(float) * 1e-9 * np.where(shapes["pow2"], 2.0, 1.0)
    flat = shapes["elements"].to_numpy(float) * 1e-9
    s = ta.probe_scores(flat, shapes, measured)
    assert s["ratio_meas"] == pytest.approx(2.0, rel=0.01) and s["ratio_pred"] == pytest.approx(1.0, rel=0.01)
    assert s["nb_gmae"] < 1e-2 and s["pow2_gmae"] == pytest.approx(50.0)
    masks = ta.subset_masks(shapes)
    assert masks["all"].all() and not (masks["conflicting"] & masks["rest"]).any()


def test_run_on_a_tiny_calibration(tmp_path):
    out = tmp_path / "p"
    calibrate(CalibrationOptions("cpu", out=out, tiny=True, threads=1, families=["data_movement"]), register=False, log=lambda s: None)
    results, probe = ta.run([out], [], probe_rounds=0, log=lambda s: None)
    assert probe == {} and calibrate_mod.holdout_split is holdout_split
    assert "today's model (MLP on batch, m, n)" in results[0]["scores"]
    assert "## `p`" in ta.markdown(results, "cmd")


@pytest.mark.parametrize("argv", [["--probe-rounds", "-1"], ["--out", "x.txt"]])
def test_bad_input_exits_2(tmp_path, capsys, argv):
    args = ["--packs", str(tmp_path), "--out", str(tmp_path / "r.md"), *argv]
    with pytest.raises(SystemExit) as e:
        ta.main(args)
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error:")
    assert not (tmp_path / "r.md").exists()


def test_a_pack_without_data_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        ta.main(["--packs", str(tmp_path / "none"), "--out", str(tmp_path / "r.md")])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err
