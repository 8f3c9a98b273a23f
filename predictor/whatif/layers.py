"""Layer-count change: find the repeated layer blocks and duplicate or drop them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from predictor.graph import ExecutionGraph, ProcKind
from predictor.graph.edit import AUX_KEY, GraphEditor, aux_of
from predictor.whatif.common import PHASE_BWD, PHASE_FWD, PHASE_OPT, WhatIfError, aux_col, copy_all, with_meta

__all__ = ["LayerInfo", "detect_layers", "set_layers", "annotate_layers", "with_layers", "typical_block_times"]


@dataclass
class LayerInfo:
    """Repeated layer blocks of one rank: per phase (1 fwd, 2 bwd, 3 optimizer) the ordered
    op ids of each block, ``count`` blocks; ``period`` ops per block in the forward pass."""

    rank: int
    count: int
    blocks: dict[int, list[np.ndarray]]  # phase -> list of op-id arrays, one per block
    prefix: dict[int, np.ndarray]  # phase -> op ids before the blocks
    suffix: dict[int, np.ndarray]  # phase -> op ids after the blocks
    period: int = 0
    notes: list[str] = field(default_factory=list)


def _op_sequence(g: ExecutionGraph, rank: int, phase: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(op ids in execution order, their signatures, their measured time) for one rank and phase."""
    op = aux_col(g, "op")
    ph = aux_col(g, "phase")
    sig = aux_col(g, "sig")
    cpu = g.proc_kind[g.proc] == ProcKind.CPU_THREAD
    sel = np.flatnonzero((g.rank == rank) & (ph == phase) & (op >= 0) & cpu)
    if sel.size == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    ops, first = np.unique(op[sel], return_index=True)
    order = np.argsort(sel[first], kind="stable")
    ops = ops[order]
    sigs = sig[sel[first]][order]
    dur = np.nan_to_num(g.duration, nan=0.0)
    on = (g.rank == rank) & (op >= 0)
    tsum = np.zeros(ops.size)
    pos = np.searchsorted(np.sort(ops), op[on])
    srt = np.argsort(ops)
    valid = pos < ops.size
    hit = np.zeros(on.sum(), dtype=bool)
    hit[valid] = np.sort(ops)[pos[valid]] == op[on][valid]
    np.add.at(tsum, srt[pos[hit]], dur[on][hit])
    return ops, sigs, tsum


def _best_repeat(sig: np.ndarray, weight: np.ndarray, count: int | None) -> tuple[int, int, int] | None:
    """(start, period, count) of the maximal tandem repeat covering the most weight; with
    ``count`` only repeats of exactly that many blocks qualify (a run of 8 equal embedding
    lookups is not 3 layers)."""
    n = sig.size
    best: tuple[float, int, int, int] | None = None
    cw = np.concatenate([[0.0], np.cumsum(weight)])
    for p in range(1, n // 2 + 1):
        eq = np.concatenate([[0], (sig[p:] == sig[:-p]).astype(np.int8), [0]])
        d = np.diff(eq)
        for s, e in zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True):
            c = (e - s + p) // p  # full periods in the p-periodic segment sig[s : e + p]
            if c < 2 or (count is not None and c != count):
                continue
            w = cw[s + c * p] - cw[s]
            if best is None or (w, -p) > (best[0], -best[2]):
                best = (w, s, p, c)
    return None if best is None else (best[1], best[2], best[3])


def _ordered_ops(g: ExecutionGraph, rank: int, phase: int) -> tuple[np.ndarray, np.ndarray]:
    """(op ids in execution order, the first task of each) of one rank and phase (CPU threads)."""
    op, ph = aux_col(g, "op"), aux_col(g, "phase")
    cpu = g.proc_kind[g.proc] == ProcKind.CPU_THREAD
    sel = np.flatnonzero((g.rank == rank) & (ph == phase) & (op >= 0) & cpu)
    if sel.size == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    ops, first = np.unique(op[sel], return_index=True)
    order = np.argsort(sel[first], kind="stable")
    return ops[order], sel[first][order]


def _per_op(g: ExecutionGraph, rank: int, ops: np.ndarray, name: str) -> np.ndarray:
    """Per op id of ``ops``: the largest value of aux column ``name`` over its tasks on ``rank`` (-1 if
    none has one; the T1 gap that opens an op carries only its op id)."""
    op = aux_col(g, "op")
    val = np.nan_to_num(aux_col(g, name), nan=-1.0)
    on = np.flatnonzero((g.rank == rank) & np.isin(op, ops))
    out = np.full(ops.size, -1.0)
    if on.size:
        pos = np.searchsorted(np.sort(ops), op[on])
        srt = np.argsort(ops)
        np.maximum.at(out, srt[pos], val[on])
    return out


def _module_blocks(g: ExecutionGraph, rank: int) -> list[np.ndarray] | None:
    """Forward blocks from the module hierarchy (aux ``mod_block``): per block its op ids in execution
    order; None when the capture recorded no repeated module blocks."""
    ops, _ = _ordered_ops(g, rank, PHASE_FWD)
    if ops.size == 0:
        return None
    b = _per_op(g, rank, ops, "mod_block")
    n = int(b.max()) + 1 if (b >= 0).any() else 0
    if n < 2:
        return None
    blocks = [ops[b == j] for j in range(n)]
    return blocks if all(x.size for x in blocks) else None


def _backward_blocks(g: ExecutionGraph, rank: int, fwd_blocks: list[np.ndarray]
                     ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray] | None:
    """Backward blocks from autograd's sequence numbers (aux ``fwd_op``: the forward op a backward op
    differentiates), in execution order (the last layer's first), with the ops before and after them;
    ops without a forward op (``AccumulateGrad``) go with the backward op before them. None when the
    trace did not record sequence numbers or a layer has no backward op."""
    ops, _ = _ordered_ops(g, rank, PHASE_BWD)
    if ops.size == 0:
        return None
    fwd = _per_op(g, rank, ops, "fwd_op")
    layer_of = {float(o): j for j, blk in enumerate(fwd_blocks) for o in blk.tolist()}
    lay = np.full(ops.size, -1, dtype=np.int64)
    cur = -1
    for i in range(ops.size):
        if fwd[i] >= 0:
            cur = layer_of.get(float(fwd[i]), -2)  # -2: a mapped op outside the layers
        lay[i] = cur if cur >= 0 else -1
    if (fwd >= 0).sum() == 0:
        return None
    c = len(fwd_blocks)
    blocks = [ops[lay == j] for j in range(c - 1, -1, -1)]
    if not all(b.size for b in blocks):
        return None
    inside = np.flatnonzero(lay >= 0)
    return blocks, ops[:inside[0]][lay[:inside[0]] < 0], ops[inside[-1] + 1:]


def detect_layers(g: ExecutionGraph, count: int | None = None, rank: int | None = None) -> LayerInfo:
    """The repeated layer blocks of ``rank`` (default: the first).

    Forward: the repeated module blocks the capture recorded (``nn.Sequential`` blocks, encoder or decoder
    layers: :mod:`predictor.sources.traces.modules`), else the tandem repeat of op signatures covering the
    most time. Backward: the backward ops of each forward block by autograd's sequence numbers, else the
    signature repeat with the forward's count. Optimizer: a per-parameter repeat where there is one.

    Raises:
        WhatIfError: no repeated block in the forward pass, or the backward pass has no
            repeat with the forward's count.
    """
    r = int(np.unique(g.rank)[0]) if rank is None else rank
    blocks: dict[int, list[np.ndarray]] = {}
    prefix: dict[int, np.ndarray] = {}
    suffix: dict[int, np.ndarray] = {}
    notes: list[str] = []
    ops, sigs, w = _op_sequence(g, r, PHASE_FWD)
    mod = _module_blocks(g, r)
    if mod is not None and (count is None or len(mod) == count):
        c = len(mod)
        blocks[PHASE_FWD] = mod
        lo = int(np.flatnonzero(ops == mod[0][0])[0])
        hi = int(np.flatnonzero(ops == mod[-1][-1])[0])
        prefix[PHASE_FWD], suffix[PHASE_FWD] = ops[:lo], ops[hi + 1:]
        period = int(mod[0].size)
        notes.append(f"forward blocks from the module hierarchy ({c} blocks of {period} ops)")
    else:
        found = _best_repeat(sigs, w, count) if ops.size else None
        if found is None:
            raise WhatIfError("no repeated layer blocks found in the forward pass" +
                              (f" with {count} repeats (base_layers)" if count else "") +
                              "; layer changes need a model built from identical layers")
        s, p, c = found
        period = p
        blocks[PHASE_FWD] = [ops[s + j * p: s + (j + 1) * p] for j in range(c)]
        prefix[PHASE_FWD], suffix[PHASE_FWD] = ops[:s], ops[s + c * p:]
        notes.append(f"forward blocks from repeated op signatures ({c} blocks of {p} ops)")
    bwd = _backward_blocks(g, r, blocks[PHASE_FWD])
    if bwd is not None:
        blocks[PHASE_BWD], prefix[PHASE_BWD], suffix[PHASE_BWD] = bwd
        notes.append("backward blocks from autograd sequence numbers")
    for phase, required in (((PHASE_BWD, True),) if bwd is None else ()) + ((PHASE_OPT, False),):
        ops2, sigs2, w2 = _op_sequence(g, r, phase)
        f2 = _best_repeat(sigs2, w2, c) if ops2.size else None
        if f2 is None:
            if required and ops2.size:
                raise WhatIfError(f"the backward pass has no repeated block matching the forward's {c} layers")
            if ops2.size:
                notes.append(f"phase {phase}: no per-layer repeat ({c} blocks); left unchanged")
            continue
        s2, p2, _ = f2
        blocks[phase] = [ops2[s2 + j * p2: s2 + (j + 1) * p2] for j in range(c)]
        prefix[phase], suffix[phase] = ops2[:s2], ops2[s2 + c * p2:]
    return LayerInfo(r, c, blocks, prefix, suffix, period, notes)


def annotate_layers(g: ExecutionGraph, infos: Mapping[int, LayerInfo]) -> None:
    """Write ``layer`` and ``region`` aux columns from detected blocks (in place on a fresh graph)."""
    aux = g.meta[AUX_KEY]
    op = aux_col(g, "op")
    layer = np.full(g.n_tasks, -1.0)
    region = np.full(g.n_tasks, -1.0)
    for info in infos.values():
        on = g.rank == info.rank
        for phase, blks in info.blocks.items():
            for j, ids in enumerate(blks):
                m = on & np.isin(op, ids)
                # backward blocks run the layers in reverse order
                layer[m] = float(info.count - 1 - j if phase == PHASE_BWD else j)
                region[m] = 1.0
            region[on & np.isin(op, info.prefix.get(phase, []))] = 0.0
            region[on & np.isin(op, info.suffix.get(phase, []))] = 2.0
    aux["layer"] = layer
    aux["region"] = region


def typical_block_times(g: ExecutionGraph, on: np.ndarray, blocks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per task of the blocks ``blocks`` (op ids) on the tasks ``on``: the mean over the blocks of the same
    task's duration and traced (``measured_raw``) duration, seconds; NaN outside the blocks and on a
    processor whose blocks do not align task by task (same count, kinds and names in order).

    A layer's time depends on where it runs in the step: under the profiler a CPU step's later forward
    blocks fault their activations in again (ViT, 8 blocks: 2 048 page faults in each of blocks 3-7, none
    in an unprofiled step; an ``aten::add`` 0.17 ms in blocks 0-3, 0.36 ms in 4-7), so a copy of the last
    block alone carries that cost once per copy."""
    op = aux_col(g, "op")
    raw = aux_col(g, "measured_raw")
    mean_d = np.full(g.n_tasks, np.nan)
    mean_r = np.full(g.n_tasks, np.nan)
    ids = np.concatenate(blocks)
    label = np.repeat(np.arange(len(blocks)), [b.size for b in blocks])
    srt = np.argsort(ids, kind="stable")
    sel = np.flatnonzero(on & np.isin(op, ids))
    blk = label[srt[np.searchsorted(ids[srt], op[sel])]]  # each block task's block
    for p in np.unique(g.proc[sel]).tolist():
        here = g.proc[sel] == p
        tasks = [sel[here & (blk == j)] for j in range(len(blocks))]
        n0 = tasks[0].size
        if any(t.size != n0 for t in tasks) or not all(
                np.array_equal(g.kind[t], g.kind[tasks[0]]) and np.array_equal(g.name[t], g.name[tasks[0]])
                for t in tasks):
            continue
        md = np.stack([g.duration[t] for t in tasks]).mean(axis=0)
        mr = np.stack([raw[t] for t in tasks]).mean(axis=0)
        for t in tasks:
            mean_d[t] = md
            mean_r[t] = mr
    return mean_d, mean_r


def set_layers(g: ExecutionGraph, count: int, *, base: int | None = None) -> ExecutionGraph:
    """Change the number of repeated layer blocks to ``count`` on every rank (duplicate the
    last block, or drop blocks from the end). ``base``: the captured count, if known.

    Every added block, and with fewer blocks every kept one, takes per task the mean time of that task
    over the captured blocks (:func:`typical_block_times`): the blocks then cost ``count`` times the
    mean captured block, whichever block the copies are stamped from."""
    if count < 1:
        raise WhatIfError(f"layers must be >= 1 (got {count})")
    infos = {r: detect_layers(g, base, r) for r in np.unique(g.rank).tolist()}
    c0 = next(iter(infos.values())).count
    if any(i.count != c0 for i in infos.values()):
        raise WhatIfError("ranks disagree on the number of repeated layers")
    op = aux_col(g, "op")
    ed = GraphEditor(g)
    keep = np.ones(g.n_tasks, dtype=bool)
    pieces: list[tuple[np.ndarray, np.ndarray, float]] = []  # (old idx, pos, op offset)
    removed: list[np.ndarray] = []
    op_step = float(1 << 52) / 64.0
    typ_d = np.full(g.n_tasks, np.nan)  # per block task: the mean over the blocks (s)
    typ_r = np.full(g.n_tasks, np.nan)
    in_blocks = np.zeros(g.n_tasks, dtype=bool)
    has_raw = "measured_raw" in aux_of(g)
    for info in infos.values():
        on = g.rank == info.rank
        for phase, blks in info.blocks.items():
            md, mr = typical_block_times(g, on, blks)
            ok = np.isfinite(md)
            typ_d[ok], typ_r[ok] = md[ok], mr[ok]
            in_blocks |= on & np.isin(op, np.concatenate(blks))
            if count < c0:
                drop_ids = np.concatenate(blks[count:]) if phase != PHASE_BWD else np.concatenate(blks[:c0 - count])
                m = on & np.isin(op, drop_ids)
                keep &= ~m
                removed.append(np.flatnonzero(m))
            elif count > c0:
                src = blks[0] if phase == PHASE_BWD else blks[-1]  # the last layer (backward runs it first)
                m = np.flatnonzero(on & np.isin(op, src))
                extra = count - c0
                for p in np.unique(g.proc[m]).tolist():
                    mp = m[g.proc[m] == p]
                    top = float(mp.max())
                    nb = mp.size
                    for k in range(extra):
                        pos = top + (k * nb + np.arange(nb) + 1) / (extra * nb + 1)
                        pieces.append((mp, pos, float(k + 1)))
    kept = np.flatnonzero(keep)
    new_of = np.full(g.n_tasks, -1, dtype=np.int64)
    new_of[kept] = ed.copy(kept, kept.astype(np.float64))
    typical: list[tuple[np.ndarray, np.ndarray]] = []  # (editor indices, their mean block durations)
    if count < c0:
        kb = kept[in_blocks[kept] & np.isfinite(typ_d[kept])]
        typical.append((new_of[kb], typ_d[kb]))
        if has_raw:
            ed.set_aux("measured_raw", new_of[kb], typ_r[kb])
    # edges among kept tasks, bridging removed ones (pred -> succ)
    src, dst, ek = g.edge_src.astype(np.int64), g.edge_dst.astype(np.int64), g.edge_kind
    if removed and g.n_edges:
        src, dst, ek = _bridge(src, dst, ek, ~keep)
    if src.size:
        ed.edges(new_of[src], new_of[dst], ek)
    # copies: their edges (internal copied, external replicated)
    all_copy_new: list[np.ndarray] = []
    copy_layer: list[np.ndarray] = []
    for mp, pos, k in pieces:
        cp = ed.copy(mp, pos)
        all_copy_new.append(cp)
        loc = np.full(g.n_tasks, -1, dtype=np.int64)
        loc[mp] = cp
        if g.n_edges:
            s_in = loc[g.edge_src] >= 0
            d_in = loc[g.edge_dst] >= 0
            both = s_in & d_in
            ed.edges(loc[g.edge_src[both]], loc[g.edge_dst[both]], g.edge_kind[both])
            into = ~s_in & d_in & keep[g.edge_src]
            ed.edges(new_of[g.edge_src[into]], loc[g.edge_dst[into]], g.edge_kind[into])
            outof = s_in & ~d_in & keep[g.edge_dst]
            ed.edges(loc[g.edge_src[outof]], new_of[g.edge_dst[outof]], g.edge_kind[outof])
        ed.set_aux("op", cp, op[mp] + k * op_step)
        ed.set_aux("copied", cp, 1.0)  # a duplicated layer's task (WhatIfTiming: trust of its measured time)
        copy_layer.append(np.full(cp.size, k))
        ok = np.isfinite(typ_d[mp])
        typical.append((cp[ok], typ_d[mp][ok]))
        if has_raw:
            ed.set_aux("measured_raw", cp[ok], typ_r[mp][ok])
    out = ed.build()
    for idx, dur in typical:
        out.duration[ed.built_index[idx]] = dur
    # layer indices of the copies: continue after the last block
    infos_new = {}
    for r in np.unique(out.rank).tolist():
        try:
            infos_new[r] = detect_layers(out, count if count >= 2 else None, r)
        except WhatIfError:
            infos_new = {}
            break
    if infos_new:
        annotate_layers(out, infos_new)
    return with_meta(out, layers_from=c0, layers_to=count, layer_period_ops=next(iter(infos.values())).period,
                      layer_notes=[n for i in infos.values() for n in i.notes])


def _bridge(src: np.ndarray, dst: np.ndarray, ek: np.ndarray, gone: np.ndarray):
    """Edges after removing tasks ``gone``: paths through removed tasks become direct edges."""
    src, dst, ek = list(src.tolist()), list(dst.tolist()), list(ek.tolist())
    succ: dict[int, list[tuple[int, int]]] = {}
    for s, d, k in zip(src, dst, ek, strict=True):
        succ.setdefault(s, []).append((d, k))
    out_s, out_d, out_k = [], [], []
    for s, d, k in zip(src, dst, ek, strict=True):
        if gone[s]:
            continue
        stack, seen = [(d, k)], set()
        while stack:
            x, kk = stack.pop()
            if not gone[x]:
                out_s.append(s)
                out_d.append(x)
                out_k.append(kk)
            elif x not in seen:
                seen.add(x)
                stack.extend(succ.get(x, []))
    return np.asarray(out_s, np.int64), np.asarray(out_d, np.int64), np.asarray(out_k, np.int8)


def with_layers(g: ExecutionGraph, info: LayerInfo) -> ExecutionGraph:
    """A copy of ``g`` with the ``layer``/``region`` columns of ``info``."""
    ed, _ = copy_all(g)
    out = ed.build()
    annotate_layers(out, {info.rank: info})
    return out
