"""tuner.alpa as a drop-in for Alpa: enumeration order, get_compute_cost, Alpa's memory formula, ManualStageOption.

Alpa needs JAX and is unmaintained, so the references here are a transcription of its enumeration
(alpa/pipeline_parallel/stage_construction.py) and cases worked by hand from its formulas
(alpa/pipeline_parallel/stage_profiling.py, get_merged_stages_memory_stats).
"""

from __future__ import annotations

import numpy as np
import pytest

from predictor.sources.synth.transformer import TransformerSpec
from predictor.sources.synth.transformer_memory import RESERVED_BYTES
from tuner.alpa import (
    MAX_SUCC_CAP,
    AutoStageOption,
    LogicalMesh,
    StageQuery,
    VirtualMesh,
    alpa_layers,
    alpa_max_n_succ_stages,
    alpa_solution,
    get_all_submesh_autosharding_config_choices,
    get_compute_cost,
    get_one_submesh_autosharding_config_choices,
    get_submesh_choices,
    manual_stage_option,
    stage_construction_dp,
    training_dp,
)

SPEC = TransformerSpec(layers=8, hidden=1024, heads=16, seq=512, vocab=8000, name="gpt-tiny")
GIB = 2.0**30


# ----------------------------------------------------------------------------- transcriptions of Alpa
def alpa_submeshes_reference(num_hosts, num_devices_per_host, space):
    """Alpa's get_submesh_choices, loop for loop."""
    choices = []
    i = 1
    while i <= num_devices_per_host:
        choices.append((1, i))
        i *= 2
    if space == "all":
        for i in range(2, num_hosts + 1):
            choices.append((i, num_devices_per_host))
    elif space == "power_of_two":
        i = 2
        while i <= num_hosts:
            choices.append((i, num_devices_per_host))
            i *= 2
    elif space == "small_power_of_two":
        i = 2
        while i <= min(num_hosts, 4):
            choices.append((i, num_devices_per_host))
            i *= 2
    return tuple(choices)


def alpa_configs_reference(submesh, space, batch_size):
    """Alpa's get_one_submesh_autosharding_config_choices as (logical shape, option dict) pairs."""
    hosts, per_host = submesh
    num_devices = hosts * per_host
    results = []
    if space in ("all", "single_node_model_parallel"):
        max_mp = num_devices if space == "all" else per_host
        for mp_size in range(1, max_mp + 1):
            if num_devices % mp_size == 0:
                dp_size = num_devices // mp_size
                if batch_size % dp_size == 0:
                    results.append(((dp_size, mp_size), {"force_batch_dim_to_mesh_dim": 0}))
        results.append(((num_devices, 1), {}))
    elif space == "same_as_physical":
        results.append(((hosts, per_host), {}))
    elif space == "data_parallel_only":
        results.append(((num_devices, 1), {"force_batch_dim_to_mesh_dim": 0}))
    elif space == "model_parallel_only":
        results.append(((1, num_devices), {"force_batch_dim_to_mesh_dim": 0}))
    return results


@pytest.mark.parametrize("space", ["power_of_two", "small_power_of_two", "all"])
def test_submesh_choices_match_alpa_index_for_index(space):
    for hosts in range(1, 18):
        for per_host in (1, 2, 4, 8, 16):
            assert get_submesh_choices(hosts, per_host, space) == alpa_submeshes_reference(hosts, per_host, space)
    assert get_submesh_choices(8, 8) == ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8), (8, 8))  # the default
    assert get_submesh_choices(16, 8, "small_power_of_two")[-2:] == ((2, 8), (4, 8))


def test_submesh_choices_reject_what_alpa_rejects():
    with pytest.raises(ValueError, match="power-of-two"):
        get_submesh_choices(2, 6)
    with pytest.raises(ValueError, match="unknown submesh space"):
        get_submesh_choices(2, 8, "every")
    assert get_submesh_choices(2, 8, "manual", [(1, 8), (2, 8)]) == ((1, 8), (2, 8))


@pytest.mark.parametrize("space", ["single_node_model_parallel", "all", "same_as_physical", "data_parallel_only",
                                   "model_parallel_only"])
def test_autosharding_configs_match_alpa_index_for_index(space):
    for submesh in get_submesh_choices(4, 8, "all") + ((1, 1),):
        for batch in (1, 2, 3, 4, 8, 12, 16, 32, 64):
            ours = get_one_submesh_autosharding_config_choices(submesh, space, batch)
            assert [(m.shape, d) for m, d in ours] == alpa_configs_reference(submesh, space, batch)


def test_autosharding_configs_hand_worked_and_padded():
    # (1, 8), micro-batch 4: mp 1 needs dp 8 (4 % 8 != 0: skipped); mp 2, 4, 8; then the free (8, 1) mesh
    got = get_one_submesh_autosharding_config_choices((1, 8), "single_node_model_parallel", 4)
    force = {"force_batch_dim_to_mesh_dim": 0}
    assert [(m.shape, d) for m, d in got] == [((4, 2), force), ((2, 4), force), ((1, 8), force), ((8, 1), {})]
    # (2, 8) under single_node_model_parallel: mp only up to one host's 8 devices
    assert [m.shape for m, _ in get_one_submesh_autosharding_config_choices((2, 8), "single_node_model_parallel", 16)
            ] == [(16, 1), (8, 2), (4, 4), (2, 8), (16, 1)]
    table = get_all_submesh_autosharding_config_choices(None, get_submesh_choices(2, 8), "single_node_model_parallel", 16)
    assert [len(row) for row in table] == [5] * 5
    assert table[0][2:] == [None, None, None]  # (1, 1): two configs, padded as Alpa pads
    assert table[0][0] == (LogicalMesh((1, 1)), force)


# ----------------------------------------------------------------------------- memory formula
def test_max_n_succ_stages_is_alpas_formula():
    # (available - peak - initial) // intermediate - 1, clipped to [-1, 2**20]
    assert alpa_max_n_succ_stages(80.0, 10.0, 20.0, 5.0) == 9
    assert alpa_max_n_succ_stages(80.0, 10.0, 20.0, 7.0) == 6  # 50 // 7 = 7
    assert alpa_max_n_succ_stages(30.0, 10.0, 20.0, 5.0) == -1  # fits itself, nothing after it
    assert alpa_max_n_succ_stages(10.0, 20.0, 5.0, 1.0) == -1  # does not fit: clipped
    assert alpa_max_n_succ_stages(80.0, 0.0, 0.0, 0.0) == MAX_SUCC_CAP == 2**20


class _Fake:
    """Latency = layers / tp + 0.5 (embedding) + 1 (head), micro-batch-independent; counts calls."""

    def __init__(self):
        self.calls = 0

    def stage_latency(self, q: StageQuery) -> float:
        self.calls += 1
        return q.n_layers / q.config.tp + 0.5 * q.with_embedding + 1.0 * q.with_head


def _layer_params(h, f, t):
    """Megatron's per-device parameters of one layer: QKV + projection + 2 norms + MLP (row biases whole)."""
    return (3 * h * h + 3 * h) / t + h * h / t + h + 4 * h + (h * f + f) / t + f * h / t + h


def test_get_compute_cost_memory_hand_worked():
    # 2 hosts x 2 devices, 40 GiB each; 4 layer groups of 2 layers, micro-batch 2
    vm = VirtualMesh(2, 2, 40 * GIB)
    subs = get_submesh_choices(2, 2)  # (1, 1), (1, 2), (2, 2)
    cfgs = get_all_submesh_autosharding_config_choices(vm, subs, "single_node_model_parallel", 2)
    cost, succ = get_compute_cost(vm, subs, cfgs, alpa_layers(SPEC, 4, 2), num_micro_batches=8, predictor=_Fake())
    assert cost.shape == succ.shape == (4, 4, 3, 3)
    # groups 1..2 (4 middle layers) on (1, 2) with the (1, 2) logical mesh: tp 2, the micro-batch whole
    assert cfgs[1][1][0].shape == (1, 2)
    s, b, h, a, f, t = 512, 2, 1024, 16, 4096, 2
    params = 4 * _layer_params(h, f, t)
    act = 4 * (10 * s * b * h + (8 * s * b * h + 4 * s * b * f) / t + 4 * a * s * b / t)  # flash attention, no SP
    peak = params * (2 + 4) + act  # bf16 weights + fp32 gradient accumulators + one micro-batch's activations
    initial = params * 12  # fp32 master + Adam moments
    expected = int((40 * GIB - RESERVED_BYTES - peak - initial) // act - 1)
    assert succ[1, 2, 1, 1] == expected
    # Alpa subtracts the stage's own peak: one successor fewer than memory less the static states alone
    assert int((40 * GIB - RESERVED_BYTES - params * 18) // act - 1) == expected + 1
    assert cost[1, 2, 1, 1] == pytest.approx(4 / 2)


def test_get_compute_cost_follows_alpas_profiling_rules():
    vm = VirtualMesh(2, 2, 80 * GIB)
    subs = get_submesh_choices(2, 2)
    cfgs = get_all_submesh_autosharding_config_choices(vm, subs, "single_node_model_parallel", 2)
    fake = _Fake()
    cost, succ = get_compute_cost(vm, subs, cfgs, alpa_layers(SPEC, 4, 2), predictor=fake)
    full = 2  # (2, 2) is the whole cluster: Alpa profiles only the whole model on it
    assert np.isfinite(cost[0, 3, full]).any()
    mask = np.ones((4, 4), bool)
    mask[0, 3] = False
    assert np.isinf(cost[:, :, full][mask]).all()
    assert np.isinf(cost[np.tril_indices(4, -1)]).all()
    # (1, 1) has two configs ((1,1) forced, (1,1) free) and one None pad: the pad is never a stage
    assert cfgs[0][2] is None and np.isinf(cost[:, :, 0, 2]).all() and (succ[:, :, 0, 2] == -1).all()
    # on (2, 2) with micro-batch 2: the forced (2, 2) mesh, then the free (4, 1) mesh, which cannot split
    # 2 sequences over 4 data-parallel devices: tuner predicts nothing there
    assert [m.shape for m, _ in cfgs[full][:2]] == [(2, 2), (4, 1)] and cfgs[full][2] is None
    assert np.isinf(cost[0, 3, full, 1]) and np.isfinite(cost[0, 3, full, 0])
    # a zero imbalance tolerance keeps only stages whose FLOP share is the submesh's device share
    tight = AutoStageOption(stage_imbalance_tolerance=0.0)
    c0, _ = get_compute_cost(vm, subs, cfgs, alpa_layers(SPEC, 4, 2), auto_stage_option=tight, predictor=_Fake())
    assert np.isinf(c0[:, :, 0]).all()  # no stage carries exactly 1/4 of the FLOPs (head and groups differ)
    # individual mode: a stage costs the sum of its single layer groups
    ind = AutoStageOption(layer_profile_mode="individual")
    c1, _ = get_compute_cost(vm, subs, cfgs, alpa_layers(SPEC, 4, 2), auto_stage_option=ind, predictor=_Fake())
    assert c1[0, 3, 1, 0] == pytest.approx(sum(c1[g, g, 1, 0] for g in range(4)))
    assert c1[1, 2, 1, 1] == pytest.approx(cost[1, 2, 1, 1])  # middle groups add up the same with this latency
    with pytest.raises(ValueError, match="inference"):
        get_compute_cost(vm, subs, cfgs, alpa_layers(SPEC, 4, 2), inference_mode=True, predictor=_Fake())


# ----------------------------------------------------------------------------- ManualStageOption
def test_manual_stage_option_of_a_hand_worked_plan():
    # 2 layer groups on 1 host x 2 devices: stage costs make two 1-device stages the best split
    subs = ((1, 1), (1, 2))
    cfgs = get_all_submesh_autosharding_config_choices(None, subs, "single_node_model_parallel", 2)
    cost = np.full((2, 2, 2, 3), np.inf)
    cost[0, 0, 0, 0] = cost[1, 1, 0, 1] = 1.0  # each group alone on one device
    cost[0, 1, 1, 0] = 3.0  # both groups on the (2, 1) mesh
    succ = np.full(cost.shape, 8)
    plan = stage_construction_dp(cost, succ, [1, 2], n_devices=2, n_micro_batches=4)
    assert plan is not None and len(plan.stages) == 2
    assert alpa_solution(plan) == [((0, 1), 0, 0), ((1, 2), 0, 1)]
    # Alpa's training_dp signature: sum 2 + (4 - 1) x max 1 = 5 seconds, the same solution
    assert training_dp(2, 2, 4, subs, 3, cost, succ) == (pytest.approx(5.0), alpa_solution(plan))
    assert training_dp(2, 2, 4, subs, 3, cost, np.full(cost.shape, -1)) == (np.inf, None)
    opt = manual_stage_option(plan, subs, cfgs)
    assert opt == {
        "forward_stage_layer_ids": [[0], [1]],
        "submesh_physical_shapes": [(1, 1), (1, 1)],
        "submesh_logical_shapes": [(1, 1), (1, 1)],
        "submesh_autosharding_option_dicts": [{"force_batch_dim_to_mesh_dim": 0}, {}],
    }


def test_manual_stage_option_from_predicted_costs_partitions_the_model():
    vm = VirtualMesh(1, 4, 80 * GIB)
    subs = get_submesh_choices(1, 4)
    cfgs = get_all_submesh_autosharding_config_choices(vm, subs, "single_node_model_parallel", 4)
    cost, succ = get_compute_cost(vm, subs, cfgs, alpa_layers(SPEC, 4, 4), predictor=_Fake())
    plan = stage_construction_dp(cost, succ, [h * d for h, d in subs], 4, 16)
    opt = manual_stage_option(plan, subs, cfgs)
    assert sum(opt["forward_stage_layer_ids"], []) == [0, 1, 2, 3]
    assert sum(h * d for h, d in opt["submesh_physical_shapes"]) == 4
    for phys, logical in zip(opt["submesh_physical_shapes"], opt["submesh_logical_shapes"], strict=True):
        assert phys[0] * phys[1] == logical[0] * logical[1]


def test_default_predictor_simulates_stages_on_the_mesh_platform():
    from predictor.timing.platforms import get_platform

    vm = VirtualMesh.from_platform(get_platform("a100-80gb"), num_hosts=1, num_devices_per_host=2)
    subs = get_submesh_choices(1, 2)
    cfgs = get_all_submesh_autosharding_config_choices(vm, subs, "single_node_model_parallel", 2)
    cost, succ = get_compute_cost(vm, subs, cfgs, alpa_layers(SPEC, 2, 2))
    finite = np.isfinite(cost)
    assert finite.any() and (cost[finite] > 0).all() and (succ[finite] >= 0).all()
    plan = stage_construction_dp(cost, succ, [h * d for h, d in subs], 2, 8)
    assert sum(manual_stage_option(plan, subs, cfgs)["forward_stage_layer_ids"], []) == [0, 1]
    with pytest.raises(ValueError, match="predictor"):
        get_compute_cost(VirtualMesh(1, 2, 80 * GIB), subs, cfgs, alpa_layers(SPEC, 2, 2))
