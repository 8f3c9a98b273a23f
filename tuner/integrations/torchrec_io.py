"""TorchRec in and out: read an ``EmbeddingBagCollection`` (+ ``ParameterConstraints``, ``Topology``)
as tuner's tables, and write tuner's placements as TorchRec sharding plans.

In
    :func:`load_torchrec_model` imports ``package.module:callable`` and calls it; the callable returns
    an ``nn.Module`` holding one or more ``EmbeddingBagCollection`` (meta device is fine), or a
    tuple ``(module, constraints)`` / ``(module, constraints, topology)``, or a dict with keys
    ``model``, ``constraints``, ``topology``. :func:`tables_from_model` reads every table's rows,
    dimension and pooling factor (the constraint's ``pooling_factors`` summed over the table's
    features, else the given default).
Out
    :func:`write_plan_file` writes a placement as JSON in TorchRec's vocabulary (module path ->
    table -> ``sharding_type``, ``compute_kernel``, ``ranks``, shards with sizes and offsets); it needs
    no TorchRec. With TorchRec installed, :func:`load_sharding_plan` turns the file into a
    ``ShardingPlan`` (for ``DistributedModelParallel(plan=...)``), :func:`save_torchrec_plan` pickles
    one with ``torch.save``, and :class:`PlanFileLoader` hands the file to
    ``EmbeddingShardingPlanner(plan_loader=...)``, which then returns it as its plan.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from predictor.files import atomic_write_text
from predictor.sources.synth.dlrm_sharding import ShardedPlacement, TableShards, as_placement
from predictor.sources.synth.dlrm_tables import EmbeddingTables

__all__ = ["TorchRecModel", "TorchRecInputError", "import_callable", "load_torchrec_model", "tables_from_model",
           "ebc_from_tables", "constraints_from_tables", "plan_records", "write_plan_file", "read_plan_file",
           "load_sharding_plan", "save_torchrec_plan", "placement_from_plan", "PlanFileLoader", "torchrec_available",
           "PLAN_FORMAT"]

PLAN_FORMAT = "tuner-torchrec-plan/1"
#: pooling factor TorchRec's planner assumes for a table without constraints (``POOLING_FACTOR``)
TORCHREC_DEFAULT_POOLING = 1.0


class TorchRecInputError(ValueError):
    """A TorchRec model reference or what it returned cannot be used (the message says why)."""


def torchrec_available() -> bool:
    """Whether ``torchrec`` imports here."""
    try:
        import torchrec  # noqa: F401
    except Exception:
        return False
    return True


@dataclass
class TorchRecModel:
    """What a model reference gave: the module, its tables' module paths, constraints and topology."""

    module: Any
    #: table name -> path of the EmbeddingBagCollection holding it ("" for a bare collection)
    paths: dict[str, str]
    constraints: dict[str, Any] = field(default_factory=dict)
    topology: Any = None


def import_callable(ref: str) -> Any:
    """The object ``package.module:callable`` names; :class:`TorchRecInputError` when it does not resolve."""
    mod, sep, attr = ref.partition(":")
    if not sep or not mod or not attr:
        raise TorchRecInputError(f"{ref!r} is not of the form package.module:callable")
    try:
        obj: Any = importlib.import_module(mod)
    except Exception as exc:
        raise TorchRecInputError(f"cannot import {mod!r}: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TorchRecInputError(f"{mod!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TorchRecInputError(f"{ref!r} is not callable")
    return obj


def _collections(module: Any) -> dict[str, Any]:
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return {path: m for path, m in module.named_modules() if isinstance(m, EmbeddingBagCollection)}


def load_torchrec_model(ref: str) -> TorchRecModel:
    """Call ``package.module:callable`` and sort out what it returned (see the module docstring)."""
    from torchrec.distributed.planner import ParameterConstraints, Topology

    out = import_callable(ref)()
    if isinstance(out, dict):
        module, constraints, topology = out.get("model"), out.get("constraints"), out.get("topology")
    elif isinstance(out, tuple):
        if not 1 <= len(out) <= 3:
            raise TorchRecInputError(f"{ref} returned a tuple of {len(out)}; expected (model, constraints, topology)")
        module, constraints, topology = (*out, None, None)[:3]
    else:
        module, constraints, topology = out, None, None
    if module is None or not hasattr(module, "named_modules"):
        raise TorchRecInputError(f"{ref} returned no nn.Module")
    ebcs = _collections(module)
    if not ebcs:
        raise TorchRecInputError(f"{ref} returned a module without an EmbeddingBagCollection")
    paths: dict[str, str] = {}
    for path, ebc in ebcs.items():
        for cfg in ebc.embedding_bag_configs():
            if cfg.name in paths:
                raise TorchRecInputError(f"table {cfg.name!r} appears twice in {ref}")
            paths[cfg.name] = path
    constraints = dict(constraints or {})
    for k, v in constraints.items():
        if not isinstance(v, ParameterConstraints):
            raise TorchRecInputError(f"constraints[{k!r}] is a {type(v).__name__}, not ParameterConstraints")
    if topology is not None and not isinstance(topology, Topology):
        raise TorchRecInputError(f"{ref} returned a {type(topology).__name__} where a Topology goes")
    return TorchRecModel(module, paths, constraints, topology)


def tables_from_model(model: TorchRecModel, default_pooling: float | None = None, label: str = "") -> EmbeddingTables:
    """The model's tables: rows, dim and pooling (constraints' ``pooling_factors`` summed over the
    table's features, else ``default_pooling``, else TorchRec's default 1.0)."""
    rows, dims, pool, names = [], [], [], []
    dtype_bytes = 4
    for ebc in _collections(model.module).values():
        for cfg in ebc.embedding_bag_configs():
            c = model.constraints.get(cfg.name)
            if c is not None and c.pooling_factors:
                p = float(sum(c.pooling_factors))
            else:
                p = float(default_pooling if default_pooling is not None else TORCHREC_DEFAULT_POOLING)
            rows.append(int(cfg.num_embeddings))
            dims.append(int(cfg.embedding_dim))
            pool.append(p)
            names.append(cfg.name)
            dtype_bytes = 2 if "16" in str(cfg.data_type) else 4
    return EmbeddingTables(rows=np.asarray(rows), dim=np.asarray(dims), pooling=np.asarray(pool), name=names,
                           label=label, dtype_bytes=dtype_bytes)


def ebc_from_tables(tables: EmbeddingTables) -> Any:
    """A meta-device ``EmbeddingBagCollection`` with one single-feature table per tuner table."""
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    names = tables.name or [f"t{i}" for i in range(len(tables))]
    cfgs = [EmbeddingBagConfig(name=n, embedding_dim=int(d), num_embeddings=int(e), feature_names=[f"f_{n}"])
            for n, e, d in zip(names, tables.rows, tables.dim, strict=True)]
    return EmbeddingBagCollection(tables=cfgs, device=torch.device("meta"))


def constraints_from_tables(tables: EmbeddingTables, sharding_types: list[str] | None = None,
                            compute_kernels: list[str] | None = None) -> dict[str, Any]:
    """``ParameterConstraints`` carrying every table's pooling factor (and the allowed types and kernels)."""
    from torchrec.distributed.planner import ParameterConstraints

    names = tables.name or [f"t{i}" for i in range(len(tables))]
    return {n: ParameterConstraints(sharding_types=sharding_types, compute_kernels=compute_kernels,
                                    pooling_factors=[float(p)])
            for n, p in zip(names, tables.pooling, strict=True)}


# ----------------------------------------------------------------------------- plans out
def _kernel(sharding_type: str, compute_device: str) -> str:
    return "dense" if sharding_type == "data_parallel" else "fused"


def plan_records(tables: EmbeddingTables, placement: np.ndarray | ShardedPlacement, paths: dict[str, str] | None = None,
                 compute_device: str = "cuda") -> dict[str, dict[str, dict]]:
    """A placement as ``{module path: {table: {sharding_type, compute_kernel, ranks, shards}}}``."""
    p = as_placement(tables, placement)
    names = tables.name or [f"t{i}" for i in range(len(tables))]
    out: dict[str, dict[str, dict]] = {}
    for name, ts in zip(names, p.tables, strict=True):
        path = (paths or {}).get(name, "")
        shards = [{"size": list(s), "offset": list(o), "rank": int(r)}
                  for r, s, o in zip(ts.ranks, ts.sizes, ts.offsets, strict=True)]
        out.setdefault(path, {})[name] = {"sharding_type": ts.sharding_type,
                                          "compute_kernel": _kernel(ts.sharding_type, compute_device),
                                          "ranks": [int(r) for r in ts.ranks], "shards": shards}
    return out


def write_plan_file(path: Path, tables: EmbeddingTables, placement: np.ndarray | ShardedPlacement, *, world_size: int,
                    batch_size: int, compute_device: str = "cuda", local_world_size: int | None = None,
                    paths: dict[str, str] | None = None, meta: dict | None = None) -> Path:
    """Write the plan file (JSON, :data:`PLAN_FORMAT`); ``batch_size`` is the global batch."""
    doc = {"format": PLAN_FORMAT, "compute_device": compute_device, "world_size": int(world_size),
           "local_world_size": int(local_world_size or world_size), "batch_size_per_rank": int(batch_size) // world_size,
           "dtype_bytes": int(tables.dtype_bytes),
           "pooling_factors": {n: float(p) for n, p in zip(tables.name or [], tables.pooling, strict=False)},
           **(meta or {}), "plan": plan_records(tables, placement, paths, compute_device)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=1))
    return path


def read_plan_file(path: Path) -> dict:
    """The plan file's document; ``ValueError`` when it is not one."""
    doc = json.loads(Path(path).read_text())
    if doc.get("format") != PLAN_FORMAT:
        raise ValueError(f"{path}: not a {PLAN_FORMAT} file")
    return doc


def load_sharding_plan(path: Path) -> Any:
    """The plan file as a TorchRec ``ShardingPlan`` (as ``EmbeddingShardingPlanner.plan`` builds one)."""
    from torchrec.distributed.planner.utils import placement
    from torchrec.distributed.types import (
        EmbeddingModuleShardingPlan,
        EnumerableShardingSpec,
        ParameterSharding,
        ShardingPlan,
        ShardMetadata,
    )

    doc = read_plan_file(path)
    dev, local = doc["compute_device"], int(doc["local_world_size"])
    plan = {}
    for mpath, tabs in doc["plan"].items():
        mod = EmbeddingModuleShardingPlan()
        for name, t in tabs.items():
            spec = None
            if t["sharding_type"] != "data_parallel":
                spec = EnumerableShardingSpec([ShardMetadata(shard_sizes=list(s["size"]), shard_offsets=list(s["offset"]),
                                                             placement=placement(dev, int(s["rank"]), local))
                                               for s in t["shards"]])
            mod[name] = ParameterSharding(sharding_type=t["sharding_type"], compute_kernel=t["compute_kernel"],
                                          ranks=[int(r) for r in t["ranks"]], sharding_spec=spec)
        plan[mpath] = mod
    return ShardingPlan(plan)


def save_torchrec_plan(path: Path, plan: Any) -> Path:
    """``torch.save`` a ``ShardingPlan`` (load it with ``torch.load(path, weights_only=False)``)."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(plan, path)
    return path


def placement_from_plan(plan: Any, tables: EmbeddingTables, paths: dict[str, str] | None = None) -> ShardedPlacement:
    """A TorchRec ``ShardingPlan`` as tuner's placement of ``tables`` (matched by table name)."""
    names = tables.name or [f"t{i}" for i in range(len(tables))]
    out = []
    for i, name in enumerate(names):
        ps = (plan.plan.get((paths or {}).get(name, "")) or {}).get(name)
        if ps is None:
            raise ValueError(f"the plan has no entry for table {name!r}")
        e, d = int(tables.rows[i]), int(tables.dim[i])
        if ps.sharding_type == "data_parallel":
            out.append(TableShards("data_parallel", tuple(ps.ranks), ((e, d),) * len(ps.ranks), ((0, 0),) * len(ps.ranks)))
            continue
        shards = ps.sharding_spec.shards
        out.append(TableShards(ps.sharding_type, tuple(int(str(s.placement).split("/")[0].split(":")[1]) for s in shards),
                               tuple((int(s.shard_sizes[0]), int(s.shard_sizes[1])) for s in shards),
                               tuple((int(s.shard_offsets[0]), int(s.shard_offsets[1])) for s in shards)))
    return ShardedPlacement(tuple(out))


def _plan_loader_base() -> type:
    from torchrec.distributed.planner.types import PlanLoader

    return PlanLoader


def PlanFileLoader(path: Path, tables: EmbeddingTables | None = None) -> Any:  # noqa: N802 - a class factory
    """A TorchRec ``PlanLoader`` over a plan file: ``EmbeddingShardingPlanner(plan_loader=PlanFileLoader(p))``
    returns the file's plan from ``plan()`` (TorchRec matches each table's options by fqn, sharding type,
    kernel and shard count, and takes the shards from the file)."""
    from torchrec.distributed.planner.enumerators import get_partition_by_type

    doc = read_plan_file(path)
    base = _plan_loader_base()

    class _Loader(base):  # type: ignore[misc, valid-type]
        def load(self) -> dict[int, Any]:
            import torch
            from torch import nn
            from torchrec.distributed.planner.types import Perf, Shard, ShardingOption, Storage

            dev, dt = doc["compute_device"], int(doc.get("dtype_bytes", 4))

            def storage(size: list[int]) -> Storage:
                # the shard's weights (the planner's stats sum them); no time estimate is stored
                b = int(size[0]) * int(size[1]) * dt
                return Storage(hbm=b if dev != "cpu" else 0, ddr=b if dev == "cpu" else 0)

            out: dict[int, Any] = {}
            holder = nn.Module()
            for mpath, tabs in doc["plan"].items():
                for name, t in tabs.items():
                    rows = max(s["offset"][0] + s["size"][0] for s in t["shards"])
                    cols = max(s["offset"][1] + s["size"][1] for s in t["shards"])
                    so = ShardingOption(
                        name=name, tensor=torch.empty(rows, cols, device="meta"), module=(mpath, holder),
                        input_lengths=[float(doc.get("pooling_factors", {}).get(name, 1.0))],
                        batch_size=int(doc["batch_size_per_rank"]), sharding_type=t["sharding_type"],
                        partition_by=get_partition_by_type(t["sharding_type"]), compute_kernel=t["compute_kernel"],
                        shards=[Shard(size=list(s["size"]), offset=list(s["offset"]), rank=int(s["rank"]),
                                      storage=storage(s["size"]), perf=Perf(0.0, 0.0, 0.0, 0.0))
                                for s in t["shards"]],
                        is_pooled=True)
                    out[so.storage_hash()] = so
            return out

        def plan_context_hash(self) -> str | None:
            return None

        def get_plan_id(self) -> str:
            return str(path)

    return _Loader()
