"""The Optuna study as the record of a search: storage, study names, trials, resume.

Every outcome is one trial: COMPLETE (value = what the space minimises), PRUNED (infeasible,
the reason in the ``error`` user attribute) or FAIL (invalid or failed, the error kept). The
outcomes of evaluations are buffered and written together, one database transaction per
batch (at most :data:`FLUSH_SECONDS` apart), so an evaluation's outcomes are recorded whole or
not at all and a search of thousands of trials spends little time writing. Each trial carries the outcome's study ``key`` and its
whole JSON record (``result``), so a resumed search reads finished outcomes back without
evaluating them again. The storage is any Optuna storage URL; by default a SQLite file in the
output folder.

Several searches may share one study (Optuna's distributed optimisation): before evaluating, a
search claims its candidates' keys as RUNNING trials tagged with its worker id, in one
transaction under a lock on the study row, and skips keys that are finished or claimed by a live
worker. Heartbeats (Optuna's ``trial_heartbeats`` table, every :data:`HEARTBEAT_SECONDS`) and,
on the same host, the claiming process's pid tell a live claim from an abandoned one, which is
marked FAIL and claimed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from tuner.report import json_default
from tuner.search.core import Candidate, Outcome

__all__ = ["SearchStudy", "StorageError", "StudyInUse", "open_study", "default_storage", "display_storage", "storage_url",
           "fingerprint", "trial_for", "finished_outcomes", "FLUSH_SECONDS", "live_workers", "worker_alive",
           "new_worker_id", "describe_worker", "Heartbeat", "CLAIM_GRACE_SECONDS", "HEARTBEAT_SECONDS", "WORKER_ATTR",
           "OPEN_ATTEMPTS"]

#: buffered outcomes are written at least this often (seconds)
FLUSH_SECONDS = 1.0


class StorageError(RuntimeError):
    """The study storage failed during a search (server down, disk full); the message names it, masked."""


class StudyInUse(ValueError):
    """A search would delete a study that another live search is evaluating; the message names it."""


def describe_worker(worker: str) -> str:
    """``host, process PID`` of a worker id."""
    host, pid = (worker.split(":") + ["", ""])[:2]
    return f"{host.split('/')[0]}, process {pid}"


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
    for attempt in range(OPEN_ATTEMPTS - 1):
        try:
            return _open_study(name, storage, resume)
        except ValueError as exc:
            if exc.__context__ is None or not _first_open_race(exc.__context__):
                raise
            time.sleep(0.2 * (attempt + 1))
    return _open_study(name, storage, resume)


#: tries to open a study whose tables another search may be creating at the same moment
OPEN_ATTEMPTS = 4


def _first_open_race(exc: BaseException) -> bool:
    """Whether ``exc`` is two searches creating the same storage's tables or study at once (worth a retry)."""
    text = " ".join(str(e) for e in (exc, exc.__cause__, exc.__context__) if e is not None).lower()
    return any(s in text for s in ("unique constraint", "already exists", "duplicate key", "database is locked"))


def _open_study(name: str, storage: str, resume: bool) -> optuna.Study:
    url = storage_url(storage)
    try:
        if not resume:
            with contextlib.suppress(KeyError):
                others = live_workers(optuna.load_study(study_name=name, storage=url))
                if others:
                    raise StudyInUse(f"study {name!r} in {display_storage(storage)}: another tuner search "
                                     f"({describe_worker(others[0])}) is evaluating it; starting it again would "
                                     "delete its trials: --resume joins it (the two share the work), or wait for it")
                optuna.delete_study(study_name=name, storage=url)
        return optuna.create_study(study_name=name, storage=url, direction="minimize", load_if_exists=True)
    except Exception as exc:  # Optuna's, the driver's import and SQLAlchemy's URL / connection errors
        if isinstance(exc, StudyInUse) or not _storage_failure(exc):
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


def _tables() -> tuple[Any, Any, Any, Any, Any, Any]:
    """Optuna's tables: studies, trials, trial parameters, values, user attributes, heartbeats."""
    from optuna.storages._rdb import models

    return (models.StudyModel.__table__, models.TrialModel.__table__, models.TrialParamModel.__table__,
            models.TrialValueModel.__table__, models.TrialUserAttributeModel.__table__,
            models.TrialHeartbeatModel.__table__)


@contextlib.contextmanager
def _transaction(backend: Any, lock_study: int | None = None) -> Iterator[Any]:
    """A connection in one transaction of ``backend``: committed when the block ends, rolled back when it
    raises; with ``lock_study`` the study's write lock is taken first (:func:`_lock_study`)."""
    txn = backend.scoped_session()
    try:
        conn = txn.connection()
        if lock_study is not None:
            _lock_study(conn, lock_study)
        yield conn
        txn.commit()
    except BaseException:
        txn.rollback()
        raise
    finally:
        txn.close()


def _lock_study(conn: Any, study_id: int) -> None:
    """Take the study's write lock for the transaction: a no-op update of its row.

    PostgreSQL and MySQL lock the row; SQLite's first write takes the database's write lock, so the
    reads that follow see every other worker's committed claims and trial numbers stay unique.
    """
    from sqlalchemy import update

    studies = _tables()[0]
    conn.execute(update(studies).where(studies.c.study_id == study_id).values(study_name=studies.c.study_name))


def _now(conn: Any) -> Any:
    """The database's clock (naive UTC), which every worker's heartbeats are compared on."""
    from sqlalchemy import func, select

    return conn.execute(select(func.now())).scalar().replace(tzinfo=None)


def _insert_trials(conn: Any, study_id: int, rows: list[dict]) -> list[int]:
    """Insert trial rows (state and datetimes) numbered after the study's last (under its lock); their ids."""
    from sqlalchemy import func, insert, select

    trials = _tables()[1]
    first = conn.execute(select(func.count()).select_from(trials).where(trials.c.study_id == study_id)).scalar()
    conn.execute(insert(trials), [{**row, "number": first + n, "study_id": study_id} for n, row in enumerate(rows)])
    numbers = dict(conn.execute(select(trials.c.number, trials.c.trial_id).where(
        trials.c.study_id == study_id, trials.c.number >= first)).all())
    return [numbers[first + n] for n in range(len(rows))]


def _insert_rows(backend: Any, study_id: int, outcomes: list[Outcome], distributions: dict[str, BaseDistribution],
                 claimed: dict[str, int] | None = None) -> None:
    """Write ``outcomes`` into Optuna's tables in one transaction (a few bulk statements).

    An outcome whose key this run claimed turns its RUNNING trial into the finished one; any other
    is inserted as a new trial. Optuna's ``add_trials`` commits every trial on its own through the
    ORM (about 30 ms each on SQLite); the rows written here are the ones it writes: trial,
    parameters, value, user attributes.
    """
    import datetime as dt

    from optuna.distributions import distribution_to_json
    from optuna.storages._rdb import models
    from sqlalchemy import delete, insert, update

    claimed = claimed or {}
    _, trials, params_t, values_t, attrs_t, beats_t = _tables()
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)  # Optuna stores naive UTC
    with _transaction(backend, lock_study=study_id) as conn:
        ids: dict[int, int] = {}  # outcome index -> trial id
        updates = [(i, claimed[o.key]) for i, o in enumerate(outcomes) if o.key in claimed]
        fresh = [i for i, o in enumerate(outcomes) if o.key not in claimed]
        for i, tid in updates:
            conn.execute(update(trials).where(trials.c.trial_id == tid).values(state=outcomes[i].state,
                                                                             datetime_complete=now))
            ids[i] = tid
        if updates:
            done = [tid for _, tid in updates]
            conn.execute(delete(beats_t).where(beats_t.c.trial_id.in_(done)))
            conn.execute(delete(attrs_t).where(attrs_t.c.trial_id.in_(done), attrs_t.c.key == "key"))
        if fresh:
            new = _insert_trials(conn, study_id, [{"state": outcomes[i].state, "datetime_start": now,
                                                   "datetime_complete": now} for i in fresh])
            ids.update(zip(fresh, new, strict=True))
        params, values, attrs = [], [], []
        for i, o in enumerate(outcomes):
            tid = ids[i]
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


#: a claim whose worker has not refreshed its heartbeat for this long is abandoned (seconds)
CLAIM_GRACE_SECONDS = 30.0
#: how often a search refreshes the heartbeats of its claims (seconds)
HEARTBEAT_SECONDS = 5.0
#: the user attribute naming the worker that claimed (and evaluated) a trial
WORKER_ATTR = "worker"
#: worker ids of the searches running in this process
_ACTIVE: set[str] = set()


def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux; '' elsewhere): tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""  # field 22 of the line; the name in parentheses may hold spaces


def _process_space() -> str:
    """This host's name and process-id namespace: where a worker's pid means the same process."""
    try:
        namespace = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}/{namespace}" if namespace else socket.gethostname()


def new_worker_id() -> str:
    """``host[/pidns]:pid:start:token``: who claims trials; unique per search, its process found again by pid
    and start time where the pid namespace is the same (containers sharing a host name are told apart)."""
    pid = os.getpid()
    return f"{_process_space()}:{pid}:{_process_start(pid)}:{secrets.token_hex(3)}"


def worker_alive(worker: str, heartbeat_age: float | None) -> bool:
    """Whether the search ``worker`` still runs: its heartbeat is fresh and, on this host, its process lives."""
    if heartbeat_age is None or heartbeat_age > CLAIM_GRACE_SECONDS:
        return False
    host, pid_text, start = (worker.split(":") + ["", "", ""])[:3]
    if host != _process_space() or not pid_text.isdigit():
        return True  # another machine or container: its heartbeat says
    pid = int(pid_text)
    if pid == os.getpid():
        return worker in _ACTIVE
    now_start = _process_start(pid)
    if now_start or start:
        return now_start == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _claims_of(conn: Any, study_id: int, keys: list[str] | None) -> list[tuple[int, TrialState, str, str, Any]]:
    """(trial id, state, key, worker, heartbeat) of the study's RUNNING, COMPLETE and PRUNED keyed trials
    (of ``keys`` only, unless None)."""
    from sqlalchemy import and_, select

    _, trials, _, _, attrs, beats = _tables()
    key_a, worker_a = attrs.alias("key_attr"), attrs.alias("worker_attr")
    base = select(trials.c.trial_id, trials.c.state, key_a.c.value_json, worker_a.c.value_json,
                  beats.c.heartbeat).select_from(
        trials.join(key_a, and_(key_a.c.trial_id == trials.c.trial_id, key_a.c.key == "key"))
        .outerjoin(worker_a, and_(worker_a.c.trial_id == trials.c.trial_id, worker_a.c.key == WORKER_ATTR))
        .outerjoin(beats, beats.c.trial_id == trials.c.trial_id)
    ).where(trials.c.study_id == study_id,
            trials.c.state.in_([TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED]))
    if keys is None:
        queries = [base.where(trials.c.state == TrialState.RUNNING)]
    else:  # bounded IN lists (SQLite's limit on bound parameters)
        wanted = [json.dumps(k) for k in keys]
        queries = [base.where(key_a.c.value_json.in_(wanted[i:i + 500])) for i in range(0, len(wanted), 500)]
    rows = []
    for query in queries:
        for tid, state, key, worker, beat in conn.execute(query).all():
            rows.append((tid, state, json.loads(key), json.loads(worker) if worker else "", beat))
    return rows


def _age(now: Any, beat: Any) -> float | None:
    """Seconds since ``beat`` on the database's clock (None without a heartbeat)."""
    return None if beat is None else (now - beat.replace(tzinfo=None)).total_seconds()


def live_workers(study: optuna.Study, me: str = "") -> list[str]:
    """Workers other than ``me`` that hold live claims in ``study`` (relational storages; else none)."""
    backend = _rdb_backend(study)
    if backend is None:
        return []
    with _transaction(backend) as conn:
        now = _now(conn)
        rows = _claims_of(conn, study._study_id, None)
    return sorted({w for _, _, _, w, beat in rows if w and w != me and worker_alive(w, _age(now, beat))})


def _fail_trials(conn: Any, tids: list[int], reason: str) -> None:
    """Mark RUNNING claims FAIL with ``reason`` (their heartbeats removed)."""
    import datetime as dt

    from sqlalchemy import delete, insert, update

    _, trials, _, _, attrs, beats = _tables()
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    for i in range(0, len(tids), 500):
        part = tids[i:i + 500]
        conn.execute(update(trials).where(trials.c.trial_id.in_(part), trials.c.state == TrialState.RUNNING)
                     .values(state=TrialState.FAIL, datetime_complete=now))
        conn.execute(delete(beats).where(beats.c.trial_id.in_(part)))
        conn.execute(delete(attrs).where(attrs.c.trial_id.in_(part), attrs.c.key == "error"))
        conn.execute(insert(attrs), [{"trial_id": t, "key": "error", "value_json": json.dumps(reason)} for t in part])


def _beat(backend: Any, study_id: int, worker: str) -> None:
    """Refresh the heartbeats of ``worker``'s claims."""
    from sqlalchemy import func, select, update

    _, _, _, _, attrs, beats = _tables()
    mine = select(attrs.c.trial_id).where(attrs.c.key == WORKER_ATTR, attrs.c.value_json == json.dumps(worker))
    with _transaction(backend) as conn:
        conn.execute(update(beats).where(beats.c.trial_id.in_(mine)).values(heartbeat=func.now()))


class Heartbeat:
    """A daemon thread refreshing a worker's claims every :data:`HEARTBEAT_SECONDS` while its search runs."""

    def __init__(self, backend: Any, study_id: int, worker: str) -> None:
        self._stop = threading.Event()
        self._args = (backend, study_id, worker)
        self._thread = threading.Thread(target=self._run, name="tuner-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(Exception):  # an outage surfaces in the search's own next write
                _beat(*self._args)

    def stop(self) -> None:
        """End the thread (waits for a heartbeat in progress)."""
        self._stop.set()
        self._thread.join(timeout=10)


class SearchStudy:
    """A study opened for one search: records outcomes in batches, reads finished ones back."""

    def __init__(self, study: optuna.Study, distributions: dict[str, BaseDistribution], storage: str = "") -> None:
        self.study = study
        self.distributions = distributions
        self.storage = storage
        self.recorded = 0  # trials written by this object
        self._buffer: list[Outcome] = []
        self._last_flush = time.monotonic()
        self.worker = new_worker_id()
        self.claimed: dict[str, int] = {}  # key -> RUNNING trial id of this run's claims not yet recorded
        self._heartbeat: Heartbeat | None = None

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
                _insert_rows(backend, self.study._study_id, batch, self.distributions, self.claimed)
                for o in batch:
                    self.claimed.pop(o.key, None)
            else:  # in-memory and journal storages: Optuna's own path
                self.study.add_trials([trial_for(o, self.distributions) for o in batch])
        except Exception as exc:
            if not _storage_failure(exc):
                raise
            raise StorageError(_storage_problem(exc, self.storage or "storage")) from None
        self.recorded += len(batch)

    def claim(self, candidates: list[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
        """Claim ``candidates`` for this run: (claimed, another run's).

        A candidate is another run's when the study already holds all its outcomes or a live
        worker has claimed one of them; otherwise each of its keys gets a RUNNING trial of this
        worker (a claim a stopped worker left is marked FAIL first). One transaction under the
        study's lock, so two searches never claim the same key. Storages other than relational
        ones (in memory) have no other workers: everything is claimed.
        """
        backend = _rdb_backend(self.study)
        if backend is None or not candidates:
            return list(candidates), []
        try:
            mine, theirs, new = self._claim(backend, candidates)
        except Exception as exc:
            if not _storage_failure(exc):
                raise
            raise StorageError(_storage_problem(exc, self.storage or "storage")) from None
        self.claimed.update(new)
        if new and self._heartbeat is None:
            _ACTIVE.add(self.worker)
            self._heartbeat = Heartbeat(backend, self.study._study_id, self.worker)
        return mine, theirs

    def _claim(self, backend: Any, candidates: list[Candidate]) -> tuple[list[Candidate], list[Candidate],
                                                                        dict[str, int]]:
        import datetime as dt

        from sqlalchemy import insert

        _, _, _, _, attrs, beats = _tables()
        sid = self.study._study_id
        with _transaction(backend, lock_study=sid) as conn:
            now = _now(conn)
            finished: set[str] = set()
            running: dict[str, list[tuple[int, str, float | None]]] = {}
            for tid, state, key, worker, beat in _claims_of(conn, sid, [k for c in candidates for k in c.keys]):
                if state == TrialState.RUNNING:
                    running.setdefault(key, []).append((tid, worker, _age(now, beat)))
                else:
                    finished.add(key)
            mine, theirs, stale = [], [], []
            for c in candidates:
                held = [r for k in c.keys for r in running.get(k, [])]
                if all(k in finished for k in c.keys) or any(
                        w != self.worker and worker_alive(w, age) for _, w, age in held):
                    theirs.append(c)
                else:
                    mine.append(c)
                    stale += [tid for tid, _, _ in held]
            if stale:
                _fail_trials(conn, stale, "abandoned: the search that claimed it stopped before recording an outcome")
            keys = [k for c in mine for k in c.keys]
            new: dict[str, int] = {}
            if keys:
                start = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
                tids = _insert_trials(conn, sid, [{"state": TrialState.RUNNING, "datetime_start": start}] * len(keys))
                new = dict(zip(keys, tids, strict=True))
                conn.execute(insert(attrs), [{"trial_id": t, "key": name, "value_json": json.dumps(value)}
                                             for k, t in new.items()
                                             for name, value in (("key", k), (WORKER_ATTR, self.worker))])
                conn.execute(insert(beats), [{"trial_id": t, "heartbeat": now} for t in new.values()])
        return mine, theirs, new

    def release(self) -> None:
        """Stop the heartbeat; claims not recorded (the search stopped early) become FAIL. Never raises."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        backend = _rdb_backend(self.study)
        left, self.claimed = list(self.claimed.values()), {}
        if backend is not None and left:
            # a lost storage: the claims go stale and are taken over
            with contextlib.suppress(Exception), _transaction(backend, lock_study=self.study._study_id) as conn:
                _fail_trials(conn, left, "interrupted: the search stopped before recording an outcome")
        _ACTIVE.discard(self.worker)

    def finished(self) -> dict[str, Outcome]:
        """Outcomes already recorded, by key (see :func:`finished_outcomes`)."""
        return finished_outcomes(self.study)

    def history(self) -> list[FrozenTrial]:
        """Finished trials (COMPLETE and PRUNED), for a sampler to learn from."""
        return self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
