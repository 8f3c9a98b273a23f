"""Small space files several test modules search (import with ``from spaces import ...``)."""

from __future__ import annotations

#: a sharding space of 2 generated tasks x 2 batch sizes x 2 sharders on 2 A100s (a second or two of CPU)
SMALL_SHARDING = {
    "space": "sharding",
    "platform": "a100-80gb",
    "n_gpus": 2,
    "batch_sizes": [512, 1024],
    "tasks": {"generate": {"count": 2, "seed": 1}},
    "model": {"bottom_mlp": [64, 32], "top_mlp": [64, 1]},
    "sharders": ["naive", "size_greedy"],
}

#: a parallel space of a 2-layer transformer on 2 A100s: TP 1 or 2 (two plans)
SMALL_PARALLEL = {
    "space": "parallel",
    "model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 128, "vocab": 1000},
    "cluster": {"platform": "a100-80gb", "nodes": 1, "devices_per_node": 2},
    "global_batch": 8,
    "ranges": {"tp": [1, 2], "pp": [1], "micro_batch": [1], "schedule": ["1f1b"], "recompute": ["none"]},
}
