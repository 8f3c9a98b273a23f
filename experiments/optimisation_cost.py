"""PredTOP Fig. 10 on this CPU: filling Alpa's stage cost tensor by profiling vs by prediction.

Setting: a small GPT (:data:`MODEL`, 8 layers) trained with :data:`N_MICRO` micro-batches per
iteration on a virtual 1 x 4 device mesh. Alpa's submesh shapes (1,1), (1,2), (1,4) and their
logical meshes (``tuner.alpa.mesh_configs``: dp x tp) give ``compute_cost[L, L, S, C]`` with
36 layer ranges x 6 (submesh, config) entries = 216 stages. There is one CPU and no second
device, so a stage on a submesh is *emulated*: the measured latency is one device's share —
TP shapes divided by ``tp``, ``micro_batch / dp`` sequences per device — with no intra-stage
communication (all-reduces) and no inter-stage transfers, the same for both arms.

Arms (each arm's cost is wall-clock seconds on this machine, one torch thread):

1. **full profiling** (vanilla Alpa without its heuristics): measure every entry
   (build the stage, 1 warm-up + 3 timed forward+backward steps, median thread CPU time).
2. **PredTOP**: measure a random ``--sample`` fraction of the entries (their measuring cost is
   the cost those same entries took in arm 1), trace the graphs of all entries, train the
   stage model on the measured ones, predict the rest. GCN and GAT variants are run too, each
   network with PredTOP's one target scale and with our per-graph work anchor
   (``TrainConfig(anchor="work")``: the network learns the ratio of the latency to a FLOP /
   byte / operator-count estimate fitted on the sample); ``--anchors`` picks.

Each filled tensor goes through our Alpa stage-construction DP (``tuner.alpa``); the plan each
arm picks is then **run for real**: its stages are built, real activations and gradients flow
stage to stage for several micro-batches (re-sharded along the batch when neighbouring stages
have different ``dp``), every stage's forward and backward are timed separately (thread CPU
time), and the iteration time is the 1F1B schedule of ``predictor.stage.pipeline`` played with
those measured times (one core cannot run the stages concurrently, so the parallel timeline
is reconstructed from measured per-stage times). Plans are measured in interleaved rounds.

Reference (PredTOP §VIII-B, Fig. 10, GPT-3 1.3B on A40/A5500 clusters): optimisation time
46.6 % lower than Alpa with partial profiling; plan iteration latency 2.1 % higher (GCN 21.3 %,
GAT 4.4 % higher).

Run (timing-sensitive):  flock /tmp/tuner-measure.lock python experiments/optimisation_cost.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.files import atomic_write_text  # noqa: E402
from predictor.metrics import mean_abs_pct_error  # noqa: E402
from predictor.stage import (  # noqa: E402
    GPTSpec,
    StageLatencyModel,
    StageSpec,
    TrainConfig,
    load_dataset,
    load_graphs,
    measure_stage,
    one_f_one_b,
    pipeline_latency,
    stage_graph,
)
from predictor.stage.gpt import build_stage_module, stage_inputs  # noqa: E402
from predictor.stage.model import DEFAULT_NETWORKS  # noqa: E402
from tuner.alpa import MAX_SUCC_CAP, Submesh, mesh_configs, stage_construction_dp  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
MODEL = GPTSpec(hidden=384, heads=8, seq=128, vocab=8192, n_layers=8, micro_batch=4)
N_MICRO = 32
N_DEVICES = 4
SUBMESHES = [Submesh(1, 1), Submesh(1, 2), Submesh(1, 4)]
NETWORKS = dict(DEFAULT_NETWORKS)


@dataclass(frozen=True)
class Entry:
    i: int
    j: int
    s: int
    c: int
    spec: StageSpec


def entries() -> tuple[list[Entry], list[list]]:
    configs = [mesh_configs(sm) for sm in SUBMESHES]
    out = []
    for s, cfgs in enumerate(configs):
        for c, cfg in enumerate(cfgs):
            for i in range(MODEL.n_layers):
                for j in range(i, MODEL.n_layers):
                    out.append(Entry(i, j, s, c, StageSpec(MODEL, i, j, tp=cfg.tp, dp=cfg.dp)))
    return out, configs


def tensor(ents: list[Entry], values: np.ndarray, n_configs: int) -> np.ndarray:
    L = MODEL.n_layers
    cost = np.full((L, L, len(SUBMESHES), n_configs), np.inf)
    for e, v in zip(ents, values, strict=True):
        cost[e.i, e.j, e.s, e.c] = v
    return cost


def plan_of(cost: np.ndarray, configs: list[list]) -> list[dict]:
    succ = np.where(np.isfinite(cost), MAX_SUCC_CAP, -1).astype(np.int64)
    sizes = [sm.n_devices for sm in SUBMESHES]
    plan = stage_construction_dp(cost, succ, sizes, N_DEVICES, N_MICRO)
    if plan is None:
        raise RuntimeError("the DP found no plan using all devices")
    return [
        {
            "first": st.first,
            "last": st.last,
            "submesh": list(
                (SUBMESHES[st.submesh_index].hosts, SUBMESHES[st.submesh_index].devices_per_host)
            ),
            "dp": configs[st.submesh_index][st.config_index].dp,
            "tp": configs[st.submesh_index][st.config_index].tp,
            "latency_s": st.latency_s,
        }
        for st in plan.stages
    ]


def _reshard(x: torch.Tensor, batch: int) -> torch.Tensor:
    """The next stage's per-device micro-batch from this stage's (batch axis split/tiled)."""
    if x.shape[0] >= batch:
        return x[:batch]
    reps = math.ceil(batch / x.shape[0])
    return x.repeat(reps, *([1] * (x.dim() - 1)))[:batch]


class PlanRunner:
    """Builds a plan's stages once; :meth:`run` pushes micro-batches through them, timing F and B per stage."""

    def __init__(self, plan: list[dict]) -> None:
        self.specs = [StageSpec(MODEL, st["first"], st["last"], tp=st["tp"], dp=st["dp"]) for st in plan]
        torch.manual_seed(0)
        self.modules = [build_stage_module(sp) for sp in self.specs]
        self.fwd: list[list[float]] = [[] for _ in self.specs]
        self.bwd: list[list[float]] = [[] for _ in self.specs]

    def run(self, n: int, record: bool = True) -> None:
        first, last = self.specs[0], self.specs[-1]
        for m in range(n):
            tokens = stage_inputs(first, seed=m)["x"]
            targets = stage_inputs(last, seed=m)["targets"]
            x = tokens
            saved = []
            for k, (sp, mod) in enumerate(zip(self.specs, self.modules, strict=True)):
                if k > 0:
                    x = _reshard(x.detach(), sp.batch).requires_grad_(True)
                t0 = time.thread_time()
                out = mod(x, targets if sp.has_head else None)
                dt_f = time.thread_time() - t0
                saved.append((x, out))
                if record:
                    self.fwd[k].append(dt_f)
                x = out
            grad = None
            for k in reversed(range(len(self.specs))):
                x_in, out = saved[k]
                g = None if grad is None else _reshard(grad, out.shape[0])
                t0 = time.thread_time()
                out.backward(g)
                dt_b = time.thread_time() - t0
                if record:
                    self.bwd[k].append(dt_b)
                grad = x_in.grad if k > 0 else None
            for mod in self.modules:
                mod.zero_grad(set_to_none=True)

    def iteration_s(self) -> tuple[float, list[float], list[float]]:
        f = [statistics.median(v) for v in self.fwd]
        b = [statistics.median(v) for v in self.bwd]
        return one_f_one_b(f, b, N_MICRO).iteration_s, f, b


def _plan_key(plan: list[dict]) -> str:
    return json.dumps([(s["first"], s["last"], s["dp"], s["tp"]) for s in plan])


def _eq4_on(plan: list[dict], ents: list[Entry], values: np.ndarray, configs: list[list]) -> float:
    """PredTOP eq. 4 for ``plan`` with its stages' latencies looked up in ``values``."""
    lookup = {
        (e.i, e.j, configs[e.s][e.c].dp, configs[e.s][e.c].tp): v for e, v in zip(ents, values, strict=True)
    }
    return pipeline_latency([lookup[(s["first"], s["last"], s["dp"], s["tp"])] for s in plan], N_MICRO)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=float, default=0.25, help="fraction of the entries PredTOP measures")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one random sample per seed")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved measurement rounds per plan")
    ap.add_argument("--micro", type=int, default=3, help="timed micro-batches per plan and round")
    ap.add_argument("--max-steps", type=int, default=1500)
    ap.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    ap.add_argument("--anchors", nargs="+", default=["geomean", "work"], choices=["geomean", "work"],
                    help="target scale of the networks: PredTOP's one geomean and/or our per-graph work anchor")
    ap.add_argument(
        "--with-dataset",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also train a DAG Transformer on the sample plus the committed CPU stage dataset",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "optimisation_cost")
    ap.add_argument("--tiny", action="store_true", help="smoke test: a 4-layer toy GPT, a few training steps")
    args = ap.parse_args(argv)
    if args.tiny:
        global MODEL
        MODEL = GPTSpec(hidden=32, heads=4, seq=16, vocab=256, n_layers=4, micro_batch=4)
        args.max_steps = 5
    torch.set_num_threads(1)
    ents, configs = entries()
    n_cfg = max(len(c) for c in configs)

    # -- arm 1: profile every entry (random order) ----------------------------------------------
    measured = np.zeros(len(ents))
    cost_s = np.zeros(len(ents))
    t0 = time.perf_counter()
    for k in np.random.default_rng(12345).permutation(len(ents)):
        a = time.perf_counter()
        measured[k] = measure_stage(ents[k].spec, warmup=1, repeats=3, seed=int(k)).median_s
        cost_s[k] = time.perf_counter() - a
    full_profile_s = time.perf_counter() - t0
    print(f"full profiling: {len(ents)} entries in {full_profile_s:.1f} s", file=sys.stderr, flush=True)
    plans = {"full_profiling": plan_of(tensor(ents, measured, n_cfg), configs)}
    arms: dict[str, dict] = {
        "full_profiling": {
            "network": None,
            "seed": None,
            "seconds": round(full_profile_s, 1),
            "profiled_entries": len(ents),
        }
    }

    # -- arm 2: PredTOP — profile a sample, train, predict the rest ------------------------------
    t0 = time.perf_counter()
    graphs = [stage_graph(e.spec) for e in ents]
    graph_s = time.perf_counter() - t0
    print(f"traced {len(graphs)} graphs in {graph_s:.1f} s", file=sys.stderr, flush=True)
    variants = [(kind if anchor == "geomean" else f"{kind}+work_anchor", kind, False, anchor)
                for anchor in args.anchors for kind in args.networks]
    if args.with_dataset:
        variants.append(("dag_transformer+cpu_dataset", "dag_transformer", True, "geomean"))
        ds_samples, _ = load_dataset()
        ds_graphs = load_graphs([s_.spec for s_ in ds_samples])  # traced once, offline (not charged)
        ds_y = np.array([s_.latency_s for s_ in ds_samples])
    n_s = int(round(args.sample * len(ents)))
    for seed in args.seeds:
        rng = np.random.default_rng(seed)
        sample = rng.choice(len(ents), size=n_s, replace=False)
        rest = np.setdiff1d(np.arange(len(ents)), sample)
        sample_profile_s = float(cost_s[sample].sum())
        for label, kind, extra, anchor in variants:
            model = StageLatencyModel(
                kind, TrainConfig(max_steps=args.max_steps, seed=seed, anchor=anchor), **NETWORKS[kind]
            )
            train_graphs = [graphs[i] for i in sample]
            train_y = measured[sample]
            if extra:
                train_graphs = train_graphs + list(ds_graphs)
                train_y = np.concatenate([train_y, ds_y])
            t0 = time.perf_counter()
            rep = model.fit(train_graphs, train_y)
            train_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            pred = np.asarray(model.predict([graphs[i] for i in rest]))
            infer_s = time.perf_counter() - t0
            values = measured.copy()
            values[rest] = pred
            name = f"predtop_{label}@seed{seed}"
            plans[name] = plan_of(tensor(ents, values, n_cfg), configs)
            total = sample_profile_s + graph_s + train_s + infer_s
            arms[name] = {
                "network": label,
                "seed": seed,
                "seconds": round(total, 1),
                "profiled_entries": n_s,
                "profile_s": round(sample_profile_s, 1),
                "graph_build_s": round(graph_s, 1),
                "train_s": round(train_s, 1),
                "predict_s": round(infer_s, 2),
                "epochs_run": rep.epochs_run,
                "extra_training_data": "the 495-stage CPU dataset (other GPT sizes; collected once, not charged)"
                if extra
                else None,
                "mre_pct_on_predicted_entries": round(mean_abs_pct_error(pred, measured[rest]), 2),
                "predicted_eq4_s": _eq4_on(plans[name], ents, values, configs),
            }
            print(
                f"{name}: {total:.1f} s, MRE on predicted entries {arms[name]['mre_pct_on_predicted_entries']} %, "
                f"plan {_plan_str(plans[name])}",
                file=sys.stderr,
                flush=True,
            )

    # -- run every distinct plan for real, interleaved ------------------------------------------
    keyed: dict[str, PlanRunner] = {}
    for plan in plans.values():
        key = _plan_key(plan)
        if key not in keyed:
            keyed[key] = PlanRunner(plan)
            keyed[key].run(1, record=False)  # warm-up
    print(f"running {len(keyed)} distinct plans", file=sys.stderr, flush=True)
    for _ in range(args.rounds):
        for runner in keyed.values():
            runner.run(args.micro)
    base_key = _plan_key(plans["full_profiling"])
    base_t = keyed[base_key].iteration_s()[0]
    base_s = arms["full_profiling"]["seconds"]
    base_eq4 = _eq4_on(plans["full_profiling"], ents, measured, configs)
    for name, a in arms.items():
        it, f, b = keyed[_plan_key(plans[name])].iteration_s()
        eq4 = _eq4_on(plans[name], ents, measured, configs)
        a.update(
            plan=plans[name],
            same_plan_as_full_profiling=_plan_key(plans[name]) == base_key,
            time_saved_pct=round(100 * (1 - a["seconds"] / base_s), 1),
            measured_iteration_s=it,
            plan_degradation_pct=round(100 * (it / base_t - 1), 2),
            profiled_eq4_s=eq4,
            profiled_eq4_degradation_pct=round(100 * (eq4 / base_eq4 - 1), 2),
            measured_stage_fwd_s=f,
            measured_stage_bwd_s=b,
        )
    summary = {}
    for label, *_ in variants:
        rows = [a for a in arms.values() if a["network"] == label]
        summary[label] = {
            "seeds": len(rows),
            "time_saved_pct_mean": round(float(np.mean([r["time_saved_pct"] for r in rows])), 1),
            "plan_degradation_pct_mean": round(float(np.mean([r["plan_degradation_pct"] for r in rows])), 2),
            "plan_degradation_pct_max": round(float(np.max([r["plan_degradation_pct"] for r in rows])), 2),
            "profiled_eq4_degradation_pct_mean": round(
                float(np.mean([r["profiled_eq4_degradation_pct"] for r in rows])), 2
            ),
            "same_plan": sum(r["same_plan_as_full_profiling"] for r in rows),
            "mre_pct_mean": round(float(np.mean([r["mre_pct_on_predicted_entries"] for r in rows])), 2),
        }
    doc = {
        "date": dt.date.today().isoformat(),
        "machine": "2-core VM (AMD EPYC) shared with other jobs; torch threads 1; run under flock /tmp/tuner-measure.lock",
        "model": MODEL.to_dict(),
        "n_micro": N_MICRO,
        "n_devices": N_DEVICES,
        "submeshes": [[s.hosts, s.devices_per_host] for s in SUBMESHES],
        "configs": [[[c.dp, c.tp] for c in cs] for cs in configs],
        "entries": len(ents),
        "sample_fraction": args.sample,
        "seeds": args.seeds,
        "summary": summary,
        "arms": arms,
        "paper": {
            "time_saved_pct_gpt3": 46.6,
            "plan_degradation_pct_gpt3": {"dag_transformer": 2.1, "gcn": 21.3, "gat": 4.4},
        },
    }
    atomic_write_text(args.out.with_suffix(".md"), markdown(doc))
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out.with_suffix('.md')} and .json")
    return 0


def _plan_str(plan: list[dict]) -> str:
    return "; ".join(
        f"L{s['first']}-{s['last']} on {s['submesh'][1]} dev (dp{s['dp']} tp{s['tp']})" for s in plan
    )


def markdown(doc: dict) -> str:
    arms = doc["arms"]
    base = arms["full_profiling"]
    m = doc["model"]
    lines = [
        "# Optimisation cost: profile every stage vs PredTOP (Fig. 10) on this CPU",
        "",
        f"Date {doc['date']}; {doc['machine']}.",
        "Reproduce: `flock /tmp/tuner-measure.lock python experiments/optimisation_cost.py`.",
        "",
        f"GPT hidden {m['hidden']}, heads {m['heads']}, seq {m['seq']}, vocab {m['vocab']}, {m['n_layers']} layers, "
        f"micro-batch {m['micro_batch']}, {doc['n_micro']} micro-batches per iteration; virtual 1 x {doc['n_devices']} mesh, "
        f"submeshes {doc['submeshes']}, configs (dp, tp) per submesh {doc['configs']}: {doc['entries']} entries of "
        "Alpa's compute_cost. **Emulation**: one CPU core, so a stage on a submesh is measured as one device's share "
        "(TP-divided shapes, micro-batch / dp sequences) with no communication (no TP/DP all-reduces, no stage-to-stage "
        "transfers). Plans come from our Alpa stage-construction DP (`tuner.alpa.stage_construction_dp`, all 4 devices "
        "used, memory unconstrained). Each picked plan is then run for real: its stages are built, activations and "
        "gradients flow stage to stage (re-sharded along the batch where dp changes), forward and backward of every "
        "stage are timed (thread CPU time, median over rounds interleaved between plans), and the iteration time is "
        "the 1F1B schedule (`predictor.stage.pipeline.one_f_one_b`) played with those times, since one core cannot "
        "run the stages at the same time.",
        "",
        f"PredTOP arms: a random {doc['sample_fraction']:.0%} of the entries is measured (its cost is what those entries "
        "took in the full-profiling arm), all entries are traced, the stage model is trained on the measured ones and "
        "predicts the others; one sample per seed. Optimisation time = measuring the sample + tracing + training + "
        "predicting (the DP itself is the same for every arm and not counted).",
        "",
        "## Summary over seeds",
        "",
        "| stage model | seeds | time saved (mean) | MRE of predicted entries (mean) | plan = full-profiling plan | "
        "measured iteration vs full profiling: mean / worst | eq. 4 on the profiled tensor vs full profiling (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, sm in doc["summary"].items():
        lines.append(
            f"| {label} | {sm['seeds']} | {sm['time_saved_pct_mean']:.1f} % | {sm['mre_pct_mean']:.2f} % | "
            f"{sm['same_plan']}/{sm['seeds']} | {sm['plan_degradation_pct_mean']:+.2f} % / {sm['plan_degradation_pct_max']:+.2f} % | "
            f"{sm['profiled_eq4_degradation_pct_mean']:+.2f} % |"
        )
    lines += [
        "",
        "## Every arm",
        "",
        "| arm | optimisation time (s) | time saved | MRE of predicted entries | plan | measured iteration (s) | vs full profiling |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, a in arms.items():
        mre = a.get("mre_pct_on_predicted_entries")
        same = " (same)" if name != "full_profiling" and a["same_plan_as_full_profiling"] else ""
        lines.append(
            f"| {name} | {a['seconds']:.1f} | {a['time_saved_pct']:.1f} % | {'-' if mre is None else f'{mre:.2f} %'} | "
            f"{_plan_str(a['plan'])}{same} | {a['measured_iteration_s']:.3f} | {a['plan_degradation_pct']:+.2f} % |"
        )
    first = next(a for n, a in arms.items() if n != "full_profiling")
    lines += [
        "",
        f"Full profiling took {base['seconds']:.1f} s. A PredTOP arm costs: measuring the sample {first['profile_s']} s "
        f"+ tracing all graphs {first['graph_build_s']} s + training ~{first['train_s']} s + predicting "
        f"{first['predict_s']} s. A plan marked (same) is the full-profiling plan, run once, so its difference is 0.",
        "",
        f"Paper (PredTOP Fig. 10, GPT-3): optimisation time −{doc['paper']['time_saved_pct_gpt3']} %, plan iteration "
        f"+{doc['paper']['plan_degradation_pct_gpt3']['dag_transformer']} % "
        f"(GCN +{doc['paper']['plan_degradation_pct_gpt3']['gcn']} %, GAT +{doc['paper']['plan_degradation_pct_gpt3']['gat']} %).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
