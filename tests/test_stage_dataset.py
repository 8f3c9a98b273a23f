"""The committed CPU stage dataset and the timing protocol (tiny stage, no timing asserted)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictor.stage import DEFAULT_DATASET, GPTSpec, StageSpec, load_dataset, measure_stage
from predictor.stage.dataset import GPU_MODELS, H100_DATASET, all_stage_specs, default_specs


def test_committed_dataset_is_complete_and_sane():
    samples, header = load_dataset(DEFAULT_DATASET)
    assert DEFAULT_DATASET.stat().st_size < 2_000_000
    assert len(samples) == 495
    y = np.array([s.latency_s for s in samples])
    assert np.all(np.isfinite(y)) and np.all(y > 0) and np.all(y < 10)
    assert {s.spec.tp for s in samples} == {1, 2, 4}
    assert header["machine"]["torch_num_threads"] == 1
    # more layers of the same model at the same TP never run much faster
    by_key = {(s.spec.model, s.spec.tp, s.spec.first, s.spec.last): s.latency_s for s in samples}
    for (m, tp, i, j), t in by_key.items():
        longer = by_key.get((m, tp, i, j + 1))
        if longer is not None:
            assert longer > 0.8 * t


def test_committed_h100_dataset_is_complete_and_sane():
    """The stages measured on the lent H100 (collect --device cuda): every GPU_MODELS stage, GPU-bound sizes."""
    samples, header = load_dataset(H100_DATASET)
    assert len(samples) == len(default_specs(GPU_MODELS)) == 495
    assert {s.spec.model for s in samples} == set(GPU_MODELS)
    assert "H100" in header["machine"]["gpu"] and header["protocol"]["device"].startswith("cuda")
    y = np.array([s.latency_s for s in samples])
    assert np.all(np.isfinite(y)) and y.min() > 1e-3 and y.max() < 1.0  # milliseconds, not launch-bound microseconds
    by_key = {(s.spec.model, s.spec.tp, s.spec.first, s.spec.last): s.latency_s for s in samples}
    for (m, tp, i, j), t in by_key.items():
        longer = by_key.get((m, tp, i, j + 1))
        if longer is not None:
            assert longer > 0.8 * t


def test_all_stage_specs_and_measure_tiny_stage():
    m = GPTSpec(hidden=16, heads=2, seq=8, vocab=32, n_layers=3, micro_batch=2)
    specs = all_stage_specs(m, tp=2)
    assert len(specs) == 6 and all(s.tp == 2 for s in specs)
    tm = measure_stage(StageSpec(m, 0, 2), warmup=1, repeats=3)
    assert len(tm.repeats_s) == 3 and tm.min_s <= tm.median_s and tm.median_s > 0


def test_foreign_file_is_rejected(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a stage latency dataset"):
        load_dataset(bad)
    with pytest.raises(ValueError, match="cannot read"):
        load_dataset(tmp_path / "missing.json")
