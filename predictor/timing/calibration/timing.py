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
:attr:`Measurement.seconds`, is the *median* of the samples, and a calibration that times a
grid in several rounds keeps the median over the rounds (:func:`typical`): a model is asked
for the time a kernel takes inside a training step, and the step runs in the machine's typical
state, interference included. A low quantile or the fastest round estimates the kernel alone on
an idle machine instead; on the shared 2-core VM that under-predicted 11 of 12 measured training
iterations (median of their iterations) by 1-17 %, the noisiest kernels (embedding lookups, round
spread ~40 %) the most. On a dedicated machine the two agree. The lower quartile and the
minimum are kept too (columns ``lq_s``, ``min_s``).

*Cold* measurements evict the last-level cache before every sample by writing a buffer twice
its size (untimed), as FBGEMM's embedding benchmarks flush the GPU cache: kernels whose data a
training step does not leave cache-resident (embedding-table rows looked up at random, operands
written dozens of ops earlier) are timed as the step runs them, not as a loop repeating them on
cache-resident data runs them. Two forms:

* :meth:`Timer.measure_cold` (the memory-bound families): *data cold, code warm*. After the
  flush one untimed call on a spare instance of the kernel brings PyTorch's dispatch path, the
  allocator's state and the kernel's code back into cache, as the ops before it do in a step;
  then ``K`` independent instances (each its own buffers, none touched since the flush) run back
  to back and a sample is their mean. ``K`` grows for short kernels (up to
  ``max_cold_instances``) so one flush buys several calls. Measured on the 2-core VM: a cold
  4 KiB ``add`` took 41 us as a lone call after the flush (the dispatcher's code and data evicted
  with everything else) and 6 us here, against 1.3 us warm.
* ``measure(..., cold=True, warm_code=...)``: one call per flush; ``warm_code`` runs the same op
  on a small table of its own first (the embedding-bag benchmarks, whose instances would each
  need their own table of up to 1 GiB). Without ``warm_code`` the code path is cold too.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Measurement", "Timer", "ESTIMATOR", "CacheFlusher", "typical"]

#: how :attr:`Measurement.seconds` is derived from the samples (documented in reports)
ESTIMATOR = "median of the timed samples; median over the rounds"


def typical(values) -> float:
    """The estimate kept from repeated rounds of one measurement: their median, seconds."""
    return float(np.median(np.asarray(values, dtype=float)))


@dataclass(frozen=True)
class Measurement:
    """Seconds per call of one timed kernel configuration."""

    seconds: float  #: the estimate: median of the samples, s
    median_s: float  #: median of the samples, s
    min_s: float  #: fastest sample, s
    samples: int  #: timed samples taken
    calls_per_sample: int  #: back-to-back calls in each sample
    lq_s: float = float("nan")  #: lower quartile of the samples, s
    #: minor page faults per call, median over the samples (CPU; NaN where not counted)
    faults: float = float("nan")

    @classmethod
    def of(cls, samples: np.ndarray, calls_per_sample: int, faults: np.ndarray | None = None) -> Measurement:
        """The statistics of ``samples`` (seconds per call) and of ``faults`` (page faults per call)."""
        return cls(seconds=float(np.median(samples)), median_s=float(np.median(samples)),
                   min_s=float(samples.min()), samples=int(samples.size), calls_per_sample=calls_per_sample,
                   lq_s=float(np.quantile(samples, 0.25)),
                   faults=float(np.median(faults)) if faults is not None and faults.size else float("nan"))


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
        max_cold_instances: most instances :meth:`measure_cold` times per flush.
        long_call_s: a call whose warm-up takes longer than this (seconds) gets one warm-up and at
            most 3 timed samples (its relative timing noise is small; the budget goes to shapes).
        code_warm_max_s: :meth:`measure_cold` calls its spare instance after each flush (to bring the
            code path back) only for calls shorter than this (seconds): the refill costs a cold call
            tens of microseconds (module doc), under 1 % of a longer call, while the spare call
            costs a whole one — for the large GEMMs of a grid, 5 of a case's 13 calls.
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
        max_cold_instances: int = 16,
        long_call_s: float = 0.05,
        code_warm_max_s: float = 5e-3,
    ) -> None:
        self.device = torch.device(device)
        self.warmup = warmup
        self.repeats = repeats
        self.min_sample_s = min_sample_s
        self.max_calls = max_calls
        self.is_cuda = self.device.type == "cuda"
        self.flush = CacheFlusher(self.device, cache_bytes)
        self.cold_repeats = cold_repeats
        self.max_cold_instances = max_cold_instances
        self.long_call_s = long_call_s
        self.code_warm_max_s = code_warm_max_s
        #: CUDA: GPU clock cycles per second of ``torch.cuda._sleep`` (measured on first use)
        self._sleep_rate: float | None = None
        #: CUDA: host seconds to issue one call of the callable being measured
        self._issue_s = 0.0

    def sync(self) -> None:
        """Wait for the device to finish queued work (no-op on CPU)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def measure(self, fn: Callable[[], object], setup: Callable[[], object] | None = None, *,
                cold: bool = False, warm_code: Callable[[], object] | None = None) -> Measurement:
        """Time ``fn``; ``setup`` (untimed, optional) runs before every sample.

        With ``setup`` each sample is a single call (the state ``setup`` prepares is consumed by
        one call, e.g. clearing an accumulated gradient). With ``cold`` each sample is a single
        call after the last-level cache was evicted (untimed), and ``cold_repeats`` samples
        are taken; ``warm_code`` (optional) runs untimed after each flush: the same op on other,
        small data, so ``fn`` finds its code path warm and only its own data cold.
        """
        if cold:
            user_setup = setup

            def setup() -> None:
                if user_setup is not None:
                    user_setup()
                self.flush()
                if warm_code is not None:
                    self.sync()
                    warm_code()

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
        faults = np.empty(samples.size)
        for i in range(samples.size):
            if setup is not None:
                setup()
                self.sync()
            samples[i] = self._sample(fn, calls)
            faults[i] = self._faults
        return Measurement.of(samples, calls, faults)

    def measure_cold(self, build: Callable[[], tuple[Callable[[], object], Callable[[], object] | None]]
                     ) -> Measurement:
        """Time a kernel *data cold, code warm* (module doc): seconds per call.

        ``build`` returns a fresh instance ``(fn, setup)`` (its own input buffers; ``setup`` may
        be None and then runs before every sample). The first instance is the spare called
        untimed after each flush (not for a call longer than ``code_warm_max_s``, whose code
        refill is negligible); ``K`` more (``ceil(min_sample_s / warm call)``, at most
        ``max_cold_instances``) are timed back to back, ``cold_repeats`` samples (3 for a call
        longer than ``long_call_s``, which gets one warm-up).
        """
        spare = build()
        self._issue_s = 0.0
        warm = 0.0
        for _ in range(self.warmup):  # the last warm-up's duration sizes K
            if spare[1] is not None:
                spare[1]()
                self.sync()
            warm = self._sample(spare[0], 1)
            if warm > self.long_call_s:
                break  # one warm-up is enough for a call this long
        k = int(min(self.max_cold_instances, max(1, np.ceil(self.min_sample_s / max(warm, 1e-9)))))
        timed = [build() for _ in range(k)]
        for fn, setup in timed:  # each instance's first call (allocator, lazy init) untimed
            if setup is not None:
                setup()
            fn()
        self.sync()
        fns = [fn for fn, _ in timed]

        def batch() -> None:
            for f in fns:
                f()

        # long calls: relative noise is small, the budget goes to shapes
        samples = np.empty(min(self.cold_repeats, 3) if warm > self.long_call_s else self.cold_repeats)
        faults = np.empty(samples.size)
        for i in range(samples.size):
            for inst in (spare, *timed):
                if inst[1] is not None:
                    inst[1]()
            self.sync()
            self.flush()
            self.sync()
            if warm <= self.code_warm_max_s:
                spare[0]()
                self.sync()
            samples[i] = self._sample(batch, 1) / k
            faults[i] = self._faults / k
        return Measurement.of(samples, k, faults)

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
        """Seconds per call of ``calls`` back-to-back calls (CUDA: kernel time, see the module doc).

        On a CPU it also counts the process's minor page faults during the calls (``getrusage``,
        outside the timed interval) and leaves their number per call in ``self._faults`` (NaN on
        CUDA): a block the C allocator maps afresh faults in every page, which the embedding
        backward's model prices separately (:mod:`predictor.timing.calibration.page_faults`)."""
        self._faults = float("nan")
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
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        self._faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / calls
        return (t1 - t0) / calls
