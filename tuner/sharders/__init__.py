"""Embedding-table sharders behind one contract, :class:`Sharder` (table-wise placement of whole tables).

* :mod:`.base` — the contract, :class:`InfeasibleShardingError` and the memory checks;
* :mod:`.heuristics` — the six sharders of Lin et al. 2024 Table III and their registry
  (:data:`SHARDERS`, :func:`get_sharder`);
* :mod:`.local_search` — moves and swaps under any cost, e.g. the simulator's predicted time;
* :mod:`.model_guided` — greedy on predicted kernel time, then local search on the simulator.
"""

from tuner.sharders.base import (
    InfeasibleShardingError,
    Sharder,
    check_assignment,
    rank_loads,
)
from tuner.sharders.heuristics import (
    SHARDERS,
    GreedySharder,
    LookupGreedySharder,
    NaiveSharder,
    NormLookupGreedySharder,
    RandomSharder,
    SizeGreedySharder,
    SizeLookupGreedySharder,
    get_sharder,
)
from tuner.sharders.local_search import local_search
from tuner.sharders.model_guided import ModelGuidedSharder, model_guided_shard

__all__ = [
    "InfeasibleShardingError",
    "Sharder",
    "NaiveSharder",
    "RandomSharder",
    "GreedySharder",
    "SizeGreedySharder",
    "LookupGreedySharder",
    "NormLookupGreedySharder",
    "SizeLookupGreedySharder",
    "ModelGuidedSharder",
    "SHARDERS",
    "get_sharder",
    "rank_loads",
    "check_assignment",
    "local_search",
    "model_guided_shard",
]
