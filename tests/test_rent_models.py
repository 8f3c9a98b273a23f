"""`space: rent` with a DLRM and with a user's nn.Module, the shipped examples' schemas, and the report in Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tuner.cli import app
from tuner.search.registry import load_space
from tuner.search.rent import RentSearch
from tuner.search.rent_answer import dominates

REPO = Path(__file__).resolve().parents[1]
TABLES = [{"rows": 200_000, "dim": 64, "pooling": 20.0}, {"rows": 50_000, "dim": 32, "pooling": 1.0},
          {"rows": 1_000_000, "dim": 128, "pooling": 4.0}, {"rows": 10_000, "dim": 64, "pooling": 8.0}]
DLRM = {
    "space": "rent",
    "model": {"dlrm": {"tables": TABLES, "dense": {"bottom_mlp": [64, 32], "top_mlp": [64, 1]},
                       "sharders": ["size_greedy", "lookup_greedy"], "batch_sizes": [512, 2048]}},
    "training": {"samples": "50M"},
    "accelerators": ["a100-80gb", "h100-sxm"],
    "devices": [2, 4],
    "search": {"strategy": "grid"},
}


def _run(tmp_path: Path, data: dict, out: str = "out") -> tuple[int, str]:
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["search", str(p), "--out", str(tmp_path / out), "--workers", "0"])
    return res.exit_code, res.output


def test_dlrm_rent_places_tables_and_prices_each_batch(tmp_path):
    code, out = _run(tmp_path, DLRM)
    assert code == 0, out
    p = json.loads((tmp_path / "out" / "results.json").read_text())
    assert p["kind"] == "dlrm" and p["model"]["tables"] == len(TABLES)
    recs = p["records"]
    assert len(recs) == 2 * 2 * 2 and all(r["status"] == "ok" for r in recs)
    for r in recs:
        f = r["fields"]
        assert f["sharder"] in ("size_greedy", "lookup_greedy") and len(f["assignment"]) == len(TABLES)
        assert max(f["assignment"]) < r["devices"]
        assert r["iteration_s"] == min(v for v in r["sharders"].values() if isinstance(v, float))
        assert r["iterations"] == -(-50_000_000 // f["global_batch"])
    front = [r for r in recs if r["key"] in set(p["front"])]
    assert front and not any(dominates(o, f) for f in front for o in recs)
    cheap = p["picks"]["cheapest"]
    assert "dlrm" in cheap["launch"] and (tmp_path / "out" / cheap["trace"]).exists()


def test_module_rent_uses_centimani_batch_choice(tmp_path, monkeypatch):
    (tmp_path / "rentmodels.py").write_text(
        "import torch.nn as nn\n\ndef make():\n    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    space = {"space": "rent", "model": {"module": {"name": "rentmodels:make", "input_shape": [16],
                                                   "batch_sizes": [32, 128]}},
             "training": {"samples": "1M", "epochs": 2}, "accelerators": ["a100-40gb", "h100-sxm"], "devices": [1, 8]}
    code, out = _run(tmp_path, space)
    assert code == 0, out
    p = json.loads((tmp_path / "out" / "results.json").read_text())
    recs = p["records"]
    assert len(recs) == 4 and all(r["status"] == "ok" for r in recs)
    for r in recs:
        assert r["fields"]["batch_size"] == 128  # eq. 5: the largest candidate that fits
        assert r["global_batch"] == 128 * r["devices"]
        assert r["time_to_train_h"] == pytest.approx(r["iterations"] * r["iteration_s"] / 3600)
    assert p["model"]["parameters"] == 16 * 64 + 64 + 64 * 2 + 2
    assert (tmp_path / "out" / p["picks"]["cheapest"]["trace"]).exists()


def test_dlrm_rent_refuses_a_chip_without_a_peak_for_its_dtype(tmp_path):
    """An fp32 DLRM on Gaudi2 (bf16 peak only) would price its MLPs at 432 TFLOP/s: refused, bf16 runs."""
    code, out = _run(tmp_path, {**DLRM, "accelerators": ["a100-80gb", "gaudi2"]})
    assert code == 2 and "accelerators[1]: gaudi2 has no fp32 peak" in " ".join(out.split()), out
    assert "model.dlrm.dense.dtype" in " ".join(out.split())
    dense = {**DLRM["model"]["dlrm"]["dense"], "dtype": "bf16"}
    bf16 = {**DLRM, "accelerators": ["gaudi2"], "model": {"dlrm": {**DLRM["model"]["dlrm"], "dense": dense}}}
    code, out = _run(tmp_path, bf16, out="bf16")
    assert code == 0, out


@pytest.mark.parametrize("name", ["rent.yaml", "rent_dlrm.yaml"])
def test_shipped_examples_resolve(name):
    search = RentSearch(load_space(REPO / "search_spaces" / name))
    assert search.candidates()
    if name == "rent.yaml":
        ctx = search.context
        assert len(ctx.offers) >= 5 and ctx.devices[0] == 8 and ctx.devices[-1] == 1024
        assert ctx.spec is not None and 12e9 < ctx.spec.param_count() < 14e9
        assert ctx.total_samples * ctx.spec.seq == pytest.approx(300e9)


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium on this machine")
def test_report_renders_in_headless_chromium(tmp_path):
    code, out = _run(tmp_path, DLRM)
    assert code == 0, out
    png = tmp_path / "report.png"
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--force-device-scale-factor=1", "--window-size=1280,1600", f"--screenshot={png}",
                    (tmp_path / "out" / "report.html").as_uri()], check=True, capture_output=True, timeout=120)
    import matplotlib.image as mpimg

    img = mpimg.imread(png)
    assert img.shape[0] == 1600 and img.shape[1] == 1280
    ink = (img[..., :3].mean(axis=2) < 0.9).mean()  # share of pixels that are not near-white
    assert 0.02 < ink < 0.6
    colours = (img[..., 0] - img[..., 2]).std() + (img[..., 1] - img[..., 2]).std()
    assert colours > 0.01  # the plot's coloured points are drawn


def test_asset_pack_as_an_accelerator(tmp_path):
    """A DLRM prices its kernels with a pack's calibrated models (its price from pricing.prices); a transformer is
    priced on catalog entries, whose GEMM ceilings are fitted to published runs, and refuses a pack."""
    space = {**DLRM, "accelerators": ["h100", "a100-80gb"], "devices": [2],
             "pricing": {"prices": {"h100": {"on_demand": 3.0}}},
             "model": {"dlrm": {**DLRM["model"]["dlrm"], "sharders": ["size_greedy"], "batch_sizes": [512]}}}
    code, out = _run(tmp_path, space)
    assert code == 0, out
    p = json.loads((tmp_path / "out" / "results.json").read_text())
    acc = {a["key"]: a for a in p["accelerators"]}
    assert acc["h100"]["price_source"] == "pricing.prices.h100.on_demand"
    assert acc["h100"]["timing_source"] == "asset pack h100"
    assert all(r["usd_per_device_hour"] == 3.0 for r in p["records"] if r["accelerator"] == "h100")
    transformer = {"space": "rent", "model": {"transformer": {"name": "t", "layers": 4, "hidden": 256, "heads": 4,
                                                              "seq": 128, "vocab": 1000}},
                   "training": {"tokens": "20M", "global_batch": 16}, "accelerators": ["h100", "a100-80gb"],
                   "devices": [1, 2], "pricing": {"prices": {"h100": {"on_demand": 3.0}}}}
    code, out = _run(tmp_path, transformer, "out2")
    assert code == 2 and "accelerators[0]: h100 is an asset pack" in out
