"""One way to time a kernel on a device: warm-up, then repeated timed samples.

* CPU: ``time.perf_counter`` around a batch of back-to-back calls (the batch is sized so one
  sample lasts at least ``min_sample_s``, which keeps the timer's own cost below 0.1 %).
* CUDA: a pair of CUDA events around the same batch, after a ``synchronize``.

Each measurement keeps every sample (seconds per call). The estimate used for fitting,
:attr:`Measurement.seconds`, is the *lower quartile* of the samples: on a machine shared
with other jobs, interference only ever adds time, so the low quantile is the best estimate
of the kernel's own time, while a quantile (rather than the minimum) is not fooled by one
lucky sample. The median and the minimum are kept too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Measurement", "Timer", "ESTIMATOR"]

#: how :attr:`Measurement.seconds` is derived from the samples (documented in reports)
ESTIMATOR = "lower quartile of the timed samples"


@dataclass(frozen=True)
class Measurement:
    """Seconds per call of one timed kernel configuration."""

    seconds: float  #: lower quartile of the samples, s
    median_s: float  #: median of the samples, s
    min_s: float  #: fastest sample, s
    samples: int  #: timed samples taken
    calls_per_sample: int  #: back-to-back calls in each sample


class Timer:
    """Times callables on one device (``torch.device('cpu')`` or ``cuda:N``).

    Args:
        device: where the callables run.
        warmup: untimed calls before timing (allocator, thread pool, caches, cuDNN choice).
        repeats: timed samples per measurement.
        min_sample_s: a sample batches enough calls to last at least this long, seconds.
        max_calls: upper bound on calls per sample.
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        *,
        warmup: int = 2,
        repeats: int = 7,
        min_sample_s: float = 2e-4,
        max_calls: int = 256,
    ) -> None:
        self.device = torch.device(device)
        self.warmup = warmup
        self.repeats = repeats
        self.min_sample_s = min_sample_s
        self.max_calls = max_calls
        self.is_cuda = self.device.type == "cuda"

    def sync(self) -> None:
        """Wait for the device to finish queued work (no-op on CPU)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def measure(self, fn: Callable[[], object], setup: Callable[[], object] | None = None) -> Measurement:
        """Time ``fn``; ``setup`` (untimed, optional) runs before every sample.

        With ``setup`` each sample is a single call (the state ``setup`` prepares is consumed by
        one call, e.g. clearing an accumulated gradient).
        """
        for _ in range(self.warmup):
            if setup is not None:
                setup()
            fn()
        self.sync()
        calls = 1
        if setup is None:
            # size the batch of calls from one probe call
            probe = self._sample(fn, 1)
            calls = int(min(self.max_calls, max(1, np.ceil(self.min_sample_s / max(probe, 1e-9)))))
        samples = np.empty(self.repeats)
        for i in range(self.repeats):
            if setup is not None:
                setup()
                self.sync()
            samples[i] = self._sample(fn, calls)
        return Measurement(
            seconds=float(np.quantile(samples, 0.25)),
            median_s=float(np.median(samples)),
            min_s=float(samples.min()),
            samples=int(samples.size),
            calls_per_sample=calls,
        )

    def _sample(self, fn: Callable[[], object], calls: int) -> float:
        """Seconds per call of ``calls`` back-to-back calls."""
        if self.is_cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3 / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls
