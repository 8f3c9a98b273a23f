"""Batch dependence of a captured run's kernels: which inputs are parameters, the captured batch size,
and how each kernel's parameters scale with the batch.

The captured batch size ``B0`` is dim 0 of the first non-parameter tensor input of the step's first
forward op (:func:`detect_batch`). A tensor input is a *parameter* if the execution trace says so (tensor
ids consumed by the optimizer step or by AccumulateGrad, closed under view ops), else if its shape (or
transpose) is a gradient's shape (:class:`ParamInputs`). For each kernel the parameters are recomputed
with the batch dimension doubled — a non-parameter tensor's first dimension divisible by ``B0``; for a
2-D GEMM the operand roles decide (activation x weight: ``m``; weight x activation: ``n``; two
activations, the weight-gradient GEMM: ``k``); for ``bmm`` the batch — and the exponent
``log2(p(2B)/p(B))`` of every parameter column is stored (``x_m``, ``x_k``, ``x_flops``, ...; ``x_work``
for the work of the op; :func:`batch_exponents`). A transform scales a column by ``s ** x``. A dropout
with ``p`` 0 or ``train`` false returns its input (:func:`returns_input`): batch-independent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from predictor.sources.traces.build import ReplayGraph
from predictor.sources.traces.host_kernels import GEMM_OPS, STOP_OPS, VIEW_OPS, kernel_params, tensor_inputs
from predictor.sources.traces.kineto import EventCat, KinetoTrace
from predictor.sources.traces.op_tree import BACKWARD_OP_PREFIX, OpTree
from predictor.sources.traces.rank_events import join_et

__all__ = ["PARAM_EXP_COLUMNS", "DROPOUT_OPS", "ParamInputs", "rank_params", "batch_exponents", "detect_batch",
           "returns_input", "record_batch_exponents"]

#: parameter columns whose batch exponent is stored (as aux column ``x_<name>``)
PARAM_EXP_COLUMNS = ("m", "n", "k", "batch", "elements", "rows", "dim", "pooling", "msg_bytes")
#: ``op(input, p, train)`` dropouts that hand back their input, without a kernel, when ``p`` is 0 or ``train``
#: is false (ATen's ``_dropout_impl``, every device)
DROPOUT_OPS = ("aten::dropout", "aten::dropout_", "aten::feature_dropout", "aten::feature_dropout_",
               "aten::alpha_dropout", "aten::alpha_dropout_", "aten::feature_alpha_dropout",
               "aten::feature_alpha_dropout_")


# ----------------------------------------------------------------------------- parameters
def _param_ids(et) -> set[int]:
    """Tensor ids of parameters (and their gradients / optimizer state), closed under view ops."""
    if et is None:
        return set()
    names = et.names
    pos = {int(i): k for k, i in enumerate(et.id.tolist())}
    in_opt = np.zeros(et.n_nodes, dtype=bool)
    for k in range(et.n_nodes):
        p = pos.get(int(et.parent[k]), -1)
        nm = names[et.name[k]]
        in_opt[k] = nm.startswith("Optimizer.step#") or nm == "torch::autograd::AccumulateGrad" or (
            p >= 0 and p < k and in_opt[p])
    ids: set[int] = set()
    for k in np.flatnonzero(in_opt).tolist():
        ids.update(int(t) for t in et.inputs_of(k).tolist())
    for k in range(et.n_nodes):
        if names[et.name[k]] in VIEW_OPS:
            ins = et.inputs_of(k)
            if ins.size and int(ins[0]) in ids:
                ids.update(int(t) for t in et.outputs_of(k).tolist())
    return ids


def _et_tensor_flags(et, node: int, pids: set[int]) -> list[bool] | None:
    """Per Tensor-typed input of ET node ``node``: is it a parameter? None if not resolvable."""
    types = et.input_types[node]
    ids = et.inputs_of(node).tolist()
    flags: list[bool] = []
    j = 0
    for t in types:
        if isinstance(t, str) and t.startswith("GenericList"):
            return None
        if isinstance(t, str) and t.startswith("Tensor"):
            if j >= len(ids):
                return None
            flags.append(int(ids[j]) in pids)
            j += 1
    return flags


@dataclass
class ParamInputs:
    """Which inputs are parameters, for one rank."""

    shapes: set[tuple[int, ...]]
    et_flags: dict[int, list[bool]]  # Kineto event -> flags per tensor input (from the ET)

    def flags(self, e: int, tensors: list[tuple[int, list[int]]], types: list | None = None) -> list[bool]:
        """A tensor input is a parameter if it is floating point, its shape (or, 2-D, its
        transpose) is a gradient's shape and — when the execution trace joined — its tensor id
        is a parameter's (ids can be reused after a tensor is freed: the id alone is not enough)."""
        by_shape = []
        for p, s in tensors:
            t = tuple(s)
            ty = types[p] if types is not None and p < len(types) else ""
            integer = isinstance(ty, str) and any(w in ty.lower() for w in ("long", "int", "bool", "char", "short"))
            by_shape.append(not integer and (t in self.shapes or (len(t) == 2 and (t[1], t[0]) in self.shapes)))
        f = self.et_flags.get(e)
        if f is not None and len(f) == len(tensors):
            return [a and b for a, b in zip(by_shape, f, strict=True)]
        return by_shape


def rank_params(tree: OpTree, et, notes: list[str]) -> ParamInputs:
    kt = tree.kt
    names = kt.names
    shapes: set[tuple[int, ...]] = set()
    for e in tree.events.tolist():
        if names[kt.name[e]] == "torch::autograd::AccumulateGrad":
            for _, s in tensor_inputs(kt.args[e].get("Input Dims", []), kt.args[e].get("Input type")):
                shapes.add(tuple(s))
    et_flags: dict[int, list[bool]] = {}
    if et is not None:
        pids = _param_ids(et)
        join = join_et(kt, et, [])
        for e, node in join.items():
            f = _et_tensor_flags(et, node, pids)
            if f is not None:
                et_flags[e] = f
        notes.append(f"rank {kt.rank}: parameters identified from execution-trace tensor ids "
                     f"({len(pids)} ids, {len(et_flags)} ops joined)")
    else:
        notes.append(f"rank {kt.rank}: no execution trace; parameters identified by gradient shapes")
    return ParamInputs(shapes, et_flags)


def batch_exponents(kind: str, name: str, shapes: list, types: list | None, flags: list[bool],
                 tensors: list[tuple[int, list[int]]], b0: int) -> dict[str, float]:
    """Exponents ``log2(p(2 B0) / p(B0))`` of the parameters of one op (empty: batch-independent)."""
    if b0 < 2 or not tensors:
        return {}
    scaled = [list(s) if isinstance(s, list) else s for s in shapes]
    hit = False

    def scale(pos: int, dim: int, member: int = -1) -> None:
        nonlocal hit
        s = scaled[pos]
        if member >= 0:  # one tensor of a tensor-list input (cat, stack): scale that member
            if isinstance(s, list) and member < len(s) and isinstance(s[member], list):
                inner = list(s[member])
                if dim < len(inner) and isinstance(inner[dim], int):
                    inner[dim] *= 2
                    scaled[pos] = [*s[:member], inner, *s[member + 1:]]
                    hit = True
            return
        if isinstance(s, list) and dim < len(s) and isinstance(s[dim], int):
            s = list(s)
            s[dim] *= 2
            scaled[pos] = s
            hit = True

    g = GEMM_OPS.get(name)
    if g is not None and kind != "bmm":
        ia, ib = g[1], g[2]
        fa = next((f for (p, _), f in zip(tensors, flags, strict=True) if p == ia), False)
        fb = next((f for (p, _), f in zip(tensors, flags, strict=True) if p == ib), False)
        a = shapes[ia] if ia < len(shapes) else None
        b = shapes[ib] if ib < len(shapes) else None
        if isinstance(a, list) and isinstance(b, list) and len(a) == 2 and len(b) == 2:
            if fb and not fa:
                if a[0] % b0 == 0:
                    scale(ia, 0)
            elif fa and not fb:
                if b[1] % b0 == 0:
                    scale(ib, 1)
            elif not fa and not fb:
                if a[1] % b0 == 0:
                    scale(ia, 1)
                    scale(ib, 0)
                elif a[0] % b0 == 0:
                    scale(ia, 0)
                elif b[1] % b0 == 0:
                    scale(ib, 1)
    else:
        member: dict[int, int] = {}
        for (p, s), f in zip(tensors, flags, strict=True):
            if f or not isinstance(shapes[p], list):
                continue
            listed = not all(isinstance(d, int) for d in shapes[p])
            k = member.get(p, -1) + 1 if listed else -1
            member[p] = k
            d = next((j for j, x in enumerate(s) if x >= b0 and x % b0 == 0), -1)
            if d >= 0:
                scale(p, d, k)
    if not hit:
        return {}
    p0 = kernel_params(kind, name, shapes, types)
    p2 = kernel_params(kind, name, scaled, types)
    out: dict[str, float] = {}
    for c in (*PARAM_EXP_COLUMNS, "flops", "bytes"):
        a, b = p0.get(c, math.nan), p2.get(c, math.nan)
        if a == a and b == b and a > 0 and b > 0 and b != a:
            out[c] = round(math.log2(b / a), 3)
    work = out.get("flops", out.get("elements", max(out.values(), default=0.0)))
    if out:
        out["work"] = work
    return out



_MODEL_INPUT_OPS = ("aten::linear", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution",
                    "aten::embedding", "aten::embedding_bag", "aten::matmul", *GEMM_OPS, *STOP_OPS)


def _bag_batch(name: str, shapes: list, concrete: list | None) -> int | None:
    """The bags of an ``aten::embedding_bag(weight, indices, offsets, ..., include_last_offset)`` call: the
    length of its 1-D offsets (less one with ``include_last_offset``); None for other ops or 2-D indices.
    Its first non-parameter input, the flat indices, holds batch x pooling lookups, not the batch."""
    if name not in ("aten::embedding_bag", "aten::_embedding_bag", "aten::_embedding_bag_forward_only"):
        return None
    if not isinstance(shapes, list) or len(shapes) < 3:
        return None
    idx, off = shapes[1], shapes[2]
    if not (isinstance(idx, list) and len(idx) == 1 and isinstance(off, list) and len(off) == 1):
        return None
    last = bool(concrete) and len(concrete) > 7 and str(concrete[7]).strip().lower() == "true"
    n = int(off[0]) - (1 if last else 0)
    return n if n >= 2 else None


def detect_batch(tree: OpTree, prm: ParamInputs, steps, rg: ReplayGraph, t0: float) -> tuple[int | None, str]:
    """Dim 0 of the first non-parameter input of the step's first layer-like forward op
    (linear, convolution, embedding, GEMM...), else of its first ATen op with one."""
    kt = tree.kt
    row = steps.iloc[0]
    s0 = float(rg.measured_start[int(row["start_task"])] * 1e6 + t0)
    s1 = s0 + float(row["measured_s"]) * 1e6
    ops = sorted((float(kt.ts[e]), e) for e in tree.events.tolist()
                 if kt.cat[e] == EventCat.CPU_OP and s0 <= kt.ts[e] <= s1)
    fallback: tuple[int, str] | None = None
    for _, e in ops:
        nm = kt.names[kt.name[e]]
        if nm.startswith(BACKWARD_OP_PREFIX):
            break
        if not nm.startswith("aten::") or nm in VIEW_OPS and nm not in _MODEL_INPUT_OPS:
            continue
        a = kt.args[e]
        tens = tensor_inputs(a.get("Input Dims", []), a.get("Input type"))
        bag = _bag_batch(nm, a.get("Input Dims", []), a.get("Concrete Inputs"))
        if bag is not None:
            return bag, f"length of the offsets of {nm} ({bag} bags)"
        for (_, s), f in zip(tens, prm.flags(e, tens, a.get("Input type")), strict=True):
            if not f and len(s) >= 1 and s[0] >= 2:
                found = (int(s[0]), f"dim 0 of the first input of {nm} ({s})")
                if nm in _MODEL_INPUT_OPS:
                    return found
                fallback = fallback or found
                break
    return fallback if fallback else (None, "not found (no forward op with a non-parameter tensor input)")


def returns_input(name: str, concrete: list | None) -> bool:
    """Is this call of a :data:`DROPOUT_OPS` op a no-op (``p`` 0 or ``train`` false in Kineto's ``Concrete
    Inputs``, e.g. ``['', '0.', 'True']``)? Its traced time is the profiler's, at any batch size."""
    if name not in DROPOUT_OPS or not concrete or len(concrete) < 3:
        return False
    p, train = str(concrete[1]).strip().lower(), str(concrete[2]).strip().lower()
    try:
        off = float(p) == 0.0
    except ValueError:
        off = False
    return off or train in ("false", "0")


def record_batch_exponents(put, k: int, kind: str, kt: KinetoTrace, e: int, prm: ParamInputs, b0: int | None,
                     counts: dict) -> None:
    counts["kernel_tasks"] += 1
    a = kt.args[e]
    shapes, types = a.get("Input Dims", []), a.get("Input type")
    tens = tensor_inputs(shapes, types)
    flags = prm.flags(e, tens, types)
    name = kt.names[kt.name[e]]
    # a no-op dropout keeps its measured time: priced as an element-wise pass, Hugging Face GPT-2's five
    # p = 0 dropouts grew from 0 to 31 µs each at batch x2
    live = b0 and not returns_input(name, a.get("Concrete Inputs"))
    exps = batch_exponents(kind, name, shapes, types, flags, tens, b0 or 0) if live else {}
    if exps:
        counts["batch_dependent"] += 1
        put(k, **{f"x_{c}": v for c, v in exps.items()})
    else:
        counts["batch_independent"] += 1
