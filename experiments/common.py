"""What the experiment scripts share: the one way to stop on bad input (one line, exit code 2), paths in
result files, writing a result pair, the host's CPU against a pack's, and a one-constant golden-section fit."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with code 2 (bad input), no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


REPO = Path(__file__).resolve().parents[1]


def repo_relative(path: str | Path) -> str:
    """``path`` relative to the repository where it lies inside it (for the reproduce lines of result
    files), else as given."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(path)


def write_results(out: Path, data: dict, markdown_text: str) -> None:
    """Write an experiment's results as ``OUT.json`` and ``OUT.md`` (folders made; each file written aside
    and renamed into place, the markdown last) and say where."""
    from predictor.files import atomic_write_text

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out.with_suffix(".json"), json.dumps(data, indent=1))
    atomic_write_text(out.with_suffix(".md"), markdown_text)
    print(f"wrote {repo_relative(out.with_suffix('.md'))}")


def previous_latest(out: Path) -> dict | None:
    """The ``latest`` section (the newest measured window or run) of the results pair at ``out``, if any:
    a re-score without measuring keeps it."""
    previous = out.with_suffix(".json")
    try:
        return json.loads(previous.read_text()).get("latest") if previous.exists() else None
    except (json.JSONDecodeError, AttributeError):
        return None


def host_check(manifest: dict | None) -> dict:
    """This host's CPU signature and, when a calibrated CPU pack predicts it, why the pack may not
    describe this CPU (:func:`predictor.timing.platforms.cpu_local.signature_mismatch`; None when they agree or
    no pack is used). A mismatch is printed on stderr at once, before anything is measured."""
    from predictor.timing.platforms.cpu_local import cpu_signature, signature_mismatch

    here = cpu_signature()
    why = signature_mismatch((manifest or {}).get("cpu"), here) if manifest is not None else None
    if why:
        print(f"warning: {why}", file=sys.stderr)
    return {"cpu": here, "pack_cpu_mismatch": why}


def host_line(check: dict) -> str:
    """One line for a result file: the CPU measured on and, if any, the pack's host mismatch."""
    from predictor.timing.platforms.cpu_local import describe_cpu

    line = f"CPU: {describe_cpu(check.get('cpu') or {})}."
    if check.get("pack_cpu_mismatch"):
        line += f" **Host check: {check['pack_cpu_mismatch']}.**"
    return line


def golden_section(f: Callable[[float], float], lo: float, hi: float, tol: float) -> tuple[float, int]:
    """Golden-section search of a unimodal ``f`` on [lo, hi] down to an interval of ``tol``;
    returns (the interval's midpoint, evaluations of ``f``)."""
    g, n = (math.sqrt(5) - 1) / 2, 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        n += 1
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2, n
