"""The network behind the learned kernel models: a small MLP on log features, trained with torch, run in numpy.

* :class:`MLPNet` — a small fully-connected network that maps kernel parameters (log2 of the
  shape columns; reuse-factor fractions as they are) to log2 seconds, as Lin et al. 2022
  §III-B2 do ("taking logarithm values of both the sizes and the results"). Inference is plain
  numpy (no torch at prediction time). Outside the benchmarked range, features are clamped
  to it and the time is scaled by the ratio of the kernel's *work* (e.g. ``m n k`` for a
  GEMM), so a 4x larger GEMM than any benchmarked one takes 4x the largest one's time
  instead of whatever the network extrapolates.
* :func:`fit_mlp` — trains the network with torch (MSE on standardised log targets, full
  batch) over a hyper-parameter grid (:data:`TABLE_II_GRID` is Lin et al. 2022 Table II;
  :data:`QUICK_GRID` and :data:`TINY_GRID` are small subsets) and keeps the configuration with
  the lowest error on a validation split of the training data; the winner is retrained on
  all training data.
"""

from __future__ import annotations

import base64
import itertools
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["OPTIONAL_GAIN", "QUICK_GRID", "TABLE_II_GRID", "TINY_GRID", "TRAIN_DTYPE", "MLPConfig", "MLPMember",
           "MLPNet", "fit_mlp", "keeps_optional"]


@dataclass(frozen=True)
class MLPConfig:
    """One point of the hyper-parameter grid (Lin et al. 2022 Table II)."""

    layers: int  #: linear layers including the output layer
    width: int  #: neurons per hidden layer
    optimizer: str  #: "adam" or "sgd" (SGD's learning rate is scaled by 10, as the paper does)
    lr: float  #: learning rate (before the SGD scaling)


def _grid(layers: Iterable[int], widths: Iterable[int], opts: Iterable[str], lrs: Iterable[float]) -> tuple[MLPConfig, ...]:
    return tuple(MLPConfig(a, b, c, d) for a, b, c, d in itertools.product(layers, widths, opts, lrs))


#: Lin et al. 2022 Table II: 5 depths x 4 widths x 2 optimisers x 7 learning rates (280 configs)
TABLE_II_GRID = _grid((3, 4, 5, 6, 7), (128, 256, 512, 1024), ("adam", "sgd"),
                      (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2))
#: the ``--quick`` subset (a 2-core CPU trains it for every kernel in a few minutes)
QUICK_GRID = _grid((3, 4), (48, 96), ("adam",), (3e-3,))
#: optional features are kept only if they bring the validation MSE below this share of the MSE
#: without them (fp32 GEMMs on the 2-core VM: 0.24-0.57; a spurious gain on bmm/bf16 data
#: without aligned shapes: 0.86)
OPTIONAL_GAIN = 0.75
#: tests only
TINY_GRID = _grid((3,), (32,), ("adam",), (1e-2,))


def _b64(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a, dtype="<f4")
    return {"shape": list(a.shape), "f32": base64.b64encode(a.tobytes()).decode("ascii")}


def _unb64(d: Mapping) -> np.ndarray:
    raw = base64.b64decode(d["f32"])
    return np.frombuffer(raw, dtype="<f4").astype(np.float64).reshape(d["shape"])


@dataclass
class MLPMember:
    """One more network of an ensemble (:attr:`MLPNet.members`): its layers and residual range,
    as :class:`MLPNet` holds its first network's."""

    weights: list[np.ndarray]
    biases: list[np.ndarray]
    res_lo: float | None = None
    res_hi: float | None = None

    def to_dict(self) -> dict:
        return {"weights": [_b64(w) for w in self.weights], "biases": [_b64(b) for b in self.biases],
                "res_lo": self.res_lo, "res_hi": self.res_hi}

    @classmethod
    def from_dict(cls, d: Mapping) -> MLPMember:
        return cls([_unb64(w) for w in d["weights"]], [_unb64(b) for b in d["biases"]],
                   None if d.get("res_lo") is None else float(d["res_lo"]),
                   None if d.get("res_hi") is None else float(d["res_hi"]))


@dataclass
class MLPNet:
    """A trained network (or an ensemble of them): features -> log2 seconds (numpy inference).

    Attributes:
        features: parameter columns, in input order.
        log_mask: per feature, True if it is log2-transformed.
        work_mask: per feature, True if the kernel's work scales with it (extrapolation).
        weights, biases: layer parameters (SiLU between layers, linear output).
        lin_w, lin_b: a linear skip from the standardised inputs to the output, fitted first by
            least squares; the network learns the residual. The skip carries the power-law trend
            (time ~ work), so the few hundred samples of a quick calibration go to the curvature.
        x_mean, x_std, y_mean, y_std: standardisation of inputs and the log2-seconds target.
        lo, hi: range of the transformed training features (clamping bounds).
        config: the grid point that won, and training facts.
        res_lo, res_hi: range of the network's output (the residual over the skip, standardised
            log2 seconds) on the training samples; :meth:`forward` clamps to it, so a point inside
            the feature box but away from every sample (a corner two features never reached
            together) gets at most the largest correction the network made on real data. Without
            the clamp a log-softmax backward net of a quick calibration predicted 93 s for a
            35 ms shape. ``None`` (packs fitted before) leaves the output unclamped.
        members: further networks of the same configuration trained from other initial seeds
            (:func:`fit_mlp` ``members``); the prediction is the mean of all networks' clamped
            residuals, i.e. the geometric mean of their times. Averaging removes most of the
            spread that one initialisation adds on a few hundred noisy samples.
    """

    features: tuple[str, ...]
    log_mask: np.ndarray
    work_mask: np.ndarray
    weights: list[np.ndarray]
    biases: list[np.ndarray]
    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float
    lo: np.ndarray
    hi: np.ndarray
    config: dict = field(default_factory=dict)
    lin_w: np.ndarray | None = None
    lin_b: float = 0.0
    res_lo: float | None = None
    res_hi: float | None = None
    members: list[MLPMember] = field(default_factory=list)

    def transform(self, raw: np.ndarray) -> np.ndarray:
        """Raw feature matrix (n, f) -> model space (log2 where ``log_mask``)."""
        z = np.array(raw, dtype=np.float64, copy=True)
        z[:, self.log_mask] = np.log2(np.maximum(z[:, self.log_mask], 1e-3))
        return z

    def forward(self, z: np.ndarray, chunk: int = 32768) -> np.ndarray:
        """log2 seconds for transformed features ``z`` (no clamping of ``z``; the network's
        residual is clamped to ``[res_lo, res_hi]`` when those are set).

        Computed in float32 (the stored precision of the weights) in chunks of ``chunk`` rows,
        so a million tasks take well under a second and little memory.
        """
        if not hasattr(self, "_f32"):
            self._f32 = [([w.astype(np.float32) for w in m.weights], [b.astype(np.float32) for b in m.biases],
                          m.res_lo, m.res_hi) for m in (self, *self.members)]
        out = np.empty(z.shape[0])
        for lo in range(0, z.shape[0], chunk):
            x = (z[lo:lo + chunk] - self.x_mean) / self.x_std
            skip = x @ self.lin_w + self.lin_b if self.lin_w is not None else 0.0
            res = np.zeros(x.shape[0])
            for ws, bs, r_lo, r_hi in self._f32:
                r = self._residual(x, ws, bs)
                res += np.clip(r, r_lo, r_hi) if r_lo is not None and r_hi is not None else r
            out[lo:lo + chunk] = (res / len(self._f32) + skip) * self.y_std + self.y_mean
        return out

    @staticmethod
    def _residual(x: np.ndarray, ws: list[np.ndarray], bs: list[np.ndarray]) -> np.ndarray:
        """The network's output (standardised log2 seconds over the skip) for standardised ``x``."""
        h = x.astype(np.float32)
        last = len(ws) - 1
        for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
            h = h @ w + b
            if i < last:
                h = h / (np.float32(1.0) + np.exp(-np.clip(h, -60.0, 60.0)))  # SiLU
        return h[:, 0].astype(np.float64)

    def predict(self, raw: np.ndarray) -> np.ndarray:
        """Seconds for raw features (n, f); clamps to the trained range and scales by work."""
        z = self.transform(raw)
        zc = np.clip(z, self.lo, self.hi)
        log_t = self.forward(zc)
        if self.work_mask.any():
            log_t = log_t + (z - zc)[:, self.work_mask & self.log_mask].sum(axis=1)
        return np.exp2(log_t)

    @property
    def n_params(self) -> int:
        return int(sum(w.size + b.size for m in (self, *self.members)
                       for w, b in zip(m.weights, m.biases, strict=True)))

    def to_dict(self) -> dict:
        return {
            "features": list(self.features),
            "log_mask": self.log_mask.astype(bool).tolist(),
            "work_mask": self.work_mask.astype(bool).tolist(),
            "weights": [_b64(w) for w in self.weights],
            "biases": [_b64(b) for b in self.biases],
            "x_mean": self.x_mean.tolist(),
            "x_std": self.x_std.tolist(),
            "y_mean": self.y_mean,
            "y_std": self.y_std,
            "lo": self.lo.tolist(),
            "hi": self.hi.tolist(),
            "config": self.config,
            "lin_w": None if self.lin_w is None else self.lin_w.tolist(),
            "lin_b": self.lin_b,
            "res_lo": self.res_lo,
            "res_hi": self.res_hi,
            "members": [m.to_dict() for m in self.members],
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> MLPNet:
        return cls(
            features=tuple(d["features"]),
            log_mask=np.asarray(d["log_mask"], dtype=bool),
            work_mask=np.asarray(d["work_mask"], dtype=bool),
            weights=[_unb64(w) for w in d["weights"]],
            biases=[_unb64(b) for b in d["biases"]],
            x_mean=np.asarray(d["x_mean"], dtype=np.float64),
            x_std=np.asarray(d["x_std"], dtype=np.float64),
            y_mean=float(d["y_mean"]),
            y_std=float(d["y_std"]),
            lo=np.asarray(d["lo"], dtype=np.float64),
            hi=np.asarray(d["hi"], dtype=np.float64),
            config=dict(d.get("config", {})),
            lin_w=None if d.get("lin_w") is None else np.asarray(d["lin_w"], dtype=np.float64),
            lin_b=float(d.get("lin_b", 0.0)),
            res_lo=None if d.get("res_lo") is None else float(d["res_lo"]),
            res_hi=None if d.get("res_hi") is None else float(d["res_hi"]),
            members=[MLPMember.from_dict(m) for m in d.get("members", [])],
        )


def _linear(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Least-squares linear fit ``y ~ x w + b`` (tiny ridge for collinear columns)."""
    a = np.hstack([x, np.ones((x.shape[0], 1))])
    reg = 1e-6 * np.eye(a.shape[1])
    reg[-1, -1] = 0.0
    coef = np.linalg.solve(a.T @ a + reg, a.T @ y)
    return coef[:-1], float(coef[-1])


#: precision the MLPs train in: "float32" (with PyTorch's fused AdamW) or "float64". The trained weights
#: are stored as float32 either way; on a 2-core AVX2 VM float32 trained 1.5-2x faster
TRAIN_DTYPE = "float32"


def _train(config: MLPConfig, x: np.ndarray, y: np.ndarray, epochs: int, seed: int, weight_decay: float = 1e-4):
    """Train one torch MLP on standardised arrays (in :data:`TRAIN_DTYPE`); returns the torch module."""
    import torch

    dtype = getattr(torch, TRAIN_DTYPE)
    torch.manual_seed(seed)
    dims = [x.shape[1]] + [config.width] * (config.layers - 1) + [1]
    mods: list = []
    for i in range(len(dims) - 1):
        mods.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            mods.append(torch.nn.SiLU())
    net = torch.nn.Sequential(*mods).to(dtype)
    xt = torch.as_tensor(x, dtype=dtype)
    yt = torch.as_tensor(y, dtype=dtype).reshape(-1, 1)
    if config.optimizer == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=config.lr * 10.0, momentum=0.9, weight_decay=weight_decay)
    else:
        opt = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=weight_decay,
                                fused=dtype == torch.float32)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs, eta_min=config.lr * 0.01)
    loss_fn = torch.nn.MSELoss()
    for _ in range(epochs):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(xt), yt)
        if not torch.isfinite(loss):
            break
        loss.backward()
        opt.step()
        sched.step()
    return net


def _eval(net, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return net(torch.as_tensor(x, dtype=next(net.parameters()).dtype)).numpy()[:, 0].astype(np.float64)


def keeps_optional(val_mse_without: float, val_mse_with: float) -> bool:
    """Whether a fit keeps its optional features, from the validation MSE (log2 seconds) without
    and with them: they must bring it below :data:`OPTIONAL_GAIN` times the MSE without. A
    validation split of ~60 samples moves the MSE by 10-20 % between equivalent fits, so extra
    columns stay only for a clear gain."""
    return val_mse_with < OPTIONAL_GAIN * val_mse_without


def fit_mlp(
    raw: np.ndarray,
    seconds: np.ndarray,
    features: Sequence[str],
    *,
    log_features: Sequence[str] | None = None,
    work: Sequence[str] = (),
    grid: Sequence[MLPConfig] = QUICK_GRID,
    epochs: int = 1500,
    val_fraction: float = 0.2,
    seed: int = 0,
    budget_s: float | None = None,
    optional: Sequence[str] = (),
    members: int = 1,
    _force_val: bool = False,
) -> MLPNet:
    """Grid-search and train an :class:`MLPNet` on (features, seconds) samples.

    Args:
        raw: feature matrix (n, f), raw units (element counts, bytes, fractions).
        seconds: measured times (n,), > 0.
        features: column names of ``raw``.
        log_features: the columns that get log2 (default: all).
        work: columns whose product is the kernel's work (extrapolation outside the range).
        grid: configurations to try; the one with the lowest validation MSE (log space) wins.
        epochs: full-batch training steps per configuration.
        val_fraction: share of the samples held out for choosing the configuration.
        seed: RNG seed (split and initialisation).
        budget_s: stop trying new configurations after this many seconds (at least one runs).
        optional: columns of ``features`` tried as one group, on and off: the grid runs once
            without them and once with them, and the lower validation error decides (the net
            keeps only the features it was trained on). Used for shape-alignment indicators,
            which matter for one kernel library and dtype (fp32 GEMMs on a CPU: up to 2x between
            a multiple-of-16 shape and its ragged neighbour) and are noise for another. They are
            kept only for a clear gain (:func:`keeps_optional`).
        members: networks trained with the winning configuration on all the training data, from
            initial seeds ``seed .. seed + members - 1``; the net predicts their geometric mean
            (:attr:`MLPNet.members`). The grid search runs once, so each member beyond the first
            costs one more training.
    """
    import torch

    raw = np.asarray(raw, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    if raw.ndim != 2 or raw.shape[0] != seconds.size or raw.shape[1] != len(features):
        raise ValueError("raw must be (n, len(features)) and seconds (n,)")
    if seconds.size < 4 or np.any(~np.isfinite(seconds)) or np.any(seconds <= 0):
        raise ValueError("fit_mlp needs at least 4 finite, positive times")
    unknown = [f for f in optional if f not in features]
    if unknown:
        raise ValueError(f"optional features {unknown} are not among the features {list(features)}")
    if optional:
        keep = [i for i, f in enumerate(features) if f not in set(optional)]
        trials = [(tuple(features[i] for i in keep), raw[:, keep]), (tuple(features), raw)]
        nets = [fit_mlp(r, seconds, f, log_features=log_features, work=work, grid=grid, epochs=epochs,
                        val_fraction=val_fraction, seed=seed, budget_s=budget_s, members=members, _force_val=True)
                for f, r in trials]
        best = nets[1] if keeps_optional(nets[0].config["val_mse_log2"], nets[1].config["val_mse_log2"]) else nets[0]
        best.config["optional"] = {"features": list(optional), "used": best is nets[1],
                                   "val_mse_log2": [n.config["val_mse_log2"] for n in nets]}
        return best
    logs = set(features if log_features is None else log_features)
    log_mask = np.array([f in logs for f in features])
    work_mask = np.array([f in set(work) for f in features])
    proto = MLPNet(tuple(features), log_mask, work_mask, [], [], np.zeros(0), np.ones(0), 0.0, 1.0,
                   np.zeros(0), np.zeros(0))
    z = proto.transform(raw)
    x_mean, x_std = z.mean(axis=0), z.std(axis=0)
    x_std = np.where(x_std > 1e-9, x_std, 1.0)
    ly = np.log2(seconds)
    y_mean, y_std = float(ly.mean()), float(ly.std() or 1.0)
    xs, ys = (z - x_mean) / x_std, (ly - y_mean) / y_std

    rng = np.random.default_rng(seed)
    perm = rng.permutation(seconds.size)
    n_val = max(1, int(round(val_fraction * seconds.size))) if len(grid) > 1 or _force_val else 0
    val, fit = perm[:n_val], perm[n_val:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny networks: threading costs more than it gives
    try:
        start = time.perf_counter()
        scores: list[tuple[float, MLPConfig]] = []
        if len(grid) > 1 or _force_val:
            for i, cfg in enumerate(grid):
                if i and budget_s is not None and time.perf_counter() - start > budget_s:
                    break
                w, b = _linear(xs[fit], ys[fit])
                net = _train(cfg, xs[fit], ys[fit] - (xs[fit] @ w + b), epochs, seed)
                err = float(np.mean((_eval(net, xs[val]) + xs[val] @ w + b - ys[val]) ** 2))
                scores.append((err if math.isfinite(err) else float("inf"), cfg))
            best_cfg = min(scores, key=lambda s: s[0])[1]
        else:
            best_cfg = grid[0]
        lin_w, lin_b = _linear(xs, ys)
        trained = [_member(_train(best_cfg, xs, ys - (xs @ lin_w + lin_b), epochs, seed + i), xs)
                   for i in range(max(1, int(members)))]
    finally:
        torch.set_num_threads(threads)
    first = trained[0]
    config = {"layers": best_cfg.layers, "width": best_cfg.width, "optimizer": best_cfg.optimizer,
              "lr": best_cfg.lr, "epochs": epochs, "tried": len(scores) or 1, "samples": int(seconds.size),
              "activation": "silu", "skip": "linear least squares", "weight_decay": 1e-4,
              "members": len(trained)}
    if scores:
        config["val_mse_log2"] = float(min(s[0] for s in scores)) * y_std**2
    return MLPNet(tuple(features), log_mask, work_mask, first.weights, first.biases, x_mean, x_std, y_mean, y_std,
                  z.min(axis=0), z.max(axis=0), config, lin_w=lin_w, lin_b=lin_b,
                  res_lo=first.res_lo, res_hi=first.res_hi, members=trained[1:])


def _member(net, xs: np.ndarray) -> MLPMember:
    """A trained torch network as numpy layers (float32 precision, as stored) with the range of its
    output on the standardised training inputs ``xs``."""
    import torch

    weights, biases = [], []
    for mod in net:
        if isinstance(mod, torch.nn.Linear):
            weights.append(mod.weight.detach().numpy().T.astype(np.float32).astype(np.float64))
            biases.append(mod.bias.detach().numpy().astype(np.float32).astype(np.float64))
    res = MLPNet._residual(xs, [w.astype(np.float32) for w in weights], [b.astype(np.float32) for b in biases])
    return MLPMember(weights, biases, float(res.min()), float(res.max()))
