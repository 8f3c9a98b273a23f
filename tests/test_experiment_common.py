"""The gloo probe plumbing the experiment scripts share (two forked local ranks)."""

from __future__ import annotations

import time

from experiments.common import run_gloo_ranks, span_after_last_arrival


def _probe(dist, rank: int, cfg: dict) -> list[dict]:
    import torch

    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x)
    dist.barrier()
    if rank == 1:  # arrives later: the span counts from its start
        time.sleep(cfg["late_s"])
    start = time.perf_counter()
    dist.barrier()
    end = time.perf_counter()
    return [{"rank": rank, "sum": float(x[0]), "span": span_after_last_arrival(dist, start, end),
             "world": dist.get_world_size()}]


def test_run_gloo_ranks_returns_rank_0s_rows_and_spans_start_at_the_last_arrival():
    rows = run_gloo_ranks(_probe, {"late_s": 0.3})
    assert rows == [{"rank": 0, "sum": 3.0, "span": rows[0]["span"], "world": 2}]
    assert 0.0 <= rows[0]["span"] < 0.25  # rank 0 waited ~0.3 s in the barrier; that is not counted
