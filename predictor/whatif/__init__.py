"""What-if transforms of a captured execution graph, one module per kind of change.

Each transform is a pure ``ExecutionGraph -> ExecutionGraph`` on a graph carrying the
auxiliary columns of :mod:`predictor.sources.traces.step_graphs`; :mod:`predictor.whatif.apply` chains
them (``WhatIf`` spec, ``predict_trace``).

* :mod:`.batch` — :func:`scale_batch`
* :mod:`.layers` — :func:`detect_layers`, :func:`set_layers`
* :mod:`.data_parallel` — :func:`scale_dp`
* :mod:`.pipeline` — :func:`restage_pp`
* :mod:`.platform` — :func:`move_platform`, :func:`speed_up`
* :mod:`.timing` — :class:`WhatIfTiming`
"""

from predictor.whatif.batch import scale_batch
from predictor.whatif.common import WhatIfError
from predictor.whatif.data_parallel import scale_dp
from predictor.whatif.layers import LayerInfo, detect_layers, set_layers
from predictor.whatif.pipeline import restage_pp
from predictor.whatif.platform import move_platform, speed_up
from predictor.whatif.timing import RATIO_ALIAS, WhatIfTiming

__all__ = ["WhatIfError", "scale_batch", "LayerInfo", "detect_layers", "set_layers", "scale_dp", "restage_pp",
           "move_platform", "speed_up", "WhatIfTiming", "RATIO_ALIAS"]
