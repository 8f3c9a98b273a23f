"""A search recorded in a real PostgreSQL server: a throw-away server on loopback, started by the test.

Needs the PostgreSQL server binaries (``initdb``, ``pg_ctl``) and ``psycopg`` (SQLAlchemy's default PostgreSQL driver); skipped without them.
The server refuses to run as root, so under root it runs as ``nobody`` from a folder that user owns.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tuner.cli import app
from tuner.search.sharding import ShardingSpace, run_sharding_search

PASSWORD = "pg-s3cret-Xq7"
SPACE = {
    "space": "sharding",
    "platform": "a100-80gb",
    "n_gpus": 2,
    "batch_sizes": [512, 1024],
    "tasks": {"generate": {"count": 2, "seed": 1}},
    "model": {"bottom_mlp": [64, 32], "top_mlp": [64, 1]},
    "sharders": ["naive", "size_greedy"],
}

pytestmark = pytest.mark.skipif(
    not (shutil.which("initdb") and shutil.which("pg_ctl")), reason="PostgreSQL server binaries not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
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
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1"
    subprocess.run([*prefix, "pg_ctl", "-D", str(data), "-o", opts, "-l", str(root / "log"), "-w", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql://tuner:{PASSWORD}@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, "pg_ctl", "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_search_records_in_postgres_resumes_and_never_prints_the_password(tmp_path, postgres_url):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(SPACE))
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["search", str(space_file), "--out", str(out), "--workers", "0",
                                      "--storage", postgres_url])
    assert result.exit_code == 0, result.output
    assert not (out / "study.db").exists()  # recorded in the server, not in a SQLite file
    written = [p.read_text(errors="ignore") for p in out.rglob("*") if p.is_file()]
    assert written and all(PASSWORD not in text for text in written)
    assert PASSWORD not in result.output

    space = ShardingSpace.model_validate(SPACE)
    resumed = run_sharding_search(space, storage=postgres_url, workers=0, resume=True)
    assert resumed.evaluated == 0 and resumed.reused == 2 * 2 * 2  # tasks x batches x sharders, all from the study


def test_unreachable_postgres_is_one_line_without_the_password(tmp_path, postgres_url):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(SPACE))
    bad = postgres_url.replace(PASSWORD, "wrong-" + PASSWORD)
    result = CliRunner().invoke(app, ["search", str(space_file), "--out", str(tmp_path / "o"), "--workers", "0",
                                      "--storage", bad])
    assert result.exit_code == 2
    assert "error:" in result.output and "Traceback" not in result.output
    assert PASSWORD not in result.output
