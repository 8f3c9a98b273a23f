"""Decoupled time model of Centimani §4.3, run through the project's simulator.

One training iteration of a traced model (:class:`~predictor.sources.synth.opgraph.OpGraph`) on
one accelerator is predicted in three stages, then their overlap is removed:

* **data loading / pre-processing** (§4.3.1): ``samples x devices-per-host / host rate``
  (the host rate is measured or given, in samples/s) plus the batch's input bytes over the
  host-to-device link;
* **computation** (§4.3.2, eq. 1-2): the sum of operator times. *Common* operators (GEMM,
  convolution, attention) take the platform's calibrated kernel models when it has an asset
  pack, else the analytic GEMM model of :mod:`predictor.timing.kernels.gemm` (peak x saturating
  efficiency) bounded by a cache-aware memory time; *uncommon* operators take the
  cache-aware roofline: ``max(FLOPs / peak, on-chip bytes / on-chip bandwidth + off-chip
  bytes / off-chip bandwidth)``, where the split of each operator's bytes between the levels
  comes from the memory model's placement (:func:`predictor.memory.place`) — on GPUs an
  operator whose whole working set fits in L2 streams at L2 bandwidth; on dataflow chips
  (:data:`DATAFLOW_KINDS`) fused operators also pass their intermediates on chip;
* **communication** (§4.3.3, eq. 4): data-parallel gradient all-reduce in DDP-style buckets
  (optionally compressed: the message shrinks by ``compression_ratio``), timed by the
  collective model of :mod:`predictor.timing.kernels.collective` from the interconnect;
* **overlap removal** (§4.3.4): instead of a closed formula, the iteration is built as an
  :class:`~predictor.graph.ExecutionGraph` — host thread issuing operators (the platform's
  per-op overheads; zero on graph-compiled accelerators), the device compute stream, a
  communication stream whose buckets wait for the operator producing their last gradient,
  and a data-loading thread that prefetches the next batch — and :func:`predictor.simulate.simulate`
  finds the critical path. The closed form ``max(T_data, T_compute + T_allreduce)`` (eq. 4,
  synchronous, no bucket overlap) is reported beside it.

Every number says which method produced it (:attr:`IterationPrediction.methods`).
Units: seconds, bytes, FLOPs, samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from predictor.graph import Category, DepKind, ExecutionGraph, Overhead, ProcKind
from predictor.memory import LevelUsage
from predictor.simulate import Timeline, simulate
from predictor.sources.synth.decoupled_timing import CacheAwareTiming, FixedTiming, asset_timing
from predictor.sources.synth.opgraph import CATEGORY_NAMES, OP_KINDS, OpGraph, Phase, TensorCategory
from predictor.sources.synth.pipeline_schedule import pipeline_latency
from predictor.timing.kernels.base import TaskView
from predictor.timing.kernels.collective import PiecewiseCollective
from predictor.timing.platforms.schema import Platform

__all__ = ["TimeOptions", "IterationPrediction", "build_iteration_graph", "prepare_iteration", "summarize_iteration",
           "predict_iteration", "COMMON_KINDS", "DATAFLOW_KINDS", "pipeline_platform", "pipeline_stages_for",
           "stage_split", "pipeline_iteration"]

#: op kinds Centimani calls "common" (micro-benchmarked / kernel-modelled)
COMMON_KINDS = ("gemm", "conv", "attention")
#: platform kinds that execute a compiled dataflow graph with operator fusion (SambaNova RDU, Graphcore
#: IPU, Cerebras WSE; Centimani §3.1): intermediates between fused operators stay on chip
DATAFLOW_KINDS = ("rdu", "ipu", "wse")
#: task kind in the ExecutionGraph for each op kind (names the kernel models route on)
_TASK_KIND = {"gemm": "gemm", "conv": "conv2d", "attention": "bmm", "embedding": "embedding",
              "norm": "layer_norm", "elementwise": "elementwise", "copy": "memcpy"}
#: task kinds of the iteration graph, in the order of its ``kinds`` table
_GRAPH_KINDS = ("host_op", "launch", *sorted(set(_TASK_KIND.values())), "optimizer", "all_reduce", "all_gather",
                "reduce_scatter", "data_loading", "accumulation")
_KIND_ID = {k: i for i, k in enumerate(_GRAPH_KINDS)}
_NO_KERNEL = (OP_KINDS.index("view"), OP_KINDS.index("alloc"))


@dataclass(frozen=True)
class TimeOptions:
    """Settings of the decoupled model (seconds, bytes, samples/s)."""

    n_devices: int = 1
    #: samples/s one host's loader + pre-processing delivers (None: not modelled)
    host_samples_per_s: float | None = None
    #: host-to-device bandwidth for the input batch, bytes/s (PCIe 4.0 x16 order of magnitude)
    host_link_bytes_per_s: float = 25e9
    overlap_data_loading: bool = True
    #: gradient bucket size of data parallelism (PyTorch DDP default 25 MiB)
    bucket_bytes: float = 25 * 2**20
    #: compressed / uncompressed gradient bytes (1: none; 0.25: 8-bit quantisation of fp32)
    compression_ratio: float = 1.0
    #: "ddp": all-reduce of gradients; "fsdp": reduce-scatter of gradients + all-gather of weights
    dp_mode: str = "ddp"
    #: micro-batches per optimizer step: gradients of GA-1 micro-batches accumulate without
    #: synchronisation, then the last one all-reduces and the optimizer steps once
    gradient_accumulation: int = 1


@dataclass
class IterationPrediction:
    """One accelerator's predicted iteration at one batch size (per device), seconds."""

    batch: int
    n_devices: int
    iteration_s: float
    samples_per_s: float
    compute_s: float
    common_ops_s: float
    uncommon_ops_s: float
    communication_s: float
    exposed_communication_s: float
    data_loading_s: float
    host_overhead_s: float
    formula_iteration_s: float
    kernel_sum_s: float
    breakdown: dict[str, float]
    time_by_kind: dict[str, float]
    methods: dict[str, str] = field(default_factory=dict)
    #: chips of one pipeline (1: the whole model on each device); ``samples_per_s`` is for
    #: ``n_devices x pipeline_stages`` chips
    pipeline_stages: int = 1

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


# ----------------------------------------------------------------------------- graph
def _on_chip_bytes(g: OpGraph, usage: LevelUsage | None, platform: Platform) -> np.ndarray:
    """Bytes of each operator's traffic served from on-chip memory (the cache-aware part).

    An operand is on-chip when its *reuse distance* fits: the bytes allocated since its last
    use (read or write), plus its own size, are at most the on-chip capacity left after the
    pinned categories (weights under ``weights_on_chip``, which are always on-chip). Otherwise
    it is read from off-chip memory, and its producer's write went off-chip too. On GPUs the
    capacity is the last-level cache; on SambaNova/Graphcore/Cerebras the on-chip SRAM.
    The first use of a tensor that outlives the iteration (weights, optimizer state) is measured
    from its last use in the previous iteration, as in steady-state training.
    """
    policy = usage.policy if usage is not None else platform.memory_policy
    cap = platform.last_level_cache_bytes if policy == "offchip_all" else platform.on_chip_bytes
    pinned_cat = (int(TensorCategory.WEIGHTS),) if policy == "weights_on_chip" else ()
    if pinned_cat:
        cap = max(cap - g.weight_bytes(), 0.0)
    n_ops = g.n_ops
    # allocated bytes before each op (prefix over allocation events)
    alloc = g.ev_sign > 0
    per_op = np.bincount(g.ev_op[alloc], weights=g.nbytes[g.ev_tensor[alloc]], minlength=n_ops + 1)
    before = np.concatenate([[0.0], np.cumsum(per_op)])  # before[i]: bytes allocated by ops < i
    # every access (reads then writes of each op), in execution order
    n_in = np.diff(g.in_ptr)
    n_out = np.diff(g.out_ptr)
    r_op = np.repeat(np.arange(n_ops), n_in)
    w_op = np.repeat(np.arange(n_ops), n_out)
    acc_op = np.concatenate([r_op, w_op])
    acc_t = np.concatenate([g.in_tensor, g.out_tensor])
    acc_w = np.concatenate([np.zeros(r_op.size, dtype=bool), np.ones(w_op.size, dtype=bool)])
    order = np.lexsort((acc_w, acc_op))
    acc_op, acc_t, acc_w = acc_op[order], acc_t[order], acc_w[order]
    m = acc_op.size
    # previous access of the same tensor
    by_t = np.lexsort((np.arange(m), acc_t))
    prev = np.full(m, -1, dtype=np.int64)
    same = acc_t[by_t[1:]] == acc_t[by_t[:-1]]
    prev[by_t[1:][same]] = by_t[:-1][same]
    has_prev = prev >= 0
    dist = np.full(m, np.inf)
    prev_op = acc_op[np.maximum(prev, 0)]
    dist[has_prev] = before[acc_op[has_prev]] - before[np.minimum(prev_op[has_prev] + 1, n_ops)]
    # steady state: a tensor that outlives the iteration (weights, optimizer state) is first used
    # after its last use in the previous iteration (or micro-batch) - a cyclic reuse distance
    last_of_t = np.full(g.n_tensors, -1, dtype=np.int64)
    last_of_t[acc_t[by_t]] = by_t  # by_t is sorted by (tensor, position): the last write wins
    first = ~has_prev & g.baseline[acc_t]
    last_op = acc_op[last_of_t[acc_t[first]]]
    dist[first] = (before[n_ops] - before[np.minimum(last_op + 1, n_ops)]) + before[acc_op[first]]
    size = g.nbytes[acc_t]
    hit = dist + size <= cap
    if pinned_cat:
        hit |= np.isin(g.category[acc_t], pinned_cat)
    if platform.kind in DATAFLOW_KINDS:
        hit |= _streamed(g, acc_op, acc_t, prev, has_prev)
        if usage is not None:  # software-managed SRAM, not a cache: a category placed wholly on chip stays there
            resident = [c for c, name in enumerate(CATEGORY_NAMES) if usage.on_chip_share.get(name, 0.0) >= 1.0]
            hit |= np.isin(g.category[acc_t], resident)
    # a write is on-chip when the tensor's next read hits (or it is never read again)
    nxt = np.full(m, -1, dtype=np.int64)
    nxt[prev[has_prev]] = np.flatnonzero(has_prev)
    write_hit = np.where(nxt >= 0, hit[np.maximum(nxt, 0)], size <= max(cap, 0.0))
    hit = np.where(acc_w, write_hit, hit)
    # operand bytes: reads use the bytes of the operand view, writes the op's written bytes split evenly
    r_bytes = np.zeros(m)
    read_pos = ~acc_w
    in_b = np.concatenate([g.in_bytes, np.zeros(w_op.size)])[order]
    r_bytes[read_pos] = in_b[read_pos]
    read_hit_b = np.bincount(acc_op[read_pos], weights=(r_bytes * hit)[read_pos], minlength=n_ops)
    read_all_b = np.bincount(acc_op[read_pos], weights=r_bytes[read_pos], minlength=n_ops)
    read_share = np.divide(read_hit_b, read_all_b, out=np.zeros(n_ops), where=read_all_b > 0)
    w_cnt = np.bincount(acc_op[acc_w], minlength=n_ops)
    w_hits = np.bincount(acc_op[acc_w], weights=hit[acc_w].astype(float), minlength=n_ops)
    write_share = np.divide(w_hits, w_cnt, out=np.zeros(n_ops), where=w_cnt > 0)
    return g.bytes_read * read_share + g.bytes_written * write_share


def _streamed(g: OpGraph, acc_op: np.ndarray, acc_t: np.ndarray, prev: np.ndarray, has_prev: np.ndarray) -> np.ndarray:
    """Accesses a dataflow chip serves on chip by operator fusion, whatever the tensor's size.

    A *section* is a common operator (GEMM, convolution, attention) and the operators after it up
    to the next one. A batch-sized tensor (activation, activation gradient, temporary) read in the
    section that wrote it or in the next one flows between the fused operators tile by tile (PCU to
    PMU to PCU on SN30, tile to tile on the IPU and the wafer) and never reaches DDR; any tensor
    accessed again inside one section (the optimizer's chain of in-place updates of a moment, one
    fused pass per parameter tile) is read from DDR once and stays on chip for the rest of the
    section; tensors kept longer (saved activations, residuals, weights between passes) follow the
    reuse-distance rule.
    """
    common = np.isin(g.kind, [OP_KINDS.index(k) for k in COMMON_KINDS])
    section = np.cumsum(common)
    prev_op = acc_op[np.maximum(prev, 0)]
    gap = section[acc_op] - section[prev_op]
    batch_sized = np.isin(g.category[acc_t], (int(TensorCategory.INPUT_OUTPUT), int(TensorCategory.EPHEMERAL)))
    return has_prev & ((gap == 0) | ((gap <= 1) & batch_sized))


def _buckets(g: OpGraph, bucket_bytes: float) -> list[tuple[int, float]]:
    """(ready op, bytes) of each gradient bucket, in the order backward fills them."""
    ready = g.grad_ready_op
    ok = ready >= 0
    order = np.argsort(ready[ok], kind="stable")
    ops = ready[ok][order]
    size = g.grad_bytes[ok][order]
    out: list[tuple[int, float]] = []
    acc, last = 0.0, -1
    for op, b in zip(ops, size, strict=True):
        acc += float(b)
        last = int(op)
        if acc >= bucket_bytes:
            out.append((last, acc))
            acc = 0.0
    if acc > 0:
        out.append((last, acc))
    return out


@dataclass
class _Tasks:
    """Task order of the iteration graph: host tasks, kernels, collectives, then the data-loading task."""

    k_idx: np.ndarray  # op of each kernel task
    host_op: np.ndarray  # op of each host task
    host_is_launch: np.ndarray  # the host task is a T4 launch (else the op's T1 dispatch gap)
    comm_ready: list[int]  # op whose kernel each collective waits for
    comm_bytes: list[float]
    comm_kind: list[str]

    @property
    def n_host(self) -> int:
        return int(self.host_op.size)

    @property
    def nk(self) -> int:
        return int(self.k_idx.size)

    @property
    def nc(self) -> int:
        return len(self.comm_ready)

    @property
    def n(self) -> int:
        return self.n_host + self.nk + self.nc + 1


def _task_order(g: OpGraph, options: TimeOptions) -> _Tasks:
    """Which ops run a kernel, the host tasks that dispatch them, and the gradient collectives."""
    kernel = ~np.isin(g.kind, _NO_KERNEL) & ((g.bytes_read + g.bytes_written) > 0)
    k_idx = np.flatnonzero(kernel)
    nk = k_idx.size
    # host tasks: per kernel op a T1 dispatch gap then a T4 launch (views and allocations run no
    # kernel and are part of the dispatch of the op around them)
    host_is_launch = np.concatenate([np.zeros(nk, dtype=bool), np.ones(nk, dtype=bool)])
    host_op = np.concatenate([k_idx, k_idx])
    host_order = np.lexsort((host_is_launch, host_op))
    comm_ready: list[int] = []
    comm_bytes: list[float] = []
    comm_kind: list[str] = []
    if max(int(options.n_devices), 1) > 1:
        for ready, nbytes in _buckets(g, options.bucket_bytes):
            msg = nbytes * options.compression_ratio
            if options.dp_mode == "fsdp":
                comm_ready += [ready, ready]
                comm_bytes += [msg, msg]
                comm_kind += ["all_gather", "reduce_scatter"]
            else:
                comm_ready.append(ready)
                comm_bytes.append(msg)
                comm_kind.append("all_reduce")
    return _Tasks(k_idx, host_op[host_order], host_is_launch[host_order], comm_ready, comm_bytes, comm_kind)


def _task_columns(g: OpGraph, t: _Tasks, data_s: float, world: int) -> tuple[dict, dict, np.ndarray]:
    """Per-task columns (rank, proc, overhead, kind, category, duration, flops, bytes), the kernel
    parameters, and the mask of the optimizer's kernels."""
    n_host, nk, nc, n, k_idx = t.n_host, t.nk, t.nc, t.n, t.k_idx
    kernels = slice(n_host, n_host + nk)
    comms = slice(n_host + nk, n_host + nk + nc)
    op_kind_names = np.asarray(OP_KINDS, dtype=object)[g.kind[k_idx]]
    k_kind = np.asarray([_TASK_KIND.get(k, "elementwise") for k in op_kind_names], dtype=object)
    is_opt = g.phase[k_idx] == Phase.OPTIMIZER
    k_kind[is_opt & ~np.isin(k_kind, ["gemm", "conv2d", "bmm"])] = "optimizer"
    k_common = np.isin(g.kind[k_idx], [OP_KINDS.index(k) for k in COMMON_KINDS])
    cols = {
        "rank": np.zeros(n, dtype=np.int32),
        "proc": np.concatenate([np.zeros(n_host), np.ones(nk), np.full(nc, 2), [3]]).astype(np.int32),
        "overhead": np.concatenate([np.where(t.host_is_launch, int(Overhead.T4), int(Overhead.T1)),
                                    np.zeros(nk + nc + 1)]).astype(np.int8),
        "kind": np.concatenate([
            np.where(t.host_is_launch, _KIND_ID["launch"], _KIND_ID["host_op"]),
            np.asarray([_KIND_ID[k] for k in k_kind], dtype=np.int64),
            np.asarray([_KIND_ID[k] for k in t.comm_kind], dtype=np.int64),
            [_KIND_ID["data_loading"]],
        ]).astype(np.int32),
        "category": np.concatenate([
            np.full(n_host, int(Category.CPU)),
            np.where(k_common, int(Category.COMPUTE), int(Category.MEMORY)),
            np.full(nc, int(Category.COMMUNICATION)),
            [int(Category.CPU)],
        ]).astype(np.int8),
    }
    nan = np.full(n, np.nan)
    cols["flops"] = nan.copy()
    cols["flops"][kernels] = np.nan_to_num(g.flops[k_idx])
    cols["bytes"] = nan.copy()
    cols["bytes"][kernels] = g.bytes_read[k_idx] + g.bytes_written[k_idx]
    cols["bytes"][comms] = t.comm_bytes
    cols["duration"] = nan.copy()
    cols["duration"][-1] = data_s
    params: dict[str, np.ndarray] = {}
    for col, src in (("m", g.m), ("n", g.n), ("k", g.k), ("batch", g.gemm_batch), ("dtype_bytes", g.dtype_bytes)):
        params[col] = nan.copy()
        params[col][kernels] = src[k_idx]
    params["elements"] = nan.copy()
    params["elements"][kernels] = np.nan_to_num(g.bytes_written[k_idx] / np.maximum(g.dtype_bytes[k_idx], 1.0))
    params["msg_bytes"] = nan.copy()
    params["msg_bytes"][comms] = t.comm_bytes
    params["world"] = nan.copy()
    params["world"][comms] = world
    return cols, params, is_opt


def _task_names(g: OpGraph, t: _Tasks) -> tuple[np.ndarray, list[str]]:
    """The name column (the ATen op of every op task) and the name table."""
    op_names = np.asarray(g.names, dtype=object)[g.op_name]
    names_list = list(dict.fromkeys([*op_names.tolist(), "launch", "all_reduce", "all_gather", "reduce_scatter",
                                     "data_loading"]))
    name_id = {s: i for i, s in enumerate(names_list)}
    op_name_ids = np.asarray([name_id[s] for s in op_names], dtype=np.int32)
    name = np.concatenate([
        np.where(t.host_is_launch, name_id["launch"], op_name_ids[t.host_op]),
        op_name_ids[t.k_idx],
        np.asarray([name_id[k] for k in t.comm_kind], dtype=np.int32),
        [name_id["data_loading"]],
    ]).astype(np.int32)
    return name, names_list


def _task_edges(g: OpGraph, t: _Tasks, is_opt: np.ndarray, options: TimeOptions) -> tuple[list, list, list]:
    """(sources, destinations, kinds) of the edges, as lists of arrays: launches, bucket readiness,
    the optimizer waiting for the buckets, and data loading before the step when it does not overlap."""
    n_host, nk, nc = t.n_host, t.nk, t.nc
    kernel_task_of_op = np.full(g.n_ops, -1, dtype=np.int64)
    kernel_task_of_op[t.k_idx] = n_host + np.arange(nk)
    launch_pos = np.flatnonzero(t.host_is_launch)
    src = [launch_pos]
    dst = [kernel_task_of_op[t.host_op[launch_pos]]]
    ek = [np.full(launch_pos.size, int(DepKind.CPU_GPU))]
    if nc:
        # a bucket waits for the kernel that produced its last gradient (or the nearest earlier kernel)
        kernel_before = np.maximum.accumulate(np.where(kernel_task_of_op >= 0, kernel_task_of_op, -1))
        ready_task = kernel_before[np.asarray(t.comm_ready)]
        comm_tasks = n_host + nk + np.arange(nc)
        ok = ready_task >= 0
        src.append(ready_task[ok])
        dst.append(comm_tasks[ok])
        ek.append(np.full(int(ok.sum()), int(DepKind.GPU_GPU)))
        opt_k = np.flatnonzero(is_opt)
        if opt_k.size:
            first_opt = n_host + int(opt_k[0])
            src.append(comm_tasks)
            dst.append(np.full(nc, first_opt))
            ek.append(np.full(nc, int(DepKind.GPU_GPU)))
    if not options.overlap_data_loading and n_host:
        src.append(np.asarray([t.n - 1]))
        dst.append(np.asarray([0]))
        ek.append(np.asarray([int(DepKind.CPU_CPU)]))
    return src, dst, ek


def _prepend_accumulation(cols: dict, params: dict, names: list[str], src: list, dst: list, ga: int) -> None:
    """Gradient accumulation: a host task before the first host task and a device task before the
    first kernel stand for the ``ga - 1`` earlier micro-batches (durations set by
    :func:`prepare_iteration`); stream and thread order make the last micro-batch wait for them."""
    name_acc = len(names)
    names.append(f"{ga - 1} accumulated micro-batches")
    head = {"rank": [0, 0], "proc": [0, 1], "name": [name_acc, name_acc], "kind": [_KIND_ID["accumulation"]] * 2,
            "category": [int(Category.CPU), int(Category.COMPUTE)], "overhead": [0, 0],
            "duration": [np.nan, np.nan], "flops": [np.nan, np.nan], "bytes": [np.nan, np.nan],
            "on_chip": [0.0, 0.0], "task_phase": [-1, -1]}
    for key, first in head.items():
        cols[key] = np.concatenate([first, cols[key]]).astype(cols[key].dtype)
    for key, v in params.items():
        params[key] = np.concatenate([[np.nan, np.nan], v])
    src[:] = [x + 2 for x in src]
    dst[:] = [x + 2 for x in dst]


def build_iteration_graph(
    g: OpGraph,
    platform: Platform,
    usage: LevelUsage | None,
    options: TimeOptions,
) -> ExecutionGraph:
    """One rank's iteration as an ExecutionGraph (columnar arrays, no per-task objects).

    Processors: 0 = host thread (per kernel op: dispatch T1 and launch T4), 1 = device
    compute stream, 2 = communication stream, 3 = data-loading thread.
    """
    t = _task_order(g, options)
    data_s = _data_loading_seconds(g, platform, options)
    world = max(int(options.n_devices), 1)
    cols, params, is_opt = _task_columns(g, t, data_s, world)
    cols["name"], names_list = _task_names(g, t)
    src, dst, ek = _task_edges(g, t, is_opt, options)
    kernels = slice(t.n_host, t.n_host + t.nk)
    cols["on_chip"] = np.zeros(t.n)
    cols["on_chip"][kernels] = _on_chip_bytes(g, usage, platform)[t.k_idx]
    if options.dp_mode == "fsdp" and world > 1:
        # FSDP: each rank updates its 1/world shard of the parameters (the trace holds the whole step)
        opt = np.flatnonzero(is_opt) + t.n_host
        for col in (cols["flops"], cols["bytes"], cols["on_chip"], params["elements"]):
            col[opt] /= world
    cols["task_phase"] = np.full(t.n, -1, dtype=np.int8)
    cols["task_phase"][: t.n_host] = g.phase[t.host_op]
    cols["task_phase"][kernels] = g.phase[t.k_idx]
    ga = max(int(options.gradient_accumulation), 1)
    if ga > 1:
        _prepend_accumulation(cols, params, names_list, src, dst, ga)
    graph = ExecutionGraph(
        **{k: cols[k] for k in ("rank", "proc", "name", "kind", "category", "overhead", "duration", "flops", "bytes")},
        group=np.full(cols["proc"].size, -1, dtype=np.int32),
        params=params,
        proc_rank=np.zeros(4, dtype=np.int32),
        proc_kind=np.asarray([ProcKind.CPU_THREAD, ProcKind.GPU_STREAM, ProcKind.GPU_STREAM, ProcKind.CPU_THREAD],
                             dtype=np.int8),
        proc_names=["host (op dispatch)", "device compute", "device communication", "host data loading"],
        edge_src=np.concatenate(src).astype(np.int32),
        edge_dst=np.concatenate(dst).astype(np.int32),
        edge_kind=np.concatenate(ek).astype(np.int8),
        names=names_list,
        kinds=list(_GRAPH_KINDS),
        meta={"on_chip_bytes": cols["on_chip"], "data_loading_s": data_s, "op_index_of_kernel": t.k_idx,
              "accumulation": ga, "task_phase": cols["task_phase"]},
    )
    graph.validate()
    return graph


def _data_loading_seconds(g: OpGraph, platform: Platform, options: TimeOptions) -> float:
    """Host loading + pre-processing of one iteration's batch, plus its transfer to the device."""
    per_host = min(max(options.n_devices, 1), platform.devices_per_node)
    ga = max(int(options.gradient_accumulation), 1)
    t = 0.0
    if options.host_samples_per_s:
        t += ga * g.batch * per_host / options.host_samples_per_s
    inputs = g.baseline & (g.category == TensorCategory.INPUT_OUTPUT)
    t += ga * float(g.nbytes[inputs].sum()) / options.host_link_bytes_per_s
    return t


# ----------------------------------------------------------------------------- prediction
def prepare_iteration(
    g: OpGraph,
    platform: Platform,
    usage: LevelUsage | None,
    options: TimeOptions | None = None,
    *,
    timing: object | None = None,
) -> tuple[ExecutionGraph, FixedTiming, bool]:
    """The iteration graph and its task durations (seconds), ready for the simulator.

    ``timing``: a calibrated :class:`~predictor.timing.kernels.timing.ModelTiming` to use instead of
    the analytic cache-aware models (default: the platform's asset pack if any). Returns
    ``(graph, timing, calibrated)``.
    """
    options = options or TimeOptions()
    graph = build_iteration_graph(g, platform, usage, options)
    calibrated = timing if timing is not None else asset_timing(platform)
    t = calibrated if calibrated is not None else CacheAwareTiming(platform)
    dur = np.asarray(t.durations(graph), dtype=np.float64)
    given = graph.kind_mask("data_loading")
    dur[given] = np.nan_to_num(graph.duration[given])  # stored by the builder, under any timing
    ga = int(graph.meta["accumulation"])
    if ga > 1:
        ph = graph.meta["task_phase"]
        micro = (ph == Phase.FORWARD) | (ph == Phase.BACKWARD)
        acc = graph.kind_mask("accumulation")
        dur[acc & (graph.proc == 0)] = (ga - 1) * dur[micro & (graph.proc == 0)].sum()
        dur[acc & (graph.proc == 1)] = (ga - 1) * dur[micro & (graph.proc == 1)].sum()
    source = getattr(t, "source", "analytic")
    return graph, FixedTiming(dur, f"calibrated ({source})" if calibrated is not None else source), calibrated is not None


def summarize_iteration(
    g: OpGraph,
    platform: Platform,
    graph: ExecutionGraph,
    tl: Timeline,
    options: TimeOptions,
    *,
    calibrated: bool = False,
    source: str = "",
) -> IterationPrediction:
    """Stage times and the methods behind them, from a simulated iteration graph."""
    dur = tl.duration
    cat = graph.category
    ga = int(graph.meta["accumulation"])
    comp = (cat == Category.COMPUTE) | (cat == Category.MEMORY)
    common = cat == Category.COMPUTE
    comm = cat == Category.COMMUNICATION
    host = graph.proc == 0
    by_kind: dict[str, float] = {}
    for kid in np.unique(graph.kind[comp | comm]):
        by_kind[graph.kinds[kid]] = float(dur[graph.kind == kid].sum())
    compute_s = float(dur[comp].sum())
    comm_s = float(dur[comm].sum())
    data_s = float(graph.meta["data_loading_s"])
    allreduce_once = _formula_allreduce(g, platform, options)
    if options.overlap_data_loading:
        formula = max(data_s, compute_s + allreduce_once)
    else:
        formula = data_s + compute_s + allreduce_once
    bd = tl.breakdown(0).as_dict()
    it = tl.iteration_s
    methods = {
        "batch_size": "memory model: fake-tensor trace, schedule walk, catalog memory_policy, eq. 5",
        "computation": (f"calibrated kernels: {source}" if calibrated else
                        "analytic: GEMM/conv/attention = catalog peak x saturating efficiency, bounded by the "
                        "cache-aware memory time; other ops = cache-aware roofline on catalog bandwidths"),
        "communication": ("none (one device)" if options.n_devices <= 1 else
                          "piecewise collective model (Lin et al. eq. 2-4), analytic parameters from the "
                          "catalog interconnect"),
        "data_loading": ("host rate given in the space + input transfer over the host link"
                         if options.host_samples_per_s else "input transfer over the host link only (no host rate given)"),
        "iteration": "simulator: critical path of the ExecutionGraph (host dispatch, compute stream, "
                     "communication stream, data-loading thread)",
    }
    return IterationPrediction(
        batch=g.batch,
        n_devices=options.n_devices,
        iteration_s=it,
        samples_per_s=ga * g.batch * max(options.n_devices, 1) / it if it > 0 else float("inf"),
        compute_s=compute_s,
        common_ops_s=float(dur[common].sum()),
        uncommon_ops_s=float(dur[comp & ~common].sum()),
        communication_s=comm_s,
        exposed_communication_s=float(bd["exposed_communication_s"]),
        data_loading_s=data_s,
        host_overhead_s=float(dur[host].sum()),
        formula_iteration_s=formula,
        kernel_sum_s=tl.kernel_sum_s(),
        breakdown=bd,
        time_by_kind=by_kind,
        methods=methods,
    )


def predict_iteration(
    g: OpGraph,
    platform: Platform,
    usage: LevelUsage | None,
    options: TimeOptions | None = None,
    *,
    timing: object | None = None,
) -> tuple[IterationPrediction, ExecutionGraph, Timeline]:
    """Predict one iteration of ``g`` (traced at the per-device batch) on ``platform``."""
    options = options or TimeOptions()
    graph, fixed, calibrated = prepare_iteration(g, platform, usage, options, timing=timing)
    tl = simulate(graph, fixed)
    return summarize_iteration(g, platform, graph, tl, options, calibrated=calibrated, source=fixed.source), graph, tl


def _formula_allreduce(g: OpGraph, platform: Platform, options: TimeOptions) -> float:
    """All_Reduce(Gradients) of eq. 4 as one message (0 on one device)."""
    if options.n_devices <= 1:
        return 0.0
    total = float(g.grad_bytes[g.grad_ready_op >= 0].sum()) * options.compression_ratio
    kind = "all_reduce" if options.dp_mode != "fsdp" else "reduce_scatter"
    view = TaskView.from_columns(kind, msg_bytes=[total], world=[options.n_devices])
    t = float(PiecewiseCollective().predict(view, platform)[0])
    return t * (2.0 if options.dp_mode == "fsdp" else 1.0)


# ----------------------------------------------------------------------------- pipelines of dataflow chips
def pipeline_platform(platform: Platform, stages: int, pin_weights: bool = True) -> Platform:
    """The memory of a ``stages``-chip pipeline as one placement target: every capacity x ``stages``.

    A vendor's pipelined recipe (Poplar pipelining on a Bow Pod, model parallelism across an SN30-8's
    RDUs, the layer-pipelined mode of a CS-2's workers) splits the layers over the chips so that each
    chip's share of the weights stays in its SRAM, hence ``weights_on_chip`` when ``pin_weights``
    (else the catalog policy: weights too large for every chip's SRAM stream from DDR). Bandwidths
    and peaks stay per chip: each operator runs on one chip. ``stages`` <= 1 returns ``platform``.
    """
    if stages <= 1:
        return platform
    mem = [m.model_copy(update={"capacity_bytes": m.capacity_bytes * stages}) for m in platform.memory]
    policy = "weights_on_chip" if pin_weights else platform.memory_policy
    return platform.model_copy(update={"memory": mem, "memory_policy": policy})


def pipeline_stages_for(platform: Platform, resident_bytes: float, usable_fraction: float = 0.95) -> int:
    """Chips a dataflow system splits a model over: the smallest power of two (up to the chips of one
    system, ``devices_per_node``) whose SRAM holds ``resident_bytes`` (weights + gradient
    accumulators, bytes); the whole system when none does. 1 on every other kind of device."""
    if platform.kind not in DATAFLOW_KINDS:
        return 1
    per_chip = platform.on_chip_bytes * usable_fraction
    stages = 1
    while stages * 2 <= platform.devices_per_node and resident_bytes > per_chip * stages:
        stages *= 2
    return stages


def stage_split(seconds: np.ndarray, stages: int) -> np.ndarray:
    """Seconds of each of ``stages`` contiguous groups of ``seconds`` (operators in order), cut where
    the slowest group is fastest (binary search on its time, greedy packing); trailing empty groups are 0."""
    t = np.asarray(seconds, dtype=float)
    if stages <= 1 or t.size == 0:
        return np.asarray([t.sum()])

    def pack(limit: float) -> list[float]:
        groups, acc = [], 0.0
        for x in t:
            if acc > 0 and acc + x > limit:
                groups.append(acc)
                acc = 0.0
            acc += x
        return [*groups, acc]

    lo, hi = float(t.max()), float(t.sum())
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if len(pack(mid)) <= stages:
            hi = mid
        else:
            lo = mid
    groups = pack(hi)
    return np.asarray(groups + [0.0] * (stages - len(groups)))


def pipeline_iteration(
    g: OpGraph,
    platform: Platform,
    graph: ExecutionGraph,
    tl: Timeline,
    pred: IterationPrediction,
    options: TimeOptions,
    stages: int,
) -> IterationPrediction:
    """One iteration of a ``stages``-chip pipeline from the simulated one-micro-batch graph (seconds).

    The forward operators are cut into ``stages`` contiguous groups (:func:`stage_split`); a stage
    runs its forward group and the matching share of the backward (backward time in proportion to
    forward time), plus sending the activation at its cut over the chip-to-chip link and receiving
    its gradient. ``options.gradient_accumulation`` micro-batches flow through the stages
    (:func:`~predictor.sources.synth.pipeline_schedule.pipeline_latency`: ``sum(t) + (m - 1) max(t)``);
    then each chip runs the optimizer on its ``1/stages`` of the parameters, and replicas
    (``options.n_devices``) all-reduce their gradient shares. ``graph`` must be built with one micro-batch.
    """
    if stages <= 1:
        return pred
    dur = tl.duration
    phase = graph.meta["task_phase"]
    dev = graph.proc == 1
    fwd = np.flatnonzero(dev & (phase == Phase.FORWARD))
    f = dur[fwd]
    total_f = float(f.sum())
    total_b = float(dur[dev & (phase == Phase.BACKWARD)].sum())
    opt = float(dur[dev & (phase == Phase.OPTIMIZER)].sum())
    groups = stage_split(f, stages)
    # the tensor each cut sends: the output of the last forward operator of the group before it
    ops = graph.meta["op_index_of_kernel"][fwd - int(np.flatnonzero(dev)[0])]
    ends = np.minimum(np.searchsorted(np.cumsum(f), np.cumsum(groups[:-1]) * (1 - 1e-12)), f.size - 1)
    link = platform.interconnect.intra_node_bandwidth_bytes_per_s
    p2p = np.zeros(stages)
    p2p[:-1] = 2.0 * g.bytes_written[ops[ends]] / link
    scale = (total_f + total_b) / total_f if total_f > 0 else 0.0
    stage_s = groups * scale + p2p
    m = max(int(options.gradient_accumulation), 1)
    pipe = pipeline_latency(stage_s, m)
    comm = _formula_allreduce(g, platform, options) / stages
    data = m * pred.data_loading_s
    body = pipe + opt / stages + comm
    it = max(data, body) if options.overlap_data_loading else data + body
    methods = {**pred.methods, "pipeline": (
        f"{stages} chips in a pipeline, the forward operators cut where the slowest stage is fastest; "
        f"{m} micro-batches, PredTOP eq. 4 (sum of stages + (m - 1) x slowest); optimizer sharded over the chips")}
    return replace(pred, iteration_s=it, samples_per_s=m * g.batch * max(options.n_devices, 1) / it,
                   compute_s=m * (total_f + total_b) / stages + opt / stages,
                   communication_s=comm + m * float(p2p.sum()), exposed_communication_s=comm,
                   data_loading_s=data, formula_iteration_s=body, methods=methods, pipeline_stages=stages)
