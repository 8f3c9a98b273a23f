"""Outputs of an accelerator search: the terminal table, ``results.json`` and ``report.html``.

``report.html`` is one self-contained file (charts are inline SVG, no scripts, no external
assets): Centimani Fig. 7-style grouped bars of throughput and price-performance normalised
to the baseline accelerator, one table per model, the memory per level and per category of
every chosen batch, and the method that produced each number. ``results.json`` is written
last and atomically (:func:`tuner.report.atomic_write_text`).
"""

from __future__ import annotations

import datetime as _dt
import html
import io
import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from predictor.timing.platforms.schema import Platform
from tuner.report import atomic_write_text, finite, json_default
from tuner.search.accelerators import AcceleratorSpace

__all__ = ["build_payload", "per_chip", "print_table", "write_outputs", "render_html"]

GIB = 2.0**30


def per_chip(row: dict) -> float:
    """Samples/s of one chip of a row: a pipelined dataflow row runs ``devices x pipeline_stages`` chips, so its
    whole-system throughput over one baseline device would overstate it by the pipeline's depth."""
    if row.get("samples_per_s_per_chip") is not None:
        return float(row["samples_per_s_per_chip"])
    return float(row["samples_per_s"]) / max(int(row.get("chips") or row.get("devices") or 1), 1)


def build_payload(space: AcceleratorSpace, platforms: dict[str, Platform], infos: dict, rows: list[dict], study: dict) -> dict:
    """The ``results.json`` document: rows with per-chip throughput normalised to the baseline, and ranks."""
    base = space.baseline_key
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["devices"]), []).append(r)
    best: dict[str, dict[str, str | None]] = {}
    for (model, devices), grp in groups.items():
        ref = next((r for r in grp if r["accelerator"] == base and r.get("status") == "ok"), None)
        ok = sorted((r for r in grp if r.get("status") == "ok" and math.isfinite(r.get("objective", math.inf))),
                    key=lambda r: r["objective"])
        for i, r in enumerate(ok):
            r["rank"] = i + 1
        for r in grp:
            r.setdefault("rank", None)
            ok_r = r.get("status") == "ok"
            r["normalised_throughput"] = (per_chip(r) / per_chip(ref)) if (ok_r and ref) else None
            pp, ref_pp = r.get("price_performance"), (ref or {}).get("price_performance")
            r["normalised_price_performance"] = (pp / ref_pp) if (ok_r and pp is not None and ref_pp) else None
        best.setdefault(model, {})[str(devices)] = ok[0]["accelerator"] if ok else None
    return {
        "space": "accelerators",
        "generated": _dt.datetime.now().isoformat(timespec="seconds"),
        "objective": space.objective,
        "baseline": base,
        "precision": space.precision,
        "optimizer": space.optimizer,
        "batch_policy": space.batch_policy,
        "gradient_accumulation": space.gradient_accumulation,
        "memory_fraction": space.memory_fraction,
        "study": study,
        "models": [
            {"name": i.name, "description": i.description, "sample_unit": i.sample_unit,
             "tokens_per_sample": i.tokens_per_sample, "n_params": i.n_params}
            for i in infos.values()
        ],
        "accelerators": [
            {"key": p.key, "name": p.name, "kind": p.kind, "memory_policy": p.memory_policy,
             "on_chip_bytes": p.on_chip_bytes, "off_chip_bytes": p.memory_bytes,
             "price_per_device_hour_usd": p.price_per_device_hour_usd, "price_date": p.price_date}
            for p in platforms.values()
        ],
        "best": best,
        "rows": rows,
    }


def _fmt(x: float | None, spec: str = ".1f", none: str = "—") -> str:
    return none if x is None else format(x, spec)


def _mem(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x / GIB:.1f} GiB" if x >= 0.1 * GIB else f"{x / 2**20:.0f} MiB"


def print_table(payload: dict, console: Console | None = None) -> None:
    """One table per model and device count: rank, batch, memory, time, throughput, price."""
    console = console or Console()
    units = {m["name"]: m["sample_unit"] for m in payload["models"]}
    by: dict[tuple[str, int], list[dict]] = {}
    for r in payload["rows"]:
        by.setdefault((r["model"], r["devices"]), []).append(r)
    for (model, devices), grp in by.items():
        t = Table(title=f"{model} x {devices} device{'s' if devices > 1 else ''} — {payload['precision']}, "
                        f"objective {payload['objective']}, baseline {payload['baseline']}", header_style="bold")
        for col, just in (("rank", "right"), ("accelerator", "left"), ("batch", "right"), ("on-chip", "right"),
                          ("off-chip", "right"), ("iter ms", "right"), (f"{units.get(model, 'samples')}/s", "right"),
                          ("chips", "right"), ("x base/chip", "right"), ("USD/h", "right"), ("perf/USD/h", "right"), ("x base", "right"),
                          ("status", "left")):
            t.add_column(col, justify=just, no_wrap=True)
        for r in sorted(grp, key=lambda r: (r.get("rank") is None, r.get("rank") or 0)):
            ok = r.get("status") == "ok"
            mem = r.get("memory") or {}
            status = "[bold green]best[/]" if r.get("rank") == 1 else ("ok" if ok else f"[red]{r.get('status')}[/]")
            t.add_row(
                _fmt(r.get("rank"), "d"),
                r["accelerator"],
                _fmt(r.get("batch_size"), "d"),
                _mem(mem.get("on_chip_bytes")) if ok else "—",
                _mem(mem.get("off_chip_bytes")) if ok else "—",
                _fmt(r["iteration_s"] * 1e3 if ok else None, ".1f"),
                _fmt(r.get("samples_per_s") if ok else None, ".1f"),
                _fmt(r.get("chips") if ok else None, "d"),
                _fmt(r.get("normalised_throughput"), ".2f"),
                _fmt(r.get("usd_per_hour"), ".2f"),
                _fmt(r.get("price_performance") if ok else None, ".2f"),
                _fmt(r.get("normalised_price_performance"), ".2f"),
                status,
            )
        console.print(t)
        for r in grp:
            if r.get("status") != "ok":
                console.print(f"  {r['accelerator']}: {r.get('status')} — {r.get('reason', '')}", highlight=False)


# ----------------------------------------------------------------------------- HTML
def _svg_chart(payload: dict, devices: int) -> str:
    """Fig. 7-style grouped bars (models x accelerators), normalised to the baseline, as inline SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m["name"] for m in payload["models"]]
    accels = [a["key"] for a in payload["accelerators"]]
    rows = {(r["model"], r["accelerator"]): r for r in payload["rows"] if r["devices"] == devices}
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), dpi=100)
    width = 0.8 / max(len(accels), 1)
    colors = plt.get_cmap("tab10").colors
    for ax, key, title in ((axes[0], "normalised_throughput", "(a) throughput per chip"),
                           (axes[1], "normalised_price_performance", "(b) price-performance")):
        for j, a in enumerate(accels):
            xs, ys, labels = [], [], []
            for i, m in enumerate(models):
                r = rows.get((m, a), {})
                v = r.get(key)
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(v if v is not None else 0.0)
                labels.append("" if v is not None else ("OOM" if r.get("status") == "infeasible" else "n/a"))
            ax.bar(xs, ys, width, label=a, color=colors[j % len(colors)])
            for x, lab in zip(xs, labels, strict=True):
                if lab:
                    ax.text(x, 0.02, lab, rotation=90, ha="center", va="bottom", fontsize=7, color="#a00")
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(range(len(models)), models, fontsize=9)
        ax.set_ylabel(f"normalised to {payload['baseline']}")
        ax.set_title(f"{title}, {devices} device{'s' if devices > 1 else ''}", fontsize=10)
    axes[1].legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]  # drop the XML prolog: the SVG sits inline in HTML


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1280px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin-bottom:6px}
table{border-collapse:collapse;font-size:13px;margin:8px 0 16px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#f4f4f4}
td.l,th.l{text-align:left} tr.best td{background:#eaf7ea;font-weight:600} tr.bad td{color:#a00}
.meta{color:#555;font-size:13px} .methods li{margin:3px 0;font-size:13px} svg{max-width:100%;height:auto}
"""


def render_html(payload: dict) -> str:
    """The self-contained report page."""
    e = html.escape
    devs = sorted({r["devices"] for r in payload["rows"]})
    units = {m["name"]: m for m in payload["models"]}
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>Accelerator selection report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Accelerator selection</h1>",
        f"<p class='meta'>objective <b>{e(payload['objective'])}</b> · baseline <b>{e(payload['baseline'])}</b> · "
        f"precision {e(payload['precision'])} · optimizer {e(payload['optimizer'])} · batch policy "
        f"{e(payload['batch_policy'])} · gradient accumulation {payload['gradient_accumulation']} · usable memory "
        f"{100 * payload['memory_fraction']:.0f}% · generated {e(payload['generated'])}</p>",
    ]
    best_lines = []
    for model, by_dev in payload["best"].items():
        for d, acc in by_dev.items():
            best_lines.append(f"<li><b>{e(model)}</b> on {d} device(s): <b>{e(acc or 'none fits')}</b></li>")
    parts.append("<h2>Recommendation</h2><ul>" + "".join(best_lines) + "</ul>")
    for d in devs:
        parts.append(f"<h2>Normalised to {e(payload['baseline'])} — {d} device{'s' if d > 1 else ''}</h2>")
        parts.append(_svg_chart(payload, d))
    for m in payload["models"]:
        name = m["name"]
        parts.append(f"<h2>{e(name)}</h2><p class='meta'>{e(m['description'])} · "
                     f"{m['n_params'] / 1e6:.1f}M parameters</p>")
        for d in devs:
            grp = [r for r in payload["rows"] if r["model"] == name and r["devices"] == d]
            grp.sort(key=lambda r: (r.get("rank") is None, r.get("rank") or 0))
            unit = units[name]["sample_unit"]
            parts.append(f"<h3>{d} device{'s' if d > 1 else ''}</h3><table><tr><th>rank</th><th class='l'>accelerator"
                         "</th><th>batch/device</th><th>on-chip</th><th>off-chip</th><th>iteration ms</th>"
                         f"<th>{e(unit)}/s</th><th>chips</th><th>× base per chip</th><th>USD/h</th><th>{e(unit)}/s per USD/h</th><th>× base</th>"
                         "<th class='l'>computation method</th><th class='l'>status</th></tr>")
            for r in grp:
                ok = r.get("status") == "ok"
                mem = r.get("memory") or {}
                cls = "best" if r.get("rank") == 1 else ("" if ok else "bad")
                method = (r.get("timing_source") or "") if ok else ""
                parts.append(
                    f"<tr class='{cls}'><td>{_fmt(r.get('rank'), 'd')}</td><td class='l'>{e(r['accelerator'])}</td>"
                    f"<td>{_fmt(r.get('batch_size'), 'd')}</td><td>{_mem(mem.get('on_chip_bytes')) if ok else '—'}</td>"
                    f"<td>{_mem(mem.get('off_chip_bytes')) if ok else '—'}</td>"
                    f"<td>{_fmt(r['iteration_s'] * 1e3 if ok else None, '.1f')}</td>"
                    f"<td>{_fmt(r.get('samples_per_s') if ok else None, '.1f')}</td>"
                    f"<td>{_fmt(r.get('chips') if ok else None, 'd')}</td>"
                    f"<td>{_fmt(r.get('normalised_throughput'), '.2f')}</td><td>{_fmt(r.get('usd_per_hour'), '.2f')}</td>"
                    f"<td>{_fmt(r.get('price_performance') if ok else None, '.2f')}</td>"
                    f"<td>{_fmt(r.get('normalised_price_performance'), '.2f')}</td><td class='l'>{e(method)}</td>"
                    f"<td class='l'>{e(r.get('status', ''))}{(': ' + e(r.get('reason', ''))) if not ok else ''}</td></tr>")
            parts.append("</table>")
            parts.append(_memory_table(grp))
    parts.append(_methods_section(payload))
    st = payload["study"]
    parts.append(f"<p class='meta'>Optuna study <code>{e(st['name'])}</code> in <code>{e(st['storage'])}</code>: "
                 f"{st['evaluated']} evaluations now, {st['reused_from_study']} reused.</p></body></html>")
    return "\n".join(parts)


def _memory_table(grp: list[dict]) -> str:
    cats = ("input_output", "weights", "gradients", "algorithm", "ephemeral")
    rows = [r for r in grp if r.get("status") == "ok"]
    if not rows:
        return ""
    head = "".join(f"<th>{c.replace('_', '/')}</th>" for c in cats)
    out = ["<table><tr><th class='l'>memory at the peak (chosen batch)</th><th class='l'>policy</th>" + head +
           "<th>on-chip / capacity</th><th>off-chip / capacity</th></tr>"]
    for r in rows:
        m = r["memory"]
        cells = "".join(f"<td>{_mem(m['by_category_bytes'].get(c))}</td>" for c in cats)
        out.append(f"<tr><td class='l'>{html.escape(r['accelerator'])}</td><td class='l'>{html.escape(m['policy'])}</td>"
                   f"{cells}<td>{_mem(m['on_chip_bytes'])} / {_mem(m['on_chip_capacity_bytes'])}</td>"
                   f"<td>{_mem(m['off_chip_bytes'])} / {_mem(m['off_chip_capacity_bytes'])}</td></tr>")
    out.append("</table>")
    return "".join(out)


def _methods_section(payload: dict) -> str:
    ok = [r for r in payload["rows"] if r.get("status") == "ok"]
    methods: dict[str, set[str]] = {}
    for r in ok:
        for k, v in (r.get("methods") or {}).items():
            methods.setdefault(k, set()).add(v)
    items = "".join(f"<li><b>{html.escape(k.replace('_', ' '))}</b>: {html.escape(' | '.join(sorted(v)))}</li>"
                    for k, v in methods.items())
    return ("<h2>How each number was produced</h2><ul class='methods'>" + items +
            "<li><b>throughput</b>: samples per iteration (batch x devices x gradient accumulation) / predicted "
            "iteration time; <b>× base</b> divides one chip's share (throughput / (devices × pipeline stages)) by one "
            "baseline device's</li><li><b>price-performance</b>: throughput / (chips x catalog price per "
            "device-hour), as Centimani §6.2.1 defines it</li></ul>")


def write_outputs(payload: dict, out: Path) -> None:
    """``report.html`` first, ``results.json`` last (atomic)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.html", render_html(payload))
    atomic_write_text(out / "results.json", json.dumps(finite(payload), indent=1, default=json_default))



