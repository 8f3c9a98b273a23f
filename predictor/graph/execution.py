"""ExecutionGraph: the one representation of a training iteration that every predictor shares.

A graph holds the *tasks* of one iteration on one or more ranks, the *processors* they run on
(CPU threads and GPU streams), and the *dependencies* between tasks. It plays the role that
TorchRec's planner ``types.py`` plays there: the whole vocabulary lives here, and builders
(trace readers, workload synthesisers, transforms) and consumers (the simulator, kernel
models, reports) import it and nothing above it.

Storage is columnar: every task attribute is one numpy array of length ``n_tasks`` and every
edge attribute one array of length ``n_edges``. Builders append through
:class:`~predictor.graph.builder.GraphBuilder` (Python lists and block stamps, finalised once into
arrays); the simulator reads only arrays.

Conventions
-----------
* Times are seconds (float64), sizes bytes, work FLOPs. Unknown values are ``NaN``.
* The order of a processor's tasks in the arrays is the order the processor executes them
  (a CPU thread's program order, a stream's launch order). The simulator never reorders.
* A *collective group* ties the tasks of one collective across ranks (one member per rank);
  the simulator ends all members at the same moment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import pandas as pd

__all__ = [
    "Category",
    "ProcKind",
    "DepKind",
    "Overhead",
    "ExecutionGraph",
    "GraphError",
    "PARAM_COLUMNS",
]


class GraphError(ValueError):
    """An ExecutionGraph is malformed (bad index, cycle, inconsistent collective group)."""


class Category(IntEnum):
    """What a task spends its time on."""

    COMPUTE = 0  #: GEMM, convolution, attention: FLOP-bound GPU kernels
    MEMORY = 1  #: element-wise, embedding lookup, memcpy, concat: bandwidth-bound kernels
    COMMUNICATION = 2  #: collectives and point-to-point transfers between ranks
    SYNC = 3  #: blocking waits (cudaStreamSynchronize, barriers) on the CPU
    CPU = 4  #: host work: framework op dispatch, CUDA runtime calls, overhead gaps


class ProcKind(IntEnum):
    """What executes a task."""

    CPU_THREAD = 0
    GPU_STREAM = 1


class DepKind(IntEnum):
    """Dependency kinds of the Lumos paper (§3.2) plus data dependencies from the ET."""

    CPU_CPU = 0  #: same thread in program order, or one thread waiting for another
    CPU_GPU = 1  #: kernel launch: the kernel cannot start before its launch call has issued it
    GPU_CPU = 2  #: blocking sync: the CPU waits for the kernel to finish
    GPU_GPU = 3  #: stream order or cross-stream event (cudaEventRecord -> cudaStreamWaitEvent)
    DATA = 4  #: tensor produced by one op and consumed by another (execution trace)


class Overhead(IntEnum):
    """CPU overhead types of Lin et al. 2022 §III-C, used to time synthetic CPU tasks."""

    NONE = 0  #: the task is timed by its measured duration or a kernel model
    T1 = 1  #: gap between two top-level framework ops
    T2 = 2  #: from an op's start to its first kernel launch
    T3 = 3  #: from an op's last kernel launch to its end
    T4 = 4  #: one CUDA runtime call (cudaLaunchKernel, cudaMemcpyAsync, ...)
    T5 = 5  #: between two kernel launches of one op
    #: once per training step of a device-mode graph: the host's framework work outside every op (entering
    #: ``backward()`` and handing it to the autograd engine's device thread, waking when it ends,
    #: ``optimizer.step()``'s Python), calibrated by closing the calibration's own step (``CpuOverheads.step_s``)
    STEP = 6
    #: once per embedding table with a sparse gradient in a device-mode step: the host cost of its sparse
    #: backward and update beyond their ops' T's (``CpuOverheads.sparse_table_s``, closed by the calibration)
    SPARSE_TABLE = 7


#: Kernel-model parameters a task may carry (float64 columns, NaN where not applicable).
#: Units: element counts for shapes, bytes for sizes.
PARAM_COLUMNS: tuple[str, ...] = (
    "m",  # GEMM rows of the output
    "n",  # GEMM columns of the output
    "k",  # GEMM reduction dimension
    "k_strided",  # 1: no GEMM operand is contiguous along k (a weight gradient's tokens), so k sets no alignment
    "tiled",  # 1: a fused kernel priced as a GEMM that pads its own tiles (flash attention): no alignment cliff
    "batch",  # batch count of a batched GEMM, samples of an embedding lookup, or the outer slices of a
    # concatenation (the product of the dims before the concatenated one: each input is copied as that
    # many contiguous chunks)
    "streams",  # a batched GEMM run as separate GEMMs: how many run at a time (NaN: one batched kernel)
    "rows",  # embedding-table rows E
    "dim",  # embedding dimension D
    "pooling",  # mean pooling factor L (lookups per sample)
    "elements",  # elements touched by an element-wise op
    "msg_bytes",  # per-rank message size of a collective (max of sent/received)
    "net_bytes",  # of them, the bytes a rank sends through the network (DeepEP's dispatch: once per node)
    "world",  # ranks taking part in a collective
    "nodes",  # nodes a collective's group spans (NaN: the group fills nodes in order)
    "nic_share",  # traffic classes sharing the node's NICs while a collective crosses them (NaN: alone, 1)
    "dtype_bytes",  # bytes per element
    "parts",  # input tensors of a concatenation
    # reuse-factor histogram of an embedding lookup's batch (Lin et al. 2024 §III-E): fraction of
    # lookups whose row is accessed 1, 2, 3-4, 5-8, ... times in the batch
    *(f"rf{i}" for i in range(17)),
)

_CATEGORY_OF_COMM = int(Category.COMMUNICATION)


@dataclass
class ExecutionGraph:
    """Tasks, processors and dependencies of one training iteration (columnar).

    Task columns (length ``n_tasks``): ``rank``, ``proc`` (index into the processor table),
    ``name`` (index into ``names``), ``kind`` (index into ``kinds``: the op kind a kernel
    model keys on, e.g. ``"gemm"``, ``"embedding_bag_fwd"``, ``"all_to_all"``), ``category``
    (:class:`Category`), ``overhead`` (:class:`Overhead`), ``duration`` (measured seconds),
    ``flops``, ``bytes`` (bytes moved), ``group`` (collective group, -1 for none) and
    ``params`` (kernel-model parameters, see :data:`PARAM_COLUMNS`).

    Processor columns (length ``n_procs``): ``proc_rank``, ``proc_kind`` (:class:`ProcKind`),
    ``proc_names`` (e.g. ``"cpu"``, ``"stream 7"``).

    Edge columns (length ``n_edges``): ``edge_src``, ``edge_dst``, ``edge_kind`` (:class:`DepKind`).
    Processor order is implicit (array order within a processor) and is not stored as edges.
    """

    rank: np.ndarray
    proc: np.ndarray
    name: np.ndarray
    kind: np.ndarray
    category: np.ndarray
    overhead: np.ndarray
    duration: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    group: np.ndarray
    params: dict[str, np.ndarray]
    proc_rank: np.ndarray
    proc_kind: np.ndarray
    proc_names: list[str]
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_kind: np.ndarray
    names: list[str]
    kinds: list[str]
    meta: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ sizes
    @property
    def n_tasks(self) -> int:
        return int(self.rank.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.edge_src.shape[0])

    @property
    def n_procs(self) -> int:
        return int(self.proc_rank.shape[0])

    @property
    def n_ranks(self) -> int:
        return int(self.proc_rank.max()) + 1 if self.n_procs else 0

    @property
    def n_groups(self) -> int:
        return int(self.group.max()) + 1 if self.n_tasks and self.group.size else 0

    # ------------------------------------------------------------------ lookups
    def kind_id(self, kind: str) -> int:
        """Index of an op kind in ``kinds`` (-1 when the graph has no such task)."""
        try:
            return self.kinds.index(kind)
        except ValueError:
            return -1

    def kind_mask(self, *kinds: str) -> np.ndarray:
        """Boolean mask of the tasks whose op kind is one of ``kinds``."""
        ids = [self.kind_id(k) for k in kinds]
        ids = [i for i in ids if i >= 0]
        if not ids:
            return np.zeros(self.n_tasks, dtype=bool)
        return np.isin(self.kind, np.asarray(ids, dtype=self.kind.dtype))

    def param(self, column: str) -> np.ndarray:
        """A kernel-model parameter column (all NaN when no task sets it)."""
        col = self.params.get(column)
        if col is None:
            return np.full(self.n_tasks, np.nan)
        return col

    def is_gpu(self) -> np.ndarray:
        """Mask of tasks that run on a GPU stream (kernels, device collectives)."""
        return self.proc_kind[self.proc] == ProcKind.GPU_STREAM

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise :class:`GraphError` if indices, lengths or collective groups are inconsistent."""
        n = self.n_tasks
        cols = {
            "proc": self.proc,
            "name": self.name,
            "kind": self.kind,
            "category": self.category,
            "overhead": self.overhead,
            "duration": self.duration,
            "flops": self.flops,
            "bytes": self.bytes,
            "group": self.group,
        }
        for cname, col in cols.items():
            if col.shape != (n,):
                raise GraphError(f"task column {cname!r} has length {col.shape}, expected {n}")
        for pname, col in self.params.items():
            if col.shape != (n,):
                raise GraphError(f"param column {pname!r} has length {col.shape}, expected {n}")
        if n and (self.proc.min() < 0 or self.proc.max() >= self.n_procs):
            raise GraphError("a task refers to a processor that does not exist")
        if n and np.any(self.proc_rank[self.proc] != self.rank):
            raise GraphError("a task's rank differs from the rank of its processor")
        if self.n_edges:
            lo = min(self.edge_src.min(), self.edge_dst.min())
            hi = max(self.edge_src.max(), self.edge_dst.max())
            if lo < 0 or hi >= n:
                raise GraphError("an edge refers to a task that does not exist")
            if np.any(self.edge_src == self.edge_dst):
                raise GraphError("an edge connects a task to itself")
        grouped = self.group >= 0
        if grouped.any():
            g = self.group[grouped]
            r = self.rank[grouped]
            key = g.astype(np.int64) * (self.n_ranks + 1) + r
            if np.unique(key).size != key.size:
                raise GraphError("a collective group has two members on the same rank")

    # ------------------------------------------------------------------ views
    def tasks_frame(self) -> pd.DataFrame:
        """All tasks as a DataFrame (for analysis and tests, not for the hot loop)."""
        df = pd.DataFrame(
            {
                "rank": self.rank,
                "proc": self.proc,
                "processor": np.asarray(self.proc_names, dtype=object)[self.proc] if self.n_procs else [],
                "name": np.asarray(self.names, dtype=object)[self.name] if self.names else [],
                "kind": np.asarray(self.kinds, dtype=object)[self.kind] if self.kinds else [],
                "category": [Category(c).name.lower() for c in self.category],
                "overhead": self.overhead,
                "duration_s": self.duration,
                "flops": self.flops,
                "bytes": self.bytes,
                "group": self.group,
            }
        )
        for pname, col in self.params.items():
            df[pname] = col
        return df

    def edges_frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "src": self.edge_src,
                "dst": self.edge_dst,
                "kind": [DepKind(k).name for k in self.edge_kind],
            }
        )

    def to_networkx(self):  # pragma: no cover - convenience for analysis only
        """Export to a networkx DiGraph (analysis and export, never the simulator's input)."""
        import networkx as nx

        g = nx.DiGraph()
        for i in range(self.n_tasks):
            g.add_node(i, name=self.names[self.name[i]], rank=int(self.rank[i]))
        for s, d, k in zip(self.edge_src, self.edge_dst, self.edge_kind, strict=True):
            g.add_edge(int(s), int(d), kind=DepKind(k).name)
        return g

    def summary(self) -> dict:
        """Counts per category and rank, for logs and reports."""
        return {
            "tasks": self.n_tasks,
            "edges": self.n_edges,
            "ranks": self.n_ranks,
            "processors": self.n_procs,
            "collective_groups": self.n_groups,
            "by_category": {
                Category(c).name.lower(): int((self.category == c).sum()) for c in np.unique(self.category)
            },
        }


def concat_graphs(graphs: list[ExecutionGraph]) -> ExecutionGraph:
    """Stack independent graphs (e.g. one per rank) into one, renumbering tasks, processors,
    names, kinds and groups. Collective groups with the same id in different inputs are
    *merged* (``meta['group_keys']`` is not needed: builders give matching ids on purpose)."""
    if not graphs:
        raise GraphError("nothing to concatenate")
    names: dict[str, int] = {}
    kinds: dict[str, int] = {}
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("rank", "proc", "name", "kind", "category", "overhead",
                                                          "duration", "flops", "bytes", "group")}
    param_keys = sorted({k for g in graphs for k in g.params})
    params: dict[str, list[np.ndarray]] = {k: [] for k in param_keys}
    src, dst, ek = [], [], []
    proc_rank, proc_kind, proc_names = [], [], []
    t_off = 0
    p_off = 0
    for g in graphs:
        name_map = np.asarray([names.setdefault(s, len(names)) for s in g.names] or [0], dtype=np.int32)
        kind_map = np.asarray([kinds.setdefault(s, len(kinds)) for s in g.kinds] or [0], dtype=np.int32)
        parts["rank"].append(g.rank)
        parts["proc"].append(g.proc + p_off)
        parts["name"].append(name_map[g.name] if g.n_tasks else g.name)
        parts["kind"].append(kind_map[g.kind] if g.n_tasks else g.kind)
        for k in ("category", "overhead", "duration", "flops", "bytes", "group"):
            parts[k].append(getattr(g, k))
        for k in param_keys:
            params[k].append(g.params.get(k, np.full(g.n_tasks, np.nan)))
        src.append(g.edge_src + t_off)
        dst.append(g.edge_dst + t_off)
        ek.append(g.edge_kind)
        proc_rank.append(g.proc_rank)
        proc_kind.append(g.proc_kind)
        proc_names.extend(g.proc_names)
        t_off += g.n_tasks
        p_off += g.n_procs
    out = ExecutionGraph(
        **{k: np.concatenate(v) for k, v in parts.items()},
        params={k: np.concatenate(v) for k, v in params.items()},
        proc_rank=np.concatenate(proc_rank),
        proc_kind=np.concatenate(proc_kind),
        proc_names=proc_names,
        edge_src=np.concatenate(src).astype(np.int32),
        edge_dst=np.concatenate(dst).astype(np.int32),
        edge_kind=np.concatenate(ek).astype(np.int8),
        names=list(names),
        kinds=list(kinds),
        meta=dict(graphs[0].meta),
    )
    out.validate()
    return out


def is_communication(category: np.ndarray) -> np.ndarray:
    """Mask of communication tasks."""
    return category == _CATEGORY_OF_COMM
