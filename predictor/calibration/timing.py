"""One way to time a kernel on a device: warm-up, then repeated timed samples.

* CPU: ``time.perf_counter`` around a batch of back-to-back calls (the batch is sized so one
  sample lasts at least ``min_sample_s``, which keeps the timer's own cost below 0.1 %).
* CUDA: a pair of CUDA events around the same batch, after a ``synchronize`` and a GPU-side
  sleep (``torch.cuda._sleep``) long enough for the host to queue the whole batch behind it. The
  events then time the *kernels* only: without the sleep, a short kernel's interval is the host's
  time to issue it (PyTorch's dispatch, checks and allocation: ~10-30 us per op on an H100 host,
  while an embedding-bag forward of a DLRM table runs 10 us), which the simulator already charges
  to the host as the op's CPU overheads (T1-T5). Measured on an H100: an eager MLP step of 9
  kernels is host-bound, a GPT step's 141 kernels keep the GPU busy under a quarter of the step.

Each measurement keeps every sample (seconds per call). The estimate used for fitting,
:attr:`Measurement.seconds`, is the *lower quartile* of the samples: on a machine shared
with other jobs, interference only ever adds time, so the low quantile is the best estimate
of the kernel's own time, while a quantile (rather than the minimum) is not fooled by one
lucky sample. The median and the minimum are kept too.

*Cold* measurements (``measure(..., cold=True)``) evict the last-level cache before every
call by writing a buffer twice its size (untimed), as FBGEMM's embedding benchmarks flush the
GPU cache: kernels whose data a training step does not leave cache-resident (embedding-table
rows looked up at random, after dozens of other ops ran) are timed as the step runs them,
not as a loop repeating them on cache-resident data runs them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Measurement", "Timer", "ESTIMATOR", "CacheFlusher"]

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


class CacheFlusher:
    """Evicts a device's last-level cache: writes a buffer of twice ``cache_bytes`` (bytes).

    The buffer is allocated on first use (a calibration that never times cold allocates none).
    """

    def __init__(self, device: torch.device, cache_bytes: float) -> None:
        self.device = device
        self.nbytes = int(2 * max(cache_bytes, 2**20))
        self._buf: torch.Tensor | None = None

    def __call__(self) -> None:
        if self._buf is None:
            self._buf = torch.zeros(self.nbytes // 4, dtype=torch.float32, device=self.device)
        self._buf.add_(1.0)


class Timer:
    """Times callables on one device (``torch.device('cpu')`` or ``cuda:N``).

    Args:
        device: where the callables run.
        warmup: untimed calls before timing (allocator, thread pool, caches, cuDNN choice).
        repeats: timed samples per measurement.
        min_sample_s: a sample batches enough calls to last at least this long, seconds.
        max_calls: upper bound on calls per sample.
        cache_bytes: the device's last-level cache, bytes (what a cold measurement evicts).
        cold_repeats: timed samples of a cold measurement (each pays one cache flush).
        long_call_s: a call whose warm-up takes longer than this (seconds) gets one warm-up and at
            most 3 timed samples (its relative timing noise is small; the budget goes to shapes).
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        *,
        warmup: int = 2,
        repeats: int = 7,
        min_sample_s: float = 2e-4,
        max_calls: int = 256,
        cache_bytes: float = 32 * 2**20,
        cold_repeats: int = 5,
        long_call_s: float = 0.05,
    ) -> None:
        self.device = torch.device(device)
        self.warmup = warmup
        self.repeats = repeats
        self.min_sample_s = min_sample_s
        self.max_calls = max_calls
        self.is_cuda = self.device.type == "cuda"
        self.flush = CacheFlusher(self.device, cache_bytes)
        self.cold_repeats = cold_repeats
        self.long_call_s = long_call_s
        #: CUDA: GPU clock cycles per second of ``torch.cuda._sleep`` (measured on first use)
        self._sleep_rate: float | None = None
        #: CUDA: host seconds to issue one call of the callable being measured
        self._issue_s = 0.0

    def sync(self) -> None:
        """Wait for the device to finish queued work (no-op on CPU)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def measure(self, fn: Callable[[], object], setup: Callable[[], object] | None = None, *,
                cold: bool = False) -> Measurement:
        """Time ``fn``; ``setup`` (untimed, optional) runs before every sample.

        With ``setup`` each sample is a single call (the state ``setup`` prepares is consumed by
        one call, e.g. clearing an accumulated gradient). With ``cold`` each sample is a single
        call after the last-level cache was evicted (untimed), and ``cold_repeats`` samples
        are taken.
        """
        if cold:
            user_setup = setup

            def setup() -> None:
                if user_setup is not None:
                    user_setup()
                self.flush()

        long_call = False
        self._issue_s = 0.0
        for _ in range(self.warmup):
            if setup is not None:
                setup()
                self.sync()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            self.sync()
            self._issue_s = t1 - t0  # the last warm-up's: caches, allocator and autotuning settled
            if time.perf_counter() - t0 > self.long_call_s:
                long_call = True  # one warm-up is enough for a call this long
                break
        calls = 1
        if setup is None:
            # size the batch of calls from one probe call
            probe = self._sample(fn, 1)
            calls = int(min(self.max_calls, max(1, np.ceil(self.min_sample_s / max(probe, 1e-9)))))
        n = self.cold_repeats if cold else self.repeats
        samples = np.empty(min(n, 3) if long_call else n)  # long calls: relative noise is small
        for i in range(samples.size):
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

    def _gpu_sleep(self, seconds: float) -> None:
        """Queue a GPU-side sleep of about ``seconds`` on the current stream (no-op if unsupported)."""
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None or seconds <= 0:
            return
        if self._sleep_rate is None:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            cycles = 2_000_000
            sleep(cycles)  # warm
            a.record()
            sleep(cycles)
            b.record()
            b.synchronize()
            self._sleep_rate = cycles / max(a.elapsed_time(b) * 1e-3, 1e-6)
        sleep(int(min(seconds, 0.05) * self._sleep_rate))

    def _sample(self, fn: Callable[[], object], calls: int) -> float:
        """Seconds per call of ``calls`` back-to-back calls (CUDA: kernel time, see the module doc)."""
        if self.is_cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            # the host queues the batch while the GPU sleeps: twice the batch's issue time, plus 20 us
            self._gpu_sleep(2.0 * self._issue_s * calls + 20e-6)
            start.record()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            issued = time.perf_counter() - t0
            end.record()
            end.synchronize()
            self._issue_s = max(self._issue_s, issued / calls)  # a slower issue: a longer sleep next time
            return start.elapsed_time(end) * 1e-3 / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls
