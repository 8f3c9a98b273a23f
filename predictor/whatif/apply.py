"""What-if edits of a captured execution graph (Lumos §3.4) and their prediction.

Every transform is a pure function ``ExecutionGraph -> ExecutionGraph`` on a graph that
carries the auxiliary columns of :mod:`predictor.sources.traces.step_graphs` (a captured step); none
mutates its input, and all work on columns (one fancy-index per column, position keys for
insertion — :class:`~predictor.graph.edit.GraphEditor`). They live one per module in
:mod:`predictor.whatif` and are re-exported here with the ``WhatIf`` spec that chains them:

* :func:`scale_batch` — multiply every batch-dependent kernel parameter column by
  ``s ** x`` (``x``: the exponent annotate measured by doubling the batch dimension) and
  mark those tasks changed; ``ratio`` keeps the work ratio for kinds without a model.
* :func:`set_layers` — find the repeated layer blocks (:func:`detect_layers`: the
  tandem repeat of top-level-op signatures — name and input shapes — covering the most
  time in the forward pass, with the same count in the backward pass and, where the
  optimizer runs one op per parameter, in the optimizer step) and duplicate the last block
  or drop blocks; copies go right after their original on every processor, edges into and
  out of a block are given to each copy, so the graph stays acyclic.
* :func:`scale_dp` — data parallelism: a graph without collectives becomes ``dp`` replicas
  with DDP's gradient all-reduce per bucket (gradients in the order they became ready,
  first bucket 1 MiB then 25 MiB as ``torch.nn.parallel.DistributedDataParallel``), one
  collective group per bucket across replicas on a communication thread (host) or stream
  (device), the reducer's per-gradient copy into the bucket and the copy back after the
  wait at the end of backward; a graph with collectives keeps its ranks and re-times them
  for the new world size (Lumos: "only the communication needs adjustment").
* :func:`restage_pp` — pipeline parallelism: layers split evenly into ``pp`` stages
  (embedding side on the first, head and loss on the last), each micro-batch's forward and
  backward a scaled copy of the stage's tasks, ordered by the 1F1B schedule of
  :func:`predictor.sources.synth.pipeline_schedule.one_f_one_b`, with send/recv pairs as
  collective groups of two (sends on a per-direction p2p thread so blocking receives
  cannot deadlock the schedule).
* :func:`move_platform` — mark every kernel task for re-timing on another platform; a
  host-mode (CPU) graph moved to an accelerator gets device mode: a launch (T4) on the
  thread and the kernel on a stream, the step end waiting for the stream.
* :func:`speed_up` — divide one op kind's durations by a factor.

:class:`WhatIfTiming` times the result: unchanged tasks keep their (profiler-corrected)
measured durations; changed tasks whose kind has a kernel model on the target platform
get the model's time (``retime="model"``) or their measured time times the model's ratio
new/old (``retime="anchored"``; the default ``auto`` anchors on the captured platform — the
measurement carries what the model misses, such as cache state inside a training step, and
a GPU op whose several kernels all carry the op's shape — and uses plain model times on
another platform); changed tasks without a model keep their measured time times the work
ratio; new tasks (collectives, DDP copies) always take the model's time.
:func:`predict_trace` runs the whole chain for ``tuner predict TRACE --set ...``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from predictor.graph import ExecutionGraph
from predictor.timing.platforms.host import comm_thread_has_core
from predictor.whatif import (
    LayerInfo,
    WhatIfError,
    WhatIfTiming,
    detect_layers,
    move_platform,
    restage_pp,
    scale_batch,
    scale_dp,
    set_layers,
    speed_up,
)
from predictor.whatif.common import MIB
from predictor.whatif.platform import explain_move

__all__ = [
    "WhatIf",
    "WhatIfError",
    "parse_sets",
    "LayerInfo",
    "detect_layers",
    "scale_batch",
    "set_layers",
    "scale_dp",
    "restage_pp",
    "move_platform",
    "speed_up",
    "apply_whatif",
    "WhatIfTiming",
    "predict_trace",
    "WhatIfResult",
]



# ============================================================================ the spec
class WhatIf(BaseModel):
    """What to change (``tuner predict TRACE --set key=value``).

    ``batch_size``/``layers``: the new per-rank batch size / number of repeated layer
    blocks, or a factor written ``x2`` (``0.5x``, ``x0.5``). ``dp``, ``pp``: data- and
    pipeline-parallel degrees (captured: the trace's). ``micro_batches``: pipeline
    micro-batches (default ``pp``). ``speedup``: op kind -> factor (``--set speedup.mm=2``).
    ``retime``: how changed tasks with a kernel model are timed (see :class:`WhatIfTiming`);
    ``auto``: ``anchored`` on the captured platform, ``model`` on another one.
    ``base_batch_size``/``base_layers``: override what was detected in the trace.
    ``bucket_mb``/``first_bucket_mb``: DDP bucket caps. ``captured_on``: catalog key of the
    platform the trace was captured on (CPU captures: ``cpu-local``). ``comm_overlap``: does a
    host-mode rank's gloo thread get a core of its own (default: yes unless this machine has
    fewer cores than ``dp x (torch threads + 1)``, when the capture ran here).
    """

    model_config = ConfigDict(extra="forbid")

    batch_size: str | None = None
    layers: str | None = None
    dp: int | None = Field(default=None, ge=1, le=65536)
    pp: int | None = Field(default=None, ge=1, le=1024)
    micro_batches: int | None = Field(default=None, ge=1, le=100000)
    speedup: dict[str, float] = Field(default_factory=dict)
    retime: Literal["auto", "model", "anchored"] = "auto"
    base_batch_size: int | None = Field(default=None, ge=2)
    base_layers: int | None = Field(default=None, ge=2)
    bucket_mb: float = Field(default=25.0, gt=0)
    first_bucket_mb: float = Field(default=1.0, gt=0)
    captured_on: str | None = None
    comm_overlap: bool | None = None

    @field_validator("batch_size", "layers")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        if v is None:
            return v
        _parse_size(str(v))
        return str(v)

    @field_validator("speedup")
    @classmethod
    def _speed(cls, v: dict[str, float]) -> dict[str, float]:
        for k, f in v.items():
            if not (f > 0 and math.isfinite(f)):
                raise ValueError(f"speedup.{k} must be a positive number (got {f})")
        return v

    def target(self, field_name: str, base: int | None) -> float | None:
        """The new value of ``batch_size`` or ``layers`` given the captured one (None: unchanged)."""
        raw = getattr(self, field_name)
        if raw is None:
            return None
        value, is_factor = _parse_size(raw)
        if is_factor:
            if base is None:
                return None
            return base * value
        return value


def _parse_size(text: str) -> tuple[float, bool]:
    """``"64"`` -> (64, False); ``"x2"``/``"2x"`` -> (2, True)."""
    t = text.strip().lower()
    is_factor = t.startswith(("x", "*")) or t.endswith("x")
    num = t.strip("x*")
    try:
        v = float(num)
    except ValueError:
        raise ValueError(f"expected a number or a factor like x2, got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"must be positive, got {text!r}")
    if not is_factor and v != int(v):
        raise ValueError(f"must be a whole number (or a factor like x1.5), got {text!r}")
    return v, is_factor


_KEYS = tuple(WhatIf.model_fields)


def parse_sets(items: Iterable[str]) -> WhatIf:
    """``["batch_size=64", "dp=2", "speedup.mm=2"]`` -> :class:`WhatIf`.

    Raises:
        WhatIfError: malformed item, unknown key, or a bad value (one line).
    """
    data: dict = {}
    for item in items:
        if "=" not in item:
            raise WhatIfError(f"--set {item!r}: expected key=value, e.g. --set batch_size=64")
        key, raw = (s.strip() for s in item.split("=", 1))
        if key.startswith("speedup."):
            kind = key.split(".", 1)[1]
            try:
                data.setdefault("speedup", {})[kind] = float(raw)
            except ValueError:
                raise WhatIfError(f"--set {key}: expected a number, got {raw!r}") from None
            continue
        if key not in _KEYS or key == "speedup":
            raise WhatIfError(f"--set {key}: unknown key; known: {', '.join(k for k in _KEYS if k != 'speedup')}, "
                              "speedup.KIND")
        data[key] = raw
    try:
        return WhatIf.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(x) for x in e["loc"]) or "value"
        msg = e["msg"].removeprefix("Value error, ")
        raise WhatIfError(f"--set {loc}: {msg}") from None


# ============================================================================ the whole chain
def apply_whatif(g: ExecutionGraph, spec: WhatIf, *, base_batch: int | None, device_target: bool | None,
                 issue_s: float = 5e-6, comm_overlap: bool = True) -> tuple[ExecutionGraph, dict]:
    """Apply ``spec`` to one captured step: platform, batch, layers, pp, dp, speed-ups (in that order).
    ``device_target``: None (platform unchanged), True/False (moved to an accelerator / a CPU)."""
    changes: dict = {}
    if device_target is not None:
        g = move_platform(g, device_target)
    b0 = spec.base_batch_size or base_batch
    new_b = spec.target("batch_size", b0)
    if spec.batch_size is not None:
        if b0 is None:
            raise WhatIfError("batch_size: the captured batch size was not found; give --set base_batch_size=N")
        f = float(new_b) / float(b0)
        if f != 1.0:
            g = scale_batch(g, f)
        changes["batch_size"] = {"from": b0, "to": int(new_b) if float(new_b).is_integer() else new_b, "factor": f,
                                 "tasks_rescaled": int(g.meta.get("whatif", {}).get("batch_changed_tasks", 0))}
    if spec.layers is not None:
        info = detect_layers(g, spec.base_layers)
        target = spec.target("layers", info.count)
        if target is None or abs(target - round(target)) > 1e-9:
            raise WhatIfError(f"layers: {spec.layers} of {info.count} layers is not a whole number")
        g = set_layers(g, int(round(target)), base=spec.base_layers)
        changes["layers"] = {"from": info.count, "to": int(round(target)), "ops_per_layer_forward": info.period,
                             "notes": g.meta.get("whatif", {}).get("layer_notes", [])}
    if spec.pp is not None and spec.pp > 1:
        g = restage_pp(g, spec.pp, spec.micro_batches, base_layers=None if spec.layers else spec.base_layers)
        w = g.meta.get("whatif", {})
        changes["pp"] = {"from": 1, "to": spec.pp, "micro_batches": w.get("micro_batches"),
                         "layers_per_stage": w.get("pp_layers_per_stage"), "schedule": "1f1b"}
    if spec.dp is not None and spec.dp > 1:
        n_ranks = int(np.unique(g.rank).size)
        g = scale_dp(g, spec.dp, bucket_bytes=spec.bucket_mb * MIB, first_bucket_bytes=spec.first_bucket_mb * MIB,
                     issue_s=issue_s, comm_overlap=comm_overlap)
        w = g.meta.get("whatif", {})
        changes["dp"] = {"from": n_ranks if w.get("dp_mode", "").startswith("re-timed") else 1, "to": spec.dp,
                         "mode": w.get("dp_mode"), "buckets": w.get("ddp_buckets"),
                         "replicas_simulated": w.get("dp_replicas_simulated"), "all_reduce": w.get("ddp_comm")}
    for kind, f in spec.speedup.items():
        g = speed_up(g, kind, f)
    if spec.speedup:
        changes["speedup"] = dict(spec.speedup)
    return g, changes


#: a replayed step this many times the capture's unprofiled step (or its inverse) marks the capture unreliable;
#: replays of the committed captures sit within a few percent of it
REPLAY_DRIFT_LIMIT = 1.5


@dataclass
class WhatIfResult:
    """A what-if prediction: ``summary()`` is the ``--json`` document."""

    source: str
    predicted_iteration_s: float
    baseline_measured_s: float
    baseline_kind: str
    baseline_replayed_s: float
    baseline_profiled_s: float
    changes: dict
    timing_source: str
    platform: str
    retime_counts: dict
    annotation: dict
    per_step_predicted_s: list[float]
    notes: list[str] = field(default_factory=list)
    timeline: object = None
    fallback: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {
            "source": self.source,
            "predicted_iteration_s": self.predicted_iteration_s,
            "baseline_measured_s": self.baseline_measured_s,
            "baseline_kind": self.baseline_kind,
            "baseline_replayed_s": self.baseline_replayed_s,
            "baseline_profiled_s": self.baseline_profiled_s,
            "speedup_vs_baseline": (self.baseline_measured_s / self.predicted_iteration_s
                                    if self.predicted_iteration_s > 0 else None),
            "changes": self.changes,
            "timing_source": self.timing_source,
            "platform": self.platform,
            "retimed_tasks": self.retime_counts,
            "fallback": self.fallback,
            "annotation": self.annotation,
            "per_step_predicted_s": self.per_step_predicted_s,
            "notes": self.notes,
        }


def torch_threads_default() -> int:
    """Threads torch would use here when the capture did not record them (no import of torch)."""
    return max(1, os.cpu_count() or 1)


def steady_state_s(tl) -> float:
    """Seconds per iteration of a training loop repeating the step of timeline ``tl``.

    A captured step ends where its host work ends; its kernels may still be queued. In a loop
    without a host-device synchronisation the host runs ahead (until the launch queue or the
    caching allocator holds it back), so the loop's period is the larger of the step's span and
    the busiest stream's kernel time per step: the bottleneck resource sets the pace. On a host
    graph (no streams) this is the step's span.
    """
    g = tl.graph
    gpu = g.is_gpu()
    if not gpu.any():
        return float(tl.iteration_s)
    busy = np.bincount(g.proc[gpu], weights=(tl.end - tl.start)[gpu], minlength=g.n_procs)
    return float(max(tl.iteration_s, busy.max()))


def predict_trace(path: str | Path, spec: WhatIf, platform: str | None = None, *, extra_catalog: str | Path | None = None,
                  annotated=None) -> WhatIfResult:
    """Load, build, annotate, transform and simulate a captured run under ``spec``.

    ``platform``: target platform (catalog key or asset pack; default: where the trace was
    captured: ``cpu-local`` for CPU captures). ``annotated``: a prepared
    :class:`~predictor.whatif.annotate.AnnotatedTrace` (skips reading).

    Raises:
        TraceError, WhatIfError, UnknownPlatformError, AssetPackError: one-line problems.
    """
    from predictor.simulate import simulate
    from predictor.sources.traces.load import load_traces
    from predictor.timing.kernels import timing_for
    from predictor.timing.platforms import CPU_LOCAL
    from predictor.whatif.annotate import annotate

    at = annotated if annotated is not None else annotate(load_traces(path), base_batch=spec.base_batch_size)
    captured = spec.captured_on or (CPU_LOCAL if at.host_mode else None)
    target = platform or captured
    if target is None:
        needs_model = spec.batch_size is not None or spec.layers is not None or spec.dp or spec.pp
        if needs_model:
            raise WhatIfError("this GPU trace needs --platform (the catalog key of its GPU, or the target) to time "
                              "changed tasks")
        target = "a100-80gb"
    timing = timing_for(target, extra_catalog)
    moved = captured is not None and target.strip().lower() != captured.strip().lower()
    device_target = (timing.platform.kind != "cpu") if moved else None
    issue = float(timing.platform.overheads.t2_s + timing.platform.overheads.t3_s)
    mode = spec.retime if spec.retime != "auto" else ("model" if moved else "anchored")
    overlap = spec.comm_overlap
    if overlap is None:  # a gloo thread per rank needs a core of its own, on this machine
        overlap = not (at.host_mode and not moved and spec.dp and
                       not comm_thread_has_core(spec.dp, at.torch_threads or torch_threads_default()))
    preds, counts, changes, tl, fallback = [], {}, {}, None, {}
    replayed = []
    notes = list(at.notes)
    g0 = at.graphs()[0]
    gloo_ddp = at.host_mode and any(n.startswith(("c10d::allreduce", "torch::distributed::reducer", "torch.distributed.ddp"))
                                       for n in g0.names)
    if gloo_ddp:
        if spec.dp is not None and spec.dp > 1:
            raise WhatIfError("dp: this capture already runs DDP on gloo, whose all-reduce runs on gloo threads "
                              "outside the graph; capture one process without DDP to predict dp")
        notes.append("captured gloo DDP run: its all-reduce waits stay as measured (not re-timed)")
    steady = False
    for sg in at.graphs():
        tl0 = simulate(sg, np.nan_to_num(sg.duration, nan=0.0), launch_fraction=at.launch_fraction)
        replayed.append(steady_state_s(tl0))
        g2, changes = apply_whatif(sg, spec, base_batch=at.base_batch, device_target=device_target, issue_s=issue,
                                   comm_overlap=overlap)
        wt = WhatIfTiming(timing, mode, platform_moved=moved)
        tl = simulate(g2, wt, launch_fraction=at.launch_fraction)
        preds.append(steady_state_s(tl))
        steady = steady or preds[-1] > tl.iteration_s
        counts = wt.counts
        fallback = wt.fallback
    if moved:
        changes["platform"] = {"from": captured, "to": timing.platform.key, "device_mode": bool(device_target)}
        if tl is not None:
            changes["platform"].update(explain_move(tl, captured, timing.platform.key, at.host_mode))
            notes.append(changes["platform"]["explanation"])
    if steady:
        notes.append("a GPU stream's work per step exceeds the step's host span: the iteration is the stream's "
                     "busy time (an unsynchronised loop runs the host ahead; the GPU sets the pace)")
    stat = at.unprofiled_stat
    base_kind = f"unprofiled iterations of the capture ({stat})" if at.unprofiled_s is not None else \
        "profiled ProfilerStep (median; no unprofiled iterations recorded)"
    baseline = at.unprofiled_s if at.unprofiled_s is not None else float(np.median(at.measured_step_s))
    drift = float(np.median(replayed)) / baseline if at.unprofiled_s and baseline > 0 else 1.0
    if not 1 / REPLAY_DRIFT_LIMIT <= drift <= REPLAY_DRIFT_LIMIT:
        notes.insert(0, f"unreliable capture: the replayed step ({np.median(replayed) * 1e3:.3f} ms) is {drift:.3g}x "
                        f"the unprofiled one ({baseline * 1e3:.3f} ms), more than the profiler's per-event cost "
                        "explains (other work on the cores while profiling?); the prediction starts from the replayed "
                        "step: capture again on an idle machine")
    ann = {"base_batch": at.base_batch, "batch_source": at.batch_source, "steps": len(at.steps),
           "steps_combined": at.combine,
           "host_mode": at.host_mode, "profiler_cost_per_event_s": at.profiler_cost_s,
           "profiler_cost_source": at.profiler_cost_source, "torch_threads": at.torch_threads,
           "profiled_extra_faults_per_step": at.extra_faults_per_step, "profiled_extra_fault_s": at.extra_fault_s,
           **at.counts}
    return WhatIfResult(
        source=str(path), predicted_iteration_s=float(np.median(preds)), baseline_measured_s=float(baseline),
        baseline_kind=base_kind, baseline_replayed_s=float(np.median(replayed)),
        baseline_profiled_s=float(np.median(at.measured_step_s)), changes=changes,
        timing_source=getattr(timing, "source", "analytic"), platform=timing.platform.key,
        retime_counts={"mode": mode, **counts},
        annotation=ann, per_step_predicted_s=[float(x) for x in preds], notes=notes, timeline=tl, fallback=fallback,
    )
