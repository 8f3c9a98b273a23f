"""The five CPU overhead types of Lin et al. 2022 (§III-C), measured from a trace itself.

* **T1** — between two top-level ops of a thread (end of one to start of the next);
* **T2** — from a top-level op's start to its first kernel launch;
* **T3** — from its last launch's end to the op's end;
* **T4** — one CUDA runtime call (``cudaLaunchKernel``, ``cudaMemcpyAsync``...), per call name;
* **T5** — between two consecutive launches of one op.

Ops that launch nothing contribute their host time as ``cpu`` samples.

Profiler overhead removal
-------------------------
Each profiled event costs the profiler time that the un-profiled run does not spend. Lin et
al. subtract a fixed cost per event (they cite 4 µs per GPU-side event from the PyTorch
source and find 2 µs per CPU event empirically). Here both costs are measured on the trace
itself:

* per runtime call: the mean traced duration of calls that do essentially nothing
  (``cudaStreamIsCapturing``, ``cudaGetDevice``, ``cudaPeekAtLastError``...) — what is
  left is the profiler's callback;
* per CPU op: the 10th percentile of the gaps between consecutive child ops inside one op —
  between two calls inside an ATen op there is little but the profiler's own bookkeeping.

Lin et al.'s constants are the fallback when a trace has too few such samples. Every sample
has ``cost x (profiled events inside its interval)`` subtracted (clipped at 0); outliers
beyond the 1.5-IQR whiskers of each type are dropped before the means, as in the paper.

The result is an :class:`OverheadTable`: JSON-serialisable, mergeable across traces (the
paper's *shared overheads*) and usable on predicted graphs (:meth:`OverheadTable.durations`,
:meth:`OverheadTable.type_means_s`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from predictor.graph import ExecutionGraph, Overhead
from predictor.sources.traces.kineto import EventCat, KinetoTrace
from predictor.sources.traces.load import TraceSet

__all__ = ["OverheadStat", "OverheadTable", "extract_overheads", "LIN2022_RUNTIME_COST_S", "LIN2022_CPU_COST_S"]

#: Lin et al. 2022 §III-C: profiler cost of a GPU-side (runtime) event, seconds
LIN2022_RUNTIME_COST_S = 4e-6
#: Lin et al. 2022 §III-C: empirical profiler cost of a CPU event, seconds
LIN2022_CPU_COST_S = 2e-6
_TRIVIAL_CALLS = (
    "cudaStreamIsCapturing", "cudaGetDevice", "cudaPeekAtLastError", "cudaGetLastError",
    "cudaStreamGetPriority", "cudaDeviceGetStreamPriorityRange", "cudaStreamGetCaptureInfo",
    "cudaStreamGetCaptureInfo_v2", "cudaDeviceGetAttribute", "cudaPointerGetAttributes",
)
_TYPES = ("T1", "T2", "T3", "T4", "T5", "cpu")


@dataclass
class OverheadStat:
    """Summary of one overhead's samples (seconds)."""

    count: int
    mean_s: float
    median_s: float
    std_s: float

    @staticmethod
    def of(samples: np.ndarray) -> OverheadStat:
        if samples.size == 0:
            return OverheadStat(0, math.nan, math.nan, math.nan)
        return OverheadStat(int(samples.size), float(samples.mean()), float(np.median(samples)), float(samples.std()))

    @staticmethod
    def merged(stats: list[OverheadStat]) -> OverheadStat:
        """Count-weighted pooling (the median is the count-weighted mean of the medians)."""
        stats = [s for s in stats if s.count > 0]
        n = sum(s.count for s in stats)
        if n == 0:
            return OverheadStat(0, math.nan, math.nan, math.nan)
        mean = sum(s.count * s.mean_s for s in stats) / n
        var = sum(s.count * (s.std_s**2 + (s.mean_s - mean) ** 2) for s in stats) / n
        med = sum(s.count * s.median_s for s in stats) / n
        return OverheadStat(n, mean, med, math.sqrt(var))


@dataclass
class OverheadTable:
    """Shared-overhead table: per type, per op name and type, per runtime call (seconds).

    ``by_type``: ``"T1"``..``"T5"`` and ``"cpu"`` over all ops; ``by_op``: op name ->
    type -> stat; ``by_runtime``: runtime call name -> T4 stat; ``profiler_cost_s``: the
    per-event costs that were subtracted (``"cpu_op"``, ``"runtime_call"``) and how they were
    found; ``sources``: the traces it was measured on.
    """

    by_type: dict[str, OverheadStat]
    by_op: dict[str, dict[str, OverheadStat]]
    by_runtime: dict[str, OverheadStat]
    profiler_cost_s: dict[str, float]
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ lookups
    def seconds(self, kind: str, op: str | None = None, runtime: str | None = None) -> float:
        """Mean seconds of overhead ``kind`` (``"T1"``..``"T5"``, ``"cpu"``) for an op or runtime
        call, falling back to the type-wide mean (NaN if the type was never seen)."""
        if kind == "T4" and runtime is not None:
            s = self.by_runtime.get(runtime)
            if s is not None and s.count:
                return s.mean_s
        if op is not None:
            s = self.by_op.get(op, {}).get(kind)
            if s is not None and s.count:
                return s.mean_s
        s = self.by_type.get(kind)
        return s.mean_s if s is not None and s.count else math.nan

    def durations(self, graph: ExecutionGraph) -> np.ndarray:
        """Seconds for every task with an overhead type T1..T5 of ``graph``, looked up by its
        name (op name or runtime call), NaN for the other tasks (STEP included). For predicted graphs."""
        out = np.full(graph.n_tasks, np.nan)
        names = graph.names
        cache: dict[tuple[int, int], float] = {}
        kinds = {int(Overhead.T1): "T1", int(Overhead.T2): "T2", int(Overhead.T3): "T3",
                 int(Overhead.T4): "T4", int(Overhead.T5): "T5"}
        for i in np.flatnonzero(graph.overhead != Overhead.NONE).tolist():
            key = (int(graph.overhead[i]), int(graph.name[i]))
            v = cache.get(key)
            if v is None:
                kind = kinds.get(key[0])
                if kind is None:  # STEP, SPARSE_TABLE: no per-op trace statistic; the platform prices them
                    continue
                nm = names[key[1]]
                v = self.seconds(kind, op=nm, runtime=nm if kind == "T4" else None)
                cache[key] = v
            out[i] = v
        return out

    def type_means_s(self) -> dict[str, float]:
        """The type-wide means (seconds, 0 where unmeasured) as the fields of the platform schema's
        ``CpuOverheads``: ``CpuOverheads(**table.type_means_s())``."""

        def m(k: str) -> float:
            v = self.seconds(k)
            return 0.0 if math.isnan(v) else max(v, 0.0)

        return {"t1_s": m("T1"), "t2_s": m("T2"), "t3_s": m("T3"), "t4_s": m("T4"), "t5_s": m("T5")}

    # ------------------------------------------------------------------ (de)serialisation
    def to_json(self) -> dict:
        return {
            "schema": "tuner.overheads/1",
            "units": "seconds",
            "profiler_cost_s": dict(self.profiler_cost_s),
            "sources": list(self.sources),
            "notes": list(self.notes),
            "by_type": {k: asdict(v) for k, v in self.by_type.items()},
            "by_runtime": {k: asdict(v) for k, v in sorted(self.by_runtime.items())},
            "by_op": {op: {k: asdict(v) for k, v in d.items()} for op, d in sorted(self.by_op.items())},
        }

    @staticmethod
    def from_json(doc: dict) -> OverheadTable:
        def st(d: dict) -> OverheadStat:
            return OverheadStat(int(d["count"]), float(d["mean_s"]), float(d["median_s"]), float(d["std_s"]))

        return OverheadTable(
            by_type={k: st(v) for k, v in doc.get("by_type", {}).items()},
            by_op={op: {k: st(v) for k, v in d.items()} for op, d in doc.get("by_op", {}).items()},
            by_runtime={k: st(v) for k, v in doc.get("by_runtime", {}).items()},
            profiler_cost_s={k: float(v) for k, v in doc.get("profiler_cost_s", {}).items()},
            sources=list(doc.get("sources", [])),
            notes=list(doc.get("notes", [])),
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1, allow_nan=True))
        tmp.replace(path)
        return path

    @staticmethod
    def load(path: str | Path) -> OverheadTable:
        return OverheadTable.from_json(json.loads(Path(path).read_text()))

    @staticmethod
    def merge(tables: list[OverheadTable]) -> OverheadTable:
        """One shared table from several (Lin et al.'s *shared overheads* across workloads)."""
        types = sorted({k for t in tables for k in t.by_type})
        ops = sorted({k for t in tables for k in t.by_op})
        rts = sorted({k for t in tables for k in t.by_runtime})
        by_op: dict[str, dict[str, OverheadStat]] = {}
        for op in ops:
            kinds = sorted({k for t in tables for k in t.by_op.get(op, {})})
            by_op[op] = {k: OverheadStat.merged([t.by_op[op][k] for t in tables if k in t.by_op.get(op, {})])
                         for k in kinds}
        costs = {k: float(np.mean([t.profiler_cost_s[k] for t in tables if k in t.profiler_cost_s]))
                 for k in ("cpu_op", "runtime_call")}
        return OverheadTable(
            by_type={k: OverheadStat.merged([t.by_type[k] for t in tables if k in t.by_type]) for k in types},
            by_op=by_op,
            by_runtime={k: OverheadStat.merged([t.by_runtime[k] for t in tables if k in t.by_runtime]) for k in rts},
            profiler_cost_s=costs,
            sources=[s for t in tables for s in t.sources],
            notes=[f"merged from {len(tables)} tables"],
        )


# ----------------------------------------------------------------------------- extraction
def _whiskers(x: np.ndarray) -> np.ndarray:
    """Mask of the samples inside the 1.5-IQR whiskers."""
    if x.size < 4:
        return np.ones(x.size, dtype=bool)
    q1, q3 = np.percentile(x, [25, 75])
    iqr = q3 - q1
    return (x >= q1 - 1.5 * iqr) & (x <= q3 + 1.5 * iqr)


def _profiler_costs(kts: list[KinetoTrace], notes: list[str]) -> tuple[float, float]:
    trivial: list[float] = []
    child_gaps: list[float] = []
    for kt in kts:
        rt = np.flatnonzero(kt.cat == EventCat.RUNTIME)
        tri = {kt.names.index(n) for n in _TRIVIAL_CALLS if n in kt.names}
        if tri:
            sel = rt[np.isin(kt.name[rt], np.fromiter(tri, dtype=np.int32))]
            trivial.extend((kt.dur[sel] * 1e-6).tolist())
        ops = np.flatnonzero(kt.cat == EventCat.CPU_OP)
        for tid in np.unique(kt.tid[ops]):
            o = ops[kt.tid[ops] == tid]
            o = o[np.lexsort((-kt.dur[o], kt.ts[o]))]
            s = kt.ts[o]
            e = s + kt.dur[o]
            # consecutive ops where the second starts after the first ends and both lie in one parent:
            # the gap between siblings (a parent's running max end covers the second)
            prev_max = np.maximum.accumulate(e)
            gap = s[1:] - e[:-1]
            nested = np.zeros(o.size - 1, dtype=bool) if o.size > 1 else np.zeros(0, dtype=bool)
            if o.size > 2:
                nested[1:] = prev_max[:-2] >= e[1:-1]  # an earlier op still open encloses both
            sib = gap[(gap >= 0) & nested]
            child_gaps.extend((sib * 1e-6).tolist())
    if len(trivial) >= 20:
        c_rt = float(np.mean(trivial))  # the mean: whole-µs timestamps round a median to 0 or 1
        notes.append(f"runtime-call profiler cost {c_rt * 1e6:.2f} us: mean of {len(trivial)} trivial calls")
    else:
        c_rt = LIN2022_RUNTIME_COST_S
        notes.append("runtime-call profiler cost: Lin et al. 2022 value (too few trivial calls in the trace)")
    if len(child_gaps) >= 50:
        c_cpu = float(np.percentile(child_gaps, 10))
        notes.append(f"CPU-op profiler cost {c_cpu * 1e6:.2f} us: 10th percentile of {len(child_gaps)} sibling gaps")
    else:
        c_cpu = LIN2022_CPU_COST_S
        notes.append("CPU-op profiler cost: Lin et al. 2022 value (too few nested ops in the trace)")
    return c_cpu, c_rt


def _count_between(sorted_starts: np.ndarray, a: float, b: float) -> tuple[int, int]:
    """Index range of the events starting in ``[a, b)``."""
    return int(np.searchsorted(sorted_starts, a, "left")), int(np.searchsorted(sorted_starts, b, "left"))


def _n_between(sorted_starts: np.ndarray, a: float, b: float) -> int:
    lo, hi = _count_between(sorted_starts, a, b)
    return hi - lo


def _corrected(x0: float, x1: float, op_starts: np.ndarray, rt_starts: np.ndarray, c_cpu: float, c_rt: float) -> float:
    """Seconds of ``[x0, x1)`` (µs) less the profiler's cost for the events inside, at least 0."""
    return max((x1 - x0) * 1e-6 - c_cpu * _n_between(op_starts, x0, x1) - c_rt * _n_between(rt_starts, x0, x1), 0.0)


def extract_overheads(trace_set: TraceSet, *, remove_profiler: bool = True) -> OverheadTable:
    """Measure T1..T5 (and host-only op time) per op type on every rank of ``trace_set``."""
    from predictor.sources.traces.dependencies import LAUNCH_CALLS

    kts = [r.kineto for r in trace_set.ranks]
    notes: list[str] = []
    c_cpu, c_rt = _profiler_costs(kts, notes) if remove_profiler else (0.0, 0.0)
    samples: dict[str, list[tuple[str, float]]] = {k: [] for k in _TYPES}  # type -> (op or call, seconds)
    for kt in kts:
        names = kt.names
        launch_ids = np.asarray([i for i, n in enumerate(names) if n in LAUNCH_CALLS], dtype=np.int32)
        rt = np.flatnonzero(kt.cat == EventCat.RUNTIME)
        for i in rt.tolist():
            samples["T4"].append((names[kt.name[i]], max(kt.dur[i] * 1e-6 - c_rt, 0.0)))
        cpu = np.flatnonzero(kt.mask(EventCat.CPU_OP, EventCat.RUNTIME))
        for tid in np.unique(kt.tid[cpu]):
            _thread_samples(kt, cpu[kt.tid[cpu] == tid], launch_ids, c_cpu, c_rt, samples)
    by_type, by_op, by_runtime = _aggregate(samples, notes)
    return OverheadTable(by_type=by_type, by_op=by_op, by_runtime=by_runtime,
                         profiler_cost_s={"cpu_op": c_cpu, "runtime_call": c_rt},
                         sources=[kt.label for kt in kts], notes=notes)


def _thread_samples(kt: KinetoTrace, ev: np.ndarray, launch_ids: np.ndarray, c_cpu: float, c_rt: float,
                    samples: dict[str, list[tuple[str, float]]]) -> None:
    """T1, T2, T3, T5 and host-only op samples (seconds, profiler cost removed) of one thread's events."""
    names = kt.names
    ev = ev[np.lexsort((kt.cat[ev] == EventCat.RUNTIME, -kt.dur[ev], kt.ts[ev]))]
    is_op = kt.cat[ev] == EventCat.CPU_OP
    ops = ev[is_op]
    rts = ev[~is_op]
    if ops.size == 0:
        return
    s = kt.ts[ops]
    e = s + kt.dur[ops]
    prev_max = np.concatenate([[-np.inf], np.maximum.accumulate(e)[:-1]])
    top = s >= prev_max - 1e-3
    tops = ops[top]
    ts_ = kt.ts[tops]
    te_ = np.maximum.reduceat(e, np.flatnonzero(top)) if tops.size else np.zeros(0)
    op_starts_sorted = np.sort(s)
    rt_starts = kt.ts[rts]
    o = np.argsort(rt_starts, kind="stable")
    rts, rt_starts = rts[o], rt_starts[o]
    is_launch = np.isin(kt.name[rts], launch_ids)

    # T1: between consecutive top-level ops
    for k in range(1, tops.size):
        gap = (ts_[k] - te_[k - 1]) * 1e-6
        if gap >= 0:
            samples["T1"].append((names[kt.name[tops[k]]], max(gap - c_cpu, 0.0)))
    for k in range(tops.size):
        a, b = float(ts_[k]), float(te_[k])
        op_name = names[kt.name[tops[k]]]
        lo, hi = _count_between(rt_starts, a, b)
        lmask = is_launch[lo:hi]
        launches = rts[lo:hi][lmask]
        if launches.size == 0:
            host = (b - a) * 1e-6 - c_cpu * _n_between(op_starts_sorted, a, b) - c_rt * (hi - lo)
            samples["cpu"].append((op_name, max(host, 0.0)))
            continue
        ls = kt.ts[launches]
        le = ls + kt.dur[launches]
        cost = (op_starts_sorted, rt_starts, c_cpu, c_rt)
        samples["T2"].append((op_name, _corrected(a, float(ls[0]), *cost)))
        samples["T3"].append((op_name, _corrected(float(le[-1]), b, *cost)))
        for j in range(1, launches.size):
            if ls[j] >= le[j - 1]:
                samples["T5"].append((op_name, _corrected(float(le[j - 1]), float(ls[j]), *cost)))


def _aggregate(samples: dict[str, list[tuple[str, float]]], notes: list[str]):
    """(by type, by op and type, by runtime call) statistics of the samples inside the whiskers."""
    by_type: dict[str, OverheadStat] = {}
    by_op: dict[str, dict[str, OverheadStat]] = {}
    by_runtime: dict[str, OverheadStat] = {}
    for kind, lst in samples.items():
        if not lst:
            continue
        keys = np.asarray([k for k, _ in lst], dtype=object)
        vals = np.asarray([v for _, v in lst])
        keep = _whiskers(vals)
        notes.append(f"{kind}: {int((~keep).sum())} of {vals.size} samples outside the whiskers dropped")
        keys, vals = keys[keep], vals[keep]
        by_type[kind] = OverheadStat.of(vals)
        order = np.argsort(keys, kind="stable")
        keys, vals = keys[order], vals[order]
        uniq, start = np.unique(keys, return_index=True)
        bounds = list(start) + [keys.size]
        for j, name in enumerate(uniq.tolist()):
            stat = OverheadStat.of(vals[bounds[j] : bounds[j + 1]])
            if kind == "T4":
                by_runtime[name] = stat
            else:
                by_op.setdefault(name, {})[kind] = stat
    return by_type, by_op, by_runtime
