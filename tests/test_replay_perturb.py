"""Perturbation tests of the replay: the simulated step follows the work it is made of.

For every shared trace (``../shared/data/traces``, skipped when absent) every kernel's ``dur`` is scaled
by 1.5 with the timestamps untouched, as an edited trace file would be; the graph is rebuilt and
simulated. The simulated step never shrinks, and grows by at least 1.35x where the busiest stream is
busy 90 % of the step (none of the shared traces is; a hand-made GPU-bound trace whose host is held by a
full launch queue is). Host compute scaled by 1.5 makes the host-bound traces grow instead. On the
8-rank DLRM trace, slowing one rank's compute delays the other ranks at the next collective.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from _trace_fixtures import TRACES, needs_traces, op, runtime, write_trace

from predictor.graph import Category, ProcKind
from predictor.simulate import union_length
from predictor.simulate.replay import ReplayResult, replay_graph, scaled_durations
from predictor.sources.traces.build import build_graph
from predictor.sources.traces.kineto import EventCat
from predictor.sources.traces.load import TraceSet, load_traces

GPU_EVENTS = (EventCat.KERNEL, EventCat.MEMCPY, EventCat.MEMSET)


def _kernels_scaled(ts: TraceSet, factor: float) -> TraceSet:
    """``ts`` with every GPU event's duration times ``factor``, timestamps untouched."""
    out = copy.copy(ts)
    out.ranks = []
    for r in ts.ranks:
        kt = copy.copy(r.kineto)
        kt.dur = kt.dur.copy()
        kt.dur[kt.mask(*GPU_EVENTS)] *= factor
        out.ranks.append(copy.copy(r))
        out.ranks[-1].kineto = kt
    return out


def _busiest_stream_share(res: ReplayResult) -> np.ndarray:
    """Per step, the busiest GPU stream's busy share of the measured step."""
    g, m = res.graph.graph, res.measured
    out = []
    for row in res.steps().itertuples():
        a, b = row.measured_start_s, row.measured_start_s + row.measured_s
        best = 0.0
        for q in np.flatnonzero((g.proc_kind == ProcKind.GPU_STREAM) & (g.proc_rank == row.graph_rank)):
            on = (g.proc == q) & (g.category != Category.SYNC)
            best = max(best, union_length(np.clip(m.start[on], a, b), np.clip(m.end[on], a, b)) / (b - a))
        out.append(best)
    return np.asarray(out)


def _check_kernel_scaling(ts: TraceSet) -> tuple[np.ndarray, np.ndarray]:
    """(busy share, simulated step ratio kernels x1.5 / as traced) per step; asserts the ratio rule."""
    base = replay_graph(build_graph(ts))
    slow = replay_graph(build_graph(_kernels_scaled(ts, 1.5)))
    ratio = slow.steps()["predicted_s"].to_numpy() / base.steps()["predicted_s"].to_numpy()
    share = _busiest_stream_share(base)
    assert np.all(ratio >= 1.0 - 1e-3), (ts.source, ratio)  # never shrinks
    assert np.all(ratio[share >= 0.9] >= 1.35), (ts.source, share, ratio)
    return share, ratio


# ----------------------------------------------------------------------------- a GPU-bound trace
def gpu_bound_trace(path, *, steps: int = 3, kernels: int = 60, kernel_us: float = 100.0, queue: int = 16,
                    sync_last: bool = True):
    """A trace of a GPU-bound loop as the CUDA runtime runs it: the host launches ``kernels`` kernels of
    ``kernel_us`` per step; once ``queue`` launches are pending, a launch call returns only when the
    oldest pending kernel ended. The last step ends with ``cudaDeviceSynchronize``."""
    ev: list[dict] = []
    h, gpu_free, corr = 1000.0, 0.0, 1
    ends: list[float] = []
    starts: list[float] = []
    for k in range(steps):
        step_start = h
        for _ in range(kernels):
            op_start = h
            h += 4.0  # the op's own host work before its launch
            call = h
            gs = max(call + 2.5, gpu_free + 1.0)
            ge = gs + kernel_us
            pending = sum(1 for s in starts if s > call)
            ret = call + 5.0
            if pending >= queue:
                ret = max(ret, sorted(e for s, e in zip(starts, ends, strict=True) if s > call)[0] + 1.0)
            ev.append(runtime("cudaLaunchKernel", 1, call, ret - call, corr))
            ev.append({"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": gs, "dur": kernel_us,
                       "args": {"stream": 7, "device": 0, "correlation": corr}})
            starts.append(gs)
            ends.append(ge)
            gpu_free = ge
            corr += 1
            h = ret + 2.0
            ev.append(op("aten::mm", 1, op_start, h - op_start))
            h += 1.0
        if sync_last and k == steps - 1:
            ev.append(runtime("cudaDeviceSynchronize", 1, h, gpu_free + 3.0 - h, corr))
            corr += 1
            h = gpu_free + 4.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 100, "tid": 1,
                   "ts": step_start, "dur": h - step_start, "args": {}})
    return write_trace(path, ev)


def test_gpu_bound_trace_follows_its_kernels(tmp_path):
    ts = load_traces(gpu_bound_trace(tmp_path / "gpu_bound.kineto.json"))
    base = replay_graph(build_graph(ts))
    df = base.steps()
    assert np.all(df["error_pct"].abs() < 2.0), df
    assert base.graph.stats.get("launches_blocked_by_full_queue", 0) > 0
    # a blocked launch or the device sync keeps only its return after the GPU task it waited for (µs), not
    # the wait (up to 1.6 ms here): the simulator recomputes that
    g = base.graph.graph
    waits = ~g.is_gpu() & (g.category == Category.SYNC)
    assert waits.sum() > 60 and g.duration[waits].max() <= 3.5e-6
    share, ratio = _check_kernel_scaling(ts)
    assert np.all(share > 0.9), share
    # host compute x1.5 hardly moves a GPU-bound step
    host = replay_graph(base.graph, scaled_durations(base.graph, host=1.5)).steps()["predicted_s"].to_numpy()
    assert np.all(host / df["predicted_s"].to_numpy() < 1.1)


def test_host_bound_trace_follows_its_host(tmp_path):
    ts = load_traces(gpu_bound_trace(tmp_path / "host_bound.kineto.json", kernel_us=2.0))
    share, ratio = _check_kernel_scaling(ts)
    assert np.all(share < 0.5) and np.all(ratio < 1.05)
    rg = build_graph(ts)
    base = replay_graph(rg).steps()["predicted_s"].to_numpy()
    host = replay_graph(rg, scaled_durations(rg, host=1.5)).steps()["predicted_s"].to_numpy()
    assert np.all(host / base > 1.35)


# ----------------------------------------------------------------------------- the shared traces
SINGLE = ["resnet50_ddp_a100_rank0of2.kineto.json.gz", "recsys_a100_rank3of8.kineto.json.gz",
          "mlp21_rtx2080ti.kineto.json.gz", "event_sync.kineto.json.gz", "event_sync_multistream.kineto.json.gz",
          "simple_add_a100.kineto.json.gz", "alexnet_a100.kineto.json.gz"]


@needs_traces
@pytest.mark.parametrize("name", SINGLE)
def test_shared_trace_kernels_and_host_scaled(name):
    ts = load_traces(TRACES / name, use_et=False)
    share, ratio = _check_kernel_scaling(ts)
    rg = build_graph(ts)
    base = replay_graph(rg).steps()["predicted_s"].to_numpy()
    host = replay_graph(rg, scaled_durations(rg, host=1.5)).steps()["predicted_s"].to_numpy()
    assert np.all(host / base >= 1.0 - 1e-3)
    # where the GPU is idle most of the step the host sets its pace: host x1.5 grows it, kernels x1.5 hardly
    idle = share < 0.5
    assert np.all(host[idle] / base[idle] > 1.2), (name, share, host / base)
    assert np.all(ratio[idle] < host[idle] / base[idle]), (name, ratio, host / base)


@needs_traces
def test_dlrm_one_slow_rank_delays_the_others():
    ts = load_traces(TRACES / "dlrm_v100_8ranks.kineto.tar.gz", use_et=False)
    _check_kernel_scaling(ts)
    rg = build_graph(ts)
    g = rg.graph
    base = replay_graph(rg)
    slow = replay_graph(rg, scaled_durations(rg, gpu=1.5, host=1.5, ranks=[0]))
    # the first collective rank 0 joins after its compute: every other rank leaves it later
    groups = np.unique(g.group[g.group >= 0])
    delayed = 0
    for grp in groups:
        others = np.flatnonzero((g.group == grp) & (g.rank != 0))
        if np.all(slow.timeline.end[others] > base.timeline.end[others] + 1e-6):
            delayed += 1
    assert delayed >= 1
    steps_b, steps_s = base.steps(), slow.steps()
    other = steps_b["graph_rank"] != 0
    assert np.all(steps_s["predicted_s"][other] >= steps_b["predicted_s"][other] - 1e-9)
    assert (steps_s["predicted_s"][other] > steps_b["predicted_s"][other] * 1.01).any()
