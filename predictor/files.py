"""Writing result files so that a reader never sees half of one (no heavy imports: experiments and
the stage-dataset collector on a bare GPU machine use it), file names made from user text, and a
writable cache folder for numba's compiled functions."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write_text", "safe_filename", "file_mode", "numba_cache_fallback"]

_UMASK_LOCK = threading.Lock()
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file: 0666 less the process umask (0644 under 022)."""
    with _UMASK_LOCK:  # reading the umask means setting it; the lock keeps threads from seeing 0
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see either the old file or the whole new one.

    The file gets the permissions an ordinary write would give it (``mkstemp`` alone makes it 0600).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def safe_filename(text: str, limit: int = 80) -> str:
    """``text`` as one file-name component: letters, digits, ``.``, ``_``, ``-`` only, no leading dot,
    at most ``limit`` characters (``"_"`` when nothing is left), so it cannot leave its folder."""
    name = _UNSAFE.sub("_", str(text)).lstrip(".")[:limit]
    return name or "_"


def _writable(folder: Path) -> bool:
    """Whether files can be created in ``folder`` or, when it does not exist yet, in its nearest parent."""
    while not folder.exists():
        if folder.parent == folder:
            return False
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def numba_cache_fallback(writable: Callable[[Path], bool] = _writable) -> str | None:
    """Point numba's cache (``@njit(cache=True)``) at a private temporary folder when it has nowhere to write.

    numba caches beside the package sources, else under ``$XDG_CACHE_HOME`` or ``~/.cache``; when
    neither is writable (a read-only install and no writable home) every cached function fails to
    compile. ``NUMBA_CACHE_DIR`` set by the user is kept. Returns the folder chosen, or None.
    """
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    home_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path(os.path.expanduser("~")) / ".cache") / "numba"
    if writable(Path(__file__).resolve().parent) or writable(home_cache):
        return None
    folder = Path(tempfile.gettempdir()) / f"tuner-numba-cache-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.getuid():  # someone else's folder of that name: a fresh private one
        folder = Path(tempfile.mkdtemp(prefix="tuner-numba-cache-"))
    os.environ["NUMBA_CACHE_DIR"] = str(folder)
    config = getattr(sys.modules.get("numba"), "config", None)
    if config is not None:  # numba read the environment when it was imported: tell it directly
        config.CACHE_DIR = str(folder)
    return str(folder)
