"""Tests hold on any machine: ``cpu-local`` is pinned to a committed asset pack.

``cpu-local`` normally stands for the pack calibrated on the host's CPU, or for the CPU measured in a few
seconds (:mod:`predictor.timing.platforms.packs`), so a test that predicts on it would depend on which CPU
runs it (an AVX2-only host picks another pack than an AVX-512 one, and measures other peaks). The product's
public override, ``$TUNER_CPU_PACK``, pins it here to :data:`PINNED_PACK` for the whole test run (set at
import, before test modules build their module-level platforms). Tests of the host matching itself take the
``host_cpu`` fixture, which removes the pin for that test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from predictor.timing.platforms.packs import CPU_PACK_ENV

#: the committed pack ``cpu-local`` stands for in the tests (an AVX-512 Zen 4 VM's calibration)
PINNED_PACK = Path(__file__).resolve().parents[1] / "assets" / "cpu-local-zen4"

os.environ[CPU_PACK_ENV] = str(PINNED_PACK)


@pytest.fixture
def host_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cpu-local`` as the product resolves it on this host (the pin of this module removed)."""
    monkeypatch.delenv(CPU_PACK_ENV, raising=False)
