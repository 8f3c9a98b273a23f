"""benchmarks/heldout_retime_cpu.py: a tiny calibration's held-out cases rebuild and re-time; bad packs exit 2."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from predictor.timing.calibrate import CalibrationOptions, calibrate

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("heldout_retime_cpu", ROOT / "benchmarks" / "heldout_retime_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory):
    out = tmp_path_factory.mktemp("retime") / "p"
    calibrate(CalibrationOptions("cpu", out=out, tiny=True, threads=1, families=["elementwise", "data_movement"]), register=False, log=lambda s: None)
    return out


def test_held_out_cases_rebuild_the_stored_shapes(tiny_pack):
    mod = _module()
    cases, pack = mod.held_out_cases(tiny_pack)
    assert cases, "no held-out cases"
    assert pack.manifest["families"] == ["elementwise", "data_movement"]
    kernels = {c["kernel"] for c in cases}
    assert {"memcpy", "add"} <= kernels
    assert all(c["stored_s"] > 0 and c["model_s"] > 0 for c in cases)
    times = mod.retime(cases[:6], rounds=2, llc=32 * 2**20, log=lambda s: None)
    assert times.shape == (6, 2) and np.all(times > 0)
    per = mod.summarise(cases[:6], times)
    assert set(per.columns) >= {"model_vs_stored", "stored_vs_now", "model_vs_now", "drift"}
    assert np.all(per.drift > 0)


def test_a_changed_grid_is_refused(tiny_pack, tmp_path):
    import shutil

    mod = _module()
    bad = tmp_path / "bad"
    shutil.copytree(tiny_pack, bad)
    man = json.loads((bad / "manifest.json").read_text())
    man["seed"] = 12345  # another seed draws other shapes
    (bad / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(mod.RetimeError, match="does not rebuild the stored shape"):
        mod.held_out_cases(bad)


def test_bad_input_exits_2(tmp_path, capsys):
    mod = _module()
    for argv in (["--pack", str(tmp_path / "missing")], ["--pack", str(tmp_path), "--rounds", "0"]):
        with pytest.raises(SystemExit) as e:
            mod.main([*argv, "--out", str(tmp_path / "r")])
        assert e.value.code == 2
        assert capsys.readouterr().err.startswith("error:")
    assert not (tmp_path / "r.md").exists()
