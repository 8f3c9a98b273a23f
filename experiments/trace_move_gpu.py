"""A GPU trace moved to the other GPU: the captured step predicted on another GPU's asset pack vs that GPU's runs.

``tuner predict TRACE --set captured_on=SRC --set batch_size=B --platform DST`` re-times every kernel of a trace
captured on one GPU with DST's kernel models (and its host overheads), at every batch measured on DST. Ground
truth: the single-GPU e2e rows measured on DST (``experiments/e2e_gpu.py --measure``, stored in
``benchmarks/data/gpu_runs.json``), which the traces and packs never saw. Directions (:data:`DIRECTIONS`): the
traces of two H200 machine instances (``benchmarks/traces/h200``, ``h200-2``) to the H100 pack against two H100
runs of the pack's machine instance, the H100 traces to the H200 pack against an H200 run of each of its two
instances.

Run:  python experiments/trace_move_gpu.py   (writes experiments/results/trace_move_gpu.{md,json}; ~1 minute)
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.common import fail, write_results  # noqa: E402
from experiments.e2e_gpu import DATA, TRACES, stored_run, trace_for  # noqa: E402

#: (traces folder, pack it was captured beside, target pack, stored runs of the target GPU)
DIRECTIONS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("h200-2", "h200-cal", "h100", ("h100-1a", "h100-1b")),
    ("h200", "h200-cal", "h100", ("h100-1a", "h100-1b")),
    ("h100", "h100", "h200-cal", ("h200-1a", "h200-2a")),
)


def run(data: Path = DATA) -> dict:
    """Every direction's rows predicted from the moved traces; the summary per direction and over all."""
    from predictor.metrics import geomean_abs_pct_error, max_abs_pct_error
    from predictor.whatif.apply import parse_sets, predict_trace

    rows = []
    for tdir, src, dst, files in DIRECTIONS:
        for f in files:
            try:
                measured = stored_run(f, data)
            except ValueError as exc:
                fail(str(exc))
            for r in measured["rows"]:
                trace = trace_for(r["model"], TRACES / tdir)
                if trace is None:
                    continue
                res = predict_trace(trace, parse_sets([f"batch_size={int(r['batch'])}", f"captured_on={src}"]), dst)
                rows.append({"traces": tdir, "captured_on": src, "platform": dst, "run": f, "model": r["model"],
                             "batch": int(r["batch"]), "trace": trace.name, "measured_s": r["measured_s"],
                             "predicted_s": float(res.predicted_iteration_s),
                             "error_pct": 100.0 * (res.predicted_iteration_s - r["measured_s"]) / r["measured_s"]})
    groups = [(f"{tdir} ({src}) -> {dst}", [r for r in rows if r["traces"] == tdir and r["platform"] == dst])
              for tdir, src, dst, _ in DIRECTIONS] + [("all", rows)]
    summary = []
    for name, rs in groups:
        pred, meas = [r["predicted_s"] for r in rs], [r["measured_s"] for r in rs]
        summary.append({"direction": name, "rows": len(rs), "geomean_pct": geomean_abs_pct_error(pred, meas),
                        "max_pct": max_abs_pct_error(pred, meas),
                        "median_signed_pct": float(np.median([r["error_pct"] for r in rs]))})
    return {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "summary": summary, "rows": rows}


def markdown(out: dict) -> str:
    lines = ["# A GPU trace moved to the other GPU: predicted vs measured there", "",
             f"{out['date']}; offline. Reproduce: `python experiments/trace_move_gpu.py`. See the module docstring.",
             "", "| direction | rows | geomean abs error % | max abs error % | median signed % |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {s['direction']} | {s['rows']} | {s['geomean_pct']:.2f} | {s['max_pct']:.1f} | "
              f"{s['median_signed_pct']:+.1f} |" for s in out["summary"]]
    lines += ["", "| traces -> platform | measured run | model | batch | measured ms | predicted ms | error % |",
              "|---|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['traces']} -> {r['platform']} | {r['run']} | {r['model']} | {r['batch']} | "
              f"{r['measured_s'] * 1e3:.3f} | {r['predicted_s'] * 1e3:.3f} | {r['error_pct']:+.1f} |"
              for r in out["rows"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "trace_move_gpu")
    a = ap.parse_args(argv)
    out = run()
    write_results(a.out, out, markdown(out))


if __name__ == "__main__":
    main()
