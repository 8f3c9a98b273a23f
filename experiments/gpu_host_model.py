"""The single-GPU host model, judged on every measured e2e file (offline; measured files, traces and packs in the repo).

A device-mode step's host time is priced per op from T1..T5 (Lin et al. 2022), which a CUDA calibration
takes from a profiled step. Session 31 found the two halves of the error (the committed session-31 table is
in git history): the profiled T's over-charge host-bound steps, and scaling them by the calibration step's
unprofiled / profiled ratio under-charged the MLP / DLRM steps, whose graphs lacked host work. Since session
32 the synthesisers emit that work in device mode (:mod:`predictor.sources.synth.emit`: kernel-less autograd
nodes and views at T1 + T3, foreach optimizers as one op, per-table sparse update ops) and a CUDA pack's
platform carries the host model of :mod:`predictor.timing.calibration.step_graph`: the T's x the ratio and
``step_s``, the step's framework cost, closed on the calibration's own step. Predictions are the pace of an
unsynchronised loop (``Timeline.loop_pace_s``), as the measured loop runs.

Per measured file, geomean / max abs error of three pricings of the same graphs:

* **profiled T's**: the manifest's T1..T5 as measured, ``step_s = 0`` (the packs' overheads before session 32);
* **T's x ratio**: scaled, ``step_s = 0``;
* **host model**: scaled and ``step_s`` (what the refitted pack's platform holds);
* **host model, latency**: the same, one step's latency from an idle device (``iteration_s``, what
  ``e2e_gpu.py`` predicted before session 32) instead of the loop's pace.

Also the host tasks per step, synthesised vs traced, per overhead type (T1: ops and nodes; T2 / T3: ops that
launch kernels; T4: launches; T5: gaps between launches of one op). Nothing here feeds a prediction.
Writes ``benchmarks/results/gpu_host_model.{md,json}``.

    python experiments/gpu_host_model.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RESULTS = REPO / "benchmarks" / "results"
#: (pack, measured files) per GPU
FILES = {
    "h200-cal": ["e2e_h200_measured.json", "e2e_h200_measured_b.json", "e2e_h200_measured_s39.json",
                 "e2e_h200_measured_s39b.json"],
    "h100": [f"e2e_h100_measured{x}.json" for x in ("_run5", "", "_run1", "_run2", "_run3")],
}
TRACES = {"h200-cal": REPO / "benchmarks" / "traces" / "h200", "h100": REPO / "benchmarks" / "traces" / "h100"}
T_FIELDS = ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s")  # as predictor.timing.calibration.step_graph.T_FIELDS


#: the pricings compared (see the module docstring)
PRICINGS = ("profiled", "scaled", "host_model", "host_model_latency")


def scaled_rows(pack: str, files: list[str]) -> tuple[dict, list[dict]]:
    """The pack's host model (ratio, step_s, simulated calibration step) and, per measured file and row, the
    loop pace predicted by each of :data:`PRICINGS`."""
    from experiments.e2e_gpu import _read_measured, graph_for
    from predictor.simulate import simulate
    from predictor.timing.calibration.step_graph import T_FIELDS, device_overheads
    from predictor.timing.kernels import timing_for
    from predictor.timing.platforms.assets import load_asset_pack
    from predictor.timing.platforms.schema import CpuOverheads

    measured_o = load_asset_pack(REPO / "assets" / pack).manifest["overheads"]
    timing = timing_for(pack)
    model = {**device_overheads(measured_o, timing), "measured_step_s": float(measured_o["iteration_s_unprofiled"])}
    pricings = {"profiled": CpuOverheads(**{k: float(measured_o[k]) for k in T_FIELDS}),
                "scaled": CpuOverheads(**{k: model[k] for k in T_FIELDS}),
                "host_model": CpuOverheads(**{k: model[k] for k in (*T_FIELDS, "step_s", "sparse_table_s")})}
    rows = []
    for f in files:
        for r in _read_measured(RESULTS / f)["rows"]:
            g = graph_for(r["model"], int(r["batch"]))
            out = {"file": f, "model": r["model"], "batch": int(r["batch"]), "measured_s": r["measured_s"]}
            for label, o in pricings.items():
                timing.overheads = o
                tl = simulate(g, timing)
                out[f"{label}_s"] = float(tl.loop_pace_s())
                if label == "host_model":
                    out["host_model_latency_s"] = float(tl.iteration_s)
            rows.append(out)
    return model, rows


#: ``--node-pricings``: what a kernel-less host node costs (``predictor.sources.synth.emit.NODE_OVERHEADS``); the first is the model's
NODE_PRICINGS = {"T1 + T3": ("T1", "T3"), "T1 + T2 + T3": ("T1", "T2", "T3"), "T1": ("T1",), "nothing": ()}


def node_pricing_rows(pack: str, files: list[str], current: tuple[dict, list[dict]] | None = None) -> list[dict]:
    """Per node pricing of :data:`NODE_PRICINGS`: the host model (its ``step_s`` closed again, the calibration step
    has nodes too) scored on every measured file: geomean / max abs error %. ``current``: :func:`scaled_rows`'s
    result under the model's own pricing (``emit.NODE_OVERHEADS``), reused rather than simulated again."""
    from predictor.graph import Overhead
    from predictor.metrics import geomean_abs_pct_error, max_abs_pct_error
    from predictor.sources.synth import emit

    kept = emit.NODE_OVERHEADS
    out = []
    try:
        for label, types in NODE_PRICINGS.items():
            emit.NODE_OVERHEADS = pricing = tuple(Overhead[t] for t in types)
            model, rows = current if current is not None and pricing == kept else scaled_rows(pack, files)
            row = {"pricing": label, "step_s": model["step_s"], "files": {}}
            for f in files:
                sel = [r for r in rows if r["file"] == f]
                pred, meas = [r["host_model_s"] for r in sel], [r["measured_s"] for r in sel]
                row["files"][f] = [geomean_abs_pct_error(pred, meas), max_abs_pct_error(pred, meas)]
            out.append(row)
    finally:
        emit.NODE_OVERHEADS = kept
    return out


def op_counts(pack: str) -> list[dict]:
    """Host tasks per overhead type, synthesised vs traced, for each committed trace of the pack's GPU."""
    from experiments.e2e_gpu import ROWS, _trace_batch, _trace_for, graph_for
    from predictor.graph import Overhead
    from predictor.sources.traces.annotate import annotate
    from predictor.sources.traces.load import load_traces

    out = []
    for model in ROWS:
        trace = _trace_for(model, TRACES[pack])
        if trace is None:
            continue
        batch = _trace_batch(trace)
        synth = graph_for(model, batch)
        traced = annotate(load_traces(trace)).graphs()[0]
        types = [o for o in Overhead if o != Overhead.NONE]
        out.append({"model": model, "batch": batch,
                    "synthesised": {o.name: int((synth.overhead == o).sum()) for o in types},
                    "traced": {o.name: int((traced.overhead == o).sum()) for o in types}})
    return out


def _err(pred: float, meas: float) -> float:
    return 100.0 * (pred / meas - 1.0)


def markdown(res: dict) -> str:
    from predictor.metrics import geomean_abs_pct_error, max_abs_pct_error

    lines = ["# The single-GPU host model: kernel-less host work, T's x the profiler ratio, the step's framework cost",
             "", f"{res['date']}; offline. Reproduce: `python experiments/gpu_host_model.py`. See the module docstring.", "",
             "## The host model of each pack (from its calibration's own step)", "",
             "| pack | unprofiled / profiled step | T1..T5 x ratio, us | simulated calibration step ms | measured ms | "
             "step_s us | sparse_table_s us |", "|---|---:|---|---:|---:|---:|---:|"]
    for pack, d in res["packs"].items():
        m = d["model"]
        ts = " / ".join(f"{m[k] * 1e6:.1f}" for k in T_FIELDS)
        lines.append(f"| {pack} | {m['profiler_ratio']:.3f} | {ts} | {m['simulated_step_s'] * 1e3:.3f} | "
                     f"{m['measured_step_s'] * 1e3:.3f} | {m['step_s'] * 1e6:.0f} | {m['sparse_table_s'] * 1e6:.0f} |")
    lines += ["", "## Every measured file: geomean / max abs error %, the same graphs priced three ways (loop pace), and one step's latency", "",
              "| pack | measured file | rows | profiled T's | T's x ratio | host model | host model, latency |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for pack, d in res["packs"].items():
        for f in FILES[pack]:
            rows = [r for r in d["rows"] if r["file"] == f]
            meas = [r["measured_s"] for r in rows]
            cells = [f"{geomean_abs_pct_error([r[f'{k}_s'] for r in rows], meas):.1f} / "
                     f"{max_abs_pct_error([r[f'{k}_s'] for r in rows], meas):.1f}" for k in PRICINGS]
            lines.append(f"| {pack} | {f} | {len(rows)} | " + " | ".join(cells) + " |")
    for pack, d in res["packs"].items():
        f = FILES[pack][0]
        lines += ["", f"## {pack}, {f}: signed error % per row", "",
                  "| model | batch | measured ms | profiled T's % | T's x ratio % | host model % | latency % |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['model']} | {r['batch']} | {r['measured_s'] * 1e3:.3f} | " + " | ".join(
            f"{_err(r[f'{k}_s'], r['measured_s']):+.1f}" for k in PRICINGS) + " |" for r in d["rows"] if r["file"] == f]
        lines += ["", f"Host tasks per step ({pack}'s GPU traces): synthesised / traced", "",
                  "| model | batch | T1 ops and nodes | T2 launching ops | T4 launches | T5 gaps in an op |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {c['model']} | {c['batch']} | " + " | ".join(
            f"{c['synthesised'][t]} / {c['traced'][t]}" for t in ("T1", "T2", "T4", "T5")) + " |" for c in d["ops"]]
    lines += ["", "## How a kernel-less node is priced: the host model (step_s closed again) per choice", "",
              "The model's choice, T1 + T3, was made while building it on these files (a first version charged nodes "
              "T2 too — an op's way to its first launch, which a node lacks — and over-charged the GPT's views): "
              "this table is a sensitivity on the same files, not a held-out test.", "",
              "| pack | node costs | step_s us | per measured file: geomean / max % |",
              "|---|---|---:|---|"]
    for pack, d in res["packs"].items():
        for r in d.get("node_pricings", []):
            cells = "; ".join(f"{f.replace('.json', '')} {g:.1f} / {m:.1f}" for f, (g, m) in r["files"].items())
            lines.append(f"| {pack} | {r['pricing']} | {r['step_s'] * 1e6:.0f} | {cells} |")
    lines += ["", "Reading: see `docs/SESSION_NOTES.md` (session 32) and the README's single-GPU rows.", ""]
    return "\n".join(lines)


def main() -> None:
    from predictor.files import atomic_write_text

    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "packs": {}}
    for pack, files in FILES.items():
        model, rows = scaled_rows(pack, files)
        res["packs"][pack] = {"model": model, "rows": rows, "ops": op_counts(pack),
                              "node_pricings": node_pricing_rows(pack, files, (model, rows))}
    atomic_write_text(RESULTS / "gpu_host_model.json", json.dumps(res, indent=1))
    text = markdown(res)
    atomic_write_text(RESULTS / "gpu_host_model.md", text)
    print(text)


if __name__ == "__main__":
    main()
