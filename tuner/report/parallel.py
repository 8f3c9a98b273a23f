"""Outputs of a ``space: parallel`` search: terminal table, results.csv, the best plan's trace, and
``results.json`` — written last and atomically, so a killed run never leaves one that looks complete."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from predictor.sources.synth.transformer import ParallelPlan
from tuner.launch import write_launch_files
from tuner.plans import predict_plan, torchtitan_iteration_s
from tuner.report import atomic_write_text, json_default
from tuner.search.core import SearchResult
from tuner.search.parallel import ParallelContext, ParallelSearch

__all__ = ["parallel_payload", "print_parallel_table", "write_parallel_outputs"]

_ORDER = {"ok": 0, "infeasible": 1, "invalid": 2, "failed": 3}


def _rank_key(r: dict) -> tuple:
    t = r.get("predicted_iteration_s")
    mem = r.get("memory_bytes_per_device") or math.inf
    return (_ORDER.get(r["status"], 4), t if t is not None else math.inf, mem)


def parallel_payload(result: SearchResult) -> dict:
    """The ``results.json`` document: plans ranked (feasible by predicted time first)."""
    search: ParallelSearch = result.space  # type: ignore[assignment]
    ctx: ParallelContext = search.context
    plans = sorted((outs[0].record for outs in result.outcomes.values()), key=_rank_key)
    ok = [p for p in plans if p["status"] == "ok"]
    counts = {s: sum(1 for p in plans if p["status"] == s) for s in _ORDER}
    return {
        "space": "parallel",
        "model": ctx.spec.to_dict(),
        "parameters": ctx.spec.param_count(),
        "platform": ctx.platform.key,
        "platform_name": ctx.platform.name,
        "devices": ctx.devices,
        "devices_per_node": ctx.devices_per_node,
        "nodes": ctx.space.cluster.nodes,
        "global_batch": ctx.space.global_batch,
        "strategy": search.strategy,
        "timing_source": "analytic kernel models from the catalog; span-aware collectives",
        "study": result.study_info(),
        "counts": {"candidates": len(search.candidates()), "evaluated": len(plans), **counts,
                   "invalid_combinations": len(search.invalid)},
        "best": ok[0] if ok else None,
        "plans": plans,
        "invalid": [{"plan": k, "reason": r} for k, r in search.invalid],
    }


def _frame(payload: dict) -> pd.DataFrame:
    rows = []
    for p in payload["plans"]:
        f = p.get("fields", {})
        rows.append({
            "plan": p.get("key"), "status": p["status"], "tp": f.get("tp"), "pp": f.get("pp"), "dp": f.get("dp"),
            "micro_batch": f.get("micro_batch"), "schedule": f.get("schedule"),
            "virtual_stages": f.get("virtual_stages") if f.get("schedule") == "interleaved" else None,
            "recompute": f.get("recompute"), "sequence_parallel": f.get("sequence_parallel"),
            "predicted_iteration_s": p.get("predicted_iteration_s"), "samples_per_s": p.get("samples_per_s"),
            "model_tflops_per_device": p.get("model_tflops_per_device"), "mfu": p.get("mfu"),
            "memory_bytes_per_device": p.get("memory_bytes_per_device") or np.nan, "reason": p.get("reason", ""),
        })
    return pd.DataFrame(rows)


def print_parallel_table(payload: dict, console: Console | None = None, top: int = 10) -> None:
    """The fastest feasible plans, then how many did not fit and why (first few)."""
    console = console or Console()
    n = payload["counts"]
    table = Table(title=f"{payload['model']['name']} on {payload['devices']} x {payload['platform_name']} — "
                        f"global batch {payload['global_batch']} ({payload['strategy']}, {n['evaluated']} of "
                        f"{n['candidates']} plans)", header_style="bold")
    for col in ("#", "tp", "pp", "dp", "mb", "schedule", "recompute", "sp", "s/iter", "samples/s", "TFLOP/s/GPU",
                "MFU", "GiB/GPU"):
        table.add_column(col, justify="right" if col not in ("schedule", "recompute") else "left", no_wrap=True)
    ok = [p for p in payload["plans"] if p["status"] == "ok"]
    for i, p in enumerate(ok[:top]):
        f = p["fields"]
        sched = f["schedule"] if f["schedule"] == "1f1b" else f"interleaved x{f['virtual_stages']}"
        style = "bold green" if i == 0 else None
        table.add_row(str(i + 1), str(f["tp"]), str(f["pp"]), str(f["dp"]), str(f["micro_batch"]), sched,
                      f["recompute"], "y" if f["sequence_parallel"] else "", f"{p['predicted_iteration_s']:.3f}",
                      f"{p['samples_per_s']:.1f}", f"{p['model_tflops_per_device']:.0f}", f"{100 * p['mfu']:.1f}%",
                      f"{p['memory_bytes_per_device'] / 2**30:.1f}", style=style)
    console.print(table)
    bad = [p for p in payload["plans"] if p["status"] != "ok"]
    if bad:
        console.print(f"{n['infeasible']} plans do not fit in memory, {n['failed'] + n['invalid']} failed; e.g.:")
        for p in bad[:3]:
            console.print(f"  {p.get('key')}: {p['status']} — {p.get('reason', '')}", highlight=False)
    if not ok:
        console.print("[red]no plan fits in memory[/]")
    launch = payload.get("launch")
    if launch:
        changed = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in launch["torchtitan_changes"].items())
        tail = (f"; torchtitan runs it with {changed}: {launch['torchtitan_predicted_iteration_s']:.3f} s/iteration"
                if changed else "")
        console.print(f"best plan as a launch: {', '.join(launch['files'])}{tail}", highlight=False)


def _launch(ctx: ParallelContext, plan: ParallelPlan, predicted_s: float, out: Path) -> dict:
    """The best plan's launch files (megatron_args.txt, torchtitan.toml, torchtitan_recipe.py) and the
    prediction of the plan as torchtitan runs it (it may differ: torchtitan always runs TP with sequence
    parallelism, reduces in fp32)."""
    tt_s = torchtitan_iteration_s(ctx.spec, plan, ctx.platform, predicted_s, devices_per_node=ctx.devices_per_node,
                                  devices=ctx.devices, detail=ctx.space.search.detail)
    launch = write_launch_files(out, ctx.spec, plan, platform=ctx.platform.key, devices_per_node=ctx.devices_per_node,
                                predicted_s=predicted_s, torchtitan_predicted_s=tt_s)
    launch.update(predicted_iteration_s=predicted_s, torchtitan_predicted_iteration_s=tt_s)
    return launch


def write_parallel_outputs(result: SearchResult, out: Path) -> dict:
    """Write results.csv, the Chrome trace and launch files of the best plan, then results.json (atomic, last)."""
    out.mkdir(parents=True, exist_ok=True)
    payload = parallel_payload(result)
    atomic_write_text(out / "results.csv", _frame(payload).to_csv(index=False))
    best = payload["best"]
    if best is not None:
        ctx: ParallelContext = result.space.worker_context()
        _, tl = predict_plan(ctx.spec, ParallelPlan(**best["fields"]), ctx.platform, devices_per_node=ctx.devices_per_node,
                             devices=ctx.devices, detail=ctx.space.search.detail, keep_timeline=True)
        if tl is not None:
            path = tl.write_chrome_trace(out / "traces" / f"best_{best['key']}.json")
            payload["best_trace"] = str(path.relative_to(out))
        payload["launch"] = _launch(ctx, ParallelPlan(**best["fields"]), best["predicted_iteration_s"], out)
    atomic_write_text(out / "results.json", json.dumps(payload, indent=1, default=json_default))
    return payload


