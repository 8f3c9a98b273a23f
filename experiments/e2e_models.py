"""The workloads of :mod:`experiments.e2e_cpu`: the real training programs it measures and their predictions.

* the specs and batch sizes of the three models (:data:`MLP`, :data:`GPT`, the DLRM task of
  :data:`DLRM_TASK`);
* the programs trained for real: :func:`mlp_step` (``nn.Sequential``, SGD), :func:`gpt_step`
  (:class:`GPTModel`, fused Adam), the DLRM job of :func:`dlrm_job` (:mod:`experiments.dlrm_gloo`);
* their predicted graphs (the synthesisers in host mode: :func:`row_graph`, :func:`gpt_graph`,
  :func:`dlrm_spec_for`) and simulation (:func:`predict_graph`);
* the rows to measure (:class:`Case`, :func:`build_cases`) and every configuration's prediction
  (:func:`predict_rows`, what ``--rescore`` scores).
"""

from __future__ import annotations

import dataclasses
import math
import time
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from experiments.dlrm_gloo import DLRMJobSpec, batch_reuse_histogram, measure_dlrm, table_batch
from experiments.measure_env import Measured
from predictor.simulate import simulate
from predictor.sources.synth.dlrm import DLRMSpec, build_dlrm_graph
from predictor.sources.synth.dlrm_tables import EmbeddingTables, generate_tasks
from predictor.sources.synth.mlp import MLPSpec, build_mlp_graph
from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec, build_transformer_graph
from predictor.timing.platforms.host import comm_thread_has_core
from tuner.sharders import get_sharder

# ----------------------------------------------------------------------------- the workloads
#: MLP: 512 features -> 3 x 1024 -> 10 classes
MLP = MLPSpec(input_dim=512, hidden=(1024, 1024, 1024), classes=10, batch_size=1, label="mlp-512-3x1024-10")
MLP_BATCHES = (64, 256, 1024)
#: a small GPT: 2 layers, hidden 256, 4 heads, 128 tokens, vocabulary 2048 (unfused attention, fp32)
GPT = TransformerSpec(layers=2, hidden=256, heads=4, seq=128, vocab=2048, dtype="fp32", attention="unfused",
                      name="gpt-2l-256h-4a-128s-2048v")
GPT_BATCHES = (2, 4, 8)
GPT_DROPOUT = 0.1
#: DLRM: one "normal" task of the sharding experiment's generator (Lin et al. 2024 §IV-B1),
#: the sharding experiment's MLPs
DLRM_TASK = {"n_gpus": 2, "n_tasks": 4, "seed": 3, "index": 1, "table_memory_gib": 0.5}
DLRM_BOTTOM = (256, 128, 64)
DLRM_TOP = (256, 128, 1)
DLRM_BATCHES = {1: (256, 1024, 4096), 2: (256, 1024, 4096)}
DLRM_SHARDER = "size_lookup_greedy"


# ----------------------------------------------------------------------------- real models
def mlp_module(spec: MLPSpec) -> nn.Sequential:
    """``spec`` as ``nn.Sequential`` (Linear, activation, ..., Linear)."""
    act = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}[spec.activation]
    mods: list[nn.Module] = []
    layers = spec.layers()
    for li, (_, i, o) in enumerate(layers):
        mods.append(nn.Linear(i, o))
        if li < len(layers) - 1:
            mods.append(act())
    return nn.Sequential(*mods)


@dataclass(frozen=True)
class StepParts:
    """One training step's pieces: ``zero_grad``, ``forward`` (through the loss, which it returns) and
    ``optimizer`` (what follows ``loss.backward()``). Calling it runs the whole step."""

    zero_grad: Callable[[], None]
    forward: Callable[[], torch.Tensor]
    optimizer: Callable[[], None]

    def __call__(self) -> None:
        self.zero_grad()
        self.forward().backward()
        self.optimizer()


def mlp_step(spec: MLPSpec, seed: int = 0, device: str | torch.device = "cpu") -> StepParts:
    """One SGD training step of ``spec`` on a fixed random batch on ``device`` (a callable)."""
    torch.manual_seed(seed)
    model = mlp_module(spec).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(spec.batch_size, spec.input_dim, device=device)
    y = torch.randint(0, spec.classes, (spec.batch_size,), device=device) if spec.loss == "cross_entropy" else \
        torch.randn(spec.batch_size, spec.classes, device=device)
    loss_fn = F.cross_entropy if spec.loss == "cross_entropy" else F.mse_loss
    return StepParts(zero_grad=lambda: opt.zero_grad(set_to_none=True), forward=lambda: loss_fn(model(x), y),
                     optimizer=opt.step)


class _Block(nn.Module):
    """One decoder layer, op for op as the transformer synthesiser's layer (tp = 1, unfused attention)."""

    def __init__(self, h: int, heads: int, ffn: int, p: float) -> None:
        super().__init__()
        self.h, self.heads, self.p = h, heads, p
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, ffn)
        self.fc2 = nn.Linear(ffn, h)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, b: int, s: int) -> torch.Tensor:
        h, nh = self.h, self.heads
        d = h // nh
        qkv = self.qkv(self.ln1(x))  # (b s, 3h)
        q, k, v = qkv.view(b, s, 3, nh, d).permute(2, 0, 3, 1, 4).reshape(3, b * nh, s, d).unbind(0)
        scores = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=1.0 / math.sqrt(d))  # scaled, causal mask
        probs = F.dropout(torch.softmax(scores, dim=-1), self.p, self.training)
        ctx = torch.bmm(probs, v).view(b, nh, s, d).transpose(1, 2).reshape(b * s, h)
        x = x + F.dropout(self.proj(ctx), self.p, self.training)
        y = self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x + F.dropout(y, self.p, self.training)


class GPTModel(nn.Module):
    """A GPT-style decoder of :class:`TransformerSpec` size (tied embeddings, learned positions)."""

    def __init__(self, spec: TransformerSpec, p: float = GPT_DROPOUT) -> None:
        super().__init__()
        self.spec, self.p = spec, p
        self.tok = nn.Parameter(torch.randn(spec.vocab, spec.hidden) * 0.02)
        self.pos = nn.Parameter(torch.randn(spec.seq, spec.hidden) * 0.02)
        self.blocks = nn.ModuleList(_Block(spec.hidden, spec.heads, spec.ffn_size, p) for _ in range(spec.layers))
        self.ln_f = nn.LayerNorm(spec.hidden)
        mask = torch.full((spec.seq, spec.seq), float("-inf")).triu(1)
        self.register_buffer("mask", mask)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        b, s = idx.shape
        h = self.spec.hidden
        x = (F.embedding(idx, self.tok) + self.pos).view(b * s, h)
        x = F.dropout(x, self.p, self.training)
        for blk in self.blocks:
            x = blk(x, self.mask, b, s)
        logits = F.linear(self.ln_f(x), self.tok)  # tied output layer
        return F.cross_entropy(logits, targets.view(-1))


def gpt_step(spec: TransformerSpec, batch: int, seed: int = 0, device: str | torch.device = "cpu") -> StepParts:
    """One training step (forward, backward, gradient norm, fused Adam) on a fixed batch on ``device``
    (a callable). Parameters and activations in ``spec.dtype`` (fp32, or bf16 / fp16 throughout)."""
    torch.manual_seed(seed)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[spec.dtype]
    model = GPTModel(spec).train().to(device=device, dtype=dtype)
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=1e-4, fused=True)
    idx = torch.randint(0, spec.vocab, (batch, spec.seq), device=device)
    tgt = torch.randint(0, spec.vocab, (batch, spec.seq), device=device)

    def optimizer() -> None:
        torch.nn.utils.get_total_norm([p.grad for p in params])  # Megatron's gradient norm (clipping)
        opt.step()

    return StepParts(zero_grad=lambda: opt.zero_grad(set_to_none=True), forward=lambda: model(idx, tgt),
                     optimizer=optimizer)


def dlrm_tables(batch: int) -> EmbeddingTables:
    """The DLRM rows' embedding tables (see :data:`DLRM_TASK`), reuse profiles for ``batch`` samples."""
    t = DLRM_TASK
    tasks = generate_tasks(int(t["n_gpus"]), n_tasks=int(t["n_tasks"]), seed=int(t["seed"]),
                           device_memory_bytes=float(t["table_memory_gib"]) * 2**30, batch_size=batch)
    return tasks[int(t["index"])]


def dlrm_job(tables: EmbeddingTables, batch: int, n_ranks: int, threads: int, warmup: int, iters: int,
             batch_pool: int = 2) -> DLRMJobSpec:
    """The measured DLRM job (index batches drawn to the tables' reuse profiles, ``batch_pool`` of them
    cycled: :attr:`~experiments.dlrm_gloo.DLRMJobSpec.batch_pool`); tables placed by :data:`DLRM_SHARDER`
    on 2 ranks."""
    if n_ranks > 1:
        a = get_sharder(DLRM_SHARDER).shard(tables, n_ranks, float("inf"), rng=np.random.default_rng(0))
    else:
        a = np.zeros(len(tables), dtype=np.int64)
    reuse = tuple(tuple(float(v) for v in row) for row in tables.reuse) if tables.reuse is not None else ()
    return DLRMJobSpec(rows=tuple(int(x) for x in tables.rows), dim=tuple(int(x) for x in tables.dim),
                       pooling=tuple(float(x) for x in tables.pooling), assignment=tuple(int(x) for x in a),
                       n_ranks=n_ranks, batch_size=batch, bottom_mlp=DLRM_BOTTOM, top_mlp=DLRM_TOP,
                       warmup=warmup, iters=iters, threads=threads, seed=batch, reuse=reuse, batch_pool=batch_pool)


def dlrm_spec_for(job: DLRMJobSpec, tables: EmbeddingTables) -> DLRMSpec:
    """The predictor's spec of ``job``: the tables with the reuse factors of the job's real batches."""
    rf = np.stack([batch_reuse_histogram(table_batch(job, t, 0)[0]) for t in range(len(tables))])
    tt = EmbeddingTables(rows=tables.rows, dim=tables.dim, pooling=tables.pooling, reuse=rf, label=tables.label)
    return DLRMSpec(tables=tt, batch_size=job.batch_size, bottom_mlp=job.bottom_mlp, top_mlp=job.top_mlp)


# ----------------------------------------------------------------------------- predictions
def predict_graph(graph, timing) -> tuple[float, float]:
    """(predicted iteration, kernel-sum baseline), seconds."""
    tl = simulate(graph, timing)
    return float(tl.iteration_s), float(tl.kernel_sum_s())


def row_graph(model: str, batch: int):
    """The host-mode graph of the ``"mlp"`` or ``"gpt"`` row at ``batch`` (:data:`MLP`, :data:`GPT`)."""
    if model == "mlp":
        return build_mlp_graph(dataclasses.replace(MLP, batch_size=batch), mode="host")
    return gpt_graph(GPT, batch)


def gpt_graph(spec: TransformerSpec, batch: int, program: str = "eager"):
    """The transformer synthesiser's host-mode graph of one iteration at ``batch`` sequences.

    ``program="eager"``: plain PyTorch's kernels (what :class:`GPTModel` runs: separate dropout and
    residual adds, reshape copies, log-softmax + NLL, AccumulateGrad); ``"megatron"``: Megatron's
    fused program (the e2e figures before 2026-11-23 used it; it predicted these rows within 1 %
    of the eager program with the packs of the day).
    """
    return build_transformer_graph(dataclasses.replace(spec, program=program),
                                   ParallelPlan(micro_batch=batch, global_batch=batch), detail="kernel", mode="host")


# ----------------------------------------------------------------------------- measurement
def time_steps(step: Callable[[], None], warmup: int, iters: int) -> list[float]:
    """Seconds of each of ``iters`` calls of ``step`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


@dataclass
class Case:
    """One row to measure: its prediction and a function running one measured pass."""

    model: str
    config: str
    batch: int
    ranks: int
    predicted: tuple[float, float]
    run: Callable[[], list[float]]
    passes: list[Measured] = field(default_factory=list)
    graph: object = None  #: DLRM rows: the predicted graph (for the cold-embedding diagnosis)
    job: DLRMJobSpec | None = None
    cold_embedding_s: float = float("nan")
    #: in-process rows (MLP, GPT): builds a fresh training step (for the system-time diagnosis)
    make_step: Callable[[], Callable[[], None]] | None = None
    system: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- runs
def build_cases(args, timing, threads: int) -> list[Case]:
    """Every (model, batch) row with its prediction (from the spec) and its measurement closure."""
    cases: list[Case] = []
    if "mlp" in args.models:
        for bs in args.mlp_batches:
            spec = MLPSpec(**{**asdict(MLP), "batch_size": bs})
            cases.append(Case("mlp", MLP.label, bs, 1, predict_graph(row_graph("mlp", bs), timing),
                              lambda spec=spec: time_steps(mlp_step(spec), args.warmup, args.iters),
                              make_step=lambda spec=spec: mlp_step(spec)))
    if "gpt" in args.models:
        for bs in args.gpt_batches:
            cases.append(Case("gpt", GPT.name, bs, 1, predict_graph(row_graph("gpt", bs), timing),
                              lambda bs=bs: time_steps(gpt_step(GPT, bs), args.warmup, args.iters),
                              make_step=lambda bs=bs: gpt_step(GPT, bs)))
    if "dlrm" in args.models:
        for n in args.dlrm_ranks:
            for bs in args.dlrm_batches:
                tables = dlrm_tables(bs)
                job = dlrm_job(tables, bs, n, threads, args.dlrm_warmup, args.iters, args.batch_pool)
                spec = dlrm_spec_for(job, tables)
                graph = build_dlrm_graph(spec, np.asarray(job.assignment), n, mode="host",
                                         comm_threads=comm_thread_has_core(n, threads))
                label = f"{tables.label}, {len(tables)} tables" + (f", {DLRM_SHARDER}" if n > 1 else "")
                sink: dict = {}
                cases.append(Case("dlrm" if n == 1 else f"dlrm-{n}rank", label, bs, n, predict_graph(graph, timing),
                                  lambda job=job, sink=sink: _dlrm_times(job, sink), graph=graph, job=job,
                                  system=sink))
    return cases


def _dlrm_times(job: DLRMJobSpec, system: dict | None = None) -> list[float]:
    """Per-iteration time of the job: each iteration's slowest rank. ``system`` (optional) receives the
    ranks' mean CPU accounting per iteration (:func:`experiments.dlrm_gloo.measure_dlrm`) of this run."""
    out = measure_dlrm(job)
    if system is not None:
        system.update({k: float(np.mean([r[k] for r in out["system"]])) for k in out["system"][0]})
    return [float(x) for x in np.asarray(out["times"]).max(axis=0)]


def predict_rows(timing) -> dict[tuple[str, int], float]:
    """Predicted seconds of every configuration, keyed by (model, batch), with ``timing``."""
    args = types.SimpleNamespace(models=["mlp", "gpt", "dlrm"], mlp_batches=list(MLP_BATCHES),
                                 gpt_batches=list(GPT_BATCHES), dlrm_batches=list(DLRM_BATCHES[1]),
                                 dlrm_ranks=[1, 2], warmup=1, iters=1, dlrm_warmup=1, batch_pool=2)
    return {(c.model, c.batch): float(c.predicted[0]) for c in build_cases(args, timing, 1)}
