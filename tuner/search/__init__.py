"""The search core and the spaces plugged into it.

* :mod:`.core` — the vocabulary (space -> candidates -> evaluation -> outcome), proposers, and
  :func:`run_search`, the one driver;
* :mod:`.executor` — evaluations in this process or as Ray tasks, a bounded window in flight;
* :mod:`.study` — the Optuna study as the record: storage, study names, trials, resume;
* :mod:`.tpe` — Optuna's TPE sampler as a proposer;
* :mod:`.schema`, :mod:`.registry` — space files: validation, the kinds, the ``tuner search`` runner;
* one module per space: :mod:`.sharding`, :mod:`.parallel`, :mod:`.accelerators`
  (their outputs are in :mod:`tuner.report`).
"""

from tuner.search.core import Candidate, Outcome, SearchResult, SearchSpace, run_search
from tuner.search.study import default_storage

__all__ = ["Candidate", "Outcome", "SearchResult", "SearchSpace", "run_search", "default_storage"]
