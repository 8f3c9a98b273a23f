"""Ray as the user's cluster has it: a local Ray of our own (never a stale cluster file), RAY_ADDRESS, token
authentication and the ray:// client named in one line, a lost raylet as one line with the resume command;
and, where `ray start` works, a search against a cluster started with `ray start --head` on loopback."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from spaces import SMALL_SHARDING
from typer.testing import CliRunner

from tuner.cli import app
from tuner.search.executor import RAY_CLIENT_EXTRA, ClusterError, connect_ray

REPO = Path(__file__).resolve().parents[1]
SPACE = SMALL_SHARDING


@pytest.fixture
def fake_ray(monkeypatch):
    """Ray's entry points replaced: ``init`` records its arguments or raises ``error``."""
    import ray

    calls: list[dict] = []
    state = {"error": None}

    def init(**kwargs):
        calls.append(kwargs)
        if state["error"] is not None:
            raise state["error"]

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 3.0})
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_BACKEND_LOG_LEVEL"):  # restored after the test
        monkeypatch.delenv(name, raising=False)
    return calls, state


def test_a_local_ray_is_our_own_with_the_workers(fake_ray):
    calls, _ = fake_ray
    assert connect_ray(2) == 6
    assert calls[0]["address"] == "local" and calls[0]["num_cpus"] == 2  # a stale cluster file is not read


def test_ray_address_is_joined_without_a_cpu_count(fake_ray, monkeypatch):
    calls, _ = fake_ray
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    connect_ray(4)
    assert calls[0]["address"] == "10.1.2.3:6379" and "num_cpus" not in calls[0]


def test_joining_with_a_token_at_hand_turns_token_mode_on(fake_ray, monkeypatch):
    import os

    monkeypatch.setenv("RAY_AUTH_TOKEN", "t0ken")
    connect_ray(2, "10.1.2.3:6379")
    assert os.environ["RAY_AUTH_MODE"] == "token"  # Ray sends its token only in token mode


def test_token_authentication_failure_names_the_token(fake_ray):
    _, state = fake_ray
    state["error"] = ConnectionError("Authentication failed: the cluster requires an auth token")
    with pytest.raises(ClusterError) as err:
        connect_ray(2, "127.0.0.1:6379")
    assert "RAY_AUTH_TOKEN" in str(err.value) and "\n" not in str(err.value)


def test_ray_client_address_without_the_client_names_the_extra(fake_ray, monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    res = CliRunner().invoke(app, ["search", str(space), "--out", str(tmp_path / "o"), "--address", "ray://10.0.0.1:10001"])
    assert res.exit_code == 2
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert "tuner[ray-client]" in line and "ray[client]" in line and RAY_CLIENT_EXTRA in line


def test_a_lost_raylet_is_one_line_with_the_resume_command(monkeypatch, tmp_path):
    import ray
    import ray.exceptions

    class Remote:
        def remote(self, *args):
            return object()

    def lost(refs, num_returns=1):
        raise ray.exceptions.LocalRayletDiedError()

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 1.0})
    monkeypatch.setattr(ray, "remote", lambda **kw: lambda fn: Remote())
    monkeypatch.setattr(ray, "put", lambda value: object())
    monkeypatch.setattr(ray, "wait", lost)
    space, out = tmp_path / "space.yaml", tmp_path / "o"
    space.write_text(yaml.safe_dump(SPACE))
    res = CliRunner().invoke(app, ["search", str(space), "--out", str(out), "--workers", "1", "--quiet"])
    assert res.exit_code == 1
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: the Ray cluster was lost") and f"--out {out} --resume" in line


# --------------------------------------------------------------------------- a real `ray start --head` cluster
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trials(db: Path) -> int:
    import sqlite3

    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:  # read-only: never creates the file
            return int(conn.execute("SELECT count(*) FROM trials").fetchone()[0])
    except sqlite3.Error:
        return 0


def _stop_cluster(temp_dir: str, only: str = "") -> None:
    """SIGKILL the processes of the cluster started in ``temp_dir`` whose command line holds ``only`` (by pid;
    `ray stop` would stop every Ray on the machine)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="ignore")
        except OSError:
            continue
        if temp_dir in cmdline and only in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


@pytest.mark.slow
def test_search_on_a_cluster_started_with_ray_start_head(tmp_path):
    ray_bin = Path(sys.executable).with_name("ray")
    if not ray_bin.exists():
        pytest.skip("the ray command is not installed")
    temp_dir = tempfile.mkdtemp(prefix="tr", dir="/tmp")  # short: Ray's socket paths must stay under 108 bytes
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    try:
        start = subprocess.run([str(ray_bin), "start", "--head", f"--port={port}",  # Ray maps 127.0.0.1 to the node IP
                                "--num-cpus=2", f"--temp-dir={temp_dir}", "--include-dashboard=false",
                                "--disable-usage-stats"], env=env, capture_output=True, text=True, timeout=150)
        if start.returncode != 0:
            pytest.skip(f"ray start --head failed here: {start.stderr.strip().splitlines()[-1:]}")
        space = tmp_path / "space.yaml"
        space.write_text(yaml.safe_dump(SPACE))
        run = subprocess.run([sys.executable, "-m", "tuner.cli", "search", str(space), "--out", str(tmp_path / "c"),
                              "--address", f"127.0.0.1:{port}", "--quiet"], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        here = CliRunner().invoke(app, ["search", str(space), "--out", str(tmp_path / "h"), "--workers", "0", "--quiet"])
        assert here.exit_code == 0
        assert (tmp_path / "c" / "results.csv").read_text() == (tmp_path / "h" / "results.csv").read_text()
        # the cluster's raylet killed mid-search: one line, exit 1, and the search resumes (here in-process)
        big = tmp_path / "big.yaml"
        big.write_text(yaml.safe_dump({**SPACE, "tasks": {"generate": {"count": 60, "seed": 3}},
                                       "sharders": ["naive", "size_greedy", "model_guided"],
                                       "model_guided": {"max_evals": 40}}))  # 120 units: the kill lands mid-run
        out = tmp_path / "k"
        cmd = [sys.executable, "-m", "tuner.cli", "search", str(big), "--out", str(out), "--quiet"]
        killed = subprocess.Popen([*cmd, "--address", f"127.0.0.1:{port}"], cwd=REPO, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 150
        while time.time() < deadline and killed.poll() is None and _trials(out / "study.db") < 1:
            time.sleep(0.5)
        _stop_cluster(temp_dir, "raylet/raylet")
        _, stderr = killed.communicate(timeout=150)
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        assert killed.returncode == 1, stderr
        if lines:  # tuner saw the lost raylet: one line with the resume command
            assert len(lines) == 1 and lines[0].startswith("error: the Ray cluster"), stderr
            assert f"--out {out} --resume" in lines[0]
        else:  # Ray's core ended the driver itself first (exit 1); its reason is in OUT/ray.log
            assert (out / "ray.log").stat().st_size > 0
        resumed = subprocess.run([*cmd, "--workers", "0"], cwd=REPO, env=env, capture_output=True, text=True)
        assert resumed.returncode == 0 and "from the study" in resumed.stdout, resumed.stderr
    finally:
        _stop_cluster(temp_dir)
        time.sleep(1.0)
        shutil.rmtree(temp_dir, ignore_errors=True)
