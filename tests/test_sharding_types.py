"""Row-wise, column-wise, table-row-wise and data-parallel sharding in the DLRM graph: the collectives
TorchRec runs for each, memory per rank, and the model-guided sharder's choice of types."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.simulate import simulate
from predictor.sources.synth.dlrm import DLRMSpec, build_dlrm_graph
from predictor.sources.synth.dlrm_sharded_graph import build_sharded_dlrm_graph
from predictor.sources.synth.dlrm_sharding import (
    ShardedPlacement,
    TableShards,
    even_cuts,
    lookup_shards,
    sharded_memory_per_rank,
)
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.timing.kernels.assets import resolve_platform
from tuner.cost import DLRMShardingJob
from tuner.sharders import ModelGuidedSharder, get_sharder
from tuner.sharders.sharding_types import TypedShardingJob, refine_sharding_types

TABLES = EmbeddingTables(rows=np.array([4_000_000, 20_000, 500, 100_000, 7_000]), dim=np.array([64, 64, 32, 128, 64]),
                         pooling=np.array([60.0, 4.0, 1.0, 10.0, 2.0]))
SPEC = DLRMSpec(tables=TABLES, batch_size=1024, bottom_mlp=(128, 64), top_mlp=(128, 1))
B, DT = 1024, 4


def _tasks(g, kind: str, rank: int | None = None) -> np.ndarray:
    idx = np.flatnonzero(np.asarray(g.kinds)[g.kind] == kind)
    return idx if rank is None else idx[g.rank[idx] == rank]


def _placement(**kinds: TableShards) -> ShardedPlacement:
    base = [TableShards.table_wise(int(e), int(d), i % 4) for i, (e, d) in enumerate(zip(TABLES.rows, TABLES.dim,
                                                                                         strict=True))]
    for k, v in kinds.items():
        base[int(k[1:])] = v
    return ShardedPlacement(tuple(base))


@pytest.mark.parametrize("mode", ["device", "host"])
def test_table_wise_placement_gives_the_table_wise_graph(mode):
    a = np.array([0, 1, 2, 3, 0])
    g1 = build_dlrm_graph(SPEC, a, 4, mode=mode)
    g2 = build_sharded_dlrm_graph(SPEC, ShardedPlacement.from_assignment(TABLES, a), 4, mode=mode)
    assert g1.n_tasks == g2.n_tasks
    timing = resolve_platform("a100-80gb").timing()
    assert simulate(g2, timing).iteration_s == pytest.approx(simulate(g1, timing).iteration_s, rel=1e-9)


@pytest.mark.parametrize("mode", ["device", "host"])
def test_row_wise_reduce_scatter_and_all_gather(mode):
    p = ShardedPlacement(tuple(TableShards.row_wise(int(e), int(d), range(4)) for e, d in zip(TABLES.rows, TABLES.dim,
                                                                                               strict=True)))
    g = build_sharded_dlrm_graph(SPEC, p, 4, mode=mode)
    assert _tasks(g, "all_to_all").size == 0  # no table-wise shard: no all-to-all
    for kind in ("reduce_scatter", "all_gather"):
        ks = _tasks(g, kind)
        assert sorted(g.rank[ks].tolist()) == [0, 1, 2, 3]  # one fused collective per rank
        assert np.allclose(g.params["msg_bytes"][ks], B * TABLES.dim.sum() * DT)  # [B, sum D] partial sums
        assert np.all(g.params["world"][ks] == 4)
        assert len(set(g.group[ks].tolist())) == 1
    # every rank looks up its quarter of the rows for the global batch, pooling in proportion
    fwd = _tasks(g, "embedding_bag_fwd", rank=1)
    assert fwd.size == len(TABLES)
    assert np.allclose(g.params["batch"][fwd], B)
    assert g.params["rows"][fwd][0] == 1_000_000 and g.params["pooling"][fwd][0] == pytest.approx(15.0)


def test_column_wise_shards_go_through_the_all_to_all():
    p = _placement(t0=TableShards.column_wise(4_000_000, 64, [0, 1]), t3=TableShards.column_wise(100_000, 128, range(4)))
    g = build_sharded_dlrm_graph(SPEC, p, 4)
    assert _tasks(g, "reduce_scatter").size == 0
    a2a = _tasks(g, "all_to_all")
    # columns per rank: t0 32+32 on 0,1; t3 32 on each; t1 64 on 1, t2 32 on 2, t4 64 on 0 (table-wise)
    cols = np.array([32 + 32 + 64, 32 + 64 + 32, 32 + 32, 32])
    assert np.allclose(g.params["msg_bytes"][a2a], max(B * cols.max(), B / 4 * cols.sum()) * DT)
    fwd = _tasks(g, "embedding_bag_fwd", rank=0)
    assert sorted(g.params["dim"][fwd].tolist()) == [32, 32, 64]


def test_data_parallel_replica_all_reduce_and_local_batch():
    p = _placement(t2=TableShards.data_parallel(500, 32, 4))
    g = build_sharded_dlrm_graph(SPEC, p, 4)
    ar = [k for k in _tasks(g, "all_reduce") if np.asarray(g.names)[g.name[k]] == "dp.all_reduce"]
    assert len(ar) == 4 and np.allclose(g.params["msg_bytes"][ar], 500 * 32 * DT)
    dp = [s for s in lookup_shards(TABLES, p, 4, B) if s.table == 2]
    assert len(dp) == 4 and all(s.batch == B / 4 and s.output == "local" for s in dp)


def test_table_row_wise_on_one_host_of_two():
    p = _placement(t0=TableShards.row_wise(4_000_000, 64, [2, 3], kind="table_row_wise"))
    g = build_sharded_dlrm_graph(SPEC, p, 4)
    rs = _tasks(g, "reduce_scatter")
    assert sorted(g.rank[rs].tolist()) == [2, 3] and np.all(g.params["world"][rs] == 2)


def test_memory_row_wise_splits_data_parallel_replicates():
    tw = sharded_memory_per_rank(SPEC, _placement(), 4)
    rw = sharded_memory_per_rank(SPEC, _placement(t0=TableShards.row_wise(4_000_000, 64, range(4))), 4)
    table0 = 4_000_000 * 64 * 4
    assert tw[0] - rw[0] == pytest.approx(table0 * 3 / 4, rel=0.01)
    dp = sharded_memory_per_rank(SPEC, _placement(t2=TableShards.data_parallel(500, 32, 4)), 4)
    assert np.all(dp[[0, 1, 3]] > tw[[0, 1, 3]])


def test_records_round_trip_and_cuts():
    p = _placement(t0=TableShards.row_wise(4_000_000, 64, range(4)), t1=TableShards.column_wise(20_000, 64, [3, 1]))
    assert ShardedPlacement.from_records(p.as_records()) == p
    assert even_cuts(10, 4) == [3, 3, 3, 1] and sum(even_cuts(4_000_001, 4)) == 4_000_001
    with pytest.raises(ValueError):
        TableShards("diagonal", (0,), ((1, 1),), ((0, 0),))


def test_model_guided_types_never_worse_and_row_wise_for_one_giant_table():
    """One table carries most of the lookups: table-wise leaves one rank with it; row- or column-wise spread
    it (on the CPU pack, where the lookups dominate the step; a host-bound A100 step keeps it table-wise)."""
    t = EmbeddingTables(rows=np.array([2_000_000, 1000, 1000, 1000]), dim=np.array([128, 16, 16, 16]),
                        pooling=np.array([200.0, 1.0, 1.0, 1.0]))
    r = resolve_platform("cpu-local")
    job = DLRMShardingJob(DLRMSpec(tables=t, batch_size=1024, bottom_mlp=(64, 32), top_mlp=(64, 1)), 2, r.platform,
                          r.timing())
    cap = job.table_capacity_bytes(0.8)
    starts = {}
    for name in ("size_greedy", "lookup_greedy"):
        a = get_sharder(name).shard(t, 2, cap)
        starts[name] = (a, job.objective(a))
    mg = ModelGuidedSharder(job, starts, max_evals=10, type_evals=12).place(cap)
    assert mg.predicted_s <= min(v for _, v in starts.values())
    assert mg.sharded is not None and mg.sharded.tables[0].sharding_type in ("row_wise", "column_wise")
    assert TypedShardingJob(job).objective(mg.sharded) == pytest.approx(mg.predicted_s)
    p, cost, info = refine_sharding_types(TypedShardingJob(job), mg.assignment, mg.info["table_wise_s"], cap, 0)
    assert info["evaluations"] == 0 and p.is_table_wise()


def test_search_with_sharding_types_writes_typed_results_and_plan_files(tmp_path):
    """A space whose model-guided sharder may change types: typed results, traces and plan files."""
    import json

    from tuner.search import default_storage
    from tuner.search.sharding import ShardingSpace, run_sharding_search

    space = ShardingSpace.model_validate({
        "space": "sharding", "platform": "cpu-local", "n_gpus": 2, "batch_sizes": [1024],
        "tasks": {"explicit": [{"name": "giant", "tables": [
            {"rows": 2_000_000, "dim": 128, "pooling": 200.0}, {"rows": 1000, "dim": 16, "pooling": 1.0},
            {"rows": 1000, "dim": 16, "pooling": 1.0}]}]},
        "model": {"bottom_mlp": [64, 32], "top_mlp": [64, 1]},
        "sharders": ["size_greedy", "lookup_greedy", "model_guided"],
        "model_guided": {"max_evals": 6, "sharding_types": True, "type_evals": 6}})
    result = run_sharding_search(space, storage=default_storage(tmp_path), workers=0)
    out = tmp_path / "o"
    payload = result.space.write_outputs(result, out)
    mg = next(c for c in payload["tasks"][0]["candidates"] if c["sharder"] == "model_guided")
    assert mg["assignment"] is None and {r["sharding_type"] for r in mg["sharding"]} - {"table_wise"}
    assert payload["tasks"][0]["best"] == "model_guided"
    assert list((out / "traces").glob("giant_b1024_model_guided.json"))
    plan = json.loads((out / "plans" / "giant_b1024.json").read_text())
    assert plan["world_size"] == 2 and plan["sharder"] == "model_guided"
    t0 = plan["plan"][""]["t0"]
    assert t0["sharding_type"] in ("row_wise", "column_wise") and len(t0["shards"]) == 2


def test_torchrec_sharder_without_torchrec_is_one_clear_error(monkeypatch):
    import tuner.integrations.torchrec_space as trs
    from tuner.search.schema import SpaceError
    from tuner.search.sharding import ShardingSpace, build_sharding_context

    monkeypatch.setattr(trs, "torchrec_available", lambda: False)
    space = ShardingSpace.model_validate({"space": "sharding", "platform": "a100-80gb", "n_gpus": 2,
                                          "batch_sizes": [512], "tasks": {"generate": {"count": 1}},
                                          "sharders": ["naive", "torchrec"]})
    with pytest.raises(SpaceError, match="needs TorchRec"):
        build_sharding_context(space)
