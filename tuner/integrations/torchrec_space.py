"""TorchRec inside ``space: sharding``: tasks read from TorchRec models, and the ``torchrec`` sharder.

A space's ``tasks.torchrec`` entries name ``package.module:callable`` models
(:func:`tuner.integrations.torchrec_io.load_torchrec_model`); :func:`torchrec_tasks` turns them into
tuner's tables (with each table's module path and the model's Topology, if it gave one).
``sharders: [..., torchrec]`` plans each task with TorchRec's own ``EmbeddingShardingPlanner``
(:func:`tuner.integrations.torchrec_estimator.torchrec_placement`), on the model's Topology when it
has one; the plan is scored by the same cost function as tuner's sharders.
"""

from __future__ import annotations

from typing import Any

from predictor.sources.synth.dlrm_tables import EmbeddingTables
from tuner.integrations.torchrec_io import (
    TorchRecInputError,
    load_torchrec_model,
    tables_from_model,
    torchrec_available,
)
from tuner.search.schema import SpaceError

__all__ = ["INSTALL_HINT", "require_torchrec", "torchrec_tasks"]

INSTALL_HINT = "pip install -e .[torchrec] && pip install --no-deps torchrec==1.8.0"


def require_torchrec(field: str) -> None:
    """:class:`SpaceError` naming ``field`` when torchrec does not import here."""
    if not torchrec_available():
        raise SpaceError(f"{field}: needs TorchRec, which is not installed ({INSTALL_HINT})")


def torchrec_tasks(entries: list[Any], n_gpus: int) -> list[tuple[EmbeddingTables, dict[str, str], Any]]:
    """(tables, table name -> module path, Topology or None) of every ``tasks.torchrec`` entry."""
    if entries:
        require_torchrec("tasks.torchrec")
    out = []
    for i, entry in enumerate(entries):
        where = f"tasks.torchrec.{i}.model"
        try:
            model = load_torchrec_model(entry.model)
        except TorchRecInputError as exc:
            raise SpaceError(f"{where}: {exc}") from None
        label = entry.name or entry.model.rpartition(":")[2]
        tables = tables_from_model(model, entry.pooling, label=label)
        if model.topology is not None and int(model.topology.world_size) != n_gpus:
            raise SpaceError(f"{where}: its Topology has world_size {model.topology.world_size}, the space n_gpus={n_gpus}")
        out.append((tables, model.paths, model.topology))
    return out
