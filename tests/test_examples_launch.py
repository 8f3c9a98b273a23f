"""The launch files in examples/launch/ (the README's `tuner predict` commands) read with tuner's launch readers."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from tuner.launch import read_llmfoundry_file, read_megatron_file, read_nemo_file, read_torchtitan_file
from tuner.launch.huggingface import read_hf_config_file

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "launch"


def _flag(text: str, flag: str) -> int:
    """The integer after ``flag`` in a launch script, or after ``flag =`` in a TOML file."""
    return int(re.search(rf"{re.escape(flag)}\s*=?\s*(\d+)", text).group(1))


def test_the_readmes_commands_name_files_that_exist():
    named = set(re.findall(r"examples/launch/[\w.-]+", (ROOT / "README.md").read_text(encoding="utf-8")))
    assert len(named) >= 5
    assert all((ROOT / p).is_file() for p in named), sorted(p for p in named if not (ROOT / p).is_file())


def test_torchtitan_job_config():
    if sys.version_info < (3, 11):
        pytest.importorskip("tomli")  # the TOML reader's parser on Python 3.10
    path = EXAMPLES / "llama3_8b.toml"
    text = path.read_text(encoding="utf-8")
    assert 'name = "llama3"' in text and 'flavor = "8B"' in text
    lp = read_torchtitan_file(path, devices=64)
    s, p = lp.spec, lp.plan
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.vocab) == (32, 4096, 32, 8, 128256)  # torchtitan's llama3 8B
    assert s.seq == _flag(text, "seq_len") == 8192 and s.dtype == "bf16"
    assert (p.tp, p.pp, p.dp, p.micro_batch, p.recompute) == (1, 1, 64, _flag(text, "local_batch_size"), "op")
    assert p.fsdp and lp.devices == 64


def test_megatron_launch_script():
    path = EXAMPLES / "train_llama.sh"
    text = path.read_text(encoding="utf-8")
    lp = read_megatron_file(path)
    s, p = lp.spec, lp.plan
    assert (s.layers, s.hidden) == (_flag(text, "--num-layers"), _flag(text, "--hidden-size")) == (32, 4096)
    assert (s.heads, s.kv_heads, s.ffn, s.seq, s.vocab) == (32, 8, 14336, 8192, 128256)
    assert (s.mlp, s.position, s.tie_embeddings, s.bias, s.dtype) == ("swiglu", "rope", False, False, "bf16")
    assert (lp.devices, lp.devices_per_node) == (64, 8)  # torchrun --nnodes 8 --nproc-per-node 8
    assert (p.tp, p.pp, p.cp, p.dp, p.micro_batch, p.global_batch) == (2, 1, 1, 32, 1, 512)
    assert p.sequence_parallel and p.distributed_optimizer and p.overlap_grad_reduce and p.overlap_param_gather
    assert "--tokenizer-model" not in lp.ignored and "--num-layers" not in lp.ignored


def test_llmfoundry_yaml():
    path = EXAMPLES / "mpt-7b.yaml"
    model = yaml.safe_load(path.read_text(encoding="utf-8"))["model"]
    lp = read_llmfoundry_file(path, devices=64, devices_per_node=8)
    s, p = lp.spec, lp.plan
    assert (s.layers, s.hidden) == (model["n_layers"], model["d_model"]) == (32, 4096)
    assert (s.heads, s.seq, s.vocab, s.dtype) == (32, 2048, 50368, "bf16")
    assert (p.dp, p.micro_batch, p.global_batch, p.recompute) == (64, 8, 512, "full") and p.fsdp


def test_nemo_yaml():
    path = EXAMPLES / "llama3_1_70b.yaml"
    model = yaml.safe_load(path.read_text(encoding="utf-8"))["model"]
    lp = read_nemo_file(path)
    s, p = lp.spec, lp.plan
    assert (s.layers, s.hidden) == (model["num_layers"], model["hidden_size"]) == (80, 8192)
    assert (s.heads, s.kv_heads, s.ffn, s.seq, s.vocab) == (64, 8, 28672, 8192, 128256)
    assert (lp.devices, p.tp, p.pp, p.cp, p.dp, p.virtual_stages) == (64, 4, 4, 2, 2, 5)


def test_hugging_face_config():
    path = EXAMPLES / "config.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    spec, notes = read_hf_config_file(path)
    assert (spec.layers, spec.hidden) == (doc["num_hidden_layers"], doc["hidden_size"]) == (32, 4096)
    assert (spec.heads, spec.kv_heads, spec.ffn, spec.vocab) == (32, 8, 14336, 128256)
    assert (spec.mlp, spec.position, spec.tie_embeddings) == ("swiglu", "rope", False)
    assert spec.seq == 4096 and notes  # the config's 8192 context, trained on tuner's default 4096 tokens
