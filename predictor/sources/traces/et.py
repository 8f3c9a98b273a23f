"""Reader for PyTorch execution traces (``ExecutionTraceObserver``), schemas 1.0.1 through 1.1.x.

Two layouts exist:

* **1.0.1** (``execution_graph`` era): flat fields per node — ``parent``, ``rf_id``, ``tid``,
  ``inputs`` (values), ``input_shapes``, ``input_types``, ``outputs``, ``output_shapes``...
* **1.0.2 … 1.1.x** (``-chakra.0.0.4``): ``ctrl_deps`` is the parent, ``inputs`` /
  ``outputs`` are ``{"values", "shapes", "types"(, "strides")}`` and the scalars live in an
  ``attrs`` list (``rf_id``, ``tid``, ``seq_id``, ``op_schema``, ...).

Both are read into the same columns. A tensor value is ``[tensor_id, storage_id, offset,
numel, itemsize, device]``; tensor ids give the data dependencies between ops. ``rf_id``
joins a node to the Kineto event whose ``args["Record function id"]`` has the same value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import numpy as np

from predictor.sources.traces.errors import TraceError
from predictor.sources.traces.json_io import json_bytes, no_gc, read_json_source

try:
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; without it the whole document is parsed
    _msgspec = None

__all__ = ["ExecutionTrace", "JsonLists", "read_et", "et_from_json", "et_from_bytes", "is_et_json",
           "SUPPORTED_SCHEMAS"]

#: schema versions this reader understands (prefix before any ``-chakra`` suffix)
SUPPORTED_SCHEMAS = ("1.0.1", "1.0.2", "1.0.3", "1.0.4", "1.1.0", "1.1.1", "1.1.2", "1.1.3")


def is_et_json(doc: object) -> bool:
    """True when a parsed JSON document looks like a PyTorch execution trace."""
    return isinstance(doc, dict) and isinstance(doc.get("nodes"), list) and "schema" in doc


def _type_plan(types: object) -> tuple[list, tuple[tuple[int, bool], ...]]:
    """``types`` as a list (``[]`` if it is none) and the positions of its tensor-valued entries, each with
    True for a list of tensors (``GenericList[Tensor...]``), False for one tensor (``Tensor...``)."""
    if types.__class__ is not list:
        return [], ()
    plan = tuple((k, not t.startswith("Tensor")) for k, t in enumerate(types)  # type: ignore[arg-type]
                 if t.__class__ is str and (t.startswith("Tensor") or t.startswith("GenericList[Tensor")))
    return types, plan  # type: ignore[return-value]


def _add_tensor_ids(out: list[int], values: object, plan: tuple[tuple[int, bool], ...]) -> None:
    """Append to ``out`` the ids of the tensors among ``values`` at the positions of ``plan`` (a tensor
    value is ``[id, storage, offset, numel, itemsize, device]``; a tensor list a list of them)."""
    if values.__class__ is not list:
        return
    n = len(values)  # type: ignore[arg-type]
    for k, many in plan:
        if k >= n:
            break
        v = values[k]  # type: ignore[index]
        if v.__class__ is not list:
            continue
        if not many:
            if v and isinstance(v[0], int):
                out.append(v[0])
            continue
        for item in v:
            if isinstance(item, list) and item and isinstance(item[0], int):
                out.append(item[0])


class JsonLists(Sequence):
    """Per-node JSON lists kept as undecoded text until one is read: a list per access (``[]`` where the
    file holds no list). The shapes of most nodes are never read, and 30k small lists kept alive slow the
    garbage collector's later passes."""

    __slots__ = ("_raw",)

    def __init__(self, raw: list) -> None:
        self._raw = raw

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._raw)))]
        v = _msgspec.json.decode(self._raw[i])
        return v if v.__class__ is list else []

    def text(self, i: int) -> bytes:
        """The JSON text of entry ``i`` (equal texts decode to equal lists)."""
        return bytes(self._raw[i])


@dataclass
class ExecutionTrace:
    """Nodes of one execution trace as columns (one row per recorded op or annotation).

    ``id``, ``parent`` (the enclosing node; 1.0.1 ``parent``, later ``ctrl_deps``), ``rf_id``
    (-1 if absent), ``tid`` (the ET's small thread index), ``name`` (index into ``names``);
    per node lists ``input_shapes``, ``input_types``, ``output_shapes`` (the shapes a list or a
    :class:`JsonLists`, indexed alike); tensor ids in
    CSR form (``in_ptr``/``in_ids``, ``out_ptr``/``out_ids``).
    """

    label: str
    schema: str
    pid: int | None
    id: np.ndarray
    parent: np.ndarray
    rf_id: np.ndarray
    tid: np.ndarray
    name: np.ndarray
    names: list[str]
    input_shapes: Sequence[list]
    input_types: list[list]
    output_shapes: Sequence[list]
    in_ptr: np.ndarray
    in_ids: np.ndarray
    out_ptr: np.ndarray
    out_ids: np.ndarray
    meta: dict = field(default_factory=dict)

    @property
    def n_nodes(self) -> int:
        return int(self.id.shape[0])

    def name_of(self, i: int) -> str:
        return self.names[self.name[i]]

    def is_root(self) -> np.ndarray:
        """Mask of the synthetic process/thread root nodes (``[pytorch|profiler|...]``)."""
        root_ids = [i for i, s in enumerate(self.names) if s.startswith("[pytorch|profiler|")]
        return np.isin(self.name, np.asarray(root_ids, dtype=self.name.dtype))

    def inputs_of(self, i: int) -> np.ndarray:
        return self.in_ids[self.in_ptr[i] : self.in_ptr[i + 1]]

    def outputs_of(self, i: int) -> np.ndarray:
        return self.out_ids[self.out_ptr[i] : self.out_ptr[i + 1]]


def _node_fields(n: dict, flat: bool) -> tuple[object, object, object, tuple, tuple]:
    """(parent, rf_id, tid, (input values, shapes, types), (output values, shapes, types)) of a node;
    ``flat``: schema 1.0.1 (fields on the node), else attributes and nested inputs / outputs."""
    if flat:
        return (n.get("parent", -1), n.get("rf_id", -1), n.get("tid", 0),
                (n.get("inputs", []), n.get("input_shapes", []), n.get("input_types", [])),
                (n.get("outputs", []), n.get("output_shapes", []), n.get("output_types", [])))
    attrs = {a.get("name"): a.get("value") for a in n.get("attrs", []) if isinstance(a, dict)}
    ins = n.get("inputs")
    outs = n.get("outputs")
    ins = ins if isinstance(ins, dict) else {}
    outs = outs if isinstance(outs, dict) else {}
    return (n.get("ctrl_deps", -1), attrs.get("rf_id", -1), attrs.get("tid", 0),
            (ins.get("values", []), ins.get("shapes", []), ins.get("types", [])),
            (outs.get("values", []), outs.get("shapes", []), outs.get("types", [])))


def _schema_of(doc_schema: object, label: str) -> tuple[str, bool]:
    """(schema, flat) of a document's ``schema`` field, or :class:`TraceError` for an unknown version."""
    schema = str(doc_schema if doc_schema is not None else "")
    base = schema.split("-")[0]
    if base not in SUPPORTED_SCHEMAS:
        raise TraceError(
            f"{label}: execution-trace schema {schema!r} is not supported (known: {', '.join(SUPPORTED_SCHEMAS)})"
        )
    return schema, base == "1.0.1"


def _pid_of(pid: object) -> int | None:
    try:
        return int(pid) if pid is not None else None  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def _trace(label: str, schema: str, pid: object, meta: dict, rows, from_text: bool) -> ExecutionTrace:
    """The columns of ``rows`` (id, name, parent, rf_id, tid, (input values, shapes, types), (output values,
    shapes, types)) per node, sorted by id; ``from_text``: the shapes and types are :class:`msgspec.Raw`
    JSON text (the shapes stay so; the types are decoded once per distinct text and shared)."""
    ids: list[int] = []
    parents: list[int] = []
    rfs: list[int] = []
    tids: list[int] = []
    name_ids: list[int] = []
    names: dict[str, int] = {}
    in_shapes: list = []
    in_types: list[list] = []
    out_shapes: list = []
    in_ptr = [0]
    out_ptr = [0]
    in_ids: list[int] = []
    out_ids: list[int] = []
    plans: dict[bytes, tuple[list, tuple[tuple[int, bool], ...]]] = {}
    for nid_raw, nm, parent, rf, tid, (iv, ish, ity), (ov, osh, oty) in rows:
        nm = nm if nm.__class__ is str else str(nm)
        nid = names.get(nm)
        if nid is None:
            nid = len(names)
            names[nm] = nid
        ids.append(int(nid_raw))
        parents.append(int(parent) if isinstance(parent, int) else -1)
        rfs.append(int(rf) if isinstance(rf, int) else -1)
        tids.append(int(tid) if isinstance(tid, int) else 0)
        name_ids.append(nid)
        if from_text:
            in_shapes.append(ish)
            out_shapes.append(osh)
            ity, oty = bytes(ity), bytes(oty)
            ity, iplan = plans.get(ity) or plans.setdefault(ity, _type_plan(_msgspec.json.decode(ity)))
            oplan = (plans.get(oty) or plans.setdefault(oty, _type_plan(_msgspec.json.decode(oty))))[1]
        else:
            in_shapes.append(ish if isinstance(ish, list) else [])
            out_shapes.append(osh if isinstance(osh, list) else [])
            ity, iplan = _type_plan(ity)
            oplan = _type_plan(oty)[1]
        in_types.append(ity)
        if iplan:
            _add_tensor_ids(in_ids, iv, iplan)
        in_ptr.append(len(in_ids))
        if oplan:
            _add_tensor_ids(out_ids, ov, oplan)
        out_ptr.append(len(out_ids))
    if not ids:
        raise TraceError(f"{label}: execution trace has no nodes")
    return ExecutionTrace(
        label=label,
        schema=schema,
        pid=_pid_of(pid),
        id=np.asarray(ids, dtype=np.int64),
        parent=np.asarray(parents, dtype=np.int64),
        rf_id=np.asarray(rfs, dtype=np.int64),
        tid=np.asarray(tids, dtype=np.int64),
        name=np.asarray(name_ids, dtype=np.int32),
        names=list(names),
        input_shapes=JsonLists(in_shapes) if from_text else in_shapes,
        input_types=in_types,
        output_shapes=JsonLists(out_shapes) if from_text else out_shapes,
        in_ptr=np.asarray(in_ptr, dtype=np.int64),
        in_ids=np.asarray(in_ids, dtype=np.int64),
        out_ptr=np.asarray(out_ptr, dtype=np.int64),
        out_ids=np.asarray(out_ids, dtype=np.int64),
        meta=meta,
    )


def et_from_json(doc: object, label: str) -> ExecutionTrace:
    """Columnise a parsed execution-trace document."""
    if not is_et_json(doc):
        raise TraceError(f"{label}: not a PyTorch execution trace (no 'schema' and 'nodes')")
    assert isinstance(doc, dict)
    schema, flat = _schema_of(doc.get("schema", ""), label)
    nodes = sorted((n for n in doc["nodes"] if isinstance(n, dict) and "id" in n), key=lambda n: n["id"])
    rows = ((n["id"], n.get("name", ""), *_node_fields(n, flat)) for n in nodes)
    meta = {k: doc.get(k) for k in ("time", "start_ts", "finish_ts")}
    return _trace(label, schema, doc.get("pid"), meta, rows, from_text=False)


if _msgspec is not None:
    class _Attr(_msgspec.Struct, gc=False):
        """One ``attrs`` entry (its ``type`` is skipped)."""

        name: object = None
        value: object = None

    class _Values(_msgspec.Struct, gc=False):
        """A node's ``inputs`` or ``outputs`` (1.0.2+): values decoded, shapes and types kept as text."""

        values: object = []
        shapes: _msgspec.Raw = _msgspec.Raw(b"[]")
        types: _msgspec.Raw = _msgspec.Raw(b"[]")

    class _Node(_msgspec.Struct, gc=False):
        """The fields of a 1.0.2+ node the reader uses."""

        id: object
        name: object = ""
        ctrl_deps: object = -1
        inputs: _Values | None = None
        outputs: _Values | None = None
        attrs: list[_Attr] = []

    class _FlatNode(_msgspec.Struct, gc=False):
        """The fields of a 1.0.1 node the reader uses."""

        id: object
        name: object = ""
        parent: object = -1
        rf_id: object = -1
        tid: object = 0
        inputs: object = []
        input_shapes: _msgspec.Raw = _msgspec.Raw(b"[]")
        input_types: _msgspec.Raw = _msgspec.Raw(b"[]")
        outputs: object = []
        output_shapes: _msgspec.Raw = _msgspec.Raw(b"[]")
        output_types: _msgspec.Raw = _msgspec.Raw(b"[]")

    def _document(name: str, node: type) -> type:
        """An execution-trace document with nodes of type ``node`` and the top-level fields the reader keeps."""
        return _msgspec.defstruct(name, [("nodes", list[node]), ("schema", object, None), ("pid", object, None),
                                         ("time", object, None), ("start_ts", object, None),
                                         ("finish_ts", object, None)], gc=False)

    _Doc, _FlatDoc = _document("_Doc", _Node), _document("_FlatDoc", _FlatNode)

    class _RfIdAttr(_msgspec.Struct, tag_field="name", tag="rf_id", gc=False):
        """The ``rf_id`` attribute."""

        value: object = -1

    class _TidAttr(_msgspec.Struct, tag_field="name", tag="tid", gc=False):
        """The ``tid`` attribute."""

        value: object = 0

    #: attributes PyTorch's observer writes that the reader skips: decoded without their value (op_schema's
    #: text alone is a third of the ResNet-50 trace); a node with any other attribute name fails the tagged
    #: decode and the document is decoded with :class:`_Attr` instead
    _SKIPPED_ATTRS = ("fw_parent", "seq_id", "scope", "fw_tid", "op_schema", "kernel_backend", "kernel_file")
    _TaggedAttr = Union[(_RfIdAttr, _TidAttr, *(  # noqa: UP007 - a tuple of classes built at run time
        _msgspec.defstruct(f"_{n}Attr", [], tag_field="name", tag=n, gc=False) for n in _SKIPPED_ATTRS))]

    class _TaggedNode(_msgspec.Struct, gc=False):
        """:class:`_Node` with its attributes decoded by name (only ``rf_id`` and ``tid`` keep a value)."""

        id: object
        name: object = ""
        ctrl_deps: object = -1
        inputs: _Values | None = None
        outputs: _Values | None = None
        attrs: list[_TaggedAttr] = []  # type: ignore[valid-type]

    _TaggedDoc = _document("_TaggedDoc", _TaggedNode)

    _DECODERS = {False: _msgspec.json.Decoder(_Doc), True: _msgspec.json.Decoder(_FlatDoc)}
    _TAGGED_DECODER = _msgspec.json.Decoder(_TaggedDoc)
    _NO_VALUES = _Values()

    class _Head(_msgspec.Struct, array_like=True, gc=False):
        """The first element of a JSON array, the rest skipped: a tensor value's id without its storage, sizes
        and device (the 37k tensor values of the ResNet-50 trace: 6 objects each as lists)."""

        head: Union[int, float, str, bool, None, _Head, dict] = None  # noqa: UP007 - a self-reference

    #: every node's tensor-holding ``values`` in one array: per entry, a JSON array becomes a :class:`_Head`
    _HEADS_DECODER = _msgspec.json.Decoder(list[list[Union[int, float, str, bool, None, _Head, dict]]])  # noqa: UP007

    class _RawValues(_msgspec.Struct, gc=False):
        """A node's ``inputs`` or ``outputs`` all as text: values, shapes and types."""

        values: _msgspec.Raw = _msgspec.Raw(b"[]")
        shapes: _msgspec.Raw = _msgspec.Raw(b"[]")
        types: _msgspec.Raw = _msgspec.Raw(b"[]")

    class _IntRfId(_msgspec.Struct, tag_field="name", tag="rf_id", gc=False):
        """The ``rf_id`` attribute, an integer."""

        value: int = -1

    class _IntTid(_msgspec.Struct, tag_field="name", tag="tid", gc=False):
        """The ``tid`` attribute, an integer."""

        value: int = 0

    _IntAttr = Union[(_IntRfId, _IntTid, *(  # noqa: UP007 - a tuple of classes built at run time
        _msgspec.defstruct(f"_Int{n}Attr", [], tag_field="name", tag=n, gc=False) for n in _SKIPPED_ATTRS))]

    class _IntNode(_msgspec.Struct, gc=False):
        """A 1.0.2+ node as PyTorch's observer writes it: integer ids, a text name, values left as text."""

        id: int
        name: str = ""
        ctrl_deps: int = -1
        inputs: _RawValues | None = None
        outputs: _RawValues | None = None
        attrs: list[_IntAttr] = []  # type: ignore[valid-type]

    _IntDoc = _document("_IntDoc", _IntNode)

    _INT_DECODER = _msgspec.json.Decoder(_IntDoc)
    _NO_RAW_VALUES = _RawValues()

_SCHEMA_IN_HEAD = re.compile(rb'"schema"\s*:\s*"([^"\\]*)"')


def _flat_rows(nodes: list):
    """(id, name, parent, rf_id, tid, inputs, outputs) of decoded 1.0.1 nodes."""
    for n in nodes:
        yield (n.id, n.name, n.parent, n.rf_id, n.tid, (n.inputs, n.input_shapes, n.input_types),
               (n.outputs, n.output_shapes, n.output_types))


def _nested_trace(label: str, schema: str, pid: object, meta: dict, nodes: list) -> ExecutionTrace:
    """:func:`_trace` of decoded 1.0.2+ nodes sorted by id, in one loop without per-node tuples or calls
    (the same columns; 2x faster on the 14k nodes of the ResNet-50 trace). The last ``rf_id`` / ``tid``
    attribute wins."""
    ids: list[int] = []
    parents: list[int] = []
    rfs: list[int] = []
    tids: list[int] = []
    name_ids: list[int] = []
    names: dict[str, int] = {}
    in_shapes: list = []
    in_types: list[list] = []
    out_shapes: list = []
    in_ptr = [0]
    out_ptr = [0]
    in_ids: list[int] = []
    out_ids: list[int] = []
    plans: dict[bytes, tuple[list, tuple[tuple[int, bool], ...]]] = {}
    last_in: dict[int, tuple] = {}  # op name -> (types text, plan) of its last node
    last_out: dict[int, tuple] = {}
    decode = _msgspec.json.decode
    add_in = in_ids.append
    add_out = out_ids.append
    for n in nodes:
        nm = n.name
        if nm.__class__ is not str:
            nm = str(nm)
        nid = names.get(nm)
        if nid is None:
            nid = names[nm] = len(names)
        nid_raw = n.id
        ids.append(nid_raw if nid_raw.__class__ is int else int(nid_raw))
        parent = n.ctrl_deps
        parents.append(parent if parent.__class__ is int else int(parent) if isinstance(parent, int) else -1)
        rf: object = -1
        tid: object = 0
        for a in n.attrs:
            c = a.__class__
            if c is _RfIdAttr:
                rf = a.value
            elif c is _TidAttr:
                tid = a.value
            elif c is _Attr:
                an = a.name
                if an == "rf_id":
                    rf = a.value
                elif an == "tid":
                    tid = a.value
        rfs.append(rf if rf.__class__ is int else int(rf) if isinstance(rf, int) else -1)
        tids.append(tid if tid.__class__ is int else int(tid) if isinstance(tid, int) else 0)
        name_ids.append(nid)
        i = n.inputs or _NO_VALUES
        o = n.outputs or _NO_VALUES
        in_shapes.append(i.shapes)
        out_shapes.append(o.shapes)
        raw = i.types
        last = last_in.get(nid)  # nodes of one op name mostly repeat its types: compare before copying to hash
        if last is not None and last[0] == raw:
            ity, iplan = last[1]
        else:
            key = bytes(raw)
            plan = plans.get(key) or plans.setdefault(key, _type_plan(decode(key)))
            last_in[nid] = (raw, plan)
            ity, iplan = plan
        in_types.append(ity)
        if iplan:
            values = i.values
            if values.__class__ is list:
                nv = len(values)
                for k, many in iplan:  # tensor value [id, storage, offset, numel, itemsize, device]
                    if k >= nv:
                        break
                    v = values[k]
                    if v.__class__ is not list:
                        continue
                    if not many:
                        if v and isinstance(v[0], int):
                            add_in(v[0])
                    else:
                        for item in v:
                            if isinstance(item, list) and item and isinstance(item[0], int):
                                add_in(item[0])
        in_ptr.append(len(in_ids))
        raw = o.types
        last = last_out.get(nid)
        if last is not None and last[0] == raw:
            oplan = last[1]
        else:
            key = bytes(raw)
            oplan = (plans.get(key) or plans.setdefault(key, _type_plan(decode(key))))[1]
            last_out[nid] = (raw, oplan)
        if oplan:  # as for the inputs, inlined: a call per node was a tenth of this loop
            values = o.values
            if values.__class__ is list:
                nv = len(values)
                for k, many in oplan:
                    if k >= nv:
                        break
                    v = values[k]
                    if v.__class__ is not list:
                        continue
                    if not many:
                        if v and isinstance(v[0], int):
                            add_out(v[0])
                    else:
                        for item in v:
                            if isinstance(item, list) and item and isinstance(item[0], int):
                                add_out(item[0])
        out_ptr.append(len(out_ids))
    if not ids:
        raise TraceError(f"{label}: execution trace has no nodes")
    return ExecutionTrace(
        label=label, schema=schema, pid=_pid_of(pid),
        id=np.asarray(ids, dtype=np.int64), parent=np.asarray(parents, dtype=np.int64),
        rf_id=np.asarray(rfs, dtype=np.int64), tid=np.asarray(tids, dtype=np.int64),
        name=np.asarray(name_ids, dtype=np.int32), names=list(names),
        input_shapes=JsonLists(in_shapes), input_types=in_types, output_shapes=JsonLists(out_shapes),
        in_ptr=np.asarray(in_ptr, dtype=np.int64), in_ids=np.asarray(in_ids, dtype=np.int64),
        out_ptr=np.asarray(out_ptr, dtype=np.int64), out_ids=np.asarray(out_ids, dtype=np.int64), meta=meta,
    )


def _int_trace(data: bytes, label: str, schema: str) -> ExecutionTrace | None:
    """:func:`_nested_trace` of a 1.0.2+ document whose ids, parents, ``rf_id`` and ``tid`` are integers and whose
    attributes are those PyTorch's observer writes (None otherwise): values stay text in the first decode, then
    the tensor-holding ones are decoded together, each JSON array as its first element only (:class:`_Head`)."""
    try:
        doc = _INT_DECODER.decode(data)
    except (_msgspec.DecodeError, _msgspec.ValidationError):
        return None
    nodes = doc.nodes
    if str(doc.schema) != schema or not nodes:
        return None
    ids = [n.id for n in nodes]
    nodes = [nodes[i] for i in sorted(range(len(ids)), key=ids.__getitem__)]  # by id, stable
    n_nodes = len(nodes)
    ids = []
    parents: list[int] = []
    rfs: list[int] = []
    tids: list[int] = []
    name_ids: list[int] = []
    names: dict[str, int] = {}
    in_shapes: list = []
    out_shapes: list = []
    in_types: list[list] = []
    plans: dict[bytes, tuple[list, tuple[tuple[int, bool], ...]]] = {}
    last_in: dict[int, tuple] = {}  # op name -> (types text, plan) of its last node: mostly repeated
    last_out: dict[int, tuple] = {}
    held: list[int] = []  # nodes whose inputs hold tensors, their values texts, every node's plan
    in_vals: list = []
    in_plans: list = [None] * n_nodes
    held_out: list[int] = []
    out_vals: list = []
    out_plans: list = [None] * n_nodes
    decode = _msgspec.json.decode
    # one pass over the nodes: a pass per column walked the 14k decoded nodes again each time (slower overall)
    for k, n in enumerate(nodes):
        nm = n.name
        nid = names.get(nm)
        if nid is None:
            nid = names[nm] = len(names)
        name_ids.append(nid)
        ids.append(n.id)
        parents.append(n.ctrl_deps)
        rf = -1
        tid = 0
        for a in n.attrs:  # the last rf_id / tid attribute wins
            c = a.__class__
            if c is _IntRfId:
                rf = a.value
            elif c is _IntTid:
                tid = a.value
        rfs.append(rf)
        tids.append(tid)
        i = n.inputs or _NO_RAW_VALUES
        o = n.outputs or _NO_RAW_VALUES
        in_shapes.append(i.shapes)
        out_shapes.append(o.shapes)
        raw = i.types
        prev = last_in.get(nid)
        if prev is not None and prev[0] == raw:
            plan = prev[1]
        else:
            key = bytes(raw)
            plan = plans.get(key) or plans.setdefault(key, _type_plan(decode(key)))
            last_in[nid] = (raw, plan)
        in_types.append(plan[0])
        if plan[1]:
            held.append(k)
            in_vals.append(i.values)
            in_plans[k] = plan
        raw = o.types
        prev = last_out.get(nid)
        if prev is not None and prev[0] == raw:
            plan = prev[1]
        else:
            key = bytes(raw)
            plan = plans.get(key) or plans.setdefault(key, _type_plan(decode(key)))
            last_out[nid] = (raw, plan)
        if plan[1]:
            held_out.append(k)
            out_vals.append(o.values)
            out_plans[k] = plan
    try:
        heads = _HEADS_DECODER.decode(b"[" + b",".join(in_vals + out_vals) + b"]")
    except (_msgspec.DecodeError, _msgspec.ValidationError):  # a values field that is no JSON array
        return None
    in_ptr, in_ids = _head_ids(held, in_plans, in_vals, heads[:len(held)], n_nodes)
    out_ptr, out_ids = _head_ids(held_out, out_plans, out_vals, heads[len(held):], n_nodes)
    col = np.fromiter  # 2x faster than np.asarray on lists of Python ints
    return ExecutionTrace(
        label=label, schema=schema, pid=_pid_of(doc.pid),
        id=col(ids, np.int64, n_nodes), parent=col(parents, np.int64, n_nodes), rf_id=col(rfs, np.int64, n_nodes),
        tid=col(tids, np.int64, n_nodes), name=col(name_ids, np.int32, n_nodes), names=list(names),
        input_shapes=JsonLists(in_shapes), input_types=in_types, output_shapes=JsonLists(out_shapes),
        in_ptr=in_ptr, in_ids=col(in_ids, np.int64, len(in_ids)),
        out_ptr=out_ptr, out_ids=col(out_ids, np.int64, len(out_ids)),
        meta={"time": doc.time, "start_ts": doc.start_ts, "finish_ts": doc.finish_ts},
    )


def _head_ids(held: list[int], plans: list, texts: list, heads: list, n_nodes: int) -> tuple[np.ndarray, list[int]]:
    """(CSR pointer over ``n_nodes``, tensor ids) of nodes ``held``, with their (types, tensor positions)
    ``plans`` (per node), values ``texts`` and values decoded as ``heads``: a tensor's id is the first element of
    its value; a list of tensors is decoded whole."""
    counts = [0] * n_nodes
    out: list[int] = []
    add = out.append
    decode = _msgspec.json.decode
    for k, raw, values in zip(held, texts, heads, strict=True):
        before = len(out)
        nv = len(values)
        whole = None
        for pos, many in plans[k][1]:
            if pos >= nv:
                break
            v = values[pos]
            if v.__class__ is not _Head:  # not a JSON array
                continue
            if not many:
                h = v.head
                if isinstance(h, int):
                    add(h)
                continue
            if whole is None:
                whole = decode(raw)
            for item in whole[pos]:
                if isinstance(item, list) and item and isinstance(item[0], int):
                    add(item[0])
        counts[k] = len(out) - before
    ptr = np.zeros(n_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, out


def et_from_bytes(data: bytes, label: str) -> ExecutionTrace | None:
    """Read the JSON text of an execution trace straight into columns, decoding only the fields the reader
    uses and leaving the shapes as text until read (with msgspec: the 12 MB ResNet-50 trace in 0.11 s,
    against 0.37 s parsing it whole and columnising it).
    None when msgspec is missing, the text does not name a known schema in its first 512 bytes, or the
    document does not decode this way: parse it as JSON instead (:func:`et_from_json`)."""
    head = data[:512]
    m = _SCHEMA_IN_HEAD.search(head) if _msgspec is not None and b'"nodes"' in data[:4096] else None
    if m is None:
        return None
    schema = m.group(1).decode("utf-8", "replace")
    if schema.split("-")[0] not in SUPPORTED_SCHEMAS:
        return None  # the parsed-document path names the problem
    flat = schema.split("-")[0] == "1.0.1"
    with no_gc():  # one pause for decoding, columnising and freeing the decoded nodes
        doc = None
        if not flat:
            trace = _int_trace(data, label, schema)
            if trace is not None:
                return trace
            try:
                doc = _TAGGED_DECODER.decode(data)
            except (_msgspec.DecodeError, _msgspec.ValidationError):  # an attribute of another name
                doc = None
        try:
            doc = doc or _DECODERS[flat].decode(data)
        except (_msgspec.DecodeError, _msgspec.ValidationError):
            return None
        if str(doc.schema) != schema:  # a second "schema" key, or one nested before the top-level one
            return None
        nodes = doc.nodes
        ids = [n.id for n in nodes]
        try:  # by id, stable; keys looked up by index, not through a Python lambda per node (3x faster)
            nodes = [nodes[i] for i in sorted(range(len(ids)), key=ids.__getitem__)]
        except TypeError:
            return None
        meta = {"time": doc.time, "start_ts": doc.start_ts, "finish_ts": doc.finish_ts}
        if flat:
            trace = _trace(label, schema, doc.pid, meta, _flat_rows(nodes), from_text=True)
        else:
            trace = _nested_trace(label, schema, doc.pid, meta, nodes)
        del doc, nodes
    return trace


def read_et(source: str | Path | bytes, label: str | None = None) -> ExecutionTrace:
    """Read one execution trace (``.json`` or ``.json.gz``) from a path or bytes."""
    if isinstance(source, bytes):
        label = label or "<bytes>"
        raw = json_bytes(source, label)
        et = et_from_bytes(raw, label)
        if et is not None:
            return et
    doc, label = read_json_source(source, label)
    return et_from_json(doc, label)
