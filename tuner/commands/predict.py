"""``tuner predict``: predict one configuration without starting Ray.

Two sources, one ``_predict_*`` function each, chosen in :func:`predict`:

* ``tuner predict --workload MODEL.yaml --set tp=4 --set pp=8 --set dp=16 --set micro_batch=2
  --set global_batch=1536 [--platform a100-80gb] [--json]`` — one TP/PP/DP plan of a transformer.
  ``MODEL.yaml`` is either a model (``layers, hidden, heads, seq, vocab, ...``), a mapping with a
  ``model:`` section (and optionally ``cluster:``, ``global_batch:``, ``options:``), or a whole
  ``space: parallel`` file (its model, cluster, global batch and options are the defaults).
* ``tuner predict TRACE --set batch_size=64 --set layers=x2 --set dp=2 --set pp=2
  [--platform NAME] [--json]`` — what-if on a captured run (``tuner.capture`` folder, Kineto
  file or archive): :func:`predictor.whatif.apply.predict_trace` transforms the captured
  execution graph and simulates it; tasks whose shape or platform changed are re-timed with
  the kernel models of ``--platform`` (an asset pack's calibrated ones when there is one).
* ``tuner predict --megatron-args LAUNCH.sh`` / ``--torchtitan JOB.toml`` / ``--torchtitan MODULE:FUNCTION`` /
  ``--llm-foundry RUN.yaml`` / ``--nemo CONFIG.yaml`` ``[--workload MODEL.yaml]`` — an existing launch read back as a plan
  (:mod:`tuner.launch`) and predicted
  like a workload plan. ``--launch DIR`` writes a workload's or launch's plan as ``megatron_args.txt``,
  ``torchtitan.toml`` and ``torchtitan_recipe.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from tuner.commands.common import console, fail

SOURCES = ("--workload MODEL.yaml, a captured TRACE, --megatron-args FILE, --torchtitan FILE|MODULE:FUNCTION, "
           "--llm-foundry FILE or --nemo FILE")


def predict(
    path: Annotated[Path | None, typer.Argument(help="a captured run (tuner.capture folder, Kineto file or .tar.gz) to "
                                                     "predict --set changes of (batch_size, layers, dp, pp, ...)")] = None,
    workload: Annotated[Path | None, typer.Option("--workload", help="transformer model YAML (or a parallel space file)")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="field=value, repeatable; workload: tp, pp, dp, micro_batch, global_batch, schedule, recompute, ..., and the model's doc_len (tokens of a packed document); trace: batch_size, layers, dp, pp, micro_batches, speedup.KIND, retime, ...")] = None,
    platform: Annotated[str | None, typer.Option("--platform", help="catalog key (`tuner catalog`); for a captured run also an asset pack (workload default: its cluster, else a100-80gb; trace default: where it was captured, cpu-local for CPU captures)")] = None,
    catalog: Annotated[Path | None, typer.Option("--catalog", help="user YAML overriding or adding catalog entries")] = None,
    devices_per_node: Annotated[int | None, typer.Option("--devices-per-node", help="default: the workload's cluster or the catalog's")] = None,
    devices: Annotated[int | None, typer.Option("--devices", help="devices of the cluster (default: the workload's nodes x devices per node)")] = None,
    detail: Annotated[str, typer.Option("--detail", help="graph detail: auto, kernel or stage")] = "auto",
    trace: Annotated[Path | None, typer.Option("--trace", help="write the predicted timeline as a Chrome/Perfetto trace")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    megatron: Annotated[Path | None, typer.Option("--megatron-args", help="score a Megatron-LM launch script or argument list (world size from torchrun, else --devices)")] = None,
    torchtitan: Annotated[Path | None, typer.Option("--torchtitan", help="score a torchtitan job: a TOML job config (releases up to v0.2), or a Python configuration MODULE:FUNCTION / FILE.py:FUNCTION (main branch; needs torchtitan importable). Model shape from --workload, else tuner's header, else the configuration (its model tree or flavor)")] = None,
    llmfoundry: Annotated[Path | None, typer.Option("--llm-foundry", help="score an llm-foundry training YAML (MPT with Composer's FSDP; the world size from --devices, the model from the YAML or --workload)")] = None,
    nemo: Annotated[Path | None, typer.Option("--nemo", help="score a NeMo 1.x GPT training YAML (Megatron-core; the world size from its trainer, else --devices)")] = None,
    launch: Annotated[Path | None, typer.Option("--launch", help="write the plan's megatron_args.txt, torchtitan.toml and torchtitan_recipe.py into this folder")] = None,
) -> None:
    """Predict one configuration without Ray: a transformer plan (--workload) or a captured run changed by --set."""
    if workload is not None and path is not None:
        fail(f"give either --workload MODEL.yaml or a TRACE, not both (got {path} and --workload {workload})")
    for flag, value in (("--devices-per-node", devices_per_node), ("--devices", devices)):
        if value is not None and not 1 <= value <= 65536:
            fail(f"{flag} must be 1 .. 65536, got {value}")
    if trace is not None and trace.is_dir():
        fail(f"--trace {trace}: is a folder; give the trace file to write, e.g. {trace / 'trace.json'}")
    if megatron is not None or torchtitan is not None or llmfoundry is not None or nemo is not None:
        _predict_launch(megatron, torchtitan, llmfoundry, nemo, workload, path, set_ or [], platform, catalog,
                        devices_per_node, devices, detail, trace, as_json, launch)
        return
    if workload is not None:
        _predict_workload(workload, set_ or [], platform, catalog, devices_per_node, devices, detail, trace, as_json,
                          launch)
        return
    if path is not None:
        _predict_trace(path, set_ or [], platform, catalog, trace, as_json)
        return
    fail(f"nothing to predict: give {SOURCES}")


# ----------------------------------------------------------------------------- trace what-if
def _predict_trace(path: Path, sets: list[str], platform: str | None, catalog: Path | None, trace: Path | None,
                   as_json: bool) -> None:
    import os

    from predictor.graph import GraphError
    from predictor.sources.traces.errors import TraceError
    from predictor.timing.kernels.assets import AssetPackError
    from predictor.timing.platforms import UnknownPlatformError
    from predictor.whatif.apply import WhatIfError, parse_sets, predict_trace

    if not path.exists():
        fail(f"{path}: no such file or folder")
    if path.is_file() and path.suffix.lower() in (".yaml", ".yml", ".toml", ".sh"):
        fail(f"{path}: a model, space or launch file, not a captured run: give it as --workload {path} (a model or "
             "space YAML) or to --megatron-args / --torchtitan / --llm-foundry / --nemo")
    try:
        spec = parse_sets(sets)
    except WhatIfError as exc:
        fail(str(exc))
    try:
        result = predict_trace(path, spec, platform, extra_catalog=catalog)
    except (TraceError, WhatIfError, UnknownPlatformError, AssetPackError) as exc:
        fail(str(exc))
    except FileNotFoundError as exc:
        fail(f"file not found: {exc.filename}")
    except GraphError as exc:
        fail(f"{path}: the changed graph cannot be simulated ({exc})")
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        if os.environ.get("TUNER_DEBUG"):
            raise
        fail(f"{path}: cannot predict from this trace ({type(exc).__name__}: {exc})")
    _emit(result.summary(), result.timeline, trace, as_json, _print_trace_result)


def _emit(result: dict, timeline, trace: Path | None, as_json: bool, print_table) -> None:
    """Write the Chrome trace when asked (its path goes into ``result``), then print ``result`` as
    JSON or with ``print_table``."""
    if trace is not None and timeline is not None:
        try:
            result["trace"] = str(timeline.write_chrome_trace(trace))
        except OSError as exc:
            fail(f"--trace {trace}: {exc.strerror or exc}")
    if as_json:
        print(json.dumps(result, indent=1, default=_json_default))
        return
    print_table(result)


def _print_trace_result(r: dict) -> None:
    from rich.table import Table

    from predictor.whatif.annotate import faults_worth_noting

    table = Table(title=f"What-if on {r['source']} ({r['platform']})", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row(f"baseline measured ({r['baseline_kind']})", f"{r['baseline_measured_s'] * 1e3:.3f} ms")
    table.add_row("baseline replayed (profiler cost removed)", f"{r['baseline_replayed_s'] * 1e3:.3f} ms")
    table.add_row("predicted iteration", f"{r['predicted_iteration_s'] * 1e3:.3f} ms")
    if r.get("speedup_vs_baseline"):
        table.add_row("speed-up vs baseline", f"{r['speedup_vs_baseline']:.3f}x")
    for key, ch in r["changes"].items():
        if isinstance(ch, dict) and "from" in ch:
            extra = ", ".join(f"{k} {v}" for k, v in ch.items()
                              if k not in ("from", "to", "notes", "explanation", "host_s", "device_busy_s")
                              and v is not None)
            table.add_row(f"change: {key}", f"{ch['from']} -> {ch['to']}" + (f" ({extra})" if extra else ""))
        else:
            table.add_row(f"change: {key}", json.dumps(ch))
    if not r["changes"]:
        table.add_row("changes", "none (replay of the capture)")
    if "explanation" in r["changes"].get("platform", {}):
        table.add_row("host vs device", r["changes"]["platform"]["explanation"])
    for kind, fb in r.get("fallback", {}).items():
        table.add_row(f"no kernel model: {kind}", f"{fb['tasks']} tasks, {fb['how']}")
    table.add_row("timing source", r["timing_source"])
    c = r["retimed_tasks"]
    table.add_row(f"tasks ({c.get('mode', '')}): measured / model / anchored / ratio (no model) / new",
                  f"{c.get('unchanged_measured', 0)} / {c.get('model', 0)} / {c.get('anchored_model', 0)} / "
                  f"{c.get('ratio_no_model', 0)} / {c.get('new_model', 0) + c.get('new_overhead', 0)}")
    a = r["annotation"]
    table.add_row("captured batch size", f"{a.get('base_batch')} ({a.get('batch_source')})")
    table.add_row("profiler cost removed per event", f"{a['profiler_cost_per_event_s'] * 1e6:.2f} µs "
                  f"({a['profiler_cost_source']})")
    if faults_worth_noting(a.get("profiled_extra_fault_s", 0.0), r["baseline_profiled_s"]):
        table.add_row("profiled steps' extra page faults",
                      f"{a['profiled_extra_faults_per_step']:.0f} a step, about {a['profiled_extra_fault_s'] * 1e3:.1f} ms: "
                      "left in the kernels that wrote fresh memory (docs/replay-whatif.md)")
    for note in r.get("notes", []):
        if note != r["changes"].get("platform", {}).get("explanation"):  # shown as "host vs device"
            table.add_row("note", note)
    if "trace" in r:
        table.add_row("trace", r["trace"])
    console.print(table)


# ----------------------------------------------------------------------------- workload
def _load_workload(path: Path) -> tuple:
    """(model section, cluster section or None, global batch or None, options or None, notes) of a YAML file or
    a Hugging Face ``config.json`` (its model; the notes say what tuner prices in place of what it runs)."""
    import yaml
    from pydantic import BaseModel, ConfigDict, ValidationError

    from tuner.search.parallel import ClusterSection, ModelSection, ParallelSpace, PlanOptions
    from tuner.search.schema import format_validation_error

    if not path.exists():
        fail(f"{path}: no such file")
    if path.is_dir():
        fail(f"{path}: is a directory, expected a YAML file")
    if path.suffix == ".json":
        return _load_hf_config(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        fail(f"{path}: YAML syntax error{where}: {getattr(exc, 'problem', None) or exc}")
    except UnicodeDecodeError:
        fail(f"{path}: not a text file")
    if not isinstance(data, dict):
        fail(f"{path}: expected a mapping (a model, or a file with a 'model:' section)")

    class _Workload(BaseModel):
        model_config = ConfigDict(extra="forbid")
        model: ModelSection
        cluster: ClusterSection | None = None
        global_batch: int | None = None
        options: PlanOptions | None = None

    try:
        if data.get("space") == "parallel":
            sp = ParallelSpace.model_validate(data)
            return sp.model, sp.cluster, sp.global_batch, sp.options, []
        if "model" in data:
            w = _Workload.model_validate(data)
            return w.model, w.cluster, w.global_batch, w.options, []
        return ModelSection.model_validate(data), None, None, None, []
    except ValidationError as err:
        fail(f"{path}: {format_validation_error(err)}")


def _load_hf_config(path: Path) -> tuple:
    """:func:`_load_workload` of a Hugging Face ``config.json``: its model, with no cluster, batch or options."""
    from tuner.launch.common import LaunchError
    from tuner.launch.huggingface import read_hf_config_file
    from tuner.search.parallel import ModelSection

    try:
        spec, notes = read_hf_config_file(path)
    except LaunchError as exc:
        fail(str(exc))
    return ModelSection.model_validate(spec.to_dict()), None, None, None, notes


def _predict_workload(path: Path, sets: list[str], platform_key: str | None, catalog: Path | None,
                      devices_per_node: int | None, n_devices: int | None, detail: str, trace: Path | None,
                      as_json: bool, launch: Path | None = None) -> None:
    from dataclasses import replace

    from predictor.sources.synth.transformer import ParallelPlan, PlanError
    from tuner.plans import plan_from_fields, predict_plan
    from tuner.search.parallel import PlanOptions, split_layers

    if detail not in ("auto", "kernel", "stage"):
        fail(f"--detail must be auto, kernel or stage (got {detail!r})")
    model, cluster, global_batch, options, notes = _load_workload(path)
    values, model_sets = _plan_sets(sets)
    platform = _platform(platform_key or (cluster.platform if cluster else "a100-80gb"),
                         catalog or (cluster.catalog if cluster else None))
    dpn = devices_per_node or (cluster.devices_per_node if cluster and cluster.devices_per_node else platform.devices_per_node)
    if dpn < 1:
        fail(f"--devices-per-node must be >= 1 (got {dpn})")
    if n_devices is not None and n_devices < 1:
        fail(f"--devices must be >= 1 (got {n_devices})")
    devices = n_devices or (cluster.nodes * dpn if cluster else None)
    if "global_batch" not in values:
        if global_batch is None:
            fail("global batch unknown: give --set global_batch=N (or global_batch: in the workload file)")
        values["global_batch"] = global_batch
    if "dp" not in values:
        model_parallel = values.get("tp", 1) * values.get("pp", 1) * values.get("cp", 1)
        values["dp"] = (devices // model_parallel if devices and model_parallel > 0 and devices % model_parallel == 0
                        else 1)
    options = options or PlanOptions()
    base = ParallelPlan(**options.plan_fields())
    try:
        plan = plan_from_fields(values, base)
        try:
            layers = split_layers(options.pipeline_split, model.layers, plan.pp, plan.virtual_stages_effective)
        except ValueError as err:
            raise PlanError(str(err)) from None
        if layers is not None and plan.stage_layers is None:
            plan = replace(plan, stage_layers=layers)
        spec = _with_model_sets(model.to_spec(), model_sets)
        result, tl = predict_plan(spec, plan, platform, devices_per_node=dpn, devices=devices, detail=detail,
                                  keep_timeline=trace is not None, memory_fraction=options.memory_fraction)
    except PlanError as exc:
        fail(str(exc))
    if "seq" in model_sets:  # the note on the config's default sequence no longer holds
        notes = [n for n in notes if not n.startswith("trained on")]
    out = {"model": spec.name, "platform": platform.key, **result}
    if notes:
        out["read"] = {"notes": notes}
    if launch is not None:
        out["launch"] = _write_launch(launch, spec, plan, platform, dpn, detail, result)
    _emit(out, tl, trace, as_json, _print_result)


def _plan_sets(sets: list[str]) -> tuple[dict, dict]:
    """``--set field=value`` items as (plan fields, model fields: ``doc_len``, ``seq``, ``vocab``, ``attention``);
    bad ones: one error line, exit 2."""
    from typing import get_args, get_type_hints

    from predictor.sources.synth.transformer import PlanError, TransformerSpec
    from tuner.plans import coerce

    values: dict = {}
    model: dict = {}
    try:
        for item in sets:
            if "=" not in item:
                fail(f"--set {item!r}: expected field=value, e.g. --set tp=4")
            key, raw = (x.strip() for x in item.split("=", 1))
            if key == "doc_len":  # the model's packed-document length (attention masked per document)
                if raw.lower() != "none" and not raw.isdigit():
                    fail(f"--set doc_len must be a whole number of tokens or none (got {raw!r})")
                model[key] = None if raw.lower() == "none" else int(raw)
                continue
            if key in ("seq", "vocab"):  # the training sequence; the vocabulary (a tokenizer tuner does not know)
                if not raw.isdigit() or int(raw) < 1:
                    fail(f"--set {key} must be a positive whole number (got {raw!r})")
                model[key] = int(raw)
                continue
            if key == "attention":  # the attention kernels (a launcher's environment can choose them)
                choices = get_args(get_type_hints(TransformerSpec)["attention"])
                if raw not in choices:
                    fail(f"--set attention must be one of {', '.join(choices)} (got {raw!r})")
                model[key] = raw
                continue
            values[key] = coerce(key, raw)
    except PlanError as exc:
        fail(f"--set: {exc}")
    return values, model


def _with_model_sets(spec, model: dict):
    """``spec`` with the model fields of ``--set`` (an invalid one: one error line, exit 2)."""
    from dataclasses import replace

    from predictor.sources.synth.transformer import PlanError

    if not model:
        return spec
    spec = replace(spec, **model)
    try:
        spec.validate()
    except PlanError as exc:
        fail(f"--set: {exc}")
    return spec


def _platform(key: str, catalog: Path | str | None):
    """The catalog platform ``key`` (unknown key or missing catalog: one error line, exit 2)."""
    from predictor.timing.platforms import CatalogError, UnknownPlatformError, get_platform

    try:
        return get_platform(key, catalog)
    except (UnknownPlatformError, CatalogError) as exc:
        fail(str(exc))
    except FileNotFoundError:
        fail(f"catalog file not found: {catalog}")


def _write_launch(folder: Path, spec, plan, platform, dpn: int, detail: str, result: dict) -> dict:
    """Write the plan's launch files into ``folder``, with the prediction of the plan as torchtitan runs it."""
    from tuner.launch import write_launch_files
    from tuner.plans import torchtitan_iteration_s

    if folder.exists() and not folder.is_dir():
        fail(f"--launch {folder}: not a folder")
    tt_s = torchtitan_iteration_s(spec, plan, platform, result.get("predicted_iteration_s"), devices_per_node=dpn,
                                  devices=plan.devices, detail=detail)
    launch = write_launch_files(folder, spec, plan, platform=platform.key, devices_per_node=dpn,
                                predicted_s=result.get("predicted_iteration_s"), torchtitan_predicted_s=tt_s)
    launch.update(folder=str(folder), torchtitan_predicted_iteration_s=tt_s)
    return launch


# ----------------------------------------------------------------------------- launch files
def _predict_launch(megatron: Path | None, torchtitan: Path | None, llmfoundry: Path | None, nemo: Path | None,
                    workload: Path | None, path: Path | None, sets: list[str], platform_key: str | None,
                    catalog: Path | None, devices_per_node: int | None, n_devices: int | None, detail: str,
                    trace: Path | None, as_json: bool, launch: Path | None) -> None:
    """Score an existing launch: Megatron-LM arguments, a torchtitan TOML or Python configuration, an llm-foundry
    or a NeMo YAML read back as spec + plan."""
    from predictor.sources.synth.transformer import PlanError
    from tuner.launch import (
        LaunchError,
        is_config_ref,
        read_llmfoundry_file,
        read_megatron_file,
        read_nemo_file,
        read_torchtitan_config,
        read_torchtitan_file,
    )
    from tuner.plans import plan_from_fields, predict_plan

    if sum(x is not None for x in (megatron, torchtitan, llmfoundry, nemo)) > 1:
        fail("give one of --megatron-args FILE, --torchtitan FILE, --llm-foundry FILE and --nemo FILE")
    if path is not None:
        fail(f"a launch file and a TRACE cannot be predicted together (got {path})")
    if (megatron is not None or nemo is not None) and workload is not None:
        fail("--workload gives the model of a --torchtitan or --llm-foundry file; Megatron-LM arguments and NeMo "
             "configs carry their own")
    if detail not in ("auto", "kernel", "stage"):
        fail(f"--detail must be auto, kernel or stage (got {detail!r})")
    if n_devices is not None and n_devices < 1:
        fail(f"--devices must be >= 1 (got {n_devices})")
    model, cluster = (_load_workload(workload)[:2] if workload is not None else (None, None))
    if n_devices is None and cluster is not None:  # the workload's cluster sizes a torchtitan shard degree of -1
        n_devices = cluster.nodes * (cluster.devices_per_node
                                     or _platform(cluster.platform, cluster.catalog).devices_per_node)
    try:
        if nemo is not None:
            lp = read_nemo_file(nemo, devices=n_devices)
        elif megatron is not None:
            lp = read_megatron_file(megatron, devices=n_devices)
        elif llmfoundry is not None:
            hint = platform_key or (cluster.platform if cluster else "a100-80gb")
            dpn_hint = devices_per_node or (cluster.devices_per_node if cluster else None) \
                or _platform(hint, catalog or (cluster.catalog if cluster else None)).devices_per_node
            lp = read_llmfoundry_file(llmfoundry, devices=n_devices, devices_per_node=dpn_hint,
                                      spec=model.to_spec() if model is not None else None)
        else:
            given = model.to_spec() if model is not None else None
            ref = Path(str(torchtitan))
            if is_config_ref(str(ref)) and not ref.exists():  # MODULE:FUNCTION, torchtitan's main branch
                lp = read_torchtitan_config(str(ref), devices=n_devices, spec=given)
            else:
                lp = read_torchtitan_file(ref, devices=n_devices, spec=given)
    except LaunchError as exc:
        fail(str(exc))
    values, model_sets = _plan_sets(sets)
    spec = _with_model_sets(lp.spec, model_sets)
    platform = _platform(platform_key or lp.platform or (cluster.platform if cluster else "a100-80gb"),
                         catalog or (cluster.catalog if cluster else None))
    dpn = devices_per_node or lp.devices_per_node or platform.devices_per_node
    if dpn < 1:
        fail(f"--devices-per-node must be >= 1 (got {dpn})")
    try:
        plan = plan_from_fields(values, lp.plan)
        result, tl = predict_plan(spec, plan, platform, devices_per_node=dpn, devices=plan.devices, detail=detail,
                                  keep_timeline=trace is not None)
    except PlanError as exc:
        fail(str(exc))
    out = {"model": spec.name, "platform": platform.key, "launch_file": str(megatron or torchtitan or llmfoundry or nemo),
           "read": lp.summary(), **result}
    if launch is not None:
        out["launch"] = _write_launch(launch, spec, plan, platform, dpn, detail, result)
    _emit(out, tl, trace, as_json, _print_result)


def _print_result(r: dict) -> None:
    from rich.table import Table

    table = Table(title=f"{r['model']} — {r['plan']} on {r['devices']} x {r['platform']}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    it = r.get("predicted_iteration_s")
    table.add_row("predicted_iteration_s", "—" if it is None else f"{it:.4f}")
    table.add_row("memory_bytes_per_device", f"{r['memory_bytes_per_device']:.4g} ({r['memory_bytes_per_device'] / 2**30:.1f} GiB)")
    table.add_row("feasible", "yes" if r["feasible"] else f"no — {r['reason']}")
    if it is not None:
        table.add_row("samples/s", f"{r['samples_per_s']:.2f}")
        table.add_row("model TFLOP/s per device (MFU)", f"{r['model_tflops_per_device']:.1f} ({100 * r['mfu']:.1f}%)")
        b = r["breakdown"]
        table.add_row("slowest stage: exposed compute / comm / overlap / idle (s)",
                      f"{b['exposed_compute_s']:.3f} / {b['exposed_communication_s']:.3f} / {b['overlap_s']:.3f} / {b['idle_s']:.3f}")
        table.add_row("graph", f"{r['graph']['tasks']:,} tasks on {r['graph']['ranks']} stage ranks ({r['graph']['detail']})")
    for note in r.get("read", {}).get("notes", []):
        table.add_row("read", note)
    ignored = r.get("read", {}).get("ignored", [])
    if ignored:  # flags / keys the reader skipped: a typo of one it prices would show here
        more = f" and {len(ignored) - 8} more (--json lists them)" if len(ignored) > 8 else ""
        table.add_row("not read (not priced)", ", ".join(ignored[:8]) + more)
    if "launch" in r:
        table.add_row("launch files", ", ".join(r["launch"]["files"]))
    if "trace" in r:
        table.add_row("trace", r["trace"])
    console.print(table)


def _json_default(x):
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and math.isnan(x):
        return None
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
