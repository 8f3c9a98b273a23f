"""What every search-space schema shares: strict pydantic models and one clear line listing every bad field.

A space file is YAML with a ``space:`` key naming its kind; each kind's schema (in its space
module) is a :class:`StrictModel`: unknown keys are errors and values keep their YAML type (a
boolean is not a number, a string is not a number). Every numeric field has a range: the
bounded types below carry the lower bound as a pydantic ``Field`` and the upper bound as a
check whose message says why the limit exists. :func:`format_validation_error` turns
pydantic's report into ``field.path: problem; field.path: problem``; :class:`SpaceError`
carries it (with the file name) to the CLI, which prints it and exits with code 2.
"""

from __future__ import annotations

import difflib
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

__all__ = ["SpaceError", "StrictModel", "PositiveInt", "Seed", "MAX_COUNT", "MAX_SEED", "at_most", "bounded_int",
           "format_validation_error"]

#: upper bound of a count without a tighter limit (sizes in elements): int64 products of two stay exact
MAX_COUNT = 2**31 - 1
#: seeds are numpy/Optuna seeds: unsigned 32-bit
MAX_SEED = 2**32 - 1


def at_most(limit: float, why: str) -> AfterValidator:
    """A check that a number is at most ``limit``; its message says ``why`` the limit exists."""

    def check(v: float) -> float:
        if v > limit:
            shown = f"{limit:,}" if isinstance(limit, int) else f"{limit:g}"
            raise ValueError(f"must be at most {shown} ({why}), got {v:,}" if isinstance(v, int)
                             else f"must be at most {shown} ({why}), got {v:g}")
        return v

    return AfterValidator(check)


def bounded_int(low: int, high: int, why: str) -> object:
    """An integer type in ``[low, high]``; a value above ``high`` fails with ``why``."""
    low_bound = Field(gt=0) if low == 1 else Field(ge=low)  # "greater than 0" reads as "positive"
    return Annotated[int, low_bound, at_most(high, why)]


#: a positive count (1 .. 2**31-1)
PositiveInt = Annotated[int, Field(gt=0), at_most(MAX_COUNT, "a 32-bit count")]
#: a random seed (0 .. 2**32-1)
Seed = Annotated[int, Field(ge=0), at_most(MAX_SEED, "seeds are unsigned 32-bit numbers")]


class SpaceError(ValueError):
    """A search-space file cannot be used; the message names the file, field and problem."""


class StrictModel(BaseModel):
    """A schema section that rejects unknown keys and values of another type (``true`` for a number)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _problem(error: dict) -> str:
    loc = ".".join(str(x) for x in error["loc"] if not str(x).startswith("function-after")) or "(top level)"
    msg = error["msg"]
    if error["type"] == "extra_forbidden":
        msg = "unknown field"
    elif error["type"] == "missing":
        msg = "required field is missing"
    elif error["type"] in ("int_type", "float_type", "bool_type", "string_type", "list_type", "dict_type",
                           "model_type") and "input" in error:
        msg = f"{msg}, got {type(error['input']).__name__} {error['input']!r}"[:200]
    return f"{loc}: {msg.removeprefix('Value error, ')}"


def format_validation_error(err: ValidationError) -> str:
    """Every problem of a pydantic error as ``field.path: message``, joined by ``; `` (one line); an unknown field
    close to a missing one beside it says so (``n_gpu: unknown field (did you mean n_gpus?)``)."""
    errors = err.errors()
    missing: dict[tuple, list[str]] = {}
    for error in errors:
        if error["type"] == "missing" and error["loc"]:
            missing.setdefault(tuple(error["loc"][:-1]), []).append(str(error["loc"][-1]))
    seen: list[str] = []
    for error in errors:
        text = _problem(error)
        if error["type"] == "extra_forbidden" and error["loc"]:
            close = difflib.get_close_matches(str(error["loc"][-1]), missing.get(tuple(error["loc"][:-1]), []), n=1)
            if close:
                text += f" (did you mean {close[0]}?)"
        if text not in seen:
            seen.append(text)
    return "; ".join(seen)
