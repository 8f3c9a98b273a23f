"""Do a DLRM step's embedding tables run warmer than the calibration times them? (CPU, one process)

Diagnosis for issue 4's 1-rank DLRM rows (over-predicted +10…+25 % against the median of the AVX2 windows,
most at the smallest batch). The calibration times each embedding-bag call cold: the last-level cache
evicted, then another table's call (``neighbour_warmers``). In a step a table's backward runs after its
own forward touched the same rows (the other tables' lookups and the dense part in between), and each
forward reads rows the previous iteration's backward wrote; whether those rows are still cached depends on
how many bytes the step touches in between against the LLC. This times the e2e DLRM's tables (one rank's
share: all 29 on 1 rank, each rank's half on 2 ranks) three ways in one process, interleaved per pass:

* ``cold``: :func:`experiments.dlrm_gloo.cold_embedding_seconds` (the calibration's protocol);
* ``sequence``: the step's order without the dense part: every local table's forward on the step's batch,
  then every table's backward + SGD row update in reverse order, the step's two batches alternating;
* ``flushed``: the same sequence with the LLC evicted before every call (the control: cache reuse removed,
  code path and neighbour state as in the sequence).

Sums over the tables (ms) and ``sequence / cold``: under 1 the step's reuse makes the tables faster than
the pack's cold-fitted models price them. The pack's predicted sums stand beside them.

    flock /tmp/tuner-measure.lock python experiments/embedding_reuse_cpu.py --platform cpu-local

writes ``experiments/results/embedding_reuse_cpu.md`` and ``.json`` (about 3 minutes per pass).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import fail, host_check, host_line, write_results  # noqa: E402

SPARSE_LR = 0.01


def local_job(batch: int, ranks: int, rank: int, iters: int):
    """The e2e DLRM job (:func:`experiments.e2e_cpu.dlrm_job`) cut to ``rank``'s tables of the ``ranks``-rank
    placement, at the whole batch (each rank looks up its tables for every sample), the predictor's spec of it
    and the tables' global indices. The cut job numbers its tables from 0, so on 2 ranks a table's index batches
    are drawn from another seed than in the step (same rows, pooling and reuse profile); on 1 rank they are the
    step's."""
    from experiments.e2e_cpu import dlrm_job, dlrm_spec_for, dlrm_tables
    from predictor.sources.synth.dlrm_tables import EmbeddingTables

    tables = dlrm_tables(batch)
    job = dlrm_job(tables, batch, ranks, 1, 1, iters)
    mine = np.flatnonzero(np.asarray(job.assignment) == rank)
    sub = replace(job, rows=tuple(job.rows[t] for t in mine), dim=tuple(job.dim[t] for t in mine),
                  pooling=tuple(job.pooling[t] for t in mine),
                  reuse=tuple(job.reuse[t] for t in mine) if job.reuse else (), assignment=(0,) * len(mine),
                  n_ranks=1)
    reuse = tables.reuse[mine] if tables.reuse is not None else None
    sub_tables = EmbeddingTables(rows=tables.rows[mine], dim=tables.dim[mine], pooling=tables.pooling[mine],
                                 reuse=reuse, label=tables.label)
    return sub, dlrm_spec_for(sub, sub_tables), mine


def sequence_seconds(job, iters: int, flush=None) -> tuple[np.ndarray, np.ndarray]:
    """Per table, median seconds of its forward and of its backward + SGD row update in the step's order
    (all forwards, then the backwards in reverse), the step's two batches alternating; ``flush`` evicts the
    LLC before every call."""
    from experiments.dlrm_gloo import table_batch

    n = len(job.rows)
    tables = [nn.EmbeddingBag(int(job.rows[t]), int(job.dim[t]), mode="sum", sparse=True) for t in range(n)]
    batches = [[tuple(torch.as_tensor(a) for a in table_batch(job, t, w)) for t in range(n)] for w in range(2)]
    fwd, bwd = np.zeros((iters, n)), np.zeros((iters, n))
    for it in range(iters + 1):  # the first iteration is warm-up
        lookups = batches[it % 2]
        pooled = []
        for k, (i, o) in enumerate(lookups):
            if flush is not None:
                flush()
            t0 = time.perf_counter()
            pooled.append(tables[k](i, o))
            if it:
                fwd[it - 1, k] = time.perf_counter() - t0
        grads = [torch.randn_like(p) for p in pooled]
        for k in reversed(range(n)):
            if flush is not None:
                flush()
            t0 = time.perf_counter()
            pooled[k].backward(grads[k])
            w = tables[k].weight
            with torch.no_grad():
                w.add_(w.grad, alpha=-SPARSE_LR)
            w.grad = None
            if it:
                bwd[it - 1, k] = time.perf_counter() - t0
    return np.median(fwd, axis=0), np.median(bwd, axis=0)


def measure(batches: list[int], passes: int, iters: int, timing, log=print) -> pd.DataFrame:
    """One row per pass, batch, rank placement (1 rank; each rank of 2) and table: seconds cold, in sequence,
    in sequence flushed, and predicted by ``timing`` (alone, no contention)."""
    from experiments.dlrm_gloo import cold_embedding_seconds, predicted_embedding_seconds
    from experiments.measure_env import llc_flush_buffer

    torch.set_num_threads(1)
    flush = llc_flush_buffer()
    placements = []  # (batch, ranks, rank, job, its tables, predicted (fwd, bwd)): the same in every pass
    for batch in batches:
        for ranks, rank in ((1, 0), (2, 0), (2, 1)):
            job, spec, mine = local_job(batch, ranks, rank, iters)
            placements.append((batch, ranks, rank, job, mine, predicted_embedding_seconds(timing, spec)))
    rows = []
    for p in range(passes):
        for batch, ranks, rank, job, mine, pred in placements:
            got = {"cold": cold_embedding_seconds(job), "sequence": sequence_seconds(job, iters),
                   "flushed": sequence_seconds(job, iters, flush)}
            for k, t in enumerate(mine):
                row = {"pass": p, "batch": batch, "ranks": ranks, "rank": rank, "table": int(t)}
                for kind, j in (("fwd", 0), ("bwd", 1)):
                    for how, v in got.items():
                        row[f"{kind}_{how}_s"] = float(v[j][k])
                    row[f"{kind}_predicted_s"] = float(pred[j][k])
                rows.append(row)
            log(f"pass {p} batch {batch} ranks {ranks} rank {rank}: bwd sum cold "
                f"{got['cold'][1].sum() * 1e3:.1f} ms, sequence {got['sequence'][1].sum() * 1e3:.1f} ms")
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per batch, placement and direction: each way's sum over the tables (ms; median over passes) and the
    sequence / cold and flushed / cold ratios (median over passes of each pass's ratio)."""
    out = []
    for (batch, ranks, rank), g in df.groupby(["batch", "ranks", "rank"]):
        sums = g.groupby("pass").sum(numeric_only=True)
        for kind in ("fwd", "bwd"):
            c = sums[f"{kind}_cold_s"]
            out.append({"batch": int(batch), "ranks": int(ranks), "rank": int(rank), "kind": kind,
                        "tables": int(g["table"].nunique()), "passes": len(sums),
                        "cold_ms": 1e3 * float(c.median()),
                        "sequence_ms": 1e3 * float(sums[f"{kind}_sequence_s"].median()),
                        "flushed_ms": 1e3 * float(sums[f"{kind}_flushed_s"].median()),
                        "predicted_ms": 1e3 * float(sums[f"{kind}_predicted_s"].iloc[0]),
                        "sequence_over_cold": float((sums[f"{kind}_sequence_s"] / c).median()),
                        "sequence_range": [float((sums[f"{kind}_sequence_s"] / c).min()),
                                           float((sums[f"{kind}_sequence_s"] / c).max())],
                        "flushed_over_cold": float((sums[f"{kind}_flushed_s"] / c).median())})
    return pd.DataFrame(out)


def markdown(summ: pd.DataFrame, meta: dict) -> str:
    lines = ["# Embedding tables in the step's order vs the calibration's cold protocol (CPU, one process)", "",
             f"{meta['date']}; {meta['host']} Prediction: `{meta['platform']}`. Reproduce: `{meta['command']}`", "",
             "The e2e DLRM's tables (1 rank: all of them; 2 ranks: each rank's share, timed here in one process "
             "without the other rank) at each batch, sums over the tables, ms (median over passes): `cold` as the "
             "calibration times each table (LLC evicted, another table's call before it), `sequence` in the "
             "step's order (all forwards, then the backwards + SGD in reverse, the step's two batches "
             "alternating, no dense part), `flushed` the same order with the LLC evicted before every call; "
             "ratios are each pass's sum over the cold sum (median over passes [range]); `predicted` the "
             "pack's sum for the tables alone (no host contention).", "",
             "| batch | placement | tables | kind | predicted | cold | flushed | sequence | flushed / cold | "
             "sequence / cold |", "|---:|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for s in summ.itertuples():
        where = "1 rank" if s.ranks == 1 else f"rank {s.rank} of {s.ranks}"
        lines.append(f"| {s.batch} | {where} | {s.tables} | {s.kind} | {s.predicted_ms:.1f} | {s.cold_ms:.1f} | "
                     f"{s.flushed_ms:.1f} | {s.sequence_ms:.1f} | {s.flushed_over_cold:.3f} | "
                     f"{s.sequence_over_cold:.3f} [{s.sequence_range[0]:.3f}-{s.sequence_range[1]:.3f}] |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", default="cpu-local", help="pack spec to predict with (as e2e_windows.py takes it)")
    ap.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--iters", type=int, default=8, help="timed iterations of each sequence")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "embedding_reuse_cpu"))
    a = ap.parse_args()
    if a.passes < 1 or a.iters < 1 or any(b < 2 for b in a.batches):
        fail("--passes and --iters must be at least 1 and every batch at least 2")
    import tempfile

    from experiments.e2e_windows import resolve_pack

    with tempfile.TemporaryDirectory(prefix="emb-reuse-") as work:
        plat, _ = resolve_pack(a.platform, Path(work))
    check = host_check(plat.pack.manifest if plat.pack is not None else None)
    df = measure(a.batches, a.passes, a.iters, plat.timing())
    summ = summary(df)
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "host": host_line(check),
            "platform": a.platform,
            "command": "flock /tmp/tuner-measure.lock python experiments/embedding_reuse_cpu.py " + " ".join(sys.argv[1:])}
    write_results(Path(a.out).with_suffix(""), {"meta": meta, "tables": df.to_dict(orient="records"),
                                                "summary": summ.to_dict(orient="records")}, markdown(summ, meta))


if __name__ == "__main__":
    main()
