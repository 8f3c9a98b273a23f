"""What the launch formats share: the plan read back from a file, its error, and the ``# tuner:`` line.

A launch file written by tuner starts with comment lines; one of them, ``# tuner: {...}``, holds
in JSON what the launcher itself does not take (the catalog platform, devices per node, the model's
name and, for torchtitan, the model's shape). Launchers ignore comments, so the file runs as is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec

__all__ = ["LaunchError", "LaunchPlan", "HEADER_PREFIX", "header_line", "read_header", "header_int", "header_str",
           "read_launch_text", "positive_int", "positive_number", "switch", "fraction", "expert_tp_degree", "TOKENIZER_FRAGMENTS", "tokenizer_vocab",
           "OFFLOAD_NOTE", "dispatcher_note", "fp8_recipe_note"]

#: the comment prefix of tuner's metadata line in a launch file
HEADER_PREFIX = "# tuner:"


class LaunchError(ValueError):
    """A launch file that cannot be read as a tuner plan (one line naming the file and the problem)."""


@dataclass(frozen=True)
class LaunchPlan:
    """A workload and plan read from a launch file.

    ``platform`` and ``devices_per_node`` are the file's hints (``None`` when it has none);
    ``ignored`` lists the launcher options that do not change tuner's prediction and were skipped;
    ``notes`` say where the launcher's meaning and tuner's model differ.
    """

    spec: TransformerSpec
    plan: ParallelPlan
    devices: int
    platform: str | None = None
    devices_per_node: int | None = None
    ignored: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def summary(self) -> dict:
        """The read-back as plain JSON types."""
        return {"model": self.spec.to_dict(), "plan": self.plan.to_dict(), "devices": self.devices,
                "platform": self.platform, "devices_per_node": self.devices_per_node,
                "ignored": list(self.ignored), "notes": list(self.notes)}


def header_line(meta: dict) -> str:
    """The ``# tuner: {...}`` comment line holding ``meta`` as one line of JSON."""
    return f"{HEADER_PREFIX} {json.dumps(meta, sort_keys=True, separators=(', ', ': '))}"


def read_header(text: str, source: str) -> dict:
    """The metadata of the first ``# tuner:`` line of ``text`` (``{}`` when there is none)."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(HEADER_PREFIX):
            try:
                meta = json.loads(stripped[len(HEADER_PREFIX):])
            except json.JSONDecodeError as exc:
                raise LaunchError(f"{source}: the '{HEADER_PREFIX}' line is not JSON ({exc.msg})") from None
            if not isinstance(meta, dict):
                raise LaunchError(f"{source}: the '{HEADER_PREFIX}' line must hold a JSON object")
            return meta
    return {}


def header_int(meta: dict, key: str, source: str) -> int | None:
    """The positive integer ``key`` of the header (``None`` when absent); raises :class:`LaunchError` otherwise."""
    val = meta.get(key)
    if val is None:
        return None
    if isinstance(val, bool) or not isinstance(val, int) or val < 1:
        raise LaunchError(f"{source}: '{HEADER_PREFIX}' {key} must be a positive integer (got {val!r})")
    return val


def header_str(meta: dict, key: str, source: str) -> str | None:
    """The text ``key`` of the header (``None`` when absent); raises :class:`LaunchError` otherwise."""
    val = meta.get(key)
    if val is not None and not isinstance(val, str):
        raise LaunchError(f"{source}: '{HEADER_PREFIX}' {key} must be text (got {val!r})")
    return val


def read_launch_text(path: Path, expected: str) -> str:
    """The text of a launch file; raises :class:`LaunchError` for a missing file, a folder (naming
    ``expected``, what the file should have been) or a binary file."""
    src = str(path)
    if not path.exists():
        raise LaunchError(f"{src}: no such file")
    if path.is_dir():
        raise LaunchError(f"{src}: is a directory, expected {expected}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LaunchError(f"{src}: not a text file") from None


def positive_int(table: dict, key: str, where: str, source: str, default: int | None = None, *,
                 minimum: int = 1) -> int:
    """``table[key]`` (``default`` when absent or null) as an integer >= ``minimum`` (a positive one by
    default, a count with ``minimum=0``); :class:`LaunchError` naming ``where + key`` for a missing or other value."""
    val = table.get(key)
    if val is None:
        if default is None:
            raise LaunchError(f"{source}: {where}{key} is missing")
        val = default
    if isinstance(val, bool) or not isinstance(val, int) or val < minimum:
        kind = "a positive integer" if minimum == 1 else f"a whole number >= {minimum}"
        raise LaunchError(f"{source}: {where}{key} must be {kind} (got {val!r})")
    return val


def positive_number(table: dict, key: str, where: str, source: str, default: float) -> float:
    """``table[key]`` (``default`` when absent or null) as a number > 0; :class:`LaunchError` for another value."""
    val = table.get(key)
    if val is None:
        return default
    if isinstance(val, bool) or not isinstance(val, (int, float)) or val <= 0:
        raise LaunchError(f"{source}: {where}{key} must be a positive number (got {val!r})")
    return float(val)


def switch(table: dict, key: str, where: str, source: str, default: bool = False) -> bool:
    """``table[key]`` (``default`` when absent or null) as true or false; :class:`LaunchError` for another value."""
    val = table.get(key)
    if val is None:
        return default
    if not isinstance(val, bool):
        raise LaunchError(f"{source}: {where}{key} must be true or false (got {val!r})")
    return val


def fraction(table: dict, key: str, where: str, source: str, default: float) -> float:
    """``table[key]`` (``default`` when absent or null) as a number in [0, 1] (a dropout probability);
    :class:`LaunchError` for another value."""
    val = table.get(key)
    if val is None:
        return default
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0.0 <= val <= 1.0:
        raise LaunchError(f"{source}: {where}{key} must be a number from 0 to 1 (got {val!r})")
    return float(val)


def expert_tp_degree(etp: int, tp: int, name: str, source: str) -> int:
    """The routed experts' TP degree ``etp`` read from option ``name``, where tuner models it: 1 (each expert
    whole on every TP rank) or the TP degree; :class:`LaunchError` otherwise."""
    if etp not in (1, tp):
        raise LaunchError(f"{source}: {name} {etp}: tuner models 1 or the TP degree ({tp})")
    return etp


#: tokenizer name fragments -> vocabulary size (the tokenizers' published sizes), matched case-insensitively in a
#: tokenizer's name, Hugging Face id or path (``meta-llama/Meta-Llama-3.1-70B``, ``/models/Llama-2-7b-hf``)
TOKENIZER_FRAGMENTS = {"Llama-3": 128256, "Llama-2": 32000, "llama_tokenizer": 32000, "gpt2": 50257,
                       "GPT2BPETokenizer": 50257, "nemotron_2_256k": 256000, "Mistral-7B-v0.1": 32000,
                       "Mixtral-8x7B": 32000, "Mistral-Nemo": 131072, "Llama-4": 202048, "DeepSeek-V3": 129280,
                       "DeepSeek-R1": 129280, "DeepSeek-V2": 102400, "deepseek-moe": 102400, "Qwen3": 151936}


def tokenizer_vocab(names: str) -> int | None:
    """The vocabulary of the first :data:`TOKENIZER_FRAGMENTS` entry found in ``names``, or None."""
    low = names.lower()
    return next((size for fragment, size in TOKENIZER_FRAGMENTS.items() if fragment.lower() in low), None)


#: what the launch readers say of CPU offloading (Megatron-LM's --cpu-offloading, NeMo's model.cpu_offloading)
OFFLOAD_NOTE = "is not modelled: the offloaded layers' activations and weights are priced as kept on the GPU"


def fp8_recipe_note(option: str, value: object) -> str | None:
    """The note on an FP8 recipe tuner prices as per-tensor scaling (``option`` named ``value``: mxfp8, blockwise...;
    Megatron's delayed and tensorwise are what it prices), or None."""
    if value is None or str(value) in ("delayed", "tensorwise"):
        return None
    return (f"{option} {value}: priced as per-tensor scaling (one cast and transpose per GEMM input at the FP8 peak); "
            "block scales' quantization and blockwise GEMMs are not modelled")


def dispatcher_note(option: str, value: object) -> str | None:
    """The note on an MoE token dispatcher tuner prices otherwise (``option`` named ``value``; tuner prices the
    all-to-all of Megatron-core's ``alltoall`` and ``alltoall_seq``), or None."""
    if value is None or str(value) in ("alltoall", "alltoall_seq"):
        return None
    return f"{option} {value}: the tokens' dispatch priced as an all-to-all over the expert-parallel ranks"
