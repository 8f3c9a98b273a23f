"""The output folder of a search: one run at a time, and never a finished result lost or mixed.

* :func:`hold` takes an exclusive lock on ``OUT/.tuner.lock`` for the whole run (``flock``: the
  kernel releases it when the process ends, even killed); a second run on the same folder fails
  at once with :class:`OutputError` naming the first run's process.
* :func:`decide_resume` reads ``OUT/.tuner-search.json`` (what searched there: the space's
  fingerprint and the storage, masked) and decides what a new run may do: continue the same
  space (the default), start it again (``--no-resume``: only with ``--overwrite`` when results
  exist), or replace another space's outputs (only with ``--overwrite``); anything else is an
  :class:`OutputError` that names the flags.
* :func:`clear_outputs` removes only the files a search writes (never anything else in the folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from predictor.files import atomic_write_text

__all__ = ["OutputError", "hold", "decide_resume", "clear_outputs", "write_marker", "LOCK_NAME", "MARKER_NAME",
           "OUTPUT_NAMES"]

LOCK_NAME = ".tuner.lock"
MARKER_NAME = ".tuner-search.json"
#: files and folders a search writes in its output folder (the SQLite study only with the default storage)
OUTPUT_NAMES = ("results.json", "results.csv", "report.md", "report.html", "figures", "traces", "study.db",
                "ray.log", MARKER_NAME)


class OutputError(ValueError):
    """The output folder cannot be used as asked; the message says why and which flag would allow it."""


@contextlib.contextmanager
def hold(out: Path) -> Iterator[None]:
    """Hold the output folder's lock while the block runs; :class:`OutputError` if another run holds it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise OutputError(f"--out {out}: another tuner search (process {holder}) is writing there; wait for it "
                              "to finish or choose another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _marker(out: Path) -> dict | None:
    try:
        data = json.loads((out / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _has_results(out: Path) -> bool:
    return any((out / name).exists() for name in OUTPUT_NAMES if name != MARKER_NAME)


def decide_resume(out: Path, space_id: str, storage: str, resume: bool | None, overwrite: bool) -> bool:
    """Whether the run continues the study (``True``) or starts it again; :class:`OutputError` when refused.

    ``space_id`` identifies the space (a fingerprint of the validated file) and ``storage`` is the
    masked storage URL; ``resume`` is ``None`` unless ``--resume`` / ``--no-resume`` was given.
    """
    prior = _marker(out)
    if overwrite:
        return bool(resume)
    if not _has_results(out):  # a fresh folder, or a search's marker with nothing written (its storage refused
        return resume is not False  # it): a study of the same space in the storage is reused
    same = prior is not None and prior.get("space") == space_id and prior.get("storage") == storage
    if not same:
        what = f"the outputs of another search ({prior.get('space_file', '?')})" if prior else "outputs of a search"
        raise OutputError(f"--out {out} holds {what}; --overwrite replaces them, or choose another --out "
                          "(--resume continues only the same space and storage)")
    if resume is False:
        raise OutputError(f"--out {out} holds this space's finished evaluations; --no-resume would evaluate them "
                          "again: add --overwrite to replace them, or drop --no-resume to continue")
    return True


def clear_outputs(out: Path, default_storage: bool) -> None:
    """Remove the files a search writes in ``out`` (the SQLite study only when it is the default storage)."""
    for name in OUTPUT_NAMES:
        if name == "study.db" and not default_storage:
            continue
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def write_marker(out: Path, space_id: str, storage: str, space_file: str) -> None:
    """Record which space and storage search in ``out`` (read by :func:`decide_resume`)."""
    atomic_write_text(out / MARKER_NAME, json.dumps({"space": space_id, "storage": storage,
                                                     "space_file": space_file}, indent=1) + "\n")
