"""Outputs of a ``space: rent`` search: terminal table, ``results.csv``, the Pareto plot, the picks'
predicted timelines, ``report.html`` and ``results.json`` (last, atomic).

``report.html`` is one self-contained page (the plot is inline SVG, no scripts): the picks (the
cheapest plan that meets the deadline and the budget, the fastest one) with their launch
arguments and timelines, the time-to-train vs cost plot with the front, the front as a table,
each accelerator's cheapest and fastest plan, and why the other candidates are infeasible.
"""

from __future__ import annotations

import datetime as dt
import html
import io
import json
import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from predictor.sources.synth.transformer import ParallelPlan
from tuner.launch import write_launch_files
from tuner.report import atomic_write_text, finite, json_default
from tuner.search.core import SearchResult
from tuner.search.rent_answer import (
    best_per_accelerator,
    best_per_unit,
    launch_arguments,
    pareto_front,
    picks,
)
from tuner.search.rent_eval import RentContext, duration, timeline_of

__all__ = ["rent_payload", "print_rent_table", "write_rent_outputs", "render_rent_html", "pareto_figure"]

GIB = 2.0**30
_ORDER = {"ok": 0, "infeasible": 1, "invalid": 2, "failed": 3}


def _reason_kind(r: dict) -> str:
    """``memory``, ``deadline``, ``budget`` (the first miss named) or the status."""
    if r.get("status") != "infeasible":
        return r.get("status", "failed")
    return (r.get("reason") or "infeasible").split(":")[0]


def _work(ctx: RentContext) -> dict:
    t = ctx.space.training
    out = {"samples": ctx.total_samples, "epochs": t.epochs}
    if ctx.kind == "transformer":
        assert ctx.spec is not None
        out.update(tokens=ctx.total_samples * ctx.spec.seq, global_batch=t.global_batch, seq=ctx.spec.seq)
    return out


def _model(ctx: RentContext) -> dict:
    m = ctx.space.model
    if ctx.kind == "transformer":
        assert ctx.spec is not None and m.transformer is not None
        return {"kind": "transformer", **m.transformer.model_dump(mode="json"), "parameters": ctx.spec.param_count()}
    if ctx.kind == "dlrm":
        assert ctx.tables is not None and m.dlrm is not None
        return {"kind": "dlrm", "tables": len(ctx.tables), "table_bytes": float(ctx.tables.bytes_per_table().sum()),
                "dense": m.dlrm.dense.model_dump(mode="json"), "sharders": list(m.dlrm.sharders)}
    assert m.module is not None
    info = ctx.module_info
    return {"kind": "module", "name": m.module.name, "parameters": info.n_params if info else None,
            "precision": m.module.precision}


def rent_payload(result: SearchResult) -> dict:
    """The ``results.json`` document: the front, the picks, each accelerator's best, every record."""
    search = result.space
    ctx: RentContext = search.context  # type: ignore[attr-defined]
    records = [outs[0].record for outs in result.outcomes.values()]
    records.sort(key=lambda r: (_ORDER.get(r.get("status", "failed"), 4), r.get("time_to_train_h") or math.inf,
                                r.get("usd") or math.inf))
    front = pareto_front(records)
    for r in front:
        r["on_front"] = True
        r["launch"] = launch_arguments(r, ctx.spec)
    chosen = picks(records)
    per_acc = best_per_accelerator(records, list(ctx.offers))
    for r in [*chosen.values(), *(x for d in per_acc.values() for x in d.values())]:
        if r is not None:
            r["launch"] = launch_arguments(r, ctx.spec)
    kinds: dict[str, int] = {}
    for r in records:
        k = _reason_kind(r)
        kinds[k] = kinds.get(k, 0) + 1
    return {
        "space": "rent",
        "generated": dt.datetime.now().isoformat(timespec="seconds"),
        "kind": ctx.kind,
        "model": _model(ctx),
        "work": _work(ctx),
        "deadline_hours": ctx.space.deadline_h,
        "budget_usd": ctx.space.budget_usd,
        "price_column": ", ".join(ctx.space.pricing.columns),
        "accelerators": [{"key": o.key, "name": o.platform.name, "kind": o.platform.kind,
                          "memory_bytes": o.platform.memory_bytes, "devices_per_node": o.platform.devices_per_node,
                          "usd_per_device_hour": o.usd_per_device_hour, "price_source": o.price_source,
                          "timing_source": _sources(records, o.key) or o.resolved.source} for o in ctx.offers.values()],
        "devices": ctx.devices,
        "strategy": search.strategy,  # type: ignore[attr-defined]
        "study": result.study_info(),
        "counts": {"candidates": len(search.candidates()), "evaluated": len(records), "front": len(front),
                   "invalid_combinations": len(search.invalid), **kinds},  # type: ignore[attr-defined]
        "front": [r["key"] for r in front],
        "picks": chosen,
        "per_accelerator": per_acc,
        "per_unit": best_per_unit(records),
        "records": records,
    }


def _file_name(key: str) -> str:
    return key.replace("/", "_")


def _sources(records: list[dict], accelerator: str) -> str:
    """The kernel-timing sources the accelerator's evaluated records name (a transformer plan's are analytic)."""
    return ", ".join(sorted({str(r["timing_source"]) for r in records
                             if r.get("accelerator") == accelerator and r.get("timing_source")}))


def _trace_all(result: SearchResult, payload: dict, out: Path) -> None:
    """Write the predicted timeline of each pick and each accelerator's best, and the picks' launch files
    (Megatron-LM arguments, torchtitan TOML and Python configuration) for a transformer; link them from the
    records."""
    ctx: RentContext = result.space.context  # type: ignore[attr-defined]
    wanted = [*payload["picks"].values(), *(x for d in payload["per_accelerator"].values() for x in d.values())]
    written: dict[str, str] = {}
    for r in wanted:
        if r is None:
            continue
        if r["key"] not in written:
            tl = timeline_of(ctx, r, getattr(result.space, "traces", {}).get("module"))
            if tl is None:
                continue
            path = tl.write_chrome_trace(out / "traces" / (_file_name(r["key"]) + ".json"))
            written[r["key"]] = str(path.relative_to(out))
        r["trace"] = written[r["key"]]
    for r in payload["picks"].values():
        if r is not None and ctx.kind == "transformer" and ctx.spec is not None and "launch_files" not in r:
            folder = out / "launch" / _file_name(r["key"])
            files = write_launch_files(folder, ctx.spec, ParallelPlan(**r["fields"]), platform=r["platform"],
                                       devices_per_node=r["devices_per_node"], predicted_s=r["iteration_s"])["files"]
            r["launch_files"] = [str((folder / f).relative_to(out)) for f in files]


# ----------------------------------------------------------------------------- terminal
def _days(r: dict | None) -> str:
    return "—" if not r or r.get("time_to_train_h") is None else duration(r["time_to_train_h"])


def _usd(x: float | None) -> str:
    return "—" if x is None else (f"${x:,.2f}" if x < 100 else f"${x:,.0f}")


def _gib(x: float | None) -> str:
    return "—" if x is None else f"{x / GIB:.1f}"


def print_rent_table(payload: dict, console: Console | None = None, top: int = 12) -> None:
    """The front (fastest first, at most ``top`` rows), the picks, and how many candidates missed and why."""
    console = console or Console()
    recs = {r["key"]: r for r in payload["records"]}
    front = [recs[k] for k in payload["front"]]
    n = payload["counts"]
    t = Table(title=f"what to rent — {payload['model'].get('name', payload['kind'])}: Pareto front, time to train "
                    f"vs cost ({n['front']} of {n['evaluated']} evaluated, {payload['strategy']})", header_style="bold")
    for col in ("accelerator", "devices", "plan", "s/iter", "time to train", "cost", "device-h", "GiB/dev"):
        t.add_column(col, justify="left" if col in ("accelerator", "plan") else "right", no_wrap=True)
    step = max(1, math.ceil(len(front) / top))
    shown = front[::step]
    if front and front[-1] is not shown[-1]:
        shown.append(front[-1])
    cheap, fast = payload["picks"]["cheapest"], payload["picks"]["fastest"]
    for r in shown:
        style = "bold green" if cheap and r["key"] == cheap["key"] else ("bold cyan" if fast and r["key"] == fast["key"]
                                                                         else None)
        t.add_row(r["accelerator"], str(r["devices"]), r.get("plan") or "", f"{r['iteration_s']:.3f}", _days(r),
                  _usd(r["usd"]), f"{r['device_hours']:,.0f}", _gib(r.get("memory_bytes_per_device")), style=style)
    console.print(t)
    for name, r in (("cheapest", cheap), ("fastest", fast)):
        if r:
            console.print(f"{name}: {r['accelerator']} x {r['devices']} ({r.get('plan')}), {_days(r)}, "
                          f"{_usd(r['usd'])}", highlight=False)
    if not cheap:
        console.print("[red]no candidate fits in memory and meets the deadline and the budget[/]")
    missed = ", ".join(f"{n.get(k, 0)} {k}" for k in ("memory", "deadline", "budget", "failed") if n.get(k))
    if missed:
        console.print(f"infeasible or failed: {missed}", highlight=False)


# ----------------------------------------------------------------------------- plot
def pareto_figure(payload: dict):  # -> matplotlib Figure
    """Time to train (hours) vs cost (USD), log-log: every prediction, the front, the picks, the limits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.6), dpi=100)
    priced = [r for r in payload["records"] if r.get("usd") and r.get("time_to_train_h")]
    if not priced:  # every candidate out of memory (or failed): no time or cost to plot on log axes
        ax.text(0.5, 0.5, "no candidate was priced: each one is out of memory or failed (see the table)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    colors = plt.get_cmap("tab10").colors
    for i, a in enumerate(x["key"] for x in payload["accelerators"]):
        c = colors[i % len(colors)]
        ok = [r for r in payload["records"] if r["accelerator"] == a and r.get("status") == "ok"]
        miss = [r for r in payload["records"] if r["accelerator"] == a and r.get("status") == "infeasible"
                and r.get("usd") is not None]
        ax.scatter([r["time_to_train_h"] for r in ok], [r["usd"] for r in ok], s=14, color=c, label=a, alpha=0.8)
        ax.scatter([r["time_to_train_h"] for r in miss], [r["usd"] for r in miss], s=14, facecolors="none",
                   edgecolors=c, alpha=0.35, linewidths=0.8)
    recs = {r["key"]: r for r in payload["records"]}
    front = [recs[k] for k in payload["front"]]
    if front:
        ax.step([r["time_to_train_h"] for r in front], [r["usd"] for r in front], where="post", color="black",
                lw=1.2, label="Pareto front")
    for name, mark in (("cheapest", "*"), ("fastest", "D")):
        r = payload["picks"].get(name)
        if r:
            ax.scatter([r["time_to_train_h"]], [r["usd"]], marker=mark, s=160, color="gold", edgecolors="black",
                       zorder=5, label=f"{name}: {r['accelerator']} x {r['devices']}")
    if payload.get("deadline_hours"):
        ax.axvline(payload["deadline_hours"], color="#a00", ls="--", lw=1, label="deadline")
    if payload.get("budget_usd"):
        ax.axhline(payload["budget_usd"], color="#06a", ls="--", lw=1, label="budget")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("time to train (hours)")
    ax.set_ylabel(f"cost (USD, {payload['price_column']})")
    ax.set_title("time to train vs cost (hollow: misses the deadline or the budget)", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # the SVG sits inline in HTML: no XML prolog


# ----------------------------------------------------------------------------- HTML
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1280px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:8px 0 16px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#f4f4f4}
td.l,th.l{text-align:left} tr.pick td{background:#eaf7ea;font-weight:600}
.meta{color:#555;font-size:13px} code{font-size:12px;word-break:break-all} svg{max-width:100%;height:auto}
td.miss{color:#a00;font-size:12px} .card{border:1px solid #cde;border-radius:6px;padding:8px 14px;margin:10px 0;background:#f8fbff}
"""


def _row(r: dict, e, picked: set[str]) -> str:
    cls = " class='pick'" if r["key"] in picked else ""
    mfu = r.get("mfu")
    trace = f"<a href='{e(r['trace'])}'>trace</a>" if r.get("trace") else ""
    return (f"<tr{cls}><td class='l'>{e(r['accelerator'])}</td><td>{r['devices']}</td><td>{r['nodes']}</td>"
            f"<td class='l'>{e(r.get('plan') or '')}</td><td>{r['iteration_s']:.3f}</td>"
            f"<td>{_days(r)}</td><td>{_usd(r['usd'])}</td><td>{r['device_hours']:,.0f}</td>"
            f"<td>{_gib(r.get('memory_bytes_per_device'))}</td><td>{'' if mfu is None else f'{100 * mfu:.1f}%'}</td>"
            f"<td class='l'>{trace}</td></tr>")


_HEAD = ("<table><tr><th class='l'>accelerator</th><th>devices</th><th>nodes</th><th class='l'>plan</th>"
         "<th>s/iteration</th><th>time to train</th><th>cost</th><th>device-hours</th><th>GiB/device</th><th>MFU</th>"
         "<th class='l'>timeline</th></tr>")


def _card(title: str, r: dict | None, e) -> str:
    if r is None:
        return (f"<div class='card'><b>{e(title)}</b>: none — no candidate fits in memory and meets the deadline "
                "and the budget.</div>")
    launch = "".join(f"<div><b>{e(k)}</b>: <code>{e(v)}</code></div>" for k, v in (r.get("launch") or {}).items())
    if r.get("launch_files"):
        launch += "<div>launch files: " + ", ".join(f"<a href='{e(f)}'>{e(f)}</a>" for f in r["launch_files"]) + "</div>"
    trace = (f" · predicted timeline: <a href='{e(r['trace'])}'>{e(r['trace'])}</a> (open in ui.perfetto.dev)"
             if r.get("trace") else "")
    return (f"<div class='card'><b>{e(title)}</b>: <b>{r['devices']} x {e(r['accelerator_name'])}</b> "
            f"({r['nodes']} node{'s' if r['nodes'] > 1 else ''}), plan <code>{e(r.get('plan') or '')}</code> — "
            f"{_days(r)}, {_usd(r['usd'])}, {r['device_hours']:,.0f} device-hours, "
            f"{_gib(r.get('memory_bytes_per_device'))} GiB per device{trace}{launch}</div>")


def render_rent_html(payload: dict) -> str:
    """The self-contained report page."""
    e = html.escape
    recs = {r["key"]: r for r in payload["records"]}
    front = [recs[k] for k in payload["front"]]
    cheap, fast = payload["picks"]["cheapest"], payload["picks"]["fastest"]
    picked = {r["key"] for r in (cheap, fast) if r}
    m, w, n = payload["model"], payload["work"], payload["counts"]
    work = (f"{w['tokens']:.3g} tokens, global batch {w['global_batch']} x {w['seq']}" if "tokens" in w
            else f"{w['samples']:.3g} samples")
    limits = " · ".join(x for x in (f"deadline {duration(payload['deadline_hours'])}" if payload["deadline_hours"] else "",
                                    f"budget {_usd(payload['budget_usd'])}" if payload["budget_usd"] else "") if x)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>What to rent</title>",
        f"<style>{_CSS}</style></head><body><h1>What to rent: {e(str(m.get('name', m['kind'])))}</h1>",
        f"<p class='meta'>{e(m['kind'])} model{_params(m)} · {e(work)} · {e(limits or 'no deadline or budget')} · "
        f"price column <b>{e(payload['price_column'])}</b> · {n['evaluated']} of {n['candidates']} candidates "
        f"evaluated ({e(payload['strategy'])}) · generated {e(payload['generated'])}</p>",
        "<h2>Answer</h2>",
        _card("Cheapest that meets the deadline" if payload["deadline_hours"] else "Cheapest", cheap, e),
        _card("Fastest within the budget" if payload["budget_usd"] else "Fastest", fast, e),
        "<h2>Time to train vs cost</h2>", _svg(pareto_figure(payload)),
        f"<h2>Pareto front ({len(front)} plans)</h2>", _HEAD, *(_row(r, e, picked) for r in front), "</table>",
        "<h2>Best plan per accelerator</h2><table><tr><th class='l'>accelerator</th><th>USD/device-h</th>"
        "<th class='l'>cheapest</th><th>time</th><th>cost</th><th class='l'>fastest</th><th>time</th><th>cost</th>"
        "<th class='l'>price source</th></tr>",
    ]
    for a in payload["accelerators"]:
        best = payload["per_accelerator"][a["key"]]
        cells = "".join(
            f"<td class='l'>{e(str(r['devices']) + ' x ' + (r.get('plan') or ''))}{_link(r, e)}</td><td>{_days(r)}</td>"
            f"<td>{_usd(r['usd'])}</td>" if r else "<td class='l'>none feasible</td><td>—</td><td>—</td>"
            for r in (best["cheapest"], best["fastest"]))
        parts.append(f"<tr><td class='l'>{e(a['key'])}</td><td>{a['usd_per_device_hour']:.2f}</td>{cells}"
                     f"<td class='l'>{e(a['price_source'])}</td></tr>")
    parts.append("</table>")
    parts.append(_unit_table(payload, e))
    parts.append(_infeasible_section(payload, e))
    parts.append(_methods(payload, e))
    st = payload["study"]
    parts.append(f"<p class='meta'>Optuna study <code>{e(st['name'])}</code> in <code>{e(st['storage'])}</code>: "
                 f"{st['evaluated']} evaluations now, {st['reused_from_study']} reused.</p></body></html>")
    return "\n".join(parts)


def _unit_table(payload: dict, e) -> str:
    """Accelerators x device counts: the best feasible plan's time and cost, or why none is feasible."""
    recs = {r["key"]: r for r in payload["records"]}
    devs = payload["devices"]
    out = ["<h2>Best plan per accelerator and device count</h2><p class='meta'>time to train / cost of the "
           "fastest feasible plan evaluated (also the cheapest at that count); — : not evaluated</p><table><tr>"
           "<th class='l'>accelerator</th>" + "".join(f"<th>{d}</th>" for d in devs) + "</tr>"]
    for a in payload["accelerators"]:
        row = payload["per_unit"].get(a["key"], {})
        cells = []
        for d in devs:
            v = row.get(str(d))
            if v is None:
                cells.append("<td>—</td>")
            elif v.startswith("miss:"):
                cells.append(f"<td class='miss'>{e(v[5:])}</td>")
            else:
                r = recs[v]
                cells.append(f"<td title='{e(r.get('plan') or '')}'>{_days(r)}<br>{_usd(r['usd'])}</td>")
        out.append(f"<tr><td class='l'>{e(a['key'])}</td>{''.join(cells)}</tr>")
    out.append("</table>")
    return "".join(out)


def _link(r: dict, e) -> str:
    return f" (<a href='{e(r['trace'])}'>trace</a>)" if r.get("trace") else ""


def _params(m: dict) -> str:
    p = m.get("parameters")
    return f", {p / 1e9:.1f} B parameters" if p else ""


def _infeasible_section(payload: dict, e) -> str:
    n = payload["counts"]
    lines = [f"<li>{n[k]} {k}</li>" for k in ("memory", "deadline", "budget", "failed") if n.get(k)]
    first: dict[str, dict] = {}
    for r in payload["records"]:
        if r.get("status") != "ok":
            first.setdefault(_reason_kind(r), r)
    examples = list(first.values())
    ex = "".join(f"<li><code>{e(r['key'])}</code>: {e(r.get('reason') or r.get('status', ''))}</li>" for r in examples)
    return (f"<h2>Not chosen</h2><p class='meta'>{n['invalid_combinations']} parameter combinations cannot make a "
            f"plan (not candidates). Evaluated but infeasible or failed:</p><ul>{''.join(lines) or '<li>none</li>'}"
            f"</ul><p class='meta'>e.g.</p><ul>{ex}</ul>")


def _methods(payload: dict, e) -> str:
    sources = sorted({a["timing_source"] for a in payload["accelerators"]})
    return ("<h2>How each number was produced</h2><ul class='meta'>"
            "<li><b>iteration</b>: the candidate's iteration graph simulated on the critical path; kernel times from "
            f"{e(', '.join(sources))}</li>"
            "<li><b>time to train</b>: ceil(samples to train / global batch) iterations x predicted iteration time</li>"
            "<li><b>cost</b>: time to train x devices x price per device-hour; <b>device-hours</b>: time x devices</li>"
            "<li><b>memory</b>: predicted peak per device against the device's capacity</li>"
            "<li><b>front</b>: feasible plans no other feasible plan beats on both time and cost</li></ul>")


def _frame(payload: dict) -> pd.DataFrame:
    cols = ("key", "status", "accelerator", "devices", "nodes", "plan", "iteration_s", "iterations",
            "time_to_train_days", "usd", "device_hours", "memory_bytes_per_device", "mfu", "reason")
    front = set(payload["front"])
    return pd.DataFrame([{**{c: r.get(c) for c in cols}, "on_front": r["key"] in front} for r in payload["records"]])


def write_rent_outputs(result: SearchResult, out: Path) -> dict:
    """results.csv, figures/pareto.png, traces/, report.html, then results.json (atomic, last)."""
    out.mkdir(parents=True, exist_ok=True)
    payload = rent_payload(result)
    _trace_all(result, payload, out)
    atomic_write_text(out / "results.csv", _frame(payload).to_csv(index=False))
    (out / "figures").mkdir(exist_ok=True)
    fig = pareto_figure(payload)
    fig.savefig(out / "figures" / "pareto.png")
    import matplotlib.pyplot as plt

    plt.close(fig)
    atomic_write_text(out / "report.html", render_rent_html(payload))
    atomic_write_text(out / "results.json", json.dumps(finite(payload), indent=1, default=json_default))
    return payload

