"""Would re-timing a pack's own shapes before predicting fix the machine's drift? (Offline, CPU.)

Every e2e window (``experiments/e2e_cpu.py``) re-times the committed pack's own GEMM and memcpy
microbenchmark shapes just before and just after its passes and records the ratio to their
calibrated times (``gemm_drift`` in ``benchmarks/results/e2e_cpu_windows.json``): the machine's
state relative to the pack. This script asks whether a predictor that scaled its kernel times by
those ratios (a drift probe of a few seconds before each prediction) would have predicted the
windows better. For every archived window measured against one pack (``--pack-created``, default
the pack committed on 2026-11-23 07:51, ``git:e459faf``) it predicts the 12 configurations three
ways — as the pack says; compute kernels (GEMM, conv) scaled by the GEMM ratio (geometric mean of
before and after); and also the memory-bound kernels (element-wise, data movement, norms,
embeddings) scaled by the memcpy ratio — and scores each against the window.

Nothing here feeds a prediction. Writes ``benchmarks/results/drift_correction_cpu.{md,json}``.

    python experiments/drift_correction_cpu.py [--pack git:e459faf] [--pack-created 2026-11-23T07:51]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import date
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.common import fail  # noqa: E402
from experiments.e2e_cpu import RESULTS, WINDOWS_FILE  # noqa: E402
from experiments.e2e_windows import load_windows, predict_rows, resolve_spec  # noqa: E402
from predictor.graph import Category  # noqa: E402
from predictor.metrics import geomean_abs_pct_error, max_abs_pct_error  # noqa: E402


class DriftScaled:
    """``base`` timing with compute kernels x ``compute`` and memory-bound kernels x ``memory`` (the
    graph's task categories, as :class:`~predictor.timing.kernels.timing.ModelTiming` classes them for host
    contention; embeddings count as memory-bound)."""

    def __init__(self, base, compute: float, memory: float) -> None:
        self.base, self.compute, self.memory = base, float(compute), float(memory)
        self.source = f"{base.source} x drift (compute {compute:.3f}, memory {memory:.3f})"

    def __getattr__(self, name: str):
        return getattr(self.base, name)

    def durations(self, graph) -> np.ndarray:
        d = np.array(self.base.durations(graph), dtype=float)
        d[graph.category == Category.COMPUTE] *= self.compute
        d[graph.category == Category.MEMORY] *= self.memory
        return d


def drift_ratios(window: dict) -> tuple[float, float] | None:
    """(GEMM ratio, memcpy ratio) of a window: geometric mean of its before / after probes (memcpy 1.0
    where the window did not probe memory); None where it has no GEMM probe."""
    d = window.get("gemm_drift") or {}
    try:
        g = float(np.sqrt(d["before"]["ratio_geomean"] * d["after"]["ratio_geomean"]))
    except (KeyError, TypeError):
        return None
    try:
        m = float(np.sqrt(d["memory_before"]["ratio_geomean"] * d["memory_after"]["ratio_geomean"]))
    except (KeyError, TypeError):
        m = 1.0
    return g, m


def score(pred: dict, window: dict) -> tuple[float, float]:
    keys = [(r["model"], int(r["batch"])) for r in window["rows"]]
    p = [pred[k] for k in keys]
    m = [float(r["measured_s"]) for r in window["rows"]]
    return geomean_abs_pct_error(p, m), max_abs_pct_error(p, m)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", default="git:e459faf", help="the pack the windows were measured against (spec as "
                    "e2e_windows.py takes it)")
    ap.add_argument("--pack-created", default="2026-11-23T07:51", help="keep windows whose pack_created starts so")
    ap.add_argument("--archive", type=Path, default=RESULTS / WINDOWS_FILE)
    ap.add_argument("--out", type=Path, default=RESULTS / "drift_correction_cpu")
    args = ap.parse_args(argv)
    windows = [w for w in load_windows(args.archive)
               if str(w.get("pack_created") or "").startswith(args.pack_created) and drift_ratios(w)]
    if not windows:
        fail(f"{args.archive}: no window with drift probes measured against a pack created {args.pack_created}")

    with tempfile.TemporaryDirectory() as tmp:
        base, _source = resolve_spec(args.pack, Path(tmp))
        plain = predict_rows(base)
        rows = []
        for w in windows:
            g, m = drift_ratios(w)
            variants = {"as calibrated": plain, "compute scaled": predict_rows(DriftScaled(base, g, 1.0)),
                        "compute + memory scaled": predict_rows(DriftScaled(base, g, m))}
            rows.append({"measured_at": w["measured_at"], "allocator": w.get("allocator", "default"),
                         "gemm_ratio": g, "memory_ratio": m,
                         **{k: dict(zip(("geomean_abs_pct", "max_abs_pct"), score(p, w), strict=True))
                            for k, p in variants.items()}})
    names = ("as calibrated", "compute scaled", "compute + memory scaled")
    lines = ["# Drift correction of a CPU pack, offline", "",
             f"{date.today().isoformat()}; pack `{args.pack}`, the {len(rows)} archived e2e windows measured against it "
             "with drift probes. Reproduce: `python experiments/drift_correction_cpu.py`.", "",
             "Error % (geomean / max) of the 12 configurations per window; ratios > 1: the machine ran slower than "
             "at calibration.", "",
             "| window | allocator | GEMM ratio | memcpy ratio | " + " | ".join(names) + " |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['measured_at'][:16]} | {r['allocator']} | {r['gemm_ratio']:.3f} | {r['memory_ratio']:.3f} | "
                     + " | ".join(f"{r[n]['geomean_abs_pct']:.1f} / {r[n]['max_abs_pct']:.1f}" for n in names) + " |")
    med = {n: (float(np.median([r[n]["geomean_abs_pct"] for r in rows])),
               float(np.median([r[n]["max_abs_pct"] for r in rows]))) for n in names}
    lines += ["", "Median over the windows (geomean / max %): "
              + "; ".join(f"{n} {g:.1f} / {x:.1f}" for n, (g, x) in med.items()) + ".", ""]
    from predictor.files import atomic_write_text

    atomic_write_text(args.out.with_suffix(".json"), json.dumps({"pack": args.pack, "windows": rows}, indent=1))
    atomic_write_text(args.out.with_suffix(".md"), "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
