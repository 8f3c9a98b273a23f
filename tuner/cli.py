"""``tuner`` command line: search, and (as later issues land) replay, predict, calibrate, report.

Bad input (a missing or malformed file, an unknown field, an impossible plan) prints one
line ``error: ...`` naming the problem and exits with code 2 — never a traceback.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

app = typer.Typer(
    name="tuner",
    help="Predict and tune distributed deep-learning training from performance models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# wide enough for the results table when stdout is a file or a pipe
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)

EXIT_BAD_INPUT = 2


class UserError(Exception):
    """A problem with what the user gave us; printed as one line, exit code 2."""


def _fail(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


@app.command()
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
        _fail(str(exc))
    if workers < 0:
        _fail("--workers must be >= 0")
    if not isinstance(spec, ShardingSpace):  # pragma: no cover - only one space kind so far
        _fail(f"{space}: space {spec.space!r} is not supported by this version")
    if out.exists() and not out.is_dir():
        _fail(f"--out {out}: exists and is not a folder")
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
            _fail(f"{space}: {exc}")
        except ValueError as exc:  # infeasible generator settings, bad storage URL, ...
            _fail(f"{space}: {exc}")
    payload = write_sharding_outputs(outcome, out)
    if not quiet:
        print_sharding_table(payload, console)
    n_eval = sum(len(c) for c in outcome.results.values())
    console.print(
        f"{n_eval} evaluations ({outcome.evaluated} new, {outcome.reused} from the study) in "
        f"{time.perf_counter() - t0:.1f} s -> {out}/results.json, report.md, traces/",
        highlight=False,
    )


@app.command()
def catalog() -> None:
    """List the accelerators the catalog knows."""
    from rich.table import Table

    from predictor.platforms import load_catalog

    table = Table(title="Accelerator catalog")
    for col in ("key", "name", "bf16 TFLOP/s", "memory GiB", "HBM TB/s", "USD/h"):
        table.add_column(col)
    for key, p in load_catalog().items():
        price = "—" if p.price_per_device_hour_usd is None else f"{p.price_per_device_hour_usd:.2f}"
        table.add_row(key, p.name, f"{p.flops_for('bf16') / 1e12:.0f}", f"{p.memory_bytes / 2**30:.0f}",
                      f"{p.memory_bandwidth / 1e12:.2f}", price)
    console.print(table)


def main() -> None:
    """Console entry point: run the app; turn stray user errors into exit code 2."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    try:
        app()
    except UserError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
