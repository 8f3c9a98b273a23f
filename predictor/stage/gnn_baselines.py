"""GCN and GAT baselines of PredTOP §VII-D, in plain torch, with the same features and head.

Both pass messages along the stage graph's edges taken as undirected, with self loops, over a
batch concatenated into one disjoint graph (:func:`~predictor.stage.batching.collate_sparse`);
each layer costs ``O(E d)``. After the layers: global add pool and the same MLP head as the DAG
Transformer. PredTOP's settings are the defaults: GCN 6 layers of width 256, GAT 6 layers of
width 32 (here 4 heads of 8 channels, concatenated).

* :class:`GCN` — Kipf & Welling: ``h' = ReLU(D^-1/2 (A + I) D^-1/2 h W)``.
* :class:`GAT` — Velickovic et al.: per head, ``e_uv = LeakyReLU(a_s . W h_u + a_d . W h_v)``,
  softmax over each node's neighbours, weighted sum of ``W h_u``; ELU between layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .batching import SparseBatch, collate_sparse

__all__ = ["GAT", "GCN"]


def _undirected_with_self_loops(edges: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    loops = torch.arange(n)
    src = torch.cat([edges[0], edges[1], loops])
    dst = torch.cat([edges[1], edges[0], loops])
    return src, dst


def _add_pool(h: torch.Tensor, batch: torch.Tensor, n_graphs: int) -> torch.Tensor:
    return torch.zeros(n_graphs, h.shape[1], dtype=h.dtype).index_add_(0, batch, h)


def _mlp_head(dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 1))


class _GCNLayer(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(
        self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, norm: torch.Tensor
    ) -> torch.Tensor:
        m = self.lin(h)
        return torch.zeros_like(m).index_add_(0, dst, m[src] * norm.unsqueeze(-1))


class GCN(nn.Module):
    """Graph convolution network -> add pool -> MLP head."""

    collate = staticmethod(collate_sparse)

    def __init__(self, n_features: int, dim: int = 256, layers: int = 6, pool_scale: float = 0.01) -> None:
        super().__init__()
        self.pool_scale = pool_scale
        self.layers = nn.ModuleList(_GCNLayer(n_features if i == 0 else dim, dim) for i in range(layers))
        self.head = _mlp_head(dim)

    def forward(self, batch: SparseBatch) -> torch.Tensor:
        n = batch.x.shape[0]
        src, dst = _undirected_with_self_loops(batch.edges, n)
        deg = torch.zeros(n).index_add_(0, dst, torch.ones(dst.shape[0]))
        norm = deg[src].rsqrt() * deg[dst].rsqrt()
        h = batch.x
        for layer in self.layers:
            h = F.relu(layer(h, src, dst, norm))
        pooled = _add_pool(h, batch.batch, batch.n_graphs) * self.pool_scale
        return self.head(pooled).squeeze(-1)


class _GATLayer(nn.Module):
    def __init__(self, d_in: int, heads: int, channels: int) -> None:
        super().__init__()
        self.heads, self.channels = heads, channels
        self.lin = nn.Linear(d_in, heads * channels, bias=False)
        self.att_src = nn.Parameter(torch.randn(heads, channels) * channels**-0.5)
        self.att_dst = nn.Parameter(torch.randn(heads, channels) * channels**-0.5)
        self.bias = nn.Parameter(torch.zeros(heads * channels))

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        n = h.shape[0]
        w = self.lin(h).view(n, self.heads, self.channels)
        score = F.leaky_relu((w * self.att_src).sum(-1)[src] + (w * self.att_dst).sum(-1)[dst], 0.2)  # [E, H]
        top = torch.full((n, self.heads), -torch.inf).scatter_reduce(
            0, dst.unsqueeze(-1).expand_as(score), score, reduce="amax", include_self=True
        )
        ex = torch.exp(score - top[dst])
        denom = torch.zeros(n, self.heads).index_add_(0, dst, ex)
        alpha = ex / denom[dst]
        out = torch.zeros_like(w).index_add_(0, dst, w[src] * alpha.unsqueeze(-1))
        return out.reshape(n, self.heads * self.channels) + self.bias


class GAT(nn.Module):
    """Graph attention network -> add pool -> MLP head."""

    collate = staticmethod(collate_sparse)

    def __init__(
        self, n_features: int, dim: int = 32, layers: int = 6, heads: int = 4, pool_scale: float = 0.01
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"width {dim} is not divisible by {heads} heads")
        self.pool_scale = pool_scale
        self.layers = nn.ModuleList(
            _GATLayer(n_features if i == 0 else dim, heads, dim // heads) for i in range(layers)
        )
        self.head = _mlp_head(dim)

    def forward(self, batch: SparseBatch) -> torch.Tensor:
        src, dst = _undirected_with_self_loops(batch.edges, batch.x.shape[0])
        h = batch.x
        for layer in self.layers:
            h = F.elu(layer(h, src, dst))
        pooled = _add_pool(h, batch.batch, batch.n_graphs) * self.pool_scale
        return self.head(pooled).squeeze(-1)
