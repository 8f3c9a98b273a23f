"""One GEMM net over several GEMM kernels (multi-task fit), against one net per kernel, on stored data.

The calibration fits one MLP per GEMM kernel (``addmm``, ``mm``, ``bmm`` x dtype), each on its own ~160
training shapes. ``addmm`` / ``mm`` / ``bmm`` of one dtype run the same BLAS / oneDNN micro-kernels on a
batch entry, so a net fitted on all their training samples, with the op as two 0/1 inputs (``is_addmm``,
``is_bmm``; ``batch`` is 1 for the unbatched ops), sees three times the shapes. Variants:

* ``current``: the benchmark's spec per kernel (what ``tuner calibrate`` fits);
* ``joint-op``: one net per dtype over addmm / mm / bmm;
* ``joint-all``: one net over both dtypes and the three ops (``dtype_bytes`` a further input).

Every variant is fitted by :func:`predictor.kernels.learned.fit_mlp` with the calibration's settings for the
pack's level (grid, epochs, ensemble members; a joint net gets the sum of its kernels' grid-search
budgets) on the union of the kernels' training samples of the calibration's own split
(:func:`predictor.calibrate._split`, one per kernel and seed), and is scored on each kernel's held-out 20 %
through the prediction path's terms (:func:`predictor.kernels.learned.known_seconds` added back). Each
seed is another split and initialisation.

    python experiments/gemm_joint_fit.py --packs assets/cpu-local-zen4 \\
        benchmarks/results/data/packs/cpu-s34 benchmarks/results/data/packs/cpu-s30x4 --seeds 0 1 2 3

writes ``experiments/results/gemm_joint_fit.md`` and its rows as ``.csv`` (no measuring; ~25 min for
those three packs and four seeds on the 2-core VM).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import predictor.calibrate as cm  # noqa: E402
from experiments.common import repo_relative  # noqa: E402
from experiments.kernel_model_variants import _specs  # noqa: E402
from predictor.calibration.base import ModelSpec  # noqa: E402
from predictor.kernels.learned import feature_matrix, fit_mlp, known_seconds  # noqa: E402
from predictor.metrics import geomean_abs_pct_error  # noqa: E402
from predictor.platforms.assets import load_asset_pack  # noqa: E402

VARIANTS = ("current", "joint-op", "joint-all")
#: the op inputs of a joint net (0/1, not logged)
OP_FEATURES = ("is_addmm", "is_bmm")


def _columns(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    cols = {c: frame[c].to_numpy(dtype=np.float64) for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])}
    cols["is_addmm"] = (frame["kind"] == "addmm").to_numpy(dtype=np.float64)
    cols["is_bmm"] = (frame["kind"] == "bmm").to_numpy(dtype=np.float64)
    return cols


def _joint_spec(spec: ModelSpec, with_dtype: bool) -> ModelSpec:
    """The bmm-like spec of a joint net: m, n, k, batch (+ dtype_bytes) + the op inputs + the alignment ones."""
    extra = ("dtype_bytes",) if with_dtype else ()
    align = tuple(spec.optional_features)
    return ModelSpec(kernel="joint", kinds=spec.kinds, method="mlp",
                     features=("m", "n", "k", "batch", *extra, *OP_FEATURES, *align),
                     raw_features=(*extra, *OP_FEATURES, *spec.raw_features),
                     optional_features=align, work=("m", "n", "k", "batch"))


def _fit(job: dict) -> list[dict]:
    """Fit one net (``job``) on its kernels' training rows and score it on each kernel's held-out rows."""
    spec: ModelSpec = job["spec"]
    train = pd.concat(job["train"], ignore_index=True)
    t0 = time.perf_counter()
    net = fit_mlp(feature_matrix(_columns(train), spec.features, len(train)),
                  cm._learned_seconds(train, job["platform"]), spec.features,
                  log_features=[f for f in spec.features if f not in spec.raw_features], work=spec.work,
                  grid=job["grid"], epochs=job["epochs"], seed=job["seed"], budget_s=job["budget"],
                  optional=spec.optional_features, members=job["members"])
    fit_s = time.perf_counter() - t0
    rows = []
    for kernel, test in job["test"].items():
        pred = (net.predict(feature_matrix(_columns(test), net.features, len(test)))
                + known_seconds(cm._view(test, test["kind"].iloc[0]), job["platform"]))
        err = np.abs(pred / test["seconds"].to_numpy() - 1.0) * 100.0
        rows.append({"pack": job["pack"], "seed": job["seed"], "variant": job["variant"], "kernel": kernel,
                     "held_out": len(test), "gmae_pct": geomean_abs_pct_error(pred, test["seconds"].to_numpy()),
                     "mape_pct": float(err.mean()), "max_pct": float(err.max()),
                     "train": len(train), "fit_s": fit_s, "model": f"{net.config['layers']}x{net.config['width']}"})
    return rows


def jobs_for(pack_path: Path, seeds: list[int]) -> list[dict]:
    """The fits of one pack: per seed, one per kernel (``current``), per dtype (``joint-op``), one ``joint-all``."""
    pack = load_asset_pack(pack_path, allow_unfitted=True)
    m = pack.manifest
    level = m.get("level", "quick")
    grid, epochs, budget = cm.MLP_SETTINGS[level]
    budget *= max(1.0, float(m.get("scale") or 1.0))
    data = pd.read_csv(pack.path / "data" / "gemm.csv")
    specs = {s.kernel: s for _fam, s in _specs(m, ["gemm"])}
    common = {"pack": pack.name, "platform": pack.platform, "grid": grid, "epochs": epochs,
              "members": cm.MLP_MEMBERS[level]}
    jobs = []
    for seed in seeds:
        parts = {}
        for kernel in specs:
            sub = data[data["kernel"] == kernel].reset_index(drop=True)
            if len(sub) < 5:
                continue
            tr, te = cm._split(len(sub), seed, kernel)
            parts[kernel] = (sub.iloc[tr], sub.iloc[te])
        for kernel, (tr, te) in parts.items():
            jobs.append({**common, "seed": seed, "variant": "current", "spec": specs[kernel], "train": [tr],
                         "test": {kernel: te}, "budget": budget})
        dtypes = sorted({k.split("/")[1] for k in parts})
        for dt in dtypes:
            group = [k for k in parts if k.endswith("/" + dt)]
            jobs.append({**common, "seed": seed, "variant": "joint-op", "spec": _joint_spec(specs[group[0]], False),
                         "train": [parts[k][0] for k in group], "test": {k: parts[k][1] for k in group},
                         "budget": budget * len(group)})
        jobs.append({**common, "seed": seed, "variant": "joint-all", "spec": _joint_spec(specs[next(iter(parts))], True),
                     "train": [p[0] for p in parts.values()], "test": {k: p[1] for k, p in parts.items()},
                     "budget": budget * len(parts)})
    return jobs


def verdict(df: pd.DataFrame, seeds: list[int]) -> list[str]:
    """The session-36 rule per dtype group over ``seeds``: mean >= 0.5 points below ``current``, no pack's
    group mean worse by > 0.5, no kernel's mean worse by > 1.0; of passing variants the lower mean wins."""
    d = df[df["seed"].isin(seeds)].copy()
    d["dtype"] = d["kernel"].str.split("/").str[1]
    lines = []
    for dt, g in d.groupby("dtype", sort=True):
        base = g[g.variant == "current"]
        cur = base.gmae_pct.mean()
        passing = []
        parts = [f"**{dt}** (seeds {', '.join(map(str, seeds))}): current {cur:.2f} %"]
        for v in VARIANTS[1:]:
            x = g[g.variant == v]
            if x.empty:
                continue
            mean = x.gmae_pct.mean()
            pack_worse = (x.groupby("pack").gmae_pct.mean() - base.groupby("pack").gmae_pct.mean()).max()
            kern_worse = (x.groupby("kernel").gmae_pct.mean() - base.groupby("kernel").gmae_pct.mean()).max()
            ok = mean <= cur - 0.5 and pack_worse <= 0.5 and kern_worse <= 1.0
            parts.append(f"{v} {mean:.2f} % (worst pack {pack_worse:+.2f}, worst kernel {kern_worse:+.2f}: "
                         f"{'passes' if ok else 'fails'})")
            if ok:
                passing.append((mean, v))
        parts.append(f"adopt: {min(passing)[1] if passing else 'none'}")
        lines.append("- " + "; ".join(parts))
    return lines


def markdown(df: pd.DataFrame, seeds: list[int], decide: list[int], command: str) -> str:
    lines = ["# One GEMM net over several GEMM kernels, against one net per kernel (stored data)", "",
             "Held-out GMAE % per kernel on each kernel's own 20 % (the calibration's split for the seed), "
             "the mean over seeds in each cell with the seeds' own figures in brackets. `current`: one net per "
             "kernel (the calibration's spec); `joint-op`: one net per dtype over addmm / mm / bmm (op as 0/1 "
             "inputs); `joint-all`: one net over both dtypes and the three ops. Same grid, epochs and ensemble "
             "as the calibration at the pack's level; a joint net's grid-search budget is the sum of its kernels'.",
             "", f"Reproduce: `{command}`", "", "## Rule (session 36, set before scoring)", "",
             *verdict(df, decide), ""]
    for pack, p in df.groupby("pack", sort=False):
        lines += [f"## {pack}", "", "| kernel | " + " | ".join(VARIANTS) + " |", "|---|" + "---:|" * len(VARIANTS)]
        for kernel, k in p.groupby("kernel", sort=False):
            cells = []
            for v in VARIANTS:
                g = k[k.variant == v].sort_values("seed").gmae_pct
                cells.append(f"{g.mean():.2f} (" + " / ".join(f"{x:.2f}" for x in g) + ")" if len(g) else "")
            lines.append(f"| {kernel} | " + " | ".join(cells) + " |")
        lines.append("")
    means = df.groupby(["kernel", "variant"], sort=False).gmae_pct.mean().unstack()
    lines += ["## Mean over packs and seeds", "", "| kernel | " + " | ".join(VARIANTS) + " |",
              "|---|" + "---:|" * len(VARIANTS)]
    for kernel, r in means.iterrows():
        lines.append(f"| {kernel} | " + " | ".join(f"{r.get(v, float('nan')):.2f}" for v in VARIANTS) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", nargs="+", required=True, help="asset packs that store GEMM benchmark data")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--decide", type=int, nargs="+", default=[1, 2, 3], help="the seeds the rule reads")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "gemm_joint_fit.md"))
    a = ap.parse_args()
    jobs = [j for p in a.packs for j in jobs_for(Path(p), a.seeds)]
    rows: list[dict] = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.workers) as pool:
        for i, r in enumerate(pool.map(_fit, jobs), 1):
            rows += r
            print(f"[{i}/{len(jobs)} {time.perf_counter() - t0:5.0f} s] {r[0]['pack']} seed {r[0]['seed']} "
                  f"{r[0]['variant']}: " + ", ".join(f"{x['kernel']} {x['gmae_pct']:.2f}" for x in r), flush=True)
    df = pd.DataFrame(rows)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out.with_suffix(".csv"), index=False)
    command = ("python experiments/gemm_joint_fit.py --packs " + " ".join(repo_relative(p) for p in a.packs)
               + " --seeds " + " ".join(map(str, a.seeds)))
    out.write_text(markdown(df, a.seeds, a.decide, command))
    print(out.read_text())


if __name__ == "__main__":
    main()
