"""``tuner`` command line. Each command lives in :mod:`tuner.commands` (one module per command).

Bad input (a missing or malformed file, an unknown field or option, an impossible plan) prints
one line ``error: ...`` naming the problem and exits with code 2 — never a traceback, never a
framed usage box; Ctrl-C prints one line and exits with 130.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from tuner.commands.calibrate import calibrate
from tuner.commands.catalog import catalog
from tuner.commands.common import CONSOLE_SCRIPT, EXIT_BAD_INPUT, EXIT_INTERRUPTED, UserError, error_line
from tuner.commands.predict import predict
from tuner.commands.replay import replay
from tuner.commands.search import search


def package_version() -> str:
    """The installed ``tuner`` distribution's version (``unknown`` when run from a bare source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tuner")
    except PackageNotFoundError:
        return "unknown"


def _usage_problem(exc: Exception) -> str:
    """The usage error's message, prefixed with the command it concerns (``tuner search: ...``)."""
    format_message = getattr(exc, "format_message", None)
    text = format_message() if callable(format_message) else str(exc)
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", "") if ctx is not None else ""
    return f"{path}: {text}" if path and path != "tuner" else text


class PlainSwitches:
    """Help that lists an on/off switch bare (``--quiet``, ``--resume/--no-resume``).

    Typer's rich help puts a value type beside every option, ``<bool>`` beside switches that take
    no value; a switch given an empty metavar shows none.
    """

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class SwitchCommand(PlainSwitches, TyperCommand):
    """A ``tuner`` command whose help lists switches bare."""


class OneLineErrors(PlainSwitches, TyperGroup):
    """The command group whose every usage error, user error and interrupt is one ``error:`` line."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # a command that does not say more about what it leaves behind
            error_line("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        try:
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                                windows_expand_args=windows_expand_args, **extra)
        except typer.TyperException as exc:  # no such option, missing argument, bad value
            if type(exc).__name__ == "NoArgsIsHelpError":  # bare `tuner`: the help
                ctx = getattr(exc, "ctx", None)
                typer.echo(ctx.get_help() if ctx is not None else str(exc), err=True)
            else:
                error_line(_usage_problem(exc))
            code = EXIT_BAD_INPUT
        except typer.Abort:
            error_line("interrupted")
            code = EXIT_INTERRUPTED
        except UserError as exc:
            error_line(str(exc))
            code = EXIT_BAD_INPUT
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    name="tuner",
    cls=OneLineErrors,
    help="Predict and tune distributed deep-learning training from performance models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"tuner {package_version()}")
        raise typer.Exit(0)


@app.callback()
def tuner(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_show_version,
                                          help="print the version and exit")] = False,
) -> None:
    """Predict and tune distributed deep-learning training from performance models."""


# one line per command; keep the list sorted
app.command(cls=SwitchCommand)(calibrate)
app.command(cls=SwitchCommand)(catalog)
app.command(cls=SwitchCommand)(predict)
app.command(cls=SwitchCommand)(replay)
app.command(cls=SwitchCommand)(search)


def main() -> None:
    """Console entry point."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    CONSOLE_SCRIPT["on"] = True
    app()


if __name__ == "__main__":
    main()
