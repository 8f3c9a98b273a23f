"""Pooling data from other calibration runs into a refit (``--data-from FAMILY[:KERNEL,...]=PACK``).

A refitted pack may take a family's (or some kernels') benchmark samples, or a probe's rows, from other
packs of the same machine timed the same way: a longer calibration of one family, or several timing-only
runs (``--no-fit``) kept as data, whose samples are pooled so that the models learn the kernel over several
runs of the machine rather than one. :func:`match_level` brings each run's samples to the refitted pack's
pace first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from predictor.timing.calibrate.fit import task_view
from predictor.timing.calibrate.options import PROBES, CalibrationError
from predictor.timing.calibrate.pack import read_benchmark_table
from predictor.timing.calibrate.probes import pooled_rounds
from predictor.timing.kernels.assets import load_asset_pack
from predictor.timing.kernels.base import KernelModel
from predictor.timing.kernels.timing import models_by_kind
from predictor.timing.platforms.schema import Platform

__all__ = ["FIELD_FAMILIES", "LOCKSTEP_TIMING_FIELDS", "TIME_COLUMNS", "TIMING_FIELDS", "family_data_from",
           "match_level", "parse_data_source", "timing_fields"]

#: manifest fields that say how a pack's samples were timed: a family's data taken from another pack
#: (``refit(data_from=)``) must agree with the refitted pack's on each, or the fit mixes protocols
TIMING_FIELDS = ("device", "threads", "gemm_timing", "memory_bound_timing", "embedding_warmup", "timing_estimator")
#: what the lockstep probe depends on (its own fixed GEMM loop and one-float all-reduce per segment): a probe
#: calibrated with other kernel-timing flags still fits
LOCKSTEP_TIMING_FIELDS = ("device", "threads")
#: the timing fields that concern only some families: a softmax table from a calibration whose GEMMs were timed
#: warm was timed exactly as one from a cold-GEMM calibration (every other field concerns every family)
FIELD_FAMILIES: dict[str, tuple[str, ...]] = {
    "gemm_timing": ("gemm",),
    "memory_bound_timing": ("elementwise", "layer_norm", "softmax", "data_movement", "reduction"),
    "embedding_warmup": ("embedding_bag", "step_reuse"),
}
#: the columns of a benchmark table that hold a time per call (seconds): what :func:`match_level` rescales
TIME_COLUMNS = ("seconds", "median_s", "lq_s", "min_s", "mean_s", "call_mean_s")


def timing_fields(family: str) -> tuple[str, ...]:
    """The manifest fields (:data:`TIMING_FIELDS`) on which ``family``'s samples depend: a pack whose data
    for ``family`` are taken into another (``refit(data_from=)``) must agree with it on these."""
    if family == "lockstep":
        return LOCKSTEP_TIMING_FIELDS
    return tuple(k for k in TIMING_FIELDS if family in FIELD_FAMILIES.get(k, (family,)))


def parse_data_source(key: str) -> tuple[str, tuple[str, ...]]:
    """``FAMILY`` or ``FAMILY:KERNEL[,KERNEL...]`` (a ``--data-from`` key): (the family, the kernels taken
    from the other pack; empty for the whole family)."""
    family, colon, sel = key.partition(":")
    kernels = tuple(dict.fromkeys(k.strip() for k in sel.split(",") if k.strip()))
    if colon and not kernels:
        raise CalibrationError(f"--data-from {key}: no kernel named after the colon (expected "
                               "FAMILY:KERNEL[,KERNEL...]=PACK)")
    return family.strip(), kernels


def match_level(table: pd.DataFrame, models: Iterable[KernelModel], platform: Platform
                ) -> tuple[pd.DataFrame, dict[str, float]]:
    """``table`` (one family's samples from another calibration of the same machine) brought to the pace of the
    pack whose ``models`` and ``platform`` are given: each kernel's times divided by its ``level``, the median over
    its samples of measured time / the pack's own prediction. A shared VM runs some hours ~10 % slower as a whole
    (a Zen 4 VM's GEMMs re-timed x0.9-1.2 of their calibration over a day); a longer calibration from such an
    hour then contributes its shapes without moving every prediction by its pace. Returns (the rescaled
    table, ``kernel -> level``). CalibrationError when the pack has no model for a kind of the table."""
    by_kind = models_by_kind(models)
    out = table.copy()
    levels: dict[str, float] = {}
    for kernel, idx in table.groupby("kernel", sort=False).groups.items():
        ratios = []
        for kind, part in table.loc[idx].groupby("kind", sort=False):
            model = by_kind.get(str(kind))
            if model is None:
                raise CalibrationError(f"--match-level: the refitted pack has no model of {kind!r} (kernel "
                                       f"{kernel!r}) to take the pace from")
            pred = np.asarray(model.predict(task_view(part, str(kind)), platform), dtype=np.float64)
            ratios.append(part["seconds"].to_numpy(dtype=np.float64) / pred)
        r = np.concatenate(ratios)
        r = r[np.isfinite(r) & (r > 0)]
        if r.size == 0:
            raise CalibrationError(f"--match-level: no valid sample of kernel {kernel!r}")
        level = float(np.median(r))
        for col in TIME_COLUMNS:
            if col in out:
                out.loc[idx, col] = out.loc[idx, col].to_numpy(dtype=np.float64) / level
        levels[str(kernel)] = level
    return out, levels


def _sources(data_from: Mapping[str, str | Path | Sequence[str | Path]]
             ) -> list[tuple[str, str, tuple[str, ...], str | Path]]:
    """``(key, family, kernels, pack)`` per pack named in ``data_from``, in the order given; CalibrationError
    when a family or kernel is named by two keys, or a probe other than lockstep by several packs."""
    items: list[tuple[str, str, tuple[str, ...], str | Path]] = []
    named: dict[str, list[tuple[str, tuple[str, ...]]]] = {}  # family -> its keys and their kernels
    for key, src in data_from.items():
        family, kernels = parse_data_source(key)
        many = list(src) if isinstance(src, list | tuple) else [src]
        if len(many) > 1 and family in PROBES and family != "lockstep":
            raise CalibrationError(f"--data-from {key}: given for {len(many)} packs; the {family} probe is taken "
                                   "from one")
        for other_key, other_kernels in named.get(family, []):
            shared = set(kernels) & set(other_kernels)
            if not kernels or not other_kernels or shared:
                what = f"kernel {sorted(shared)[0]!r}" if shared else f"family {family!r}"
                raise CalibrationError(f"--data-from: {what} given twice ({other_key} and {key}; several packs "
                                       "for one kernel are given under one key)")
        named.setdefault(family, []).append((key, kernels))
        items += [(key, family, kernels, one) for one in many]
    return items


def _load_source(m: dict, key: str, family: str, kernels: tuple[str, ...], src: str | Path):
    """The pack ``src`` named for ``family``, checked to be timed as the refitted pack's (manifest ``m``) on
    the same CPU."""
    from predictor.timing.calibration import FAMILIES
    from predictor.timing.kernels.assets import AssetPackError
    from predictor.timing.platforms.cpu_local import same_cpu

    if family not in FAMILIES and family not in PROBES:
        raise CalibrationError(f"--data-from {key}={src}: unknown family {family!r} "
                               f"(one of {', '.join([*FAMILIES, *PROBES])})")
    if kernels and family in PROBES:
        raise CalibrationError(f"--data-from {key}={src}: {family} is a probe, taken whole (no kernels)")
    try:
        other = load_asset_pack(src, allow_unfitted=True)
    except AssetPackError as exc:
        raise CalibrationError(f"--data-from {key}={src}: {exc}") from None
    om = other.manifest
    for field in timing_fields(family):
        if om.get(field) != m.get(field):
            raise CalibrationError(f"--data-from {key}={src}: its {field} is {om.get(field)!r}, the refitted "
                                   f"pack's {m.get(field)!r}: samples timed another way")
    if str(m.get("device", "cpu")).startswith("cpu") and not same_cpu(om.get("cpu"), m.get("cpu")):
        raise CalibrationError(f"--data-from {key}={src}: measured on another CPU than the refitted pack")
    return other


def _take_probe(tables: dict, record: dict, key: str, family: str, src: str | Path, other) -> None:
    """The step-reuse or lockstep probe rows of pack ``other`` into ``tables`` and ``record``: the lockstep
    rounds of several packs pooled per process, in the order given."""
    om = other.manifest
    if family == "step_reuse":
        rows = (om.get("embedding_step_reuse_probe") or {}).get("rows")
        if not rows:
            raise CalibrationError(f"--data-from {key}={src}: the pack has no step-reuse probe "
                                   "(manifest embedding_step_reuse_probe)")
        tables[family] = rows
        record[family] = {"pack": str(other.path), "created": om.get("created"), "rows": len(rows)}
        return
    probe = om.get("lockstep_probe") or {}
    if not probe.get("per_process"):
        raise CalibrationError(f"--data-from {key}={src}: the pack has no lockstep probe "
                               "(manifest lockstep_probe)")
    if family in tables:
        if probe.get("world") != record[family]["world"]:
            raise CalibrationError(f"--data-from {key}={src}: probed over {probe.get('world')} "
                                   f"processes, {record[family]['pack']} over {record[family]['world']}")
        tables[family] = pooled_rounds(tables[family], probe["per_process"])
        record[family]["pack"] += f", {other.path}"
        record[family]["created"] += f", {om.get('created')}"
        record[family]["probes"] += 1
        return
    tables[family] = probe["per_process"]
    record[family] = {"pack": str(other.path), "created": str(om.get("created")), "world": probe.get("world"),
                      "probes": 1}


def _take_table(key: str, family: str, kernels: tuple[str, ...], src: str | Path, other) -> pd.DataFrame:
    """Pack ``other``'s benchmark table of ``family``, only ``kernels``' rows when some are named."""
    om = other.manifest
    f = other.path / "data" / f"{family}.csv"
    if not f.exists():
        raise CalibrationError(f"--data-from {key}={src}: the pack has no {family} benchmarks ({f})")
    table = read_benchmark_table(f, f"--data-from {key}={src}")
    if om.get("kernels") and not kernels:
        raise CalibrationError(f"--data-from {key}={src}: the pack timed only {', '.join(om['kernels'])} "
                               f"(--kernels); take them by name, e.g. {family}:{om['kernels'][0]}={src}")
    if kernels:
        have = list(dict.fromkeys(table["kernel"].astype(str))) if "kernel" in table else []
        missing = [k for k in kernels if k not in have]
        if missing:
            raise CalibrationError(f"--data-from {key}={src}: the pack has no {family} samples of "
                                   f"{', '.join(map(repr, missing))} (it has {', '.join(have) or 'none'})")
        table = table[table["kernel"].astype(str).isin(kernels)].reset_index(drop=True)
    return table


def family_data_from(m: dict, data_from: Mapping[str, str | Path | Sequence[str | Path]]
                     ) -> tuple[dict[str, pd.DataFrame | list], dict, dict[str, tuple[str, ...]], list[dict]]:
    """Benchmark tables of some families from other packs (``family -> pack``), checked to be measured
    the way the refitted pack's (manifest ``m``) were and on the same CPU: (tables by family, the record of
    where each came from, the kernels taken per family where only some are, the record of each table
    taken: ``parts[i]`` is the entry of the rows whose ``_part`` is ``i``); for a probe of
    :data:`~.options.PROBES` its raw rows (a list) instead of a table.

    A key ``family:k1,k2`` takes only those kernels' rows (the refitted pack keeps its other kernels' samples
    of the family). One family may be named by several keys whose kernels do not overlap
    (``gemm:addmm/fp32=A`` and ``gemm:addmm/bf16=B``). A key may map to several packs (a list): their samples
    are pooled. Every table carries a ``_part`` column (one value per key and pack) that
    :func:`~predictor.timing.calibrate.refit` uses to bring each run to the pack's pace apart and then drops.
    The lockstep probe may come from several packs too: each process's rounds are pooled over them.
    CalibrationError, naming the family and the pack, when one cannot be used."""
    tables, record, selected = {}, {}, {}
    parts: dict[str, list[pd.DataFrame]] = {}  # family -> the tables taken for it, one per key and pack
    part_records: list[dict] = []  # the record entry of each of those tables, by its ``_part``
    key_records: dict[str, list[dict]] = {}  # key -> the entries of its packs, in the order given
    for key, family, kernels, src in _sources(data_from):
        other = _load_source(m, key, family, kernels, src)
        if family in PROBES:
            _take_probe(tables, record, key, family, src, other)
            continue
        table = _take_table(key, family, kernels, src, other)
        if kernels:
            selected[family] = tuple(dict.fromkeys((*selected.get(family, ()), *kernels)))
        om = other.manifest
        parts.setdefault(family, []).append(table.assign(_part=len(part_records)))
        one = {"pack": str(other.path), "created": om.get("created"), "level": om.get("level"),
               "scale": om.get("scale", 1.0), "samples": len(table)}
        part_records.append(one)
        sources = key_records.setdefault(key, [])
        sources.append(one)
        # several packs pooled under one key: each keeps its entry under ``sources``, the key sums them
        record[key] = one if len(sources) == 1 else {
            "pack": ", ".join(x["pack"] for x in sources), "created": ", ".join(str(x["created"]) for x in sources),
            "samples": sum(x["samples"] for x in sources), "sources": list(sources)}
    for family, taken in parts.items():
        tables[family] = pd.concat(taken, ignore_index=True)
    return tables, record, selected, part_records
