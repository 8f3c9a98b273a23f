"""DAG Transformer stage-latency network (PredTOP §IV-A/§IV-B5, after Luo et al.'s DAG Transformer).

* **Reachability attention (DAGRA)**: node ``u`` attends to node ``v`` only when a directed
  path joins them in either direction (or ``u == v``) — PredTOP eq. 1 with ``k = inf`` — so one
  layer already exchanges information along whole dependency chains, not just neighbours.
* **Depth positional encoding (DAGPE)**: the sinusoidal encoding of each node's depth (longest
  path from a source) is added to its input embedding.
* **Global add pool** (eq. 2): the graph embedding is the sum of node embeddings — latency is
  additive over ops — followed by an MLP head with ReLUs and one output.

PredTOP's best setting is 4 layers of width 64 (§IV-B6); those are this class's defaults.
:class:`~predictor.stage.model.StageLatencyModel` uses 2 layers of width 32 unless told otherwise
(``DEFAULT_NETWORKS``), which trained better within a CPU budget on the CPU dataset.
``input_mix=True`` (off by default, not in PredTOP) also adds each node's direct inputs' mean
embedding to its own; it did not help on the CPU dataset.

``hop_bias=K`` (off when 0; not in PredTOP, Graphormer's spatial encoding applied to DAGRA): each
layer adds a learned per-head bias to the attention logit of ``u -> v`` by their signed
shortest-path distance, clipped to ``[-K, K]`` (upstream and downstream kept apart). Reachability
attention alone weighs a direct input like a node 30 ops away; the bias lets a head look mostly
at a node's neighbourhood (PredTOP eq. 1's ``k``-hop receptive field, learned instead of fixed)
while still seeing whole chains.

``local=True`` (off by default; Luo et al. combine DAG attention with the structure-aware
transformer, SAT, the same way): each layer's queries and keys are computed from the node's
embedding plus one message-passing step over its direct inputs and direct consumers, so attention
weights can depend on a node's neighbourhood (e.g. a matmul's contraction size, visible only in
its inputs' shapes); values stay the node's own embedding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .batching import DenseBatch, collate_dense

__all__ = ["DAGTransformer", "depth_encoding"]


def depth_encoding(depth: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal encoding ``[..., dim]`` of integer depths (sin on even, cos on odd channels)."""
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / max(half, 1))
    angle = depth.to(torch.float32).unsqueeze(-1) * freq
    enc = torch.zeros(*depth.shape, dim)
    enc[..., 0 : 2 * half : 2] = torch.sin(angle)
    enc[..., 1 : 2 * half : 2] = torch.cos(angle)
    return enc


class _ReachabilityAttentionLayer(nn.Module):
    """Pre-LayerNorm transformer layer whose attention is restricted by a boolean mask."""

    def __init__(self, dim: int, heads: int, ff_mult: int = 2, hop_bias: int = 0, local: bool = False) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"width {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.hop_bias = hop_bias
        # bias[bucket, head]; bucket = clip(signed hops, -K, K) + K; zero-initialised (starts as plain DAGRA)
        self.bias = nn.Parameter(torch.zeros(2 * hop_bias + 1, heads)) if hop_bias > 0 else None
        # structure-aware queries / keys (SAT-style): one message-passing step over the direct
        # inputs and the direct consumers before the attention
        self.loc_in = nn.Linear(dim, dim) if local else None
        self.loc_out = nn.Linear(dim, dim) if local else None
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, ff_mult * dim), nn.ReLU(), nn.Linear(ff_mult * dim, dim))

    def forward(
        self,
        h: torch.Tensor,
        attn: torch.Tensor,
        hops: torch.Tensor | None = None,
        pred: torch.Tensor | None = None,
        succ: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, n, d = h.shape
        x = self.ln1(h)
        if self.loc_in is not None and pred is not None and succ is not None:
            s = x + self.loc_in(torch.bmm(pred, x)) + self.loc_out(torch.bmm(succ, x))
            w, bias = self.qkv.weight, self.qkv.bias
            qk = F.linear(s, w[: 2 * d], bias[: 2 * d]).view(b, n, 2, self.heads, d // self.heads)
            vv = F.linear(x, w[2 * d :], bias[2 * d :]).view(b, n, 1, self.heads, d // self.heads)
            q, k, v = torch.cat([qk, vv], dim=2).permute(2, 0, 3, 1, 4)
        else:
            q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = attn
        if self.bias is not None and hops is not None:
            bucket = hops.clamp(-self.hop_bias, self.hop_bias) + self.hop_bias  # [B, N, N]
            logit_bias = self.bias[bucket].permute(0, 3, 1, 2)  # [B, H, N, N]
            mask = logit_bias.masked_fill(~attn, float("-inf"))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = h + self.out(a.transpose(1, 2).reshape(b, n, d))
        return h + self.ff(self.ln2(h))


class DAGTransformer(nn.Module):
    """Node features -> reachability-masked transformer layers -> add pool -> MLP -> one scalar per graph."""

    collate = staticmethod(collate_dense)

    def __init__(
        self,
        n_features: int,
        dim: int = 64,
        layers: int = 4,
        heads: int = 4,
        pool_scale: float = 0.01,
        input_mix: bool = False,
        hop_bias: int = 0,
        local: bool = False,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.pool_scale = pool_scale
        self.embed = nn.Linear(n_features, dim)
        # optional: add the mean embedding of each node's direct inputs to its own (a node's
        # output shape does not say its input shapes, e.g. a matmul's contraction size)
        self.mix = nn.Linear(dim, dim) if input_mix else None
        self.local = local
        self.layers = nn.ModuleList(
            _ReachabilityAttentionLayer(dim, heads, hop_bias=hop_bias, local=local) for _ in range(layers)
        )
        self.head = nn.Sequential(
            nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 1)
        )

    def node_embeddings(self, batch: DenseBatch) -> torch.Tensor:
        """``[B, N, dim]`` embeddings after the last layer (padding rows included).

        Not layer-normalised: a node's embedding must be free to be large when the node is
        expensive, since the add pool sums what the nodes contribute.
        """
        e = self.embed(batch.x)
        h = e + depth_encoding(batch.depth, self.dim)
        if self.mix is not None:
            h = h + self.mix(torch.bmm(batch.pred, e))
        pred = succ = None
        if self.local:
            pred = batch.pred
            adj_t = (batch.pred > 0).to(batch.pred.dtype).transpose(1, 2)  # row u: u's direct consumers
            succ = adj_t / adj_t.sum(dim=-1, keepdim=True).clamp(min=1.0)
        for layer in self.layers:
            h = layer(h, batch.attn, batch.hops, pred, succ)
        return h

    def forward(self, batch: DenseBatch) -> torch.Tensor:
        """``[B]`` outputs (in the model's target space, see :mod:`predictor.stage.model`)."""
        h = self.node_embeddings(batch) * batch.node_mask.unsqueeze(-1)
        pooled = (
            h.sum(dim=1) * self.pool_scale
        )  # global add pool (a constant scale keeps the head's inputs O(1))
        return self.head(pooled).squeeze(-1)
