"""The one error a trace reader raises: :class:`TraceError`, a one-line message naming the file."""

from __future__ import annotations

__all__ = ["TraceError"]


class TraceError(ValueError):
    """A trace file or folder cannot be replayed (truncated, not a trace, empty, a rank missing).

    The message is one line that names the file and the problem, e.g.
    ``"run/rank3.json.gz: truncated gzip stream"``; the CLI prints it and exits with code 2.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
