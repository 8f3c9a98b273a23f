"""The kernels every part of a transformer step is made of, sized for one rank of a plan: linear
layers' GEMMs (forward, input and weight gradients; grouped over experts), FP8 casts, the MLP
activation, tensor-parallel collectives and the eager program's small pieces (dropout-add, layer-norm
backward, bias gradients, AccumulateGrad and view nodes).

:class:`LayerOps` holds the plan's shapes (tokens, widths, heads on this rank) and emits these onto a
:class:`~predictor.sources.synth.transformer_emitter.StepEmitter`; :class:`~predictor.sources.synth.
transformer_kernels.StepKernels` builds the layers, the embedding and the head from them. Units:
elements, bytes, seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from predictor.sources.synth.emit import Kernel, column_sum, eltwise, gemm
from predictor.sources.synth.transformer_emitter import GroupLayout, StepEmitter, collective
from predictor.sources.synth.transformer_memory import expert_param_count, layer_param_count
from predictor.sources.synth.transformer_spec import ParallelPlan, TransformerSpec

#: the compute streams Transformer Engine's grouped GEMM spreads its per-expert GEMMs over
#: (``transformer_engine/common/util/multi_stream.cpp``: ``num_compute_streams = 4``)
TE_GROUPED_GEMM_STREAMS = 4

__all__ = ["LayerOps", "TE_GROUPED_GEMM_STREAMS"]


class LayerOps:
    """A plan's shapes on one rank and the kernels a step's layers are made of (see the module docstring)."""

    def __init__(self, spec: TransformerSpec, plan: ParallelPlan, layout: GroupLayout) -> None:
        self.spec, self.plan, self.lay = spec, plan, layout
        self.dt = spec.dtype_bytes
        self.t = plan.tp
        self.sp = plan.sequence_parallel and plan.tp > 1
        self.b = plan.micro_batch
        self.s = spec.seq  # tokens of a sequence (attention reads them all)
        self.cp = plan.cp
        self.h = spec.hidden
        self.f = spec.ffn_size
        self.f1 = spec.fc1_size  # fc1's output: f, or gate and up (2 f) for SwiGLU
        self.q = spec.qkv_size  # the QKV projection's output
        self.T = float(self.b * self.s / self.cp)  # tokens of a micro-batch on this rank
        self.Tn = self.T / self.t if self.sp else self.T  # tokens seen by norms/dropouts
        self.heads_local = spec.heads // self.t
        self.d = spec.head_dim
        # the fused attention's head width: d, or with multi-latent attention the mean of the query/key and
        # value widths (FLOPs and bytes), its query/key width choosing the published rate
        self.d_core = spec.attention_core_width / 2.0 if spec.mla is not None else self.d
        self.d_rate = float(spec.mla.q_head_dim) if spec.mla is not None else self.d
        self.a = spec.attn_size  # the heads' width together (the attention projection's input)
        self.V = spec.padded_vocab(self.t)
        self.layer_params = layer_param_count(spec, self.t, plan.ep, expert_tp=plan.etp)
        self.dense_layer_params = layer_param_count(spec, self.t, plan.ep, dense=True, expert_tp=plan.etp)
        self.eager = spec.program == "eager"
        self.expert_params = expert_param_count(spec, plan.ep, plan.etp)
        #: traffic classes on the NICs while the TP collectives now emitted run: ``layout.tp_share`` inside
        #: the backward that overlaps the data-parallel buckets (:meth:`sharing_nics`), else 1
        self.tp_share = 1.0

    @contextmanager
    def sharing_nics(self) -> Iterator[None]:
        """TP collectives emitted inside this block share the NICs with the data-parallel buckets."""
        self.tp_share = self.lay.tp_share
        try:
            yield
        finally:
            self.tp_share = 1.0

    # -------------------------------------------------------------- collectives
    def tp_collective(self, e: StepEmitter, name: str, kind: str, elems: float) -> list[int]:
        if self.t <= 1:
            return []
        return e.op(name, [collective(name, kind, elems * self.dt, self.lay.tp, self.dt, self.tp_share)])


    def _activation(self, e: StepEmitter, p: str, gelu: str, elems: float) -> None:
        """The MLP's activation over ``elems`` outputs: op ``p + gelu`` (bias + GeLU: reads 1, writes 1
        element each) or, for SwiGLU, ``p + "swiglu"``: ``silu(gate) * up`` (reads 2, writes 1) fused, or
        eager's ``F.silu(gate)`` and the multiply (reads 3, writes 2)."""
        if self.spec.mlp == "swiglu" and self.eager:
            e.op(f"{p}swiglu.silu", [eltwise(f"{p}swiglu.silu", "gelu", elems, self.dt, rw=2.0)])
            e.op(f"{p}swiglu.mul", [eltwise(f"{p}swiglu.mul", "mul", elems, self.dt, rw=3.0)])
        elif self.spec.mlp == "swiglu":
            e.op(f"{p}swiglu", [eltwise(f"{p}swiglu", "gelu", elems, self.dt, rw=3.0)])
        else:
            e.op(f"{p}{gelu}", [eltwise(f"{p}{gelu}", "gelu", elems, self.dt, rw=2.0)])

    def _activation_bwd(self, e: StepEmitter, p: str, gelu: str, elems: float) -> None:
        """The activation's backward: GeLU's reads input and gradient, writes one; SwiGLU's reads gate,
        up and the output gradient and writes the gradients of gate and up."""
        name = f"{p}swiglu" if self.spec.mlp == "swiglu" else f"{p}{gelu}"
        if self.spec.mlp == "swiglu" and self.eager:  # the multiply's two input gradients, then silu's
            e.op(f"{name}.mul.backward", [eltwise(f"{name}.mul_bwd_up", "mul", elems, self.dt, rw=3.0),
                                          eltwise(f"{name}.mul_bwd_gate", "mul", elems, self.dt, rw=3.0)])
            e.op(f"{name}.silu.backward", [eltwise(f"{name}.silu_bwd", "gelu_bwd", elems, self.dt, rw=3.0)])
            return
        rw = 5.0 if self.spec.mlp == "swiglu" else 3.0
        e.op(f"{name}.backward", [eltwise(f"{name}_bwd", "gelu_bwd", elems, self.dt, rw=rw)])


    # -------------------------------------------------------------- GEMMs
    # Shapes as PyTorch (and Megatron) run them: a linear layer's forward is x @ W.t(), its input
    # gradient grad @ W, its weight gradient grad.t() @ x ([out x tokens] @ [tokens x in]). The
    # eager program names the ATen op (addmm with a bias, else mm; bmm), Megatron's program "gemm".
    def _op(self, eager_op: str) -> str:
        return eager_op if self.eager else "gemm"

    def _linear(self, name: str, rows: float, out: float, inp: float, *, bias: bool = True,
                batch: float = 1.0) -> Kernel:
        """Forward of a linear layer ``inp -> out`` on ``rows`` tokens (``batch`` experts: grouped)."""
        with_bias = bias and self.spec.bias
        op = "bmm" if batch != 1.0 else ("addmm" if with_bias else "mm")
        if not with_bias and name.endswith(".addmm"):  # named after the ATen op it runs
            name = name.removesuffix(".addmm") + ".mm"
        return gemm(name, rows, out, inp, self._linear_dt(name), batch=batch, op=self._op(op),
                    streams=self._grouped_streams(batch))

    def _dgrad(self, name: str, rows: float, inp: float, out: float, *, batch: float = 1.0) -> Kernel:
        """Input gradient of a linear layer ``inp -> out``: ``grad @ W``."""
        return gemm(name, rows, inp, out, self._linear_dt(name), batch=batch, op=self._op("bmm" if batch != 1.0 else "mm"),
                    streams=self._grouped_streams(batch))

    def _wgrad(self, name: str, out: float, inp: float, rows: float, *, batch: float = 1.0) -> Kernel:
        """Weight gradient of a linear layer ``inp -> out``: ``grad.t() @ x``."""
        return gemm(name, out, inp, rows, self._linear_dt(name), batch=batch, op=self._op("bmm" if batch != 1.0 else "mm"),
                    streams=self._grouped_streams(batch), k_strided=True)

    def _grouped_streams(self, experts: float) -> int | None:
        """How many of the local experts' GEMMs run at a time (None: one batched kernel). Grouped
        (``moe.grouped_gemm``): the megatron program's Transformer Engine ``GroupedLinear`` issues one cuBLAS
        GEMM per expert, round-robin on its 4 compute streams (``nvte_multi_stream_cublas_gemm``, TE 2.7-2.9;
        its CUTLASS grouped kernel only on request); eager's ``torch._grouped_mm`` is one kernel. Otherwise
        one expert after another (Megatron's ``SequentialMLP``, torchtitan's loop)."""
        if experts <= 1 or self.spec.moe is None:
            return None
        if not self.spec.moe.grouped_gemm:
            return 1
        return None if self.eager else TE_GROUPED_GEMM_STREAMS

    def _fp8_cast(self, e: StepEmitter, name: str, elements: float) -> None:
        """``fp8_linear``: Transformer Engine's cast-transpose of a linear layer's input (forward) or output
        gradient (backward): reads the 16-bit tensor, writes its fp8 copy and the fp8 transpose the
        other GEMM reads (2 + 1 + 1 bytes per element)."""
        if self.spec.fp8_linear:
            e.op(name, [eltwise(name, "elementwise", elements, 2, rw=2.0)])

    def _linear_dt(self, name: str) -> int:
        """Bytes per GEMM input of a linear layer: 1 for a layer's linears under ``fp8_linear``."""
        if self.spec.fp8_linear and "lm_head" not in name and ".router" not in name:
            return 1
        return self.dt

    def _bmm(self, name: str, m: float, n: float, k: float, batch: float) -> Kernel:
        """An attention GEMM per (sample, head)."""
        return gemm(name, m, n, k, self.dt, batch=batch, op=self._op("bmm"))

    # -------------------------------------------------------------- eager-program pieces
    def _dropout_add(self, e: StepEmitter, name: str) -> None:
        """The output dropout and the residual add: one fused kernel, or eager's two ops; without dropout
        (``spec.dropout == 0``) the fused kernel adds and writes no mask, and eager runs the add alone."""
        Tn, h, dt = self.Tn, self.h, self.dt
        if not self.eager:
            if self.spec.has_dropout:
                e.op(name, [eltwise(name, "dropout", Tn * h, dt, rw=3.5)])
            else:
                e.op(name, [eltwise(name, "add", Tn * h, dt, rw=3.0)])
            return
        if self.spec.has_dropout:
            e.op(f"{name}.dropout", [eltwise(f"{name}.dropout", "dropout", Tn * h, dt, rw=2.5)])
        e.op(f"{name}.residual_add", [eltwise(f"{name}.residual_add", "add", Tn * h, dt, rw=3.0)])

    def _layernorm_bwd(self, e: StepEmitter, name: str) -> None:
        """Layer-norm backward: Megatron's fused kernel, or eager's input-gradient kernel plus the
        weight/bias gradient partials and their reduction (and two AccumulateGrad ops)."""
        Tn, h, dt = self.Tn, self.h, self.dt
        if not self.eager:
            e.op(f"{name}.backward", [eltwise(f"{name}_bwd", "layer_norm", Tn * h, dt, rw=4.0)])
            return
        e.op(f"{name}.backward", [eltwise(f"{name}_bwd", "layer_norm", Tn * h, dt, rw=3.0),
                                  eltwise(f"{name}_bwd.gamma_beta", "elementwise", Tn * h, dt, rw=2.0),
                                  eltwise(f"{name}_bwd.reduce", "elementwise", 64.0 * h, 4, rw=1.0)])
        self._accumulate_grad(e, name, 2)

    def _bias_grad(self, name: str, rows: float, n: float) -> list[Kernel]:
        """Eager ``AddmmBackward``'s bias gradient: a column sum of the output gradient (none without biases)."""
        return [column_sum(f"{name}.bias_grad", rows, n, self.dt)] if self.eager and self.spec.bias else []

    def _accumulate_grad(self, e: StepEmitter, name: str, tensors: int) -> None:
        """Eager autograd's AccumulateGrad per parameter tensor: host work, no kernel (gradients set to
        None before backward are taken over, not added); a kernel-less node on a device, a T1 gap on a CPU."""
        if self.eager:
            for i in range(tensors):
                if e.mode == "device":
                    e.node(f"{name}.accumulate_grad[{i}]")
                else:
                    e.op(f"{name}.accumulate_grad[{i}]", [])

    def _views(self, e: StepEmitter, p: str, *names: str) -> None:
        """Device mode, eager program: view ops and the autograd nodes of views (no kernel; T1 + T3 each,
        :meth:`OpEmitter.node`). The CPU graphs keep them inside their T's."""
        if self.eager:
            for n in names:
                e.node(f"{p}{n}")
