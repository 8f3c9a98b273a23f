"""Held-out error of kernel-model variants, refitted from stored calibration data (no device needed).

Each variant changes one kernel's :class:`~predictor.timing.calibration.base.ModelSpec` (method, features,
optional features) and is fitted by the code ``tuner calibrate`` runs (:func:`predictor.timing.calibrate._fit_all`:
same 80/20 split, same MLP grid and ensemble, same prediction path), on the stored benchmark data of
several packs, so a model change is judged on timings no one re-measured for it. The ``current``
variant is the spec the benchmark declares today.

    python experiments/kernel_model_variants.py \\
        --packs benchmarks/results/data/packs/cpu-allrounds16 benchmarks/results/data/packs/cpu-allrounds16x2

writes ``experiments/results/kernel_model_variants.md`` and its rows as ``.csv`` (10-20 s per pack, seed and
variant of an MLP kernel on the 2-core VM). ``--seeds 1 2 3`` fits every variant once per seed, each another
held-out split and initialisation, and reports the mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import predictor.timing.calibrate as calibrate_mod  # noqa: E402
from experiments.common import repo_relative  # noqa: E402
from predictor.timing.calibrate import make_benchmarks  # noqa: E402
from predictor.timing.calibration.base import BenchContext, ModelSpec  # noqa: E402
from predictor.timing.calibration.timing import Timer  # noqa: E402
from predictor.timing.kernels.learned import CONV_ALIGN_FEATURES  # noqa: E402
from predictor.timing.platforms.assets import load_asset_pack  # noqa: E402
from predictor.timing.platforms.cpu_local import fp32_lanes  # noqa: E402

Variant = tuple[str, str, Callable[[ModelSpec], ModelSpec]]
#: (kernel, label, benchmark table -> table with another ``seconds``): the same model fitted to, and
#: judged against, another estimate of each sample's time (packs that store the column only)
Estimator = tuple[str, str, str]

ESTIMATORS: list[Estimator] = [
    *[(f"{k}/w2", "mean over passes (mean_s)", "mean_s") for k in ("all_reduce", "all_to_all", "all_gather",
                                                                    "reduce_scatter")],
    *[(f"{k}/w2", "fastest pass (median_s)", "median_s") for k in ("all_reduce", "all_to_all", "all_gather",
                                                                   "reduce_scatter")],
]


def _no_align(spec: ModelSpec) -> ModelSpec:
    """``spec`` without the convolution channel-alignment inputs (:data:`CONV_ALIGN_FEATURES`)."""
    return dataclasses.replace(spec, features=tuple(f for f in spec.features if f not in CONV_ALIGN_FEATURES),
                               raw_features=tuple(f for f in spec.raw_features if f not in CONV_ALIGN_FEATURES))


def _align16(spec: ModelSpec, optional: bool) -> ModelSpec:
    """``spec`` with the 16-lane channel-alignment pair in place of any it had, plain or as an optional group."""
    base, pair = _no_align(spec), ("cout_al16", "cin_al16")
    return dataclasses.replace(base, features=(*base.features, *pair), raw_features=(*base.raw_features, *pair),
                               optional_features=pair if optional else base.optional_features)


#: (kernel, label, spec -> variant spec); "current" is added for every kernel named here
VARIANTS: list[Variant] = [
    ("concat", "roofline on bytes (before session 17)", lambda s: dataclasses.replace(s, method="roofline", features=(),
                                                                                      work=(), fill="")),
    ("concat", "MLP without parts", lambda s: dataclasses.replace(s, features=("elements", "batch"),
                                                                  work=("elements",))),
    ("transpose", "+ optional m_al16, n_al16", lambda s: dataclasses.replace(
        s, features=(*s.features, "m_al16", "n_al16"), optional_features=("m_al16", "n_al16"))),
    *[(k, "+ optional n_al16", lambda s: dataclasses.replace(s, features=(*s.features, "n_al16"),
                                                               optional_features=("n_al16",)))
      for k in ("softmax", "softmax_bwd", "log_softmax_bwd", "layer_norm")],
    *[(k, "MLP on elements", lambda s: dataclasses.replace(s, method="mlp", features=("elements", "dtype_bytes"),
                                                             work=("elements",)))
      for k in ("relu", "gelu", "tanh", "add", "mul", "relu_bwd", "gelu_bwd", "tanh_bwd", "memcpy")],
    *[(f"{op}/{dt}", "+ gemm_bytes", lambda s: dataclasses.replace(s, features=(*s.features, "gemm_bytes")))
      for op in ("addmm", "mm", "bmm") for dt in ("fp32", "bf16")],
    *[(f"bmm/{dt}", "+ bmm_naive", lambda s: dataclasses.replace(
        s, features=(*s.features, "bmm_naive"), raw_features=(*s.raw_features, "bmm_naive"))) for dt in ("fp32", "bf16")],
    *[(k, "+ short_rows", lambda s: dataclasses.replace(s, features=(*s.features, "short_rows"),
                                                          raw_features=(*s.raw_features, "short_rows")))
      for k in ("softmax", "softmax_bwd", "log_softmax_bwd")],
    ("conv2d/fp32", "+ conv_bytes", lambda s: dataclasses.replace(s, features=(*s.features, "conv_bytes"))),
    # session 40: the channel-alignment inputs fixed at 16 lanes on every CPU, as an optional group (A) or plain (B)
    ("conv2d/fp32", "+ optional cout_al16, cin_al16", lambda s: _align16(s, optional=True)),
    ("conv2d/fp32", "+ cout_al16, cin_al16", lambda s: _align16(s, optional=False)),
    ("conv2d/fp32", "without cout_alV, cin_alV (before session 40)", _no_align),
    ("conv2d/fp32", "without conv_native (before session 19)", lambda s: dataclasses.replace(
        _no_align(s), features=tuple(f for f in s.features if f not in ("conv_native", *CONV_ALIGN_FEATURES)),
        raw_features=())),
]


def _specs(pack_manifest: dict, families: list[str]) -> list[tuple[str, ModelSpec]]:
    ctx = BenchContext(device=torch.device("cpu"), level=pack_manifest.get("level", "quick"),
                       rng=np.random.default_rng(0), timer=Timer(torch.device("cpu")),
                       threads=int(pack_manifest.get("threads") or 1),
                       simd_lanes=fp32_lanes((pack_manifest.get("cpu") or {}).get("torch_capability")))
    return [(b.name, s) for b in make_benchmarks(int(pack_manifest.get("world_size", 1)), families)
            for s in b.specs(ctx)]


def fit_spec(pack, family: str, frame: pd.DataFrame, spec: ModelSpec,
             train: Callable[[np.ndarray], np.ndarray] | None = None, seed: int | None = None,
             siblings: tuple[ModelSpec, ...] = ()) -> tuple[dict, dict | None]:
    """``spec`` fitted on ``frame`` (one family's benchmark data) by the calibration's own code
    (:func:`predictor.timing.calibrate._fit_all`) with the pack's level, seed and scale: (the fitted models
    by key, the kernel's error-table row or None when it was not fitted). ``train`` maps the spec's
    kernel's training indices (of the calibration's own split) to the ones to fit on; the held-out
    indices stay as they are. ``seed``: another held-out split and initialisation than the pack's own.
    ``siblings``: the other specs of ``spec``'s pool (``ModelSpec.pool``), fitted with it as one net as the
    calibration does; without them a pooled spec is fitted on its own kernel's samples alone."""
    m = pack.manifest
    split = calibrate_mod._split
    if train is not None:
        def narrowed(n: int, seed: int, name: str):
            tr, te = split(n, seed, name)
            return (train(tr) if name == spec.kernel else tr), te
        calibrate_mod._split = narrowed
    try:
        models, table = calibrate_mod._fit_all({family: frame}, [(family, spec), *((family, x) for x in siblings)],
                                               m.get("level", "quick"),
                                               int(m.get("seed", 0)) if seed is None else seed, pack.platform,
                                               log=lambda _s: None,
                                               scale=float(m.get("scale") or 1.0))
    finally:
        calibrate_mod._split = split
    return models, next((r for r in table if r["kernel"] == spec.kernel), None)


def run(packs: list[Path], kernels: set[str] | None, log: Callable[[str], None] = print,
        seeds: list[int] | None = None, labels: set[str] | None = None) -> pd.DataFrame:
    """One row per (pack, kernel, variant): held-out GMAE / MAPE / max (percent) and the fitted model;
    with ``seeds``, one row per seed as well (column ``seed``): each seed another 80/20 split of the
    pack's samples and other initial weights, so a variant is judged over several held-out sets
    (one fit's GMAE moves by about a point with its initialisation alone)."""
    rows: list[dict] = []
    for path in packs:
        pack = load_asset_pack(path, allow_unfitted=True)
        m = pack.manifest
        data = {f.stem: pd.read_csv(f) for f in sorted((pack.path / "data").glob("*.csv"))}
        specs = {s.kernel: (fam, s) for fam, s in _specs(m, list(data))}
        names = [k for k in dict.fromkeys([*(k for k, _, _ in VARIANTS), *(k for k, _, _ in ESTIMATORS)])
                 if kernels is None or k in kernels]
        for kernel in names:
            if kernel not in specs:
                continue
            fam, spec = specs[kernel]
            todo = [("current", spec, data[fam])] + [(label, make(spec), data[fam])
                                                     for k, label, make in VARIANTS if k == kernel
                                                     and (labels is None or label in labels)]
            todo += [(label, spec, data[fam].assign(seconds=data[fam][col]))
                     for k, label, col in ESTIMATORS if k == kernel and col in data[fam]]
            for seed in seeds or [int(m.get("seed", 0))]:
                for label, s, frame in todo:
                    t0 = time.perf_counter()
                    # ``current`` is fitted as the calibration fits it: with its pool's other kernels
                    siblings = tuple(x for f, x in specs.values() if label == "current" and spec.pool
                                     and f == fam and x.pool == spec.pool and x.kernel != kernel)
                    _, r = fit_spec(pack, fam, frame, s, seed=seed, siblings=siblings)
                    if r is None:
                        continue
                    rows.append({"pack": pack.name, "kernel": kernel, "variant": label, "samples": r["samples"],
                                 "seed": seed,
                                 "gmae_pct": r["gmae_pct"], "mape_pct": r["mape_pct"], "max_pct": r["max_pct"],
                                 "model": r["model"]})
                    log(f"{pack.name:<22} {kernel:<16} {label:<40} "
                        f"{f'seed {seed} ' if seeds else ''}GMAE {r['gmae_pct']:6.2f} %  "
                        f"({time.perf_counter() - t0:.0f} s)")
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame, command: str) -> str:
    lines = [
        "# Kernel-model variants on stored calibration data",
        "",
        "Each variant is fitted by the calibration's own code (`predictor.timing.calibrate._fit_all`: the pack's "
        "80/20 split, MLP grid, the level's ensemble, prediction path) on the benchmark data a pack stores; the "
        "numbers are held-out errors on the same 20 % as the pack's own table. `current` is the model the "
        "benchmark declares now; an estimator variant fits the same model to another estimate of each sample's "
        "time and is judged against that estimate on the held-out samples. MLP ensembles start from fixed seeds "
        "but train with a time budget, so a "
        "rerun may move an MLP's GMAE by a few tenths of a point.",
        "",
        f"Reproduce: `{command}`",
        "",
    ]
    seeds = sorted(df["seed"].unique()) if "seed" in df else []
    if len(seeds) > 1:
        lines += [f"Each cell: the mean over seeds {', '.join(str(x) for x in seeds)} (each seed another 80/20 split "
                  "and other initial weights), the seeds' own figures in brackets; `mean`: over the packs.", ""]
    for kernel, part in df.groupby("kernel", sort=False):
        packs = list(part["pack"].unique())
        lines += [f"## {kernel}", "", "| variant | " + " | ".join(packs) + " | mean |",
                  "|---|" + "---:|" * (len(packs) + 1)]
        for variant, v in part.groupby("variant", sort=False):
            cells, means = [], []
            for p in packs:
                g = v[v.pack == p].gmae_pct
                if not len(g):
                    cells.append("")
                    continue
                means.append(float(g.mean()))
                cells.append(f"{g.mean():.2f}" + (" (" + " / ".join(f"{x:.2f}" for x in g) + ")" if len(g) > 1 else ""))
            lines.append(f"| {variant} | " + " | ".join(cells) + f" | {np.mean(means):.2f} |")
        lines += ["", "GMAE %, held out. Samples per pack: "
                  + ", ".join(f"{p} {int(part[part.pack == p].samples.iloc[0])}" for p in packs), ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", nargs="+", required=True, help="asset packs that store benchmark data")
    ap.add_argument("--kernels", nargs="*", help="only these kernels (default: every kernel with variants)")
    ap.add_argument("--seeds", type=int, nargs="*",
                    help="fit every variant once per seed given (each another held-out split and initialisation) "
                         "instead of once with the pack's own seed")
    ap.add_argument("--labels", nargs="*", help="only the variants with these labels (and `current`)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "kernel_model_variants.md"))
    a = ap.parse_args()
    df = run([Path(p) for p in a.packs], set(a.kernels) if a.kernels else None, seeds=a.seeds,
             labels=set(a.labels) if a.labels else None)
    command = "python experiments/kernel_model_variants.py --packs " + " ".join(
        repo_relative(p) for p in a.packs)
    if a.kernels:
        command += " --kernels " + " ".join(a.kernels)
    if a.seeds:
        command += " --seeds " + " ".join(str(x) for x in a.seeds)
    if a.labels:
        command += " --labels " + " ".join(f'"{x}"' for x in a.labels)
    if a.out != ap.get_default("out"):
        command += f" --out {repo_relative(a.out)}"
    Path(a.out).write_text(markdown(df, command))
    df.to_csv(Path(a.out).with_suffix(".csv"), index=False)
    print(f"wrote {a.out} and its rows as {Path(a.out).with_suffix('.csv').name}")


if __name__ == "__main__":
    main()
