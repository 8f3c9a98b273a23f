"""What the experiment scripts share: the one way to stop on bad input (one line, exit code 2)."""

from __future__ import annotations

import sys
from typing import NoReturn


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with code 2 (bad input), no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
