"""Judging sharder predictions on a ground truth pooled over runs (experiments/sharding_windows.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.sharding_windows import (
    HEURISTICS,
    judge,
    mg_vs_pooled_best,
    pooled_truth,
    same_placements,
    window_factors,
)


def _run(scale: float, times: dict[str, float], mg: float | None = None) -> dict:
    row = {"task": "t0", "placements": {s: [i % 2] for i, s in enumerate(HEURISTICS)},
           "measured_s": {s: scale * v for s, v in times.items()}, "predicted_s": dict(times)}
    if mg is not None:
        row["model_guided_actual_s"] = scale * mg
    return {"rows": [row]}


REPO = Path(__file__).resolve().parents[1]
TIMES = {s: 1.0 + 0.1 * i for i, s in enumerate(HEURISTICS)}  # naive fastest


def test_a_slow_window_does_not_move_the_pooled_truth() -> None:
    runs = [_run(1.0, TIMES), _run(2.0, TIMES), _run(1.0, TIMES)]
    f = window_factors(runs)
    assert f[1] / f[0] == pytest.approx(2.0)
    truth = pooled_truth(runs)
    ratios = [truth["t0"][s] / TIMES[s] for s in HEURISTICS]
    assert max(ratios) == pytest.approx(min(ratios))  # relative times kept exactly


def test_judge_criterion_and_exact_pick() -> None:
    truth = {"t0": dict(TIMES)}
    assert judge({"t0": dict(TIMES)}, truth)["criterion_met"] == 1
    wrong = {"t0": {**TIMES, "size_lookup_greedy": 0.1}}  # picks the slowest, 50 % off
    j = judge(wrong, truth)
    assert j["criterion_met"] == 0 and j["p_is_af"] == 0 and j["mean_gap_pct"] == pytest.approx(50.0)


def test_model_guided_is_compared_with_the_same_runs_time_of_the_pooled_fastest() -> None:
    run = _run(1.0, TIMES, mg=0.9)
    assert mg_vs_pooled_best(run, {"t0": dict(TIMES)}) == pytest.approx(-10.0)


def test_runs_with_other_placements_are_not_pooled() -> None:
    a, b = _run(1.0, TIMES), _run(1.0, TIMES)
    assert same_placements(a, b)
    b["rows"][0]["placements"]["random"] = [1, 1]
    assert not same_placements(a, b)


def test_runs_of_another_cpu_are_not_pooled(tmp_path, monkeypatch) -> None:
    import json

    import experiments.sharding_windows as sw

    avx2 = {"model_name": "AMD EPYC", "family": "25", "model": "1", "torch_capability": "AVX2", "isa": "avx2 fma"}
    new = {**_run(1.0, TIMES, mg=1.0), "meta": {"cpu": avx2}, "summary": {"model_guided_vs_best_six_mean_pct": 0.0}}
    old = {**_run(2.0, TIMES, mg=2.0), "summary": {"model_guided_vs_best_six_mean_pct": 0.0}}  # no record: the AVX-512 host of sessions 1-20
    monkeypatch.setattr(sw, "load_runs", lambda revs, run_file: [("new", new), ("old", old)])
    sw.main(["--out", str(tmp_path / "w")])
    got = json.loads((tmp_path / "w.json").read_text())
    assert got["runs"] == ["new"] and got["skipped"] == ["old (another CPU)"]
    assert "One run only" in (tmp_path / "w.md").read_text()
    sw.main(["--out", str(tmp_path / "all"), "--all-cpus"])
    assert json.loads((tmp_path / "all.json").read_text())["runs"] == ["new", "old"]


def test_runs_of_another_batch_pool_are_not_pooled(tmp_path, monkeypatch) -> None:
    import json

    import experiments.sharding_windows as sw

    summ = {"model_guided_vs_best_six_mean_pct": 0.0}
    new = {**_run(1.0, TIMES, mg=1.0), "meta": {"args": {"batch_pool": 8}}, "summary": summ}
    old = {**_run(2.0, TIMES, mg=2.0), "meta": {"args": {}}, "summary": summ}  # before --batch-pool: 2 batches
    monkeypatch.setattr(sw, "load_runs", lambda revs, run_file: [("new", new), ("old", old)])
    sw.main(["--out", str(tmp_path / "w")])
    got = json.loads((tmp_path / "w.json").read_text())
    assert got["runs"] == ["new"] and got["skipped"] == ["old (a pool of 2 index batches, not 8)"]


def test_repredicting_a_run_with_its_own_pack_gives_its_predictions_again(tmp_path) -> None:
    """``--predict-with``: the tasks rebuilt from the run's arguments and predicted with the run's pack
    reproduce what the run predicted; a contention what-if (``hc:``) changes them."""
    import json

    from experiments.sharding_windows import repredict, run_caps_step_reuse, run_co_run

    run = json.loads((REPO / "experiments/results/avx2/sharding_selection.json").read_text())
    run["rows"] = run["rows"][:2]
    # the committed run file's newest run was measured with the pack as committed beside it: that pack at the
    # run file's last commit
    import subprocess

    try:
        rev = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%H", "--",
                              "experiments/results/avx2/sharding_selection.json"],
                             check=True, capture_output=True, text=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        rev = ""
    if not rev:
        pytest.skip("needs the repository's git history (the pack as committed beside the run)")
    pack = f"git:{rev}:{run['meta']['args']['platform']}"
    got = repredict(run, pack, tmp_path / "a", co_run=run_co_run(run), cap_step_reuse=run_caps_step_reuse(run))
    for row in run["rows"]:
        for s, v in got[row["task"]].items():
            assert v == pytest.approx(row["predicted_s"][s], rel=1e-6)
    lower = repredict(run, f"hc:embedding=0.5:{pack}", tmp_path / "b",
                      co_run=run_co_run(run), cap_step_reuse=run_caps_step_reuse(run))
    assert all(lower[t][s] < got[t][s] for t in got for s in got[t])


def test_sharding_runs_carry_their_batch_pool_into_the_measured_job() -> None:
    """``sharding_selection.py --batch-pool``: the measured program cycles that many index batches; a run
    stored before the option reads as 2 (what every such run cycled)."""
    import json

    from experiments.sharding_selection import resolve_timing, run_args, run_tasks, task_job

    run = json.loads((REPO / "experiments/results/avx2/sharding_selection.json").read_text())
    old = run_args(run)
    assert old.batch_pool == 2
    new = run_args({**run, "meta": {**run["meta"], "args": {**run["meta"]["args"], "batch_pool": 8}}})
    platform, timing, _ = resolve_timing(new.platform)
    tables = run_tasks(new)[0]
    assert task_job(0, tables, new, platform, timing)[0].batch_pool == 8
    assert task_job(0, tables, old, platform, timing)[0].batch_pool == 2
