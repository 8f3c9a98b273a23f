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
