"""What every search-space schema shares: strict pydantic models and one clear line per bad field.

A space file is YAML with a ``space:`` key naming its kind; each kind's schema (in its space
module) is a :class:`StrictModel`, so unknown keys are errors. :func:`format_validation_error`
turns pydantic's report into ``field.path: problem``; :class:`SpaceError` carries it (with the
file name) to the CLI, which prints it and exits with code 2.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["SpaceError", "StrictModel", "PositiveInt", "format_validation_error"]

PositiveInt = Annotated[int, Field(gt=0)]


class SpaceError(ValueError):
    """A search-space file cannot be used; the message names the file, field and problem."""


class StrictModel(BaseModel):
    """A schema section that rejects unknown keys."""

    model_config = ConfigDict(extra="forbid")


def format_validation_error(err: ValidationError) -> str:
    """The first problem of a pydantic error as ``field.path: message``."""
    first = err.errors()[0]
    loc = ".".join(str(x) for x in first["loc"] if not str(x).startswith("function-after")) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "missing":
        msg = "required field is missing"
    msg = msg.removeprefix("Value error, ")
    more = len(err.errors()) - 1
    return f"{loc}: {msg}" + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")
