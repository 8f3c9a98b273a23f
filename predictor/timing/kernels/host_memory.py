"""Page faults of the blocks a kernel allocates on a CPU host.

A CPU training step allocates its tensors from glibc's malloc, and a block of at least the
platform's ``fresh_mapping_bytes`` (glibc's largest mmap threshold, 32 MiB) is mapped afresh on every
allocation and unmapped when freed, so each of its 4 KiB pages faults every step, at the platform's
``page_fault_s`` (:mod:`predictor.timing.calibration.page_faults`). Measured in a DLRM step at batch 4096
on this project's 2-core VM: the sparse gradients of the two tables above 32 MiB fault one page each
(20 406 and 13 504 faults for 79.7 and 52.7 MiB), and so do the 38 MiB interaction concatenation and
its gradient; together about 48 000 faults, 70 ms of a 340 ms step.

:func:`allocation_fault_seconds` charges that to the kernels whose one output is a fresh block of
known size (:data:`FRESH_OUTPUT_KINDS`): the embedding backward's sparse gradient (``batch x pooling
x dim``), a GEMM's product (``batch x m x n``), and the result of a concatenation, an element-wise
op, a layer norm, a softmax (forward or backward) or a transpose copy (``elements``, the output's
element count), each times ``dtype_bytes``. In the calibration's benchmarks those faults are most of
a large memory-bound kernel's time: an out-of-place ``add`` of 16.7 M fp32 elements paid 16 323
faults, 23.5 of its 29.8 ms, and a 150 MB ``log_softmax`` backward whose output block glibc happened
to find free took 4.9 ms against 26-35 ms for its faulting neighbours. Smaller blocks reuse freed heap memory or not depending on the process's allocation
history (glibc's default), and are charged nothing; on platforms without a measured fault cost
(every GPU: their caching allocators keep their blocks) the term is zero.
"""

from __future__ import annotations

import numpy as np

from predictor.timing.kernels.base import TaskView
from predictor.timing.platforms.schema import Platform

__all__ = ["PAGE_BYTES", "GEMM_KINDS", "ELEMENTS_OUTPUT_KINDS", "FRESH_OUTPUT_KINDS", "output_bytes", "allocation_fault_seconds",
           "KNOWN_TERM_KINDS", "known_seconds"]

#: bytes per faulted page
PAGE_BYTES = 4096.0
#: op kinds whose output is a GEMM product (``batch x m x n`` elements)
GEMM_KINDS = ("gemm", "mm", "addmm", "bmm", "linear", "matmul")
#: op kinds that write one new block of ``elements`` elements (in-place updates such as the
#: optimizer's are not among them)
ELEMENTS_OUTPUT_KINDS = ("concat", "relu", "gelu", "tanh", "sigmoid", "dropout", "add", "mul", "relu_bwd",
                         "gelu_bwd", "tanh_bwd", "layer_norm", "softmax", "softmax_bwd", "log_softmax_bwd",
                         "transpose")
#: op kinds whose output block :func:`output_bytes` knows
FRESH_OUTPUT_KINDS = ("embedding_bag_bwd", *GEMM_KINDS, *ELEMENTS_OUTPUT_KINDS)


def output_bytes(tasks: TaskView) -> np.ndarray:
    """Bytes of the block each task allocates for its output (NaN for kinds outside
    :data:`FRESH_OUTPUT_KINDS`, and where a needed parameter is missing)."""
    n, kind = len(tasks), tasks.kind
    dt = tasks.get("dtype_bytes", 4.0)
    if kind == "embedding_bag_bwd":
        return tasks.get("batch", 1.0) * tasks.get("pooling", 1.0) * tasks.get("dim") * dt
    if kind in GEMM_KINDS:
        return tasks.get("batch", 1.0) * tasks.get("m") * tasks.get("n") * dt
    if kind in ELEMENTS_OUTPUT_KINDS:
        elements = tasks.get("elements")
        if kind == "transpose":  # a batched transpose may carry only its shape
            elements = np.where(np.isnan(elements), tasks.get("batch", 1.0) * tasks.get("m") * tasks.get("n"),
                                elements)
        return elements * dt
    return np.full(n, np.nan)


def allocation_fault_seconds(tasks: TaskView, platform: Platform) -> np.ndarray:
    """Seconds of page faults each task's output block pays on ``platform``'s host: ceil(bytes /
    4 KiB) x ``page_fault_s`` for a block of at least ``fresh_mapping_bytes``, else 0 (module doc)."""
    n = len(tasks)
    fault_s, ceiling = float(platform.page_fault_s), float(platform.fresh_mapping_bytes)
    if not n or tasks.kind not in FRESH_OUTPUT_KINDS or fault_s <= 0 or ceiling <= 0:
        return np.zeros(n)
    out = np.nan_to_num(output_bytes(tasks), nan=0.0)
    return np.where(out >= ceiling, np.ceil(out / PAGE_BYTES) * fault_s, 0.0)


#: the op kinds :func:`known_seconds` can be non-zero for
KNOWN_TERM_KINDS = FRESH_OUTPUT_KINDS


def known_seconds(tasks: TaskView, platform: Platform) -> np.ndarray:
    """Seconds of each task that a calibrated model does not learn because they follow from measured
    platform facts: the page faults of an output block the host maps afresh every step
    (:func:`allocation_fault_seconds`: outputs of at least 32 MiB of
    embedding backwards, GEMMs and the memory-bound kinds that write a new block; zero for other
    kinds, and on platforms without a measured fault cost). Calibration fits the models to the measured times less
    the faults each sample was counted paying;
    :meth:`~predictor.timing.kernels.learned.MLPKernelModel.predict` and
    :meth:`~predictor.timing.kernels.roofline_fit.FittedRoofline.predict` add these back."""
    return allocation_fault_seconds(tasks, platform)
