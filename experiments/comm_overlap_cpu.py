"""What an asynchronous gloo collective costs when the ranks' main threads compute beside it (CPU, 2 ranks).

Diagnosis for issue 4's 2-rank DLRM rows. On a host whose cores are all taken by the ranks' main threads
(2 ranks on this 2-vCPU VM) the simulation runs every collective inline on the main thread
(``comm_threads=False``): compute and communication add up. In the real step DDP issues its bucket
all-reduces asynchronously on gloo's worker threads while the backward goes on, and the all-to-all of
gradients queues behind them (``experiments/results/dlrm_phases_cpu_s19.md``). This probe measures that
pattern in isolation, on 2 ranks, every piece alone and together, interleaved round by round:

* ``compute``: ``work_ms`` of 256x256 GEMMs (a fixed call count, measured once);
* ``comm``: one blocking collective of the size (all-reduce or all-to-all);
* ``ddp``: the step's pattern: all-reduce A issued async, GEMMs, all-reduce B issued async, a blocking
  all-to-all, then both all-reduces waited for;
* the inline sum the simulation predicts for ``ddp``: compute + the three collectives alone.

Every time runs from the last rank's start to the last rank's end (one host clock). ``extra`` = ddp -
inline sum: what the overlap costs beyond the inline model (negative: it saves).

    flock /tmp/tuner-measure.lock python experiments/comm_overlap_cpu.py

writes ``experiments/results/comm_overlap_cpu.md`` and ``.json`` (about 1 minute).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import run_gloo_ranks, span_after_last_arrival, write_results  # noqa: E402

#: the e2e DLRM rows' batches
BATCHES = (256, 1024, 4096)


def step_sizes(batch: int) -> tuple[int, int, int]:
    """(all-reduce A, all-reduce B, all-to-all) bytes per rank of the e2e DLRM step on 2 ranks at ``batch``:
    DDP's two buckets and the all-to-all's max-of-max message (:func:`~experiments.collective_protocol_cpu.step_collectives`)."""
    from experiments.collective_protocol_cpu import step_collectives

    c = step_collectives(batch)
    return int(c["ddp.all_reduce[0]"][1]), int(c["ddp.all_reduce[1]"][1]), int(c["all_to_all_fwd"][1])


def _probe(dist, rank: int, cfg: dict) -> list[dict]:
    """One rank's side of the probe (:func:`experiments.common.run_gloo_ranks`); rank 0's rows are kept."""
    a, b = torch.rand(256, 256), torch.rand(256, 256)
    t0 = time.perf_counter()
    for _ in range(50):
        torch.mm(a, b)
    per_call = (time.perf_counter() - t0) / 50
    calls = torch.tensor([max(1, round(cfg["work_ms"] / 1e3 / per_call))], dtype=torch.int64)
    dist.all_reduce(calls, op=dist.ReduceOp.MAX)  # the same work on every rank
    n_calls = int(calls.item())

    def compute(n: int = n_calls) -> None:
        for _ in range(n):
            torch.mm(a, b)

    rows = []
    for batch, sizes in cfg["sizes"].items():
        pieces = _pieces(dist, sizes, compute, max(1, n_calls // 10))
        for fn in pieces.values():
            fn()
        for rnd in range(cfg["rounds"]):
            for name, fn in pieces.items():
                dist.barrier()
                s = time.perf_counter()
                fn()
                e = time.perf_counter()
                rows.append({"batch": int(batch), "round": rnd, "piece": name,
                             "seconds": span_after_last_arrival(dist, s, e)})
    return rows


def _pieces(dist, sizes: tuple[int, int, int], compute, tail_calls: int) -> dict:
    """The probe's callables for one batch's (all-reduce A, all-reduce B, all-to-all) bytes."""
    s_a, s_b, s_x = sizes
    ar_a, ar_b = torch.ones(s_a // 4), torch.ones(s_b // 4)
    x_in, x_out = torch.ones(s_x // 4), torch.empty(s_x // 4)

    def ddp() -> None:
        wa = dist.all_reduce(ar_a, async_op=True)
        compute()
        wb = dist.all_reduce(ar_b, async_op=True)
        compute(tail_calls)
        dist.all_to_all_single(x_out, x_in)
        wa.wait()
        wb.wait()

    return {"compute": compute, "compute_tail": lambda: compute(tail_calls),
            "all_reduce_a": lambda: dist.all_reduce(ar_a), "all_reduce_b": lambda: dist.all_reduce(ar_b),
            "all_to_all": lambda: dist.all_to_all_single(x_out, x_in), "ddp": ddp}


def run(rounds: int, work_ms: float, batches: list[int]) -> pd.DataFrame:
    """One row per (batch, round, piece): seconds."""
    cfg = {"sizes": {b: step_sizes(b) for b in batches}, "rounds": rounds, "work_ms": work_ms}
    return pd.DataFrame(run_gloo_ranks(_probe, cfg))


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per batch: each piece's median (ms), the inline sum and the overlap's extra over it."""
    med = df.groupby(["batch", "piece"])["seconds"].median().unstack("piece") * 1e3
    med["comm_sum"] = med["all_reduce_a"] + med["all_reduce_b"] + med["all_to_all"]
    med["inline"] = med["compute"] + med["compute_tail"] + med["comm_sum"]
    med["extra"] = med["ddp"] - med["inline"]
    med["comm_factor"] = (med["ddp"] - med["compute"] - med["compute_tail"]) / med["comm_sum"]
    return med


def markdown(med: pd.DataFrame, command: str, work_ms: float, rounds: int) -> str:
    lines = ["# An asynchronous gloo all-reduce beside compute (CPU, 2 ranks)", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, this 2-core VM (2 ranks: no spare core). "
             f"Reproduce: `{command}`", "",
             f"Pieces timed alone and in the step's pattern, interleaved, {rounds} rounds, median, ms: compute = "
             f"{work_ms:g} ms of 256x256 GEMMs per rank; AR A / AR B = DDP's two bucket all-reduces of the e2e DLRM; "
             "A2A = its all-to-all at that batch; `ddp` = AR A async, compute, AR B async, a tenth of the compute, "
             "blocking A2A, wait for both all-reduces; `inline` = what the simulation adds up for it (compute, its "
             "tenth and the three collectives alone); `extra` = ddp - inline; comm factor = (ddp - compute) / the "
             "collectives alone: how much longer the communication takes beside compute than alone.", "",
             "| batch | compute | AR A | AR B | A2A | inline | ddp | extra | comm factor |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for batch, x in med.iterrows():
        lines.append(f"| {batch} | {x['compute']:.2f} | {x['all_reduce_a']:.2f} | {x['all_reduce_b']:.2f} | "
                     f"{x['all_to_all']:.2f} | {x['inline']:.2f} | {x['ddp']:.2f} | {x['extra']:+.2f} | "
                     f"{x['comm_factor']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--work-ms", type=float, default=10.0, help="GEMM work per rank between the all-reduces, ms")
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), choices=BATCHES)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "comm_overlap_cpu.md"))
    a = ap.parse_args()
    if a.rounds < 1 or a.work_ms <= 0:
        ap.error("--rounds must be >= 1 and --work-ms > 0")
    df = run(a.rounds, a.work_ms, a.batches)
    med = summary(df)
    cmd = " ".join(["flock /tmp/tuner-measure.lock python experiments/comm_overlap_cpu.py", *sys.argv[1:]])
    text = markdown(med, cmd, a.work_ms, a.rounds)
    write_results(Path(a.out), {"rows": df.to_dict(orient="records"),
                                "summary": med.reset_index().to_dict(orient="records")}, text)
    print(text)


if __name__ == "__main__":
    main()
