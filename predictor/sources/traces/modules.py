"""Layer structure of a captured step from the module hierarchy and autograd's sequence numbers.

Two facts the Kineto trace records let a what-if change the number of layers of any model, not only
one whose ops repeat with a fixed period:

* **Module calls.** ``tuner.capture`` wraps every ``nn.Module`` forward in a ``record_function`` range
  named ``nn.Module: <Class>_<i>`` (``i`` counts the instances of that class in call order); a trace
  recorded with ``with_stack=True`` has the same ranges as Python events. Ranges nest, so each call's
  parent call is known. :func:`module_blocks` takes, among the children of every call, the runs of
  consecutive calls of one class whose top-level ops have equal signatures (op name and input
  shapes) — the blocks of an ``nn.Sequential``, the layers of an ``nn.TransformerEncoder``, the
  decoder layers of a Hugging Face model — and keeps the run covering the most traced time.
* **Sequence numbers.** Every forward op that records autograd history has a ``Sequence number``,
  and the backward op autograd runs for it (``autograd::engine::evaluate_function: AddmmBackward0``)
  has the same one. :func:`forward_op_of` maps each backward top-level op to the forward top-level op
  it differentiates, so a layer's backward ops are found from its forward ops even when the first
  layer's backward differs from the others' (it computes no input gradient).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from predictor.sources.traces.kineto import EventCat
from predictor.sources.traces.op_tree import BACKWARD_OP_PREFIX, OpTree, top_op

__all__ = ["MODULE_PREFIX", "ModuleBlocks", "module_calls", "module_blocks", "forward_op_of"]

#: name prefix of a module-call range (``tuner.capture``'s annotation, the Python tracer's event)
MODULE_PREFIX = "nn.Module: "
_INSTANCE = re.compile(r"_\d+$")


@dataclass
class ModuleBlocks:
    """The repeated blocks found: forward top-level op event -> block index (0 = first called)."""

    block_of: dict[int, int] = field(default_factory=dict)
    count: int = 0
    description: str = ""


def module_calls(tree: OpTree) -> list[tuple[float, float, str, int]]:
    """(start µs, end µs, name without the prefix, thread key) of every module-call range, by start."""
    kt = tree.kt
    sel = np.flatnonzero(kt.mask(EventCat.USER_ANNOTATION, EventCat.PYTHON))
    names = kt.names
    out = []
    for e in sel.tolist():
        nm = names[kt.name[e]]
        if nm.startswith(MODULE_PREFIX):
            key = (int(kt.pid[e]), int(kt.tid[e]))
            out.append((float(kt.ts[e]), float(kt.ts[e] + kt.dur[e]), nm[len(MODULE_PREFIX):],
                        tree.thread_key.get(key, -1)))
    out.sort(key=lambda c: (c[0], -c[1]))
    return out


def _signature(tree: OpTree, e: int) -> str:
    a = tree.kt.args[e]
    return tree.kt.names[tree.kt.name[e]] + str(a.get("Input Dims", ""))


def module_blocks(tree: OpTree, tops: list[int]) -> ModuleBlocks:
    """The repeated module blocks among the forward top-level ops ``tops`` (events, any order).

    Returns an empty :class:`ModuleBlocks` when the trace has no module-call ranges or no two
    consecutive sibling calls of one class run the same ops."""
    calls = module_calls(tree)
    if not calls or not tops:
        return ModuleBlocks()
    kt = tree.kt
    tops = sorted(tops, key=lambda e: float(kt.ts[e]))
    starts = np.asarray([float(kt.ts[e]) for e in tops])
    # parent call of each call: ranges nest on their thread
    parent = [-1] * len(calls)
    stack: list[int] = []
    for i, (s, _e, _n, th) in enumerate(calls):
        while stack and (calls[stack[-1]][3] != th or s >= calls[stack[-1]][1] - 1e-3):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parent):
        children.setdefault(p, []).append(i)

    def ops_in(i: int) -> list[int]:
        a = np.searchsorted(starts, calls[i][0] - 1e-3, side="left")
        b = np.searchsorted(starts, calls[i][1] + 1e-3, side="right")
        return tops[a:b]

    depth = [0] * len(calls)
    for i, p in enumerate(parent):
        depth[i] = depth[p] + 1 if p >= 0 else 0
    # runs by description (instance names repeat every step): their blocks and traced time
    found: dict[str, list] = {}
    for p, kids in children.items():
        run: list[tuple[int, list[int]]] = []
        prev_key = None
        for c in [*kids, -1]:
            ops = ops_in(c) if c >= 0 else []
            key = (_INSTANCE.sub("", calls[c][2]), tuple(_signature(tree, e) for e in ops)) if ops else None
            # a run holds distinct instances (one module called again, such as a whole model step after step, is not
            # a stack of layers)
            again = c >= 0 and any(calls[x][2] == calls[c][2] for x, _ in run)
            if key is None or key != prev_key or again:
                if len(run) >= 2:
                    first, last = calls[run[0][0]][2], calls[run[-1][0]][2]
                    where = calls[p][2] if p >= 0 else "the step"
                    desc = f"{len(run)} x {_INSTANCE.sub('', first)} ({first} .. {last}) in {where}"
                    entry = found.setdefault(desc, [0.0, depth[run[0][0]], []])
                    entry[0] += float(sum(kt.dur[e] for _, ops_ in run for e in ops_))
                    entry[2].append([ops_ for _, ops_ in run])
                run = []
            if key is not None:
                run.append((c, ops))
            prev_key = key
    if not found:
        return ModuleBlocks()
    desc, (_, _, runs) = max(found.items(), key=lambda kv: (kv[1][0], -kv[1][1]))
    block_of = {e: j for blocks in runs for j, ops in enumerate(blocks) for e in ops}
    return ModuleBlocks(block_of, len(runs[0]), desc)


def forward_op_of(tree: OpTree) -> dict[int, int]:
    """Backward top-level op event -> the forward top-level op event with its ``Sequence number``
    (ops without one, such as ``AccumulateGrad``, are left out)."""
    kt = tree.kt
    names = kt.names
    fwd: dict[int, int] = {}
    bwd: list[tuple[int, int]] = []
    for e in tree.events.tolist():
        if kt.cat[e] != EventCat.CPU_OP:
            continue
        seq = kt.args[e].get("Sequence number")
        if not isinstance(seq, int) or seq < 0:
            continue
        if names[kt.name[e]].startswith(BACKWARD_OP_PREFIX) and e not in tree.parent:
            bwd.append((e, seq))
        elif "Fwd thread id" not in kt.args[e] or kt.args[e].get("Fwd thread id") == 0:
            fwd.setdefault(seq, top_op(tree, e))
    out = {}
    for e, seq in bwd:
        f = fwd.get(seq)
        if f is not None and f != e and not names[kt.name[f]].startswith(BACKWARD_OP_PREFIX):
            out[e] = f
    return out
