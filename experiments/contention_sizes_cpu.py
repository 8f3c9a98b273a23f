"""Host contention of two processes by working-set size (CPU): the calibration's probe at several buffer sizes.

``tuner calibrate --world-size K`` on a CPU measures one slow-down factor per kernel class
(:func:`predictor.timing.calibration.contention.measure_host_contention`: embedding, memory, compute), with probe
buffers sized from the last-level cache (the streaming ``memory`` probe: twice the LLC). This runs the same
probe with the LLC taken as several sizes, so the ``memory`` and ``embedding`` probes work on smaller and
larger sets, and says whether the factor depends on the working set and how much it moves from one
run to the next.

    flock /tmp/tuner-measure.lock python experiments/contention_sizes_cpu.py

writes ``experiments/results/contention_sizes_cpu.md`` and ``.json`` (about 4 minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.timing.calibration.contention import CLASSES, measure_host_contention  # noqa: E402


def run(llc_mib: list[float], world: int, rounds: int, log=print) -> list[dict]:
    """One row per assumed LLC size: the memory probe's buffer (MiB) and each class's factor."""
    rows = []
    for mib in llc_mib:
        f = measure_host_contention(world, 1, mib * 2**20, rounds=rounds)
        rows.append({"llc_mib": mib, "memory_buffer_mib": 2 * mib, **f,
                     "at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        log(f"LLC taken as {mib:g} MiB: " + ", ".join(f"{c} x{f[c]:.2f}" for c in CLASSES))
    return rows


def markdown(rows: list[dict], command: str, world: int) -> str:
    lines = [f"# Host contention of {world} processes by working-set size (CPU)", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, this 2-core VM. Reproduce: `{command}`", "",
             "The calibration's contention probe (`predictor/timing/calibration/contention.py`: the slowest of the "
             "processes running a kernel at once over their mean alone, median over rounds) with the last-level "
             "cache taken as each size below: the `memory` probe streams twice that, the `embedding` probe's table "
             "is eight times that (at least 64k rows), the `compute` probe is a cache-resident GEMM either way. "
             "The calibration uses the real LLC (32 MiB here).", "",
             "| LLC taken as MiB | memory buffer MiB | " + " | ".join(CLASSES) + " | measured at |",
             "|---:|---:|" + "---:|" * len(CLASSES) + "---|"]
    for r in rows:
        lines.append(f"| {r['llc_mib']:g} | {r['memory_buffer_mib']:g} | "
                     + " | ".join(f"{r[c]:.2f}" for c in CLASSES) + f" | {r['at']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llc-mib", type=float, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "contention_sizes_cpu.md"))
    a = ap.parse_args()
    if min(a.llc_mib) <= 0 or a.rounds < 1 or a.world < 2:
        ap.error("--llc-mib must be > 0, --rounds >= 1 and --world >= 2")
    rows = run(a.llc_mib, a.world, a.rounds)
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    out.write_text(markdown(rows, "flock /tmp/tuner-measure.lock python experiments/contention_sizes_cpu.py", a.world))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
