"""Host contention: K ranks of one CPU host slow each other's memory-bound kernels."""

from __future__ import annotations

import numpy as np
import pytest
from _pinned_cpu import bare_cpu

from predictor.graph import Category
from predictor.sources.synth.dlrm import DLRMSpec, build_dlrm_graph
from predictor.sources.synth.dlrm_tables import EmbeddingTables
from predictor.timing.calibration.contention import CLASSES, measure_host_contention
from predictor.timing.kernels import ModelTiming
from predictor.timing.platforms import get_platform

CPU = bare_cpu()  # cpu-local without host refinements: each test sets its own
FACTORS = {"embedding": 1.5, "memory": 1.8, "compute": 1.0}


def _graph(n_ranks: int):
    t = EmbeddingTables(rows=np.full(4, 10_000), dim=np.full(4, 64), pooling=np.linspace(1, 20, 4))
    spec = DLRMSpec(tables=t, batch_size=512, bottom_mlp=(32, 64), top_mlp=(64, 1))
    return build_dlrm_graph(spec, np.arange(4) % n_ranks, n_ranks, mode="host")


def test_factors_scale_each_kernel_class_of_a_k_rank_graph():
    g = _graph(2)
    plain = ModelTiming(CPU).durations(g)
    contended = ModelTiming(CPU.model_copy(update={"host_contention": {2: FACTORS}}), co_run=False).durations(g)
    kinds = np.asarray(g.kinds, dtype=object)[g.kind]
    emb = np.isin(kinds, ("embedding_bag_fwd", "embedding_bag_bwd"))
    assert emb.any()
    np.testing.assert_allclose(contended[emb], 1.5 * plain[emb])
    mem = (g.category == Category.MEMORY) & ~emb & (plain > 0)
    assert mem.any()
    np.testing.assert_allclose(contended[mem], 1.8 * plain[mem])
    comm = g.category == Category.COMMUNICATION
    np.testing.assert_allclose(contended[comm], plain[comm])  # collectives have their own calibration


def test_factors_apply_only_to_the_calibrated_rank_count_on_cpus():
    one, four = _graph(1), _graph(4)
    t = ModelTiming(CPU.model_copy(update={"host_contention": {2: FACTORS}}))
    np.testing.assert_allclose(t.durations(one), ModelTiming(CPU).durations(one))
    np.testing.assert_allclose(t.durations(four), ModelTiming(CPU).durations(four))
    gpu = get_platform("a100-80gb").model_copy(update={"host_contention": {2: FACTORS}})
    assert ModelTiming(gpu).contention_factors(2) == {}


def test_one_process_has_no_contention():
    assert measure_host_contention(1) == dict.fromkeys(CLASSES, 1.0)


def test_probe_processes_report_a_factor_per_class():
    f = measure_host_contention(2, llc_bytes=2**20, slot_s=0.2, rounds=1)
    assert set(f) == set(CLASSES)
    assert all(np.isfinite(v) and v > 0 for v in f.values())


def test_platform_yaml_round_trip_keeps_the_factors():
    p = CPU.model_copy(update={"host_contention": {2: FACTORS}})
    again = type(p).model_validate(p.model_dump(mode="json"))
    assert again.host_contention == {2: pytest.approx(FACTORS)}


def test_the_slowest_process_sets_the_factor():
    from predictor.timing.calibration.contention import factors

    # two processes, two rounds; [alone_s, together_s]
    p0 = {"compute": [[10.0, 10.5], [10.0, 10.5]], "memory": [[1.0, 1.5], [1.0, 1.7]],
          "embedding": [[1.0, 1.1], [1.0, 1.1]]}
    p1 = {"compute": [[11.0, 12.0], [11.0, 12.6]], "memory": [[1.0, 1.2], [1.0, 1.2]],
          "embedding": [[2.0, 2.6], [2.0, 2.4]]}
    f = factors([p0, p1], "slowest")
    # compute: the slower process at once over the mean alone (10.5): 12.0 / 10.5 and 12.6 / 10.5
    assert f["compute"] == pytest.approx(np.median([12.0 / 10.5, 12.6 / 10.5]))
    assert f["memory"] == pytest.approx(np.median([1.5, 1.7]))
    # embedding: each process against its own time alone (placement differences are not the host's)
    assert f["embedding"] == pytest.approx(np.median([1.3, 1.2]))


def test_the_mean_estimator_averages_the_processes_ratios():
    from predictor.timing.calibration.contention import factors

    p0 = {"compute": [[10.0, 10.5], [10.0, 10.5]], "memory": [[1.0, 1.5], [1.0, 1.7]],
          "embedding": [[1.0, 1.1], [1.0, 1.1]]}
    p1 = {"compute": [[11.0, 12.0], [11.0, 12.6]], "memory": [[1.0, 1.2], [1.0, 1.2]],
          "embedding": [[2.0, 2.6], [2.0, 2.4]]}
    f = factors([p0, p1], "mean")
    # embedding: per round the mean of each process's own ratio: (1.1 + 1.3) / 2 and (1.1 + 1.2) / 2
    assert f["embedding"] == pytest.approx(np.median([1.2, 1.15]))
    assert f["compute"] == pytest.approx(np.median([(10.5 + 12.0) / 2 / 10.5, (10.5 + 12.6) / 2 / 10.5]))
    # never above the slowest process's factor
    slow = factors([p0, p1], "slowest")
    assert all(f[c] <= slow[c] for c in CLASSES)
    with pytest.raises(ValueError, match="unknown contention estimator"):
        factors([p0, p1], "fastest")
    # the calibration's: the slowest process for the dense classes, the mean for the embedding tables
    d = factors([p0, p1], "slowest-dense")
    assert d == pytest.approx({"embedding": f["embedding"], "memory": slow["memory"], "compute": slow["compute"]})


def test_the_lockstep_factor_is_the_slowest_period_less_the_sync_over_the_slowest_free_segment():
    from predictor.timing.calibration.lockstep import lockstep_factor

    p0 = {"free_s": [0.010, 0.010, 0.010], "lockstep_s": [0.0115, 0.0121, 0.0111], "sync_s": [0.0002] * 3}
    p1 = {"free_s": [0.009, 0.011, 0.010], "lockstep_s": [0.0116, 0.0120, 0.0112], "sync_s": [0.0004] * 3}
    # per round: (max lockstep - median sync) / max free = 1.13 / 1.0 ... -> median 1.10
    per_round = [(0.0116 - 0.0003) / 0.010, (0.0121 - 0.0003) / 0.011, (0.0112 - 0.0003) / 0.010]
    assert lockstep_factor([p0, p1]) == pytest.approx(np.median(per_round))
    # waiting never makes the work faster
    fast = {"free_s": [0.010], "lockstep_s": [0.009], "sync_s": [0.0001]}
    assert lockstep_factor([fast, fast]) == 1.0


def test_the_sync_factor_scales_every_kernel_class_of_a_k_rank_graph():
    g = _graph(2)
    base = ModelTiming(CPU.model_copy(update={"host_contention": {2: FACTORS}}), co_run=False).durations(g)
    synced = ModelTiming(CPU.model_copy(update={"host_contention": {2: {**FACTORS, "sync": 1.1}}}),
                         co_run=False).durations(g)
    comm = g.category == Category.COMMUNICATION
    np.testing.assert_allclose(synced[comm], base[comm])
    work = ~comm & (base > 0) & (g.category != Category.CPU)
    assert work.any()
    np.testing.assert_allclose(synced[work], 1.1 * base[work])
    one = _graph(1)  # one rank waits for no one
    np.testing.assert_allclose(ModelTiming(CPU.model_copy(update={"host_contention": {2: {"sync": 1.1}}})).durations(one),
                               ModelTiming(CPU).durations(one))


def test_the_lockstep_probe_runs_two_gloo_processes():
    from predictor.timing.calibration.lockstep import lockstep_factor, probe_lockstep

    rows = probe_lockstep(2, 1, rounds=1, segment_s=0.002, segments=5)
    assert len(rows) == 2
    for r in rows:
        assert all(len(r[k]) == 1 and 0 < r[k][0] < 1 for k in ("free_s", "sync_s", "lockstep_s"))
    assert 1.0 <= lockstep_factor(rows) < 10
    with pytest.raises(ValueError, match="at least 2"):
        probe_lockstep(1)


def test_calibration_spreads_the_host_probes_rounds_over_its_bursts_and_pools_them_per_process():
    from predictor.timing.calibrate.probes import burst_rounds, pooled_rounds

    for total in range(0, 10):
        for bursts in (1, 2, 3):
            got = [burst_rounds(total, bursts, i) for i in range(bursts)]
            assert sum(got) == total and max(got) - min(got) <= 1 and got == sorted(got, reverse=True)
    assert [burst_rounds(5, 3, i) for i in range(3)] == [2, 2, 1]
    first = [{"free_s": [1.0], "sync_s": [0.1]}, {"free_s": [2.0], "sync_s": [0.2]}]
    second = [{"free_s": [3.0, 4.0], "sync_s": [0.3, 0.4]}, {"free_s": [5.0, 6.0], "sync_s": [0.5, 0.6]}]
    assert pooled_rounds([], first) == first
    assert pooled_rounds(first, second) == [{"free_s": [1.0, 3.0, 4.0], "sync_s": [0.1, 0.3, 0.4]},
                                      {"free_s": [2.0, 5.0, 6.0], "sync_s": [0.2, 0.5, 0.6]}]
    with pytest.raises(ValueError):  # a burst of another world size
        pooled_rounds(first, second[:1])
