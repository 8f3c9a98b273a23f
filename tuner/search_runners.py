"""One runner per search-space kind, behind one request type.

``tuner search SPACE.yaml`` validates the file (:mod:`tuner.spaces`), then hands a
:class:`SearchRequest` to the runner registered for its ``space:`` kind in :data:`RUNNERS`.
A runner evaluates the space (Ray + Optuna study), writes its outputs under ``request.out``
(``results.json`` last and atomically), prints its table unless ``quiet``, and returns a
one-line summary. Runners raise :class:`tuner.spaces.SpaceError` or ``ValueError`` for bad
input; the command turns those into ``error:`` lines with exit code 2.

To add a space kind: a pydantic schema registered in ``tuner.spaces.SPACES`` and a runner
registered here, both as ``"module:attribute"`` strings (imported only when used).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console

__all__ = ["SearchRequest", "RUNNERS", "get_runner", "run_sharding"]


@dataclass
class SearchRequest:
    """Everything a runner needs from the command line."""

    space_path: Path
    spec: BaseModel
    out: Path
    storage: str  # Optuna storage URL
    workers: int  # Ray workers; 0 = evaluate in this process
    address: str | None  # existing Ray cluster, or None for a local one
    resume: bool
    quiet: bool
    console: Console
    progress: Callable[[int, int], None] | None = None  # (done units, total units)


RUNNERS: dict[str, str] = {
    "sharding": "tuner.search_runners:run_sharding",
    "parallel": "tuner.parallel.runner:run",
    "accelerators": "tuner.accelerators.runner:run",
}


def get_runner(kind: str) -> Callable[[SearchRequest], str]:
    """The runner of a space kind."""
    target = RUNNERS.get(kind)
    if target is None:
        raise ValueError(f"no runner for space {kind!r}; known: {', '.join(sorted(RUNNERS))}")
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def run_sharding(req: SearchRequest) -> str:
    """``space: sharding`` — every sharder on every task and batch size."""
    from tuner.report import print_sharding_table, write_sharding_outputs
    from tuner.search import run_sharding_search

    outcome = run_sharding_search(
        req.spec, storage=req.storage, workers=req.workers, address=req.address, resume=req.resume, progress=req.progress
    )
    payload = write_sharding_outputs(outcome, req.out)
    if not req.quiet:
        print_sharding_table(payload, req.console)
    n_eval = sum(len(c) for c in outcome.results.values())
    return (
        f"{n_eval} evaluations ({outcome.evaluated} new, {outcome.reused} from the study) "
        f"-> {req.out}/results.json, report.md, traces/"
    )
