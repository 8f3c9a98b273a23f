"""experiments/fit_recipe.py: the recipe-variant table and its bad input."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.fit_recipe import main, markdown, parse_variant


def _row(kernel: str, variant: str, gmae: float, fit_s: float, n: int = 50) -> dict:
    return {"pack": "p", "kernel": kernel, "variant": variant, "samples": n, "gmae_pct": gmae, "max_pct": 2 * gmae,
            "fit_s": fit_s, "model": "m"}


def test_markdown_gives_every_variant_and_their_geomeans() -> None:
    df = pd.DataFrame([_row("k1", "float64x5", 4.0, 10.0), _row("k1", "float32x3", 4.0, 5.0),
                       _row("k2", "float64x5", 9.0, 20.0, 60), _row("k2", "float32x3", 1.0, 10.0, 60)])
    text = markdown(df, "cmd", "CPU: x.")
    assert "| k1 | 50 | 4.00 | 4.00 | 10.0 | 5.0 |" in text
    assert "float64x5 6.00 %, float32x3 2.00 %; fitting float64x5 30 s, float32x3 15 s" in text


def test_variants_parse_and_a_bad_one_is_one_line_and_exit_2(capsys) -> None:
    assert parse_variant("float32x3") == ("float32", 3)
    with pytest.raises(SystemExit) as exc:
        parse_variant("float16x2")
    assert exc.value.code == 2 and "expected PRECISIONxMEMBERS" in capsys.readouterr().err


def test_a_missing_pack_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--packs", str(tmp_path / "none"), "--out", str(tmp_path / "o.md")])
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("error: ")
    assert not (tmp_path / "o.md").exists()
