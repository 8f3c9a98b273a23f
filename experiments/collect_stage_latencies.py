"""Measure the stage-latency data set of the stage model (PredTOP training data).

Every contiguous layer range of the GPT variants in ``predictor.stage.dataset.DEFAULT_MODELS``
at TP 1/2/4 (emulated by shapes): forward + backward of one micro-batch, one torch thread,
thread CPU time, several shuffled passes (protocol in ``predictor/stage/dataset.py``).
Timing-sensitive — run it under the shared lock:

    flock /tmp/tuner-measure.lock python experiments/collect_stage_latencies.py collect \
        [--out predictor/stage/data/cpu_stage_latencies.json] [--passes 12]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predictor.stage.dataset import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
