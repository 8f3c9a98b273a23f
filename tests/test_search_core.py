"""The search core on a toy space: outcomes as trials, failures recorded, resume; joining Ray clusters."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution
from typer.testing import CliRunner

from tuner.cli import app
from tuner.search import Candidate, Outcome, SearchResult, SearchSpace, default_storage, run_search
from tuner.search.executor import ClusterError, connect_ray

CALLS: list[int] = []


def evaluate_toy(ctx: dict, candidate: Candidate, part: object = None) -> list[Outcome]:
    x = candidate.params["x"]
    CALLS.append(x)
    if x == ctx["broken"]:
        raise RuntimeError("toy evaluation exploded")
    if x == ctx["too_big"]:
        return [Outcome(candidate.key, {"x": x}, {"status": "infeasible", "reason": "does not fit"})]
    return [Outcome(candidate.key, {"x": x}, {"status": "ok", "y": x * x}, float(x * x))]


class ToySpace(SearchSpace):
    kind = "toy"

    def __init__(self, n: int = 5, broken: int = 2, too_big: int = 3) -> None:
        self.ctx = {"broken": broken, "too_big": too_big}
        self._candidates = [Candidate(f"x{i}", {"x": i}) for i in range(n)]
        self.n = n

    def study_name(self) -> str:
        return "toy"

    def distributions(self) -> dict:
        return {"x": CategoricalDistribution(list(range(self.n)))}

    def candidates(self) -> list[Candidate]:
        return self._candidates

    def evaluator(self):
        return evaluate_toy

    def worker_context(self) -> dict:
        return self.ctx

    def failed(self, candidate: Candidate, reason: str) -> list[Outcome]:
        return [Outcome(candidate.key, dict(candidate.params), {"status": "failed", "reason": reason})]

    def write_outputs(self, result: SearchResult, out: Path) -> dict:
        return {}

    def print_table(self, payload: dict, console) -> None:
        pass

    def summary(self, result: SearchResult, payload: dict, out: Path) -> str:
        return ""


def test_every_outcome_is_a_trial_and_resume_reevaluates_only_failures(tmp_path):
    storage = default_storage(tmp_path)
    CALLS.clear()
    first = run_search(ToySpace(), storage=storage, workers=0)
    assert CALLS == [0, 1, 2, 3, 4] and first.evaluated == 5 and first.reused == 0
    assert [first.outcomes[f"x{i}"][0].status for i in range(5)] == ["ok", "ok", "failed", "infeasible", "ok"]
    study = optuna.load_study(study_name="toy", storage=storage)
    states = {t.user_attrs["key"]: t.state for t in study.trials}
    assert states == {"x0": optuna.trial.TrialState.COMPLETE, "x1": optuna.trial.TrialState.COMPLETE,
                      "x2": optuna.trial.TrialState.FAIL, "x3": optuna.trial.TrialState.PRUNED,
                      "x4": optuna.trial.TrialState.COMPLETE}
    fail = next(t for t in study.trials if t.user_attrs["key"] == "x2")
    assert "toy evaluation exploded" in fail.user_attrs["error"]
    assert next(t for t in study.trials if t.user_attrs["key"] == "x4").value == 16.0

    CALLS.clear()
    again = run_search(ToySpace(broken=-1), storage=storage, workers=0, resume=True)
    assert CALLS == [2] and again.evaluated == 1 and again.reused == 4
    assert [c.key for c, _ in again.ordered()] == ["x0", "x1", "x2", "x3", "x4"]
    assert again.outcomes["x2"][0].value == 4.0 and again.outcomes["x4"][0].record == {"status": "ok", "y": 16}


def test_progress_counts_reused_and_new_candidates(tmp_path):
    seen: list[tuple[int, int]] = []
    run_search(ToySpace(n=3, broken=-1), storage=default_storage(tmp_path), workers=0,
               progress=lambda d, t: seen.append((d, t)))
    assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)]


# --------------------------------------------------------------------------- Ray clusters
class _FakeRay:
    """Stands in for ray.init: refuses a CPU count when joining a cluster, as Ray does."""

    def __init__(self, existing: bool, reachable: bool = True, cpus: float = 3.0) -> None:
        self.existing, self.reachable, self.cpus = existing, reachable, cpus
        self.calls: list[dict] = []

    def init(self, **kwargs) -> None:
        self.calls.append(kwargs)
        if not self.reachable:
            raise ConnectionError("Could not connect to the Ray cluster at 10.9.9.9:6379")
        if self.existing and "num_cpus" in kwargs:
            raise ValueError("When connecting to an existing cluster, num_cpus and num_gpus must not be provided.")


@pytest.fixture
def fake_ray(monkeypatch):
    import ray

    def make(**kw) -> _FakeRay:
        fake = _FakeRay(**kw)
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        monkeypatch.setattr(ray, "init", fake.init)
        monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": fake.cpus})
        return fake

    return make


def test_ray_address_in_the_environment_is_joined_without_a_cpu_count(fake_ray, monkeypatch):
    fake = fake_ray(existing=True)
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    assert connect_ray(2) == 6  # two tasks per CPU of the cluster
    assert len(fake.calls) == 1 and "num_cpus" not in fake.calls[0]
    assert fake.calls[0]["address"] == "10.1.2.3:6379" and "py_modules" in fake.calls[0]["runtime_env"]


def test_local_ray_gets_the_workers_and_a_found_cluster_is_joined(fake_ray, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fake = fake_ray(existing=False, cpus=2.0)
    assert connect_ray(2) == 4 and fake.calls[0]["num_cpus"] == 2
    fake = fake_ray(existing=True, cpus=8.0)  # a `ray start` cluster on this machine
    assert connect_ray(2) == 16
    assert fake.calls[0]["num_cpus"] == 2 and "num_cpus" not in fake.calls[1]


def test_unreachable_cluster_is_one_error_line_that_does_not_blame_the_space_file(fake_ray, monkeypatch, tmp_path):
    fake_ray(existing=True, reachable=False)
    monkeypatch.setenv("RAY_ADDRESS", "10.9.9.9:6379")
    with pytest.raises(ClusterError, match="from RAY_ADDRESS"):
        connect_ray(2)
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"space": "sharding", "platform": "a100-80gb", "n_gpus": 2, "batch_sizes": [512],
                                     "tasks": {"generate": {"count": 1}}, "sharders": ["naive"]}))
    res = CliRunner().invoke(app, ["search", str(space), "--out", str(tmp_path / "o"), "--workers", "2"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "10.9.9.9:6379" in lines[0] and str(space) not in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "o" / "results.json").exists()
