"""A bare CPU platform for tests that price graphs on ``cpu-local`` and set one host refinement themselves.

``cpu-local`` is pinned to a committed pack in the tests (``conftest.py``); its calibrated platform carries
the refinements measured on that host (host contention, lockstep, kernel pace, collective waits, page
faults, step reuse). :func:`bare_cpu` is that platform's peaks, bandwidths and overheads without them: a CPU
whose kernels run as timed alone, on any machine.
"""

from __future__ import annotations

from predictor.timing.platforms import Platform, get_platform

#: the measured refinements of a calibrated CPU platform, each set to "none measured"
REFINEMENTS = {"host_contention": {}, "kernel_pace": {}, "collective_wait_s": {}, "page_fault_s": 0.0,
               "fresh_mapping_bytes": 0.0, "embedding_step_reuse": [], "embedding_step_reuse_pooling": []}


def bare_cpu() -> Platform:
    """The pinned ``cpu-local`` platform without :data:`REFINEMENTS`."""
    return get_platform("cpu-local").model_copy(update=REFINEMENTS)
