"""Kernel time models behind one protocol (:class:`KernelModel`), and the timing that applies them.

One module per kernel family: :mod:`.gemm`, :mod:`.embedding`, :mod:`.elementwise`,
:mod:`.collective`. :class:`ModelTiming` routes every task of a graph to its model.
"""

from predictor.kernels.base import KernelModel, TaskView
from predictor.kernels.collective import PiecewiseCollective, PiecewiseSigmoid, alpha_beta
from predictor.kernels.elementwise import Roofline
from predictor.kernels.embedding import AnalyticEmbedding
from predictor.kernels.gemm import AnalyticGemm
from predictor.kernels.timing import ModelTiming, analytic_models

__all__ = [
    "KernelModel",
    "TaskView",
    "AnalyticGemm",
    "AnalyticEmbedding",
    "Roofline",
    "PiecewiseCollective",
    "PiecewiseSigmoid",
    "alpha_beta",
    "ModelTiming",
    "analytic_models",
    "timing_for",
]


def timing_for(name_or_path: str, extra=None, keep_measured: bool = False) -> ModelTiming:
    """ModelTiming for a ``--platform`` value: an asset pack's calibrated models, or the analytic ones.

    ``timing.source`` says which (see :func:`predictor.platforms.assets.resolve_platform`).
    """
    from predictor.platforms.assets import timing_for as _timing_for

    return _timing_for(name_or_path, extra, keep_measured)
