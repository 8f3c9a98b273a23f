"""What every command shares: the consoles and the one way to end on a problem (one ``error:`` line).

Bad input exits with code 2 (:func:`fail`); a failure of something the run depends on (a storage
or a cluster lost mid-run) with 1, and Ctrl-C with 130 (:func:`stop`).
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer
from rich.console import Console

EXIT_BAD_INPUT = 2
EXIT_RUNTIME = 1
EXIT_INTERRUPTED = 130

# wide enough for the results tables when stdout is a file or a pipe
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)


class UserError(Exception):
    """A problem with what the user gave us; printed as one line, exit code 2."""


def error_line(message: str) -> None:
    """Print ``error: message`` on stderr as one line (never wrapped, no markup read from ``message``)."""
    text = " ".join(str(message).split())  # a message with line breaks still prints as one line
    err_console.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)


def escape(text: str) -> str:
    """``text`` with rich markup brackets escaped (user input is printed literally)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with code 2 (bad input)."""
    error_line(message)
    raise typer.Exit(EXIT_BAD_INPUT)


def stop(message: str, code: int) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code`` (1: a lost dependency, 130: interrupted)."""
    error_line(message)
    raise typer.Exit(code)
