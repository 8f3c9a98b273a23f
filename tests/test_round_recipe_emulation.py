"""The offline round-recipe experiment (experiments/round_recipe_emulation.py), without refitting."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.round_recipe_emulation import emulate_fresh_rounds, main

REPO = Path(__file__).resolve().parents[1]


def _table(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    lo = rng.uniform(1e-5, 1e-3, n)
    return pd.DataFrame({"kernel": "add", "seconds": lo * 1.1, "median_s": lo, "pass_spread": 0.3, "rounds": 3})


def test_emulation_keeps_one_of_the_three_round_values_or_their_median(tmp_path) -> None:
    _table(400).to_csv(tmp_path / "elementwise.csv", index=False)
    lines = emulate_fresh_rounds(tmp_path, keep=0.62, seed=0)
    out = pd.read_csv(tmp_path / "elementwise.csv")
    lo = _table(400)["median_s"].to_numpy()
    ratio = out["seconds"].to_numpy() / lo
    # each new sample is one round (1, 1.1, 1.3), or the median of two (1.05, 1.15, 1.2) or three (1.1)
    allowed = np.array([1.0, 1.05, 1.1, 1.15, 1.2, 1.3])
    assert np.abs(ratio[:, None] - allowed[None, :]).min(axis=1).max() < 1e-9
    counts = np.bincount(out["rounds"], minlength=4)[1:]
    assert counts.min() > 0 and len(lines) == 1 and lines[0].startswith("| elementwise | 400 |")


def test_a_pack_of_the_old_recipe_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    # a stored pack of the old recipe (session 16's --scale 4 calibration), its tables left out
    pack = tmp_path / "old"
    shutil.copytree(REPO / "benchmarks/results/data/packs/cpu-scale4", pack, ignore=shutil.ignore_patterns("*.csv"))
    with pytest.raises(SystemExit) as e:
        main(["--pack", str(pack), "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "later_rounds" in err[0]
    assert not (tmp_path / "out.md").exists()
