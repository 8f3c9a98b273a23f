"""The calibration timer: warm batches of calls vs cold single calls after a cache flush."""

from __future__ import annotations

import torch

from predictor.calibration.timing import CacheFlusher, Timer


def test_cold_measurement_flushes_before_every_call() -> None:
    timer = Timer("cpu", warmup=2, repeats=7, cold_repeats=4, cache_bytes=2**20)
    order: list[str] = []
    flush = timer.flush
    timer.flush = lambda: (order.append("flush"), flush())  # type: ignore[assignment]
    m = timer.measure(lambda: order.append("call"), cold=True)
    assert m.samples == 4 and m.calls_per_sample == 1
    # every call, warm-up included, follows its own flush
    assert order == ["flush", "call"] * (2 + 4)


def test_cold_measurement_runs_the_user_setup_too() -> None:
    timer = Timer("cpu", warmup=1, repeats=3, cold_repeats=2, cache_bytes=2**20)
    calls = {"setup": 0, "fn": 0}
    m = timer.measure(lambda: calls.__setitem__("fn", calls["fn"] + 1),
                      setup=lambda: calls.__setitem__("setup", calls["setup"] + 1), cold=True)
    assert m.samples == 2
    assert calls == {"setup": 3, "fn": 3}


def test_warm_measurement_batches_calls_and_never_flushes() -> None:
    timer = Timer("cpu", warmup=1, repeats=5, cache_bytes=2**20, min_sample_s=1e-3)
    timer.flush = lambda: (_ for _ in ()).throw(AssertionError("flushed"))  # type: ignore[assignment]
    m = timer.measure(lambda: None)
    assert m.samples == 5 and m.calls_per_sample > 1
    assert m.min_s <= m.seconds <= m.median_s


def test_flusher_writes_twice_the_cache_lazily() -> None:
    f = CacheFlusher(torch.device("cpu"), 3 * 2**20)
    assert f._buf is None
    f()
    f()
    assert f._buf is not None and f._buf.numel() * 4 == 6 * 2**20
    assert float(f._buf[0]) == 2.0


def test_long_calls_get_one_warm_up_and_three_samples() -> None:
    import time

    timer = Timer("cpu", warmup=2, repeats=7, cold_repeats=5, cache_bytes=2**20, long_call_s=0.005)
    calls: list[float] = []
    m = timer.measure(lambda: (calls.append(1.0), time.sleep(0.01)), cold=True)
    assert m.samples == 3 and len(calls) == 1 + 3
    short = Timer("cpu", warmup=2, repeats=7, cold_repeats=5, cache_bytes=2**20, long_call_s=0.005)
    assert short.measure(lambda: None, cold=True).samples == 5
