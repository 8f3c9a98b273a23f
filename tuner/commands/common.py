"""What every command shares: the consoles and the one way to fail on bad input (exit 2)."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer
from rich.console import Console

EXIT_BAD_INPUT = 2

# wide enough for the results tables when stdout is a file or a pipe
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)


class UserError(Exception):
    """A problem with what the user gave us; printed as one line, exit code 2."""


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with code 2 (bad input)."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)
