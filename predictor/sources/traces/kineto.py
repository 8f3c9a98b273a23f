"""Reader for Kineto traces (PyTorch profiler Chrome-trace JSON): one file per rank.

The reader keeps the complete events (``"ph": "X"``) of a trace as columns — one numpy
array per field, one pass over the JSON — plus the raw ``args`` dict of each event for the
few fields the graph builder needs. Times stay in **microseconds**, as in the file; the graph
builder converts them to seconds.

Event categories are normalised across Kineto versions (``cpu_op``/``Operator``,
``cuda_runtime``/``cuda_driver``/``Runtime``, ``kernel``/``Kernel``, ...) into
:class:`EventCat`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Union

import numpy as np
import pandas as pd

from predictor.sources.traces.errors import TraceError
from predictor.sources.traces.json_io import read_json_source

try:  # reads a Kineto trace's events into columns 1.8x faster than parsing and columnising the document
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - the JSON path reads every trace too
    _msgspec = None

__all__ = ["EventCat", "KinetoTrace", "read_kineto", "kineto_from_json", "kineto_from_bytes", "is_kineto_json"]


class EventCat(IntEnum):
    """Normalised category of a Kineto event."""

    CPU_OP = 0  #: a framework operator (``aten::addmm``, ``autograd::engine::...``, ``c10d::...``)
    USER_ANNOTATION = 1  #: ``record_function`` ranges: ``ProfilerStep#N``, ``## forward ##``
    PYTHON = 2  #: Python function ranges (``with_stack``)
    RUNTIME = 3  #: CUDA runtime / driver calls (``cudaLaunchKernel``, ``cudaStreamSynchronize``)
    KERNEL = 4  #: a GPU kernel
    MEMCPY = 5  #: a GPU memory copy
    MEMSET = 6  #: a GPU memory set
    CUDA_SYNC = 7  #: Kineto's synchronisation records (Stream Wait Event, Stream/Event/Context Sync)
    GPU_ANNOTATION = 8  #: a user annotation projected onto a GPU stream
    OTHER = 9


_CATS: dict[str, EventCat] = {
    "cpu_op": EventCat.CPU_OP,
    "operator": EventCat.CPU_OP,
    "user_annotation": EventCat.USER_ANNOTATION,
    "python_function": EventCat.PYTHON,
    "python": EventCat.PYTHON,
    "cuda_runtime": EventCat.RUNTIME,
    "cuda_driver": EventCat.RUNTIME,
    "runtime": EventCat.RUNTIME,
    "kernel": EventCat.KERNEL,
    "gpu_memcpy": EventCat.MEMCPY,
    "memcpy": EventCat.MEMCPY,
    "gpu_memset": EventCat.MEMSET,
    "memset": EventCat.MEMSET,
    "cuda_sync": EventCat.CUDA_SYNC,
    "gpu_user_annotation": EventCat.GPU_ANNOTATION,
}
GPU_CATS = (EventCat.KERNEL, EventCat.MEMCPY, EventCat.MEMSET)

_RANK_IN_NAME = re.compile(r"(?:rank|worker|_r)[-_]?(\d+)", re.IGNORECASE)


def _int_or(value: object, default: int) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value == value:
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    return default


@dataclass
class KinetoTrace:
    """The complete events of one Kineto trace file, as columns (times in microseconds).

    Columns (length ``n``): ``cat`` (:class:`EventCat`), ``name`` (index into ``names``),
    ``pid``, ``tid`` (for GPU events: device and stream), ``ts``, ``dur`` (µs), ``corr``
    (CUDA correlation id, -1 if none), ``ext`` (External id), ``rf`` (Record function id,
    joins the execution trace's ``rf_id``), ``stream`` and ``device`` (GPU events, -1 on the
    CPU). ``args`` holds each event's raw ``args`` dict.
    """

    label: str
    cat: np.ndarray
    name: np.ndarray
    names: list[str]
    pid: np.ndarray
    tid: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    corr: np.ndarray
    ext: np.ndarray
    rf: np.ndarray
    stream: np.ndarray
    device: np.ndarray
    args: list[dict]
    rank: int | None = None
    world_size: int | None = None
    meta: dict = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)

    @property
    def n_events(self) -> int:
        return int(self.cat.shape[0])

    def mask(self, *cats: EventCat) -> np.ndarray:
        """Boolean mask of the events in any of ``cats``."""
        return np.isin(self.cat, np.asarray([int(c) for c in cats], dtype=self.cat.dtype))

    def name_of(self, i: int) -> str:
        return self.names[self.name[i]]

    def has_record_function_ids(self) -> bool:
        """True when CPU ops carry ``Record function id`` (joins an execution trace by ``rf_id``)."""
        return bool(np.any(self.rf[self.cat == EventCat.CPU_OP] >= 0))

    @property
    def pids(self) -> list[int]:
        """Host process ids of the CPU-side events."""
        cpu = self.mask(EventCat.CPU_OP, EventCat.USER_ANNOTATION, EventCat.RUNTIME)
        return sorted({int(p) for p in np.unique(self.pid[cpu])})

    def frame(self) -> pd.DataFrame:
        """All events as a DataFrame (category names, times in µs) for interactive analysis."""
        return pd.DataFrame(
            {
                "cat": [EventCat(c).name.lower() for c in self.cat],
                "name": np.asarray(self.names, dtype=object)[self.name] if self.n_events else [],
                "pid": self.pid,
                "tid": self.tid,
                "ts_us": self.ts,
                "dur_us": self.dur,
                "correlation": self.corr,
                "external_id": self.ext,
                "record_function_id": self.rf,
                "stream": self.stream,
            }
        )

    def summary(self) -> dict:
        counts = np.bincount(self.cat, minlength=len(EventCat))
        return {"file": self.label, "rank": self.rank, "events": self.n_events,
                **{EventCat(i).name.lower(): int(c) for i, c in enumerate(counts) if c}}


def is_kineto_json(doc: object) -> bool:
    """True when a parsed JSON document looks like a Kineto / Chrome trace."""
    if isinstance(doc, dict):
        return isinstance(doc.get("traceEvents"), list)
    return False


def _distributed_info(doc: dict) -> dict:
    info = doc.get("distributedInfo")
    if isinstance(info, str):  # some exporters write it as a string
        import ast

        try:
            info = ast.literal_eval(info)
        except (ValueError, SyntaxError):
            info = None
    return info if isinstance(info, dict) else {}


def kineto_from_json(doc: object, label: str) -> KinetoTrace:
    """Columnise a parsed Kineto document (one pass over its events)."""
    if not is_kineto_json(doc):
        if isinstance(doc, dict) and "nodes" in doc:
            raise TraceError(f"{label}: is a PyTorch execution trace, not a Kineto trace")
        raise TraceError(f"{label}: not a Kineto trace (a JSON document without a 'traceEvents' list)")
    assert isinstance(doc, dict)
    events = doc["traceEvents"]
    thread_names = _thread_names((ev.get("pid"), ev.get("tid"), ev.get("args")) for ev in events
                                 if isinstance(ev, dict) and ev.get("ph") == "M" and ev.get("name") == "thread_name")
    rows = ((ev.get("cat"), ev.get("name", ""), ev.get("pid", -1), ev.get("tid", -1), ev.get("ts"), ev.get("dur", 0.0),
             ev.get("args")) for ev in events if isinstance(ev, dict) and ev.get("ph") == "X")
    columns, names, args = _columns(rows)
    return _trace_from_columns(doc, label, columns, names, args, thread_names)


if _msgspec is not None:
    class _EventFields(_msgspec.Struct, gc=False):
        """The fields of a trace event the reader uses besides its phase (any JSON value; the rest of the event is
        skipped; not tracked by the garbage collector: 10 % faster to decode)."""

        cat: object = None
        name: object = ""
        pid: object = -1
        tid: object = -1
        ts: object = None
        dur: object = 0.0
        args: object = None

    class _Event(_EventFields, gc=False):
        """An event of any phase: :class:`_EventFields` and ``ph``."""

        ph: object = None

    def _document(name: str, event: type) -> type:
        """A Kineto document with events of type ``event`` and the top-level fields :class:`KinetoTrace` keeps."""
        return _msgspec.defstruct(name, [("traceEvents", list[event]), ("schemaVersion", object, None),
                                         ("distributedInfo", object, None), ("deviceProperties", object, None),
                                         ("record_shapes", object, None)], gc=False)

    _DECODER = _msgspec.json.Decoder(_document("_Document", _Event))

    class _Complete(_EventFields, tag_field="ph", tag="X", gc=False):
        """A complete event (``"ph": "X"``): :class:`_EventFields`."""

    class _Meta(_msgspec.Struct, tag_field="ph", tag="M", gc=False):
        """A metadata event (``"ph": "M"``): thread names."""

        name: object = ""
        pid: object = -1
        tid: object = -1
        args: object = None

    #: Chrome trace phases the reader skips: their events decode with no field (the 13.6k flow events of the
    #: ResNet-50 trace kept five objects each); a trace with another phase decodes with :class:`_Event`
    _SKIPPED_PHASES = ("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "R", "c")
    _PhasedEvent = Union[(_Complete, _Meta, *(  # noqa: UP007 - a tuple of classes built at run time
        _msgspec.defstruct(f"_Phase{i}", [], tag_field="ph", tag=ph, gc=False)
        for i, ph in enumerate(_SKIPPED_PHASES)))]

    #: a document whose events decode by phase
    _PHASED_DECODER = _msgspec.json.Decoder(_document("_PhasedDocument", _PhasedEvent))


def kineto_from_bytes(data: bytes, label: str) -> KinetoTrace | None:
    """Read the JSON text of a Kineto trace straight into columns, decoding only the fields the reader uses
    (with msgspec: 1.8x faster than parsing the whole document, then columnising it). None when msgspec is
    not installed or ``data`` is not a Kineto document that decodes this way: parse it as JSON instead."""
    head = data[:512]
    if _msgspec is None or not (b'"schemaVersion"' in head or b'"traceEvents"' in head):
        return None
    try:
        doc = _PHASED_DECODER.decode(data)
    except (_msgspec.DecodeError, _msgspec.ValidationError):  # an event of another phase, or none
        doc = None
    if doc is not None:
        events = doc.traceEvents
        thread_names = _thread_names((ev.pid, ev.tid, ev.args) for ev in events
                                     if ev.__class__ is _Meta and ev.name == "thread_name")
        rows = ((ev.cat, ev.name, ev.pid, ev.tid, ev.ts, ev.dur, ev.args) for ev in events if ev.__class__ is _Complete)
    else:
        try:
            doc = _DECODER.decode(data)
        except (_msgspec.DecodeError, _msgspec.ValidationError):
            return None
        events = doc.traceEvents
        thread_names = _thread_names((ev.pid, ev.tid, ev.args) for ev in events
                                     if ev.ph == "M" and ev.name == "thread_name")
        rows = ((ev.cat, ev.name, ev.pid, ev.tid, ev.ts, ev.dur, ev.args) for ev in events if ev.ph == "X")
    columns, names, args = _columns(rows)
    top = {"schemaVersion": doc.schemaVersion, "distributedInfo": doc.distributedInfo,
           "deviceProperties": doc.deviceProperties, "record_shapes": doc.record_shapes, "traceEvents": events}
    trace = _trace_from_columns(top, label, columns, names, args, thread_names)
    if trace.rank is None or trace.rank < 0:
        trace.rank = rank_from_filename(label)
    return trace


def _thread_names(meta) -> dict[tuple[int, int], str]:
    """(pid, tid) -> name of the ``thread_name`` metadata events, given as (pid, tid, args)."""
    out: dict[tuple[int, int], str] = {}
    for pid, tid, a in meta:
        a = a if isinstance(a, dict) else {}
        out[(_int_or(pid, -1), _int_or(tid, -1))] = str(a.get("name", ""))
    return out


def _columns(rows) -> tuple[dict[str, tuple[list, type]], list[str], list[dict]]:
    """Columns, names and args of the complete events given as (cat, name, pid, tid, ts, dur, args) rows;
    events of an unknown category or without a numeric ``ts`` are dropped."""
    names: dict[str, int] = {}
    cats, name_ids, pids, tids, corrs, exts, rfs, streams, devices = ([] for _ in range(9))
    tss: list[float] = []
    durs: list[float] = []
    argss: list[dict] = []
    cat_get = {k: int(v) for k, v in _CATS.items()}.get
    code_of: dict[str, int] = {}  # category text as written -> code: lower() once per distinct text, not per event
    other = int(EventCat.OTHER)
    gpu_cats = {int(c) for c in (*GPU_CATS, EventCat.CUDA_SYNC, EventCat.GPU_ANNOTATION)}
    empty: dict = {}
    for cat_s, nm, pid, tid, ts, dur, a in rows:
        if cat_s.__class__ is str:
            c = code_of.get(cat_s)
            if c is None:
                c = code_of[cat_s] = cat_get(cat_s.lower(), other)
        else:
            c = other
        if c == other:
            continue
        if ts.__class__ is not float and not isinstance(ts, (int, float)):
            continue
        if dur.__class__ is not float and not isinstance(dur, (int, float)):
            dur = 0.0
        if nm.__class__ is not str and not isinstance(nm, str):
            nm = str(nm)
        nid = names.get(nm)
        if nid is None:
            nid = len(names)
            names[nm] = nid
        if a.__class__ is not dict:
            a = empty
        if pid.__class__ is not int:
            pid = _int_or(pid, -1)
        if tid.__class__ is not int:
            tid = _int_or(tid, -1)
        if c in gpu_cats:
            stream = _int_or(a.get("stream"), tid)
            device = _int_or(a.get("device"), pid)
        else:
            stream = -1
            device = -1
        cats.append(c)
        name_ids.append(nid)
        pids.append(pid)
        tids.append(tid)
        tss.append(ts)
        durs.append(dur if dur > 0 else 0.0)
        v = a.get("correlation", -1)
        corrs.append(v if v.__class__ is int else _int_or(v, -1))
        v = a.get("External id", -1)
        exts.append(v if v.__class__ is int else _int_or(v, -1))
        v = a.get("Record function id", -1)
        rfs.append(v if v.__class__ is int else _int_or(v, -1))
        streams.append(stream)
        devices.append(device)
        argss.append(a)
    columns = {"cat": (cats, np.int8), "name": (name_ids, np.int32), "pid": (pids, np.int64),
               "tid": (tids, np.int64), "ts": (tss, np.float64), "dur": (durs, np.float64),
               "corr": (corrs, np.int64), "ext": (exts, np.int64), "rf": (rfs, np.int64),
               "stream": (streams, np.int64), "device": (devices, np.int64)}
    return columns, list(names), argss


def _trace_from_columns(doc: dict, label: str, columns: dict[str, tuple[list, type]], names: list[str],
                        args: list[dict], thread_names: dict[tuple[int, int], str]) -> KinetoTrace:
    """The :class:`KinetoTrace` of the per-event ``columns`` (name -> (values, dtype)) read from ``doc``."""
    info = _distributed_info(doc)
    rank = info.get("rank")
    world = info.get("world_size")
    meta = {
        "schemaVersion": doc.get("schemaVersion"),
        "distributedInfo": info,
        "devices": [str(d.get("name", "")) for d in doc.get("deviceProperties", []) or [] if isinstance(d, dict)],
        "record_shapes": doc.get("record_shapes"),
        "raw_events": len(doc["traceEvents"]),
    }
    return KinetoTrace(
        label=label,
        names=names,
        args=args,
        rank=_int_or(rank, -1) if rank is not None else None,
        world_size=_int_or(world, -1) if world is not None else None,
        meta=meta,
        thread_names=thread_names,
        # np.fromiter: 2x faster than np.asarray on a list of Python floats
        **{k: np.fromiter(v, dtype=dt, count=len(v)) for k, (v, dt) in columns.items()},
    )


def rank_from_filename(label: str) -> int | None:
    """A rank number spelled in a file name (``rank3``, ``worker3``, ``..._3.json``), if any."""
    base = Path(label).name
    m = _RANK_IN_NAME.search(base)
    if m:
        return int(m.group(1))
    m = re.search(r"[_-](\d+)\.(?:pt\.trace\.)?json(?:\.gz)?$", base)
    return int(m.group(1)) if m else None


def read_kineto(source: str | Path | bytes, label: str | None = None) -> KinetoTrace:
    """Read one Kineto trace (``.json`` or ``.json.gz``) from a path or from bytes.

    Raises :class:`TraceError` (one line naming the file) for a missing, truncated, non-JSON
    or non-Kineto file.
    """
    doc, label = read_json_source(source, label)
    trace = kineto_from_json(doc, label)
    if trace.rank is None or trace.rank < 0:
        trace.rank = rank_from_filename(label)
    return trace
