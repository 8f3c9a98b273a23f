"""The distributed optimizer's parameter all-gather beside the next forward (``overlap_param_gather``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from predictor.sources.synth.pipeline_schedule import schedule
from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec, build_transformer_graph
from predictor.timing.platforms import get_platform
from tuner.plans import predict_plan

#: a model whose gradients and parameters cross 8 nodes, 4 micro-batches per replica (TP 8 fills a node)
SPEC = TransformerSpec(layers=8, hidden=4096, heads=32, seq=2048, vocab=32000, attention="flash", dropout=0.0)
PLAN = ParallelPlan(tp=8, pp=1, dp=8, micro_batch=1, global_batch=32, sequence_parallel=True,
                    distributed_optimizer=True, grad_reduce_dtype="fp32")


def _kernels_only(graph, names: np.ndarray) -> np.ndarray:
    """Task names with the host tasks' blanked (an op's CPU task carries its kernel's name)."""
    procs = np.asarray(graph.proc_names, dtype=object)[graph.proc]
    return np.where(procs != "cpu", names, "")


def _timeline(plan: ParallelPlan, platform: str = "h100-sxm"):
    res, tl = predict_plan(SPEC, plan, get_platform(platform), devices=plan.devices, detail="kernel",
                           keep_timeline=True)
    names = np.asarray(tl.graph.names, dtype=object)[tl.graph.name].astype(str)
    return res, tl, _kernels_only(tl.graph, names)


def test_the_gather_moves_from_after_the_step_into_the_first_forward():
    after, tl0, names0 = _timeline(PLAN)
    beside, tl1, names1 = _timeline(replace(PLAN, overlap_param_gather=True))
    adam0 = tl0.end[names0 == "adam.multi_tensor_apply"].max()
    gather0 = names0 == "param.all_gather"
    assert tl0.start[gather0].min() >= adam0  # the step, then the gather
    gather1 = np.flatnonzero(names1 == "param.all_gather")
    assert gather1.size == 2  # the first bucket and the rest of the one model chunk
    adam1 = tl1.end[names1 == "adam.multi_tensor_apply"].max()
    assert tl1.end[gather1].max() < adam1
    # the first bucket before the first layer; the rest launched by that wait, done by the first backward
    first_fwd = np.flatnonzero(np.char.endswith(names1, "qkv.addmm")).min()
    first_bwd = np.flatnonzero(np.char.endswith(names1, "dgrad")).min()
    assert tl1.end[gather1[0]] <= tl1.start[first_fwd] + 1e-12
    assert tl1.end[gather1[0]] <= tl1.start[gather1[1]] and tl1.end[gather1[1]] <= tl1.start[first_bwd] + 1e-12
    assert beside["predicted_iteration_s"] < after["predicted_iteration_s"]
    assert beside["plan"].endswith("-opg") and not after["plan"].endswith("-opg")


def test_a_slower_network_still_shows_through_the_overlapped_gather():
    """Perturb: the gather hidden behind one forward cannot hide a 10x slower network."""
    plat = get_platform("h100-sxm")
    net = plat.interconnect
    slow = plat.model_copy(update={"interconnect": net.model_copy(update={"network_efficiency": net.network_efficiency / 10})})
    plan = replace(PLAN, overlap_param_gather=True)
    fast, _ = predict_plan(SPEC, plan, plat, devices=plan.devices)
    slowed, _ = predict_plan(SPEC, plan, slow, devices=plan.devices)
    assert slowed["predicted_iteration_s"] > 1.5 * fast["predicted_iteration_s"]


@pytest.mark.parametrize("detail", ["kernel", "stage"])
def test_interleaved_chunks_each_wait_for_their_own_gather(detail):
    plan = replace(PLAN, tp=4, pp=2, dp=4, global_batch=16, schedule="interleaved", virtual_stages=2,
                   overlap_param_gather=True)
    plat = get_platform("h100-sxm")
    from predictor.sources.synth.transformer import transformer_timing

    g = build_transformer_graph(SPEC, plan, detail=detail, timing=transformer_timing(plat))
    names = _kernels_only(g, np.asarray(g.names, dtype=object)[g.name].astype(str))
    assert (names == "param.all_gather").sum() == 2 * 2 * 2  # per stage, per chunk: first bucket and rest
    res, _ = predict_plan(SPEC, plan, plat, devices=plan.devices, detail=detail)
    assert res["feasible"] and res["predicted_iteration_s"] > 0


def test_the_switch_needs_a_sharded_optimizer():
    assert not replace(PLAN, distributed_optimizer=False, overlap_param_gather=True).gathers_params_in_forward
    assert not replace(PLAN, dp=1, tp=8, global_batch=4, overlap_param_gather=True).gathers_params_in_forward
    assert replace(PLAN, overlap_param_gather=True).gathers_params_in_forward



def _chunk_gathers(plan: ParallelPlan) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Stage 0's gather kernels (first bucket and rest of each chunk, in order), the timeline's starts, and the
    start of each chunk's first forward on stage 0 (its first layer's input norm, micro-batch 0)."""
    _, tl, names = _timeline(plan)
    rank0 = np.asarray(tl.graph.rank) == 0
    gathers = np.flatnonzero((names == "param.all_gather") & rank0)
    qkv = np.sort(tl.start[np.flatnonzero(np.char.endswith(names, "layer[0].input_layernorm") & rank0)])
    forwards = [st for st in schedule(plan.schedule, plan.pp, plan.micro_batches, 0, plan.virtual_stages)
                if st.phase == "F"]
    first = [float(qkv[next(k for k, st in enumerate(forwards) if st.chunk == c and st.micro_batch == 0)])
             for c in range(plan.virtual_stages)]
    return gathers, tl.start, first


def test_aligned_chunks_are_gathered_a_chunk_ahead_and_lazy_ones_at_their_forward():
    base = replace(PLAN, tp=4, pp=2, dp=4, global_batch=16, schedule="interleaved", virtual_stages=4,
                   overlap_param_gather=True)
    gathers, start, first = _chunk_gathers(base)  # aligned: Megatron-core's default
    assert gathers.size == 2 * 4
    assert start[gathers[2]] < first[1]  # chunk 1 gathered from the start, ahead of its forward
    for c in (2, 3):  # chunk c launched by chunk c - 1's first forward, done before its own
        assert first[c - 1] <= start[gathers[2 * c]] <= first[c]
    lazy = replace(base, align_param_gather=False)
    gathers, start, first = _chunk_gathers(lazy)
    for c in range(1, 4):  # each chunk's rest launched by its own first forward (chunk 0's starts at the embedding)
        assert start[gathers[2 * c + 1]] >= first[c] - 1e-12
    assert lazy.label().endswith("-opg-noalign") and base.label().endswith("-opg")
