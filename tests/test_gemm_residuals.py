"""experiments/gemm_residuals_cpu.py: the agreement of two timings of one grid, a pack's residuals by shape group
and by n mod 16; bad input exits 2 with one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments import gemm_residuals_cpu as gr


def _data_pack(path: Path, seconds: np.ndarray, shapes: pd.DataFrame) -> Path:
    (path / "data").mkdir(parents=True)
    shapes.assign(kernel="bmm/fp32", kind="bmm", seconds=seconds).to_csv(path / "data" / "gemm.csv", index=False)
    return path


def _shapes(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({c: rng.integers(8, 200, n) for c in ("m", "n", "k", "batch")})


def test_two_timings_of_one_grid_agree_to_their_known_scatter(tmp_path: Path):
    shapes = _shapes(400)
    base = 1e-4 * (1 + shapes["m"].to_numpy() / 100)
    # the second spell 10 % slower overall, each shape off by exactly +-2 % around that
    sign = np.where(np.arange(400) % 2 == 0, 1.02, 1 / 1.02)
    a = _data_pack(tmp_path / "a", base, shapes)
    b = _data_pack(tmp_path / "b", base * 1.1 * sign, shapes)
    out = tmp_path / "r"
    gr.main(["--repeat", str(a), str(b), "--out", str(out)])
    rep = json.loads(out.with_suffix(".json").read_text())["repeat"]
    level = 1.1 * (1.02 + 1 / 1.02) / 2  # the median of 200 values of each kind: their mean
    assert rep["common"] == 400 and rep["level"] == pytest.approx(level, rel=1e-9)
    assert rep["all"]["gmae_pct"] == pytest.approx((1.1 * 1.02 / level - 1) * 100, rel=1e-2)  # ~1.98 % each way
    assert "Two timings of one grid" in out.with_suffix(".md").read_text()


def test_residual_groups_and_the_n_mod_16_pattern():
    rows = pd.DataFrame({"m": [16, 16, 17, 16], "n": [16, 24, 24, 40], "k": [16, 16, 3, 16], "batch": [1, 1, 1, 1],
                         "seconds": [1.0, 1.0, 1.0, 1.0]})
    # a fake model 20 % over on n = 8 mod 16, exact elsewhere
    r = rows.assign(pred=np.where(rows["n"] % 16 == 8, 1.2, 1.0))
    r = r.assign(log_ratio=np.log(r["pred"] / r["seconds"]))
    g = {x["group"]: x for x in gr.groups(r)}
    assert g["aligned (m, n, k multiples of 16)"]["n"] == 1 and g["ragged"]["n"] == 3
    assert g["k < 8"]["n"] == 1 and g["k < 8"]["median_signed_pct"] == pytest.approx(20.0)
    by = {b["n_mod_16"]: b for b in gr.by_n_mod16(r)}
    assert by[8]["n"] == 3 and by[8]["median_signed_pct"] == pytest.approx(20.0) and by[0]["median_signed_pct"] == 0


@pytest.mark.parametrize("args, message", [
    ([], "give --repeat A B"),
    (["--pack", "x"], "--pack needs --data"),
    (["--repeat", "NOPE", "NOPE"], "no GEMM benchmark table"),
])
def test_bad_input_exits_2(tmp_path: Path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        gr.main([*args, "--out", str(tmp_path / "r")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err
    assert not (tmp_path / "r.md").exists()
