"""Optuna TPE as a proposer: asks a sampler for candidates, a batch at a time, and tells it the outcomes.

The sampler runs on an in-memory study (an ask on a SQLite study costs about ten commits);
the driver records every evaluated outcome in the persistent study as it returns, and a
resumed search seeds the sampler with the trials the persistent study holds. Parameters that
map to no candidate are told FAIL at no cost; a candidate proposed again is told the outcome
it already has, without a new evaluation.
"""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.search.core import Candidate, Outcome, Proposer

__all__ = ["TPEProposer"]

#: sampled parameters -> the candidate they make, or ``None`` when they make none
Resolve = Callable[[dict], Candidate | None]


class TPEProposer(Proposer):
    """Proposes ``target`` distinct candidates chosen by a seeded, multivariate TPE sampler.

    ``batch_size`` candidates are asked for at a time (they are evaluated together); at most
    ``30 * target + 100`` asks are made in all, so a space with few valid parameter
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
        history: list[FrozenTrial],
    ) -> None:
        self.distributions = distributions
        self.resolve = resolve
        self.target = target
        self.batch_size = max(batch_size, 1)
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                             n_startup_trials=max(4, min(16, target // 4)))
        self.sampler_study = optuna.create_study(direction="minimize", sampler=sampler)
        for old in history:
            if set(old.params) == set(distributions):
                self.sampler_study.add_trial(old)
        self.asks = 0
        self.max_asks = 30 * target + 100
        self.asked: dict[str, Trial] = {}

    def _tell(self, trial: Trial, outcome: Outcome | None) -> None:
        if outcome is None:
            self.sampler_study.tell(trial, state=TrialState.FAIL)
        elif outcome.state == TrialState.COMPLETE:
            self.sampler_study.tell(trial, outcome.value)
        else:
            self.sampler_study.tell(trial, state=outcome.state)

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
