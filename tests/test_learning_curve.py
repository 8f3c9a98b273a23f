"""experiments/learning_curve.py: fits on growing shares of a stored pack's training split; bad input exits 2."""

from __future__ import annotations

import pytest

import predictor.timing.calibrate.fit as calibrate_mod
from experiments import learning_curve
from predictor.timing.calibrate import CalibrationOptions, calibrate
from predictor.timing.calibrate.fit import holdout_split


def test_shares_grow_the_training_set_and_keep_the_split(tmp_path):
    out = tmp_path / "p"
    calibrate(CalibrationOptions("cpu", out=out, tiny=True, threads=1, families=["elementwise"]), register=False, log=lambda s: None)
    df = learning_curve.run([out], ["add"], [0.5, 1.0], log=lambda s: None)
    assert list(df.share) == [0.5, 1.0]
    assert df.train.iloc[0] < df.train.iloc[1]
    assert df.test.nunique() == 1  # the held-out set does not move with the share
    assert calibrate_mod.holdout_split is holdout_split  # the patch is undone
    assert "## add" in learning_curve.markdown(df, "cmd")


@pytest.mark.parametrize("argv", [["--shares", "0"], ["--shares", "1.5"], []])
def test_bad_input_exits_2(tmp_path, capsys, argv):
    args = ["--packs", str(tmp_path), "--kernels", "add", "--out", str(tmp_path / "r.md"), *argv]
    with pytest.raises(SystemExit) as e:
        learning_curve.main(args)
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error:")
    assert not (tmp_path / "r.md").exists()
