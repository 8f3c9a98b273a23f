"""Local helper processes of a calibration: ``python -m MODULE ARGS`` per rank, started together.

The collective benchmarks (one process per rank) and the host-contention probes (one process per
co-scheduled rank) both need K plain subprocesses — not ``multiprocessing`` spawn, so the caller's
``__main__`` is never re-imported — with the repository on ``PYTHONPATH``, a shared deadline,
stragglers killed, and each process's output kept for the error message.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcessRun", "run_module_processes"]


@dataclass(frozen=True)
class ProcessRun:
    """How a group of processes ended."""

    codes: list[int]  #: exit codes (a killed process: its signal, negative)
    timed_out: bool
    logs: list[Path]  #: stdout + stderr of each process

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(c == 0 for c in self.codes)

    def why(self, timeout_s: float) -> str:
        """``timed out after N s`` or the exit codes, plus the last line a failed process printed."""
        why = f"timed out after {timeout_s:.0f} s" if self.timed_out else f"exit codes {self.codes}"
        for code, log in zip(self.codes, self.logs, strict=True):
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            if code != 0 and lines:
                return f"{why}: {lines[-1][:200]}"
        return why


def run_module_processes(module: str, argvs: list[list[str]], log_dir: Path, timeout_s: float) -> ProcessRun:
    """Run ``python -m module *argv`` for every ``argv`` at once; wait at most ``timeout_s`` seconds for all."""
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    logs = [log_dir / f"proc{i}.log" for i in range(len(argvs))]
    procs = []
    for argv, path in zip(argvs, logs, strict=True):
        with open(path, "w") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", module, *argv], stdout=log,
                                          stderr=subprocess.STDOUT, env=env))
    deadline = time.monotonic() + timeout_s
    timed_out = False
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    return ProcessRun([int(p.returncode) for p in procs], timed_out, logs)
