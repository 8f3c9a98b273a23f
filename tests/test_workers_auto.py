"""``--workers auto`` (the default): in this process unless the measured work left pays for a local Ray's start."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
import yaml
from spaces import SMALL_SHARDING
from test_search_core import ToySpace
from typer.testing import CliRunner

import tuner.search.core as core
import tuner.search.executor as executor
from tuner.cli import app
from tuner.search import default_storage, run_search
from tuner.search.core import AUTO, RAY_START_FACTOR, RAY_START_SECONDS, Candidate, choose_workers, probe


def _text(res) -> str:
    """The command's stdout with the terminal's line wrapping undone."""
    return " ".join(res.stdout.split())


def _results(out) -> dict:
    doc = json.loads((out / "results.json").read_text())
    doc["study"].pop("storage")  # the study file's path differs between the two folders
    return doc


def test_auto_stays_in_this_process_on_a_small_space_and_says_so(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SMALL_SHARDING))
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():  # an earlier test in this process left its Ray running
        ray.shutdown()
    auto = CliRunner().invoke(app, ["search", str(space), "--out", str(tmp_path / "a"), "--quiet"])
    assert auto.exit_code == 0, auto.output
    assert "auto: in this process" in _text(auto) and "start)" in _text(auto)
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()
    here = CliRunner().invoke(app, ["search", str(space), "--out", str(tmp_path / "h"), "--workers", "0", "--quiet"])
    assert here.exit_code == 0, here.output
    assert "auto:" not in _text(here)
    assert _results(tmp_path / "a") == _results(tmp_path / "h")


class SlowClock:
    """``time`` for the search core where every reading is 20 s after the last: each candidate costs ~20 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 20.0
        return self.now

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def test_auto_starts_ray_when_the_measured_work_is_over_the_threshold(tmp_path, monkeypatch):
    started: list[int] = []
    ran: list[tuple[int, str]] = []

    def run_ray(self, space, candidates, on_result):  # Ray's tasks, evaluated here
        for c in candidates:
            ran.append((self.workers, c.key))
        self._run_here(space, candidates, on_result)

    monkeypatch.setattr(core, "time", SlowClock())
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(executor, "connect_ray", lambda workers, address=None: started.append(workers) or 8)
    monkeypatch.setattr(executor.Executor, "_run_ray", run_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    res = run_search(ToySpace(n=10, broken=-1, too_big=-1), storage=default_storage(tmp_path), workers=AUTO)
    assert res.evaluated == 10 and sorted(res.outcomes) == sorted(f"x{i}" for i in range(10))
    assert started and set(started) == {4}  # min(CPUs, candidates left)
    assert ran and {w for w, _ in ran} == {4} and len(ran) < 10  # the first ones were timed in this process
    assert res.how.startswith("auto: a local Ray with 4 CPUs")


def test_auto_with_a_cluster_address_uses_the_cluster(tmp_path, monkeypatch):
    started: list[tuple[int, str | None]] = []
    monkeypatch.setattr(executor, "connect_ray", lambda workers, address=None: started.append((workers, address)) or 4)
    monkeypatch.setattr(executor.Executor, "_run_ray", lambda self, space, cands, on_result:
                        self._run_here(space, cands, on_result))
    res = run_search(ToySpace(n=3, broken=-1, too_big=-1), storage=default_storage(tmp_path), workers=AUTO,
                     address="10.0.0.1:6379")
    assert started and started[0] == (2, "10.0.0.1:6379")
    assert res.how == "auto: the Ray cluster at 10.0.0.1:6379"


def test_choose_workers_threshold():
    limit = RAY_START_FACTOR * RAY_START_SECONDS
    assert choose_workers(limit / 100 * 0.9, 100, cpus=2)[0] == 0  # under the threshold
    assert choose_workers(limit / 100 * 1.1, 100, cpus=2)[0] == 2
    assert choose_workers(limit, 3, cpus=16)[0] == 3  # never more CPUs than candidates left
    workers, why = choose_workers(limit, 100, cpus=1)
    assert workers == 0 and "one CPU" in why


@pytest.mark.parametrize(("flag", "want"), [(None, AUTO), ("auto", AUTO), ("0", 0), ("3", 3), ("4096", 4096)])
def test_explicit_workers_reach_the_search_unchanged(tmp_path, monkeypatch, flag, want):
    seen: list[int] = []

    def stop(space, *, storage, workers, address, resume, progress, on_open):
        seen.append(workers)
        raise ValueError("stopped here")

    monkeypatch.setattr("tuner.search.registry.run_search", stop)
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SMALL_SHARDING))
    extra = [] if flag is None else ["--workers", flag]
    res = CliRunner().invoke(app, ["search", str(space), "--out", str(tmp_path / "o"), "--quiet", *extra])
    assert res.exit_code == 2 and "stopped here" in res.stderr
    assert seen == [want]


@pytest.mark.parametrize("value", ["lots", "-1", "4097", "", "2.5"])
def test_bad_workers_is_one_error_line(tmp_path, value):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SMALL_SHARDING))
    res = CliRunner().invoke(app, ["search", str(space), "--out", str(tmp_path / "o"), "--workers", value])
    assert res.exit_code == 2
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: --workers must be auto or 0 .. 4096") and not (tmp_path / "o").exists()


def test_auto_in_this_process_leaves_no_empty_ray_log(tmp_path):
    """The console script sends native stderr to OUT/ray.log; a run that started no Ray removes it empty."""
    import subprocess

    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SMALL_SHARDING))
    tuner = os.path.join(os.path.dirname(sys.executable), "tuner")
    if not os.path.exists(tuner):
        pytest.skip("the tuner console script is not installed next to this interpreter")
    out = tmp_path / "a"
    run = subprocess.run([tuner, "search", str(space), "--out", str(out), "--quiet"], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "auto: in this process" in " ".join(run.stdout.split())
    assert (out / "results.json").is_file() and not (out / "ray.log").exists()


def test_probe_times_the_first_candidate_apart():
    """The first evaluation's one-time costs (numba compiling on a fresh install) do not set the rate."""
    calls: list[int] = []

    def evaluate(chunk: list[Candidate]) -> None:
        time.sleep(0.3 if not calls else 0.002 * len(chunk))
        calls.append(len(chunk))

    batch = [Candidate(key=str(i), params={}) for i in range(400)]
    left, per = probe(batch, evaluate)
    assert calls[0] == 1 and len(calls) >= 2
    assert per < 0.05  # 2 ms a candidate, not the first's 300 ms spread over the probe
    assert len(left) == 400 - sum(calls)
    left, per = probe(batch[:1], evaluate)  # nothing after the first: its time is the rate
    assert left == [] and per >= 0.002
