"""torchtitan's Python configurations (main branch): the recipe tuner writes, run by torchtitan's own
``ConfigManager`` and read back to the plan torchtitan runs — against the installed torchtitan, else
against a stand-in of its configuration classes (``tests/torchtitan_stub``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from typer.testing import CliRunner

from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec
from tuner.cli import app
from tuner.launch import (
    LaunchError,
    is_config_ref,
    plan_from_torchtitan_config,
    read_torchtitan_config,
    torchtitan_plan,
    torchtitan_recipe,
)
from tuner.launch.torchtitan import torchtitan_model
from tuner.launch.torchtitan_config import spec_from_model_config, torchtitan_flavor

STUB = Path(__file__).resolve().parent / "torchtitan_stub"
REAL = importlib.util.find_spec("torchtitan") is not None
LLAMA = torchtitan_model("llama3", "8B", 4096)
SMALL = TransformerSpec(layers=8, hidden=1024, heads=16, seq=1024, vocab=8000, name="gpt-small")

PLANS = [
    ParallelPlan(tp=2, pp=2, dp=2, micro_batch=2, global_batch=32, schedule="interleaved", virtual_stages=2,
                 sequence_parallel=True, recompute="full", distributed_optimizer=True),
    ParallelPlan(tp=1, pp=1, dp=8, micro_batch=2, global_batch=64, fsdp=True, recompute="op"),
    ParallelPlan(tp=1, pp=1, dp=8, micro_batch=2, global_batch=64, fsdp=True, fsdp_reshard_after_forward=False),
    ParallelPlan(tp=1, pp=1, dp=8, micro_batch=2, global_batch=64, fsdp=True, fsdp_shard=2),
    ParallelPlan(tp=4, pp=1, dp=2, micro_batch=1, global_batch=16, tp_comm_overlap=True),
    ParallelPlan(tp=1, pp=4, dp=2, micro_batch=1, global_batch=16, recompute="full"),
    # a split only module_fqns_per_model_part makes
    ParallelPlan(tp=1, pp=4, dp=2, micro_batch=1, global_batch=16, stage_layers=(2, 10, 10, 10)),
    ParallelPlan(tp=2, pp=1, dp=2, cp=2, micro_batch=1, global_batch=8, distributed_optimizer=True),
]


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output


def _drop_torchtitan_modules() -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in ("torchtitan", "torchtitan_recipe")]:
        del sys.modules[name]


@pytest.fixture
def stub(monkeypatch):
    """torchtitan importable for one test: the installed package, else its stand-in."""
    if not REAL:
        monkeypatch.syspath_prepend(str(STUB))
    yield
    if not REAL:
        _drop_torchtitan_modules()


def test_config_refs_are_told_from_toml_files():
    assert is_config_ref("llama3:llama3_8b") and is_config_ref("torchtitan_recipes.llama3:llama3_8b_h200")
    assert is_config_ref("out/launch/torchtitan_recipe.py:tuner_plan")
    assert not is_config_ref("job.toml") and not is_config_ref("llama3") and not is_config_ref("a:b-c")


def test_flavors_are_recognised_by_shape():
    assert torchtitan_flavor(LLAMA) == ("llama3", "8B")
    assert torchtitan_flavor(replace(LLAMA, layers=30)) is None and torchtitan_flavor(SMALL) is None
    assert torchtitan_flavor(torchtitan_model("qwen3", "32B", 4096)) == ("qwen3", "32B")


#: the Qwen 3 model cards' parameter counts (billions; the small models' output layer tied to the embedding)
QWEN3_PARAMS = {"0.6B": 0.6, "1.7B": 1.7, "4B": 4.0, "8B": 8.2, "14B": 14.8, "32B": 32.8}


@pytest.mark.parametrize("flavor", list(QWEN3_PARAMS))
def test_qwen3_flavors_have_their_model_cards_parameter_counts(flavor):
    spec = torchtitan_model("qwen3", flavor, 4096)
    assert spec.param_count() / 1e9 == pytest.approx(QWEN3_PARAMS[flavor], rel=0.04)


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.label())
def test_recipe_runs_and_reads_back_to_the_plan_torchtitan_runs(stub, tmp_path, plan):
    recipe = tmp_path / "torchtitan_recipe.py"
    recipe.write_text(torchtitan_recipe(LLAMA, plan, platform="h100-sxm", devices_per_node=8))
    back = read_torchtitan_config(f"{recipe}:tuner_plan")
    # async TP turns torch.compile on, which in torchtitan's defaults compiles the loss too: a fused loss
    assert back.spec == replace(LLAMA, fused_loss=plan.tp_comm_overlap)
    assert back.devices == plan.devices and back.platform == "h100-sxm"
    assert back.plan == torchtitan_plan(plan, LLAMA)
    assert any("async TP" in n for n in back.notes) == plan.tp_comm_overlap
    # the configuration starts from torchtitan's own Llama 3 8B
    assert "import llama3_8b as base_config" in recipe.read_text()


def test_recipe_of_a_model_without_a_flavor_asks_for_its_configuration(stub, tmp_path):
    plan = PLANS[0]
    text = torchtitan_recipe(SMALL, plan)
    recipe = tmp_path / "torchtitan_recipe.py"
    recipe.write_text(text)
    with pytest.raises(LaunchError, match="NotImplementedError: .*return the Trainer.Config of gpt-small"):
        read_torchtitan_config(f"{recipe}:tuner_plan")
    # once base_config returns a configuration, the plan's fields are the ones set
    from torchtitan.models.llama3.config_registry import llama3_8b

    scope: dict = {}
    exec(compile(text, str(recipe), "exec"), scope)  # the recipe as torchtitan runs it
    scope["base_config"] = llama3_8b
    back = plan_from_torchtitan_config(scope["tuner_plan"](), "recipe", spec=SMALL)
    assert back.plan == torchtitan_plan(plan, SMALL) and back.devices == plan.devices


def test_registry_configuration_reads_as_torchtitan_defines_it(stub):
    # llama3_70b: 8 x 8192 tokens a micro-batch, TP 8, FSDP over the rest, full checkpointing
    back = read_torchtitan_config("llama3:llama3_70b", devices=64)
    assert back.spec.name == "llama3-70B" and back.spec.seq == 8192
    p = back.plan
    assert (p.tp, p.dp, p.micro_batch, p.global_batch, p.recompute) == (8, 8, 8, 64, "full")
    # torchtitan's 2-D layout: FSDP over the data-parallel ranks, TP inside a node
    assert p.sequence_parallel and p.fsdp and not p.distributed_optimizer and any("RMSNorm" in n for n in back.notes)
    with pytest.raises(LaunchError, match="world size is unknown: give --devices N"):
        read_torchtitan_config("llama3:llama3_70b")


def test_configurations_tuner_does_not_model_are_refused(stub):
    from torchtitan.distributed.activation_checkpoint import MemoryBudgetAC
    from torchtitan.models.llama3.config_registry import llama3_8b

    def read(**changes):
        cfg = llama3_8b()
        for path, value in changes.items():
            section, field = path.split("__")
            if section == "root":
                setattr(cfg, field, value)
            else:
                setattr(getattr(cfg, section), field, value)
        return plan_from_torchtitan_config(cfg, "cfg", devices=8)

    assert read().plan.recompute == "op"
    with pytest.raises(LaunchError, match="MemoryBudgetAC"):
        read(root__activation_checkpoint=MemoryBudgetAC.Config())
    with pytest.raises(LaunchError, match="not a whole number of sequences"):
        read(training__num_tokens_per_microbatch_per_dp_rank=10000)
    assert any("CPU offload is not modelled" in n for n in read(training__enable_cpu_offload=True).notes)
    hsdp = read(parallelism__data_parallel_replicate_degree=2, parallelism__data_parallel_shard_degree=4)
    assert (hsdp.plan.fsdp, hsdp.plan.fsdp_shard) == (True, 4)
    # a packed row shorter than the context (torchtitan's gpt-oss debug recipes): one sequence of its tokens
    short = read(training__num_tokens_per_microbatch_per_dp_rank=1024)
    assert (short.spec.seq, short.plan.micro_batch) == (1024, 1) and any("1024 tokens" in n for n in short.notes)
    with pytest.raises(LaunchError, match="not a multiple of the 65536 tokens"):
        read(training__num_tokens_per_train_step=100000)
    with pytest.raises(LaunchError, match="ZeroBubble"):
        read(parallelism__pipeline_parallel_degree=2, parallelism__pipeline_parallel_schedule="ZeroBubble",
             parallelism__num_pp_microbatches=4)
    with pytest.raises(LaunchError, match="tuner knows llama3 / 8B"):
        read(root__model_spec=None)
    # a tree tuner does not read (DeepSeek-V3's multi-latent attention) under a flavor it knows: by the flavor
    mla = NS(name="deepseek_v3", flavor="16B",
             model=NS(dim=2048, vocab_size=102400, layers=[NS(attention=NS(n_heads=16, q_lora_rank=0))] * 27))
    v3 = read(root__model_spec=mla)
    assert v3.spec.mla is not None and v3.spec.moe.experts == 64 and any("torchtitan's flavor" in n for n in v3.notes)
    with pytest.raises(LaunchError, match="grouped-query attention"):
        read(root__model_spec=NS(name="mine", flavor="2B", model=mla.model))
    with pytest.raises(LaunchError, match="has no training.max_context_length"):
        plan_from_torchtitan_config(object(), "cfg", devices=8)
    assert read(root__activation_checkpoint=None).plan.recompute == "none"


def test_cli_scores_a_recipe_it_wrote(stub, tmp_path):
    model = tmp_path / "m.yaml"
    model.write_text("model: {name: llama3-8B, layers: 32, hidden: 4096, heads: 32, kv_heads: 8, ffn: 14336, "
                     "seq: 4096, vocab: 128256, mlp: swiglu, tie_embeddings: false, attention: flash2}\ncluster: {platform: h100-sxm, nodes: 1}\nglobal_batch: 16\n")
    code, out = _cli("predict", "--workload", str(model), "--set", "tp=2", "--set", "pp=2", "--launch",
                     str(tmp_path / "launch"), "--json")
    assert code == 0, out
    res = json.loads(out)
    assert "torchtitan_recipe.py" in res["launch"]["files"]
    code, again = _cli("predict", "--torchtitan", f"{tmp_path / 'launch' / 'torchtitan_recipe.py'}:tuner_plan", "--json")
    assert code == 0, again
    assert json.loads(again)["predicted_iteration_s"] == res["launch"]["torchtitan_predicted_iteration_s"]


def test_the_model_read_is_a_space_model_section(stub, tmp_path):
    # `tuner predict --torchtitan ... --json` prints read.model: a parallel or rent space takes it as `model:`
    from tuner.search.parallel import ModelSection

    code, out = _cli("predict", "--torchtitan", "llama3:llama3_70b", "--devices", "64", "--json")
    assert code == 0, out
    model = json.loads(out)["read"]["model"]
    spec = read_torchtitan_config("llama3:llama3_70b", devices=64).spec
    assert ModelSection(**model).to_spec() == spec


def test_cli_without_torchtitan_says_what_it_needs(monkeypatch):
    for name in ("torchtitan", "torchtitan.config", "torchtitan.config.manager"):
        monkeypatch.setitem(sys.modules, name, None)  # import torchtitan fails, installed or not
    code, out = _cli("predict", "--torchtitan", "llama3:llama3_8b", "--devices", "8")
    assert code == 2 and out.startswith("error: llama3:llama3_8b: reading a torchtitan configuration needs")
    assert len(out.strip().splitlines()) == 1


def _block(heads=16, kv=4, head_dim=128, ffn=None, experts=None):
    """A decoder block's configuration as torchtitan's Llama 3 / Qwen 3 lay it out (field names upstream's)."""
    att = NS(n_heads=heads, n_kv_heads=kv, head_dim=head_dim, qk_norm=NS(), inner_attention=NS(),
             qkv_linear=NS(n_kv_heads=kv, head_dim=head_dim))
    moe = None if experts is None else NS(num_experts=experts, router=NS(top_k=2),
                                          routed_experts=NS(inner_experts=NS(hidden_dim=512)),
                                          shared_experts=NS(w1=NS(out_features=1024)))
    return NS(attention=att, feed_forward=None if ffn is None else NS(w1=NS(out_features=ffn)), moe=moe)


def _model(blocks, tie=True):
    return NS(name="mine", flavor="2B", model=NS(dim=1024, vocab_size=32000, enable_weight_tying=tie, layers=blocks))


def test_model_shape_is_read_from_the_configuration_tree():
    spec, notes = spec_from_model_config(_model([_block(ffn=4096)] * 2 + [_block(experts=8)] * 6), 2048, "cfg")
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.kv_channels, spec.vocab) == \
        (8, 1024, 16, 4, 128, 32000)
    assert spec.ffn == 4096 and spec.tie_embeddings and spec.mlp == "swiglu" and spec.program == "eager"
    assert (spec.moe.experts, spec.moe.top_k, spec.moe.ffn, spec.moe.shared_ffn, spec.moe.dense_layers) == \
        (8, 2, 512, 1024, 2)
    assert any("query / key norms" in n for n in notes) and spec.name == "mine-2B"
    assert spec.dropout == 0.0 and not spec.bias  # torchtitan's models: no dropout, Linear.Config(bias=False)
    biased = _block(ffn=4096)
    biased.attention.wo = NS(bias=True)
    assert spec_from_model_config(_model([biased] * 2), 2048, "cfg")[0].bias
    dense, _ = spec_from_model_config(_model([_block(heads=8, kv=8, head_dim=128, ffn=2816)] * 4), 512, "cfg")
    assert dense.kv_heads is None and dense.kv_channels is None and dense.moe is None  # 8 x 128 = 1024 wide
    with pytest.raises(LaunchError, match="first layers are dense"):
        spec_from_model_config(_model([_block(experts=8), _block(ffn=4096)] * 3), 2048, "cfg")
    maverick, _ = spec_from_model_config(_model([_block(ffn=4096), _block(experts=8)] * 3), 2048, "cfg")
    assert (maverick.moe.dense_layers, maverick.moe.every, maverick.ffn) == (0, 2, 4096)  # Llama 4's alternation
    with pytest.raises(LaunchError, match="grouped-query attention"):
        spec_from_model_config(_model([NS(attention=NS(n_heads=16, q_lora_rank=0), feed_forward=None, moe=None)]),
                               2048, "cfg")
    assert spec_from_model_config(NS(name="x", flavor="y", model=None), 2048, "cfg") is None


@pytest.mark.skipif(not REAL, reason="torchtitan (main branch) not installed")
def test_real_torchtitan_models_read_with_their_parameter_counts():
    # Qwen3 30B-A3B and 32B (Qwen's model cards: 30.5B and 32.8B parameters)
    moe = read_torchtitan_config("qwen3:qwen3_30b_a3b", devices=64).spec
    assert moe.moe.experts == 128 and moe.moe.top_k == 8 and moe.param_count() / 1e9 == pytest.approx(30.5, abs=0.1)
    dense = read_torchtitan_config("qwen3:qwen3_32b", devices=64).spec
    assert dense.kv_channels == 128 and dense.param_count() / 1e9 == pytest.approx(32.8, abs=0.1)
    v3 = read_torchtitan_config("deepseek_v3:deepseek_v3_16b", devices=64).spec  # multi-latent attention: by flavor
    assert v3.mla is not None and v3.param_count() / 1e9 == pytest.approx(15.7, abs=0.1)


@pytest.mark.skipif(not REAL, reason="torchtitan (main branch) not installed")
def test_real_torchtitan_configuration_reads_and_round_trips(tmp_path):
    back = read_torchtitan_config("llama3:llama3_8b", devices=8)
    assert back.spec.name == "llama3-8B" and back.plan.devices == 8
    recipe = tmp_path / "torchtitan_recipe.py"
    recipe.write_text(torchtitan_recipe(back.spec, back.plan))
    again = read_torchtitan_config(f"{recipe}:tuner_plan")
    assert again.plan == back.plan
    _drop_torchtitan_modules()


class Float8Linear:
    """Stands for torchtitan's converted linear: its config class is ``Float8Linear.Config``."""

    class Config:
        def __init__(self, out_features: int) -> None:
            self.out_features = out_features


def test_float8_converted_linears_read_as_fp8_linears():
    """torchtitan main applies a Float8LinearConverter to the model's configuration tree, swapping each
    ``Linear.Config`` for ``Float8Linear.Config``: read as tuner's FP8 linears, with a note."""
    block = _block(ffn=4096)
    block.feed_forward.w1 = Float8Linear.Config(out_features=4096)
    spec, notes = spec_from_model_config(_model([block] * 2), 2048, "cfg")
    assert spec.fp8_linear and spec.ffn == 4096 and any("Float8Linear linears" in n for n in notes)
    plain, _ = spec_from_model_config(_model([_block(ffn=4096)] * 2), 2048, "cfg")
    assert not plain.fp8_linear
