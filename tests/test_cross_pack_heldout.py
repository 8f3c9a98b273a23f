"""experiments/cross_pack_heldout.py: a pack's models on its own held-out samples reproduce its error table;
bad input exits 2 with one line."""

from __future__ import annotations

import json

import pytest

from experiments import cross_pack_heldout
from predictor.timing.calibrate import CalibrationOptions, calibrate


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory):
    out = tmp_path_factory.mktemp("cross") / "p"
    calibrate(CalibrationOptions("cpu", out=out, tiny=True, threads=1, families=["elementwise"]), register=False, log=lambda s: None)
    return out


def test_own_data_reproduces_the_error_table(tiny_pack, tmp_path):
    out = tmp_path / "r"
    cross_pack_heldout.main(["--models", str(tiny_pack), "--data", str(tiny_pack), "--families", "elementwise",
                             "--out", str(out)])
    rows = {r["kernel"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    table = {r["kernel"]: r for r in json.loads((tiny_pack / "manifest.json").read_text())["error_table"]}
    assert rows and set(rows) <= set(table)
    for kernel, r in rows.items():
        assert r["n"] == table[kernel]["test"]
        # the CSV stores 6 significant digits: each sample's error moves by up to ~1e-3 points, which the
        # mean absorbs but a geomean does not when one sample's error is near zero (clipped at 1e-3 %)
        assert r["mape_pct"] == pytest.approx(table[kernel]["mape_pct"], abs=1e-2)
        assert r["gmae_pct"] == pytest.approx(table[kernel]["gmae_pct"], rel=5e-2)
        assert r["gmae_level_pct"] > 0 and r["level"] > 0
    assert "held-out samples of" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("families", [["gemm"], ["no_such_family"]])
def test_a_family_the_data_lack_exits_2(tiny_pack, tmp_path, capsys, families):
    out = tmp_path / "r"
    with pytest.raises(SystemExit) as e:
        cross_pack_heldout.main(["--models", str(tiny_pack), "--data", str(tiny_pack), "--families", *families,
                                 "--out", str(out)])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error:")
    assert not out.with_suffix(".md").exists()


def test_a_folder_that_is_not_a_pack_exits_2(tiny_pack, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cross_pack_heldout.main(["--models", str(tiny_pack), "--data", str(tmp_path), "--families", "elementwise",
                                 "--out", str(tmp_path / "r")])
    assert e.value.code == 2
    assert "not an asset pack" in capsys.readouterr().err
