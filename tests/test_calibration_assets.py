"""Asset packs: round trip, clear one-line errors for missing/corrupt packs, name resolution."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from predictor.timing.kernels import TaskView, timing_for
from predictor.timing.kernels.assets import (
    AssetPackError,
    find_asset_pack,
    load_asset_pack,
    resolve_platform,
    write_asset_pack,
)
from predictor.timing.kernels.collective import PiecewiseCollective, PiecewiseSigmoid
from predictor.timing.kernels.learned import MLPKernelModel
from predictor.timing.kernels.mlp import MLPConfig, fit_mlp
from predictor.timing.kernels.roofline_fit import FittedRoofline, RooflineFit
from predictor.timing.platforms import get_platform


def _models() -> dict:
    rng = np.random.default_rng(0)
    x = np.exp(rng.uniform(np.log(8), np.log(512), size=(40, 3)))
    t = 1e-6 + 2 * x.prod(axis=1) / 1e11
    net = fit_mlp(x, t, ("m", "n", "k"), work=("m", "n", "k"), grid=[MLPConfig(3, 8, "adam", 1e-2)], epochs=50)
    return {
        "gemm": MLPKernelModel("mlp-gemm", ("gemm", "addmm", "mm", "bmm"), {"addmm/fp32": net}, router="gemm",
                               fallback="analytic-gemm"),
        "roofline": FittedRoofline({"add": RooflineFit(2e-6, (), (40e9,))}, generic="add"),
        "collectives": PiecewiseCollective({("all_reduce", 2): PiecewiseSigmoid.continuous(3e-5, 4e9, 1024.0, 2.0**20)}),
    }


@pytest.fixture()
def pack(tmp_path: Path) -> Path:
    base = get_platform("a100-80gb")
    platform = base.model_copy(update={"key": "testpack"})
    table = [{"kernel": "addmm/fp32", "samples": 40, "test": 8, "gmae_pct": 1.0, "mape_pct": 1.5, "std_pct": 1.0,
              "max_pct": 3.0, "model": "MLP"}]
    return write_asset_pack(tmp_path / "testpack", name="testpack", device="cpu", platform=platform, models=_models(),
                            error_table=table, manifest_extra={"cpu_model": "nowhere", "threads": 1})


def test_pack_round_trip_and_timing(pack: Path):
    loaded = load_asset_pack(pack)
    assert loaded.name == "testpack" and loaded.source == "asset pack testpack"
    assert {type(m).__name__ for m in loaded.models} == {"MLPKernelModel", "FittedRoofline", "PiecewiseCollective"}
    assert loaded.error_table[0]["kernel"] == "addmm/fp32"
    timing = loaded.timing()
    assert timing.source == "asset pack testpack"
    assert isinstance(timing.model_for("gemm"), MLPKernelModel)
    assert isinstance(timing.model_for("optimizer"), FittedRoofline)  # generic fit for unlisted kinds
    assert type(timing.model_for("embedding_bag_fwd")).__name__ == "AnalyticEmbedding"  # not calibrated: analytic
    view = TaskView.from_columns("all_reduce", msg_bytes=[1e6], world=[2.0])
    assert timing.model_for("all_reduce").predict(view, loaded.platform)[0] > 0
    assert sum(f.stat().st_size for f in pack.rglob("*") if f.is_file()) < 2 * 2**20


def test_resolution_by_path_name_catalog(pack: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    assert resolve_platform(str(pack)).source == "asset pack testpack"
    monkeypatch.setenv("TUNER_ASSETS", str(pack.parent))
    assert find_asset_pack("TestPack") == pack
    assert timing_for("testpack").source == "asset pack testpack"
    cat = resolve_platform("a100-80gb")
    assert cat.source == "analytic (catalog)" and cat.pack is None
    assert timing_for("a100-80gb").source == "analytic (catalog)"


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_missing_pack(tmp_path: Path):
    with pytest.raises(AssetPackError) as exc:
        load_asset_pack(tmp_path / "nope")
    assert "not found" in _one_line(exc)
    with pytest.raises(AssetPackError) as exc:
        resolve_platform(str(tmp_path / "nope"))
    assert "nope" in _one_line(exc)


@pytest.mark.parametrize(
    "damage, expect",
    [
        (lambda p: (p / "manifest.json").unlink(), "manifest.json: missing"),
        (lambda p: (p / "manifest.json").write_text('{"format": 1, "name": '), "manifest.json: invalid JSON at line 1"),
        (lambda p: (p / "manifest.json").write_text("[1, 2]"), "must be a JSON object"),
        (lambda p: _edit_manifest(p, lambda m: m.pop("models")), "missing field(s) models"),
        (lambda p: _edit_manifest(p, lambda m: m.update(format=99)), "format 99 is not supported"),
        (lambda p: (p / "models" / "gemm.json").unlink(), "gemm.json: missing"),
        (lambda p: (p / "models" / "gemm.json").write_text("{not json"), "gemm.json: invalid JSON"),
        (lambda p: (p / "models" / "roofline.json").write_text('{"type": "roofline_v9"}'), "not a valid kernel model"),
        (lambda p: (p / "models" / "collectives.json").write_text('{"type": "piecewise_collective"}'),
         "missing field 'curves'"),
        (lambda p: (p / "platform.yaml").write_text("a: [1, 2\n"), "platform.yaml: invalid YAML"),
        (lambda p: (p / "platform.yaml").write_text("x:\n  name: y\n"), "platform.yaml: "),
        (lambda p: (p / "platform.yaml").unlink(), "platform.yaml: missing"),
    ],
)
def test_corrupt_pack_gives_one_clear_line(pack: Path, damage, expect: str):
    damage(pack)
    with pytest.raises(AssetPackError) as exc:
        load_asset_pack(pack)
    assert expect in _one_line(exc)


def _edit_manifest(pack: Path, edit) -> None:
    m = json.loads((pack / "manifest.json").read_text())
    edit(m)
    (pack / "manifest.json").write_text(json.dumps(m))


def test_rewriting_a_pack_replaces_it_whole(pack: Path):
    (pack / "stale.txt").write_text("old")
    loaded = load_asset_pack(pack)
    write_asset_pack(pack, name="testpack", device="cpu", platform=loaded.platform,
                     models={"roofline": FittedRoofline({"add": RooflineFit(1e-6, (), (10e9,))})})
    again = load_asset_pack(pack)
    assert not (pack / "stale.txt").exists()
    assert [type(m).__name__ for m in again.models] == ["FittedRoofline"]
    assert not list(pack.parent.glob(".testpack*"))


def test_cpu_local_names_the_pack_of_this_cpu(pack: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             host_cpu: None):
    import shutil

    import predictor.timing.platforms.packs as assets
    from predictor.timing.platforms.cpu_local import cpu_model, cpu_signature

    root = tmp_path / "assets"
    root.mkdir()
    monkeypatch.setenv("TUNER_ASSETS", str(root))
    monkeypatch.setattr(assets, "repo_assets_dir", lambda: tmp_path / "no-repo-assets")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))

    def copy(name: str, **manifest) -> Path:
        d = root / name
        shutil.copytree(pack, d)
        m = json.loads((d / "manifest.json").read_text())
        m.pop("cpu", None)
        m.update(manifest)
        (d / "manifest.json").write_text(json.dumps(m))
        return d

    other = {**cpu_signature(), "torch_capability": "SOMETHING_ELSE"}
    copy("cpu-local", cpu_model=cpu_model())  # no CPU record (an older pack), same model name
    assert assets.cpu_local_pack() == root / "cpu-local"
    copy("cpu-local-b", cpu=other)  # another CPU's: never chosen
    assert assets.cpu_local_pack() == root / "cpu-local"
    copy("cpu-local-c", cpu=cpu_signature())  # this CPU's: chosen over the unrecorded one
    assert assets.cpu_local_pack() == root / "cpu-local-c"
    assert resolve_platform("cpu-local").pack.path == root / "cpu-local-c"
    shutil.rmtree(root / "cpu-local-c")
    shutil.rmtree(root / "cpu-local")
    copy("cpu-local", cpu=other)  # only packs of other CPUs: the measured platform, saying so
    assert assets.cpu_local_pack() is None
    assert "from another CPU" in resolve_platform("cpu-local").source


def test_tuner_cpu_pack_pins_cpu_local_on_any_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """``$TUNER_CPU_PACK`` makes ``cpu-local`` the pack it names (by name or folder), whatever the host's CPU;
    ``none`` makes it the measured CPU with analytic models; a name that is no pack is a one-line error."""
    from predictor.timing.platforms import packs

    repo = packs.repo_assets_dir()
    for value in ("cpu-local-avx2", str(repo / "cpu-local-avx2")):
        monkeypatch.setenv(packs.CPU_PACK_ENV, value)
        assert packs.cpu_local_pack() == Path(value) if "/" in value else repo / value
        assert resolve_platform("cpu-local").source.startswith("asset pack cpu-local-avx2")
        assert get_platform("cpu-local").key == "cpu-local-avx2"
    monkeypatch.setenv(packs.CPU_PACK_ENV, "none")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    assert packs.cpu_local_pack() is None
    assert resolve_platform("cpu-local").source == "analytic (measured cpu-local; TUNER_CPU_PACK=none)"
    assert get_platform("cpu-local").key == "cpu-local"
    monkeypatch.setenv(packs.CPU_PACK_ENV, "no-such-pack")
    with pytest.raises(AssetPackError, match="TUNER_CPU_PACK=no-such-pack: no asset pack of that name"):
        resolve_platform("cpu-local")
    with pytest.raises(AssetPackError, match="no asset pack"):
        get_platform("cpu-local")


def test_the_tests_pin_holds_on_another_cpu(monkeypatch: pytest.MonkeyPatch):
    """Under the tests' pin (``conftest.py``) ``cpu-local`` neither measures the host nor picks its pack: with
    the host taken for the AVX2-only EPYC that ``assets/cpu-local-avx2`` records, it is still the pinned pack."""
    import predictor.timing.platforms.cpu_local as cpu_local
    from predictor.timing.platforms import packs

    pinned = Path(packs.cpu_pack_override() or "")
    assert pinned.name == "cpu-local-zen4"
    avx2 = json.loads((packs.repo_assets_dir() / "cpu-local-avx2" / "manifest.json").read_text())["cpu"]

    def no_measuring(*_a, **_k):
        raise AssertionError("the host was measured")

    monkeypatch.setattr(cpu_local, "cpu_signature", lambda: dict(avx2))
    monkeypatch.setattr(cpu_local, "measure_cpu_local", no_measuring)
    assert packs.cpu_local_pack() == pinned
    assert resolve_platform("cpu-local").pack.path == pinned
    assert get_platform("cpu-local").key == pinned.name
    monkeypatch.delenv(packs.CPU_PACK_ENV)  # unpinned, the same host picks the AVX2 pack
    assert packs.cpu_local_pack() == packs.repo_assets_dir() / "cpu-local-avx2"
