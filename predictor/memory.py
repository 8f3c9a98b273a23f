"""Centimani memory model (Xie et al., USENIX ATC 2024, §4.2 and §5.1).

1. **Data classification**: every tensor of a traced training iteration
   (:mod:`predictor.sources.synth.opgraph`) is in one of five categories —
   input/output (activations and activation gradients), weights & biases, gradients,
   algorithm-related (optimizer state, fp32 master weights, autocast weight copies) and
   ephemeral (short-lived temporaries, math-library workspace, communication buffers).
2. **Memory estimation**: the allocation/free events of the iteration are walked in schedule
   order (the forward pass keeps each activation until the backward op that uses it frees
   it), giving the bytes live per category after every event (:class:`MemoryTimeline`).
3. **Mapping to levels** by the accelerator's ``memory_policy`` from the catalog
   (:func:`place`):

   * ``offchip_all`` (GPUs, TPU, Gaudi): every category in device DRAM/HBM; the on-chip
     levels are caches, not allocated;
   * ``weights_on_chip`` (Cerebras, as Centimani describes it): weights & biases pinned
     on-chip (they must fit, or no batch size fits); activations, ephemeral tensors,
     gradients and algorithm-related tensors then fill the remaining on-chip memory in that
     order and spill off-chip;
   * ``onchip_first`` (SambaNova, Graphcore): on-chip memory is filled first — activations,
     ephemeral, weights, gradients, algorithm-related, in that order — and the rest spills
     off-chip.

   Each level's usage is its own peak over the iteration.
4. **Batch-size selection** (eq. 5): among the candidate batch sizes whose on-chip and
   off-chip estimates are below the capacities, the one minimising
   ``W_onchip (Real_on - Est_on)^2 + (Real_off - Est_off)^2`` (``W_onchip = 10``), i.e. the
   one that fills the memories most, on-chip weighted ten times.

Units: bytes throughout (GiB only inside the eq. 5 objective, which is unit-invariant).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from predictor.sources.synth.opgraph import CATEGORY_NAMES, OpGraph, TensorCategory
from predictor.timing.platforms.schema import Platform

__all__ = [
    "TensorCategory",
    "CATEGORY_NAMES",
    "MemoryExtras",
    "MemoryTimeline",
    "memory_timeline",
    "LevelUsage",
    "place",
    "BatchChoice",
    "select_batch_size",
    "W_ONCHIP",
    "POLICY_FILL_ORDER",
    "measure_training_peak",
]

#: weight of the on-chip term in eq. 5 (Centimani §5.1: "usually set to 10")
W_ONCHIP = 10.0

_IO, _W, _G, _A, _E = (int(c) for c in TensorCategory)
#: order in which categories fill on-chip memory under each policy (pinned categories first)
POLICY_FILL_ORDER: dict[str, tuple[int, ...]] = {
    "offchip_all": (),
    "weights_on_chip": (_IO, _E, _G, _A),
    "onchip_first": (_IO, _E, _W, _G, _A),
}
#: categories that must be on-chip under each policy
POLICY_PINNED: dict[str, tuple[int, ...]] = {"offchip_all": (), "weights_on_chip": (_W,), "onchip_first": ()}


@dataclass(frozen=True)
class MemoryExtras:
    """Memory the trace cannot see, added as ephemeral bytes for the whole iteration.

    ``workspace_bytes``: math-library workspace reserved on the device (e.g. cuBLAS; 0 on a
    CPU, where the trace already sees every tensor). ``comm_buffer_bytes``: communication
    reservation of data parallelism (PyTorch DDP keeps a flat copy of every gradient in its
    buckets, so this is the gradient size when more than one device trains).
    """

    workspace_bytes: float = 0.0
    comm_buffer_bytes: float = 0.0

    @property
    def total(self) -> float:
        return float(self.workspace_bytes + self.comm_buffer_bytes)


@dataclass
class MemoryTimeline:
    """Bytes live per category after every allocation/free event of one iteration.

    ``levels[i, c]``: bytes of category ``c`` live after event ``i - 1`` (row 0: the baseline,
    before the iteration's first event). ``ev_op[i]``: operators executed before event ``i``.
    """

    levels: np.ndarray  # (n_events + 1, 5)
    ev_op: np.ndarray
    batch: int

    @property
    def total(self) -> np.ndarray:
        return self.levels.sum(axis=1)

    @property
    def peak_index(self) -> int:
        return int(np.argmax(self.total))

    @property
    def peak_bytes(self) -> float:
        """Peak of all live tensor bytes over the iteration."""
        return float(self.total.max())

    def at_peak(self) -> dict[str, float]:
        """Bytes per category at the moment of the total peak."""
        row = self.levels[self.peak_index]
        return {CATEGORY_NAMES[c]: float(row[c]) for c in range(len(CATEGORY_NAMES))}

    def category_peaks(self) -> dict[str, float]:
        """Each category's own peak over the iteration (not simultaneous)."""
        m = self.levels.max(axis=0)
        return {CATEGORY_NAMES[c]: float(m[c]) for c in range(len(CATEGORY_NAMES))}


def memory_timeline(graph: OpGraph, extras: MemoryExtras | None = None) -> MemoryTimeline:
    """Walk the graph's allocation events in schedule order (Centimani §5.1)."""
    n_cat = len(CATEGORY_NAMES)
    base = np.zeros(n_cat)
    np.add.at(base, graph.category[graph.baseline].astype(np.int64), graph.nbytes[graph.baseline])
    delta = np.zeros((graph.n_events, n_cat))
    if graph.n_events:
        rows = np.arange(graph.n_events)
        delta[rows, graph.category[graph.ev_tensor].astype(np.int64)] = graph.nbytes[graph.ev_tensor] * graph.ev_sign
    levels = np.vstack([base, base + np.cumsum(delta, axis=0)])
    np.maximum(levels, 0.0, out=levels)  # rounding of interpolated sizes never makes a category negative
    if extras is not None and extras.total:
        levels[:, _E] += extras.total
    ev_op = np.concatenate([[0], graph.ev_op]) if graph.n_events else np.zeros(1, dtype=np.int64)
    return MemoryTimeline(levels, ev_op, graph.batch)


@dataclass
class LevelUsage:
    """Peak usage of on-chip and off-chip memory of one device, bytes, and whether it fits."""

    policy: str
    on_chip_bytes: float
    off_chip_bytes: float
    on_chip_capacity: float
    off_chip_capacity: float
    peak_bytes: float
    by_category: dict[str, float]
    #: share of each category resident on-chip at the peak (the time model's cache-aware roofline uses it)
    on_chip_share: dict[str, float]
    feasible: bool
    reason: str = ""

    def as_dict(self) -> dict:
        return {
            "policy": self.policy,
            "on_chip_bytes": self.on_chip_bytes,
            "off_chip_bytes": self.off_chip_bytes,
            "on_chip_capacity_bytes": self.on_chip_capacity,
            "off_chip_capacity_bytes": self.off_chip_capacity,
            "peak_bytes": self.peak_bytes,
            "by_category_bytes": dict(self.by_category),
            "on_chip_share": dict(self.on_chip_share),
            "feasible": self.feasible,
            "reason": self.reason,
        }


def place(
    timeline: MemoryTimeline,
    platform: Platform,
    *,
    policy: str | None = None,
    usable_fraction: float = 1.0,
) -> LevelUsage:
    """Map every category to on-chip/off-chip memory by ``policy`` (default: the platform's).

    ``usable_fraction`` of each capacity may be used (e.g. 0.9 leaves room for the runtime
    context and allocator fragmentation on GPUs).
    """
    policy = policy or platform.memory_policy
    if policy not in POLICY_FILL_ORDER:
        raise ValueError(f"memory policy must be one of {', '.join(POLICY_FILL_ORDER)} (got {policy!r})")
    lv = timeline.levels
    on_cap = platform.on_chip_bytes * usable_fraction if policy != "offchip_all" else 0.0
    off_cap = platform.memory_bytes * usable_fraction
    on_cat = np.zeros_like(lv)
    pinned = POLICY_PINNED[policy]
    for c in pinned:
        on_cat[:, c] = lv[:, c]
    room = np.maximum(on_cap - on_cat.sum(axis=1), 0.0)
    for c in POLICY_FILL_ORDER[policy]:
        take = np.minimum(lv[:, c], room)
        on_cat[:, c] = take
        room = room - take
    on = on_cat.sum(axis=1)
    off = lv.sum(axis=1) - on
    i = timeline.peak_index
    row = lv[i]
    share = {CATEGORY_NAMES[c]: (float(on_cat[i, c] / row[c]) if row[c] > 0 else (1.0 if c in pinned else 0.0))
             for c in range(len(CATEGORY_NAMES))}
    if policy == "offchip_all":
        share = {k: 0.0 for k in share}
    on_peak, off_peak = float(on.max()), float(off.max())
    reasons = []
    if policy != "offchip_all" and on_peak > on_cap:
        pinned_peak = float(sum(lv[:, c].max() for c in pinned))
        reasons.append(f"on-chip needs {_gib(pinned_peak)} for pinned weights, device has {_gib(on_cap)}")
    if off_peak > off_cap:
        reasons.append(f"off-chip needs {_gib(off_peak)}, device has {_gib(off_cap)}")
    return LevelUsage(
        policy=policy,
        on_chip_bytes=on_peak,
        off_chip_bytes=off_peak,
        on_chip_capacity=on_cap,
        off_chip_capacity=off_cap,
        peak_bytes=timeline.peak_bytes,
        by_category=timeline.at_peak(),
        on_chip_share=share,
        feasible=not reasons,
        reason="; ".join(reasons),
    )


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB" if x >= 2**28 else f"{x / 2**20:.1f} MiB"


@dataclass
class BatchChoice:
    """The outcome of eq. 5 over a candidate set."""

    batch: int | None
    usage: LevelUsage | None
    candidates: list[dict] = field(default_factory=list)
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return self.batch is not None


def eq5_objective(usage: LevelUsage, w_onchip: float = W_ONCHIP) -> float:
    """``W_onchip (Real_on - Est_on)^2 + (Real_off - Est_off)^2`` in GiB^2 (Centimani eq. 5)."""
    g = 2.0**30
    on = (usage.on_chip_capacity - usage.on_chip_bytes) / g
    off = (usage.off_chip_capacity - usage.off_chip_bytes) / g
    return float(w_onchip * on * on + off * off)


def select_batch_size(
    estimate: Callable[[int], LevelUsage],
    candidates: Sequence[int],
    *,
    w_onchip: float = W_ONCHIP,
) -> BatchChoice:
    """Eq. 5: the feasible candidate minimising the weighted squared free memory.

    ``estimate(b)`` gives the level usage at batch ``b``. When no candidate fits, the choice
    has ``batch=None`` and ``reason`` says why the smallest one does not.
    """
    rows = []
    best: tuple[float, int, LevelUsage] | None = None
    for b in sorted(set(int(x) for x in candidates)):
        u = estimate(b)
        obj = eq5_objective(u, w_onchip) if u.feasible else float("inf")
        rows.append({"batch": b, "on_chip_bytes": u.on_chip_bytes, "off_chip_bytes": u.off_chip_bytes,
                     "feasible": u.feasible, "objective": obj, "reason": u.reason})
        if u.feasible and (best is None or obj < best[0] or (obj == best[0] and b > best[1])):
            best = (obj, b, u)
    if best is None:
        first = rows[0] if rows else {"batch": None, "reason": "no candidates"}
        return BatchChoice(None, None, rows, f"batch {first['batch']} does not fit: {first['reason']}")
    return BatchChoice(best[1], best[2], rows)


# ----------------------------------------------------------------------------- measurement
def measure_training_peak(
    build: Callable,
    make_batch: Callable,
    loss_fn: Callable,
    batch: int,
    *,
    precision: str = "fp32",
    optimizer: str = "adamw",
    seed: int = 0,
) -> dict:
    """Run two real training iterations on the CPU and measure the peak of tensor allocations, bytes.

    Method: ``torch.profiler`` with ``profile_memory=True`` records every allocation and free
    of PyTorch's CPU allocator (each tensor storage, including temporaries inside operators
    that allocate through it) with a timestamp. The profiler is started *before* the model is
    built, so the running sum of these events is the absolute number of bytes held by tensors;
    the result is the maximum of that sum during the second (steady-state) iteration, which
    the same :class:`~predictor.sources.synth.training_loop.TrainingLoop` code runs as the trace does.
    Memory that does not go through the allocator (Python objects, oneDNN's own scratchpads,
    the interpreter) is not counted — it is not tensor memory.

    Returns ``{"peak_bytes", "start_bytes", "events"}``.
    """
    import torch

    from predictor.sources.synth.training_loop import TrainingLoop

    torch.manual_seed(seed)
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts, profile_memory=True) as prof:
        loop = TrainingLoop(build(), make_batch, loss_fn, batch, precision=precision, optimizer=optimizer)
        loop.step()
        with torch.profiler.record_function("tuner::steady_iteration"):
            loop.step()
        del loop
    events = list(prof.profiler.kineto_results.events())
    mem = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    mark = next(e for e in events if e.name() == "tuner::steady_iteration")
    t = np.asarray([m[0] for m in mem], dtype=np.int64)
    level = np.cumsum(np.asarray([m[1] for m in mem], dtype=np.float64))
    i0 = int(np.searchsorted(t, mark.start_ns()))
    i1 = int(np.searchsorted(t, mark.end_ns(), side="right"))
    start = float(level[i0 - 1]) if i0 > 0 else 0.0
    peak = max(start, float(level[i0:i1].max()) if i1 > i0 else start)
    return {"peak_bytes": peak, "start_bytes": start, "events": len(mem)}
