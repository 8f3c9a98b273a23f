"""One net pooled over several kernels of a family (multi-task fit), against one net per kernel, on stored data.

The calibration fitted one MLP per kernel, each on its own training shapes. Kernels of one family that run
the same code on their operands (``addmm`` / ``mm`` / ``bmm`` of a dtype: the same BLAS / oneDNN micro-kernels
on a batch entry; the softmax and log-softmax backwards: a row reduction over two tensors) can share one
net fitted on all their training samples, with the kernel as 0/1 route inputs (GEMMs: ``is_addmm``,
``is_bmm``, ``batch`` 1 for the unbatched ops; softmax: ``is_softmax_bwd``, ``is_log_softmax_bwd``).
Variants per family (:data:`FAMILIES`):

* ``current``: the benchmark's spec per kernel, fitted alone (the calibration before ``ModelSpec.pool``);
* gemm: ``joint-op`` (one net per dtype over addmm / mm / bmm), ``joint-all`` (one net over both dtypes and
  the three ops, ``dtype_bytes`` a further input);
* softmax: ``joint-bwd`` (one net over the two backward kernels; the forward stays alone), ``joint-all``
  (one net over the three).

Every variant is fitted by :func:`predictor.timing.kernels.learned.fit_mlp` with the calibration's settings for the
pack's level (grid, epochs, ensemble members; a pooled net gets the sum of its kernels' grid-search
budgets) on the union of the kernels' training samples of the calibration's own split
(:func:`predictor.timing.calibrate._split`, one per kernel and seed), and is scored on each kernel's held-out 20 %
through the prediction path's terms (:func:`predictor.timing.kernels.learned.known_seconds` added back). Each
seed is another split and initialisation.

    python experiments/pooled_fit.py --family gemm --packs assets/cpu-local-zen4 \\
        benchmarks/results/data/packs/cpu-s34 benchmarks/results/data/packs/cpu-s30x4 --seeds 0 1 2 3

writes ``experiments/results/pooled_fit_FAMILY.md`` and its rows as ``.csv`` (no measuring; ~15 min for the
GEMMs of those three packs and four seeds on the 2-core VM).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import predictor.timing.calibrate as cm  # noqa: E402
from experiments.common import repo_relative  # noqa: E402
from experiments.kernel_model_variants import _specs  # noqa: E402
from predictor.metrics import geomean_abs_pct_error  # noqa: E402
from predictor.timing.calibration.base import ModelSpec  # noqa: E402
from predictor.timing.kernels.learned import (  # noqa: E402
    ONEDNN_FEATURES,
    ROUTE_FEATURES,
    feature_matrix,
    fit_mlp,
    known_seconds,
)
from predictor.timing.platforms.assets import load_asset_pack  # noqa: E402

ROUTE_PREFIX = "is_"


def _route_inputs(family: str) -> tuple[str, ...]:
    """The 0/1 kernel inputs of a pooled net of ``family`` (not logged)."""
    return ROUTE_FEATURES if family == "gemm" else ("is_softmax_bwd", "is_log_softmax_bwd")


def _per_dtype(kernels: list[str]) -> list[list[str]]:
    """The GEMM kernels grouped by dtype (``op/dtype``): one pool per dtype."""
    return [[k for k in kernels if k.endswith("/" + dt)] for dt in sorted({k.split("/")[1] for k in kernels})]


#: family -> variant -> (pools of kernels as a function of the family's kernels, extra inputs)
FAMILIES: dict[str, dict[str, tuple[Callable[[list[str]], list[list[str]]], tuple[str, ...]]]] = {
    "gemm": {
        "joint-op": (_per_dtype, ()),
        "joint-all": (lambda ks: [list(ks)], ("dtype_bytes",)),
        # session 38: the bf16 pool with ATen's oneDNN edge as an input (fp32 kernels: as in ``current``)
        "joint-op+onednn": (lambda ks: [[k for k in ks if k.endswith("/bf16")]], ONEDNN_FEATURES),
        # session 38: both pools with ATen's small-bmm loop (m n k < 400, bmm rows only) as an input
        "joint-op+naive": (_per_dtype, ("bmm_naive",)),
        # session 40: both pools with the 16-element alignment inputs (m_al16, n_al16, k_al16) always on, not an
        # optional group a fit keeps only for a clear validation gain (:data:`PLAIN_ALIGN`)
        "joint-op+align": (_per_dtype, ()),
    },
    "softmax": {
        "joint-bwd": (lambda ks: [[k for k in ks if k.endswith("_bwd")]], ()),
        "joint-all": (lambda ks: [list(ks)], ()),
    },
}


def _columns(frame: pd.DataFrame, family: str) -> dict[str, np.ndarray]:
    cols = {c: frame[c].to_numpy(dtype=np.float64) for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])}
    op = frame["kernel"].str.split("/").str[0]
    for f in _route_inputs(family):
        cols[f] = (op == f[len(ROUTE_PREFIX):]).to_numpy(dtype=np.float64)
    return cols


def alone(spec: ModelSpec) -> ModelSpec:
    """``spec`` as one kernel's own net: without a pool, route inputs, or (unbatched GEMMs) ``batch``."""
    drop = {f for f in spec.features if f.startswith(ROUTE_PREFIX)}
    if spec.router == "gemm" and not spec.kernel.startswith("bmm"):
        drop.add("batch")
    keep = lambda names: tuple(f for f in names if f not in drop)  # noqa: E731
    return dataclasses.replace(spec, features=keep(spec.features), raw_features=keep(spec.raw_features),
                               optional_features=keep(spec.optional_features), work=keep(spec.work), pool="")


def _pooled_spec(family: str, spec: ModelSpec, extra: tuple[str, ...]) -> ModelSpec:
    """The spec of a pooled net from one member's own spec (:func:`alone`): its inputs + ``extra`` + route inputs."""
    route = _route_inputs(family)
    if family == "gemm":  # bmm-like: m, n, k, batch, (extra), the spec's own 0/1 inputs, route inputs, alignment
        align = tuple(spec.optional_features)
        own = tuple(f for f in spec.raw_features if f not in align and f not in extra)  # bf16: onednn_gemm
        return ModelSpec(kernel="pool", kinds=spec.kinds, method="mlp",
                         features=("m", "n", "k", "batch", *extra, *own, *route, *align),
                         raw_features=(*extra, *own, *route, *align),
                         optional_features=align, work=("m", "n", "k", "batch"))
    return dataclasses.replace(spec, kernel="pool", features=(*spec.features, *extra, *route),
                               raw_features=(*spec.raw_features, *extra, *route))


#: variants whose pooled GEMM nets take the alignment inputs as plain inputs (no optional group)
PLAIN_ALIGN = ("joint-op+align",)


def _fit(job: dict) -> list[dict]:
    """Fit one net (``job``) on its kernels' training rows and score it on each kernel's held-out rows."""
    spec: ModelSpec = job["spec"]
    fam = job["family"]
    train = pd.concat(job["train"], ignore_index=True)
    t0 = time.perf_counter()
    net = fit_mlp(feature_matrix(_columns(train, fam), spec.features, len(train)),
                  cm._learned_seconds(train, job["platform"]), spec.features,
                  log_features=[f for f in spec.features if f not in spec.raw_features], work=spec.work,
                  grid=job["grid"], epochs=job["epochs"], seed=job["seed"], budget_s=job["budget"],
                  optional=spec.optional_features, members=job["members"])
    fit_s = time.perf_counter() - t0
    rows = []
    for kernel, test in job["test"].items():
        pred = (net.predict(feature_matrix(_columns(test, fam), net.features, len(test)))
                + known_seconds(cm._view(test, test["kind"].iloc[0]), job["platform"]))
        err = np.abs(pred / test["seconds"].to_numpy() - 1.0) * 100.0
        rows.append({"pack": job["pack"], "seed": job["seed"], "variant": job["variant"], "kernel": kernel,
                     "held_out": len(test), "gmae_pct": geomean_abs_pct_error(pred, test["seconds"].to_numpy()),
                     "mape_pct": float(err.mean()), "max_pct": float(err.max()),
                     "train": len(train), "fit_s": fit_s, "model": f"{net.config['layers']}x{net.config['width']}"})
    return rows


def jobs_for(pack_path: Path, seeds: list[int], family: str, variants: list[str] | None = None) -> list[dict]:
    """The fits of one pack: per seed, one per kernel (``current``) and one per pool of each variant (of
    ``variants`` only, ``current`` among them or not, when given)."""
    pack = load_asset_pack(pack_path, allow_unfitted=True)
    m = pack.manifest
    level = m.get("level", "quick")
    grid, epochs, budget = cm.MLP_SETTINGS[level]
    budget *= max(1.0, float(m.get("scale") or 1.0))
    data = pd.read_csv(pack.path / "data" / f"{family}.csv")
    specs = {s.kernel: alone(s) for _fam, s in _specs(m, [family]) if s.method == "mlp"}
    common = {"pack": pack.name, "platform": pack.platform, "grid": grid, "epochs": epochs,
              "members": cm.MLP_MEMBERS[level], "family": family}
    jobs = []
    for seed in seeds:
        parts = {}
        for kernel in specs:
            sub = data[data["kernel"] == kernel].reset_index(drop=True)
            if len(sub) < 5:
                continue
            tr, te = cm._split(len(sub), seed, kernel)
            parts[kernel] = (sub.iloc[tr], sub.iloc[te])
        if variants is None or "current" in variants:
            for kernel, (tr, te) in parts.items():
                jobs.append({**common, "seed": seed, "variant": "current", "spec": specs[kernel], "train": [tr],
                             "test": {kernel: te}, "budget": budget})
        for variant, (pools, extra) in FAMILIES[family].items():
            if variants is not None and variant not in variants:
                continue
            for group in pools(list(parts)):
                spec = _pooled_spec(family, specs[group[0]], extra)
                if variant in PLAIN_ALIGN:
                    spec = dataclasses.replace(spec, optional_features=())
                jobs.append({**common, "seed": seed, "variant": variant,
                             "spec": spec,
                             "train": [parts[k][0] for k in group], "test": {k: parts[k][1] for k in group},
                             "budget": budget * len(group)})
    return jobs


def with_unpooled(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with, for each variant, the ``current`` rows of the kernels none of its pools covers (a variant
    fits those alone, as ``current`` does)."""
    cur = df[df.variant == "current"]
    extra = []
    for v in df.variant.unique():
        if v == "current":
            continue
        have = set(zip(df[df.variant == v].pack, df[df.variant == v].seed, df[df.variant == v].kernel, strict=True))
        miss = cur[[(p, s, k) not in have for p, s, k in zip(cur.pack, cur.seed, cur.kernel, strict=True)]]
        extra.append(miss.assign(variant=v))
    return pd.concat([df, *extra], ignore_index=True)


def _group(kernel: str, family: str) -> str:
    return kernel.split("/")[1] if family == "gemm" else family


def verdict(df: pd.DataFrame, seeds: list[int], family: str, baseline: str = "current") -> list[str]:
    """The session-36 rule per group (GEMMs: per dtype; softmax: the family) over ``seeds``: mean >= 0.5
    points below ``baseline`` (a variant's name; ``current`` by default), no pack's group mean worse by > 0.5,
    no kernel's mean worse by > 1.0; of passing variants the lower mean wins."""
    d = df[df["seed"].isin(seeds)].copy()
    d["group"] = [_group(k, family) for k in d["kernel"]]
    lines = []
    for grp, g in d.groupby("group", sort=True):
        base = g[g.variant == baseline]
        cur = base.gmae_pct.mean()
        passing = []
        parts = [f"**{grp}** (seeds {', '.join(map(str, seeds))}): {baseline} {cur:.2f} %"]
        for v in ("current", *FAMILIES[family]):
            x = g[g.variant == v]
            if v == baseline or x.empty:
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


def markdown(df: pd.DataFrame, family: str, decide: list[int], command: str, baseline: str = "current") -> str:
    variants = tuple(v for v in ("current", *FAMILIES[family]) if v in set(df.variant))
    lines = [f"# One net pooled over several {family} kernels, against one net per kernel (stored data)", "",
             "Held-out GMAE % per kernel on each kernel's own 20 % (the calibration's split for the seed), "
             "the mean over seeds in each cell with the seeds' own figures in brackets. `current`: one net per "
             "kernel; the others: one net per pool of kernels (the kernel as 0/1 route inputs), kernels outside "
             "every pool of a variant fitted alone as in `current`. Same grid, epochs and ensemble as the "
             "calibration at the pack's level; a pooled net's grid-search budget is the sum of its kernels'.",
             "", f"Reproduce: `{command}`", "", "## Rule (session 36, set before scoring)", "",
             *verdict(df, decide, family, baseline), ""]
    for pack, p in df.groupby("pack", sort=False):
        lines += [f"## {pack}", "", "| kernel | " + " | ".join(variants) + " |", "|---|" + "---:|" * len(variants)]
        for kernel, k in p.groupby("kernel", sort=False):
            cells = []
            for v in variants:
                g = k[k.variant == v].sort_values("seed").gmae_pct
                cells.append(f"{g.mean():.2f} (" + " / ".join(f"{x:.2f}" for x in g) + ")" if len(g) else "")
            lines.append(f"| {kernel} | " + " | ".join(cells) + " |")
        lines.append("")
    means = df.groupby(["kernel", "variant"], sort=False).gmae_pct.mean().unstack()
    lines += ["## Mean over packs and seeds", "", "| kernel | " + " | ".join(variants) + " |",
              "|---|" + "---:|" * len(variants)]
    for kernel, r in means.iterrows():
        lines.append(f"| {kernel} | " + " | ".join(f"{r.get(v, float('nan')):.2f}" for v in variants) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), default="gemm")
    ap.add_argument("--packs", nargs="+", required=True, help="asset packs that store the family's benchmark data")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--decide", type=int, nargs="+", default=[1, 2, 3], help="the seeds the rule reads")
    ap.add_argument("--variants", nargs="+", help="variants to fit (default: `current` and all of the family's); "
                    "without `current`, a pooled variant's kernels outside its pools are left out")
    ap.add_argument("--baseline", default="current", help="the variant the rule compares the others to")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", help="default: experiments/results/pooled_fit_FAMILY.md")
    a = ap.parse_args()
    known = set(FAMILIES[a.family])
    bad = [v for v in [*(a.variants or []), a.baseline] if v != "current" and v not in known]
    if bad:
        sys.exit(f"error: unknown variant(s) {', '.join(bad)} of family {a.family} (one of {', '.join(sorted(known))})")
    if a.variants is not None and a.baseline != "current" and a.baseline not in a.variants:
        sys.exit(f"error: --baseline {a.baseline} is not among --variants")
    jobs = [j for p in a.packs for j in jobs_for(Path(p), a.seeds, a.family, a.variants)]
    rows: list[dict] = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.workers) as pool:
        for i, r in enumerate(pool.map(_fit, jobs), 1):
            rows += r
            print(f"[{i}/{len(jobs)} {time.perf_counter() - t0:5.0f} s] {r[0]['pack']} seed {r[0]['seed']} "
                  f"{r[0]['variant']}: " + ", ".join(f"{x['kernel']} {x['gmae_pct']:.2f}" for x in r), flush=True)
    df = with_unpooled(pd.DataFrame(rows))
    out = Path(a.out or ROOT / "experiments" / "results" / f"pooled_fit_{a.family}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out.with_suffix(".csv"), index=False)
    command = (f"python experiments/pooled_fit.py --family {a.family} --packs "
               + " ".join(repo_relative(p) for p in a.packs) + " --seeds " + " ".join(map(str, a.seeds))
               + (" --variants " + " ".join(a.variants) if a.variants else "")
               + (f" --baseline {a.baseline}" if a.baseline != "current" else "")
               + (f" --decide {' '.join(map(str, a.decide))}" if a.decide != [1, 2, 3] else "")
               + (f" --out {repo_relative(out)}" if a.out else ""))
    out.write_text(markdown(df, a.family, a.decide, command, a.baseline))
    print(out.read_text())


if __name__ == "__main__":
    main()
