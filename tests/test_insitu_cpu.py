"""``experiments/insitu_cpu.py``: GEMM shapes from profiler input shapes, and the report."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import insitu_cpu  # noqa: E402


def test_gemm_shapes_from_profiler_inputs():
    assert insitu_cpu._gemm_shape("aten::mm", [[64, 1024], [1024, 512]]) == ("mm", 1, 64, 512, 1024)
    assert insitu_cpu._gemm_shape("aten::addmm", [[512], [64, 1024], [1024, 512], [], []]) == ("addmm", 1, 64, 512, 1024)
    assert insitu_cpu._gemm_shape("aten::bmm", [[8, 128, 64], [8, 64, 32]]) == ("bmm", 8, 128, 32, 64)
    assert insitu_cpu._gemm_shape("aten::baddbmm", [[8, 128, 128], [8, 128, 64], [8, 64, 128], [], []]) == \
        ("bmm", 8, 128, 128, 64)


def test_child_and_report_on_a_tiny_step(monkeypatch):
    # a real (tiny) MLP step through the child's measurement and profiling path, then the report
    import dataclasses

    from experiments import e2e_cpu

    monkeypatch.setattr(e2e_cpu, "MLP", dataclasses.replace(e2e_cpu.MLP, input_dim=16, hidden=(32, 32), classes=4))
    monkeypatch.setattr(insitu_cpu, "PROFILE_BLOCKS", 1)
    r = insitu_cpu.child("mlp", 8, profile=True, steps=3)
    assert r["step_s"] > 0 and r["predicted_s"] > 0 and r["gemms"]
    assert all(g["warm_s"] > 0 and g["in_situ_s"] > 0 and g["predicted_s"] > 0 for g in r["gemms"])
    md = insitu_cpu.markdown([{"model": "mlp", "batch": 8, "default": r, "no_trim": r}],
                             {"date": "d", "machine": "m", "torch": "t", "wall_s": 1.0})
    assert "| mlp | 8 |" in md and "in situ / warm" in md
    # another pack's predictions of the same shapes, beside the in-situ sums
    rows = [{"model": "mlp", "batch": 8, "default": r, "no_trim": r}]
    insitu_cpu.predict_gemms(rows, insitu_cpu.resolve_packs(["cpu-local-zen4"]))
    assert all(g["predicted_by"]["cpu-local-zen4"] > 0 for g in r["gemms"])
    md = insitu_cpu.markdown(rows, {"date": "d", "machine": "m", "torch": "t", "wall_s": 1.0,
                                    "compare": ["cpu-local-zen4"], "args": " --compare cpu-local-zen4"})
    assert "| in situ ms | cold alone ms | cpu-local-zen4 ms |" in md and "--compare cpu-local-zen4" in md
    # the bias gradients: one column sum per linear layer (widths 32, 32, 4) over the batch of 8, timed in situ and by each pack
    assert sorted(t[1] for t in r["sum_tasks"]) == [4.0, 32.0, 32.0] and {t[0] for t in r["sum_tasks"]} == {8.0}
    assert r["predicted_sum_s"] > 0 and r["sum_in_situ_s"] > 0
    insitu_cpu.predict_sums(rows, insitu_cpu.resolve_packs(["cpu-local-zen4"]))
    assert r["sum_predicted_by"]["cpu-local-zen4"] > 0
    md = insitu_cpu.markdown(rows, {"date": "d", "machine": "m", "torch": "t", "wall_s": 1.0,
                                    "compare": ["cpu-local-zen4"]})
    assert "| model | batch | sums | predicted ms | in situ ms | predicted / in situ | cpu-local-zen4 / in situ |" in md


def test_an_unknown_pack_fails_before_measuring(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        insitu_cpu.main(["--compare", "no-such-pack", "--out", "/nonexistent/insitu"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "no-such-pack" in err and err.count("\n") == 1


def test_compare_takes_pack_specs_such_as_a_committed_revision(tmp_path):
    timings = insitu_cpu.resolve_packs(["git:HEAD:cpu-local-zen4", "cpu-local-zen4"], tmp_path)
    shape = ("addmm", 1, 1024, 1024, 512)
    got = [insitu_cpu.gemm_prediction(t, *shape) for t in timings.values()]
    assert got[0] > 0 and got[0] == got[1]  # HEAD's committed pack is the working tree's
