"""The critical-path simulator and trace replay.

* :mod:`.engine` — :func:`simulate` (graph + timing -> :class:`Timeline`, seconds)
* :mod:`.replay` — :func:`replay`: a captured trace read, rebuilt and simulated, per step against the measurement
"""

from predictor.simulate.engine import Breakdown, MeasuredTiming, Timeline, simulate, union_length

__all__ = ["Breakdown", "MeasuredTiming", "Timeline", "simulate", "union_length"]
