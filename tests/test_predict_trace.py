"""``tuner predict TRACE --set ...`` on a run captured on this CPU inside the test."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _trace_fixtures import capture_training
from typer.testing import CliRunner

from tuner.cli import app

torch = pytest.importorskip("torch")

BATCH = 12
LAYERS = 3


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """A tiny MLP (3 identical hidden layers) trained with SGD, captured with tuner.capture,
    plus unprofiled iterations after the window (profiler-cost calibration)."""
    folder = tmp_path_factory.mktemp("whatif") / "run"
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        layers = [torch.nn.Linear(20, 48), torch.nn.ReLU()]
        for _ in range(LAYERS):
            layers += [torch.nn.Linear(48, 48), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(48, 5))
        x, y = torch.randn(BATCH, 20), torch.randint(0, 5, (BATCH,))
        # three profiled steps: the prediction is their median, so one step stalled by a busy host does not decide
        capture_training(folder, model, lambda m: torch.nn.functional.cross_entropy(m(x), y), steps=1 + 3 + 4,
                         lr=0.01, active=3)
    finally:
        torch.set_num_threads(threads)
    return folder


def _predict(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["predict", *args])
    return r.exit_code, r.output


def test_capture_records_unprofiled_iterations(captured):
    from predictor.sources.traces.capture import read_step_times

    st = read_step_times(captured / "rank0.steps.csv")
    assert st["window"].count("active") == 3 and st["window"].count("after") == 4
    assert st["torch_threads"] == 1 and all(w > 0 for w in st["wall_s"])


def test_archived_capture_keeps_its_unprofiled_iterations(captured, tmp_path):
    """A .tar.gz of a capture folder predicts as the folder does (its steps.csv read from inside)."""
    import tarfile

    from predictor.sources.traces.load import load_traces
    from predictor.whatif.annotate import annotate

    archive = tmp_path / "run.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(captured, arcname="run")
    a, b = annotate(load_traces(captured)), annotate(load_traces(archive))
    assert b.unprofiled_s is not None and b.unprofiled_s == pytest.approx(a.unprofiled_s)
    assert b.torch_threads == a.torch_threads == 1


def test_capture_far_slower_than_its_unprofiled_steps_is_flagged(captured, tmp_path):
    """Profiled steps slowed by more than the profiler's per-event cost (another process on the cores) replay far
    above the unprofiled step: the what-if says the capture is unreliable instead of a silent 0.004x speed-up."""
    import shutil

    from predictor.whatif.apply import parse_sets, predict_trace

    run = tmp_path / "run"
    shutil.copytree(captured, run)
    csv = run / "rank0.steps.csv"
    rows = []
    for line in csv.read_text().splitlines():
        parts = line.split(",")
        if len(parts) == 4 and parts[2] == "after":
            parts[1] = f"{float(parts[1]) / 200:.9f}"
        rows.append(",".join(parts))
    csv.write_text("\n".join(rows) + "\n")
    assert not any(n.startswith("unreliable capture") for n in predict_trace(captured, parse_sets(["batch_size=x2"])).notes)
    assert predict_trace(run, parse_sets(["batch_size=x2"])).notes[0].startswith("unreliable capture")


def test_annotation_splits_host_ops_into_kernels(captured):
    from predictor.sources.traces.load import load_traces
    from predictor.whatif.annotate import annotate

    at = annotate(load_traces(captured))
    assert at.host_mode and at.base_batch == BATCH and at.unprofiled_s is not None
    g = at.graphs()[0]
    kinds = set(g.kinds)
    assert {"addmm", "mm", "relu"} <= kinds
    aux = g.meta["aux"]
    fwd_gemm = g.kind_mask("addmm")
    assert np.all(g.params["m"][fwd_gemm] == BATCH)  # batch rows of x @ W^T
    assert np.all(aux["x_m"][fwd_gemm] == 1.0)
    grads = np.isfinite(aux["grad_bytes"])
    assert grads.sum() == 2 * (LAYERS + 2)  # weight and bias of every Linear
    assert 0 < at.profiler_cost_s < 1e-3


def test_predict_batch_size_json(captured):
    # 32x the batch: the tiny captured MLP is host-bound, so a small batch change moves the kernels
    # by less than the capture's own noise; at 32x its GEMMs alone add more than the whole step
    code, text = _predict(str(captured), "--set", f"batch_size={32 * BATCH}", "--json")
    assert code == 0, text
    r = json.loads(text)
    for key in ("predicted_iteration_s", "baseline_measured_s", "changes", "timing_source"):
        assert key in r
    assert r["changes"]["batch_size"]["from"] == BATCH and r["changes"]["batch_size"]["to"] == 32 * BATCH
    assert r["changes"]["batch_size"]["tasks_rescaled"] > 0
    assert r["predicted_iteration_s"] > r["baseline_replayed_s"] > 0
    # rescaled kernels are re-timed by their kind's model (anchored to the measured time on the captured
    # platform) or, without one, by the batch ratio; a pack with the column-sum model has a model for every
    # kernel of this step
    c = r["retimed_tasks"]
    assert c["model"] + c["anchored_model"] + c["ratio_no_model"] > 0, c


def test_predict_layers_dp_pp(captured):
    code, text = _predict(str(captured), "--set", "layers=x2", "--json")
    assert code == 0, text
    r = json.loads(text)
    assert r["changes"]["layers"]["from"] == LAYERS and r["changes"]["layers"]["to"] == 2 * LAYERS
    assert r["predicted_iteration_s"] > r["baseline_replayed_s"]
    code, text = _predict(str(captured), "--set", "dp=2", "--json")
    assert code == 0, text
    r = json.loads(text)
    assert r["changes"]["dp"]["to"] == 2 and r["changes"]["dp"]["buckets"] >= 1
    assert r["retimed_tasks"]["new_model"] > 0
    code, text = _predict(str(captured), "--set", "pp=3", "--set", "micro_batches=3", "--json")
    assert code == 0, text
    assert json.loads(text)["changes"]["pp"]["layers_per_stage"] == [1, 1, 1]


def test_predict_prints_a_table_and_moves_platform(captured, tmp_path):
    code, text = _predict(str(captured), "--set", "batch_size=x2", "--trace", str(tmp_path / "t.json"))
    assert code == 0, text
    assert "predicted iteration" in text and "timing source" in text
    assert (tmp_path / "t.json").exists()
    code, text = _predict(str(captured), "--platform", "a100-80gb", "--json")
    assert code == 0, text
    r = json.loads(text)
    assert r["changes"]["platform"]["to"] == "a100-80gb" and r["changes"]["platform"]["device_mode"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--set", "layers=x2", "--set", "base_layers=5"], "no repeated layer blocks"),
        (["--set", "pp=9"], "pp=9 needs at least 9 repeated layers"),
        (["--set", "nope=1"], "unknown key"),
        (["--platform", "tpu-v9"], "unknown platform 'tpu-v9'"),
    ],
)
def test_predict_bad_changes_exit_2(captured, args, expected):
    code, text = _predict(str(captured), *args)
    assert code == 2, text
    assert expected in text and "Traceback" not in text and len(text.strip().splitlines()) == 1


def test_predict_missing_or_foreign_trace(tmp_path):
    code, text = _predict(str(tmp_path / "missing"), "--set", "dp=2")
    assert code == 2 and "no such file or folder" in text
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    code, text = _predict(str(bad), "--set", "dp=2")
    assert code == 2 and "not a trace" in text and len(text.strip().splitlines()) == 1


@pytest.mark.parametrize("dtype, nbytes", [("c10::BFloat16", 2.0), ("c10::Half", 2.0), ("float", 4.0)])
def test_kineto_dtype_names_keep_gemm_shapes(dtype: str, nbytes: float):
    """Kineto names half-precision types c10::BFloat16 / c10::Half: a GEMM keeps its m, n, k and dtype
    size with them (without them batch what-ifs would leave a bf16 trace's GEMMs unscaled)."""
    from predictor.sources.traces.host_kernels import kernel_params

    p = kernel_params("addmm", "aten::addmm", [[3072], [4096, 1024], [1024, 3072], [], []],
                      [dtype] * 3 + ["Scalar"] * 2)
    assert (p["m"], p["n"], p["k"], p["dtype_bytes"]) == (4096.0, 3072.0, 1024.0, nbytes)
    b = kernel_params("bmm", "aten::bmm", [[64, 1024, 1024], [64, 1024, 64]], [dtype] * 2)
    assert (b["batch"], b["m"], b["n"], b["k"]) == (64.0, 1024.0, 64.0, 1024.0)


def test_a_host_bound_gpu_capture_replays_at_its_unprofiled_step():
    """An H200 capture of the small GPT (host 5 ms, kernels 1 ms per step) is host-bound: the replay with no
    change lands near the capture's own unprofiled iterations (60 % above them with the profiler cost capped
    at its per-event mean); the near-balanced MLP capture keeps that cap."""
    from pathlib import Path

    from predictor.whatif.annotate import HOST_BOUND_RATIO
    from predictor.whatif.apply import parse_sets, predict_trace

    traces = Path(__file__).resolve().parents[1] / "benchmarks" / "traces" / "h200-2"
    gpt = predict_trace(traces / "traces-gpt-b8.tar.gz", parse_sets([]), "h200-cal")
    assert gpt.baseline_replayed_s == pytest.approx(gpt.baseline_measured_s, rel=0.10)
    mlp = predict_trace(traces / "traces-mlp-b4096.tar.gz", parse_sets([]), "h200-cal")
    tl = mlp.timeline
    assert tl.host_span_s() <= HOST_BOUND_RATIO * tl.kernel_sum_s()
