"""Regenerate ``predictor/sources/synth/data/dlrm_reuse_profiles.json`` from Meta's locality stats.

Input: ``../shared/data/dlrm_locality/{2021,2022}_locality_stats.txt`` (unmodified copies of
facebookresearch/dlrm_datasets ``embedding_bag/{2021,2022}/locality_stats.txt``). Output: the
17-bin histograms of every block, exactly as printed (3 decimals; loaders renormalise), plus the
batch size and lookup totals needed to rescale them.

Usage::

    python experiments/derive_reuse_profiles.py [--src DIR] [--out FILE] [--check]

``--check`` compares against the existing file instead of writing, exit status 1 on a difference.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from predictor.sources.synth.dlrm_reuse import RF_BIN_LABELS, parse_locality_stats

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SRC = REPO.parent / "shared" / "data" / "dlrm_locality"
DEFAULT_OUT = REPO / "predictor" / "workloads" / "data" / "dlrm_reuse_profiles.json"
YEARS = (2021, 2022)


def derive(src: Path) -> dict:
    """Build the JSON document from the locality-stats files under ``src``."""
    datasets: dict[str, dict] = {}
    for year in YEARS:
        path = src / f"{year}_locality_stats.txt"
        blocks = parse_locality_stats(path)
        n_tables = {int(m.group(1)) for b in blocks if (m := re.search(r"_t(\d+)_", b.file))}
        if len(n_tables) != 1:
            raise ValueError(
                f"{path}: cannot tell the table count from file names {[b.file for b in blocks]}"
            )
        datasets[str(year)] = {
            "source_file": f"embedding_bag/{year}/locality_stats.txt",
            "n_tables": n_tables.pop(),
            "blocks": [
                {
                    "file": b.file,
                    "batch_size": b.batch_size,
                    "avg_indices": b.avg_indices,
                    "avg_unique_cols": b.avg_unique_cols,
                    "index_ratio": list(b.index_ratio),
                    "col_histogram": list(b.col_histogram),
                }
                for b in blocks
            ],
        }
    return {
        "source": (
            "facebookresearch/dlrm_datasets embedding_bag/*/locality_stats.txt "
            "(embedding_bag/2021/locality_stats.txt, embedding_bag/2022/locality_stats.txt; "
            "MIT license); derived by experiments/derive_reuse_profiles.py"
        ),
        "bins": list(RF_BIN_LABELS),
        "description": (
            "Per dataset file (block): 'index_ratio' = fraction of lookups whose row is accessed a "
            "number of times in each bin within the batch ('Ratio of index distribution at different "
            "column sizes'); 'col_histogram' = fraction of accessed rows per bin ('Histogram of col "
            "sizes'). Values as printed (3 decimals); normalise before use. avg_indices: lookups in "
            "the batch over all tables; batch_size: samples."
        ),
        "datasets": datasets,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    doc = derive(args.src)
    text = json.dumps(doc, indent=1) + "\n"
    if args.check:
        same = args.out.exists() and json.loads(args.out.read_text()) == doc
        print(f"{args.out}: {'up to date' if same else 'DIFFERS'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    n = {y: len(d["blocks"]) for y, d in doc["datasets"].items()}
    print(f"wrote {args.out} ({n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
