"""Every command's ``--help``: switches listed bare (no ``<bool>`` value type), every option explained."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from tuner.cli import app

GROUP = typer.main.get_command(app)
COMMANDS = sorted(GROUP.commands)


@pytest.mark.parametrize("name", ["", *COMMANDS], ids=lambda n: n or "tuner")
def test_help_lists_switches_bare(name: str) -> None:
    args = [name, "--help"] if name else ["--help"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    assert "<bool>" not in result.output


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_has_help(name: str) -> None:
    command = GROUP.commands[name]
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        assert (getattr(param, "help", None) or "").strip(), f"tuner {name}: {param.name} has no help text"


def test_search_switches() -> None:
    out = CliRunner().invoke(app, ["search", "--help"], env={"COLUMNS": "160"}).output
    assert "--resume" in out and "--no-resume" in out  # an explicit choice either way
    assert "--overwrite" in out and "--no-overwrite" not in out  # off unless given
    assert "--quiet" in out and "--no-quiet" not in out
