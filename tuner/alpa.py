"""Alpa's inter-operator pass, fed by predictions instead of profiling.

Alpa (Zheng et al., OSDI 2022, §5) slices a model's ``L`` layer groups into pipeline stages and
assigns each stage a *submesh* of the cluster and an intra-operator *configuration*. Its
stage-construction DP needs two tensors that Alpa fills by compiling and profiling every
candidate stage:

* ``compute_cost[i, j, s, c]`` — seconds of one micro-batch's forward + backward through
  layer groups ``i..j`` on submesh ``s`` with configuration ``c`` (``inf`` where impossible);
* ``max_n_succ_stages[i, j, s, c]`` — how many stages may follow that stage before its
  activations (one micro-batch per later stage, 1F1B) no longer fit in device memory
  (``-1``: the stage does not fit at all), by Alpa's formula
  ``(available - stage peak - optimizer states) // stashed activations - 1``.

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

Drop-in for Alpa (``alpa/pipeline_parallel/stage_construction.py`` and ``stage_profiling.py``):
:func:`get_submesh_choices` and :func:`get_all_submesh_autosharding_config_choices` enumerate
submeshes and (logical mesh, option dict) configs in Alpa's order, :func:`get_compute_cost` takes
``get_compute_cost``'s arguments and returns its two tensors, and :func:`manual_stage_option` turns
the DP's plan into the arguments of Alpa's ``ManualStageOption``.
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
    "StageMemoryStats",
    "stage_memory_stats",
    "alpa_max_n_succ_stages",
    "get_submesh_choices",
    "LogicalMesh",
    "LOGICAL_SPACES",
    "get_one_submesh_autosharding_config_choices",
    "get_all_submesh_autosharding_config_choices",
    "mesh_config_of",
    "VirtualMesh",
    "AutoStageOption",
    "AlpaLayer",
    "alpa_layers",
    "get_compute_cost",
    "alpa_solution",
    "training_dp",
    "manual_stage_option",
]

#: model states per parameter with mixed-precision Adam (Megatron accounting), bytes
STATE_BYTES_PER_PARAM = 18.0
#: fp32 gradient accumulator per parameter, bytes (live while a stage runs)
GRAD_BYTES_PER_PARAM = 4.0
#: fp32 master weight + Adam's two fp32 moments per parameter, bytes (read only by the optimizer step)
OPTIMIZER_BYTES_PER_PARAM = 12.0
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


def get_submesh_choices(num_hosts: int, num_devices_per_host: int, space: str = "power_of_two",
                        manually_specified_submeshes: Sequence[tuple[int, int]] | None = None
                        ) -> tuple[tuple[int, int], ...]:
    """Alpa's submesh shapes ``(hosts, devices per host)``, in Alpa's order (its ``get_submesh_choices``).

    ``(1, 1), (1, 2), (1, 4) ... (1, M)`` (``M`` must be a power of two), then whole hosts:
    ``power_of_two`` (Alpa's default) ``(2, M), (4, M), ...`` up to ``num_hosts``; ``small_power_of_two``
    the same up to 4 hosts; ``all`` ``(2, M), (3, M) ... (N, M)``; ``manual`` the given shapes.
    """
    if num_hosts < 1 or num_devices_per_host < 1:
        raise ValueError("a cluster needs at least one host and one device per host")
    if space == "manual":
        if not manually_specified_submeshes:
            raise ValueError("the manual submesh space needs manually_specified_submeshes")
        return tuple((int(h), int(d)) for h, d in manually_specified_submeshes)
    if num_devices_per_host & (num_devices_per_host - 1):
        raise ValueError(f"Alpa's submesh spaces need a power-of-two number of devices per host "
                         f"(got {num_devices_per_host})")
    out = [(1, 1 << k) for k in range(num_devices_per_host.bit_length())]
    if space == "all":
        hosts = list(range(2, num_hosts + 1))
    elif space in ("power_of_two", "small_power_of_two"):
        top = num_hosts if space == "power_of_two" else min(num_hosts, 4)
        hosts = [1 << k for k in range(1, top.bit_length()) if 1 << k <= top]
    else:
        raise ValueError(f"unknown submesh space {space!r}: power_of_two, small_power_of_two, all or manual")
    return tuple(out + [(h, num_devices_per_host) for h in hosts])


def alpa_submesh_choices(num_hosts: int, devices_per_host: int, space: str = "power_of_two") -> list[Submesh]:
    """:func:`get_submesh_choices` as :class:`Submesh` objects (Alpa's default space: ``power_of_two``)."""
    return [Submesh(h, d) for h, d in get_submesh_choices(num_hosts, devices_per_host, space)]


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


@dataclass(frozen=True)
class StageMemoryStats:
    """The memory terms of Alpa's ``get_merged_stages_memory_stats`` for one stage on one device, bytes.

    ``peak``: the stage's own peak while it runs one micro-batch's forward + backward (weights in the
    model dtype, fp32 gradient accumulators, that micro-batch's activations); ``initial``: what only
    the optimizer step reads (fp32 master weights and Adam's two moments); ``intermediate``: the
    activations one micro-batch keeps from its forward to its backward.
    """

    peak: float
    initial: float
    intermediate: float


def stage_memory_stats(spec: TransformerSpec, n_layers: int, with_embedding: bool, with_head: bool, cfg: MeshConfig,
                       mb_dev: int, recompute: str = "none") -> StageMemoryStats:
    """Alpa's memory terms of a stage of ``n_layers`` layers on one device of logical mesh ``cfg``
    running ``mb_dev`` sequences (Korthikanti et al. activations, Megatron's parameter sharding)."""
    t = cfg.tp
    vpad = spec.padded_vocab(t)
    params = n_layers * layer_param_count(spec, t, expert_tp=t)  # Megatron splits each expert as its MLP
    if with_embedding:
        params += vpad * spec.hidden / t + spec.position_params
    if with_head:
        params += 2 * spec.hidden + (0 if (with_embedding and spec.tie_embeddings) else vpad * spec.hidden / t)
    plan = ParallelPlan(tp=t, micro_batch=mb_dev, recompute=recompute)  # type: ignore[arg-type]
    act = n_layers * activation_bytes_per_layer(spec, plan)
    if with_head:
        act += 4.0 * spec.seq * mb_dev * spec.hidden / t * (1.0 + vpad / spec.hidden)
    weights_and_grads = params * (spec.dtype_bytes + GRAD_BYTES_PER_PARAM)
    return StageMemoryStats(peak=weights_and_grads + act, initial=params * OPTIMIZER_BYTES_PER_PARAM,
                            intermediate=act)


def alpa_max_n_succ_stages(available: float, peak: float, initial: float, intermediate: float) -> int:
    """Alpa's bound on the stages after a stage: ``(available - peak - initial) // intermediate - 1``,
    clipped to ``[-1, 2**20]`` (``get_merged_stages_memory_stats``)."""
    k = (available - peak - initial) // max(intermediate, 1e-8) - 1
    return int(min(max(-1, k), MAX_SUCC_CAP))


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
    not divide the heads / FFN. ``memory_bytes`` defaults to the platform's device memory;
    ``max_n_succ_stages`` is Alpa's :func:`alpa_max_n_succ_stages` of :func:`stage_memory_stats`
    with the memory less :data:`RESERVED_BYTES` available.
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
    available = memory_bytes - RESERVED_BYTES  # what a device reports free next to the framework's reserve
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
                    m = stage_memory_stats(spec, n, emb, head, cfg, mb_dev, recompute)
                    succ[i, j, s, c] = alpa_max_n_succ_stages(available, m.peak, m.initial, m.intermediate)
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


# ============================================================================ Alpa's interfaces
@dataclass(frozen=True)
class LogicalMesh:
    """A logical device mesh of a submesh; ``shape`` is ``(data-parallel, model-parallel)`` devices."""

    shape: tuple[int, int]


#: Alpa's logical-mesh spaces (``AutoStageOption.submesh_logical_shape_space``)
LOGICAL_SPACES = ("single_node_model_parallel", "all", "same_as_physical", "data_parallel_only", "model_parallel_only")
_FORCE_BATCH = {"force_batch_dim_to_mesh_dim": 0}


def get_one_submesh_autosharding_config_choices(submesh: tuple[int, int], space: str,
                                                batch_size: int) -> list[tuple[LogicalMesh, dict]]:
    """The ``(logical mesh, autosharding option dict)`` configs Alpa tries on one ``(hosts, devices per
    host)`` submesh, in Alpa's order: for ``all`` / ``single_node_model_parallel`` every model-parallel
    size ``mp = 1, 2, ...`` (up to the submesh's devices, or one host's) dividing the devices whose
    data-parallel size divides ``batch_size``, with the batch forced onto mesh dimension 0, then the
    ``(devices, 1)`` mesh with free batch sharding."""
    hosts, per_host = submesh
    n = hosts * per_host
    if space in ("all", "single_node_model_parallel"):
        top = n if space == "all" else per_host
        out = [(LogicalMesh((n // mp, mp)), dict(_FORCE_BATCH)) for mp in range(1, top + 1)
               if n % mp == 0 and batch_size % (n // mp) == 0]
        return [*out, (LogicalMesh((n, 1)), {})]
    if space == "same_as_physical":
        return [(LogicalMesh((hosts, per_host)), {})]
    if space == "data_parallel_only":
        return [(LogicalMesh((n, 1)), dict(_FORCE_BATCH))]
    if space == "model_parallel_only":
        return [(LogicalMesh((1, n)), dict(_FORCE_BATCH))]
    raise ValueError(f"unknown logical mesh space {space!r}: {', '.join(LOGICAL_SPACES)}")


def get_all_submesh_autosharding_config_choices(virtual_mesh: object, submesh_choices: Sequence[tuple[int, int]],
                                                space: str, batch_size: int) -> list[list]:
    """Every submesh's configs, padded with ``None`` to the longest list (Alpa's function of this name;
    ``virtual_mesh`` is accepted for its signature and not read)."""
    configs = [get_one_submesh_autosharding_config_choices(tuple(sm), space, batch_size)  # type: ignore[arg-type]
               for sm in submesh_choices]
    width = max(len(c) for c in configs)
    return [c + [None] * (width - len(c)) for c in configs]


def mesh_config_of(logical: LogicalMesh) -> MeshConfig:
    """The (dp, tp) that tuner predicts for a logical mesh: dimension 0 data, dimension 1 tensor parallel.

    A config that leaves the batch sharding free is predicted as the same (dp, tp) split."""
    return MeshConfig(int(logical.shape[0]), int(logical.shape[1]))


@dataclass(frozen=True)
class VirtualMesh:
    """The cluster as Alpa's ``VirtualPhysicalMesh`` shows it to ``get_compute_cost``."""

    num_hosts: int
    num_devices_per_host: int
    memory_bytes: float  #: device memory, bytes
    platform: Platform | None = None  #: the devices, for the default stage predictor

    @classmethod
    def from_platform(cls, platform: Platform, num_hosts: int, num_devices_per_host: int | None = None) -> VirtualMesh:
        """``num_hosts`` hosts of ``platform`` devices (per host: the catalog's unless given)."""
        return cls(num_hosts, num_devices_per_host or platform.devices_per_node, platform.memory_bytes, platform)

    @property
    def num_devices(self) -> int:
        """Devices of the cluster."""
        return self.num_hosts * self.num_devices_per_host

    def get_available_memory(self) -> float:
        """Bytes a device has free for a stage (its memory less the framework's reserve)."""
        return self.memory_bytes - RESERVED_BYTES


@dataclass
class AutoStageOption:
    """The fields of Alpa's ``AutoStageOption`` that ``get_compute_cost`` reads, with Alpa's defaults."""

    submesh_physical_shape_space: str = "power_of_two"
    manually_specified_submeshes: Sequence[tuple[int, int]] | None = None
    submesh_logical_shape_space: str = "single_node_model_parallel"
    layer_profile_mode: str = "composition"
    stage_imbalance_tolerance: float = np.inf
    use_hlo_cost_model: bool = False
    profiling_database_filename: str | None = None
    cached_profile_result: str | None = None


@dataclass(frozen=True)
class AlpaLayer:
    """One of Alpa's pipeline layers: the forward or the backward of layer group ``group``."""

    spec: TransformerSpec
    group: int
    n_layers: int  #: transformer layers in the group
    with_embedding: bool
    with_head: bool
    micro_batch: int  #: sequences per micro-batch
    backward: bool = False
    recompute: str = "none"

    @property
    def flops(self) -> float:
        """FLOPs of this layer on one micro-batch (a backward does twice its forward's)."""
        head = 2.0 * self.spec.seq * self.spec.hidden * self.spec.vocab
        per_layer = (self.spec.forward_flops_per_sequence() - head) / self.spec.layers
        fwd = self.micro_batch * (self.n_layers * per_layer + head * self.with_head)
        return fwd * (2.0 if self.backward else 1.0)


def alpa_layers(spec: TransformerSpec, n_groups: int, micro_batch: int, recompute: str = "none") -> list[AlpaLayer]:
    """Alpa's ``layers`` for training ``spec``: ``n_groups`` forward layers, then their backwards in reverse."""
    sizes = layer_groups(spec.layers, n_groups)
    fwd = [AlpaLayer(spec, g, int(n), g == 0, g == n_groups - 1, micro_batch, False, recompute)
           for g, n in enumerate(sizes)]
    return fwd + [replace(layer, backward=True) for layer in reversed(fwd)]


def get_compute_cost(virtual_mesh: VirtualMesh, submesh_choices: Sequence[tuple[int, int]],
                     autosharding_configs: Sequence[Sequence], layers: Sequence[AlpaLayer],
                     accumulator_mapping: object = None, acc_grad_invars: object = None, acc_grad_outvars: object = None,
                     apply_grad_layers: object = None, apply_grad_global_info: object = None,
                     num_micro_batches: int = 1, default_as_option: object = None,
                     auto_stage_option: AutoStageOption | None = None, inference_mode: bool = False, *,
                     predictor: StageLatencyPredictor | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Alpa's ``get_compute_cost`` with predicted instead of profiled stages.

    Same arguments and return values: ``compute_cost[L, L, S, C]`` (seconds of one micro-batch's
    forward + backward of layers ``i..j`` on submesh ``s`` with config ``c``; ``inf`` where Alpa
    profiles nothing) and ``max_n_succ_stages[L, L, S, C]`` (:func:`alpa_max_n_succ_stages`; -1 where
    nothing). As in Alpa's "composition" mode, a submesh as large as the cluster only holds the
    whole model, a stage whose share of the FLOPs is off the submesh's share of the devices by more
    than ``stage_imbalance_tolerance`` is skipped, and ``None`` configs are skipped; "individual"
    mode sums single-layer costs. ``layers`` are :func:`alpa_layers`; the JAX-specific arguments
    (accumulator mapping, gradient variables, apply-grad layers, default auto-sharding option) are
    accepted and not read. ``predictor`` defaults to a :class:`SimulatedStagePredictor` of the
    mesh's platform (:meth:`VirtualMesh.from_platform`); a learned stage model plugs in the same way.
    """
    if inference_mode:
        raise ValueError("inference_mode: tuner predicts training stages (forward + backward) only")
    if predictor is None:
        if virtual_mesh.platform is None:
            raise ValueError("give predictor= or a VirtualMesh with a platform (VirtualMesh.from_platform)")
        predictor = SimulatedStagePredictor(virtual_mesh.platform)
    opt = auto_stage_option or AutoStageOption()
    if opt.layer_profile_mode not in ("composition", "individual"):
        raise ValueError(f"unknown layer_profile_mode {opt.layer_profile_mode!r}: composition or individual")
    if len(layers) % 2:
        raise ValueError("training layers come in forward / backward pairs (an even count)")
    L, S = len(layers) // 2, len(submesh_choices)
    C = len(autosharding_configs[0])
    fwd = list(layers[:L])
    prefix = np.concatenate([[0.0], np.cumsum([layer.flops for layer in layers])])
    total = prefix[-1]
    cost = np.full((L, L, S, C), np.inf)
    succ = np.full((L, L, S, C), -1, dtype=np.int64)
    available = virtual_mesh.get_available_memory()
    for m, (hosts, per_host) in enumerate(submesh_choices):
        ratio = hosts * per_host / virtual_mesh.num_devices
        for c, config in enumerate(autosharding_configs[m]):
            if config is None:
                continue
            mesh = mesh_config_of(config[0])
            for i in range(L):
                for j in range(i, L):
                    if ratio == 1 and not (i == 0 and j == L - 1):
                        continue
                    share = (prefix[j + 1] - prefix[i] + prefix[2 * L - i] - prefix[2 * L - j - 1]) / total
                    tol = 1.0 + opt.stage_imbalance_tolerance
                    if ratio > share * tol or ratio < share / tol:
                        continue
                    parts = [fwd[i:j + 1]] if opt.layer_profile_mode == "composition" else [[x] for x in fwd[i:j + 1]]
                    found = [_predict_group(g, Submesh(hosts, per_host), mesh, predictor) for g in parts]
                    if any(f is None for f in found):
                        continue
                    cost[i, j, m, c] = sum(f[0] for f in found)  # type: ignore[index]
                    stats = [f[1] for f in found]  # type: ignore[index]
                    # merged layers: all their weights, gradients and activations are live at the fwd/bwd turn
                    succ[i, j, m, c] = alpa_max_n_succ_stages(available, sum(st.peak for st in stats),
                                                              sum(st.initial for st in stats),
                                                              sum(st.intermediate for st in stats))
    return cost, succ


def _predict_group(group: Sequence[AlpaLayer], submesh: Submesh, mesh: MeshConfig,
                   predictor: StageLatencyPredictor) -> tuple[float, StageMemoryStats] | None:
    """(seconds, memory) of layers ``group`` as one stage on ``mesh``; ``None`` when it cannot run there."""
    first, last = group[0], group[-1]
    spec, mb = first.spec, first.micro_batch
    if mb % mesh.dp:
        return None
    try:
        check_plan(replace(spec, layers=1), ParallelPlan(tp=mesh.tp, micro_batch=mb // mesh.dp,
                                                         global_batch=mb // mesh.dp))
    except PlanError:
        return None
    n = sum(x.n_layers for x in group)
    q = StageQuery(spec, n, first.with_embedding, last.with_head, submesh, mesh, mb, first.recompute)
    stats = stage_memory_stats(spec, n, first.with_embedding, last.with_head, mesh, mb // mesh.dp, first.recompute)
    return float(predictor.stage_latency(q)), stats


def alpa_solution(plan: StagePlan) -> list[tuple[tuple[int, int], int, int]]:
    """The DP's stages as Alpa's ``training_dp`` solution: ``((first layer, last layer + 1), submesh, config)``."""
    return [((st.first, st.last + 1), st.submesh_index, st.config_index) for st in plan.stages]


def training_dp(num_layers: int, num_devices: int, num_microbatches: int, submesh_choices: Sequence[tuple[int, int]],
                num_autosharding_configs: int, compute_cost: np.ndarray, max_n_succ_stages: np.ndarray
                ) -> tuple[float, list[tuple[tuple[int, int], int, int]] | None]:
    """Alpa's ``training_dp`` signature over :func:`stage_construction_dp`: (pipeline latency, solution),
    ``(inf, None)`` when no split fits."""
    shape = (num_layers, num_layers, len(submesh_choices), num_autosharding_configs)
    if np.shape(compute_cost) != shape:
        raise ValueError(f"compute_cost has shape {np.shape(compute_cost)}, expected {shape}")
    plan = stage_construction_dp(compute_cost, max_n_succ_stages, [h * d for h, d in submesh_choices], num_devices,
                                 num_microbatches)
    return (math.inf, None) if plan is None else (plan.total_latency_s, alpa_solution(plan))


def manual_stage_option(plan: StagePlan, submesh_choices: Sequence[tuple[int, int]],
                        autosharding_configs: Sequence[Sequence]) -> dict:
    """The keyword arguments of Alpa's ``ManualStageOption`` for the DP's ``plan`` (as Alpa parses its own
    solution): ``ManualStageOption(**manual_stage_option(...))`` replays the plan in Alpa."""
    picked = [autosharding_configs[st.submesh_index][st.config_index] for st in plan.stages]
    if any(p is None for p in picked):
        raise ValueError("the plan uses a padding (None) config: compute_cost and configs do not match")
    return {
        "forward_stage_layer_ids": [list(range(st.first, st.last + 1)) for st in plan.stages],
        "submesh_physical_shapes": [tuple(submesh_choices[st.submesh_index]) for st in plan.stages],
        "submesh_logical_shapes": [tuple(p[0].shape) for p in picked],
        "submesh_autosharding_option_dicts": [dict(p[1]) for p in picked],
    }
