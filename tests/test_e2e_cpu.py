"""The end-to-end CPU experiment's pieces: real models mirror the synthesised graphs; measurement helpers."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments.e2e_cpu import GPTModel, gpt_graph, gpt_step, mlp_step, time_steps  # noqa: E402
from experiments.measure_env import BackgroundLoad, measure_quietly, wait_for_quiet  # noqa: E402
from predictor.sources.synth.mlp import MLPSpec, build_mlp_graph  # noqa: E402
from predictor.sources.synth.transformer import TransformerSpec  # noqa: E402

TINY_GPT = TransformerSpec(layers=2, hidden=32, heads=2, seq=16, vocab=64, dtype="fp32", attention="unfused")
GEMMS = {"aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm"}


def _profiled_gemms(step) -> Counter:
    step()  # warm-up (first-iteration allocations)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    return Counter(e.name for e in prof.events() if e.name in GEMMS)


def _graph_gemms(g) -> int:
    kinds = np.asarray(g.kinds)[g.kind]
    return int(np.isin(kinds, ["gemm", "addmm", "mm", "bmm"]).sum())


def test_gpt_model_has_the_specs_parameters_and_the_graphs_gemms():
    model = GPTModel(TINY_GPT)
    assert sum(p.numel() for p in model.parameters()) == TINY_GPT.param_count()
    real = _profiled_gemms(gpt_step(TINY_GPT, batch=2))
    assert sum(real.values()) == _graph_gemms(gpt_graph(TINY_GPT, 2))


def test_mlp_step_runs_the_graphs_gemms():
    spec = MLPSpec(input_dim=12, hidden=(24, 16), classes=3, batch_size=8)
    real = _profiled_gemms(mlp_step(spec))
    g = build_mlp_graph(spec)
    kinds = Counter(np.asarray(g.kinds)[g.kind])
    assert real["aten::addmm"] == kinds["addmm"] and real["aten::mm"] == kinds["mm"]


def test_time_steps_and_background_load():
    calls = []
    times = time_steps(lambda: calls.append(1), warmup=2, iters=5)
    assert len(calls) == 7 and len(times) == 5 and all(t >= 0 for t in times)
    with BackgroundLoad() as bg:
        sum(range(10000))
    assert bg.wall_s > 0 and (bg.cores >= 0 or np.isnan(bg.cores))
    assert wait_for_quiet(max_cores=1e9, window_s=0.01) >= 0


def test_measure_quietly_keeps_the_quietest_attempt():
    seen = []

    def run():
        seen.append(1)
        return [0.01 * len(seen)] * 3

    m = measure_quietly(run, max_background=-1.0, retries=2, log=lambda _: None, quiet_timeout_s=0.0)
    assert len(seen) == 3 and m.attempts == 3 and len(m.attempt_medians) == 3
    assert m.median_s in m.attempt_medians


_DLRM_JOB = """
import json, sys
sys.path.insert(0, sys.argv[1])
from experiments.dlrm_gloo import DLRMJobSpec, measure_dlrm
out = []
for n, a in ((1, (0, 0, 0)), (2, (0, 1, 1))):
    spec = DLRMJobSpec(rows=(100, 200, 50), dim=(8, 8, 16), pooling=(2.0, 0.5, 5.0), assignment=a, n_ranks=n,
                       batch_size=16, bottom_mlp=(16, 8), top_mlp=(16, 1), warmup=1, iters=2, phases=True,
                       pin=n > 1, batch_pool=1 if n == 1 else 3)
    r = measure_dlrm(spec)
    out.append({"n": n, "times": r["times"], "iteration_s": r["iteration_s"], "rf": sorted(r["rf"]),
                "phases": r["phases"], "starts": r["starts"],
                "labels": sorted({label for it in r["marks"][0] for label, _ in it})})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_dlrm_gloo_runs_on_one_and_two_ranks():
    # in a fresh interpreter: measure_dlrm forks its ranks, and a fork of this test process (which earlier
    # tests left with profiler / thread-pool threads) can deadlock in the child (it hung a CI run once)
    import json
    import subprocess

    res = subprocess.run([sys.executable, "-c", _DLRM_JOB, str(REPO)], capture_output=True, text=True, timeout=600,
                         check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    for r in json.loads(res.stdout.strip().splitlines()[-1]):
        assert len(r["times"]) == r["n"] and all(len(t) == 2 for t in r["times"])
        assert r["iteration_s"] > 0 and r["rf"] == [0, 1, 2]
        # every timed iteration's start on the host clock; with several ranks (pinned here) the
        # all-to-all's arrival and DDP's all-reduces (comm hook) are marked
        assert [len(s) for s in r["starts"]] == [2] * r["n"]
        assert ({"a2a_fwd_start", "ar_issue", "ar_done"} <= set(r["labels"])) == (r["n"] > 1)
        # phase marks: every timed iteration of every rank, adding up to its time
        for times, phases in zip(r["times"], r["phases"], strict=True):
            assert len(phases) == 2
            for t, ph in zip(times, phases, strict=True):
                assert ("a2a_bwd" in ph) == (r["n"] > 1) and "emb_bwd" in ph and min(ph.values()) >= 0
                assert sum(ph.values()) == pytest.approx(t, abs=5e-4)


def test_phase_seconds_cuts_an_iteration_at_its_marks():
    from experiments.dlrm_gloo import phase_seconds

    two = [("start", 10.0), ("emb_fwd_table", 10.5), ("emb_fwd", 11.0), ("a2a_fwd", 12.0), ("dense_fwd", 14.0),
           ("a2a_bwd_start", 17.0), ("a2a_bwd_end", 18.5), ("emb_grad", 18.6), ("emb_bwd", 19.0),
           ("emb_bwd", 21.0), ("backward", 21.5), ("optimizer", 22.0)]
    assert phase_seconds(two) == {"emb_fwd": 1.0, "a2a_fwd": 1.0, "dense_fwd": 2.0, "dense_bwd": 3.0, "a2a_bwd": 1.5,
                                  "emb_bwd": 2.5, "ddp_tail": 0.5, "optimizer": 0.5}
    one = [("start", 0.0), ("emb_fwd", 1.0), ("dense_fwd", 3.0), ("emb_grad", 6.0), ("emb_grad", 6.1),
           ("emb_bwd", 7.0), ("emb_bwd", 8.0), ("backward", 8.0), ("optimizer", 9.0)]
    assert phase_seconds(one) == {"emb_fwd": 1.0, "dense_fwd": 2.0, "dense_bwd": 3.0, "emb_bwd": 2.0, "ddp_tail": 0.0,
                                  "optimizer": 1.0}


def test_main_writes_the_table_and_json_last(tmp_path):
    import json

    from experiments.e2e_cpu import main

    main(["--models", "mlp", "--mlp-batches", "4", "8", "--iters", "10", "--passes", "2", "--warmup", "1",
          "--quiet-timeout", "0", "--retries", "0", "--no-check", "--platform", str(REPO / "assets" / "cpu-local"),
          "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "e2e_cpu.json").read_text())
    assert [r["batch"] for r in doc["rows"]] == [4, 8]
    r = doc["rows"][0]
    assert len(r["pass_medians_s"]) == 2 and r["measured_s"] > 0 and r["predicted_s"] > 0
    assert r["error_pct"] == pytest.approx(abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] * 100)
    assert "geomean_abs_pct_error" in doc["summary"]
    md = (tmp_path / "e2e_cpu.md").read_text()
    assert "| mlp |" in md and "kernel-sum baseline" in md
    assert doc["meta"]["batch_pool"] == 2 and "DLRM index batches: a pool of 2 cycled" in md
    # the host is recorded, and the committed pack (calibrated before packs recorded their CPU) is flagged
    assert doc["meta"]["cpu"]["torch_capability"] and "does not record its CPU" in doc["meta"]["pack_cpu_mismatch"]
    assert "CPU: " in md and "Host check" in md


@pytest.mark.parametrize("args", [["--iters", "3"], ["--archive", "--no-archive"], ["--batch-pool", "0"]])
def test_bad_arguments_exit_2(args, tmp_path, capsys):
    from experiments.e2e_cpu import main

    with pytest.raises(SystemExit) as exc:
        main([*args, "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert not (tmp_path / "e2e_cpu.json").exists()


def test_an_out_that_names_a_file_exits_2_before_measuring(tmp_path, capsys):
    from experiments.e2e_cpu import main

    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "e2e_cpu_mine.md")])
    assert exc.value.code == 2
    assert "a folder" in capsys.readouterr().err
    assert not (tmp_path / "e2e_cpu_mine.md").exists()


def test_system_time_per_step_counts_iterations():
    from experiments.e2e_cpu import system_time_per_step

    calls = []
    y = system_time_per_step(lambda: calls.append(sum(range(2000))), warmup=2, iters=5)
    assert len(calls) == 7
    assert y["wall_s"] > 0 and y["user_s"] >= 0 and y["system_s"] >= 0 and y["minor_faults"] >= 0


def test_gemm_drift_retimes_the_packs_own_shapes(tmp_path):
    import pandas as pd

    from experiments.e2e_cpu import drift_lines
    from experiments.measure_env import gemm_drift

    (tmp_path / "data").mkdir()
    rows = [{"kernel": f"{op}/fp32", "kind": op, "m": 32, "n": 32, "k": 32, "batch": 1, "dtype_bytes": 4,
             "flops": 65536.0, "seconds": 1.0} for op in ("mm", "addmm")]
    pd.DataFrame(rows).to_csv(tmp_path / "data" / "gemm.csv", index=False)
    d = gemm_drift(tmp_path, cases=2)
    # a 32^3 GEMM takes microseconds, recorded as 1 s: the ratio says "much faster now"
    assert d["cases"] == 2 and 0 < d["ratio_geomean"] < 0.01
    from predictor.timing.calibration.pace import pack_references

    assert d["reference"] == pack_references(tmp_path)["compute"]  # what the drift is a ratio to
    assert gemm_drift(tmp_path / "missing") == {}
    text = "\n".join(drift_lines({"before": d, "after": d}))
    assert "Machine drift" in text and f"x{d['ratio_geomean']:.3f}" in text


def test_memory_drift_retimes_the_packs_memcpy_shapes_as_they_were_timed(tmp_path):
    import pandas as pd

    from experiments.e2e_cpu import drift_lines
    from experiments.measure_env import memory_drift

    (tmp_path / "data").mkdir()
    rows = [{"kernel": "memcpy", "kind": "memcpy", "elements": 4096 * (i + 1), "dtype_bytes": 4,
             "bytes": 8.0 * 4096 * (i + 1), "seconds": 1.0, "cold": i % 2} for i in range(4)]
    rows.append({"kernel": "concat", "kind": "concat", "elements": 99, "dtype_bytes": 4, "bytes": 1e9,
                 "seconds": 1.0, "cold": 1})
    pd.DataFrame(rows).to_csv(tmp_path / "data" / "data_movement.csv", index=False)
    d = memory_drift(tmp_path, cases=8)
    assert d["cases"] == 2 and 0 < d["ratio_geomean"] < 0.01  # memcpy only, the larger half by bytes
    assert memory_drift(tmp_path / "missing") == {}
    g = {"cases": 1, "ratio_geomean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}
    text = "\n".join(drift_lines({"before": g, "after": g, "memory_before": d, "memory_after": d}))
    assert "memcpy microbenchmarks (2 shapes" in text
    with pytest.raises(ValueError, match="no column 'kernel'"):
        (tmp_path / "data" / "data_movement.csv").write_text("a,b\n1,2\n")
        memory_drift(tmp_path)


@pytest.mark.parametrize("content, message", [
    (b"\x00\xff garbage \"unclosed\n1,2\n3\n", "not a GEMM benchmark table"),
    (b"a,b\n1,2\n", "no column 'kernel'"),
])
def test_gemm_drift_rejects_a_corrupt_table(tmp_path, content: bytes, message: str):
    from experiments.measure_env import gemm_drift

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "gemm.csv").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        gemm_drift(tmp_path)


def test_embedding_override_applies_the_k_rank_contention_factor():
    """The cold-embedding diagnosis swaps the embedding models only: measured-alone times get the
    same host-contention factor the pack's predictions get in a K-rank graph."""
    import types

    import numpy as np

    from experiments.dlrm_gloo import EmbeddingOverride

    class Base:
        source = "stub"

        def durations(self, graph):
            return np.ones(3)

        def contention_factors(self, n_ranks):
            return {"embedding": 1.5} if n_ranks == 2 else {}

    def graph(n_ranks):
        return types.SimpleNamespace(n_ranks=n_ranks, kinds=["gemm", "embedding_bag_fwd", "embedding_bag_bwd"],
                                     kind=np.array([0, 1, 2]), names=["mm", "emb_fwd[1]", "emb_bwd[0]"],
                                     name=np.array([0, 1, 2]))

    o = EmbeddingOverride(Base(), fwd_s=np.array([0.1, 0.2]), bwd_s=np.array([0.3, 0.4]))
    assert np.allclose(o.durations(graph(1)), [1.0, 0.2, 0.3])
    assert np.allclose(o.durations(graph(2)), [1.0, 0.3, 0.45])
