"""``tuner.capture`` on this CPU: records Kineto + ET per rank; ``replay`` reads the folder back."""

from __future__ import annotations

import pytest
from _trace_fixtures import capture_training


def test_capture_then_replay(tmp_path):
    torch = pytest.importorskip("torch")
    from predictor.simulate.replay import replay

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    capture_training(tmp_path / "run", model, lambda m: m(torch.randn(16, 32)).square().mean(), steps=4)
    assert (tmp_path / "run" / "rank0.kineto.json.gz").exists()
    assert (tmp_path / "run" / "rank0.et.json").exists()
    res = replay(tmp_path / "run")
    df = res.steps()
    assert len(df) == 2 and df["name"].str.startswith("ProfilerStep#").all()
    assert df["error_pct"].abs().max() < 1.0
    assert any("rf_id" in n for n in res.graph.notes)
    # shapes recorded: the GEMM ops' CPU tasks exist and the ET joined every node
    names = set(res.graph.graph.names)
    assert "aten::linear" in names or "aten::addmm" in names


def test_capture_rejects_bad_window(tmp_path):
    from predictor.sources.traces.capture import capture

    with pytest.raises(ValueError):
        capture(tmp_path, warmup=1, active=0)


def test_cupti_teardown_only_for_cuda_captures(tmp_path, monkeypatch):
    """A CPU capture leaves ``TEARDOWN_CUPTI`` alone and says so in ``steps.csv``; the CUDA version gate
    reads PyTorch's runtime version (>= 12.6: Kineto's teardown is safe with CUDA graphs there)."""
    torch = pytest.importorskip("torch")
    from predictor.sources.traces import capture as cap_mod
    from predictor.sources.traces.capture import capture, read_step_times

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    with capture(tmp_path / "c", warmup=0, active=1, execution_trace=False, cuda=False) as cap:
        for _ in range(3):
            torch.ones(4).sum()
            cap.step()
    text = (tmp_path / "c" / "rank0.steps.csv").read_text()
    assert "# teardown_cupti=unset" in text
    assert "TEARDOWN_CUPTI" not in __import__("os").environ
    assert read_step_times(tmp_path / "c" / "rank0.steps.csv")["window"] == ["active", "after", "after"]
    for version, ok in (("13.0", True), ("12.6", True), ("12.4", False), (None, False), ("x.y", False)):
        monkeypatch.setattr(torch.version, "cuda", version)
        assert cap_mod._cuda_at_least(12, 6) is ok
