"""GraphBuilder.append_tasks and single tasks mixed with stamps: the same graph as one task() call per task."""

import numpy as np

from predictor.graph import Category, DepKind, GraphBuilder, Overhead, ProcKind

_COLS = ("proc", "name", "kind", "category", "overhead", "duration", "flops", "bytes", "group", "rank")


def _block():
    b = GraphBuilder()
    cpu = b.processor(0, ProcKind.CPU_THREAD, "t")
    gpu = b.processor(0, ProcKind.GPU_STREAM, "s")
    b.task(cpu, "launch", "launch", Category.CPU, duration=1e-6)
    b.task(gpu, "gemm", "gemm", Category.COMPUTE, duration=5e-6, params={"m": 64.0})
    b.edge(0, 1, DepKind.CPU_GPU)
    return b.build()


def _graph(bulk: bool):
    block = _block()
    b = GraphBuilder()
    p = b.processor(1, ProcKind.CPU_THREAD, "main")
    rows = [("a", "cpu_op", Category.CPU, 1e-6, Overhead.T2), ("T1", "cpu_gap", Category.CPU, 2e-6, Overhead.T1),
            ("a", "sync", Category.SYNC, 0.0, Overhead.T4)]
    firsts = []
    for step in range(3):
        b.task(p, "lead", "cpu_op", Category.CPU, duration=3e-6, params={"n": float(step)})
        b.stamp(block, step % 2)
        if bulk:
            firsts.append(b.append_tasks(p, *(list(c) for c in zip(*rows, strict=True))))
        else:
            firsts.append(b.n_tasks)
            for nm, kd, cat, d, ov in rows:
                b.task(p, nm, kd, cat, duration=d, overhead=ov)
    return b.build(), firsts


def test_append_tasks_matches_single_tasks_between_stamps():
    bulk, first_bulk = _graph(True)
    one, first_one = _graph(False)
    assert first_bulk == first_one == [3, 9, 15]
    for c in _COLS:
        a, o = getattr(bulk, c), getattr(one, c)
        assert a.dtype == o.dtype
        np.testing.assert_array_equal(a, o)
    assert bulk.names == one.names and bulk.kinds == one.kinds
    for k in ("m", "n"):
        np.testing.assert_array_equal(bulk.params[k], one.params[k])
    np.testing.assert_array_equal(bulk.edge_src, one.edge_src)
    # the single tasks sit after the stamps appended before them
    assert [bulk.names[i] for i in bulk.name[:6]] == ["lead", "launch", "gemm", "a", "T1", "a"]
    assert np.isnan(bulk.flops[3:6]).all() and (bulk.group[3:6] == -1).all()
