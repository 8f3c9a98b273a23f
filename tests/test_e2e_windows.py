"""Scoring a pack against every archived e2e measurement window (experiments/e2e_windows.py)."""

from __future__ import annotations

import json

import pytest

from experiments.e2e_windows import (
    at_median_pace,
    drift_relative,
    load_windows,
    pace_relative_summary,
    rank_ratios,
    score,
    window_gemm_drift,
)


def _window(t: str, mlp64: float, gpt2: float) -> dict:
    return {"measured_at": t, "rows": [{"model": "mlp", "batch": 64, "ranks": 1, "measured_s": mlp64},
                                       {"model": "gpt", "batch": 2, "ranks": 1, "measured_s": gpt2}]}


def test_score_per_window_pooled_and_against_the_median_of_windows() -> None:
    windows = [_window("a", 0.010, 0.050), _window("b", 0.012, 0.040), _window("c", 0.011, 0.045)]
    pred = {("mlp", 64): 0.011, ("gpt", 2): 0.045}
    got = score(pred, windows)
    assert [w["n"] for w in got["windows"]] == [2, 2, 2]
    assert got["windows"][0]["max_abs_pct"] == pytest.approx(10.0)  # mlp: 11 vs 10 ms
    assert got["pooled"]["n"] == 6 and got["pooled"]["max_abs_pct"] == pytest.approx(12.5)  # gpt 45 vs 40
    # the per-configuration medians (11 ms, 45 ms) are exactly the predictions
    assert got["vs_median_of_windows"]["max_abs_pct"] == pytest.approx(0.0, abs=1e-9)
    assert got["per_config_vs_median"] == {"mlp 64": pytest.approx(0.0, abs=1e-9), "gpt 2": pytest.approx(0.0, abs=1e-9)}


def test_the_two_rank_ratio_is_taken_inside_each_window() -> None:
    def w(t: str, one: float, two: float) -> dict:
        return {"measured_at": t, "rows": [{"model": "dlrm", "batch": 256, "ranks": 1, "measured_s": one},
                                           {"model": "dlrm-2rank", "batch": 256, "ranks": 2, "measured_s": two}]}

    # the machine twice as slow in the second window: the ratio does not move
    windows = [w("a", 0.040, 0.030), w("b", 0.080, 0.060), w("c", 0.050, 0.040)]
    got = rank_ratios({("dlrm", 256): 0.050, ("dlrm-2rank", 256): 0.030, ("mlp", 64): 0.01}, windows)
    assert list(got) == ["256"]
    r = got["256"]
    assert r["measured"] == pytest.approx(0.75) and r["measured_range"] == pytest.approx([0.75, 0.8])
    assert r["predicted"] == pytest.approx(0.6) and r["error_pct"] == pytest.approx(-20.0)
    assert r["n"] == 3


def test_the_machine_drift_is_divided_out_per_configuration() -> None:
    def w(t: str, drift: float, mlp64: float) -> dict:
        return {**_window(t, mlp64, 0.05), "gemm_drift": {"before": {"ratio_geomean": drift},
                                                          "after": {"ratio_geomean": drift}}}

    # the MLP step runs exactly at the machine's pace x 1.1 in every window: its error beyond the drift is 10 %
    windows = [w("a", 1.0, 0.011), w("b", 1.2, 0.0132), w("c", 0.9, 0.0099), _window("d", 0.5, 0.05)]
    assert window_gemm_drift(windows[1]) == pytest.approx(1.2) and window_gemm_drift(windows[3]) is None
    got = drift_relative({("mlp", 64): 0.010, ("gpt", 2): 0.05}, windows)
    assert got["mlp 64"]["n"] == 3  # the window without a drift record is left out
    assert got["mlp 64"]["over_drift"] == pytest.approx(1.1)
    assert got["mlp 64"]["measured_over_predicted"] == pytest.approx(1.1)
    assert got["mlp 64"]["corr_with_drift"] == pytest.approx(1.0)
    summary = pace_relative_summary(got)
    assert summary["max_abs_pct"] == pytest.approx(10.0) and pace_relative_summary({}) == {}


def test_the_median_pace_what_if_scales_every_prediction_by_the_median_drift() -> None:
    def w(t: str, drift: float, mlp64: float, gpt2: float) -> dict:
        return {**_window(t, mlp64, gpt2), "gemm_drift": {"before": {"ratio_geomean": drift},
                                                          "after": {"ratio_geomean": drift}}}

    # the machine runs 1.1x the pack's recorded pace in the median window; predictions right at the pack's pace
    windows = [w("a", 1.0, 0.010, 0.050), w("b", 1.1, 0.011, 0.055), w("c", 1.2, 0.012, 0.060), _window("d", 9, 9)]
    got = at_median_pace({("mlp", 64): 0.010, ("gpt", 2): 0.050}, windows[:3])
    assert got["pace"] == pytest.approx(1.1) and got["n_windows"] == 3
    assert got["max_abs_pct"] == pytest.approx(0.0, abs=1e-9)  # x1.1 = the medians 11 ms, 55 ms
    # without the scaling the same predictions are 9.1 % under the medians
    assert score({("mlp", 64): 0.010, ("gpt", 2): 0.050}, windows[:3])["vs_median_of_windows"]["max_abs_pct"] == \
        pytest.approx(100 / 11, rel=1e-6)
    assert at_median_pace({("mlp", 64): 0.010}, [windows[3]]) == {}  # no drift record: no what-if


@pytest.mark.parametrize("text", ["{not json", json.dumps([{"measured_at": "x", "rows": [{"model": "mlp"}]}]),
                                  json.dumps([])])
def test_a_malformed_archive_is_one_line_and_exit_2(tmp_path, capsys, text) -> None:
    f = tmp_path / "w.json"
    f.write_text(text)
    with pytest.raises(SystemExit) as exc:
        load_windows(f)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(f) in err and err.count("\n") == 1


def test_a_missing_archive_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        load_windows(tmp_path / "none.json")
    assert exc.value.code == 2 and "run experiments/e2e_cpu.py first" in capsys.readouterr().err


def test_the_scores_never_overwrite_the_archive(tmp_path, capsys) -> None:
    from experiments.e2e_windows import main

    archive = tmp_path / "w.json"
    archive.write_text(json.dumps([_window("a", 0.01, 0.05)]))
    with pytest.raises(SystemExit) as exc:
        main(["--archive", str(archive), "--out", str(tmp_path / "w")])
    assert exc.value.code == 2 and "would overwrite the archive" in capsys.readouterr().err
    assert json.loads(archive.read_text())[0]["measured_at"] == "a"


def test_windows_of_another_allocator_mode_are_left_out(tmp_path, capsys) -> None:
    from experiments.e2e_windows import main

    archive = tmp_path / "w.json"
    archive.write_text(json.dumps([_window("a", 0.01, 0.05)]))  # no "allocator": measured as glibc comes
    with pytest.raises(SystemExit) as exc:
        main(["--archive", str(archive), "--allocator", "no_trim", "--out", str(tmp_path / "s")])
    assert exc.value.code == 2 and "no window measured with --allocator no_trim" in capsys.readouterr().err
    assert not (tmp_path / "s.md").exists()


def test_only_the_windows_of_the_packs_cpu_are_pooled() -> None:
    from experiments.e2e_windows import windows_of_cpu

    avx2 = {"model_name": "AMD EPYC", "family": "25", "model": "1", "torch_capability": "AVX2", "isa": "avx2 fma"}
    avx512 = {**avx2, "torch_capability": "AVX512", "isa": "avx2 fma avx512f avx512_bf16"}
    windows = [_window("old", 0.01, 0.05), {**_window("a", 0.02, 0.08), "cpu": avx2},
               {**_window("b", 0.01, 0.05), "cpu": avx512}]
    assert [w["measured_at"] for w in windows_of_cpu(windows, avx2)] == ["a"]
    assert [w["measured_at"] for w in windows_of_cpu(windows, {**avx2, "stepping": "9"})] == ["a"]  # not compared
    assert [w["measured_at"] for w in windows_of_cpu(windows, None)] == ["old"]  # unrecorded: sessions 1-20's host
    assert windows_of_cpu(windows, {**avx2, "model": "17"}) == []


def test_a_pack_without_windows_of_its_cpu_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    from experiments.e2e_windows import main

    archive = tmp_path / "w.json"
    archive.write_text(json.dumps([{**_window("a", 0.01, 0.05), "cpu": {"model_name": "Other CPU"}}]))
    with pytest.raises(SystemExit) as exc:  # a catalog platform has no pack, so no CPU record
        main(["--archive", str(archive), "--platform", "h100-sxm", "--out", str(tmp_path / "s")])
    assert exc.value.code == 2 and "no window measured on the CPU of" in capsys.readouterr().err
    assert not (tmp_path / "s.md").exists()


def test_a_contention_what_if_replaces_only_the_named_factors(tmp_path) -> None:
    from experiments.e2e_windows import resolve_spec

    base, _ = resolve_spec("cpu-local-avx2", tmp_path / "a")
    t, _ = resolve_spec("hc:embedding=1.0,memory=1.1:cpu-local-avx2", tmp_path / "b")
    for world, f in base.platform.host_contention.items():
        assert t.platform.host_contention[world] == {**f, "embedding": 1.0, "memory": 1.1}


@pytest.mark.parametrize("spec", ["hc:embedding=1.0", "hc:cache=1.0:cpu-local-avx2", "hc:embedding=x:cpu-local-avx2",
                                  "hc:embedding=0:cpu-local-avx2", "hc:embedding=nan:cpu-local-avx2"])
def test_a_malformed_contention_what_if_is_one_line_and_exit_2(tmp_path, capsys, spec) -> None:
    from experiments.e2e_windows import resolve_spec

    with pytest.raises(SystemExit) as exc:
        resolve_spec(spec, tmp_path)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "expected hc:CLASS=F" in err and len(err.strip().splitlines()) == 1


def test_windows_of_another_batch_pool_are_left_out(tmp_path, capsys) -> None:
    from experiments.e2e_windows import main

    archive = tmp_path / "w.json"
    archive.write_text(json.dumps([_window("a", 0.01, 0.05)]))  # no "batch_pool": the 2 batches of every old run
    with pytest.raises(SystemExit) as exc:
        main(["--archive", str(archive), "--batch-pool", "8", "--out", str(tmp_path / "s")])
    assert exc.value.code == 2 and "and --batch-pool 8" in capsys.readouterr().err
    assert not (tmp_path / "s.md").exists()


def test_since_that_is_not_a_time_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    from experiments.e2e_windows import main

    with pytest.raises(SystemExit) as exc:
        main(["--since", "yesterday", "--archive", str(tmp_path / "w.json"), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--since 'yesterday'" in err and err.count("\n") == 1


def test_since_keeps_only_the_windows_measured_from_then_on(tmp_path, capsys) -> None:
    from experiments.e2e_windows import main

    f = tmp_path / "w.json"
    rows = [{"model": "mlp", "batch": 64, "ranks": 1, "measured_s": 0.01}]
    f.write_text(json.dumps([{"measured_at": "2026-11-26T10:33:14+00:00", "batch_pool": 2, "rows": rows},
                             {"measured_at": "2026-11-26T11:20:00+00:00", "batch_pool": 2, "rows": rows}]))
    with pytest.raises(SystemExit) as exc:  # both windows are older than --since: none is left to score
        main(["--since", "2026-11-26T11:30", "--archive", str(f), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and "since 2026-11-26T11:30" in capsys.readouterr().err


def test_since_over_a_window_whose_time_is_not_iso_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    from experiments.e2e_windows import main

    f = tmp_path / "w.json"
    rows = [{"model": "mlp", "batch": 64, "ranks": 1, "measured_s": 0.01}]
    f.write_text(json.dumps([{"measured_at": "noon", "batch_pool": 2, "rows": rows}]))
    with pytest.raises(SystemExit) as exc:
        main(["--since", "2026-11-26T11:30", "--archive", str(f), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "measured_at 'noon'" in err and err.count("\n") == 1
    assert not (tmp_path / "o.md").exists()
