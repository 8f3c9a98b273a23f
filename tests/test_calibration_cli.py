"""``tuner calibrate`` end to end on test-sized grids, and clean failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from predictor.timing.kernels.assets import load_asset_pack
from tuner.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))


def test_calibrate_cpu_quick_tiny_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    out = tmp_path / "packs" / "smoke"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--quick", "--out", str(out), "--threads", "1",
                              "--families", "gemm,elementwise,embedding_bag,data_movement"])
    assert res.exit_code == 0, res.output
    assert "held-out" in res.output and "addmm/fp32" in res.output and "embedding_bag_fwd" in res.output
    pack = load_asset_pack(out)
    assert pack.name == "smoke" and pack.manifest["threads"] == 1 and pack.manifest["level"] == "tiny"
    kernels = {r["kernel"] for r in pack.error_table}
    assert {"addmm/fp32", "bmm/bf16", "relu", "memcpy", "transpose", "embedding_bag_bwd"} <= kernels
    for r in pack.error_table:
        assert r["test"] >= 1 and r["gmae_pct"] >= 0
    assert pack.platform.key == "smoke"
    # T1..T5 measured (T1 less the profiler's cost per event, which a busy host can raise to T1 itself: >= 0)
    o = pack.platform.overheads
    assert all(np.isfinite(v) and v >= 0 for v in (o.t1_s, o.t2_s, o.t3_s, o.t4_s, o.t5_s))
    # the host's page-fault cost is measured and kept with the platform (priced into the embedding backward)
    assert 0 < pack.platform.page_fault_s < 1e-3 and pack.manifest["page_fault_s"] == pack.platform.page_fault_s
    # registered: --platform smoke resolves to it from anywhere
    from predictor.timing.kernels import timing_for

    assert timing_for("smoke").source == "asset pack smoke"
    assert (out / "data" / "gemm.csv").is_file() and (out / "errors.md").is_file()
    # on a CPU the memory-bound families are timed cold (cache evicted before each call), GEMMs warm
    assert pack.manifest["memory_bound_timing"] == "cold"
    assert set(pd.read_csv(out / "data" / "elementwise.csv")["cold"]) == {1}
    assert set(pd.read_csv(out / "data" / "gemm.csv")["cold"]) == {0} and pack.manifest["gemm_timing"] == "warm"
    assert pack.manifest["embedding_warmup"] == "neighbour"
    # with the embedding family the step-reuse probe runs too: its curve on the platform, its rows in the manifest
    assert len(pack.platform.embedding_step_reuse) == 2
    assert len(pack.manifest["embedding_step_reuse_probe"]["rows"]) == 2
    # and per pooling of the probe's tables (1 to 64 lookups per sample) at both working sets
    assert sorted({p[1] for p in pack.platform.embedding_step_reuse_pooling}) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    assert len(pack.platform.embedding_step_reuse_pooling) == 14


def test_calibrate_gemms_cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    out = tmp_path / "packs" / "cold"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--quick", "--out", str(out), "--threads", "1",
                              "--families", "gemm", "--gemm-timing", "cold"])
    assert res.exit_code == 0, res.output
    pack = load_asset_pack(out)
    assert pack.manifest["gemm_timing"] == "cold"
    assert set(pd.read_csv(out / "data" / "gemm.csv")["cold"]) == {1}
    assert pack.manifest["scale"] == 1.0


def test_scale_multiplies_grids_and_is_recorded(tmp_path: Path):
    # --scale K: K times the level's shapes per grid (the tiny level, for tests, keeps its counts)
    import numpy as np

    from predictor.timing.calibration.base import BenchContext
    from predictor.timing.calibration.timing import Timer

    def ctx(level: str, scale: float) -> BenchContext:
        return BenchContext(device=torch.device("cpu"), level=level, rng=np.random.default_rng(0),  # type: ignore[arg-type]
                            timer=Timer("cpu"), scale=scale)

    assert ctx("quick", 4.0).count(tiny=3, quick=350, full=1500) == 1400
    assert ctx("quick", 0.25).count(tiny=3, quick=2, full=9) == 1  # at least one
    assert ctx("full", 1.0).count(tiny=3, quick=350, full=1500) == 1500
    from predictor.timing.calibrate import CalibrationOptions, calibrate

    pack = calibrate(CalibrationOptions("cpu", out=tmp_path / "s", tiny=True, threads=1, families=["elementwise"], scale=2.0), log=lambda _: None, register=False)
    assert pack.manifest["scale"] == 2.0


def test_scale_goes_with_a_fresh_calibration(tmp_path: Path):
    res = runner.invoke(app, ["calibrate", "--refit", str(tmp_path / "p"), "--scale", "2"])
    assert res.exit_code == 2 and "--scale goes with a fresh calibration" in res.output


def test_rounds_time_each_shape_that_many_times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # --rounds N: every grid N times (the tiny level's default is one round); a sample keeps the median of its
    # rounds and records how many reached it
    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    out = tmp_path / "r3"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--quick", "--out", str(out), "--threads", "1",
                              "--families", "elementwise", "--rounds", "3"])
    assert res.exit_code == 0, res.output
    assert load_asset_pack(out).manifest["rounds"] == 3
    frame = pd.read_csv(out / "data" / "elementwise.csv")
    assert frame["rounds"].max() == 3 and (frame["rounds"] >= 1).all()
    for args, message in ((["--out", str(tmp_path / "x"), "--rounds", "0"], "--rounds 0: must be between 1 and"),
                          (["--refit", str(out), "--rounds", "5"], "--rounds goes with a fresh calibration")):
        res = runner.invoke(app, ["calibrate", "--device", "cpu", *args])
        assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output, res.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_calibrate_cuda_without_cuda_fails_cleanly(tmp_path: Path, device: str):
    res = runner.invoke(app, ["calibrate", "--device", device, "--out", str(tmp_path / "x")])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "CUDA is not available" in lines[0]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--device", "tpu"], "expected cpu, cuda or cuda:N"),
        (["--world-size", "0"], "--world-size 0: must be >= 1"),
        (["--families", "gemm,nosuch"], "unknown benchmark family 'nosuch'"),
        (["--memory-bound", "lukewarm"], "--memory-bound lukewarm: expected cold or warm"),
        (["--gemm-timing", "hot"], "--gemm-timing hot: expected cold or warm"),
        (["--scale", "0"], "--scale 0.0: must be between 0.25 and 64"),
        (["--scale", "100"], "--scale 100.0: must be between 0.25 and 64"),
        (["--scale", "nan"], "--scale nan: must be between 0.25 and 64"),
    ],
)
def test_calibrate_bad_input_is_one_line(tmp_path: Path, args: list[str], expect: str):
    res = runner.invoke(app, ["calibrate", "--out", str(tmp_path / "x"), *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and expect in lines[0]


@pytest.mark.slow
def test_calibrate_gloo_collectives_two_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(tmp_path / "coll"), "--threads", "1",
                              "--world-size", "2", "--families", "collectives"])
    assert res.exit_code == 0, res.output
    assert "collective waits, 2 ranks" in res.output and "all-reduce" in res.output
    pack = load_asset_pack(tmp_path / "coll")
    kernels = {r["kernel"] for r in pack.error_table}
    assert kernels == {"all_reduce/w2", "all_to_all/w2", "all_gather/w2", "reduce_scatter/w2"}
    coll = next(m for m in pack.models if type(m).__name__ == "PiecewiseCollective")
    assert ("all_to_all", 2) in coll.params
    assert pack.platform.interconnect.intra_node_latency_s > 0
    # every pass's median of single calls is kept (pass_s, mean_s their mean); the sample is the median
    # over all the calls of every pass, which lies between the passes' medians
    from predictor.timing.calibrate.options import collective_passes

    data = pd.read_csv(tmp_path / "coll" / "data" / "collectives.csv")
    passes = [[float(v) for v in str(s).split(";")] for s in data["pass_s"]]
    assert {len(p) for p in passes} == {collective_passes("tiny")}
    assert (data["calls"] >= 3 * collective_passes("tiny")).all()  # repeats x calls per batch, every pass
    lo, hi = np.array([min(p) for p in passes]), np.array([max(p) for p in passes])
    assert ((data["seconds"] >= lo * (1 - 1e-4)) & (data["seconds"] <= hi * (1 + 1e-4))).all()
    np.testing.assert_allclose(data["mean_s"], [np.mean(p) for p in passes], rtol=1e-4)
    np.testing.assert_allclose(data["median_s"], lo, rtol=1e-4)  # the fastest pass's median
    assert (data["call_mean_s"] > 0).all()
    # the platform keeps each kind's wait: median over its sizes of mean call - median call
    from predictor.timing.calibrate.calibrated_platform import collective_wait

    assert pack.platform.collective_wait_s[2] == pytest.approx(collective_wait(data, 2))
    assert set(pack.platform.collective_wait_s[2]) == {"all_reduce", "all_to_all", "all_gather", "reduce_scatter"}
    # the contention probe's raw timings travel with the pack, and the factors are their estimate
    from predictor.timing.calibration.contention import CONTENTION_ESTIMATOR, factors

    probe = pack.manifest["host_contention_probe"]
    assert probe["world"] == 2 and probe["estimator"] == CONTENTION_ESTIMATOR and len(probe["per_process"]) == 2
    got = dict(pack.platform.host_contention[2])
    assert {k: v for k, v in got.items() if k != "sync"} == pytest.approx(factors(probe["per_process"],
                                                                                   CONTENTION_ESTIMATOR))
    # and the lockstep probe's: the sync factor from its stored rows
    from predictor.timing.calibration.lockstep import lockstep_factor

    assert got["sync"] == pytest.approx(lockstep_factor(pack.manifest["lockstep_probe"]["per_process"]))


def test_a_refit_estimates_the_contention_again_from_the_stored_probe():
    from predictor.timing.calibrate.probes import contention_again
    from predictor.timing.calibration.contention import CONTENTION_ESTIMATOR, factors

    raw = [{c: [[1.0, 1.2], [1.0, 1.4]] for c in ("embedding", "memory", "compute")},
           {c: [[1.0, 1.0], [1.0, 1.1]] for c in ("embedding", "memory", "compute")}]
    stored = {"embedding": 9.0, "memory": 9.0, "compute": 9.0}
    m = {"host_contention_probe": {"world": 2, "estimator": "an older one", "per_process": raw}}
    info: dict = {}
    again = contention_again(m, 2, stored, info)
    assert again == pytest.approx(factors(raw, CONTENTION_ESTIMATOR))
    assert CONTENTION_ESTIMATOR in info["host_contention"]
    assert m["host_contention_probe"]["estimator"] == CONTENTION_ESTIMATOR
    # a pack without the raw timings (before 2026-11-25), or of another world size, keeps its factors
    assert contention_again({}, 2, stored, {}) == stored
    assert contention_again(m, 4, stored, {}) == stored


def test_refit_rebuilds_a_pack_from_its_stored_benchmarks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    src = tmp_path / "packs" / "src"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(src), "--threads", "1",
                              "--families", "gemm,elementwise"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "packs" / "again"
    res = runner.invoke(app, ["calibrate", "--refit", str(src), "--out", str(out)])
    assert res.exit_code == 0, res.output
    a, b = load_asset_pack(src), load_asset_pack(out)
    assert b.name == "again" and b.manifest["refit"]["from"] == str(src)
    # same data (the calibration fits the samples as it stores them: 6 significant digits), same seed, same
    # code: the same held-out errors, and the benchmarks' own facts kept (before the calibration fitted its
    # unrounded samples, a refit moved a tiny pack's GMAE by up to several percent and the test was flaky)
    assert [r["kernel"] for r in a.error_table] == [r["kernel"] for r in b.error_table]
    for ra, rb in zip(a.error_table, b.error_table, strict=True):
        assert rb["gmae_pct"] == pytest.approx(ra["gmae_pct"], rel=1e-6, abs=1e-9)
    assert b.manifest["created"] == a.manifest["created"] and b.manifest["level"] == "tiny"
    assert b.platform.overheads.t2_s == pytest.approx(a.platform.overheads.t2_s)
    assert "(calibrated" in b.platform.name and b.platform.name.count("(calibrated") == 1
    # measured facts travel with the pack (the cost itself is a timing of this machine: a fresh block's write
    # over a kept one's, clipped at 0; one CI run read 0.0, so only its presence is asserted)
    assert b.platform.page_fault_s == a.platform.page_fault_s >= 0
    assert "page_fault_s" in a.platform.sources and b.platform.sources["page_fault_s"] == a.platform.sources["page_fault_s"]
    # facts measured since (a pack calibrated before page faults were measured) go into the platform
    from predictor.timing.calibrate import CalibrationError, refit

    facts = {"page_fault_s": 2e-6, "fresh_mapping_bytes": 32.0 * 2**20}
    c = refit(src, tmp_path / "packs" / "facts", platform_facts=facts, log=lambda _m: None, register=False)
    assert c.platform.page_fault_s == 2e-6 and c.manifest["refit"]["platform_facts"] == facts
    assert c.manifest["page_fault_s"] == 2e-6
    with pytest.raises(CalibrationError, match="bad platform facts"):
        refit(src, tmp_path / "packs" / "bad", platform_facts={"page_fault_s": -1.0}, log=lambda _m: None,
              register=False)
    # in place by default
    res = runner.invoke(app, ["calibrate", "--refit", str(out)])
    assert res.exit_code == 0, res.output
    assert load_asset_pack(out).name == "again"


def test_no_fit_writes_benchmarks_that_refit_fits_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Measure on the device only (--no-fit), fit elsewhere (--refit); an unfitted pack predicts nothing."""
    from predictor.timing.kernels.assets import AssetPackError

    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    raw = tmp_path / "raw"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(raw), "--threads", "1",
                              "--families", "elementwise", "--no-fit"])
    assert res.exit_code == 0, res.output
    assert "not fitted" in res.output and "--refit" in res.output
    assert (raw / "data" / "elementwise.csv").exists() and not list((raw / "models").iterdir())
    with pytest.raises(AssetPackError, match="no fitted models yet"):
        load_asset_pack(raw)
    unfitted = load_asset_pack(raw, allow_unfitted=True)
    assert unfitted.manifest["fitted"] is False and unfitted.manifest["benchmark_s"] > 0
    res = runner.invoke(app, ["calibrate", "--refit", str(raw)])
    assert res.exit_code == 0, res.output
    pack = load_asset_pack(raw)
    assert "fitted" not in pack.manifest and pack.models and pack.error_table
    assert pack.manifest["benchmark_s"] == unfitted.manifest["benchmark_s"]
    assert "(calibrated" in pack.platform.name
    res = runner.invoke(app, ["calibrate", "--refit", str(raw), "--no-fit"])
    assert res.exit_code == 2 and "--no-fit goes with a fresh calibration" in res.output
    res = runner.invoke(app, ["calibrate", "--refit", str(raw), "--gemm-timing", "cold"])
    assert res.exit_code == 2 and "--gemm-timing goes with a fresh calibration" in res.output


@pytest.mark.parametrize("setup, message", [
    ("missing", "not found"),
    ("no_data", "stores no benchmark data"),
    ("bad_csv", "not a benchmark table"),
])
def test_refit_bad_pack_fails_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: str, message: str):
    import shutil

    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    pack = tmp_path / "p"
    if setup != "missing":
        res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(pack), "--threads", "1",
                                  "--families", "elementwise"])
        assert res.exit_code == 0, res.output
        if setup == "no_data":
            shutil.rmtree(pack / "data")
        else:
            (pack / "data" / "elementwise.csv").write_bytes(b"\x00\xff\xfe garbage \"unclosed\n1,2\n3\n")
    res = runner.invoke(app, ["calibrate", "--refit", str(pack)])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_out_or_refit_required():
    res = runner.invoke(app, ["calibrate", "--device", "cpu"])
    assert res.exit_code == 2 and "--out is required" in res.output


def test_refit_takes_overheads_measured_since(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import json

    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    src = tmp_path / "src"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(src), "--threads", "1",
                              "--families", "elementwise"])
    assert res.exit_code == 0, res.output
    ov = tmp_path / "ov.json"
    ov.write_text(json.dumps({"t1_s": 1e-6, "t2_s": 2e-6, "t3_s": 3e-6, "t4_s": 4e-6, "t5_s": 5e-6,
                              "definition": "test"}))
    res = runner.invoke(app, ["calibrate", "--refit", str(src), "--overheads", str(ov)])
    assert res.exit_code == 0, res.output
    p = load_asset_pack(src)
    assert p.platform.overheads.t4_s == pytest.approx(4e-6) and p.manifest["overheads"]["t5_s"] == 5e-6
    assert p.manifest["refit"]["overheads_from"] == str(ov)
    ov.write_text(json.dumps({"t1_s": -1}))
    res = runner.invoke(app, ["calibrate", "--refit", str(src), "--overheads", str(ov)])
    assert res.exit_code == 2 and "t1_s must be a non-negative number" in res.output
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(tmp_path / "x"), "--overheads", str(ov)])
    assert res.exit_code == 2 and "--overheads goes with --refit" in res.output


def _two_data_movement_packs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Two tiny data-movement calibrations of this machine with other shape grids (seeds 0 and 1): (base, other)."""
    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    base, other = tmp_path / "base", tmp_path / "dm-only"
    for out, seed in ((base, "0"), (other, "1")):
        res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(out), "--threads", "1",
                                  "--families", "data_movement", "--seed", seed])
        assert res.exit_code == 0, res.output
    return base, other


def _assert_refit_refuses(base: Path, out: Path, cases) -> None:
    """Each ``(--data-from values, message)`` case: a refit of ``base`` into ``out`` exits 2 with one line naming the
    problem (``message``), no traceback, and nothing written."""
    for args, message in cases:
        cmd = ["calibrate", "--refit", str(base), "--out", str(out)]
        for a in args:
            cmd += ["--data-from", a]
        res = runner.invoke(app, cmd)
        assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output, (args, res.output)
        assert not out.exists()


def test_refit_takes_some_kernels_of_a_family_from_another_pack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``--data-from FAMILY:KERNEL=PACK`` replaces that kernel's samples alone; the family's other kernels keep
    the refitted pack's, and the manifest records which kernels came from where."""
    base, other = _two_data_movement_packs(tmp_path, monkeypatch)
    mine, theirs = pd.read_csv(base / "data" / "data_movement.csv"), pd.read_csv(other / "data" / "data_movement.csv")
    merged = tmp_path / "merged"
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(merged),
                              "--data-from", f"data_movement:transpose={other}"])
    assert res.exit_code == 0, res.output
    got = pd.read_csv(merged / "data" / "data_movement.csv")
    pd.testing.assert_frame_equal(got[got.kernel == "transpose"].reset_index(drop=True),
                                  theirs[theirs.kernel == "transpose"].reset_index(drop=True), check_dtype=False)
    pd.testing.assert_frame_equal(got[got.kernel != "transpose"].reset_index(drop=True),
                                  mine[mine.kernel != "transpose"].reset_index(drop=True), check_dtype=False)
    assert not got[got.kernel == "transpose"].reset_index(drop=True).equals(
        mine[mine.kernel == "transpose"].reset_index(drop=True))  # another seed: other shapes
    rec = load_asset_pack(merged).manifest["refit"]["data_from"]
    assert list(rec) == ["data_movement:transpose"] and rec["data_movement:transpose"]["pack"] == str(other)
    assert rec["data_movement:transpose"]["samples"] == int((theirs.kernel == "transpose").sum())
    # the whole family taken later replaces the kernel's record as well as its rows
    again = tmp_path / "again"
    res = runner.invoke(app, ["calibrate", "--refit", str(merged), "--out", str(again),
                              "--data-from", f"data_movement={other}"])
    assert res.exit_code == 0, res.output
    assert list(load_asset_pack(again).manifest["refit"]["data_from"]) == ["data_movement"]
    pd.testing.assert_frame_equal(pd.read_csv(again / "data" / "data_movement.csv"), theirs, check_dtype=False)
    _assert_refit_refuses(base, tmp_path / "bad", (
        ([f"data_movement:transposes={other}"], "no data_movement samples of 'transposes'"),
        ([f"data_movement:={other}"], "no kernel named after the colon"),
        ([f"data_movement:transpose={other}", f"data_movement={other}"], "given twice"),
        ([f"step_reuse:x={other}"], "a probe, taken whole")))


def test_a_timing_only_run_of_one_kernel_goes_into_a_pack_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``--kernels K --no-fit`` times K alone, with the same shapes a whole-family run of that seed draws for it
    (the other kernels' shapes are drawn and left out), and records K in the manifest; such a timing-only run is
    pooled by name (``--data-from FAMILY:K=RUN``) and refused whole or as a pack to refit."""
    base, _ = _two_data_movement_packs(tmp_path, monkeypatch)
    run = tmp_path / "run"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(run), "--threads", "1",
                              "--families", "data_movement", "--seed", "0", "--kernels", "transpose", "--no-fit"])
    assert res.exit_code == 0, res.output
    assert "--data-from FAMILY:transpose=" in res.output
    got, whole = pd.read_csv(run / "data" / "data_movement.csv"), pd.read_csv(base / "data" / "data_movement.csv")
    assert set(got.kernel) == {"transpose"} and len(got) > 0
    shapes = [c for c in ("elements", "bytes", "m", "n") if c in got and c in whole]
    mine = whole[whole.kernel == "transpose"]
    assert {tuple(r) for r in got[shapes].astype(float).values} <= {tuple(r) for r in mine[shapes].astype(float).values}
    assert load_asset_pack(run, allow_unfitted=True).manifest["kernels"] == ["transpose"]
    merged = tmp_path / "merged"
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(merged),
                              "--data-from", f"data_movement:transpose={run}"])
    assert res.exit_code == 0, res.output
    out = pd.read_csv(merged / "data" / "data_movement.csv")
    assert len(out[out.kernel == "transpose"]) == len(got)
    assert "kernels" not in load_asset_pack(merged).manifest
    _assert_refit_refuses(base, tmp_path / "bad", (
        ([f"data_movement={run}"], "the pack timed only transpose"),))
    res = runner.invoke(app, ["calibrate", "--refit", str(run), "--out", str(tmp_path / "bad")])
    assert res.exit_code == 2 and "holds a timing-only run of transpose" in res.output
    assert not (tmp_path / "bad").exists()
    for args, message in ((["--kernels", "transpose"], "add --no-fit"),
                          (["--kernels", "relu", "--no-fit"], "'relu' is no kernel of the families run"),
                          (["--families", "embedding_bag", "--kernels", "embedding_bag_fwd", "--no-fit"],
                           "'embedding_bag_fwd' is no kernel of the families run that can be timed alone")):
        res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(tmp_path / "bad"), "--families",
                                  "data_movement", *args] if "--families" not in args else
                            ["calibrate", "--device", "cpu", "--out", str(tmp_path / "bad"), *args])
        lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and message in lines[0], (args, res.output)
        assert not (tmp_path / "bad").exists()


def test_refit_match_level_brings_taken_samples_to_the_packs_pace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``--match-level`` divides each taken kernel's times by their median ratio to the refitted pack's own model:
    a calibration run twice as slow adds the same shapes at the same level as one at the pack's pace."""
    from predictor.timing.calibrate.pool import TIME_COLUMNS, match_level

    base, other = _two_data_movement_packs(tmp_path, monkeypatch)
    pack = load_asset_pack(base)
    theirs = pd.read_csv(other / "data" / "data_movement.csv")
    slow = theirs.copy()
    for col in TIME_COLUMNS:
        if col in slow:
            slow[col] = slow[col] * 2.0
    a, lv = match_level(theirs, pack.models, pack.platform)
    b, lv2 = match_level(slow, pack.models, pack.platform)
    assert set(lv) == {"concat", "memcpy", "transpose"} and all(v > 0 for v in lv.values())
    assert all(lv2[k] == pytest.approx(2.0 * lv[k]) for k in lv)
    np.testing.assert_allclose(a["seconds"], b["seconds"])  # the run's pace is gone, the shapes' times stay
    np.testing.assert_allclose(a["seconds"] * a["kernel"].map(lv), theirs["seconds"])
    (other / "data" / "data_movement.csv").write_text(slow.to_csv(index=False))
    merged = tmp_path / "merged"
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(merged), "--match-level",
                              "--data-from", f"data_movement:transpose={other}"])
    assert res.exit_code == 0, res.output
    got = pd.read_csv(merged / "data" / "data_movement.csv")
    np.testing.assert_allclose(got[got.kernel == "transpose"]["seconds"], a[a.kernel == "transpose"]["seconds"],
                               rtol=1e-4)
    rec = load_asset_pack(merged).manifest["refit"]["data_from"]["data_movement:transpose"]
    assert rec["pace"]["transpose"] == pytest.approx(lv2["transpose"], rel=1e-3) and list(rec["pace"]) == ["transpose"]
    # the rescaled samples are fitted as the pack stores them: a plain refit of it reproduces its error table
    again = tmp_path / "again"
    assert runner.invoke(app, ["calibrate", "--refit", str(merged), "--out", str(again)]).exit_code == 0
    assert load_asset_pack(again).error_table == load_asset_pack(merged).error_table
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(tmp_path / "bad"), "--match-level"])
    assert res.exit_code == 2 and "--match-level goes with --data-from" in res.output
    assert not (tmp_path / "bad").exists()


def test_refit_pools_a_kernels_samples_over_several_packs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``--data-from KEY=A --data-from KEY=B`` fits the kernels of KEY on A's and B's samples together; with
    ``--match-level`` each pack's samples are brought to the refitted pack's pace on their own (a run twice as slow
    adds its shapes at the pack's level), and the manifest records each pack with its pace under ``sources``.
    Keys of one family with other kernels may be given side by side; a kernel under two keys is refused."""
    from predictor.timing.calibrate.pool import TIME_COLUMNS, match_level

    base, other = _two_data_movement_packs(tmp_path, monkeypatch)
    pack = load_asset_pack(base)
    mine, theirs = pd.read_csv(base / "data" / "data_movement.csv"), pd.read_csv(other / "data" / "data_movement.csv")
    slow = theirs.copy()
    for col in TIME_COLUMNS:
        if col in slow:
            slow[col] = slow[col] * 2.0
    (other / "data" / "data_movement.csv").write_text(slow.to_csv(index=False))
    pooled = tmp_path / "pooled"
    key = "data_movement:transpose"
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(pooled), "--match-level",
                              "--data-from", f"{key}={base}", "--data-from", f"{key}={other}",
                              "--data-from", f"data_movement:memcpy={other}"])
    assert res.exit_code == 0, res.output
    got = pd.read_csv(pooled / "data" / "data_movement.csv")
    a, _ = match_level(mine[mine.kernel == "transpose"].reset_index(drop=True), pack.models, pack.platform)
    b, lv = match_level(theirs[theirs.kernel == "transpose"].reset_index(drop=True), pack.models, pack.platform)
    t = got[got.kernel == "transpose"]
    assert len(t) == len(a) + len(b) and "_part" not in got
    np.testing.assert_allclose(t["seconds"], np.concatenate([a["seconds"], b["seconds"]]), rtol=1e-4)
    assert len(got[got.kernel == "memcpy"]) == int((theirs.kernel == "memcpy").sum())
    pd.testing.assert_frame_equal(got[got.kernel == "concat"].reset_index(drop=True),
                                  mine[mine.kernel == "concat"].reset_index(drop=True), check_dtype=False)
    rec = load_asset_pack(pooled).manifest["refit"]["data_from"]
    assert list(rec) == [key, "data_movement:memcpy"]
    assert [x["pack"] for x in rec[key]["sources"]] == [str(base), str(other)]
    assert rec[key]["samples"] == len(a) + len(b)
    assert rec[key]["sources"][1]["pace"]["transpose"] == pytest.approx(2.0 * lv["transpose"], rel=1e-3)
    assert rec[key]["sources"][0]["pace"]["transpose"] == pytest.approx(1.0, rel=0.5)
    table = {r["kernel"]: r for r in load_asset_pack(pooled).error_table}
    assert table["transpose"]["samples"] == len(a) + len(b)
    _assert_refit_refuses(base, tmp_path / "bad", (
        ([f"data_movement:transpose,memcpy={other}", f"{key}={base}"], "kernel 'transpose' given twice"),
        ([f"data_movement={other}", f"{key}={base}"], "family 'data_movement' given twice"),
        ([f"step_reuse={other}", f"step_reuse={base}"], "the step_reuse probe is taken from one")))


def test_refit_takes_a_family_from_another_pack_of_the_same_machine(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    import json

    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    base, other = tmp_path / "base", tmp_path / "gemm-only"
    for out, fams in ((base, "gemm,elementwise"), (other, "gemm")):
        res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(out), "--threads", "1",
                                  "--families", fams, "--seed", "0" if out == base else "1"])
        assert res.exit_code == 0, res.output
    theirs = pd.read_csv(other / "data" / "gemm.csv")
    assert not theirs.equals(pd.read_csv(base / "data" / "gemm.csv"))  # another seed: other shapes
    merged = tmp_path / "merged"
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(merged), "--data-from", f"gemm={other}"])
    assert res.exit_code == 0, res.output
    pack = load_asset_pack(merged)
    # the pack stores (and was fitted on) the other pack's GEMMs and its own element-wise samples
    pd.testing.assert_frame_equal(pd.read_csv(merged / "data" / "gemm.csv"), theirs)
    pd.testing.assert_frame_equal(pd.read_csv(merged / "data" / "elementwise.csv"),
                                  pd.read_csv(base / "data" / "elementwise.csv"))
    rec = pack.manifest["refit"]["data_from"]["gemm"]
    assert rec["pack"] == str(other) and rec["samples"] == len(theirs)
    # a later refit of the merged pack (no --data-from) keeps the record of where its GEMM samples came from
    again = tmp_path / "again"
    res = runner.invoke(app, ["calibrate", "--refit", str(merged), "--out", str(again)])
    assert res.exit_code == 0, res.output
    assert load_asset_pack(again).manifest["refit"]["data_from"]["gemm"] == rec
    # bad sources: one line naming the problem, exit 2, nothing written
    man = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**man, "gemm_timing": "cold"}))
    _assert_refit_refuses(base, tmp_path / "bad", (
        ([f"gemm={other}"], "its gemm_timing is 'cold'"),
        ([f"gemms={other}"], "unknown family 'gemms'"),
        ([f"conv2d={base}"], "has no conv2d benchmarks"),
        (["gemm"], "expected FAMILY=PACK"),
        ([f"gemm={tmp_path / 'nowhere'}"], "not found")))
    man["cpu"] = {**(man.get("cpu") or {}), "model": "another"}
    (other / "manifest.json").write_text(json.dumps(man))
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(tmp_path / "bad"),
                              "--data-from", f"gemm={other}"])
    assert res.exit_code == 2 and "another CPU" in res.output
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(tmp_path / "x"), "--data-from",
                              f"gemm={other}"])
    assert res.exit_code == 2 and "--data-from goes with --refit" in res.output


def test_a_family_is_checked_only_on_the_timing_fields_it_depends_on():
    from predictor.timing.calibrate.pool import LOCKSTEP_TIMING_FIELDS, TIMING_FIELDS, timing_fields

    # the GEMM timing concerns the GEMMs alone: a softmax table from a warm-GEMM calibration fits a cold-GEMM pack
    assert "gemm_timing" in timing_fields("gemm") and "gemm_timing" not in timing_fields("softmax")
    assert "memory_bound_timing" in timing_fields("softmax") and "memory_bound_timing" not in timing_fields("gemm")
    assert "embedding_warmup" in timing_fields("embedding_bag") and "embedding_warmup" not in timing_fields("conv2d")
    for family in ("gemm", "conv2d", "softmax", "collectives", "embedding_bag"):
        assert {"device", "threads", "timing_estimator"} <= set(timing_fields(family)) <= set(TIMING_FIELDS)
    assert timing_fields("lockstep") == LOCKSTEP_TIMING_FIELDS
    # the memory-bound families named there are the ones whose benchmarks follow the memory-bound timing flag
    import importlib

    from predictor.timing.calibrate.pool import FIELD_FAMILIES
    from predictor.timing.calibration import FAMILIES

    def bench_class(path: str):
        module, _, name = path.partition(":")
        return getattr(importlib.import_module(module), name)

    memory_bound = {f for f, path in FAMILIES.items() if bench_class(path).memory_bound}
    assert set(FIELD_FAMILIES["memory_bound_timing"]) == memory_bound


def test_round_spreads_and_the_noisy_machine_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from predictor.timing.calibrate import NOISY_ROUND_SPREAD_PCT, compute_round_spread, round_spreads

    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    src = tmp_path / "packs" / "src"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(src), "--threads", "1", "--families", "gemm"])
    assert res.exit_code == 0, res.output
    assert "warning" not in res.output  # tiny: one round, no spread to judge by
    gemm = pd.read_csv(src / "data" / "gemm.csv")
    noisy = np.where(gemm["kernel"].str.endswith("fp32"), 0.25, 0.05)
    gemm.assign(pass_spread=noisy).to_csv(src / "data" / "gemm.csv", index=False)
    spreads = round_spreads(src)
    assert spreads["addmm/fp32"] == pytest.approx(25.0) and spreads["mm/bf16"] == pytest.approx(5.0)
    assert compute_round_spread(spreads) == pytest.approx(25.0) and NOISY_ROUND_SPREAD_PCT < 25.0
    res = runner.invoke(app, ["calibrate", "--refit", str(src), "--out", str(tmp_path / "packs" / "again")])
    assert res.exit_code == 0, res.output
    assert "round spread" in res.output and "machine was noisy" in res.output
    # quiet rounds: no warning; a pack without data or spreads: nothing to judge
    gemm.assign(pass_spread=0.05).to_csv(src / "data" / "gemm.csv", index=False)
    res = runner.invoke(app, ["calibrate", "--refit", str(src), "--out", str(tmp_path / "packs" / "quiet")])
    assert res.exit_code == 0 and "machine was noisy" not in res.output
    assert round_spreads(tmp_path / "nowhere") == {} and compute_round_spread({"relu": 40.0}) is None


def test_the_step_reuse_probe_alone_goes_into_a_pack_by_refit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    base, probe = tmp_path / "base", tmp_path / "probe"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(base), "--threads", "1",
                              "--families", "elementwise"])
    assert res.exit_code == 0, res.output
    assert load_asset_pack(base).platform.embedding_step_reuse == []  # no embedding family: no probe
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(probe), "--threads", "1",
                              "--families", "step_reuse"])
    assert res.exit_code == 2 and "add --no-fit" in res.output and not probe.exists()
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(probe), "--threads", "1",
                              "--families", "step_reuse", "--no-fit"])
    assert res.exit_code == 0, res.output
    rows = load_asset_pack(probe, allow_unfitted=True).manifest["embedding_step_reuse_probe"]["rows"]
    merged = tmp_path / "merged"
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(merged),
                              "--data-from", f"step_reuse={probe}"])
    assert res.exit_code == 0, res.output
    pack = load_asset_pack(merged)
    from predictor.timing.calibration.step_reuse import reuse_curve, reuse_surface

    assert pack.platform.embedding_step_reuse == [pytest.approx(p) for p in reuse_curve(rows)]
    assert pack.platform.embedding_step_reuse_pooling == [pytest.approx(p) for p in reuse_surface(rows)]
    assert "embedding_step_reuse_pooling" in pack.platform.sources
    assert pack.manifest["embedding_step_reuse_probe"]["rows"] == rows
    assert pack.manifest["refit"]["data_from"]["step_reuse"]["rows"] == len(rows)
    assert "embedding_step_reuse" in pack.platform.sources
    # the models are the base pack's: only the curve was added
    assert (merged / "data" / "elementwise.csv").read_text() == (base / "data" / "elementwise.csv").read_text()
    # a pack without the probe cannot give one
    res = runner.invoke(app, ["calibrate", "--refit", str(merged), "--out", str(tmp_path / "bad"),
                              "--data-from", f"step_reuse={base}"])
    assert res.exit_code == 2 and "has no step-reuse probe" in res.output and not (tmp_path / "bad").exists()


def test_the_lockstep_probe_alone_goes_into_a_pack_of_its_world_size(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    import json

    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    base, probe = tmp_path / "base", tmp_path / "probe"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(base), "--threads", "1",
                              "--families", "elementwise"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(probe), "--threads", "1",
                              "--world-size", "2", "--families", "lockstep", "--no-fit"])
    assert res.exit_code == 0, res.output
    rows = load_asset_pack(probe, allow_unfitted=True).manifest["lockstep_probe"]["per_process"]
    assert len(rows) == 2
    # the base pack was calibrated for one process: a 2-process probe does not fit it
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(tmp_path / "bad"),
                              "--data-from", f"lockstep={probe}"])
    assert res.exit_code == 2 and "probed over 2 processes" in res.output and not (tmp_path / "bad").exists()
    man = json.loads((base / "manifest.json").read_text())
    # kernel-timing flags the probe does not use do not stop it (a pack with cold GEMMs takes it)
    (base / "manifest.json").write_text(json.dumps({**man, "world_size": 2, "gemm_timing": "cold"}))
    merged = tmp_path / "merged"
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(merged),
                              "--data-from", f"lockstep={probe}"])
    assert res.exit_code == 0, res.output
    pack = load_asset_pack(merged)
    from predictor.timing.calibration.lockstep import lockstep_factor

    assert pack.platform.host_contention[2]["sync"] == pytest.approx(lockstep_factor(rows))
    assert pack.manifest["lockstep_probe"]["per_process"] == rows
    assert "host_contention.sync" in pack.platform.sources
    res = runner.invoke(app, ["calibrate", "--refit", str(merged), "--out", str(tmp_path / "bad"),
                              "--data-from", f"lockstep={base}"])
    assert res.exit_code == 2 and "has no lockstep probe" in res.output
    # probes of several runs pool their rounds per process (here the same probe twice: every round twice)
    pooled = tmp_path / "pooled"
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(pooled),
                              "--data-from", f"lockstep={probe}", "--data-from", f"lockstep={merged}"])
    assert res.exit_code == 0, res.output
    man = load_asset_pack(pooled).manifest
    assert man["lockstep_probe"]["per_process"] == [{k: v + v for k, v in r.items()} for r in rows]
    assert man["refit"]["data_from"]["lockstep"]["probes"] == 2
    assert str(merged) in man["refit"]["data_from"]["lockstep"]["pack"]
    pman = json.loads((probe / "manifest.json").read_text())
    (probe / "manifest.json").write_text(json.dumps({**pman, "threads": 2}))  # but its threads per rank do
    res = runner.invoke(app, ["calibrate", "--refit", str(base), "--out", str(tmp_path / "bad"),
                              "--data-from", f"lockstep={probe}"])
    assert res.exit_code == 2 and "its threads is 2" in res.output and not (tmp_path / "bad").exists()


def test_refit_to_the_fastest_round_and_bad_fit_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``--fit-target fastest_round`` refits a pack's stored samples to their fastest rounds and keeps the
    choice in the manifest (a later plain refit keeps it); the models carry their state factors, and the
    table and the printout show both scores. An unknown target is one line and exit 2."""
    from predictor.timing.kernels.state import StateScaled

    monkeypatch.setenv("TUNER_CALIBRATE_TINY", "1")
    src = tmp_path / "packs" / "src"
    assert runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(src), "--threads", "1",
                               "--families", "gemm,elementwise"]).exit_code == 0
    out = tmp_path / "packs" / "fast"
    res = runner.invoke(app, ["calibrate", "--refit", str(src), "--out", str(out), "--fit-target", "fastest_round"])
    assert res.exit_code == 0, res.output
    assert "state x" in res.output and "typical GMAE" in res.output
    pack = load_asset_pack(out)
    assert pack.manifest["fit_target"] == "fastest_round"
    assert all(isinstance(m, StateScaled) for m in pack.models)
    for r in pack.error_table:
        assert r["state_factor"] >= 1.0 and r["typical"]["gmae_pct"] >= 0
    assert "typical GMAE %" in (out / "errors.md").read_text()
    assert runner.invoke(app, ["calibrate", "--refit", str(out)]).exit_code == 0  # in place: the target stays
    assert load_asset_pack(out).manifest["fit_target"] == "fastest_round"
    # collectives only: a pack without collectives keeps every model fitted to the typical rounds
    coll = tmp_path / "packs" / "coll"
    res = runner.invoke(app, ["calibrate", "--refit", str(src), "--out", str(coll), "--fit-target",
                              "fastest_collectives"])
    assert res.exit_code == 0, res.output
    pack = load_asset_pack(coll)
    assert pack.manifest["fit_target"] == "fastest_collectives"
    assert not any(isinstance(m, StateScaled) for m in pack.models)
    assert [r["gmae_pct"] for r in pack.error_table] == pytest.approx(
        [r["gmae_pct"] for r in load_asset_pack(src).error_table], rel=5e-2)
    # MLP refits agree to ~1e-4, but the refit reads the CSV's 6 significant digits, and a geomean moves
    # by more when one held-out sample's error lies near zero
    for args in (["calibrate", "--refit", str(src), "--out", str(tmp_path / "x"), "--fit-target", "fastest"],
                 ["calibrate", "--device", "cpu", "--out", str(tmp_path / "y"), "--fit-target", "min"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and "--fit-target" in res.output and "Traceback" not in res.output


def test_the_lockstep_probe_alone_on_one_process_is_refused_before_anything_is_written(tmp_path: Path):
    out = tmp_path / "one"
    res = runner.invoke(app, ["calibrate", "--device", "cpu", "--out", str(out), "--families", "lockstep", "--no-fit"])
    assert res.exit_code == 2 and "--world-size 2 or more" in res.output and "Traceback" not in res.output
    assert not out.exists()
