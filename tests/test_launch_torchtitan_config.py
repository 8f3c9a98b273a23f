"""torchtitan's Python configurations (main branch): the recipe tuner writes, run by torchtitan's own
``ConfigManager`` and read back to the plan torchtitan runs — against the installed torchtitan, else
against a stand-in of its configuration classes (``tests/torchtitan_stub``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

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
from tuner.launch.torchtitan_config import torchtitan_flavor

STUB = Path(__file__).resolve().parent / "torchtitan_stub"
REAL = importlib.util.find_spec("torchtitan") is not None
LLAMA = torchtitan_model("llama3", "8B", 4096)
SMALL = TransformerSpec(layers=8, hidden=1024, heads=16, seq=1024, vocab=8000, name="gpt-small")

PLANS = [
    ParallelPlan(tp=2, pp=2, dp=2, micro_batch=2, global_batch=32, schedule="interleaved", virtual_stages=2,
                 sequence_parallel=True, recompute="full", distributed_optimizer=True),
    ParallelPlan(tp=1, pp=1, dp=8, micro_batch=2, global_batch=64, fsdp=True, recompute="op"),
    ParallelPlan(tp=4, pp=1, dp=2, micro_batch=1, global_batch=16, tp_comm_overlap=True),
    ParallelPlan(tp=1, pp=4, dp=2, micro_batch=1, global_batch=16, recompute="full"),
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


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.label())
def test_recipe_runs_and_reads_back_to_the_plan_torchtitan_runs(stub, tmp_path, plan):
    recipe = tmp_path / "torchtitan_recipe.py"
    recipe.write_text(torchtitan_recipe(LLAMA, plan, platform="h100-sxm", devices_per_node=8))
    back = read_torchtitan_config(f"{recipe}:tuner_plan")
    assert back.spec == LLAMA and back.devices == plan.devices and back.platform == "h100-sxm"
    assert back.plan == torchtitan_plan(plan, LLAMA)
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
    assert p.sequence_parallel and p.fsdp and not p.distributed_optimizer and any("flavor" in n for n in back.notes)
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
        read(training__num_tokens_per_microbatch_per_dp_rank=5000)
    with pytest.raises(LaunchError, match="not a multiple of the 65536 tokens"):
        read(training__num_tokens_per_train_step=100000)
    with pytest.raises(LaunchError, match="ZeroBubble"):
        read(parallelism__pipeline_parallel_degree=2, parallelism__pipeline_parallel_schedule="ZeroBubble",
             parallelism__num_pp_microbatches=4)
    with pytest.raises(LaunchError, match="tuner knows llama3 / 8B"):
        read(root__model_spec=None)
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


def test_cli_without_torchtitan_says_what_it_needs(monkeypatch):
    for name in ("torchtitan", "torchtitan.config", "torchtitan.config.manager"):
        monkeypatch.setitem(sys.modules, name, None)  # import torchtitan fails, installed or not
    code, out = _cli("predict", "--torchtitan", "llama3:llama3_8b", "--devices", "8")
    assert code == 2 and out.startswith("error: llama3:llama3_8b: reading a torchtitan configuration needs")
    assert len(out.strip().splitlines()) == 1


@pytest.mark.skipif(not REAL, reason="torchtitan (main branch) not installed")
def test_real_torchtitan_configuration_reads_and_round_trips(tmp_path):
    back = read_torchtitan_config("llama3:llama3_8b", devices=8)
    assert back.spec.name == "llama3-8B" and back.plan.devices == 8
    recipe = tmp_path / "torchtitan_recipe.py"
    recipe.write_text(torchtitan_recipe(back.spec, back.plan))
    again = read_torchtitan_config(f"{recipe}:tuner_plan")
    assert again.plan == back.plan
    _drop_torchtitan_modules()
