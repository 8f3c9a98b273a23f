"""A small GPT built from ``torch.nn`` whose contiguous layer ranges are pipeline *stages*.

A model has ``n_layers`` transformer blocks; layer ``i`` is block ``i``, the token and
position embeddings belong to layer 0 and the final LayerNorm, LM head and cross-entropy loss
to layer ``n_layers - 1`` (as in Alpa's GPT benchmark, where the first and last stages carry
the embedding and the head). A :class:`StageSpec` is a layer range ``first..last`` (inclusive)
of one :class:`GPTSpec` run on one device of a submesh whose intra-stage parallelism is
*emulated by shapes*:

* tensor parallelism ``tp``: Megatron's column/row split — the QKV and FC1 projections keep
  ``1/tp`` of their output columns, the attention keeps ``heads/tp`` heads, the output and
  FC2 projections ``1/tp`` of their input rows, the embedding and LM head ``vocab/tp`` rows.
  The all-reduces that real TP adds are *not* emulated (one CPU, no second device);
* data parallelism ``dp``: each device runs ``micro_batch/dp`` sequences.

:func:`stage_step_fn` returns the function whose latency a stage is: forward and backward
(gradients of every parameter and of the input activation) for one micro-batch. The same
function is traced into a graph (:mod:`predictor.stage.graph`) and timed
(:mod:`predictor.stage.dataset`), so the graph and the latency describe the same work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPTSpec", "StageSpec", "StageSpecError", "build_stage_module", "stage_inputs", "stage_step_fn"]


class StageSpecError(ValueError):
    """A stage or model spec is impossible (heads not divisible by tp, empty layer range...)."""


@dataclass(frozen=True)
class GPTSpec:
    """Shape of a GPT-style decoder: sizes are element counts, ``micro_batch`` in sequences."""

    hidden: int
    heads: int
    seq: int
    vocab: int
    n_layers: int
    micro_batch: int = 1
    ffn_mult: int = 4

    @property
    def name(self) -> str:
        """Short identifier, e.g. ``h256-a8-s128-v8192-L8-b2``."""
        return f"h{self.hidden}-a{self.heads}-s{self.seq}-v{self.vocab}-L{self.n_layers}-b{self.micro_batch}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StageSpec:
    """Layers ``first..last`` (inclusive) of ``model`` on one device with ``tp``/``dp`` emulated."""

    model: GPTSpec
    first: int
    last: int
    tp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        m = self.model
        if not 0 <= self.first <= self.last < m.n_layers:
            raise StageSpecError(f"layer range {self.first}..{self.last} is outside 0..{m.n_layers - 1}")
        if self.tp < 1 or self.dp < 1:
            raise StageSpecError(f"tp={self.tp} and dp={self.dp} must be >= 1")
        if m.hidden % m.heads:
            raise StageSpecError(f"hidden {m.hidden} is not divisible by heads {m.heads}")
        if m.heads % self.tp:
            raise StageSpecError(f"heads {m.heads} is not divisible by tp={self.tp}")
        if m.vocab % self.tp:
            raise StageSpecError(f"vocab {m.vocab} is not divisible by tp={self.tp}")
        if m.micro_batch % self.dp:
            raise StageSpecError(f"micro_batch {m.micro_batch} is not divisible by dp={self.dp}")

    @property
    def n_layers(self) -> int:
        return self.last - self.first + 1

    @property
    def has_embedding(self) -> bool:
        return self.first == 0

    @property
    def has_head(self) -> bool:
        return self.last == self.model.n_layers - 1

    @property
    def batch(self) -> int:
        """Sequences per device in one micro-batch."""
        return self.model.micro_batch // self.dp

    def to_dict(self) -> dict:
        return {
            "model": self.model.to_dict(),
            "first": self.first,
            "last": self.last,
            "tp": self.tp,
            "dp": self.dp,
        }

    @classmethod
    def from_dict(cls, d: dict) -> StageSpec:
        return cls(
            GPTSpec(**d["model"]), int(d["first"]), int(d["last"]), int(d.get("tp", 1)), int(d.get("dp", 1))
        )


class _Block(nn.Module):
    """Pre-LN transformer block holding one tensor-parallel shard of its weights."""

    def __init__(self, hidden: int, heads: int, ffn: int, tp: int) -> None:
        super().__init__()
        self.local_heads = heads // tp
        self.head_dim = hidden // heads
        local = self.local_heads * self.head_dim
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * local)
        self.proj = nn.Linear(local, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn // tp)
        self.fc2 = nn.Linear(ffn // tp, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        local = self.local_heads * self.head_dim
        q, k, v = self.qkv(self.ln1(x)).split(local, dim=-1)
        q = q.view(b, s, self.local_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.local_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.local_heads, self.head_dim).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, local))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class StageModule(nn.Module):
    """The layers of one stage; ``forward`` returns activations, or the loss on the last stage."""

    def __init__(self, spec: StageSpec) -> None:
        super().__init__()
        m, tp = spec.model, spec.tp
        self.spec = spec
        if spec.has_embedding:
            self.tok = nn.Embedding(m.vocab // tp, m.hidden)
            self.pos = nn.Embedding(m.seq, m.hidden)
        self.blocks = nn.ModuleList(
            _Block(m.hidden, m.heads, m.ffn_mult * m.hidden, tp) for _ in range(spec.n_layers)
        )
        if spec.has_head:
            self.ln_f = nn.LayerNorm(m.hidden)
            self.head = nn.Linear(m.hidden, m.vocab // tp, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.spec.has_embedding:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.tok(x) + self.pos(positions)
        for blk in self.blocks:
            x = blk(x)
        if self.spec.has_head:
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return x


def build_stage_module(spec: StageSpec, device: str | torch.device = "cpu") -> StageModule:
    """The stage's layers with randomly initialised float32 weights on ``device``."""
    with torch.device(device):
        return StageModule(spec)


def stage_inputs(
    spec: StageSpec, device: str | torch.device = "cpu", seed: int = 0
) -> dict[str, torch.Tensor]:
    """Inputs of one micro-batch: ``x`` (token ids or activations), ``targets``, ``grad_out``."""
    m = spec.model
    g = torch.Generator(device="cpu").manual_seed(seed)
    b, s = spec.batch, m.seq
    if spec.has_embedding:
        x = torch.randint(0, m.vocab // spec.tp, (b, s), generator=g)
    else:
        x = torch.randn(b, s, m.hidden, generator=g)
    x = x.to(device)
    if not spec.has_embedding:
        x.requires_grad_(True)
    out: dict[str, torch.Tensor] = {"x": x}
    if spec.has_head:
        out["targets"] = torch.randint(0, m.vocab // spec.tp, (b, s), generator=g).to(device)
    else:
        out["grad_out"] = torch.randn(b, s, m.hidden, generator=g).to(device)
    return out


def stage_step_fn(module: StageModule) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``f(params, inputs) -> (output, *grads)``: forward + backward of one micro-batch.

    ``params`` is ``dict(module.named_parameters())``. Returned: the stage's output (the
    activation sent to the next stage, or the loss on the last stage) and the gradients of the
    input activation (when the stage does not start with the embedding) and every parameter.
    """
    spec = module.spec

    def step(params: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        x = inputs["x"]
        wrt = list(params.values())
        if not spec.has_embedding:
            wrt = [x, *wrt]
        out = torch.func.functional_call(module, params, (x, inputs.get("targets")))
        grad_out = None if spec.has_head else inputs["grad_out"]
        return (out.detach(), *torch.autograd.grad(out, wrt, grad_out))

    return step
