"""The C allocator modes of measured CPU runs (the environment a measured process starts with)."""

from __future__ import annotations

import pytest

from predictor.timing.platforms.host import ALLOCATORS, allocator_env, with_allocator


def test_allocator_env_modes() -> None:
    assert allocator_env("default") == {}
    env = allocator_env("no_trim")
    assert set(env) == {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"}
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) == 32 * 2**20  # glibc ignores anything larger
    assert set(ALLOCATORS) == {"default", "no_trim"}
    with pytest.raises(ValueError, match="allocator must be one of"):
        allocator_env("jemalloc")
    # a new process's environment: the other mode's settings go, the user's other variables stay
    base = {"PATH": "/bin", **env}
    assert with_allocator(base, "default") == {"PATH": "/bin"}
    assert with_allocator({"PATH": "/bin"}, "no_trim") == {"PATH": "/bin", **env}
