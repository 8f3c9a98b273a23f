"""experiments/fit_precision.py: the float64 / float32 comparison table and its bad input."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.fit_precision import main, markdown


def test_markdown_gives_both_precisions_and_their_geomeans() -> None:
    df = pd.DataFrame([
        {"pack": "p", "kernel": "k1", "precision": "float64", "samples": 50, "gmae_pct": 4.0, "max_pct": 9.0,
         "fit_s": 10.0, "model": "m"},
        {"pack": "p", "kernel": "k1", "precision": "float32", "samples": 50, "gmae_pct": 4.0, "max_pct": 9.0,
         "fit_s": 5.0, "model": "m"},
        {"pack": "p", "kernel": "k2", "precision": "float64", "samples": 60, "gmae_pct": 9.0, "max_pct": 20.0,
         "fit_s": 20.0, "model": "m"},
        {"pack": "p", "kernel": "k2", "precision": "float32", "samples": 60, "gmae_pct": 1.0, "max_pct": 2.0,
         "fit_s": 10.0, "model": "m"},
    ])
    text = markdown(df, "cmd", "CPU: x.")
    assert "| k1 | 50 | 4.00 | 4.00 | 10.0 | 5.0 |" in text
    assert "float64 6.00 %, float32 2.00 %; fitting 30 s against 15 s" in text


def test_a_missing_pack_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--packs", str(tmp_path / "none"), "--out", str(tmp_path / "o.md")])
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("error: ")
    assert not (tmp_path / "o.md").exists()
