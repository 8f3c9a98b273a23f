"""The Optuna study as the record of a search: storage, study names, trials, resume.

Every outcome is one trial, added as soon as its evaluation returns: COMPLETE (value = what
the space minimises), PRUNED (infeasible, the reason in the ``error`` user attribute) or FAIL
(invalid or failed, the error kept). Each trial carries the outcome's study ``key`` and its
whole JSON record (``result``), so a resumed search reads finished outcomes back without
evaluating them again. The storage is any Optuna storage URL; by default a SQLite file in the
output folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from tuner.report import json_default
from tuner.search.core import Outcome

__all__ = ["SearchStudy", "open_study", "default_storage", "display_storage", "fingerprint", "trial_for",
           "finished_outcomes"]


def _parsed(storage: str) -> Any:
    """``storage`` parsed by SQLAlchemy, or None when it is not a URL SQLAlchemy parses."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(storage)
    except Exception:
        return None


def display_storage(storage: str) -> str:
    """``storage`` as it may be printed or written: any password in the URL replaced by ``***``."""
    url = _parsed(storage)
    if url is None:  # hide everything between '://' and '@'
        head, sep, tail = storage.partition("://")
        return f"{head}{sep}***@{tail.rsplit('@', 1)[1]}" if sep and "@" in tail else storage
    return url.render_as_string(hide_password=True) if url.password else storage


def default_storage(out: Path) -> str:
    """SQLite study file in the output folder (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(out / 'study.db').resolve()}"


def _hide(text: str, storage: str) -> str:
    """``text`` with the storage URL (and its password, if any) shown as :func:`display_storage` shows it."""
    text = text.replace(storage, display_storage(storage))
    url = _parsed(storage)
    if url is not None and url.password:
        text = text.replace(str(url.password), "***")
    return text


def fingerprint(data: Any) -> str:
    """Stable short hash (10 hex digits) of JSON-ready ``data``: part of a study name."""
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:10]


def open_study(name: str, storage: str, resume: bool) -> optuna.Study:
    """Create (or with ``resume`` load) the study; without ``resume`` an old one is replaced.

    Raises ``ValueError("storage URL: problem")`` for a storage that cannot be opened.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        if not resume:
            with contextlib.suppress(KeyError):
                optuna.delete_study(study_name=name, storage=storage)
        return optuna.create_study(study_name=name, storage=storage, direction="minimize", load_if_exists=True)
    except Exception as exc:  # Optuna's, the driver's import and SQLAlchemy's URL / connection errors
        known = (ImportError, ValueError, optuna.exceptions.OptunaError)
        if not isinstance(exc, known) and not type(exc).__module__.startswith("sqlalchemy"):
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"storage {display_storage(storage)!r}: {_hide(first, storage)}") from None


def trial_for(outcome: Outcome, distributions: dict[str, BaseDistribution]) -> FrozenTrial:
    """The trial recording ``outcome``."""
    attrs = {"key": outcome.key, "result": json.dumps(outcome.record, default=json_default)}
    state = outcome.state
    if state == TrialState.COMPLETE:
        return create_trial(params=outcome.params, distributions=distributions, value=outcome.value, user_attrs=attrs)
    attrs["error"] = outcome.reason
    return create_trial(params=outcome.params, distributions=distributions, state=state, user_attrs=attrs)


def finished_outcomes(study: optuna.Study) -> dict[str, Outcome]:
    """Outcomes the study holds (ok or infeasible; failed ones are evaluated again), by key."""
    done = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        key = t.user_attrs.get("key")
        if key and "result" in t.user_attrs:
            done[key] = Outcome(key, dict(t.params), json.loads(t.user_attrs["result"]), t.value)
    return done


class SearchStudy:
    """A study opened for one search: records outcomes, reads finished ones back."""

    def __init__(self, study: optuna.Study, distributions: dict[str, BaseDistribution]) -> None:
        self.study = study
        self.distributions = distributions

    @classmethod
    def open(cls, name: str, storage: str, resume: bool, distributions: dict[str, BaseDistribution]) -> SearchStudy:
        """Open the study ``name`` of ``storage`` (see :func:`open_study`)."""
        return cls(open_study(name, storage, resume), distributions)

    @property
    def name(self) -> str:
        """The study's name."""
        return self.study.study_name

    def record(self, outcomes: list[Outcome]) -> None:
        """Add one trial per outcome, in one write."""
        self.study.add_trials([trial_for(o, self.distributions) for o in outcomes])

    def finished(self) -> dict[str, Outcome]:
        """Outcomes already recorded, by key (see :func:`finished_outcomes`)."""
        return finished_outcomes(self.study)

    def history(self) -> list[FrozenTrial]:
        """Finished trials (COMPLETE and PRUNED), for a sampler to learn from."""
        return self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
