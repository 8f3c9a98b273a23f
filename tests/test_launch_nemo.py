"""NeMo 1.x GPT training YAMLs read as tuner's spec + plan (tuner/launch/nemo.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from predictor.timing.platforms import get_platform
from tuner.cli import app
from tuner.launch import LaunchError, read_nemo_yaml
from tuner.plans import predict_plan

#: Llama 3.1 70B as NVIDIA's DGX Cloud recipe (v25.01) configures it for 64 H100s, the fields tuner reads
LLAMA_70B = """
run:
  name: llama3_1_70b
trainer:
  num_nodes: 8
  devices: 8
  precision: bf16-mixed
model:
  mcore_gpt: true
  micro_batch_size: 1
  global_batch_size: 128
  tensor_model_parallel_size: 4
  pipeline_model_parallel_size: 4
  virtual_pipeline_model_parallel_size: 5
  context_parallel_size: 2
  encoder_seq_length: 8192
  num_layers: 80
  hidden_size: 8192
  ffn_hidden_size: 28672
  num_attention_heads: 64
  num_query_groups: 8
  hidden_dropout: 0.0
  bias: false
  activation: fast-swiglu
  position_embedding_type: rope
  share_embeddings_and_output_weights: false
  tokenizer:
    library: huggingface
    type: meta-llama/Meta-Llama-3.1-70B
  activations_checkpoint_granularity: null
  sequence_parallel: true
  fp8: false
  ub_tp_comm_overlap: true
  optim:
    name: distributed_fused_adam
    overlap_grad_sync: true
    overlap_param_sync: true
    grad_sync_dtype: bf16
"""


def test_the_recipe_predicts_as_the_validations_row(validation_row_seconds):
    lp = read_nemo_yaml(LLAMA_70B, "llama3_1_70b.yaml")
    got, _ = predict_plan(lp.spec, lp.plan, get_platform("h100-sxm"), devices=lp.devices)
    want = validation_row_seconds("dgxc_llama31", "Llama3.1-70B bf16", 64, "h100-sxm")
    assert got["predicted_iteration_s"] == pytest.approx(want, rel=1e-9)
    assert (lp.devices, lp.devices_per_node, lp.spec.vocab, lp.spec.attention) == (64, 8, 128256, "te")
    p = lp.plan
    assert (p.tp, p.pp, p.cp, p.dp, p.virtual_stages, p.schedule) == (4, 4, 2, 2, 5, "interleaved")
    assert p.distributed_optimizer and p.tp_comm_overlap and p.sequence_parallel and p.grad_reduce_dtype == "bf16"
    assert not any("normalization" in n for n in lp.notes)
    rms = read_nemo_yaml(LLAMA_70B.replace("  bias: false", "  bias: false\n  normalization: rmsnorm"), "f")
    assert "model.normalization rmsnorm priced as LayerNorm" in rms.notes


def test_model_and_plan_options():
    moe = read_nemo_yaml(LLAMA_70B.replace("  fp8: false", "  fp8: true\n  num_moe_experts: 8\n  moe_router_topk: 2\n"
                                           "  expert_model_parallel_size: 2"), "f")
    assert (moe.spec.moe.experts, moe.plan.ep, moe.spec.fp8_linear, moe.spec.fp8_params) == (8, 2, True, False)
    assert not moe.spec.moe.grouped_gemm  # NeMo's default: Megatron's SequentialMLP
    grouped = read_nemo_yaml(LLAMA_70B.replace("  fp8: false", "  num_moe_experts: 8\n  moe_grouped_gemm: true"), "f")
    assert grouped.spec.moe.grouped_gemm
    with pytest.raises(LaunchError, match="moe_grouped_gemm must be true or false"):
        read_nemo_yaml(LLAMA_70B.replace("  fp8: false", "  num_moe_experts: 8\n  moe_grouped_gemm: 2"), "f")
    fp8 = read_nemo_yaml(LLAMA_70B.replace("  fp8: false", "  fp8: true\n  fp8_params: true"), "f")
    assert fp8.spec.fp8_params and not read_nemo_yaml(LLAMA_70B + "  fp8_params: true\n", "f").spec.fp8_params
    full = read_nemo_yaml(LLAMA_70B.replace("activations_checkpoint_granularity: null",
                                            "activations_checkpoint_granularity: full\n"
                                            "  activations_checkpoint_method: block\n"
                                            "  activations_checkpoint_num_layers: 2"), "f")
    assert (full.plan.recompute, full.plan.recompute_layers) == ("full", 2)
    gpt = read_nemo_yaml(LLAMA_70B.replace("type: meta-llama/Meta-Llama-3.1-70B", "type: GPT2BPETokenizer")
                         .replace("fast-swiglu", "gelu").replace("position_embedding_type: rope",
                                                                 "position_embedding_type: learned_absolute"), "f",
                         devices=128)
    assert (gpt.spec.vocab, gpt.spec.mlp, gpt.spec.position, gpt.devices, gpt.plan.dp) == (50257, "gelu", "learned", 128, 4)
    odd = read_nemo_yaml(LLAMA_70B.replace("meta-llama/Meta-Llama-3.1-70B", "my/tokenizer"), "f")
    assert any("my/tokenizer" in n and "--set vocab" in n for n in odd.notes)


@pytest.mark.parametrize(("change", "expected"), [
    (("model:", "modell:"), "no model: section"),
    (("num_layers: 80", "num_layers: 78"), "do not split evenly"),
    (("precision: bf16-mixed", "precision: int8"), "trainer.precision 'int8'"),
    (("activation: fast-swiglu", "activation: geglu-x"), "model.activation 'geglu-x'"),
    (("tensor_model_parallel_size: 4", "tensor_model_parallel_size: 3"), "does not divide the 64 devices"),
    (("activations_checkpoint_granularity: null", "activations_checkpoint_granularity: partial"), "granularity 'partial'"),
    (("hidden_size: 8192", "hidden_size: -1"), "model.hidden_size must be a positive integer"),
])
def test_bad_configs_raise_one_line(change, expected):
    with pytest.raises(LaunchError, match=expected) as err:
        read_nemo_yaml(LLAMA_70B.replace(*change), "cfg.yaml")
    assert "\n" not in str(err.value) and str(err.value).startswith("cfg.yaml: ")


def test_cli_predicts_a_nemo_yaml(tmp_path):
    (tmp_path / "cfg.yaml").write_text(LLAMA_70B)
    out = CliRunner().invoke(app, ["predict", "--nemo", str(tmp_path / "cfg.yaml"), "--platform", "h100-sxm", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["plan"].startswith("tp4-pp4-dp2-mb1-int5")
    both = CliRunner().invoke(app, ["predict", "--nemo", str(tmp_path / "cfg.yaml"), "--megatron-args",
                                    str(tmp_path / "cfg.yaml")])
    assert both.exit_code == 2 and "give one of" in both.output


def test_the_launchers_interpolations_resolve_as_it_composes_the_file():
    """NeMo-Framework-Launcher's conf/training YAMLs (gpt3/175b.yaml) write sizes as interpolations and resolvers; a
    reference to the launcher's other sections (${data_dir}) keeps its text."""
    text = (LLAMA_70B.replace("ffn_hidden_size: 28672", "ffn_hidden_size: ${multiply:7, ${divide_ceil:${.hidden_size}, 2}}")
            .replace("global_batch_size: 128", "global_batch_size: ${multiply:16, ${training.trainer.num_nodes}}")
            .replace("  tokenizer:\n", "  tokenizer:\n    model: ${data_dir}/llama/tokenizer.model\n")
            .replace("num_query_groups: 8", "num_query_groups: ${divide_floor:${.num_attention_heads}, 8}"))
    lp = read_nemo_yaml(text, "175b.yaml")
    assert (lp.spec.ffn, lp.plan.global_batch, lp.spec.kv_heads, lp.spec.vocab) == (28672, 128, 8, 128256)
    base = read_nemo_yaml(LLAMA_70B, "f")
    assert lp.spec == base.spec and lp.plan == base.plan
    with pytest.raises(LaunchError, match="model.hidden_size must be a positive integer"):
        read_nemo_yaml(LLAMA_70B.replace("hidden_size: 8192", "hidden_size: ${data_dir}"), "f")


def test_geglu_reads_as_the_gated_mlp_with_a_note():
    lp = read_nemo_yaml(LLAMA_70B.replace("activation: fast-swiglu", "activation: fast-geglu"), "grok1_proxy.yaml")
    assert lp.spec.mlp == "swiglu" and any("fast-geglu read as SwiGLU" in n for n in lp.notes)


def test_settings_tuner_prices_otherwise_are_named():
    lp = read_nemo_yaml(LLAMA_70B + "  cpu_offloading: true\n  moe_token_dispatcher_type: allgather\n", "f")
    assert any("cpu_offloading is not modelled" in n for n in lp.notes)
    assert any("moe_token_dispatcher_type allgather" in n for n in lp.notes)
    assert not any("offloading" in n or "dispatcher" in n for n in read_nemo_yaml(LLAMA_70B, "f").notes)


def test_fine_grained_moe_keys_read_as_megatron_flags():
    """NeMo passes Megatron-core's MoE settings by their TransformerConfig names: experts' and shared experts'
    widths, the layer pattern, node-limited routing, DeepEP, forced balance (a 70B-shaped MoE of 64 experts)."""
    moe = ("  num_moe_experts: 64\n  moe_router_topk: 6\n  moe_ffn_hidden_size: 1408\n"
           "  moe_shared_expert_intermediate_size: 2816\n  moe_layer_freq: ([0]*1+[1]*79)\n  moe_grouped_gemm: true\n"
           "  moe_token_dispatcher_type: flex\n  moe_router_num_groups: 8\n  moe_router_group_topk: 4\n"
           "  moe_router_force_load_balancing: true\n  expert_model_parallel_size: 8\n")
    lp = read_nemo_yaml(LLAMA_70B + moe, "moe.yaml")
    m = lp.spec.moe
    assert (m.experts, m.top_k, m.ffn, m.shared_ffn, m.dense_layers, m.every) == (64, 6, 1408, 2816, 1, 1)
    assert (m.grouped_gemm, m.dispatcher, m.router_groups, m.router_group_topk) == (True, "deepep", 8, 4)
    assert not any("routing priced as balanced" in n for n in lp.notes)
    plain = read_nemo_yaml(LLAMA_70B + "  num_moe_experts: 8\n  moe_router_topk: 2\n", "m.yaml")
    assert plain.spec.moe.ffn is None and plain.spec.moe.dispatcher == "alltoall"
    assert any("routing priced as balanced" in n for n in plain.notes)
    every2 = read_nemo_yaml(LLAMA_70B + "  num_moe_experts: 8\n  moe_layer_freq: 2\n", "m.yaml")
    assert every2.spec.moe.every == 2 and any("moe-layer-freq 2" in n for n in every2.notes)


def test_block_scaled_fp8_recipes_are_noted():
    lp = read_nemo_yaml(LLAMA_70B + "  fp8: true\n  fp8_recipe: mxfp8\n", "f")
    assert lp.spec.fp8_linear and any("fp8_recipe mxfp8: priced as per-tensor scaling" in n for n in lp.notes)
    assert not any("fp8_recipe" in n for n in read_nemo_yaml(LLAMA_70B + "  fp8: true\n", "f").notes)
