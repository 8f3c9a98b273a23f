"""What the op before an embedding-bag kernel costs it: the calibration's protocol vs a training step's order.

Diagnosis for issue 4's DLRM rows (``experiments/results/dlrm_phases_cpu*.md``: the tables' backward
phase ran 10-25 % longer in a step than packs calibrated before session 18 predict). Those packs timed
every embedding-bag call after evicting the last-level cache and then running the same kernel on a
tiny table of the same width (a few KiB), on the reasoning that in a step the previous table's lookup
leaves the code path warm; since session 18 the call before is a typical other table's
(:func:`predictor.timing.calibration.embedding_bag.neighbour_warmers`). This script times one table's call
under several "previous op" states, each after the same cache eviction:

* ``tiny warm``: eviction, the same kernel on a 256-row table, the call (the protocol before session 18);
* ``cold code``: eviction, the call (no warming call);
* ``after big``: eviction, a large table's call of the same kind (tens of MB gathered), the call
  (a step's order: the previous table may be a heavy one);
* ``after big + warm``: as ``after big`` with the code-warming call in between;
* ``after neighbour``: eviction, a typical other table's call of the same kind (100k x 64, pooling 8,
  the same batch), the call (most of a step's order; the protocol since session 18);
* ``after mul``: eviction, an element-wise op on a small tensor, the call.

Each figure is the median of ``--repeats`` timings, milliseconds.

    flock /tmp/tuner-measure.lock python experiments/embedding_code_state_cpu.py

writes ``experiments/results/embedding_code_state_cpu.md`` and ``.json`` (about 30 s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.timing.calibration.embedding_bag import neighbour_warmers, neighbour_weight  # noqa: E402
from predictor.timing.calibration.timing import CacheFlusher  # noqa: E402

#: (label, rows, dim, batch, pooling): tables of the e2e DLRM task at batch 1024 (light ones with many
#: rows, a medium one) and the heavy table whose call precedes them in ``after big``
TABLES = [("light 589k x 32, L 1", 588_890, 32, 1024, 1.0), ("light 216k x 64, L 1.8", 215_535, 64, 1024, 1.8),
          ("medium 94k x 32, L 14", 93_825, 32, 1024, 14.1)]
BIG = ("heavy 290k x 64, L 80", 290_147, 64, 1024, 79.7)
#: the tiny table the protocol before session 18 warmed the code path on (rows, lookups, bags)
TINY = (256, 64, 16)


def _table(rows: int, dim: int, batch: int, pooling: float, seed: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """(forward, backward + SGD row update) of one table's call, as the calibration times them."""
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.Parameter(torch.rand(rows, dim, generator=g))
    n = max(1, int(round(batch * pooling)))
    idx = torch.randint(0, rows, (n,), generator=g)
    off = torch.linspace(0, n, batch + 1)[:-1].long()
    out = F.embedding_bag(idx, w, off, mode="sum", sparse=True)
    grad = torch.randn(out.shape, generator=g)

    def fwd() -> None:
        with torch.no_grad():
            F.embedding_bag(idx, w, off, mode="sum")

    def bwd() -> None:
        w.grad = None
        out.backward(grad, retain_graph=True)
        with torch.no_grad():
            w.add_(w.grad, alpha=-1e-3)
        w.grad = None

    return fwd, bwd


def measure(repeats: int, llc_bytes: float, log=print) -> list[dict]:
    torch.set_num_threads(1)
    flush = CacheFlusher(torch.device("cpu"), llc_bytes)
    big_fwd, big_bwd = _table(*BIG[1:], seed=99)
    neighbour = neighbour_weight(torch.device("cpu"))
    small = torch.randn(1024, 32)
    rows = []
    for label, r, d, b, pooling in TABLES:
        fwd, bwd = _table(r, d, b, pooling, seed=r)
        warm_fwd, warm_bwd = _table(TINY[0], d, TINY[2], TINY[1] / TINY[2], seed=7)
        nb_fwd, nb_bwd = neighbour_warmers(b, neighbour)
        for kind, call, warm, big, nb in (("fwd", fwd, warm_fwd, big_fwd, nb_fwd), ("bwd", bwd, warm_bwd, big_bwd, nb_bwd)):
            states: dict[str, list[Callable[[], None]]] = {
                "tiny warm": [warm], "cold code": [], "after big": [big], "after big + warm": [big, warm],
                "after neighbour": [nb], "after mul": [lambda: small.mul(2.0)],
            }
            call()
            times: dict[str, list[float]] = {s: [] for s in states}
            for _ in range(repeats):
                for s, before in states.items():  # interleaved: a slow spell falls on every state
                    flush()
                    for f in before:
                        f()
                    t0 = time.perf_counter()
                    call()
                    times[s].append(time.perf_counter() - t0)
            row = {"table": label, "kind": kind, **{s: float(np.median(v)) * 1e3 for s, v in times.items()}}
            rows.append(row)
            log(f"{label:<24} {kind}: " + "  ".join(f"{s} {row[s]:.3f}" for s in states))
    return rows


def markdown(rows: list[dict], command: str, repeats: int) -> str:
    states = [k for k in rows[0] if k not in ("table", "kind")]
    lines = ["# Embedding-bag calls: the calibration's protocol vs the op before them in a step", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, this 2-core VM, 1 torch thread, torch "
             f"{torch.__version__}. Reproduce: `{command}`", "",
             "Every timing follows the same eviction of the last-level cache; the states differ in what ran "
             "between the eviction and the timed call (module doc of `experiments/embedding_code_state_cpu.py`). "
             f"Median of {repeats} timings per cell, ms; the states are interleaved. `after neighbour` is what "
             "`tuner calibrate` records since session 18, `tiny warm` what it recorded before.", "",
             "| table | kernel | " + " | ".join(states) + " |", "|---|---|" + "---:|" * len(states)]
    for r in rows:
        lines.append(f"| {r['table']} | {r['kind']} | " + " | ".join(f"{r[s]:.3f}" for s in states) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--llc-bytes", type=float, default=32 * 2**20)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "embedding_code_state_cpu.md"))
    a = ap.parse_args()
    rows = measure(a.repeats, a.llc_bytes)
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    out.write_text(markdown(rows, "flock /tmp/tuner-measure.lock python experiments/embedding_code_state_cpu.py",
                            a.repeats))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
