"""What-if validation on this CPU: capture one configuration, predict another,
run that one for real, compare.

Workloads (random weights, random data, SGD, one torch thread per process):

* ``mlp`` — 256 -> 512 x (4 hidden Linear+ReLU) -> 10, cross-entropy, batch 64;
* ``gpt`` — a GPT-style decoder built from ``torch.nn`` (token + position embedding,
  pre-LayerNorm blocks with causal ``scaled_dot_product_attention`` and a GELU MLP, tied-free
  LM head), vocab 512, context 64, width 128, 4 heads, 2 layers, batch 8;
* ``dlrm`` — DLRM-style: bottom MLP 13-128-64-32, 8 ``nn.EmbeddingBag`` tables (5000 x 32,
  sum pooling, 20 lookups per sample), dot interaction (``bmm``), top MLP
  68-256 x (3 hidden) -1, BCE-with-logits, batch 128;
* ``ddp`` — the MLP captured in one process, predicted and run as a 2-process gloo
  ``DistributedDataParallel`` job (same per-rank batch).

Changes: batch x2 and x4, layers x2 (MLP hidden layers, GPT blocks, DLRM top-MLP hidden
layers), DP 1 -> 2. Ground truth: the median wall time of real, unprofiled training
iterations at the changed configuration, run in this script right after the capture.
Predictions: ``predictor.whatif.apply.predict_trace`` on the capture (``tuner predict``),
timed with ``predictor.timing.kernels.timing_for("cpu-local")`` (the calibrated asset pack when
one exists for this CPU, else analytic models on the measured platform) in both re-timing
modes (``model``: changed tasks take the kernel model's time; ``anchored``: their measured
time times the model's ratio new/old).

Run (timing-sensitive; ~5-8 minutes on the 2-core VM):

    flock /tmp/tuner-measure.lock nice -n -10 python experiments/whatif_cpu.py

Writes ``experiments/results/whatif_cpu.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform as _platform
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from predictor.metrics import geomean_abs_pct_error, max_abs_pct_error, mean_abs_pct_error  # noqa: E402
from predictor.timing.calibration.collectives import free_port  # noqa: E402
from predictor.whatif.apply import parse_sets, predict_trace  # noqa: E402

THREADS = 1
#: profiled iterations recorded (per-task minimum over them; see predictor.whatif.annotate)
ACTIVE = 5


# ============================================================================ workloads
class MLP(nn.Module):
    def __init__(self, layers: int, d_in: int = 256, hidden: int = 512, d_out: int = 10) -> None:
        super().__init__()
        mods: list[nn.Module] = [nn.Linear(d_in, hidden), nn.ReLU()]
        for _ in range(layers):
            mods += [nn.Linear(hidden, hidden), nn.ReLU()]
        mods.append(nn.Linear(hidden, d_out))
        self.net = nn.Sequential(*mods)

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self, c: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.fc2 = nn.Linear(4 * c, c)
        self.act = nn.GELU()

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fc2(self.act(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers: int, vocab: int = 512, ctx: int = 64, c: int = 128, heads: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(ctx, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.head = nn.Linear(c, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class DLRM(nn.Module):
    def __init__(self, layers: int, tables: int = 8, rows: int = 5000, dim: int = 32, dense: int = 13) -> None:
        super().__init__()
        self.bot = nn.Sequential(nn.Linear(dense, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, dim),
                                 nn.ReLU())
        self.embs = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        n = tables + 1
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        top: list[nn.Module] = [nn.Linear(dim + n * (n - 1) // 2, 256), nn.ReLU()]
        for _ in range(layers):
            top += [nn.Linear(256, 256), nn.ReLU()]
        top.append(nn.Linear(256, 1))
        self.top = nn.Sequential(*top)

    def forward(self, dense, indices, offsets):
        x = self.bot(dense)
        t = torch.stack([x] + [e(indices[i], offsets) for i, e in enumerate(self.embs)], dim=1)
        z = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([x, z], dim=1))


def make(workload: str, batch: int, layers: int, seed: int = 0):
    """(model, step function) of one configuration; data is generated once (no loader cost)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    if workload in ("mlp", "ddp"):
        model = MLP(layers)
        x = torch.randn(batch, 256, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)

        def loss_fn(m):
            return F.cross_entropy(m(x), y)
    elif workload == "gpt":
        model = GPT(layers)
        idx = torch.randint(0, 512, (batch, 64), generator=g)
        tgt = torch.randint(0, 512, (batch, 64), generator=g)

        def loss_fn(m):
            logits = m(idx)
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1))
    elif workload == "dlrm":
        model = DLRM(layers)
        dense = torch.randn(batch, 13, generator=g)
        indices = [torch.randint(0, 5000, (batch * 20,), generator=g) for _ in range(8)]
        offsets = torch.arange(0, batch * 20, 20)
        lbl = torch.rand(batch, 1, generator=g).round()

        def loss_fn(m):
            return F.binary_cross_entropy_with_logits(m(dense, indices, offsets), lbl)
    else:
        raise ValueError(workload)
    return model, loss_fn


def train_steps(model, loss_fn, n: int, on_step=None) -> list[float]:
    """Run ``n`` SGD iterations; wall time of each (seconds)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        loss = loss_fn(model)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(time.perf_counter() - t)
        if on_step is not None:
            on_step()
    return out


def measure_round(workload: str, b0: int, l0: int, configs: list[tuple[str, dict]], iters: int, warm: int,
                  times: dict[str, list[float]]) -> None:
    """One round: every configuration ``warm + iters`` real iterations; append the timed ones."""
    for label, cfg in configs:
        if "dp" in cfg:
            times[label] += measure_ddp(cfg["dp"], b0, l0, iters, warm)["times"]
        else:
            model, loss_fn = make(workload, cfg.get("batch", b0), cfg.get("layers", l0))
            times[label] += train_steps(model, loss_fn, warm + iters)[warm:]


def capture_training(model, loss_fn, folder: Path, after: int) -> None:
    """Capture ``ACTIVE`` SGD iterations of ``model`` into ``folder`` (``after`` more run past the capture)."""
    import tuner

    train_steps(model, loss_fn, 3)  # warm the allocator and caches before the profiler starts
    with tuner.capture(folder, warmup=2, active=ACTIVE) as cap:
        train_steps(model, loss_fn, 2 + ACTIVE + after, on_step=cap.step)


def capture(workload: str, batch: int, layers: int, folder: Path, after: int) -> None:
    model, loss_fn = make(workload, batch, layers)
    capture_training(model, loss_fn, folder, after)


# ---------------------------------------------------------------------------- DDP (2 processes)
def _ddp_worker(rank: int, world: int, port: int, batch: int, layers: int, iters: int, warm: int, out: str) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(THREADS)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, loss_fn = make("ddp", batch, layers)
    ddp = nn.parallel.DistributedDataParallel(model)
    dist.barrier()
    times = train_steps(ddp, lambda m: loss_fn(m), warm + iters)[warm:]
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def measure_ddp(world: int, batch: int, layers: int, iters: int, warm: int, attempts: int = 3) -> dict:
    """Median/min iteration of a ``world``-process gloo DDP run (rank 0's clock); a run whose
    processes fail to rendezvous (a port taken meanwhile) is retried on a new port."""
    import torch.multiprocessing as mp

    for attempt in range(attempts):
        port = free_port()
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "times.json")
            try:
                mp.spawn(_ddp_worker, args=(world, port, batch, layers, iters, warm, out), nprocs=world, join=True)
            except mp.ProcessExitedException:
                if attempt == attempts - 1:
                    raise
                print(f"  (DDP run failed, retrying on another port: attempt {attempt + 2})", flush=True)
                continue
            times = json.loads(Path(out).read_text())
        return {"min_s": float(np.min(times)), "median_s": float(np.median(times)),
                "p90_s": float(np.percentile(times, 90)), "iters": iters, "world": world, "times": times}
    raise RuntimeError("unreachable")


# ============================================================================ the experiment
WORKLOADS = {
    # name: (base batch, base layers, cases [(label, --set items, real config)])
    "mlp": (64, 4, [("batch x2", ["batch_size=x2"], {"batch": 128}),
                    ("batch x4", ["batch_size=x4"], {"batch": 256}),
                    ("layers x2", ["layers=x2"], {"layers": 8})]),
    "gpt": (8, 2, [("batch x2", ["batch_size=x2"], {"batch": 16}),
                   ("batch x4", ["batch_size=x4"], {"batch": 32}),
                   ("layers x2", ["layers=x2"], {"layers": 4})]),
    "dlrm": (128, 3, [("batch x2", ["batch_size=x2"], {"batch": 256}),
                      ("batch x4", ["batch_size=x4"], {"batch": 512}),
                      ("layers x2", ["layers=x2", "base_layers=3"], {"layers": 6})]),
    "ddp": (64, 4, [("DP 1->2", ["dp=2"], {"dp": 2})]),
}


def run(args) -> dict:
    torch.set_num_threads(THREADS)
    rows = []
    started = time.time()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for wl, (b0, l0, cases) in WORKLOADS.items():
            if args.only and wl not in args.only:
                continue
            t = time.time()
            # captures interleaved with the measurement rounds, so both see the same conditions
            configs = [("base", {})] + [(label, cfg) for label, _, cfg in cases]
            times: dict[str, list[float]] = {label: [] for label, _ in configs}
            captured = []
            for rnd in range(args.rounds):
                if rnd < args.captures:
                    folder = Path(tmp) / wl / f"capture{rnd}"
                    capture(wl, b0, l0, folder, after=args.after)
                    captured.append(folder)
                measure_round(wl, b0, l0, configs, args.iters, args.warm, times)
            real_by = {label: {"min_s": float(np.min(v)), "median_s": float(np.median(v)),
                               "p90_s": float(np.percentile(v, 90)), "iters": len(v)} for label, v in times.items()}
            base_real = real_by["base"]
            print(f"[{wl}] captured + measured in {time.time() - t:.1f}s; base real {base_real['median_s'] * 1e3:.2f} ms",
                  flush=True)
            from predictor.sources.traces.load import load_traces
            from predictor.whatif.annotate import annotate, combine_captures

            at = combine_captures([annotate(load_traces(f)) for f in captured])
            folder = captured[0]
            for label, sets, cfg in cases:
                real = real_by[label]
                preds = {}
                for mode in ("model", "anchored"):
                    spec = parse_sets([*sets, f"retime={mode}"])
                    res = predict_trace(folder, spec, "cpu-local", annotated=at)
                    preds[mode] = res
                r = preds["model"]
                row = {
                    "workload": wl, "change": label, "set": sets,
                    "base": {"batch": b0, "layers": l0}, "target": cfg,
                    "measured_s": real["median_s"], "measured_min_s": real["min_s"], "measured_p90_s": real["p90_s"],
                    "predicted_s": r.predicted_iteration_s,
                    "predicted_anchored_s": preds["anchored"].predicted_iteration_s,
                    "base_measured_unprofiled_s": base_real["median_s"],
                    "base_capture_unprofiled_s": r.baseline_measured_s,
                    "base_replayed_s": r.baseline_replayed_s,
                    "base_profiled_step_s": r.baseline_profiled_s,
                    "timing_source": r.timing_source,
                    "retimed_tasks": r.retime_counts,
                    "retimed_tasks_anchored": preds["anchored"].retime_counts,
                    "changes": r.changes,
                    "annotation": r.annotation,
                }
                row["error_pct"] = 100.0 * (row["predicted_s"] - row["measured_s"]) / row["measured_s"]
                row["error_anchored_pct"] = 100.0 * (row["predicted_anchored_s"] - row["measured_s"]) / row["measured_s"]
                row["naive_error_pct"] = 100.0 * (row["base_measured_unprofiled_s"] - row["measured_s"]) / row["measured_s"]
                rows.append(row)
                print(f"  {label:10s} measured {row['measured_s'] * 1e3:8.2f} ms  predicted {row['predicted_s'] * 1e3:8.2f}"
                      f" ms ({row['error_pct']:+.1f}%)  anchored {row['predicted_anchored_s'] * 1e3:8.2f} ms "
                      f"({row['error_anchored_pct']:+.1f}%)", flush=True)
    meas = np.array([r["measured_s"] for r in rows])
    summary = {}
    for key, col in (("model", "predicted_s"), ("anchored", "predicted_anchored_s")):
        pred = np.array([r[col] for r in rows])
        summary[key] = {"geomean_abs_error_pct": geomean_abs_pct_error(pred, meas),
                        "max_abs_error_pct": max_abs_pct_error(pred, meas),
                        "mean_abs_error_pct": mean_abs_pct_error(pred, meas)}
    return {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": f"2-core VM ({_platform.processor() or _platform.machine()}, host {socket.gethostname()}), shared "
                   "with other jobs; run under flock /tmp/tuner-measure.lock",
        "torch": torch.__version__, "torch_threads": THREADS, "iters": args.iters * args.rounds,
        "rounds": args.rounds, "warmup_iters": args.warm, "captures_per_workload": args.captures,
        "capture": {"warmup": 2, "active": ACTIVE, "unprofiled_after": args.after},
        "load_average_start": load0, "load_average_end": os.getloadavg(),
        "wall_s": time.time() - started,
        "rows": rows, "summary": summary,
        "command": "flock /tmp/tuner-measure.lock nice -n -10 python experiments/whatif_cpu.py",
    }


def _fmt_ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def write(doc: dict, out_dir: Path) -> None:
    from predictor.files import atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    s = doc["summary"]
    src = sorted({r["timing_source"] for r in doc["rows"]})
    lines = [
        "# What-if predictions vs real runs on this CPU",
        "",
        f"Measured {doc['date']} on a {doc['machine']}; torch {doc['torch']}, {doc['torch_threads']} thread per "
        f"process, measurement run at nice -10; ground truth = the median of {doc['iters']} real unprofiled "
        f"iterations ({doc['rounds']} rounds interleaving the configurations, {doc['warmup_iters']} warm-up "
        "iterations each) run in the same script as the captures. The VM is shared with other jobs "
        f"(1-min load average {doc['load_average_start'][0]:.1f} at the start, "
        f"{doc['load_average_end'][0]:.1f} at the end) that slow it down by 10-20 % at times; minima are in the JSON. "
        "Capture: `tuner.capture(warmup=2, "
        f"active={doc['capture']['active']})` plus {doc['capture']['unprofiled_after']} unprofiled iterations "
        f"(profiler-cost calibration), {doc['captures_per_workload']} captures interleaved with the measurement "
        "rounds; predictions use the per-task median over all their steps (`combine_captures`). "
        f"Kernel models: {', '.join(src)}. Whole run {doc['wall_s']:.0f} s.",
        "",
        "*model* re-times changed tasks with the kernel models' absolute times (`retime=model`); *anchored* scales "
        "their measured time by the model's ratio new/old (`retime=anchored`, what `tuner predict` does by default "
        "on the captured platform); *naive* is the unchanged baseline iteration, for scale.",
        "",
        "| workload | change | base ms | measured ms | model ms | error % | anchored ms | error % | naive error % |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r['workload']} | {r['change']} | {_fmt_ms(r['base_measured_unprofiled_s'])} | {_fmt_ms(r['measured_s'])} "
            f"| {_fmt_ms(r['predicted_s'])} | {r['error_pct']:+.1f} | {_fmt_ms(r['predicted_anchored_s'])} "
            f"| {r['error_anchored_pct']:+.1f} | {r['naive_error_pct']:+.1f} |")
    lines += [
        "",
        f"**anchored (default)**: geomean |error| {s['anchored']['geomean_abs_error_pct']:.1f} %, "
        f"max {s['anchored']['max_abs_error_pct']:.1f} % over {len(doc['rows'])} cases.  ",
        f"**model**: geomean |error| {s['model']['geomean_abs_error_pct']:.1f} %, "
        f"max {s['model']['max_abs_error_pct']:.1f} %.",
        "",
        "Per case (anchored run), which path each task took (anchored = measured x model ratio / ratio = no model "
        "for the kind, measured x work ratio / new = added by the transform, model time / unchanged = measured):",
        "",
        "| workload | change | tasks rescaled | anchored | ratio (no model) | new | unchanged | profiler cost/event µs |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        c = r["retimed_tasks_anchored"]
        ch = r["changes"]
        resc = ch.get("batch_size", {}).get("tasks_rescaled", "")
        lines.append(f"| {r['workload']} | {r['change']} | {resc} | {c.get('anchored_model', 0)} | "
                     f"{c.get('ratio_no_model', 0)} | "
                     f"{c.get('new_model', 0)} | {c.get('unchanged_measured', 0)} | "
                     f"{r['annotation']['profiler_cost_per_event_s'] * 1e6:.2f} |")
    lines += ["", f"Reproduce: `{doc['command']}`", ""]
    atomic_write_text(out_dir / "whatif_cpu.md", "\n".join(lines))
    atomic_write_text(out_dir / "whatif_cpu.json", json.dumps(doc, indent=1, default=float))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=10, help="timed real iterations per configuration and round")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved measurement rounds")
    ap.add_argument("--captures", type=int, default=3, help="captures per workload (first rounds), combined")
    ap.add_argument("--warm", type=int, default=2, help="warm-up iterations before timing, per round")
    ap.add_argument("--after", type=int, default=8, help="unprofiled iterations recorded after the capture window")
    ap.add_argument("--only", nargs="*", help="workloads to run (default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "experiments" / "results", help="the folder of the results")
    args = ap.parse_args()
    doc = run(args)
    if args.only:
        print(json.dumps(doc["summary"], indent=1))
        return
    write(doc, args.out)
    s = doc["summary"]["anchored"]
    print(f"anchored: geomean |error| {s['geomean_abs_error_pct']:.1f} %, max {s['max_abs_error_pct']:.1f} % -> "
          f"{args.out / 'whatif_cpu.md'}")


if __name__ == "__main__":
    main()
