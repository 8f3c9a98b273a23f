"""Kernel time models behind one protocol (:class:`KernelModel`), and the timing that applies them.

One module per kernel family: :mod:`.gemm`, :mod:`.embedding`, :mod:`.elementwise`,
:mod:`.collective`. :class:`ModelTiming` routes every task of a graph to its model.
"""

from predictor.kernels.base import KernelModel, TaskView
from predictor.kernels.collective import PiecewiseCollective, PiecewiseSigmoid, analytic_params
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
    "analytic_params",
    "ModelTiming",
    "analytic_models",
]
