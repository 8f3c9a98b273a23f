"""NCCL's cost model across nodes: LL128 inside a node only, so a TP group spanning nodes is not
priced faster than the latency-bandwidth line of its links."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.timing.kernels.collective import alpha_beta, nccl_candidates, nccl_seconds
from predictor.timing.platforms import get_platform

A100 = get_platform("a100-80gb")


def test_ll128_is_a_candidate_inside_a_node_only():
    inside = nccl_candidates("all_reduce", 8, 1, 16e6, A100)
    across = nccl_candidates("all_reduce", 16, 2, 16e6, A100)
    assert ("ring", "LL128") in inside
    assert not any(proto == "LL128" for _, proto in across)
    assert ("ring", "Simple") in across and ("ring", "LL") in across


@pytest.mark.parametrize("msg", [4e6, 16e6, 64e6])
def test_tp16_all_reduce_over_two_nodes_is_not_faster_than_the_line_model(msg):
    # Megatron's TP all-reduces are MBs; with TP 16 on 8-GPU nodes they cross the NICs
    ts, bw = alpha_beta("all_reduce", 16, 2, A100)
    nccl = float(nccl_seconds("all_reduce", 16, 2, np.asarray([msg]), A100)[0])
    assert nccl >= ts + msg / bw
    inside = float(nccl_seconds("all_reduce", 8, 1, np.asarray([msg]), A100)[0])
    assert nccl > inside  # one node's NVLink beats two nodes' NICs


def test_small_all_reduce_across_nodes_still_takes_the_low_latency_protocols():
    # 100 kB: NCCL's LL (or the tree's) latency wins over Simple's plateau latency
    t = float(nccl_seconds("all_reduce", 16, 2, np.asarray([1e5]), A100)[0])
    cands = nccl_candidates("all_reduce", 16, 2, 1e5, A100)
    simple = cands["ring", "Simple"][0] + 1e5 / cands["ring", "Simple"][1]
    assert t < simple
