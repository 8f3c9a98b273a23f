"""The search vocabulary and the one driver: space -> candidates -> evaluation -> outcome.

* A **space** (:class:`SearchSpace`) resolves a validated space file into a picklable context
  (what a worker needs) and enumerates its **candidates** — the way TorchRec's planner has an
  enumerator.
* A **candidate** (:class:`Candidate`) is one evaluation: a study key, the parameters it needs,
  and the study keys of the outcomes it yields (several when one evaluation ranks several
  options together, e.g. every sharder of one task).
* An **evaluation** is ``space.evaluator()(context, candidate, part)``, a module-level function
  the executor (:mod:`tuner.search.executor`) runs in a Ray task or in this process.
* An **outcome** (:class:`Outcome`) is one Optuna trial: ``ok`` (COMPLETE, value = what the
  study minimises), ``infeasible`` (PRUNED, with the reason), ``invalid`` or ``failed`` (FAIL,
  with the error), plus the JSON-ready record the reports read.
* A **proposer** picks the next candidates: every one (:class:`Exhaustive`) or an Optuna
  sampler's choice (:class:`tuner.search.tpe.TPEProposer`).

:func:`run_search` ties them together with the study (:mod:`tuner.search.study`): it skips what
the study already holds when resuming, claims what it evaluates a share at a time (so other
searches of the same study take the rest, and read back what it records), records the outcomes
of finished evaluations in batches (one transaction each, at most a second apart: a killed
search loses only what was in flight and that last second), and returns a :class:`SearchResult`.
"""

from __future__ import annotations

import abc
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
    from rich.console import Console

    from tuner.search.study import SearchStudy

__all__ = ["Candidate", "Outcome", "Evaluator", "SearchSpace", "Proposer", "Exhaustive", "SearchResult", "run_search",
           "STATUSES", "Progress", "AUTO", "RAY_START_SECONDS", "RAY_START_FACTOR", "PROBE_SECONDS", "AUTO_BATCH_WORKERS",
           "probe"]

#: outcome status -> Optuna trial state
STATUSES: dict[str, TrialState] = {
    "ok": TrialState.COMPLETE,
    "infeasible": TrialState.PRUNED,
    "invalid": TrialState.FAIL,
    "failed": TrialState.FAIL,
}

#: a search claims at most this share of the candidates it has left at a time: a search of the same study
#: started meanwhile finds the rest to share
CLAIM_SHARE = 4
#: seconds between reads of the study while only another search's candidates are left
POLL_SECONDS = 1.0

#: ``workers=AUTO``: evaluate in this process, start a local Ray only when the work left pays for its start
AUTO = -1
#: seconds a local Ray takes to start: 9-13 s measured on the 2-core VM (benchmarks/results/search_bench.md)
RAY_START_SECONDS = 10.0
#: a local Ray starts when the in-process work left exceeds this many Ray starts: on 2 CPUs Ray breaks even
#: at 2 (start + work / 2 = work), 3 leaves room for a slow start and for Ray's per-task overhead
RAY_START_FACTOR = 3.0
#: seconds of in-process evaluation (at least one candidate) that time the candidates before the choice
PROBE_SECONDS = 0.5
#: workers the proposer batches for under ``AUTO`` (the earlier default), so its candidates do not depend on
#: where they are evaluated
AUTO_BATCH_WORKERS = 2

#: ``progress(done, total)``: steps done (candidates evaluated or reused, preparation steps) of ``total``
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Candidate:
    """One evaluation of a space: its study key, its parameters, the keys of its outcomes."""

    key: str
    params: dict[str, Any]
    outcome_keys: tuple[str, ...] = ()  # default: one outcome under ``key``
    part: str | None = None  # name of a large shared input the evaluation needs (see SearchSpace.part)

    @property
    def keys(self) -> tuple[str, ...]:
        """Study keys of the outcomes this evaluation yields."""
        return self.outcome_keys or (self.key,)


@dataclass
class Outcome:
    """One evaluated option, recorded as one Optuna trial.

    ``params`` are the trial's parameters (values of the space's distributions), ``value`` the
    number the study minimises (``None`` unless ``ok``) and ``record`` the JSON-ready result,
    whose ``status`` and ``reason`` keys the reports and the study read.
    """

    key: str
    params: dict[str, Any]
    record: dict[str, Any]
    value: float | None = None

    @property
    def status(self) -> str:
        """``ok``, ``infeasible``, ``invalid`` or ``failed``."""
        return self.record.get("status", "failed")

    @property
    def state(self) -> TrialState:
        """The Optuna trial state of the status."""
        return STATUSES.get(self.status, TrialState.FAIL)

    @property
    def reason(self) -> str:
        """Why the option is not ``ok`` (empty when it is)."""
        return str(self.record.get("reason") or "")


#: ``evaluate(context, candidate, part) -> outcomes``; module-level so Ray can ship it to workers
Evaluator = Callable[[Any, Candidate, Any], list[Outcome]]


class SearchSpace(abc.ABC):
    """A space plugged into the search core; subclasses resolve their space file in ``__init__``.

    Required: :attr:`kind`, :meth:`study_name`, :meth:`distributions`, :meth:`candidates`,
    :meth:`evaluator`, :meth:`worker_context`, :meth:`failed`, and the three output hooks the
    ``tuner search`` command calls (:meth:`write_outputs`, :meth:`print_table`, :meth:`summary`).
    """

    #: the ``space:`` value of the files it reads
    kind: ClassVar[str] = ""
    #: ``--all-traces``: :meth:`write_outputs` writes the charts and traces of every candidate's best option,
    #: not only of the best plans
    all_traces: bool = False

    @abc.abstractmethod
    def study_name(self) -> str:
        """Name of the study; it changes whenever a setting that changes results does."""

    @abc.abstractmethod
    def distributions(self) -> dict[str, BaseDistribution]:
        """Optuna distributions of the trial parameters."""

    @abc.abstractmethod
    def candidates(self) -> list[Candidate]:
        """Every candidate of the space, in report order."""

    @abc.abstractmethod
    def evaluator(self) -> Evaluator:
        """The module-level evaluation function."""

    @abc.abstractmethod
    def worker_context(self) -> Any:
        """What every evaluation receives (picklable; sent to the Ray object store once)."""

    @abc.abstractmethod
    def failed(self, candidate: Candidate, reason: str) -> list[Outcome]:
        """``failed`` outcomes for an evaluation that raised or whose worker died."""

    def part(self, name: str) -> Any:
        """A large input shared by the candidates that name it (sent to the object store once)."""
        raise KeyError(name)

    def prepare(self, todo: list[Candidate]) -> list[Callable[[], None]]:
        """Driver-side steps to run before ``todo`` is evaluated (each one is a progress step)."""
        return []

    def proposer(self, candidates: list[Candidate], done: dict[str, list[Outcome]], history: list[FrozenTrial],
                 workers: int) -> Proposer:
        """How to pick candidates; default: every candidate not done."""
        return Exhaustive(candidates, done)

    @abc.abstractmethod
    def write_outputs(self, result: SearchResult, out: Path) -> dict:
        """Write the output files (``results.json`` last, atomically); returns the results document."""

    @abc.abstractmethod
    def print_table(self, payload: dict, console: Console) -> None:
        """The terminal table of a results document."""

    @abc.abstractmethod
    def summary(self, result: SearchResult, payload: dict, out: Path) -> str:
        """One line: what was evaluated and where the outputs are."""


class Proposer(abc.ABC):
    """Picks the candidates to evaluate next, in batches."""

    #: candidates with outcomes when the search is complete (the progress total)
    target: int = 0

    @abc.abstractmethod
    def propose(self, done: dict[str, list[Outcome]]) -> list[Candidate]:
        """The next batch (evaluated before the next call); empty when the search is complete."""

    def observe(self, candidate: Candidate, outcomes: list[Outcome]) -> None:  # noqa: B027 (optional hook)
        """Called with every evaluated candidate's outcomes; the default ignores them."""


class Exhaustive(Proposer):
    """Every candidate not done, in one batch (the executor bounds how many run at once)."""

    def __init__(self, candidates: list[Candidate], done: dict[str, list[Outcome]]) -> None:
        self.todo = [c for c in candidates if c.key not in done]
        self.target = len(candidates)

    def propose(self, done: dict[str, list[Outcome]]) -> list[Candidate]:
        batch, self.todo = self.todo, []
        return batch


@dataclass
class SearchResult:
    """What a search produced: the outcomes by candidate key, and the study's bookkeeping."""

    space: SearchSpace
    outcomes: dict[str, list[Outcome]]  # candidates reused from the study first, then in completion order
    study_name: str
    storage: str
    evaluated: int  # outcomes evaluated now
    reused: int  # outcomes read back from the study
    how: str = ""  # under ``workers=AUTO``: where the search evaluated and why, one clause

    def study_info(self) -> dict[str, Any]:
        """The ``study`` entry of a results document."""
        from tuner.search.study import display_storage

        return {"name": self.study_name, "storage": display_storage(self.storage), "evaluated": self.evaluated,
                "reused_from_study": self.reused}

    def ordered(self) -> list[tuple[Candidate, list[Outcome]]]:
        """(candidate, outcomes) of every candidate with outcomes, in the space's candidate order."""
        return [(c, self.outcomes[c.key]) for c in self.space.candidates() if c.key in self.outcomes]


def run_search(
    space: SearchSpace,
    *,
    storage: str,
    workers: int = AUTO,
    address: str | None = None,
    resume: bool = False,
    progress: Progress | None = None,
    on_open: Callable[[], None] | None = None,
) -> SearchResult:
    """Evaluate ``space``, recording every outcome in the study ``space.study_name()`` of ``storage``.

    ``workers=0`` evaluates in this process; otherwise in Ray tasks on a local Ray with
    ``workers`` CPUs, or on the cluster at ``address`` (or ``RAY_ADDRESS``). ``workers=AUTO``
    uses that cluster when one is named; else it evaluates the first candidates in this process
    (:data:`PROBE_SECONDS`) and starts a local Ray for the rest only when their estimated
    in-process seconds exceed :data:`RAY_START_FACTOR` x :data:`RAY_START_SECONDS`. ``resume``
    reuses the outcomes the study already holds; without it an older study of that name is replaced.
    ``on_open`` runs once the study is open, before anything is evaluated.
    """
    from tuner.search.executor import Executor, cluster_address, connect_ray
    from tuner.search.study import SearchStudy

    study = SearchStudy.open(space.study_name(), storage, resume, space.distributions())
    if on_open is not None:
        on_open()
    candidates = space.candidates()
    finished = study.finished() if resume else {}
    done: dict[str, list[Outcome]] = {}
    for c in candidates:
        if all(k in finished for k in c.keys):
            done[c.key] = [finished[k] for k in c.keys]
    reused = sum(len(v) for v in done.values())
    probing = workers == AUTO and cluster_address(address) is None
    how = ""
    if workers == AUTO:
        how = "" if probing else f"auto: the Ray cluster at {cluster_address(address)}"
        proposer = space.proposer(candidates, done, study.history(), AUTO_BATCH_WORKERS)
        workers = 0 if probing else AUTO_BATCH_WORKERS
    else:
        proposer = space.proposer(candidates, done, study.history(), workers)
    steps = space.prepare([c for c in candidates if c.key not in done])
    total = proposer.target + len(steps)
    prepared = 0
    evaluated = 0

    def tick() -> None:
        if progress:
            progress(min(len(done), proposer.target) + prepared, total)

    tick()
    for step in steps:
        step()
        prepared += 1
        tick()

    def on_result(candidate: Candidate, outcomes: list[Outcome]) -> None:
        nonlocal evaluated
        done[candidate.key] = outcomes
        evaluated += len(outcomes)
        study.record(outcomes)
        proposer.observe(candidate, outcomes)
        tick()

    def on_other(candidate: Candidate, outcomes: list[Outcome]) -> None:  # another search of the study evaluated it
        nonlocal reused
        done[candidate.key] = outcomes
        reused += len(outcomes)
        proposer.observe(candidate, outcomes)
        tick()

    executor = Executor(workers, address)

    def evaluate(batch: list[Candidate]) -> None:
        _evaluate_claimed(batch, study, lambda c: executor.run(space, c, on_result), on_other, workers)

    try:
        while batch := proposer.propose(done):
            if probing:  # time the first candidates here, then choose where the rest runs
                probing = False
                batch, per = probe(batch, evaluate)
                workers, how = choose_workers(per, max(proposer.target - len(done), 0))
                executor = Executor(workers, address)
            if workers > 0:  # Ray joined before anything is claimed: a cluster that cannot be joined leaves no claims
                connect_ray(workers, address)
            evaluate(batch)
    finally:  # outcomes of finished evaluations are written even when the search is interrupted
        try:
            study.flush()
        finally:
            study.release()
    return SearchResult(space, done, study.name, storage, evaluated=evaluated, reused=reused, how=how)


def probe(batch: list[Candidate], evaluate: Callable[[list[Candidate]], None]) -> tuple[list[Candidate], float]:
    """Evaluate the front of ``batch`` in chunks of 1, 1, 2, 4, ... until :data:`PROBE_SECONDS` have passed
    and at least two chunks ran; returns what is left of it and the wall seconds per candidate.

    The first candidate is timed apart: it pays the one-time costs (numba compiling the simulator on a
    fresh install, lazy imports), which made the sharding space's 560 candidates look like 128 s of work
    against the 6 s they take. The rate comes from the later chunks, or from the first when nothing is left.
    """
    t0 = time.perf_counter()
    chunk, batch = batch[:1], batch[1:]
    evaluate(chunk)
    t1 = time.perf_counter()
    first = t1 - t0
    n, size = 0, 1
    while batch and (n == 0 or time.perf_counter() - t0 < PROBE_SECONDS):
        chunk, batch = batch[:size], batch[size:]
        evaluate(chunk)
        n, size = n + len(chunk), 2 * size
    return batch, ((time.perf_counter() - t1) / n if n else first)


def choose_workers(seconds_each: float, left: int, cpus: int | None = None) -> tuple[int, str]:
    """Where ``left`` candidates of ``seconds_each`` wall seconds run under ``AUTO``: (workers, why).

    A local Ray with ``min(cpus, left)`` CPUs when their in-process seconds exceed
    :data:`RAY_START_FACTOR` x :data:`RAY_START_SECONDS` and this machine has 2 CPUs or more;
    else 0 (this process).
    """
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    estimate = seconds_each * left
    limit = RAY_START_FACTOR * RAY_START_SECONDS
    if estimate > limit and cpus > 1 and left > 1:
        workers = min(cpus, left)
        return workers, (f"auto: a local Ray with {workers} CPUs, ~{estimate:.0f} s of work left > {limit:.0f} s "
                         f"({RAY_START_FACTOR:g}x Ray's ~{RAY_START_SECONDS:.0f} s start)")
    why = "one CPU" if cpus <= 1 and estimate > limit else f"~{estimate:.0f} s of work left <= {limit:.0f} s"
    return 0, f"auto: in this process, {why} ({RAY_START_FACTOR:g}x Ray's ~{RAY_START_SECONDS:.0f} s start)"


def _evaluate_claimed(batch: list[Candidate], study: SearchStudy,
                      evaluate: Callable[[list[Candidate]], None], on_other: Callable[[Candidate, list[Outcome]], None],
                      workers: int) -> None:
    """Evaluate ``batch`` alongside any other search of the same study, never a candidate twice.

    Claims a share of what is left (at most 1/:data:`CLAIM_SHARE`, at least two per worker),
    evaluates it, and repeats, so a search started meanwhile finds the rest to share; then reads
    the outcomes of the candidates another search claimed as that search records them, taking
    over any it abandons (killed: its heartbeat stops) and any whose evaluation failed there
    (evaluated again, as a resumed search does).
    """
    queue, waiting = list(batch), []
    least = 2 * max(workers, 1)
    while queue:
        size = max(least, math.ceil(len(queue) / CLAIM_SHARE))
        window, queue = queue[:size], queue[size:]
        mine, theirs = study.claim(window)
        waiting += theirs
        evaluate(mine)
    while waiting:
        study.flush()  # what this search holds back, another one may be waiting for
        found = study.finished()
        left = []
        for c in waiting:
            if all(k in found for k in c.keys):
                on_other(c, [found[k] for k in c.keys])
            else:
                left.append(c)
        if not left:
            return
        mine, waiting = study.claim(left)
        evaluate(mine)
        if not mine:
            time.sleep(POLL_SECONDS)
