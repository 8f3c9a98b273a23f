"""The measured collective wait: the mean single call over the median one, added to a CPU step's collectives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from _pinned_cpu import bare_cpu

from predictor.sources.synth.dlrm import DLRMSpec, build_dlrm_graph
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.timing.calibrate.calibrated_platform import collective_wait
from predictor.timing.kernels import ModelTiming
from predictor.timing.platforms.schema import Platform

CPU = bare_cpu()  # cpu-local without host refinements: each test sets its own
WAITS = {"all_to_all": 2e-4, "all_reduce": 7e-4}


def _graph(n_ranks: int):
    t = EmbeddingTables(rows=np.full(4, 10_000), dim=np.full(4, 64), pooling=np.linspace(1, 20, 4))
    spec = DLRMSpec(tables=t, batch_size=512, bottom_mlp=(32, 64), top_mlp=(64, 1))
    return build_dlrm_graph(spec, np.arange(4) % n_ranks, n_ranks, mode="host")


def test_wait_is_each_kinds_median_gap_between_mean_and_median_call():
    rng = np.random.default_rng(0)
    rows = []
    for kind, gap in (("all_reduce", 7e-4), ("all_to_all", 2e-4)):
        for size in 4 * 2 ** np.arange(9):
            typical = 3e-4 + size * 1e-10
            rows.append({"kind": kind, "world": 2, "msg_bytes": float(size), "seconds": typical,
                         "call_mean_s": typical + gap * rng.uniform(0.8, 1.2)})
    rows.append({"kind": "all_gather", "world": 2, "msg_bytes": 8.0, "seconds": 3e-4, "call_mean_s": 2e-4})
    rows.append({"kind": "all_reduce", "world": 4, "msg_bytes": 8.0, "seconds": 3e-4, "call_mean_s": 9e-3})
    waits = collective_wait(pd.DataFrame(rows), 2)
    assert waits["all_reduce"] == pytest.approx(7e-4, rel=0.1) and waits["all_to_all"] == pytest.approx(2e-4, rel=0.1)
    assert waits["all_gather"] == 0.0  # a mean under the median is no wait
    # tables from batch means (no single-call column) have no separate wait
    assert collective_wait(pd.DataFrame(rows).drop(columns="call_mean_s"), 2) is None
    assert collective_wait(None, 2) is None


def test_wait_is_added_to_each_collective_of_a_k_rank_cpu_step_only():
    g = _graph(2)
    plain = ModelTiming(CPU).durations(g)
    waited = ModelTiming(CPU.model_copy(update={"collective_wait_s": {2: WAITS}})).durations(g)
    kinds = np.asarray(g.kinds, dtype=object)[g.kind]
    for kind, wait in WAITS.items():
        sel = kinds == kind
        assert sel.any()
        np.testing.assert_allclose(waited[sel], plain[sel] + wait)
    other = ~np.isin(kinds, list(WAITS))
    np.testing.assert_allclose(waited[other], plain[other])
    # another rank count, or one rank: no wait
    g4 = _graph(4)
    np.testing.assert_allclose(ModelTiming(CPU.model_copy(update={"collective_wait_s": {2: WAITS}})).durations(g4),
                               ModelTiming(CPU).durations(g4))


def test_platform_yaml_round_trip_keeps_the_waits():
    p = Platform.model_validate({**CPU.model_dump(mode="json"), "collective_wait_s": {"2": WAITS}})
    assert p.collective_wait_s == {2: WAITS}


def test_a_negative_wait_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="collective_wait_s"):
        Platform.model_validate({**CPU.model_dump(mode="json"), "collective_wait_s": {"2": {"all_reduce": -1e-4}}})
