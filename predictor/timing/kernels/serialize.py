"""JSON form of every calibrated kernel model (weights as base64 float32), used by asset packs:
:func:`model_to_dict` and its inverse :func:`model_from_dict`."""

from __future__ import annotations

from collections.abc import Mapping

from predictor.timing.kernels.base import KernelModel
from predictor.timing.kernels.collective import PiecewiseCollective, PiecewiseSigmoid
from predictor.timing.kernels.learned import MLPKernelModel
from predictor.timing.kernels.mlp import MLPNet
from predictor.timing.kernels.roofline_fit import FittedRoofline, RooflineFit
from predictor.timing.kernels.state import StateScaled

__all__ = ["model_from_dict", "model_to_dict"]


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
