"""The one cost function every search calls.

:func:`evaluate_graph` is the cost of any candidate: simulate its ExecutionGraph with a
timing, check its memory against the device, and report time, memory, feasibility and
price. Space-specific helpers (``DLRMShardingJob``) only build the graph and the memory
estimate of a candidate and hand them to it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from predictor.graph import Category, ExecutionGraph, GraphBuilder, ProcKind
from predictor.simulate import Timeline, simulate
from predictor.sources.synth.dlrm import (
    DLRMGraphTemplate,
    DLRMSpec,
    all_to_all_message_bytes,
    build_dlrm_graph,
    dlrm_dense_memory,
    dlrm_memory_per_rank,
)
from predictor.timing.kernels import ModelTiming
from predictor.timing.platforms.host import comm_thread_has_core
from predictor.timing.platforms.schema import Platform

__all__ = ["CostResult", "evaluate_graph", "DLRMShardingJob"]


@dataclass
class CostResult:
    """What a search learns about one candidate (seconds, bytes, USD)."""

    predicted_iteration_s: float
    per_rank_s: list[float]
    memory_bytes_per_rank: list[float]
    feasible: bool
    reason: str = ""
    kernel_sum_s: float = float("nan")
    breakdown: dict[str, float] = field(default_factory=dict)
    timing_source: str = "analytic"
    usd_per_iteration: float | None = None

    def as_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return asdict(self)

    @property
    def objective(self) -> float:
        """Lower is better; infeasible candidates are +inf."""
        return self.predicted_iteration_s if self.feasible else float("inf")


def evaluate_graph(
    graph: ExecutionGraph,
    timing: ModelTiming,
    memory_bytes_per_rank: np.ndarray,
    platform: Platform,
    *,
    n_devices: int | None = None,
    durations: np.ndarray | None = None,
) -> tuple[CostResult, Timeline]:
    """Simulate ``graph`` and check it against ``platform``'s memory and price (seconds, bytes, USD).

    ``durations``: the tasks' seconds when the caller has them already (else ``timing`` gives them)."""
    tl = simulate(graph, timing if durations is None else durations)
    mem = np.asarray(memory_bytes_per_rank, dtype=float)
    cap = platform.memory_bytes
    over = np.flatnonzero(mem > cap)
    feasible = over.size == 0
    reason = ""
    if not feasible:
        r = int(over[np.argmax(mem[over])])
        reason = f"rank {r} needs {mem[r] / 2**30:.1f} GiB, device has {cap / 2**30:.1f} GiB"
    n_dev = n_devices or graph.n_ranks
    usd = None
    if platform.price_per_device_hour_usd is not None:
        usd = tl.iteration_s * n_dev * platform.price_per_device_hour_usd / 3600.0
    result = CostResult(
        predicted_iteration_s=tl.iteration_s,
        per_rank_s=[float(x) for x in tl.per_rank_s],
        memory_bytes_per_rank=[float(x) for x in mem],
        feasible=feasible,
        reason=reason,
        kernel_sum_s=tl.kernel_sum_s(),
        breakdown=tl.breakdown().as_dict(),
        timing_source=timing.source,
        usd_per_iteration=usd,
    )
    return result, tl


@dataclass
class DLRMShardingJob:
    """One DLRM training task at one batch size on ``n_ranks`` devices of ``platform``.

    On an accelerator the job keeps one :class:`DLRMGraphTemplate` for all its placements and, when
    the timing prices every task on its own parameters (no step-reuse curve, no host contention),
    the durations of the template's pool: a placement's durations are then gathered from them and
    only its all-to-alls, whose message size the placement sets, are timed again.
    """

    spec: DLRMSpec
    n_ranks: int
    platform: Platform
    timing: ModelTiming
    #: CPU platforms: torch threads per rank process (with the rank count, decides whether gloo's
    #: threads have cores of their own, :func:`predictor.timing.platforms.host.comm_thread_has_core`)
    threads_per_rank: int = 1
    _template: DLRMGraphTemplate | None = field(default=None, init=False, repr=False)
    _pool_s: np.ndarray | None = field(default=None, init=False, repr=False)
    _a2a_s: dict[float, float] = field(default_factory=dict, init=False, repr=False)
    _dense_memory: tuple[float, float] | None = field(default=None, init=False, repr=False)
    _loads: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)

    @property
    def template(self) -> DLRMGraphTemplate | None:
        """The graph template of the job's placements (None on CPU platforms: host-mode graphs)."""
        if self.platform.kind == "cpu":
            return None
        if self._template is None:
            self._template = DLRMGraphTemplate(self.spec, self.n_ranks)
        return self._template

    def graph(self, assignment: np.ndarray) -> ExecutionGraph:
        """The iteration graph of a table -> rank assignment (host mode on CPU platforms)."""
        template = self.template
        if template is not None:
            return template.graph(assignment)
        comm_threads = comm_thread_has_core(self.n_ranks, self.threads_per_rank)
        return build_dlrm_graph(self.spec, assignment, self.n_ranks, mode="host", comm_threads=comm_threads)

    def timed_graph(self, assignment: np.ndarray, *, params: bool = True) -> tuple[ExecutionGraph, np.ndarray]:
        """The iteration graph of ``assignment`` and its task durations (seconds); ``params=False``: a graph
        without kernel parameters where the template allows (enough to simulate)."""
        template = self.template
        if template is None or not self._per_task_timing():
            graph = self.graph(assignment)
            return graph, self.timing.durations(graph)
        graph, pool_index, a2a = template.assemble(assignment, params=params)
        dur = self._pool_seconds()[pool_index]
        if a2a.size:
            dur[a2a] = self._all_to_all_seconds(float(all_to_all_message_bytes(self.spec, assignment, self.n_ranks))
                                                if self.n_ranks > 1 else 0.0)
        return graph, dur

    def _pool_seconds(self) -> np.ndarray:
        """Durations of the template's pool tasks (seconds), timed once."""
        if self._pool_s is None:
            assert self.template is not None
            self._pool_s = self.timing.durations(self.template.pool)
        return self._pool_s

    def lower_bound(self, assignment: np.ndarray) -> float:
        """A closed-form lower bound of :meth:`objective` (seconds): the busiest CPU thread or compute stream
        of any rank, whose tasks run one after another (0 where the timing is not per task; +inf when the
        placement does not fit)."""
        if np.any(self.memory(assignment) > self.platform.memory_bytes):
            return float("inf")
        template = self.template
        if template is None or not self._per_task_timing():
            return 0.0
        if self._loads is None:
            self._loads = template.processor_seconds(self._pool_seconds())
        base, per_table = self._loads
        busy = base[None, :2] + np.stack([np.bincount(assignment, weights=per_table[:, p], minlength=self.n_ranks)
                                          for p in range(2)], axis=1)
        return float(busy.max())

    def memory(self, assignment: np.ndarray) -> np.ndarray:
        """Device memory of each rank under ``assignment`` (bytes)."""
        if self._dense_memory is None:
            self._dense_memory = dlrm_dense_memory(self.spec, self.n_ranks)
        return dlrm_memory_per_rank(self.spec, assignment, self.n_ranks, self._dense_memory)

    def _per_task_timing(self) -> bool:
        """Whether the timing prices each task from its own parameters alone (then a task copied from the
        template's pool takes the pool task's time)."""
        return not self.platform.embedding_step_reuse and not self.timing.contention_factors(self.n_ranks)

    def _all_to_all_seconds(self, msg_bytes: float) -> float:
        """Seconds of the job's all-to-all of ``msg_bytes`` per rank (timed once per message size)."""
        if msg_bytes not in self._a2a_s:
            b = GraphBuilder()
            proc = b.processor(0, ProcKind.GPU_STREAM, "stream comm")
            b.task(proc, "all_to_all", "all_to_all", Category.COMMUNICATION,
                   params={"msg_bytes": msg_bytes, "world": self.n_ranks, "dtype_bytes": self.spec.dtype_bytes})
            self._a2a_s[msg_bytes] = float(self.timing.durations(b.build())[0])
        return self._a2a_s[msg_bytes]

    def evaluate(self, assignment: np.ndarray) -> tuple[CostResult, Timeline]:
        """Cost of a table -> rank assignment."""
        mem = self.memory(assignment)
        graph, dur = self.timed_graph(assignment)
        return evaluate_graph(graph, self.timing, mem, self.platform, durations=dur)

    def objective(self, assignment: np.ndarray) -> float:
        """Predicted iteration time (seconds; +inf when it does not fit)."""
        if np.any(self.memory(assignment) > self.platform.memory_bytes):
            return float("inf")
        graph, dur = self.timed_graph(assignment, params=False)
        return simulate(graph, dur).iteration_s

    def table_capacity_bytes(self, memory_fraction: float) -> float:
        """Bytes of each device the sharders may fill with tables (paper: 80% of DRAM)."""
        return memory_fraction * self.platform.memory_bytes
