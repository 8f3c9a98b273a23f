"""Collectives (all-reduce, all-to-all, all-gather, reduce-scatter, send/recv): the piecewise model
of Lin et al. 2024, eq. 2-4.

Latency as a function of the per-rank message size ``m`` (bytes; for all-to-all the "max of
max" rule: the largest of sent/received over all ranks) has three regions:

* ``m <= m1``: constant start-up latency ``ts``;
* ``m1 < m < m2``: ``log10 t = L / (1 + exp(-k (log2 m - x0))) + b`` (the S-shaped bandwidth
  ramp);
* ``m >= m2``: ``ts + m / bw_max`` (saturated bandwidth).

Eight parameters per collective (``ts, m1, m2, bw_max, L, x0, k, b``), fitted by
:func:`fit_piecewise_sigmoid` from microbenchmarks (``tuner calibrate``). Uncalibrated, a
collective is timed on the latency-bandwidth line ``ts + m / bw_max`` of the links its group
spans (:func:`alpha_beta`): ring algorithms move ``2(n-1)/n * m`` bytes per rank for
all-reduce and ``(n-1)/n * m`` for the others. (A sigmoid joining ``ts`` and that line over a
wide range lies above the line in between — 2x for a 25 MB all-reduce on 8 A100s — so the
analytic default is the line itself.)

Platforms whose interconnect sets ``collective_model: nccl`` are timed instead by NCCL's own
cost model (:func:`nccl_seconds`, after ``src/graph/tuning.cc`` of NCCL 2.8-2.18): for each
algorithm (ring; tree for all-reduce across nodes) and protocol (LL, LL128, Simple) a latency
``base + steps x per-hop latency`` (NVLink hops and network hops priced apart) and a bus
bandwidth (the NVLink bus rate NCCL reaches inside a node; across nodes the group's share of the
node's NICs), and the fastest pair wins — so small messages ride LL's low latency, large ones
Simple's bandwidth, and deep node counts the tree's ``log2(nodes)`` latency. LL128 is priced inside
a node only: NCCL turns it on across nodes only when every GPU reaches its NIC through its own
PCIe switch (``typeInter <= PATH_PXB``), not on the many clusters whose NICs hang off the CPU's
root complex, so a TP group spanning nodes pays Simple's plateau latency. A group spanning
nodes sends through ``ranks per node x NICs per device`` adapters; ``nic_share`` (a task
parameter, default 1) divides them among traffic classes that cross the network at the same time.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.platforms.schema import Platform

COLLECTIVES = ("all_reduce", "all_to_all", "all_gather", "reduce_scatter", "send_recv", "broadcast", "ep_dispatch")


@dataclass(frozen=True)
class PiecewiseSigmoid:
    """The 8 parameters of eq. 2-4 (seconds, bytes, bytes/s; x0 in log2 bytes)."""

    ts: float
    m1: float
    m2: float
    bw_max: float
    L: float
    x0: float
    k: float
    b: float

    def __call__(self, m: np.ndarray) -> np.ndarray:
        m = np.asarray(m, dtype=np.float64)
        x = np.log2(np.maximum(m, 1.0))
        mid = 10.0 ** (self.L / (1.0 + np.exp(np.clip(-self.k * (x - self.x0), -60.0, 60.0))) + self.b)
        big = self.ts + m / self.bw_max
        return np.where(m <= self.m1, self.ts, np.where(m >= self.m2, big, mid))

    @classmethod
    def continuous(cls, ts: float, bw_max: float, m1: float, m2: float, steepness: float = 8.0) -> PiecewiseSigmoid:
        """The member of the family that joins ``ts`` at ``m1`` and ``ts + m/bw_max`` at ``m2``."""
        x1, x2 = math.log2(m1), math.log2(m2)
        x0 = 0.5 * (x1 + x2)
        k = steepness / max(x2 - x1, 1e-9)
        y1 = math.log10(ts)
        y2 = math.log10(ts + m2 / bw_max)
        s1 = 1.0 / (1.0 + math.exp(-k * (x1 - x0)))
        s2 = 1.0 / (1.0 + math.exp(-k * (x2 - x0)))
        L = (y2 - y1) / (s2 - s1)
        return cls(ts=ts, m1=m1, m2=m2, bw_max=bw_max, L=L, x0=x0, k=k, b=y1 - L * s1)


def wire_factor(kind: str, world: int) -> float:
    """Bytes each rank sends per byte of message for a ring/pairwise algorithm."""
    n = max(world, 1)
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_to_all", "all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def latency_steps(kind: str, world: int) -> int:
    """Sequential communication steps of the algorithm (each pays the link latency)."""
    n = max(world, 1)
    if kind == "all_reduce":
        return 2 * (n - 1)
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return n - 1
    return 1


def alpha_beta(kind: str, world: int, nodes: int, platform: Platform) -> tuple[float, float]:
    """Uncalibrated (start-up seconds ``ts``, effective bytes/s ``bw_max``) of a collective of ``world``
    ranks spanning ``nodes`` nodes, on the links that group uses.

    * one node: intra-node (NVLink) bandwidth and latency, ring wire factor;
    * ``nodes > 1`` with ``k = world / nodes`` ranks per node: rings (all-reduce, all-gather,
      reduce-scatter, broadcast) run ``k`` side by side, one through each rank's NIC, so the bus
      bandwidth is ``min(intra, k * inter)``; an all-to-all sends the off-node share
      ``(world - k) / world`` of each message through its NIC and the rest over NVLink, whichever
      takes longer; send/recv uses one NIC. Every step pays the inter-node latency.

    (Strided groups matter: with TP=8 on 8-GPU nodes a data-parallel group of 2 spans 2 nodes.)
    """
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


# ---------------------------------------------------------------------------- NCCL's cost model
#: NCCL's protocols, in the order of the latency tables below
PROTOCOLS = ("LL", "LL128", "Simple")
#: base latency per call, microseconds, per algorithm and protocol (NCCL 2.18 ``baseLat``)
NCCL_BASE_US = {"ring": (6.6, 14.0, 8.4), "tree": (6.8, 14.0, 0.0)}
#: latency of one step (hop), microseconds, over NVLink and over the network (NCCL 2.18 ``hwLat``)
NCCL_HOP_US = {("ring", "nvlink"): (0.6, 1.9, 3.4), ("ring", "net"): (2.7, 4.0, 14.0),
               ("tree", "nvlink"): (0.6, 1.25, 28.0), ("tree", "net"): (5.0, 8.5, 28.0)}
#: NCCL multiplies a multi-node ring all-reduce's Simple latency by this for large messages
#: (its "plateau effect of ring", NCCL 2.8 ``ncclTopoGetAlgoTime``)
RING_PLATEAU = 1.9


@dataclass(frozen=True)
class Links:
    """The bus bandwidths (bytes/s) one collective group reaches on a platform."""

    intra_bus: float  #: NVLink bus bandwidth of a ring inside one node
    net_bus: float  #: the group's share of one node's NICs (0 inside one node)
    per_rank_nic: float  #: one rank's share of the node's NICs, bytes/s
    tree_bus: float  #: cap of the tree algorithm across nodes (0: no tree)
    ll128: bool


def group_links(world: int, nodes: int, platform: Platform, nic_share: float = 1.0) -> Links:
    """Bus bandwidths of a ``world``-rank group over ``nodes`` nodes; ``nic_share`` traffic classes
    share the NICs (bytes/s). Each device owns ``nics_per_node / devices_per_node`` of its node's
    adapters at ``network_efficiency`` of their line rate; a ring through ``k`` ranks of a node uses
    the ``k`` ranks' adapters side by side."""
    ic = platform.interconnect
    dpn = max(platform.devices_per_node, 1)
    intra = ic.intra_node_bus_bandwidth_bytes_per_s or ic.intra_node_bandwidth_bytes_per_s
    nic = (ic.nic_bandwidth_bytes_per_s or ic.inter_node_bandwidth_bytes_per_s) * ic.network_efficiency
    per_rank = nic * (ic.nics_per_node or dpn) / dpn / max(nic_share, 1.0)
    k = max(world / max(nodes, 1), 1.0)
    net = k * per_rank if nodes > 1 else 0.0
    return Links(intra, net, per_rank, ic.tree_bus_bandwidth_bytes_per_s or 0.0, ic.ll128)


def _ring_steps(kind: str, world: int, nodes: int) -> tuple[int, int]:
    """(steps, steps that cross nodes) of NCCL's ring for ``kind``."""
    if kind == "all_reduce":
        return 2 * (world - 1), (2 * nodes if nodes > 1 else 0)
    if kind in ("all_gather", "reduce_scatter"):
        return world - 1, nodes - 1
    return world, (nodes if nodes > 1 else 0)  # broadcast, reduce


def nccl_candidates(kind: str, world: int, nodes: int, m: float, platform: Platform,
                    nic_share: float = 1.0) -> dict[tuple[str, str], tuple[float, float]]:
    """(algorithm, protocol) -> (latency seconds, algorithm bandwidth bytes/s) of the NCCL choices for
    a ring collective (all-reduce, all-gather, reduce-scatter, broadcast) of ``m`` bytes."""
    ln = group_links(world, nodes, platform, nic_share)
    bus = min(ln.intra_bus, ln.net_bus) if nodes > 1 and world > nodes else (ln.net_bus or ln.intra_bus)
    ppn = world / max(nodes, 1)
    steps, inter = _ring_steps(kind, world, nodes)
    out: dict[tuple[str, str], tuple[float, float]] = {}
    # LL128 inside a node only: NCCL enables it across nodes only where each GPU's NIC sits under its own
    # PCIe switch (tuning.cc: typeInter <= PATH_PXB, PATH_PXN on Hopper), which the catalog does not record
    ll128 = ln.ll128 and nodes <= 1
    for i, proto in enumerate(PROTOCOLS):
        if proto == "LL128" and not ll128:
            continue
        if proto == "LL":
            bw = bus / (4.0 if nodes > 1 or kind == "all_reduce" else 3.0)
        elif proto == "LL128":
            bw = bus * (0.7 if ppn < 2 else 0.92)
        else:
            bw = bus
        hop_in = NCCL_HOP_US["ring", "nvlink"][i] * (1.8 if nodes > 1 and proto == "LL" else 1.0)
        lat = NCCL_BASE_US["ring"][i] + (steps - inter) * hop_in + inter * NCCL_HOP_US["ring", "net"][i]
        if proto == "Simple" and nodes > 1 and kind == "all_reduce" and m >= world / 16.0 * 65536:
            lat *= RING_PLATEAU
        out["ring", proto] = (lat * 1e-6, bw * world / steps)
    if kind == "all_reduce" and nodes > 1 and ln.tree_bus > 0:
        tree = min(bus * 0.92, ln.tree_bus)
        depth = math.log2(nodes)
        for i, proto in enumerate(PROTOCOLS):
            if proto == "LL128" and not ll128:
                continue
            bw = tree / 3.8 if proto == "LL" else tree * (120.0 / 128.0) if proto == "LL128" else tree
            lat = NCCL_BASE_US["tree"][i] + 2.0 * ((ppn - 1.0) * NCCL_HOP_US["tree", "nvlink"][i]
                                                   + depth * NCCL_HOP_US["tree", "net"][i])
            out["tree", proto] = (lat * 1e-6, bw * 0.5)
    return out


def nccl_seconds(kind: str, world: int, nodes: int, m: np.ndarray, platform: Platform,
                 nic_share: float = 1.0) -> np.ndarray:
    """Seconds of a collective of ``m`` bytes per rank (all-reduce buffer; the full gathered tensor for
    all-gather / reduce-scatter) under NCCL's cost model: the fastest (algorithm, protocol).

    All-to-all sends the off-node share ``(world - k) / world`` of each message through the rank's
    NICs and the rest over NVLink, whichever is slower; send/recv crosses one NIC share (or NVLink).
    """
    m = np.asarray(m, dtype=np.float64)
    floor = platform.kernel_floor_s
    if world <= 1:
        return np.zeros_like(m)
    ln = group_links(world, nodes, platform, nic_share)
    if kind in ("all_to_all", "send_recv"):
        i = PROTOCOLS.index("Simple")
        hop = NCCL_HOP_US["ring", "net" if nodes > 1 else "nvlink"][i]
        lat = (NCCL_BASE_US["ring"][i] + hop) * 1e-6
        if kind == "send_recv":
            bw = ln.per_rank_nic if nodes > 1 else ln.intra_bus
            return np.maximum(lat + m / bw, floor)
        k = max(world / max(nodes, 1), 1.0)
        off = (world - k) / world / ln.per_rank_nic if nodes > 1 else 0.0
        on = (k - 1.0) / world / ln.intra_bus
        return np.maximum(lat + m * max(off, on), floor)
    best = np.full_like(m, np.inf)
    for mm in np.unique(m):
        sel = m == mm
        cands = nccl_candidates(kind, world, nodes, float(mm), platform, nic_share)
        best[sel] = min(lat + mm / bw for lat, bw in cands.values())
    return np.maximum(best, floor)


def ep_dispatch_seconds(world: int, nodes: int, nvl_bytes: np.ndarray, net_bytes: np.ndarray, platform: Platform,
                        nic_share: float = 1.0) -> np.ndarray:
    """Seconds of one rank's DeepEP normal-mode dispatch or combine (``ep_dispatch``): ``net_bytes`` through its
    share of the node's NICs and ``nvl_bytes`` over NVLink, side by side (DeepEP forwards one chunk over NVLink
    while the next arrives over RDMA), after NCCL's Simple all-to-all latency."""
    ln = group_links(world, nodes, platform, nic_share)
    i = PROTOCOLS.index("Simple")
    lat = (NCCL_BASE_US["ring"][i] + NCCL_HOP_US["ring", "net" if nodes > 1 else "nvlink"][i]) * 1e-6
    net = np.asarray(net_bytes, dtype=np.float64) / ln.per_rank_nic if nodes > 1 else 0.0
    return np.maximum(lat + np.maximum(net, np.asarray(nvl_bytes, dtype=np.float64) / ln.intra_bus),
                      platform.kernel_floor_s)


class PiecewiseCollective(KernelModel):
    """Collectives by eq. 2-4 where calibrated, else on the latency-bandwidth line of their links.

    Reads ``msg_bytes``, ``world`` and ``nodes`` (nodes the group spans; when absent the group is
    taken to fill nodes in order, ``ceil(world / devices_per_node)``, except on a CPU platform,
    whose ranks are processes of one host, as ``tuner calibrate --world-size K`` runs them). A fitted
    :class:`PiecewiseSigmoid` for ``(kind, world)`` times single-node groups; every other case —
    uncalibrated, or a group spanning nodes — uses :func:`nccl_seconds` on a platform whose
    interconnect says ``collective_model: nccl``, else :func:`alpha_beta`: ``ts + m / bw_max``.
    ``nic_share`` (optional) is the number of traffic classes sharing the NICs meanwhile.
    """

    kinds = COLLECTIVES
    name = "piecewise-sigmoid-collective"

    def __init__(self, fitted: dict[tuple[str, int], PiecewiseSigmoid] | None = None) -> None:
        #: calibrated parameters keyed by (collective kind, world size)
        self.params = dict(fitted or {})

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        m = np.nan_to_num(tasks.get("msg_bytes"), nan=0.0)
        world = np.nan_to_num(tasks.get("world", 1.0), nan=1.0).astype(np.int64)
        nodes = tasks.get("nodes")
        # without a ``nodes`` column: CPU ranks are processes of one host (as the calibration ran
        # them); accelerator ranks fill nodes of ``devices_per_node`` in order
        default = np.ones_like(world) if platform.kind == "cpu" else np.ceil(world / platform.devices_per_node)
        n_nodes = np.where(np.isfinite(nodes), nodes, default).astype(np.int64)
        share = np.nan_to_num(tasks.get("nic_share", 1.0), nan=1.0)
        kind = tasks.kind or "all_reduce"
        nccl = platform.interconnect.collective_model == "nccl"
        out = np.zeros(len(tasks))
        for w, n, sh in {(int(a), int(b), float(c)) for a, b, c in zip(world, n_nodes, share, strict=True)}:
            if w <= 1:
                continue  # a collective over one rank moves nothing
            sel = (world == w) & (n_nodes == n) & (share == sh)
            fitted = self.params.get((kind, w))
            if kind == "ep_dispatch":
                net = np.nan_to_num(tasks.get("net_bytes"), nan=0.0)
                out[sel] = ep_dispatch_seconds(w, n, m[sel], net[sel], platform, sh)
            elif fitted is not None and n <= 1:
                out[sel] = fitted(m[sel])
            elif nccl:
                out[sel] = nccl_seconds(kind, w, n, m[sel], platform, sh)
            else:
                ts, bw = alpha_beta(kind, w, n, platform)
                out[sel] = ts + m[sel] / bw
        return out


# ---------------------------------------------------------------------------- fitting (calibration)
def _log_loss(curve: PiecewiseSigmoid, m: np.ndarray, t: np.ndarray) -> float:
    with np.errstate(over="ignore", invalid="ignore"):
        pred = curve(m)
    if not np.all(np.isfinite(pred)) or np.any(pred <= 0):
        return float("inf")
    return float(np.sum((np.log10(pred) - np.log10(t)) ** 2))


def fit_piecewise_sigmoid(m: np.ndarray, t: np.ndarray) -> PiecewiseSigmoid:
    """Fit the 8 parameters of eq. 2-4 to measured (message bytes, seconds) points.

    Every pair of region boundaries ``m1 < m2`` taken from the measured sizes (at most 32 of
    them, quantiles, when there are more) is tried:
    ``ts`` is the geometric mean of the times at ``m <= m1``; ``1 / bw_max`` the
    relative-error least-squares slope of ``t - ts`` over ``m >= m2``; the sigmoid of eq. 3-4
    is fitted (``scipy.optimize.curve_fit``, log10 seconds against log2 bytes, rising: ``L >= 0``,
    ``k > 0``) to the points strictly between, starting from the continuous member of the family (with fewer than four
    such points, or when the fitted sigmoid is more than 0.1 decade off the flat region at ``m1``
    or the linear region at ``m2``, the continuous member is kept). The pair with the smallest squared log10 error
    over all points wins.

    Args:
        m: message sizes, bytes (> 0), at least 4 distinct values.
        t: seconds (> 0), same length.

    Raises:
        ValueError: too few points or non-positive values.
    """
    m = np.asarray(m, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    if m.shape != t.shape or m.ndim != 1:
        raise ValueError("m and t must be 1-D arrays of equal length")
    ok = np.isfinite(m) & np.isfinite(t) & (m > 0) & (t > 0)
    m, t = m[ok], t[ok]
    sizes = np.unique(m)
    if sizes.size < 4:
        raise ValueError(f"fit_piecewise_sigmoid needs at least 4 distinct message sizes, got {sizes.size}")
    order = np.argsort(m, kind="stable")
    m, t = m[order], t[order]
    x, y = np.log2(m), np.log10(t)

    if sizes.size > 32:  # many distinct sizes (uneven all-to-all): boundaries from 32 quantiles
        sizes = np.unique(np.quantile(sizes, np.linspace(0.0, 1.0, 32), method="nearest"))
    # every admissible pair's continuous member first (cheap); then the sigmoid fits, best-first, each
    # skipped where the pair cannot win: the flat and linear regions' share of its loss does not depend
    # on the sigmoid, so once it exceeds the best loss found the fit cannot help (the winner is the one
    # the plain pair-by-pair loop finds; ties go to the earlier pair). An uneven all-to-all has ~500 pairs.
    pairs: list[tuple[float, int, PiecewiseSigmoid, np.ndarray, float]] = []
    for i1 in range(0, sizes.size - 2):
        m1 = float(sizes[i1])
        low = m <= m1
        ts = float(10.0 ** y[low].mean())
        for i2 in range(i1 + 1, sizes.size - 1):
            m2 = float(sizes[i2])
            high = m >= m2
            r = m[high] / t[high]
            denom = float(np.sum(r * r))
            u = float(np.sum(r * (1.0 - ts / t[high])) / denom) if denom > 0 else 0.0
            u = max(u, 1e-18)  # seconds per byte; noise must not make bandwidth negative
            try:
                curve = PiecewiseSigmoid.continuous(ts, 1.0 / u, m1, m2)
            except (ValueError, ZeroDivisionError, OverflowError):
                continue
            mid = (~low) & (~high)
            fixed = _log_loss(curve, m[~mid], t[~mid])
            pairs.append((_log_loss(curve, m, t), len(pairs), curve, mid, fixed))
    best: tuple[float, int, PiecewiseSigmoid] | None = None
    for loss, idx, curve, mid, fixed in sorted(pairs, key=lambda c: (c[0], c[1])):
        if best is not None and (fixed, idx) > (best[0], best[1]):
            continue
        if mid.sum() >= 4:
            curve, loss = _fit_mid(curve, loss, x, y, m, t, mid)
        if best is None or (loss, idx) < (best[0], best[1]):
            best = (loss, idx, curve)
    if best is None:
        raise ValueError("fit_piecewise_sigmoid: no admissible region boundaries")
    return best[2]


def _sigmoid(xv: np.ndarray, L: float, x0: float, k: float, b: float) -> np.ndarray:
    """Eq. 3-4 in log space: log10 seconds at log2 bytes ``xv``."""
    return L / (1.0 + np.exp(-np.clip(k * (xv - x0), -60.0, 60.0))) + b


def _fit_mid(curve: PiecewiseSigmoid, loss: float, x: np.ndarray, y: np.ndarray, m: np.ndarray, t: np.ndarray,
             mid: np.ndarray) -> tuple[PiecewiseSigmoid, float]:
    """The sigmoid of eq. 3-4 fitted to the ``mid`` points of one boundary pair (``x, y``: log2 bytes,
    log10 seconds; ``m, t``: bytes, seconds), from its continuous member ``curve`` (loss ``loss``); the
    fitted curve and its loss where it joins both regions and fits better, else ``curve`` and ``loss``."""
    from scipy.optimize import curve_fit

    # the latency curve rises with message size: 0 <= L <= 20 decades, k > 0
    p0 = (min(max(curve.L, 1e-6), 19.9), curve.x0, min(max(curve.k, 1e-3), 100.0), curve.b)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # OptimizeWarning on flat, well-fitted data
            popt, _ = curve_fit(_sigmoid, x[mid], y[mid], p0=p0, maxfev=2000,
                                bounds=([0.0, -np.inf, 1e-3, -np.inf], [20.0, np.inf, 100.0, np.inf]))
    except (RuntimeError, ValueError, FloatingPointError):
        return curve, loss
    cand = PiecewiseSigmoid(ts=curve.ts, m1=curve.m1, m2=curve.m2, bw_max=curve.bw_max, L=float(popt[0]),
                            x0=float(popt[1]), k=float(popt[2]), b=float(popt[3]))
    # keep the fitted sigmoid only where it joins the flat and the linear regions (within 0.1 decade
    # at both boundaries): a steep sigmoid can thread the measured mid points and plunge between them
    # (seen: 85 % held-out error)
    joins = (abs(float(_sigmoid(np.log2(curve.m1), *popt)) - np.log10(curve.ts)) <= 0.1
             and abs(float(_sigmoid(np.log2(curve.m2), *popt)) - np.log10(curve.ts + curve.m2 / curve.bw_max)) <= 0.1)
    cand_loss = _log_loss(cand, m, t)
    if joins and cand_loss < loss:
        return cand, cand_loss
    return curve, loss
