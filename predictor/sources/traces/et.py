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

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from predictor.sources.traces._io import read_json_source
from predictor.sources.traces.errors import TraceError

__all__ = ["ExecutionTrace", "read_et", "et_from_json", "is_et_json", "SUPPORTED_SCHEMAS"]

#: schema versions this reader understands (prefix before any ``-chakra`` suffix)
SUPPORTED_SCHEMAS = ("1.0.1", "1.0.2", "1.0.3", "1.0.4", "1.1.0", "1.1.1", "1.1.2", "1.1.3")


def is_et_json(doc: object) -> bool:
    """True when a parsed JSON document looks like a PyTorch execution trace."""
    return isinstance(doc, dict) and isinstance(doc.get("nodes"), list) and "schema" in doc


def _tensor_ids(values: list, types: list) -> list[int]:
    out: list[int] = []
    for v, t in zip(values, types, strict=False):
        if not isinstance(t, str):
            continue
        if t.startswith("Tensor") and isinstance(v, list) and v and isinstance(v[0], int):
            out.append(v[0])
        elif t.startswith("GenericList[Tensor") and isinstance(v, list):
            for item in v:
                if isinstance(item, list) and item and isinstance(item[0], int):
                    out.append(item[0])
    return out


@dataclass
class ExecutionTrace:
    """Nodes of one execution trace as columns (one row per recorded op or annotation).

    ``id``, ``parent`` (the enclosing node; 1.0.1 ``parent``, later ``ctrl_deps``), ``rf_id``
    (-1 if absent), ``tid`` (the ET's small thread index), ``name`` (index into ``names``);
    per node Python lists ``input_shapes``, ``input_types``, ``output_shapes``; tensor ids in
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
    input_shapes: list[list]
    input_types: list[list]
    output_shapes: list[list]
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
    ins = n.get("inputs") or {}
    outs = n.get("outputs") or {}
    return (n.get("ctrl_deps", -1), attrs.get("rf_id", -1), attrs.get("tid", 0),
            (ins.get("values", []), ins.get("shapes", []), ins.get("types", [])),
            (outs.get("values", []), outs.get("shapes", []), outs.get("types", [])))


def et_from_json(doc: object, label: str) -> ExecutionTrace:
    """Columnise a parsed execution-trace document."""
    if not is_et_json(doc):
        raise TraceError(f"{label}: not a PyTorch execution trace (no 'schema' and 'nodes')")
    assert isinstance(doc, dict)
    schema = str(doc.get("schema", ""))
    base = schema.split("-")[0]
    if base not in SUPPORTED_SCHEMAS:
        raise TraceError(
            f"{label}: execution-trace schema {schema!r} is not supported (known: {', '.join(SUPPORTED_SCHEMAS)})"
        )
    flat = base == "1.0.1"
    nodes = sorted((n for n in doc["nodes"] if isinstance(n, dict) and "id" in n), key=lambda n: n["id"])
    ids: list[int] = []
    parents: list[int] = []
    rfs: list[int] = []
    tids: list[int] = []
    name_ids: list[int] = []
    names: dict[str, int] = {}
    in_shapes: list[list] = []
    in_types: list[list] = []
    out_shapes: list[list] = []
    in_ptr = [0]
    out_ptr = [0]
    in_ids: list[int] = []
    out_ids: list[int] = []
    for n in nodes:
        nm = str(n.get("name", ""))
        nid = names.get(nm)
        if nid is None:
            nid = len(names)
            names[nm] = nid
        parent, rf, tid, (iv, ish, ity), (ov, osh, oty) = _node_fields(n, flat)
        ids.append(int(n["id"]))
        parents.append(int(parent) if isinstance(parent, int) else -1)
        rfs.append(int(rf) if isinstance(rf, int) else -1)
        tids.append(int(tid) if isinstance(tid, int) else 0)
        name_ids.append(nid)
        in_shapes.append(ish if isinstance(ish, list) else [])
        in_types.append(ity if isinstance(ity, list) else [])
        out_shapes.append(osh if isinstance(osh, list) else [])
        if isinstance(iv, list) and isinstance(ity, list):
            in_ids.extend(_tensor_ids(iv, ity))
        in_ptr.append(len(in_ids))
        if isinstance(ov, list) and isinstance(oty, list):
            out_ids.extend(_tensor_ids(ov, oty))
        out_ptr.append(len(out_ids))
    if not ids:
        raise TraceError(f"{label}: execution trace has no nodes")
    pid = doc.get("pid")
    try:
        pid_i = int(pid) if pid is not None else None
    except (TypeError, ValueError):
        pid_i = None
    return ExecutionTrace(
        label=label,
        schema=schema,
        pid=pid_i,
        id=np.asarray(ids, dtype=np.int64),
        parent=np.asarray(parents, dtype=np.int64),
        rf_id=np.asarray(rfs, dtype=np.int64),
        tid=np.asarray(tids, dtype=np.int64),
        name=np.asarray(name_ids, dtype=np.int32),
        names=list(names),
        input_shapes=in_shapes,
        input_types=in_types,
        output_shapes=out_shapes,
        in_ptr=np.asarray(in_ptr, dtype=np.int64),
        in_ids=np.asarray(in_ids, dtype=np.int64),
        out_ptr=np.asarray(out_ptr, dtype=np.int64),
        out_ids=np.asarray(out_ids, dtype=np.int64),
        meta={k: doc.get(k) for k in ("time", "start_ts", "finish_ts")},
    )


def read_et(source: str | Path | bytes, label: str | None = None) -> ExecutionTrace:
    """Read one execution trace (``.json`` or ``.json.gz``) from a path or bytes."""
    doc, label = read_json_source(source, label)
    return et_from_json(doc, label)
