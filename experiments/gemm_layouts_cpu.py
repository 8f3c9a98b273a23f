"""Do a training step's GEMM layouts run at the speed the calibration measures? (CPU one thread, or a GPU)

The calibration times ``addmm(bias, x, y)`` and ``mm(x, y)`` with both operands row-major (NN). A
training step of ``nn.Linear`` layers runs three layouts per layer: the forward
``addmm(bias, x, W.t())`` (NT: the weight ``W`` is ``out x in`` and enters transposed), the input
gradient ``mm(dy, W)`` (NN) and the weight gradient ``mm(dy.t(), x)`` (TN). This script times each
layout the calibration's way (data cold, code warm: :meth:`Timer.measure_cold`, the timer of
``tuner calibrate --quick``) on the distinct GEMM shapes of the e2e MLP step, interleaved in shuffled
rounds, and reports each layout's time over the NN time of the same shape.

    flock /tmp/tuner-measure.lock python experiments/gemm_layouts_cpu.py

writes ``experiments/results/gemm_layouts_cpu.md`` and ``.json`` (about 2 minutes). On a GPU machine
(``experiments/gpu_session.sh lease`` runs it when time is left; ~30 s):

    python experiments/gemm_layouts_cpu.py --device cuda --batches 1024 4096 16384 --dtype fp32 bf16 --out OUT

(on CUDA the NT / TN kernels are cuBLAS's other heuristics: the in-situ GEMMs of session 39's H200 traces sat
-27...+34 % from the NN-fitted models by layout).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import fail  # noqa: E402
from predictor.timing.calibration.timing import Timer  # noqa: E402


def geomean(values) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(values, dtype=float)))))


def step_gemms(batches: list[int]) -> list[tuple[str, str, int, int, int]]:
    """(label, op, m, n, k) of the distinct GEMMs of one MLP training step (``experiments/e2e_cpu.py``'s MLP:
    512 -> 1024 -> 1024 -> 1024 -> 10, ReLU) at each batch, named by output ``m x n`` and reduction ``k``."""
    out = []
    for b in batches:
        for i, o in ((512, 1024), (1024, 1024), (1024, 10)):
            out += [(f"mlp b{b} {i}->{o} fwd", "addmm", b, o, i),
                    (f"mlp b{b} {i}->{o} dgrad", "mm", b, i, o),
                    (f"mlp b{b} {i}->{o} wgrad", "mm", o, i, b)]
    return out


LAYOUTS = ("NN", "NT", "TN")


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def builder(op: str, layout: str, m: int, n: int, k: int, device: torch.device = torch.device("cpu"),
            dtype: torch.dtype = torch.float32):
    """A case builder (fresh operands per instance) of ``op`` in ``layout`` computing an m x n output."""
    def build():
        kw = {"device": device, "dtype": dtype}
        x = torch.randn(m, k, **kw) if layout[0] == "N" else torch.randn(k, m, **kw).t()
        y = torch.randn(k, n, **kw) if layout[1] == "N" else torch.randn(n, k, **kw).t()
        if op == "addmm":
            bias = torch.randn(n, **kw)
            return (lambda: torch.addmm(bias, x, y)), None
        return (lambda: torch.mm(x, y)), None

    return build


def score_pack(pack: str, rows: list[dict]) -> dict[str, float]:
    """A fitted pack's predicted NN time of every row over its measured NN time: by time, and geomeans."""
    from predictor.timing.kernels import TaskView
    from predictor.timing.platforms.assets import resolve_platform

    p = resolve_platform(pack).pack  # names resolve as --platform does (cpu-local: this CPU's pack)
    if p is None:
        raise ValueError(f"{pack}: not an asset pack (no fitted GEMM model to score)")
    model = next(m for m in p.models if "gemm" in m.kinds or "addmm" in m.kinds)
    pred = np.array([model.predict(TaskView.from_columns(r["op"], m=[float(r["m"])], n=[float(r["n"])],
                                                         k=[float(r["k"])], batch=[1.0],
                                                         dtype_bytes=[float(DTYPES[r.get("dtype", "fp32")].itemsize)]),
                                   p.platform)[0] for r in rows])
    nn = np.array([r["NN_s"] for r in rows])
    large = np.array([2.0 * r["m"] * r["n"] * r["k"] > 5e7 for r in rows])
    return {"by_time": float(pred.sum() / nn.sum()), "geomean_large": geomean(pred[large] / nn[large]),
            "geomean_all": geomean(pred / nn)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--packs", nargs="*", default=[],
                    help="fitted asset packs (names or paths) whose GEMM predictions are scored against the NN times")
    ap.add_argument("--device", default="cpu", help="cpu (one thread) or cuda[:N]")
    ap.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["fp32"])
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "gemm_layouts_cpu")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        fail(f"--device {a.device} needs a CUDA GPU")
    torch.manual_seed(a.seed)
    cache = 32 * 2**20 if device.type == "cpu" else 128 * 2**20  # above an H100 / H200's L2 (50-60 MiB)
    timer = Timer(device, warmup=2, repeats=7, cold_repeats=5, cache_bytes=cache)
    shapes = [(f"{label} {dt}" if len(a.dtype) > 1 else label, op, m, n, k, dt)
              for dt in a.dtype for label, op, m, n, k in step_gemms(a.batches)]
    cases = [(s, lay) for s in shapes for lay in LAYOUTS]
    times: dict[tuple[str, str], list[float]] = {}
    rng = np.random.default_rng(a.seed)
    t0 = time.perf_counter()
    for _ in range(a.rounds):
        for i in rng.permutation(len(cases)):
            (label, op, m, n, k, dt), lay = cases[i]
            times.setdefault((label, lay), []).append(
                timer.measure_cold(builder(op, lay, m, n, k, device, DTYPES[dt])).seconds)
    wall = time.perf_counter() - t0
    rows = []
    for label, op, m, n, k, dt in shapes:
        med = {lay: float(np.median(times[(label, lay)])) for lay in LAYOUTS}
        rows.append({"gemm": label, "op": op, "m": m, "n": n, "k": k, "dtype": dt,
                     **{f"{lay}_s": med[lay] for lay in LAYOUTS},
                     **{f"{lay}_over_NN": med[lay] / med["NN"] for lay in ("NT", "TN")}})
    # the layout each GEMM of the step really uses
    used = {"fwd": "NT", "dgrad": "NN", "wgrad": "TN"}
    role = {r["gemm"]: next(w for w in r["gemm"].split() if w in used) for r in rows}
    step_ratio = [r[f"{used[role[r['gemm']]]}_s"] / r["NN_s"] for r in rows]
    summary = {"NT_over_NN_geomean": geomean([r["NT_over_NN"] for r in rows]),
               "TN_over_NN_geomean": geomean([r["TN_over_NN"] for r in rows]),
               "step_layouts_over_NN_geomean": geomean(step_ratio),
               "step_layouts_time_weighted": float(sum(r[f"{used[role[r['gemm']]]}_s"] for r in rows)
                                                   / sum(r["NN_s"] for r in rows))}
    scores = {str(p): score_pack(p, rows) for p in a.packs}
    summary["packs"] = scores
    meta = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
            "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
            "threads": torch.get_num_threads(), "rounds": a.rounds, "wall_s": round(wall, 1),
            "command": "flock /tmp/tuner-measure.lock python experiments/gemm_layouts_cpu.py "
                       + " ".join(argv if argv is not None else sys.argv[1:])}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1))
    lines = [
        "# GEMM layouts of a training step against the calibration's NN layout "
        + ("(CPU, 1 thread)" if device.type == "cpu" else f"({meta['device']})"),
        "",
        f"{meta['measured_at']}, torch {meta['torch']}, {a.rounds} shuffled rounds, each time the median of 5 "
        "cold samples (the calibration's timer: cache evicted, code warm); the median over rounds is kept. "
        f"Wall time {wall:.0f} s. Reproduce: `{meta['command'].strip()}`",
        "",
        "`fwd` runs NT in a step (`addmm(bias, x, W.t())`), `dgrad` NN (`mm(dy, W)`), `wgrad` TN (`mm(dy.t(), x)`); "
        "the calibration times NN only.",
        "",
        f"**Summary:** NT / NN geomean x{summary['NT_over_NN_geomean']:.3f}, TN / NN x{summary['TN_over_NN_geomean']:.3f}; "
        f"the layouts a step uses over NN: x{summary['step_layouts_over_NN_geomean']:.3f} geomean, "
        f"x{summary['step_layouts_time_weighted']:.3f} weighted by time.",
        "",
        "| GEMM (m x n x k) | NN us | NT / NN | TN / NN |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['gemm']} ({r['m']} x {r['n']} x {r['k']}) | {r['NN_s'] * 1e6:.1f} | "
                     f"{r['NT_over_NN']:.3f} | {r['TN_over_NN']:.3f} |")
    if scores:
        lines += ["", "Each pack's prediction of the NN GEMMs over their times measured here (the calibration times NN; "
                  "> 1: the pack predicts slower):", "",
                  "| pack | by time (sum predicted / sum measured) | geomean, GEMMs above 5e7 FLOPs | geomean, all |",
                  "|---|---:|---:|---:|"]
        lines += [f"| {p} | x{v['by_time']:.3f} | x{v['geomean_large']:.3f} | x{v['geomean_all']:.3f} |"
                  for p, v in scores.items()]
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
