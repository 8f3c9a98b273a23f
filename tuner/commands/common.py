"""What every command shares: the consoles and the one way to end on a problem (one ``error:`` line).

Bad input exits with code 2 (:func:`fail`); a failure of something the run depends on (a storage
or a cluster lost mid-run) with 1, and Ctrl-C with 130 (:func:`stop`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
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


#: set by the console script (``tuner``): the process may give file descriptor 2 to native code's log
CONSOLE_SCRIPT = {"on": False}


def divert_native_stderr(log: Path) -> bool:
    """Send what native code writes to file descriptor 2 (Ray's C++ core: retries, lost raylets) to ``log``
    for the rest of the process; Python's ``sys.stderr`` (error lines, the progress bar) keeps the terminal.

    Only in the ``tuner`` console script, where the process ends with the command; returns whether it did.
    """
    if not CONSOLE_SCRIPT["on"]:
        return False
    try:
        if sys.stderr.fileno() != 2:
            return False
        sys.stderr.flush()
        saved = os.dup(2)
        log.parent.mkdir(parents=True, exist_ok=True)
        target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except (AttributeError, OSError, ValueError):
        return False
    os.dup2(target, 2)
    os.close(target)
    sys.stderr = os.fdopen(saved, "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace")
    return True
