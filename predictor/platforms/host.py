"""Facts about a CPU host that runs several training processes (ranks) side by side."""

from __future__ import annotations

import os

__all__ = ["comm_thread_has_core"]


def comm_thread_has_core(ranks: int, threads_per_rank: int, cores: int | None = None) -> bool:
    """Whether ``ranks`` processes on this host, each running ``threads_per_rank`` compute threads,
    leave every rank a core for its communication thread (gloo's worker).

    When they do not (``cores < ranks x (threads_per_rank + 1)``), a collective running "in the
    background" takes its CPU time from the compute threads: gloo's all-reduce sums and its
    loopback socket copies are CPU work. Measured on this 2-core VM with 2 DLRM ranks
    (torch.profiler, rank 0): the MLP's ``AddmmBackward0`` took 2.5x its 1-rank time per sample
    while DDP's all-reduces ran. Graph builders then put collectives on the issuing thread, where
    they serialise with compute. ``cores`` defaults to ``os.cpu_count()``.
    """
    cores = (os.cpu_count() or 1) if cores is None else cores
    return cores >= ranks * (threads_per_rank + 1)
