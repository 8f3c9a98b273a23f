"""The graph of a pipeline stage at tensor-op level, as PredTOP §IV-B builds it from a Jaxpr.

We build it from PyTorch instead: :func:`trace_stage` runs ``make_fx`` (fake tensors, no
compute) over one micro-batch's forward *and* backward of a stage
(:func:`predictor.stage.gpt.stage_step_fn`), which gives an ATen-level FX graph — the
PyTorch counterpart of the Jaxpr equations PredTOP reads. :func:`graph_from_fx` turns it into
a :class:`StageGraph`:

* one node per FX node: ``placeholder`` -> *input* (parameters, activations, targets),
  ``get_attr`` -> *literal* (constant tensors), ``call_function`` -> *operator*, ``output``
  -> *output* (PredTOP Table I, "node type");
* edges are the data dependencies (an FX node's tensor arguments);
* **pruning (§IV-B4)**: ops that only re-describe a tensor — views, reshapes, transposes,
  expands, squeezes, slices, splits, ``getitem`` of a tuple, ``detach``, ``contiguous``,
  dtype conversions — are removed and their producers wired straight to their consumers, so
  connectivity is kept. Each kept node records its own output shape and dtype, so what a pruned
  op did is still visible as a change of shape/dtype between neighbours (the paper's argument).
  ``clone`` is *kept*: on CPU it is a real copy kernel that costs time.

Node features (PredTOP Table I) are assembled by :meth:`StageGraph.features`: the op-type
one-hot over the fixed vocabulary :data:`OP_VOCAB` (unknown ops share an ``other`` slot), the
output tensor dimensions log-scaled (``log2(1 + d)``, right-aligned in :data:`MAX_RANK` slots,
plus ``log2(1 + numel)``), the output dtype one-hot and the node-type one-hot.

Each operator node also records its arithmetic work (``flops``, counted from its FX inputs'
shapes: ``2 M N K`` per GEMM, ``4 B H S^2 D`` per attention forward and 2.5x that backward,
0 for the rest). :meth:`StageGraph.work` sums the graph's FLOPs, output bytes and operator
count — the inputs of the analytic anchor of :class:`~predictor.stage.model.StageLatencyModel`
(not node features: the network sees PredTOP Table I only).

The DAG-Transformer inputs are :meth:`StageGraph.reachability` (``R[u, v]`` = a directed path
``u -> v`` exists), :meth:`StageGraph.depth` (longest path from a source) and, for its optional
hop bias, :meth:`StageGraph.hop_distance` (shortest directed path, in edges). Nodes are stored
in a topological order (the FX order), so every edge goes from a lower to a higher index.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from predictor.sources.traces.ops import dtype_bytes

__all__ = [
    "DTYPE_VOCAB",
    "MAX_RANK",
    "NODE_KINDS",
    "N_FEATURES",
    "OP_VOCAB",
    "SHAPE_ONLY_OPS",
    "StageGraph",
    "graph_from_fx",
    "stage_graph",
    "trace_stage",
]

#: node types of PredTOP Table I
NODE_KINDS: tuple[str, ...] = ("input", "literal", "operator", "output")

#: ATen ops (overload stripped) that only change how a tensor is described, pruned as §IV-B4
SHAPE_ONLY_OPS: frozenset[str] = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "t",
        "transpose",
        "permute",
        "expand",
        "squeeze",
        "unsqueeze",
        "slice",
        "select",
        "split",
        "split_with_sizes",
        "unbind",
        "alias",
        "detach",
        "contiguous",
        "flatten",
        "unflatten",
        "as_strided",
        "_reshape_alias",
        "getitem",
        "_to_copy",
        "to",
        "type_as",
        "convert_element_type",
        "lift_fresh",
        "lift_fresh_copy",
    }
)

#: op types with their own one-hot slot (fixed so that a saved model stays valid); the last
#: slot, ``other``, takes every op not listed. Inputs/literals/outputs use their kind's name.
OP_VOCAB: tuple[str, ...] = (
    "input",
    "literal",
    "output",
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "matmul",
    "linear",
    "add",
    "sub",
    "mul",
    "div",
    "neg",
    "pow",
    "sqrt",
    "rsqrt",
    "exp",
    "log",
    "tanh",
    "sum",
    "mean",
    "amax",
    "where",
    "masked_fill",
    "native_layer_norm",
    "native_layer_norm_backward",
    "layer_norm",
    "gelu",
    "gelu_backward",
    "relu",
    "threshold_backward",
    "silu",
    "silu_backward",
    "_softmax",
    "_safe_softmax",
    "_softmax_backward_data",
    "_log_softmax",
    "_log_softmax_backward_data",
    "nll_loss_forward",
    "nll_loss_backward",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_cudnn_attention_backward",
    "embedding",
    "embedding_dense_backward",
    "cat",
    "stack",
    "clone",
    "copy_",
    "zeros",
    "zeros_like",
    "ones",
    "ones_like",
    "full",
    "full_like",
    "empty",
    "arange",
    "tril",
    "triu",
    "scalar_tensor",
    "index_select",
    "index_add",
    "gather",
    "scatter_add",
    "native_dropout",
    "native_dropout_backward",
    "other",
)
_OP_INDEX = {name: i for i, name in enumerate(OP_VOCAB)}

#: output dtypes with their own one-hot slot; the last, ``other``, takes the rest (and non-tensors)
DTYPE_VOCAB: tuple[str, ...] = (
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int64",
    "int32",
    "bool",
    "other",
)
_DTYPE_INDEX = {name: i for i, name in enumerate(DTYPE_VOCAB)}

#: output dimensions kept per node (right-aligned; leading dims of higher-rank tensors are folded in)
MAX_RANK = 4

#: bump when graph construction changes (keys the on-disk graph cache)
GRAPH_FORMAT_VERSION = 3

N_FEATURES = len(OP_VOCAB) + MAX_RANK + 1 + len(DTYPE_VOCAB) + len(NODE_KINDS)


@dataclass
class StageGraph:
    """A stage DAG, columnar: node ``i`` is ``op[i]`` with output ``shape[i]`` (nodes in topological order).

    ``shape`` is ``int64 [N, MAX_RANK]`` right-aligned, unused leading slots 0 (a scalar is all
    zeros); ``edges`` is ``int64 [E, 2]`` of ``(src, dst)`` with ``src < dst``; ``flops`` is
    ``float64 [N]``, each node's floating-point operations (0 where not counted).
    """

    op: list[str]
    kind: np.ndarray  # int8 [N], index into NODE_KINDS
    shape: np.ndarray  # int64 [N, MAX_RANK]
    dtype: list[str]
    edges: np.ndarray  # int64 [E, 2]
    meta: dict = field(default_factory=dict)
    flops: np.ndarray | None = None  # float64 [N]

    def __post_init__(self) -> None:
        n = len(self.op)
        self.flops = np.zeros(n) if self.flops is None else np.asarray(self.flops, dtype=np.float64).reshape(n)
        self.kind = np.asarray(self.kind, dtype=np.int8).reshape(n)
        self.shape = np.asarray(self.shape, dtype=np.int64).reshape(n, MAX_RANK)
        self.edges = np.asarray(self.edges, dtype=np.int64).reshape(-1, 2)
        if len(self.dtype) != n:
            raise ValueError(f"dtype has {len(self.dtype)} entries for {n} nodes")
        if self.edges.size and (self.edges.min() < 0 or self.edges.max() >= n):
            raise ValueError("edge endpoint out of range")
        if self.edges.size and np.any(self.edges[:, 0] >= self.edges[:, 1]):
            raise ValueError("edges must go from a lower to a higher node index (topological order)")

    @property
    def n_nodes(self) -> int:
        return len(self.op)

    @property
    def n_edges(self) -> int:
        return int(self.edges.shape[0])

    def features(self) -> np.ndarray:
        """``float32 [N, N_FEATURES]``: op one-hot | log2(1+dims) | log2(1+numel) | dtype one-hot | node-type one-hot."""
        n = self.n_nodes
        x = np.zeros((n, N_FEATURES), dtype=np.float32)
        other = _OP_INDEX["other"]
        op_idx = np.fromiter((_OP_INDEX.get(o, other) for o in self.op), dtype=np.int64, count=n)
        x[np.arange(n), op_idx] = 1.0
        c = len(OP_VOCAB)
        x[:, c : c + MAX_RANK] = np.log2(1.0 + self.shape)
        numel = np.where(self.shape > 0, self.shape, 1).prod(axis=1)
        x[:, c + MAX_RANK] = np.log2(1.0 + numel)
        c += MAX_RANK + 1
        dt_other = _DTYPE_INDEX["other"]
        dt_idx = np.fromiter((_DTYPE_INDEX.get(d, dt_other) for d in self.dtype), dtype=np.int64, count=n)
        x[np.arange(n), c + dt_idx] = 1.0
        c += len(DTYPE_VOCAB)
        x[np.arange(n), c + self.kind.astype(np.int64)] = 1.0
        return x

    def work(self) -> np.ndarray:
        """``float64 [3]``: total FLOPs, total bytes written by operator nodes, operator count.

        Bytes assume the output dtype's size (4 for float32; 8 for int64; 1 for bool).
        """
        op = self.kind == NODE_KINDS.index("operator")
        numel = np.where(self.shape > 0, self.shape, 1).prod(axis=1).astype(np.float64)
        size = np.nan_to_num(np.array([dtype_bytes(d) for d in self.dtype]), nan=4.0)
        return np.array([float(self.flops[op].sum()), float((numel * size)[op].sum()), float(op.sum())])

    def predecessors(self) -> list[np.ndarray]:
        """Per node, the sorted indices of its direct predecessors."""
        order = np.argsort(self.edges[:, 1], kind="stable")
        src, dst = self.edges[order, 0], self.edges[order, 1]
        bounds = np.searchsorted(dst, np.arange(self.n_nodes + 1))
        return [np.unique(src[bounds[i] : bounds[i + 1]]) for i in range(self.n_nodes)]

    def reachability(self) -> np.ndarray:
        """``bool [N, N]``: ``R[u, v]`` is True iff a directed path ``u -> v`` of >= 1 edge exists.

        Computed in topological order: ancestors(v) = union over predecessors p of ({p} | ancestors(p)).
        """
        n = self.n_nodes
        anc = np.zeros((n, n), dtype=bool)  # anc[v, u] = u reaches v
        for v, preds in enumerate(self.predecessors()):
            if preds.size:
                anc[v, preds] = True
                anc[v] |= anc[preds].any(axis=0)
        return anc.T.copy()

    def hop_distance(self) -> np.ndarray:
        """``int64 [N, N]``: edges on the shortest directed path ``u -> v`` (0 on the diagonal, -1: none).

        Computed in topological order: ``D[u, v] = 1 + min over predecessors p of v of D[u, p]``.
        """
        n = self.n_nodes
        big = np.iinfo(np.int64).max // 2
        dist = np.full((n, n), big, dtype=np.int64)  # dist[v, u]: from u to v
        for v, preds in enumerate(self.predecessors()):
            if preds.size:
                dist[v] = dist[preds].min(axis=0) + 1
            dist[v, v] = 0
        out = dist.T.copy()
        out[out >= big // 2] = -1
        return out

    def attention_mask(self) -> np.ndarray:
        """``bool [N, N]``: True where node ``u`` may attend to ``v`` (a path either way, or ``u == v``)."""
        r = self.reachability()
        return r | r.T | np.eye(self.n_nodes, dtype=bool)

    def depth(self) -> np.ndarray:
        """``int64 [N]``: number of edges on the longest path from any source to the node."""
        d = np.zeros(self.n_nodes, dtype=np.int64)
        for v, preds in enumerate(self.predecessors()):
            if preds.size:
                d[v] = d[preds].max() + 1
        return d

    def op_counts(self) -> dict[str, int]:
        """How many nodes of each op type (a quick summary)."""
        names, counts = np.unique(np.asarray(self.op, dtype=object), return_counts=True)
        return {str(k): int(c) for k, c in zip(names, counts, strict=True)}

    def to_dict(self) -> dict:
        return {
            "op": list(self.op),
            "kind": self.kind.tolist(),
            "shape": self.shape.tolist(),
            "dtype": list(self.dtype),
            "edges": self.edges.tolist(),
            "meta": dict(self.meta),
            "flops": self.flops.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> StageGraph:
        return cls(
            d["op"],
            np.asarray(d["kind"]),
            np.asarray(d["shape"]),
            d["dtype"],
            np.asarray(d["edges"]),
            d.get("meta", {}),
            None if d.get("flops") is None else np.asarray(d["flops"]),
        )


def _op_name(target: object) -> str:
    """``aten.addmm.default`` -> ``addmm``; ``operator.getitem`` -> ``getitem``."""
    if target is operator.getitem:
        return "getitem"
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        return str(getattr(packet, "__name__", packet)).split(".")[-1]
    return str(getattr(target, "__name__", target)).split(".")[-1]


def _first_tensor(val: object) -> torch.Tensor | None:
    if isinstance(val, torch.Tensor):
        return val
    if isinstance(val, list | tuple):
        for v in val:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _shape_row(shape: Sequence[int]) -> list[int]:
    dims = [int(d) for d in shape]
    if len(dims) > MAX_RANK:  # fold leading dims into the first kept slot
        dims = [math.prod(dims[: len(dims) - MAX_RANK + 1]), *dims[len(dims) - MAX_RANK + 1 :]]
    return [0] * (MAX_RANK - len(dims)) + dims


def _tensor_args(node: torch.fx.Node) -> Iterable[torch.fx.Node]:
    seen: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: seen.append(a))
    return seen


def _arg_shape(node: torch.fx.Node, i: int) -> tuple[int, ...] | None:
    args = node.args
    if i >= len(args) or not isinstance(args[i], torch.fx.Node):
        return None
    val = args[i].meta.get("val")
    return tuple(int(d) for d in val.shape) if isinstance(val, torch.Tensor) else None


def node_flops(node: torch.fx.Node, name: str) -> float:
    """Floating-point operations of one FX call (GEMMs and attention; 0 for everything else)."""
    if name in ("mm", "bmm", "addmm", "baddbmm"):
        off = 1 if name in ("addmm", "baddbmm") else 0
        a, b = _arg_shape(node, off), _arg_shape(node, off + 1)
        if a is None or b is None or len(a) < 2 or len(b) < 2:
            return 0.0
        return 2.0 * math.prod(a) * b[-1]
    if "scaled_dot_product" in name:
        q, k = _arg_shape(node, 0), _arg_shape(node, 1)
        if q is None or k is None or len(q) < 2:
            return 0.0
        fwd = 4.0 * math.prod(q) * k[-2]  # QK^T and PV: 2 x (2 B H S_q S_k D)
        causal = any(v is True for v in list(node.args[2:]) + list(node.kwargs.values()))
        fwd *= 0.5 if causal else 1.0
        return 2.5 * fwd if name.endswith("_backward") else fwd
    return 0.0


def graph_from_fx(gm: torch.fx.GraphModule, prune: bool = True, meta: dict | None = None) -> StageGraph:
    """A :class:`StageGraph` from an FX graph, with shape-only ops pruned when ``prune``.

    A pruned node forwards the set of kept nodes it depends on, so every consumer of it is wired
    to those producers directly (connectivity is kept; duplicate edges are merged).
    """
    ops: list[str] = []
    kinds: list[int] = []
    shapes: list[list[int]] = []
    dtypes: list[str] = []
    flops: list[float] = []
    edges: set[tuple[int, int]] = set()
    sources: dict[torch.fx.Node, tuple[int, ...]] = {}  # fx node -> kept node ids it stands for
    for node in gm.graph.nodes:
        preds: set[int] = set()
        for a in _tensor_args(node):
            preds.update(sources.get(a, ()))
        if node.op == "placeholder":
            kind, name = "input", "input"
        elif node.op == "get_attr":
            kind, name = "literal", "literal"
        elif node.op == "output":
            kind, name = "output", "output"
        else:
            kind, name = "operator", _op_name(node.target)
            if prune and name in SHAPE_ONLY_OPS:
                sources[node] = tuple(sorted(preds))
                continue
        idx = len(ops)
        val = _first_tensor(node.meta.get("val"))
        ops.append(name)
        kinds.append(NODE_KINDS.index(kind))
        shapes.append(_shape_row(val.shape) if val is not None else [0] * MAX_RANK)
        dtypes.append(str(val.dtype).removeprefix("torch.") if val is not None else "other")
        flops.append(node_flops(node, name) if kind == "operator" else 0.0)
        edges.update((p, idx) for p in preds)
        sources[node] = (idx,)
    edge_arr = np.array(sorted(edges), dtype=np.int64).reshape(-1, 2)
    return StageGraph(
        ops,
        np.array(kinds),
        np.array(shapes, dtype=np.int64).reshape(-1, MAX_RANK),
        dtypes,
        edge_arr,
        meta or {},
        np.array(flops, dtype=np.float64),
    )


def trace_stage(spec: object) -> torch.fx.GraphModule:
    """ATen-level FX graph of one micro-batch's forward + backward of ``spec`` (a ``StageSpec``).

    Weights are allocated uninitialised and tracing uses fake tensors, so nothing is computed;
    the CPU device is kept so that the traced kernels (e.g. the CPU flash-attention op) are the
    ones the CPU runs.
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    from .gpt import build_stage_module, stage_inputs, stage_step_fn

    module = build_stage_module(spec, "meta").to_empty(device="cpu")  # type: ignore[arg-type]
    inputs = stage_inputs(spec, "cpu")  # type: ignore[arg-type]
    params = dict(module.named_parameters())
    return make_fx(stage_step_fn(module), tracing_mode="fake")(params, inputs)


def stage_graph(spec: object, prune: bool = True) -> StageGraph:
    """Trace ``spec`` (a ``StageSpec``) and build its (pruned) :class:`StageGraph`."""
    gm = trace_stage(spec)
    meta = spec.to_dict() if hasattr(spec, "to_dict") else {}
    return graph_from_fx(gm, prune=prune, meta=meta)
