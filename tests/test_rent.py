"""`space: rent`: schema errors, the Pareto front and the picks, infeasible reasons, grid and NSGA-II searches."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from tuner.cli import app
from tuner.search import default_storage, run_search
from tuner.search.registry import load_space
from tuner.search.rent import RentSearch, device_counts, parse_amount
from tuner.search.rent_answer import (
    best_per_accelerator,
    best_per_unit,
    dominates,
    launch_arguments,
    pareto_front,
    picks,
)

MODEL = {"name": "tiny-gpt", "layers": 4, "hidden": 256, "heads": 4, "seq": 128, "vocab": 1000}
SPACE = {
    "space": "rent",
    "model": {"transformer": MODEL},
    "training": {"tokens": "20M", "global_batch": 16},
    "accelerators": ["a100-80gb", "h100-sxm"],
    "devices": [1, 2, 4],
    "ranges": {"tp": [1, 2], "pp": [1, 2], "micro_batch": [1, 2], "recompute": ["none"]},
    "search": {"strategy": "grid"},
}


def _write(tmp_path: Path, data: dict, name: str = "space.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def _run(tmp_path: Path, data: dict, *extra: str, out: str = "out") -> tuple[int, str]:
    res = CliRunner().invoke(app, ["search", str(_write(tmp_path, data)), "--out", str(tmp_path / out), "--workers",
                                   "0", *extra])
    return res.exit_code, res.output


def _payload(tmp_path: Path, out: str = "out") -> dict:
    return json.loads((tmp_path / out / "results.json").read_text())


def _space(**changes) -> dict:
    data = json.loads(json.dumps(SPACE))
    data.update(changes)
    return data


# --------------------------------------------------------------------------- schema
@pytest.mark.parametrize(("change", "expect"), [
    ({"model": {"transformer": MODEL, "module": {"name": "gpt2-tiny"}}}, "exactly one of transformer, dlrm, module"),
    ({"training": {"tokens": "20M"}}, "training.global_batch"),
    ({"training": {"tokens": "lots", "global_batch": 16}}, "training.tokens"),
    ({"accelerators": ["a100-80gb", "tpu-v9"]}, "accelerators[1]"),
    ({"accelerators": ["a100-80gb", "h100"]}, "accelerators[1]: h100 is an asset pack"),
    ({"pricing": {"column": "spot", "prices": {"a100-80gb": {"spot": 2.0}}}}, "h100-sxm has no 'spot' price"),
    ({"pricing": {"prices": {"mi999": {"on_demand": 1.0}}}}, "pricing.prices: mi999"),
    ({"devices": {"min": 64, "max": 8}}, "max=8 is below min=64"),
    ({"deadline_days": 1, "deadline_hours": 3}, "not both"),
    ({"budget_usd": -5}, "budget_usd"),
    ({"ranges": {"tp": [3], "pp": [1]}}, "no valid candidate"),
    ({"model": {"transformer": {**MODEL, "fp8_linear": True}}}, "accelerators[0]: a100-80gb has no FP8 peak"),
    ({"model": {"transformer": {**MODEL, "dtype": "fp32"}}, "accelerators": ["a100-80gb", "gaudi2"]},
     "accelerators[1]: gaudi2 has no fp32 peak in the catalog"),
])
def test_bad_space_is_one_error_line_and_exit_2(tmp_path, change, expect):
    code, out = _run(tmp_path, _space(**change))
    assert code == 2, out
    errors = [x for x in out.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and expect in errors[0], out
    assert "Traceback" not in out and not (tmp_path / "out" / "results.json").exists()


def test_amounts_and_device_ranges(tmp_path):
    assert parse_amount("300B") == 3e11 and parse_amount("1.5T") == 1.5e12 and parse_amount(4e9) == 4e9
    assert parse_amount("2e3k") == 2e6
    for bad in ("", "3 apples", True, -1):
        with pytest.raises(ValueError):
            parse_amount(bad)
    spec = load_space(_write(tmp_path, _space(devices={"min": 8, "max": 1024})))
    assert device_counts(spec.devices) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert device_counts([16, 4]) == [4, 16]


# --------------------------------------------------------------------------- the answer, on records
def _rec(key: str, t: float, usd: float, status: str = "ok", acc: str = "a") -> dict:
    return {"key": key, "status": status, "time_to_train_h": t, "usd": usd, "accelerator": acc}


def test_front_is_feasible_non_dominated_and_complete():
    recs = [_rec("fast", 1, 100), _rec("mid", 2, 50), _rec("slow", 4, 10), _rec("dominated", 3, 60),
            _rec("tie", 2, 50), _rec("same-time-dearer", 1, 120), _rec("oom", 0.5, 1, "infeasible"),
            _rec("late", 0.1, 0.1, "infeasible"), {"key": "failed", "status": "failed"}]
    front = pareto_front(recs)
    assert [r["key"] for r in front] == ["fast", "mid", "slow"]
    ok = [r for r in recs if r["status"] == "ok"]
    for f in front:  # non-dominated by any feasible record
        assert not any(dominates(o, f) for o in ok)
    for o in ok:  # every feasible record off the front is dominated by (or ties) a front point
        if o not in front:
            assert any(dominates(f, o) or (f["time_to_train_h"], f["usd"]) == (o["time_to_train_h"], o["usd"])
                       for f in front)
    p = picks(recs)
    assert p["cheapest"]["key"] == "slow" and p["fastest"]["key"] == "fast"
    per = best_per_accelerator([*recs, _rec("b1", 9, 9, acc="b")], ["a", "b", "c"])
    assert per["b"]["cheapest"]["key"] == "b1" and per["c"] == {"cheapest": None, "fastest": None}
    assert picks([_rec("x", 1, 1, "infeasible")]) == {"cheapest": None, "fastest": None}
    unit = [{**_rec("u1", 2, 20), "devices": 8}, {**_rec("u2", 1, 10), "devices": 8},
            {**_rec("late", 9, 90, "infeasible"), "devices": 16, "reason": "deadline: 9 h > 5 h"},
            {"key": "oom", "status": "infeasible", "reason": "memory: 99 GiB", "accelerator": "b", "devices": 8}]
    assert best_per_unit(unit) == {"a": {"8": "u2", "16": "miss:deadline"}, "b": {"8": "miss:memory"}}


def test_launch_arguments():
    from predictor.sources.synth.transformer import TransformerSpec

    fields = {"tp": 4, "pp": 2, "dp": 8, "micro_batch": 2, "global_batch": 512, "schedule": "interleaved",
              "virtual_stages": 2, "recompute": "full", "sequence_parallel": True, "distributed_optimizer": True}
    rec = {"kind": "transformer", "devices": 64, "nodes": 8, "devices_per_node": 8, "fields": fields,
           "iterations": 1000}
    m = launch_arguments(rec, TransformerSpec(**{**MODEL, "layers": 40}))["megatron"]
    for flag in ("torchrun --nnodes 8 --nproc-per-node 8", "--tensor-model-parallel-size 4",
                 "--pipeline-model-parallel-size 2", "--micro-batch-size 2", "--global-batch-size 512",
                 "--num-layers-per-virtual-pipeline-stage 10", "--sequence-parallel", "--recompute-granularity full",
                 "--use-distributed-optimizer", "--train-iters 1000"):
        assert flag in m
    dlrm = {"kind": "dlrm", "devices": 4, "nodes": 1, "devices_per_node": 8,
            "fields": {"global_batch": 1024, "sharder": "size_greedy"}}
    out = launch_arguments(dlrm)
    assert out["torchrun"] == "torchrun --nnodes 1 --nproc-per-node 4" and "batch per rank 256" in out["dlrm"]


# --------------------------------------------------------------------------- searches
def test_grid_search_front_picks_and_outputs(tmp_path):
    code, out = _run(tmp_path, _space())
    assert code == 0, out
    p = _payload(tmp_path)
    recs = {r["key"]: r for r in p["records"]}
    ok = [r for r in p["records"] if r["status"] == "ok"]
    assert p["counts"]["evaluated"] == p["counts"]["candidates"] == len(recs)  # grid: every candidate
    assert ok and p["front"]
    front = [recs[k] for k in p["front"]]
    assert all(f["status"] == "ok" for f in front)
    assert not any(dominates(o, f) for f in front for o in ok)
    for r in ok:  # the work: ceil(tokens / (batch x seq)) iterations, cost = hours x devices x price
        assert r["iterations"] == math.ceil(20e6 / MODEL["seq"] / 16)
        assert r["time_to_train_h"] == pytest.approx(r["iterations"] * r["iteration_s"] / 3600)
        assert r["usd"] == pytest.approx(r["time_to_train_h"] * r["devices"] * r["usd_per_device_hour"])
        assert r["device_hours"] == pytest.approx(r["time_to_train_h"] * r["devices"])
        assert r["memory_bytes_per_device"] <= r["device_memory_bytes"]
    cheap, fast = p["picks"]["cheapest"], p["picks"]["fastest"]
    assert cheap["usd"] == min(r["usd"] for r in ok) and fast["time_to_train_h"] == min(r["time_to_train_h"] for r in ok)
    assert "megatron" in cheap["launch"] and (tmp_path / "out" / cheap["trace"]).exists()
    assert all((tmp_path / "out" / f).exists() for f in cheap["launch_files"])
    assert set(p["per_accelerator"]) == {"a100-80gb", "h100-sxm"}
    for name in ("report.html", "results.csv", "figures/pareto.png", "study.db"):
        assert (tmp_path / "out" / name).exists()
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<svg" in html and "<script" not in html and "Pareto front" in html and cheap["trace"] in html
    assert "Best plan per accelerator and device count" in html
    for acc, units in p["per_unit"].items():
        for dev, key in units.items():
            mine = [r for r in ok if r["accelerator"] == acc and r["devices"] == int(dev)]
            assert key == min(mine, key=lambda r: r["time_to_train_h"])["key"] if mine else key.startswith("miss:")
    assert "cheapest:" in out
    code, out = _run(tmp_path, _space(), "--resume")
    assert code == 0 and f"0 new, {len(recs)} from the study" in out, out


def test_price_column_from_the_space(tmp_path):
    prices = {"a100-80gb": {"spot": 1.5}, "h100-sxm": {"spot": 3.0, "on_demand": 99.0}}
    code, out = _run(tmp_path, _space(devices=[2], pricing={"column": "spot", "prices": prices}))
    assert code == 0, out
    p = _payload(tmp_path)
    assert p["price_column"] == "spot"
    for r in p["records"]:
        if r["status"] == "ok":
            assert r["usd_per_device_hour"] == prices[r["accelerator"]]["spot"]
            assert r["usd"] == pytest.approx(r["time_to_train_h"] * 2 * prices[r["accelerator"]]["spot"])
    assert {a["key"]: a["price_source"] for a in p["accelerators"]}["h100-sxm"] == "pricing.prices.h100-sxm.spot"


def test_several_price_columns_are_offers_of_one_search(tmp_path):
    prices = {"a100-80gb": {"spot": 1.5}, "h100-sxm": {"spot": 3.0}}
    code, out = _run(tmp_path, _space(devices=[2], pricing={"column": ["on_demand", "spot"], "prices": prices}))
    assert code == 0, out
    p = _payload(tmp_path)
    assert [a["key"] for a in p["accelerators"]] == ["a100-80gb@on_demand", "a100-80gb@spot", "h100-sxm@on_demand",
                                                     "h100-sxm@spot"]
    by = {}
    for r in p["records"]:
        by.setdefault(r["accelerator"].split("@")[0], {})[(r["plan"], r["price_column"])] = r
    for acc, recs in by.items():  # the same plan at two prices: same time, cost in the ratio of the prices
        for (plan, col), r in recs.items():
            if col == "spot" and r["status"] == "ok":
                od = recs[(plan, "on_demand")]
                assert r["time_to_train_h"] == pytest.approx(od["time_to_train_h"])
                assert r["usd"] / od["usd"] == pytest.approx(prices[acc]["spot"] / od["usd_per_device_hour"])
    assert p["picks"]["cheapest"]["accelerator"].endswith("@spot") and p["picks"]["cheapest"]["platform"] in by
    code, out = _run(tmp_path, _space(pricing={"column": ["spot", "spot"], "prices": prices}), out="bad")
    assert code == 2 and "column lists a name twice" in out


def test_deadline_budget_and_memory_infeasible_with_reasons(tmp_path):
    code, out = _run(tmp_path, _space(), out="free")
    assert code == 0, out
    free = [r for r in _payload(tmp_path, "free")["records"] if r["status"] == "ok"]
    times = sorted(r["time_to_train_h"] for r in free)
    costs = sorted(r["usd"] for r in free)
    deadline, budget = times[len(times) // 2], costs[-len(costs) // 3]
    # 10 GB devices: the unsplit plans at micro-batch 2 no longer fit
    cat = tmp_path / "cat.yaml"
    cat.write_text("h100-sxm:\n  memory:\n    - {name: l2, capacity_bytes: 52428800, bandwidth_bytes_per_s: 1.2e+13, "
                   "on_chip: true}\n    - {name: hbm, capacity_bytes: 4.0e+8, bandwidth_bytes_per_s: 3.35e+12, "
                   "on_chip: false}\n")
    code, out = _run(tmp_path, _space(deadline_hours=deadline, budget_usd=budget, catalog=str(cat)), out="lim")
    assert code == 0, out
    p = _payload(tmp_path, "lim")
    recs = p["records"]
    reasons = [r["reason"] for r in recs if r["status"] == "infeasible"]
    for kind in ("memory: ", "deadline: ", "budget: "):
        assert any(kind in x for x in reasons), kind
    for r in recs:
        if r["status"] == "ok":
            assert r["time_to_train_h"] <= deadline and r["usd"] <= budget
        elif r["reason"].startswith("memory"):
            assert r["memory_bytes_per_device"] > 4e8 and "GiB" in r["reason"]
    front = set(p["front"])
    assert all(r["status"] == "ok" for r in recs if r["key"] in front)
    ok = [r for r in recs if r["status"] == "ok"]
    assert p["picks"]["cheapest"]["key"] == min(ok, key=lambda r: (r["usd"], r["time_to_train_h"]))["key"]
    assert p["picks"]["fastest"]["key"] == min(ok, key=lambda r: (r["time_to_train_h"], r["usd"]))["key"]
    # the study records infeasible candidates as pruned trials with the reason
    study = optuna.load_study(study_name=p["study"]["name"], storage=f"sqlite:///{tmp_path / 'lim' / 'study.db'}")
    pruned = study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
    assert len(pruned) == sum(r["status"] == "infeasible" for r in recs)
    assert all(t.user_attrs["error"] for t in pruned)


@pytest.mark.parametrize("per_accelerator", [False, True])
def test_nsga2_search_evaluates_distinct_candidates_and_resumes(tmp_path, per_accelerator):
    data = _space(devices=[1, 2, 4, 8], deadline_hours=1e6,
                  ranges={"tp": [1, 2, 4], "pp": [1, 2, 4], "micro_batch": [1, 2, 4], "recompute": ["none", "full"]},
                  search={"strategy": "nsga2", "trials": 14, "population": 6, "seed": 1, "polish": 0,
                          "per_accelerator": per_accelerator})
    spec = load_space(_write(tmp_path, data, "n.yaml"))
    assert RentSearch(spec).strategy == "nsga2"
    code, out = _run(tmp_path, data)
    assert code == 0, out
    p = _payload(tmp_path)
    assert p["strategy"] == "nsga2" and p["counts"]["evaluated"] == 14 < p["counts"]["candidates"]
    assert len({r["key"] for r in p["records"]}) == 14
    if per_accelerator:  # equal shares
        assert sorted(sum(r["accelerator"] == a for r in p["records"]) for a in ("a100-80gb", "h100-sxm")) == [7, 7]
    ok = [r for r in p["records"] if r["status"] == "ok"]
    front = [r for r in p["records"] if r["key"] in set(p["front"])]
    assert front and not any(dominates(o, f) for f in front for o in ok)
    more = load_space(_write(tmp_path, {**data, "search": {**data["search"], "trials": 16}}, "more.yaml"))
    res = run_search(RentSearch(more), storage=default_storage(tmp_path / "out"), workers=0, resume=True)
    assert (res.evaluated, res.reused) == (2, 14)


def test_polish_leaves_each_accelerator_at_a_local_optimum(tmp_path):
    data = _space(devices=[1, 2, 4, 8],
                  ranges={"tp": [1, 2, 4], "pp": [1, 2, 4], "micro_batch": [1, 2, 4], "recompute": ["none", "full"]},
                  search={"strategy": "nsga2", "trials": 10, "population": 6, "seed": 2, "polish": 200})
    code, out = _run(tmp_path, data)
    assert code == 0, out
    p = _payload(tmp_path)
    assert 10 < p["counts"]["evaluated"] < p["counts"]["candidates"]
    search = RentSearch(load_space(_write(tmp_path, data, "again.yaml")))
    keys = {r["key"] for r in p["records"]}
    dims = search.distributions()
    for acc, best in p["per_accelerator"].items():
        for rec in best.values():
            raw = {"accelerator": acc, "devices": rec["devices"],
                   **{k: v for k, v in _raw_of(rec).items() if k in dims}}
            for name, d in dims.items():
                if name == "accelerator":
                    continue
                i = d.choices.index(raw[name])
                for j in (i - 1, i + 1):
                    if 0 <= j < len(d.choices):
                        cand = search.resolve({**raw, name: d.choices[j]})
                        assert cand is None or cand.key in keys, (rec["key"], name)


def _raw_of(rec: dict) -> dict:
    """The range values of a transformer record's plan (its trial parameters less accelerator and devices)."""
    f = rec["fields"]
    return {"tp": f["tp"], "pp": f["pp"], "micro_batch": f["micro_batch"], "schedule": f["schedule"],
            "virtual_stages": 2, "recompute": f["recompute"], "sequence_parallel": f["sequence_parallel"],
            "ep": f["ep"], "distributed_optimizer": f["distributed_optimizer"], "cp": f.get("cp", 1),
            "fsdp": f.get("fsdp", False)}


def test_polish_climbs_from_plans_that_fit_but_miss_the_budget():
    """The best plan within the budget can be one step from a plan just over it, and further from every
    feasible record: the polish proposes the neighbours of both."""
    from optuna.distributions import CategoricalDistribution

    from tuner.search.core import Candidate, Outcome
    from tuner.search.rent_nsga import PolishProposer

    class Done:  # an inner proposer with nothing left
        target = 0

        def propose(self, done):
            return []

    dists = {"accelerator": CategoricalDistribution(["x"]), "devices": CategoricalDistribution([8, 16, 32, 64])}
    resolve = lambda p: Candidate(key=f"{p['accelerator']}/{p['devices']}", params=dict(p))  # noqa: E731

    def outcome(devices: int, status: str, hours: float, usd: float, budget: float) -> Outcome:
        rec = {"status": status, "time_to_train_h": hours, "usd": usd,
               "constraints": {"memory": -0.5, "deadline": -0.5, "budget": budget}}
        return Outcome(f"x/{devices}", {"accelerator": "x", "devices": devices}, rec)

    done = {"x/8": [outcome(8, "ok", 100.0, 10.0, -0.9)], "x/64": [outcome(64, "infeasible", 10.0, 120.0, 0.2)]}
    keys = {c.key for c in PolishProposer(Done(), dists, resolve, budget=10).propose(done)}
    assert keys == {"x/16", "x/32"}  # 16 from the feasible record, 32 from the one over the budget
    done["x/64"][0].record["constraints"]["memory"] = 0.1  # out of memory too: no longer climbed from
    assert {c.key for c in PolishProposer(Done(), dists, resolve, budget=10).propose(done)} == {"x/16"}


def test_memory_fraction_of_a_transformer_rent_space_is_a_memory_constraint(tmp_path):
    # options.memory_fraction: plans over that share of the device are infeasible, and the constraint
    # NSGA-II reads is measured against the usable share
    code, out = _run(tmp_path, _space(options={"memory_fraction": 0.0002}), out="frac")
    assert code == 0, out
    recs = _payload(tmp_path, "frac")["records"]
    assert recs and all(r["status"] == "infeasible" and r["reason"].startswith("memory") for r in recs)
    for r in recs:
        assert r["constraints"]["memory"] == pytest.approx(r["memory_bytes_per_device"] / r["usable_memory_bytes"] - 1)
        assert r["constraints"]["memory"] > 0
