"""Other tools' formats in and out of tuner.

* :mod:`.torchrec_io` — TorchRec models, constraints and topologies in; sharding plans out (a JSON
  plan file, a pickled ``ShardingPlan``, a ``PlanLoader`` the planner accepts);
* :mod:`.torchrec_estimator` — a TorchRec ``ShardEstimator`` backed by tuner's kernel models, and
  TorchRec's own planner as a candidate of the sharding search.

TorchRec is optional (``pip install -e .[torchrec]``, see docs/sharding.md); these modules import
it only inside the functions that need it.
"""
