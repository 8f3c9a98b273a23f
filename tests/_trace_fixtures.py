"""Shared helpers for the trace tests: where the shared traces are, hand-made Kineto files, and a captured
training loop."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest


def shared_dir() -> Path:
    env = os.environ.get("TUNER_SHARED")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared"


TRACES = shared_dir() / "data" / "traces"

needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="shared traces not present")


def capture_training(folder: Path, model, loss_of, *, steps: int, lr: float = 0.1, warmup: int = 1,
                     active: int = 2, modules: bool = True) -> Path:
    """``steps`` SGD steps (learning rate ``lr``) of ``model`` under ``tuner.capture(folder)``, one profiler step
    each; ``loss_of(model)`` gives a step's loss; ``modules``: record the module ranges. Returns ``folder``."""
    import torch

    import tuner

    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with tuner.capture(folder, warmup=warmup, active=active, modules=modules) as cap:
        for _ in range(steps):
            loss = loss_of(model)
            opt.zero_grad()
            loss.backward()
            opt.step()
            cap.step()
    return folder


def capture_steps(folder: Path, model, loss_of, *, modules: bool = True, steps: int = 7, active: int = 2) -> Path:
    """The what-if tests' capture: :func:`capture_training` on one torch thread, learning rate 0.01, one warm-up
    step, ``active`` profiled ones, the rest of ``steps`` after the window; returns ``folder``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return capture_training(folder, model, loss_of, steps=steps, lr=0.01, warmup=1, active=active, modules=modules)
    finally:
        torch.set_num_threads(threads)


def op(name: str, tid: int, ts: float, dur: float, pid: int = 100, **args) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def ann(name: str, tid: int, ts: float, dur: float, pid: int = 100) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def runtime(name: str, tid: int, ts: float, dur: float, corr: int, pid: int = 100) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "External id": corr}}


def kernel(name: str, stream: int, ts: float, dur: float, corr: int, **args) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "device": 0, "correlation": corr, **args}}


def write_trace(path: Path, events: list[dict], rank: int | None = None, world: int | None = None) -> Path:
    doc: dict = {"schemaVersion": 1, "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, **({"world_size": world} if world else {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path
