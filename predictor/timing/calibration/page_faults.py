"""What one minor page fault costs a training process on this host, and which allocations fault.

A CPU training step allocates its tensors from glibc's malloc. A block of at least
:data:`~predictor.timing.platforms.host.GLIBC_MMAP_CEILING_BYTES` (glibc's largest dynamic mmap threshold on 64-bit Linux,
``DEFAULT_MMAP_THRESHOLD_MAX``) is mapped on its own and unmapped when freed (unless a free heap
block large enough happens to exist), so every one of its 4 KiB pages faults (the kernel zero-fills
it) each time the step allocates it again. In a
DLRM step the sparse embedding gradients are such blocks: a table's gradient holds one row per
lookup, ``batch x pooling x dim x dtype`` bytes. Measured on this project's 2-core VM, an
embedding backward with a 64 MiB gradient pays 16 385 faults per call (16 384 pages), every call;
one with a 16 MiB gradient pays 0 or 4 096 depending on the process's allocation history (glibc's
threshold moves up when a mapped block is freed), which no model of the step can know.

:func:`measure_page_fault_s` times it where nothing else happens: a fresh block above the ceiling
is allocated, written once and freed, against the same write into a block kept mapped; the
difference divided by the faults counted (``getrusage``) is the wall time of one fault. The kernel
models add ``pages x page_fault_s`` to each kernel whose output block reaches the ceiling
(:func:`predictor.timing.kernels.host_memory.allocation_fault_seconds`: embedding gradients, GEMM products
and the new blocks of memory-bound kernels); ``tuner calibrate`` stores both numbers in the platform (``page_fault_s``,
``fresh_mapping_bytes``).
"""

from __future__ import annotations

import mmap
import resource
import statistics
import time

from predictor.timing.kernels.host_memory import PAGE_BYTES

__all__ = ["FAULT_SIZES", "fault_cost", "measure_page_fault_s"]

#: block sizes timed, bytes: all above the ceiling, so every allocation is a fresh mapping
FAULT_SIZES = (48 * 2**20, 96 * 2**20, 192 * 2**20)


def fault_cost(size: int, repeats: int) -> dict:
    """Wall and system seconds per fault of writing ``size`` freshly mapped bytes, against a kept block.

    Returns a dict with ``size_bytes``, ``faults_per_alloc`` (median, counted), ``pages``,
    ``fresh_wall_s`` / ``kept_wall_s`` (median seconds of one write), ``wall_per_fault_s`` and
    ``system_per_fault_s`` (seconds).
    """
    import torch

    kept = torch.empty(size, dtype=torch.uint8)
    kept.fill_(1)
    kept_wall: list[float] = []
    fresh_wall, sys_s, faults = [], [], []
    for _ in range(repeats):  # kept and fresh writes alternate, so a slow stretch of the host hits both alike
        t0 = time.perf_counter()
        kept.fill_(2)
        kept_wall.append(time.perf_counter() - t0)
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        # a private anonymous mapping, as glibc gives a block above its mmap ceiling, but always fresh:
        # torch.empty reused a free heap block left by earlier work in the process (0 faults, cost 0)
        block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        x = torch.frombuffer(block, dtype=torch.uint8)
        x.fill_(2)
        del x
        block.close()
        t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        fresh_wall.append(t1 - t0)
        sys_s.append(r1.ru_stime - r0.ru_stime)
        faults.append(r1.ru_minflt - r0.ru_minflt)
    n_faults = max(statistics.median(faults), 1.0)
    return {
        "size_bytes": size,
        "faults_per_alloc": statistics.median(faults),
        "pages": size / PAGE_BYTES,
        "fresh_wall_s": statistics.median(fresh_wall),
        "kept_wall_s": statistics.median(kept_wall),
        "wall_per_fault_s": max(statistics.median(fresh_wall) - statistics.median(kept_wall), 0.0) / n_faults,
        "system_per_fault_s": statistics.median(sys_s) / n_faults,
    }


def measure_page_fault_s(repeats: int = 9, sizes: tuple[int, ...] = FAULT_SIZES) -> tuple[float, list[dict]]:
    """Median wall seconds of one minor page fault over ``sizes`` (and the per-size rows of
    :func:`fault_cost`); about a second with the defaults. Timed on one torch thread (the thread
    count is restored after), as a step's gradient is faulted in by the thread that writes it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = [fault_cost(int(s), repeats) for s in sizes]
    finally:
        torch.set_num_threads(threads)
    return float(statistics.median(r["wall_per_fault_s"] for r in rows)), rows
