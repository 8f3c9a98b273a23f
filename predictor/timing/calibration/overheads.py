"""Host overheads T1..T5 (Lin et al. 2022 §III-C) measured from a profiled training run.

A small DLRM-like model (embedding bag with sparse gradients, two MLPs, layer-norm, dropout,
concat, BCE loss, SGD) trains for a few iterations under ``torch.profiler``; the host events
of the busiest thread form a tree (top-level op -> children -> leaves). Per type, values
outside the box-plot whiskers (1.5 IQR) are dropped and the mean is kept, as the paper does.

What a "kernel launch" is depends on the device:

* **CUDA**: the CUDA runtime calls under an op (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ...).
  T1 = gap between consecutive top-level ops; T2 = op start -> first runtime call;
  T3 = last runtime call end -> op end; T4 = duration of a runtime call; T5 = gap between
  consecutive runtime calls of one op. Exactly the paper's definitions.
* **CPU**: there are no launches; an op's compute runs synchronously inside its *compute
  leaves* (leaf ``aten::`` events that do work, i.e. not views/metadata such as ``aten::t``,
  ``aten::view``, ``aten::empty``). We define, by analogy:
  T1 = gap between consecutive top-level ops (Python, autograd engine bookkeeping);
  T2 = top-level op start -> first compute leaf start (dispatch down through composite ops
  and metadata ops); T3 = last compute leaf end -> op end; T5 = gap between consecutive
  compute leaves of one op; **T4 = 0**: a compute leaf's own dispatch cost is *inside* the
  kernel time, because the microbenchmarks time the Python-level call of the same op. A CPU
  graph must therefore run its "kernels" serially with the host thread (the CPU is the
  device); the overheads then add up with kernel times instead of overlapping them.

The profiler's own cost per event (``profiler_overhead_s``: per-iteration wall time with
minus without the profiler, divided by the events per iteration) inflates every gap; it is
subtracted once from each gap-type mean (T1, T2, T3, T5), clipped at zero. The unprofiled
iterations are timed both before and after the profiled ones (their median is the baseline), so a
machine that slows down or speeds up during the measurement does not read as profiler cost: with
all of them before, a second CPU job starting mid-measurement made the tiny calibration's overhead
exceed T1 and clip it to zero.

On CUDA that correction is partial: a gap holds many events (an op's dispatch runs several nested
ATen calls, each with the profiler's callbacks). On an H100 host the T's so derived charge a
one-kernel op T1 + T2 + T3 + T4 = 50.9 µs, where a tight loop of such ops, unprofiled, costs 8-40 µs
each (median 26 µs; :func:`unprofiled_op_seconds`, recorded as ``unprofiled_op_s``). The manifest keeps
the T's as measured; a CUDA pack's *platform* holds the device host model of
:mod:`predictor.timing.calibration.step_graph`: the T's x this step's unprofiled / profiled ratio, and
``step_s``, what the unprofiled step costs beyond its simulated ops. Scaling alone under-charged the MLP / DLRM
steps, whose device-mode graphs lacked host work the real program runs (kernel-less autograd nodes, the
foreach optimizer op, the framework work of ``backward()`` and ``step()``); the synthesisers emit it. :func:`unprofiled_step_seconds` records what that work costs
unprofiled (``unprofiled_step_s``), to check the closure's ``step_s`` against on the next GPU run.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["measure_overheads", "METADATA_OPS", "whisker_mean", "unprofiled_op_seconds", "unprofiled_step_seconds",
           "single_kernel_ops", "host_seconds_per_call", "host_gaps"]

#: leaf ops that do no compute (views, allocation, metadata) — not "kernels" on CPU
METADATA_OPS = frozenset(
    "aten::" + n
    for n in (
        "t", "transpose", "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand",
        "permute", "select", "slice", "unsqueeze", "squeeze", "detach", "detach_", "alias", "empty",
        "empty_like", "empty_strided", "resolve_conj", "resolve_neg", "result_type", "lift_fresh",
        "numpy_T", "split", "chunk", "unbind", "narrow", "contiguous", "is_nonzero", "item",
        "_local_scalar_dense", "set_", "resize_", "to", "_to_copy_noop", "size", "stride", "dim",
        "is_same_size", "expand_as", "view_as", "flatten", "unflatten",
        "_has_compatible_shallow_copy_type",
    )
)


def whisker_mean(values: list[float] | np.ndarray) -> tuple[float, int]:
    """Mean of the values inside the box-plot whiskers (Q1 - 1.5 IQR, Q3 + 1.5 IQR), and their count."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return 0.0, 0
    q1, q3 = np.quantile(v, [0.25, 0.75])
    iqr = q3 - q1
    keep = v[(v >= q1 - 1.5 * iqr) & (v <= q3 + 1.5 * iqr)]
    keep = keep if keep.size else v
    return float(keep.mean()), int(keep.size)


class SmallDLRM(nn.Module):
    def __init__(self, rows: int = 20000, dim: int = 32, tables: int = 4) -> None:
        super().__init__()
        self.emb = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        self.norm = nn.LayerNorm(dim * (tables + 1))
        self.top = nn.Sequential(nn.Linear(dim * (tables + 1), 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 1))

    def forward(self, dense: torch.Tensor, idx: list[torch.Tensor], off: torch.Tensor) -> torch.Tensor:
        pooled = [e(i, off) for e, i in zip(self.emb, idx, strict=True)]
        z = torch.cat([self.bottom(dense), *pooled], dim=1)
        return self.top(self.norm(z))


def single_kernel_ops(device: torch.device) -> dict:
    """Eager ops that launch one kernel each on tiny tensors (name -> zero-argument callable)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=g).to(device)
    w = torch.randn(64, 64, generator=g).to(device)
    bias = torch.randn(64, generator=g).to(device)
    table = torch.randn(1000, 64, generator=g).to(device)
    idx = torch.randint(0, 1000, (256,), generator=g).to(device)
    off = torch.arange(0, 256, 4).to(device)
    return {
        "add": lambda: x + w,
        "relu": lambda: torch.relu(x),
        "addmm": lambda: torch.addmm(bias, x, w),
        "layer_norm": lambda: F.layer_norm(x, (64,)),
        "dropout": lambda: F.dropout(x, 0.1, training=True),
        "softmax": lambda: torch.softmax(x, -1),
        "embedding_bag": lambda: F.embedding_bag(idx, table, off, mode="sum"),
    }


def host_seconds_per_call(fn, calls: int, device: torch.device, warmup: int = 50) -> float:
    """Host seconds per call of ``fn`` over ``calls`` back-to-back calls without synchronisation
    (after ``warmup`` calls and a sync): on tiny tensors the GPU finishes each kernel long before the
    next is issued, so the loop runs at the host's pace."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return dt / calls


def unprofiled_op_seconds(device: torch.device, calls: int = 2000, rounds: int = 3) -> dict[str, float]:
    """Host seconds per call of each :func:`single_kernel_ops` op (:func:`host_seconds_per_call`),
    the fastest of ``rounds``."""
    return {name: min(host_seconds_per_call(fn, calls, device) for _ in range(rounds))
            for name, fn in single_kernel_ops(device).items()}


#: tensor / layer counts of :func:`unprofiled_step_seconds` (two of each: a fixed and a per-unit cost)
STEP_PROBE_SIZES = (4, 32)


def unprofiled_step_seconds(device: torch.device, calls: int = 300, rounds: int = 3) -> dict[str, float]:
    """Host seconds per call, unprofiled, of the step-level framework work an eager device-mode step runs
    beside its ops (what single-GPU e2e traces show besides the ops):

    * ``foreach_add_N``: one ``torch._foreach_add_`` over N tiny tensors (SGD's update as one op, many
      tensors, as PyTorch's default foreach optimizers run it on a GPU);
    * ``sgd_step_N``: ``SGD.step()`` over N tiny parameters with gradients (its Python and the foreach op);
    * ``backward_N``: ``loss.backward()`` through N tiny ``Linear`` + ReLU layers, gradients set to None
      before (engine entry, one node per op, AccumulateGrad per parameter, the layers' kernels).

    Each over N in :data:`STEP_PROBE_SIZES`, the fastest of ``rounds`` (:func:`host_seconds_per_call`).
    Recorded beside the T's (``unprofiled_step_s``), not applied by any model yet.
    """
    g = torch.Generator().manual_seed(0)
    out: dict[str, float] = {}
    for n in STEP_PROBE_SIZES:
        params = [torch.randn(16, generator=g).to(device) for _ in range(n)]
        grads = [torch.randn(16, generator=g).to(device) for _ in range(n)]
        out[f"foreach_add_{n}"] = min(host_seconds_per_call(lambda p=params, q=grads: torch._foreach_add_(p, q, alpha=-0.01),
                                                            calls, device) for _ in range(rounds))
        leaves = [torch.randn(16, generator=g).to(device).requires_grad_() for _ in range(n)]
        for leaf, grad in zip(leaves, grads, strict=True):
            leaf.grad = grad.clone()
        opt = torch.optim.SGD(leaves, lr=0.01)
        out[f"sgd_step_{n}"] = min(host_seconds_per_call(opt.step, calls, device) for _ in range(rounds))
        layers = nn.Sequential(*[m for _ in range(n) for m in (nn.Linear(8, 8), nn.ReLU())]).to(device)
        x = torch.randn(4, 8, generator=g).to(device)

        def backward(model: nn.Module = layers, inp: torch.Tensor = x) -> None:
            for prm in model.parameters():
                prm.grad = None
            model(inp).sum().backward()

        forward = min(host_seconds_per_call(lambda m=layers, i=x: m(i).sum(), calls, device) for _ in range(rounds))
        out[f"backward_{n}"] = max(0.0, min(host_seconds_per_call(backward, calls, device) for _ in range(rounds)) - forward)
    return out


class _DenseOnlyStep:
    """The calibration model without its embedding tables (``SmallDLRM(tables=0)``), timed unprofiled like the
    full step (a synchronisation after each): the second point of the device host model's closure
    (:mod:`predictor.timing.calibration.step_graph`: the step's framework cost apart from the sparse tables' host cost).
    Its SGD has no sparse gradient, so on a device it takes the foreach path."""

    def __init__(self, device: torch.device, batch: int, warmup: int, sync) -> None:
        torch.manual_seed(1)
        self.model = SmallDLRM(tables=0).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(1)
        dense = torch.randn(batch, 13, generator=gen).to(device)
        self.data = (dense, [], torch.arange(0, batch * 4, 4).to(device), torch.rand(batch, 1, generator=gen).to(device))
        self.sync = sync
        self.seconds: list[float] = []
        for _ in range(warmup):
            _train_step(self.model, self.opt, self.data)
        sync()

    def time(self, iterations: int) -> None:
        self.seconds += _timed_steps(self.model, self.opt, self.data, iterations, self.sync)

    def median_s(self) -> float:
        return float(np.median(self.seconds))


def _timed_steps(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple, iterations: int, sync) -> list[float]:
    """Wall seconds of ``iterations`` unprofiled training steps, each ended by ``sync()``."""
    out = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        _train_step(model, opt, batch)
        sync()
        out.append(time.perf_counter() - t0)
    return out


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple) -> None:
    dense, idx, off, y = batch
    opt.zero_grad(set_to_none=True)
    loss = F.binary_cross_entropy_with_logits(model(dense, idx, off), y)
    loss.backward()
    opt.step()


def _small_dlrm(device: torch.device, batch: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, tuple]:
    """The overheads calibration's model (:class:`SmallDLRM`, seeded), its SGD optimizer and one batch of
    ``batch`` samples on ``device``: (model, optimizer, (dense, indices, offsets, labels))."""
    torch.manual_seed(0)
    model = SmallDLRM().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    dense = torch.randn(batch, 13, generator=gen).to(device)
    idx = [torch.randint(0, 20000, (batch * 4,), generator=gen).to(device) for _ in range(4)]
    off = torch.arange(0, batch * 4, 4).to(device)
    y = torch.rand(batch, 1, generator=gen).to(device)
    return model, opt, (dense, idx, off, y)


def _is_launch(e, cuda: bool) -> bool:
    """Whether profiler event ``e`` is a launch: a CUDA runtime call (not a synchronisation) on a GPU, a compute
    leaf (a leaf ``aten::`` op that is not a view or metadata op) on a CPU."""
    if cuda:
        return e.name.startswith("cuda") and "Synchronize" not in e.name
    return not e.cpu_children and e.name.startswith("aten::") and e.name not in METADATA_OPS


def _launches_under(e, cuda: bool) -> list:
    """The launches below event ``e`` (``e`` itself when it is one and has none below), by start time."""
    out, stack = [], [e]
    while stack:
        x = stack.pop()
        if x is not e and _is_launch(x, cuda):
            out.append(x)
            continue
        stack.extend(x.cpu_children)
    if not out and _is_launch(e, cuda):
        out = [e]
    return sorted(out, key=lambda x: x.time_range.start)


def _is_step_marker(e) -> bool:
    """The schedule's ``ProfilerStep#N`` events, which wrap iterations."""
    return e is not None and e.name.startswith("ProfilerStep")


def host_gaps(events: list, cuda: bool) -> tuple[list[float], ...]:
    """The samples of T1..T5 (seconds) in one thread's profiler ``events``: per top-level op, the gap since the
    previous op's end (T1), from its start to its first launch (T2), from its last launch to its end (T3), each
    launch's own time on a GPU (T4) and the gaps between its launches (T5)."""
    roots = sorted((e for e in events if not _is_step_marker(e) and (e.cpu_parent is None or _is_step_marker(e.cpu_parent))),
                   key=lambda e: e.time_range.start)
    t1, t2, t3, t4, t5 = [], [], [], [], []
    prev_end = None
    for e in roots:
        s, t = e.time_range.start * 1e-6, e.time_range.end * 1e-6
        if prev_end is not None and s >= prev_end:
            t1.append(s - prev_end)
        prev_end = t
        ls = _launches_under(e, cuda)
        if not ls:
            continue
        t2.append(ls[0].time_range.start * 1e-6 - s)
        t3.append(t - ls[-1].time_range.end * 1e-6)
        for a, b in zip(ls, ls[1:], strict=False):
            t5.append(max(0.0, (b.time_range.start - a.time_range.end) * 1e-6))
        if cuda:
            t4 += [x.time_range.elapsed_us() * 1e-6 for x in ls]
    return t1, t2, t3, t4, t5


def measure_overheads(device: torch.device, iterations: int = 12, warmup: int = 3, batch: int = 256,
                      profiler_warmup: int = 0) -> dict:
    """T1..T5 (seconds) and how they were obtained; see the module docstring for definitions.

    Args:
        device: where the small model trains.
        iterations: timed iterations, unprofiled and then profiled.
        warmup: untimed iterations before them (seconds of a fresh process's first steps: lazy
            CUDA module loading, allocator growth).
        batch: samples per iteration.
        profiler_warmup: profiled iterations discarded before the recorded ones (the profiler's
            own start-up: its first steps after ``profile()`` opens run slower than its steady state).
    """
    from torch.profiler import ProfilerActivity, profile, schedule

    model, opt, data = _small_dlrm(device, batch)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        _train_step(model, opt, data)
    sync()
    plain: list[float] = []

    def time_plain() -> None:
        plain.extend(_timed_steps(model, opt, data, iterations, sync))

    time_plain()
    dense_only = _DenseOnlyStep(device, batch, warmup, sync) if cuda else None
    if dense_only is not None:
        dense_only.time(iterations)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    profiled = []
    sched = schedule(wait=0, warmup=profiler_warmup, active=iterations, repeat=1) if profiler_warmup else None
    with profile(activities=acts, schedule=sched) as prof:
        for i in range(profiler_warmup + iterations):
            t0 = time.perf_counter()
            _train_step(model, opt, data)
            sync()
            if i >= profiler_warmup:
                profiled.append(time.perf_counter() - t0)
            if sched is not None:
                prof.step()
    time_plain()  # the baseline brackets the profiled iterations
    if dense_only is not None:
        dense_only.time(iterations)
    events = [e for e in prof.events() if getattr(e, "device_type", None) is None or str(e.device_type).endswith("CPU")]
    busiest = Counter(e.thread for e in events).most_common(1)[0][0]
    events = [e for e in events if e.thread == busiest]
    per_iter_events = len(events) / iterations
    prof_overhead = max(0.0, (np.median(profiled) - np.median(plain)) / max(per_iter_events, 1.0))
    t1, t2, t3, t4, t5 = host_gaps(events, cuda)
    out: dict = {"device": str(device), "iterations": iterations, "warmup": warmup,
                 "profiler_warmup": profiler_warmup, "profiler_overhead_s": prof_overhead,
                 "iteration_s_unprofiled": float(np.median(plain)), "iteration_s_profiled": float(np.median(profiled)),
                 **({"iteration_s_unprofiled_dense": dense_only.median_s()} if dense_only is not None else {}),
                 "samples": {}}
    for name, vals in (("t1_s", t1), ("t2_s", t2), ("t3_s", t3), ("t5_s", t5)):
        mean, n = whisker_mean(vals)
        out[name] = max(0.0, mean - prof_overhead)
        out["samples"][name] = n
    t4_mean, n4 = whisker_mean(t4)
    out["t4_s"] = t4_mean if cuda else 0.0
    out["samples"]["t4_s"] = n4
    if cuda:  # a record of the host's tight-loop cost per op, beside the T's (not applied; see above)
        out["unprofiled_op_s"] = unprofiled_op_seconds(device)
        out["unprofiled_step_s"] = unprofiled_step_seconds(device)
    out["definition"] = "CUDA runtime calls are launches" if cuda else (
        "CPU: launches are compute leaves (leaf aten ops that are not views/metadata); T4 = 0, the "
        "dispatch cost of a compute leaf is inside its measured kernel time")
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m predictor.timing.calibration.overheads --device cuda --out FILE``: T1..T5 alone, as JSON
    (what ``tuner calibrate --refit PACK --overheads FILE`` puts into a pack)."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description="Measure host overheads T1..T5 on a device (JSON).")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument("--iterations", type=int, default=12)
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    out = measure_overheads(dev, iterations=args.iterations)
    out["device_name"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    from pathlib import Path

    from predictor.files import atomic_write_text

    atomic_write_text(Path(args.out), json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k.startswith("t")}, indent=1))


if __name__ == "__main__":
    main()

