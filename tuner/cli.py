"""``tuner`` command line. Each command lives in :mod:`tuner.commands` (one module per command).

Bad input (a missing or malformed file, an unknown field, an impossible plan) prints one
line ``error: ...`` naming the problem and exits with code 2 — never a traceback.
"""

from __future__ import annotations

import os
import sys

import typer

from tuner.commands.calibrate import calibrate
from tuner.commands.catalog import catalog
from tuner.commands.common import EXIT_BAD_INPUT, UserError, err_console
from tuner.commands.predict import predict
from tuner.commands.replay import replay
from tuner.commands.search import search

app = typer.Typer(
    name="tuner",
    help="Predict and tune distributed deep-learning training from performance models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# one line per command; keep the list sorted
app.command()(calibrate)
app.command()(catalog)
app.command()(predict)
app.command()(replay)
app.command()(search)


def main() -> None:
    """Console entry point: run the app; turn stray user errors into exit code 2."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    try:
        app()
    except UserError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
