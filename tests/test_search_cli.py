"""`tuner search` end to end: bad inputs (exit 2, one line), Ray evaluation, resume after a kill,
atomic results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tuner.cli import app
from tuner.search import default_storage
from tuner.search.registry import load_space
from tuner.search.schema import SpaceError
from tuner.search.sharding import ShardingSpace, build_sharding_context, run_sharding_search

REPO = Path(__file__).resolve().parents[1]

SMALL = {
    "space": "sharding",
    "platform": "a100-80gb",
    "n_gpus": 2,
    "batch_sizes": [512],
    "tasks": {"generate": {"count": 2, "seed": 1}},
    "model": {"bottom_mlp": [64, 32], "top_mlp": [64, 1]},
    "sharders": ["naive", "size_greedy", "model_guided"],
    "model_guided": {"max_evals": 5},
}


def _write(tmp_path: Path, data: dict | str, name: str = "space.yaml") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def _run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(batch_sizes=[-512]), "batch_sizes.0: Input should be greater than 0"),
        (lambda d: d.update(n_gpus=0), "n_gpus: Input should be greater than 0"),
        (lambda d: d.update(colour="blue"), "colour: unknown field"),
        (lambda d: d["model"].update(layers=3), "model.layers: unknown field"),
        (lambda d: d.update(batch_sizes=[513]), "not divisible by n_gpus=2"),
        (lambda d: d.update(sharders=["naive", "magic"]), "sharders.1"),
        (lambda d: d.pop("platform"), "platform: required field is missing"),
    ],
)
def test_bad_fields_name_the_field(tmp_path, mutate, expected):
    data = json.loads(json.dumps(SMALL))
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(SpaceError) as err:
        load_space(path)
    assert expected in str(err.value)
    assert str(path) in str(err.value)
    code, out = _run_cli("search", str(path), "--out", str(tmp_path / "o"), "--workers", "0")
    assert code == 2
    assert "Traceback" not in out
    assert expected in " ".join(out.split())


def test_missing_file_and_yaml_syntax_error(tmp_path):
    code, out = _run_cli("search", str(tmp_path / "nope.yaml"))
    assert code == 2 and "no such file" in out
    bad = _write(tmp_path, "space: sharding\nn_gpus: [1, 2\n")
    code, out = _run_cli("search", str(bad), "--out", str(tmp_path / "o"))
    assert code == 2 and "YAML syntax error at line" in out
    code, out = _run_cli("search", str(_write(tmp_path, "- just\n- a list\n", "l.yaml")))
    assert code == 2 and "expected a mapping" in out


def test_unknown_platform_lists_valid_names(tmp_path):
    data = dict(SMALL, platform="a100-90gb")
    code, out = _run_cli("search", str(_write(tmp_path, data)), "--out", str(tmp_path / "o"), "--workers", "0")
    assert code == 2
    assert "a100-90gb" in out and "a100-80gb" in out and "Traceback" not in out


def test_platform_without_a_peak_for_the_model_dtype_is_refused(tmp_path):
    """Gaudi2 lists a bf16 peak only: an fp32 DLRM would have its GEMMs priced at 432 TFLOP/s (22x an A100's fp32)."""
    data = dict(SMALL, platform="gaudi2")
    code, out = _run_cli("search", str(_write(tmp_path, data)), "--out", str(tmp_path / "o"), "--workers", "0")
    assert code == 2 and "Traceback" not in out and not (tmp_path / "o").exists()  # OUT untouched
    assert "gaudi2 has no fp32 peak in the catalog" in " ".join(out.split())
    fixed = _write(tmp_path, dict(SMALL, platform="gaudi2", model={**SMALL["model"], "dtype": "bf16"}), "b.yaml")
    assert build_sharding_context(load_space(fixed)).platform.key == "gaudi2"
    code, out = _run_cli("search", str(fixed), "--out", str(tmp_path / "o"), "--workers", "0")
    assert code == 0, out  # the corrected file runs in the same OUT, no --overwrite needed


def test_bad_storage_url(tmp_path):
    code, out = _run_cli("search", str(_write(tmp_path, SMALL)), "--out", str(tmp_path / "o"), "--workers", "0",
                         "--storage", "nosuchdb://x")
    assert code == 2 and "storage 'nosuchdb://x'" in out and "Traceback" not in out
    # nothing was written but the folder's marker: the corrected command runs there without --overwrite
    code, out = _run_cli("search", str(_write(tmp_path, SMALL)), "--out", str(tmp_path / "o"), "--workers", "0")
    assert code == 0, out


def test_table_larger_than_device_memory_is_infeasible_not_a_crash(tmp_path):
    # 4e9 rows x 128 x 4 B = 2 TB: no sharder can place it; every candidate is reported infeasible
    data = dict(SMALL)
    data["tasks"] = {"explicit": [{"name": "huge", "tables": [{"rows": 4_000_000_000, "dim": 128, "pooling": 5},
                                                               {"rows": 1000, "dim": 128, "pooling": 1}]}]}
    out = tmp_path / "o"
    code, text = _run_cli("search", str(_write(tmp_path, data)), "--out", str(out), "--workers", "0")
    assert code == 0, text
    res = json.loads((out / "results.json").read_text())
    task = res["tasks"][0]
    assert task["best"] is None
    assert all(not c["feasible"] and c["status"] == "infeasible" for c in task["candidates"])
    assert "exceeds" in task["candidates"][0]["reason"] or "GiB" in task["candidates"][0]["reason"]


# --------------------------------------------------------------------------- the search itself
def test_search_in_process_writes_every_output(tmp_path):
    out = tmp_path / "o"
    code, text = _run_cli("search", str(_write(tmp_path, SMALL)), "--out", str(out), "--workers", "0")
    assert code == 0, text
    res = json.loads((out / "results.json").read_text())
    assert res["space"] == "sharding" and len(res["tasks"]) == 2
    for t in res["tasks"]:
        assert {c["sharder"] for c in t["candidates"]} == {"naive", "size_greedy", "model_guided"}
        ok = [c for c in t["candidates"] if c["feasible"]]
        best = min(ok, key=lambda c: c["predicted_iteration_s"])
        assert t["best_predicted_iteration_s"] == best["predicted_iteration_s"]
        mg = next(c for c in t["candidates"] if c["sharder"] == "model_guided")
        heur = min(c["predicted_iteration_s"] for c in ok if c["sharder"] != "model_guided")
        assert mg["predicted_iteration_s"] <= heur + 1e-12  # never worse than the best heuristic
        for c in ok:
            assert len(c["per_rank_s"]) == 2 and len(c["memory_bytes_per_rank"]) == 2
            assert max(c["per_rank_s"]) == pytest.approx(c["predicted_iteration_s"])
    assert (out / "results.csv").read_text().count("\n") == 1 + 2 * 3
    assert (out / "report.md").exists() and len(list((out / "figures").glob("*.png"))) == 1  # the best plans
    traces = list((out / "traces").glob("*.json"))
    assert len(traces) == 2 and json.loads(traces[0].read_text())["traceEvents"]
    assert "Predicted iteration time" in text


def test_search_with_ray_matches_in_process(tmp_path):
    space = ShardingSpace.model_validate(SMALL)
    local = run_sharding_search(space, storage=default_storage(tmp_path / "a"), workers=0)
    (tmp_path / "b").mkdir()
    ray_run = run_sharding_search(space, storage=default_storage(tmp_path / "b"), workers=2)
    for unit, outs in local.outcomes.items():
        assert [o.record["predicted_iteration_s"] for o in outs] == pytest.approx(
            [o.record["predicted_iteration_s"] for o in ray_run.outcomes[unit]]
        )


def test_killed_search_resumes_without_losing_finished_evaluations(tmp_path):
    (tmp_path / "o").mkdir()
    storage = default_storage(tmp_path / "o")
    data = dict(SMALL, batch_sizes=[512, 1024])
    space = ShardingSpace.model_validate(data)
    calls = []

    def killer(done: int, total: int) -> None:
        calls.append(done)
        if done == 2:  # two units finished and recorded, then the run dies
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sharding_search(space, storage=storage, workers=0, progress=killer)
    resumed = run_sharding_search(space, storage=storage, workers=0, resume=True)
    assert resumed.reused == 2 * 3  # the finished units' 3 sharders each came from the study
    assert resumed.evaluated == 2 * 3  # only the other two units ran again
    fresh = run_sharding_search(space, storage=default_storage(tmp_path), workers=0)
    for unit, outs in fresh.outcomes.items():
        assert [o.record["predicted_iteration_s"] for o in outs] == pytest.approx(
            [o.record["predicted_iteration_s"] for o in resumed.outcomes[unit]]
        )


def test_killed_cli_run_leaves_no_complete_looking_results(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "results.json").write_text('{"stale": true}')
    # big enough (80 units, ~20 s) that the kill lands mid-run
    space = _write(tmp_path, dict(SMALL, tasks={"generate": {"count": 20, "seed": 1}}, batch_sizes=[512, 1024, 2048, 4096],
                                  model_guided={"max_evals": 40}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "search", str(space), "--out", str(out), "--workers", "0", "--quiet",
         "--overwrite"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    # wait until the study exists, then kill the run mid-way
    import time

    deadline = time.time() + 60
    while time.time() < deadline and not (out / "study.db").exists():
        time.sleep(0.2)
    time.sleep(1.0)
    proc.kill()
    proc.wait()
    assert proc.returncode != 0
    assert not (out / "results.json").exists()  # the stale file was removed, no new one was written


def test_an_evaluation_that_raises_is_recorded_as_failed_and_the_search_goes_on(tmp_path, monkeypatch):
    import optuna

    import tuner.search.sharding as search_mod

    real = search_mod.get_sharder

    class Broken:
        def shard(self, *a, **k):
            raise RuntimeError("sharder exploded")

    monkeypatch.setattr(search_mod, "get_sharder", lambda name: Broken() if name == "size_greedy" else real(name))
    space = ShardingSpace.model_validate(SMALL)
    storage = default_storage(tmp_path / "o")
    out = run_sharding_search(space, storage=storage, workers=0)
    for outs in out.outcomes.values():
        by = {o.record["sharder"]: o.record for o in outs}
        assert by["size_greedy"]["status"] == "failed" and "sharder exploded" in by["size_greedy"]["reason"]
        assert by["naive"]["status"] == "ok" and by["model_guided"]["status"] == "ok"
    study = optuna.load_study(study_name=out.study_name, storage=storage)
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 2 and "sharder exploded" in failed[0].user_attrs["error"]


def test_cpu_local_uses_the_calibrated_asset_pack(tmp_path):
    data = dict(SMALL, platform="cpu-local", sharders=["naive", "size_greedy"])
    out = tmp_path / "o"
    code, text = _run_cli("search", str(_write(tmp_path, data)), "--out", str(out), "--workers", "0", "--quiet")
    assert code == 0, text
    res = json.loads((out / "results.json").read_text())
    assert res["timing_source"].startswith("asset pack")
    analytic = json.loads(json.dumps(SMALL))
    code, _ = _run_cli("search", str(_write(tmp_path, analytic, "a.yaml")), "--out", str(tmp_path / "a"), "--workers", "0",
                       "--quiet")
    assert json.loads((tmp_path / "a" / "results.json").read_text())["timing_source"].startswith("analytic")
