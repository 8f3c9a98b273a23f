"""GraphBuilder.repeat and the transformer templates' repeated layers: the graph task-by-task emission builds."""

import numpy as np
import pytest

from predictor.graph import Category, DepKind, GraphBuilder, ProcKind
from predictor.sources.synth.transformer import (
    MoESpec,
    ParallelPlan,
    TransformerSpec,
    build_transformer_graph,
)
from predictor.timing.platforms import get_platform
from tuner.plans import transformer_timing

_COLS = ("rank", "proc", "name", "kind", "category", "overhead", "duration", "flops", "bytes", "group",
         "edge_src", "edge_dst", "edge_kind")


def _same(g1, g2) -> None:
    for c in _COLS:
        assert np.array_equal(getattr(g1, c), getattr(g2, c), equal_nan=True), c
    assert g1.names == g2.names and g1.kinds == g2.kinds and g1.proc_names == g2.proc_names
    assert set(g1.params) == set(g2.params)
    for k in g1.params:
        assert np.array_equal(g1.params[k], g2.params[k], equal_nan=True), k


def _layers(layers: int, repeat: bool, flops=lambda i: 1.0):
    """A chain of layers (a launch and a kernel each, the kernel after the previous layer's), one at a time or
    the first two emitted and the rest repeated."""
    b = GraphBuilder()
    cpu, gpu = b.processor(0, ProcKind.CPU_THREAD, "cpu"), b.processor(0, ProcKind.GPU_STREAM, "gpu")
    head = b.task(gpu, "head", "gemm", Category.COMPUTE, duration=1.0)
    last, marks = head, [b.mark()]
    for i in range(layers if not repeat else 2):
        launch = b.task(cpu, "launch", "launch", Category.CPU, duration=1e-6)
        k = b.task(gpu, f"layer[{i}].mm", "gemm", Category.COMPUTE, flops=flops(i), params={"m": 8.0})
        b.edge(launch, k, DepKind.CPU_GPU)
        b.edge(last, k, DepKind.GPU_GPU)
        b.edge(head, k, DepKind.GPU_GPU)  # every layer waits for the head: kept, not moved
        last = k
        marks.append(b.mark())
    if repeat:
        ok = b.repeat(*marks, layers - 2, lambda nm, k: [nm.replace("[0]", f"[{j}]") for j in range(1, k + 1)])
        return b.build(), ok
    return b.build(), True


def test_repeat_builds_what_emitting_every_layer_builds():
    (g, ok), (full, _) = _layers(6, True), _layers(6, False)
    assert ok
    _same(g, full)
    assert g.names.count("layer[5].mm") == 1 and g.n_tasks == 13


def test_repeat_refuses_a_span_that_does_not_repeat_and_appends_nothing():
    g, ok = _layers(6, True, flops=lambda i: 1.0 + i)  # the second layer's kernel differs from the first's
    assert not ok and g.n_tasks == 5
    b = GraphBuilder()
    p = b.processor(0, ProcKind.CPU_THREAD, "cpu")
    a = b.mark()
    b.task(p, "x[0]", "op", Category.CPU)
    m = b.mark()
    b.task(p, "x[1]", "op", Category.CPU)
    # names that do not follow the renaming: refused
    assert not b.repeat(a, m, b.mark(), 3, lambda nm, k: [nm] * k) and b.n_tasks == 2


SPECS = {
    "gpt": TransformerSpec(name="gpt", layers=16, hidden=1024, heads=16, seq=2048, vocab=32000),
    "moe": TransformerSpec(name="moe", layers=12, hidden=1024, heads=16, seq=2048, vocab=32000,
                           moe=MoESpec(experts=8, top_k=2, dense_layers=1)),
    "llama": TransformerSpec(name="llama", layers=24, hidden=2048, heads=16, kv_heads=4, seq=4096, vocab=128256,
                             mlp="swiglu", position="rope", attention="te", program="eager"),
    # a 113 M-parameter layer per rank against DP 256's 256 M-parameter buckets: a bucket every two or three layers
    "nemotron": TransformerSpec(name="nemotron", layers=32, hidden=6144, heads=48, kv_heads=8, seq=4096, vocab=256000,
                                ffn=24576, bias=False, position="rope", attention="cudnn"),
}


@pytest.mark.parametrize("spec,plan,detail", [
    ("gpt", dict(tp=8, pp=1, dp=8, global_batch=64, recompute="full"), "stage"),
    ("gpt", dict(tp=2, pp=2, dp=4, global_batch=32, recompute="full", recompute_layers=3,
                 distributed_optimizer=True, overlap_grad_reduce=True), "kernel"),
    ("gpt", dict(tp=4, pp=2, dp=2, global_batch=16, schedule="interleaved", virtual_stages=2,
                 sequence_parallel=True, tp_comm_overlap=True), "stage"),
    ("moe", dict(tp=1, pp=2, dp=4, ep=2, global_batch=16, recompute="selective", overlap_grad_reduce=True), "kernel"),
    ("llama", dict(tp=1, pp=1, dp=4, global_batch=16, fsdp=True), "kernel"),
    ("llama", dict(tp=2, pp=1, dp=4, global_batch=16, overlap_grad_reduce=True, distributed_optimizer=True), "stage"),
    ("nemotron", dict(tp=4, pp=1, dp=256, global_batch=1024, sequence_parallel=True, distributed_optimizer=True,
                      overlap_grad_reduce=True, grad_reduce_dtype="bf16"), "stage"),
])
def test_transformer_graph_is_the_same_with_layers_repeated(monkeypatch, spec, plan, detail):
    """Every chunk's layers emitted one by one (repeat refused) and with repeated layers: the same graph."""
    timing = transformer_timing(get_platform("h100-sxm"))
    p = ParallelPlan(micro_batch=1, **plan)
    repeat, copied = GraphBuilder.repeat, []
    monkeypatch.setattr(GraphBuilder, "repeat", lambda self, *a: copied.append(repeat(self, *a)) or copied[-1])
    fast = build_transformer_graph(SPECS[spec], p, devices_per_node=8, detail=detail, timing=timing, check=False)
    assert any(copied) or p.fsdp  # layers were copied (FSDP's per-layer gathers are emitted one by one)
    monkeypatch.setattr(GraphBuilder, "repeat", lambda self, *a, **k: False)
    full = build_transformer_graph(SPECS[spec], p, devices_per_node=8, detail=detail, timing=timing, check=False)
    _same(fast, full)
