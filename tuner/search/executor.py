"""The executor: runs a space's evaluations in this process or as Ray tasks, a bounded window at a time.

``workers=0`` evaluates in this process, one candidate after another. Otherwise the executor
connects to Ray — a local Ray of its own with ``workers`` CPUs (never a cluster that ``ray
start`` or a stale cluster file names), or the existing cluster named by ``--address`` or
``RAY_ADDRESS`` (joined as it is: Ray refuses a CPU count there; ``auto`` joins the cluster
``ray start`` runs on this machine, ``ray://host:port`` goes through Ray's client) — and keeps
at most two tasks per cluster CPU in flight, so every CPU stays busy while results come back
and a killed search loses only that window. A task evaluates a chunk of consecutive candidates
(:class:`ChunkSizer`: about a second of work once the first evaluations are timed), and each
candidate's outcomes go to ``on_result`` whole, in the chunk's order. The space's context (and
each shared part) goes to the object store once; a task whose worker dies is retried by Ray
(``max_retries``), then its candidates are recorded as ``failed``; a lost node, raylet or
cluster ends the run with :class:`ClusterLost` (the outcomes already returned are recorded and a
resumed search skips them).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tuner.search.core import Candidate, Evaluator, Outcome, SearchSpace

__all__ = ["Executor", "ClusterError", "ClusterLost", "connect_ray", "cluster_address", "evaluate_chunk", "ChunkSizer", "TASKS_PER_CPU",
           "TASK_SECONDS", "MAX_CHUNK", "RAY_CLIENT_EXTRA"]

#: what installs Ray's client (``ray://`` addresses): Ray's ``client`` extra, grpcio among it
RAY_CLIENT_EXTRA = "pip install 'tuner[ray-client]' (Ray's client: ray[client])"

#: tasks in flight per cluster CPU
TASKS_PER_CPU = 2
#: seconds one Ray task should run (several candidates when they are fast); Ray's per-task cost is ~ms
TASK_SECONDS = 1.0
#: at most this many candidates per Ray task
MAX_CHUNK = 64

OnResult = Callable[[Candidate, list[Outcome]], None]


class ClusterError(RuntimeError):
    """Ray could not be started or the cluster could not be joined; the message names the cluster."""


class ClusterLost(ClusterError):
    """The cluster, a node or the local raylet went away while the search ran."""


def _lost_cluster_errors() -> tuple[type[BaseException], ...]:
    """Ray's exceptions that mean the cluster (not one evaluation) failed."""
    import ray.exceptions as rex

    names = ("LocalRayletDiedError", "NodeDiedError", "RaySystemError", "OwnerDiedError")
    return tuple(getattr(rex, n) for n in names if hasattr(rex, n))


TOKEN_HINT = ("if the cluster uses token authentication, set RAY_AUTH_TOKEN to its token (`ray get-auth-token` on "
              "the head node prints it)")


def _join_hint(text: str, target: str | None) -> str:
    """What to do about a failed join (token authentication, Ray's client)."""
    low = text.lower()
    if target and target.startswith("ray://") and ("client" in low or "grpc" in low):
        return f"; {RAY_CLIENT_EXTRA}"
    if target and ("auth" in low or "token" in low or "failed to connect" in low):
        return f"; {TOKEN_HINT}"
    return ""


def _token_available() -> bool:
    """Whether a Ray authentication token is at hand: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return True
    return os.path.isfile(os.path.join(os.path.expanduser("~"), ".ray", "auth_token"))


def _reload_ray_config() -> None:
    """Make an imported Ray read ``RAY_*`` variables again (what Ray does when it turns token mode on)."""
    config = getattr(sys.modules.get("ray._raylet"), "Config", None)
    if config is not None and hasattr(config, "initialize"):
        config.initialize("")


def _prepare_join() -> None:
    """Environment for joining an existing cluster.

    Ray 2.52+ sends its token only when ``RAY_AUTH_MODE=token``, and a driver joining an explicit
    address never turns that on itself, so a cluster that `ray start` launched with token
    authentication (the default for local clusters since Ray 2.59) refused the join after 20 s of
    log lines. With a token at hand and no mode chosen, token mode is turned on; Ray's C++ warnings
    (one per retry) are kept off the terminal.
    """
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
    if "RAY_AUTH_MODE" not in os.environ and _token_available():
        os.environ["RAY_AUTH_MODE"] = "token"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def cluster_address(address: str | None) -> str | None:
    """The existing cluster to join: ``address``, else ``RAY_ADDRESS`` (``None``: start a local Ray)."""
    target = address or os.environ.get("RAY_ADDRESS") or None
    return None if target == "local" else target


def connect_ray(workers: int, address: str | None = None) -> int:
    """Start or join Ray (once per process); returns the in-flight window (tasks).

    Without a cluster address a local Ray of its own with ``max(workers, 1)`` CPUs starts
    (``address="local"``: a running ``ray start`` cluster or a stale cluster file is not used). An
    existing cluster gets this package's code shipped with its tasks. Raises
    :class:`ClusterError` with one line when Ray cannot start or the cluster cannot be joined.
    """
    target = cluster_address(address)
    if target is not None and "ray" not in sys.modules:
        _prepare_join()  # before Ray reads its configuration at import
    import ray

    if not ray.is_initialized():
        base: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR,
                                "configure_logging": True}
        where = f"the Ray cluster at {target!r}" if target else f"a local Ray with {max(workers, 1)} CPUs"
        source = " (from RAY_ADDRESS)" if target and not address else ""
        if target and target.startswith("ray://") and importlib.util.find_spec("grpc") is None:
            raise ClusterError(f"cannot connect to {where}{source}: a ray:// address needs Ray's client; "
                               f"{RAY_CLIENT_EXTRA}")
        try:
            if target is None:
                try:
                    ray.init(address="local", num_cpus=max(workers, 1), **base)
                except ValueError as exc:  # a Ray that joins a found cluster anyway: join it without a CPU count
                    if "existing cluster" not in str(exc):
                        raise
                    ray.init(runtime_env=_code_env(), **base)
            else:
                _prepare_join()
                _reload_ray_config()
                ray.init(address=target, runtime_env=_code_env(), **base)
        except (Exception, SystemExit) as exc:  # Ray's connection, authentication and start-up errors
            text = _first_line(exc)
            raise ClusterError(f"cannot connect to {where}{source}: {text}{_join_hint(text, target)}") from None
    try:
        cpus = int(ray.cluster_resources().get("CPU", 0))
    except Exception as exc:  # the cluster went away right after the join
        raise ClusterLost(f"the Ray cluster stopped answering: {_first_line(exc)}") from None
    return TASKS_PER_CPU * max(cpus, 1)


def _code_env() -> dict:
    """Ray runtime environment shipping ``predictor`` and ``tuner`` to the cluster's workers."""
    import predictor
    import tuner

    return {"py_modules": [os.path.dirname(predictor.__file__), os.path.dirname(tuner.__file__)]}


class Executor:
    """Runs evaluations: in this process when ``workers`` is 0, else as Ray tasks."""

    def __init__(self, workers: int = 2, address: str | None = None) -> None:
        self.workers = workers
        self.address = address
        self._space: SearchSpace | None = None
        self._refs: dict[str | None, Any] = {}
        self._remote: Any = None  # evaluate_chunk as a Ray remote function

    def run(self, space: SearchSpace, candidates: list[Candidate], on_result: OnResult) -> None:
        """Evaluate ``candidates``; ``on_result(candidate, outcomes)`` as each one returns."""
        if not candidates:
            return
        if self.workers <= 0:
            self._run_here(space, candidates, on_result)
        else:
            self._run_ray(space, candidates, on_result)

    def _run_here(self, space: SearchSpace, candidates: list[Candidate], on_result: OnResult) -> None:
        evaluate = space.evaluator()
        context = space.worker_context()
        for c in candidates:
            try:
                outcomes = evaluate(context, c, space.part(c.part) if c.part else None)
            except Exception as exc:  # recorded as failed with its error; the search goes on
                reason = f"{type(exc).__name__}: {exc}"
                print(f"warning: evaluation {c.key} failed: {' '.join(reason.split())[:300]}", file=sys.stderr)
                outcomes = space.failed(c, reason)
            on_result(c, outcomes)

    def _put(self, space: SearchSpace, part: str | None) -> Any:
        """Object-store reference of the space's context (``part=None``) or of one of its parts."""
        import ray

        if self._space is not space:
            self._space, self._refs = space, {}
        if part not in self._refs:
            self._refs[part] = ray.put(space.worker_context() if part is None else space.part(part))
        return self._refs[part]

    def _run_ray(self, space: SearchSpace, candidates: list[Candidate], on_result: OnResult) -> None:
        import ray

        window = connect_ray(self.workers, self.address)
        evaluate = space.evaluator()
        if self._remote is None:
            self._remote = ray.remote(max_retries=2, num_cpus=1)(evaluate_chunk)
        remote = self._remote
        context = self._put(space, None)
        queue = deque(candidates)
        pending: dict[Any, list[Candidate]] = {}
        sizer = ChunkSizer(window)
        while queue or pending:
            while queue and len(pending) < window:
                chunk = _take_chunk(queue, sizer.size(len(queue)))
                part = self._put(space, chunk[0].part) if chunk[0].part else None
                pending[remote.remote(evaluate, context, chunk, part)] = chunk
            lost = _lost_cluster_errors()
            try:
                ready, _ = ray.wait(list(pending), num_returns=1)
            except lost as exc:
                raise ClusterLost(f"the Ray cluster was lost: {_first_line(exc)}") from None
            for ref in ready:
                chunk = pending.pop(ref)
                try:
                    results = ray.get(ref)
                except lost as exc:  # a node or the raylet died: the rest of the window would fail too
                    raise ClusterLost(f"the Ray cluster lost a node or its raylet: {_first_line(exc)}") from None
                except ray.exceptions.RayError as exc:  # the worker died (after Ray's retries): the chunk failed
                    text = str(exc).strip()
                    reason = f"worker error: {text.splitlines()[-1] if text else type(exc).__name__}"
                    for c in chunk:
                        on_result(c, space.failed(c, reason))
                    continue
                for c, (outcomes, seconds) in zip(chunk, results, strict=True):
                    if isinstance(outcomes, str):  # the evaluation raised: recorded as failed, as in this process
                        print(f"warning: evaluation {c.key} failed: {' '.join(outcomes.split())[:300]}", file=sys.stderr)
                        outcomes = space.failed(c, outcomes)
                    else:
                        sizer.observe(seconds)
                    on_result(c, outcomes)


def evaluate_chunk(evaluate: Evaluator, context: Any, chunk: list[Candidate],
                   part: Any) -> list[tuple[list[Outcome] | str, float]]:
    """One Ray task: ``evaluate`` each candidate of ``chunk`` in order; per candidate its outcomes (or the
    error text when it raised) and its evaluation seconds (wall, this worker)."""
    out: list[tuple[list[Outcome] | str, float]] = []
    for c in chunk:
        t0 = time.perf_counter()
        try:
            res: list[Outcome] | str = evaluate(context, c, part)
        except Exception as exc:  # recorded as failed on the driver; the chunk's other candidates go on
            res = f"{type(exc).__name__}: {exc}"
        out.append((res, time.perf_counter() - t0))
    return out


def _take_chunk(queue: deque[Candidate], size: int) -> list[Candidate]:
    """Up to ``size`` candidates from the front of ``queue`` that share the first one's part (a task gets one)."""
    chunk = [queue.popleft()]
    while queue and len(chunk) < size and queue[0].part == chunk[0].part:
        chunk.append(queue.popleft())
    return chunk


class ChunkSizer:
    """How many candidates one Ray task evaluates.

    A task should run about :data:`TASK_SECONDS` so Ray's per-task cost (scheduling, argument
    transfer, the result's round trip) stays small against the evaluations; the size comes from
    the median evaluation seconds measured so far (one candidate per task until a result is back).
    It never exceeds an even share of what is left over the window's tasks, so every CPU gets work
    to the end and a killed search loses at most ``window`` tasks.
    """

    def __init__(self, window: int) -> None:
        self.window = max(window, 1)
        self.seconds: list[float] = []

    def observe(self, seconds: float) -> None:
        """One evaluation's measured seconds."""
        self.seconds.append(seconds)
        if len(self.seconds) > 4 * MAX_CHUNK:  # the recent ones: a space's late candidates can be slower
            del self.seconds[: len(self.seconds) - 2 * MAX_CHUNK]

    def size(self, left: int) -> int:
        """Candidates for the next task, with ``left`` candidates not yet submitted."""
        if not self.seconds:
            return 1
        per = max(statistics.median(self.seconds), 1e-6)
        want = max(1, min(MAX_CHUNK, int(TASK_SECONDS / per)))
        return max(1, min(want, math.ceil(left / self.window)))
