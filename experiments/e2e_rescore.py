"""The stored measurement windows of :mod:`experiments.e2e_cpu` and ``--rescore``: asset packs scored on them.

Each measured run of ``experiments/e2e_cpu.py`` (a *window* of the shared machine's state) is appended
to :data:`WINDOWS_FILE` (:func:`archive_window`). :func:`rescore` scores packs on every stored window of
their CPU: per window, pooled over every (window, configuration) pair, against each configuration's
median over the windows, the 2-rank / 1-rank DLRM ratio, and against the machine's pace (GEMM drift)
of each window; :func:`windows_markdown` writes those scores as markdown.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from pathlib import Path

import numpy as np

from experiments.common import REPO, fail, repo_relative
from experiments.dlrm_gloo import LEGACY_BATCH_POOL
from experiments.e2e_models import predict_rows
from predictor.files import atomic_write_text
from predictor.metrics import geomean_abs_pct_error, max_abs_pct_error

#: every full measurement, appended by the measuring mode and re-scored by ``--rescore``
WINDOWS_FILE = REPO / "benchmarks" / "data" / "e2e_cpu_windows.json"


def archive_window(path: Path, meta: dict, rows: list[dict]) -> None:
    """Append a measured run (one *window* of the shared machine's state) to the data set ``path``.

    Windows minutes apart differ by up to ~20 % on this VM, more than the accuracy target, so a pack
    is scored on every stored window, not only the latest (``--rescore``).
    """
    windows = json.loads(path.read_text()) if path.exists() else []
    windows.append({"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "pack_created": meta.get("pack_created"), "threads": meta.get("threads"),
                    "iters": meta.get("iters"), "passes": meta.get("passes"),
                    "allocator": meta.get("allocator", "default"),
                    "batch_pool": meta.get("batch_pool", LEGACY_BATCH_POOL),
                    "gemm_drift": meta.get("gemm_drift"),
                    "cpu": meta.get("cpu"),
                    "rows": [{"model": r["model"], "batch": r["batch"], "ranks": r["ranks"],
                              "measured_s": r["measured_s"], "pass_medians_s": r["pass_medians_s"]} for r in rows]})
    atomic_write_text(path, json.dumps(windows, indent=1))


# ----------------------------------------------------------------------------- scoring the stored windows
def load_windows(path: Path) -> list[dict]:
    """The stored windows; one line and exit 2 on a missing or malformed data set."""
    if not path.exists():
        fail(f"{path}: no stored measurements (run experiments/e2e_cpu.py first)")
    try:
        windows = json.loads(path.read_text())
        for w in windows:
            for r in w["rows"]:
                float(r["measured_s"]), str(r["model"]), int(r["batch"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        fail(f"{path}: not a data set of e2e measurements ({type(exc).__name__}: {exc})")
    if not windows:
        fail(f"{path}: no window stored")
    return windows


def utc_time(text: str, what: str) -> datetime:
    """``text`` as an ISO time, UTC when it names no zone; one line naming ``what`` and exit 2 when it is not one."""
    try:
        t = datetime.fromisoformat(str(text))
    except ValueError:
        fail(f"{what} {text!r}: not an ISO time (e.g. 2026-11-26T11:18)")
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def resolve_pack(spec: str):
    """``(resolved platform, source)`` of a pack name or folder; one line and exit 2 when it does not resolve.
    The resolved platform's ``pack`` (None for a catalog platform) has the manifest."""
    from predictor.timing.kernels.assets import AssetPackError, resolve_platform

    try:
        plat = resolve_platform(spec)
    except (AssetPackError, KeyError, ValueError) as exc:
        fail(f"--platform {spec}: {exc}")
    return plat, plat.source


def windows_of_cpu(windows: list[dict], cpu: dict | None) -> list[dict]:
    """The windows measured on the CPU ``cpu`` (a :func:`~predictor.timing.platforms.cpu_local.cpu_signature`
    record; None: the unrecorded host of the oldest windows, an AVX-512 EPYC): a pack describes one CPU."""
    from predictor.timing.platforms.cpu_local import same_cpu

    return [w for w in windows if same_cpu(w.get("cpu"), cpu)]


def _stats(pairs: list[tuple[float, float]]) -> dict:
    """GMAE, max and median signed error (%) of (predicted, measured) pairs (:mod:`predictor.metrics`)."""
    p, m = [a for a, _ in pairs], [b for _, b in pairs]
    return {"geomean_abs_pct": geomean_abs_pct_error(p, m), "max_abs_pct": max_abs_pct_error(p, m),
            "median_signed_pct": float(np.median((np.asarray(p) / np.asarray(m) - 1.0) * 100.0)), "n": len(pairs)}


def config_medians(pred: dict[tuple[str, int], float], windows: list[dict]) -> dict[tuple[str, int], float]:
    """Each predicted configuration's median measured seconds over ``windows`` (the steadier ground truth)."""
    by_cfg: dict[tuple[str, int], list[float]] = {}
    for w in windows:
        for r in w["rows"]:
            if (key := (r["model"], int(r["batch"]))) in pred:
                by_cfg.setdefault(key, []).append(r["measured_s"])
    return {k: float(np.median(v)) for k, v in by_cfg.items()}


def score(pred: dict[tuple[str, int], float], windows: list[dict]) -> dict:
    """Errors (%) of ``pred`` against each window, pooled, and against the per-configuration median."""
    per, pooled = [], []
    for w in windows:
        pairs = [(pred[key], r["measured_s"]) for r in w["rows"] if (key := (r["model"], int(r["batch"]))) in pred]
        pooled += pairs
        per.append({"measured_at": w["measured_at"], **_stats(pairs)})
    med = config_medians(pred, windows)
    med_errs = {f"{k[0]} {k[1]}": (pred[k] / m - 1.0) * 100.0 for k, m in med.items()}
    return {"windows": per, "pooled": _stats(pooled),
            "vs_median_of_windows": _stats([(pred[k], m) for k, m in med.items()]),
            "per_config_vs_median": med_errs}


def rank_ratios(pred: dict[tuple[str, int], float], windows: list[dict]) -> dict[str, dict]:
    """Per DLRM batch: the 2-rank step over the 1-rank step of the same window (both measured minutes
    apart, so the machine's drift between windows cancels), median over the windows, against the same
    ratio predicted: the 2-rank model (contention, collectives, DDP) apart from the machine's pace."""
    out = {}
    measured_rows = [{(r["model"], int(r["batch"])): r["measured_s"] for r in w["rows"]} for w in windows]
    for (model, batch), p2 in pred.items():
        if model != "dlrm-2rank" or ("dlrm", batch) not in pred:
            continue
        ratios = [got[(model, batch)] / got[("dlrm", batch)] for got in measured_rows
                  if (model, batch) in got and ("dlrm", batch) in got]
        if ratios:
            measured, predicted = float(np.median(ratios)), p2 / pred[("dlrm", batch)]
            out[str(batch)] = {"measured": measured, "predicted": predicted, "n": len(ratios),
                               "measured_range": [float(min(ratios)), float(max(ratios))],
                               "error_pct": (predicted / measured - 1.0) * 100.0}
    return out


def window_gemm_drift(window: dict) -> float | None:
    """A window's GEMM drift: the geomean of its before / after re-timings of the measuring pack's GEMM shapes
    (``measure_env.gemm_drift``: now / at calibration), or None when it recorded none
    (:func:`predictor.timing.calibration.pace.window_drift` of the compute class)."""
    from predictor.timing.calibration.pace import window_drift

    return window_drift(window, "compute")


def drift_relative(pred: dict[tuple[str, int], float], windows: list[dict],
                   pack_pace: float = 1.0) -> dict[str, dict]:
    """Per configuration, over the windows that recorded a GEMM drift: the median of measured / predicted,
    its correlation with the window's GEMM drift, and the median of (measured / predicted) / drift: the
    row's error with the machine's pace at the time divided out (above 1: the step runs slower than the
    pack predicts beyond the machine's own drift). Every drift is a re-timing of the pack the window was
    measured with. ``pack_pace``: the compute pace the pack's predictions already carry
    (``Platform.kernel_pace``): each drift is taken relative to it."""
    out: dict[str, dict] = {}
    for key, p in pred.items():
        pairs = [(r["measured_s"] / p, d / pack_pace) for w in windows if (d := window_gemm_drift(w)) is not None
                 for r in w["rows"] if (r["model"], int(r["batch"])) == key]
        if len(pairs) < 3:
            continue
        ratio, drift = np.array(pairs).T
        with np.errstate(invalid="ignore", divide="ignore"):  # a constant column has no correlation (NaN)
            corr = float(np.corrcoef(ratio, drift)[0, 1])
        out[f"{key[0]} {key[1]}"] = {"n": len(pairs), "measured_over_predicted": float(np.median(ratio)),
                                     "corr_with_drift": corr,
                                     "over_drift": float(np.median(ratio / drift))}
    return out


def pace_relative_summary(drift: dict[str, dict]) -> dict[str, float]:
    """Geomean and max (%) over the configurations of :func:`drift_relative`'s ``|over_drift - 1|``; {} if none."""
    errs = np.array([abs(r["over_drift"] - 1.0) * 100.0 for r in drift.values()])
    if not len(errs):
        return {}
    return {"geomean_abs_pct": float(np.exp(np.mean(np.log(np.maximum(errs, 1e-9))))), "max_abs_pct": float(errs.max())}


def at_median_pace(pred: dict[tuple[str, int], float], windows: list[dict], pack_pace: float = 1.0) -> dict:
    """A what-if, reported only: ``pred`` multiplied by the median over ``windows`` of their GEMM drift
    (:func:`window_gemm_drift`) and scored against each configuration's median over the windows. Nothing
    feeds a prediction. ``{}`` when no window recorded a drift. ``pack_pace``: the compute pace the pack's
    predictions already carry (``Platform.kernel_pace``): they are multiplied by the median drift over it."""
    drifts = [d for w in windows if (d := window_gemm_drift(w)) is not None]
    if not drifts:
        return {}
    pace = float(np.median(drifts))
    pairs = [(pred[k] * pace / pack_pace, m) for k, m in config_medians(pred, windows).items()]
    return {"pace": pace, "pace_quartiles": [float(q) for q in np.percentile(drifts, [25, 75])], "n_windows": len(drifts),
            **_stats(pairs)}


def _label(spec: str) -> str:
    """A pack spec as a column name: a path shortened to its last part."""
    return Path(spec).name if "/" in spec else spec


def rescore(args, windows: list[dict]) -> dict:
    """Every pack of ``args`` (``--platform`` first, then ``--compare``) scored on ``windows``, those of the
    first pack's CPU (``--cpu``): ``{"windows": [...], "cpu_note": ..., "packs": {spec: scores}}``."""
    from predictor.timing.platforms.cpu_local import cpu_signature, describe_cpu

    platforms = [args.platform, *args.compare]
    results, cpu_note = {}, f"all {len(windows)} windows, of every CPU (`--cpu all`)"
    for i, spec in enumerate([*platforms]):
        plat, source = resolve_pack(spec)
        p = platforms[i] = plat.pack.name if plat.pack is not None else spec  # "cpu-local": the host's pack
        if i == 0 and args.cpu != "all":
            cpu = cpu_signature() if args.cpu == "host" else (plat.pack.manifest.get("cpu") if plat.pack else None)
            n_all, windows = len(windows), windows_of_cpu(windows, cpu)
            who = "this host's CPU" if args.cpu == "host" else f"the CPU of `{_label(p)}`"
            cpu_note = (f"the {len(windows)} of {n_all} windows measured on {who}: "
                        + (describe_cpu(cpu) if cpu else "unrecorded, the AVX-512 EPYC of the oldest windows"))
            if not windows:
                fail(f"{repo_relative(args.data)}: no window measured on {who} "
                     f"({describe_cpu(cpu) if cpu else 'unrecorded'}); --cpu all pools every CPU's")
        pred = predict_rows(plat.timing())
        pack_pace = plat.platform.kernel_pace.get("compute", 1.0)
        results[p] = {"timing_source": source, **score(pred, windows), "rank_ratio": rank_ratios(pred, windows),
                      "drift_relative": drift_relative(pred, windows, pack_pace),
                      "at_median_pace": at_median_pace(pred, windows, pack_pace), "kernel_pace": pack_pace}
    if args.since is not None:
        cpu_note += f"; only those measured at or after {args.since} (`--since`)"
    return {"date": date.today().isoformat(), "windows": [w["measured_at"] for w in windows], "cpu_note": cpu_note,
            "allocator": args.allocator, "batch_pool": args.batch_pool, "platforms": platforms,
            "spread": _spread(windows), "packs": results}


def _spread(windows: list[dict]) -> list[float]:
    """Per configuration measured in more than one window: slowest / fastest window - 1."""
    by_cfg: dict[str, list[float]] = {}
    for w in windows:
        for r in w["rows"]:
            by_cfg.setdefault(f"{r['model']} {r['batch']}", []).append(r["measured_s"])
    return [max(v) / min(v) - 1.0 for v in by_cfg.values() if len(v) > 1]


def windows_markdown(doc: dict) -> str:
    """The scores over the stored windows (:func:`rescore`'s ``doc``) as markdown."""
    platforms, results, sp = doc["platforms"], doc["packs"], doc["spread"]
    lines = [
        "# End-to-end CPU accuracy over every stored measurement window",
        "",
        f"{doc['date']}; {len(doc['windows'])} stored runs of `experiments/e2e_cpu.py` "
        f"(`{repo_relative(WINDOWS_FILE)}`), each the median of 3 interleaved passes of the 12 training "
        f"iterations, measured with the C allocator `{doc['allocator']}` and the DLRM rows cycling a pool of "
        f"{doc['batch_pool']} index batches (`--batch-pool`). Reproduce: `{doc['command']}`.",
        "",
        f"Windows: {doc['cpu_note']}.",
        "",
        (f"How much the machine moves: one configuration's measurement differs between windows by a median of "
         f"{100 * float(np.median(sp)):.1f} % (slowest / fastest window - 1; max {100 * max(sp):.1f} %)."
         if sp else "One window only: how much the machine moves between windows is not known from these."),
        "",
        "| pack | pooled geomean % | pooled max % | median signed % | vs median of windows: geomean % / max % |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in platforms:
        r = results[p]
        lines.append(f"| {_label(p)} | {r['pooled']['geomean_abs_pct']:.2f} | {r['pooled']['max_abs_pct']:.1f} | "
                     f"{r['pooled']['median_signed_pct']:+.1f} | {r['vs_median_of_windows']['geomean_abs_pct']:.2f} / "
                     f"{r['vs_median_of_windows']['max_abs_pct']:.1f} |")
    lines += ["", "Per window (geomean % / max % / median signed %):", "",
              "| measured at | " + " | ".join(map(_label, platforms)) + " |", "|---|" + "---:|" * len(platforms)]
    for i, at in enumerate(doc["windows"]):
        cells = [f"{results[p]['windows'][i]['geomean_abs_pct']:.1f} / {results[p]['windows'][i]['max_abs_pct']:.1f} / "
                 f"{results[p]['windows'][i]['median_signed_pct']:+.1f}" for p in platforms]
        lines.append(f"| {at} | " + " | ".join(cells) + " |")
    lines += ["", "Per configuration against the median of the windows (error %):", "",
              "| configuration | " + " | ".join(map(_label, platforms)) + " |", "|---|" + "---:|" * len(platforms)]
    for k in results[platforms[0]]["per_config_vs_median"]:
        lines.append(f"| {k} | " + " | ".join(f"{results[p]['per_config_vs_median'][k]:+.1f}" for p in platforms) + " |")
    lines += _ratio_lines(platforms, results) + _pace_lines(platforms, results)
    lines += ["", "Target: geomean under 5 %, max under 10 %."]
    return "\n".join(lines) + "\n"


def _ratio_lines(platforms: list[str], results: dict) -> list[str]:
    """The 2-rank / 1-rank table of :func:`windows_markdown`."""
    first = results[platforms[0]].get("rank_ratio") or {}
    if not first:
        return []
    lines = ["", "The 2-rank DLRM step over the 1-rank step of the same window (the machine's drift between windows "
             "cancels; the 2-rank model alone: host contention, collectives, DDP): measured median over "
             "the windows [range], and each pack's predicted ratio (error %):", "",
             "| batch | measured | " + " | ".join(map(_label, platforms)) + " |", "|---:|---|" + "---:|" * len(platforms)]
    for b, r in first.items():
        cells = [f"{results[p]['rank_ratio'][b]['predicted']:.3f} ({results[p]['rank_ratio'][b]['error_pct']:+.1f})"
                 for p in platforms]
        lines.append(f"| {b} | {r['measured']:.3f} [{r['measured_range'][0]:.3f}-{r['measured_range'][1]:.3f}] | "
                     + " | ".join(cells) + " |")
    return lines


def _pace_lines(platforms: list[str], results: dict) -> list[str]:
    """The tables of :func:`windows_markdown` against the machine's pace (GEMM drift) of each window."""
    lines: list[str] = []
    drift = results[platforms[0]].get("drift_relative") or {}
    if drift:
        lines += ["", f"Against the machine's pace (`{_label(platforms[0])}`): each window re-times the measuring "
                  "pack's GEMM shapes before and after (`gemm_drift`, now / at calibration). Per configuration, over "
                  "the windows with that record: median measured / predicted, its correlation with the window's "
                  "drift, and the median of (measured / predicted) / drift, the error with the machine's pace divided "
                  "out:", "", "| configuration | windows | measured / predicted | corr. with drift | / drift |",
                  "|---|---:|---:|---:|---:|"]
        for k, r in drift.items():
            lines.append(f"| {k} | {r['n']} | {r['measured_over_predicted']:.3f} | {r['corr_with_drift']:+.2f} | "
                         f"{r['over_drift']:.3f} |")
        lines += ["", "Each pack's errors with the pace divided out (|(measured / predicted) / drift - 1| over the "
                  "configurations: a model change scored apart from the machine's pace when the pack was "
                  "calibrated; a pack with a measured kernel pace has each drift divided by its compute pace "
                  "first):", "", "| pack | geomean % | max % |", "|---|---:|---:|"]
        for p in platforms:
            s = pace_relative_summary(results[p].get("drift_relative") or {})
            if s:
                lines.append(f"| {_label(p)} | {s['geomean_abs_pct']:.2f} | {s['max_abs_pct']:.1f} |")
    paced = results[platforms[0]].get("at_median_pace") or {}
    if paced:
        lines += ["", f"What if each pack ran at the windows' median pace (a what-if, not a prediction): the median GEMM "
                  f"drift over the {paced['n_windows']} windows with a record is x{paced['pace']:.3f} (quartiles "
                  f"{paced['pace_quartiles'][0]:.3f}-{paced['pace_quartiles'][1]:.3f}); each pack's predictions "
                  "multiplied by it (over its own compute pace, for a pack that carries one), against the "
                  "per-configuration medians:", "",
                  "| pack | geomean % | max % | median signed % |", "|---|---:|---:|---:|"]
        for p in platforms:
            a = results[p].get("at_median_pace") or {}
            if a:
                lines.append(f"| {_label(p)} | {a['geomean_abs_pct']:.2f} | {a['max_abs_pct']:.1f} | "
                             f"{a['median_signed_pct']:+.1f} |")
    return lines
