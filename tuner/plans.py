"""Predict one TP/PP/DP plan of a transformer: its graph, its memory, and the one cost function.

:func:`predict_plan` is what ``tuner predict --workload``, every ``space: parallel`` evaluation
and the Megatron validation call. A plan whose memory does not fit is reported infeasible with
the stage, the bytes and the device capacity — without simulating it (the reason is the same one
:func:`tuner.cost.evaluate_graph` would give). Every other plan is built with
:func:`predictor.sources.synth.transformer.build_transformer_graph` and costed by
:func:`tuner.cost.evaluate_graph`.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from predictor.simulate import Timeline
from predictor.sources.synth.transformer import (
    ParallelPlan,
    PlanError,
    TransformerSpec,
    build_transformer_graph,
    check_plan,
    transformer_timing,
)
from predictor.sources.synth.transformer_memory import memory_per_stage
from predictor.timing.platforms.schema import Platform
from tuner.cost import evaluate_graph
from tuner.launch import torchtitan_plan, torchtitan_spec

__all__ = ["PLAN_FIELDS", "predict_plan", "plan_from_fields", "peak_flops", "coerce", "unsupported_precision"]

#: ParallelPlan field -> type, for ``--set key=value`` and search parameters
PLAN_FIELDS: dict[str, type] = {f.name: f.type for f in fields(ParallelPlan)}


def peak_flops(spec: TransformerSpec, platform: Platform) -> float:
    """Dense peak FLOP/s of the platform in the model's dtype."""
    return platform.flops_for(spec.dtype)


def plan_from_fields(values: dict, base: ParallelPlan | None = None) -> ParallelPlan:
    """A plan from ``{field: value}`` over ``base``; raises :class:`PlanError` for unknown fields."""
    unknown = sorted(set(values) - set(PLAN_FIELDS))
    if unknown:
        raise PlanError(f"unknown plan field(s) {', '.join(unknown)}; known: {', '.join(PLAN_FIELDS)}")
    return replace(base or ParallelPlan(), **values)


def missing_peak(platform: Platform, dtype: str) -> str | None:
    """Why ``platform`` cannot price GEMMs in ``dtype`` from the catalog (it lists no peak for it, so they would run
    at another format's: Gaudi2's fp32 at its bf16 432 TFLOP/s, 22x the A100's fp32), or None."""
    if platform.lists_peak(dtype):
        return None
    return (f"{platform.key} has no {dtype} peak in the catalog (its {dtype} GEMMs would be priced at "
            f"{platform.flops_for(dtype) / 1e12:.0f} TFLOP/s, another format's peak); give the chip's {dtype} peak "
            "in a catalog file")


def unsupported_precision(spec: TransformerSpec, platform: Platform) -> str | None:
    """Why ``platform`` cannot run ``spec``'s precision (FP8 linears on a chip the catalog gives no fp8 peak, which
    would be priced at its fp32 peak; a model dtype whose peak it does not list), or None."""
    if spec.fp8_linear and "fp8" not in platform.peak_flops:
        return (f"{platform.key} has no FP8 peak in the catalog, and fp8_linear runs on FP8 tensor cores (H100, H200, "
                "B200, MI300X); give the chip's fp8 peak in a catalog file")
    return missing_peak(platform, spec.dtype)


def predict_plan(
    spec: TransformerSpec,
    plan: ParallelPlan,
    platform: Platform,
    *,
    devices_per_node: int | None = None,
    devices: int | None = None,
    detail: str = "auto",
    keep_timeline: bool = False,
    memory_fraction: float = 1.0,
) -> tuple[dict, Timeline | None]:
    """Predict ``plan``: a result dict (seconds, bytes, FLOP/s) and, if asked, the timeline. The plan must
    fit in ``memory_fraction`` of each device's memory.

    Raises :class:`PlanError` when the plan cannot run at all (heads not divisible by ``tp``,
    more stages than layers, ``tp*pp*dp != devices``, FP8 linears on a chip without an FP8 peak...). A plan
    that runs out of memory is a result with ``feasible=False`` and ``status="infeasible"``.
    """
    check_plan(spec, plan, devices)
    refused = unsupported_precision(spec, platform)
    if refused:
        raise PlanError(refused)
    dpn = devices_per_node or platform.devices_per_node
    mem = memory_per_stage(spec, plan)
    totals = np.asarray([m.total_bytes for m in mem])
    worst = int(np.argmax(totals))
    cap = platform.memory_bytes * memory_fraction
    base = {
        "plan": plan.label(),
        "params": plan.to_dict(),
        "devices": plan.devices,
        "micro_batches": plan.micro_batches,
        "memory_bytes_per_device": float(totals.max()),
        "memory_per_stage": [m.as_dict() for m in mem],
        "device_memory_bytes": platform.memory_bytes,
    }
    if memory_fraction < 1.0:
        base["usable_memory_bytes"] = cap
    if totals.max() > cap:
        base.update(
            status="infeasible",
            feasible=False,
            reason=f"stage {worst} needs {totals[worst] / 2**30:.1f} GiB per device, "
            f"{platform.key} has {platform.memory_bytes / 2**30:.1f} GiB"
            + (f" ({memory_fraction:.0%} usable: {cap / 2**30:.1f} GiB)" if memory_fraction < 1.0 else ""),
            predicted_iteration_s=None,
        )
        return base, None
    timing = transformer_timing(platform)
    graph = build_transformer_graph(spec, plan, devices_per_node=dpn, detail=detail, timing=timing,  # type: ignore[arg-type]
                                    mode="host" if platform.kind == "cpu" else "device", check=False)
    res, tl = evaluate_graph(graph, timing, totals, platform, n_devices=plan.devices)
    it = res.predicted_iteration_s
    model_flops = spec.iteration_flops(plan.global_batch)
    per_device = model_flops / max(it, 1e-30) / plan.devices
    base.update(
        status="ok" if res.feasible else "infeasible",
        feasible=res.feasible,
        reason=res.reason,
        predicted_iteration_s=it,
        samples_per_s=plan.global_batch / it,
        tokens_per_s=plan.global_batch * spec.seq / it,
        model_tflops_per_device=per_device / 1e12,
        mfu=per_device / peak_flops(spec, platform),
        per_stage_s=res.per_rank_s,
        kernel_sum_s=res.kernel_sum_s,
        breakdown=res.breakdown,
        usd_per_iteration=res.usd_per_iteration,
        timing_source=res.timing_source,
        graph={"tasks": graph.n_tasks, "ranks": graph.n_ranks, "detail": graph.meta.get("detail")},
    )
    return base, (tl if keep_timeline else None)


def coerce(name: str, raw: str) -> int | bool | str | tuple[int, ...] | None:
    """Parse the text of ``--set name=raw`` into the plan field's type; raises :class:`PlanError`."""
    if name not in PLAN_FIELDS:
        raise PlanError(f"unknown plan field {name!r}; known: {', '.join(PLAN_FIELDS)}")
    typ = str(PLAN_FIELDS[name])
    text = raw.strip()
    if typ.startswith("tuple[int"):  # stage_layers: layers per virtual stage, comma-separated (none: even)
        if text.lower() == "none":
            return None
        try:
            return tuple(int(n) for n in text.strip("()[]").split(","))  # type: ignore[return-value]
        except ValueError:
            raise PlanError(f"{name} must be whole numbers separated by commas, e.g. 15,16,16,15 (got {raw!r})") from None
    if typ == "int | None":  # e.g. recompute_layers: a count, or none for every layer
        if text.lower() == "none":
            return None  # type: ignore[return-value]
        typ = "int"
    if typ == "int":
        try:
            return int(text)
        except ValueError:
            raise PlanError(f"{name} must be an integer (got {raw!r})") from None
    if typ == "bool":
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise PlanError(f"{name} must be true or false (got {raw!r})")
    allowed = _literal_values(typ)
    if allowed and text not in allowed:
        raise PlanError(f"{name} must be one of {', '.join(allowed)} (got {raw!r})")
    return text


def _literal_values(typ: str) -> list[str]:
    if not typ.startswith("Literal["):
        return []
    return [x.strip().strip("'\"") for x in typ[len("Literal["):-1].split(",")]


def torchtitan_iteration_s(spec: TransformerSpec, plan: ParallelPlan, platform: Platform, predicted_s: float | None, *,
                           devices_per_node: int, devices: int, detail: str = "auto") -> float | None:
    """Iteration seconds of ``plan`` as its written torchtitan job runs it (:func:`~tuner.launch.torchtitan_plan`,
    :func:`~tuner.launch.torchtitan_spec`): ``predicted_s``, the plan's own prediction, where that is the same run."""
    tt, tt_spec = torchtitan_plan(plan, spec), torchtitan_spec(spec)
    if tt == plan and tt_spec == spec:
        return predicted_s
    res, _ = predict_plan(tt_spec, tt, platform, devices_per_node=devices_per_node, devices=devices, detail=detail)
    return res["predicted_iteration_s"]
