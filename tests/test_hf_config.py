"""Hugging Face config.json files read as tuner's model (tuner/launch/huggingface.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli import app
from tuner.launch import LaunchError, read_llmfoundry_yaml
from tuner.launch.huggingface import read_hf_config_text, spec_from_hf_config

#: the shapes of public models' config.json files, with each model card's parameter count (billions)
CONFIGS = {
    "Llama-2-7b": (6.74, dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                              num_key_value_heads=32, intermediate_size=11008, vocab_size=32000,
                              max_position_embeddings=4096, tie_word_embeddings=False)),
    "Mistral-7B-v0.1": (7.24, dict(model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=8, intermediate_size=14336, vocab_size=32000,
                                   max_position_embeddings=32768)),
    "Meta-Llama-3-8B": (8.03, dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                                   max_position_embeddings=8192)),
    "Mixtral-8x7B-v0.1": (46.7, dict(model_type="mixtral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                     num_key_value_heads=8, intermediate_size=14336, vocab_size=32000,
                                     num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768)),
    "Qwen3-30B-A3B": (30.5, dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                                 num_key_value_heads=4, head_dim=128, intermediate_size=6144, moe_intermediate_size=768,
                                 num_experts=128, num_experts_per_tok=8, vocab_size=151936, tie_word_embeddings=False,
                                 max_position_embeddings=40960, decoder_sparse_step=1, mlp_only_layers=[])),
    "DeepSeek-V3": (671, dict(model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61, num_attention_heads=128,
                              num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                              qk_rope_head_dim=64, v_head_dim=128, intermediate_size=18432, moe_intermediate_size=2048,
                              n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=3,
                              n_group=8, topk_group=4, vocab_size=129280, max_position_embeddings=163840)),
    "gemma-7b": (8.54, dict(model_type="gemma", hidden_size=3072, num_hidden_layers=28, num_attention_heads=16,
                            num_key_value_heads=16, head_dim=256, intermediate_size=24576, vocab_size=256000,
                            max_position_embeddings=8192)),
    "gemma-2b": (2.51, dict(model_type="gemma", hidden_size=2048, num_hidden_layers=18, num_attention_heads=8,
                            num_key_value_heads=1, head_dim=256, intermediate_size=16384, vocab_size=256000,
                            max_position_embeddings=8192)),
    "Phi-3-mini-4k": (3.82, dict(model_type="phi3", hidden_size=3072, num_hidden_layers=32, num_attention_heads=32,
                                 num_key_value_heads=32, intermediate_size=8192, vocab_size=32064,
                                 max_position_embeddings=4096, tie_word_embeddings=False)),
    "OLMo-2-1124-7B": (7.30, dict(model_type="olmo2", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                  num_key_value_heads=32, intermediate_size=11008, vocab_size=100352,
                                  max_position_embeddings=4096, tie_word_embeddings=False)),
    "gpt2": (0.124, dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024,
                         resid_pdrop=0.1)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_public_configs_read_to_their_published_parameter_counts(name):
    billions, doc = CONFIGS[name]
    spec, _ = spec_from_hf_config(doc, name)
    assert spec.param_count() / 1e9 == pytest.approx(billions, rel=0.006)


def test_each_family_reads_what_it_runs():
    mixtral, _ = spec_from_hf_config(CONFIGS["Mixtral-8x7B-v0.1"][1], "m")
    assert (mixtral.moe.experts, mixtral.moe.top_k, mixtral.moe.ffn, mixtral.kv_heads) == (8, 2, 14336, 8)
    qwen, _ = spec_from_hf_config(CONFIGS["Qwen3-30B-A3B"][1], "q")
    assert (qwen.kv_channels, qwen.moe.experts, qwen.moe.ffn, qwen.tie_embeddings) == (128, 128, 768, False)
    # Qwen MoE's decoder_sparse_step: layer i routed when (i + 1) % step == 0, the others dense
    sparse, _ = spec_from_hf_config({**CONFIGS["Qwen3-30B-A3B"][1], "decoder_sparse_step": 2}, "q")
    assert sparse.moe.every == 2 and sparse.moe_layer_count == 24 and not sparse.is_moe_layer(0)
    ds, notes = spec_from_hf_config(CONFIGS["DeepSeek-V3"][1], "d")
    assert (ds.mla.kv_lora_rank, ds.moe.dense_layers, ds.moe.shared_ffn, ds.program) == (512, 3, 2048, "megatron")
    assert (ds.moe.router_groups, ds.moe.router_group_topk) == (8, 4)  # node-limited routing: 4 of 8 groups
    ungrouped, _ = spec_from_hf_config({**CONFIGS["DeepSeek-V3"][1], "n_group": 1, "topk_group": 1}, "d")
    assert ungrouped.moe.router_groups == 0
    gpt2, _ = spec_from_hf_config(CONFIGS["gpt2"][1], "g")
    assert (gpt2.mlp, gpt2.position, gpt2.bias, gpt2.tie_embeddings, gpt2.dropout) == ("gelu", "learned", True, True, 0.1)
    llama, notes = spec_from_hf_config(CONFIGS["Mistral-7B-v0.1"][1], "l")
    assert (llama.mlp, llama.position, llama.bias, llama.program, llama.seq) == ("swiglu", "rope", False, "eager", 4096)
    assert any("allows 32768" in n for n in notes)
    assert spec_from_hf_config(CONFIGS["Mistral-7B-v0.1"][1], "l", seq=8192)[0].seq == 8192


@pytest.mark.parametrize(("text", "expected"), [
    ("{", "not JSON"),
    ('{"hidden_size": 4}', "names no model_type"),
    ('{"model_type": "t5"}', "model_type 't5'"),
    ('{"model_type": "llama", "hidden_size": 4096}', "has no num_hidden_layers"),
    ('{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 0}', "must be a positive integer"),
])
def test_bad_configs_raise_one_line(text, expected):
    with pytest.raises(LaunchError, match=expected) as err:
        read_hf_config_text(text, "config.json")
    assert "\n" not in str(err.value)


def test_cli_predicts_a_config_json_workload(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS["Llama-2-7b"][1]))
    args = ["predict", "--workload", str(path), "--set", "fsdp=true", "--set", "micro_batch=1", "--set", "global_batch=8",
            "--devices", "8", "--platform", "h100-sxm", "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    res = json.loads(out.output)
    assert res["plan"] == "tp1-pp1-dp8-mb1-1f1b-none-fsdp" and any("allows 4096" in n for n in res["read"]["notes"])
    short = json.loads(CliRunner().invoke(app, [*args, "--set", "seq=1024"]).output)
    assert short["predicted_iteration_s"] < res["predicted_iteration_s"]
    assert not any("allows" in n for n in short["read"]["notes"])
    (tmp_path / "bad.json").write_text('{"model_type": "t5"}')
    bad = CliRunner().invoke(app, ["predict", "--workload", str(tmp_path / "bad.json"), "--set", "global_batch=8"])
    assert bad.exit_code == 2 and "model_type 't5'" in bad.output


def test_llmfoundry_reads_a_hugging_face_model_from_its_local_folder(tmp_path):
    (tmp_path / "llama2").mkdir()
    (tmp_path / "llama2" / "config.json").write_text(json.dumps(CONFIGS["Llama-2-7b"][1]))
    yaml_text = ("max_seq_len: 2048\nmodel:\n  name: hf_causal_lm\n  pretrained_model_name_or_path: llama2\n"
                 "global_train_batch_size: 16\ndevice_train_microbatch_size: 2\nfsdp_config:\n"
                 "  sharding_strategy: FULL_SHARD\n")
    lp = read_llmfoundry_yaml(yaml_text, str(tmp_path / "run.yaml"), devices=8)
    assert (lp.spec.layers, lp.spec.ffn, lp.spec.seq, lp.spec.mlp) == (32, 11008, 2048, "swiglu")
    with pytest.raises(LaunchError, match="Hugging Face models whose config.json is on this machine"):
        read_llmfoundry_yaml(yaml_text.replace("llama2", "meta-llama/Llama-2-7b-hf"), str(tmp_path / "run.yaml"),
                             devices=8)


def test_spaces_take_a_config_json_as_their_model(tmp_path):
    import yaml

    from tuner.search.registry import load_space
    from tuner.search.schema import SpaceError

    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["Mixtral-8x7B-v0.1"][1]))
    repo = Path(__file__).resolve().parents[1] / "search_spaces"
    parallel = yaml.safe_load((repo / "parallel.yaml").read_text())
    parallel["model"] = {"hf_config": "config.json", "seq": 2048, "name": "mixtral"}
    (tmp_path / "parallel.yaml").write_text(yaml.safe_dump(parallel))
    spec = load_space(tmp_path / "parallel.yaml").model.to_spec()
    assert (spec.moe.experts, spec.seq, spec.name) == (8, 2048, "mixtral")  # the section's own fields win
    rent = yaml.safe_load((repo / "rent.yaml").read_text())
    rent["model"] = {"transformer": {"hf_config": str(tmp_path / "config.json")}}
    (tmp_path / "rent.yaml").write_text(yaml.safe_dump(rent))
    assert load_space(tmp_path / "rent.yaml").model.transformer.to_spec().param_count() == pytest.approx(46.7e9, rel=0.01)
    parallel["model"] = {"hf_config": "missing.json"}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(parallel))
    with pytest.raises(SpaceError, match="model.hf_config: .*missing.json"):
        load_space(tmp_path / "bad.yaml")
