"""Model specs for accelerator selection: an ``nn.Module`` factory, an example batch and a loss.

Built-in specs (implemented here in plain ``torch.nn``; torchvision/transformers are not
dependencies): GPT-2 1.5B, BERT-large, ResNet-50 v1.5, DLRM, MPT-style GPT sizes (for the
MosaicML throughput comparison), and small configurations that run for real on a CPU
(``gpt2-tiny``, ``bert-mini``, ``dlrm-small``, ``mlp``).

A user's own model is named ``package.module:callable``: the callable (no arguments) returns
the ``nn.Module``; the example batch comes from ``input="package.module:callable"`` (called
with the batch size, returns the model's positional arguments) or from ``input_shape`` (a
float tensor of shape ``[batch, *input_shape]``). Its loss is the mean of the first output.

Nothing here allocates when called under ``FakeTensorMode`` (see
:mod:`predictor.sources.synth.op_trace`), so the large specs are analysed without their memory.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ModelSpec", "ModelImportError", "MODEL_SPECS", "get_model_spec", "list_models", "GPTConfig"]


class ModelImportError(ValueError):
    """A model name that is neither a built-in spec nor an importable ``module:callable``."""


Batch = tuple[tuple, object]  # (positional arguments of the model, target for the loss)


@dataclass(frozen=True)
class ModelSpec:
    """How to build, feed and train one model.

    ``make_batch(b)`` returns ``(args, target)``: the model is called as ``model(*args)`` and
    the loss as ``loss(output, target)``. ``tokens_per_sample`` converts samples/s to tokens/s
    for language models (1 otherwise).
    """

    name: str
    build: Callable[[], nn.Module]
    make_batch: Callable[[int], Batch]
    loss: Callable[[object, object], torch.Tensor]
    sample_unit: str = "samples"
    tokens_per_sample: int = 1
    description: str = ""


# ----------------------------------------------------------------------------- GPT
@dataclass(frozen=True)
class GPTConfig:
    """Decoder-only transformer (GPT-2 layout: pre-LN, GELU MLP, tied embeddings)."""

    n_layer: int
    d_model: int
    n_head: int
    vocab: int = 50257
    seq: int = 1024
    bias: bool = True
    learned_pos: bool = True
    mlp_ratio: int = 4


class _CausalBlock(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        d = c.d_model
        self.n_head = c.n_head
        self.ln1 = nn.LayerNorm(d, bias=c.bias)
        self.qkv = nn.Linear(d, 3 * d, bias=c.bias)
        self.proj = nn.Linear(d, d, bias=c.bias)
        self.ln2 = nn.LayerNorm(d, bias=c.bias)
        self.fc = nn.Linear(d, c.mlp_ratio * d, bias=c.bias)
        self.out = nn.Linear(c.mlp_ratio * d, d, bias=c.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_head
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """GPT-2-style language model returning logits ``[batch, seq, vocab]``."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c.vocab, c.d_model)
        self.wpe = nn.Embedding(c.seq, c.d_model) if c.learned_pos else None
        self.blocks = nn.ModuleList(_CausalBlock(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model, bias=c.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe.weight[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))


def _gpt_spec(name: str, c: GPTConfig, description: str) -> ModelSpec:
    def batch(b: int) -> Batch:
        idx = torch.randint(0, c.vocab, (b, c.seq))
        return (idx,), idx

    return ModelSpec(name, lambda: GPT(c), batch, _lm_loss, "sequences", c.seq, description)


# ----------------------------------------------------------------------------- BERT
@dataclass(frozen=True)
class BertConfig:
    n_layer: int
    d_model: int
    n_head: int
    d_ff: int
    vocab: int = 30522
    seq: int = 512


class _EncoderBlock(nn.Module):
    """Post-LN encoder layer as in BERT."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.n_head = c.n_head
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.ln1 = nn.LayerNorm(c.d_model)
        self.fc = nn.Linear(c.d_model, c.d_ff)
        self.out = nn.Linear(c.d_ff, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_head
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = self.ln1(x + self.drop(self.proj(y)))
        return self.ln2(x + self.drop(self.out(F.gelu(self.fc(x)))))


class Bert(nn.Module):
    """BERT encoder with the masked-LM head (transform + tied decoder) over every position."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.d_model)
        self.pos = nn.Embedding(c.seq, c.d_model)
        self.typ = nn.Embedding(2, c.d_model)
        self.ln = nn.LayerNorm(c.d_model)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.ModuleList(_EncoderBlock(c) for _ in range(c.n_layer))
        self.head = nn.Linear(c.d_model, c.d_model)
        self.head_ln = nn.LayerNorm(c.d_model)
        self.decoder_bias = nn.Parameter(torch.zeros(c.vocab))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos.weight[: idx.shape[1]] + self.typ.weight[0]
        x = self.drop(self.ln(x))
        for blk in self.blocks:
            x = blk(x)
        x = self.head_ln(F.gelu(self.head(x)))
        return F.linear(x, self.tok.weight, self.decoder_bias)


def _bert_spec(name: str, c: BertConfig, description: str) -> ModelSpec:
    def batch(b: int) -> Batch:
        idx = torch.randint(0, c.vocab, (b, c.seq))
        return (idx,), idx

    return ModelSpec(name, lambda: Bert(c), batch, _lm_loss, "sequences", c.seq, description)


# ----------------------------------------------------------------------------- ResNet-50
class _Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: the stride sits on the 3x3 convolution."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    """ResNet-50 v1.5 (He et al. 2016, NVIDIA's v1.5 stride placement), 1000 classes."""

    def __init__(self, classes: int = 1000, layers: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
        blocks: list[nn.Module] = []
        cin = 64
        for i, n in enumerate(layers):
            width = 64 * 2**i
            for j in range(n):
                blocks.append(_Bottleneck(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * 4
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _resnet_spec(name: str, image: int, description: str) -> ModelSpec:
    def batch(b: int) -> Batch:
        return (torch.randn(b, 3, image, image),), torch.randint(0, 1000, (b,))

    return ModelSpec(name, ResNet50, batch, lambda out, y: F.cross_entropy(out.float(), y), "images", 1, description)


# ----------------------------------------------------------------------------- DLRM
@dataclass(frozen=True)
class DLRMConfig:
    tables: tuple[int, ...]  # rows per table
    dim: int
    dense: int = 13
    bottom: tuple[int, ...] = (512, 256)
    top: tuple[int, ...] = (1024, 1024, 512, 256)
    pooling: int = 1


def _mlp(sizes: list[int], last_act: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_act:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """DLRM (Naumov et al. 2019): bottom MLP, sum-pooled embedding bags, pairwise dot interaction, top MLP."""

    def __init__(self, c: DLRMConfig) -> None:
        super().__init__()
        self.bottom = _mlp([c.dense, *c.bottom, c.dim], last_act=True)
        self.emb = nn.ModuleList(nn.EmbeddingBag(rows, c.dim, mode="sum") for rows in c.tables)
        n = len(c.tables) + 1
        self.pairs = n * (n - 1) // 2
        self.top = _mlp([c.dim + self.pairs, *c.top, 1], last_act=False)
        iu = torch.triu_indices(n, n, offset=1)
        self.register_buffer("iu", iu[0] * n + iu[1], persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        feats = [x] + [e(sparse[:, i]) for i, e in enumerate(self.emb)]
        t = torch.stack(feats, dim=1)  # [b, n, d]
        z = torch.bmm(t, t.transpose(1, 2)).flatten(1)[:, self.iu]
        return self.top(torch.cat([x, z], dim=1)).squeeze(1)


def _dlrm_spec(name: str, c: DLRMConfig, description: str) -> ModelSpec:
    def batch(b: int) -> Batch:
        sparse = torch.randint(0, min(c.tables), (b, len(c.tables), c.pooling))
        return (torch.randn(b, c.dense), sparse), torch.rand(b)

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(out.float(), y)

    return ModelSpec(name, lambda: DLRM(c), batch, loss, "samples", 1, description)


# ----------------------------------------------------------------------------- MLP
def _mlp_spec(name: str, width: int, depth: int, features: int, classes: int, description: str) -> ModelSpec:
    def build() -> nn.Module:
        return _mlp([features] + [width] * depth + [classes], last_act=False)

    def batch(b: int) -> Batch:
        return (torch.randn(b, features),), torch.randint(0, classes, (b,))

    return ModelSpec(name, build, batch, lambda out, y: F.cross_entropy(out.float(), y), "samples", 1, description)


# ----------------------------------------------------------------------------- registry
#: MPT model sizes of MosaicML's llm-foundry (scripts/train/yamls/pretrain/mpt-*.yaml):
#: (d_model, n_layers, n_heads); vocab 50368, no biases, ALiBi (no learned positions)
MPT_SIZES: dict[str, tuple[int, int, int]] = {
    "125m": (768, 12, 12),
    "350m": (1024, 24, 16),
    "760m": (1536, 24, 12),
    "1b": (2048, 24, 16),
    "3b": (2560, 32, 20),
    "7b": (4096, 32, 32),
    "13b": (5120, 40, 40),
    "30b": (7168, 48, 64),
    "70b": (8192, 80, 64),
}


def mpt_spec(size: str, seq: int = 2048) -> ModelSpec:
    """An MPT-style GPT (llm-foundry layout) of one of :data:`MPT_SIZES` at sequence length ``seq``."""
    d, n_layer, heads = MPT_SIZES[size]
    c = GPTConfig(n_layer=n_layer, d_model=d, n_head=heads, vocab=50368, seq=seq, bias=False, learned_pos=False)
    return _gpt_spec(f"mpt-{size}", c, f"MPT-{size} layout (d={d}, L={n_layer}, heads={heads}, seq={seq})")


def _registry() -> dict[str, ModelSpec]:
    specs = [
        _gpt_spec("gpt2-1.5b", GPTConfig(48, 1600, 25), "GPT-2 XL, 1.56B parameters, seq 1024"),
        _gpt_spec("gpt2-small", GPTConfig(12, 768, 12), "GPT-2 small, 124M parameters, seq 1024"),
        _gpt_spec("gpt2-tiny", GPTConfig(4, 256, 4, vocab=8192, seq=128), "4-layer GPT, d=256, seq 128 (CPU-sized)"),
        _bert_spec("bert-large", BertConfig(24, 1024, 16, 4096), "BERT-large, 335M parameters, seq 512, MLM head"),
        _bert_spec("bert-base", BertConfig(12, 768, 12, 3072), "BERT-base, 110M parameters, seq 512, MLM head"),
        _bert_spec("bert-mini", BertConfig(4, 256, 4, 1024, vocab=8192, seq=128), "4-layer BERT, d=256, seq 128 (CPU-sized)"),
        _resnet_spec("resnet50", 224, "ResNet-50 v1.5, 25.6M parameters, 224x224 images"),
        _resnet_spec("resnet50-64px", 64, "ResNet-50 v1.5 on 64x64 images (CPU-sized)"),
        _dlrm_spec("dlrm", DLRMConfig(tables=(1_000_000,) * 26, dim=128),
                   "DLRM, 26 tables x 1M rows x 128, MLPerf-style MLPs"),
        _dlrm_spec("dlrm-small", DLRMConfig(tables=(100_000,) * 8, dim=64, bottom=(256, 128), top=(512, 256)),
                   "DLRM, 8 tables x 100k rows x 64 (CPU-sized)"),
        _mlp_spec("mlp", 2048, 4, 1024, 1000, "MLP, 4 hidden layers of 2048"),
    ]
    return {s.name: s for s in specs}


MODEL_SPECS: dict[str, ModelSpec] = _registry()


def list_models() -> list[str]:
    """Names of the built-in specs (plus ``mpt-<size>``)."""
    return sorted(MODEL_SPECS) + [f"mpt-{s}" for s in MPT_SIZES]


def get_model_spec(
    name: str,
    *,
    input: str | None = None,  # noqa: A002 - the YAML field's name
    input_shape: list[int] | None = None,
) -> ModelSpec:
    """A built-in spec by name, or a user's ``module:callable`` model.

    Raises:
        ModelImportError: unknown name, a module that does not import, a missing attribute,
            or a user model without an example input.
    """
    key = name.strip()
    if key.lower() in MODEL_SPECS:
        return MODEL_SPECS[key.lower()]
    if key.lower().startswith("mpt-") and key.lower()[4:] in MPT_SIZES:
        return mpt_spec(key.lower()[4:])
    if ":" not in key:
        raise ModelImportError(
            f"unknown model {name!r}; built-in: {', '.join(list_models())}, or give 'package.module:callable'"
        )
    build = _import_callable(key, "model")
    if input is not None:
        make_args = _import_callable(input, "input")

        def batch(b: int) -> Batch:
            args = make_args(b)
            return (args if isinstance(args, tuple) else (args,)), None
    elif input_shape:
        shape = [int(x) for x in input_shape]

        def batch(b: int) -> Batch:
            return (torch.randn(b, *shape),), None
    else:
        raise ModelImportError(f"model {name!r}: give 'input: module:callable' or 'input_shape: [...]' for its example batch")

    def loss(out: object, _target: object) -> torch.Tensor:
        first = next((t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)), None)
        if first is None:
            raise TypeError("the model returned no tensor")
        return first.float().mean()

    return ModelSpec(key, build, batch, loss, "samples", 1, f"user model {key}")


def _import_callable(target: str, what: str) -> Callable:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ModelImportError(f"{what}: {target!r} is not of the form 'package.module:callable'")
    cwd = os.getcwd()
    if cwd not in sys.path:  # `tuner` is a console script: let `mymodels:make` import from the working folder
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module raising while it imports
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ModelImportError(f"{what}: cannot import {module_name!r} ({type(exc).__name__}: {msg})") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ModelImportError(f"{what}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ModelImportError(f"{what}: {target!r} is not callable")
    return obj


def parameter_count(spec: ModelSpec) -> int:
    """Parameters of a spec's model, counted under fake tensors (nothing allocated)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = spec.build()
        return int(sum(p.numel() for p in model.parameters()))

