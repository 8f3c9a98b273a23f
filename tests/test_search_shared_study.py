"""Two searches of one space sharing one study (``--storage``) split the work: no candidate is evaluated twice,
each ``--out`` gets every outcome, and a killed one leaves the study resumable."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from spaces import SMALL_SHARDING
from test_study_postgres import postgres_url, server  # noqa: F401 (its throw-away PostgreSQL server)
from typer.testing import CliRunner

from tuner.cli import app
from tuner.search import study as study_mod

REPO = Path(__file__).resolve().parents[1]
#: 6 tasks x 2 batch sizes = 12 evaluations of 2 sharders each (24 outcomes)
SPACE = {**SMALL_SHARDING, "tasks": {"generate": {"count": 6, "seed": 1}}}
EVALUATIONS, OUTCOMES = 12, 24

#: a search whose every evaluation also sleeps DELAY seconds, started once every BARRIER file exists; Ctrl-C
#: raises KeyboardInterrupt even when the tests run as a background job, whose shell hands SIGINT down ignored
RUNNER = """
import os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)
import tuner.search.sharding as sharding
real = sharding.evaluate_sharding
def slow(*args):
    time.sleep(float(os.environ["DELAY"]))
    return real(*args)
sharding.evaluate_sharding = slow
from tuner.cli import main
Path(os.environ["READY"]).touch()
while not all(Path(p).exists() for p in os.environ["BARRIER"].split(",")):
    time.sleep(0.05)
sys.argv = ["tuner", *sys.argv[1:]]
main()
"""


def _start(tmp_path: Path, name: str, storage: str, delay: float, barrier: list[str], *extra: str) -> subprocess.Popen:
    env = {**os.environ, "DELAY": str(delay), "READY": str(tmp_path / f"{name}.ready"), "BARRIER": ",".join(barrier),
           "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", RUNNER, "search", str(tmp_path / "space.yaml"), "--out",
                             str(tmp_path / name), "--storage", storage, "--workers", "0", "--quiet", *extra],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trials(db: Path) -> list[tuple[str, str, str]]:
    """(state, key, error) of every keyed trial in the SQLite study file."""
    import sqlite3

    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT t.state, k.value_json, e.value_json FROM trials t "
                            "JOIN trial_user_attributes k ON k.trial_id = t.trial_id AND k.key = 'key' "
                            "LEFT JOIN trial_user_attributes e ON e.trial_id = t.trial_id AND e.key = 'error'").fetchall()
    return [(state, json.loads(key), json.loads(err) if err else "") for state, key, err in rows]


def _wait_for_claim(db: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, proc.communicate()
        try:
            if any(state == "RUNNING" for state, _, _ in _trials(db)):
                return
        except Exception:  # the file or its tables are not there yet
            pass
        time.sleep(0.1)
    pytest.fail("no claim recorded")


@pytest.fixture
def space_file(tmp_path: Path) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(SPACE))
    return path


@pytest.mark.slow
def test_two_searches_on_one_sqlite_study_share_the_work(tmp_path, space_file):
    db = tmp_path / "shared.db"
    storage = f"sqlite:///{db}"
    barrier = [str(tmp_path / "a.ready"), str(tmp_path / "b.ready")]
    procs = [_start(tmp_path, name, storage, 0.25, barrier) for name in ("a", "b")]
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    rows = _trials(db)
    finished = [key for state, key, _ in rows if state in ("COMPLETE", "PRUNED")]
    assert len(finished) == OUTCOMES and len(set(finished)) == OUTCOMES  # every outcome recorded once
    assert not [r for r in rows if r[0] == "RUNNING"]
    docs = [json.loads((tmp_path / name / "results.json").read_text()) for name in ("a", "b")]
    evaluated = [d["study"]["evaluated"] for d in docs]
    assert sum(evaluated) == OUTCOMES and min(evaluated) > 0, evaluated  # both worked, nothing twice
    print("evaluated by each search:", evaluated)
    assert all(d["study"]["evaluated"] + d["study"]["reused_from_study"] == OUTCOMES for d in docs)
    assert docs[0]["tasks"] == docs[1]["tasks"]  # each --out reports the whole space


def test_a_killed_search_leaves_the_study_resumable(tmp_path, space_file):
    db = tmp_path / "shared.db"
    storage = f"sqlite:///{db}"
    proc = _start(tmp_path, "a", storage, 30.0, [])
    _wait_for_claim(db, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t0 = time.monotonic()
    res = CliRunner().invoke(app, ["search", str(space_file), "--out", str(tmp_path / "b"), "--storage", storage,
                                   "--workers", "0", "--quiet"])
    assert res.exit_code == 0, res.output
    assert time.monotonic() - t0 < study_mod.CLAIM_GRACE_SECONDS  # the dead process's claims are taken at once
    rows = _trials(db)
    assert sorted(k for s, k, _ in rows if s in ("COMPLETE", "PRUNED")) == sorted(
        {k for s, k, _ in rows if s in ("COMPLETE", "PRUNED")})
    assert len([r for r in rows if r[0] in ("COMPLETE", "PRUNED")]) == OUTCOMES
    abandoned = [r for r in rows if r[0] == "FAIL"]
    assert abandoned and all("abandoned" in err for _, _, err in abandoned)
    assert not [r for r in rows if r[0] == "RUNNING"]


def test_starting_a_study_again_under_a_running_search_is_refused(tmp_path, space_file):
    db = tmp_path / "shared.db"
    storage = f"sqlite:///{db}"
    proc = _start(tmp_path, "a", storage, 30.0, [])
    try:
        _wait_for_claim(db, proc)
        res = CliRunner().invoke(app, ["search", str(space_file), "--out", str(tmp_path / "b"), "--storage", storage,
                                       "--workers", "0", "--quiet", "--no-resume"])
        assert res.exit_code == 2, res.output
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), res.output
        assert "another tuner search" in lines[0] and f"process {proc.pid}" in lines[0] and "--resume" in lines[0]
        assert any(state == "RUNNING" for state, _, _ in _trials(db))  # its claims are untouched
        kept = tmp_path / "c" / "results.json"  # an earlier search's outputs, which --overwrite would replace
        kept.parent.mkdir()
        kept.write_text("{}")
        res = CliRunner().invoke(app, ["search", str(space_file), "--out", str(kept.parent), "--storage", storage,
                                       "--workers", "0", "--quiet", "--overwrite"])
        assert res.exit_code == 2 and "another tuner search" in res.output, res.output
        assert kept.read_text() == "{}"  # refused before anything in --out was removed
    finally:
        proc.kill()
        proc.wait()


def test_worker_alive():
    me = study_mod.new_worker_id()
    assert not study_mod.worker_alive(me, 1.0)  # this process, but no search of it is running
    study_mod._ACTIVE.add(me)
    try:
        assert study_mod.worker_alive(me, 1.0)
        assert not study_mod.worker_alive(me, study_mod.CLAIM_GRACE_SECONDS + 1)  # heartbeat stopped
        assert not study_mod.worker_alive(me, None)
    finally:
        study_mod._ACTIVE.discard(me)
    host = me.split(":")[0]
    parent = os.getppid()
    assert study_mod.worker_alive(f"{host}:{parent}:{study_mod._process_start(parent)}:ab", 1.0)
    assert not study_mod.worker_alive(f"{host}:{parent}:1:ab", 1.0)  # the pid was reused by another process
    assert study_mod.worker_alive("elsewhere:1:1:ab", 1.0)  # another host: the heartbeat decides
    assert study_mod.worker_alive(f"{host.split('/')[0]}/1:1:1:ab", 1.0)  # another container of this host name
    assert study_mod.describe_worker(me) == f"{host.split('/')[0]}, process {os.getpid()}"


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("initdb") and shutil.which("pg_ctl")), reason="PostgreSQL server binaries not installed")
def test_two_searches_on_one_postgres_study_share_the_work(tmp_path, space_file, postgres_url):  # noqa: F811
    from sqlalchemy import create_engine, text

    from tuner.search.study import storage_url

    barrier = [str(tmp_path / "a.ready"), str(tmp_path / "b.ready")]
    procs = [_start(tmp_path, name, postgres_url, 0.25, barrier) for name in ("a", "b")]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    docs = [json.loads((tmp_path / name / "results.json").read_text()) for name in ("a", "b")]
    evaluated = [d["study"]["evaluated"] for d in docs]
    assert sum(evaluated) == OUTCOMES and min(evaluated) > 0, evaluated
    engine = create_engine(storage_url(postgres_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT t.state, k.value_json FROM trials t JOIN studies s ON s.study_id = t.study_id "
                "JOIN trial_user_attributes k ON k.trial_id = t.trial_id AND k.key = 'key' "
                "WHERE s.study_name = :name"), {"name": docs[0]["study"]["name"]}).all()
    finally:
        engine.dispose()
    finished = [key for state, key in rows if state in ("COMPLETE", "PRUNED")]
    assert len(finished) == OUTCOMES == len(set(finished)) and all(state != "RUNNING" for state, _ in rows)


def test_an_interrupted_search_gives_its_claims_back(tmp_path, space_file):
    db = tmp_path / "shared.db"
    storage = f"sqlite:///{db}"
    proc = _start(tmp_path, "a", storage, 30.0, [])
    _wait_for_claim(db, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "--resume" in err, err
    rows = _trials(db)
    assert rows and not [r for r in rows if r[0] == "RUNNING"]
    assert all("interrupted" in e for s, _, e in rows if s == "FAIL")
    res = CliRunner().invoke(app, ["search", str(space_file), "--out", str(tmp_path / "a"), "--storage", storage,
                                   "--workers", "0", "--quiet"])
    assert res.exit_code == 0, res.output
    assert len([r for r in _trials(db) if r[0] in ("COMPLETE", "PRUNED")]) == OUTCOMES
