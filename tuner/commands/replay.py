"""``tuner replay PATH``: rebuild a captured run's execution graph, simulate it, compare.

PATH is a Kineto trace (``.json``/``.json.gz``), or a folder / ``.tar.gz`` of per-rank traces,
optionally with their execution traces (found next to them, or given with ``--et``). Prints
per ProfilerStep the measured and simulated time and the kernel-sum baseline, the Lumos breakdown (exposed
compute / exposed communication / overlap / idle) of both, and the critical path's top contributors;
writes into ``--out`` the simulated timeline (beside the measured one) as a Chrome/Perfetto trace, the
simulated timeline in the Kineto schema (``simulated.kineto.json.gz``, one file per rank under
``simulated_kineto/`` for several ranks), a GPU-utilisation PNG (measured vs simulated, Lumos Fig. 6; none
without a GPU) and ``replay.json`` (last, atomically). ``--json`` prints that summary on stdout and nothing else.
In a trace of some ranks of a job, ``--collectives modelled`` (default) gives each collective its modelled
transfer and reports the rest of its measured time per step as the peer wait; ``measured`` keeps it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from predictor.files import atomic_write_text
from tuner.commands.common import err_console, fail


def _plot_utilization(df, path: Path, title: str) -> Path:
    """Lumos Fig. 6 style: GPU compute-stream utilisation per bin, measured vs simulated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.2), dpi=110)
    t_ms = df["time_s"].to_numpy() * 1e3
    ax.step(t_ms, df["measured"].to_numpy() * 100, where="post", label="measured", lw=1.2)
    ax.step(t_ms, df["predicted"].to_numpy() * 100, where="post", label="simulated", lw=1.0, ls="--")
    width_ms = (t_ms[1] - t_ms[0]) if t_ms.size > 1 else 1.0
    ax.set_xlabel(f"time since first step start (ms), {width_ms:g} ms bins")
    ax.set_ylabel("GPU compute busy (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path


def _print_report(summary: dict, out: Path | None) -> None:
    from rich.table import Table

    from tuner.commands.common import console

    t = Table(title=f"Replay of {summary['source']} ({summary['ranks']} rank(s) of {summary['world_size']})")
    coll = summary.get("collectives") or {}
    waits = bool(coll.get("priced"))
    cols = ["rank", "step", "measured ms", "simulated ms", "error %", "kernel sum ms", "error %"]
    for col in cols + (["peer wait ms"] if waits else []):
        t.add_column(col, justify="right" if col != "step" else "left")
    for s in summary["steps"]:
        t.add_row(str(s["rank"]), s["name"], f"{s['measured_s'] * 1e3:.3f}", f"{s['predicted_s'] * 1e3:.3f}",
                  f"{s['error_pct']:+.2f}", f"{s['kernel_sum_s'] * 1e3:.3f}", f"{s['kernel_sum_error_pct']:+.1f}",
                  *([f"{s['peer_wait_s'] * 1e3:.3f}"] if waits else []))
    console.print(t)
    if waits:
        console.print(
            f"collectives without their peers' traces ({coll['priced']}): {coll['mode']} durations; measured "
            f"{coll['measured_s'] * 1e3:.3f} ms, modelled transfer on {coll['platform']} {coll['priced_s'] * 1e3:.3f} ms, "
            f"peer wait {coll['peer_wait_s'] * 1e3:.3f} ms", highlight=False)
    console.print(
        f"iteration: measured {summary['measured_iteration_s'] * 1e3:.3f} ms, simulated "
        f"{summary['predicted_iteration_s'] * 1e3:.3f} ms; mean |error| {summary['mean_abs_error_pct']:.2f} %, "
        f"max {summary['max_abs_error_pct']:.2f} % (kernel-sum baseline: mean "
        f"{summary['kernel_sum_mean_abs_error_pct']:.1f} %)", highlight=False)
    b = Table(title="Breakdown over the replayed steps (slowest rank)")
    for col in ("", "exposed compute ms", "exposed comm ms", "overlap ms", "idle ms", "total ms"):
        b.add_column(col, justify="right")
    for label, key in (("measured", "breakdown_measured"), ("simulated", "breakdown")):
        d = summary[key]
        b.add_row(label, *(f"{d[k] * 1e3:.3f}" for k in ("exposed_compute_s", "exposed_communication_s",
                                                          "overlap_s", "idle_s", "total_s")))
    console.print(b)
    c = Table(title="Critical path: top contributors (simulated)")
    for col in ("name", "category", "ms", "share %"):
        c.add_column(col, justify="left" if col in ("name", "category") else "right")
    for r in summary["critical_path"]:
        c.add_row(r["name"][:70], r["category"], f"{r['time_s'] * 1e3:.3f}", f"{r['share'] * 100:.1f}")
    console.print(c)
    for note in summary["notes"]:
        console.print(f"note: {note}", highlight=False, style="dim")
    if out is not None:
        for label, p in summary.get("outputs", {}).items():
            console.print(f"{label}: {p}", highlight=False)


def replay(
    path: Annotated[Path, typer.Argument(help="Kineto trace (.json/.json.gz), or folder/.tar.gz of per-rank traces")],
    json_out: Annotated[bool, typer.Option("--json", help="print the summary as JSON on stdout (nothing else)")] = False,
    out: Annotated[Path, typer.Option("--out", help="folder for the simulated traces, PNG and replay.json")] = Path(
        "out/replay"),
    et: Annotated[Path | None, typer.Option("--et", help="execution trace(s): file, folder or .tar.gz")] = None,
    no_et: Annotated[bool, typer.Option("--no-et", help="ignore execution traces")] = False,
    top: Annotated[int, typer.Option("--top", help="critical-path contributors to list")] = 10,
    collectives: Annotated[str, typer.Option(
        "--collectives", help="in a trace of some ranks only, collectives last their modelled transfer (modelled) "
        "or their measured time, waiting for the absent peers included (measured)")] = "modelled",
) -> None:
    """Replay a captured run: measured vs simulated time per ProfilerStep, breakdown, critical path."""
    from predictor.graph import GraphError
    from predictor.simulate.kineto_export import write_kineto
    from predictor.simulate.replay import replay as run_replay
    from predictor.sources.traces.collectives import COLLECTIVE_MODES
    from predictor.sources.traces.errors import TraceError

    if out.exists() and not out.is_dir():
        fail(f"--out {out}: exists and is not a folder")
    if top < 0:
        fail("--top must be >= 0")
    if collectives not in COLLECTIVE_MODES:
        fail(f"--collectives {collectives!r}: expected one of {', '.join(COLLECTIVE_MODES)}")
    try:
        result = run_replay(path, et, use_et=not no_et, collectives=collectives)
        summary = result.summary(top=top)
    except TraceError as exc:
        fail(str(exc))
    except GraphError as exc:
        fail(f"{path}: the trace's dependencies cannot be simulated ({exc})")
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        if os.environ.get("TUNER_DEBUG"):
            raise
        fail(f"{path}: cannot replay this trace ({type(exc).__name__}: {exc})")
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json").unlink(missing_ok=True)  # a stale summary must not look like this run's
    trace_file = result.write_trace(out / "replay_trace.json")
    kineto = write_kineto(result, out)
    summary["outputs"] = {"simulated trace": str(trace_file),
                          "simulated Kineto trace": str(kineto[0] if len(kineto) == 1 else kineto[0].parent)}
    png = out / "gpu_utilization.png"
    png.unlink(missing_ok=True)  # a stale chart must not look like this run's
    if result.graph.graph.is_gpu().any():
        _plot_utilization(result.utilization(), png,
                          f"{Path(path).name}: GPU compute-stream utilisation, measured vs simulated")
        summary["outputs"]["utilisation plot"] = str(png)
    else:
        summary["notes"].append("no GPU in this trace: no GPU utilisation chart; the breakdown's compute is the "
                                "host ops")
    summary["outputs"]["summary"] = str(out / "replay.json")
    text = json.dumps(summary, indent=1)
    atomic_write_text(out / "replay.json", text)
    if json_out:
        sys.stdout.write(text + "\n")
    else:
        _print_report(summary, out)
        err_console.print(f"wrote {out}", highlight=False, style="dim")
