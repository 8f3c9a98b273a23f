"""Tests hold on any machine: ``cpu-local`` is pinned to a committed asset pack.

``cpu-local`` normally stands for the pack calibrated on the host's CPU, or for the CPU measured in a few
seconds (:mod:`predictor.timing.platforms.packs`), so a test that predicts on it would depend on which CPU
runs it (an AVX2-only host picks another pack than an AVX-512 one, and measures other peaks). The product's
public override, ``$TUNER_CPU_PACK``, pins it here to :data:`PINNED_PACK` for the whole test run (set at
import, before test modules build their module-level platforms). Tests of the host matching itself take the
``host_cpu`` fixture, which removes the pin for that test.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from predictor.timing.platforms.packs import CPU_PACK_ENV

#: the committed pack ``cpu-local`` stands for in the tests (an AVX-512 Zen 4 VM's calibration)
PINNED_PACK = Path(__file__).resolve().parents[1] / "assets" / "cpu-local-zen4"

os.environ[CPU_PACK_ENV] = str(PINNED_PACK)


@pytest.fixture
def host_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cpu-local`` as the product resolves it on this host (the pin of this module removed)."""
    monkeypatch.delenv(CPU_PACK_ENV, raising=False)


@functools.cache
def _multinode_validation() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "experiments" / "multinode_validation.py"
    spec = importlib.util.spec_from_file_location("multinode_validation", path)
    module = sys.modules.setdefault("multinode_validation", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture
def multinode_validation() -> ModuleType:
    """``experiments/multinode_validation.py`` loaded once, by path (tests do not import the lab's package): its
    published rows (``load_rows``) and how it prices them (``platform_for``)."""
    return _multinode_validation()


@pytest.fixture
def validation_row_seconds(multinode_validation):
    """Seconds tuner predicts for the validation's published row of source ``key``, ``model`` on ``gpus``
    GPUs, on ``platform`` (the catalog entry as it stands)."""
    from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec
    from predictor.timing.platforms import get_platform
    from tuner.plans import predict_plan

    def seconds(key: str, model: str, gpus: int, platform: str) -> float:
        row = next(r for r in multinode_validation.load_rows() if (r.key, r.model, r.gpus) == (key, model, gpus))
        res, _ = predict_plan(TransformerSpec(**row.spec), ParallelPlan(**row.plan), get_platform(platform),
                              devices=gpus)
        return res["predicted_iteration_s"]

    return seconds
