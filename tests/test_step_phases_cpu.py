"""experiments/step_phases_cpu.py: the synthesised step cut into forward / backward / optimizer."""

from __future__ import annotations

import numpy as np

from experiments.e2e_cpu import row_graph
from experiments.step_phases_cpu import phase_step, predicted_phases, task_phases
from predictor.timing.kernels.timing import ModelTiming
from predictor.timing.platforms import get_platform


def test_host_tasks_go_with_the_kernel_after_them():
    names = ["T1", "fc0.addmm", "T1", "nll_loss", "T1", "nll_loss_bwd", "fc0.wgrad", "T1", "sgd.fc0.weight.add_"]
    assert task_phases(names, "mlp").tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2]
    gpt = ["T1", "word_embedding.gather", "nll_loss", "T1", "loss.ones_like", "layer[0].qkv.wgrad", "T1",
           "grad_norm.foreach_norm[0]", "adam.fused"]
    assert task_phases(gpt, "gpt").tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_the_phases_of_the_e2e_rows_add_up_to_the_simulated_step():
    timing = ModelTiming(get_platform("cpu-local"))
    for model, batch in (("mlp", 64), ("gpt", 2)):
        spans, step = predicted_phases(row_graph(model, batch), timing, model)
        assert spans.shape == (3,) and (spans > 0).all()
        assert np.isclose(spans.sum(), step, rtol=1e-9)
        assert spans[1] > spans[2]  # the backward outweighs the optimizer step in both


def test_a_measured_step_returns_its_three_phases():
    step = phase_step("mlp", 8)
    phases = step()
    assert len(phases) == 3 and all(t > 0 for t in phases)


def test_an_unknown_platform_is_one_line_and_exit_2(tmp_path, capsys):
    import pytest

    from experiments.step_phases_cpu import main

    with pytest.raises(SystemExit) as exc:
        main(["--platform", "no-such-pack", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no-such-pack" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())
