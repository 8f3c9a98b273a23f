"""The C allocator modes of measured CPU runs, and ``experiments/allocator_spread_cpu.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import allocator_spread_cpu as spread  # noqa: E402
from predictor.timing.platforms.host import ALLOCATORS, allocator_env, with_allocator  # noqa: E402


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


def test_spread_summary_and_report() -> None:
    procs = [{"faults": [0, 3000, 0, 3000], "wall_s": [0.010, 0.012, 0.010, 0.012]},
             {"faults": [0, 0, 0, 0], "wall_s": [0.010, 0.010, 0.010, 0.010]}]
    s = spread.summarise(procs)
    assert s["mean_faults"] == [1500.0, 0.0]
    assert s["share_steps_without_faults"] == [0.5, 1.0]
    assert s["step_spread_pct"] == pytest.approx(10.0)  # medians 11 vs 10 ms
    meta = {"date": "d", "machine": "m", "torch": "t", "processes": 2, "warmup": 1, "steps": 4, "wall_s": 1.0,
            "command": "python experiments/allocator_spread_cpu.py"}
    text = spread.markdown([{"model": "mlp", "batch": 64, "default": s, "no_trim": s}], meta)
    assert "| mlp | 64 | default | 1500, 0 | 50%, 100% | 11.00, 10.00 | 10.0% |" in text


def test_bad_arguments_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        spread.main(["--processes", "1"])
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("error: --processes")
