"""Alpa's inter-operator pass, fed by predictions instead of profiling.

Alpa (Zheng et al., OSDI 2022, §5) slices a model's ``L`` layer groups into pipeline stages and
assigns each stage a *submesh* of the cluster and an intra-operator *configuration*. Its
stage-construction DP needs two tensors that Alpa fills by compiling and profiling every
candidate stage:

* ``compute_cost[i, j, s, c]`` — seconds of one micro-batch's forward + backward through
  layer groups ``i..j`` on submesh ``s`` with configuration ``c`` (``inf`` where impossible);
* ``max_n_succ_stages[i, j, s, c]`` — how many stages may follow that stage before its
  activations (one micro-batch per later stage, 1F1B) no longer fit in device memory
  (``-1``: the stage does not fit at all).

:func:`stage_cost_tensors` fills both from a :class:`StageLatencyPredictor` (the PredTOP idea:
predict stage latency instead of profiling it). The default predictor,
:class:`SimulatedStagePredictor`, synthesises the stage's kernels
(:func:`predictor.sources.synth.transformer.build_stage_graph`) and simulates one micro-batch; a
learned stage model (``predictor/stage/``) plugs in through the same protocol. The memory side
uses :mod:`predictor.sources.synth.transformer_memory` (Korthikanti et al. 2022).

:func:`stage_construction_dp` is our implementation of Alpa's DP (its eq. 2-5): for every
candidate bound ``t_max`` on the slowest stage — the sorted unique finite values of
``compute_cost`` — find the split of all layers into stages, each on a submesh, that uses
exactly all devices and minimises ``sum(stage latencies)``, with every stage ``<= t_max`` and
its ``max_n_succ_stages >= (stages after it)``; the answer minimises
``sum + (B - 1) * t_max`` over the bounds (``B`` micro-batches), stopping once
``(B - 1) * t_max`` alone exceeds the best total. As in Alpa, submesh shapes
``(1, 1), (1, 2), (1, 4) ... (1, M), (2, M) ... (N, M)`` are assumed to tile the cluster
whenever their device counts add up to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numba
import numpy as np

from predictor.sources.synth.pipeline_schedule import pipeline_latency
from predictor.sources.synth.transformer import (
    ParallelPlan,
    PlanError,
    TransformerSpec,
    build_stage_graph,
    check_plan,
    transformer_timing,
)
from predictor.sources.synth.transformer_memory import (
    RESERVED_BYTES,
    activation_bytes_per_layer,
    layer_param_count,
)
from predictor.timing.kernels import ModelTiming
from predictor.timing.platforms.schema import Platform

__all__ = [
    "Submesh",
    "MeshConfig",
    "StageQuery",
    "StageLatencyPredictor",
    "SimulatedStagePredictor",
    "StageCosts",
    "StageAssignment",
    "StagePlan",
    "alpa_submesh_choices",
    "mesh_configs",
    "layer_groups",
    "stage_cost_tensors",
    "stage_construction_dp",
    "pipeline_latency",
]

#: model states per parameter with mixed-precision Adam (Megatron accounting), bytes
STATE_BYTES_PER_PARAM = 18.0
#: upper bound stored in max_n_succ_stages when memory is no constraint
MAX_SUCC_CAP = 1 << 20


# ============================================================================ vocabulary
@dataclass(frozen=True)
class Submesh:
    """A physical submesh: ``hosts`` nodes x ``devices_per_host`` devices."""

    hosts: int
    devices_per_host: int

    @property
    def n_devices(self) -> int:
        """Devices of the submesh."""
        return self.hosts * self.devices_per_host


@dataclass(frozen=True)
class MeshConfig:
    """A logical mesh of a submesh: ``dp`` data-parallel x ``tp`` tensor-parallel devices."""

    dp: int
    tp: int

    @property
    def n_devices(self) -> int:
        """Devices of the logical mesh."""
        return self.dp * self.tp


@dataclass(frozen=True)
class StageQuery:
    """One candidate stage: ``n_layers`` transformer layers (+ embedding / head) on one submesh config.

    ``micro_batch`` is the stage's micro-batch (sequences); each device runs ``micro_batch / dp``.
    """

    spec: TransformerSpec
    n_layers: int
    with_embedding: bool
    with_head: bool
    submesh: Submesh
    config: MeshConfig
    micro_batch: int
    recompute: str = "none"


@runtime_checkable
class StageLatencyPredictor(Protocol):
    """Predicts the latency of one stage: seconds of one micro-batch's forward + backward.

    Contract: ``stage_latency(query)`` returns a finite, positive float for a stage that can run
    and may assume the query is valid (divisibility is checked by the caller).
    """

    def stage_latency(self, query: StageQuery) -> float: ...


class SimulatedStagePredictor:
    """Default predictor: synthesise the stage's kernels and simulate one micro-batch on ``platform``.

    Results are cached by everything that changes the stage graph, so a homogeneous model needs
    one simulation per (layer count, embedding, head, config) however many ``(i, j)`` pairs.
    """

    def __init__(self, platform: Platform, *, timing: ModelTiming | None = None) -> None:
        self.platform = platform
        self.timing = timing or transformer_timing(platform)
        self._cache: dict[tuple, float] = {}
        self.simulations = 0

    def stage_latency(self, query: StageQuery) -> float:
        from predictor.simulate import simulate

        key = (query.spec, query.n_layers, query.with_embedding, query.with_head, query.config,
               query.submesh.devices_per_host, query.micro_batch, query.recompute)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        plan = ParallelPlan(tp=query.config.tp, micro_batch=query.micro_batch // query.config.dp,
                            recompute=query.recompute)  # type: ignore[arg-type]
        g = build_stage_graph(query.spec, plan, query.n_layers, with_embedding=query.with_embedding,
                              with_head=query.with_head, devices_per_node=query.submesh.devices_per_host,
                              mode="host" if self.platform.kind == "cpu" else "device")
        t = simulate(g, self.timing).iteration_s
        self.simulations += 1
        self._cache[key] = t
        return t


def alpa_submesh_choices(num_hosts: int, devices_per_host: int) -> list[Submesh]:
    """Alpa's submesh shapes: ``(1, 1), (1, 2), (1, 4), ... (1, M)`` then ``(2, M) ... (N, M)``."""
    if num_hosts < 1 or devices_per_host < 1:
        raise ValueError("a cluster needs at least one host and one device per host")
    out = []
    i = 1
    while i < devices_per_host:
        out.append(Submesh(1, i))
        i *= 2
    out.append(Submesh(1, devices_per_host))
    out += [Submesh(h, devices_per_host) for h in range(2, num_hosts + 1)]
    return out


def mesh_configs(submesh: Submesh) -> list[MeshConfig]:
    """Logical meshes of a submesh: every ``dp x tp = devices`` with ``tp`` a power of two (TP first inside a host)."""
    n = submesh.n_devices
    out = []
    tp = 1
    while tp <= n:
        if n % tp == 0:
            out.append(MeshConfig(n // tp, tp))
        tp *= 2
    return out


def layer_groups(n_layers: int, n_groups: int) -> np.ndarray:
    """Transformer layers in each of ``n_groups`` contiguous groups (as even as possible)."""
    if not 1 <= n_groups <= n_layers:
        raise ValueError(f"cannot cluster {n_layers} layers into {n_groups} groups")
    return np.asarray([len(a) for a in np.array_split(np.arange(n_layers), n_groups)], dtype=np.int64)


# ============================================================================ cost tensors
@dataclass
class StageCosts:
    """Alpa's stage tensors and what their axes mean."""

    compute_cost: np.ndarray  #: [L, L, S, C] seconds per micro-batch (inf: impossible)
    max_n_succ_stages: np.ndarray  #: [L, L, S, C] int (-1: does not fit)
    submeshes: list[Submesh]
    configs: list[list[MeshConfig]]  #: per submesh; config c of submesh s is configs[s][c]
    group_sizes: np.ndarray  #: transformer layers per layer group
    micro_batch: int

    @property
    def submesh_sizes(self) -> np.ndarray:
        """Devices of every submesh (int64, shape ``(S,)``)."""
        return np.asarray([s.n_devices for s in self.submeshes], dtype=np.int64)


def _stage_memory(spec: TransformerSpec, n_layers: int, emb: bool, head: bool, cfg: MeshConfig, mb_dev: int,
                  recompute: str) -> tuple[float, float]:
    """(static bytes, activation bytes per micro-batch) of one device of a stage."""
    t = cfg.tp
    vpad = spec.padded_vocab(t)
    params = n_layers * layer_param_count(spec, t)
    if emb:
        params += vpad * spec.hidden / t + spec.seq * spec.hidden
    if head:
        params += 2 * spec.hidden + (0 if (emb and spec.tie_embeddings) else vpad * spec.hidden / t)
    plan = ParallelPlan(tp=t, micro_batch=mb_dev, recompute=recompute)  # type: ignore[arg-type]
    act = n_layers * activation_bytes_per_layer(spec, plan)
    if head:
        act += 4.0 * spec.seq * mb_dev * spec.hidden / t * (1.0 + vpad / spec.hidden)
    return params * STATE_BYTES_PER_PARAM + RESERVED_BYTES, act


def stage_cost_tensors(
    spec: TransformerSpec,
    n_groups: int,
    submeshes: Sequence[Submesh],
    micro_batch: int,
    *,
    platform: Platform | None = None,
    predictor: StageLatencyPredictor | None = None,
    configs: Sequence[Sequence[MeshConfig]] | None = None,
    memory_bytes: float | None = None,
    recompute: str = "none",
) -> StageCosts:
    """``compute_cost[L, L, S, C]`` and ``max_n_succ_stages[L, L, S, C]`` from predictions.

    ``n_groups`` layer groups ``L`` cluster ``spec.layers`` (group 0 carries the embedding,
    group ``L-1`` the output layer). ``configs[s]`` are the logical meshes tried on submesh ``s``
    (default :func:`mesh_configs`); ``C`` is the longest list and shorter ones are padded with
    ``inf``. A config is impossible when ``dp`` does not divide ``micro_batch`` or ``tp`` does
    not divide the heads / FFN. ``memory_bytes`` defaults to the platform's device memory.
    """
    if predictor is None:
        if platform is None:
            raise ValueError("give a platform (for the default predictor) or a predictor")
        predictor = SimulatedStagePredictor(platform)
    if memory_bytes is None:
        if platform is None:
            raise ValueError("give memory_bytes or a platform")
        memory_bytes = platform.memory_bytes
    spec.validate()
    sizes = layer_groups(spec.layers, n_groups)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    subs = list(submeshes)
    cfgs = [list(c) for c in configs] if configs is not None else [mesh_configs(s) for s in subs]
    if len(cfgs) != len(subs):
        raise ValueError(f"configs has {len(cfgs)} lists for {len(subs)} submeshes")
    L, S, C = n_groups, len(subs), max(len(c) for c in cfgs)
    cost = np.full((L, L, S, C), np.inf)
    succ = np.full((L, L, S, C), -1, dtype=np.int64)
    for s, sub in enumerate(subs):
        for c, cfg in enumerate(cfgs[s]):
            if cfg.n_devices != sub.n_devices:
                raise ValueError(f"config {cfg} does not use the {sub.n_devices} devices of submesh {sub}")
            if micro_batch % cfg.dp:
                continue
            mb_dev = micro_batch // cfg.dp
            try:
                check_plan(replace(spec, layers=1), ParallelPlan(tp=cfg.tp, micro_batch=mb_dev, global_batch=mb_dev))
            except PlanError:
                continue
            for i in range(L):
                for j in range(i, L):
                    n = int(starts[j + 1] - starts[i])
                    emb, head = i == 0, j == L - 1
                    q = StageQuery(spec, n, emb, head, sub, cfg, micro_batch, recompute)
                    cost[i, j, s, c] = float(predictor.stage_latency(q))
                    static, act = _stage_memory(spec, n, emb, head, cfg, mb_dev, recompute)
                    if static + act > memory_bytes:
                        succ[i, j, s, c] = -1
                    else:
                        k = math.floor((memory_bytes - static) / max(act, 1.0)) - 1
                        succ[i, j, s, c] = min(k, MAX_SUCC_CAP)
    return StageCosts(cost, succ, subs, cfgs, sizes, micro_batch)


# ============================================================================ the DP
@numba.njit(cache=True)
def _dp_bounded(cost: np.ndarray, max_succ: np.ndarray, sizes: np.ndarray, n_devices: int,
                t_max: float) -> tuple[float, int, np.ndarray]:
    """min over splits of sum(stage cost), every stage <= t_max, all devices used (Alpa eq. 3-4)."""
    L = cost.shape[0]
    S = cost.shape[2]
    C = cost.shape[3]
    D = n_devices
    inf = np.inf
    f = np.full((L + 1, L + 1, D + 1), inf)
    choice = np.full((L + 1, L + 1, D + 1, 3), -1, dtype=np.int64)
    f[0, L, 0] = 0.0
    for s in range(1, L + 1):
        for i in range(L - 1, -1, -1):
            for j in range(i, L):
                for m in range(S):
                    n = sizes[m]
                    for d in range(n, D + 1):
                        prev = f[s - 1, j + 1, d - n]
                        if prev == inf:
                            continue
                        for c in range(C):
                            t = cost[i, j, m, c]
                            if t > t_max or max_succ[i, j, m, c] < s - 1:
                                continue
                            v = prev + t
                            if v < f[s, i, d]:
                                f[s, i, d] = v
                                choice[s, i, d, 0] = j
                                choice[s, i, d, 1] = m
                                choice[s, i, d, 2] = c
    best = inf
    best_s = -1
    for s in range(1, L + 1):
        if f[s, 0, D] < best:
            best = f[s, 0, D]
            best_s = s
    return best, best_s, choice


@dataclass(frozen=True)
class StageAssignment:
    """One stage of the chosen plan: layer groups ``first..last`` (inclusive) on a submesh config."""

    first: int
    last: int
    submesh_index: int
    config_index: int
    latency_s: float
    submesh: Submesh | None = None
    config: MeshConfig | None = None


@dataclass(frozen=True)
class StagePlan:
    """The DP's answer: total pipeline latency ``sum + (B - 1) * max`` (seconds) and the stages."""

    total_latency_s: float
    max_stage_latency_s: float
    stages: tuple[StageAssignment, ...]
    thresholds_tried: int


def stage_construction_dp(
    compute_cost: np.ndarray,
    max_n_succ_stages: np.ndarray,
    submesh_sizes: Sequence[int],
    n_devices: int,
    n_micro_batches: int,
    *,
    costs: StageCosts | None = None,
) -> StagePlan | None:
    """Alpa's stage construction: the split, submeshes and configs minimising pipeline latency.

    Returns ``None`` when no split uses exactly ``n_devices`` devices within memory.
    """
    cost = np.ascontiguousarray(compute_cost, dtype=np.float64)
    succ = np.ascontiguousarray(max_n_succ_stages, dtype=np.int64)
    sizes = np.ascontiguousarray(submesh_sizes, dtype=np.int64)
    if cost.ndim != 4 or cost.shape[0] != cost.shape[1] or succ.shape != cost.shape or sizes.size != cost.shape[2]:
        raise ValueError(f"compute_cost {cost.shape}, max_n_succ_stages {succ.shape} and {sizes.size} submesh sizes "
                         "do not fit the [L, L, S, C] layout")
    if n_micro_batches < 1 or n_devices < 1:
        raise ValueError("n_micro_batches and n_devices must be >= 1")
    finite = cost[np.isfinite(cost)]
    best_total, best_sol = math.inf, None
    tried = 0
    for t_max in np.unique(finite):  # sorted ascending
        if (n_micro_batches - 1) * t_max >= best_total:
            break
        tried += 1
        total, s, choice = _dp_bounded(cost, succ, sizes, int(n_devices), float(t_max))
        if not math.isfinite(total):
            continue
        total += (n_micro_batches - 1) * t_max
        if total < best_total:
            best_total = total
            best_sol = _walk(choice, s, n_devices, sizes)
    if best_sol is None:
        return None
    stages = []
    for i, j, m, c in best_sol:
        sub = costs.submeshes[m] if costs else None
        cfg = costs.configs[m][c] if costs else None
        stages.append(StageAssignment(i, j, m, c, float(cost[i, j, m, c]), sub, cfg))
    lat = [st.latency_s for st in stages]
    return StagePlan(pipeline_latency(lat, n_micro_batches), max(lat), tuple(stages), tried)


def _walk(choice: np.ndarray, s: int, n_devices: int, sizes: np.ndarray) -> list[tuple[int, int, int, int]]:
    out = []
    i, d = 0, n_devices
    L = choice.shape[0] - 1
    while s > 0 and i < L:
        j, m, c = (int(x) for x in choice[s, i, d])
        out.append((i, j, m, c))
        d -= int(sizes[m])
        i = j + 1
        s -= 1
    return out
