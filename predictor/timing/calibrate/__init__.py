"""Calibrate a device: run the microbenchmarks, fit every kernel model, write an asset pack.

``calibrate(CalibrationOptions(device=..., out=...))`` is what ``tuner calibrate`` runs (:mod:`.run`):

1. the platform to refine (:mod:`.calibrated_platform`): on CPU the measured ``cpu-local`` entry
   (:func:`~predictor.timing.platforms.cpu_local.measure_cpu_local`), on CUDA the catalog entry of
   the GPU's model;
2. every benchmark family of :mod:`predictor.timing.calibration` on the device (grid size by level,
   :mod:`.options`: ``tiny`` for tests, ``quick`` for a few minutes on a 2-core CPU, ``full`` for real
   devices), collectives on ``world_size`` local processes (gloo on CPU, NCCL on GPUs), the host probes
   (:mod:`.probes`) and the host overheads T1..T5 from a profiled training run;
3. per kernel a random 20 % of the samples is held out; the model of the kernel (MLP with
   the grid search of Lin et al. 2022 Table II, fitted roofline, or piecewise sigmoid) is
   fitted on the other 80 % and its error on the held-out 20 % is reported as Table I of the
   paper does: GMAE, MAPE and the standard deviation of the absolute percentage errors (:mod:`.fit`,
   :mod:`.report`);
4. the calibrated platform (measured peak FLOP/s, bandwidths, collective latency, overheads)
   and the models are written as an asset pack (:mod:`.pack`, :mod:`predictor.timing.kernels.assets`)
   that ``--platform NAME`` then uses.

``refit(PACK)`` (:mod:`.refit`) fits a stored pack's models again from the benchmark data it keeps, no device
needed, optionally with data pooled from other calibration runs of the same machine (:mod:`.pool`).
"""

from __future__ import annotations

from predictor.timing.calibrate.options import (
    HOLDOUT_FRACTION,
    CalibrationError,
    CalibrationOptions,
    parse_device,
)
from predictor.timing.calibrate.refit_pack import refit
from predictor.timing.calibrate.report import (
    NOISY_ROUND_SPREAD_PCT,
    compute_round_spread,
    error_table_markdown,
    round_spreads,
)
from predictor.timing.calibrate.run import calibrate

__all__ = ["HOLDOUT_FRACTION", "NOISY_ROUND_SPREAD_PCT", "CalibrationError", "CalibrationOptions", "calibrate",
           "compute_round_spread", "error_table_markdown", "parse_device", "refit", "round_spreads"]
