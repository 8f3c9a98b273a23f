"""Find and read the traces of a run: one Kineto file, a folder or a ``.tar.gz`` of per-rank
files, each optionally with its PyTorch execution trace (ET).

Accepted inputs
---------------
* ``run.json`` / ``run.json.gz`` — one Kineto trace (one rank). A sibling execution trace is
  picked up automatically when its name swaps ``.kineto.`` for ``.et.`` (``x.kineto.json.gz``
  next to ``x.et.json.gz``), which is also how :func:`predictor.sources.traces.capture.capture` names
  its files.
* a folder or a ``.tar.gz`` / ``.tgz`` / ``.tar`` — every ``*.json`` / ``*.json.gz`` inside
  (any depth) is read and sorted into Kineto traces and execution traces by content. A
  ``x.kineto.tar.gz`` has its ETs looked up in ``x.et.tar.gz`` the same way.
* ``et=`` names the execution traces explicitly (a file, folder or archive).

Ranks come from ``distributedInfo.rank`` in each Kineto file, else from the file name
(``rank3``, ``worker3``, ``..._3.json``). An ET is paired with the Kineto trace of the same
process id, else of the same rank number in its file name, else (one of each) with the only
one. A multi-file run must hold every rank ``0 .. world_size-1`` exactly once.
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from predictor.sources.traces.errors import TraceError
from predictor.sources.traces.et import ExecutionTrace, et_from_bytes, et_from_json, is_et_json
from predictor.sources.traces.json_io import json_bytes, no_gc, parse_json
from predictor.sources.traces.kineto import (
    KinetoTrace,
    is_kineto_json,
    kineto_from_bytes,
    kineto_from_json,
    rank_from_filename,
)

__all__ = ["RankTrace", "TraceSet", "load_traces", "sibling_et_path"]

_JSON_NAME = re.compile(r"\.json(\.gz)?$", re.IGNORECASE)
_ARCHIVE = (".tar.gz", ".tgz", ".tar")


@dataclass
class RankTrace:
    """The traces of one rank: its Kineto trace and, if found, its execution trace."""

    rank: int
    kineto: KinetoTrace
    et: ExecutionTrace | None = None


@dataclass
class TraceSet:
    """Every rank's traces of one run, sorted by rank.

    ``world_size`` is the job's world size as the traces declare it; it exceeds ``len(ranks)``
    for a single-rank trace of a multi-rank job (then collectives have no partner ranks).
    """

    source: str
    ranks: list[RankTrace]
    world_size: int
    notes: list[str] = field(default_factory=list)

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    @property
    def partial(self) -> bool:
        """True for a subset of a larger job's ranks (e.g. rank 0 of 2)."""
        return self.world_size > self.n_ranks

    def summary(self) -> dict:
        return {
            "source": self.source,
            "ranks": [r.rank for r in self.ranks],
            "world_size": self.world_size,
            "execution_traces": [r.et.label if r.et else None for r in self.ranks],
            "notes": list(self.notes),
        }


def _is_archive(path: Path) -> bool:
    name = path.name.lower()
    return any(name.endswith(s) for s in _ARCHIVE)


def archive_member_texts(path: str | Path, suffix: str) -> dict[str, str]:
    """``{file name: UTF-8 text}`` of the members of archive ``path`` whose names end with
    ``suffix`` (a capture's ``rank{R}.steps.csv``, say); empty if ``path`` is no readable archive."""
    path = Path(path)
    if not _is_archive(path):
        return {}
    out: dict[str, str] = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for m in tar.getmembers():
                if m.isfile() and m.name.endswith(suffix) and not Path(m.name).name.startswith("._"):
                    fh = tar.extractfile(m)
                    if fh is not None:
                        out[Path(m.name).name] = fh.read().decode("utf-8", errors="replace")
    except (tarfile.TarError, EOFError, OSError):
        return {}
    return out


def sibling_et_path(path: Path) -> Path | None:
    """The execution trace next to a Kineto file or archive (``.kineto.`` -> ``.et.``), if it exists."""
    name = path.name
    if ".kineto." not in name:
        return None
    stem, rest = name.split(".kineto.", 1)
    for cand in (f"{stem}.et.{rest}", f"{stem}.et.json.gz", f"{stem}.et.json"):
        p = path.with_name(cand)
        if p.exists() and p != path:
            return p
    return None


def _parse(data: bytes, label: str) -> object:
    """A Kineto trace or an execution trace read straight into columns (:func:`kineto_from_bytes`,
    :func:`et_from_bytes`), else the parsed JSON document."""
    raw = json_bytes(data, label)
    with no_gc():
        trace: object = kineto_from_bytes(raw, label)
        if trace is None:
            trace = et_from_bytes(raw, label)
    return trace if trace is not None else parse_json(raw, label)


def _read_documents(path: Path) -> list[tuple[str, object]]:
    """(label, parsed JSON or a Kineto trace already in columns) of one file, or of every JSON file in a folder
    or archive."""
    if not path.exists():
        raise TraceError(f"{path}: no such file or folder")
    docs: list[tuple[str, object]] = []
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and _JSON_NAME.search(p.name)
                       and not p.name.startswith("._"))
        for f in files:
            try:
                data = f.read_bytes()
            except OSError as exc:
                raise TraceError(f"{f}: cannot read ({exc.strerror})") from None
            docs.append((str(f), _parse(data, str(f))))
        if not docs:
            raise TraceError(f"{path}: folder holds no trace files (*.json, *.json.gz)")
        return docs
    if _is_archive(path):
        try:
            with tarfile.open(path, "r:*") as tar:
                members = [m for m in tar.getmembers() if m.isfile() and _JSON_NAME.search(m.name)
                           and not Path(m.name).name.startswith("._")]
                members.sort(key=lambda m: m.name)
                for m in members:
                    fh = tar.extractfile(m)
                    if fh is None:
                        continue
                    label = f"{path}:{m.name}"
                    docs.append((label, _parse(fh.read(), label)))
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise TraceError(f"{path}: truncated or corrupt archive ({exc or type(exc).__name__})") from None
        if not docs:
            raise TraceError(f"{path}: archive holds no trace files (*.json, *.json.gz)")
        return docs
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    return [(str(path), _parse(data, str(path)))]


def _split(docs: list[tuple[str, object]], what: str) -> tuple[list[KinetoTrace], list[ExecutionTrace]]:
    kin: list[KinetoTrace] = []
    ets: list[ExecutionTrace] = []
    for label, doc in docs:
        if isinstance(doc, KinetoTrace):
            kin.append(doc)
        elif isinstance(doc, ExecutionTrace):
            ets.append(doc)
        elif is_kineto_json(doc):
            k = kineto_from_json(doc, label)
            if k.rank is None or k.rank < 0:
                k.rank = rank_from_filename(label)
            kin.append(k)
        elif is_et_json(doc):
            ets.append(et_from_json(doc, label))
        elif len(docs) == 1:
            raise TraceError(
                f"{label}: not a trace (expected a Kineto JSON with 'traceEvents' or an execution trace with 'nodes')"
            )
        else:
            raise TraceError(f"{label}: not a trace file in {what} (neither Kineto nor execution trace)")
    return kin, ets


def _assign_ranks(kin: list[KinetoTrace], where: str) -> int:
    """Give every Kineto trace a rank; check uniqueness and completeness; return the world size."""
    if len(kin) == 1:
        k = kin[0]
        if k.rank is None or k.rank < 0:
            k.rank = 0
        world = k.world_size if k.world_size and k.world_size > 0 else 1
        return max(world, 1)
    unknown = [k for k in kin if k.rank is None or k.rank < 0]
    if unknown and len(unknown) < len(kin):
        raise TraceError(f"{where}: {unknown[0].label} has no rank (no distributedInfo.rank, no rank in its name)")
    if unknown:
        for i, k in enumerate(sorted(kin, key=lambda k: k.label)):
            k.rank = i
    seen: dict[int, str] = {}
    for k in kin:
        assert k.rank is not None
        if k.rank in seen:
            raise TraceError(f"{where}: two traces claim rank {k.rank} ({Path(seen[k.rank]).name}, {Path(k.label).name})")
        seen[k.rank] = k.label
    worlds = {k.world_size for k in kin if k.world_size and k.world_size > 0}
    world = max(worlds) if worlds else max(seen) + 1
    missing = sorted(set(range(world)) - set(seen))
    if missing:
        shown = ", ".join(str(r) for r in missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise TraceError(
            f"{where}: rank{'s' if len(missing) > 1 else ''} {shown} missing (world size {world}, "
            f"found {len(kin)} rank traces)"
        )
    extra = sorted(r for r in seen if r >= world)
    if extra:
        raise TraceError(f"{where}: rank {extra[0]} is outside the world size {world}")
    return world


def _pair(kin: list[KinetoTrace], ets: list[ExecutionTrace], notes: list[str]) -> dict[int, ExecutionTrace]:
    paired: dict[int, ExecutionTrace] = {}
    left: list[ExecutionTrace] = []
    by_pid: dict[int, KinetoTrace] = {}
    for k in kin:
        for p in k.pids:
            by_pid.setdefault(p, k)
    for e in ets:
        k = by_pid.get(e.pid) if e.pid is not None else None
        if k is not None and k.rank not in paired:
            paired[k.rank] = e  # type: ignore[index]
        else:
            left.append(e)
    still: list[ExecutionTrace] = []
    ranks = {k.rank for k in kin}
    for e in left:
        r = rank_from_filename(e.label)
        if r is not None and r in ranks and r not in paired:
            paired[r] = e
        else:
            still.append(e)
    if still and len(kin) == 1 and not paired:
        paired[kin[0].rank] = still.pop(0)  # type: ignore[index]
    for e in still:
        notes.append(f"execution trace {e.label} matched no Kineto trace; ignored")
    return paired


def load_traces(path: str | Path, et: str | Path | None = None, *, use_et: bool = True) -> TraceSet:
    """Read the Kineto traces (and execution traces) of a run; see the module docstring.

    ``et`` names the execution traces explicitly; ``use_et=False`` ignores every ET.
    Raises :class:`TraceError` with a one-line message on any unreadable or inconsistent input.
    """
    path = Path(path)
    docs = _read_documents(path)
    with no_gc():
        kin, ets = _split(docs, str(path))
    notes: list[str] = []
    if not kin:
        raise TraceError(f"{path}: holds execution traces only; give the Kineto trace(s) (the ET goes with --et)")
    if et is not None:
        with no_gc():
            _, extra = _split(_read_documents(Path(et)), str(et))
        if not extra:
            raise TraceError(f"{et}: holds no execution trace")
        ets = extra
    elif use_et and not ets and not path.is_dir():
        sib = sibling_et_path(path)
        if sib is not None:
            with no_gc():
                _, ets = _split(_read_documents(sib), str(sib))
            notes.append(f"execution traces from {sib}")
    if not use_et:
        ets = []
    world = _assign_ranks(kin, str(path))
    paired = _pair(kin, ets, notes)
    ranks = [RankTrace(rank=int(k.rank), kineto=k, et=paired.get(int(k.rank))) for k in kin]  # type: ignore[arg-type]
    ranks.sort(key=lambda r: r.rank)
    if len(ranks) == 1 and world > 1:
        notes.append(
            f"single-rank trace of a {world}-rank job: its collectives' measured durations include waiting for "
            "the absent peers; the replay prices them from their message size (--collectives modelled) or keeps "
            "them (--collectives measured)"
        )
    return TraceSet(source=str(path), ranks=ranks, world_size=world, notes=notes)
