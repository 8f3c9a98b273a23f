"""The one cost function every search calls.

:func:`evaluate_graph` is the cost of any candidate: simulate its ExecutionGraph with a
timing, check its memory against the device, and report time, memory, feasibility and
price. Space-specific helpers (``DLRMShardingJob``) only build the graph and the memory
estimate of a candidate and hand them to it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from predictor.graph import ExecutionGraph
from predictor.simulate import Timeline, simulate
from predictor.sources.synth.dlrm import DLRMSpec, build_dlrm_graph, dlrm_memory_per_rank
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
) -> tuple[CostResult, Timeline]:
    """Simulate ``graph`` and check it against ``platform``'s memory and price (seconds, bytes, USD)."""
    tl = simulate(graph, timing)
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
    """One DLRM training task at one batch size on ``n_ranks`` devices of ``platform``."""

    spec: DLRMSpec
    n_ranks: int
    platform: Platform
    timing: ModelTiming
    #: CPU platforms: torch threads per rank process (with the rank count, decides whether gloo's
    #: threads have cores of their own, :func:`predictor.timing.platforms.host.comm_thread_has_core`)
    threads_per_rank: int = 1

    def graph(self, assignment: np.ndarray) -> ExecutionGraph:
        """The iteration graph of a table -> rank assignment (host mode on CPU platforms)."""
        host = self.platform.kind == "cpu"
        comm_threads = not host or comm_thread_has_core(self.n_ranks, self.threads_per_rank)
        return build_dlrm_graph(self.spec, assignment, self.n_ranks, mode="host" if host else "device",
                                comm_threads=comm_threads)

    def evaluate(self, assignment: np.ndarray) -> tuple[CostResult, Timeline]:
        """Cost of a table -> rank assignment."""
        mem = dlrm_memory_per_rank(self.spec, assignment, self.n_ranks)
        return evaluate_graph(self.graph(assignment), self.timing, mem, self.platform)

    def objective(self, assignment: np.ndarray) -> float:
        """Predicted iteration time (seconds; +inf when it does not fit)."""
        return self.evaluate(assignment)[0].objective

    def table_capacity_bytes(self, memory_fraction: float) -> float:
        """Bytes of each device the sharders may fill with tables (paper: 80% of DRAM)."""
        return memory_fraction * self.platform.memory_bytes
