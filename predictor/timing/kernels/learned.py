"""Calibrated kernel models: MLPs on log features, fitted rooflines, and their (de)serialisation.

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
* :class:`MLPKernelModel` — a :class:`~predictor.timing.kernels.base.KernelModel` holding one or
  several nets (GEMM: one per op and dtype) with a router; tasks lacking a feature fall back
  to the family's analytic model.
* :class:`FittedRoofline` — the roofline with *measured* bandwidths: per op kind a floor
  (seconds) and an effective bandwidth per working-set regime (bytes/s), fitted by
  :func:`fit_roofline`.
* :func:`model_to_dict` / :func:`model_from_dict` — JSON form of every calibrated model
  (weights as base64 float32), used by asset packs.
"""

from __future__ import annotations

import base64
import itertools
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.kernels.collective import PiecewiseCollective, PiecewiseSigmoid
from predictor.timing.kernels.elementwise import Roofline
from predictor.timing.kernels.embedding import RF_COLUMNS, RF_COUNTS, AnalyticEmbedding
from predictor.timing.kernels.gemm import AnalyticGemm
from predictor.timing.kernels.host_memory import FRESH_OUTPUT_KINDS, allocation_fault_seconds
from predictor.timing.kernels.state import StateScaled
from predictor.timing.platforms.schema import Platform

__all__ = [
    "MLPNet",
    "MLPMember",
    "MLPConfig",
    "TABLE_II_GRID",
    "QUICK_GRID",
    "TINY_GRID",
    "OPTIONAL_GAIN",
    "keeps_optional",
    "fit_mlp",
    "MLPKernelModel",
    "RooflineFit",
    "fit_roofline",
    "FittedRoofline",
    "uniform_reuse_factors",
    "CONV_PATH_FEATURES",
    "CONV_ALIGN_FEATURES",
    "conv_align_features",
    "conv_native",
    "DERIVED_FEATURES",
    "ALIGN16_FEATURES",
    "ONEDNN_FEATURES",
    "ONEDNN_MIN_PRODUCT",
    "SHORT_ROW_FEATURES",
    "VECTOR_BYTES",
    "GEMM_SHAPE_FEATURES",
    "ROUTE_FEATURES",
    "route_columns",
    "feature_matrix",
    "model_to_dict",
    "model_from_dict",
]


# ============================================================================ the network
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
#: are stored as float32 either way; on the AVX2 VM of session 22 float32 trained 1.5-2x faster
#: (``experiments/fit_recipe.py``)
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


# ============================================================================ reuse factors
def uniform_reuse_factors(lookups: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Expected lookup-weighted 17-bin reuse histogram of ``lookups`` uniform draws from ``rows``.

    A lookup's row is hit ``1 + Poisson(lambda)`` times in total with ``lambda = lookups /
    rows`` (size-biased Poisson), so bin ``j`` gets ``P(1 + Poisson(lambda) in bin j)``.
    Used when a task carries no measured reuse factors. Shape ``(n, 17)``.
    """
    lam = np.asarray(lookups, dtype=np.float64) / np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
    lam = np.maximum(lam, 0.0)
    out = np.zeros((lam.size, len(RF_COLUMNS)))
    from scipy.special import pdtr  # Poisson CDF, a vectorised ufunc

    cdf_prev = np.zeros(lam.size)  # P(Poisson <= lo - 2) for the current bin
    for j in range(len(RF_COLUMNS)):
        hi = 1 if j == 0 else 2**j
        # c in [lo, hi]  <=>  Poisson in [lo - 1, hi - 1]
        cdf = pdtr(hi - 1, lam) if j < len(RF_COLUMNS) - 1 else np.ones(lam.size)
        out[:, j] = np.maximum(cdf - cdf_prev, 0.0)
        cdf_prev = cdf
    s = out.sum(axis=1, keepdims=True)
    return out / np.where(s > 0, s, 1.0)



# ============================================================================ derived features
#: embedding-lookup features computed from B, L, E, D and the reuse factors (log2-transformed):
#: ``lookups = B L``; ``distinct_rows = lookups * sum_j rf_j / c_j`` (rows touched, ``c_j`` the
#: representative access count of bin ``j``); ``distinct_bytes`` and ``table_bytes`` their bytes.
#: GEMMs on a GPU: ``ld_aligned`` (1 when the rows of n and k are 16-byte multiples, else 0; not logged).
#: GEMMs on a CPU: ``m_al16``, ``n_al16``, ``k_al16`` (1 when that dimension is a multiple of 16
#: elements, else 0; not logged): BLAS micro-kernels work on register tiles of 8-16 fp32 lanes,
#: and a ragged edge costs a masked or scalar tail.
ALIGN16_FEATURES = ("m_al16", "n_al16", "k_al16")
#: finer steps of the vector dimension of a CPU GEMM (not logged): ``n_al8`` / ``n_al4`` = 1 when ``n`` (the
#: columns of the result, the dimension BLAS vectorises for row-major operands) is a multiple of 8 / 4 elements.
#: A ragged ``n`` costs a masked tail in proportion to what is left over: on the Zen 4 VM the fp32 net with the
#: 16-element flags alone over-predicted the bmm samples with ``n`` = 8 mod 16 by a median 18 % and those with
#: ``n`` = 4 or 12 mod 16 by 7-9 % (mm likewise), where ``n`` = 7 or 11 mod 16 ran 7-8 % slower than it said
#: (1321 unseen samples of five spells, session 48)
ALIGN_FINE_FEATURES = ("n_al8", "n_al4")
#: PyTorch's CPU convolution path (columns ``m = H W``, ``k``, ``dim = kh``, ``batch``): 1 when an fp32
#: convolution runs ATen's own kernel (im2col + GEMM, ``Slow2d``), 0 when it goes to oneDNN. ATen's
#: ``use_mkldnn`` rule: a 1x1 filter on fewer than 16 images stays native on one thread
#: (``conv_native``; with more threads, ``conv_native_mt``, oneDNN takes it), and so does a filter of at
#: most 3x3 on a single image of at most 20480 input elements (strided and dilated convolutions always
#: go to oneDNN; graph tasks do not carry the stride and read as stride 1). An MLP on log sizes did not
#: place that edge from a few hundred samples: the native path was 18 % off where the rest was 11 %;
#: with the indicator the held-out conv2d GMAE of five stored calibrations fell from 8.6-12.0 % to
#: 7.1-8.2 % (``experiments/results/kernel_model_variants_conv.md``)
CONV_PATH_FEATURES = ("conv_native", "conv_native_mt")
#: A convolution's channel counts on a vector boundary (columns ``n`` = ``C_out``, ``k`` = ``C_in kh kw``,
#: ``dim`` = ``kh``; not logged): ``cout_alV`` / ``cin_alV`` = 1 when ``C_out`` / ``C_in`` is a multiple of ``V``,
#: else 0, for ``V`` = 8 or 16 fp32 lanes. oneDNN's fp32 convolutions block channels by the vector width
#: (``nChw16c`` with AVX-512); on the Zen 4 VM the held-out samples over 1 ms with ``C_out`` a multiple of 16 ran a
#: median 7-14 % under the net's prediction without them and those with ``C_out`` = 8 mod 16 5-18 % over it
#: (session 40, ``cpu-s37x8`` seed 0). The spec takes the 16-lane pair on AVX-512 CPUs only
#: (:func:`conv_align_features`); the 8-lane pair is there for ``experiments/kernel_model_variants.py``
CONV_ALIGN_FEATURES = ("cout_al8", "cin_al8", "cout_al16", "cin_al16")


def conv_align_features(lanes: int) -> tuple[str, ...]:
    """The channel-alignment inputs of a CPU convolution net on a CPU with ``lanes`` fp32 lanes: the 16-lane pair
    of :data:`CONV_ALIGN_FEATURES` with AVX-512 (``lanes`` >= 16), none with fewer: on the AVX2 VM's stored
    calibration the 8-lane (and 16-lane) inputs cost 0.6-1.4 points of held-out GMAE (session 40)."""
    return ("cout_al16", "cin_al16") if lanes >= 16 else ()


#: GEMM and convolution shape features, tried in session 35 (their held-out gains did not hold over other
#: splits, and ``gemm_bytes`` moved a step's large GEMMs: see :mod:`predictor.timing.calibration.gemm`);
#: ``experiments/kernel_model_variants.py`` has them as variants. Since session 47 the CPU fp32 GEMM net takes
#: ``bmm_naive`` (on the 6-round spells its rows were the worst bmm samples).
#: ``gemm_bytes`` = ``dtype_bytes x batch x (m k + k n + m n)``, the operands' and result's bytes (log2);
#: ``bmm_naive`` = 1 when ``m n k < 400`` (not logged; in a net pooled over the GEMM ops, only on ``is_bmm``
#: rows): ATen's CPU ``bmm`` runs its own per-entry loop below that product instead of a BLAS batch;
#: ``bmm_intensity`` = log2 of ``2 m n k / (dtype_bytes (m k + k n + m n))`` on bmm rows, 0 on others (not logged;
#: the CPU fp32 net since session 48): a bmm with a small k streams its result and runs at memory speed;
#: ``conv_bytes`` = a "same"-padded convolution's input,
#: weight and output bytes, ``dtype_bytes x (batch m k / kh^2 + n k + batch n m)`` (log2; the columns
#: :func:`conv_native` reads)
GEMM_SHAPE_FEATURES = ("gemm_bytes", "bmm_naive", "conv_bytes", "bmm_intensity")
#: PyTorch's CPU path for a bf16 GEMM (not logged): ``onednn_gemm`` = 1 when ``batch x m x n x k`` exceeds
#: 16^3 = 4096, the size from which ATen hands a bf16 ``addmm`` / ``mm`` / ``bmm`` to oneDNN
#: (``checksize`` in ``aten/src/ATen/native/mkldnn/Matmul.cpp``; on a CPU with AVX-512 BF16), else 0 (its own
#: blocked kernel). On the Zen 4 VM the step costs a fixed ~20 us: products of 1k-4k ran a median 6-8 us, of
#: 4k-16k 27-35 us (``cpu-s37x8``, all three bf16 ops; fp32 GEMMs have no such edge), and 16x16x16 with batch 1
#: 7.8 us against 29.0 us with batch 2
ONEDNN_FEATURES = ("onednn_gemm",)
ONEDNN_MIN_PRODUCT = 16.0**3
#: rows shorter than one 512-bit vector (not logged): ``short_rows`` = 1 when ``n x dtype_bytes`` < 64. ATen's
#: vectorised row kernels (softmax and its backwards) take a scalar / masked path for such rows: on the Zen 4 VM
#: they cost ~10x per element (softmax 18-19 ns at n < 16 fp32 against 1.6 ns at n = 16)
SHORT_ROW_FEATURES = ("short_rows",)
VECTOR_BYTES = 64.0
#: route inputs of a net pooled over several GEMM kernels (``ModelSpec.pool``; not logged): 1 when the task's
#: route (``"{op}/{dtype}"``, :meth:`MLPKernelModel._keys`) is an ``addmm`` / a ``bmm``, else 0; ``mm`` is
#: both 0. Taken from the route, not the task's columns: in training from the benchmark row's kernel, in
#: prediction from the router's key, so a ``linear`` task times as the ``addmm`` it runs
ROUTE_FEATURES = ("is_addmm", "is_bmm")


def route_columns(route: str, n: int) -> dict[str, np.ndarray]:
    """The :data:`ROUTE_FEATURES` columns of ``n`` tasks on ``route`` (``"addmm/fp32"`` ...)."""
    op = route.split("/", 1)[0]
    return {f: np.full(n, float(f == f"is_{op}")) for f in ROUTE_FEATURES}


DERIVED_FEATURES = ("lookups", "distinct_rows", "distinct_bytes", "table_bytes", "ld_aligned", *ALIGN16_FEATURES,
                    *ALIGN_FINE_FEATURES,
                    *CONV_PATH_FEATURES, *CONV_ALIGN_FEATURES, *GEMM_SHAPE_FEATURES, *ONEDNN_FEATURES, *SHORT_ROW_FEATURES)


def _kernel_height(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """A convolution's filter height ``kh`` (column ``dim``; NaN or below 1: 1)."""
    return np.maximum(np.nan_to_num(np.asarray(columns["dim"], dtype=np.float64), nan=1.0), 1.0)


def conv_native(columns: Mapping[str, np.ndarray], single_thread: bool = True) -> np.ndarray:
    """Whether PyTorch runs each stride-1 fp32 convolution on the CPU with its own kernel rather than
    oneDNN (bool array; :data:`CONV_PATH_FEATURES`), from columns ``m`` (output pixels per image, = H W
    with "same" padding), ``k`` (``C_in kh kw``), ``dim`` (``kh``, square filters) and ``batch`` (images)."""
    kh = _kernel_height(columns)
    k = np.asarray(columns["k"], dtype=np.float64)
    images = np.asarray(columns["batch"], dtype=np.float64)
    in_elements = k / (kh * kh) * np.asarray(columns["m"], dtype=np.float64)  # C_in H W of one image
    one_by_one = (kh == 1) & (images < 16) if single_thread else np.zeros(len(k), dtype=bool)
    return one_by_one | ((kh <= 3) & (images <= 1) & (in_elements <= 20480))


def _dtype_bytes(columns: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """Bytes per element of each of ``n`` rows (column ``dtype_bytes``; missing or NaN: 4, fp32)."""
    return np.nan_to_num(np.asarray(columns.get("dtype_bytes", np.full(n, 4.0)), dtype=np.float64), nan=4.0)


def _batch(columns: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """Batch entries of each of ``n`` GEMM rows (column ``batch``; missing, NaN or below 1: 1, an unbatched op)."""
    return np.maximum(np.nan_to_num(np.asarray(columns.get("batch", np.ones(n)), dtype=np.float64), nan=1.0), 1.0)


def feature_matrix(columns: Mapping[str, np.ndarray], features: Sequence[str], n: int) -> np.ndarray:
    """The (n, f) raw feature matrix of ``features`` from ``columns`` (derived ones computed)."""
    out = []
    for f in features:
        if f == "ld_aligned":
            # GEMM operands whose rows are 16-byte multiples (n and k): the GPU's fast (vectorised,
            # TMA) kernels need them; a ragged n or k runs ~5x slower on an H100 at the same FLOPs
            dt = _dtype_bytes(columns, n)
            rows_n = np.asarray(columns["n"], dtype=np.float64) * dt
            rows_k = np.asarray(columns["k"], dtype=np.float64) * dt
            out.append(((np.mod(rows_n, 16) == 0) & (np.mod(rows_k, 16) == 0)).astype(np.float64))
        elif f in ALIGN16_FEATURES or f in ALIGN_FINE_FEATURES:
            step = float(f.rsplit("al", 1)[1])
            out.append((np.mod(np.asarray(columns[f[0]], dtype=np.float64), step) == 0).astype(np.float64))
        elif f in CONV_PATH_FEATURES:
            out.append(conv_native(columns, single_thread=f == "conv_native").astype(np.float64))
        elif f in CONV_ALIGN_FEATURES:
            if f.startswith("cout_"):
                channels = np.asarray(columns["n"], dtype=np.float64)
            else:
                kh = _kernel_height(columns)
                channels = np.asarray(columns["k"], dtype=np.float64) / (kh * kh)
            out.append((np.mod(np.round(channels), float(f.rsplit("al", 1)[1])) == 0).astype(np.float64))
        elif f in SHORT_ROW_FEATURES:
            out.append((np.asarray(columns["n"], dtype=np.float64) * _dtype_bytes(columns, n) < VECTOR_BYTES)
                       .astype(np.float64))
        elif f in ONEDNN_FEATURES:
            product = np.prod([np.asarray(columns[c], dtype=np.float64) for c in ("m", "n", "k")], axis=0)
            b = _batch(columns, n)
            out.append((b * product > ONEDNN_MIN_PRODUCT).astype(np.float64))
        elif f in GEMM_SHAPE_FEATURES:
            m, nn, k = (np.asarray(columns[c], dtype=np.float64) for c in ("m", "n", "k"))
            b = _batch(columns, n)
            dt = _dtype_bytes(columns, n)
            gate = np.asarray(columns["is_bmm"], dtype=np.float64) if "is_bmm" in columns else 1.0
            if f == "bmm_naive":  # in a net pooled over addmm / mm / bmm, only the bmm rows (route input)
                out.append((m * nn * k < 400.0) * gate)
            elif f == "bmm_intensity":  # log2 of FLOPs per operand / result byte, bmm rows only
                out.append(np.log2(2.0 * m * nn * k / (dt * (m * k + k * nn + m * nn))) * gate)
            elif f == "conv_bytes":
                kh = _kernel_height(columns)
                out.append(dt * (b * m * k / (kh * kh) + nn * k + b * nn * m))
            else:
                out.append(dt * b * (m * k + k * nn + m * nn))
        elif f in DERIVED_FEATURES:
            b = np.asarray(columns["batch"], dtype=np.float64)
            L = np.asarray(columns["pooling"], dtype=np.float64)
            d = np.asarray(columns["dim"], dtype=np.float64)
            dt = _dtype_bytes(columns, n)
            lookups = np.maximum(b * L, 1.0)
            if f == "lookups":
                out.append(lookups)
            elif f == "table_bytes":
                out.append(np.asarray(columns["rows"], dtype=np.float64) * d * dt)
            else:
                rf = np.stack([np.asarray(columns[c], dtype=np.float64) for c in RF_COLUMNS], axis=1)
                distinct = np.maximum(lookups * (rf / RF_COUNTS).sum(axis=1), 1.0)
                out.append(distinct if f == "distinct_rows" else distinct * d * dt)
        else:
            out.append(np.asarray(columns[f], dtype=np.float64))
    return np.stack(out, axis=1) if out else np.zeros((n, 0))


# ============================================================================ MLP kernel model
_FALLBACKS = {"analytic-gemm": AnalyticGemm, "analytic-embedding": AnalyticEmbedding, "roofline": Roofline}
_DTYPE_NAMES = {4: ("fp32",), 2: ("bf16", "fp16"), 8: ("fp64",), 1: ("fp8",)}


class MLPKernelModel(KernelModel):
    """Kernel times from one or several :class:`MLPNet` s, routed per task.

    Routers:

    * ``"single"``: one net (key ``""``).
    * ``"gemm"``: key ``"{op}/{dtype}"`` with op ``bmm`` (kind ``bmm`` or ``batch > 1``),
      ``mm`` (kinds ``mm``, ``matmul``) or ``addmm`` (the others), dtype from ``dtype_bytes``
      (2 bytes: bf16, else fp16).
    * ``"dtype"``: key ``"{prefix}/{dtype}"`` (convolutions).

    Fill-ins before prediction: ``"rows_by_width"`` (layer-norm, softmax) reads a task with
    only ``elements`` as rows of width 1024; ``"reuse"`` (embedding) gives a task without
    reuse factors the uniform-access expectation (:func:`uniform_reuse_factors`); ``"concat"`` reads a
    concatenation without ``batch`` / ``parts`` as two inputs of one contiguous slice. Tasks
    that still lack a feature, or whose route has no net, go to the analytic ``fallback``.
    """

    def __init__(
        self,
        name: str,
        kinds: Sequence[str],
        nets: Mapping[str, MLPNet],
        *,
        router: str = "single",
        prefix: str = "",
        fill: str = "",
        fallback: str = "roofline",
    ) -> None:
        self.name = name
        self.kinds = tuple(kinds)
        self.nets = dict(nets)
        self.router = router
        self.prefix = prefix
        self.fill = fill
        self.fallback_name = fallback
        self.fallback = _FALLBACKS[fallback]()
        #: the calibrated nets (what an asset pack stores)
        self.params = self.nets

    # ------------------------------------------------------------------ routing
    def _keys(self, tasks: TaskView) -> np.ndarray:
        n = len(tasks)
        if self.router == "single":
            return np.full(n, "", dtype=object)
        dt = np.nan_to_num(tasks.get("dtype_bytes", 4.0), nan=4.0).astype(np.int64)
        if self.router == "gemm":
            batch = np.nan_to_num(tasks.get("batch", 1.0), nan=1.0)
            kind = tasks.kind
            plain = "mm" if kind in ("mm", "matmul") else "addmm"
            is_bmm = (batch > 1) | (kind == "bmm")
        else:
            plain, is_bmm = self.prefix, np.zeros(n, dtype=bool)
        # one route lookup per distinct (op, dtype) pair, not per task
        code = dt * 2 + is_bmm
        uniq, inv = np.unique(code, return_inverse=True)
        keys = np.array([self._with_dtype("bmm" if c % 2 else plain, int(c // 2)) for c in uniq], dtype=object)
        return keys[inv.reshape(-1)]

    def _with_dtype(self, op: str, dtype_bytes: int) -> str:
        for name in _DTYPE_NAMES.get(dtype_bytes, ("fp32",)):
            key = f"{op}/{name}"
            if key in self.nets:
                return key
        return f"{op}/{_DTYPE_NAMES.get(dtype_bytes, ('fp32',))[0]}"

    def _columns(self, tasks: TaskView, features: Sequence[str], key: str = "") -> np.ndarray:
        cols = {f: tasks.get(f) for f in features if f not in DERIVED_FEATURES}
        if any(f in ROUTE_FEATURES for f in features):
            cols.update(route_columns(key, len(tasks)))
        if self.router == "gemm" and "batch" in cols:
            cols["batch"] = np.nan_to_num(cols["batch"], nan=1.0)  # a task without a batch is one GEMM (_keys)
        if any(f in DERIVED_FEATURES for f in features):
            for c in ("batch", "pooling", "rows", "dim", "dtype_bytes", "m", "n", "k", *RF_COLUMNS):
                cols.setdefault(c, tasks.get(c))
        if self.fill == "rows_by_width" and "m" in cols and "n" in cols:
            elems = tasks.get("elements")
            n = np.where(np.isnan(cols["n"]), np.minimum(1024.0, np.maximum(elems, 1.0)), cols["n"])
            m = np.where(np.isnan(cols["m"]), elems / n, cols["m"])
            cols["m"], cols["n"] = m, n
        if self.fill == "concat":
            # a concatenation without its inputs' layout reads as two inputs of one contiguous slice each
            for c, default in (("batch", 1.0), ("parts", 2.0)):
                if c in cols:
                    cols[c] = np.where(np.isnan(cols[c]), default, cols[c])
        if self.fill == "reuse":
            rf = np.stack([tasks.get(c) for c in RF_COLUMNS], axis=1)
            missing = ~np.isfinite(rf).all(axis=1) | (np.nan_to_num(rf).sum(axis=1) <= 0)
            if missing.any():
                lookups = tasks.get("batch", 1.0) * tasks.get("pooling", 1.0)
                guess = uniform_reuse_factors(lookups[missing], tasks.get("rows", 1.0)[missing])
                rf[missing] = guess
                for j, c in enumerate(RF_COLUMNS):
                    if c in cols:
                        cols[c] = rf[:, j]
        if "dtype_bytes" in cols:
            cols["dtype_bytes"] = np.nan_to_num(cols["dtype_bytes"], nan=4.0)
        return feature_matrix(cols, features, len(tasks))

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        """Seconds per task: the routed net's time plus the terms the nets were fitted without
        (:func:`known_seconds`); tasks no net can time go to the analytic fallback."""
        n = len(tasks)
        out = np.full(n, np.nan)
        keys = self._keys(tasks)
        known = known_seconds(tasks, platform)
        for key in np.unique(keys) if n else []:
            net = self.nets.get(key)
            sel = np.flatnonzero(keys == key)
            if net is None:
                continue
            raw = self._columns(_subset(tasks, sel), net.features, key)
            ok = np.isfinite(raw).all(axis=1)
            if ok.any():
                out[sel[ok]] = net.predict(raw[ok]) + known[sel[ok]]
        todo = np.flatnonzero(~np.isfinite(out))
        if todo.size:
            out[todo] = self.fallback.predict(_subset(tasks, todo), platform)
        return np.maximum(out, 0.0)


#: the op kinds :func:`known_seconds` can be non-zero for
KNOWN_TERM_KINDS = FRESH_OUTPUT_KINDS


def known_seconds(tasks: TaskView, platform: Platform) -> np.ndarray:
    """Seconds of each task that a calibrated model does not learn because they follow from measured
    platform facts: the page faults of an output block the host maps afresh every step
    (:func:`~predictor.timing.kernels.host_memory.allocation_fault_seconds`: outputs of at least 32 MiB of
    embedding backwards, GEMMs and the memory-bound kinds that write a new block; zero for other
    kinds, and on platforms without a measured fault cost). Calibration fits the models to the measured times less the faults each
    sample was counted paying; :meth:`MLPKernelModel.predict` and :meth:`FittedRoofline.predict` add
    these back."""
    return allocation_fault_seconds(tasks, platform)


def _subset(tasks: TaskView, idx: np.ndarray) -> TaskView:
    return TaskView({k: np.asarray(v)[idx] for k, v in tasks.columns.items()}, int(idx.size), tasks.kind)


# ============================================================================ fitted roofline
@dataclass(frozen=True)
class RooflineFit:
    """``t = floor_s + bytes / bandwidth[regime]``; regime ``i`` covers ``edges[i-1] < bytes <= edges[i]``.

    ``edges`` (bytes, ascending) split the working-set sizes into ``len(edges) + 1`` regimes
    (in cache, main memory, ...); ``bandwidths`` are bytes/s, one per regime.
    """

    floor_s: float
    edges: tuple[float, ...]
    bandwidths: tuple[float, ...]

    def __call__(self, moved: np.ndarray) -> np.ndarray:
        moved = np.asarray(moved, dtype=np.float64)
        regime = np.searchsorted(np.asarray(self.edges), moved, side="left")
        bw = np.asarray(self.bandwidths)[regime]
        return self.floor_s + moved / bw

    @property
    def peak_bandwidth(self) -> float:
        """Largest fitted bandwidth, bytes/s (the "corrected peak" of Lin et al. 2022), over the
        regimes where moving the bytes takes at least as long as the floor at the regime's upper
        edge (the last regime always counts). On a GPU the smallest regimes are all launch floor:
        their fitted slope is noise, and their "bandwidth" (hundreds of TB/s) no memory's."""
        bws = [bw for i, bw in enumerate(self.bandwidths)
               if i == len(self.bandwidths) - 1 or self.edges[i] / bw >= self.floor_s]
        return float(max(bws))


def _solve_roofline(moved: np.ndarray, t: np.ndarray, edges: Sequence[float]) -> tuple[RooflineFit, float]:
    """Relative-error least squares for (floor, 1/bw per regime) with non-negativity."""
    from scipy.optimize import nnls

    regime = np.searchsorted(np.asarray(edges), moved, side="left")
    n_reg = len(edges) + 1
    a = np.zeros((moved.size, 1 + n_reg))
    a[:, 0] = 1.0
    a[np.arange(moved.size), 1 + regime] = moved
    w = 1.0 / t
    coef, _ = nnls(a * w[:, None], np.ones_like(t))
    inv = coef[1:]
    # an empty regime or a zero slope: borrow the neighbour's bandwidth (never infinite)
    for i in range(n_reg):
        if inv[i] <= 0:
            nz = [inv[j] for j in range(n_reg) if inv[j] > 0]
            inv[i] = min(nz) if nz else 1e-12
    fit = RooflineFit(float(coef[0]), tuple(float(e) for e in edges), tuple(float(1.0 / u) for u in inv))
    err = float(np.mean(np.log(fit(moved) / t) ** 2))
    return fit, err


def fit_roofline(moved: np.ndarray, seconds: np.ndarray, *, max_edges: int = 3, min_points: int = 4) -> RooflineFit:
    """Fit a :class:`RooflineFit` to measured (bytes moved, seconds) points.

    Regime edges are chosen greedily among the half-octave points of the measured byte range
    (up to ``max_edges``, each regime keeping at least ``min_points`` samples); an edge is kept
    only if it lowers the mean squared log error by more than 2 %.

    Raises:
        ValueError: fewer than ``min_points`` valid samples.
    """
    moved = np.asarray(moved, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    ok = np.isfinite(moved) & np.isfinite(t) & (moved > 0) & (t > 0)
    moved, t = moved[ok], t[ok]
    if moved.size < min_points:
        raise ValueError(f"fit_roofline needs at least {min_points} samples, got {moved.size}")
    lo, hi = np.log2(moved.min()), np.log2(moved.max())
    candidates = [2.0**x for x in np.arange(np.ceil(lo * 2) / 2, hi, 0.5)]
    edges: list[float] = []
    best, err = _solve_roofline(moved, t, edges)
    for _ in range(max_edges):
        trial = None
        for c in candidates:
            if c in edges:
                continue
            e = sorted([*edges, c])
            counts = np.bincount(np.searchsorted(np.asarray(e), moved, side="left"), minlength=len(e) + 1)
            if counts.min() < min_points:
                continue
            fit, f_err = _solve_roofline(moved, t, e)
            if trial is None or f_err < trial[1]:
                trial = (fit, f_err, e)
        if trial is None or trial[1] > err * 0.98:
            break
        best, err, edges = trial
    return best


class FittedRoofline(Roofline):
    """Roofline with measured bandwidths: one :class:`RooflineFit` per op kind.

    Bytes moved come from the task's ``bytes`` (or ``2 x elements x dtype_bytes``). Kinds
    without their own fit use ``generic`` (the fit of a streaming binary op).
    """

    name = "fitted-roofline"

    def __init__(self, fits: Mapping[str, RooflineFit], generic: str | None = None) -> None:
        super().__init__()
        self.fits = dict(fits)
        self.generic = generic if generic in self.fits else (next(iter(self.fits)) if self.fits else None)
        self.kinds = tuple(dict.fromkeys([*self.fits, *Roofline.kinds]))
        #: calibrated parameters
        self.params = self.fits  # type: ignore[assignment]

    def predict(self, tasks: TaskView, platform: Platform) -> np.ndarray:
        fit = self.fits.get(tasks.kind) or (self.fits.get(self.generic) if self.generic else None)
        if fit is None:
            return super().predict(tasks, platform)
        moved = tasks.get("bytes")
        elems = tasks.get("elements")
        dt = tasks.get("dtype_bytes", 4.0)
        moved = np.nan_to_num(np.where(np.isnan(moved), 2.0 * elems * dt, moved), nan=0.0)
        return fit(moved) + known_seconds(tasks, platform)


# ============================================================================ serialisation
def _nets_to_dict(nets: Mapping[str, MLPNet]) -> dict:
    """Nets by route, JSON-ready; a net shared by several routes (a pooled fit, ``ModelSpec.pool``) is written
    once and the other routes name its first route (``{"same_as": route}``)."""
    out: dict[str, dict] = {}
    first: dict[int, str] = {}
    for route, net in nets.items():
        if id(net) in first:
            out[route] = {"same_as": first[id(net)]}
        else:
            first[id(net)] = route
            out[route] = net.to_dict()
    return out


def _nets_from_dict(d: Mapping) -> dict[str, MLPNet]:
    """Inverse of :func:`_nets_to_dict`: a ``same_as`` route gets the very net of the route it names."""
    nets = {k: MLPNet.from_dict(v) for k, v in d.items() if "same_as" not in v}
    for k, v in d.items():
        if "same_as" in v:
            if v["same_as"] not in nets:
                raise KeyError(f"net {k!r} is the same as {v['same_as']!r}, which the model does not have")
            nets[k] = nets[v["same_as"]]
    return {k: nets[k] for k in d}


def model_to_dict(model: KernelModel) -> dict:
    """JSON-ready form of a calibrated model (asset packs)."""
    if isinstance(model, StateScaled):
        return {"type": "state_scaled", "factors": dict(model.factors), "inner": model_to_dict(model.inner)}
    if isinstance(model, MLPKernelModel):
        return {
            "type": "mlp",
            "name": model.name,
            "kinds": list(model.kinds),
            "router": model.router,
            "prefix": model.prefix,
            "fill": model.fill,
            "fallback": model.fallback_name,
            "nets": _nets_to_dict(model.nets),
        }
    if isinstance(model, FittedRoofline):
        return {
            "type": "fitted_roofline",
            "generic": model.generic,
            "fits": {k: {"floor_s": f.floor_s, "edges": list(f.edges), "bandwidths": list(f.bandwidths)}
                     for k, f in model.fits.items()},
        }
    if isinstance(model, PiecewiseCollective):
        return {
            "type": "piecewise_collective",
            "curves": [{"kind": k, "world": w, **vars(c)} for (k, w), c in sorted(model.params.items())],
        }
    raise TypeError(f"cannot serialise kernel model {type(model).__name__}")


def model_from_dict(d: Mapping) -> KernelModel:
    """Inverse of :func:`model_to_dict`; raises ``KeyError``/``ValueError``/``TypeError`` on bad input."""
    kind = d["type"]
    if kind == "state_scaled":
        if not isinstance(d["factors"], Mapping):
            raise TypeError("state_scaled factors must map op kinds to numbers")
        return StateScaled(model_from_dict(d["inner"]), {str(k): float(v) for k, v in d["factors"].items()})
    if kind == "mlp":
        nets = _nets_from_dict(d["nets"])
        return MLPKernelModel(d["name"], d["kinds"], nets, router=d.get("router", "single"),
                              prefix=d.get("prefix", ""), fill=d.get("fill", ""), fallback=d.get("fallback", "roofline"))
    if kind == "fitted_roofline":
        fits = {k: RooflineFit(float(v["floor_s"]), tuple(map(float, v["edges"])), tuple(map(float, v["bandwidths"])))
                for k, v in d["fits"].items()}
        for k, f in fits.items():
            if len(f.bandwidths) != len(f.edges) + 1 or min(f.bandwidths) <= 0:
                raise ValueError(f"roofline fit {k!r}: needs len(edges)+1 positive bandwidths")
        return FittedRoofline(fits, d.get("generic"))
    if kind == "piecewise_collective":
        fitted = {}
        for c in d["curves"]:
            c = dict(c)
            key = (str(c.pop("kind")), int(c.pop("world")))
            fitted[key] = PiecewiseSigmoid(**{k: float(v) for k, v in c.items()})
        return PiecewiseCollective(fitted)
    raise ValueError(f"unknown kernel model type {kind!r}")
