"""Batched transposes at power-of-two dimensions: would stride-alignment features and power-of-two
shapes in the grid help the transpose model? (stored calibration data; ``--probe-rounds`` measures)

``x.transpose(1, 2).contiguous()`` of a ``batch x m x n`` tensor reads ``m`` input rows
``n * dtype_bytes`` bytes apart for each output row. When that stride holds a large power of two the
rows map to few cache sets, and on this VM such shapes run up to ~2x slower than ``n +- 1``; model
dimensions are mostly powers of two, which the calibration's log-uniform grid almost never draws.
Session 21 tried two things, tested here and not adopted:

* a grid that appends a third more transposes with ``n`` a power of two (:func:`aligned_transpose_draws`;
  the pack ``benchmarks/results/data/packs/cpu-dm21x4`` was measured with it: its cases from
  ``3 x 150 x scale`` on are those), and
* hypothesis features, computed here as columns: ``l1_conflict`` / ``l2_conflict``
  (:func:`cache_conflict`: ``log2`` of the rows' cache lines over what the sets they map to hold,
  L1d 4 KiB x 8 ways, L2 64 KiB x 8 ways) and ``stride_alias`` (:func:`stride_alias`: the stride's
  power-of-two factor above 512 bytes, ``log2``, capped at 4 KiB).

Each variant is fitted by the calibration's own code (:func:`predictor.timing.calibrate._fit_all`, the pack's
80/20 split) and scored on the held-out samples split three ways: shapes whose lines conflict,
other power-of-two ``n``, the rest. ``--compare`` adds fitted packs' own transpose models (measured
in another window, they carry its drift too). ``--probe-rounds R`` also times, as the calibration
does, transposes of ~1 Mi elements with ``n`` = 128..2048 (powers of two) and ``n +- 1``, ``m`` =
16..1024, and scores every model on them: a model that knows the conflicts predicts the power-of-two
shapes as well as their neighbours and their measured slowdown.

    flock /tmp/tuner-measure.lock python experiments/transpose_alignment_cpu.py \\
        --packs benchmarks/results/data/packs/cpu-dm21x4 benchmarks/results/data/packs/cpu-dm20x8 \\
        --compare assets/cpu-local --probe-rounds 5
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.kernel_model_variants import _specs, fit_spec  # noqa: E402
from predictor.graph import PARAM_COLUMNS  # noqa: E402
from predictor.metrics import geomean_abs_pct_error  # noqa: E402
from predictor.timing.calibrate import _split  # noqa: E402
from predictor.timing.calibration.base import log_uniform_int  # noqa: E402
from predictor.timing.kernels.base import TaskView  # noqa: E402
from predictor.timing.platforms.assets import AssetPackError, load_asset_pack  # noqa: E402

SUBSETS = ("all", "conflicting", "other power-of-two n", "rest")
CONFLICT = ("l1_conflict", "l2_conflict")
GEOMETRY = {"l1_conflict": (4096, 8), "l2_conflict": (65536, 8)}  # (sets x line bytes, ways)
PROBE_N = (128, 256, 512, 1024, 2048)
PROBE_M = (16, 64, 256, 1024)
PROBE_ELEMENTS = 2**20


def aligned_transpose_draws(rng: np.random.Generator, count: int, cap: int) -> list[tuple[int, int, int]]:
    """``count`` transposes ``(batch, m, n)``: ``n`` a power of two in 4..4096, ``m`` a power of two in
    2..1024 or log-uniform there (even odds), ``batch`` log-uniform 1..4096, elements in ``[64, cap]``
    (the grid extension ``cpu-dm21x4`` was measured with)."""
    out: list[tuple[int, int, int]] = []
    while len(out) < count:
        b = int(log_uniform_int(rng, 1, 4096, 1)[0])
        n = 2 ** int(rng.integers(2, 13))
        m = 2 ** int(rng.integers(1, 11)) if rng.random() < 0.5 else int(log_uniform_int(rng, 2, 1024, 1)[0])
        if 64 <= b * m * n <= cap:
            out.append((b, m, n))
    return out


def _alias(n: np.ndarray, dtype_bytes: np.ndarray) -> np.ndarray:
    stride = np.nan_to_num(np.asarray(n, dtype=np.float64) * np.asarray(dtype_bytes, dtype=np.float64),
                           nan=0.0).astype(np.int64)
    return np.where(stride > 0, stride & -stride, 1)  # largest power-of-two factor of the row stride (bytes)


def cache_conflict(m: np.ndarray, n: np.ndarray, dtype_bytes: np.ndarray, span: int, ways: int,
                   line: int = 64) -> np.ndarray:
    """``log2`` of how many times the ``m`` lines a transpose keeps live (one per input row) exceed what
    the sets they map to hold (``ways`` lines per set, ``span`` = sets x ``line`` bytes); 0 where they fit."""
    m = np.nan_to_num(np.asarray(m, dtype=np.float64), nan=1.0)
    capacity = ways * span / np.maximum(np.minimum(_alias(n, dtype_bytes), span), line)
    return np.log2(np.maximum(m / capacity, 1.0))


def stride_alias(n: np.ndarray, dtype_bytes: np.ndarray) -> np.ndarray:
    """``log2`` of the row stride's power-of-two factor above 512 bytes, capped at 4 KiB (0..3)."""
    return np.maximum(0.0, np.log2(np.minimum(_alias(n, dtype_bytes), 4096)) - 9.0)


def with_hypotheses(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the hypothesis columns (:data:`CONFLICT`, ``stride_alias``) added."""
    dt = frame["dtype_bytes"].fillna(4.0).to_numpy(dtype=np.float64) if "dtype_bytes" in frame \
        else np.full(len(frame), 4.0)
    m, n = frame["m"].to_numpy(dtype=np.float64), frame["n"].to_numpy(dtype=np.float64)
    cols = {f: cache_conflict(m, n, dt, *GEOMETRY[f]) for f in CONFLICT}
    return frame.assign(**cols, stride_alias=stride_alias(n, dt))


def _view(frame: pd.DataFrame) -> TaskView:
    keep = set(PARAM_COLUMNS) | {"flops", "bytes", *CONFLICT, "stride_alias"}
    return TaskView.from_columns("transpose", **{c: frame[c].to_numpy(dtype=np.float64)
                                                 for c in frame.columns if c in keep})


def subset_masks(test: pd.DataFrame) -> dict[str, np.ndarray]:
    """Boolean masks of :data:`SUBSETS` over held-out rows that carry the hypothesis columns."""
    conflict = test[list(CONFLICT)].to_numpy().max(axis=1) > 0
    n = test["n"].to_numpy(dtype=np.int64)
    pow2 = (n & (n - 1)) == 0
    return {"all": np.ones(len(test), dtype=bool), "conflicting": conflict,
            "other power-of-two n": pow2 & ~conflict, "rest": ~pow2 & ~conflict}


def score(pred: np.ndarray, actual: np.ndarray, masks: dict[str, np.ndarray]) -> dict[str, tuple[int, float, float]]:
    """Per subset: (samples, GMAE %, median signed error %)."""
    return {name: (int(mk.sum()), geomean_abs_pct_error(pred[mk], actual[mk]),
                   float(np.median(pred[mk] / actual[mk] - 1.0) * 100.0))
            for name, mk in masks.items() if mk.any()}


def probe_shapes() -> pd.DataFrame:
    """For each ``m`` and power-of-two ``n``: ``n`` and ``n +- 1`` at ~:data:`PROBE_ELEMENTS` elements."""
    rows = []
    for m in PROBE_M:
        for n0 in PROBE_N:
            b = max(1, PROBE_ELEMENTS // (m * n0))
            for n in (n0 - 1, n0, n0 + 1):
                rows.append({"kernel": "transpose", "kind": "transpose", "batch": b, "m": m, "n": n, "pow2": n == n0,
                             "base": n0, "elements": b * m * n, "dtype_bytes": 4, "bytes": 8.0 * b * m * n})
    return with_hypotheses(pd.DataFrame(rows))


def measure_probe(shapes: pd.DataFrame, rounds: int, llc: float, log: Callable[[str], None] = print) -> np.ndarray:
    """Median seconds per probe shape over ``rounds`` shuffled rounds, data cold as the calibration
    times data movement (:func:`benchmarks.heldout_retime_cpu.retime`)."""
    import torch

    from benchmarks.heldout_retime_cpu import retime
    from predictor.timing.calibration.data_movement import _transpose

    cases = [{"build": _transpose(int(r.batch), int(r.m), int(r.n), torch.device("cpu")), "cold": True}
             for r in shapes.itertuples()]
    return np.median(retime(cases, rounds, llc, log=log), axis=1)


def probe_scores(pred: np.ndarray, shapes: pd.DataFrame, measured: np.ndarray) -> dict[str, float]:
    """GMAE % on the power-of-two shapes and on their neighbours; the power-of-two shape's time over
    its neighbours' mean, median and max over the (m, n) pairs, predicted and measured."""
    pow2 = shapes["pow2"].to_numpy(dtype=bool)
    ratio_p, ratio_m = [], []
    for _, g in shapes.groupby(["m", "base"]):
        i = g.index.to_numpy()
        c, nb = i[g["pow2"].to_numpy(dtype=bool)], i[~g["pow2"].to_numpy(dtype=bool)]
        ratio_p.append(pred[c].mean() / pred[nb].mean())
        ratio_m.append(measured[c].mean() / measured[nb].mean())
    return {"pow2_gmae": geomean_abs_pct_error(pred[pow2], measured[pow2]),
            "nb_gmae": geomean_abs_pct_error(pred[~pow2], measured[~pow2]),
            "ratio_pred": float(np.median(ratio_p)), "ratio_meas": float(np.median(ratio_m)),
            "ratio_max_pred": float(np.max(ratio_p)), "ratio_max_meas": float(np.max(ratio_m))}


def _fit(frame: pd.DataFrame, spec, pack, drop_train: np.ndarray | None):
    """The transpose model fitted by the calibration's code; ``drop_train`` (bool per transpose
    sample) leaves those samples out of the training split, the held-out split unchanged."""
    keep = None if drop_train is None else (lambda train: train[~drop_train[train]])
    models, row = fit_spec(pack, "data_movement", frame, spec, train=keep)
    return models["transpose"], (row["model"] if row else "")


def run(packs: list[Path], compare: list[Path], probe_rounds: int = 0,
        log: Callable[[str], None] = print) -> tuple[list[dict], dict]:
    """Per data pack its held-out subsets' scores per model; the probe (empty without rounds)."""
    probe: dict = {}
    if probe_rounds > 0:
        shapes = probe_shapes()
        probe = {"shapes": shapes, "measured": measure_probe(shapes, probe_rounds, 32 * 2**20, log=log),
                 "rounds": probe_rounds, "scores": {}, "view": _view(shapes)}
    fitted = []
    for path in compare:
        pack = load_asset_pack(path)
        model = next((mdl for mdl in pack.models if "transpose" in mdl.kinds), None)
        if model is None:
            raise AssetPackError(f"{path}: no fitted transpose model")
        fitted.append((pack.name, pack, model))
    results = []
    for path in packs:
        pack = load_asset_pack(path, allow_unfitted=True)
        m = pack.manifest
        file = pack.path / "data" / "data_movement.csv"
        if not file.exists():
            raise AssetPackError(f"{path}: no data-movement benchmark data (data/data_movement.csv)")
        frame = with_hypotheses(pd.read_csv(file)) if "m" in pd.read_csv(file, nrows=0) else None
        if frame is None:
            raise AssetPackError(f"{path}: its data-movement data lack the transpose shapes (m, n)")
        spec = next(s for _fam, s in _specs(m, ["data_movement"]) if s.kernel == "transpose")
        sub = frame[frame["kernel"] == "transpose"].reset_index(drop=True)
        _, te = _split(len(sub), int(m.get("seed", 0)), "transpose")
        test = sub.iloc[te]
        masks, actual, view = subset_masks(test), test["seconds"].to_numpy(dtype=np.float64), _view(test)
        first_aligned = 3 * round(150 * float(m.get("scale") or 1.0))  # after memcpy, concat, random transposes
        aligned = sub["case"].to_numpy() >= first_aligned

        def extra(features: tuple[str, ...], _spec=spec):
            return dataclasses.replace(_spec, features=(*_spec.features, *features), raw_features=features)

        variants = {"today's model (MLP on batch, m, n)": (spec, None),
                    "+ l1_conflict, l2_conflict": (extra(CONFLICT), None),
                    "+ l1_conflict, l2_conflict, optional": (dataclasses.replace(
                        extra(CONFLICT), optional_features=CONFLICT), None),
                    "+ stride_alias": (extra(("stride_alias",)), None)}
        if aligned.any():
            variants["today's model, the appended power-of-two shapes left out of training"] = (spec, aligned)
        scores: dict[str, dict] = {}
        notes: dict[str, str] = {}
        for label, (s, drop) in variants.items():
            model, notes[label] = _fit(frame, s, pack, drop)
            scores[label] = score(model.predict(view, pack.platform), actual, masks)
            if probe:
                probe["scores"][f"{pack.name}: {label}"] = probe_scores(
                    model.predict(probe["view"], pack.platform), probe["shapes"], probe["measured"])
            log(f"{pack.name}: {label:<44} " + ", ".join(f"{k} {v[1]:.1f} %" for k, v in scores[label].items()))
        for name, fp, model in fitted:
            scores[name] = score(model.predict(view, fp.platform), actual, masks)
            notes[name] = "the pack's own model"
            if probe and name not in probe["scores"]:
                probe["scores"][name] = probe_scores(model.predict(probe["view"], fp.platform), probe["shapes"],
                                                     probe["measured"])
        results.append({"pack": pack.name, "created": m.get("created", ""), "train": len(sub) - len(te),
                        "aligned": int(aligned.sum()), "scores": scores, "notes": notes})
    return results, probe


def markdown(results: list[dict], command: str, probe: dict | None = None) -> str:
    lines = ["# Batched transposes at power-of-two dimensions (session 21; tried, not adopted)", "",
             "Held-out samples of each pack's transpose benchmark (its own 80/20 split), split into shapes whose "
             "input rows conflict in the cache by the hypothesis (`l1_conflict` or `l2_conflict` > 0), other "
             "power-of-two `n`, and the rest. Cells: samples: GMAE % / median signed error % (prediction over "
             "measurement - 1). Variants fitted by the calibration's own code on the pack's training split; a "
             "fitted pack's own model was measured in another window and carries that window's drift too.", "",
             f"Reproduce: `{command}`", ""]
    for r in results:
        lines += [f"## `{r['pack']}` (measured {r['created']}, {r['train']} training samples, "
                  f"{r['aligned']} of them from the appended power-of-two grid)", "",
                  "| model | " + " | ".join(SUBSETS) + " | fitted |", "|---|" + "---:|" * len(SUBSETS) + "---|"]
        for label, sc in r["scores"].items():
            cells = [f"{sc[k][0]}: {sc[k][1]:.1f} / {sc[k][2]:+.1f}" if k in sc else "" for k in SUBSETS]
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {r['notes'][label]} |")
        lines.append("")
    if probe:
        lines += ["## Probe: power-of-two rows against their neighbours, measured now", "",
                  f"{len(probe['shapes'])} transposes of ~{PROBE_ELEMENTS} elements: m in {list(PROBE_M)}, n in "
                  f"{list(PROBE_N)} and n +- 1, timed data cold as the calibration times them, median of "
                  f"{probe['rounds']} shuffled rounds. Slowdown: the power-of-two shape's time over its two "
                  "neighbours' mean, median (max) over the 20 (m, n) pairs.", "",
                  "| model | GMAE % power-of-two n | GMAE % n +- 1 | slowdown predicted | slowdown measured |",
                  "|---|---:|---:|---:|---:|"]
        for name, s in probe["scores"].items():
            lines.append(f"| {name} | {s['pow2_gmae']:.1f} | {s['nb_gmae']:.1f} | {s['ratio_pred']:.2f} "
                         f"({s['ratio_max_pred']:.2f}) | {s['ratio_meas']:.2f} ({s['ratio_max_meas']:.2f}) |")
        sh = probe["shapes"].assign(ns_per_element=probe["measured"] / probe["shapes"]["elements"] * 1e9)
        lines += ["", "Measured ns per element (n - 1 / n / n + 1):", "",
                  "| m | " + " | ".join(f"n = {n}" for n in PROBE_N) + " |", "|---:|" + "---:|" * len(PROBE_N)]
        for m, g in sh.groupby("m"):
            cells = [" / ".join(f"{v:.2f}" for v in g[g.base == n].sort_values("n").ns_per_element) for n in PROBE_N]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", nargs="+", required=True, help="packs that store data-movement benchmark data")
    ap.add_argument("--compare", nargs="*", default=[], help="fitted packs whose transpose model to score too")
    ap.add_argument("--probe-rounds", type=int, default=0,
                    help="also time power-of-two transposes and their neighbours, this many rounds (measures)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "transpose_alignment_cpu.md"))
    args = ap.parse_args(argv)
    if not args.out.endswith(".md"):
        print(f"error: --out names a markdown file, got {args.out!r}", file=sys.stderr)
        raise SystemExit(2)
    if args.probe_rounds < 0:
        print(f"error: --probe-rounds must be >= 0, got {args.probe_rounds}", file=sys.stderr)
        raise SystemExit(2)
    try:
        results, probe = run([Path(p) for p in args.packs], [Path(p) for p in args.compare], args.probe_rounds)
    except AssetPackError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    command = "python experiments/transpose_alignment_cpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    Path(args.out).write_text(markdown(results, command, probe))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
