"""Lockstep loss against the length of the work between two collectives, on this CPU host.

Diagnosis for the 2-rank DLRM rows of issue 4. Calibration (:mod:`predictor.timing.calibration.lockstep`) measures
how much slower K ranks run when they wait for each other after every segment of work, with one segment
length (10 ms), and the timing model multiplies every kernel of a K-rank CPU graph by that factor. A DLRM
step's segments (work between two blocking collectives) are 5-10 ms at batch 256 and 30-110 ms at 4096. If
the loss comes from rare events (a rank pre-empted, a thread woken late) the factor is flat for short
segments, where at most one such event falls in a segment, and falls for long ones, where both ranks
collect about as many. This script runs the calibration's own probe at several segment lengths, the
lengths interleaved over several repeats so the host's drift falls on all of them alike.

    flock /tmp/tuner-measure.lock python experiments/lockstep_segments_cpu.py

writes ``experiments/results/lockstep_segments_cpu.md`` and ``.json`` (about 3 minutes).

Finding (session 33, Zen 4 VM): the factor is flat at x1.05-1.07 from 2.5 to 20 ms and falls to x1.01-1.03 at
40-160 ms. A timing model that priced each segment of a DLRM step by this curve (the rank's work between two
of its collectives, interpolated in log length) was built and judged on the archived end-to-end windows: it
predicted the 2-rank / 1-rank ratio no better than one factor for every segment (on the six windows of
01:16-07:26 with the same probe: -3.4 / -3.2 / -5.8 % at batches 256 / 1024 / 4096 against -3.1 / -3.2 /
-3.1 %; on the window of 08:31, bracketed by two probes: -6.2 / -1.8 / -1.2 % against -5.9 / -1.8 / +1.7 %),
so it was not adopted. The 2-rank step at batch 4096 (segments of 30-110 ms) loses as much, relative to
the prediction, as at 256 (5-10 ms): the uniform factor stands for more than waiting on rare events.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import write_results  # noqa: E402
from predictor.timing.calibration.lockstep import per_round_factors, probe_lockstep  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments-ms", type=float, nargs="+", default=[2.5, 5, 10, 20, 40, 80, 160])
    ap.add_argument("--repeats", type=int, default=3, help="passes over all segment lengths, interleaved")
    ap.add_argument("--rounds", type=int, default=5, help="probe rounds per length and pass (calibration quick: 5)")
    ap.add_argument("--work-s", type=float, default=0.4, help="seconds of segments per protocol, block and round")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "lockstep_segments_cpu.md")
    args = ap.parse_args(argv)

    started = datetime.now(timezone.utc)
    rows: list[dict] = []
    for rep in range(args.repeats):
        order = args.segments_ms if rep % 2 == 0 else args.segments_ms[::-1]
        for seg_ms in order:
            seg = seg_ms / 1e3
            t0 = time.perf_counter()
            probe = probe_lockstep(args.world, 1, rounds=args.rounds, segment_s=seg,
                                   segments=max(5, int(round(args.work_s / seg))))
            f = per_round_factors(probe)
            free = float(np.median([np.max(x) for x in zip(*(p["free_s"] for p in probe), strict=True)]))
            rows.append({"repeat": rep, "segment_ms": seg_ms, "free_ms": free * 1e3,
                         "factor": float(np.median(f)), "per_round": [float(x) for x in f],
                         "probe": probe, "seconds": time.perf_counter() - t0})
            print(f"pass {rep}: segment {seg_ms:6.1f} ms (free {free * 1e3:6.2f} ms): lockstep x{np.median(f):.3f} "
                  f"(rounds {' '.join(f'{x:.3f}' for x in f)})", flush=True)

    table = ["| segment ms | free segment ms (median) | factor per pass | median factor | loss per segment ms |",
             "|---:|---:|---|---:|---:|"]
    summary = []
    for seg_ms in args.segments_ms:
        rs = [r for r in rows if r["segment_ms"] == seg_ms]
        facs = [r["factor"] for r in rs]
        free = float(np.median([r["free_ms"] for r in rs]))
        med = float(np.median(facs))
        summary.append({"segment_ms": seg_ms, "free_ms": free, "factor": med, "factors": facs})
        table.append(f"| {seg_ms:g} | {free:.2f} | {' / '.join(f'{x:.3f}' for x in facs)} | {med:.3f} | "
                     f"{(med - 1) * free:.2f} |")
    md = "\n".join([
        "# Lockstep loss against segment length (this CPU host)",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, {args.world} gloo ranks x 1 torch thread, unpinned. Per segment length: the "
        f"calibration's lockstep probe (`predictor/timing/calibration/lockstep.py`: GEMM segments timed free, all at once, "
        f"and in lockstep, each followed by a one-float all-reduce; {args.rounds} rounds, about {args.work_s:g} s of "
        f"segments per protocol and round), {args.repeats} passes over the lengths, alternately ascending and "
        f"descending. Factor = (slowest rank's lockstep period - all-reduce alone) / slowest rank's free segment, "
        f"median over rounds (what `tuner calibrate` stores as `host_contention[K].sync`, at 10 ms).",
        "",
        f"Reproduce: `flock /tmp/tuner-measure.lock python experiments/lockstep_segments_cpu.py "
        f"--segments-ms {' '.join(f'{x:g}' for x in args.segments_ms)} --repeats {args.repeats}`",
        "",
        *table,
        "",
        "`loss per segment ms` = (median factor - 1) x free segment: the time a segment loses to waiting for the "
        "slower rank.",
    ])
    write_results(args.out, {"started": started.isoformat(), "args": {k: (str(v) if isinstance(v, Path) else v)
                                                                      for k, v in vars(args).items()},
                             "summary": summary, "rows": rows}, md)
    print(md)


if __name__ == "__main__":
    main()
