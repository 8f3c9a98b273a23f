"""How stable are the host overheads T1..T5 that ``tuner calibrate`` measures? (issue 4, part 2/5)

On the H100 machines of 2026-11-23 the profiled T's of three machine instances were T2 = 24, 34 and
54 us while the same training loops ran at about the same speed on them; a pack carries the T's of
its calibration instance, so this spread lands in every host-bound prediction. This script times
the measurement itself: ``--rounds`` rounds, each measuring T1..T5 with every setting in
``SETTINGS`` (interleaved), in one process; run it in two fresh processes to see the
process-to-process part too.

Settings: ``as_calibrated`` = what the packs so far used (3 warm-up steps, 12 profiled steps, the
profiler's start-up steps recorded); ``steady`` = 20 warm-up steps and 3 discarded profiler steps
before 24 recorded ones.

Run (GPU machine):  python experiments/overheads_spread.py --device cuda --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predictor.files import atomic_write_text  # noqa: E402
from predictor.timing.calibration.overheads import measure_overheads  # noqa: E402

#: name -> keyword arguments of measure_overheads
SETTINGS: dict[str, dict] = {
    "as_calibrated": {"iterations": 12, "warmup": 3, "profiler_warmup": 0},
    "steady": {"iterations": 24, "warmup": 20, "profiler_warmup": 3},
}
KEYS = ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s", "iteration_s_unprofiled", "iteration_s_profiled",
        "profiler_overhead_s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    rows = []
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for name, kw in SETTINGS.items():
            o = measure_overheads(dev, **kw)
            rows.append({"round": r, "setting": name, **{k: o[k] for k in KEYS}})
            print(f"round {r} {name:<14} " + " ".join(f"{k[:-2]} {o[k] * 1e6:7.2f}" for k in KEYS[:5])
                  + f"  step {o['iteration_s_unprofiled'] * 1e3:.3f} ms", flush=True)
    doc = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "settings": SETTINGS, "seconds": round(time.perf_counter() - t0, 1), "rows": rows}
    atomic_write_text(args.out, json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
