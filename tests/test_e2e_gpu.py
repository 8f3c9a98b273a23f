"""``experiments/e2e_gpu.py``: ``--predict`` on a small measured file (no GPU needed), ``--measure`` as a CPU smoke run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import e2e_gpu  # noqa: E402


def _measured(tmp_path: Path, rows: list[tuple[str, int, float]]) -> Path:
    f = tmp_path / "m.json"
    f.write_text(json.dumps({
        "date": "2026-11-23", "gpu": "NVIDIA H100 80GB HBM3", "torch": "x", "cuda": "13.0", "python": "3.12",
        "host_cpu": "x86_64", "warmup": 1, "iters": 2, "passes": 2, "tf32": False,
        "rows": [{"model": m, "config": "c", "batch": b, "measured_s": t, "p10_s": t, "p90_s": t,
                  "pass_medians_s": [t, t * 1.01], "wall_means_s": [t, t]} for m, b, t in rows]}))
    return f


@pytest.mark.skipif(not (REPO / "assets" / "h100" / "manifest.json").exists(), reason="needs the h100 asset pack")
def test_predict_writes_both_platforms_and_the_trace_rows(tmp_path: Path):
    main = _measured(tmp_path, [("mlp", 4096, 1.7e-3), ("mlp", 16384, 5.5e-3)])
    (tmp_path / "o").mkdir()
    other = _measured(tmp_path / "o", [("mlp", 4096, 1.5e-3)])
    out = tmp_path / "res"
    e2e_gpu.main(["--predict", str(main), str(other), "--results-dir", str(out)])
    res = json.loads((out / "e2e_h100.json").read_text())
    assert res["platforms"] == ["h100-sxm", "h100"]
    assert res["summary"]["h100"]["source"] == "asset pack h100"
    for r in res["rows"]:
        # the big MLP is GPU-bound: both predictors land within a factor of 2 of its measurement
        assert 0.5 < r["predicted_s[h100]"] / r["measured_s"] < 2.0
        assert r["trace"] == "traces-mlp-b4096.tar.gz" and r["trace_predicted_s"] > 0
    # the trace predicts a 4x batch as more work than its own batch
    assert res["rows"][1]["trace_predicted_s"] > 2 * res["rows"][0]["trace_predicted_s"]
    assert res["other_runs"][0]["summary"]["h100"]["n"] == 1
    md = (out / "e2e_h100.md").read_text()
    assert "From captured traces" in md and "other machine instances" in md


@pytest.mark.skipif(not (REPO / "assets" / "h200-cal" / "manifest.json").exists(), reason="needs the h200-cal pack")
def test_predict_for_the_h200_uses_its_catalog_entry_pack_and_traces(tmp_path: Path):
    main = _measured(tmp_path, [("mlp", 16384, 5.4e-3)])
    out = tmp_path / "res"
    e2e_gpu.main(["--gpu", "h200", "--predict", str(main), "--results-dir", str(out)])
    res = json.loads((out / "e2e_h200.json").read_text())
    assert res["platforms"] == ["h200", "h200-cal"] and res["gpu"] == "h200"
    assert res["summary"]["h200"]["source"] == "analytic (catalog)"
    assert res["summary"]["h200-cal"]["source"] == "asset pack h200-cal"
    assert "trace what-if (h200-cal)" in res["summary"]
    row = res["rows"][0]
    assert row["trace"] == "traces-mlp-b4096.tar.gz"
    # GPU-bound: the H200's faster memory puts the calibrated MLP step below the H100 pack's
    e2e_gpu.main(["--predict", str(main), "--platforms", "h100", "--results-dir", str(out)])
    h100 = json.loads((out / "e2e_h100.json").read_text())["rows"][0]["predicted_s[h100]"]
    assert row["predicted_s[h200-cal]"] < h100
    assert "one H200" in (out / "e2e_h200.md").read_text()


@pytest.mark.parametrize(("text", "message"), [
    (None, "cannot read measured file"),
    ('{"rows": [', "is not JSON"),
    ('{"rows": [{"model": "mlp"}]}', "has no rows with"),
])
def test_bad_measured_file_exits_2_with_one_line(tmp_path: Path, capsys, text, message):
    f = tmp_path / "m.json"
    if text is not None:
        f.write_text(text)
    with pytest.raises(SystemExit) as exc:
        e2e_gpu.main(["--predict", str(f), "--results-dir", str(tmp_path / "res")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "res").exists()  # nothing half-written


def test_measure_records_the_hosts_tight_loop_probe(tmp_path: Path, monkeypatch):
    """``--measure`` (CPU smoke run): rows and the host probe a later prediction can compare with the pack's."""
    monkeypatch.setattr(e2e_gpu, "ROWS", {"mlp": (8,)})
    out = tmp_path / "m.json"
    e2e_gpu.main(["--measure", "--device", "cpu", "--models", "mlp", "--warmup", "0", "--iters", "2", "--passes", "1",
                  "--out", str(out)])
    data = json.loads(out.read_text())
    assert [(r["model"], r["batch"]) for r in data["rows"]] == [("mlp", 8)] and data["rows"][0]["measured_s"] > 0
    assert {"add", "addmm", "embedding_bag"} <= set(data["host_probe_op_s"]) and data["host_probe_op_s"]["add"] > 0
