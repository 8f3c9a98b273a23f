"""End-to-end CPU accuracy over every archived measurement window, not only the latest.

``experiments/e2e_cpu.py`` appends each full measurement of its 12 training iterations to
``benchmarks/results/e2e_cpu_windows.json``. On this shared 2-core VM one configuration's measured
iteration moves by up to ~20 % between runs minutes apart (other tenants of the host), more than
the accuracy target, so one run judges a pack by the state of one window. This script predicts
the 12 configurations once per asset pack (from their specs, as ``e2e_cpu.py`` does) and scores
the predictions against every archived window:

* per window: geomean and max absolute error, and the median *signed* error (bias: < 0 means
  the pack predicts faster than the machine ran);
* pooled: over every (window, configuration) pair;
* against the median over the windows of each configuration (a steadier ground truth).

Writes ``benchmarks/results/e2e_windows.md`` and ``.json`` (the archive itself is never written here).

    python experiments/e2e_windows.py [--platform cpu-local] [--compare PACK|git:REV|lq:PACK|fastest:PACK|fastcoll:PACK|refit:DIR|throughout:SPEC ...]
                                      [--allocator default|no_trim] [--cpu pack|host|all]

Only the windows measured on the ``--platform`` pack's CPU are pooled (``--cpu pack``, the default:
the manifest's ``cpu`` record against each window's; windows and packs from before session 21 have
none and are the AVX-512 EPYC of sessions 1-20's), since a pack describes one CPU; ``--cpu host``
takes this host's windows, ``--cpu all`` every window.

A pack spec prefixed ``faults32:`` gives a pack calibrated before ``tuner calibrate`` measured the
cost of a page fault this VM's measured cost (``experiments/page_faults_cpu.py``), so its kernels pay
the faults of output blocks at or above glibc's 32 MiB mmap ceiling
(:func:`predictor.timing.kernels.host_memory.allocation_fault_seconds`): a ``refit:`` pack is fitted with it
(the fit takes out the faults its samples were counted paying, where the pack has counts), a fitted
pack adds it at prediction.
Packs that carry their own ``page_fault_s`` are left as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from datetime import date, datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments.common import fail, repo_relative  # noqa: E402
from experiments.dlrm_gloo import LEGACY_BATCH_POOL  # noqa: E402
from experiments.e2e_cpu import DLRM_BATCHES, GPT_BATCHES, MLP_BATCHES, RESULTS, WINDOWS_FILE, build_cases  # noqa: E402
from predictor.metrics import geomean_abs_pct_error, max_abs_pct_error  # noqa: E402
from predictor.timing.platforms.host import ALLOCATORS  # noqa: E402


def load_windows(path: Path) -> list[dict]:
    """The archived windows; one line and exit 2 on a missing or malformed archive."""
    if not path.exists():
        fail(f"{path}: no archived measurements (run experiments/e2e_cpu.py first)")
    try:
        windows = json.loads(path.read_text())
        for w in windows:
            for r in w["rows"]:
                float(r["measured_s"]), str(r["model"]), int(r["batch"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        fail(f"{path}: not an archive of e2e measurements ({type(exc).__name__}: {exc})")
    if not windows:
        fail(f"{path}: empty archive")
    return windows


def utc_time(text: str, what: str) -> datetime:
    """``text`` as an ISO time, UTC when it names no zone; one line naming ``what`` and exit 2 when it is not one."""
    try:
        t = datetime.fromisoformat(str(text))
    except ValueError:
        fail(f"{what} {text!r}: not an ISO time (e.g. 2026-11-26T11:18)")
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


#: pack-spec prefixes that refit a pack's stored data -> the fit target (None: the pack's own)
REFIT_SPECS: dict[str, str | None] = {"refit": None, "fastest": "fastest_round", "fastcoll": "fastest_collectives"}


def materialise(spec: str, workdir: Path, fault_s: float | None = None) -> str:
    """A platform argument for ``spec``:

    * ``git:REV[:NAME]`` -> ``assets/NAME`` (default ``cpu-local``) as committed at ``REV``, extracted to
      ``workdir``;
    * ``lq:PACK`` -> PACK refitted with each sample's lower quartile of its fastest round as its
      time (``lq_s``: the estimator before 2026-11-23), same data, so only the estimator differs;
    * ``fastest:PACK`` -> PACK (a pack, or a ``refit:``-able data folder) refitted to each sample's fastest
      round times each op kind's typical-state factor (``fit_target="fastest_round"``,
      :mod:`predictor.timing.kernels.state`), same data, so only the fit target differs;
    * ``fastcoll:PACK`` -> the same with ``fit_target="fastest_collectives"`` (only the collectives fitted to
      their fastest passes, times their state factor; every other family typical);
    * ``refit:DIR`` -> the benchmark data of DIR (a pack written with ``--no-fit``, such as those
      kept in ``benchmarks/results/data/packs/``) fitted into ``workdir``;
    * ``hc:CLASS=F[,CLASS=F]:SPEC`` -> the pack of ``SPEC`` with its host-contention factors of those
      classes (``embedding``, ``memory``, ``compute``; every world size) set to ``F``: a what-if on
      the contention model, e.g. ``hc:embedding=1.0:cpu-local-avx2``;
    * ``pace:CLASS=F[,CLASS=F]:SPEC`` -> the pack of ``SPEC`` with its kernel pace of those classes set to
      ``F`` (``Platform.kernel_pace``), e.g. ``pace:compute=1.05:cpu-local-zen4``;
    * (:func:`resolve_pack`, outermost) ``throughout:SPEC`` -> SPEC with host contention priced throughout
      the step, not only while another rank runs (the timing before session 27);
    * anything else is a pack name or path as ``--platform`` takes it.

    ``fault_s``: a page-fault cost (seconds) that ``refit:`` gives a pack lacking one (``faults32:``
    specs; see :func:`predictor.timing.calibrate.refit`'s ``platform_facts``).
    """
    if spec.startswith("hc:"):
        return _contention_variant(spec, workdir, fault_s)
    if spec.startswith("pace:"):
        return _pace_variant(spec, workdir, fault_s)
    if spec.startswith("git:"):
        from predictor.timing.platforms.assets import AssetPackError, pack_at_revision

        rev, _, name = spec[4:].partition(":")
        name = name or "cpu-local"
        try:
            return str(pack_at_revision(REPO, rev, f"assets/{name}", workdir / f"git-{rev}-{name}"))
        except AssetPackError as exc:
            fail(f"--compare {spec}: {exc}")
    if spec.startswith(tuple(f"{k}:" for k in REFIT_SPECS)):
        from predictor.timing.calibrate import CalibrationError, refit

        kind, _, src = spec.partition(":")
        out = workdir / kind
        try:
            refit(Path(src) if kind == "refit" else _pack_dir(src, spec), out, log=lambda _m: None, register=False,
                  platform_facts=fault_facts(fault_s) if fault_s is not None else None,
                  fit_target=REFIT_SPECS[kind])
        except CalibrationError as exc:
            fail(f"--compare {spec}: {exc}")
        return str(out)
    if spec.startswith("lq:"):
        import shutil

        import pandas as pd

        from predictor.timing.calibrate import refit

        name = spec[3:]
        src = _pack_dir(name, spec)
        tmp = workdir / "lq-src"
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        for csv in (tmp / "data").glob("*.csv"):
            d = pd.read_csv(csv)
            if "lq_s" not in d.columns:
                fail(f"--compare {spec}: {csv.name} has no lq_s column (a pack calibrated before 2026-11-23)")
            d["seconds"] = d["lq_s"]
            d.to_csv(csv, index=False)
        out = workdir / "lq"
        refit(tmp, out, log=lambda _m: None, register=False)
        return str(out)
    return spec


def _pack_dir(name: str, spec: str) -> Path:
    """The folder of the asset pack ``name`` (a pack folder, or a name ``find_asset_pack`` knows); one
    line and exit 2, naming ``spec``, when there is none."""
    from predictor.timing.platforms.assets import find_asset_pack

    src = Path(name) if (Path(name) / "manifest.json").is_file() else find_asset_pack(name)
    if src is None:
        fail(f"--compare {spec}: no asset pack {name!r}")
    return src


def _contention_variant(spec: str, workdir: Path, fault_s: float | None) -> str:
    """The ``hc:CLASS=F,...:SPEC`` pack (:func:`materialise`): SPEC's pack copied into ``workdir`` with
    those host-contention factors replaced in its ``platform.yaml``."""
    from predictor.timing.platforms.schema import KERNEL_CLASSES

    def replace(plat: dict, factors: dict[str, float], src: str) -> None:
        hc = plat.get("host_contention") or {}
        if not hc:
            fail(f"--compare {spec}: {src} has no host-contention factors to replace")
        for world in hc:
            hc[world].update(factors)

    # the lockstep factor is replaced like a class's
    return _platform_variant(spec, "hc", (*KERNEL_CLASSES, "sync"), replace, workdir, fault_s)


def _pace_variant(spec: str, workdir: Path, fault_s: float | None) -> str:
    """The ``pace:CLASS=F,...:SPEC`` pack (:func:`materialise`): SPEC's pack copied into ``workdir`` with
    those kernel-pace factors (``Platform.kernel_pace``) set in its ``platform.yaml``."""
    from predictor.timing.platforms.schema import KERNEL_CLASSES

    def replace(plat: dict, factors: dict[str, float], _src: str) -> None:
        plat["kernel_pace"] = {**(plat.get("kernel_pace") or {}), **factors}

    return _platform_variant(spec, "pace", KERNEL_CLASSES, replace, workdir, fault_s)


def _platform_variant(spec: str, prefix: str, classes: tuple[str, ...], replace, workdir: Path,
                      fault_s: float | None) -> str:
    """``PREFIX:CLASS=F[,CLASS=F]:SPEC``: SPEC's pack (:func:`materialise`) copied into ``workdir`` and its
    ``platform.yaml`` edited by ``replace(platform mapping, {class: F}, source folder)``."""
    import shutil

    import yaml

    head, sep, inner = spec[len(prefix) + 1:].partition(":")
    try:
        factors = {k.strip(): float(v) for k, v in (kv.split("=") for kv in head.split(","))}
    except ValueError:
        factors = {}
    if not sep or not factors or any(k not in classes or not 0 < f < float("inf") for k, f in factors.items()):
        fail(f"--compare {spec}: expected {prefix}:CLASS=F[,CLASS=F]:PACK with CLASS in {', '.join(classes)} "
             "and F > 0")
    src = _pack_dir(materialise(inner, workdir / f"{prefix}-inner", fault_s), spec)
    out = workdir / (f"{prefix}-" + "-".join(f"{k}{v:g}" for k, v in factors.items()))
    shutil.copytree(src, out, dirs_exist_ok=True)
    doc = yaml.safe_load((out / "platform.yaml").read_text())
    for plat in doc.values():
        replace(plat, factors, str(src))
    (out / "platform.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(out)


#: the measured cost of one minor page fault on this VM (``experiments/page_faults_cpu.py``)
PAGE_FAULTS_FILE = RESULTS / "page_faults_cpu.json"


def measured_fault_s(path: Path = PAGE_FAULTS_FILE) -> float:
    """Median wall seconds per minor page fault from ``experiments/page_faults_cpu.py``'s results."""
    try:
        rows = json.loads(path.read_text())["fault_cost"]
        return float(np.median([float(r["wall_per_fault_s"]) for r in rows]))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        fail(f"{path}: no measured page-fault cost (run experiments/page_faults_cpu.py): {exc}")


def fault_facts(fault_s: float) -> dict[str, float]:
    """Platform fields of a glibc host whose page fault costs ``fault_s`` seconds."""
    from predictor.timing.platforms.host import GLIBC_MMAP_CEILING_BYTES

    return {"page_fault_s": float(fault_s), "fresh_mapping_bytes": float(GLIBC_MMAP_CEILING_BYTES)}


def resolve_spec(spec: str, workdir: Path):
    """``(timing, source)`` of a pack spec (:func:`materialise`), a ``faults32:`` prefix included: a pack
    without a page-fault cost of its own gets this VM's measured one (:func:`measured_fault_s`),
    through ``refit``'s ``platform_facts`` for ``refit:`` specs and on its platform for fitted packs.
    One line and exit 2 on a spec that does not resolve."""
    plat, source = resolve_pack(spec, workdir)
    return plat.timing(), source


def resolve_pack(spec: str, workdir: Path):
    """``(resolved platform, source)`` of a pack spec, as :func:`resolve_spec` (whose timing is the
    platform's); the resolved platform's ``pack`` (None for a catalog platform) has the manifest."""
    import dataclasses

    from predictor.timing.platforms.assets import AssetPackError, resolve_platform

    if spec.startswith("throughout:"):
        plat, source = resolve_pack(spec.removeprefix("throughout:"), workdir)
        return _ContentionThroughout(plat), source + ", host contention throughout the step"
    fault_s = measured_fault_s() if spec.startswith("faults32:") else None
    path = materialise(spec.removeprefix("faults32:"), workdir, fault_s)
    try:
        plat = resolve_platform(path)
    except (AssetPackError, KeyError, ValueError) as exc:
        fail(f"--platform {path}: {exc}")
    source = plat.source
    if fault_s is not None and plat.platform.page_fault_s <= 0:
        plat = dataclasses.replace(plat, platform=plat.platform.model_copy(update=fault_facts(fault_s)))
        source += f" + page faults at {fault_s * 1e6:.2f} us"
    return plat, source


class _ContentionThroughout:
    """A resolved platform whose timings price host contention throughout the step (``co_run=False``,
    as every prediction before session 27), not only while another rank runs
    (:mod:`predictor.timing.kernels.co_run`): the ``throughout:SPEC`` what-if."""

    def __init__(self, plat) -> None:
        self._plat = plat

    def __getattr__(self, name: str):
        return getattr(self._plat, name)

    def timing(self, *args, **kwargs):
        t = self._plat.timing(*args, **kwargs)
        t.co_run = False
        return t


def windows_of_cpu(windows: list[dict], cpu: dict | None) -> list[dict]:
    """The windows measured on the CPU ``cpu`` (a :func:`~predictor.timing.platforms.cpu_local.cpu_signature`
    record; None: the unrecorded host of the windows before session 21, the AVX-512 EPYC of sessions
    1-20): a pack is judged on the machine it describes, and one CPU's windows are pooled."""
    from predictor.timing.platforms.cpu_local import same_cpu

    return [w for w in windows if same_cpu(w.get("cpu"), cpu)]


def predict_rows(timing) -> dict[tuple[str, int], float]:
    """Predicted seconds of every e2e configuration, keyed by (model, batch), with ``timing``."""
    args = types.SimpleNamespace(models=["mlp", "gpt", "dlrm"], mlp_batches=list(MLP_BATCHES),
                                 gpt_batches=list(GPT_BATCHES), dlrm_batches=list(DLRM_BATCHES[1]),
                                 dlrm_ranks=[1, 2], warmup=1, iters=1, dlrm_warmup=1, batch_pool=2)
    return {(c.model, c.batch): float(c.predicted[0]) for c in build_cases(args, timing, 1)}


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
    ratio predicted — the 2-rank model (contention, collectives, DDP) judged apart from the machine's pace."""
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
    """A window's GEMM drift: the geomean of its before / after re-timings of the scoring pack's GEMM shapes
    (``measure_env.gemm_drift``: now / at calibration), or None when it recorded none
    (:func:`predictor.timing.calibration.pace.window_drift` of the compute class)."""
    from predictor.timing.calibration.pace import window_drift

    return window_drift(window, "compute")


def drift_relative(pred: dict[tuple[str, int], float], windows: list[dict],
                   pack_pace: float = 1.0) -> dict[str, dict]:
    """Per configuration, over the windows that recorded a GEMM drift: the median of measured / predicted,
    its correlation with the window's GEMM drift, and the median of (measured / predicted) / drift — the
    row's error with the machine's pace at the time divided out (above 1: the step runs slower than the
    pack predicts beyond the machine's own drift). Every drift is a re-timing of the pack the window was
    measured with; the windows of one pack's CPU share its GEMM shapes only while that pack is committed.
    ``pack_pace``: the compute pace the pack's predictions already carry (``Platform.kernel_pace``): each
    drift is taken relative to it."""
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
    (:func:`window_gemm_drift`: how much slower than the pack's recorded GEMM samples the machine ran during a
    typical window) and scored against each configuration's median over the windows, as :func:`score`'s
    ``vs_median_of_windows``. A pack whose shape models are right but whose pace is that of a faster spell reads
    better here than against the medians; nothing feeds a prediction. ``{}`` when no window recorded a drift.
    ``pack_pace``: the compute pace the pack's predictions already carry (``Platform.kernel_pace``): they are
    multiplied by the median drift over it."""
    drifts = [d for w in windows if (d := window_gemm_drift(w)) is not None]
    if not drifts:
        return {}
    pace = float(np.median(drifts))
    pairs = [(pred[k] * pace / pack_pace, m) for k, m in config_medians(pred, windows).items()]
    return {"pace": pace, "pace_quartiles": [float(q) for q in np.percentile(drifts, [25, 75])], "n_windows": len(drifts),
            **_stats(pairs)}


def _label(spec: str) -> str:
    """A pack spec as a column name: paths shortened to their last part (``refit:a/b/c`` -> ``refit:c``)."""
    head, _, tail = spec.rpartition(":") if ":" in spec and "/" in spec else ("", "", spec)
    return (head + ":" if head else "") + (Path(tail).name if "/" in tail else tail)


def markdown(results: dict[str, dict], windows: list[dict], platforms: list[str], allocator: str = "default",
             cpu_note: str = "", batch_pool: int = 2, extra_args: str = "") -> str:
    """The report; ``extra_args``: the command line's other non-default options (for its reproduce line)."""
    spread = {}
    for w in windows:
        for r in w["rows"]:
            spread.setdefault(f"{r['model']} {r['batch']}", []).append(r["measured_s"])
    sp = [max(v) / min(v) - 1.0 for v in spread.values() if len(v) > 1]
    lines = [
        "# End-to-end CPU accuracy over every measurement window",
        "",
        f"{date.today().isoformat()}; {len(windows)} archived runs of `experiments/e2e_cpu.py` "
        f"(`benchmarks/results/{WINDOWS_FILE}`), each the median of 3 interleaved passes of the 12 training "
        f"iterations, measured with the C allocator `{allocator}` and the DLRM rows cycling a pool of {batch_pool} "
        "index batches (`e2e_cpu.py --batch-pool`). Reproduce: "
        "`python experiments/e2e_windows.py --platform " + platforms[0]
        + (" --compare " + " ".join(platforms[1:]) if len(platforms) > 1 else "")
        + (f" --allocator {allocator}" if allocator != "default" else "")
        + (f" --batch-pool {batch_pool}" if batch_pool != 2 else "") + extra_args + "`.",
        "",
        *([f"Windows: {cpu_note}.", ""] if cpu_note else []),
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
    for i, w in enumerate(windows):
        cells = [f"{results[p]['windows'][i]['geomean_abs_pct']:.1f} / {results[p]['windows'][i]['max_abs_pct']:.1f} / "
                 f"{results[p]['windows'][i]['median_signed_pct']:+.1f}" for p in platforms]
        lines.append(f"| {w['measured_at']} | " + " | ".join(cells) + " |")
    lines += ["", "Per configuration against the median of the windows (error %):", "",
              "| configuration | " + " | ".join(map(_label, platforms)) + " |", "|---|" + "---:|" * len(platforms)]
    for k in results[platforms[0]]["per_config_vs_median"]:
        lines.append(f"| {k} | " + " | ".join(f"{results[p]['per_config_vs_median'][k]:+.1f}" for p in platforms) + " |")
    first = results[platforms[0]].get("rank_ratio") or {}
    if first:
        lines += ["", "The 2-rank DLRM step over the 1-rank step of the same window (the machine's drift between windows "
                  "cancels; the 2-rank model — host contention, collectives, DDP — judged alone): measured median over "
                  "the windows [range], and each pack's predicted ratio (error %):", "",
                  "| batch | measured | " + " | ".join(map(_label, platforms)) + " |", "|---:|---|" + "---:|" * len(platforms)]
        for b, r in first.items():
            cells = [f"{results[p]['rank_ratio'][b]['predicted']:.3f} ({results[p]['rank_ratio'][b]['error_pct']:+.1f})"
                     for p in platforms]
            lines.append(f"| {b} | {r['measured']:.3f} [{r['measured_range'][0]:.3f}-{r['measured_range'][1]:.3f}] | "
                         + " | ".join(cells) + " |")
    drift = results[platforms[0]].get("drift_relative") or {}
    if drift:
        lines += ["", f"Against the machine's pace (`{_label(platforms[0])}`): each window re-times the committed pack's "
                  "GEMM shapes before and after (`gemm_drift`, now / at calibration). Per configuration, over the "
                  "windows with that record: median measured / predicted, its correlation with the window's drift, "
                  "and the median of (measured / predicted) / drift — the error with the machine's pace divided out:",
                  "", "| configuration | windows | measured / predicted | corr. with drift | / drift |",
                  "|---|---:|---:|---:|---:|"]
        for k, r in drift.items():
            lines.append(f"| {k} | {r['n']} | {r['measured_over_predicted']:.3f} | {r['corr_with_drift']:+.2f} | "
                         f"{r['over_drift']:.3f} |")
        lines += ["", "Each pack's errors with the pace divided out (|(measured / predicted) / drift - 1| over the "
                  "configurations; a model change judged apart from the spell the pack was calibrated in; a pack "
                  "with a measured kernel pace has each drift divided by its compute pace first):", "",
                  "| pack | geomean % | max % |", "|---|---:|---:|"]
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
    lines += ["", "Target (issue 4): geomean under 5 %, max under 10 %."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", default="cpu-local", help="the pack to score (first column)")
    ap.add_argument("--compare", nargs="*", default=[], help="more packs (paths or names) scored beside it")
    ap.add_argument("--archive", type=Path, default=RESULTS / WINDOWS_FILE)
    ap.add_argument("--allocator", choices=ALLOCATORS, default="default",
                    help="score the windows measured under this C allocator mode (e2e_cpu.py --allocator)")
    ap.add_argument("--batch-pool", type=int, default=2,
                    help="score the windows whose DLRM rows cycled this many index batches (e2e_cpu.py --batch-pool)")
    ap.add_argument("--cpu", choices=("pack", "host", "all"), default="pack",
                    help="pool the windows measured on the CPU of the --platform pack (default; a pack without a "
                         "record: the windows without one), on this host's CPU, or all of them")
    ap.add_argument("--since", default=None, metavar="ISO_TIME",
                    help="score only the windows measured at or after this UTC time, e.g. 2026-11-26T11:18 (the "
                         "windows held out from a pack chosen before them)")
    ap.add_argument("--out", type=Path, default=None, help="default: e2e_windows[_ALLOCATOR] in benchmarks/results")
    args = ap.parse_args(argv)
    extra_args = f" --cpu {args.cpu}" if args.cpu != "pack" else ""
    since = None if args.since is None else utc_time(args.since, "--since")
    if since is not None:
        extra_args += f" --since {args.since}"
    if args.out is None:
        args.out = RESULTS / (("e2e_windows" if args.allocator == "default" else f"e2e_windows_{args.allocator}")
                              + ("" if args.batch_pool == 2 else f"_pool{args.batch_pool}"))
    else:
        extra_args += f" --out {repo_relative(args.out)}"
    if args.out.with_suffix(".json").resolve() == args.archive.resolve():
        fail(f"--out {args.out}: would overwrite the archive {args.archive}")
    windows = [w for w in load_windows(args.archive) if w.get("allocator", "default") == args.allocator
               and w.get("batch_pool", LEGACY_BATCH_POOL) == args.batch_pool
               and (since is None or utc_time(w.get("measured_at"), f"{args.archive}: measured_at") >= since)]
    if not windows:
        fail(f"{args.archive}: no window measured with --allocator {args.allocator} and --batch-pool {args.batch_pool}"
             + (f" since {args.since}" if since is not None else ""))
    platforms = [args.platform, *args.compare]
    results = {}
    import tempfile

    from predictor.timing.platforms.cpu_local import cpu_signature, describe_cpu

    cpu_note = f"all {len(windows)} windows, of every CPU (`--cpu all`)"
    with tempfile.TemporaryDirectory() as tmp:
        for i, p in enumerate(platforms):
            plat, source = resolve_pack(p, Path(tmp) / str(i))
            if i == 0 and args.cpu != "all":
                cpu = cpu_signature() if args.cpu == "host" else (plat.pack.manifest.get("cpu") if plat.pack else None)
                n_all, windows = len(windows), windows_of_cpu(windows, cpu)
                who = "this host's CPU" if args.cpu == "host" else f"the CPU of `{_label(p)}`"
                cpu_note = (f"the {len(windows)} of {n_all} windows measured on {who}: "
                            + (describe_cpu(cpu) if cpu else "unrecorded, the AVX-512 EPYC of sessions 1-20"))
                if not windows:
                    fail(f"{args.archive}: no window measured on {who} "
                         f"({describe_cpu(cpu) if cpu else 'unrecorded'}); --cpu all pools every CPU's")
            pred = predict_rows(plat.timing())
            pack_pace = plat.platform.kernel_pace.get("compute", 1.0)
            results[p] = {"timing_source": source, **score(pred, windows), "rank_ratio": rank_ratios(pred, windows),
                          "drift_relative": drift_relative(pred, windows, pack_pace),
                          "at_median_pace": at_median_pace(pred, windows, pack_pace), "kernel_pace": pack_pace}
    from tuner.report import atomic_write_text

    if since is not None:
        cpu_note += f"; only those measured at or after {args.since} (`--since`)"
    text = markdown(results, windows, platforms, args.allocator, cpu_note, args.batch_pool, extra_args)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(results, indent=1))
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
