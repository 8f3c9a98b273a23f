"""GraphBuilder.append_tasks with FLOPs, bytes, groups and parameters: the same graph as one append_task per task."""

import math

import numpy as np
import pytest

from predictor.graph import Category, GraphBuilder, GraphError, Overhead, ProcKind

_COLS = ("proc", "name", "kind", "category", "overhead", "duration", "flops", "bytes", "group", "rank")
_NAN = math.nan
#: (name, kind, category, duration s, FLOPs, bytes, group, parameters)
_ROWS = [
    ("gemm", "gemm", Category.COMPUTE, 5e-6, 2e9, 4096.0, -1, {"m": 64.0, "n": 32.0}),
    ("stream gap", "gpu_gap", Category.SYNC, 1e-6, _NAN, _NAN, -1, None),
    ("nccl", "all_reduce", Category.COMMUNICATION, 9e-6, _NAN, 1024.0, 0, {"msg_bytes": 1024.0}),
    ("stream gap", "gpu_gap", Category.SYNC, 1e-6, _NAN, _NAN, -1, {}),
    ("copy", "memcpy", Category.MEMORY, 2e-6, _NAN, 512.0, -1, {"n": 8.0}),
]


def _graph(bulk: bool):
    b = GraphBuilder()
    cpu = b.processor(0, ProcKind.CPU_THREAD, "main")
    gpu = b.processor(0, ProcKind.GPU_STREAM, "s7")
    b.task(cpu, "launch", "launch", Category.CPU, duration=1e-6, params={"k": 3.0})
    if bulk:
        nm, kd, cat, dur, fl, nb, grp, par = (list(c) for c in zip(*_ROWS, strict=True))
        first = b.append_tasks(gpu, nm, kd, cat, dur, [Overhead.NONE] * len(_ROWS), flops=fl, nbytes=nb, groups=grp,
                               params=par)
    else:
        first = b.n_tasks
        for nm, kd, cat, dur, fl, nb, grp, par in _ROWS:
            b.append_task(gpu, nm, kd, cat, dur, fl, nb, Overhead.NONE, grp, par)
    b.task(cpu, "sync", "sync", Category.SYNC, duration=0.0)
    return b.build(), first


def test_append_tasks_with_columns_matches_append_task():
    bulk, first_bulk = _graph(True)
    one, first_one = _graph(False)
    assert first_bulk == first_one == 1
    for c in _COLS:
        a, o = getattr(bulk, c), getattr(one, c)
        assert a.dtype == o.dtype
        np.testing.assert_array_equal(a, o)
    assert bulk.names == one.names and bulk.kinds == one.kinds
    assert list(bulk.params) == list(one.params) == ["k", "m", "n", "msg_bytes"]
    for k in bulk.params:
        np.testing.assert_array_equal(bulk.params[k], one.params[k])
    assert bulk.flops[1] == 2e9 and bulk.group[3] == 0 and bulk.params["n"][5] == 8.0


def test_append_tasks_rejects_an_unknown_parameter():
    b = GraphBuilder()
    p = b.processor(0, ProcKind.GPU_STREAM, "s")
    with pytest.raises(GraphError, match="unknown kernel parameter 'mm'"):
        b.append_tasks(p, ["k"], ["gemm"], [Category.COMPUTE], [1e-6], [Overhead.NONE], params=[{"mm": 1.0}])
