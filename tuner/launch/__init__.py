"""Plans that launch: a TP/PP/DP plan as Megatron-LM arguments, a torchtitan TOML (releases up to v0.2) and a
torchtitan Python configuration (its main branch), and each read back; llm-foundry and NeMo training YAMLs read.

Public API (what ``tuner search`` reports, ``tuner predict`` and other searches call)::

    megatron_args(spec, plan) -> list[str]            # Megatron-LM flags of the plan
    torchtitan_toml(spec, plan) -> str                # torchtitan TOML job config
    read_megatron_args(text_or_words) -> LaunchPlan   # a launch script back as spec + plan + devices
    read_torchtitan_toml(text, spec=...) -> LaunchPlan
    torchtitan_recipe(spec, plan) -> str              # torchtitan main: a module whose tuner_plan() is the config
    read_torchtitan_config("MODULE:FUNCTION") -> LaunchPlan   # needs torchtitan (main) importable
    read_llmfoundry_yaml(text, devices=N) -> LaunchPlan  # an llm-foundry training YAML (MPT, Composer FSDP)
    read_nemo_yaml(text) -> LaunchPlan                # a NeMo 1.x GPT training YAML (Megatron-core)
    write_launch_files(out, spec, plan, ...) -> dict  # megatron_args.txt, torchtitan.toml, torchtitan_recipe.py
"""

from __future__ import annotations

from pathlib import Path

from predictor.files import atomic_write_text
from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec
from tuner.launch.common import LaunchError, LaunchPlan
from tuner.launch.llmfoundry import read_llmfoundry_file, read_llmfoundry_yaml
from tuner.launch.megatron import (
    megatron_args,
    megatron_command,
    megatron_launch_text,
    read_megatron_args,
    read_megatron_file,
)
from tuner.launch.nemo import read_nemo_file, read_nemo_yaml
from tuner.launch.torchtitan import (
    read_torchtitan_file,
    read_torchtitan_toml,
    torchtitan_plan,
    torchtitan_spec,
    torchtitan_toml,
)
from tuner.launch.torchtitan_config import (
    RECIPE_FILE,
    is_config_ref,
    plan_from_torchtitan_config,
    read_torchtitan_config,
    torchtitan_recipe,
)

__all__ = ["LaunchError", "LaunchPlan", "MEGATRON_FILE", "TORCHTITAN_FILE", "megatron_args", "megatron_command",
           "megatron_launch_text", "read_megatron_args", "read_megatron_file", "torchtitan_plan", "torchtitan_spec", "torchtitan_toml",
           "read_torchtitan_toml", "read_torchtitan_file", "RECIPE_FILE", "is_config_ref", "plan_from_torchtitan_config",
           "read_torchtitan_config", "torchtitan_recipe", "read_llmfoundry_yaml", "read_llmfoundry_file", "read_nemo_yaml", "read_nemo_file",
           "launch_payload",
           "write_launch_files"]

#: file names of the launch files next to results.json
MEGATRON_FILE = "megatron_args.txt"
TORCHTITAN_FILE = "torchtitan.toml"


def launch_payload(spec: TransformerSpec, plan: ParallelPlan, *, platform: str, devices_per_node: int) -> dict:
    """The launch section of a results document: Megatron-LM arguments and command, torchtitan TOML and Python
    configuration, and the plan as torchtitan runs it with the fields that differ (``{field: [plan's, torchtitan's]}``;
    the model's ``mtp_layers`` too, which torchtitan does not train)."""
    tt = torchtitan_plan(plan, spec)
    changes = {k: [v, tt.to_dict()[k]] for k, v in plan.to_dict().items() if tt.to_dict()[k] != v}
    tspec = torchtitan_spec(spec)
    if tspec.mtp_layers != spec.mtp_layers:
        changes["mtp_layers"] = [spec.mtp_layers, tspec.mtp_layers]
    for field in ("dispatcher", "router_group_topk"):
        if spec.moe is not None and tspec.moe is not None and getattr(spec.moe, field) != getattr(tspec.moe, field):
            changes[f"moe.{field}"] = [getattr(spec.moe, field), getattr(tspec.moe, field)]
    return {
        "megatron_args": megatron_args(spec, plan),
        "megatron_command": megatron_command(spec, plan, devices_per_node),
        "torchtitan_toml": torchtitan_toml(spec, plan, platform=platform, devices_per_node=devices_per_node),
        "torchtitan_recipe": torchtitan_recipe(spec, plan, platform=platform, devices_per_node=devices_per_node),
        "torchtitan_plan": tt.label(),
        "torchtitan_changes": changes,
    }


def write_launch_files(out: Path, spec: TransformerSpec, plan: ParallelPlan, *, platform: str, devices_per_node: int,
                       predicted_s: float | None = None, torchtitan_predicted_s: float | None = None) -> dict:
    """Write ``megatron_args.txt``, ``torchtitan.toml`` and ``torchtitan_recipe.py`` into ``out``; returns
    :func:`launch_payload` with the ``files`` written (names relative to ``out``)."""
    out.mkdir(parents=True, exist_ok=True)
    payload = launch_payload(spec, plan, platform=platform, devices_per_node=devices_per_node)
    atomic_write_text(out / MEGATRON_FILE, megatron_launch_text(spec, plan, platform=platform,
                                                                devices_per_node=devices_per_node,
                                                                predicted_s=predicted_s))
    atomic_write_text(out / TORCHTITAN_FILE, torchtitan_toml(spec, plan, platform=platform,
                                                             devices_per_node=devices_per_node,
                                                             predicted_s=torchtitan_predicted_s))
    atomic_write_text(out / RECIPE_FILE, torchtitan_recipe(spec, plan, platform=platform,
                                                           devices_per_node=devices_per_node,
                                                           predicted_s=torchtitan_predicted_s))
    payload["files"] = [MEGATRON_FILE, TORCHTITAN_FILE, RECIPE_FILE]
    return payload
