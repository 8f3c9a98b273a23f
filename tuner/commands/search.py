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
    workers: Annotated[int, typer.Option("--workers", help="parallel Ray workers (0: evaluate in this process)")] = 2,
    address: Annotated[str | None, typer.Option("--address", help="address of an existing Ray cluster")] = None,
    storage: Annotated[
        str | None, typer.Option("--storage", help="Optuna storage URL (default: sqlite:///OUT/study.db)")
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue the study in the storage, skipping finished evaluations")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no table, no progress bar")] = False,
) -> None:
    """Evaluate a search space and rank its candidates."""
    from tuner.report import print_sharding_table, write_sharding_outputs
    from tuner.search import default_storage, run_sharding_search
    from tuner.spaces import ShardingSpace, SpaceError, load_space

    try:
        spec = load_space(space)
    except SpaceError as exc:
        fail(str(exc))
    if workers < 0:
        fail("--workers must be >= 0")
    if not isinstance(spec, ShardingSpace):  # pragma: no cover - only one space kind so far
        fail(f"{space}: space {spec.space!r} is not supported by this version")
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").unlink(missing_ok=True)  # a stale one must not look like this run's
    url = storage or default_storage(out)
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
        job = bar.add_task("evaluating task x batch units", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(job, completed=done, total=total)

        try:
            outcome = run_sharding_search(spec, storage=url, workers=workers, address=address, resume=resume, progress=progress)
        except SpaceError as exc:
            fail(f"{space}: {exc}")
        except ValueError as exc:  # infeasible generator settings, bad storage URL, ...
            fail(f"{space}: {exc}")
    payload = write_sharding_outputs(outcome, out)
    if not quiet:
        print_sharding_table(payload, console)
    n_eval = sum(len(c) for c in outcome.results.values())
    console.print(
        f"{n_eval} evaluations ({outcome.evaluated} new, {outcome.reused} from the study) in "
        f"{time.perf_counter() - t0:.1f} s -> {out}/results.json, report.md, traces/",
        highlight=False,
    )


