"""`space: parallel` search and `tuner predict --workload`: results, infeasible plans, resume, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from predictor.sources.synth.transformer import ParallelPlan
from predictor.timing.platforms import get_platform
from tuner.cli import app
from tuner.plans import predict_plan
from tuner.search import default_storage
from tuner.search.parallel import enumerate_candidates, normalise, run_parallel_search
from tuner.search.registry import load_space
from tuner.search.schema import SpaceError

REPO = Path(__file__).resolve().parents[1]

SPACE = {
    "space": "parallel",
    "model": {"name": "gpt-small", "layers": 8, "hidden": 1024, "heads": 16, "seq": 1024, "vocab": 8000},
    "cluster": {"platform": "a100-80gb", "nodes": 1},
    "global_batch": 32,
    "ranges": {"tp": [1, 2, 4], "pp": [1, 2, 4], "micro_batch": [1, 4], "recompute": ["none", "full"]},
    "search": {"strategy": "grid"},
}
MODEL = {"name": "m", "layers": 8, "hidden": 1024, "heads": 16, "seq": 1024, "vocab": 8000}


def _write(tmp_path: Path, data: dict, name: str = "space.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output


def _space(tmp_path, **changes):
    data = json.loads(json.dumps(SPACE))
    for k, v in changes.items():
        data[k] = v
    return load_space(_write(tmp_path, data))


# --------------------------------------------------------------------------- search
def test_grid_search_ranks_feasible_plans_and_never_picks_an_oom_one(tmp_path):
    # 80 MB devices do not hold 8 x 1024-wide layers unsplit: only some plans fit
    cat = tmp_path / "cat.yaml"
    cat.write_text("a100-80gb:\n  memory:\n    - {name: l2, capacity_bytes: 41943040, bandwidth_bytes_per_s: 7.2e+12, "
                   "on_chip: true}\n    - {name: hbm, capacity_bytes: 1.6e+9, bandwidth_bytes_per_s: 2.0e+12, on_chip: false}\n")
    space = _space(tmp_path, cluster={"platform": "a100-80gb", "nodes": 1, "catalog": str(cat)})
    out = tmp_path / "out"
    out.mkdir()
    code, text = _cli("search", str(_write(tmp_path, space.model_dump(mode="json"))), "--out", str(out), "--workers", "0")
    assert code == 0, text
    payload = json.loads((out / "results.json").read_text())
    plans = payload["plans"]
    ok = [p for p in plans if p["status"] == "ok"]
    oom = [p for p in plans if p["status"] == "infeasible"]
    assert ok and oom
    assert payload["best"]["key"] == ok[0]["key"]
    assert all(a["predicted_iteration_s"] <= b["predicted_iteration_s"] for a, b in zip(ok, ok[1:], strict=False))
    assert min(p["memory_bytes_per_device"] for p in oom) > 1.6e9
    assert all("GiB per device" in p["reason"] for p in oom)
    assert payload["best"]["memory_bytes_per_device"] <= 1.6e9
    assert (out / payload["best_trace"]).exists()
    assert (out / "results.csv").exists()
    assert payload["counts"]["candidates"] == len(plans)  # grid evaluates every candidate
    assert payload["best"]["key"].split("-")[0] in text  # the table shows the winner


def test_tpe_search_resumes_without_re_evaluating(tmp_path):
    space = _space(tmp_path, search={"strategy": "tpe", "trials": 6, "seed": 3},
                   ranges={"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch": [1, 2, 4], "recompute": ["none", "full"]})
    out = tmp_path / "o"
    out.mkdir()
    first = run_parallel_search(space, storage=default_storage(out), workers=0)
    assert first.space.strategy == "tpe" and len(first.outcomes) == 6 and first.evaluated == 6
    again = run_parallel_search(space, storage=default_storage(out), workers=0, resume=True)
    assert again.evaluated == 0 and again.reused == 6
    assert again.outcomes.keys() == first.outcomes.keys()
    more = run_parallel_search(space.model_copy(update={"search": space.search.model_copy(update={"trials": 8})}),
                               storage=default_storage(out), workers=0, resume=True)
    assert more.evaluated == 2 and len(more.outcomes) == 8


def test_candidates_skip_impossible_combinations(tmp_path):
    space = _space(tmp_path, ranges={"tp": [1, 2, 3], "pp": [1, 2, 16], "micro_batch": [1], "recompute": ["none"]})
    cands, invalid = enumerate_candidates(space, 8)
    keys = {c.key for c in cands}
    assert "tp2-pp2-dp2-mb1-1f1b-none" in keys
    reasons = " | ".join(r for _, r in invalid)
    assert "does not divide 8 devices" in reasons  # tp=3
    assert all(c.params["fields"]["tp"] * c.params["fields"]["pp"] * c.params["fields"]["dp"] == 8 for c in cands)


def test_fsdp_plans_are_searched_without_pipelines(tmp_path):
    space = _space(tmp_path, ranges={"tp": [1, 2], "pp": [1, 2], "micro_batch": [1], "recompute": ["full"],
                                     "fsdp": [False, True]})
    cands, invalid = enumerate_candidates(space, 8)
    keys = {c.key for c in cands}
    assert {"tp1-pp1-dp8-mb1-1f1b-full-fsdp", "tp2-pp1-dp4-mb1-1f1b-full-fsdp"} <= keys
    assert not any("fsdp" in k and "-pp2-" in k for k in keys)
    assert any("fsdp is modelled without pipeline parallelism" in r for _, r in invalid)
    res = run_parallel_search(space, storage=default_storage(_mk(tmp_path / "f")), workers=0)
    fsdp = [v[0].record for k, v in res.outcomes.items() if k.endswith("-fsdp")]
    assert fsdp and all(r["feasible"] and r["predicted_iteration_s"] > 0 for r in fsdp)
    # options.fsdp2: the FSDP plans run as PyTorch's fully_shard, the others are unchanged
    two = _space(tmp_path, ranges=space.ranges.model_dump(), options={"fsdp2": True})
    raw = {"tp": 1, "pp": 1, "micro_batch": 1, "schedule": "1f1b", "virtual_stages": 2, "recompute": "full",
           "sequence_parallel": False, "ep": 1, "distributed_optimizer": False}
    assert normalise(two, 8, {**raw, "fsdp": True})[1]["fsdp2"] and not normalise(two, 8, raw)[1]["fsdp2"]
    # options.fsdp_reshard_after_forward false: the FSDP plans keep their gathers to the backward (SHARD_GRAD_OP)
    keep = _space(tmp_path, ranges=space.ranges.model_dump(), options={"fsdp_reshard_after_forward": False})
    assert normalise(keep, 8, {**raw, "fsdp": True})[0] == "tp1-pp1-dp8-mb1-1f1b-full-fsdp-zero2"
    assert normalise(keep, 8, raw)[0] == "tp1-pp1-dp8-mb1-1f1b-full"
    # options.fsdp_shard: HSDP groups of that many data-parallel ranks, where they divide dp
    hsdp = _space(tmp_path, ranges=space.ranges.model_dump(), options={"fsdp_shard": 4})
    assert normalise(hsdp, 8, {**raw, "fsdp": True})[0] == "tp1-pp1-dp8-mb1-1f1b-full-fsdp-hsdp4"
    assert normalise(hsdp, 8, {**raw, "fsdp": True, "tp": 2})[0] == "tp2-pp1-dp4-mb1-1f1b-full-fsdp"  # 4 of 4: full
    assert "does not make HSDP groups" in normalise(hsdp, 6, {**raw, "fsdp": True})[1]


@pytest.mark.slow
def test_ray_workers_give_the_same_grid_as_in_process(tmp_path):
    space = _space(tmp_path, ranges={"tp": [2, 4], "pp": [1, 2], "micro_batch": [2], "recompute": ["none"]})
    a = run_parallel_search(space, storage=default_storage(_mk(tmp_path / "a")), workers=0)
    b = run_parallel_search(space, storage=default_storage(_mk(tmp_path / "b")), workers=2)
    assert {k: v[0].record["predicted_iteration_s"] for k, v in a.outcomes.items()} == pytest.approx(
        {k: v[0].record["predicted_iteration_s"] for k, v in b.outcomes.items()})


def _mk(p: Path) -> Path:
    p.mkdir()
    return p


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"model": {**MODEL, "heads": 12}}, "model: hidden size 1024 is not divisible by 12 heads"),
        ({"cluster": {"platform": "a100-90gb"}}, "unknown platform 'a100-90gb'"),
        ({"ranges": {"tp": [3], "pp": [1]}}, "no valid plan in the ranges for 8 devices"),
        ({"global_batch": 0}, "global_batch: Input should be greater than 0"),
        ({"ranges": {"schedule": ["zigzag"]}}, "ranges.schedule.0"),
        ({"model": {**MODEL, "dropout": 1.0}}, "model.dropout: Input should be less than 1"),
        ({"model": {**MODEL, "fp8_linear": True}}, "has no FP8 peak in the catalog"),
    ],
)
def test_bad_spaces_exit_2_with_one_line(tmp_path, change, expected):
    data = json.loads(json.dumps(SPACE))
    data.update(change)
    code, text = _cli("search", str(_write(tmp_path, data)), "--out", str(tmp_path / "out"), "--workers", "0")
    assert code == 2, text
    assert expected in text
    assert "Traceback" not in text
    assert not (tmp_path / "out" / "results.json").exists()


# --------------------------------------------------------------------------- tuner predict
def test_predict_prints_time_and_memory_as_json(tmp_path):
    wl = _write(tmp_path, MODEL, "model.yaml")
    code, text = _cli("predict", "--workload", str(wl), "--set", "tp=2", "--set", "pp=2", "--set", "dp=2",
                      "--set", "micro_batch=2", "--set", "global_batch=32", "--json")
    assert code == 0, text
    r = json.loads(text)
    assert r["predicted_iteration_s"] > 0 and r["memory_bytes_per_device"] > 0
    assert r["plan"] == "tp2-pp2-dp2-mb2-1f1b-none" and r["devices"] == 8
    assert len(r["memory_per_stage"]) == 2
    # the same plan from a space file (cluster of 8 devices: dp derived)
    code, text = _cli("predict", "--workload", str(_write(tmp_path, SPACE)), "--set", "tp=2", "--set", "pp=2",
                      "--set", "micro_batch=2", "--json")
    assert code == 0, text
    assert json.loads(text)["predicted_iteration_s"] == pytest.approx(r["predicted_iteration_s"])


def test_predict_writes_a_trace(tmp_path):
    wl = _write(tmp_path, {"model": MODEL, "global_batch": 8}, "model.yaml")
    code, text = _cli("predict", "--workload", str(wl), "--set", "tp=2", "--trace", str(tmp_path / "t.json"))
    assert code == 0, text
    assert "predicted_iteration_s" in text and "memory_bytes_per_device" in text
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--set", "tp=3", "--set", "global_batch=8"], "16 attention heads are not divisible by tp=3"),
        (["--set", "pp=16", "--set", "global_batch=8"], "pp=16 pipeline stages but the model has only 8 layers"),
        (["--set", "tp=2", "--set", "pp=2", "--set", "dp=4", "--set", "global_batch=8", "--devices", "8"],
         "tp x pp x dp = 2 x 2 x 4 = 16, but the cluster has 8 devices"),
        (["--set", "global_batch=8", "--platform", "a100-90gb"], "unknown platform 'a100-90gb' (did you mean a100"),
        (["--set", "global_batch=8", "--platform", "h100"], "'h100' is an asset pack, not a catalog entry"),
        (["--set", "global_batch=8", "--platform", "assets/h100"], "(did you mean h100-sxm?)"),
        (["--set", "tp=two"], "tp must be an integer"),
        (["--set", "colour=blue"], "unknown plan field 'colour'"),
        (["--set", "tp=2"], "global batch unknown"),
    ],
)
def test_predict_bad_input_exits_2_with_one_line(tmp_path, args, expected):
    wl = _write(tmp_path, MODEL, "model.yaml")
    code, text = _cli("predict", "--workload", str(wl), *args)
    assert code == 2, text
    assert expected in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1


def test_predict_from_a_missing_trace_or_nothing_exits_2(tmp_path):
    # the trace path itself is covered by tests/test_predict_trace.py
    code, text = _cli("predict", str(tmp_path / "trace.json"), "--set", "batch_size=64")
    assert code == 2 and "no such file or folder" in text
    code, text = _cli("predict")
    assert code == 2 and "--workload" in text
    code, text = _cli("predict", str(REPO / "search_spaces" / "parallel.yaml"))  # --workload forgotten
    assert code == 2 and "not a captured run: give it as --workload" in text and len(text.strip().splitlines()) == 1


def test_example_space_loads_and_has_valid_plans():
    space = load_space(REPO / "search_spaces" / "parallel.yaml")
    cands, _ = enumerate_candidates(space, 64)
    assert len(cands) > 100
    with pytest.raises(SpaceError):
        load_space(REPO / "search_spaces" / "missing.yaml")


def test_doc_len_is_a_model_field_and_a_predict_set(tmp_path):
    model = _write(tmp_path, {"model": {**MODEL, "attention": "flash2"},
                              "cluster": {"platform": "a100-80gb", "nodes": 1}, "global_batch": 8}, "m.yaml")
    code, whole = _cli("predict", "--workload", str(model), "--json")
    assert code == 0, whole
    code, packed = _cli("predict", "--workload", str(model), "--set", "doc_len=256", "--json")
    assert code == 0, packed
    assert json.loads(packed)["predicted_iteration_s"] < json.loads(whole)["predicted_iteration_s"]
    in_file = _write(tmp_path, {"model": {**MODEL, "attention": "flash2", "doc_len": 256},
                                "cluster": {"platform": "a100-80gb", "nodes": 1}, "global_batch": 8}, "d.yaml")
    code, same = _cli("predict", "--workload", str(in_file), "--json")
    assert code == 0 and json.loads(same)["predicted_iteration_s"] == json.loads(packed)["predicted_iteration_s"]
    for bad, said in (("doc_len=abc", "whole number of tokens"), ("doc_len=4096", "doc_len must be 1 .. seq")):
        code, out = _cli("predict", "--workload", str(model), "--set", bad)
        assert code == 2 and out.startswith("error:") and said in out, out
    too_long = _write(tmp_path, {"model": {**MODEL, "doc_len": 4096}, "cluster": {"platform": "a100-80gb"},
                                 "global_batch": 8}, "t.yaml")
    code, out = _cli("predict", "--workload", str(too_long))
    assert code == 2 and "doc_len" in out, out


def test_pipeline_split_counting_the_embedding_and_loss_fits_layers_that_do_not_divide(tmp_path):
    """options.pipeline_split embedding_and_loss: a 10-layer model on 4 stages runs 2, 3, 3, 2 layers (Megatron's
    --account-for-embedding/loss-in-pipeline-split); even, it cannot be split."""
    ranges = {"tp": [1], "pp": [4], "micro_batch": [1], "recompute": ["none"]}
    model = dict(SPACE["model"], layers=10)
    counted = _space(tmp_path, model=model, ranges=ranges, options={"pipeline_split": "embedding_and_loss"})
    cands, _ = enumerate_candidates(counted, 8)
    assert [c.key for c in cands] == ["tp1-pp4-dp2-mb1-1f1b-none-layers2,3x2,2"]
    res, _ = predict_plan(counted.model.to_spec(), ParallelPlan(**cands[0].params["fields"]), get_platform("a100-80gb"),
                          devices=8)
    assert res["feasible"] and res["predicted_iteration_s"] > 0
    cands, invalid = enumerate_candidates(_space(tmp_path, model=model, ranges=ranges, options={"pipeline_split": "even"}), 8)
    assert not cands and "cannot be split evenly" in invalid[0][1]
    auto = _space(tmp_path, model=model, ranges=dict(ranges, pp=[2, 4]))  # the default: even where the layers divide
    assert sorted(c.key for c in enumerate_candidates(auto, 8)[0]) == ["tp1-pp2-dp4-mb1-1f1b-none",
                                                                       "tp1-pp4-dp2-mb1-1f1b-none-layers2,3x2,2"]
    raw = {"tp": 1, "pp": 4, "micro_batch": 1, "schedule": "interleaved", "virtual_stages": 2, "recompute": "none",
           "sequence_parallel": False, "ep": 1, "distributed_optimizer": False, "fsdp": False}
    assert normalise(counted, 8, raw) == (None, "10 layers with the embedding / loss counted do not split over 8 "
                                                "virtual stages")


def test_memory_fraction_drops_the_plans_that_need_more_than_that_share(tmp_path):
    # options.memory_fraction: the same grid, fewer feasible plans; the space's predict says the same
    space = {**SPACE, "ranges": {"tp": [1, 2], "pp": [1, 2], "micro_batch": [4], "recompute": ["none"]}}
    runs = {}
    for frac in (1.0, 0.0005):  # 0.05 % of 80 GiB is 43 MB: no plan of this model fits
        out = tmp_path / f"out{frac}"
        out.mkdir()
        data = {**space, "options": {"memory_fraction": frac}}
        code, text = _cli("search", str(_write(tmp_path, data, f"s{frac}.yaml")), "--out", str(out), "--workers", "0")
        assert code == 0, text
        runs[frac] = json.loads((out / "results.json").read_text())["plans"]
    assert all(p["status"] == "ok" for p in runs[1.0])
    assert all(p["status"] == "infeasible" and "% usable" in p["reason"] for p in runs[0.0005])
    code, text = _cli("predict", "--workload", str(tmp_path / "s0.0005.yaml"), "--set", "tp=2", "--set", "pp=1",
                      "--set", "micro_batch=4", "--json")
    assert code == 0, text
    r = json.loads(text)
    assert r["status"] == "infeasible" and r["usable_memory_bytes"] == pytest.approx(0.0005 * r["device_memory_bytes"])
