"""Ray tasks that evaluate chunks of candidates: sized from measured evaluation seconds, one part per task,
every candidate's outcomes whole and equal to the in-process ones, failures per candidate (a fake Ray runs
the tasks in this process, completing the newest first)."""

from __future__ import annotations

import pytest

from tuner.search import Candidate, Outcome
from tuner.search import executor as ex
from tuner.search.executor import MAX_CHUNK, TASK_SECONDS, ChunkSizer, Executor, evaluate_chunk


def evaluate_square(ctx: dict, candidate: Candidate, part: object = None) -> list[Outcome]:
    """A toy evaluation: x squared; raises for ``ctx['broken']``; records the part it got."""
    x = candidate.params["x"]
    if x == ctx["broken"]:
        raise RuntimeError("toy evaluation exploded")
    return [Outcome(candidate.key, {"x": x}, {"status": "ok", "part": part}, float(x * x))]


class Squares:
    """The parts of the search space interface the executor uses."""

    def __init__(self, n: int, broken: int = -1, parts: int = 0) -> None:
        self.ctx = {"broken": broken}
        group = max(n // parts, 1) if parts else 0
        self._candidates = [Candidate(f"x{i}", {"x": i}, part=f"p{i // group}" if parts else None) for i in range(n)]

    def candidates(self) -> list[Candidate]:
        return self._candidates

    def evaluator(self):
        return evaluate_square

    def worker_context(self) -> dict:
        return self.ctx

    def part(self, name: str) -> str:
        return f"value of {name}"

    def failed(self, candidate: Candidate, reason: str) -> list[Outcome]:
        return [Outcome(candidate.key, dict(candidate.params), {"status": "failed", "reason": reason})]


@pytest.fixture
def fake_ray(monkeypatch):
    """Ray replaced by tasks run in this process at ``get``; ``wait`` returns the newest task first. Returns the
    chunks the tasks got, and a set of task numbers whose worker dies."""
    import ray
    import ray.exceptions

    chunks: list[list[str]] = []
    dying: set[int] = set()

    class Put:
        def __init__(self, value):
            self.value = value

    class Ref:
        def __init__(self, fn, args, number):
            self.fn, self.args, self.number = fn, args, number

    class Remote:
        def __init__(self, fn):
            self.fn = fn

        def remote(self, *args):
            chunks.append([c.key for c in args[2]])
            return Ref(self.fn, args, len(chunks) - 1)

    def get(ref):
        if ref.number in dying:
            raise ray.exceptions.WorkerCrashedError()
        return ref.fn(*[a.value if isinstance(a, Put) else a for a in ref.args])  # top-level refs resolved

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray, "remote", lambda **kw: Remote)
    monkeypatch.setattr(ray, "put", Put)
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns=1: (refs[-1:], refs[:-1]))
    return chunks, dying


def in_process(space: Squares) -> list[tuple[str, list[Outcome]]]:
    got: list[tuple[str, list[Outcome]]] = []
    Executor(0).run(space, space.candidates(), lambda c, o: got.append((c.key, o)))
    return got


def test_sizer_starts_at_one_then_fills_a_task_with_measured_evaluations():
    sizer = ChunkSizer(window=4)
    assert sizer.size(1000) == 1  # nothing measured yet
    for _ in range(5):
        sizer.observe(TASK_SECONDS / 10)
    assert sizer.size(1000) == 10
    assert sizer.size(20) == 5  # an even share of what is left over the window's tasks
    assert sizer.size(1) == 1
    for _ in range(20):
        sizer.observe(1e-9)
    assert sizer.size(10**6) == MAX_CHUNK


def test_a_chunk_evaluates_in_order_and_keeps_a_raising_candidate_apart():
    space = Squares(4, broken=2)
    res = evaluate_chunk(evaluate_square, space.ctx, space.candidates(), None)
    assert [r[0][0].value for r in res if not isinstance(r[0], str)] == [0.0, 1.0, 9.0]
    assert res[2][0] == "RuntimeError: toy evaluation exploded" and all(s >= 0 for _, s in res)


def test_chunks_grow_and_every_candidate_equals_the_in_process_result(fake_ray, monkeypatch):
    chunks, _ = fake_ray
    monkeypatch.setattr(ex, "TASK_SECONDS", 1e9)  # any measured evaluation is fast: the size is the share cap
    space = Squares(200, broken=7)
    got: list[tuple[str, list[Outcome]]] = []
    Executor(2).run(space, space.candidates(), lambda c, o: got.append((c.key, o)))
    assert [len(c) for c in chunks[:4]] == [1, 1, 1, 1]  # the window's first tasks, before any timing
    assert max(len(c) for c in chunks) > 1 and len(chunks) < 200
    keys = [k for c in chunks for k in c]
    assert sorted(keys) == sorted(c.key for c in space.candidates())  # each candidate in one task
    for chunk in chunks:  # consecutive candidates, reported whole in the chunk's order
        first = [k for k, _ in got].index(chunk[0])
        assert [k for k, _ in got[first:first + len(chunk)]] == chunk
    here = dict(in_process(space))
    assert len(got) == 200
    for key, outcomes in got:
        assert [(o.key, o.params, o.record, o.value) for o in outcomes] == \
               [(o.key, o.params, o.record, o.value) for o in here[key]]
    assert dict(got)["x7"][0].reason == "RuntimeError: toy evaluation exploded"


def test_a_task_gets_one_part_and_its_value(fake_ray, monkeypatch):
    chunks, _ = fake_ray
    monkeypatch.setattr(ex, "TASK_SECONDS", 1e9)
    space = Squares(60, parts=3)
    got: dict[str, list[Outcome]] = {}
    Executor(1).run(space, space.candidates(), lambda c, o: got.__setitem__(c.key, o))
    part_of = {c.key: c.part for c in space.candidates()}
    assert all(len({part_of[k] for k in chunk}) == 1 for chunk in chunks)
    assert all(o[0].record["part"] == f"value of {part_of[k]}" for k, o in got.items())


def test_a_dead_worker_fails_its_chunk_and_the_search_goes_on(fake_ray, monkeypatch):
    chunks, dying = fake_ray
    monkeypatch.setattr(ex, "TASK_SECONDS", 1e9)
    dying.add(5)
    space = Squares(100)
    got: dict[str, list[Outcome]] = {}
    Executor(2).run(space, space.candidates(), lambda c, o: got.__setitem__(c.key, o))
    assert len(got) == 100
    failed = {k for k, o in got.items() if o[0].status == "failed"}
    assert failed == set(chunks[5]) and all(got[k][0].reason.startswith("worker error: ") for k in failed)
