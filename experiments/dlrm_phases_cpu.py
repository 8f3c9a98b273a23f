"""Where a DLRM step's predicted time goes wrong: measured vs simulated time per phase, per rank.

Diagnosis for issue 4's end-to-end DLRM rows. The real program of ``experiments/e2e_cpu.py``
(:mod:`experiments.dlrm_gloo`, the same tables, sharding and batches) runs with phase marks
(``DLRMJobSpec.phases``: a wall-clock reading at each boundary of :data:`~experiments.dlrm_gloo.PHASES`,
no profiler, so nothing slows the step), and the simulated timeline of the same host-mode graph is
cut at the same boundaries. Each phase's measured time is the median over timed iterations; a
phase that waits for the other rank (the all-to-alls, DDP's tail) carries that rank's lateness.

    flock /tmp/tuner-measure.lock python experiments/dlrm_phases_cpu.py --platform cpu-local \
        refit:benchmarks/results/data/packs/cpu-emb-nb18 refit:benchmarks/results/data/packs/cpu-emb-old18

(``--platform`` takes the pack specs of ``experiments/e2e_windows.py``: a pack, ``refit:DIR`` for a stored
pack's benchmark data fitted on the fly) writes ``experiments/results/dlrm_phases_cpu.md`` and ``.json`` (about 1 minute).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import write_results  # noqa: E402
from experiments.dlrm_gloo import PHASES, measure_dlrm, phase_durations  # noqa: E402
from experiments.e2e_cpu import dlrm_job, dlrm_spec_for, dlrm_tables  # noqa: E402
from experiments.e2e_windows import resolve_spec  # noqa: E402
from predictor.graph import ExecutionGraph  # noqa: E402
from predictor.metrics import geomean_abs_pct_error  # noqa: E402
from predictor.simulate import Timeline, simulate  # noqa: E402
from predictor.sources.synth.dlrm import build_dlrm_graph  # noqa: E402
from predictor.timing.platforms.host import comm_thread_has_core  # noqa: E402


def simulated_phases(tl: Timeline, rank: int) -> dict[str, float]:
    """Seconds of each phase of ``rank`` in the simulated timeline, cut at the tasks that end the
    phases in the real program (see :data:`~experiments.dlrm_gloo.PHASES`)."""
    g: ExecutionGraph = tl.graph
    f = g.tasks_frame()
    f = f.assign(start=tl.start, end=tl.end)
    f = f[f["rank"] == rank]
    kind = f["kind"].to_numpy()

    def last_end(mask) -> float | None:
        return float(f["end"][mask].max()) if np.any(mask) else None

    def first_start(mask) -> float | None:
        return float(f["start"][mask].min()) if np.any(mask) else None

    names = f["name"].to_numpy()
    emb_b = kind == "embedding_bag_bwd"
    ends = {
        "emb_fwd": last_end(kind == "embedding_bag_fwd"),
        "a2a_fwd": last_end(names == "all_to_all_fwd"),
        "dense_fwd": last_end(names == "bce_loss"),
        "dense_bwd": first_start(names == "all_to_all_bwd") or first_start(emb_b),
        "a2a_bwd": last_end(names == "all_to_all_bwd"),
        "emb_bwd": last_end(emb_b),
        # one rank: no DDP, backward() ends with the last table's backward
        "ddp_tail": last_end(np.char.startswith(names.astype(str), "copy_bucket_to_grad")) or last_end(emb_b),
        "optimizer": float(f["end"].max()),
    }
    return phase_durations(ends, 0.0)


def table_seconds(marks: list[tuple[str, float]], local: np.ndarray) -> dict[str, dict[int, float]]:
    """Seconds of each local table's embedding-bag forward and backward (+ SGD row update) in one
    iteration's marks: forwards run in table order, each ending at an ``emb_fwd_table`` mark;
    backwards in reverse order, each ending at an ``emb_bwd`` mark and starting at the later of the
    previous table's end and the last ``emb_grad`` mark (its input's gradient arriving) before it."""
    fwd_ends = [t for label, t in marks if label == "emb_fwd_table"]
    start = next(t for label, t in marks if label == "start")
    fwd = dict(zip((int(t) for t in local), np.diff([start, *fwd_ends]), strict=True))
    bwd: dict[int, float] = {}
    prev, grad_at, order = None, None, iter(int(t) for t in local[::-1])
    for label, t in marks:
        if label == "emb_grad":
            grad_at = t
        elif label == "emb_bwd":
            begin = max(x for x in (prev, grad_at) if x is not None)
            bwd[next(order)] = t - begin
            prev = t
    return {"fwd": fwd, "bwd": bwd}


def allreduce_seconds(marks: list[tuple[str, float]]) -> list[tuple[float, float]]:
    """(issued, done) seconds after the iteration's start of each DDP bucket all-reduce in one
    iteration's marks (``ar_issue`` / ``ar_done`` of :func:`~experiments.dlrm_gloo._timed_allreduce_hook`),
    in issue order; the k-th completion is paired with the k-th issue (gloo's queue is FIFO)."""
    start = next(t for label, t in marks if label == "start")
    issued = [t - start for label, t in marks if label == "ar_issue"]
    done = sorted(t - start for label, t in marks if label == "ar_done")
    return list(zip(issued, done, strict=False))


def collective_seconds(marks: list[list[tuple[str, float]]], starts: list[float], begin: str, end: str,
                       nth: int = 0) -> tuple[float, float] | None:
    """(seconds from the last rank's arrival to the collective's end, arrival skew in seconds) of the
    ``nth`` collective that starts at mark ``begin`` and ends at mark ``end`` in one iteration, from
    every rank's marks (``marks[r]``, seconds after ``starts[r]``, all on one host clock); None when
    a rank lacks the marks. The end is the last rank's (the collective ends together on all ranks,
    up to the wake-up of each rank's waiting thread)."""
    arrive, done = [], []
    for mk, t0 in zip(marks, starts, strict=True):
        b = [t for label, t in mk if label == begin]
        e = sorted(t for label, t in mk if label == end)
        if len(b) <= nth or len(e) <= nth:
            return None
        arrive.append(t0 + b[nth])
        done.append(t0 + e[nth])
    return max(done) - max(arrive), max(arrive) - min(arrive)


def simulated_allreduces(tl: Timeline, rank: int) -> list[tuple[float, float]]:
    """(start, end) seconds of ``rank``'s DDP all-reduce tasks in the simulated timeline, bucket order."""
    f = tl.graph.tasks_frame().assign(start=tl.start, end=tl.end)
    f = f[(f["rank"] == rank) & f["name"].astype(str).str.startswith("ddp.all_reduce[")]
    f = f.assign(bucket=f["name"].str.extract(r"\[(\d+)\]", expand=False).astype(int)).sort_values("bucket")
    return list(zip(f["start"].astype(float), f["end"].astype(float), strict=True))


def collective_rows(frame: pd.DataFrame, tl: Timeline, meas: dict, batch: int, n: int) -> list[dict]:
    """One row per collective of rank 0 in ``frame`` (the graph's tasks): its time in situ from the last
    rank's arrival (:func:`collective_seconds` over ``meas``, a :func:`measure_dlrm` result with ``starts``),
    median and p90, the arrival skew, and its duration in ``tl`` (ms)."""
    if not meas.get("starts") or not all(meas["starts"]):
        return []
    f = frame.assign(dur=tl.duration)
    f = f[f["rank"] == 0]
    probes = [("all_to_all_fwd", "a2a_fwd_start", "a2a_fwd", 0), ("all_to_all_bwd", "a2a_bwd_start", "a2a_bwd_end", 0)]
    probes += [(f"ddp.all_reduce[{bi}]", "ar_issue", "ar_done", bi)
               for bi in range(int(f["name"].astype(str).str.startswith("ddp.all_reduce[").sum()))]
    rows = []
    for task, begin, end, nth in probes:
        got = [collective_seconds([meas["marks"][r][i] for r in range(n)], [meas["starts"][r][i] for r in range(n)],
                                  begin, end, nth)
               for i in range(len(meas["starts"][0]))]
        got = np.array([g for g in got if g is not None]).reshape(-1, 2)
        sel = f[f["name"] == task]
        if not len(got) or sel.empty:
            continue
        rows.append({"batch": batch, "ranks": n, "collective": task,
                     "msg_bytes": float(sel["msg_bytes"].iloc[0]) if "msg_bytes" in sel else np.nan,
                     "insitu_ms": float(np.median(got[:, 0])) * 1e3,
                     "insitu_p90_ms": float(np.quantile(got[:, 0], 0.9)) * 1e3,
                     "skew_ms": float(np.median(got[:, 1])) * 1e3,
                     "calibrated_ms": float(sel["dur"].iloc[0]) * 1e3})
    return rows


def allreduce_rows(tl: Timeline, meas: dict, batch: int, n: int) -> list[dict]:
    """One row per rank and DDP bucket: its all-reduce's issue, completion and duration in situ
    (:func:`allreduce_seconds`, medians and p90 over the timed iterations) and in ``tl`` (ms)."""
    rows = []
    for r in range(n):
        insitu = [allreduce_seconds(mk) for mk in meas["marks"][r]]
        for bi, (s0, s1) in enumerate(simulated_allreduces(tl, r)):
            got = np.array([x[bi] for x in insitu if len(x) > bi]).reshape(-1, 2)
            if not len(got):
                continue
            rows.append({"batch": batch, "ranks": n, "rank": r, "bucket": bi,
                         "issued_ms": float(np.median(got[:, 0])) * 1e3, "done_ms": float(np.median(got[:, 1])) * 1e3,
                         "insitu_ms": float(np.median(got[:, 1] - got[:, 0])) * 1e3,
                         "insitu_p90_ms": float(np.quantile(got[:, 1] - got[:, 0], 0.9)) * 1e3,
                         "sim_start_ms": s0 * 1e3, "sim_end_ms": s1 * 1e3, "sim_ms": (s1 - s0) * 1e3})
    return rows


def run(platforms: list[str], batches: list[int], ranks: list[int], iters: int,
        log=print, pin: bool = False,
        batch_pool: int = 2) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(phases, tables, all-reduces, collectives): per phase and rank, measured and simulated (with ``platforms[0]``)
    seconds in ms; per table and rank, its forward / backward in situ and each platform's prediction
    (ms); per DDP bucket and rank (several ranks), its all-reduce's issue and completion in situ and
    in the simulated timeline (ms after the iteration's start); per collective of the step (several
    ranks), its in-situ time from the last rank's arrival and its calibrated duration (ms). ``pin``: each rank on
    its own CPU (:attr:`~experiments.dlrm_gloo.DLRMJobSpec.pin`); ``batch_pool``: index batches cycled
    (:attr:`~experiments.dlrm_gloo.DLRMJobSpec.batch_pool`; 2 as every earlier run, 8 for fresh rows)."""
    with tempfile.TemporaryDirectory(prefix="dlrm-phases-") as work:  # refit: specs are fitted here first
        timings = {p: resolve_spec(p, Path(work))[0] for p in platforms}
    rows, per_table, reduces, colls = [], [], [], []
    for bs in batches:
        for n in ranks:
            tables = dlrm_tables(bs)
            job = replace(dlrm_job(tables, bs, n, 1, 3, iters, batch_pool), phases=True, pin=pin)
            graph = build_dlrm_graph(dlrm_spec_for(job, tables), np.asarray(job.assignment), n, mode="host",
                                     comm_threads=comm_thread_has_core(n, 1))
            timelines = {p: simulate(graph, t) for p, t in timings.items()}
            tl = timelines[platforms[0]]
            frame = graph.tasks_frame()
            names = frame["name"]
            durations = {p: pd.Series(x.duration, index=names) for p, x in timelines.items()}
            meas = measure_dlrm(job)
            assignment = np.asarray(job.assignment)
            for r in range(n):
                local = np.flatnonzero(assignment == r)
                insitu = [table_seconds(mk, local) for mk in meas["marks"][r]]
                for ti in local:
                    row = {"batch": bs, "ranks": n, "rank": r, "table": int(ti), "rows": int(tables.rows[ti]),
                           "dim": int(tables.dim[ti]), "pooling": float(tables.pooling[ti])}
                    for kind in ("fwd", "bwd"):
                        row[f"{kind}_insitu_ms"] = float(np.median([x[kind][int(ti)] for x in insitu])) * 1e3
                        for p, d in durations.items():
                            row[f"{kind}_{p}_ms"] = float(d[f"embedding_bag_{kind}[{ti}]"].sum()) * 1e3
                    per_table.append(row)
            if n > 1:
                colls += collective_rows(frame, tl, meas, bs, n)
                reduces += allreduce_rows(tl, meas, bs, n)
            for r in range(n):
                ph = pd.DataFrame(meas["phases"][r])
                s = simulated_phases(tl, r)
                for p in PHASES:
                    if p in s or p in ph:
                        col = ph[p] if p in ph else pd.Series([np.nan])
                        rows.append({"batch": bs, "ranks": n, "rank": r, "phase": p,
                                     "measured_ms": float(col.mean()) * 1e3, "median_ms": float(col.median()) * 1e3,
                                     "p90_ms": float(col.quantile(0.9)) * 1e3,
                                     "simulated_ms": float(s.get(p, np.nan)) * 1e3})
                it = np.asarray(meas["times"][r])
                rows.append({"batch": bs, "ranks": n, "rank": r, "phase": "iteration",
                             "measured_ms": float(it.mean()) * 1e3, "median_ms": float(np.median(it)) * 1e3,
                             "p90_ms": float(np.quantile(it, 0.9)) * 1e3,
                             "simulated_ms": float(tl.per_rank_s[r]) * 1e3})
                log(f"batch {bs} ranks {n} rank {r}: measured {np.median(meas['times'][r]) * 1e3:.2f} ms, "
                    f"simulated {tl.per_rank_s[r] * 1e3:.2f} ms")
    return pd.DataFrame(rows), pd.DataFrame(per_table), pd.DataFrame(reduces), pd.DataFrame(colls)


def collectives_markdown(co: pd.DataFrame, platform: str) -> list[str]:
    """Each collective of the step in situ (from the last rank's arrival) against its calibrated time."""
    if co.empty:
        return []
    lines = ["## Collectives in situ vs calibrated", "",
             "In situ: from the last rank's arrival at the collective to its end (marks on one host clock; the "
             "all-to-all of gradients and the all-reduces include waiting in gloo's queue behind earlier "
             "collectives), median and p90 over the timed iterations; skew: the median gap between the ranks' "
             f"arrivals; calibrated: the task's duration from `{platform}` (the piecewise model of the "
             "calibration's batched back-to-back calls).", "",
             "| batch | collective | msg bytes | in situ ms (p90) | skew ms | calibrated ms | in situ / calibrated |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for x in co.itertuples():
        lines.append(f"| {x.batch} | {x.collective} | {x.msg_bytes:,.0f} | {x.insitu_ms:.2f} ({x.insitu_p90_ms:.2f}) | "
                     f"{x.skew_ms:.2f} | {x.calibrated_ms:.2f} | {x.insitu_ms / max(x.calibrated_ms, 1e-9):.2f} |")
    lines.append("")
    return lines


def allreduce_markdown(ar: pd.DataFrame) -> list[str]:
    """The DDP bucket all-reduces in situ against the simulated timeline, per batch, rank and bucket."""
    if ar.empty:
        return []
    lines = ["## DDP all-reduces in situ vs simulated", "",
             "In situ: DDP's default all-reduce wrapped in a comm hook that marks when each bucket's all-reduce is "
             "issued (main thread) and when it completes (gloo's thread), median over the timed iterations, ms after "
             "the iteration's start; simulated: the same bucket's `ddp.all_reduce` task.", "",
             "| batch | rank | bucket | issued ms | done ms | in situ ms (p90) | simulated start ms | end ms | "
             "simulated ms | in situ / simulated |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in ar.itertuples():
        lines.append(f"| {x.batch} | {x.rank} | {x.bucket} | {x.issued_ms:.2f} | {x.done_ms:.2f} | "
                     f"{x.insitu_ms:.2f} ({x.insitu_p90_ms:.2f}) | {x.sim_start_ms:.2f} | {x.sim_end_ms:.2f} | "
                     f"{x.sim_ms:.2f} | {x.insitu_ms / max(x.sim_ms, 1e-9):.2f} |")
    lines.append("")
    return lines


def markdown(df: pd.DataFrame, platform: str, command: str) -> str:
    lines = ["# DLRM step phases: measured vs simulated", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, this 2-core VM, 1 torch thread per rank; prediction: "
             f"`{platform}`. Reproduce: `{command}`", "",
             "Measured: the real program (`experiments/dlrm_gloo.py`, the e2e rows' tables and sharding) with a wall "
             "clock read at each phase boundary; `mean` over the timed iterations (the phases' means add up to the "
             "iteration's), `median` and `p90` beside it; simulated: the host-mode graph's timeline cut at the same "
             "boundaries. A phase that ends in a collective (`a2a_*`, `ddp_tail`) includes the wait for the other "
             "rank. `delta` = measured mean - simulated. The e2e rows score the median iteration.", ""]
    for (bs, n), part in df.groupby(["batch", "ranks"], sort=False):
        cols = sorted(part["rank"].unique())
        head = "| phase | " + " | ".join(f"rank {r}: mean ms | median | p90 | simulated ms | delta ms"
                                         for r in cols) + " |"
        lines += [f"## batch {bs}, {n} rank(s)", "", head, "|---|" + "---:|---:|---:|---:|---:|" * len(cols)]
        for phase, rows in part.groupby("phase", sort=False):
            cells = []
            for r in cols:
                x = rows[rows["rank"] == r]
                if x.empty:
                    cells += [""] * 5
                    continue
                m, s = float(x.measured_ms.iloc[0]), float(x.simulated_ms.iloc[0])
                cells += [f"{m:.2f}", f"{float(x.median_ms.iloc[0]):.2f}", f"{float(x.p90_ms.iloc[0]):.2f}",
                          f"{s:.2f}", f"{m - s:+.2f}"]
            lines.append(f"| {phase} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def tables_markdown(tab: pd.DataFrame, platforms: list[str]) -> list[str]:
    """Per configuration and kernel: the tables' summed time in situ and as each platform predicts it,
    the GMAE over tables, and the median in situ / predicted of light (pooling <= 2) and other tables."""
    lines = ["## Per table: embedding-bag kernels in situ vs predicted", "",
             "In situ: each table's forward (between consecutive lookups) and backward + SGD row update (from its "
             "input gradient's arrival to its update hook), median over the timed iterations; predicted: the "
             "platform's duration of that table's task in the same graph (host contention applied).", "",
             "| batch | ranks | kernel | in situ ms (sum) | " + " | ".join(
                 f"`{Path(p).name}` ms (sum) | GMAE % | light x | others x" for p in platforms) + " |",
             "|---:|---:|---|---:|" + "---:|---:|---:|---:|" * len(platforms)]
    light = tab["pooling"] <= 2.0
    for (bs, n), part in tab.groupby(["batch", "ranks"], sort=False):
        lt = light[part.index]
        for kind in ("fwd", "bwd"):
            ins = part[f"{kind}_insitu_ms"]
            cells = [f"{ins.sum():.2f}"]
            for p in platforms:
                pred = part[f"{kind}_{p}_ms"]
                ratio = ins / pred
                cells += [f"{pred.sum():.2f}", f"{geomean_abs_pct_error(pred.to_numpy(), ins.to_numpy()):.1f}",
                          f"{ratio[lt].median():.2f}", f"{ratio[~lt].median():.2f}"]
            lines.append(f"| {bs} | {n} | {kind} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", nargs="+", default=["cpu-local"],
                    help="pack specs to predict with, as experiments/e2e_windows.py takes them (refit:DIR fits a "
                         "stored pack's data first); the phase tables use the first, every one gets per-table figures")
    ap.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--pin", action="store_true",
                    help="diagnosis: pin each rank (and its gloo threads) to its own CPU (DLRMJobSpec.pin)")
    ap.add_argument("--batch-pool", type=int, default=2,
                    help="index batches the DLRM cycles (e2e_cpu.py --batch-pool; 8 = fresh rows each iteration)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "dlrm_phases_cpu.md"))
    a = ap.parse_args()
    if a.batch_pool < 1:
        ap.error("--batch-pool must be >= 1")
    df, tab, ar, co = run(a.platform, a.batches, a.ranks, a.iters, pin=a.pin, batch_pool=a.batch_pool)
    command = "flock /tmp/tuner-measure.lock python experiments/dlrm_phases_cpu.py " + " ".join(sys.argv[1:])
    write_results(Path(a.out), {"phases": df.to_dict(orient="records"), "tables": tab.to_dict(orient="records"),
                                "all_reduces": ar.to_dict(orient="records"),
                                "collectives": co.to_dict(orient="records")},
                  markdown(df, a.platform[0], command) + "\n".join(tables_markdown(tab, a.platform)
                                                                   + allreduce_markdown(ar)
                                                                   + collectives_markdown(co, a.platform[0])))


if __name__ == "__main__":
    main()
