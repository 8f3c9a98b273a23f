"""Optuna's NSGA-II as a proposer of ``space: rent`` candidates: two objectives, three constraints.

The sampler runs on an in-memory two-objective study (time to train in hours, cost in USD); the
driver records every outcome in the persistent study as it returns (value = time to train), and
a resumed search seeds the sampler with the records the persistent study holds. Each told trial
carries the record's constraint values (``memory``, ``deadline``, ``budget``: ``need / limit - 1``,
met when <= 0), so NSGA-II prefers candidates that meet them (constrained domination). A plan
that does not fit in memory is told with both objectives at :data:`UNMET` and its memory excess
as the violation; parameters that map to no candidate are told FAIL at no cost; a candidate
proposed again is told the outcome it already has.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, Trial, TrialState, create_trial

from tuner.search.core import Candidate, Outcome, Proposer

__all__ = ["NSGAProposer", "PolishProposer", "objectives", "UNMET"]

#: objective values told for a plan without a prediction (it did not fit in memory)
UNMET = 1e30

#: sampled parameters -> the candidate they make, or ``None`` when they make none
Resolve = Callable[[dict], Candidate | None]


def objectives(record: dict) -> tuple[float, float] | None:
    """(time to train h, cost USD) of a record with a prediction, else ``None``."""
    t, usd = record.get("time_to_train_h"), record.get("usd")
    return None if t is None or usd is None else (float(t), float(usd))


@dataclass
class _Sampler:
    """One NSGA-II study: its distributions (without the group's parameter), its share of the target."""

    study: optuna.Study
    distributions: dict[str, BaseDistribution]
    target: int
    fixed: dict[str, Any]  # the group's parameter value, added to every sampled set
    asks: int = 0

    @property
    def max_asks(self) -> int:
        return 30 * self.target + 100


class NSGAProposer(Proposer):
    """Proposes ``target`` distinct candidates chosen by seeded NSGA-II samplers, ``batch_size`` at a time.

    With ``group`` (a parameter name, e.g. ``accelerator``) each value of that parameter gets its
    own sampler and an equal share of ``target``, asked in turn: every accelerator's own
    time-cost front is searched, not only the one that dominates. A sampler makes at most
    ``30 * share + 100`` asks, so a group with few valid parameter combinations ends.
    """

    def __init__(
        self,
        distributions: dict[str, BaseDistribution],
        resolve: Resolve,
        *,
        target: int,
        batch_size: int,
        seed: int,
        population: int,
        history: list[FrozenTrial],
        group: str | None = None,
    ) -> None:
        self.distributions = distributions
        self.resolve = resolve
        self.target = target
        self.batch_size = max(batch_size, 1)
        self.group = group
        values = list(distributions[group].choices) if group else [None]  # type: ignore[attr-defined]
        own = {k: d for k, d in distributions.items() if k != group}
        self.samplers: list[_Sampler] = []
        for i, v in enumerate(values):
            sampler = optuna.samplers.NSGAIISampler(seed=seed + i, population_size=population)
            study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
            share = target // len(values) + (1 if i < target % len(values) else 0)
            self.samplers.append(_Sampler(study, own, share, {group: v} if group else {}))
        for old in history:
            self._seed(old)
        self.asked: dict[str, tuple[_Sampler, Trial]] = {}
        self.turn = 0

    def _seed(self, old: FrozenTrial) -> None:
        """Add a trial of the persistent study to its sampler as a two-objective trial (if it has both)."""
        if set(old.params) != set(self.distributions) or "result" not in old.user_attrs:
            return
        values, cons = self._values(json.loads(old.user_attrs["result"]))
        s = self._sampler_of(old.params)
        if values is None or s is None:
            return
        params = {k: v for k, v in old.params.items() if k not in s.fixed}
        s.study.add_trial(create_trial(params=params, distributions=s.distributions, values=list(values),
                                       constraints=cons))

    def _sampler_of(self, params: dict) -> _Sampler | None:
        return next((s for s in self.samplers if all(params.get(k) == v for k, v in s.fixed.items())), None)

    @staticmethod
    def _values(rec: dict) -> tuple[tuple[float, float] | None, dict[str, float]]:
        cons = {k: float(v) for k, v in (rec.get("constraints") or {}).items()}
        values = objectives(rec)
        if values is None and cons.get("memory", 0.0) > 0:
            values = (UNMET, UNMET)
        return values, cons

    @staticmethod
    def _tell(s: _Sampler, trial: Trial, outcome: Outcome | None) -> None:
        values, cons = NSGAProposer._values(outcome.record) if outcome is not None else (None, {})
        if values is None:
            s.study.tell(trial, state=TrialState.FAIL)
            return
        for name, v in cons.items():
            trial.set_constraint(name, v)
        s.study.tell(trial, list(values))

    @staticmethod
    def _have(s: _Sampler, done: dict[str, list[Outcome]]) -> int:
        """Evaluated candidates in sampler ``s``'s share."""
        return sum(1 for outs in done.values() if all(outs[0].params.get(k) == v for k, v in s.fixed.items()))

    def propose(self, done: dict[str, list[Outcome]]) -> list[Candidate]:
        """Up to ``batch_size`` new candidates, the samplers asked in turn; empty once every share is done."""
        batch: list[Candidate] = []
        # per sampler: evaluated (``done`` holds still while proposing) and asked, not yet evaluated
        have = {id(s): self._have(s, done) for s in self.samplers}
        pending = {id(s): sum(1 for q, _ in self.asked.values() if q is s) for s in self.samplers}
        while len(batch) < self.batch_size:
            open_ = [s for s in self.samplers if have[id(s)] + pending[id(s)] < s.target and s.asks < s.max_asks]
            if not open_:
                break
            s = open_[self.turn % len(open_)]
            self.turn += 1
            trial = s.study.ask(s.distributions)
            s.asks += 1
            cand = self.resolve({**trial.params, **s.fixed})
            if cand is None:
                self._tell(s, trial, None)
            elif cand.key in done or cand.key in self.asked:  # proposed again: reuse its outcome
                prev = done.get(cand.key)
                self._tell(s, trial, prev[0] if prev else None)
            else:
                self.asked[cand.key] = (s, trial)
                pending[id(s)] += 1
                batch.append(cand)
        return batch

    def observe(self, candidate: Candidate, outcomes: list[Outcome]) -> None:
        s, trial = self.asked.pop(candidate.key)
        self._tell(s, trial, outcomes[0])


class PolishProposer(Proposer):
    """After ``inner`` is done, hill-climb each accelerator's cheapest and fastest feasible record.

    A round proposes, for each accelerator and each objective (cost, time to train), the
    neighbours not evaluated yet of its best feasible record and of its best record that fits in
    memory but misses the deadline or the budget (the fastest plan just over the budget is
    usually one step from the fastest within it): the parameter sets that differ in
    one parameter by one step of its value list (devices, tp, pp, micro-batch...), or one step up
    in one parameter of a ``trades`` pair and one step down in the other. It stops when
    a round has no new neighbour or ``budget`` evaluations are spent. Within one accelerator and
    device count time and cost both scale with the iteration time, so the best plan of a nearby
    device count is usually one step away: this finds what a sampler that spent its trials on
    the dominating accelerator left behind.
    """

    def __init__(self, inner: Proposer, distributions: dict[str, BaseDistribution], resolve: Resolve, *,
                 budget: int, group: str = "accelerator", trades: tuple[tuple[str, str], ...] = ()) -> None:
        self.inner = inner
        self.trades = trades
        self.choices = {k: list(d.choices) for k, d in distributions.items()}  # type: ignore[attr-defined]
        self.resolve = resolve
        self.budget = budget
        self.group = group
        self.spent = 0
        self.inner_done = False
        self.target = inner.target + budget

    def _neighbours(self, params: dict) -> list[dict]:
        out = []
        for name, values in self.choices.items():
            if name == self.group or params.get(name) not in values:
                continue
            i = values.index(params[name])
            out += [{**params, name: values[j]} for j in (i - 1, i + 1) if 0 <= j < len(values)]
        for a, b in self.trades:  # one step up in a and one down in b, and the reverse (tp x pp kept)
            va, vb = self.choices.get(a, []), self.choices.get(b, [])
            if params.get(a) not in va or params.get(b) not in vb:
                continue
            i, j = va.index(params[a]), vb.index(params[b])
            for di in (-1, 1):
                if 0 <= i + di < len(va) and 0 <= j - di < len(vb):
                    out.append({**params, a: va[i + di], b: vb[j - di]})
        return out

    def propose(self, done: dict[str, list[Outcome]]) -> list[Candidate]:
        if not self.inner_done:
            batch = self.inner.propose(done)
            if batch:
                return batch
            self.inner_done = True
        priced = [outs[0] for outs in done.values() if objectives(outs[0].record)]
        ok = [o for o in priced if o.status == "ok"]
        # fits in memory, misses the deadline or the budget
        near = [o for o in priced if o.status != "ok" and (o.record.get("constraints") or {}).get("memory", 0.0) <= 0]
        starts = []  # per accelerator and pool: the cheapest, then the fastest record
        for g in self.choices.get(self.group, [None]):
            for pool in (ok, near):
                mine = [o for o in pool if o.params.get(self.group) == g]
                starts += [min(mine, key=lambda o: objectives(o.record)[i]) for i in (1, 0) if mine]  # type: ignore[index]
        batch: dict[str, Candidate] = {}
        for best in starts:
            if self.spent + len(batch) >= self.budget:
                break
            for params in self._neighbours(best.params):
                cand = self.resolve(params)
                if cand is not None and cand.key not in done and self.spent + len(batch) < self.budget:
                    batch.setdefault(cand.key, cand)
        self.spent += len(batch)
        return list(batch.values())

    def observe(self, candidate: Candidate, outcomes: list[Outcome]) -> None:
        if not self.inner_done:
            self.inner.observe(candidate, outcomes)
