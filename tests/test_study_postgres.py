"""A search recorded in a real PostgreSQL server: a throw-away server on loopback, started by the test.

Needs the PostgreSQL server binaries (``initdb``, ``pg_ctl``; `.ci/run` puts PostgreSQL 15's on the path)
and ``psycopg`` (the ``postgres`` extra); skipped without them. The server refuses to run as root, so under
root it runs as ``nobody`` from a folder that user owns. The tests record searches of all three space kinds
under the documented ``postgresql://`` URL, never write or print its password, stop the server mid-run
(one line naming the storage, masked, and the resume command) and resume to the uninterrupted result.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from spaces import SMALL_PARALLEL, SMALL_SHARDING
from typer.testing import CliRunner

from tuner.cli import app
from tuner.search.sharding import ShardingSpace, run_sharding_search

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "pg-s3cret-Xq7"
SPACE = SMALL_SHARDING
PARALLEL = SMALL_PARALLEL
ACCELERATORS = {"space": "accelerators", "models": [{"name": "resnet50"}], "accelerators": ["a100-80gb"],
                "devices": [1], "batch_sizes": [1, 2]}

pytestmark = pytest.mark.skipif(
    not (shutil.which("initdb") and shutil.which("pg_ctl")), reason="PostgreSQL server binaries not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A throw-away PostgreSQL server: its URL (with the password) and how to stop and start it."""

    url: str
    data: Path
    root: Path
    port: int
    prefix: list[str]

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        subprocess.run([*self.prefix, "pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w",
                        "start"], check=True, capture_output=True)

    def stop(self) -> None:
        subprocess.run([*self.prefix, "pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                       capture_output=True)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    pytest.importorskip("psycopg")
    root = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
    data, pwfile = root / "data", root / "pw"
    pwfile.write_text(PASSWORD + "\n")
    prefix: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "nobody")
        shutil.chown(pwfile, "nobody")
        root.chmod(0o700)
        prefix = ["runuser", "-u", "nobody", "--"]
    port = _free_port()
    subprocess.run([*prefix, "initdb", "-D", str(data), "-U", "tuner", f"--pwfile={pwfile}",
                    "--auth-host=scram-sha-256", "--auth-local=trust"], check=True, capture_output=True)
    srv = Server(f"postgresql://tuner:{PASSWORD}@127.0.0.1:{port}/postgres", data, root, port, prefix)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(server: Server) -> str:
    return server.url


def _trials(url: str) -> int:
    """Trials recorded in the server (0 before the study exists)."""
    from sqlalchemy import create_engine, text

    from tuner.search.study import storage_url

    engine = create_engine(storage_url(url))
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM trials")).scalar() or 0)
    except Exception:  # no tables yet
        return 0
    finally:
        engine.dispose()


def _written(out: Path) -> list[str]:
    return [p.read_text(errors="ignore") for p in out.rglob("*") if p.is_file() and p.name != "study.db"]


def test_search_records_in_postgres_resumes_and_never_prints_the_password(tmp_path, postgres_url):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(SPACE))
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["search", str(space_file), "--out", str(out), "--workers", "0",
                                      "--storage", postgres_url])
    assert result.exit_code == 0, result.output
    assert not (out / "study.db").exists()  # recorded in the server, not in a SQLite file
    written = _written(out)
    assert written and all(PASSWORD not in text for text in written)
    assert PASSWORD not in result.output
    assert json.loads((out / "results.json").read_text())["study"]["storage"].startswith("postgresql://tuner:***@")

    space = ShardingSpace.model_validate(SPACE)
    resumed = run_sharding_search(space, storage=postgres_url, workers=0, resume=True)
    assert resumed.evaluated == 0 and resumed.reused == 2 * 2 * 2  # tasks x batches x sharders, all from the study


@pytest.mark.parametrize("data", [PARALLEL, ACCELERATORS], ids=["parallel", "accelerators"])
def test_every_space_kind_masks_the_password_in_every_output(tmp_path, postgres_url, data):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(data))
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["search", str(space_file), "--out", str(out), "--workers", "0", "--quiet",
                                      "--storage", postgres_url])
    assert result.exit_code == 0, result.output
    written = _written(out)
    assert len(written) >= 2 and all(PASSWORD not in text for text in written)  # results.json, report.html, ...
    assert PASSWORD not in result.output
    assert "***" in json.loads((out / "results.json").read_text())["study"]["storage"]


def test_unreachable_postgres_is_one_line_without_the_password(tmp_path, postgres_url):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(SPACE))
    bad = postgres_url.replace(PASSWORD, "wrong-" + PASSWORD)
    result = CliRunner().invoke(app, ["search", str(space_file), "--out", str(tmp_path / "o"), "--workers", "0",
                                      "--storage", bad])
    assert result.exit_code == 2
    assert "error:" in result.output and "Traceback" not in result.output
    assert PASSWORD not in result.output


@pytest.mark.slow
def test_server_stopped_mid_run_is_one_line_and_the_search_resumes(tmp_path, server):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump({**SPACE, "tasks": {"generate": {"count": 16, "seed": 2}},
                                          "batch_sizes": [512, 1024, 2048],
                                          "sharders": ["naive", "size_greedy", "model_guided"],
                                          "model_guided": {"max_evals": 30}}))
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "tuner.cli", "search", str(space_file), "--out", str(out), "--workers", "0",
           "--quiet", "--storage", server.url]
    before = _trials(server.url)  # the server holds the other tests' studies too
    run = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and run.poll() is None and _trials(server.url) < before + 6:  # two units recorded
        time.sleep(0.3)
    server.stop()
    try:
        _, stderr = run.communicate(timeout=120)
    finally:
        server.start()
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert run.returncode == 1, stderr
    assert len(lines) == 1 and lines[0].startswith("error: storage 'postgresql://tuner:***@127.0.0.1"), stderr
    assert "--resume" in lines[0] and PASSWORD not in stderr and not (out / "results.json").exists()
    resumed = subprocess.run([*cmd, "--resume"], cwd=REPO, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "from the study" in resumed.stdout and "(0 new" not in resumed.stdout
    ref = subprocess.run([*cmd[:6], str(tmp_path / "ref"), *cmd[7:-2]], cwd=REPO, capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr

    def ranked(folder: Path) -> list:
        res = json.loads((folder / "results.json").read_text())
        return [(t["task"], t["batch_size"], c["sharder"], c["predicted_iteration_s"])
                for t in res["tasks"] for c in t["candidates"]]

    assert ranked(out) == ranked(tmp_path / "ref")


def test_a_second_run_on_a_locked_out_refuses_before_touching_the_study(tmp_path, postgres_url):
    from tuner.search.outdir import hold

    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(SPACE))
    out = tmp_path / "o"
    with hold(out):  # a first search holds the folder
        result = CliRunner().invoke(app, ["search", str(space_file), "--out", str(out), "--workers", "0",
                                          "--storage", postgres_url])
    assert result.exit_code == 2
    (line,) = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert "another tuner search" in line and PASSWORD not in result.output
    assert not (out / "results.json").exists()
