"""The per-table embedding diagnosis of the e2e DLRM (experiments/embedding_tables_cpu.py), without timing."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.dlrm_gloo import predicted_embedding_seconds
from experiments.e2e_cpu import dlrm_job, dlrm_spec_for, dlrm_tables
from experiments.embedding_tables_cpu import compare, main
from predictor.timing.kernels import timing_for


def test_compare_reports_sums_gmae_and_the_worst_tables() -> None:
    tables = dlrm_tables(256)
    spec = dlrm_spec_for(dlrm_job(tables, 256, 1, 1, warmup=1, iters=1), tables)
    timing = timing_for("a100-80gb")
    pf, pb = predicted_embedding_seconds(timing, spec)
    slower = pb * 1.25
    slower[3] = pb[3] * 2.0  # one table twice as slow as predicted
    got = compare({"spec": spec, "fwd": pf * 1.25, "bwd": slower}, timing)
    assert got["fwd_sum_err_pct"] == pytest.approx(-20.0)
    assert got["fwd_gmae_pct"] == pytest.approx(20.0)
    assert got["worst_bwd"][0]["table"] == 3 and got["worst_bwd"][0]["err_pct"] == pytest.approx(-50.0)
    assert np.isclose(got["bwd_sum_pred_s"], pb.sum())


def test_bad_batches_are_one_line_and_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--batches", "0"])
    assert e.value.code == 2 and "--batches" in capsys.readouterr().err
