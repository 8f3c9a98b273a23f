"""Kernel models fitted to each sample's fastest round, brought back to the machine's typical state by a
measured per-kind factor (``fit_target="fastest_round"``, :mod:`predictor.timing.kernels.state`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from predictor.timing.calibrate import CalibrationError, error_table_markdown
from predictor.timing.calibrate.fit import fit_models
from predictor.timing.calibration.base import BenchContext
from predictor.timing.calibration.elementwise import ElementwiseBenchmark
from predictor.timing.calibration.timing import Timer
from predictor.timing.kernels import TaskView
from predictor.timing.kernels.elementwise import Roofline
from predictor.timing.kernels.roofline_fit import FittedRoofline, RooflineFit
from predictor.timing.kernels.serialize import model_from_dict, model_to_dict
from predictor.timing.kernels.state import StateScaled, state_factor, unwrap
from predictor.timing.kernels.timing import ModelTiming
from predictor.timing.platforms import get_platform

CPU = get_platform("cpu-local")


def test_state_factor_is_the_median_ratio_over_multi_round_samples():
    rng = np.random.default_rng(0)
    fastest = np.exp(rng.uniform(np.log(1e-6), np.log(1e-2), 400))
    ratio = 1.08 * np.exp(rng.normal(0.0, 0.03, 400))
    rounds = np.full(400, 3.0)
    rounds[:50] = 1.0  # one-round samples: both estimates are the same timing
    typical = np.where(rounds >= 2, fastest * ratio, fastest)
    assert state_factor(typical, fastest, rounds) == pytest.approx(1.08, rel=0.01)
    # without the rounds the one-round samples pull it towards 1
    assert state_factor(typical, fastest) < state_factor(typical, fastest, rounds)
    assert state_factor(fastest, fastest, np.ones(400)) == 1.0  # nothing to measure the state on
    assert state_factor(typical, fastest, np.where(rounds >= 2, np.nan, 1.0)) == pytest.approx(1.08, rel=0.01)
    assert state_factor(fastest * 0.9, fastest) == 1.0  # never below the fastest round


def test_state_scaled_multiplies_per_kind_and_survives_serialisation():
    roof = FittedRoofline({"add": RooflineFit(2e-6, (), (40e9,)), "relu": RooflineFit(1e-6, (), (30e9,))}, generic="add")
    model = StateScaled(roof, {"add": 1.10, "relu": 1.02, "*": 1.05})
    for kind, f in (("add", 1.10), ("relu", 1.02), ("optimizer", 1.05)):
        view = TaskView.from_columns(kind, bytes=[1e3, 1e7])
        np.testing.assert_allclose(model.predict(view, CPU), roof.predict(view, CPU) * f)
        np.testing.assert_allclose(model.predict_undisturbed(view, CPU), roof.predict(view, CPU))
        again = model_from_dict(model_to_dict(model))
        np.testing.assert_allclose(again.predict(view, CPU), model.predict(view, CPU))
    assert unwrap(model) is roof and unwrap(roof) is roof
    with pytest.raises(ValueError, match="positive"):
        StateScaled(roof, {"add": 0.0})
    # the timing layer still finds the calibrated roofline as the fallback of unclaimed kinds
    timing = ModelTiming(CPU, [model])
    assert timing.model_for("no_such_kind") is model and isinstance(unwrap(timing.model_for("x")), Roofline)


def _elementwise_specs():
    ctx = BenchContext(device=torch.device("cpu"), level="tiny", rng=np.random.default_rng(0),
                       timer=Timer(torch.device("cpu")))
    return [("elementwise", s) for s in ElementwiseBenchmark().specs(ctx) if s.kernel == "add"]


def _synthetic_rounds(n: int, rng: np.random.Generator, state: float) -> tuple[pd.DataFrame, np.ndarray]:
    """An ``add`` benchmark table whose fastest rounds follow a known roofline with 3 % noise and whose
    medians of rounds run ``state`` x slower with 12 % more noise (a shared host); (table, true fastest)."""
    moved = np.exp(rng.uniform(np.log(1e4), np.log(1e9), n))
    true = 2e-6 + moved / 25e9
    fastest = true * np.exp(rng.normal(0.0, 0.03, n))
    typical = fastest * state * np.exp(np.abs(rng.normal(0.0, 0.12, n)) - 0.12 * np.sqrt(2 / np.pi))
    frame = pd.DataFrame({"kernel": "add", "kind": "add", "elements": moved / 12.0, "dtype_bytes": 4.0,
                          "bytes": moved, "seconds": typical, "median_s": fastest, "rounds": 3})
    return frame, true


def test_fastest_round_fit_recovers_the_shape_curve_and_the_state_factor():
    frame, _true = _synthetic_rounds(400, np.random.default_rng(1), state=1.10)
    data = {"elementwise": frame}
    models, table = fit_models(data, _elementwise_specs(), "tiny", 0, CPU, log=lambda s: None,
                             target="fastest_round")
    model = models["roofline"]
    assert isinstance(model, StateScaled)
    row = table[0]
    assert row["state_factor"] == pytest.approx(1.10, rel=0.03)
    # against the held-out fastest rounds the model is at the fastest rounds' own noise
    assert row["gmae_pct"] < 4.0
    # the scaled model against the noisier medians of rounds: worse, but centred (no bias from the factor)
    assert row["typical"]["gmae_pct"] > row["gmae_pct"]
    view = TaskView.from_columns("add", bytes=[1e6, 1e8])
    ratio = model.predict(view, CPU) / model.predict_undisturbed(view, CPU)
    np.testing.assert_allclose(ratio, row["state_factor"])
    # the typical fit of the same data sits near the scaled fastest-round fit
    typ_models, typ_table = fit_models(data, _elementwise_specs(), "tiny", 0, CPU, log=lambda s: None)
    assert "typical" not in typ_table[0]
    np.testing.assert_allclose(typ_models["roofline"].predict(view, CPU), model.predict(view, CPU), rtol=0.08)
    md = error_table_markdown(table)
    assert "state x" in md and "typical GMAE %" in md and f"| {row['state_factor']:.3f} |" in md


def _collective_rounds(n: int, rng: np.random.Generator, state: float) -> pd.DataFrame:
    """A 2-rank all-reduce table: fastest passes on a known latency + bandwidth curve (3 % noise), the
    typical pass ``state`` x slower with 25 % more noise (gloo on a shared host)."""
    size = np.exp(rng.uniform(np.log(4.0), np.log(2.0**24), n))
    fastest = (2e-5 + size / 2e9) * np.exp(rng.normal(0.0, 0.03, n))
    typical = fastest * state * np.exp(np.abs(rng.normal(0.0, 0.25, n)) - 0.25 * np.sqrt(2 / np.pi))
    return pd.DataFrame({"kernel": "all_reduce/w2", "kind": "all_reduce", "msg_bytes": size, "world": 2,
                         "seconds": typical, "median_s": fastest, "rounds": np.nan})


def test_fastest_collectives_scales_only_the_collectives():
    from predictor.timing.calibration.base import ModelSpec

    rng = np.random.default_rng(3)
    elementwise, _ = _synthetic_rounds(300, rng, state=1.10)
    data = {"elementwise": elementwise, "collectives": _collective_rounds(120, rng, state=1.3)}
    specs = [*_elementwise_specs(), ("collectives", ModelSpec(kernel="all_reduce/w2", kinds=("all_reduce",),
                                                              method="piecewise"))]
    models, table = fit_models(data, specs, "tiny", 0, CPU, log=lambda s: None, target="fastest_collectives")
    assert isinstance(models["collectives"], StateScaled)
    assert not isinstance(models["roofline"], StateScaled)  # element-wise stays fitted to the typical rounds
    rows = {r["kernel"]: r for r in table}
    assert "typical" not in rows["add"]
    assert rows["all_reduce/w2"]["state_factor"] == pytest.approx(1.3, rel=0.05)
    assert rows["all_reduce/w2"]["gmae_pct"] < 5.0  # the sigmoid against the held-out fastest passes
    # element-wise: the same models as a typical fit of the same data
    typ_models, _ = fit_models(data, specs, "tiny", 0, CPU, log=lambda s: None)
    view = TaskView.from_columns("add", bytes=[1e6, 1e8])
    np.testing.assert_allclose(typ_models["roofline"].predict(view, CPU), models["roofline"].predict(view, CPU))
    # only the collectives need the fastest-round column
    fit_models({"elementwise": elementwise.drop(columns="median_s"), "collectives": data["collectives"]}, specs,
             "tiny", 0, CPU, log=lambda s: None, target="fastest_collectives")
    with pytest.raises(CalibrationError, match="collectives"):
        fit_models({"elementwise": elementwise, "collectives": data["collectives"].drop(columns="median_s")}, specs,
                 "tiny", 0, CPU, log=lambda s: None, target="fastest_collectives")
    md = error_table_markdown(table)
    assert "state x" in md


def test_fastest_round_fit_needs_the_fastest_round_column():
    frame, _ = _synthetic_rounds(40, np.random.default_rng(2), state=1.05)
    with pytest.raises(CalibrationError, match="median_s"):
        fit_models({"elementwise": frame.drop(columns="median_s")}, _elementwise_specs(), "tiny", 0, CPU,
                 log=lambda s: None, target="fastest_round")
    with pytest.raises(CalibrationError, match="fit target"):
        fit_models({"elementwise": frame}, _elementwise_specs(), "tiny", 0, CPU, log=lambda s: None, target="fastest")


def test_a_corrupt_state_scaled_model_is_one_clear_pack_error(tmp_path):
    import json

    from predictor.timing.kernels.assets import AssetPackError, load_asset_pack, write_asset_pack

    roof = FittedRoofline({"add": RooflineFit(2e-6, (), (40e9,))}, generic="add")
    write_asset_pack(tmp_path / "p", name="p", device="cpu", platform=CPU,
                     models={"roofline": StateScaled(roof, {"add": 1.1})}, error_table=[], data={})
    assert isinstance(load_asset_pack(tmp_path / "p").models[0], StateScaled)
    f = tmp_path / "p" / "models" / "roofline.json"
    for factors in ([1.1], {"add": -1.0}, {"add": "fast"}):
        doc = json.loads(f.read_text())
        doc["factors"] = factors
        f.write_text(json.dumps(doc))
        with pytest.raises(AssetPackError, match="roofline.json: not a valid kernel model"):
            load_asset_pack(tmp_path / "p")
