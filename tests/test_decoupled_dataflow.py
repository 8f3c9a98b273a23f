"""On-chip residency of the decoupled time model on dataflow chips (SN30, Bow IPU, CS-2): operator
fusion keeps intermediates on chip, software-managed SRAM keeps what the memory model placed there."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.memory import memory_timeline, place
from predictor.sources.synth.decoupled import (
    DATAFLOW_KINDS,
    TimeOptions,
    build_iteration_graph,
    predict_iteration,
)
from predictor.sources.synth.models import get_model_spec
from predictor.sources.synth.op_trace import trace_scalable
from predictor.timing.platforms import get_platform


@pytest.fixture(scope="module")
def tiny_gpt():
    spec = get_model_spec("gpt2-tiny")
    return trace_scalable(spec.build, spec.make_batch, spec.loss, precision="fp32")


def _share(graph, kind: str) -> float:
    mask = graph.kind_mask(kind)
    total = np.nan_to_num(graph.bytes[mask]).sum()
    return float(graph.meta["on_chip_bytes"][mask].sum() / total)


def _shrunk(key: str, on_chip_bytes: float, kind: str | None = None):
    """``key`` with its on-chip level cut to ``on_chip_bytes`` (and another platform kind, if given)."""
    p = get_platform(key)
    mem = [m.model_copy(update={"capacity_bytes": on_chip_bytes}) if m.on_chip else m for m in p.memory]
    return p.model_copy(update={"memory": mem, **({"kind": kind} if kind else {})})


def test_catalog_dataflow_chips():
    assert {get_platform(k).kind for k in ("sn30", "bow-ipu", "cs-2")} == set(DATAFLOW_KINDS)
    assert get_platform("a100-40gb").kind not in DATAFLOW_KINDS


def test_fusion_keeps_intermediates_on_chip_but_not_saved_activations(tiny_gpt):
    g = tiny_gpt.at(512)  # activations far beyond a 4 MiB on-chip memory
    rdu = _shrunk("sn30", 4 * 2**20)
    cache = _shrunk("sn30", 4 * 2**20, kind="tpu")  # same memories, executed op by op
    fused = build_iteration_graph(g, rdu, None, TimeOptions())
    plain = build_iteration_graph(g, cache, None, TimeOptions())
    assert _share(fused, "elementwise") > 0.6 > _share(plain, "elementwise") + 0.3
    total = np.nan_to_num(fused.bytes[fused.kind_mask("elementwise", "layer_norm")]).sum()
    on = fused.meta["on_chip_bytes"][fused.kind_mask("elementwise", "layer_norm")].sum()
    assert on < 0.97 * total  # the backward still reads saved activations from DDR
    t_fused, _, _ = predict_iteration(g, rdu, None)
    t_plain, _, _ = predict_iteration(g, cache, None)
    assert t_fused.uncommon_ops_s < 0.5 * t_plain.uncommon_ops_s


def test_sram_holds_what_the_memory_model_placed_on_chip(tiny_gpt):
    g = tiny_gpt.at(4)
    ipu = get_platform("bow-ipu")
    usage = place(memory_timeline(g), ipu)
    assert usage.off_chip_bytes == 0  # the whole iteration fits in 900 MB
    graph = build_iteration_graph(g, ipu, usage, TimeOptions())
    dev = (graph.proc == 1) & (np.nan_to_num(graph.bytes) > 0)
    assert np.allclose(graph.meta["on_chip_bytes"][dev], np.nan_to_num(graph.bytes[dev]))


def test_gpus_keep_the_cache_rule(tiny_gpt):
    g = tiny_gpt.at(512)
    a100 = get_platform("a100-40gb")
    graph = build_iteration_graph(g, a100, None, TimeOptions())
    assert _share(graph, "elementwise") < 0.5  # L2 holds little of a 512-sequence batch
