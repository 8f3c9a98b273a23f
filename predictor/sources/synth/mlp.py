"""Plain multi-layer perceptron training -> ExecutionGraph, and the linear-layer op helpers of eager PyTorch.

:class:`MLPSpec` is an ``nn.Sequential`` of ``nn.Linear`` layers with an activation between
them, trained with cross-entropy (or MSE) and SGD; :func:`build_mlp_graph` emits one training
iteration the way eager PyTorch runs it (op by op, see :mod:`predictor.sources.synth.emit`):

forward
    per layer ``addmm`` (``F.linear`` with a bias on a 2-D input: ``m = batch, n = out,
    k = in``) and the activation (not after the last layer); the loss.
backward (autograd, last layer first)
    loss backward; per layer the activation's backward, then ``AddmmBackward0``: the input
    gradient ``grad @ W`` (``mm``, ``m = batch, n = in, k = out``; skipped for the first layer,
    whose input needs no gradient), the weight gradient ``input^T @ grad`` (``mm``,
    ``m = in, n = out, k = batch``) and the bias gradient (a sum over the batch).
optimizer
    ``torch.optim.SGD`` on CPU runs its single-tensor loop (no foreach kernels on CPU): one
    ``param.add_(grad, alpha=-lr)`` per parameter tensor (reads param and grad, writes param). On a
    device its default is the foreach path: one ``_foreach_add_`` op whose ``multi_tensor_apply``
    launches cover every tensor (:func:`predictor.sources.synth.emit.foreach`).
device mode also emits (the host work an eager step runs without kernels, see
    :mod:`predictor.sources.synth.emit`): ``zero_grad``, the framework work entering ``backward()``
    (STEP), the seed gradient (``ones_like``), per linear layer the ``TBackward0`` node of its
    transposed weight and one ``AccumulateGrad`` node per parameter tensor.

The helpers (:func:`linear_forward`, :func:`linear_backward`, :func:`sgd_step`) are shared with
the host-mode DLRM graph. Units: elements, bytes, seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from predictor.graph import Category, ExecutionGraph, GraphBuilder
from predictor.sources.synth.emit import ExecMode, Kernel, OpEmitter, column_sum, eltwise, foreach, gemm

__all__ = [
    "MLPSpec",
    "build_mlp_graph",
    "addmm",
    "mm",
    "linear_forward",
    "linear_backward",
    "activation_forward",
    "activation_backward",
    "sgd_step",
    "linear_grad_nodes",
    "backward_entry",
]

ACTIVATIONS = ("relu", "gelu", "tanh", "sigmoid")


@dataclass(frozen=True)
class MLPSpec:
    """An MLP classifier. ``batch_size`` samples of ``input_dim`` features, ``hidden`` widths,
    ``classes`` outputs; fp32 unless ``dtype_bytes`` says otherwise."""

    input_dim: int
    hidden: Sequence[int]
    classes: int
    batch_size: int
    activation: Literal["relu", "gelu", "tanh", "sigmoid"] = "relu"
    loss: Literal["cross_entropy", "mse"] = "cross_entropy"
    dtype_bytes: int = 4
    label: str = ""

    def layers(self) -> list[tuple[str, int, int]]:
        """(name, in, out) of every linear layer."""
        widths = [int(self.input_dim), *(int(h) for h in self.hidden), int(self.classes)]
        return [(f"fc{i}", widths[i], widths[i + 1]) for i in range(len(widths) - 1)]

    def param_count(self) -> int:
        return sum(i * o + o for _, i, o in self.layers())

    def validate(self) -> None:
        """Raise ``ValueError`` (one line) for an impossible spec."""
        if min(self.input_dim, self.classes, self.batch_size, *self.hidden or [1]) < 1:
            raise ValueError("MLP sizes and batch must be >= 1")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)} (got {self.activation!r})")
        if self.loss not in ("cross_entropy", "mse"):
            raise ValueError(f"loss must be cross_entropy or mse (got {self.loss!r})")


# ----------------------------------------------------------------------------- kernels
def addmm(name: str, m: float, n: float, k: float, dt: int) -> Kernel:
    """``addmm(bias, A[m x k], B[k x n])`` (``F.linear`` with a bias: ``B`` is ``W.t()``)."""
    return gemm(name, m, n, k, dt, op="addmm")


def mm(name: str, m: float, n: float, k: float, dt: int) -> Kernel:
    """``mm(A[m x k], B[k x n])``."""
    return gemm(name, m, n, k, dt, op="mm")


def linear_forward(e: OpEmitter, name: str, b: float, i: int, o: int, dt: int, after: Sequence[int] = ()) -> list[int]:
    """``nn.Linear(i, o)`` on ``b`` rows: one ``addmm``."""
    return e.op(f"{name}.linear", [addmm(f"{name}.addmm", b, o, i, dt)], after=after)


def linear_backward(e: OpEmitter, name: str, b: float, i: int, o: int, dt: int, input_grad: bool = True) -> list[int]:
    """``AddmmBackward0`` of ``nn.Linear(i, o)``: input gradient (if needed), weight gradient, bias
    gradient (sum of ``b x o`` over the batch). Returns the kernel ids (last: the bias gradient)."""
    kernels = [mm(f"{name}.wgrad", o, i, b, dt),  # grad.t() @ input: [o x b] @ [b x i]
               column_sum("bias_grad", b, o, dt)]
    if input_grad:
        kernels.insert(0, mm(f"{name}.dgrad", b, i, o, dt))
    return e.op(f"{name}.linear.backward", kernels)


def activation_forward(e: OpEmitter, name: str, kind: str, elements: float, dt: int) -> list[int]:
    """An out-of-place activation (reads and writes every element once)."""
    return e.op(f"{name}.{kind}", [eltwise(f"{name}.{kind}", kind, elements, dt, rw=2.0)])


def activation_backward(e: OpEmitter, name: str, kind: str, elements: float, dt: int) -> list[int]:
    """The activation's backward (reads the gradient and the saved tensor, writes the gradient)."""
    return e.op(f"{name}.{kind}.backward", [eltwise(f"{name}.{kind}_bwd", f"{kind}_bwd", elements, dt, rw=3.0)])


def linear_grad_nodes(e: OpEmitter, name: str) -> None:
    """Device mode: the kernel-less autograd nodes of ``nn.Linear``'s backward — ``AccumulateGrad`` of
    the bias, ``TBackward0`` (the weight's transpose view), ``AccumulateGrad`` of the weight (gradients
    set to None before backward are taken over, not added)."""
    for node in ("bias.accumulate_grad", "weight.t_backward", "weight.accumulate_grad"):
        e.node(f"{name}.{node}")


def backward_entry(e: OpEmitter, dt: int) -> list[int]:
    """Device mode: ``loss.backward()`` — the step's framework work (STEP) and the seed gradient
    (``ones_like``: one one-element fill kernel); host mode: nothing."""
    if e.mode != "device":
        return []
    e.step_framework()
    return e.op("backward.seed", [eltwise("backward.ones_like", "fill", 1.0, dt, rw=1.0)])


def sgd_step(e: OpEmitter, tensors: Sequence[tuple[str, float]], dt: int, after: Sequence[int] = (),
             use_foreach: bool | None = None) -> list[int]:
    """``torch.optim.SGD.step`` (no momentum) over the tensors ``(name, elements)``: on a CPU one
    ``param.add_(grad)`` per tensor, the first waiting for ``after``; on a device (foreach, the
    default there) one ``_foreach_add_`` op (its launches: :func:`predictor.sources.synth.emit.foreach`).
    ``use_foreach=False``: the per-tensor loop on a device too (a group with sparse gradients)."""
    if e.mode == "device" if use_foreach is None else use_foreach:
        return e.op("sgd.foreach_add_", foreach("sgd.foreach_add_", "add", [n for _, n in tensors], dt), after=after)
    out: list[int] = []
    for j, (name, n) in enumerate(tensors):
        out += e.op(f"sgd.{name}", [(f"sgd.{name}.add_", "add", Category.MEMORY,
                                     {"elements": n, "dtype_bytes": dt, "bytes": 3.0 * n * dt})],
                    after=after if j == 0 else ())
    return out


def layer_tensors(layers: Sequence[tuple[str, int, int]]) -> list[tuple[str, float]]:
    """(name, elements) of every parameter tensor, in ``module.parameters()`` order."""
    out: list[tuple[str, float]] = []
    for name, i, o in layers:
        out += [(f"{name}.weight", float(i * o)), (f"{name}.bias", float(o))]
    return out


# ----------------------------------------------------------------------------- graph
def _loss_forward(e: OpEmitter, spec: MLPSpec) -> None:
    b, c, dt = float(spec.batch_size), float(spec.classes), spec.dtype_bytes
    if spec.loss == "cross_entropy":
        e.op("cross_entropy", [("log_softmax", "softmax", Category.MEMORY,
                                {"m": b, "n": c, "elements": b * c, "dtype_bytes": dt, "bytes": 2.0 * b * c * dt}),
                               eltwise("nll_loss", "loss", b, dt, rw=2.0)])
    else:
        e.op("mse_loss", [eltwise("mse_loss", "loss", b * c, dt, rw=2.0)])


def _loss_backward(e: OpEmitter, spec: MLPSpec) -> None:
    b, c, dt = float(spec.batch_size), float(spec.classes), spec.dtype_bytes
    if spec.loss == "cross_entropy":
        e.op("nll_loss.backward", [eltwise("nll_loss_bwd", "loss", b * c, dt, rw=1.0)])
        e.op("log_softmax.backward", [("log_softmax_bwd", "log_softmax_bwd", Category.MEMORY,
                                       {"m": b, "n": c, "elements": b * c, "dtype_bytes": dt,
                                        "bytes": 3.0 * b * c * dt})])
    else:
        e.op("mse_loss.backward", [eltwise("mse_loss_bwd", "loss", b * c, dt, rw=3.0)])


def build_mlp_graph(spec: MLPSpec, mode: ExecMode = "host") -> ExecutionGraph:
    """One training iteration of ``spec`` on one rank (``mode``: ``"host"`` for CPU, ``"device"``
    for an accelerator; see :mod:`predictor.sources.synth.emit`)."""
    spec.validate()
    gb = GraphBuilder()
    e = OpEmitter(gb, 0, mode)
    dt = spec.dtype_bytes
    b = float(spec.batch_size)
    layers = spec.layers()
    last = len(layers) - 1
    e.node("optimizer.zero_grad")
    for li, (name, i, o) in enumerate(layers):
        linear_forward(e, name, b, i, o, dt)
        if li < last:
            activation_forward(e, name, spec.activation, b * o, dt)
    _loss_forward(e, spec)
    backward_entry(e, dt)
    _loss_backward(e, spec)
    for li in reversed(range(len(layers))):
        name, i, o = layers[li]
        if li < last:
            activation_backward(e, name, spec.activation, b * o, dt)
        linear_backward(e, name, b, i, o, dt, input_grad=li > 0)
        linear_grad_nodes(e, name)
    sgd_step(e, layer_tensors(layers), dt)
    gb.meta.update({"workload": "mlp", "n_ranks": 1, "batch_size": spec.batch_size, "label": spec.label})
    return gb.build()
