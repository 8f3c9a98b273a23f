"""Replay: simulate a graph built from traces and compare it with the measured run.

``replay(path)`` reads the traces (:func:`~predictor.sources.traces.load.load_traces`), builds the
graph (:func:`~predictor.sources.traces.build.build_graph`), simulates it with the measured task
durations (:class:`~predictor.simulate.MeasuredTiming`: kernels and host compute segments; every wait —
syncs, blocking copies, launches held by a full queue, collectives, cross-thread and cross-stream
dependencies — is recomputed by the simulator; a collective without its peers' traces lasts its modelled
transfer, :mod:`~predictor.sources.traces.collectives`) and returns a :class:`ReplayResult`: per rank and
ProfilerStep the measured and simulated time with Lin et al.'s kernel-sum baseline, the peer wait, the Lumos Fig. 5
breakdown of both (a CPU capture's compute: its host ops), the critical path, and the GPU utilisation
over time (Lumos Fig. 6) of both. :func:`scaled_durations` perturbs the measured durations (the
replay must follow); :mod:`~predictor.simulate.kineto_export` writes the simulated run as Kineto traces.

A simulated step lasts from the simulated start of its ``ProfilerStep`` start marker to that of its
end marker, on the thread that holds the annotation: the simulated host decides it.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from predictor.graph import Category, GraphBuilder, ProcKind
from predictor.simulate import Breakdown, MeasuredTiming, Timeline, simulate, union_length
from predictor.sources.traces.build import ReplayGraph, build_graph
from predictor.sources.traces.collectives import CollectivePricing, price_collectives
from predictor.sources.traces.json_io import no_gc
from predictor.sources.traces.load import TraceSet, load_traces

if TYPE_CHECKING:
    from predictor.timing.platforms.schema import Platform

__all__ = ["ReplayResult", "replay", "replay_graph", "replay_durations", "scaled_durations", "measured_timeline",
           "window_breakdown", "busy_fraction", "kernel_sum_s", "work_masks", "HOST_COMM_PREFIXES"]


def _clip(start: np.ndarray, end: np.ndarray, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    s = np.clip(start, a, b)
    e = np.clip(end, a, b)
    keep = e > s
    return s[keep], e[keep]


#: host ops of a CPU capture that are collectives (gloo), not compute
HOST_COMM_PREFIXES = ("c10d::", "gloo:", "nccl:", "torch.distributed", "ProcessGroup")


def work_masks(g, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(compute, communication) task masks of ``rank``: GPU kernels and collectives; on a rank without GPU
    streams (a CPU capture) its host ops are the kernels — op segments, collectives by name — and the
    overhead gaps, runtime calls and waits are neither."""
    on = g.rank == rank
    gpu = g.is_gpu()
    if (on & gpu).any():
        comp = on & ((g.category == Category.COMPUTE) | (g.category == Category.MEMORY)) & gpu
        return comp, on & (g.category == Category.COMMUNICATION)
    is_comm = np.asarray([n.startswith(HOST_COMM_PREFIXES) for n in g.names], dtype=bool)
    ops = on & g.kind_mask("cpu_op")
    comm = ops & is_comm[g.name] if is_comm.size else ops & False
    return ops & ~comm, comm | (on & (g.category == Category.COMMUNICATION))


def window_breakdown(tl: Timeline, rank: int, a: float, b: float) -> Breakdown:
    """Lumos Fig. 5 breakdown of ``rank`` inside the window ``[a, b]`` (seconds); a CPU capture's compute is
    its host ops (:func:`work_masks`)."""
    comp, comm = work_masks(tl.graph, rank)
    cs, ce = _clip(tl.start[comp], tl.end[comp], a, b)
    ms, me = _clip(tl.start[comm], tl.end[comm], a, b)
    c = union_length(cs, ce)
    m = union_length(ms, me)
    both = union_length(np.concatenate([cs, ms]), np.concatenate([ce, me]))
    overlap = c + m - both
    total = max(b - a, 0.0)
    return Breakdown(total, c - overlap, m - overlap, overlap, max(total - both, 0.0))


def busy_fraction(tl: Timeline, rank: int, edges: np.ndarray, *, compute_only: bool = True) -> np.ndarray:
    """Fraction of each bin ``[edges[i], edges[i+1])`` during which at least one GPU stream of
    ``rank`` runs a (compute, unless ``compute_only=False``) task — Lumos Fig. 6."""
    g = tl.graph
    sel = (g.rank == rank) & g.is_gpu() & (g.category != Category.SYNC)  # no stream gaps
    if compute_only:
        sel &= g.category != Category.COMMUNICATION
    s, e = tl.start[sel], tl.end[sel]
    keep = e > s
    s, e = s[keep], e[keep]
    widths = np.diff(edges)
    if s.size == 0:
        return np.zeros(widths.size)
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum.accumulate(e[order])
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    seg_s = s[new]
    seg_e = e[np.append(np.flatnonzero(new)[1:] - 1, s.size - 1)]
    cum = np.concatenate([[0.0], np.cumsum(seg_e - seg_s)])

    def busy_until(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(seg_s, t, side="right")  # segments starting at or before t
        full = cum[np.maximum(k - 1, 0)]
        last = np.where(k > 0, np.minimum(t - seg_s[np.maximum(k - 1, 0)], (seg_e - seg_s)[np.maximum(k - 1, 0)]), 0.0)
        return full + np.maximum(last, 0.0)

    b = busy_until(edges)
    return np.diff(b) / np.where(widths > 0, widths, 1.0)


def kernel_sum_s(tl: Timeline, measured: Timeline, rank: int, a: float, b: float) -> float:
    """Lin et al.'s baseline for one step of ``rank``: the busiest GPU stream's summed task durations
    (kernels, copies, collectives; ``tl``'s durations) of the tasks that started in the measured window
    ``[a, b)`` seconds. Without GPU streams (a CPU capture) the busiest thread's summed op time."""
    g = tl.graph
    inside = (g.rank == rank) & (measured.start >= a) & (measured.start < b)
    gpu = g.is_gpu()
    if (gpu & (g.rank == rank)).any():
        sel = inside & gpu & (g.category != Category.SYNC)
    else:
        sel = inside & g.kind_mask("cpu_op")
    if not sel.any():
        return 0.0
    return float(np.bincount(g.proc[sel], weights=tl.duration[sel], minlength=g.n_procs).max())


@dataclass
class ReplayResult:
    """A simulated replay next to the measured run it came from."""

    graph: ReplayGraph
    timeline: Timeline
    measured: Timeline
    #: the collectives without their peers' traces, priced by the collective model (None: not priced)
    collectives: CollectivePricing | None = None

    # ------------------------------------------------------------------ steps
    def steps(self) -> pd.DataFrame:
        """One row per rank and step: ``name``, ``rank`` (as in the traces), ``measured_s``,
        ``predicted_s`` (the simulated host's step markers), ``error_pct`` (signed), window starts of
        both, and Lin et al.'s ``kernel_sum_s`` baseline with its ``kernel_sum_error_pct``."""
        st = self.graph.steps
        tl = self.timeline
        g = self.graph.graph
        pred, pstart = [], []
        for _, row in st.iterrows():
            if row["start_task"] >= 0:
                a = float(tl.start[int(row["start_task"])])
                b = float(tl.start[int(row["end_task"])])
            else:
                on = g.rank == row["rank"]
                a = float(tl.start[on].min())
                b = float(tl.end[on].max())
            pred.append(b - a)
            pstart.append(a)
        out = pd.DataFrame({
            "name": st["name"].to_numpy(),
            "rank": st["trace_rank"].to_numpy(),
            "graph_rank": st["rank"].to_numpy(),
            "measured_s": st["measured_s"].to_numpy(dtype=float),
            "predicted_s": np.asarray(pred, dtype=float),
            "measured_start_s": st["measured_start_s"].to_numpy(dtype=float),
            "predicted_start_s": np.asarray(pstart, dtype=float),
        })
        out["error_pct"] = (out["predicted_s"] - out["measured_s"]) / out["measured_s"] * 100.0
        out["kernel_sum_s"] = [kernel_sum_s(tl, self.measured, int(r.graph_rank), float(r.measured_start_s),
                                            float(r.measured_start_s + r.measured_s)) for r in out.itertuples()]
        out["kernel_sum_error_pct"] = (out["kernel_sum_s"] - out["measured_s"]) / out["measured_s"] * 100.0
        out["peer_wait_s"] = self._peer_wait(out)
        return out

    def _peer_wait(self, df: pd.DataFrame) -> np.ndarray:
        """Per step row, the measured NCCL time minus the modelled transfer of the collectives without their
        peers that started in the measured step (seconds; 0 where there are none)."""
        cp = self.collectives
        out = np.zeros(len(df))
        if cp is None or not cp.tasks.size:
            return out
        start = self.measured.start[cp.tasks]
        rank = self.graph.graph.rank[cp.tasks]
        wait = cp.wait_s
        for i, r in enumerate(df.itertuples()):
            sel = (rank == r.graph_rank) & (start >= r.measured_start_s) & (start < r.measured_start_s + r.measured_s)
            out[i] = float(wait[sel].sum())
        return out

    def iteration_s(self) -> tuple[float, float]:
        """(measured, predicted) iteration time: per step the slowest rank, averaged over steps."""
        df = self.steps()
        per = df.groupby("name", sort=False)[["measured_s", "predicted_s"]].max()
        return float(per["measured_s"].mean()), float(per["predicted_s"].mean())

    def _window(self, which: str, rank: int | None) -> tuple[int, float, float]:
        df = self.steps()
        if rank is None:
            rank = int(df.loc[df["predicted_s"].idxmax(), "graph_rank"]) if len(df) else 0
        mine = df[df["graph_rank"] == rank]
        col = "measured" if which == "measured" else "predicted"
        a = float(mine[f"{col}_start_s"].min())
        b = float((mine[f"{col}_start_s"] + mine[f"{col}_s"]).max())
        return rank, a, b

    def breakdown(self, which: str = "predicted", rank: int | None = None) -> Breakdown:
        """Exposed compute / exposed communication / overlap / idle over the replayed steps of
        ``rank`` (graph rank; default: the slowest), of the ``"predicted"`` or ``"measured"`` run."""
        rank, a, b = self._window(which, rank)
        tl = self.measured if which == "measured" else self.timeline
        return window_breakdown(tl, rank, a, b)

    def utilization(self, bin_s: float | None = None, rank: int | None = None) -> pd.DataFrame:
        """GPU compute-stream utilisation per time bin, measured vs predicted (Lumos Fig. 6).

        Times are seconds from each run's first step start; ``bin_s`` defaults to 1 ms (or
        1/500 of the window when that is longer than 0.5 s)."""
        rank, ma, mb = self._window("measured", rank)
        _, pa, pb = self._window("predicted", rank)
        span = max(mb - ma, pb - pa)
        if bin_s is None:
            bin_s = 1e-3 if span <= 0.5 else span / 500.0
        n = max(int(math.ceil(span / bin_s)), 1)
        rel = np.arange(n + 1) * bin_s
        return pd.DataFrame({
            "time_s": rel[:-1],
            "measured": busy_fraction(self.measured, rank, ma + rel),
            "predicted": busy_fraction(self.timeline, rank, pa + rel),
        })

    def gpu_start_deviation_s(self) -> float:
        """Median |simulated - measured| start of the GPU tasks, after aligning both runs at
        their first step (seconds): how closely the simulated GPU timeline follows the real one."""
        g = self.graph.graph
        df = self.steps()
        dev = []
        for r in np.unique(g.rank):
            mine = df[df["graph_rank"] == r]
            if not len(mine):
                continue
            shift = float(mine["predicted_start_s"].min() - mine["measured_start_s"].min())
            on = (g.rank == r) & g.is_gpu() & (g.category != Category.SYNC)
            lo = float(mine["measured_start_s"].min())
            hi = float((mine["measured_start_s"] + mine["measured_s"]).max())
            on &= (self.measured.start >= lo) & (self.measured.start <= hi)
            dev.append(np.abs(self.timeline.start[on] - shift - self.measured.start[on]))
        d = np.concatenate(dev) if dev else np.zeros(0)
        return float(np.median(d)) if d.size else 0.0

    def write_trace(self, path: str | Path, *, measured: bool = True) -> Path:
        """Write the simulated run (and, with ``measured=True``, the measured one below it) as
        one Chrome/Perfetto trace (µs). Processes: ``rank R (simulated)`` and ``rank R
        (measured)``; threads: the graph's CPU threads and GPU streams."""
        g = self.graph.graph
        on_path = np.zeros(g.n_tasks, dtype=bool)
        on_path[self.timeline.critical_path()] = True
        names = [json.dumps(n) for n in g.names]
        kinds = [json.dumps(k) for k in g.kinds]
        cats = [json.dumps(Category(c).name.lower()) for c in range(len(Category))]
        parts: list[str] = []
        runs = [("simulated", 0, self.timeline)] + ([("measured", 1_000_000, self.measured)] if measured else [])
        for label, off, tl in runs:
            for r, tr in enumerate(self.graph.trace_ranks):
                parts.append(json.dumps({"ph": "M", "name": "process_name", "pid": off + r,
                                         "args": {"name": f"rank {tr} ({label})"}}))
            for p in range(g.n_procs):
                parts.append(json.dumps({"ph": "M", "name": "thread_name", "pid": off + int(g.proc_rank[p]), "tid": p,
                                         "args": {"name": g.proc_names[p]}}))
            ts = np.round(tl.start * 1e6, 3).tolist()
            du = np.round((tl.end - tl.start) * 1e6, 3).tolist()
            pid = (g.rank.astype(np.int64) + off).tolist()
            tid = g.proc.tolist()
            nm = g.name.tolist()
            kd = g.kind.tolist()
            ct = g.category.tolist()
            cp = on_path.tolist() if label == "simulated" else [False] * g.n_tasks
            for i in range(g.n_tasks):
                parts.append(
                    f'{{"ph":"X","name":{names[nm[i]]},"cat":{cats[ct[i]]},"pid":{pid[i]},"tid":{tid[i]},'
                    f'"ts":{ts[i]},"dur":{du[i]},"args":{{"kind":{kinds[kd[i]]},"critical_path":{"true" if cp[i] else "false"}}}}}'
                )
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text('{"displayTimeUnit":"ms","otherData":{"producer":"tuner replay"},"traceEvents":[\n'
                       + ",\n".join(parts) + "\n]}\n")
        tmp.replace(path)
        return path

    def summary(self, top: int = 10) -> dict:
        """JSON-ready summary (what ``tuner replay --json`` prints)."""
        df = self.steps()
        meas, pred = self.iteration_s()
        rg = self.graph
        errs = df["error_pct"].abs()
        cp = self.timeline.critical_path_summary(top=top)
        return {
            "source": rg.graph.meta.get("source"),
            "ranks": int(rg.graph.n_ranks),
            "trace_ranks": [int(r) for r in rg.trace_ranks],
            "world_size": int(rg.world_size),
            "steps": [
                {"name": str(r.name), "rank": int(r.rank), "measured_s": float(r.measured_s),
                 "predicted_s": float(r.predicted_s), "error_pct": float(r.error_pct),
                 "kernel_sum_s": float(r.kernel_sum_s), "kernel_sum_error_pct": float(r.kernel_sum_error_pct),
                 "peer_wait_s": float(r.peer_wait_s)}
                for r in df.itertuples()
            ],
            "measured_iteration_s": meas,
            "predicted_iteration_s": pred,
            "mean_abs_error_pct": float(errs.mean()) if len(errs) else None,
            "max_abs_error_pct": float(errs.max()) if len(errs) else None,
            "kernel_sum_mean_abs_error_pct": float(df["kernel_sum_error_pct"].abs().mean()) if len(errs) else None,
            "breakdown": self.breakdown("predicted").as_dict(),
            "breakdown_measured": self.breakdown("measured").as_dict(),
            "critical_path": [
                {"name": str(r["name"]), "category": str(r["category"]), "time_s": float(r["time_s"]),
                 "share": float(r["share"])} for _, r in cp.iterrows()
            ],
            "gpu_start_deviation_s": self.gpu_start_deviation_s(),
            "launch_fraction": rg.launch_fraction,
            "collectives": self.collectives.as_dict() if self.collectives is not None else None,
            "graph": {**rg.graph.summary(), "dependencies": {k: v for k, v in rg.stats.items()}},
            "notes": list(rg.notes) + (list(self.collectives.notes) if self.collectives is not None else []),
        }


def measured_timeline(rg: ReplayGraph) -> Timeline:
    """The measured run of ``rg`` as a :class:`~predictor.simulate.Timeline` (same breakdown code)."""
    g = rg.graph
    return Timeline(g, rg.measured_start.copy(), rg.measured_end.copy(),
                    rg.measured_end - rg.measured_start, np.full(g.n_tasks, -1, dtype=np.int64),
                    np.full(max(g.n_groups, 0), -1, dtype=np.int64))


def _pricing(rg: ReplayGraph, collectives: str, platform: Platform | None) -> CollectivePricing:
    return price_collectives(rg.graph, rg.world_size, rg.devices, mode=collectives, platform=platform)


def replay_durations(rg: ReplayGraph, collectives: str = "modelled", platform: Platform | None = None) -> np.ndarray:
    """Seconds per task the replay simulates: the measured ones, except that in ``"modelled"`` mode a
    collective without its peers' traces lasts its modelled transfer (:mod:`~predictor.sources.traces.collectives`;
    ``platform``: the GPU to price it on, default the catalog's match of the traced GPU)."""
    return _pricing(rg, collectives, platform).durations(MeasuredTiming().durations(rg.graph))


def replay_graph(rg: ReplayGraph, durations: np.ndarray | None = None, *, collectives: str = "modelled",
                 platform: Platform | None = None) -> ReplayResult:
    """Simulate a built replay graph with :func:`replay_durations` (or ``durations``, seconds per task);
    ``collectives``: ``"modelled"`` or ``"measured"`` durations of the collectives without their peers."""
    pricing = _pricing(rg, collectives, platform)
    d = pricing.durations(MeasuredTiming().durations(rg.graph)) if durations is None else durations
    tl = simulate(rg.graph, np.asarray(d, dtype=np.float64), launch_fraction=rg.launch_fraction)
    return ReplayResult(graph=rg, timeline=tl, measured=measured_timeline(rg), collectives=pricing)


def scaled_durations(rg: ReplayGraph, *, gpu: float = 1.0, host: float = 1.0, ranks: list[int] | None = None,
                     collectives: str = "modelled") -> np.ndarray:
    """:func:`replay_durations` (seconds) with every GPU task (kernel, copy, set; collectives excluded)
    multiplied by ``gpu`` and every host compute task (op segments, overhead gaps, runtime calls; not the
    waits) by ``host``, on graph ranks ``ranks`` (default: all) — a perturbation the replay must follow."""
    g = rg.graph
    d = replay_durations(rg, collectives)
    on = np.ones(g.n_tasks, dtype=bool) if ranks is None else np.isin(g.rank, ranks)
    gpu_work = on & g.is_gpu() & (g.category != Category.SYNC) & (g.category != Category.COMMUNICATION)
    host_work = on & ~g.is_gpu() & (g.category == Category.CPU)
    d[gpu_work] *= gpu
    d[host_work] *= host
    return d


def _warm_simulator() -> threading.Thread:
    """Simulate a one-task graph on a thread: the simulator's compiled code loads (about 0.4 s in a fresh
    process, mostly in LLVM without the GIL) while the traces are read."""
    def run() -> None:
        gb = GraphBuilder()
        gb.task(gb.processor(0, ProcKind.CPU_THREAD, "warm-up"), "warm-up", "cpu_op", Category.CPU, duration=0.0)
        simulate(gb.build())

    th = threading.Thread(target=run, name="tuner-simulator-warm-up", daemon=True)
    th.start()
    return th


def replay(source: str | Path | TraceSet, et: str | Path | None = None, *, use_et: bool = True,
           collectives: str = "modelled", platform: Platform | None = None) -> ReplayResult:
    """Read, build and simulate the traces at ``source`` (file, folder, archive or a TraceSet);
    ``collectives``/``platform``: see :func:`replay_graph`."""
    warm = _warm_simulator()
    # the garbage collector paused until the traces are freed: on resuming after each reader it walked the
    # 10^5 containers just read (11 ms of a 24k-task replay), which are garbage by the end
    with no_gc():
        ts = source if isinstance(source, TraceSet) else load_traces(source, et, use_et=use_et)
        rg = build_graph(ts)
        del ts
        warm.join()
        return replay_graph(rg, collectives=collectives, platform=platform)
