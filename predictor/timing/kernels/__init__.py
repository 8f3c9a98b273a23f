"""Kernel time models behind one protocol (:class:`KernelModel`), and the timing that applies them.

One module per kernel family: :mod:`.gemm`, :mod:`.embedding`, :mod:`.elementwise`,
:mod:`.collective`. :class:`ModelTiming` routes every task of a graph to its model.
"""

from predictor.timing.kernels.base import KernelModel, TaskView
from predictor.timing.kernels.collective import PiecewiseCollective, PiecewiseSigmoid, alpha_beta
from predictor.timing.kernels.elementwise import Roofline
from predictor.timing.kernels.embedding import AnalyticEmbedding
from predictor.timing.kernels.gemm import AnalyticGemm
from predictor.timing.kernels.timing import ModelTiming, analytic_models

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

    ``timing.source`` says which (see :func:`predictor.timing.platforms.assets.resolve_platform`).
    """
    from predictor.timing.platforms.assets import timing_for as _timing_for

    return _timing_for(name_or_path, extra, keep_measured)
