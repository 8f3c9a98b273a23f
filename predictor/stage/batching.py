"""Graphs prepared once for the networks, and the two ways a list of them becomes a batch.

A :class:`PreparedGraph` holds the (normalised) node features, the reachability attention mask,
the signed hop distances, the node depths and the edge list of one :class:`~predictor.stage.graph.StageGraph`, computed
once and reused by every model and epoch.

* :func:`collate_dense` pads graphs to the largest node count of the batch — what the DAG
  Transformer's masked attention needs (``[B, N, N]`` masks). Padding nodes attend only to
  themselves and are left out of the pooling.
* :func:`collate_sparse` concatenates graphs into one disjoint graph with an edge list and a
  node -> graph index — what the message-passing GCN/GAT baselines need (cost ``O(E d)``
  rather than ``O(N^2 d)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .graph import StageGraph

__all__ = ["DenseBatch", "PreparedGraph", "SparseBatch", "collate_dense", "collate_sparse", "prepare"]


@dataclass
class PreparedGraph:
    """Network inputs of one graph: ``x`` [N, F] float32, ``mask`` [N, N] bool, ``depth`` [N], ``edges`` [E, 2].

    ``hops`` [N, N] int16: signed shortest-path length between two nodes, ``+d`` when ``v`` is
    ``d`` edges downstream of ``u``, ``-d`` when upstream, 0 on the diagonal and between nodes
    with no path (those pairs are masked out anyway).
    """

    x: np.ndarray
    mask: np.ndarray
    depth: np.ndarray
    edges: np.ndarray
    work: np.ndarray | None = None  #: :meth:`StageGraph.work` (FLOPs, bytes, operators)
    hops: np.ndarray | None = None

    @property
    def n_nodes(self) -> int:
        return int(self.x.shape[0])


def prepare(
    graph: StageGraph, mean: np.ndarray | None = None, std: np.ndarray | None = None
) -> PreparedGraph:
    """Features (standardised column-wise by ``mean``/``std`` when given), mask, depth and edges."""
    x = graph.features()
    if mean is not None and std is not None:
        x = (x - mean) / std
    # one shortest-path pass gives both the hops and the attention mask (a path either way, or u == v:
    # what StageGraph.attention_mask computes from the reachability)
    d = graph.hop_distance()
    mask = (d >= 0) | (d.T >= 0)
    hops = np.where(d > 0, d, 0) - np.where(d.T > 0, d.T, 0)
    return PreparedGraph(x.astype(np.float32), mask, graph.depth(), graph.edges.copy(), graph.work(),
                         np.clip(hops, -32767, 32767).astype(np.int16))


@dataclass
class DenseBatch:
    """Padded batch: ``x`` [B, N, F], ``attn`` [B, 1, N, N] (True = may attend), ``depth`` [B, N],
    ``node_mask`` [B, N], ``pred`` [B, N, N] (row ``v``: ``1 / in-degree`` at each direct predecessor of ``v``),
    ``hops`` [B, N, N] int64 (:class:`PreparedGraph`'s signed hop distances, 0 on padding)."""

    x: torch.Tensor
    attn: torch.Tensor
    depth: torch.Tensor
    node_mask: torch.Tensor
    pred: torch.Tensor
    hops: torch.Tensor


@dataclass
class SparseBatch:
    """Disjoint union: ``x`` [sum N, F], ``edges`` [2, sum E] (src, dst), ``batch`` [sum N], ``n_graphs``."""

    x: torch.Tensor
    edges: torch.Tensor
    batch: torch.Tensor
    n_graphs: int


def collate_dense(graphs: Sequence[PreparedGraph]) -> DenseBatch:
    """Pad ``graphs`` to a common node count."""
    b = len(graphs)
    n = max(g.n_nodes for g in graphs)
    f = graphs[0].x.shape[1]
    x = np.zeros((b, n, f), dtype=np.float32)
    attn = np.zeros((b, n, n), dtype=bool)
    attn[:, np.arange(n), np.arange(n)] = True
    depth = np.zeros((b, n), dtype=np.int64)
    node_mask = np.zeros((b, n), dtype=bool)
    pred = np.zeros((b, n, n), dtype=np.float32)
    hops = np.zeros((b, n, n), dtype=np.int64)
    for i, g in enumerate(graphs):
        k = g.n_nodes
        x[i, :k] = g.x
        attn[i, :k, :k] = g.mask
        depth[i, :k] = g.depth
        node_mask[i, :k] = True
        if g.hops is not None:
            hops[i, :k, :k] = g.hops
        if g.edges.size:
            src, dst = g.edges[:, 0], g.edges[:, 1]
            indeg = np.bincount(dst, minlength=k).astype(np.float32)
            pred[i, dst, src] = 1.0 / indeg[dst]
    return DenseBatch(
        torch.from_numpy(x),
        torch.from_numpy(attn).unsqueeze(1),
        torch.from_numpy(depth),
        torch.from_numpy(node_mask),
        torch.from_numpy(pred),
        torch.from_numpy(hops),
    )


def collate_sparse(graphs: Sequence[PreparedGraph]) -> SparseBatch:
    """Concatenate ``graphs``; edge indices are offset by each graph's first node."""
    offsets = np.cumsum([0] + [g.n_nodes for g in graphs])
    x = np.concatenate([g.x for g in graphs], axis=0)
    edges = np.concatenate([g.edges + offsets[i] for i, g in enumerate(graphs)], axis=0).reshape(-1, 2)
    batch = np.repeat(np.arange(len(graphs)), [g.n_nodes for g in graphs])
    return SparseBatch(
        torch.from_numpy(x),
        torch.from_numpy(np.ascontiguousarray(edges.T)),
        torch.from_numpy(batch),
        len(graphs),
    )
