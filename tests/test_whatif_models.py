"""What-ifs on model kinds beyond MLP/GPT/DLRM: op-kind pricing, module-hierarchy layer blocks, platform moves.

Small captures made on this CPU inside the test (one torch thread)."""

from __future__ import annotations

import numpy as np
import pytest
from _trace_fixtures import capture_steps

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

BATCH = 8


def _blocks_mlp(layers: int = 4, d: int = 32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(*[nn.Sequential(nn.Linear(d, d), nn.ReLU()) for _ in range(layers)]),
                         nn.Linear(d, 3))


@pytest.fixture(scope="module")
def blocks_mlp(tmp_path_factory):
    """An MLP of 4 identical Linear+ReLU blocks (the first block's backward computes no input gradient)."""
    x, y = torch.randn(BATCH, 32), torch.randint(0, 3, (BATCH,))
    root = tmp_path_factory.mktemp("blocks")
    loss = lambda m: F.cross_entropy(m(x), y)  # noqa: E731
    return (capture_steps(root / "modules", _blocks_mlp(), loss),
            capture_steps(root / "plain", _blocks_mlp(), loss, modules=False))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Conv + BatchNorm, an LSTM over an embedding, two EmbeddingBags: one model with every new op kind."""

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
            self.emb = nn.Embedding(50, 8)
            self.lstm = nn.LSTM(8, 16, batch_first=True)
            self.bags = nn.ModuleList(nn.EmbeddingBag(100, 4, mode="sum") for _ in range(2))
            self.head = nn.Linear(4 * 8 * 8 + 16 + 8, 3)

        def forward(self, idx, img, bag_idx, offsets):
            h, _ = self.lstm(self.emb(idx))
            bags = [b(bag_idx, offsets) for b in self.bags]
            return self.head(torch.cat([self.conv(img).flatten(1), h[:, -1], *bags], dim=1))

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 50, (BATCH, 6), generator=g)
    img = torch.randn(BATCH, 3, 8, 8, generator=g)
    bag_idx = torch.randint(0, 100, (BATCH * 3,), generator=g)
    offsets = torch.arange(0, BATCH * 3, 3)
    y = torch.randint(0, 3, (BATCH,), generator=g)
    folder = tmp_path_factory.mktemp("mixed") / "run"
    return capture_steps(folder, Mixed(), lambda m: F.cross_entropy(m(idx, img, bag_idx, offsets), y))


# ----------------------------------------------------------------------------- op kinds
def test_new_op_kinds_are_kernels_with_batch_exponents(mixed):
    from predictor.graph.edit import aux_of
    from predictor.sources.traces.load import load_traces
    from predictor.whatif.annotate import annotate

    at = annotate(load_traces(mixed))
    assert at.base_batch == BATCH  # the LSTM's embedding comes first here; bags read their offsets
    g = at.graphs()[0]
    x = aux_of(g)["x_batch"]
    for kind in ("rnn", "rnn_bwd", "batch_norm", "batch_norm_bwd", "conv2d", "embedding_bag_fwd"):
        sel = g.kind_mask(kind)
        assert sel.any(), kind
    rnn = g.kind_mask("rnn", "rnn_bwd")
    assert np.all(x[rnn] == 1.0)  # hx's rows double with the batch
    assert np.all(g.params["m"][rnn] == 6) and np.all(g.params["dim"][rnn] == 16)


def test_embedding_bag_batch_is_the_offsets_length(tmp_path):
    from predictor.sources.traces.load import load_traces
    from predictor.whatif.annotate import annotate

    class Bags(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bags = nn.ModuleList(nn.EmbeddingBag(200, 4, mode="sum") for _ in range(3))
            self.top = nn.Linear(12, 1)

        def forward(self, ids, off):
            return self.top(torch.cat([b(ids, off) for b in self.bags], dim=1))

    ids, off = torch.randint(0, 200, (BATCH * 5,)), torch.arange(0, BATCH * 5, 5)
    lbl = torch.rand(BATCH, 1)
    folder = capture_steps(tmp_path / "bags", Bags(), lambda m: F.binary_cross_entropy_with_logits(m(ids, off), lbl))
    at = annotate(load_traces(folder))
    assert at.base_batch == BATCH and "offsets" in at.batch_source


def test_recurrent_model_composes_gemms_sub_linearly():
    from predictor.timing.kernels import TaskView, timing_for

    t = timing_for("cpu-local")
    times = {}
    for kind in ("rnn", "rnn_bwd"):
        for b in (16, 32, 64):
            v = TaskView.single(kind, batch=b, m=20, n=512, k=64, dim=128, elements=b * 20 * 512, dtype_bytes=4)
            times[kind, b] = float(t.model_for(kind).predict(v, t.platform)[0])
    for kind in ("rnn", "rnn_bwd"):
        assert 0 < times[kind, 16] < times[kind, 32] < times[kind, 64]
        assert times[kind, 64] / times[kind, 32] <= 2.05  # the recurrent GEMMs are only B rows tall
    assert times["rnn_bwd", 32] > 1.5 * times["rnn", 32]


def test_anchored_time_trusts_the_kernel_share_of_the_trace():
    from predictor.whatif.timing import anchored_time

    t_old, t_new = np.array([1.0, 1.0]), np.array([3.0, 3.0])
    # no profiler cost removed: measured x ratio; all of it removed: the model's increment
    out = anchored_time(np.array([2.0, 0.0]), np.array([2.0, 5.0]), t_old, t_new)
    assert out == pytest.approx([6.0, 2.0])


def test_batch_what_if_reports_kinds_without_a_model(mixed):
    from predictor.whatif.apply import parse_sets, predict_trace

    res = predict_trace(mixed, parse_sets(["batch_size=x2"]))
    s = res.summary()
    assert s["predicted_iteration_s"] > 0
    assert all(v["tasks"] > 0 and v["how"] for v in s["fallback"].values())
    assert not {"rnn", "rnn_bwd", "batch_norm", "conv2d"} & set(s["fallback"])  # these have models


# ----------------------------------------------------------------------------- layer blocks
@pytest.mark.parametrize("which", [0, 1])
def test_layers_and_pp_on_four_identical_blocks(blocks_mlp, which):
    from predictor.whatif.apply import parse_sets, predict_trace

    folder = blocks_mlp[which]
    res = predict_trace(folder, parse_sets(["layers=x2"]))
    ch = res.changes["layers"]
    assert ch["from"] == 4 and ch["to"] == 8 and ch["ops_per_layer_forward"] == 2
    assert "backward blocks from autograd sequence numbers" in ch["notes"]
    assert ("module hierarchy" if which == 0 else "op signatures") in " ".join(ch["notes"])
    assert res.predicted_iteration_s > res.baseline_replayed_s
    pp = predict_trace(folder, parse_sets(["pp=2"]))
    assert pp.changes["pp"]["layers_per_stage"] == [2, 2]


def test_module_blocks_name_the_sequential(blocks_mlp):
    from predictor.sources.traces.kineto import EventCat
    from predictor.sources.traces.load import load_traces
    from predictor.sources.traces.modules import forward_op_of, module_blocks
    from predictor.sources.traces.op_tree import op_tree

    tree = op_tree(load_traces(blocks_mlp[0]).ranks[0].kineto)
    kt = tree.kt
    fwd_of = forward_op_of(tree)
    assert fwd_of  # every backward op of a Linear/ReLU maps to its forward op
    tops = [e for e in tree.events.tolist() if kt.cat[e] == EventCat.CPU_OP and e not in tree.parent
            and e not in fwd_of]
    mb = module_blocks(tree, tops)
    assert mb.count == 4 and mb.description.startswith("4 x Sequential")


# ----------------------------------------------------------------------------- platform
def test_platform_move_says_what_stays_on_the_host(blocks_mlp):
    from predictor.whatif.apply import parse_sets, predict_trace

    small = {p: predict_trace(blocks_mlp[0], parse_sets(["batch_size=x2"]), p) for p in ("a100-80gb", "rtx-2080ti")}
    for p, r in small.items():
        pl = r.changes["platform"]
        assert pl["to"] == p and pl["kernels_moved"] > 0 and pl["device_busy_s"] > 0 and pl["host_s"] > 0
        assert pl["bound"] == ("host" if pl["host_s"] >= pl["device_busy_s"] else "device")
        assert f"{pl['bound']}-bound on {p}" in pl["explanation"] and pl["explanation"] in r.notes
        if pl["bound"] == "host":  # the host's time sets the step, plus at most the device's tail
            assert pl["host_s"] * 0.999 <= r.predicted_iteration_s <= pl["host_s"] + pl["device_busy_s"]
    big = {p: predict_trace(blocks_mlp[0], parse_sets(["batch_size=x2000000"]), p) for p in ("a100-80gb", "rtx-2080ti")}
    assert all(r.changes["platform"]["bound"] == "device" for r in big.values())
    assert big["rtx-2080ti"].predicted_iteration_s > 1.5 * big["a100-80gb"].predicted_iteration_s


def test_host_bound_move_explains_an_unchanged_step(blocks_mlp):
    """Host time that exceeds every GPU's kernel time: the same prediction on each, and the output says so."""
    from predictor.graph import ProcKind
    from predictor.sources.traces.load import load_traces
    from predictor.whatif.annotate import annotate
    from predictor.whatif.apply import parse_sets, predict_trace

    at = annotate(load_traces(blocks_mlp[0]))
    for g in at.graphs():  # 2 ms of host work per op: a slow host
        host = (g.proc_kind[g.proc] == ProcKind.CPU_THREAD) & g.kind_mask("cpu_op")
        g.duration[host] = 2e-3
    res = {p: predict_trace(blocks_mlp[0], parse_sets([]), p, annotated=at) for p in ("a100-80gb", "h100", "rtx-2080ti")}
    first = res["a100-80gb"].predicted_iteration_s
    assert all(r.predicted_iteration_s == pytest.approx(first, rel=1e-3) for r in res.values())  # only the tail differs
    for r in res.values():
        assert r.changes["platform"]["bound"] == "host"
        assert "does not change the step" in r.changes["platform"]["explanation"]
