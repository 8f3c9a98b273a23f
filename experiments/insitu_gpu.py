"""Where a GPU-bound step's error comes from: the synthesised step's kernels against a captured trace's.

The single-GPU e2e rows whose passes agree (GPU-bound) are predicted from the synthesisers' device-mode
graphs priced by an asset pack. This sets each traced model's step (``tuner.capture`` archives
``traces-MODEL-bBATCH.tar.gz`` of ``experiments/e2e_gpu.py --measure --traces``, captured on the
machine that measured the rows) beside the synthesised graph of the same model and batch, kernel class
by kernel class: the trace's kernels (per-task median over the profiled steps, Kineto's device
timestamps) grouped by their names (:data:`TRACE_CLASSES`), the synthesised kernels by their kinds
(:data:`KIND_CLASS`), each pack's predicted time per class. A class whose prediction falls short of the
trace is a kernel model that under-prices its kernels in situ, or kernels the synthesiser does not emit.

Nothing here feeds a prediction.

Run:  python experiments/insitu_gpu.py --traces benchmarks/traces/h200-s39 --packs h200-cal
      benchmarks/results/data/packs/h200-s39 --out benchmarks/results/insitu_h200_s39
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.common import fail, repo_relative, write_results  # noqa: E402

#: kernel-name patterns of a trace's kernels, first match wins (CUDA builds of ATen, cuBLAS / cuBLASLt)
TRACE_CLASSES: tuple[tuple[str, str], ...] = (
    ("gemm", r"gemm|nvjet|cutlass|xmma|gemv"),
    ("softmax", r"softmax|SoftMax"),
    ("layer_norm", r"layer_norm|LayerNorm|GammaBeta"),
    ("dropout", r"dropout"),
    ("embedding", r"EmbeddingBag|embedding|gather|indexFunc|index_elementwise|adix|compute_grad_weight|segment|"
                  r"krn_partial|sum_and_scatter|unique|sort"),
    ("optimizer", r"multi_tensor_apply"),
    ("copy", r"Memset|Memcpy|direct_copy|CatArray|fill|Fill"),
    ("pointwise and reductions", r"."),
)
#: synthesiser kinds -> the class of the same kernels in a trace
KIND_CLASS: dict[str, str] = {
    **dict.fromkeys(("mm", "addmm", "bmm", "gemm", "interaction"), "gemm"),
    **dict.fromkeys(("softmax", "softmax_bwd", "log_softmax_bwd"), "softmax"),
    "layer_norm": "layer_norm", "dropout": "dropout", "optimizer": "optimizer",
    **dict.fromkeys(("embedding", "embedding_bag_fwd", "embedding_bag_bwd", "embedding_bag_update"), "embedding"),
    **dict.fromkeys(("memcpy", "concat", "fill"), "copy"),
}
CLASSES = tuple(c for c, _ in TRACE_CLASSES)


def trace_class(name: str) -> str:
    """The class of a traced kernel by its name (:data:`TRACE_CLASSES`)."""
    return next(c for c, p in TRACE_CLASSES if re.search(p, name))


def traced_classes(trace: Path) -> dict[str, tuple[int, float]]:
    """Per class: (kernels, seconds) of one traced step."""
    from predictor.sources.traces.annotate import annotate
    from predictor.sources.traces.load import load_traces

    g = annotate(load_traces(trace)).graphs()[0]
    out = {c: [0, 0.0] for c in CLASSES}
    gap = g.kinds.index("gpu_gap") if "gpu_gap" in g.kinds else -1
    for i in np.flatnonzero(g.is_gpu() & (g.kind != gap)).tolist():
        row = out[trace_class(g.names[g.name[i]])]
        row[0] += 1
        row[1] += float(g.duration[i])
    return {c: (int(n), s) for c, (n, s) in out.items()}


def synthesised_classes(model: str, batch: int, timing) -> dict[str, tuple[int, float]]:
    """Per class: (kernels, predicted seconds) of the synthesised device-mode step priced by ``timing``."""
    from experiments.e2e_gpu import graph_for
    from predictor.simulate import simulate

    g = graph_for(model, batch)
    tl = simulate(g, timing)
    d = tl.end - tl.start
    out = {c: [0, 0.0] for c in CLASSES}
    for i in np.flatnonzero(g.is_gpu()).tolist():
        row = out[KIND_CLASS.get(g.kinds[g.kind[i]], "pointwise and reductions")]
        row[0] += 1
        row[1] += float(d[i])
    return {c: (int(n), s) for c, (n, s) in out.items()}


def _model_batch(trace: Path) -> tuple[str, int]:
    """(model, batch) of a ``traces-MODEL-bBATCH.tar.gz`` archive."""
    from experiments.e2e_gpu import _trace_batch

    return trace.name.removeprefix("traces-").rpartition("-b")[0], _trace_batch(trace)


def _pct(pred: float, meas: float) -> str:
    return f"{100 * (pred - meas) / meas:+.1f}" if meas > 0 else ""


def markdown(rows: list[dict], packs: list[str], meta: dict) -> str:
    lines = ["# A captured GPU step's kernels against the synthesised step's, by class", "",
             f"{meta['date']}; offline. Reproduce: `{meta['command']}`. See the module docstring.", "",
             "Per traced model (at the trace's batch): the trace's kernels per step (count, us) and each pack's "
             "prediction of the synthesised graph's kernels of the same class (count, us, signed error % against "
             "the trace).", ""]
    for model in dict.fromkeys(r["trace"] for r in rows):
        mr = [r for r in rows if r["trace"] == model]
        lines += [f"## {model}", "",
                  "| class | traced kernels | traced us | synthesised kernels | "
                  + " | ".join(f"{p} us | {p} err %" for p in packs) + " |",
                  "|---|---:|---:|---:|" + "---:|---:|" * len(packs)]
        for r in [*mr, {"class": "**all**", **{k: sum(x[k] for x in mr) for k in mr[0] if k not in
                                                ("class", "trace", "model", "batch")}}]:
            cells = []
            for p in packs:
                cells += [f"{r[f'predicted_s[{p}]'] * 1e6:.1f}", _pct(r[f"predicted_s[{p}]"], r["traced_s"])]
            lines.append(f"| {r['class']} | {r['traced_kernels']} | {r['traced_s'] * 1e6:.1f} | "
                         f"{r['synthesised_kernels']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, required=True, help="folder of traces-MODEL-bBATCH.tar.gz archives")
    ap.add_argument("--packs", nargs="+", required=True, help="asset packs (names or paths) that price the graphs")
    ap.add_argument("--out", type=Path, required=True, help="results path without suffix (.md and .json)")
    a = ap.parse_args(argv)
    from predictor.timing.platforms import resolve_platform
    from predictor.timing.platforms.assets import AssetPackError

    traces = sorted(a.traces.glob("traces-*-b*.tar.gz")) if a.traces.is_dir() else []
    if not traces:
        fail(f"no traces-MODEL-bBATCH.tar.gz in {a.traces}")
    try:
        timings = {p: resolve_platform(p).timing() for p in a.packs}
    except (AssetPackError, KeyError) as e:
        fail(str(e))
    rows = []
    for t in traces:
        model, batch = _model_batch(t)
        traced = traced_classes(t)
        synth = {p: synthesised_classes(model, batch, tm) for p, tm in timings.items()}
        first = next(iter(synth.values()))
        for c in CLASSES:
            rows.append({"trace": t.name, "model": model, "batch": batch, "class": c,
                         "traced_kernels": traced[c][0], "traced_s": traced[c][1],
                         "synthesised_kernels": first[c][0],
                         **{f"predicted_s[{p}]": s[c][1] for p, s in synth.items()}})
    meta = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python experiments/insitu_gpu.py --traces " + repo_relative(a.traces) + " --packs "
                       + " ".join(a.packs) + " --out " + repo_relative(a.out),
            "traces": [repo_relative(t) for t in traces], "packs": a.packs}
    write_results(a.out, {"meta": meta, "rows": rows}, markdown(rows, a.packs, meta))


if __name__ == "__main__":
    main()
