"""The platform a calibration refines (measured ``cpu-local`` or the GPU's catalog entry) and the calibrated
platform it writes: measured peaks, bandwidths, collective latency and waits, host contention, overheads."""

from __future__ import annotations

import datetime as _dt

import numpy as np
import pandas as pd
import torch

from predictor.timing.calibrate.options import CalibrationError
from predictor.timing.calibration.base import Level
from predictor.timing.kernels.base import KernelModel
from predictor.timing.kernels.collective import PiecewiseCollective, latency_steps, wire_factor
from predictor.timing.kernels.roofline_fit import FittedRoofline
from predictor.timing.kernels.state import unwrap
from predictor.timing.platforms.schema import Platform

__all__ = ["base_platform", "calibrated_platform", "collective_wait", "is_device", "with_device_host_model"]


def base_platform(dev: torch.device, level: Level) -> Platform:
    """The platform calibration refines (measured cpu-local, or the GPU's catalog entry)."""
    if dev.type == "cpu":
        from predictor.timing.platforms.cpu_local import measure_cpu_local

        return measure_cpu_local(cache=level == "tiny")
    from predictor.timing.platforms import load_catalog

    gpu = torch.cuda.get_device_name(dev).lower()
    catalog = load_catalog()
    for key, p in catalog.items():
        tokens = [t for t in key.split("-") if t not in ("sxm", "sxm2", "pcie", "nvl")]
        if p.kind == "gpu" and tokens and all(t in gpu.replace(" ", "") or t in gpu for t in tokens):
            return p
    for key, p in catalog.items():  # model family only (e.g. "h100")
        if p.kind == "gpu" and key.split("-")[0] in gpu:
            return p
    raise CalibrationError(f"GPU {torch.cuda.get_device_name(dev)!r} is not in the catalog; add an entry to calibrate it")


def collective_wait(table: pd.DataFrame | None, world: int) -> dict[str, float] | None:
    """Per collective kind, seconds a call over ``world`` local ranks waits on average beyond its typical time:
    the median, over that kind's benchmarked sizes in ``table``, of ``call_mean_s - seconds`` (mean over all
    single calls minus their median; at least 0). None where the table has no single-call means (packs whose
    collectives were timed as batch means, whose median already mixes the waits in)."""
    if table is None or not {"call_mean_s", "world", "kind"} <= set(table.columns):
        return None
    rows = table[table["world"] == world]
    gap = pd.to_numeric(rows["call_mean_s"], errors="coerce") - pd.to_numeric(rows["seconds"], errors="coerce")
    waits = {str(k): float(max(0.0, np.median(g.dropna()))) for k, g in gap.groupby(rows["kind"]) if g.notna().any()}
    return waits or None


def _measured_peaks(fields: dict, sources: dict, gemm: pd.DataFrame | None, src: str) -> None:
    """``fields``' peak FLOP/s per dtype set to the best rate the GEMM benchmarks achieved."""
    if gemm is None or not len(gemm):
        return
    peaks = dict(fields["peak_flops"])
    for dt_bytes, dtype in ((4, "fp32"), (2, "bf16")):
        sel = gemm[gemm["dtype_bytes"] == dt_bytes]
        if len(sel):
            peaks[dtype] = float((sel["flops"] / sel["seconds"]).max())
            sources[f"peak_flops.{dtype}"] = f"{src}: best achieved rate over the GEMM microbenchmarks"
    fields["peak_flops"] = peaks


def _measured_memory(fields: dict, sources: dict, models: dict[str, KernelModel], src: str) -> None:
    """``fields``' memory bandwidths and kernel floor from the fitted memcpy roofline."""
    roof = unwrap(models["roofline"]) if "roofline" in models else None
    if not (isinstance(roof, FittedRoofline) and "memcpy" in roof.fits):
        return
    fit = roof.fits["memcpy"]
    mem = [dict(m) for m in fields["memory"]]
    mem[-1]["bandwidth_bytes_per_s"] = float(fit.bandwidths[-1])
    sources[f"memory.{len(mem) - 1}.bandwidth_bytes_per_s"] = f"{src}: fitted memcpy roofline, largest sizes"
    if len(mem) > 1:
        mem[0]["bandwidth_bytes_per_s"] = max(float(fit.peak_bandwidth), mem[-1]["bandwidth_bytes_per_s"])
        sources["memory.0.bandwidth_bytes_per_s"] = f"{src}: fitted memcpy roofline, peak regime"
    fields["memory"] = mem
    fields["kernel_floor_s"] = float(min(f.floor_s for f in roof.fits.values()))
    sources["kernel_floor_s"] = f"{src}: smallest fitted roofline floor"
    fields["memory_efficiency"] = 1.0


def _measured_interconnect(fields: dict, sources: dict, models: dict[str, KernelModel], base: Platform,
                           data: dict[str, pd.DataFrame], world_size: int, src: str) -> None:
    """``fields``' intra-node latency and bandwidth from the fitted all-reduce curve, and the collectives'
    mean waits (CPU)."""
    coll = unwrap(models["collectives"]) if "collectives" in models else None
    if isinstance(coll, PiecewiseCollective) and ("all_reduce", world_size) in coll.params:
        c = coll.params[("all_reduce", world_size)]
        ic = dict(fields["interconnect"])
        ic["intra_node_latency_s"] = float(c.ts / latency_steps("all_reduce", world_size))
        ic["intra_node_bandwidth_bytes_per_s"] = float(c.bw_max * wire_factor("all_reduce", world_size))
        fields["interconnect"] = ic
        sources["interconnect.intra_node_latency_s"] = f"{src}: fitted all-reduce start-up latency / ring steps"
        sources["interconnect.intra_node_bandwidth_bytes_per_s"] = f"{src}: fitted all-reduce bandwidth x ring factor"
    wait = collective_wait(data.get("collectives"), world_size) if base.kind == "cpu" else None
    if wait is not None:
        fields["collective_wait_s"] = {world_size: wait}
        sources["collective_wait_s"] = (f"{src}: per kind, median over the benchmarked sizes of the mean single "
                                        "call minus the median single call")
    elif data.get("collectives") is not None:  # curves from batch means: no separate wait
        fields["collective_wait_s"] = {}
        sources.pop("collective_wait_s", None)


def _measured_contention(fields: dict, sources: dict, contention: dict[str, float], world_size: int,
                         src: str) -> None:
    """``fields``' host-contention factors of ``world_size`` processes; a refit keeping them keeps their source."""
    from predictor.timing.calibration.contention import CONTENTION_ESTIMATOR

    hc = fields.get("host_contention") or {}
    stored = dict(hc.get(world_size) or hc.get(str(world_size)) or {})
    fields["host_contention"] = {world_size: dict(contention)}
    classes = {k: v for k, v in contention.items() if k != "sync"}
    kept = {k: v for k, v in stored.items() if k != "sync"} == classes
    if classes and not (kept and "host_contention" in sources):
        sources["host_contention"] = (f"{src}: probe kernels, {world_size} processes at once vs alone, "
                                      f"'{CONTENTION_ESTIMATOR}' estimator (predictor/timing/calibration/contention.py)")
    if "sync" in contention and not (stored.get("sync") == contention["sync"]
                                     and "host_contention.sync" in sources):
        sources["host_contention.sync"] = (f"{src}: {world_size} processes in lockstep vs at once "
                                           "(predictor/timing/calibration/lockstep.py)")


def calibrated_platform(base: Platform, name: str, data: dict[str, pd.DataFrame], models: dict[str, KernelModel],
                        overheads: dict, world_size: int, contention: dict[str, float] | None = None) -> Platform:
    """``base`` with measured peaks, bandwidths, collective latency and overheads (seconds)."""
    today = _dt.date.today().isoformat()
    src = f"tuner calibrate {today}"
    fields = base.model_dump(mode="json")
    sources = dict(fields.get("sources") or {})
    fields["key"] = name
    fields["name"] = f"{base.name} (calibrated {today})"
    _measured_peaks(fields, sources, data.get("gemm"), src)
    _measured_memory(fields, sources, models, src)
    _measured_interconnect(fields, sources, models, base, data, world_size, src)
    if contention:
        _measured_contention(fields, sources, contention, world_size, src)
    fields["overheads"] = {k: float(overheads[k]) for k in ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s")}
    sources["overheads"] = f"{src}: profiled training run, whisker-trimmed means ({overheads.get('definition', '')})"
    fields["sources"] = sources
    note = "Calibrated by tuner calibrate; kernel models in the asset pack."
    if note not in (fields.get("notes") or ""):  # a refit starts from a calibrated platform
        fields["notes"] = ((fields.get("notes") or "") + " " + note).strip()
    platform = Platform.model_validate(fields)
    if is_device(overheads) and overheads.get("iteration_s_unprofiled"):
        platform = with_device_host_model(platform, models, overheads, src)
    return platform


def is_device(overheads: dict) -> bool:
    """Whether the overheads were measured on an accelerator (CUDA runtime calls as launches)."""
    return str(overheads.get("device", "")).startswith("cuda") or "CUDA" in str(overheads.get("definition", ""))


def with_device_host_model(platform: Platform, models: dict[str, KernelModel], overheads: dict, src: str) -> Platform:
    """``platform`` with the device host model (:mod:`predictor.timing.calibration.step_graph`): T1..T5 scaled by the
    calibration step's unprofiled / profiled ratio, ``step_s`` closed on that step with the fitted models."""
    from predictor.timing.calibration.step_graph import device_overheads
    from predictor.timing.kernels.timing import ModelTiming, analytic_models

    timing = ModelTiming(platform, [*models.values(), *analytic_models()])
    d = device_overheads(overheads, timing)
    fields = platform.model_dump()
    fields["overheads"] = {k: d[k] for k in ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s", "step_s", "sparse_table_s")}
    closure = (f"step_s = its unprofiled step {overheads['iteration_s_unprofiled'] * 1e3:.3f} ms - the simulated "
               f"{d['simulated_step_s'] * 1e3:.3f} ms")
    if "simulated_dense_step_s" in d:
        closure = (f"step_s = its dense-only step {overheads['iteration_s_unprofiled_dense'] * 1e3:.3f} ms - the "
                   f"simulated {d['simulated_dense_step_s'] * 1e3:.3f} ms; sparse_table_s = the full step's remainder "
                   f"({overheads['iteration_s_unprofiled'] * 1e3:.3f} ms measured, {d['simulated_step_s'] * 1e3:.3f} ms "
                   "simulated) over its 4 tables")
    fields["sources"] = {**fields["sources"], "overheads": (
        f"{src}: profiled training run, whisker-trimmed means x the step's unprofiled / profiled time "
        f"{d['profiler_ratio']:.3f}; {closure} (predictor/timing/calibration/step_graph.py)")}
    return Platform.model_validate(fields)
