"""The kernels of one transformer pipeline step, as Megatron-LM runs them (Narayanan et al. SC21;
Korthikanti et al. 2022), emitted onto a template graph for one representative rank.

* **Layers** (per micro-batch, per model chunk): layer norm -> QKV GEMM (column-parallel,
  ``3h/t`` outputs) -> attention core -> output projection (row-parallel, ``h/t`` inputs) ->
  TP all-reduce -> bias-dropout-add -> layer norm -> FC1 (column) -> GeLU -> FC2 (row) -> TP
  all-reduce -> bias-dropout-add. With sequence parallelism each all-reduce becomes a
  reduce-scatter and an all-gather precedes the next column-parallel GEMM; layer norms and
  dropouts run on ``1/t`` of the tokens (a dropout's backward is a multiply by its saved mask,
  kind ``mul``: it draws no random numbers). Backward mirrors it: dgrad and wgrad GEMMs, the
  conjugate collectives (all-reduce of the input gradient of column-parallel blocks), and
  with SP the re-gather of the GEMM input for wgrad (Korthikanti §4.2.2).
* **Attention**: ``attention="flash"`` (default) is one fused kernel per pass (FLOPs of the
  causal half, ``4 b s^2 h / t x 1/2``; backward 2.5x forward, since it recomputes the scores)
  and stores no ``s x s`` matrix; ``"flash2"``, ``"flash_triton"``, ``"cudnn"``, ``"te"`` and ``"flex"`` are the same kernels of op
  kind ``attn_<impl>`` (``_bwd``), timed at the implementation's published speed; ``"unfused"`` is the pre-FlashAttention Megatron path the
  2021-2022 papers measured: batched QK^T GEMM, fused scale-mask-softmax, dropout, GEMM with V
  (full ``s x s``, no causal skipping).
* **MoE** (``moe``): router GEMM + top-k; Megatron's all-to-all dispatcher: the token copies
  permuted by expert, all-to-all over the expert-parallel group (``ep`` ranks of the data-parallel
  group; with ``expert_tp`` 1, ``ep`` neighbouring ranks of the stage's TP x DP ranks), sorted by
  local expert, the local experts' GEMMs on the routed tokens (balanced routing, ``top_k x
  capacity_factor`` copies per token; Transformer Engine's one GEMM per expert on 4 streams under
  the megatron program) — each expert split over the TP ranks, which all-gather their routed tokens
  before it and reduce-scatter after (``expert_tp``, Megatron's default), or whole on each TP rank
  for its own tokens — then the same back; a shared expert as a TP-split dense MLP; the first
  ``dense_layers`` layers dense.
* **Multi-latent attention** (``mla``): the down projections (whole on every TP rank), the
  latents' norm and the up projections (split by heads) in place of the QKV GEMM.
* **Embedding** on the first virtual stage (vocab-parallel: all-reduce over TP); output layer,
  vocab-parallel cross-entropy on the last.
* **Recomputation**: ``full`` re-runs each layer's forward (with its collectives) right before
  its backward; ``selective`` re-runs the attention core (nothing for flash attention, which
  recomputes internally).

Every framework op costs CPU time (T1, T2, one T4 launch per kernel, T5, T3 — the
:class:`~predictor.sources.synth.emit.OpEmitter` of every synthesiser), so CPU-bound small models
show launch gaps. FLOPs and bytes are set on every kernel. Collectives carry the size of their
group (``world``) and the nodes it spans (``nodes``) from
:class:`~predictor.sources.synth.transformer_emitter.GroupLayout`. Units: elements,
bytes, seconds.
"""

from __future__ import annotations

import math

from predictor.graph import Category, DepKind
from predictor.sources.synth.emit import Kernel, concat, eltwise
from predictor.sources.synth.transformer_emitter import StepEmitter, collective
from predictor.sources.synth.transformer_matmuls import layer_matmuls
from predictor.sources.synth.transformer_ops import LayerOps
from predictor.sources.synth.transformer_spec import MoESpec
from predictor.timing.kernels.attention import attention_kind

__all__ = ["StepKernels", "deepep_bytes"]


def deepep_bytes(moe: MoESpec, world: int, nodes: int) -> tuple[float, float]:
    """(NVLink, network) copies of one token a rank's DeepEP normal-mode dispatch sends over an expert-parallel group
    of ``world`` ranks on ``nodes`` nodes (a combine sends as many back): once to each destination node off its
    own (RDMA), then to each destination GPU over NVLink but its own. Destinations are the expected distinct GPUs
    and nodes of ``top_k`` of the experts drawn evenly (without replacement), the nodes capped by node-limited
    routing (``router_group_topk`` of ``router_groups``, each chosen group taken to receive an expert)."""
    experts, k = moe.experts, moe.top_k

    def hit(held: float) -> float:  # probability a token's experts include one of ``held`` given experts
        held = round(held)
        return 1.0 if experts - held < k else 1.0 - math.comb(experts - held, k) / math.comb(experts, k)

    gpus = world * hit(experts / world)
    dest_nodes = nodes * hit(experts / nodes)
    g, m = moe.router_groups, moe.router_group_topk
    if g and m:
        if g % nodes == 0:  # whole groups per node: the node takes none of the chosen m groups, or some
            limited = nodes * (1.0 - math.comb(g - g // nodes, m) / math.comb(g, m))
        else:
            limited = min(float(nodes), m * nodes / g)
        dest_nodes = min(dest_nodes, limited)
    net = dest_nodes * (nodes - 1) / nodes if nodes > 1 else 0.0
    return gpus * (1.0 - nodes / world), net


class StepKernels(LayerOps):
    """Emits the kernels of one pipeline step (embedding, layers, head) for the plan's shapes."""

    def _tp_reduce_out(self, e: StepEmitter, name: str) -> None:
        """The row-parallel output: all-reduce, or reduce-scatter with sequence parallelism."""
        self.tp_collective(e, name, "reduce_scatter" if self.sp else "all_reduce", self.T * self.h)

    def _tp_gather_in(self, e: StepEmitter, name: str) -> None:
        """Sequence parallelism: all-gather the column-parallel GEMM's input."""
        if self.sp:
            self.tp_collective(e, name, "all_gather", self.T * self.h)

    def _overlapped(self, e: StepEmitter) -> bool:
        """``tp_comm_overlap`` with sequence parallelism on a device (Transformer Engine's userbuffers, as
        Megatron's ``--tp-comm-overlap`` runs them): a layer's sequence-parallel all-gather runs in chunks
        alongside the GEMM that reads it, its reduce-scatter alongside the GEMM that writes it."""
        return self.sp and self.plan.tp_comm_overlap and e.mode == "device"

    def _gathered_gemm(self, e: StepEmitter, gather: str, name: str, kernels: list[Kernel]) -> None:
        """The sequence-parallel all-gather ``gather`` of a GEMM's input, then the GEMM op ``name``; overlapped,
        the two start together and the next op waits for both."""
        if not self._overlapped(e):
            self._tp_gather_in(e, gather)
            e.op(name, kernels)
            return
        coll = collective(gather, "all_gather", self.T * self.h * self.dt, self.lay.tp, self.dt, self.tp_share)
        e.beside(e.tp_stream, gather, [coll], name, kernels)

    def _reduced_gemm(self, e: StepEmitter, name: str, kernels: list[Kernel], reduce: str) -> None:
        """A row-parallel GEMM op ``name``, then its output's reduction ``reduce`` (reduce-scatter with sequence
        parallelism, else all-reduce); overlapped, the two start together and the next op waits for both."""
        if not self._overlapped(e):
            e.op(name, kernels)
            self._tp_reduce_out(e, reduce)
            return
        coll = collective(reduce, "reduce_scatter", self.T * self.h * self.dt, self.lay.tp, self.dt, self.tp_share)
        e.beside(e.tp_stream, reduce, [coll], name, kernels, side_first=False)

    def _input_grad_reduce(self, e: StepEmitter, name: str, wgrad: list[Kernel]) -> None:
        """Column-parallel backward: dgrad's input-gradient reduce, then wgrad (overlapped if asked)."""
        if self.t <= 1:
            e.op(f"{name}.wgrad", wgrad)
            return
        kind = "reduce_scatter" if self.sp else "all_reduce"
        coll = collective(f"{name}.grad_{kind}", kind, self.T * self.h * self.dt, self.lay.tp, self.dt, self.tp_share)
        if self.plan.tp_comm_overlap:
            last_dgrad = [e.last] if e.last is not None else []
            ar = e.op_on(e.tp_stream, f"{name}.grad_{kind}", [coll], after=last_dgrad)
            if self.sp:
                self.tp_collective(e, f"{name}.wgrad_input_all_gather", "all_gather", self.T * self.h)
            e.op(f"{name}.wgrad", wgrad)
            e.after_next += ar  # the next op consumes the reduced input gradient
        else:
            e.op(f"{name}.grad_{kind}", [coll])
            if self.sp:
                self.tp_collective(e, f"{name}.wgrad_input_all_gather", "all_gather", self.T * self.h)
            e.op(f"{name}.wgrad", wgrad)

    # -------------------------------------------------------------- attention core
    def _fused_kind(self, backward: bool) -> str:
        """Op kind of the fused attention kernel: ``bmm`` for ``"flash"``, else the implementation's own."""
        return "bmm" if self.spec.attention == "flash" else attention_kind(self.spec.attention, backward)

    def _attention_span(self) -> tuple[float, float, float]:
        """(queries, keys, spans per sequence) of a fused attention kernel: this rank's queries against every
        key of the sequence (``seq / cp`` of ``seq``), or with attention masked per document each ``doc_len``
        document's queries against its own keys, ``seq / doc_len`` times."""
        s = float(self.s)
        doc = self.spec.doc_len
        if doc is not None and doc < s:
            return float(doc), float(doc), s / doc
        return s / self.cp, s, 1.0

    def _attn_fwd(self, e: StepEmitter, p: str) -> None:
        b, s, d, hl, dt = self.b, self.s, self.d, self.heads_local, self.dt
        if self.spec.fused_attention:
            q, n, spans = self._attention_span()
            flops = 4.0 * b * spans * q * n * hl * self.d_core * (0.5 if self.spec.causal else 1.0)
            k = (f"{p}flash_attn_fwd", self._fused_kind(False), Category.COMPUTE,
                 {"m": q, "n": n, "k": self.d_rate, "batch": b * hl * spans, "dtype_bytes": dt, "flops": flops,
                  "bytes": 4.0 * self.T * hl * self.d_core * dt, "tiled": 1.0})
            self._with_kv_exchange(e, p, f"{p}core_attention", [k], backward=False)
            return
        bh = float(b * hl)
        if self.eager:  # q, k, v split out of the fused projection: view, permute + reshape copies, unbind
            self._views(e, p, "qkv.view", "qkv.permute")
            e.op(f"{p}qkv_split.reshape", [eltwise(f"{p}qkv_split.copy", "memcpy", self.T * self.q / self.t, dt)])
            self._views(e, p, "qkv.unbind", "k.transpose")
        if self.eager and self.spec.causal:
            # baddbmm(mask, q, k^T, alpha): ATen first copies the broadcast [s, s] mask into the [b h, s, s] output
            e.op(f"{p}attn_scores", [eltwise(f"{p}attn_scores.mask_copy", "memcpy", bh * s * s, dt),
                                     self._bmm(f"{p}attn_scores.bmm", s, s, d, bh)])
        else:
            e.op(f"{p}attn_scores", [self._bmm(f"{p}attn_scores.bmm", s, s, d, bh)])  # q @ k^T
        e.op(f"{p}scale_mask_softmax", [eltwise(f"{p}softmax", "softmax", bh * s * s, dt, rw=2.0)])
        if self.spec.has_dropout:
            e.op(f"{p}attn_dropout", [eltwise(f"{p}attn_dropout", "dropout", bh * s * s, dt, rw=2.5)])
        e.op(f"{p}attn_context", [self._bmm(f"{p}attn_context.bmm", s, d, s, bh)])
        if self.eager:  # heads back to tokens: view, transpose + reshape copy
            self._views(e, p, "context.view", "context.transpose")
            e.op(f"{p}context.reshape", [eltwise(f"{p}context.copy", "memcpy", self.T * hl * d, dt)])

    def _with_kv_exchange(self, e: StepEmitter, p: str, name: str, kernels: list[Kernel], *, backward: bool) -> None:
        """The fused attention op ``name``; with context parallelism its keys and values pass round the ``cp``
        ranks (Transformer Engine's p2p ring: cp - 1 steps, each overlapping the previous block's attention),
        priced as an all-gather of K and V beside the attention, and in the backward a reduce-scatter of
        their gradients as well; the next op waits for both."""
        if self.cp <= 1:
            e.op(name, kernels)
            return
        kv = 2.0 * self.b * self.s * (self.spec.kv_heads_count / self.t) * self.d_core * self.dt  # K, V: whole sequence
        colls = [collective(f"{p}cp_kv_all_gather", "all_gather", kv, self.lay.cp, self.dt)]
        if backward:
            colls.append(collective(f"{p}cp_dkv_reduce_scatter", "reduce_scatter", kv, self.lay.cp, self.dt))
        e.beside(e.cp_stream, f"{p}cp_kv_exchange", colls, name, kernels)

    def _attn_bwd(self, e: StepEmitter, p: str) -> None:
        b, s, d, hl, dt = self.b, self.s, self.d, self.heads_local, self.dt
        if self.spec.fused_attention:
            q, n, spans = self._attention_span()
            flops = 2.5 * 4.0 * b * spans * q * n * hl * self.d_core * (0.5 if self.spec.causal else 1.0)
            k = (f"{p}flash_attn_bwd", self._fused_kind(True), Category.COMPUTE,
                 {"m": q, "n": n, "k": self.d_rate, "batch": b * hl * spans, "dtype_bytes": dt, "flops": flops,
                  "bytes": 8.0 * self.T * hl * self.d_core * dt, "tiled": 1.0})
            self._with_kv_exchange(e, p, f"{p}core_attention.backward", [k], backward=True)
            return
        if "core_attn" in self.plan.selective_modules:
            self._attn_fwd(e, f"{p}recompute.")
        bh = float(b * hl)
        if self.eager:
            self._views(e, p, "context.unsafe_view_backward", "context.clone_backward", "context.transpose_backward")
            e.op(f"{p}context.reshape.backward", [eltwise(f"{p}context.copy_bwd", "memcpy", self.T * hl * d, dt)])
        e.op(f"{p}attn_context.backward", [self._bmm(f"{p}attn_context.dgrad_probs", s, s, d, bh),
                                           self._bmm(f"{p}attn_context.dgrad_v", s, d, s, bh)])
        if self.spec.has_dropout:
            e.op(f"{p}attn_dropout.backward", [eltwise(f"{p}attn_dropout_bwd", "mul", bh * s * s, dt, rw=2.5)])
        e.op(f"{p}scale_mask_softmax.backward", [eltwise(f"{p}softmax_bwd", "softmax_bwd", bh * s * s, dt, rw=3.0)])
        if self.eager:  # baddbmm's backward: the two GEMMs plus the scale (alpha) applied to each gradient
            e.op(f"{p}attn_scores.backward", [self._bmm(f"{p}attn_scores.dgrad_q", s, d, s, bh),
                                              eltwise(f"{p}attn_scores.scale_q", "mul", bh * s * d, dt),
                                              # the gradient of k^T: q^T @ dS, [d x s] @ [s x s]
                                              self._bmm(f"{p}attn_scores.dgrad_k", d, s, s, bh),
                                              eltwise(f"{p}attn_scores.scale_k", "mul", bh * s * d, dt)])
            # unbind's backward stacks q, k, v; the permute's backward copies them back to tokens
            self._views(e, p, "k.transpose_backward")
            e.op(f"{p}qkv_split.backward", [concat(f"{p}qkv_split.stack", 1, self.T * self.q / self.t, 3, dt),
                                            eltwise(f"{p}qkv_split.copy_bwd", "memcpy", self.T * self.q / self.t, dt)])
            self._views(e, p, "qkv.unsafe_view_backward", "qkv.clone_backward", "qkv.permute_backward")
            return
        e.op(f"{p}attn_scores.backward", [self._bmm(f"{p}attn_scores.dgrad_q", s, d, s, bh),
                                          self._bmm(f"{p}attn_scores.dgrad_k", d, s, s, bh)])

    # -------------------------------------------------------------- MLP
    def _mlp_fwd(self, e: StepEmitter, p: str, dense: bool = False) -> None:
        T, h, dt = self.T, self.h, self.dt
        if self.spec.moe is None or dense:
            self._dense_mlp_fwd(e, p, self.f, self.f1)
            return
        moe = self.spec.moe
        if moe.shared_ffn:  # the shared expert: a dense, TP-split MLP every token runs
            self._dense_mlp_fwd(e, f"{p}shared_expert.", moe.shared_ffn, self.spec.fc1_width(moe.shared_ffn))
        Tr, routed, per_expert, local, f, f1, g = self._routed()
        counted = e.op(f"{p}router", [self._linear(f"{p}router.mm", Tr, moe.experts, h, bias=False),
                                      eltwise(f"{p}router.topk", "softmax", Tr * moe.experts, dt, rw=3.0)])
        # Megatron's all-to-all dispatcher (token_dispatcher.py): permute the token copies by expert, send them,
        # sort the received chunks by local expert, run the experts, and the same back
        counted = self._token_counts(e, p, counted)
        self._moe_pass(e, f"{p}moe_permute", routed * h)
        self._counts_to_host(e, p, counted)
        self._a2a(e, f"{p}moe_dispatch", routed * h)
        if g > 1:  # experts split over the TP ranks: each runs its 1 / g of every expert on the group's tokens
            self.tp_collective(e, f"{p}moe_tokens_all_gather", "all_gather", routed * g * h)
        self._sort_chunks(e, f"{p}moe_sort_chunks", routed * g * h)
        self._fp8_cast(e, f"{p}experts.fc1.fp8_cast", routed * g * h)
        e.op(f"{p}experts.fc1", [self._linear(f"{p}experts.fc1", per_expert, f1 / g, h, batch=local)])
        self._activation(e, f"{p}experts.", "gelu", routed * f)
        self._fp8_cast(e, f"{p}experts.fc2.fp8_cast", routed * f)
        e.op(f"{p}experts.fc2", [self._linear(f"{p}experts.fc2", per_expert, h, f / g, batch=local)])
        self._sort_chunks(e, f"{p}moe_restore_chunks", routed * g * h)
        if g > 1:
            self.tp_collective(e, f"{p}moe_tokens_reduce_scatter", "reduce_scatter", routed * g * h)
        self._a2a(e, f"{p}moe_combine", routed * h)
        self._moe_pass(e, f"{p}moe_unpermute", routed * h)
        if not self.sp:
            self.tp_collective(e, f"{p}moe_output_all_gather", "all_gather", T * h)

    def _routed(self) -> tuple[float, float, float, float, int, int, int]:
        """An MoE layer's shapes on this rank: (tokens it routes — TP ranks split them —, the token copies it
        sends to the experts, an expert's tokens here — its TP group's with experts split over TP —, local
        experts, an expert's width, its fc1 output, the experts' TP degree)."""
        moe, ep, g = self.spec.moe, self.plan.ep, self.plan.etp
        assert moe is not None
        f = self.spec.expert_ffn_size
        Tr = self.T / self.t
        routed = Tr * moe.top_k * moe.capacity_factor
        return Tr, routed, routed * g * ep / moe.experts, float(moe.experts // ep), f, self.spec.fc1_width(f), g

    def _dense_mlp_fwd(self, e: StepEmitter, p: str, f: float, f1: float) -> None:
        """A TP-split MLP of width ``f`` (fc1 output ``f1``): column-parallel fc1, activation, row-parallel
        fc2 with its all-reduce (reduce-scatter with sequence parallelism)."""
        T, h, t = self.T, self.h, self.t
        self._fp8_cast(e, f"{p}fc1.fp8_cast", T * h)
        self._gathered_gemm(e, f"{p}mlp_input_all_gather", f"{p}fc1", [self._linear(f"{p}fc1.addmm", T, f1 / t, h)])
        self._activation(e, p, "bias_gelu", T * f / t)
        self._fp8_cast(e, f"{p}fc2.fp8_cast", T * f / t)
        self._reduced_gemm(e, f"{p}fc2", [self._linear(f"{p}fc2.mm", T, h, f / t)],
                           f"{p}mlp_output_{'reduce_scatter' if self.sp else 'all_reduce'}")

    def _a2a(self, e: StepEmitter, name: str, elems: float) -> None:
        """The expert-parallel all-to-all of ``elems`` token elements (none without expert parallelism); with
        DeepEP (``moe.dispatcher``) its dispatch or combine kernel, priced on the bytes it moves
        (:func:`deepep_bytes`)."""
        if self.plan.ep <= 1:
            return
        moe = self.spec.moe
        assert moe is not None
        if moe.dispatcher != "deepep":
            e.op(name, [collective(name, "all_to_all", elems * self.dt, self.lay.ep, self.dt)])
            return
        world, nodes = self.lay.ep
        token_bytes = elems / moe.top_k * self.dt  # the rank's tokens (its busiest share: x capacity factor)
        nvl, net = (token_bytes * x for x in deepep_bytes(moe, world, nodes))
        k = collective(name, "ep_dispatch", nvl, self.lay.ep, self.dt)
        k[3]["net_bytes"] = net
        e.op(name, [k])

    def _token_counts(self, e: StepEmitter, p: str, after: list[int]) -> list[int]:
        """With expert parallelism, the tokens each rank sends each expert exchanged over the expert-parallel
        group before the all-to-all (int64 counts: Megatron gathers them, torchtitan all-to-alls them); the
        tasks the host then waits for (``after`` without expert parallelism)."""
        moe = self.spec.moe
        assert moe is not None
        if self.plan.ep <= 1:
            return after
        experts = float(moe.experts)
        return e.op(f"{p}moe_token_counts", [collective(f"{p}moe_token_counts", "all_gather", experts * 8.0,
                                                        self.lay.ep, 8)])

    def _counts_to_host(self, e: StepEmitter, p: str, counts: list[int]) -> None:
        """The host waiting for the token counts before it launches the all-to-all (a CUDA sync each MoE layer's
        forward: Megatron's dropless dispatcher needs the split sizes on the CPU, torchtitan's expert parallelism
        copies them with ``.tolist()``; torchtitan without it keeps them on the GPU)."""
        if e.mode != "device" or not counts or (self.eager and self.plan.ep <= 1):
            return
        wait = e.sync(f"{p}moe_token_counts.synchronize")
        e.b.edge(counts[-1], wait, DepKind.GPU_CPU)

    def _moe_pass(self, e: StepEmitter, name: str, elems: float) -> None:
        """One pass over ``elems`` token elements that reorders them (a permutation: reads and writes each)."""
        e.op(name, [eltwise(name, "elementwise", elems, self.dt, rw=2.0)])

    def _sort_chunks(self, e: StepEmitter, name: str, elems: float) -> None:
        """The received token chunks reordered by local expert (or back): with expert parallelism and more
        than one local expert (Megatron's ``sort_chunks_by_idxs``)."""
        if self.plan.ep > 1 and self.spec.moe is not None and self.spec.moe.experts // self.plan.ep > 1:
            self._moe_pass(e, name, elems)

    def _mlp_bwd(self, e: StepEmitter, p: str, dense: bool = False) -> None:
        T, h = self.T, self.h
        if self.spec.moe is None or dense:
            self._dense_mlp_bwd(e, p, self.f, self.f1)
            return
        moe = self.spec.moe
        Tr, routed, per_expert, local, f, f1, g = self._routed()
        self._moe_pass(e, f"{p}moe_unpermute.backward", routed * h)
        self._a2a(e, f"{p}moe_combine.backward", routed * h)
        if g > 1:
            self.tp_collective(e, f"{p}moe_tokens_reduce_scatter.backward", "all_gather", routed * g * h)
        self._sort_chunks(e, f"{p}moe_restore_chunks.backward", routed * g * h)
        self._fp8_cast(e, f"{p}experts.fc2.grad_fp8_cast", routed * g * h)
        e.op(f"{p}experts.fc2.backward", [self._dgrad(f"{p}experts.fc2.dgrad", per_expert, f / g, h, batch=local),
                                          self._wgrad(f"{p}experts.fc2.wgrad", h, f / g, per_expert, batch=local)])
        self._activation_bwd(e, f"{p}experts.", "gelu", routed * f)
        self._fp8_cast(e, f"{p}experts.fc1.grad_fp8_cast", routed * f1)
        e.op(f"{p}experts.fc1.backward", [self._dgrad(f"{p}experts.fc1.dgrad", per_expert, h, f1 / g, batch=local),
                                          self._wgrad(f"{p}experts.fc1.wgrad", f1 / g, h, per_expert, batch=local)])
        self._sort_chunks(e, f"{p}moe_sort_chunks.backward", routed * g * h)
        if g > 1:
            self.tp_collective(e, f"{p}moe_tokens_all_gather.backward", "reduce_scatter", routed * g * h)
        self._a2a(e, f"{p}moe_dispatch.backward", routed * h)
        self._moe_pass(e, f"{p}moe_permute.backward", routed * h)
        e.op(f"{p}router.backward", [self._dgrad(f"{p}router.dgrad", Tr, h, moe.experts),
                                     self._wgrad(f"{p}router.wgrad", moe.experts, h, Tr)])
        if not self.sp:
            self.tp_collective(e, f"{p}moe_input_grad_all_gather", "all_gather", T * h)
        if moe.shared_ffn:
            self._dense_mlp_bwd(e, f"{p}shared_expert.", moe.shared_ffn, self.spec.fc1_width(moe.shared_ffn))

    def _dense_mlp_bwd(self, e: StepEmitter, p: str, f: float, f1: float) -> None:
        """The backward of :meth:`_dense_mlp_fwd`: fc2's gradients, the activation's, fc1's with the
        input-gradient reduce."""
        T, h, t = self.T, self.h, self.t
        self._fp8_cast(e, f"{p}fc2.grad_fp8_cast", T * h)
        self._gathered_gemm(e, f"{p}mlp_output_grad_all_gather", f"{p}fc2.backward",
                            [self._dgrad(f"{p}fc2.dgrad", T, f / t, h), self._wgrad(f"{p}fc2.wgrad", h, f / t, T),
                             *self._bias_grad(f"{p}fc2", T, h)])
        self._accumulate_grad(e, f"{p}fc2", 2)
        self._activation_bwd(e, p, "bias_gelu", T * f / t)
        self._fp8_cast(e, f"{p}fc1.grad_fp8_cast", T * f1 / t)
        e.op(f"{p}fc1.dgrad", [self._dgrad(f"{p}fc1.dgrad", T, h, f1 / t)])
        self._input_grad_reduce(e, f"{p}fc1", [self._wgrad(f"{p}fc1.wgrad", f1 / t, h, T),
                                               *self._bias_grad(f"{p}fc1", T, f1 / t)])
        self._accumulate_grad(e, f"{p}fc1", 2)

    # -------------------------------------------------------------- layers
    def layer_fwd(self, e: StepEmitter, p: str, dense: bool = False) -> None:
        """Forward of one layer (prefix ``p``); ``dense``: one of an MoE model's dense layers."""
        T, Tn, h, t, dt = self.T, self.Tn, self.h, self.t, self.dt
        e.op(f"{p}input_layernorm", [eltwise(f"{p}input_layernorm", "layer_norm", Tn * h, dt, rw=2.0)])
        self._qkv_fwd(e, p)
        self._rope(e, p)
        self._attn_fwd(e, p)
        self._fp8_cast(e, f"{p}attn_proj.fp8_cast", T * self.a / t)
        self._reduced_gemm(e, f"{p}attn_proj", [self._linear(f"{p}attn_proj.mm", T, h, self.a / t)],
                           f"{p}attn_output_{'reduce_scatter' if self.sp else 'all_reduce'}")
        self._dropout_add(e, f"{p}bias_dropout_add")
        e.op(f"{p}post_attention_layernorm", [eltwise(f"{p}post_attention_layernorm", "layer_norm", Tn * h, dt, rw=2.0)])
        self._mlp_fwd(e, p, dense)
        self._dropout_add(e, f"{p}bias_dropout_add_2")

    def _rope(self, e: StepEmitter, p: str, *, backward: bool = False) -> None:
        """Rotary embeddings (``spec.position == "rope"``) of this rank's queries and keys (with multi-latent
        attention their rotary parts), or of their gradients: Megatron's fused kernel (reads and writes them
        once), or eager's complex rotation as torchtitan's Llama runs it: a copy to fp32, the complex multiply
        and the copy back to the model dtype (in 2-byte units: 3, 4 and 3 passes)."""
        if self.spec.position != "rope":
            return
        m = self.spec.mla
        width = (self.spec.heads * m.rope_head_dim / self.t + m.rope_head_dim if m is not None else
                 (self.spec.heads + self.spec.kv_heads_count) * self.d / self.t)
        n, dt = self.T * width, self.dt
        name = f"{p}rope" + (".backward" if backward else "")
        if not self.eager:
            e.op(name, [eltwise(name, "elementwise", n, dt, rw=2.0)])
            return
        e.op(f"{name}.to_float", [eltwise(f"{name}.to_float", "memcpy", n, dt, rw=3.0)])
        e.op(f"{name}.mul", [eltwise(f"{name}.mul", "mul", n, dt, rw=4.0)])
        e.op(f"{name}.to_dtype", [eltwise(f"{name}.to_dtype", "memcpy", n, dt, rw=3.0)])

    def _qkv_fwd(self, e: StepEmitter, p: str) -> None:
        """The attention's input projections: the column-parallel QKV GEMM, or multi-latent attention's
        down projections (one GEMM, whole on every rank), their latents' norm and the up projections."""
        T, h, t = self.T, self.h, self.t
        self._fp8_cast(e, f"{p}qkv.fp8_cast", T * h)
        m = self.spec.mla
        if m is None:
            self._gathered_gemm(e, f"{p}qkv_input_all_gather", f"{p}qkv", [self._linear(f"{p}qkv.addmm", T, self.q / t, h)])
            return
        heads = self.spec.heads
        down = [self._linear(f"{p}mla_down.mm", T, m.kv_lora_rank + m.rope_head_dim + m.q_lora_rank, h, bias=False)]
        if not m.q_lora_rank:  # queries straight from the hidden state
            down.append(self._linear(f"{p}q_proj.mm", T, heads * m.q_head_dim / t, h, bias=False))
        self._gathered_gemm(e, f"{p}qkv_input_all_gather", f"{p}mla_down", down)
        latents = m.kv_lora_rank + m.q_lora_rank
        e.op(f"{p}mla_norm", [eltwise(f"{p}mla_norm", "layer_norm", T * latents, self.dt, rw=2.0)])
        self._mla_up(e, p)
        if self.eager:  # torch.cat of each head's plain and rotary parts into its query and its key
            rows = T * heads / t
            e.op(f"{p}mla_qk_cat", [concat(f"{p}mla_{x}_cat", rows, m.q_head_dim, 2, self.dt) for x in "qk"])

    def _mla_up(self, e: StepEmitter, p: str) -> None:
        """Multi-latent attention's up projections (split by heads): keys and values, and queries with a q latent."""
        m, heads, T, t = self.spec.mla, self.spec.heads, self.T, self.t
        assert m is not None
        up = [self._linear(f"{p}kv_up.mm", T, heads * (m.qk_head_dim + m.v_head_dim) / t, m.kv_lora_rank, bias=False)]
        if m.q_lora_rank:
            up.append(self._linear(f"{p}q_up.mm", T, heads * m.q_head_dim / t, m.q_lora_rank, bias=False))
        e.op(f"{p}mla_up", up)

    def _qkv_bwd(self, e: StepEmitter, p: str) -> None:
        """The backward of :meth:`_qkv_fwd`, ending with the input-gradient reduce."""
        T, h, t = self.T, self.h, self.t
        m = self.spec.mla
        if m is None:
            self._fp8_cast(e, f"{p}qkv.grad_fp8_cast", T * self.q / t)
            e.op(f"{p}qkv.dgrad", [self._dgrad(f"{p}qkv.dgrad", T, h, self.q / t)])
            self._input_grad_reduce(e, f"{p}qkv", [self._wgrad(f"{p}qkv.wgrad", self.q / t, h, T),
                                                   *self._bias_grad(f"{p}qkv", T, self.q / t)])
            self._accumulate_grad(e, f"{p}qkv", 2)
            return
        heads = self.spec.heads
        if self.eager:  # cat's backward: the query and key gradients sliced into their parts; the shared
            n = T * heads / t * m.q_head_dim  # rotary key's gradient summed over the heads
            e.op(f"{p}mla_qk_cat.backward", [eltwise(f"{p}mla_q_cat_bwd", "memcpy", n, self.dt),
                                             eltwise(f"{p}mla_k_cat_bwd", "memcpy", n, self.dt)])
        kv_up = heads * (m.qk_head_dim + m.v_head_dim) / t
        up = [self._dgrad(f"{p}kv_up.dgrad", T, m.kv_lora_rank, kv_up), self._wgrad(f"{p}kv_up.wgrad", kv_up, m.kv_lora_rank, T)]
        if m.q_lora_rank:
            q_up = heads * m.q_head_dim / t
            up += [self._dgrad(f"{p}q_up.dgrad", T, m.q_lora_rank, q_up), self._wgrad(f"{p}q_up.wgrad", q_up, m.q_lora_rank, T)]
        e.op(f"{p}mla_up.backward", up)
        latents = m.kv_lora_rank + m.q_lora_rank
        e.op(f"{p}mla_norm.backward", [eltwise(f"{p}mla_norm_bwd", "layer_norm", T * latents, self.dt, rw=3.0)])
        down_out = m.kv_lora_rank + m.rope_head_dim + m.q_lora_rank
        self._fp8_cast(e, f"{p}qkv.grad_fp8_cast", T * down_out)
        dgrad = [self._dgrad(f"{p}mla_down.dgrad", T, h, down_out)]
        wgrad = [self._wgrad(f"{p}mla_down.wgrad", down_out, h, T)]
        if not m.q_lora_rank:
            q = heads * m.q_head_dim / t
            dgrad.append(self._dgrad(f"{p}q_proj.dgrad", T, h, q))
            wgrad.append(self._wgrad(f"{p}q_proj.wgrad", q, h, T))
        e.op(f"{p}qkv.dgrad", dgrad)
        self._input_grad_reduce(e, f"{p}qkv", wgrad)

    def _op_recompute(self, e: StepEmitter, p: str, dense: bool = False) -> None:
        """torchtitan's op-level checkpointing replays the layer's forward before its backward, running what it
        did not save: the norms, the sequence-parallel all-gathers, every second plain matmul in torchtitan's
        order (:func:`layer_matmuls`: a dense Llama layer's wk, wo and w3), rotary embeddings, the activations
        and an MoE layer's routed experts (grouped GEMMs are not among the ops it saves; the all-to-alls are), each
        replayed fp8 matmul with its input's cast."""
        T, Tn, h, t, dt = self.T, self.Tn, self.h, self.t, self.dt
        r = f"{p}recompute."
        moe_layer = self.spec.moe is not None and not dense
        dropped = layer_matmuls(self.spec, t, dense=not moe_layer)[1::2]  # odd-numbered outputs saved

        def replay(part: str) -> None:
            """The dropped matmuls of ``part``, the first reading the all-gathered input gathering it again."""
            gather = True
            for mm in (mm for mm in dropped if mm.part == part):
                rows = T / t if mm.routed else T
                self._fp8_cast(e, f"{r}{mm.name}.fp8_cast", rows * mm.k)  # the input's fp8 copy, not saved
                kernels = [self._linear(f"{r}{mm.name}.mm", rows, mm.n, mm.k, bias=False)]
                if mm.gathered and gather:
                    gather = False
                    self._gathered_gemm(e, f"{r}{'qkv' if part == 'attn' else 'mlp'}_input_all_gather", f"{r}{mm.name}",
                                        kernels)
                else:
                    e.op(f"{r}{mm.name}", kernels)

        e.op(f"{r}input_layernorm", [eltwise(f"{r}input_layernorm", "layer_norm", Tn * h, dt, rw=2.0)])
        replay("attn")
        if self.spec.mla is not None:
            latents = self.spec.mla.kv_lora_rank + self.spec.mla.q_lora_rank
            e.op(f"{r}mla_norm", [eltwise(f"{r}mla_norm", "layer_norm", T * latents, dt, rw=2.0)])
        self._rope(e, r)  # elementwise: not saved
        e.op(f"{r}post_attention_layernorm", [eltwise(f"{r}post_attention_layernorm", "layer_norm", Tn * h, dt, rw=2.0)])
        replay("mlp")
        moe = self.spec.moe
        if not moe_layer:
            self._activation(e, r, "bias_gelu", T * self.f / t)
            return
        assert moe is not None
        if moe.shared_ffn:
            self._activation(e, f"{r}shared_expert.", "bias_gelu", T * moe.shared_ffn / t)
        _, routed, per_expert, local, f, f1, g = self._routed()
        if g > 1:
            self.tp_collective(e, f"{r}moe_tokens_all_gather", "all_gather", routed * g * h)
        self._fp8_cast(e, f"{r}experts.fc1.fp8_cast", routed * g * h)
        e.op(f"{r}experts.fc1", [self._linear(f"{r}experts.fc1", per_expert, f1 / g, h, batch=local)])
        self._activation(e, f"{r}experts.", "gelu", routed * f)
        self._fp8_cast(e, f"{r}experts.fc2.fp8_cast", routed * f)
        e.op(f"{r}experts.fc2", [self._linear(f"{r}experts.fc2", per_expert, h, f / g, batch=local)])

    def _module_recompute(self, e: StepEmitter, p: str, dense: bool = False) -> None:
        """Megatron-core's selective recomputation of modules (``recompute_modules``; the attention core is
        re-run in the attention's backward): before the layer's backward, the norms, MLA's up projections and
        rotary embeddings, the dense MLP, the whole MoE layer (its dispatch and all-to-alls too), or the experts'
        activation or the shared expert, each with the collectives it runs."""
        Tn, h, dt = self.Tn, self.h, self.dt
        mods, r = self.plan.selective_modules, f"{p}recompute."
        if "layernorm" in mods:
            e.op(f"{r}norms", [eltwise(f"{r}{n}", "layer_norm", Tn * h, dt, rw=2.0)
                               for n in ("input_layernorm", "post_attention_layernorm")])
        if "mla_up_proj" in mods and self.spec.mla is not None:
            self._mla_up(e, r)
            self._rope(e, r)
        moe = self.spec.moe
        if moe is None or dense:
            if "mlp" in mods:
                self._dense_mlp_fwd(e, r, self.f, self.f1)
            return
        if "moe" in mods:
            self._mlp_fwd(e, r)
            return
        if "shared_experts" in mods and moe.shared_ffn:
            self._dense_mlp_fwd(e, f"{r}shared_expert.", moe.shared_ffn, self.spec.fc1_width(moe.shared_ffn))
        if "moe_act" in mods:
            _, routed, _, _, f, _, _ = self._routed()
            self._activation(e, f"{r}experts.", "gelu", routed * f)

    def layer_bwd(self, e: StepEmitter, p: str, index: int = 0, dense: bool = False) -> None:
        """Backward of layer ``index`` of the chunk (prefix ``p``), after its recomputation if any; ``dense``:
        one of an MoE model's dense layers."""
        T, Tn, h, t, dt = self.T, self.Tn, self.h, self.t, self.dt
        if self.plan.recomputes_layer(index):
            self.layer_fwd(e, f"{p}recompute.", dense)
        elif self.plan.recompute == "op":
            self._op_recompute(e, p, dense)
        elif self.plan.recompute_modules:
            self._module_recompute(e, p, dense)
        if self.spec.has_dropout:  # the mask applied to the gradient (without dropout it passes through)
            e.op(f"{p}bias_dropout_add_2.backward", [eltwise(f"{p}bias_dropout_add_2_bwd", "mul", Tn * h, dt, rw=3.5)])
        self._mlp_bwd(e, p, dense)
        self._layernorm_bwd(e, f"{p}post_attention_layernorm")
        if self.eager:  # the residual stream's two gradients summed by autograd
            e.op(f"{p}residual_2.grad_add", [eltwise(f"{p}residual_2.grad_add", "add", Tn * h, dt, rw=3.0)])
        self._views(e, p, "residual_2.add_backward")
        if self.spec.has_dropout:
            e.op(f"{p}bias_dropout_add.backward", [eltwise(f"{p}bias_dropout_add_bwd", "mul", Tn * h, dt, rw=3.5)])
        self._fp8_cast(e, f"{p}attn_proj.grad_fp8_cast", T * h)
        self._gathered_gemm(e, f"{p}attn_output_grad_all_gather", f"{p}attn_proj.backward",
                            [self._dgrad(f"{p}attn_proj.dgrad", T, self.a / t, h),
                             self._wgrad(f"{p}attn_proj.wgrad", h, self.a / t, T),
                             *self._bias_grad(f"{p}attn_proj", T, h)])
        self._accumulate_grad(e, f"{p}attn_proj", 2)
        self._attn_bwd(e, p)
        self._rope(e, p, backward=True)
        self._qkv_bwd(e, p)
        self._layernorm_bwd(e, f"{p}input_layernorm")
        if self.eager:
            e.op(f"{p}residual.grad_add", [eltwise(f"{p}residual.grad_add", "add", Tn * h, dt, rw=3.0)])
        # the TBackward0 node of each linear layer's transposed weight (qkv, attention projection, fc1, fc2)
        self._views(e, p, "residual.add_backward", *(f"{n}.t_backward" for n in ("qkv", "attn_proj", "fc1", "fc2")))

    # -------------------------------------------------------------- embedding and head
    def embedding_fwd(self, e: StepEmitter, p: str = "") -> None:
        """The word (and learned position) embedding, its vocab-parallel reduce and dropout (prefix ``p``: a
        multi-token prediction depth's, which runs the same embedding module on the next tokens)."""
        T, Tn, h, dt = self.T, self.Tn, self.h, self.dt
        learned = self.spec.position == "learned"
        if self.eager:  # F.embedding, then "+ pos": two ops
            e.op(f"{p}embedding", [eltwise(f"{p}word_embedding.gather", "embedding", T * h, dt, rw=2.0)])
            if learned:
                e.op(f"{p}position_embedding", [eltwise(f"{p}position_embedding.add", "add", T * h, dt, rw=3.0)])
        else:
            e.op(f"{p}embedding", [eltwise(f"{p}word_embedding.gather", "embedding", T * h, dt, rw=2.0)]
                 + ([eltwise(f"{p}position_embedding.add", "add", T * h, dt, rw=3.0)] if learned else []))
        self._tp_reduce_out(e, f"{p}embedding.vocab_parallel_reduce")
        if self.spec.has_dropout:
            e.op(f"{p}embedding_dropout", [eltwise(f"{p}embedding_dropout", "dropout", Tn * h, dt, rw=2.5)])

    def embedding_bwd(self, e: StepEmitter, p: str = "") -> None:
        """Backward of :meth:`embedding_fwd`."""
        T, Tn, h, dt = self.T, self.Tn, self.h, self.dt
        if self.spec.has_dropout:
            e.op(f"{p}embedding_dropout.backward", [eltwise(f"{p}embedding_dropout_bwd", "mul", Tn * h, dt, rw=2.5)])
        if self.sp:
            self.tp_collective(e, f"{p}embedding.grad_all_gather", "all_gather", T * h)
        if self.eager:
            # the position table's gradient: a sum over the batch; the token table's: eager's
            # embedding_dense_backward (sort the indices, count, index-add), then the tied output
            # layer's gradient added to it
            if self.spec.position == "learned":
                e.op(f"{p}position_embedding.backward", [eltwise(f"{p}position_embedding.grad_sum", "elementwise",
                                                                 T * h, dt, rw=1.0)])
                self._accumulate_grad(e, f"{p}position_embedding", 1)
            e.op(f"{p}embedding.backward", [eltwise(f"{p}word_embedding.sort_indices", "elementwise", T, 8, rw=4.0),
                                            eltwise(f"{p}word_embedding.count", "elementwise", T, 8, rw=2.0),
                                            eltwise(f"{p}word_embedding.grad_index_add", "embedding", T * h, dt,
                                                    rw=3.0)])
            if self.spec.tie_embeddings:
                e.op(f"{p}word_embedding.tied_grad_add", [eltwise(f"{p}word_embedding.tied_grad_add", "add",
                                                                  self.V / self.t * h, dt, rw=3.0)])
            self._accumulate_grad(e, f"{p}word_embedding", 1)
            return
        e.op(f"{p}embedding.backward", [eltwise(f"{p}word_embedding.grad_index_add", "embedding", T * h, dt, rw=3.0)])

    def head_fwd(self, e: StepEmitter, p: str = "") -> None:
        """The final norm, the output layer and the loss (prefix ``p``: a multi-token prediction depth's)."""
        T, Tn, h, t, dt, V = self.T, self.Tn, self.h, self.t, self.dt, self.V
        e.op(f"{p}final_layernorm", [eltwise(f"{p}final_layernorm", "layer_norm", Tn * h, dt, rw=2.0)])
        self._tp_gather_in(e, f"{p}lm_head_input_all_gather")
        e.op(f"{p}lm_head", [self._linear(f"{p}lm_head.mm", T, V / t, h, bias=False)])
        if self.eager and t == 1 and not self.spec.fused_loss:  # F.cross_entropy: log-softmax, then NLL
            self._views(e, p, "logits.view", "targets.view")
            e.op(f"{p}cross_entropy", [eltwise(f"{p}log_softmax", "softmax", T * V, dt, rw=2.0),
                                       eltwise(f"{p}nll_loss", "elementwise", T, 4, rw=2.0)])
            return
        e.op(f"{p}cross_entropy", [eltwise(f"{p}vocab_parallel_cross_entropy", "softmax", T * V / t, dt, rw=4.0)])
        for i in range(3 if t > 1 else 0):  # max, sum of exp, target logit over the vocab shards
            name = f"{p}cross_entropy.all_reduce[{i}]"
            e.op(name, [collective(name, "all_reduce", T * 4.0, self.lay.tp, 4)])

    def head_bwd(self, e: StepEmitter, p: str = "") -> None:
        """Backward of :meth:`head_fwd`."""
        T, h, t, dt, V = self.T, self.h, self.t, self.dt, self.V
        if self.eager and t == 1 and not self.spec.fused_loss:
            # backward() seeds the loss gradient; NLL's backward zero-fills the logits' gradient and
            # scatters into it; log-softmax's backward
            e.op(f"{p}loss.grad_seed", [eltwise(f"{p}loss.ones_like", "elementwise", 1.0, 4, rw=1.0)])
            e.op(f"{p}nll_loss.backward", [eltwise(f"{p}nll_loss_bwd.zero", "elementwise", T * V, dt, rw=1.0),
                                           eltwise(f"{p}nll_loss_bwd.scatter", "elementwise", T, 4, rw=2.0)])
            e.op(f"{p}log_softmax.backward", [eltwise(f"{p}log_softmax_bwd", "log_softmax_bwd", T * V, dt, rw=3.0)])
        else:
            e.op(f"{p}cross_entropy.backward", [eltwise(f"{p}vocab_parallel_cross_entropy_bwd", "softmax", T * V / t,
                                                        dt, rw=3.0)])
        self._views(e, p, "logits.view_backward")
        e.op(f"{p}lm_head.dgrad", [self._dgrad(f"{p}lm_head.dgrad", T, h, V / t)])
        self._input_grad_reduce(e, f"{p}lm_head", [self._wgrad(f"{p}lm_head.wgrad", V / t, h, T)])
        self._views(e, p, "lm_head.t_backward")
        self._layernorm_bwd(e, f"{p}final_layernorm")

    # -------------------------------------------------------------- multi-token prediction
    # Megatron-core's MultiTokenPredictionBlock: per depth, the next tokens' embedding (the model's embedding
    # module, on the last stage its copy of the input embedding), RMSNorms of it and of the incoming hidden state, their concatenation projected
    # 2h -> h by a column-parallel linear whose output is all-gathered over TP, one layer of the model's last
    # layer's kind, and the depth's own final norm, output layer (shared weights) and loss.
    def mtp_fwd(self, e: StepEmitter) -> None:
        """The multi-token prediction depths' forward (``spec.mtp_layers``), after the model's last layer."""
        T, Tn, h, dt = self.T, self.Tn, self.h, self.dt
        for k in range(self.spec.mtp_layers):
            p = f"mtp[{k}]."
            self.embedding_fwd(e, p)
            e.op(f"{p}norms", [eltwise(f"{p}{n}", "layer_norm", Tn * h, dt, rw=2.0) for n in ("enorm", "hnorm")])
            e.op(f"{p}concat", [eltwise(f"{p}concat", "elementwise", Tn * 2 * h, dt, rw=2.0)])
            if self.sp:
                self.tp_collective(e, f"{p}eh_proj_input_all_gather", "all_gather", T * 2 * h)
            self._fp8_cast(e, f"{p}eh_proj.fp8_cast", T * 2 * h)
            e.op(f"{p}eh_proj", [self._linear(f"{p}eh_proj.mm", T, h / self.t, 2 * h, bias=False)])
            self.tp_collective(e, f"{p}eh_proj_output_all_gather", "all_gather", T * h)
            self.layer_fwd(e, f"{p}layer.", self.spec.mtp_dense)
            self.head_fwd(e, p)

    def mtp_bwd(self, e: StepEmitter) -> None:
        """Backward of :meth:`mtp_fwd`, deepest first; the layer recomputed as the plan recomputes layer 0."""
        T, h = self.T, self.h
        for k in reversed(range(self.spec.mtp_layers)):
            p = f"mtp[{k}]."
            self.head_bwd(e, p)
            self.layer_bwd(e, f"{p}layer.", 0, self.spec.mtp_dense)
            self.tp_collective(e, f"{p}eh_proj_output_all_gather.backward", "reduce_scatter", T * h)
            self._fp8_cast(e, f"{p}eh_proj.grad_fp8_cast", T * h / self.t)
            e.op(f"{p}eh_proj.backward", [self._dgrad(f"{p}eh_proj.dgrad", T, 2 * h, h / self.t),
                                          self._wgrad(f"{p}eh_proj.wgrad", h / self.t, 2 * h, T)])
            self.tp_collective(e, f"{p}eh_proj_input_grad_reduce", "reduce_scatter" if self.sp else "all_reduce",
                               T * 2 * h)
            for n in ("enorm", "hnorm"):
                self._layernorm_bwd(e, f"{p}{n}")
            self.embedding_bwd(e, p)
