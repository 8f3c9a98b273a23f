"""Facts about a CPU host that runs several training processes (ranks) side by side."""

from __future__ import annotations

import os

__all__ = ["comm_thread_has_core", "ALLOCATORS", "GLIBC_MMAP_CEILING_BYTES", "allocator_env", "with_allocator"]

#: glibc's largest dynamic mmap threshold on 64-bit Linux (``DEFAULT_MMAP_THRESHOLD_MAX``), bytes:
#: a block at least this large is mapped on its own (afresh on every allocation, unless a free heap
#: block happens to fit)
GLIBC_MMAP_CEILING_BYTES = 32 * 2**20

#: how the host's C allocator is configured for a measured run: ``default`` = glibc as it comes;
#: ``no_trim`` = glibc never returns freed memory to the OS (trim threshold ~1 PB) and maps only
#: blocks above 32 MiB on their own, which is what a caching allocator (jemalloc, tcmalloc, as
#: PyTorch's CPU launcher ``torch.backends.xeon.run_cpu`` recommends) does for a training loop
ALLOCATORS = ("default", "no_trim")
_NO_TRIM_ENV = {"MALLOC_TRIM_THRESHOLD_": str(10**15), "MALLOC_MMAP_THRESHOLD_": str(GLIBC_MMAP_CEILING_BYTES)}


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


def allocator_env(allocator: str) -> dict[str, str]:
    """Environment variables that put glibc's malloc of a *new* process in ``allocator`` mode.

    glibc reads them once, at process start, so they apply to processes started after they are
    set (``os.execve`` of oneself, spawned ranks). Measured on this project's 2-core VM: under
    ``default`` the same training step pays 0 to ~3000 page faults per step (up to a quarter of a
    small step) depending on the process's allocation history, so two fresh processes of one
    program differ by up to 8x in faults; under ``no_trim`` only blocks above 32 MiB fault.
    """
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)} (got {allocator!r})")
    return dict(_NO_TRIM_ENV) if allocator == "no_trim" else {}


def with_allocator(environ: dict[str, str], allocator: str) -> dict[str, str]:
    """A copy of ``environ`` with every setting of :func:`allocator_env` removed, then ``allocator``'s
    added: the environment of a new process whose C allocator runs in that mode."""
    return {k: v for k, v in environ.items() if k not in allocator_env("no_trim")} | allocator_env(allocator)
