"""Simulator throughput: synthetic multi-rank graphs of 10k, 100k and 1M tasks.

Each rank has a CPU thread issuing launch calls, a compute stream and a communication
stream; every 20th op is a collective across all ranks (one group), and the next compute
kernel depends on it (intra-rank sync). Durations are random. The script times
``simulate()`` (topology build + numba pass; JIT warm-up excluded) on one core and writes
``benchmarks/results/simulate_bench.md`` and ``.json``.

Run: ``python benchmarks/simulate_bench.py [--sizes 10000 100000 1000000]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from predictor.graph import Category, DepKind, ExecutionGraph, ProcKind
from predictor.simulate import simulate

RESULTS = Path(__file__).resolve().parent / "results"


def synthetic_graph(n_tasks: int, n_ranks: int = 8, comm_every: int = 20, seed: int = 0) -> ExecutionGraph:
    """A multi-rank graph of about ``n_tasks`` tasks, built straight into arrays."""
    rng = np.random.default_rng(seed)
    ops_per_rank = max(n_tasks // (2 * n_ranks), comm_every)
    ops_per_rank -= ops_per_rank % comm_every
    n_ops = ops_per_rank * n_ranks
    # per op: one CPU launch task then one GPU task
    op_rank = np.repeat(np.arange(n_ranks), ops_per_rank)
    op_pos = np.tile(np.arange(ops_per_rank), n_ranks)
    is_comm = (op_pos % comm_every) == comm_every - 1
    cpu_task = 2 * np.arange(n_ops)
    gpu_task = cpu_task + 1
    n = 2 * n_ops
    rank = np.repeat(op_rank, 2).astype(np.int32)
    proc = np.empty(n, dtype=np.int32)
    proc[cpu_task] = 3 * op_rank
    proc[gpu_task] = 3 * op_rank + 1 + is_comm
    category = np.empty(n, dtype=np.int8)
    category[cpu_task] = Category.CPU
    category[gpu_task] = np.where(is_comm, Category.COMMUNICATION, Category.COMPUTE)
    kind = np.zeros(n, dtype=np.int32)
    kind[gpu_task] = np.where(is_comm, 2, 1)
    group = np.full(n, -1, dtype=np.int32)
    group[gpu_task[is_comm]] = op_pos[is_comm] // comm_every
    duration = np.empty(n)
    duration[cpu_task] = rng.uniform(2e-6, 12e-6, n_ops)
    duration[gpu_task] = rng.lognormal(np.log(20e-6), 1.0, n_ops)
    # edges: launch CPU->GPU for every op; collective -> next compute kernel (GPU->GPU);
    # compute kernel -> next collective (the collective consumes the compute's output)
    src = [cpu_task]
    dst = [gpu_task]
    kinds = [np.full(n_ops, DepKind.CPU_GPU, dtype=np.int8)]
    comm_ops = np.flatnonzero(is_comm)
    nxt = comm_ops + 1
    ok = (nxt < n_ops) & (op_rank[np.minimum(nxt, n_ops - 1)] == op_rank[comm_ops])
    src.append(gpu_task[comm_ops[ok]])
    dst.append(gpu_task[nxt[ok]])
    kinds.append(np.full(int(ok.sum()), DepKind.GPU_GPU, dtype=np.int8))
    prev = comm_ops - 1
    src.append(gpu_task[prev])
    dst.append(gpu_task[comm_ops])
    kinds.append(np.full(prev.size, DepKind.GPU_GPU, dtype=np.int8))
    proc_rank = np.repeat(np.arange(n_ranks), 3).astype(np.int32)
    proc_kind = np.tile(np.array([ProcKind.CPU_THREAD, ProcKind.GPU_STREAM, ProcKind.GPU_STREAM], dtype=np.int8), n_ranks)
    proc_names = [name for _ in range(n_ranks) for name in ("cpu", "compute", "comm")]
    return ExecutionGraph(
        rank=rank,
        proc=proc,
        name=kind.copy(),
        kind=kind,
        category=category,
        overhead=np.zeros(n, dtype=np.int8),
        duration=duration,
        flops=np.full(n, np.nan),
        bytes=np.full(n, np.nan),
        group=group,
        params={},
        proc_rank=proc_rank,
        proc_kind=proc_kind,
        proc_names=proc_names,
        edge_src=np.concatenate(src).astype(np.int32),
        edge_dst=np.concatenate(dst).astype(np.int32),
        edge_kind=np.concatenate(kinds).astype(np.int8),
        names=["launch", "kernel", "all_reduce"],
        kinds=["launch", "gemm", "all_reduce"],
    )


def bench(n_tasks: int, repeats: int) -> dict:
    g = synthetic_graph(n_tasks)
    g.validate()
    simulate(g)  # JIT + topology warm-up on this structure
    g.meta.pop("_topology", None)
    cold = []
    warm = []
    for _ in range(repeats):
        g.meta.pop("_topology", None)
        t0 = time.perf_counter()
        simulate(g)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tl = simulate(g)  # topology cached: only the numba pass
        warm.append(time.perf_counter() - t0)
    return {
        "tasks": g.n_tasks,
        "edges": g.n_edges,
        "ranks": g.n_ranks,
        "collective_groups": g.n_groups,
        "seconds_with_topology": min(cold),
        "seconds_pass_only": min(warm),
        "tasks_per_s_with_topology": g.n_tasks / min(cold),
        "tasks_per_s_pass_only": g.n_tasks / min(warm),
        "iteration_s": tl.iteration_s,
    }


def bench_co_run(repeats: int, pack: str = "cpu-local-avx2") -> dict | None:
    """Seconds to time and simulate one candidate of the CPU sharding search (the first task of
    ``experiments/sharding_selection.py``: 2 gloo ranks, batch 1024, naive placement) with host contention
    priced throughout the step and only while another rank runs (:mod:`predictor.timing.kernels.co_run`: a few
    extra simulations); None when ``pack`` is not found."""
    from predictor.sources.synth.dlrm import DLRMSpec, build_dlrm_graph
    from predictor.sources.synth.dlrm_tables import generate_tasks
    from predictor.timing.kernels.assets import AssetPackError, resolve_platform

    try:
        timing = resolve_platform(pack).timing()
    except (AssetPackError, KeyError, ValueError):
        return None
    tables = generate_tasks(2, n_tasks=10, seed=7, device_memory_bytes=2**30, batch_size=1024)[0]
    spec = DLRMSpec(tables=tables, batch_size=1024, bottom_mlp=(256, 128, 64), top_mlp=(256, 128, 1))
    g = build_dlrm_graph(spec, np.arange(len(tables)) % 2, 2, mode="host", comm_threads=False)
    out = {"pack": pack, "tasks": g.n_tasks}
    for label, co_run in (("throughout", False), ("co_run", True)):
        timing.co_run = co_run
        simulate(g, timing.durations(g))  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            it = simulate(g, timing.durations(g)).iteration_s
            best = min(best, time.perf_counter() - t0)
        out[f"{label}_s"] = best
        out[f"{label}_iteration_s"] = it
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    rows = [bench(n, args.repeats) for n in args.sizes]
    co = bench_co_run(args.repeats)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "simulate_bench.json").write_text(json.dumps({"meta": meta, "rows": rows, "co_run": co}, indent=2))
    lines = [
        "# Simulator throughput",
        "",
        f"`python benchmarks/simulate_bench.py` on {meta['cpus']} cores ({meta['machine']}), one thread; best of {args.repeats}.",
        "",
        "| tasks | edges | ranks | groups | s (topology + pass) | tasks/s | s (pass only) | tasks/s (pass only) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tasks']:,} | {r['edges']:,} | {r['ranks']} | {r['collective_groups']:,} | {r['seconds_with_topology']:.4f} | "
            f"{r['tasks_per_s_with_topology']:,.0f} | {r['seconds_pass_only']:.4f} | {r['tasks_per_s_pass_only']:,.0f} |"
        )
    if co:
        lines += ["", f"One candidate of the CPU sharding search (kernel timing + simulation, `{co['pack']}`, 2 ranks, "
                  f"{co['tasks']:,} tasks): host contention throughout {co['throughout_s'] * 1e3:.2f} ms, only while "
                  f"another rank runs (`predictor/timing/kernels/co_run.py`) {co['co_run_s'] * 1e3:.2f} ms; predicted "
                  f"iteration {co['throughout_iteration_s'] * 1e3:.1f} vs {co['co_run_iteration_s'] * 1e3:.1f} ms."]
    (args.out / "simulate_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
