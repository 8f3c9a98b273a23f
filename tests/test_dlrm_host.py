"""Host mode (CPU) of the DLRM synthesiser: the program experiments/dlrm_gloo.py runs, op by op."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.simulate import simulate
from predictor.sources.synth.dlrm import GLOO_WORKER_THREADS, DLRMSpec, build_dlrm_graph, ddp_buckets
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.timing.kernels import ModelTiming
from predictor.timing.platforms import get_platform

CPU = get_platform("cpu-local")


def _spec(n_tables=4, dim=64, batch=512, bottom=(32, 64), top=(64, 1)):
    t = EmbeddingTables(rows=np.full(n_tables, 10_000), dim=np.full(n_tables, dim),
                        pooling=np.linspace(1, 20, n_tables))
    return DLRMSpec(tables=t, batch_size=batch, bottom_mlp=bottom, top_mlp=top)


def _frame(g):
    df = g.tasks_frame()
    return df[df.kind != "overhead"].reset_index()


def test_ddp_buckets_follow_the_reducer_rule():
    # DLRM of the sharding experiment with a 2264-wide interaction: PyTorch 2.13's DDP (2 gloo ranks,
    # after its bucket rebuild) makes [top2, top1, top0] (612865 params >= 1 MiB) and [bottom]
    layers = [("bot0", 13, 256), ("bot1", 256, 128), ("bot2", 128, 64), ("top0", 2264, 256), ("top1", 256, 128),
              ("top2", 128, 1)]
    assert ddp_buckets(layers, 4, 25 * 2**20) == [["top2", "top1", "top0"], ["bot2", "bot1", "bot0"]]
    # a 164-wide interaction: 120001 params, under 1 MiB -> one bucket
    small = [*layers[:3], ("top0", 164, 256), *layers[4:]]
    assert ddp_buckets(small, 4, 25 * 2**20) == [["top2", "top1", "top0", "bot2", "bot1", "bot0"]]


def test_one_rank_has_no_collectives_and_no_ddp():
    spec = _spec()
    g = build_dlrm_graph(spec, np.zeros(4, dtype=int), 1, mode="host")
    df = _frame(g)
    assert not g.is_gpu().any()
    assert set(df.processor) == {"cpu"}
    assert not df.kind.isin(["all_to_all", "all_reduce", "memcpy", "mul"]).any()
    assert (df.kind == "embedding_bag_fwd").sum() == 4 and (df.kind == "embedding_bag_bwd").sum() == 4
    layers = spec.mlp_layers()
    assert (df.kind == "addmm").sum() == len(layers)
    assert (df.kind == "mm").sum() == 2 * len(layers) - 1  # no input gradient for the first layer
    assert (df.kind == "add").sum() == 2 * len(layers)  # SGD: one add_ per parameter tensor
    # one thread, no waits: the iteration is the sum of its tasks
    tl = simulate(g, ModelTiming(CPU))
    assert tl.iteration_s == pytest.approx(float(tl.duration.sum()), rel=1e-9)


def test_two_ranks_gloo_workers_blocking_all_to_all_and_ddp():
    spec = _spec()
    g = build_dlrm_graph(spec, np.array([0, 1, 0, 1]), 2, mode="host")
    df = _frame(g)
    names = list(df.name)
    coll = df[df.kind.isin(["all_to_all", "all_reduce"])]
    assert set(coll.processor) <= {f"gloo worker {w}" for w in range(GLOO_WORKER_THREADS)}
    assert set(df[~df.kind.isin(["all_to_all", "all_reduce"])].processor) == {"cpu"}
    # every collective group has one member per rank
    grouped = df[df.group >= 0]
    assert (grouped.groupby("group")["rank"].nunique() == 2).all()
    assert (grouped.groupby("group").size() == 2).all()
    waits = set(zip(g.edge_src.tolist(), g.edge_dst.tolist(), strict=True))
    r0 = df[df["rank"] == 0]
    idx = {n: int(i) for n, i in zip(r0.name, r0["index"], strict=True)}
    # the all-to-all blocks the main thread: the bottom MLP starts after it
    assert (idx["all_to_all_fwd"], idx["bot0.addmm"]) in waits
    # autograd order: the bottom MLP's backward runs before the all-to-all of the gradients
    r0_names = list(r0.name)
    assert r0_names.index("bot0.wgrad") < r0_names.index("pack_embedding_grads")
    assert (idx["all_to_all_bwd"], int(r0[r0.kind == "embedding_bag_bwd"]["index"].iloc[0])) in waits
    # DDP: one all-reduce per bucket; SGD waits for the copies back, which wait for every all-reduce
    n_buckets = len(ddp_buckets(spec.mlp_layers(), 4, spec.ddp_bucket_bytes))
    assert (r0.kind == "all_reduce").sum() == n_buckets
    copy = int(r0[r0.kind == "memcpy"]["index"].iloc[0])
    for ar in r0[r0.kind == "all_reduce"]["index"]:
        assert (int(ar), copy) in waits
    assert names.count("sgd.bot0.weight.add_") == 2
    tl = simulate(g, ModelTiming(CPU))
    assert tl.iteration_s > 0 and tl.per_rank_s.size == 2


def test_unbalanced_sharding_is_slower_in_host_mode():
    t = EmbeddingTables(rows=np.full(6, 200_000), dim=np.full(6, 64), pooling=np.full(6, 40.0))
    spec = DLRMSpec(tables=t, batch_size=1024, bottom_mlp=(32, 64), top_mlp=(64, 1))
    timing = ModelTiming(CPU)
    balanced = simulate(build_dlrm_graph(spec, np.arange(6) % 2, 2, mode="host"), timing).iteration_s
    piled = simulate(build_dlrm_graph(spec, np.zeros(6, dtype=int), 2, mode="host"), timing).iteration_s
    assert piled > balanced * 1.2


def test_without_spare_cores_collectives_serialise_with_compute():
    from predictor.timing.platforms.host import comm_thread_has_core

    # 2 ranks x (1 compute + 1 gloo thread) need 4 cores
    assert comm_thread_has_core(2, 1, cores=4) and not comm_thread_has_core(2, 1, cores=2)
    spec = _spec(bottom=(256, 256), top=(512, 512, 1))  # DDP all-reduces long enough to matter
    a = np.array([0, 1, 0, 1])
    timing = ModelTiming(CPU)
    overlapped = build_dlrm_graph(spec, a, 2, mode="host")
    serial = build_dlrm_graph(spec, a, 2, mode="host", comm_threads=False)
    df = _frame(serial)
    comm = df[df.kind.isin(["all_to_all", "all_reduce"])]
    assert len(comm) and set(comm.processor) == {"cpu"}
    assert not df.processor.str.startswith("gloo").any()
    t_over, t_serial = simulate(overlapped, timing), simulate(serial, timing)
    # the same tasks and durations; only the overlap of the all-reduces with backward is gone
    assert t_serial.iteration_s > t_over.iteration_s
    assert float(t_serial.duration.sum()) == pytest.approx(float(t_over.duration.sum()), rel=1e-9)


@pytest.mark.parametrize("n_ranks,comm_threads", [(1, True), (2, False), (2, True)])
def test_simulated_phases_add_up_to_each_ranks_iteration(n_ranks, comm_threads):
    from experiments.dlrm_gloo import PHASES
    from experiments.dlrm_phases_cpu import simulated_phases

    a = np.array([0, 1, 0, 1]) if n_ranks > 1 else np.zeros(4, dtype=int)
    tl = simulate(build_dlrm_graph(_spec(), a, n_ranks, mode="host", comm_threads=comm_threads), ModelTiming(CPU))
    for r in range(n_ranks):
        ph = simulated_phases(tl, r)
        assert list(ph) == [p for p in PHASES if p in ph] and min(ph.values()) >= 0
        assert ("a2a_fwd" in ph) == ("a2a_bwd" in ph) == (n_ranks > 1)
        assert sum(ph.values()) == pytest.approx(float(tl.per_rank_s[r]), rel=1e-9)


def test_table_seconds_reads_each_tables_calls_from_the_marks():
    from experiments.dlrm_phases_cpu import table_seconds

    local = np.array([2, 5, 7])
    # forwards in table order; the gradients' hooks may all fire first or one before each backward
    marks = [("start", 0.0), ("emb_fwd_table", 1.0), ("emb_fwd_table", 1.5), ("emb_fwd_table", 3.5),
             ("emb_fwd", 3.5), ("dense_fwd", 5.0), ("emb_grad", 6.0), ("emb_bwd", 7.0), ("emb_grad", 7.5),
             ("emb_bwd", 8.0), ("emb_bwd", 9.5), ("backward", 9.5), ("optimizer", 10.0)]
    got = table_seconds(marks, local)
    assert got["fwd"] == {2: 1.0, 5: 0.5, 7: 2.0}
    assert got["bwd"] == {7: 1.0, 5: 0.5, 2: 1.5}  # last table first


def test_collective_seconds_counts_from_the_last_ranks_arrival():
    from experiments.dlrm_phases_cpu import allreduce_seconds, collective_seconds

    # rank 1 starts its iteration 0.5 s later on the host clock and reaches the all-to-all later
    marks = [[("start", 0.0), ("a2a_fwd_start", 1.0), ("a2a_fwd", 3.0), ("ar_issue", 4.0), ("ar_issue", 4.5),
              ("ar_done", 6.0), ("ar_done", 7.0)],
             [("start", 0.0), ("a2a_fwd_start", 1.5), ("a2a_fwd", 2.6), ("ar_issue", 3.0), ("ar_issue", 4.0),
              ("ar_done", 5.5), ("ar_done", 6.5)]]
    starts = [10.0, 10.5]
    span, skew = collective_seconds(marks, starts, "a2a_fwd_start", "a2a_fwd")
    assert span == pytest.approx(13.1 - 12.0) and skew == pytest.approx(1.0)
    span, skew = collective_seconds(marks, starts, "ar_issue", "ar_done", nth=1)
    assert span == pytest.approx(17.0 - 14.5) and skew == pytest.approx(0.0)
    assert collective_seconds(marks, starts, "a2a_bwd_start", "a2a_bwd_end") is None
    assert allreduce_seconds(marks[0]) == [(4.0, 6.0), (4.5, 7.0)]


def test_embedding_generalisation_markdown_has_a_table_per_pack_and_kernel():
    import pandas as pd

    from experiments.embedding_generalisation_cpu import markdown

    rows = [{"pack": "p", "variant": v, "seed": s, "batch": b, "kernel": k, "heldout_gmae_pct": 3.0 + s,
             "sum_err_pct": -10.0 + s, "tables_gmae_pct": 12.0}
            for v in ("current", "x") for s in (0, 1) for b in (256, 1024)
            for k in ("embedding_bag_fwd", "embedding_bag_bwd")]
    md = markdown(pd.DataFrame(rows), "cmd", "then")
    assert md.count("## p, embedding_bag_") == 2
    assert "| current | 3.5 | -9.5 | 12.0 | -9.5 | 12.0 |" in md  # mean over the seeds


@pytest.mark.parametrize("args", [["--packs", "/nonexistent-pack"],
                                  ["--packs", "benchmarks/results/data/packs/cpu-emb-nb18", "--tables", "README.md"]])
def test_embedding_generalisation_refuses_bad_input_with_exit_2(args, monkeypatch, capsys):
    from pathlib import Path

    from experiments.embedding_generalisation_cpu import main

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    monkeypatch.setattr("sys.argv", ["embedding_generalisation_cpu.py", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("error: ")


def test_dlrm_phases_refuses_an_empty_batch_pool(monkeypatch, capsys, tmp_path):
    """``dlrm_phases_cpu.py --batch-pool 0``: one line and exit 2, before any measuring or writing."""
    from experiments.dlrm_phases_cpu import main

    out = tmp_path / "p.md"
    monkeypatch.setattr("sys.argv", ["dlrm_phases_cpu.py", "--batch-pool", "0", "--out", str(out)])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2 and "--batch-pool must be >= 1" in capsys.readouterr().err
    assert not out.exists()
