"""Outputs of a ``space: sharding`` search: the terminal table, ``results.json``/``.csv``, Chrome traces
of the best placements, and ``report.md`` with one PNG bar chart per task (``results.json`` last).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from predictor.files import safe_filename
from predictor.sources.synth.dlrm_sharding import ShardedPlacement
from tuner.report import atomic_write_text, json_default
from tuner.search.core import SearchResult
from tuner.search.sharding import ShardingContext
from tuner.sharders.sharding_types import TypedShardingJob

__all__ = ["sharding_payload", "print_sharding_table", "write_sharding_outputs", "write_plan_files", "placement_of"]


#: a sharder within this factor of the best predicted iteration time ties with it
TIE = 1.0 + 1e-9


def _best(cands: list[dict]) -> dict | None:
    ok = [c for c in cands if c.get("status") == "ok"]
    return min(ok, key=lambda c: c["predicted_iteration_s"]) if ok else None


def _units(result: SearchResult) -> list[tuple[int, int, list[dict]]]:
    """(task index, global batch size, one result per sharder) of every evaluated unit, in space order."""
    return [(c.params["task"], c.params["batch_size"], [o.record for o in outs]) for c, outs in result.ordered()]


def sharding_payload(result: SearchResult) -> dict:
    """The ``results.json`` document."""
    ctx: ShardingContext = result.space.worker_context()
    tasks = []
    wins: dict[str, int] = {}
    gains = []
    for ti, b, cands in _units(result):
        best = _best(cands)
        if best:  # every sharder as fast as the best counts: most heuristics tie on small tasks
            for c in cands:
                if c.get("status") == "ok" and c["predicted_iteration_s"] <= best["predicted_iteration_s"] * TIE:
                    wins[c["sharder"]] = wins.get(c["sharder"], 0) + 1
        by = {c["sharder"]: c for c in cands}
        heur = [c["predicted_iteration_s"] for c in cands
                if c["sharder"] not in ("model_guided", "torchrec") and c.get("status") == "ok"]
        mg = by.get("model_guided")
        if mg and mg.get("status") == "ok" and heur:
            gains.append(1.0 - mg["predicted_iteration_s"] / min(heur))
        t = ctx.tasks[ti]
        tasks.append(
            {
                "task": t.label,
                "batch_size": b,
                "n_tables": len(t),
                "heavy_tables": int(t.heavy_mask().sum()),
                "candidates": cands,
                "best": best["sharder"] if best else None,
                "best_predicted_iteration_s": best["predicted_iteration_s"] if best else None,
            }
        )
    return {
        "space": "sharding",
        "platform": ctx.platform.key,
        "platform_name": ctx.platform.name,
        "n_gpus": ctx.space.n_gpus,
        "timing_source": ctx.timing_source,
        "study": result.study_info(),
        "summary": {
            "wins": wins,
            "model_guided_gain_vs_best_heuristic_mean": float(np.mean(gains)) if gains else None,
            "model_guided_gain_vs_best_heuristic_max": float(np.max(gains)) if gains else None,
        },
        "tasks": tasks,
    }


def _frame(payload: dict) -> pd.DataFrame:
    rows = []
    for t in payload["tasks"]:
        for c in t["candidates"]:
            mem = c.get("memory_bytes_per_rank") or []
            rows.append(
                {
                    "task": t["task"],
                    "batch_size": t["batch_size"],
                    "sharder": c["sharder"],
                    "status": c["status"],
                    "predicted_iteration_s": c["predicted_iteration_s"],  # seconds and bytes, as results.json
                    "slowest_rank_s": max(c["per_rank_s"]) if c.get("per_rank_s") else None,
                    "max_memory_bytes_per_rank": max(mem) if mem else None,
                    "feasible": c["feasible"],
                    "best": c["sharder"] == t["best"],
                    "reason": c.get("reason", ""),
                }
            )
    return pd.DataFrame(rows)


def print_sharding_table(payload: dict, console: Console | None = None) -> None:
    """Task x sharder predicted milliseconds, the best of each row marked."""
    console = console or Console()
    sharders = [c["sharder"] for c in payload["tasks"][0]["candidates"]] if payload["tasks"] else []
    table = Table(title=f"Predicted iteration time (ms) — {payload['platform_name']} x {payload['n_gpus']}",
                  show_lines=False, header_style="bold")
    table.add_column("task", no_wrap=True)
    table.add_column("batch", justify="right")
    for s in sharders:
        table.add_column(s.replace("_greedy", "").replace("_", " "), justify="right", no_wrap=True)
    table.add_column("use", style="bold green", no_wrap=True)
    for t in payload["tasks"]:
        cells = []
        for c in t["candidates"]:
            if c["status"] == "ok":
                v = f"{c['predicted_iteration_s'] * 1e3:.2f}"
                cells.append(f"[bold green]*{v}[/]" if c["sharder"] == t["best"] else v)
            else:
                cells.append("[red]OOM[/]" if c["status"] == "infeasible" else "[red]error[/]")
        table.add_row(t["task"], str(t["batch_size"]), *cells, t["best"] or "[red]none fits[/]")
    console.print(table)
    console.print(f"kernel timing: {payload['timing_source']}")
    s = payload["summary"]
    wins = ", ".join(f"{k}: {v}" for k, v in sorted(s["wins"].items(), key=lambda kv: -kv[1]))
    console.print(f"fastest sharders per task and batch (ties count for each) — {wins}")
    if s["model_guided_gain_vs_best_heuristic_mean"] is not None:
        console.print(
            f"model-guided vs best of the heuristic sharders: {100 * s['model_guided_gain_vs_best_heuristic_mean']:.2f}% "
            f"faster on average (up to {100 * s['model_guided_gain_vs_best_heuristic_max']:.2f}%)"
        )


def _bar_chart(df: pd.DataFrame, task: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sub = df[df.task == task]
    batches = sorted(sub.batch_size.unique())
    sharders = list(dict.fromkeys(sub.sharder))
    fig, ax = plt.subplots(figsize=(9.5, 3.2), dpi=100)
    width = 0.8 / max(len(sharders), 1)
    x = np.arange(len(batches))
    for i, s in enumerate(sharders):
        vals = [1e3 * sub[(sub.batch_size == b) & (sub.sharder == s)].predicted_iteration_s.fillna(0).sum()
                for b in batches]
        ax.bar(x + i * width - 0.4 + width / 2, vals, width, label=s)
    ax.set_xticks(x, [str(b) for b in batches])
    ax.set_xlabel("global batch size")
    ax.set_ylabel("predicted iteration (ms)")
    ax.set_title(task)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _best_units(payload: dict) -> set[tuple[str, int]]:
    """(task, batch size) of each task's best plan: the batch size whose best sharder trains the most samples
    per second."""
    best: dict[str, tuple[float, int]] = {}
    for t in payload["tasks"]:
        s = t["best_predicted_iteration_s"]
        if s:
            rate = t["batch_size"] / s
            if t["task"] not in best or rate > best[t["task"]][0]:
                best[t["task"]] = (rate, t["batch_size"])
    return {(task, b) for task, (_, b) in best.items()}


def _overview_chart(payload: dict, path: Path) -> None:
    """Every task's sharders at its best plan's batch size, as slowdown over the best (one PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = _best_units(payload)
    rows = [t for t in payload["tasks"] if (t["task"], t["batch_size"]) in units]
    sharders = [c["sharder"] for c in rows[0]["candidates"]] if rows else []
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(rows) + 2.5), 3.4), dpi=100)
    width = 0.8 / max(len(sharders), 1)
    x = np.arange(len(rows))
    for i, s in enumerate(sharders):
        vals = [next((c["predicted_iteration_s"] / t["best_predicted_iteration_s"] for c in t["candidates"]
                      if c["sharder"] == s and c.get("status") == "ok"), 0.0) for t in rows]
        ax.bar(x + i * width - 0.4 + width / 2, vals, width, label=s)
    ax.set_xticks(x, [f"{t['task']} b{t['batch_size']}" for t in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("iteration / best")
    ax.set_ylim(bottom=0.9)
    if rows:  # no task has a feasible plan: an empty chart
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_sharding_outputs(result: SearchResult, out: Path) -> dict:
    """Write every output file; ``results.json`` last. Returns the payload."""
    out.mkdir(parents=True, exist_ok=True)
    payload = sharding_payload(result)
    df = _frame(payload)
    atomic_write_text(out / "results.csv", df.to_csv(index=False))
    # Chrome traces of each task's best plan (the batch size and sharder of most samples per second); with
    # ``--all-traces`` of the best sharder at every batch size (each trace costs a simulation and ~1 MB)
    traces = out / "traces"
    traces.mkdir(exist_ok=True)
    ctx: ShardingContext = result.space.worker_context()
    every = getattr(result.space, "all_traces", False)
    best_units = _best_units(payload)
    for ti, b, cands in _units(result):
        best = _best(cands)
        if not best or not (every or (ctx.tasks[ti].label, b) in best_units):
            continue
        _, tl = TypedShardingJob(ctx.job(ti, b)).evaluate(placement_of(best))
        tl.write_chrome_trace(traces / f"{safe_filename(ctx.tasks[ti].label)}_b{b}_{best['sharder']}.json")
    figs = out / "figures"
    figs.mkdir(exist_ok=True)
    lines = [
        f"# Sharding search — {payload['platform_name']} x {payload['n_gpus']}",
        "",
        f"Study `{payload['study']['name']}` ({payload['study']['evaluated']} evaluations now, "
        f"{payload['study']['reused_from_study']} reused). Timing: {payload['timing_source']}.",
        "",
    ]
    s = payload["summary"]
    lines.append("Fastest sharder counts (ties count for each): "
                 + ", ".join(f"{k} {v}" for k, v in sorted(s["wins"].items(), key=lambda kv: -kv[1])) + ".")
    if s["model_guided_gain_vs_best_heuristic_mean"] is not None:
        lines.append(
            f"Model-guided vs best heuristic: {100 * s['model_guided_gain_vs_best_heuristic_mean']:.2f}% faster on "
            f"average, {100 * s['model_guided_gain_vs_best_heuristic_max']:.2f}% at most."
        )
    lines.append("")
    if not every:  # one chart of every task's best plan; a chart per task with --all-traces
        _overview_chart(payload, figs / "best_plans.png")
        lines += ["![every task's sharders at its best plan's batch size](figures/best_plans.png)", ""]
    for label in dict.fromkeys(df.task):
        sub = df[df.task == label]
        lines += [f"## {label}", ""]
        if every:
            png = figs / f"{safe_filename(label)}.png"
            _bar_chart(df, label, png)
            lines += [f"![{label}](figures/{png.name})", ""]
        lines += ["| batch | best | predicted ms |", "|---:|---|---:|"]
        for t in payload["tasks"]:
            if t["task"] == label:
                ms = "—" if t["best_predicted_iteration_s"] is None else f"{t['best_predicted_iteration_s'] * 1e3:.2f}"
                lines.append(f"| {t['batch_size']} | {t['best'] or 'none fits'} | {ms} |")
        infeasible = sub[sub.status != "ok"]
        if len(infeasible):
            lines.append("")
            for _, r in infeasible.iterrows():
                lines.append(f"- batch {r.batch_size}, {r.sharder}: {r.status} — {r.reason}")
        lines.append("")
    atomic_write_text(out / "report.md", "\n".join(lines))
    write_plan_files(result, out / "plans")
    atomic_write_text(out / "results.json", json.dumps(payload, indent=1, default=json_default))
    return payload


def placement_of(candidate: dict) -> np.ndarray | ShardedPlacement:
    """A result's placement: its rank-per-table ``assignment``, or its ``sharding`` (other sharding types)."""
    if candidate.get("assignment") is not None:
        return np.asarray(candidate["assignment"])
    return ShardedPlacement.from_records(candidate["sharding"])


def write_plan_files(result: SearchResult, folder: Path) -> list[Path]:
    """The best plan of each task and batch as a TorchRec plan file, ``TASK_bBATCH.json``
    (:func:`tuner.integrations.torchrec_io.write_plan_file`), and in a space that uses TorchRec (with it
    installed) the same plan as a pickled ``ShardingPlan``, ``TASK_bBATCH.pt``."""
    from tuner.integrations.torchrec_io import (
        load_sharding_plan,
        save_torchrec_plan,
        torchrec_available,
        write_plan_file,
    )

    ctx: ShardingContext = result.space.worker_context()
    # importing torchrec takes ~3.7 s of CPU (the shipped space's reports: 4.9 s with it, 1.2 s without): only a
    # space that uses TorchRec (its tasks or its planner) pickles ShardingPlans
    space = ctx.space
    pickled = bool(space.tasks.torchrec or "torchrec" in space.sharders) and torchrec_available()
    written = []
    for ti, b, cands in _units(result):
        best = _best(cands)
        if not best:
            continue
        tables = ctx.tasks[ti]
        stem = "".join(c if c.isalnum() or c in "._-" else "_" for c in f"{tables.label}_b{b}")
        path = write_plan_file(folder / f"{stem}.json", tables, placement_of(best), world_size=ctx.space.n_gpus,
                               batch_size=b, compute_device="cpu" if ctx.platform.kind == "cpu" else "cuda",
                               local_world_size=min(ctx.space.n_gpus, int(ctx.platform.devices_per_node or 1)),
                               paths=ctx.table_paths[ti] if ctx.table_paths else None,
                               meta={"task": tables.label, "sharder": best["sharder"],
                                     "predicted_iteration_s": best["predicted_iteration_s"]})
        written.append(path)
        if pickled:
            save_torchrec_plan(path.with_suffix(".pt"), load_sharding_plan(path))
    return written

