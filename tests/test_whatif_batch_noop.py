"""Batch what-if: a dropout that returns its input (``p`` 0 or ``train`` false) does no work at any batch size.

A small capture made on this CPU inside the test (one torch thread)."""

from __future__ import annotations

import numpy as np
import pytest
from _trace_fixtures import capture_steps

from predictor.sources.traces.batch_dependence import returns_input

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

BATCH = 8


@pytest.mark.parametrize(("name", "concrete", "noop"), [
    ("aten::dropout", ["", "0.", "True"], True),  # Hugging Face GPT-2 with *_pdrop = 0
    ("aten::dropout", ["", "0.1", "False"], True),  # eval mode
    ("aten::feature_alpha_dropout_", ["", "0", "true"], True),
    ("aten::dropout", ["", "0.1", "True"], False),
    ("aten::dropout", None, False),  # no concrete inputs recorded: assume it works
    ("aten::native_dropout", ["", "0.", "True"], False),  # clones its input even at p = 0
    ("aten::mul", ["", "0.", "True"], False),
])
def test_returns_input_reads_p_and_train(name, concrete, noop):
    assert returns_input(name, concrete) is noop


@pytest.fixture(scope="module")
def dropout_run(tmp_path_factory):
    """Linear -> dropout(p=0) -> ReLU -> Linear, captured at batch 8."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Dropout(0.0), nn.ReLU(), nn.Linear(64, 3))
    x, y = torch.randn(BATCH, 16), torch.randint(0, 3, (BATCH,))
    return capture_steps(tmp_path_factory.mktemp("dropout") / "run", model,
                         lambda m: F.cross_entropy(m(x), y), steps=5, active=2)


def test_noop_dropout_keeps_its_time_when_the_batch_grows(dropout_run):
    from predictor.graph.edit import aux_of
    from predictor.sources.traces.load import load_traces
    from predictor.timing.kernels import timing_for
    from predictor.whatif.annotate import annotate
    from predictor.whatif.batch import scale_batch
    from predictor.whatif.timing import WhatIfTiming

    at = annotate(load_traces(dropout_run))
    assert at.base_batch == BATCH
    g = at.graphs()[0]
    names = np.asarray(g.names, dtype=object)[g.name]
    drop = np.flatnonzero(names == "aten::dropout")
    lin = np.flatnonzero(np.isin(names, ("aten::addmm", "aten::mm")))
    assert drop.size == 1 and lin.size
    aux = aux_of(g)
    assert np.nan_to_num(aux["x_work"][drop], nan=0.0)[0] == 0.0  # was 1.0: the input's elements doubled
    assert np.all(np.nan_to_num(aux["x_work"][lin], nan=0.0) > 0)  # the GEMMs around it still scale
    g4 = scale_batch(g, 4.0)
    changed = aux_of(g4)["changed"]
    assert changed[drop][0] == 0.0 and np.all(changed[lin] == 1.0)
    d = WhatIfTiming(timing_for("cpu-local"), "anchored").durations(g4)
    # unchanged: its profiler-corrected traced time (was the element-wise model's time of 4x the elements)
    assert d[drop][0] == pytest.approx(float(np.nan_to_num(g.duration[drop][0], nan=0.0)), abs=1e-12)
