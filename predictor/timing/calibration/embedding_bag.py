"""Embedding-bag microbenchmarks, forward and backward, with index batches drawn to reuse factors.

Each configuration is a table of ``E`` rows x ``D`` (fp32), a batch of ``B`` samples with
``L`` lookups per sample on average (``N = round(B L)`` lookups, bag sizes multinomial, so
fractional ``L`` works), and an index batch whose *reuse-factor histogram* follows a target.
Half of the tables span a wide log-uniform grid (E from 100, D 8..256, L 0.2..1000); the other
half are drawn as :func:`~predictor.sources.synth.dlrm_tables.generate_tasks` draws a task's tables
(E 1e3..1e7, D 32/64/128, light or heavy-tailed L up to 1000, batches of 256 and more, reuse
always from the profiles), so the shapes DLRM tasks use are
covered densely — a quick grid capped at L 160 and 1.7e7 looked-up elements under-predicted a
heavy table's backward 3x (measured 385 ms) and over-predicted another's 3x. Index batches:

* a third of the wide grid's batches draw indices uniformly at random (the natural reuse of
  ``N`` draws from ``E`` rows);
* the others take one of Meta's open DLRM reuse profiles (:func:`~predictor.sources.synth.
  dlrm_reuse.reuse_profiles`) thinned to this batch's size with
  :func:`~predictor.sources.synth.dlrm_reuse.thin_reuse`, and :func:`indices_for_reuse` draws
  rows with access counts in each bin accordingly.

The features stored with the timing are the reuse factors *measured* on the generated batch
(:func:`reuse_factors`: lookup-weighted, bins ``(0,1], (1,2], (2,4], ...``), as Lin et al.
2024 §III-E store per-batch RF with each benchmark sample.

Timed kernels (``torch.nn.functional.embedding_bag``, ``mode="sum"``):

* ``embedding_bag_fwd``: the forward lookup + pooling;
* ``embedding_bag_bwd``: the backward of the same call with ``sparse=True`` gradients (the
  CPU DLRM setting) *plus* the SGD update of the touched rows (``weight.add_(grad)``), which
  together are what FBGEMM's fused backward-SGD kernel does on GPUs.

Parameters per row: ``batch = B, rows = E, dim = D, pooling = L, dtype_bytes, rf0..rf16``.
Modelled by an MLP on ``log2 B, E, L, D`` and four sizes derived with the 17 reuse factors
(log2 of lookups ``B L``, rows touched ``B L sum_j rf_j / c_j``, their bytes, table bytes:
:data:`~predictor.timing.kernels.features.DERIVED_FEATURES`). Lin et al. 2024 §III-E give the network
the 17 bins themselves; with a quick calibration's ~500 samples on this CPU that generalised
worse to real task tables (measured on the 84 tables of three sharding tasks' real batches,
timed cold beside the calibration: backward GMAE 12.6 % with the bins vs 11.3 % without, 37.6 % vs
21.7 % on the ten tables slower than 20 ms; forward 17.5 % vs 12.3 %), so the bins enter through
the rows they imply — the quantity the backward's row update and the forward's gathers scale with.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from predictor.sources.synth.dlrm_reuse import RF_BINS, reuse_profile_meta, reuse_profiles, thin_reuse
from predictor.sources.synth.dlrm_tables import sample_pooling
from predictor.timing.calibration.base import (
    BenchContext,
    Benchmark,
    ModelSpec,
    keep_typical,
    log_uniform_int,
    record,
)
from predictor.timing.kernels.embedding import RF_COLUMNS

__all__ = ["EmbeddingBagBenchmark", "reuse_factors", "indices_for_reuse", "EMBEDDING_FEATURES", "neighbour_warmers",
           "neighbour_weight", "NEIGHBOUR_TABLE"]

#: B, E, L, D, derived sizes (lookups, rows touched, their bytes, table bytes) and the 17 reuse factors
#: the embedding MLPs' inputs: B, E, L, D and the sizes the batch's 17-bin reuse histogram implies
#: (:data:`~predictor.timing.kernels.features.DERIVED_FEATURES`); the 17 bins themselves are not inputs
EMBEDDING_FEATURES = ("batch", "rows", "pooling", "dim", "lookups", "distinct_rows", "distinct_bytes", "table_bytes")


def reuse_factors(indices: np.ndarray) -> np.ndarray:
    """Lookup-weighted 17-bin reuse histogram of one index batch (sums to 1).

    Bin ``j`` holds the fraction of lookups whose row is accessed ``c`` times in the batch with
    ``c`` in bin ``j``: ``(0,1], (1,2], (2,4], ..., (32768, inf)``.
    """
    _, counts = np.unique(np.asarray(indices), return_counts=True)
    if counts.size == 0:
        return np.zeros(RF_BINS)
    bins = np.clip(np.ceil(np.log2(counts)), 0, RF_BINS - 1).astype(np.int64)
    hist = np.bincount(bins, weights=counts.astype(np.float64), minlength=RF_BINS)
    return hist / hist.sum()


def indices_for_reuse(rf: np.ndarray, lookups: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    """``lookups`` row ids in ``[0, rows)`` whose reuse histogram approximates ``rf``.

    For each bin, enough distinct rows with access counts drawn inside the bin's range take
    the bin's share of the lookups; rows are distinct random ids, the multiset is shuffled.
    When the distinct rows needed exceed ``rows``, ids are drawn with replacement (collisions
    raise reuse); the caller measures the achieved histogram with :func:`reuse_factors`.
    """
    rf = np.asarray(rf, dtype=np.float64)
    rf = rf / rf.sum()
    share = np.floor(rf * lookups).astype(np.int64)
    share[int(np.argmax(rf))] += lookups - int(share.sum())
    counts: list[np.ndarray] = []
    for j, n_j in enumerate(share):
        if n_j <= 0:
            continue
        lo, hi = (1, 1) if j == 0 else (2 ** (j - 1) + 1, 2**j)
        left = int(n_j)
        while left > 0:
            c = rng.integers(lo, hi + 1, size=max(1, left // max(lo, 1)))
            c = c[np.cumsum(c) <= left]
            if c.size == 0:
                c = np.array([left])
            counts.append(c)
            left -= int(c.sum())
    cnt = np.concatenate(counts) if counts else np.ones(1, dtype=np.int64)
    distinct = cnt.size
    if distinct <= rows:
        ids = rng.choice(rows, size=distinct, replace=False) if rows <= 4 * distinct or rows < 2**20 else \
            _distinct_ids(rows, distinct, rng)
    else:
        ids = rng.integers(0, rows, size=distinct)
    out = np.repeat(ids, cnt)
    rng.shuffle(out)
    return out[:lookups]


def _distinct_ids(rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` distinct ids from a large range without a full permutation."""
    got = np.unique(rng.integers(0, rows, size=int(k * 1.2) + 16))
    while got.size < k:
        got = np.unique(np.concatenate([got, rng.integers(0, rows, size=k)]))
    return rng.permutation(got)[:k]


class EmbeddingBagBenchmark(Benchmark):
    """embedding_bag forward and backward (sparse gradient + SGD row update), timed cold.

    Every call is timed after evicting the last-level cache (:class:`~.timing.CacheFlusher`):
    in a training step dozens of other ops run between two lookups of a table, so its rows are
    not cache-resident. After the flush the same op runs untimed on another, typical table for the
    same batch (:func:`neighbour_warmers`): in a step the op before a table's call is another table's,
    which leaves the code path warm and the caches full of its data. Measured on a 2-core VM: the 29 tables
    of a DLRM task at batch 1024 take 1.1 ms forward repeated warm and 4.8 ms cold; simulating the DLRM iterations with cold-measured embedding kernels instead of
    warm-calibrated models cut their geomean error from 30 % to 14 %.
    """

    name = "embedding_bag"
    #: its rounds walk the same table sequence (not ``run_cases``), so they need no ``ctx.only``
    retimes_first_round = False

    def specs(self, ctx: BenchContext) -> list[ModelSpec]:
        return [
            ModelSpec(kernel=k, kinds=(k,), method="mlp", features=EMBEDDING_FEATURES,
                      work=("batch", "pooling", "dim"), fill="reuse", fallback="analytic-embedding")
            for k in ("embedding_bag_fwd", "embedding_bag_bwd")
        ]

    def run(self, ctx: BenchContext) -> pd.DataFrame:
        rng = ctx.rng
        n_tables = ctx.count(tiny=3, quick=64, full=160)
        per_table = ctx.count(tiny=3, quick=8, full=16)
        # the largest lookups (batch x pooling x dim elements) a case may gather: the generator's
        # heavy tables reach pooling 1000 (Lin et al. 2024 §IV-B), 1.3e8 elements at batch 1024
        max_lookup_elems = {"tiny": 2**18, "quick": 2**27, "full": 2**28}[ctx.range_level]
        l_hi = {"tiny": 160.0, "quick": 1000.0, "full": 1000.0}[ctx.range_level]
        b_hi = {"tiny": 256, "quick": 4096, "full": 65536}[ctx.range_level]
        # tables may be larger than other families' tensors: a task's table fills up to 80 % of a
        # rank's memory share, and its rows' spread over DRAM is what the backward's update pays for
        table_bytes = 4 * ctx.max_tensor_bytes if ctx.level != "tiny" else ctx.max_tensor_bytes
        profiles = reuse_profiles()
        big = reuse_profile_meta(2021)
        big_lookups = big["batch_size"] * big["mean_pooling"]
        rows_out: list[dict] = []
        neighbour = neighbour_weight(ctx.device)  # the table whose call precedes every timed one
        import time

        start = time.perf_counter()
        for ti in range(n_tables):
            if ti >= 2 and time.perf_counter() - start > ctx.budget_s:
                ctx.log(f"    embedding_bag: budget of {ctx.budget_s:.0f} s reached after {ti} of {n_tables} tables")
                break
            # every other table is drawn as the DLRM task generator draws them (E log-uniform on
            # 1e3..1e7, D in {32, 64, 128}, pooling light or heavy-tailed up to 1000), so the shapes
            # tasks use are covered densely; the others span a wider, uniform grid
            task_like = ti % 2 == 1
            dims = [32, 64, 128] if task_like else [8, 16, 24, 32, 48, 64, 96, 128, 192, 256]
            d = int(rng.choice(dims))
            e_lo, e_hi = (1e3, 1e7) if task_like else (100, 2e7)
            e_hi = max(2 * e_lo, min(e_hi, table_bytes / (4 * d)))
            e = int(log_uniform_int(rng, e_lo, e_hi, 1)[0])
            heavy = bool(rng.random() < 0.5)
            weight = torch.nn.Parameter(torch.rand(e, d, device=ctx.device))
            for _ in range(per_table):
                # task-like tables: training batch sizes (256 up); the others from 16
                b = int(log_uniform_int(rng, min(256, b_hi // 2) if task_like else 16, b_hi, 1)[0])
                if task_like:
                    L = float(min(l_hi, sample_pooling(rng, 1, np.array([heavy]))[0]))
                else:
                    L = float(np.exp(rng.uniform(np.log(0.2), np.log(l_hi))))
                n = max(1, int(round(b * L)))
                if n * d > max_lookup_elems:
                    n = max(1, max_lookup_elems // d)
                    L = n / b
                if not task_like and rng.random() < 1 / 3:
                    idx = rng.integers(0, e, size=n)
                else:
                    f = min(1.0, n / big_lookups * float(np.exp(rng.uniform(np.log(0.25), np.log(4.0)))))
                    target = thin_reuse(profiles[rng.integers(len(profiles))], f)
                    idx = indices_for_reuse(target, n, e, rng)
                rf = reuse_factors(idx)
                sizes = rng.multinomial(n, np.full(b, 1.0 / b))
                offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
                row = {"batch": b, "rows": e, "dim": d, "pooling": n / b, "dtype_bytes": 4,
                       **{c: float(v) for c, v in zip(RF_COLUMNS, rf, strict=True)}}
                row["case"] = len(rows_out) // 2
                rows_out += self._time(ctx, weight, idx, offsets, row, neighbour)
            del weight
        return pd.DataFrame(rows_out)

    def _time(self, ctx: BenchContext, weight: torch.nn.Parameter, idx: np.ndarray, offsets: np.ndarray,
              row: dict, neighbour: torch.nn.Parameter) -> list[dict]:
        dev = ctx.device
        i_t = torch.as_tensor(idx, dtype=torch.int64, device=dev)
        o_t = torch.as_tensor(offsets, dtype=torch.int64, device=dev)
        spare_fwd, spare_bwd = neighbour_warmers(int(row["batch"]), neighbour)
        best: dict[str, dict] = {}
        seen: dict[str, list[float]] = {"fwd": [], "bwd": []}
        faults: dict[str, list[float]] = {"fwd": [], "bwd": []}
        for _ in range(max(1, ctx.passes)):
            with torch.no_grad():
                m = ctx.timer.measure(lambda: F.embedding_bag(i_t, weight, o_t, mode="sum"), cold=True,
                                      warm_code=spare_fwd)
            seen["fwd"].append(m.seconds)
            faults["fwd"].append(m.faults)
            if "fwd" not in best or m.seconds < best["fwd"]["seconds"]:
                best["fwd"] = record({"kernel": "embedding_bag_fwd", "kind": "embedding_bag_fwd", **row}, m)
            m = _time_backward(ctx, weight, i_t, o_t, spare_bwd)
            seen["bwd"].append(m.seconds)
            faults["bwd"].append(m.faults)
            if "bwd" not in best or m.seconds < best["bwd"]["seconds"]:
                best["bwd"] = record({"kernel": "embedding_bag_bwd", "kind": "embedding_bag_bwd", **row}, m)
        return [keep_typical(best[key], seen[key], faults[key]) for key in ("fwd", "bwd")]


#: the other table whose call runs untimed before each timed one (rows, dim, mean pooling): a
#: typical table of a DLRM task (the generator's median rows, the middle width, light pooling), looked
#: up for the timed call's batch with uniformly random rows
NEIGHBOUR_TABLE = (100_000, 64, 8.0)


def _backward_step(weight: torch.nn.Parameter, i_t: torch.Tensor, o_t: torch.Tensor):
    """``(backward, clear)``: one embedding_bag call's backward (sparse gradient) plus the SGD update
    of its rows, and the setup that drops the accumulated gradient."""
    out = F.embedding_bag(i_t, weight, o_t, mode="sum", sparse=True)
    grad = torch.randn_like(out)

    def clear() -> None:
        weight.grad = None

    def backward() -> None:
        out.backward(grad, retain_graph=True)
        with torch.no_grad():
            weight.add_(weight.grad, alpha=-1e-3)

    return backward, clear


def neighbour_weight(dev: torch.device, seed: int = 0) -> torch.nn.Parameter:
    """The weights of :data:`NEIGHBOUR_TABLE` on ``dev`` (float32, 25.6 MB): made once per run of
    timings and handed to :func:`neighbour_warmers` for every timed call."""
    rows, dim, _ = NEIGHBOUR_TABLE
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.rand(rows, dim, generator=g).to(dev))


def neighbour_warmers(batch: int, weight: torch.nn.Parameter):
    """``(fwd, bwd)``: forward, and backward + SGD row update, of :data:`NEIGHBOUR_TABLE` (``weight``:
    :func:`neighbour_weight`) for ``batch`` samples. Run untimed after the cache flush and before the
    timed call, they leave the state a training step leaves: there the op before a table's lookup (or
    its backward) is another table's, which brings the code path back into cache and its own rows and
    gradient in.

    A warm-up by the same op on a 256-row table of a few KiB leaves the caches nearly empty of data: on a
    2-core VM a light table's backward (589k x 32, one lookup per sample, batch 1024) took 0.23 ms after it,
    0.37 ms after a typical table's call and 0.28 ms inside a DLRM training step.
    """
    rows, _, pooling = NEIGHBOUR_TABLE
    w, dev = weight, weight.device
    n = max(1, int(round(batch * pooling)))
    g = torch.Generator().manual_seed(batch)
    i = torch.randint(0, rows, (n,), generator=g).to(dev)
    o = torch.linspace(0, n, batch + 1)[:-1].long().to(dev)
    backward, clear = _backward_step(w, i, o)

    def fwd() -> None:
        with torch.no_grad():
            F.embedding_bag(i, w, o, mode="sum")

    def bwd() -> None:
        clear()
        backward()
        clear()

    return fwd, bwd


def _time_backward(ctx: BenchContext, weight: torch.nn.Parameter, i_t: torch.Tensor, o_t: torch.Tensor,
                   warm_code=None):
    """Backward of one embedding_bag call (sparse gradient) plus the SGD update of its rows, timed
    cold (``warm_code``: see :meth:`~.timing.Timer.measure`)."""
    backward, clear = _backward_step(weight, i_t, o_t)
    m = ctx.timer.measure(backward, setup=clear, cold=True, warm_code=warm_code)
    weight.grad = None
    return m
