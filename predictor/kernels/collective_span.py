"""Collectives whose group may span several nodes: latency + bandwidth on the links the group uses.

:class:`~predictor.kernels.collective.PiecewiseCollective` picks the link from the group size
alone (NVLink when ``world <= devices_per_node``). In 3D-parallel training that is wrong for
strided groups: with TP=8 on 8-GPU nodes, a data-parallel group of 2 has one rank on each of
two nodes and every byte crosses InfiniBand. This model reads one more task column,
``nodes`` (how many nodes the group spans), and times the collective on the links it uses:

* one node: NVLink/intra-node bandwidth, ring wire factor (``2 (n-1)/n`` for all-reduce,
  ``(n-1)/n`` for all-gather / reduce-scatter / all-to-all);
* ``nodes > 1`` with ``k = world / nodes`` ranks per node: a ring (all-reduce, all-gather,
  reduce-scatter, broadcast) runs ``k`` rings side by side, one through each rank's NIC, so
  its bus bandwidth is ``min(intra, k * inter)`` per rank; an all-to-all sends the
  ``(world - k) / world`` share of each rank's message off-node through its own NIC and the
  rest over NVLink, whichever takes longer; a send/recv pair uses one NIC. Every algorithm
  step pays the inter-node latency.

Uncalibrated, the time is the latency-bandwidth (Hockney) line ``ts + m / bw_max`` itself: the
analytic piecewise-sigmoid default of :func:`~predictor.kernels.collective.analytic_params`
joins ``ts`` and that line over a 256x range of sizes and lies above it in between (a 25 MB
all-reduce over 8 NVLink A100s: ~390 us against ~175 us on the line, and NCCL's published
~230 GB/s bus bandwidth gives ~190 us). Calibrated single-node curves (fitted
:class:`~predictor.kernels.collective.PiecewiseSigmoid` parameters for ``(kind, world)``)
are used as fitted. Bandwidths are the platform's per-device, one-direction figures.
"""

from __future__ import annotations

import numpy as np

from predictor.kernels.base import TaskView
from predictor.kernels.collective import PiecewiseCollective, latency_steps, wire_factor
from predictor.platforms.schema import Platform

__all__ = ["SpanAwareCollective", "alpha_beta", "NODES_COLUMN"]

#: extra task column read by this model: number of nodes the collective's group spans
NODES_COLUMN = "nodes"


def alpha_beta(kind: str, world: int, nodes: int, platform: Platform) -> tuple[float, float]:
    """(start-up seconds ``ts``, effective bytes/s ``bw_max``) of a collective of ``world`` ranks on ``nodes`` nodes."""
    ic = platform.interconnect
    intra, inter = ic.intra_node_bandwidth_bytes_per_s, ic.inter_node_bandwidth_bytes_per_s
    if nodes <= 1:
        ts = max(latency_steps(kind, world) * ic.intra_node_latency_s, platform.kernel_floor_s)
        return ts, intra / wire_factor(kind, world)
    k = max(world / nodes, 1.0)
    if kind == "all_to_all":
        off = (world - k) / world / inter
        on = (k - 1.0) / world / intra
        bw_max = 1.0 / max(off, on, 1e-30)
    elif kind == "send_recv":
        bw_max = inter
    else:
        bw_max = min(intra, k * inter) / wire_factor(kind, world)
    ts = max(latency_steps(kind, world) * ic.inter_node_latency_s, platform.kernel_floor_s)
    return ts, bw_max


class SpanAwareCollective(PiecewiseCollective):
    """Collectives timed on the links their group spans (the ``nodes`` column; see the module doc)."""

    name = "span-aware-collective"

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        m = np.nan_to_num(tasks.get("msg_bytes"), nan=0.0)
        world = np.nan_to_num(tasks.get("world", 1.0), nan=1.0).astype(np.int64)
        nodes = tasks.get(NODES_COLUMN)
        dpn = platform.devices_per_node
        # without a nodes value: the group fills nodes in order (the base model's assumption)
        n_nodes = np.where(np.isfinite(nodes), nodes, np.ceil(world / dpn)).astype(np.int64)
        kind = tasks.kind or "all_reduce"
        out = np.zeros(len(tasks))
        for w, n in {(int(a), int(b)) for a, b in zip(world, n_nodes, strict=True)}:
            sel = (world == w) & (n_nodes == n)
            if w <= 1:
                continue  # a collective over one rank moves nothing
            fitted = self.params.get((kind, w))
            if fitted is not None and n <= 1:
                out[sel] = fitted(m[sel])
                continue
            ts, bw = alpha_beta(kind, w, n, platform)
            out[sel] = ts + m[sel] / bw
        return out
