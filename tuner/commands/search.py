"""``tuner search SPACE.yaml``: evaluate a search space in parallel and rank its candidates."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tuner.commands.common import console, err_console, fail


def search(
    space: Annotated[Path, typer.Argument(help="search-space YAML, e.g. search_spaces/sharding.yaml")],
    out: Annotated[Path, typer.Option("--out", help="output folder")] = Path("out/search"),
    workers: Annotated[int, typer.Option("--workers", help="CPUs of the local Ray (0: evaluate in this process; an existing cluster is used whole)")] = 2,
    address: Annotated[str | None, typer.Option("--address", help="address of an existing Ray cluster (default: RAY_ADDRESS, else a local Ray)")] = None,
    storage: Annotated[
        str | None, typer.Option("--storage", help="Optuna storage URL (default: sqlite:///OUT/study.db)")
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue the study in the storage, skipping finished evaluations")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no table, no progress bar")] = False,
) -> None:
    """Evaluate a search space and rank its candidates."""
    from tuner.search.executor import ClusterError
    from tuner.search.registry import SearchRequest, load_space, run_request
    from tuner.search.schema import SpaceError
    from tuner.search.study import default_storage

    try:
        spec = load_space(space)
    except SpaceError as exc:
        fail(str(exc))
    if workers < 0:
        fail("--workers must be >= 0")
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").unlink(missing_ok=True)  # a stale one must not look like this run's
    t0 = time.perf_counter()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
        transient=False,
    ) as bar:
        job = bar.add_task("evaluating", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(job, completed=done, total=total)

        request = SearchRequest(
            space_path=space,
            spec=spec,
            out=out,
            storage=storage or default_storage(out),
            workers=workers,
            address=address,
            resume=resume,
            quiet=quiet,
            console=console,
            progress=progress,
        )
        try:
            summary = run_request(request)
        except ClusterError as exc:  # Ray could not start, or the cluster could not be joined
            fail(str(exc))
        except SpaceError as exc:
            fail(f"{space}: {exc}")
        except ValueError as exc:  # infeasible settings, bad storage URL, ...
            fail(f"{space}: {exc}")
    console.print(f"{summary} ({time.perf_counter() - t0:.1f} s)", highlight=False)
