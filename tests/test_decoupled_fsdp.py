"""The decoupled model under FSDP: each rank runs the optimizer on its shard of the parameters."""

from __future__ import annotations

import pytest

from predictor.sources.synth.decoupled import TimeOptions, predict_iteration
from predictor.sources.synth.models import get_model_spec
from predictor.sources.synth.op_trace import trace_scalable
from predictor.timing.platforms import get_platform


def test_fsdp_shards_the_optimizer_step_over_the_ranks():
    spec = get_model_spec("gpt2-small")
    g = trace_scalable(spec.build, spec.make_batch, spec.loss, precision="amp_bf16", optimizer="adamw").at(1)
    plat = get_platform("a100-80gb")
    ddp, _, _ = predict_iteration(g, plat, None, TimeOptions(n_devices=8))
    fsdp, _, _ = predict_iteration(g, plat, None, TimeOptions(n_devices=8, dp_mode="fsdp"))
    one, _, _ = predict_iteration(g, plat, None, TimeOptions(n_devices=1, dp_mode="fsdp"))
    two, _, _ = predict_iteration(g, plat, None, TimeOptions(n_devices=2, dp_mode="fsdp"))
    opt_ddp, opt_fsdp = ddp.time_by_kind["optimizer"], fsdp.time_by_kind["optimizer"]
    assert opt_ddp > 0
    # an eighth of the traffic, each of the per-tensor kernels keeping its launch floor
    assert opt_ddp / 8 <= opt_fsdp < 0.7 * opt_ddp
    assert opt_fsdp < two.time_by_kind["optimizer"] < opt_ddp
    assert one.time_by_kind["optimizer"] == pytest.approx(opt_ddp)  # one rank holds every parameter
    assert fsdp.time_by_kind["gemm"] == pytest.approx(ddp.time_by_kind["gemm"])
