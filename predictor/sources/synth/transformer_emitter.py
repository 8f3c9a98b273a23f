"""Where one rank's ops of a transformer step go: the plan's process groups and the emitter.

:class:`GroupLayout` gives each process group of a plan (tensor, data, expert, context parallel,
the model-parallel group of the gradient norm, the tied embeddings) its size and the nodes it
spans, in Megatron-LM's rank order; :func:`collective` is one collective kernel on such a group;
:class:`StepEmitter` stamps ops onto a template graph of one representative rank, with the side
streams that tensor- and context-parallel collectives overlap on. Units: elements, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.graph import Category, ExecutionGraph, GraphBuilder, ProcKind
from predictor.sources.synth.emit import ExecMode, Kernel, OpEmitter
from predictor.sources.synth.transformer_spec import ParallelPlan

__all__ = ["GroupLayout", "StepEmitter", "collective", "group_span"]


def group_span(ranks: np.ndarray, devices_per_node: int) -> tuple[int, int]:
    """(world, nodes spanned) of a group of global ranks on ``devices_per_node``-device nodes."""
    ranks = np.asarray(ranks, dtype=np.int64)
    return int(ranks.size), int(np.unique(ranks // max(devices_per_node, 1)).size)


@dataclass(frozen=True)
class GroupLayout:
    """Group sizes and node spans of the plan's process groups (Megatron rank order pp > dp > cp > tp;
    ``dp`` is the gradient group, data x context parallel)."""

    tp: tuple[int, int]
    dp: tuple[int, int]
    ep: tuple[int, int]
    edp: tuple[int, int]  # expert-data-parallel
    mp: tuple[int, int]  # model-parallel (grad-norm) group: tp x pp (x dp with the distributed optimizer)
    pp_next: list[tuple[int, int]]  # link stage s -> s+1 (mod p)
    tied: tuple[int, int]
    #: traffic classes sharing a node's NICs while each class's transfers run: TP collectives
    #: spanning nodes and data-parallel buckets reduced during backward (``overlap_grad_reduce``)
    #: over the network meet there during the backward that launches the buckets (the last micro-batch's)
    tp_share: float = 1.0
    dp_share: float = 1.0
    cp: tuple[int, int] = (1, 1)  #: the context-parallel ring
    fsdp: tuple[int, int] = (1, 1)  #: FSDP's shard group: the data-parallel group, or HSDP's ``fsdp_shard`` ranks
    fsdp_rep: tuple[int, int] = (1, 1)  #: HSDP's replicate group: the ranks holding the same shard

    @classmethod
    def of(cls, plan: ParallelPlan, dpn: int) -> GroupLayout:
        """The groups of ``plan`` on nodes of ``dpn`` devices."""
        tp, dp, pp, ep, cp = plan.tp, plan.dp, plan.pp, plan.ep, plan.cp
        stride = tp * cp * dp

        def rank(s: int, d: int, t: int) -> int:
            return s * stride + d * tp * cp + t

        tp_g = group_span(np.arange(tp), dpn)
        dp_g = group_span(np.arange(dp * cp) * tp, dpn)
        cp_g = group_span(np.arange(cp) * tp, dpn)
        if plan.folds_tp_into_ep:  # ep neighbouring ranks of the stage's tp x cp x dp; the rest hold the same experts
            ep_g = group_span(np.arange(ep), dpn)
            edp_g = group_span(np.arange(0, stride, ep), dpn)
        else:
            ep_g = group_span(np.arange(ep) * tp * cp, dpn)
            # the ranks holding the same experts: dp / ep of them, each with its cp ranks (Megatron-core's
            # data-modulo-expert group with context parallelism)
            edp_g = group_span((np.arange(0, dp, ep)[:, None] * tp * cp + np.arange(cp)[None, :] * tp).ravel(), dpn)
        sharded = plan.distributed_optimizer or plan.fsdp
        mp_ranks = [rank(s, d, t) for s in range(pp) for t in range(tp) for d in range(dp if sharded else 1)]
        mp_g = group_span(np.asarray(mp_ranks), dpn)
        links = [group_span(np.asarray([rank(s, 0, 0), rank((s + 1) % pp, 0, 0)]), dpn) for s in range(pp)]
        tied = group_span(np.asarray([rank(0, 0, 0), rank(pp - 1, 0, 0)]), dpn)
        tp_net = tp_g[1] > 1
        dp_net = dp_g[1] > 1 and plan.overlap_grad_reduce
        share = 2.0 if tp_net and dp_net else 1.0
        # HSDP (torchtitan's mesh: replicate outermost, then shard, cp, tp): a shard group is fsdp_shard consecutive
        # data-parallel ranks with their cp ranks; a replicate group the ranks fsdp_shard apart
        k = plan.fsdp_shard if plan.fsdp and plan.fsdp_shard is not None else dp
        fsdp_g = group_span((np.arange(k)[:, None] * tp * cp + np.arange(cp)[None, :] * tp).ravel(), dpn)
        rep_g = group_span(np.arange(0, dp, k) * tp * cp, dpn)
        return cls(tp_g, dp_g, ep_g, edp_g, mp_g, links, tied, tp_share=share, dp_share=share, cp=cp_g,
                   fsdp=fsdp_g, fsdp_rep=rep_g)


def collective(name: str, kind: str, msg_bytes: float, span: tuple[int, int], dt: int, share: float = 1.0) -> Kernel:
    """A collective kernel moving ``msg_bytes`` bytes over a group of ``span = (world, nodes)``, its
    network transfers sharing the NICs with ``share - 1`` other traffic classes."""
    world, nodes = span
    params = {"msg_bytes": msg_bytes, "world": world, "nodes": nodes, "dtype_bytes": dt}
    if share != 1.0:  # only where classes meet on the network: single-node graphs keep their columns
        params["nic_share"] = share
    return (name, kind, Category.COMMUNICATION, params)


class StepEmitter(OpEmitter):
    """OpEmitter with extra streams (TP overlap) that records the first/last compute kernel."""

    def __init__(self, b: GraphBuilder, rank: int, mode: ExecMode) -> None:
        super().__init__(b, rank, mode)
        self.first: int | None = None
        self.last: int | None = None
        self.after_next: list[int] = []  # tasks the next compute op must wait for
        self._side_streams: dict[str, int] = {}

    def _side_stream(self, label: str) -> int:
        """The device stream ``stream <label>`` of communication that overlaps compute (created on first use;
        the communication thread in host mode)."""
        if self.mode != "device":
            return self.comm
        if label not in self._side_streams:
            self._side_streams[label] = self.b.processor(self.rank, ProcKind.GPU_STREAM, f"stream {label}")
        return self._side_streams[label]

    @property
    def tp_stream(self) -> int:
        """Stream for TP collectives that overlap compute (``tp_comm_overlap``)."""
        return self._side_stream("tp")

    @property
    def cp_stream(self) -> int:
        """Stream for the context-parallel key/value exchange that overlaps attention."""
        return self._side_stream("cp")

    def op(self, name: str, kernels, *, comm: bool = False, async_op: bool = False, after=(), group: int = -1) -> list[int]:
        if not comm and self.after_next:
            after = [*after, *self.after_next]
            self.after_next = []
        out = super().op(name, kernels, comm=comm, async_op=async_op, after=after, group=group)
        if not comm and out:
            if self.first is None:
                self.first = out[0]
            self.last = out[-1]
        return out

    def op_on(self, stream: int, name: str, kernels, *, after=()) -> list[int]:
        """An op whose kernels run on ``stream`` (device mode; blocking on the thread in host mode)."""
        if self.mode != "device":
            return self.op(name, kernels, comm=True, async_op=True, after=after)
        return self.device_op(name, kernels, stream=stream, after=after)

    def beside(self, stream: int, side: str, side_kernels, name: str, kernels, *, side_first: bool = True) -> None:
        """Op ``name`` and, on ``stream``, op ``side`` started together (both after the last compute kernel;
        ``side_first``: ``side`` is launched first); the next compute op waits for both."""
        before = [self.last] if self.last is not None else []
        if side_first:
            ids = self.op_on(stream, side, side_kernels, after=before)
            self.op(name, kernels)
        else:
            self.op(name, kernels)
            ids = self.op_on(stream, side, side_kernels, after=before)
        self.after_next += ids

    def sync(self, name: str = "cudaStreamSynchronize") -> int:
        """A blocking wait on the CPU thread (its GPU_CPU edges are added by the caller)."""
        return self.b.task(self.cpu, name, "sync", Category.SYNC)

    def freeze(self, markers: dict) -> ExecutionGraph:
        """The emitted block, with ``markers`` (and its first/last compute kernel) in ``meta["markers"]``."""
        g = self.b.build(validate=False)
        markers.setdefault("first", self.first)
        markers.setdefault("last", self.last)
        g.meta["markers"] = markers
        return g
