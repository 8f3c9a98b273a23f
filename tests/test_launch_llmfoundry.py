"""llm-foundry training YAMLs read as tuner's spec + plan (tuner/launch/llmfoundry.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from predictor.sources.synth.transformer import TransformerSpec
from predictor.timing.platforms import get_platform
from tuner.cli import app
from tuner.launch import LaunchError, read_llmfoundry_yaml
from tuner.plans import predict_plan

#: MPT-1B as llm-foundry's large-scale H100 benchmark ran it (SHARD_GRAD_OP, FlashAttention-2, micro-batch 12)
MPT_1B = """
variables:
  max_seq_len: 2048
max_seq_len: ${variables.max_seq_len}
model:
  name: mpt_causal_lm
  d_model: 2048
  n_heads: 16
  n_layers: 24
  expansion_ratio: 4
  max_seq_len: ${variables.max_seq_len}
  vocab_size: 50368
  attn_config:
    attn_impl: flash
optimizer:
  name: decoupled_adamw
global_train_batch_size: 1536
device_train_microbatch_size: 12
precision: amp_bf16
fsdp_config:
  sharding_strategy: SHARD_GRAD_OP
  mixed_precision: DEFAULT
  activation_checkpointing: false
"""


def test_a_benchmark_yaml_predicts_as_the_validations_row(validation_row_seconds):
    # the user's path (the run's YAML) and the validation's row (mosaic_h100_large, MPT-1B on 128 GPUs) agree
    lp = read_llmfoundry_yaml(MPT_1B, "mpt1b.yaml", devices=128, devices_per_node=8)
    got, _ = predict_plan(lp.spec, lp.plan, get_platform("h100-sxm"), devices=128)
    want = validation_row_seconds("mosaic_h100_large", "MPT-1B", 128, "h100-sxm")
    assert got["predicted_iteration_s"] == pytest.approx(want, rel=1e-9)
    assert lp.plan.fsdp and not lp.plan.fsdp_reshard_after_forward and lp.plan.grad_reduce_dtype == "fp32"
    assert (lp.spec.attention, lp.spec.program, lp.spec.fused_loss, lp.spec.seq) == ("flash2", "eager", True, 2048)


def test_sharding_strategies_and_model_options():
    def read(strategy: str):
        return read_llmfoundry_yaml(MPT_1B.replace("SHARD_GRAD_OP", strategy), "f", devices=32, devices_per_node=8)

    hybrid = read("HYBRID_SHARD").plan
    assert (hybrid.fsdp_shard, hybrid.fsdp_reshard_after_forward) == (8, True)  # PyTorch FSDP: shard inside a node
    zero2 = read("_HYBRID_SHARD_ZERO2").plan
    assert (zero2.fsdp_shard, zero2.fsdp_reshard_after_forward) == (8, False)
    assert not read("NO_SHARD").plan.fsdp
    ddp = read_llmfoundry_yaml(MPT_1B.split("fsdp_config:")[0], "f", devices=32)
    assert not ddp.plan.fsdp
    pure = read_llmfoundry_yaml(MPT_1B.replace("DEFAULT", "PURE").replace("activation_checkpointing: false",
                                                                          "activation_checkpointing: true"), "f", devices=32)
    assert (pure.plan.grad_reduce_dtype, pure.plan.recompute) == ("bf16", "full")
    gqa = MPT_1B.replace("    attn_impl: flash", "    attn_impl: triton\n    attn_type: grouped_query_attention\n"
                         "    kv_n_heads: 4\n    alibi: true").replace("  vocab_size: 50368",
                                                                      "  vocab_size: 50368\n  ffn_config:\n"
                                                                      "    ffn_type: mptglu\n    ffn_hidden_size: 5632\n"
                                                                      "  no_bias: true")
    lp = read_llmfoundry_yaml(gqa, "f", devices=32)
    s = lp.spec
    assert (s.kv_heads, s.attention, s.mlp, s.ffn, s.bias, s.position) == (4, "flash_triton", "swiglu", 5632, False, "none")
    assert any("ALiBi" in n for n in lp.notes)
    lion = read_llmfoundry_yaml(MPT_1B.replace("decoupled_adamw", "decoupled_lionw"), "f", devices=32)
    assert any("decoupled_lionw priced as AdamW" in n for n in lion.notes)
    # --workload's model: the YAML's sequence and precision still apply
    given = TransformerSpec(layers=4, hidden=512, heads=8, seq=128, vocab=1000)
    other = read_llmfoundry_yaml(MPT_1B.replace("mpt_causal_lm", "hf_causal_lm"), "f", devices=32, spec=given)
    assert (other.spec.layers, other.spec.seq, other.spec.program) == (4, 2048, "eager")


@pytest.mark.parametrize(("change", "devices", "expected"), [
    (("", ""), None, "give --devices N"),
    (("device_train_microbatch_size: 12", "device_train_microbatch_size: auto"), 128, "auto: give the micro-batch"),
    (("device_train_microbatch_size: 12", "device_train_microbatch_size: 5"), 128, "does not divide the per-device"),
    (("global_train_batch_size: 1536", "global_train_batch_size: 100"), 128, "not divisible by the 128 devices"),
    (("mpt_causal_lm", "hf_causal_lm"), 128, "give the model's shape with --workload"),
    (("attn_impl: flash", "attn_impl: xformers"), 128, "attn_impl 'xformers'"),
    (("SHARD_GRAD_OP", "SHARD_EVERYTHING"), 128, "sharding_strategy 'SHARD_EVERYTHING'"),
    (("${variables.max_seq_len}\nmodel", "${variables.nope}\nmodel"), 128, "nope"),
    (("precision: amp_bf16", "precision: amp_int4"), 128, "precision 'amp_int4'"),
    (("n_layers: 24", "n_layers: -2"), 128, "model.n_layers must be a positive integer"),
])
def test_bad_yamls_raise_one_line(change, devices, expected):
    with pytest.raises(LaunchError, match=expected) as err:
        read_llmfoundry_yaml(MPT_1B.replace(*change), "run.yaml", devices=devices)
    assert "\n" not in str(err.value) and str(err.value).startswith("run.yaml: ")


def test_cli_predicts_an_llmfoundry_yaml(tmp_path):
    (tmp_path / "run.yaml").write_text(MPT_1B)
    out = CliRunner().invoke(app, ["predict", "--llm-foundry", str(tmp_path / "run.yaml"), "--devices", "128",
                                   "--platform", "h100-sxm", "--json"])
    assert out.exit_code == 0, out.output
    res = json.loads(out.output)
    assert res["plan"] == "tp1-pp1-dp128-mb12-1f1b-none-fsdp-zero2" and res["predicted_iteration_s"] > 0
    both = CliRunner().invoke(app, ["predict", "--llm-foundry", str(tmp_path / "run.yaml"), "--torchtitan",
                                    str(tmp_path / "run.yaml"), "--devices", "8"])
    assert both.exit_code == 2 and "give one of" in both.output
