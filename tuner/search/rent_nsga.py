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

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, Trial, TrialState, create_trial

from tuner.search.core import Candidate, Outcome, Proposer

__all__ = ["NSGAProposer", "objectives", "UNMET"]

#: objective values told for a plan without a prediction (it did not fit in memory)
UNMET = 1e30

#: sampled parameters -> the candidate they make, or ``None`` when they make none
Resolve = Callable[[dict], Candidate | None]


def objectives(record: dict) -> tuple[float, float] | None:
    """(time to train h, cost USD) of a record with a prediction, else ``None``."""
    t, usd = record.get("time_to_train_h"), record.get("usd")
    return None if t is None or usd is None else (float(t), float(usd))


class NSGAProposer(Proposer):
    """Proposes ``target`` distinct candidates chosen by a seeded NSGA-II sampler, ``batch_size`` at a time.

    At most ``30 * target + 100`` asks are made in all, so a space with few valid parameter
    combinations ends.
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
    ) -> None:
        self.distributions = distributions
        self.resolve = resolve
        self.target = target
        self.batch_size = max(batch_size, 1)
        sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=population)
        self.sampler_study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
        for old in history:
            seeded = self._seed(old)
            if seeded is not None:
                self.sampler_study.add_trial(seeded)
        self.asks = 0
        self.max_asks = 30 * target + 100
        self.asked: dict[str, Trial] = {}

    def _seed(self, old: FrozenTrial) -> FrozenTrial | None:
        """A study trial of the persistent study as a two-objective trial (None if it has neither)."""
        if set(old.params) != set(self.distributions) or "result" not in old.user_attrs:
            return None
        rec = json.loads(old.user_attrs["result"])
        values, cons = self._values(rec)
        if values is None:
            return None
        return create_trial(params=dict(old.params), distributions=self.distributions, values=list(values),
                            constraints=cons)

    @staticmethod
    def _values(rec: dict) -> tuple[tuple[float, float] | None, dict[str, float]]:
        cons = {k: float(v) for k, v in (rec.get("constraints") or {}).items()}
        values = objectives(rec)
        if values is None and cons.get("memory", 0.0) > 0:
            values = (UNMET, UNMET)
        return values, cons

    def _tell(self, trial: Trial, outcome: Outcome | None) -> None:
        if outcome is None:
            self.sampler_study.tell(trial, state=TrialState.FAIL)
            return
        values, cons = self._values(outcome.record)
        if values is None:
            self.sampler_study.tell(trial, state=TrialState.FAIL)
            return
        for name, v in cons.items():
            trial.set_constraint(name, v)
        self.sampler_study.tell(trial, list(values))

    def propose(self, done: dict[str, list[Outcome]]) -> list[Candidate]:
        """Up to ``batch_size`` new candidates; empty once ``target`` are done or the asks run out."""
        while len(done) < self.target and self.asks < self.max_asks:
            batch: list[Candidate] = []
            while len(batch) < self.batch_size and self.asks < self.max_asks and len(done) + len(batch) < self.target:
                trial = self.sampler_study.ask(self.distributions)
                self.asks += 1
                cand = self.resolve(trial.params)
                if cand is None:
                    self._tell(trial, None)
                elif cand.key in done or cand.key in self.asked:  # proposed again: reuse its outcome
                    prev = done.get(cand.key)
                    self._tell(trial, prev[0] if prev else None)
                else:
                    self.asked[cand.key] = trial
                    batch.append(cand)
            if batch:
                return batch
        return []

    def observe(self, candidate: Candidate, outcomes: list[Outcome]) -> None:
        self._tell(self.asked.pop(candidate.key), outcomes[0])
