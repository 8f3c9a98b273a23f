"""Graph construction from traces: dependencies checked by hand on small traces.

The two HTA unit-test traces (``event_sync``, ``event_sync_multistream``) have every kind of
CUDA synchronisation with Kineto's ``cuda_sync`` records; the hand-made traces cover the
inter-thread dependency, cross-rank collectives and event waits without ``cuda_sync``.
"""

from __future__ import annotations

import numpy as np
import pytest
from _trace_fixtures import TRACES, ann, kernel, needs_traces, op, runtime, write_trace

from predictor.graph import Category, DepKind, Overhead
from predictor.simulate import simulate
from predictor.simulate.replay import replay
from predictor.sources.traces.build import build_graph
from predictor.sources.traces.load import load_traces


def _edges(rg, kind: DepKind) -> set[tuple[str, str]]:
    g = rg.graph
    names = np.asarray(g.names, dtype=object)[g.name]
    sel = g.edge_kind == kind
    return {(names[s], names[d]) for s, d in zip(g.edge_src[sel], g.edge_dst[sel], strict=True)}


def _task(rg, name: str, nth: int = 0) -> int:
    g = rg.graph
    return int(np.flatnonzero(np.asarray(g.names, dtype=object)[g.name] == name)[nth])


@needs_traces
def test_event_sync_dependencies_by_hand():
    rg = build_graph(load_traces(TRACES / "event_sync.kineto.json.gz"))
    g = rg.graph
    # 4 kernels + 1 copy on stream 7, each launched by the runtime call with its correlation id
    # (too few queued kernels to measure the stream's own gap: no gap tasks)
    assert int(g.is_gpu().sum()) == 5
    assert int((g.edge_kind == DepKind.CPU_GPU).sum()) == 5
    spin = "at::cuda::(anonymous namespace)::spin_kernel(long)"
    copy = "Memcpy DtoH (Device -> Pageable)"
    # GPU -> CPU: the blocking copy and the stream sync wait for the copy; the event sync waits
    # for the kernel issued before its cudaEventRecord (correlation 1533); the device sync for
    # the last task of the stream
    assert _edges(rg, DepKind.GPU_CPU) == {
        (copy, "cudaMemcpyAsync (wait)"),
        (copy, "cudaStreamSynchronize"),
        (spin, "cudaEventSynchronize"),
        (spin, "cudaDeviceSynchronize"),
    }
    # the event sync keeps only what follows the kernel's end: 512416 - (512372 + 36) = 8 µs
    assert g.duration[_task(rg, "cudaEventSynchronize")] == pytest.approx(8e-6)
    assert g.category[_task(rg, "cudaEventSynchronize")] == Category.SYNC
    # overhead types: T2 before the first launch of aten::sum, T3 after it, T1 between ops
    sums = np.flatnonzero(np.asarray(g.names, dtype=object)[g.name] == "aten::sum")
    assert [Overhead(int(o)) for o in g.overhead[sums]] == [Overhead.T2, Overhead.T3]
    assert Overhead.T1 in {Overhead(int(o)) for o in g.overhead}
    # one ProfilerStep, and the replay reproduces it
    res = replay(load_traces(TRACES / "event_sync.kineto.json.gz"))
    steps = res.steps()
    assert list(steps["name"]) == ["ProfilerStep#100"]
    assert steps["measured_s"].iloc[0] == pytest.approx(3154e-6)
    assert abs(steps["error_pct"].iloc[0]) < 1.0
    # the simulated sync starts when the kernel it waits for has ended
    tl = res.timeline
    assert tl.start[_task(rg, "cudaEventSynchronize")] >= tl.end[_task(rg, spin)] - 1e-12


@needs_traces
def test_event_sync_multistream_cross_stream_edge():
    rg = build_graph(load_traces(TRACES / "event_sync_multistream.kineto.json.gz"))
    g = rg.graph
    # Stream Wait Event (corr 1389): stream 24 waits for stream 20's event recorded at corr 1385,
    # i.e. for the sgemm issued to stream 20 before it; the first task after the wait is a memset
    gg = [(int(s), int(d)) for s, d, k in zip(g.edge_src, g.edge_dst, g.edge_kind, strict=True) if k == DepKind.GPU_GPU]
    assert len(gg) == 1
    s, d = gg[0]
    assert g.proc_names[g.proc[s]] == "gpu0 stream 20" and g.names[g.name[s]] == "ampere_sgemm_128x64_nn"
    assert g.proc_names[g.proc[d]] == "gpu0 stream 24" and g.names[g.name[d]] == "Memset (Device)"
    assert rg.stats["event_edges_cuda_sync"] == 1
    # the device synchronisation waits for the last task of each of the three streams
    sync = _task(rg, "cudaDeviceSynchronize")
    preds = g.edge_src[(g.edge_dst == sync) & (g.edge_kind == DepKind.GPU_CPU)]
    assert sorted(g.proc_names[g.proc[p]] for p in preds) == ["gpu0 stream 20", "gpu0 stream 24", "gpu0 stream 28"]
    tl = simulate(g, launch_fraction=rg.launch_fraction)
    assert tl.start[d] >= tl.end[s] - 1e-12


@needs_traces
def test_simple_add_every_gpu_task_is_launched_and_blocking_copies_wait():
    rg = build_graph(load_traces(TRACES / "simple_add_a100.kineto.json.gz"))
    g = rg.graph
    n_gpu = int((g.is_gpu() & (g.category != Category.SYNC)).sum())  # kernels and copies, not stream gaps
    assert rg.stats["stream_gap_us_rank0"] > 0
    launched = np.unique(g.edge_dst[g.edge_kind == DepKind.CPU_GPU])
    assert launched.size == n_gpu == 98
    assert rg.stats["sync_stream_cuda_sync"] == 16 and rg.stats["sync_device"] == 5
    # every wait part of a blocking copy has the copy as a GPU->CPU predecessor
    names = np.asarray(g.names, dtype=object)[g.name]
    waits = np.flatnonzero(names == "cudaMemcpyAsync (wait)")
    for w in waits:
        src = g.edge_src[(g.edge_dst == w) & (g.edge_kind == DepKind.GPU_CPU)]
        assert src.size == 1 and names[src[0]].startswith("Memcpy")
    assert rg.steps["name"].tolist() == ["whole trace"]


def _two_thread_trace(tmp_path):
    # main thread: forward op F [0, 100) launching k1; then blocked in backward() until the
    # autograd thread's op B [150, 250) ends; then op O [300, 340). Autograd thread waits for F.
    ev = [
        ann("ProfilerStep#1", 1, 0, 350),
        op("aten::mm", 1, 0, 100),
        runtime("cudaLaunchKernel", 1, 40, 10, corr=1),
        kernel("gemm_k1", 7, 55, 500, corr=1),
        op("autograd::engine::evaluate_function: MmBackward0", 2, 150, 100),
        runtime("cudaLaunchKernel", 2, 200, 10, corr=2),
        kernel("gemm_k2", 7, 560, 20, corr=2),
        op("aten::add_", 1, 300, 40),
    ]
    return write_trace(tmp_path / "t.kineto.json", ev)


def test_inter_thread_dependencies_by_hand(tmp_path):
    rg = build_graph(load_traces(_two_thread_trace(tmp_path)))
    g = rg.graph
    cc = [(int(s), int(d)) for s, d, k in zip(g.edge_src, g.edge_dst, g.edge_kind, strict=True) if k == DepKind.CPU_CPU]
    names = np.asarray(g.names, dtype=object)[g.name]
    procs = np.asarray(g.proc_names, dtype=object)[g.proc]
    # autograd thread's leading gap waits for the forward op; main's gap waits for backward
    assert {(names[s], procs[d]) for s, d in cc} == {("aten::mm", "cpu tid 2"),
                                                       ("autograd::engine::evaluate_function: MmBackward0", "cpu tid 1")}
    res = replay(load_traces(tmp_path / "t.kineto.json"))
    assert res.steps()["predicted_s"].iloc[0] == pytest.approx(350e-6, rel=1e-6)
    # stream order: k2 starts after k1 ends although launched long before
    tl = res.timeline
    assert tl.start[_task(rg, "gemm_k2")] == pytest.approx(tl.end[_task(rg, "gemm_k1")])


def test_event_wait_inferred_without_cuda_sync(tmp_path):
    # record on stream 7 (the thread's last launch), wait, then launch to stream 40: k_comm waits
    # for k_comp although launched first
    ev = [
        op("c10d::allreduce_", 1, 0, 100),
        runtime("cudaLaunchKernel", 1, 5, 5, corr=1),
        kernel("compute", 7, 12, 300, corr=1),
        runtime("cudaEventRecord", 1, 20, 2, corr=2),
        runtime("cudaStreamWaitEvent", 1, 25, 2, corr=3),
        runtime("cudaLaunchKernelExC", 1, 30, 5, corr=4),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 40, 312, 50, corr=4),
    ]
    rg = build_graph(load_traces(write_trace(tmp_path / "w.json", ev)))
    assert _edges(rg, DepKind.GPU_GPU) == {("compute", "ncclKernel_AllReduce_RING_LL_Sum_float")}
    assert rg.stats["event_edges_inferred"] == 1
    g = rg.graph
    comm = _task(rg, "ncclKernel_AllReduce_RING_LL_Sum_float")
    assert g.kinds[g.kind[comm]] == "all_reduce" and g.category[comm] == Category.COMMUNICATION


def test_collectives_grouped_across_ranks_with_min_duration(tmp_path):
    folder = tmp_path / "run"
    for r, (launch_at, dur) in enumerate([(10, 400), (300, 110)]):
        ev = [
            ann("ProfilerStep#3", 1, 0, 600),
            op("c10d::alltoall_base_", 1, launch_at - 5, 20),
            runtime("cudaLaunchKernel", 1, launch_at, 5, corr=1),
            kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 84, launch_at + 6, dur, corr=1),
            op("aten::add", 1, 590, 5),
        ]
        write_trace(folder / f"rank{r}.kineto.json.gz", ev, rank=r, world=2)
    rg = build_graph(load_traces(folder))
    g = rg.graph
    grouped = np.flatnonzero(g.group >= 0)
    assert grouped.size == 2 and g.group[grouped[0]] == g.group[grouped[1]]
    # both members get the smaller measured duration (the last rank to arrive waits least)
    assert np.allclose(g.duration[grouped], 110e-6)
    assert g.kinds[g.kind[grouped[0]]] == "all_to_all"
    tl = simulate(g, launch_fraction=rg.launch_fraction)
    # members end together: max(start) + min(duration)
    assert tl.end[grouped[0]] == pytest.approx(tl.end[grouped[1]])
    assert tl.end[grouped[0]] == pytest.approx(tl.start[grouped].max() + 110e-6)
