"""One training iteration of an ``nn.Module`` in a given precision, under fake tensors or for real.

:class:`TrainingLoop` is the code :func:`predictor.sources.synth.op_trace.trace_training_step`
records and :func:`predictor.memory.measure_training_peak` measures, so the trace and the
measurement run the same program.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from predictor.sources.synth.opgraph import PRECISIONS, Phase, TraceError

__all__ = ["TrainingLoop"]


class TrainingLoop:
    """One training iteration of ``model`` in a given precision: the same code runs under fake
    tensors (tracing) and for real (the measurements that validate the trace).

    ``precision``: ``fp32``; ``bf16``/``fp16`` = low-precision weights and activations with
    fp32 master weights, master gradients and optimizer state (the mixed-precision recipe of
    Micikevicius et al. that Megatron and DeepSpeed use); ``amp_bf16``/``amp_fp16`` =
    ``torch.autocast`` around forward and loss (fp32 weights, low-precision copies cached per
    iteration). ``optimizer``: ``adamw``, ``adam``, ``sgd`` (momentum 0.9) or ``none``.
    """

    def __init__(
        self,
        model: nn.Module,
        make_batch: Callable[[int], tuple[tuple, object]],
        loss_fn: Callable[[object, object], torch.Tensor],
        batch: int,
        *,
        precision: str = "fp32",
        optimizer: str = "adamw",
        on_phase: Callable[[Phase], None] | None = None,
    ) -> None:
        if precision not in PRECISIONS:
            raise TraceError(f"precision must be one of {', '.join(PRECISIONS)} (got {precision!r})")
        self.precision = precision
        self.on_phase = on_phase or (lambda p: None)
        low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        if low is not None:
            _cast_floating(model, low)
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master: list[torch.Tensor] = []
        if low is not None:
            self.master = [p.detach().float() for p in self.params]
            for m in self.master:
                m.requires_grad_(True)
        self.amp_dtype = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}.get(precision)
        opt_params = self.master or self.params
        self.optimizer = _make_optimizer(optimizer, opt_params)
        args, self.target = make_batch(batch)
        args = args if isinstance(args, tuple) else (args,)
        if low is not None:  # low-precision weights take low-precision floating inputs
            args = tuple(a.to(low) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        self.inputs = args
        self.loss_fn = loss_fn

    def step(self) -> None:
        """zero_grad, forward + loss, backward, optimizer step (phases reported to ``on_phase``)."""
        self.on_phase(Phase.OTHER)
        for p in self.params:
            p.grad = None
        for m in self.master:
            m.grad = None
        self.on_phase(Phase.FORWARD)
        ctx = torch.autocast("cpu", dtype=self.amp_dtype) if self.amp_dtype is not None else contextlib.nullcontext()
        with ctx:
            out = self.model(*self.inputs)
            loss = self.loss_fn(out, self.target)
        del out
        self.on_phase(Phase.BACKWARD)
        loss.backward()
        del loss
        self.on_phase(Phase.OPTIMIZER)
        if self.master:
            with torch.no_grad():
                for p, m in zip(self.params, self.master, strict=True):
                    m.grad = None if p.grad is None else p.grad.float()
        if self.optimizer is not None:
            self.optimizer.step()
        if self.master:
            with torch.no_grad():
                for p, m in zip(self.params, self.master, strict=True):
                    p.copy_(m)
                    m.grad = None
        self.on_phase(Phase.OTHER)

    def state_tensors(self) -> Iterator[torch.Tensor]:
        """Optimizer state tensors (after at least one step)."""
        if self.optimizer is None:
            return
        for st in self.optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    yield v


def _cast_floating(model: nn.Module, dtype: torch.dtype) -> None:
    """``model.to(dtype)`` for floating parameters and buffers, without swapping tensor subclasses.

    (``Module.to`` swaps the parameter objects of tensor subclasses such as fake tensors,
    which fails; rebinding new Parameters works for real and fake tensors alike, and keeps
    tied weights tied.)
    """
    memo: dict[int, nn.Parameter] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or not p.is_floating_point():
                continue
            if id(p) not in memo:
                memo[id(p)] = nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
            mod._parameters[name] = memo[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is not None and b.is_floating_point():
                mod._buffers[name] = b.to(dtype)


def _make_optimizer(name: str, params: list[torch.Tensor]) -> torch.optim.Optimizer | None:
    if name == "none" or not params:
        return None
    # foreach/fused off: the per-parameter loop is the default on CPU and what the trace times
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=False)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=False)
    raise TraceError(f"optimizer must be adamw, adam, sgd or none (got {name!r})")

