"""The Optuna study as the record of a search: storage, study names, trials, resume.

Every outcome is one trial: COMPLETE (value = what the space minimises), PRUNED (infeasible,
the reason in the ``error`` user attribute) or FAIL (invalid or failed, the error kept). The
outcomes of evaluations are buffered and written together, one database transaction per
batch (at most :data:`FLUSH_SECONDS` apart), so an evaluation's outcomes are recorded whole or
not at all and a search of thousands of trials spends little time writing. Each trial carries the outcome's study ``key`` and its
whole JSON record (``result``), so a resumed search reads finished outcomes back without
evaluating them again. The storage is any Optuna storage URL; by default a SQLite file in the
output folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from tuner.report import json_default
from tuner.search.core import Outcome

__all__ = ["SearchStudy", "StorageError", "open_study", "default_storage", "display_storage", "storage_url",
           "fingerprint", "trial_for", "finished_outcomes", "FLUSH_SECONDS"]

#: buffered outcomes are written at least this often (seconds)
FLUSH_SECONDS = 1.0


class StorageError(RuntimeError):
    """The study storage failed during a search (server down, disk full); the message names it, masked."""


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


def storage_url(storage: str) -> str:
    """The URL handed to SQLAlchemy: a ``postgresql://`` URL names the PostgreSQL driver that is installed.

    SQLAlchemy 2.0 reads a bare ``postgresql://`` as psycopg2 and 2.1 as psycopg (3); the
    ``tuner[postgres]`` extra installs psycopg (3), so the URL is rewritten to the driver present.
    """
    head, sep, tail = storage.partition("://")
    if head != "postgresql" or not sep:
        return storage
    for module, dialect in (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"{dialect}://{tail}"
    return storage


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


def _storage_problem(exc: BaseException, storage: str) -> str:
    """One line on a storage failure, the password masked; a missing driver names the extra to install."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if cause is not None and type(cause).__module__.startswith(("sqlalchemy", "psycopg", "sqlite3")):
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else first  # the driver's own words
    if isinstance(exc, ImportError) or "DB access module" in first:
        first += " (PostgreSQL: pip install 'tuner[postgres]')"
    return f"storage {display_storage(storage)!r}: {_hide(first, storage)}"


def _storage_failure(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the storage (Optuna, SQLAlchemy, a database driver, a driver import)."""
    known = (ImportError, ValueError, OSError, optuna.exceptions.OptunaError)
    return isinstance(exc, known) or type(exc).__module__.startswith(("sqlalchemy", "psycopg", "sqlite3"))


def open_study(name: str, storage: str, resume: bool) -> optuna.Study:
    """Create (or with ``resume`` load) the study; without ``resume`` an old one is replaced.

    Raises ``ValueError("storage URL: problem")`` for a storage that cannot be opened.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_url(storage)
    try:
        if not resume:
            with contextlib.suppress(KeyError):
                optuna.delete_study(study_name=name, storage=url)
        return optuna.create_study(study_name=name, storage=url, direction="minimize", load_if_exists=True)
    except Exception as exc:  # Optuna's, the driver's import and SQLAlchemy's URL / connection errors
        if not _storage_failure(exc):
            raise
        raise ValueError(_storage_problem(exc, storage)) from None


def _user_attrs(outcome: Outcome) -> dict[str, str]:
    """The trial's user attributes: the study key, the JSON record, and the reason when not ``ok``."""
    attrs = {"key": outcome.key, "result": json.dumps(outcome.record, default=json_default)}
    if outcome.state != TrialState.COMPLETE:
        attrs["error"] = outcome.reason
    return attrs


def trial_for(outcome: Outcome, distributions: dict[str, BaseDistribution]) -> FrozenTrial:
    """The trial recording ``outcome``."""
    attrs = _user_attrs(outcome)
    if outcome.state == TrialState.COMPLETE:
        return create_trial(params=outcome.params, distributions=distributions, value=outcome.value, user_attrs=attrs)
    return create_trial(params=outcome.params, distributions=distributions, state=outcome.state, user_attrs=attrs)


def finished_outcomes(study: optuna.Study) -> dict[str, Outcome]:
    """Outcomes the study holds (ok or infeasible; failed ones are evaluated again), by key."""
    done = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        key = t.user_attrs.get("key")
        if key and "result" in t.user_attrs:
            done[key] = Outcome(key, dict(t.params), json.loads(t.user_attrs["result"]), t.value)
    return done


def _rdb_backend(study: optuna.Study) -> Any:
    """The relational storage behind ``study`` (None for in-memory, journal or other storages)."""
    from optuna.storages import RDBStorage

    storage = getattr(study, "_storage", None)
    backend = getattr(storage, "_backend", storage)
    return backend if isinstance(backend, RDBStorage) and hasattr(backend, "scoped_session") else None


def _insert_rows(backend: Any, study_id: int, outcomes: list[Outcome],
                 distributions: dict[str, BaseDistribution]) -> None:
    """Insert finished trials for ``outcomes`` into Optuna's tables in one transaction (a few bulk statements).

    Optuna's ``add_trials`` commits every trial on its own through the ORM (about 30 ms each on
    SQLite); the rows written here are the ones it writes: trial, parameters, value, user attributes.
    """
    import datetime as dt

    from optuna.distributions import distribution_to_json
    from optuna.storages._rdb import models
    from sqlalchemy import func, insert, select

    trials, params_t = models.TrialModel.__table__, models.TrialParamModel.__table__
    values_t, attrs_t = models.TrialValueModel.__table__, models.TrialUserAttributeModel.__table__
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)  # Optuna stores naive UTC
    txn = backend.scoped_session()
    try:
        models.StudyModel.find_or_raise_by_id(study_id, txn, for_update=True)  # trial numbers stay unique
        conn = txn.connection()
        first = conn.execute(select(func.count()).select_from(trials).where(trials.c.study_id == study_id)).scalar()
        conn.execute(insert(trials), [{"number": first + i, "study_id": study_id, "state": o.state,
                                       "datetime_start": now, "datetime_complete": now}
                                      for i, o in enumerate(outcomes)])
        ids = dict(conn.execute(select(trials.c.number, trials.c.trial_id).where(
            trials.c.study_id == study_id, trials.c.number >= first)).all())
        params, values, attrs = [], [], []
        for i, o in enumerate(outcomes):
            tid = ids[first + i]
            for name, value in o.params.items():
                dist = distributions[name]
                params.append({"trial_id": tid, "param_name": name, "param_value": dist.to_internal_repr(value),
                               "distribution_json": distribution_to_json(dist)})
            if o.state == TrialState.COMPLETE:
                stored, kind = models.TrialValueModel.value_to_stored_repr(float(o.value))
                values.append({"trial_id": tid, "objective": 0, "value": stored, "value_type": kind})
            for key, value in _user_attrs(o).items():
                attrs.append({"trial_id": tid, "key": key, "value_json": json.dumps(value)})
        for table, rows in ((params_t, params), (values_t, values), (attrs_t, attrs)):
            if rows:
                conn.execute(insert(table), rows)
        txn.commit()
    except BaseException:
        txn.rollback()
        raise
    finally:
        txn.close()


class SearchStudy:
    """A study opened for one search: records outcomes in batches, reads finished ones back."""

    def __init__(self, study: optuna.Study, distributions: dict[str, BaseDistribution], storage: str = "") -> None:
        self.study = study
        self.distributions = distributions
        self.storage = storage
        self.recorded = 0  # trials written by this object
        self._buffer: list[Outcome] = []
        self._last_flush = time.monotonic()

    @classmethod
    def open(cls, name: str, storage: str, resume: bool, distributions: dict[str, BaseDistribution]) -> SearchStudy:
        """Open the study ``name`` of ``storage`` (see :func:`open_study`)."""
        return cls(open_study(name, storage, resume), distributions, storage)

    @property
    def name(self) -> str:
        """The study's name."""
        return self.study.study_name

    def record(self, outcomes: list[Outcome]) -> None:
        """Buffer one evaluation's outcomes; write the buffer when :data:`FLUSH_SECONDS` have passed."""
        self._buffer.extend(outcomes)
        if time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write every buffered trial in one transaction; raises :class:`StorageError` when the storage fails."""
        batch, self._buffer = self._buffer, []
        self._last_flush = time.monotonic()
        if not batch:
            return
        backend = _rdb_backend(self.study)
        try:
            if backend is not None:
                _insert_rows(backend, self.study._study_id, batch, self.distributions)
            else:  # in-memory and journal storages: Optuna's own path
                self.study.add_trials([trial_for(o, self.distributions) for o in batch])
        except Exception as exc:
            if not _storage_failure(exc):
                raise
            raise StorageError(_storage_problem(exc, self.storage or "storage")) from None
        self.recorded += len(batch)

    def finished(self) -> dict[str, Outcome]:
        """Outcomes already recorded, by key (see :func:`finished_outcomes`)."""
        return finished_outcomes(self.study)

    def history(self) -> list[FrozenTrial]:
        """Finished trials (COMPLETE and PRUNED), for a sampler to learn from."""
        return self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
