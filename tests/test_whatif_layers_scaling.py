"""``layers=xN`` adds what the repeated blocks cost on average, and nothing outside them.

A captured CPU step's later layers can run slower than its first ones (the heap faults their
activations in again), so a copy of the last block alone over-prices every added layer: twice the
layers then predicted more than twice the step, although the embedding, head, loss and the rest do
not double."""

from __future__ import annotations

import numpy as np
import pytest
from _trace_fixtures import capture_steps

from predictor.graph.edit import AUX_KEY
from predictor.simulate import simulate
from predictor.whatif.common import PHASE_BWD, PHASE_FWD, PHASE_OPT
from predictor.whatif.layers import detect_layers, set_layers

US = 1e-6


def _graph_with_slow_last_block(block_us: tuple[float, ...] = (10.0, 10.0, 40.0)):
    """Prefix (embedding, 50 µs), one (addmm, relu) block per entry of ``block_us`` (the addmm's µs),
    a head and loss (80 µs), the blocks' backward and optimizer ops, on one CPU thread."""
    from predictor.graph import Category, GraphBuilder, ProcKind

    b = GraphBuilder()
    cpu = b.processor(0, ProcKind.CPU_THREAD, "cpu tid 1")
    aux: dict[str, list[float]] = {"op": [], "phase": [], "sig": [], "measured_raw": []}

    def task(name, kind, cat, dur, op, phase, sig):
        b.task(cpu, name, kind, cat, duration=dur)
        for k, v in (("op", op), ("phase", phase), ("sig", sig), ("measured_raw", dur)):
            aux[k].append(float(v))

    task("ProfilerStep#1", "marker", Category.CPU, 0.0, -1, 0, -1)
    ops = [("embed", "elementwise", Category.MEMORY, 50 * US, PHASE_FWD, 0)]
    ops += [o for t in block_us for o in (("aten::addmm", "addmm", Category.COMPUTE, t * US, PHASE_FWD, 1),
                                          ("aten::relu", "relu", Category.MEMORY, 5 * US, PHASE_FWD, 2))]
    ops += [("head", "addmm", Category.COMPUTE, 80 * US, PHASE_FWD, 3)]
    ops += [("aten::mm", "mm", Category.COMPUTE, 2 * t * US, PHASE_BWD, 4) for t in reversed(block_us)]
    ops += [("aten::add_", "add", Category.MEMORY, 3 * US, PHASE_OPT, 5) for _ in block_us]
    for i, (name, kind, cat, dur, phase, sig) in enumerate(ops):
        task(name, kind, cat, dur, i, phase, sig)
    task("ProfilerStep#1", "marker", Category.CPU, 0.0, -1, 0, -1)
    g = b.build()
    g.meta[AUX_KEY] = {k: np.asarray(v) for k, v in aux.items()}
    return g


def _by_name(g) -> dict[str, tuple[int, float]]:
    names = np.asarray(g.names, dtype=object)[g.name]
    return {str(n): (int((names == n).sum()), float(g.duration[names == n].sum())) for n in np.unique(names)}


def test_added_layers_cost_the_mean_block_not_the_last():
    g = _graph_with_slow_last_block()
    before, t1 = _by_name(g), simulate(g).iteration_s
    g2 = set_layers(g, 6)
    after = _by_name(g2)
    # the blocks' tasks: twice the captured total (6 x the mean block), the last block's 40 µs copied 3x would
    # make the addmm 180 µs
    assert after["aten::addmm"][0] == 6 and after["aten::addmm"][1] == pytest.approx(2 * 60 * US)
    assert after["aten::mm"][1] == pytest.approx(2 * 120 * US)
    assert after["aten::relu"][1] == pytest.approx(2 * 15 * US)
    assert after["aten::add_"][1] == pytest.approx(2 * 9 * US)
    for name in ("embed", "head"):  # outside the blocks: unchanged
        assert after[name] == before[name]
    blocks = sum(before[n][1] for n in ("aten::addmm", "aten::relu", "aten::mm", "aten::add_"))
    t2 = simulate(g2).iteration_s
    assert t2 == pytest.approx(t1 + blocks) and t2 / t1 < 2.0
    # the traced time the re-timing weighs a copy's measurement by moves with it
    aux = g2.meta[AUX_KEY]
    copies = (aux["copied"] > 0) & (np.asarray(g2.names, dtype=object)[g2.name] == "aten::addmm")
    assert copies.sum() == 3 and np.allclose(aux["measured_raw"][copies], 20 * US)


def test_fewer_layers_keep_the_mean_block():
    g = _graph_with_slow_last_block()
    g2 = set_layers(g, 1)
    after = _by_name(g2)
    assert after["aten::addmm"] == (1, pytest.approx(20 * US))
    assert after["aten::mm"] == (1, pytest.approx(40 * US))
    assert after["embed"] == _by_name(g)["embed"]


def test_blocks_that_do_not_align_keep_their_own_times():
    from predictor.whatif.layers import typical_block_times

    g = _graph_with_slow_last_block()
    info = detect_layers(g)
    op = g.meta[AUX_KEY]["op"]
    on = g.rank == info.rank
    d, r = typical_block_times(g, on, info.blocks[PHASE_FWD])
    inside = np.isin(op, np.concatenate(info.blocks[PHASE_FWD]))
    assert np.isfinite(d[inside]).all() and np.isnan(d[~inside]).all()
    assert np.allclose(d[g.kind_mask("addmm") & inside], 20 * US) and np.allclose(r[inside], d[inside])
    # a block with one task more than the others: no mean, the copies keep the last block's times
    blocks = [info.blocks[PHASE_FWD][0], np.concatenate([info.blocks[PHASE_FWD][1], [0.0]]),
              info.blocks[PHASE_FWD][2]]
    d2, _ = typical_block_times(g, on, blocks)
    assert np.isnan(d2).all()


# ----------------------------------------------------------------------------- a captured model
torch = pytest.importorskip("torch")


class _BlocksWithHead(torch.nn.Module):
    """An embedding, 3 identical (Linear, GELU) blocks and a wide classifier head with its loss."""

    def __init__(self, layers: int = 3, d: int = 64, classes: int = 2000) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(500, d)
        self.blocks = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU())
                                            for _ in range(layers)])
        self.head = torch.nn.Linear(d, classes)

    def forward(self, idx):
        return self.head(self.blocks(self.emb(idx)).mean(1))


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    torch.manual_seed(0)
    model = _BlocksWithHead()
    idx, y = torch.randint(0, 500, (16, 8)), torch.randint(0, 2000, (16,))
    return capture_steps(tmp_path_factory.mktemp("blocks_head") / "cap", model,
                         lambda m: torch.nn.functional.cross_entropy(m(idx), y), steps=8, active=3)


def test_captured_blocks_double_and_the_rest_stays(captured):
    from predictor.sources.traces.load import load_traces
    from predictor.whatif.annotate import annotate
    from predictor.whatif.apply import parse_sets, predict_trace

    at = annotate(load_traces(captured))
    g = at.graphs()[0]
    info = detect_layers(g)
    assert info.count == 3
    g2 = set_layers(g, 6)
    op, op2 = g.meta[AUX_KEY]["op"], g2.meta[AUX_KEY]["op"]
    ids = np.concatenate([b for blks in info.blocks.values() for b in blks])
    inside = np.isin(op, ids)
    copied = np.nan_to_num(g2.meta[AUX_KEY].get("copied", np.zeros(g2.n_tasks))) > 0
    inside2 = np.isin(op2, ids) | copied
    d, d2 = np.nan_to_num(g.duration), np.nan_to_num(g2.duration)
    for k in np.unique(g.kind).tolist():
        kind = g.kinds[k]
        m, m2 = g.kind == k, g2.kind == g2.kinds.index(kind)
        # outside the blocks: the same tasks with the same times
        assert (m2 & ~inside2).sum() == (m & ~inside).sum(), kind
        assert d2[m2 & ~inside2].sum() == pytest.approx(d[m & ~inside].sum(), rel=1e-9, abs=1e-12), kind
        # inside: twice the tasks, twice the captured time of the kind
        assert (m2 & inside2).sum() == 2 * (m & inside).sum(), kind
        assert d2[m2 & inside2].sum() == pytest.approx(2 * d[m & inside].sum(), rel=1e-9, abs=1e-12), kind
    res = predict_trace(captured, parse_sets(["layers=x2"]), annotated=at)
    ratio = res.predicted_iteration_s / res.baseline_replayed_s
    assert 1.0 < ratio < 2.0
