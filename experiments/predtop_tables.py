"""PredTOP Tables V-VI re-done on this CPU: stage-latency MRE of DAG Transformer vs GCN vs GAT.

Ground truth: ``predictor/stage/data/cpu_stage_latencies.json`` — forward + backward latencies
of one micro-batch of every contiguous layer range of five small GPT models at TP 1/2/4
(emulated by shapes), measured on this machine (``experiments/collect_stage_latencies.py``,
thread CPU time, median of repeats). Nobody's model produced these numbers.

Protocol (PredTOP §VIII-A): for each seed, the samples are shuffled; 10 % are the validation
set (early stopping), a training fraction of 10 %, 20 %, ..., 80 % is taken from the rest, and
every remaining sample is a held-out test sample. The score is the mean relative error (eq. 5)
on the test samples, overall and per TP degree (our counterpart of the paper's
mesh/configuration columns; one model serves all three because the graph carries the TP
shapes). Mean and standard deviation over seeds are reported.

Reference (PredTOP Table V(a), GPT-3 on 1 A40, "Mesh 1 / Configuration 1", MRE %, for the
fractions 80..10 %): DAG Transformer 2.33 2.89 3.64 3.08 3.47 3.01 4.28 3.60; GCN 1.88 4.63
5.81 2.57 2.57 13.38 10.37 29.99; GAT 4.56 7.44 66.74 4.68 3.93 8.95 5.05 34.31. The paper
states DAG-Transformer MRE < 3.7 % from 30 % of the samples on.

Run:  python experiments/predtop_tables.py            (writes experiments/results/predtop_tables.{md,json})
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.metrics import mean_abs_pct_error  # noqa: E402
from predictor.stage import StageLatencyModel, TrainConfig, load_dataset, load_graphs  # noqa: E402
from predictor.stage.dataset import DEFAULT_DATASET  # noqa: E402
from tuner.report import atomic_write_text  # noqa: E402

RESULTS = ROOT / "experiments" / "results"

#: PredTOP Table V(a), GPT-3, Platform 1 (A40), Mesh 1 / Configuration 1 — MRE % by fraction
PAPER_TABLE_VA = {
    "fractions": [0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1],
    "dag_transformer": [2.33, 2.89, 3.64, 3.08, 3.47, 3.01, 4.28, 3.60],
    "gcn": [1.88, 4.63, 5.81, 2.57, 2.57, 13.38, 10.37, 29.99],
    "gat": [4.56, 7.44, 66.74, 4.68, 3.93, 8.95, 5.05, 34.31],
}

#: network settings used here (PredTOP's are DAG-T 4x64, GCN 6x256, GAT 6x32; narrowed where the
#: CPU budget of the whole table, ~10 min, needs it — see the results file)
MODELS: dict[str, dict] = {
    "dag_transformer": {"dim": 64, "layers": 4, "heads": 4},
    "gcn": {"dim": 64, "layers": 6},
    "gat": {"dim": 32, "layers": 6, "heads": 4},
}
LABELS = {"dag_transformer": "DAG Transformer", "gcn": "GCN", "gat": "GAT"}


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    samples, header = load_dataset(args.dataset)
    specs = [s.spec for s in samples]
    y = np.array([s.latency_s for s in samples])
    tps = np.array([s.tp for s in specs])
    t0 = time.perf_counter()
    graphs = load_graphs(specs)
    graph_s = time.perf_counter() - t0
    fractions = [round(f, 2) for f in args.fractions]
    cfg = {
        "epochs": args.epochs,
        "patience": args.patience,
        "max_steps": args.max_steps,
        "lr": args.lr,
        "batch_size": 32,
    }
    results: dict = {
        kind: {str(f): {"overall": [], **{f"tp{t}": [] for t in sorted(set(tps))}} for f in fractions}
        for kind in args.models
    }
    train_seconds: dict = {kind: 0.0 for kind in args.models}
    n = len(samples)
    n_val = int(round(0.1 * n))
    for seed in range(args.seeds):
        perm = np.random.default_rng(1000 + seed).permutation(n)
        val = perm[:n_val]
        rest = perm[n_val:]
        for f in fractions:
            n_tr = int(round(f * n))
            tr, te = rest[:n_tr], rest[n_tr:]
            for kind in args.models:
                model = StageLatencyModel(kind, TrainConfig(seed=seed, **cfg), **MODELS[kind])
                rep = model.fit([graphs[i] for i in tr], y[tr], [graphs[i] for i in val], y[val])
                train_seconds[kind] += rep.train_seconds
                pred = np.asarray(model.predict([graphs[i] for i in te]))
                r = results[kind][str(f)]
                r["overall"].append(mean_abs_pct_error(pred, y[te]))
                for t in sorted(set(tps)):
                    sel = tps[te] == t
                    r[f"tp{t}"].append(mean_abs_pct_error(pred[sel], y[te][sel]))
                print(
                    f"seed {seed} f={f:.1f} {kind:16s} MRE {r['overall'][-1]:6.2f}%  "
                    f"({rep.epochs_run} epochs, best {rep.best_epoch}, {rep.train_seconds:.1f}s)",
                    file=sys.stderr,
                    flush=True,
                )
    return {
        "date": dt.date.today().isoformat(),
        "machine": header.get("machine", {}),
        "dataset": {
            "path": str(Path(args.dataset).relative_to(ROOT))
            if Path(args.dataset).is_relative_to(ROOT)
            else str(args.dataset),
            "n_samples": n,
            "retest": {k: v for k, v in header.get("retest", {}).items() if k != "rows"},
            "collection_seconds": header.get("collection_seconds"),
            "protocol": header.get("protocol"),
        },
        "protocol": {
            "validation_fraction": 0.1,
            "fractions": fractions,
            "seeds": args.seeds,
            "train": cfg,
            "networks": {k: MODELS[k] for k in args.models},
            "torch_threads": args.threads,
            "target": "L1 on log(latency / geomean)",
        },
        "graph_build_seconds": round(graph_s, 1),
        "train_seconds": {k: round(v, 1) for k, v in train_seconds.items()},
        "mre_pct": results,
        "paper_table_va": PAPER_TABLE_VA,
    }


def _fmt(vals: list[float]) -> str:
    return f"{np.mean(vals):.2f} ± {np.std(vals):.2f}" if vals else "-"


def markdown(doc: dict) -> str:
    kinds = list(doc["mre_pct"])
    fractions = doc["protocol"]["fractions"]
    cols = [c for c in next(iter(doc["mre_pct"][kinds[0]].values())) if c != "overall"]
    rt = doc["dataset"]["retest"]
    lines = [
        "# PredTOP Tables V–VI on this CPU: stage-latency MRE (%)",
        "",
        f"Date {doc['date']}; machine: {doc['machine'].get('cpu', '?')}, 2-core VM shared with other jobs; "
        f"measurement threads {doc['machine'].get('torch_num_threads')}, training threads {doc['protocol']['torch_threads']}.",
        "Reproduce: `python experiments/predtop_tables.py` (dataset: `flock /tmp/tuner-measure.lock python experiments/collect_stage_latencies.py collect`).",
        "",
        f"Ground truth: {doc['dataset']['n_samples']} measured stages (`{doc['dataset']['path']}`): every layer range of "
        "five small GPTs at TP 1/2/4 emulated by shapes, forward + backward of one micro-batch, median thread CPU time. "
        f"Measurement noise floor (same stage measured twice, n={rt.get('n')}): mean |difference| "
        f"{rt.get('mean_abs_rel_diff_pct', float('nan')):.2f} %, max {rt.get('max_abs_rel_diff_pct', float('nan')):.2f} %.",
        "",
        f"Split per seed: 10 % validation (early stopping), the training fraction, the rest is the held-out test set. "
        f"Mean ± std over {doc['protocol']['seeds']} seeds. Training: {json.dumps(doc['protocol']['train'])}, "
        f"{doc['protocol']['target']}; networks {json.dumps(doc['protocol']['networks'])}.",
        "",
        "## All test stages",
        "",
        "| train fraction | "
        + " | ".join(LABELS[k] for k in kinds)
        + " | paper Tran / GCN / GAT (Table V(a), Mesh 1 Conf 1) |",
        "|---|" + "---|" * len(kinds) + "---|",
    ]
    pa = doc["paper_table_va"]
    for f in sorted(fractions, reverse=True):
        ref = ""
        if f in pa["fractions"]:
            i = pa["fractions"].index(f)
            ref = f"{pa['dag_transformer'][i]:.2f} / {pa['gcn'][i]:.2f} / {pa['gat'][i]:.2f}"
        lines.append(
            f"| {int(round(f * 100))} % | "
            + " | ".join(_fmt(doc["mre_pct"][k][str(f)]["overall"]) for k in kinds)
            + f" | {ref} |"
        )
    lines += [
        "",
        "## Per TP degree (the configuration columns)",
        "",
        "| train fraction | " + " | ".join(f"{c} {LABELS[k]}" for c in cols for k in kinds) + " |",
        "|---|" + "---|" * (len(cols) * len(kinds)),
    ]
    for f in sorted(fractions, reverse=True):
        lines.append(
            f"| {int(round(f * 100))} % | "
            + " | ".join(_fmt(doc["mre_pct"][k][str(f)][c]) for c in cols for k in kinds)
            + " |"
        )
    # verdict on the target
    dag = doc["mre_pct"].get("dag_transformer")
    lines += ["", "## Against the target", ""]
    if dag:
        from30 = [f for f in fractions if f >= 0.3 - 1e-9]
        worst = max(np.mean(dag[str(f)]["overall"]) for f in from30) if from30 else float("nan")
        lines.append(
            f"- Target: DAG-Transformer MRE < 3 % from 30 % of the samples on. Measured: worst mean MRE over "
            f"fractions ≥ 30 % = {worst:.2f} % → {'met' if worst < 3 else 'NOT met'}."
        )
        for other in (k for k in kinds if k != "dag_transformer"):
            wins = sum(
                np.std(dag[str(f)]["overall"]) < np.std(doc["mre_pct"][other][str(f)]["overall"])
                for f in fractions
            )
            mwins = sum(
                np.mean(dag[str(f)]["overall"]) < np.mean(doc["mre_pct"][other][str(f)]["overall"])
                for f in fractions
            )
            lines.append(
                f"- vs {LABELS[other]}: DAG Transformer has the lower mean MRE at {mwins}/{len(fractions)} fractions "
                f"and the lower std over seeds at {wins}/{len(fractions)}."
            )
    lines += [
        "",
        f"Graph tracing (cached after the first run): {doc['graph_build_seconds']} s; training time per network over "
        f"the whole table: " + ", ".join(f"{LABELS[k]} {v} s" for k, v in doc["train_seconds"].items()) + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", type=Path, default=DEFAULT_DATASET)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--epochs", type=int, default=500)
    ap.add_argument("--patience", type=int, default=200)
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "predtop_tables")
    args = ap.parse_args(argv)
    try:
        doc = run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    atomic_write_text(args.out.with_suffix(".md"), markdown(doc))
    atomic_write_text(
        args.out.with_suffix(".json"), json.dumps(doc, indent=1) + "\n"
    )  # last: marks completion
    print(f"wrote {args.out.with_suffix('.md')} and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
