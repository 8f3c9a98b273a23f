"""The device host model's calibration: the overheads calibration's own step as a graph, and what it closes.

:func:`predictor.timing.calibration.overheads.measure_overheads` trains a small DLRM-like model (``SmallDLRM``:
four sparse ``EmbeddingBag`` tables, two MLPs, concatenation, layer norm, dropout, BCE with logits, SGD)
and times its step twice: unprofiled (``iteration_s_unprofiled``, a synchronisation after each step) and
profiled (``iteration_s_profiled``), from which T1..T5 come. Two facts follow for a device's host model:

* **profiler ratio** — ``iteration_s_unprofiled / iteration_s_profiled``: the profiler slows every host
  event of that host-bound step; its T's, scaled by the ratio, are what the same ops cost unprofiled
  (:func:`device_overheads`). Scaling alone under-charges steps whose graphs lack host work the real
  program runs; the device-mode synthesisers emit that work (:mod:`predictor.sources.synth.emit`: kernel-less
  autograd nodes, foreach optimizers).
* **step framework cost** (``step_s``, overhead type STEP, once per training step) — the measured
  unprofiled step less the simulated :func:`calibration_step_graph` priced with the scaled T's and
  ``step_s = 0``: what the step costs the host beyond its ops (entering ``backward()``, the autograd
  device thread's hand-offs, ``optimizer.step()``'s Python), clipped at zero.
* **sparse table cost** (``sparse_table_s``, overhead type SPARSE_TABLE, once per embedding table with a
  sparse gradient) — when the calibration also timed the model without its tables
  (``iteration_s_unprofiled_dense``), two points close two unknowns: ``step_s`` from the
  dense-only step, and the full step's remainder over its four tables (a sparse backward and update cost the
  host more than the average op the T's price: nested ATen calls building and adding the sparse gradient).
  Without that measurement ``step_s`` takes the whole remainder and ``sparse_table_s`` is 0.

Both are calibration facts of the device, taken from the calibration's own measurements, and applied to
every device-mode graph (CUDA asset packs; :func:`predictor.timing.calibrate.calibrated_platform.calibrated_platform`).
Units: seconds.
"""

from __future__ import annotations

import numpy as np

from predictor.graph import Category, ExecutionGraph, GraphBuilder
from predictor.sources.synth.emit import OpEmitter, concat, eltwise
from predictor.sources.synth.mlp import (
    activation_backward,
    activation_forward,
    backward_entry,
    layer_tensors,
    linear_backward,
    linear_forward,
    linear_grad_nodes,
    sgd_step,
)
from predictor.timing.kernels.embedding import RF_COLUMNS

__all__ = ["calibration_step_graph", "profiler_ratio", "device_overheads", "T_FIELDS"]

T_FIELDS = ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s")
#: ``SmallDLRM``'s defaults and ``measure_overheads``' batch (keep in step with overheads.py)
ROWS, DIM, TABLES, POOLING, BATCH, DENSE = 20000, 32, 4, 4, 256, 13
BOTTOM = ((DENSE, 64), (64, DIM))
TOP_HIDDEN = 128  # the top MLP: concatenation width -> 128 -> 1


def _table_reuse(batch: int) -> np.ndarray:
    """The reuse histograms of the calibration step's index batches, drawn as ``measure_overheads`` draws them."""
    import torch

    from predictor.timing.calibration.embedding_bag import reuse_factors

    gen = torch.Generator().manual_seed(0)
    torch.randn(batch, DENSE, generator=gen)
    return np.stack([reuse_factors(torch.randint(0, ROWS, (batch * POOLING,), generator=gen).numpy())
                     for _ in range(TABLES)])


def calibration_step_graph(batch: int = BATCH, tables: int = TABLES) -> ExecutionGraph:
    """One training step of ``SmallDLRM`` on a device, as eager PyTorch runs it (see the module).

    Forward: ``zero_grad``, four embedding-bag lookups, bottom MLP (13-64-32, ReLU), concatenation of five
    32-wide parts, layer norm, top MLP (160-128-1, ReLU, dropout), BCE with logits (log-sigmoid, three
    element-wise ops, mean: five kernels). Backward: the loss node (four kernels), per linear layer
    ``AddmmBackward0`` (the first layer's input needs no gradient) and its three kernel-less nodes,
    the dropout / ReLU / layer-norm nodes, ``CatBackward0`` (views, no kernel), per table the sparse
    backward and its ``AccumulateGrad`` (and its SPARSE_TABLE task). Optimizer: SGD with sparse gradients in
    the group runs its per-tensor loop (foreach does not take sparse tensors): one ``add_`` per parameter tensor.
    ``tables=0``: the dense-only step the calibration also times (``SmallDLRM(tables=0)``: a one-part
    concatenation, 32-wide layer norm, SGD's foreach path).
    """
    gb = GraphBuilder()
    e = OpEmitter(gb, 0, "device")
    dt, b = 4, float(batch)
    rf = _table_reuse(batch) if tables else np.zeros((0, len(RF_COLUMNS)))

    def table(t: int) -> dict:
        p = {"batch": b, "rows": float(ROWS), "dim": float(DIM), "pooling": float(POOLING), "dtype_bytes": float(dt)}
        p.update({c: float(v) for c, v in zip(RF_COLUMNS, rf[t], strict=True)})
        return p

    e.node("optimizer.zero_grad")
    for t in range(tables):
        e.op(f"embedding_bag[{t}]", [(f"embedding_bag_fwd[{t}]", "embedding_bag_fwd", Category.MEMORY, table(t))])
    width = DIM * (tables + 1)
    bottom = [(f"bottom{li}", i, o) for li, (i, o) in enumerate(BOTTOM)]
    top = [("top0", width, TOP_HIDDEN), ("top1", TOP_HIDDEN, 1)]
    for name, i, o in bottom:
        linear_forward(e, name, b, i, o, dt)
        activation_forward(e, name, "relu", b * o, dt)
    e.op("cat", [concat("cat", b, width, tables + 1, dt)])
    e.op("layer_norm", [eltwise("layer_norm", "layer_norm", b * width, dt, rw=2.0)])
    (_, i0, o0), (_, i1, o1) = top
    linear_forward(e, "top0", b, i0, o0, dt)
    activation_forward(e, "top0", "relu", b * o0, dt)
    e.op("top0.dropout", [eltwise("top0.dropout", "dropout", b * o0, dt, rw=2.5)])
    linear_forward(e, "top1", b, i1, o1, dt)
    e.op("bce_with_logits", [eltwise(f"bce_with_logits[{k}]", "elementwise", b, dt, rw=2.0) for k in range(5)])
    backward_entry(e, dt)
    e.op("bce_with_logits.backward", [eltwise(f"bce_with_logits_bwd[{k}]", "elementwise", b, dt, rw=2.0)
                                      for k in range(4)])
    linear_backward(e, "top1", b, i1, o1, dt)
    linear_grad_nodes(e, "top1")
    e.op("top0.dropout.backward", [eltwise("top0.dropout_bwd", "mul", b * o0, dt, rw=3.0)])
    activation_backward(e, "top0", "relu", b * o0, dt)
    linear_backward(e, "top0", b, i0, o0, dt)
    linear_grad_nodes(e, "top0")
    e.op("layer_norm.backward", [eltwise("layer_norm_bwd", "layer_norm", b * width, dt, rw=3.0),
                                 eltwise("layer_norm_bwd.gamma_beta", "elementwise", b * width, dt, rw=2.0)])
    e.node("layer_norm.weight.accumulate_grad")
    e.node("layer_norm.bias.accumulate_grad")
    e.node("cat.backward")
    for li in reversed(range(len(bottom))):
        name, i, o = bottom[li]
        activation_backward(e, name, "relu", b * o, dt)
        linear_backward(e, name, b, i, o, dt, input_grad=li > 0)
        linear_grad_nodes(e, name)
    for t in reversed(range(tables)):
        e.op(f"embedding_bag_backward[{t}]", [(f"embedding_bag_bwd[{t}]", "embedding_bag_bwd", Category.MEMORY, table(t))])
        e.node(f"embedding_bag[{t}].accumulate_grad")
        e.sparse_table(f"embedding_bag[{t}].sparse_host")
    # SGD in parameters() order: tables (dense += sparse rows), bottom, norm, top; with sparse gradients in the
    # group its per-tensor loop (foreach takes no sparse tensors), else the foreach path
    params = [*((f"emb{t}", b * POOLING * DIM) for t in range(tables)), *layer_tensors(bottom),
              ("norm.weight", float(width)), ("norm.bias", float(width)), *layer_tensors(top)]
    sgd_step(e, params, dt, use_foreach=not tables)
    gb.meta.update({"workload": "calibration_step", "n_ranks": 1, "batch_size": batch, "tables": tables})
    return gb.build()


def profiler_ratio(overheads: dict) -> float:
    """The calibration step's unprofiled / profiled time (in (0, 1]); 1.0 when either is missing."""
    u, p = overheads.get("iteration_s_unprofiled"), overheads.get("iteration_s_profiled")
    if not u or not p or u <= 0 or p <= 0:
        return 1.0
    return float(min(1.0, u / p))


def device_overheads(overheads: dict, timing) -> dict[str, float]:
    """T1..T5 scaled by :func:`profiler_ratio`, ``step_s`` and ``sparse_table_s`` closed on the calibration's
    step(s) (seconds; see the module).

    ``overheads``: a CUDA calibration's measured overheads (the manifest's ``overheads``). ``timing``: a
    :class:`predictor.timing.kernels.timing.ModelTiming` of the device's fitted kernel models (its overheads are
    replaced here). Returns ``t1_s..t5_s``, ``step_s``, ``sparse_table_s``, and what the closure used:
    ``profiler_ratio``, ``simulated_step_s`` (the full step, both costs 0) and, with a dense-only step,
    ``simulated_dense_step_s``."""
    from predictor.simulate import simulate
    from predictor.timing.platforms.schema import CpuOverheads

    ratio = profiler_ratio(overheads)
    scaled = {k: float(overheads[k]) * ratio for k in T_FIELDS}
    timing.overheads = CpuOverheads(**scaled)
    simulated = float(simulate(calibration_step_graph(), timing).iteration_s)
    measured = float(overheads.get("iteration_s_unprofiled") or 0.0)
    out = {**scaled, "profiler_ratio": ratio, "simulated_step_s": simulated}
    dense = overheads.get("iteration_s_unprofiled_dense")
    if not dense:
        return {**out, "step_s": max(0.0, measured - simulated), "sparse_table_s": 0.0}
    sim_dense = float(simulate(calibration_step_graph(tables=0), timing).iteration_s)
    step_s = max(0.0, float(dense) - sim_dense)
    sparse = max(0.0, (measured - simulated - step_s) / TABLES)
    return {**out, "step_s": step_s, "sparse_table_s": sparse, "simulated_dense_step_s": sim_dense}
