"""Embedding-bag models fitted from stored calibration data, scored on a real task's tables (no device needed).

A pack's held-out error is measured on its own grid's samples; a DLRM step needs the model on the
task's tables. ``experiments/embedding_tables_cpu.py`` times the e2e DLRM task's 29 tables at each batch
the way the calibration times its samples and stores every table's forward and backward seconds. This
script fits the embedding models of stored packs again (the calibration's own fit,
:func:`predictor.timing.calibrate._fit_all`, for several seeds and :class:`~predictor.timing.calibration.base.ModelSpec`
variants) and scores them against those per-table timings: the sum over tables (what a step adds up)
and the GMAE over tables, per batch.

    python experiments/embedding_generalisation_cpu.py \\
        --packs benchmarks/results/data/packs/cpu-nb18x2 benchmarks/results/data/packs/cpu-emb-nb18 \\
        --tables benchmarks/results/embedding_tables_cpu_s18.json

writes ``experiments/results/embedding_generalisation_cpu.md`` (about 40 s per pack, variant and seed).
The packs should be calibrated with the protocol the tables were timed with (manifest
``embedding_warmup``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import fail, repo_relative  # noqa: E402
from experiments.dlrm_gloo import predicted_embedding_seconds  # noqa: E402
from experiments.e2e_cpu import dlrm_job, dlrm_spec_for, dlrm_tables  # noqa: E402
from experiments.kernel_model_variants import _specs  # noqa: E402
from predictor.metrics import geomean_abs_pct_error  # noqa: E402
from predictor.timing.calibrate import _fit_all  # noqa: E402
from predictor.timing.calibration.base import ModelSpec  # noqa: E402
from predictor.timing.kernels import analytic_models  # noqa: E402
from predictor.timing.kernels.embedding import RF_COLUMNS  # noqa: E402
from predictor.timing.kernels.timing import ModelTiming  # noqa: E402
from predictor.timing.platforms.assets import AssetPackError, load_asset_pack  # noqa: E402

#: (label, spec -> variant spec); applied to both embedding kernels
VARIANTS: list[tuple[str, Callable[[ModelSpec], ModelSpec] | None]] = [
    ("current", None),
    ("+ the 17 reuse bins (Lin et al. 2024)", lambda s: dataclasses.replace(s, features=(*s.features, *RF_COLUMNS))),
    ("B, E, L, D only", lambda s: dataclasses.replace(s, features=("batch", "rows", "pooling", "dim"))),
    ("derived sizes + D, B", lambda s: dataclasses.replace(
        s, features=("lookups", "distinct_rows", "distinct_bytes", "table_bytes", "dim", "batch"))),
]
KINDS = ("embedding_bag_fwd", "embedding_bag_bwd")


def run(packs: list[Path], tables_json: Path, seeds: list[int], log=print) -> pd.DataFrame:
    measured = json.loads(tables_json.read_text())["batches"]
    specs_by_batch = {}
    for b in sorted(int(k) for k in measured):
        t = dlrm_tables(b)
        specs_by_batch[b] = dlrm_spec_for(dlrm_job(t, b, 1, 1, 0, 10), t)
    rows = []
    for path in packs:
        pack = load_asset_pack(path, allow_unfitted=True)
        frame = pd.read_csv(pack.path / "data" / "embedding_bag.csv")
        base = [(f, s) for f, s in _specs(pack.manifest, ["embedding_bag"]) if s.kernel in KINDS]
        for label, make in VARIANTS:
            for seed in seeds:
                specs = [(f, make(s) if make else s) for f, s in base]
                models, table = _fit_all({"embedding_bag": frame}, specs, "quick", seed, pack.platform,
                                         log=lambda _s: None, scale=float(pack.manifest.get("scale") or 1.0))
                timing = ModelTiming(pack.platform, models=[*models.values(), *analytic_models()])
                held = {r["kernel"]: r["gmae_pct"] for r in table}
                for b, spec in specs_by_batch.items():
                    pred = dict(zip(KINDS, predicted_embedding_seconds(timing, spec), strict=True))
                    for kind in KINDS:
                        m = np.asarray(measured[str(b)][f"{kind[-3:]}_s"])
                        p = pred[kind]
                        rows.append({"pack": path.name, "variant": label, "seed": seed, "batch": b, "kernel": kind,
                                     "heldout_gmae_pct": held[kind], "sum_err_pct": (p.sum() / m.sum() - 1) * 100,
                                     "tables_gmae_pct": geomean_abs_pct_error(p, m)})
                log(f"{path.name:<14} {label:<40} seed {seed}: " + "  ".join(
                    f"b{r['batch']} {r['kernel'][-3:]} {r['sum_err_pct']:+.1f}%" for r in rows[-2 * len(specs_by_batch):]))
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame, command: str, measured_at: str) -> str:
    lines = ["# Embedding-bag models on a real task's tables", "",
             f"Tables timed {measured_at} (`experiments/embedding_tables_cpu.py`); models refitted from stored data. "
             f"Reproduce: `{command}`", "",
             "`sum` = predicted / measured sum over the 29 tables - 1 (what a step adds up); `tables` = GMAE over "
             "the tables; `held-out` = the fit's own held-out GMAE on its grid. Mean over seeds.", ""]
    g = df.groupby(["pack", "variant", "kernel", "batch"], sort=False).mean(numeric_only=True).reset_index()
    for (pack, kernel), part in g.groupby(["pack", "kernel"], sort=False):
        batches = sorted(part["batch"].unique())
        lines += [f"## {pack}, {kernel}", "",
                  "| variant | held-out % | " + " | ".join(f"b{b} sum % | b{b} tables %" for b in batches) + " |",
                  "|---|---:|" + "---:|---:|" * len(batches)]
        for variant, v in part.groupby("variant", sort=False):
            cells = []
            for b in batches:
                x = v[v.batch == b].iloc[0]
                cells += [f"{x.sum_err_pct:+.1f}", f"{x.tables_gmae_pct:.1f}"]
            lines.append(f"| {variant} | {v.heldout_gmae_pct.iloc[0]:.1f} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", nargs="+", required=True, help="packs that store embedding_bag benchmark data")
    ap.add_argument("--tables", default=str(ROOT / "benchmarks" / "results" / "embedding_tables_cpu_s18.json"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "embedding_generalisation_cpu.md"))
    a = ap.parse_args()
    for p in a.packs:  # bad input: one line and exit 2 before any fitting
        try:
            pack = load_asset_pack(p, allow_unfitted=True)
        except AssetPackError as exc:
            fail(f"--packs {p}: {exc}")
        if not (pack.path / "data" / "embedding_bag.csv").is_file():
            fail(f"--packs {p}: the pack stores no embedding_bag benchmark data (data/embedding_bag.csv)")
    try:
        json.loads(Path(a.tables).read_text())["batches"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        fail(f"--tables {a.tables}: not a results file of experiments/embedding_tables_cpu.py ({exc!r})")
    df = run([Path(p) for p in a.packs], Path(a.tables), a.seeds)
    rel = [repo_relative(p) for p in a.packs]
    command = (f"python experiments/embedding_generalisation_cpu.py --packs {' '.join(rel)} --seeds "
               f"{' '.join(map(str, a.seeds))}")
    measured_at = json.loads(Path(a.tables).read_text())["meta"]["measured_at"]
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(df.to_dict(orient="records"), indent=1))
    out.write_text(markdown(df, command, measured_at))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
