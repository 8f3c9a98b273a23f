"""Add the ``parts`` column to the concat rows of asset packs benchmarked before it was recorded.

The concat model's features are ``elements, batch, parts`` (inputs of the concatenation); packs
measured before session 17 stored ``elements`` and ``batch`` only. The shapes of a pack's grids
follow from its seed, level and ``--scale`` (the same draws :meth:`DataMovementBenchmark.cases`
makes), so the number of inputs of each sample is re-derived from them and written only when every
sample's ``elements`` and ``batch`` match the re-derived case; otherwise the pack is left alone.

    python experiments/add_concat_parts.py assets/cpu-local benchmarks/results/data/packs/*
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predictor.timing.calibrate import make_benchmarks  # noqa: E402
from predictor.timing.calibration.base import log_uniform_int  # noqa: E402
from predictor.timing.calibration.data_movement import concat_draws  # noqa: E402


def concat_cases(seed: int, level: str, scale: float, world_size: int,
                 cuda: bool = False) -> dict[int, tuple[int, int, int]]:
    """case index -> (elements, batch, parts) of the concat rows of the data-movement grid."""
    rng = np.random.default_rng(seed)
    benches = make_benchmarks(world_size, None)
    seeds = {b.name: int(rng.integers(2**62)) for b in benches}
    r = np.random.default_rng(seeds["data_movement"])
    base = {"tiny": 8, "quick": 150, "full": 500}[level]
    count = max(1, round(base * (scale if level != "tiny" else 1.0)))
    # a GPU's --quick draws the full level's shape ranges (BenchContext.range_level)
    cap = {"tiny": 2**18, "quick": 2**24, "full": 2**27}["full" if cuda and level == "quick" else level]
    log_uniform_int(r, 2**6, cap, count)  # the memcpy sizes come first
    out: dict[int, tuple[int, int, int]] = {}
    for i, (b, widths) in enumerate(concat_draws(r, count, cap)):
        out[count + i] = (b * sum(widths), b, len(widths))
    return out


def migrate(pack: Path) -> str:
    csv = pack / "data" / "data_movement.csv"
    if not csv.exists():
        return "no data_movement.csv"
    d = pd.read_csv(csv)
    if "parts" in d:
        return "already has parts"
    m = json.loads((pack / "manifest.json").read_text())
    cat = d["kernel"] == "concat"
    rows = d[cat]
    for world in (int(m.get("world_size", 1)), 1, 2, 4):
        cases = concat_cases(int(m.get("seed", 0)), m.get("level", "quick"), float(m.get("scale") or 1.0), world,
                             str(m.get("device", "cpu")).startswith("cuda"))
        got = [cases.get(int(c)) for c in rows["case"]]
        if all(g is not None and g[0] == e and g[1] == b
               for g, e, b in zip(got, rows["elements"], rows["batch"], strict=True)):
            d["parts"] = np.nan
            d.loc[cat, "parts"] = [g[2] for g in got]
            d.to_csv(csv, index=False, float_format="%.6g")  # as the pack writer does
            return f"parts added to {int(cat.sum())} concat rows"
    return "NOT migrated: the re-derived grid does not match the stored samples"


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {migrate(Path(arg))}")
