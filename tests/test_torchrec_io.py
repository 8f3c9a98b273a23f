"""TorchRec round trip: an EmbeddingBagCollection in, a sharding plan out, the plan back in TorchRec,
and tuner's estimator inside TorchRec's planner (CPU, meta tensors). Skipped without the extra."""

from __future__ import annotations

import logging
import textwrap
import warnings

import numpy as np
import pytest

torchrec = pytest.importorskip("torchrec")

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology  # noqa: E402
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator  # noqa: E402
from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator  # noqa: E402

from predictor.sources.synth.dlrm import DLRMSpec  # noqa: E402
from predictor.sources.synth.dlrm_sharding import ShardedPlacement, TableShards  # noqa: E402
from predictor.sources.synth.dlrm_tables import EmbeddingTables  # noqa: E402
from predictor.timing.kernels.assets import resolve_platform  # noqa: E402
from tuner.integrations.torchrec_estimator import (  # noqa: E402
    dense_tensor_estimate,
    make_shard_estimator,
    torchrec_placement,
)
from tuner.integrations.torchrec_io import (  # noqa: E402
    PlanFileLoader,
    TorchRecInputError,
    constraints_from_tables,
    ebc_from_tables,
    load_sharding_plan,
    load_torchrec_model,
    placement_from_plan,
    tables_from_model,
    write_plan_file,
)

logging.getLogger("torchrec").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", category=FutureWarning)

MODEL_SRC = textwrap.dedent("""
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.distributed.planner import ParameterConstraints, Topology

    def make():
        cfgs = [EmbeddingBagConfig(name="users", embedding_dim=64, num_embeddings=2_000_000, feature_names=["u"]),
                EmbeddingBagConfig(name="goods", embedding_dim=128, num_embeddings=50_000, feature_names=["i", "j"]),
                EmbeddingBagConfig(name="ads", embedding_dim=32, num_embeddings=1_000, feature_names=["a"])]
        ebc = EmbeddingBagCollection(tables=cfgs, device=torch.device("meta"))
        cons = {"users": ParameterConstraints(pooling_factors=[30.0]),
                "goods": ParameterConstraints(pooling_factors=[2.0, 3.0])}
        return ebc, cons, Topology(world_size=4, compute_device="cuda", hbm_cap=80 * 2**30)

    def not_a_model():
        return 3
""")


@pytest.fixture
def model_module(tmp_path, monkeypatch):
    (tmp_path / "my_trec_model.py").write_text(MODEL_SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_trec_model"


def _tables() -> EmbeddingTables:
    return EmbeddingTables(rows=np.array([2_000_000, 50_000, 1_000, 300_000]), dim=np.array([64, 128, 32, 64]),
                           pooling=np.array([30.0, 5.0, 1.0, 12.0]), name=["a", "b", "c", "d"], label="t")


def test_ebc_constraints_topology_in(model_module):
    m = load_torchrec_model(f"{model_module}:make")
    assert m.topology.world_size == 4
    t = tables_from_model(m, default_pooling=7.0)
    assert t.name == ["users", "goods", "ads"]
    assert t.rows.tolist() == [2_000_000, 50_000, 1_000]
    assert t.dim.tolist() == [64, 128, 32]
    assert t.pooling.tolist() == [30.0, 5.0, 7.0]  # features of one table add up; no constraint -> default


def test_bad_model_reference(model_module):
    for ref in ("no_colon", f"{model_module}:missing", "no_such_pkg_xyz:make", f"{model_module}:not_a_model"):
        with pytest.raises(TorchRecInputError):
            load_torchrec_model(ref)


def test_plan_out_and_back(tmp_path):
    t = _tables()
    p = ShardedPlacement((TableShards.row_wise(2_000_000, 64, range(4)), TableShards.table_wise(50_000, 128, 2),
                          TableShards.data_parallel(1_000, 32, 4), TableShards.column_wise(300_000, 64, [1, 3])))
    path = write_plan_file(tmp_path / "plan.json", t, p, world_size=4, batch_size=2048)
    plan = load_sharding_plan(path)
    mod = plan.plan[""]
    assert mod["a"].sharding_type == "row_wise" and mod["a"].ranks == [0, 1, 2, 3]
    assert mod["b"].ranks == [2] and mod["c"].sharding_type == "data_parallel"
    assert [s.shard_sizes for s in mod["d"].sharding_spec.shards] == [[300_000, 32], [300_000, 32]]
    assert placement_from_plan(plan, t) == p


def test_planner_accepts_written_plan(tmp_path):
    """TorchRec plans, tuner writes that plan, TorchRec's planner loads the file and returns it unchanged."""
    t = _tables()
    topo = Topology(world_size=4, compute_device="cuda", hbm_cap=80 * 2**30)
    cons = constraints_from_tables(t)
    ebc = ebc_from_tables(t)
    plan = EmbeddingShardingPlanner(topology=topo, batch_size=256, constraints=cons, debug=False).plan(
        ebc, [EmbeddingBagCollectionSharder()])
    placement = placement_from_plan(plan, t)
    path = write_plan_file(tmp_path / "p.json", t, placement, world_size=4, batch_size=1024)
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=256, constraints=cons, debug=False,
                                       plan_loader=PlanFileLoader(path))
    again = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
    assert str(again) == str(plan)


def test_tuner_estimator_inside_torchrec_planner():
    t = _tables()
    resolved = resolve_platform("a100-80gb")
    topo = Topology(world_size=4, compute_device="cuda", hbm_cap=80 * 2**30)
    cons = constraints_from_tables(t)
    est = make_shard_estimator(topo, resolved.timing(), resolved.platform, cons)
    en = EmbeddingEnumerator(topo, 256, cons, estimator=[est, EmbeddingStorageEstimator(topo, cons)])
    opts = en.enumerate(ebc_from_tables(t), [EmbeddingBagCollectionSharder()])
    assert opts
    for so in opts:
        for sh in so.shards:
            assert sh.perf is not None and sh.storage is not None
            assert sh.perf.fwd_compute > 0 and sh.perf.bwd_compute > 0
            assert sh.perf.fwd_comms >= 0 and sh.perf.bwd_comms >= 0
    # a row-wise shard of the big table does less lookup work than the whole table
    tw = next(so for so in opts if so.name == "a" and so.sharding_type == "table_wise" and so.compute_kernel == "fused")
    rw = next(so for so in opts if so.name == "a" and so.sharding_type == "row_wise" and so.compute_kernel == "fused")
    assert rw.shards[0].perf.fwd_compute < tw.shards[0].perf.fwd_compute
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=256, constraints=cons, enumerator=en, debug=False)
    plan = planner.plan(ebc_from_tables(t), [EmbeddingBagCollectionSharder()])
    assert set(plan.plan[""]) == {"a", "b", "c", "d"}


def test_torchrec_candidate_and_dense_estimate():
    t = _tables()
    spec = DLRMSpec(tables=t, batch_size=1024)
    resolved = resolve_platform("a100-80gb")
    dense = dense_tensor_estimate(spec, 4)
    assert 0 < dense < 1e9
    placement, info = torchrec_placement(spec, 4, resolved.platform, 0.8, timing=resolved.timing())
    assert len(placement) == 4 and info["estimator"] == "tuner"
    assert sum(info["sharding_types"].values()) == 4
    # TorchRec's proposals rated by tuner's simulator: its pick is no slower than its default pick
    from tuner.cost import DLRMShardingJob
    from tuner.sharders.sharding_types import TypedShardingJob

    job = DLRMShardingJob(spec, 4, resolved.platform, resolved.timing())
    rated, info = torchrec_placement(spec, 4, resolved.platform, 0.8, job=job)
    default, _ = torchrec_placement(spec, 4, resolved.platform, 0.8)
    assert info["perf_model"] == "tuner-simulator"
    typed = TypedShardingJob(job)
    assert typed.objective(rated) <= typed.objective(default) * (1 + 1e-9)


def test_space_with_torchrec_task_and_sharder(tmp_path, model_module):
    """A space reads a TorchRec model, runs TorchRec's planner as a candidate, writes loadable plans."""
    import json

    import torch

    from tuner.search import default_storage
    from tuner.search.schema import SpaceError
    from tuner.search.sharding import ShardingSpace, build_sharding_context, run_sharding_search

    doc = {"space": "sharding", "platform": "a100-80gb", "n_gpus": 4, "batch_sizes": [1024],
           "tasks": {"torchrec": [{"model": f"{model_module}:make", "name": "mine", "pooling": 4.0}]},
           "model": {"bottom_mlp": [64, 32], "top_mlp": [64, 1]},
           "sharders": ["size_greedy", "model_guided", "torchrec"], "model_guided": {"max_evals": 4}}
    space = ShardingSpace.model_validate(doc)
    result = run_sharding_search(space, storage=default_storage(tmp_path), workers=0)
    payload = result.space.write_outputs(result, tmp_path / "o")
    cands = {c["sharder"]: c for c in payload["tasks"][0]["candidates"]}
    assert cands["torchrec"]["status"] == "ok" and cands["torchrec"]["predicted_iteration_s"] > 0
    assert payload["tasks"][0]["task"] == "mine" and payload["tasks"][0]["n_tables"] == 3
    plan_doc = json.loads((tmp_path / "o" / "plans" / "mine_b1024.json").read_text())
    assert set(plan_doc["plan"][""]) == {"users", "goods", "ads"}
    plan = torch.load(tmp_path / "o" / "plans" / "mine_b1024.pt", weights_only=False)
    assert str(plan) == str(load_sharding_plan(tmp_path / "o" / "plans" / "mine_b1024.json"))
    # a topology of another size than n_gpus is one clear error
    bad = ShardingSpace.model_validate({**doc, "n_gpus": 2})
    with pytest.raises(SpaceError, match="world_size 4"):
        build_sharding_context(bad)
