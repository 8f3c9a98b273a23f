"""Trace one training iteration into an :class:`~predictor.sources.synth.opgraph.OpGraph` without
running the model.

A model (any ``nn.Module``) is built and stepped under :class:`FakeTensorMode`: every tensor
is a *fake* one that carries shape, dtype and device but no data, so a 1.5B-parameter GPT-2
is analysed on a laptop without allocating its 6 GB of weights. A dispatch-level
:class:`TorchDispatchMode` sits above the fake mode and records every ATen operator the
iteration runs — the forward pass, the loss, the backward pass that autograd executes, and
the optimizer step — in execution order (:class:`~predictor.sources.synth.training_loop.TrainingLoop`).

A storage's free event comes from a ``weakref.finalize`` on the storage object, whose Python
object PyTorch keeps alive exactly as long as the C++ storage — so tensors saved by autograd for
the backward pass stay allocated until autograd releases them, as they do in eager execution.
:func:`trace_scalable` traces at two batch sizes for
:class:`~predictor.sources.synth.opgraph.ScalableOpGraph`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from predictor.sources.synth.op_costs import classify_op, op_costs, op_short_name, shape_text, tensor_bytes
from predictor.sources.synth.opgraph import (
    OP_KIND_INDEX,
    OpGraph,
    Phase,
    ScalableOpGraph,
    TensorCategory,
    TraceError,
)
from predictor.sources.synth.training_loop import TrainingLoop

__all__ = ["trace_training_step", "trace_scalable"]

_IGNORED_NAMESPACES = {"prim", "profiler"}


class _Recorder:
    """Builds an :class:`OpGraph` while a TorchDispatchMode feeds it operators."""

    def __init__(self) -> None:
        self.phase = Phase.OTHER
        self.closed = False
        self.names: dict[str, int] = {}
        self.cols: dict[str, list] = {k: [] for k in ("op_name", "phase", "kind", "flops", "bytes_read",
                                                     "bytes_written", "param_elems", "m", "n", "k", "gemm_batch",
                                                     "dtype_bytes")}
        self.shapes: list[str] = []
        self.in_ptr = [0]
        self.in_tensor: list[int] = []
        self.in_bytes: list[float] = []
        self.out_ptr = [0]
        self.out_tensor: list[int] = []
        # tensors (storages)
        self.live: dict[int, int] = {}  # storage cdata -> tensor id
        self.t_nbytes: list[float] = []
        self.t_phase: list[int] = []
        self.t_baseline: list[bool] = []
        self.t_alloc_op: list[int] = []
        self.t_free_op: list[int] = []
        self.t_reads: list[int] = []
        self.t_cast_of_weight: list[bool] = []
        self.t_category: dict[int, int] = {}
        self.weight_ids: set[int] = set()
        self.ev_tensor: list[int] = []
        self.ev_sign: list[int] = []
        self.ev_op: list[int] = []
        self._finalizers: list[weakref.finalize] = []

    # ------------------------------------------------------------ tensors
    def _new_tensor(self, storage, baseline: bool) -> int:
        tid = len(self.t_nbytes)
        key = storage._cdata
        self.live[key] = tid
        self.t_nbytes.append(float(storage.nbytes()))
        self.t_phase.append(int(self.phase))
        self.t_baseline.append(baseline)
        self.t_alloc_op.append(-1 if baseline else self.n_ops)
        self.t_free_op.append(-1)
        self.t_reads.append(0)
        self.t_cast_of_weight.append(False)
        self._finalizers.append(weakref.finalize(storage, self._release, key, tid))
        if not baseline:
            self.ev_tensor.append(tid)
            self.ev_sign.append(1)
            self.ev_op.append(self.n_ops)
        return tid

    def _release(self, key: int, tid: int) -> None:
        if self.closed:
            return
        if self.live.get(key) == tid:
            del self.live[key]
        self.t_free_op[tid] = self.n_ops
        self.ev_tensor.append(tid)
        self.ev_sign.append(-1)
        self.ev_op.append(self.n_ops)

    def register_baseline(self, t: torch.Tensor, category: TensorCategory) -> int:
        """A storage alive before the recorded iteration (weights, optimizer state, inputs)."""
        s = t.untyped_storage()
        tid = self.live.get(s._cdata)
        if tid is None:
            tid = self._new_tensor(s, baseline=True)
        self.t_category.setdefault(tid, int(category))
        if self.t_category[tid] == TensorCategory.WEIGHTS:
            self.weight_ids.add(tid)
        return tid

    def tensor_id(self, t: torch.Tensor, *, as_output: bool) -> int:
        s = t.untyped_storage()
        tid = self.live.get(s._cdata)
        if tid is None:
            # an input nobody registered existed before the iteration: baseline
            tid = self._new_tensor(s, baseline=not as_output)
        return tid

    @property
    def n_ops(self) -> int:
        return len(self.cols["op_name"])

    # ------------------------------------------------------------ operators
    def record(self, func, args, kwargs, out) -> None:
        name = op_short_name(func)
        kind = classify_op(name, func)
        ins = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        outs = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
        in_ids = [self.tensor_id(t, as_output=False) for t in ins]
        for tid in in_ids:
            self.t_reads[tid] += 1
        out_ids = [self.tensor_id(t, as_output=True) for t in outs]
        weights = self.weight_ids
        param_elems = float(sum(t.numel() for t, tid in zip(ins, in_ids, strict=True)
                                if tid in weights or self.t_cast_of_weight[tid]))
        if name == "_to_copy" and in_ids and (in_ids[0] in weights) and out_ids and self.phase == Phase.FORWARD:
            self.t_cast_of_weight[out_ids[0]] = True
        flops, read, written, gemm = op_costs(name, kind, func, args, kwargs, ins, outs, out)
        c = self.cols
        c["op_name"].append(self.names.setdefault(str(func), len(self.names)))
        c["phase"].append(int(self.phase))
        c["kind"].append(kind)
        c["flops"].append(flops)
        c["bytes_read"].append(read)
        c["bytes_written"].append(written)
        c["param_elems"].append(param_elems)
        for key, v in zip(("m", "n", "k", "gemm_batch"), gemm, strict=True):
            c[key].append(v)
        ref = ins[1] if kind == OP_KIND_INDEX["gemm"] and len(ins) > 1 else (ins[0] if ins else (outs[0] if outs else None))
        c["dtype_bytes"].append(float(ref.element_size()) if ref is not None else np.nan)
        self.shapes.append(f"{shape_text(ins)} -> {shape_text(outs)}")
        for tid, t in zip(in_ids, ins, strict=True):
            self.in_tensor.append(tid)
            self.in_bytes.append(tensor_bytes(t))
        self.in_ptr.append(len(self.in_tensor))
        self.out_tensor.extend(out_ids)
        self.out_ptr.append(len(self.out_tensor))

    # ------------------------------------------------------------ freezing
    def close(self) -> None:
        self.closed = True
        for f in self._finalizers:
            f.detach()

    def categories(self, grads: set[int], states: set[int], master: set[int]) -> np.ndarray:
        n = len(self.t_nbytes)
        cat = np.full(n, int(TensorCategory.INPUT_OUTPUT), dtype=np.int8)
        for tid in range(n):
            pre = self.t_category.get(tid)
            if pre is not None:
                cat[tid] = pre
                continue
            if tid in grads:
                cat[tid] = TensorCategory.GRADIENTS
                continue
            if tid in states or tid in master or self.t_cast_of_weight[tid]:
                cat[tid] = TensorCategory.ALGORITHM
                continue
            if self.t_baseline[tid]:
                continue
            freed = self.t_free_op[tid]
            phase = self.t_phase[tid]
            temporary_of_step = phase in (Phase.OPTIMIZER, Phase.OTHER)
            consumed_at_once = self.t_reads[tid] <= 1 and freed - self.t_alloc_op[tid] <= 2
            if freed >= 0 and (temporary_of_step or consumed_at_once):
                cat[tid] = TensorCategory.EPHEMERAL
        return cat


class _Mode:
    """Factory for the recording TorchDispatchMode (imported lazily: private torch API)."""

    @staticmethod
    def make(rec: _Recorder):
        from torch.utils._python_dispatch import TorchDispatchMode

        class RecordingMode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if getattr(func, "namespace", "aten") not in _IGNORED_NAMESPACES:
                    rec.record(func, args, kwargs, out)
                return out

        return RecordingMode()


def trace_training_step(
    build: Callable[[], nn.Module],
    make_batch: Callable[[int], tuple[tuple, object]],
    loss_fn: Callable[[object, object], torch.Tensor],
    batch: int,
    *,
    precision: str = "fp32",
    optimizer: str = "adamw",
) -> OpGraph:
    """Trace one steady-state training iteration at ``batch`` under fake tensors.

    An unrecorded warm-up iteration creates the optimizer state first, so the recorded one
    starts as every later iteration does: weights, optimizer state and the previous
    iteration's gradients alive. Nothing is allocated for real.

    Raises:
        TraceError: the model cannot be built or stepped under fake tensors.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    if batch < 1:
        raise TraceError(f"batch size must be >= 1 (got {batch})")
    rec = _Recorder()
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = build()
            if not isinstance(model, nn.Module):
                raise TraceError(f"the model factory returned {type(model).__name__}, not an nn.Module")
            model.train()
            loop = TrainingLoop(model, make_batch, loss_fn, batch, precision=precision, optimizer=optimizer)
            loop.step()  # warm-up: optimizer state
            _register_baseline(rec, loop)
            step = _record_step(rec, loop)
    except TraceError:
        rec.close()
        raise
    except Exception as exc:  # an op without a fake implementation, a shape error in the model, ...
        rec.close()
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TraceError(f"cannot trace the model under fake tensors: {type(exc).__name__}: {msg}") from None
    rec.close()  # the loop (weights, state, gradients) stays alive until here: no free event after the step
    return _freeze(rec, step, batch, precision, optimizer)


def _register_baseline(rec: _Recorder, loop: TrainingLoop) -> None:
    """The storages alive before the recorded iteration, with their categories."""
    for p in loop.model.parameters():
        rec.register_baseline(p, TensorCategory.WEIGHTS)
    for b in loop.model.buffers():
        rec.register_baseline(b, TensorCategory.WEIGHTS)
    for m in loop.master:
        rec.register_baseline(m, TensorCategory.ALGORITHM)
    for s in loop.state_tensors():
        rec.register_baseline(s, TensorCategory.ALGORITHM)
    for p in loop.params:
        if p.grad is not None:
            rec.register_baseline(p.grad, TensorCategory.GRADIENTS)
    for x in tree_leaves((loop.inputs, loop.target)):
        if isinstance(x, torch.Tensor):
            rec.register_baseline(x, TensorCategory.INPUT_OUTPUT)


@dataclass
class _RecordedStep:
    """What the recorded iteration leaves besides the recorder's columns (tensor ids of the recorder)."""

    grads: set[int]  # weight gradients (fp32 master gradients excluded)
    master_grads: set[int]
    grad_ids: list[int]  # per parameter: its gradient's tensor, -1 if none
    states: set[int]  # optimizer state
    master: set[int]  # fp32 master weights
    n_params: int
    param_grad_bytes: list[float]
    grad_of_param: dict[int, torch.Tensor]  # keeps the gradients alive until the recorder is closed


def _record_step(rec: _Recorder, loop: TrainingLoop) -> _RecordedStep:
    """Run one iteration under the recording mode; note which storages hold gradients and state."""
    grads: set[int] = set()
    master_grads: set[int] = set()

    def on_phase(p: Phase) -> None:
        if rec.phase == Phase.BACKWARD and p == Phase.OPTIMIZER:
            for q in loop.params:
                if q.grad is not None:
                    tid = rec.live.get(q.grad.untyped_storage()._cdata)
                    if tid is not None:
                        grads.add(tid)
        if rec.phase == Phase.OPTIMIZER and p == Phase.OTHER:
            for m in loop.master:
                if m.grad is not None:
                    tid = rec.live.get(m.grad.untyped_storage()._cdata)
                    if tid is not None:
                        master_grads.add(tid)
        rec.phase = p

    loop.on_phase = on_phase
    grad_of_param = {}
    with _Mode.make(rec):
        loop.step()
        for i, q in enumerate(loop.params):
            if q.grad is not None:
                grad_of_param[i] = q.grad
    # capture before the loop object (and its tensors) go away
    grad_ids = [rec.live.get(grad_of_param[i].untyped_storage()._cdata, -1) if i in grad_of_param else -1
                for i in range(len(loop.params))]
    states = {rec.live[s.untyped_storage()._cdata] for s in loop.state_tensors()
              if s.untyped_storage()._cdata in rec.live}
    master = {rec.live[m.untyped_storage()._cdata] for m in loop.master if m.untyped_storage()._cdata in rec.live}
    return _RecordedStep(grads, master_grads, grad_ids, states, master, int(sum(p.numel() for p in loop.params)),
                         [float(p.numel() * p.element_size()) for p in loop.params], grad_of_param)


def _freeze(rec: _Recorder, step: _RecordedStep, batch: int, precision: str, optimizer: str) -> OpGraph:
    """The recorder's lists as the columns of an :class:`OpGraph`."""
    cat = rec.categories(step.grads, step.states, step.master | step.master_grads)
    ev_tensor, ev_sign, ev_op = _canonical_events(rec.ev_tensor, rec.ev_sign, rec.ev_op)
    alloc_op = np.asarray(rec.t_alloc_op)
    grad_ready = np.asarray([alloc_op[g] if g >= 0 else -1 for g in step.grad_ids], dtype=np.int64)
    c = rec.cols
    f64 = lambda k: np.asarray(c[k], dtype=np.float64)  # noqa: E731
    return OpGraph(
        batch=int(batch),
        precision=precision,
        names=list(rec.names),
        op_name=np.asarray(c["op_name"], dtype=np.int32),
        phase=np.asarray(c["phase"], dtype=np.int8),
        kind=np.asarray(c["kind"], dtype=np.int8),
        flops=f64("flops"),
        bytes_read=f64("bytes_read"),
        bytes_written=f64("bytes_written"),
        param_elems=f64("param_elems"),
        m=f64("m"),
        n=f64("n"),
        k=f64("k"),
        gemm_batch=f64("gemm_batch"),
        dtype_bytes=f64("dtype_bytes"),
        shapes=rec.shapes,
        in_ptr=np.asarray(rec.in_ptr, dtype=np.int64),
        in_tensor=np.asarray(rec.in_tensor, dtype=np.int64),
        in_bytes=np.asarray(rec.in_bytes, dtype=np.float64),
        out_ptr=np.asarray(rec.out_ptr, dtype=np.int64),
        out_tensor=np.asarray(rec.out_tensor, dtype=np.int64),
        nbytes=np.asarray(rec.t_nbytes, dtype=np.float64),
        category=cat,
        alloc_phase=np.asarray(rec.t_phase, dtype=np.int8),
        baseline=np.asarray(rec.t_baseline, dtype=bool),
        ev_tensor=ev_tensor,
        ev_sign=ev_sign,
        ev_op=ev_op,
        grad_ready_op=grad_ready,
        grad_bytes=np.asarray(step.param_grad_bytes, dtype=np.float64),
        n_params=step.n_params,
        meta={"optimizer": optimizer},
    )


def _canonical_events(tensor: list[int], sign: list[int], op: list[int]) -> tuple[np.ndarray, ...]:
    """Events with each run of consecutive frees (or allocations) between two ops sorted by tensor.

    Python may release the objects of one deallocation cascade in any order; within such a run
    the order cannot change any peak (a run of frees only decreases the live bytes), so sorting
    makes traces at different batch sizes comparable event by event.
    """
    t = np.asarray(tensor, dtype=np.int64)
    s = np.asarray(sign, dtype=np.int8)
    o = np.asarray(op, dtype=np.int64)
    if t.size == 0:
        return t, s, o
    new_run = np.ones(t.size, dtype=bool)
    new_run[1:] = (s[1:] != s[:-1]) | (o[1:] != o[:-1])
    run = np.cumsum(new_run)
    order = np.lexsort((t, run))
    return t[order], s[order], o[order]


def trace_scalable(
    build: Callable[[], nn.Module],
    make_batch: Callable[[int], tuple[tuple, object]],
    loss_fn: Callable[[object, object], torch.Tensor],
    *,
    precision: str = "fp32",
    optimizer: str = "adamw",
    batches: tuple[int, int] = (2, 3),
) -> ScalableOpGraph:
    """Trace at two batch sizes and return the interpolating :class:`ScalableOpGraph`."""
    lo = trace_training_step(build, make_batch, loss_fn, batches[0], precision=precision, optimizer=optimizer)
    hi = trace_training_step(build, make_batch, loss_fn, batches[1], precision=precision, optimizer=optimizer)
    return ScalableOpGraph(lo, hi)
