"""The e2e DLRM's embedding tables one by one: each pack's prediction against the table timed alone.

The DLRM rows of ``experiments/e2e_cpu.py`` look up the 29 tables of one sharding task. For each of
its batch sizes this times every table's embedding-bag forward and backward (+ SGD row update) on
its real index batch, cache evicted before each call and another table's call run before it
(:func:`experiments.dlrm_gloo.cold_embedding_seconds`, the way calibration times them), counts the
page faults of each backward, and sets each pack's per-table prediction beside it
(:func:`experiments.dlrm_gloo.predicted_embedding_seconds`: one rank, no host contention). Where a
DLRM step is mispredicted although its tables, timed this way, put the step right
(``cold_embedding_s`` in ``e2e_cpu.json``), the per-table errors say which tables and which
direction the embedding models miss.

Reported per batch and pack: the sum over tables measured and predicted (forward, backward), the
GMAE over tables, and the tables with the largest backward error.

Run:  flock /tmp/tuner-measure.lock python experiments/embedding_tables_cpu.py \\
          [--compare PACK|refit:DIR|faults32:SPEC ...] [--batches 256 1024 4096]
      (pack specs as ``experiments/e2e_windows.py`` takes them; default: cpu-local;
      writes benchmarks/results/embedding_tables_cpu.{md,json}; about a minute of timing per batch)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.common import fail  # noqa: E402
from experiments.dlrm_gloo import cold_embedding_seconds, predicted_embedding_seconds  # noqa: E402
from experiments.e2e_cpu import DLRM_BATCHES, RESULTS, dlrm_job, dlrm_spec_for, dlrm_tables  # noqa: E402
from experiments.e2e_windows import resolve_spec  # noqa: E402
from predictor.metrics import geomean_abs_pct_error  # noqa: E402


def measure_tables(batch: int, threads: int) -> dict:
    """Every table's cold forward / backward seconds at ``batch`` and the page faults of the timing."""
    tables = dlrm_tables(batch)
    job = dlrm_job(tables, batch, 1, threads, warmup=1, iters=1)
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fwd, bwd = cold_embedding_seconds(job)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0
    spec = dlrm_spec_for(job, tables)
    grad = batch * np.asarray(spec.tables.pooling) * np.asarray(spec.tables.dim) * 4.0
    return {"job": job, "spec": spec, "fwd": fwd, "bwd": bwd, "grad_bytes": grad, "faults_total": int(faults)}


def compare(measured: dict, timing) -> dict:
    """Per-table predictions of ``timing`` against ``measured``; errors in %."""
    pf, pb = predicted_embedding_seconds(timing, measured["spec"])
    mf, mb = measured["fwd"], measured["bwd"]
    err_b = (pb / mb - 1.0) * 100.0
    worst = np.argsort(-np.abs(err_b))[:5]
    return {
        "fwd_sum_pred_s": float(pf.sum()), "bwd_sum_pred_s": float(pb.sum()),
        "fwd_sum_err_pct": float((pf.sum() / mf.sum() - 1.0) * 100.0),
        "bwd_sum_err_pct": float((pb.sum() / mb.sum() - 1.0) * 100.0),
        "fwd_gmae_pct": geomean_abs_pct_error(pf, mf), "bwd_gmae_pct": geomean_abs_pct_error(pb, mb),
        "fwd_pred_s": pf.tolist(), "bwd_pred_s": pb.tolist(),
        "worst_bwd": [{"table": int(t), "measured_ms": float(mb[t] * 1e3), "predicted_ms": float(pb[t] * 1e3),
                       "err_pct": float(err_b[t])} for t in worst],
    }


def markdown(results: dict, packs: list[str], meta: dict) -> str:
    lines = [
        "# The e2e DLRM's embedding tables one by one (CPU)",
        "",
        f"{meta['measured_at']}, {meta['threads']} thread(s). Each table's forward and backward (+ SGD row update) "
        "on its real index batch, cache evicted before each call, another table's call before it (the calibration's "
        "protocol since session 18; code path re-warmed on a small table before) (median of 5 calls), "
        "against each pack's prediction for the table alone. Reproduce: `flock /tmp/tuner-measure.lock python "
        f"experiments/embedding_tables_cpu.py --platform {packs[0]} --compare {' '.join(packs[1:])}`.",
        "",
        "| batch | pack | fwd sum measured / predicted ms (err) | bwd sum measured / predicted ms (err) | "
        "GMAE over tables fwd / bwd % | worst backward tables (measured -> predicted ms) |",
        "|---:|---|---|---|---|---|",
    ]
    for b, r in results.items():
        for p in packs:
            c = r["packs"][p]
            worst = "; ".join(f"t{w['table']} {w['measured_ms']:.2f} -> {w['predicted_ms']:.2f}" for w in c["worst_bwd"][:3])
            lines.append(f"| {b} | {p} | {r['fwd_sum_s'] * 1e3:.2f} / {c['fwd_sum_pred_s'] * 1e3:.2f} "
                         f"({c['fwd_sum_err_pct']:+.1f} %) | {r['bwd_sum_s'] * 1e3:.2f} / {c['bwd_sum_pred_s'] * 1e3:.2f} "
                         f"({c['bwd_sum_err_pct']:+.1f} %) | {c['fwd_gmae_pct']:.1f} / {c['bwd_gmae_pct']:.1f} | {worst} |")
    lines += ["", "Page faults while timing each batch's tables (all calls, warm-ups included): "
              + ", ".join(f"b{b} {r['faults_total']}" for b, r in results.items())
              + "; tables whose gradient reaches 32 MiB: "
              + ", ".join(f"b{b} {r['tables_ge_32mib']}" for b, r in results.items()) + ".", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", default="cpu-local", help="the first pack (spec as e2e_windows.py takes it)")
    ap.add_argument("--compare", nargs="*", default=[], help="more pack specs")
    ap.add_argument("--batches", type=int, nargs="+", default=list(DLRM_BATCHES[1]))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS / "embedding_tables_cpu")
    args = ap.parse_args(argv)
    if any(b < 1 for b in args.batches) or args.threads < 1:
        fail("--batches and --threads must be >= 1")
    packs = [args.platform, *args.compare]
    with tempfile.TemporaryDirectory() as tmp:
        timings = {p: resolve_spec(p, Path(tmp) / str(i)) for i, p in enumerate(packs)}
        results: dict[int, dict] = {}
        for b in args.batches:
            m = measure_tables(b, args.threads)
            print(f"batch {b}: fwd {m['fwd'].sum() * 1e3:.2f} ms, bwd {m['bwd'].sum() * 1e3:.2f} ms over "
                  f"{len(m['fwd'])} tables, {m['faults_total']} faults", flush=True)
            results[b] = {"fwd_sum_s": float(m["fwd"].sum()), "bwd_sum_s": float(m["bwd"].sum()),
                          "fwd_s": m["fwd"].tolist(), "bwd_s": m["bwd"].tolist(),
                          "grad_bytes": m["grad_bytes"].tolist(), "faults_total": m["faults_total"],
                          "tables_ge_32mib": int((m["grad_bytes"] >= 32 * 2**20).sum()),
                          "packs": {p: compare(m, t) for p, (t, _s) in timings.items()}}
    meta = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "threads": args.threads,
            "sources": {p: s for p, (_t, s) in timings.items()}}
    from predictor.files import atomic_write_text

    text = markdown(results, packs, meta)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps({"meta": meta, "batches": results}, indent=1))
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
