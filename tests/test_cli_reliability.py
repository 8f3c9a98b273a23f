"""Nothing lost, nothing leaked, one clear line: the output folder's lock and resume rules, calibrate's --out,
interrupts and storage failures as one line with the resume command, bounds and types of space fields, file
permissions, --version and boolean switches, and numba's cache without a writable home."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from spaces import SMALL_PARALLEL, SMALL_SHARDING
from typer.testing import CliRunner

from tuner.cli import app
from tuner.search.outdir import LOCK_NAME, hold

REPO = Path(__file__).resolve().parents[1]
SPACE = SMALL_SHARDING


def _space(tmp_path: Path, data: dict = SPACE, name: str = "space.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def _search(*args: str):
    return CliRunner().invoke(app, ["search", *args, "--workers", "0", "--quiet"])


def _errors(result) -> list[str]:
    return [ln for ln in (result.stderr or "").splitlines() if ln.strip()]


def _ranked(out: Path) -> list[tuple]:
    res = json.loads((out / "results.json").read_text())
    return [(t["task"], t["batch_size"], c["sharder"], c["predicted_iteration_s"])
            for t in res["tasks"] for c in t["candidates"]]


# --------------------------------------------------------------------------- the output folder
def test_existing_out_continues_the_same_space_and_refuses_another(tmp_path):
    space, out = _space(tmp_path), tmp_path / "o"
    first = _search(str(space), "--out", str(out))
    assert first.exit_code == 0, first.output
    before = _ranked(out)
    again = _search(str(space), "--out", str(out))
    assert again.exit_code == 0 and "0 new, 8 from the study" in again.stdout
    other = _space(tmp_path, {**SPACE, "batch_sizes": [512]}, "other.yaml")
    refused = _search(str(other), "--out", str(out))
    assert refused.exit_code == 2
    (line,) = _errors(refused)
    assert line.startswith("error:") and "--overwrite" in line and "--resume" in line
    assert _ranked(out) == before  # the first search's results are still there, whole
    fresh = _search(str(space), "--out", str(out), "--no-resume")
    assert fresh.exit_code == 2 and "--overwrite" in _errors(fresh)[0]
    replaced = _search(str(other), "--out", str(out), "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert {b for _, b, _, _ in _ranked(out)} == {512}


def test_a_second_run_on_a_locked_out_refuses_with_one_line(tmp_path):
    space, out = _space(tmp_path), tmp_path / "o"
    with hold(out):
        res = _search(str(space), "--out", str(out))
    assert res.exit_code == 2
    (line,) = _errors(res)
    assert "another tuner search" in line and str(os.getpid()) in line
    assert not (out / "results.json").exists() and not (out / "study.db").exists()


@pytest.mark.slow
def test_concurrent_runs_on_one_out_and_a_killed_run_resumed(tmp_path):
    space = _space(tmp_path, {**SPACE, "tasks": {"generate": {"count": 8, "seed": 1}}, "batch_sizes": [512, 1024, 2048],
                              "sharders": ["naive", "size_greedy", "model_guided"], "model_guided": {"max_evals": 30}})
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "tuner.cli", "search", str(space), "--out", str(out), "--workers", "0", "--quiet"]
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline and not (out / "study.db").exists():
        time.sleep(0.2)
    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert second.returncode == 2
    assert [ln for ln in second.stderr.splitlines() if ln.strip()][0].startswith("error: --out")
    time.sleep(2.0)
    first.kill()  # SIGKILL mid-run: the lock goes with the process, finished units stay in the study
    first.wait()
    resumed = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    reference = subprocess.run([*cmd[:6], str(tmp_path / "ref"), *cmd[7:]], cwd=REPO, capture_output=True, text=True)
    assert reference.returncode == 0, reference.stderr
    assert _ranked(out) == _ranked(tmp_path / "ref")  # nothing lost, nothing evaluated twice differently


# --------------------------------------------------------------------------- one line, the resume command
def test_ctrl_c_is_one_line_with_the_resume_command_and_exit_130(tmp_path, monkeypatch):
    import tuner.search.registry as registry

    def interrupted(request):
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "run_request", interrupted)
    space, out = _space(tmp_path), tmp_path / "o"
    res = _search(str(space), "--out", str(out))
    assert res.exit_code == 130
    (line,) = _errors(res)
    assert line.startswith("error: interrupted") and f"tuner search {space} --out {out} --resume" in line


def test_a_storage_failure_mid_run_is_one_line_and_the_search_resumes(tmp_path, monkeypatch):
    import sqlalchemy.exc

    import tuner.search.study as study

    real = study._insert_rows
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise sqlalchemy.exc.OperationalError("INSERT", {}, Exception("server closed the connection"))
        return real(*args, **kwargs)

    monkeypatch.setattr(study, "_insert_rows", flaky)
    space, out = _space(tmp_path), tmp_path / "o"
    res = _search(str(space), "--out", str(out))
    assert res.exit_code == 1
    (line,) = _errors(res)
    assert "storage 'sqlite:///" in line and "server closed the connection" in line and "--resume" in line
    assert "Traceback" not in res.output and not (out / "results.json").exists()
    again = _search(str(space), "--out", str(out), "--resume")
    assert again.exit_code == 0, again.output


def test_a_model_module_calling_sys_exit_is_an_error_line(tmp_path, monkeypatch):
    (tmp_path / "exiting_mod.py").write_text("import sys\nsys.exit(7)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    space = _space(tmp_path, {"space": "accelerators", "models": [{"name": "exiting_mod:build"}],
                              "accelerators": ["a100-80gb"], "batch_sizes": [1]})
    res = _search(str(space), "--out", str(tmp_path / "o"))
    assert res.exit_code == 2
    (line,) = _errors(res)
    assert "sys.exit(7)" in line


# --------------------------------------------------------------------------- the study
def test_an_evaluations_outcomes_are_recorded_whole_or_not_at_all(tmp_path):
    import optuna
    from optuna.distributions import CategoricalDistribution

    from tuner.search.core import Outcome
    from tuner.search.study import SearchStudy, trial_for

    dist = {"x": CategoricalDistribution(list(range(600)))}
    storage = f"sqlite:///{tmp_path / 's.db'}"
    st = SearchStudy.open("s", storage, False, dist)
    unit = [Outcome(f"k{i}", {"x": i}, {"status": "ok"}, float(i)) for i in range(6)]
    broken = [*unit[:3], Outcome("bad", {"y": 1}, {"status": "ok"}, 1.0)]  # fails after its trials are inserted
    st.record(broken)
    with pytest.raises(KeyError):
        st.flush()
    assert st.study.get_trials() == []  # rolled back: no half-recorded evaluation
    outcomes = [Outcome(f"k{i}", {"x": i}, {"status": ["ok", "infeasible", "failed"][i % 3], "reason": "r"},
                        float(i) if i % 3 == 0 else None) for i in range(560)]
    t0 = time.perf_counter()
    for i in range(0, 560, 7):
        st.record(outcomes[i:i + 7])
    st.flush()
    elapsed = time.perf_counter() - t0
    ref = optuna.create_study(study_name="ref", storage=storage)
    ref.add_trials([trial_for(o, dist) for o in outcomes[:6]])
    mine = st.study.get_trials()[:6]
    for a, b in zip(mine, ref.get_trials(), strict=True):  # the rows Optuna itself writes
        assert (a.number, a.state, a.params, a.value, a.user_attrs) == (b.number, b.state, b.params, b.value,
                                                                         b.user_attrs)
    assert len(st.study.get_trials()) == 560 and elapsed < 2.0


# --------------------------------------------------------------------------- bounds and types
@pytest.mark.parametrize(("path", "value", "expected"), [
    (("n_gpus",), True, "n_gpus: Input should be a valid integer, got bool True"),
    (("tasks", "generate", "seed"), -1000000, "tasks.generate.seed: Input should be greater than or equal to 0"),
    (("n_gpus",), 100000, "n_gpus: must be at most 4,096 (every GPU is a rank of the simulated graph)"),
    (("batch_sizes",), [1e12], "batch_sizes.0: Input should be a valid integer, got float"),
])
def test_field_types_and_ranges(tmp_path, path, value, expected):
    data = json.loads(json.dumps(SPACE))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    res = _search(str(_space(tmp_path, data)), "--out", str(tmp_path / "o"))
    assert res.exit_code == 2
    (line,) = _errors(res)
    assert expected in line


def test_every_validation_problem_is_listed(tmp_path):
    res = _search(str(_space(tmp_path, {**SPACE, "n_gpus": 0, "seed": -1, "colour": "blue"})), "--out",
                  str(tmp_path / "o"))
    (line,) = _errors(res)
    assert "n_gpus:" in line and "seed:" in line and "colour: unknown field" in line and "more problem" not in line
    typo = {k: v for k, v in SPACE.items() if k != "n_gpus"} | {"n_gpu": 4}
    (line,) = _errors(_search(str(_space(tmp_path, typo, "typo.yaml")), "--out", str(tmp_path / "o2")))
    assert "n_gpus: required field is missing; n_gpu: unknown field (did you mean n_gpus?)" in line
    assert "colour: unknown field (" not in _errors(res)[0]  # no field near it is missing


def test_a_plan_of_too_many_micro_batches_is_not_simulated(tmp_path):
    from tuner.search.parallel import MAX_MICRO_BATCHES, ParallelSpace, normalise

    space = ParallelSpace.model_validate({
        "space": "parallel", "model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 128, "vocab": 1000},
        "cluster": {"platform": "a100-80gb", "nodes": 1, "devices_per_node": 1}, "global_batch": 2**20})
    raw = {"tp": 1, "pp": 1, "micro_batch": 1, "schedule": "1f1b", "virtual_stages": 2, "recompute": "none",
           "sequence_parallel": False, "ep": 1, "distributed_optimizer": False}
    key, reason = normalise(space, 1, raw)
    assert key is None and f"at most {MAX_MICRO_BATCHES}" in reason


# --------------------------------------------------------------------------- calibrate, files, switches
def test_calibrate_refuses_an_out_that_is_not_a_pack(tmp_path):
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "thesis.tex").write_text("my thesis")
    for target in (folder, folder / "thesis.tex"):
        res = CliRunner().invoke(app, ["calibrate", "--out", str(target), "--tiny"])
        assert res.exit_code == 2 and len(_errors(res)) == 1
    assert (folder / "thesis.tex").read_text() == "my thesis"


def test_results_files_have_ordinary_permissions(tmp_path):
    from predictor.files import atomic_write_text, file_mode

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "r.json", "{}")
        assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644 == file_mode()
    finally:
        os.umask(old)
    res = _search(str(_space(tmp_path)), "--out", str(tmp_path / "o"))
    assert res.exit_code == 0
    for name in ("results.json", "results.csv", "report.md"):
        assert stat.S_IMODE((tmp_path / "o" / name).stat().st_mode) == file_mode()


def test_csv_and_json_share_seconds_and_bytes(tmp_path):
    import pandas as pd

    out = tmp_path / "o"
    assert _search(str(_space(tmp_path)), "--out", str(out)).exit_code == 0
    df = pd.read_csv(out / "results.csv")
    assert {"predicted_iteration_s", "slowest_rank_s", "max_memory_bytes_per_rank"} <= set(df.columns)
    assert not [c for c in df.columns if c.endswith(("_ms", "_gib"))]
    res = json.loads((out / "results.json").read_text())
    first = res["tasks"][0]["candidates"][0]
    row = df[(df.task == res["tasks"][0]["task"]) & (df.sharder == first["sharder"])
             & (df.batch_size == res["tasks"][0]["batch_size"])].iloc[0]
    assert row.predicted_iteration_s == pytest.approx(first["predicted_iteration_s"])
    assert row.max_memory_bytes_per_rank == pytest.approx(max(first["memory_bytes_per_rank"]))
    # the summary counts each sharder as fast as the best (ties count for each)
    want: dict[str, int] = {}
    for t in res["tasks"]:
        ok = [c for c in t["candidates"] if c["status"] == "ok"]
        for c in ok:
            if c["predicted_iteration_s"] <= min(o["predicted_iteration_s"] for o in ok) * (1 + 1e-9):
                want[c["sharder"]] = want.get(c["sharder"], 0) + 1
    assert res["summary"]["wins"] == want and sum(want.values()) >= len(res["tasks"])


def test_version_and_boolean_switches(tmp_path):
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.startswith("tuner ")
    space, out = _space(tmp_path), tmp_path / "o"
    assert _search(str(space), "--out", str(out), "--resume").exit_code == 0
    bad = _search(str(space), "--out", str(out), "--resume", "true")
    assert bad.exit_code == 2 and _errors(bad)[0].startswith("error: tuner search: Got unexpected extra argument")


def test_lock_file_names_the_holder(tmp_path):
    with hold(tmp_path / "o"):
        assert (tmp_path / "o" / LOCK_NAME).read_text().strip() == str(os.getpid())


def test_numba_cache_falls_back_to_a_writable_folder(tmp_path, monkeypatch):
    from predictor.files import numba_cache_fallback

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    assert numba_cache_fallback(writable=lambda folder: True) is None
    folder = numba_cache_fallback(writable=lambda folder: False)  # no writable sources, no writable home
    assert folder and os.environ["NUMBA_CACHE_DIR"] == folder and os.access(folder, os.W_OK)
    assert stat.S_IMODE(Path(folder).stat().st_mode) == 0o700
    code = ("from predictor.graph import GraphBuilder, ProcKind, Category; from predictor.simulate import simulate\n"
            "b = GraphBuilder(); p = b.processor(0, ProcKind.GPU_STREAM, 's')\n"
            "b.task(p, 'k', 'k', Category.COMPUTE, duration=1.0); print(simulate(b.build()).iteration_s)\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path / "no-home")}
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "1.0", run.stderr
    assert any((tmp_path / "cache").rglob("*.nbi"))  # the compiled engine was cached there


def test_parallel_csv_is_in_seconds_and_bytes(tmp_path):
    import pandas as pd

    space = _space(tmp_path, SMALL_PARALLEL)
    out = tmp_path / "o"
    assert _search(str(space), "--out", str(out)).exit_code == 0
    df = pd.read_csv(out / "results.csv")
    assert {"predicted_iteration_s", "memory_bytes_per_device"} <= set(df.columns)
    plans = {p["key"]: p for p in json.loads((out / "results.json").read_text())["plans"]}
    for _, row in df.iterrows():
        assert row.memory_bytes_per_device == pytest.approx(plans[row.plan]["memory_bytes_per_device"])


def test_a_task_too_large_for_the_machine_fails_fast_with_the_limit(tmp_path):
    data = {**SPACE, "n_gpus": 4096, "batch_sizes": [4096],
            "tasks": {"explicit": [{"name": "wide", "tables": [{"rows": 10, "dim": 4, "pooling": 1}] * 300}]}}
    t0 = time.perf_counter()
    res = _search(str(_space(tmp_path, data)), "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and time.perf_counter() - t0 < 30
    (line,) = _errors(res)
    assert "1,228,800 tables x GPUs, at most 1,048,576" in line


def test_native_log_lines_go_to_a_file_and_error_lines_to_the_terminal(tmp_path):
    code = ("import os, sys; from pathlib import Path\n"
            "from tuner.commands.common import CONSOLE_SCRIPT, divert_native_stderr, error_line\n"
            "CONSOLE_SCRIPT['on'] = True\n"
            f"assert divert_native_stderr(Path({str(tmp_path / 'ray.log')!r}))\n"
            "os.write(2, b'[C++] raylet died\\n')\n"
            "error_line('the Ray cluster was lost')\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip() == "error: the Ray cluster was lost"
    assert "[C++] raylet died" in (tmp_path / "ray.log").read_text()
