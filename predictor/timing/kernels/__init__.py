"""Kernel time models behind one protocol (:class:`KernelModel`), and the timing that applies them.

One module per kernel family: :mod:`.gemm`, :mod:`.embedding`, :mod:`.elementwise`,
:mod:`.collective`; the learned ones in :mod:`.learned`, :mod:`.roofline_fit` and :mod:`.mlp`.
:class:`ModelTiming` routes every task of a graph to its model. :mod:`.assets` keeps calibrated models with
their platform on disk as asset packs and resolves a ``--platform`` value to a timing (:func:`timing_for`).
"""

from predictor.timing.kernels.assets import timing_for
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
