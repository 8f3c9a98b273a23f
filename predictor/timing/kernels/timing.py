"""ModelTiming: durations for every task of a graph from kernel models and CPU overheads.

* CPU tasks with an overhead type (T1..T5) take the platform's overhead (Lin et al. 2022);
* tasks of a kind some kernel model claims are predicted by it, one vectorised call per kind;
* any other GPU task falls back to the roofline on its FLOPs/bytes;
* with ``keep_measured=True`` a task that has a measured duration keeps it (replay of the
  unchanged parts of a captured graph), otherwise every task is predicted;
* on a CPU platform calibrated for K ranks on the host (``Platform.host_contention[K]``), the
  predicted kernels of a K-rank graph are slowed by the measured factor of their class (embedding
  kinds, other memory-bound kernels, compute kernels) while another rank of the host runs a kernel (the
  ranks share caches and memory; a rank's tail that runs alone runs at its own speed:
  :mod:`predictor.timing.kernels.co_run`, a few simulations of the graph; ``co_run=False`` slows them throughout);
  and every class by the ``sync`` factor when the pack has one (K ranks in lockstep vs at once: at each
  collective every rank waits for the slowest, tails included; :mod:`predictor.timing.calibration.lockstep`);
* on a platform with a measured step-reuse curve (``Platform.embedding_step_reuse``), the embedding-bag
  kernels are scaled by its forward / backward factor at the graph's embedding working set (distinct rows x
  row bytes over every table of the ranks sharing the last-level cache: all ranks of a CPU host, each rank
  on its own elsewhere) over the LLC: the pack's models are fitted to cold timings, and in a step a table's
  backward finds the rows its forward read still cached while the working set fits
  (:mod:`predictor.timing.calibration.step_reuse`); where the pack measured it per pooling of the probe's tables
  (``Platform.embedding_step_reuse_pooling``) each table takes its pooling's factor;
* on a CPU platform with a measured pace (``Platform.kernel_pace``: how much slower the machine typically runs
  each kernel class than during the calibration that timed it), the predicted kernels of that class
  take that factor (before host contention; measured and overhead-typed tasks keep their time);
* on a CPU platform with measured collective waits for K ranks (``Platform.collective_wait_s[K]``), every
  collective task of a K-rank graph takes its kind's wait (seconds) more: the calibrated curves time the typical
  (median) call, a step pays the mean, scheduler-tick waits included. A graph is one training step.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from predictor.graph import Category, ExecutionGraph, Overhead
from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.kernels.collective import PiecewiseCollective
from predictor.timing.kernels.composite import AttentionModel, BatchNormModel, RecurrentModel
from predictor.timing.kernels.elementwise import Roofline
from predictor.timing.kernels.embedding import AnalyticEmbedding
from predictor.timing.kernels.gemm import AnalyticGemm
from predictor.timing.kernels.state import unwrap
from predictor.timing.kernels.step_reuse import reuse_factor, reuse_factors_by_pooling, step_working_set_bytes
from predictor.timing.platforms.schema import CpuOverheads, Platform


def overhead_array(o: CpuOverheads) -> np.ndarray:
    """Seconds of each :class:`Overhead` type of ``o``, indexed by its value (NONE: 0)."""
    return np.array([0.0, o.t1_s, o.t2_s, o.t3_s, o.t4_s, o.t5_s, o.step_s, o.sparse_table_s])


def analytic_models() -> list[KernelModel]:
    """The analytic model of each kernel family (used when a platform has no asset pack)."""
    return [AnalyticGemm(), AnalyticEmbedding(), PiecewiseCollective(), Roofline()]


#: backward kinds whose forward kind is not their name less ``_bwd``
_FORWARD_KIND = {"log_softmax_bwd": "softmax"}


def models_by_kind(models: Iterable[KernelModel]) -> dict[str, KernelModel]:
    """Op kind -> the first of ``models`` that claims it (a pack's model order decides a kind two models claim)."""
    by_kind: dict[str, KernelModel] = {}
    for model in models:
        for kind in model.kinds:
            by_kind.setdefault(kind, model)
    return by_kind


class ModelTiming:
    """A :class:`predictor.simulate.Timing` backed by kernel models on one platform."""

    def __init__(
        self,
        platform: Platform,
        models: Iterable[KernelModel] | None = None,
        *,
        overheads: CpuOverheads | None = None,
        keep_measured: bool = False,
        source: str = "analytic",
        co_run: bool = True,
    ) -> None:
        self.platform = platform
        self.models = list(models) if models is not None else analytic_models()
        self.overheads = overheads or platform.overheads
        self.keep_measured = keep_measured
        #: host contention only while another rank of the host runs (:mod:`predictor.timing.kernels.co_run`);
        #: False prices every kernel of a K-rank CPU graph at the contended speed throughout
        self.co_run = co_run
        #: step-reuse factors capped at 1 (:meth:`step_reuse_multipliers`); False: as measured
        self.cap_step_reuse = True
        #: which model family produced the numbers ("analytic", or an asset pack's name)
        self.source = source
        self._by_kind = models_by_kind(self.models)
        # recurrent layers, batch norm, fused attention: composed of this timing's GEMM and element-wise models
        for composite in (RecurrentModel(self.model_for), BatchNormModel(self.model_for),
                          AttentionModel(self.model_for)):
            if not any(k in self._by_kind for k in composite.kinds):
                self.models.append(composite)
                self._by_kind.update((k, composite) for k in composite.kinds)
        # the calibrated roofline (under its typical-state factor, if the pack has one) times unclaimed kinds
        self._fallback = next((m for m in self.models if isinstance(unwrap(m), Roofline)), Roofline())

    def model_for(self, kind: str) -> KernelModel:
        return self._by_kind.get(self.timed_kind(kind), self._fallback)

    def timed_kind(self, kind: str) -> str:
        """The op kind whose model times ``kind``: itself, or for a backward kind ``X_bwd`` that no model
        covers (an asset pack calibrated before backward kernels were benchmarked), its forward ``X``,
        timed with the backward task's own parameters (bytes moved) as before."""
        if kind in self._by_kind or not kind.endswith("_bwd"):
            return kind
        return _FORWARD_KIND.get(kind, kind[: -len("_bwd")])

    def overhead_seconds(self) -> np.ndarray:
        """Seconds of each :class:`Overhead` type, indexed by its value."""
        return overhead_array(self.overheads)

    def durations(self, graph: ExecutionGraph) -> np.ndarray:
        out = np.zeros(graph.n_tasks)
        has_overhead = graph.overhead != Overhead.NONE
        out[has_overhead] = self.overhead_seconds()[graph.overhead[has_overhead]]
        todo = ~has_overhead
        if self.keep_measured:
            measured = np.isfinite(graph.duration) & todo
            out[measured] = graph.duration[measured]
            todo &= ~measured
        # CPU-side tasks without an overhead type and without a measurement cost nothing
        on_device = todo & (graph.is_gpu() | (graph.category != Category.CPU))
        for kid in np.unique(graph.kind[on_device]):
            kind = graph.kinds[kid]
            idx = np.flatnonzero(on_device & (graph.kind == kid))
            timed = self.timed_kind(kind)
            out[idx] = self.model_for(timed).predict(TaskView.from_graph(graph, idx, timed), self.platform)
        self._apply_step_reuse(graph, on_device, out)
        self._apply_collective_wait(graph, on_device, out)
        pace = {cls: p for cls, p in self.platform.kernel_pace.items() if p != 1.0}
        factors = self.contention_factors(graph.n_ranks)
        if not pace and not factors:  # the class masks only when a factor needs them (the hot loop)
            return out
        classes = self.kernel_classes(graph)
        for cls, p in pace.items():  # the machine's typical pace against the calibration's
            out[on_device & classes[cls]] *= p
        if not factors:
            return out
        factor = np.ones(graph.n_tasks)
        busy = np.zeros(graph.n_tasks, dtype=bool)
        for cls, sel in classes.items():
            factor[on_device & sel] = factors.get(cls, 1.0)
            busy |= on_device & sel
        out[busy] *= factors.get("sync", 1.0)  # the ranks wait for each other at every collective (lockstep.py)
        if not self.co_run:
            return out * factor
        from predictor.simulate import simulate
        from predictor.timing.kernels.co_run import co_run_durations

        return co_run_durations(graph, out, factor, busy, simulate)

    @staticmethod
    def kernel_classes(graph: ExecutionGraph) -> dict[str, np.ndarray]:
        """Task masks of the kernel classes of host contention and pace (:data:`KERNEL_CLASSES`): the
        embedding kinds, every other memory-bound task, the compute tasks."""
        emb = graph.kind_mask(*AnalyticEmbedding.kinds)
        return {"embedding": emb, "memory": (graph.category == Category.MEMORY) & ~emb,
                "compute": graph.category == Category.COMPUTE}

    def step_working_sets(self, graph: ExecutionGraph) -> dict[int, float]:
        """Per cache domain (-1: every rank of a CPU host; else a rank), the step's embedding working set
        over the LLC (distinct rows x row bytes over the domain's tables / LLC bytes); {} without a
        step-reuse measurement, without embedding tasks, or when a forward task lacks its table's rows,
        batch or dim."""
        llc = self.platform.last_level_cache_bytes
        fwd = np.flatnonzero(graph.kind_mask("embedding_bag_fwd"))
        if not self.platform.embedding_step_reuse or llc <= 0 or fwd.size == 0:
            return {}
        tasks = TaskView.from_graph(graph, fwd, "embedding_bag_fwd")
        known = np.isfinite(tasks.get("rows")) & np.isfinite(tasks.get("batch")) & np.isfinite(tasks.get("dim"))
        if not known.all():  # a table of unknown size (a trace without its parameters): no working set
            return {}
        distinct = AnalyticEmbedding().distinct_rows(tasks)
        dim, dtype = tasks.get("dim", 1.0), tasks.get("dtype_bytes", 4.0)
        domain = np.full(fwd.size, -1) if self.platform.kind == "cpu" else graph.rank[fwd]
        return {int(d): step_working_set_bytes(distinct[domain == d], dim[domain == d], dtype[domain == d]) / llc
                for d in np.unique(domain)}

    def step_reuse_factors(self, graph: ExecutionGraph) -> dict[int, tuple[float, float]]:
        """Per cache domain (as :meth:`step_working_sets`), the (forward, backward) factor of the platform's
        step-reuse curve of table sums at that domain's working set; {} as :meth:`step_working_sets`."""
        curve = self.platform.embedding_step_reuse
        return {d: (reuse_factor(curve, x, "fwd"), reuse_factor(curve, x, "bwd"))
                for d, x in self.step_working_sets(graph).items()}

    def step_reuse_multipliers(self, graph: ExecutionGraph) -> np.ndarray:
        """Per task, the factor its predicted kernel time takes for the step's reuse (1 for all but the
        embedding-bag kernels): by each table's pooling where the platform has the per-pooling surface,
        else the curve of table sums (:meth:`step_reuse_factors`), each measured point taken at most 1
        (``cap_step_reuse``). The models are fitted to the cold protocol (cache evicted before every call), the
        worst a step can leave a table; a probe reading above 1 (single calls of 0.1-0.3 ms timed one by one,
        per-round ratios 0.4-1.9 on a Zen 4 VM) is noise, and in situ the light tables ran 0.63-0.76 their
        cold time at every batch of the e2e DLRM. With the cap, the e2e DLRM error on a Zen 4 VM's nine windows
        fell from 1.31 / 15.7 to 1.26 / 13.2 % (geomean / max against the medians)."""
        out = np.ones(graph.n_tasks)
        working_sets = self.step_working_sets(graph)
        if not working_sets:
            return out
        surface, curve = self.platform.embedding_step_reuse_pooling, self.platform.embedding_step_reuse
        if self.cap_step_reuse:  # each measured point at most 1, before interpolating between them
            surface = [[x, p, min(f, 1.0), min(b, 1.0)] for x, p, f, b in surface]
            curve = [[x, min(f, 1.0), min(b, 1.0)] for x, f, b in curve]
        pooling = graph.params.get("pooling")
        for which in ("fwd", "bwd"):
            kind = graph.kind_mask(f"embedding_bag_{which}")
            for d, x in working_sets.items():
                sel = kind if d == -1 else kind & (graph.rank == d)
                if surface and pooling is not None:
                    out[sel] = reuse_factors_by_pooling(surface, x, pooling[sel], which)
                else:
                    out[sel] = reuse_factor(curve, x, which)
        return out

    def _apply_step_reuse(self, graph: ExecutionGraph, on_device: np.ndarray, out: np.ndarray) -> None:
        """Scale the predicted embedding-bag kernels of ``out`` (seconds, in place) by
        :meth:`step_reuse_multipliers`."""
        if not self.platform.embedding_step_reuse:
            return
        m = self.step_reuse_multipliers(graph)
        out[on_device] *= m[on_device]

    def collective_waits(self, n_ranks: int) -> dict[str, float]:
        """Collective kind -> seconds each call of an ``n_ranks``-rank CPU-host graph waits on average beyond
        the calibrated (typical) call (``Platform.collective_wait_s``; {} without that measurement)."""
        if self.platform.kind != "cpu" or n_ranks < 2:
            return {}
        return dict(self.platform.collective_wait_s.get(int(n_ranks), {}))

    def _apply_collective_wait(self, graph: ExecutionGraph, on_device: np.ndarray, out: np.ndarray) -> None:
        """Add each kind's :meth:`collective_waits` to its predicted collective tasks of ``out`` (seconds, in place)."""
        for kind, wait in self.collective_waits(graph.n_ranks).items():
            if wait > 0:
                out[on_device & graph.kind_mask(kind)] += wait

    def contention_factors(self, n_ranks: int) -> dict[str, float]:
        """The platform's host-contention factors for ``n_ranks`` ranks on one CPU host ({} if none)."""
        if self.platform.kind != "cpu" or n_ranks < 2:
            return {}
        return dict(self.platform.host_contention.get(int(n_ranks), {}))
