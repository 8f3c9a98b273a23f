"""A small training loop captured with ``tuner.capture`` on this CPU (one torch thread), shared by the what-if tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def capture_steps(folder: Path, model, loss_of: Callable, *, modules: bool = True, steps: int = 7,
                  active: int = 2) -> Path:
    """Capture ``steps`` SGD iterations of ``model`` (loss ``loss_of(model)``) into ``folder``: one warm-up
    step, ``active`` profiled ones, the rest after the window; returns ``folder``."""
    import torch

    import tuner

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with tuner.capture(folder, warmup=1, active=active, modules=modules) as cap:
            for _ in range(steps):
                loss = loss_of(model)
                opt.zero_grad()
                loss.backward()
                opt.step()
                cap.step()
    finally:
        torch.set_num_threads(threads)
    return folder
