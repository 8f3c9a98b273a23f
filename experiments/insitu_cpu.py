"""Where the CPU end-to-end error comes from: one training step taken apart, predicted vs in situ.

For a few rows of ``experiments/e2e_cpu.py`` (MLP and the small GPT, one process, one thread) this
measures, each configuration in fresh child processes:

* the step time with the default C allocator, and the system time and page faults per step
  (glibc hands freed heap memory back to the OS and the next step faults it in again), then the
  same program with trimming and mmap disabled (``MALLOC_TRIM_THRESHOLD_`` /
  ``MALLOC_MMAP_THRESHOLD_`` set very high: no page faults);
* in the no-fault process, the step profiled (torch.profiler, CPU, 3 blocks of 5 steps, each op's
  fastest block): every GEMM's time in situ, and
  the same GEMM shapes timed alone warm (repeated on cache-resident inputs, as the calibration
  times them) and cold (last-level cache evicted first), and the asset pack's prediction of each;
* the rest of the step (not GEMMs) in situ, by ATen op, against the prediction of the non-GEMM
  tasks of the synthesised graph.

Nothing here feeds a prediction: it says which part of the model a remaining error belongs to.

Run:  flock /tmp/tuner-measure.lock python experiments/insitu_cpu.py [--platform PACK] [--compare PACK ...]
      (writes benchmarks/results/insitu_cpu.{md,json}; about 3 minutes). ``--compare``: more packs whose
      predictions of the same GEMM shapes are set beside the in-situ and alone times.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform as pyplatform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from predictor.timing.platforms.host import allocator_env  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
#: (model, batch) rows of experiments/e2e_cpu.py taken apart
CONFIGS = (("mlp", 64), ("mlp", 1024), ("gpt", 2), ("gpt", 8))
#: environment that stops glibc from returning freed memory to the OS (no page faults in steady state)
#: (32 MiB is the largest mmap threshold glibc accepts; a larger value is ignored)
NO_TRIM = allocator_env("no_trim")
#: profiled blocks of 5 steps; each op keeps its fastest block (a shared VM has slow spells)
PROFILE_BLOCKS = 3
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def _step(model: str, batch: int):
    """The e2e experiment's training step closure and its host-mode graph."""
    from experiments.e2e_cpu import GPT, MLP, gpt_step, mlp_step, row_graph

    step = mlp_step(dataclasses.replace(MLP, batch_size=batch)) if model == "mlp" else gpt_step(GPT, batch)
    return step, row_graph(model, batch)


def _gemm_shape(key: str, shapes: list) -> tuple[str, int, int, int, int]:
    """(kind, batch, m, n, k) of a profiled GEMM from its input shapes."""
    if key == "aten::mm":
        (m, k), (_, n) = shapes[0], shapes[1]
        return "mm", 1, m, n, k
    if key == "aten::addmm":
        (m, k), (_, n) = shapes[1], shapes[2]
        return "addmm", 1, m, n, k
    (b, m, k), (_, _, n) = (shapes[0], shapes[1]) if key == "aten::bmm" else (shapes[1], shapes[2])
    return "bmm", b, m, n, k


def child(model: str, batch: int, profile: bool, steps: int = 20, platform: str = "cpu-local") -> dict:
    """Runs in a fresh process: step timing with rusage; with ``profile``, the GEMM and op breakdown."""
    import numpy as np
    import torch

    from experiments.e2e_cpu import resolve
    from experiments.measure_env import llc_flush_buffer, time_call
    from predictor.simulate import simulate
    from predictor.timing.calibration.gemm import GEMM_KINDS

    torch.set_num_threads(1)
    step, graph = _step(model, batch)
    timing, _, _ = resolve(platform)
    tl = simulate(graph, timing)
    kinds = np.asarray(graph.kinds)[graph.kind]
    is_gemm = np.isin(kinds, GEMM_KINDS)
    is_sum = kinds == "sum"
    out = {"model": model, "batch": batch, "predicted_s": float(tl.iteration_s),
           "predicted_gemm_s": float(tl.duration[is_gemm].sum()),
           "predicted_other_s": float(tl.iteration_s - tl.duration[is_gemm].sum()),
           "predicted_sum_s": float(tl.duration[is_sum].sum()),
           "sum_tasks": np.column_stack([graph.param("m")[is_sum], graph.param("n")[is_sum]]).tolist()}
    for _ in range(5):
        step()
    r0, times = resource.getrusage(resource.RUSAGE_SELF), []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out.update(step_s=float(np.median(times)), system_s=(r1.ru_stime - r0.ru_stime) / steps,
               faults=(r1.ru_minflt - r0.ru_minflt) / steps)
    if not profile:
        return out
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    n = 5
    best: dict[tuple, tuple] = {}  # (op, shapes) -> (seconds per step, event) of the fastest block
    for _ in range(PROFILE_BLOCKS):
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(n):
                step()
        for e in prof.key_averages(group_by_input_shape=True):
            key = (e.key, str(e.input_shapes))
            per_step = e.self_cpu_time_total / n / 1e6
            if key not in best or per_step < best[key][0]:
                best[key] = (per_step, e)
    flush = llc_flush_buffer()
    gemms, other = [], {}
    for per_step, e in best.values():
        if e.key not in GEMM_OPS:
            other[e.key] = other.get(e.key, 0.0) + per_step
            continue
        kind, b, m, nn_, k = _gemm_shape(e.key, e.input_shapes)
        pred = gemm_prediction(timing, kind, b, m, nn_, k)
        if b == 1:
            x, y = torch.randn(m, k), torch.randn(k, nn_)
            fn = lambda x=x, y=y: torch.mm(x, y)  # noqa: E731
        else:
            x, y = torch.randn(b, m, k), torch.randn(b, k, nn_)
            fn = lambda x=x, y=y: torch.bmm(x, y)  # noqa: E731
        calls = e.count / n
        gemms.append({"kind": kind, "batch": b, "m": m, "n": nn_, "k": k, "calls": calls, "predicted_s": pred,
                      "warm_s": time_call(fn, None), "cold_s": time_call(fn, flush),
                      "in_situ_s": per_step / calls})
    out["gemms"] = gemms
    out["profiled_step_s"] = float(sum(other.values()) + sum(g["in_situ_s"] * g["calls"] for g in gemms))
    out["other_ops_s"] = dict(sorted(other.items(), key=lambda kv: -kv[1])[:12])
    out["other_in_situ_s"] = float(sum(other.values()))
    out["sum_in_situ_s"] = float(other.get("aten::sum", 0.0))
    return out


def run_child(model: str, batch: int, env: dict, profile: bool, platform: str = "cpu-local") -> dict:
    """:func:`child` in a fresh interpreter with ``env`` added."""
    cmd = ([sys.executable, __file__, "--child", model, str(batch), "--platform", platform]
           + (["--profile"] if profile else []))
    res = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"error: child {model} b{batch} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def gemm_prediction(timing, kind: str, b: int, m: int, n: int, k: int) -> float:
    """``timing``'s prediction of one fp32 GEMM call (seconds); ``b`` > 1: a batched one."""
    from predictor.timing.kernels.base import TaskView

    cols = {"m": m, "n": n, "k": k, "dtype_bytes": 4, "flops": 2.0 * m * n * k * b}
    if b != 1:
        cols["batch"] = b
    return float(timing.model_for(kind).predict(TaskView.single(kind, **cols), timing.platform)[0])


def resolve_packs(names: list[str], workdir: Path | None = None) -> dict:
    """Each named pack's timing, by name; a name that is no pack or platform: one line and exit 2.
    With ``workdir``, the names are pack specs as ``experiments/e2e_windows.py --compare`` takes them
    (``git:REV[:NAME]``, ``refit:DIR``, ... — :func:`experiments.e2e_windows.materialise`, extracted or fitted
    into ``workdir``)."""
    from experiments.common import fail
    from experiments.e2e_cpu import resolve
    from predictor.timing.platforms.assets import AssetPackError

    if workdir is not None:
        from experiments.e2e_windows import resolve_spec

        return {name: resolve_spec(name, workdir)[0] for name in names}
    out = {}
    for name in names:
        try:
            out[name] = resolve(name)[0]
        except (AssetPackError, KeyError, ValueError) as exc:
            fail(f"pack {name}: {exc}")
    return out


def predict_gemms(rows: list[dict], timings: dict) -> None:
    """Each profiled GEMM's time predicted by each pack's timing of ``timings`` (by name; seconds per
    call), stored in its ``predicted_by`` by pack."""
    for pack, timing in timings.items():
        for r in rows:
            for g in r["no_trim"]["gemms"]:
                g.setdefault("predicted_by", {})[pack] = gemm_prediction(timing, g["kind"], g["batch"], g["m"],
                                                                         g["n"], g["k"])


def sum_prediction(timing, tasks: list[list[float]]) -> float:
    """``timing``'s prediction of a step's column sums (``[m, n]`` each, fp32; seconds per step): the
    calibrated reduction model where the pack has one, else the pack's roofline."""
    import numpy as np

    from predictor.sources.synth.emit import column_sum
    from predictor.timing.kernels.base import TaskView

    if not tasks:
        return 0.0
    params = [column_sum("sum", m, n, 4)[3] for m, n in tasks]  # the synthesisers' parameters of each sum
    view = TaskView.from_columns("sum", **{c: np.array([p[c] for p in params], dtype=float) for c in params[0]})
    return float(timing.model_for("sum").predict(view, timing.platform).sum())


def predict_sums(rows: list[dict], timings: dict) -> None:
    """Each row's column sums (the bias gradients) predicted by each pack of ``timings`` (seconds per
    step), stored in its no-trim record's ``sum_predicted_by`` by pack."""
    for pack, timing in timings.items():
        for r in rows:
            nt = r["no_trim"]
            nt.setdefault("sum_predicted_by", {})[pack] = sum_prediction(timing, nt.get("sum_tasks", []))


def _vs_situ_head(columns: str, align: str, compared: list[str]) -> list[str]:
    """A table's header and alignment rows: ``columns`` (ending ``" | "``), then one ``PACK / in situ`` column per
    pack of ``compared``."""
    return [columns + " | ".join(f"{p} / in situ" for p in compared) + (" |" if compared else ""),
            align + "---:|" * len(compared)]


def _ratio(x: float, of: float) -> str:
    """``x / of`` to two places, ``n/a`` where ``of`` is not positive."""
    return f"{x / of:.2f}" if of > 0 else "n/a"


def _per_step(gemms: list[dict], key: str) -> float:
    """``key`` (seconds per call) summed over a step's GEMMs, each times its calls per step."""
    return sum(x[key] * x["calls"] for x in gemms)


def markdown(rows: list[dict], meta: dict) -> str:
    ms = 1e3
    lines = [
        "# One CPU training step taken apart: predicted vs in situ",
        "",
        f"{meta['date']}, {meta['machine']}, torch {meta['torch']}, 1 thread; asset pack "
        f"`{meta.get('platform', 'cpu-local')}`; host-mode graphs of `experiments/e2e_cpu.py`. Reproduce: "
        f"`flock /tmp/tuner-measure.lock python experiments/insitu_cpu.py{meta.get('args', '')}` "
        f"({meta['wall_s']:.0f} s).",
        "",
        "Each configuration runs in fresh processes: `default` = the C allocator as it comes; `no trim` = "
        "the same program with glibc's trimming and mmap thresholds set very high, so freed memory is never "
        "handed back to the OS and no step pays page faults. Step = median of 20 steps after 5 warm-up ones.",
        "",
        "| model | batch | predicted ms | step ms (default) | system ms / step | page faults / step | "
        "step ms (no trim) | system ms (no trim) | faults (no trim) | error vs no trim |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d, nt = r["default"], r["no_trim"]
        lines.append(f"| {r['model']} | {r['batch']} | {d['predicted_s'] * ms:.2f} | {d['step_s'] * ms:.2f} | "
                     f"{d['system_s'] * ms:.2f} | {d['faults']:.0f} | {nt['step_s'] * ms:.2f} | "
                     f"{nt['system_s'] * ms:.2f} | {nt['faults']:.0f} | "
                     f"{100 * (d['predicted_s'] / nt['step_s'] - 1):+.1f}% |")
    lines += [
        "",
        "## GEMMs: the pack vs the same shapes alone (warm, cold) vs in situ",
        "",
        "Sums per step over every GEMM of the profiled step (no-trim process). `warm`: repeated on "
        "cache-resident inputs (how the calibration times GEMMs); `cold`: the last-level cache evicted "
        "before each call; `in situ`: the profiler's time of the same calls inside the step.",
        "",
        "| model | batch | GEMMs | predicted ms | warm ms | cold ms | in situ ms | in situ / warm | cold / warm |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        g = r["no_trim"]["gemms"]
        s = {k: _per_step(g, k) for k in ("predicted_s", "warm_s", "cold_s", "in_situ_s")}
        lines.append(f"| {r['model']} | {r['batch']} | {sum(x['calls'] for x in g):.0f} | {s['predicted_s'] * ms:.2f} | "
                     f"{s['warm_s'] * ms:.2f} | {s['cold_s'] * ms:.2f} | {s['in_situ_s'] * ms:.2f} | "
                     f"{s['in_situ_s'] / s['warm_s']:.2f} | {s['cold_s'] / s['warm_s']:.2f} |")
    compared = list(meta.get("compare", []))
    lines += [
        "",
        "By GEMM op (sum per step, ms): the attention `bmm`s of the GPT step read operands its previous ops just "
        "wrote, so they run near their warm time in situ where the pack, fitted to cold timings, predicts the cold "
        "one.",
        "",
        *_vs_situ_head("| model | batch | op | calls | predicted ms | warm ms | cold ms | in situ ms | predicted / in situ | ",
                       "|---|---:|---|---:|---:|---:|---:|---:|---:|", compared),
    ]
    for r in rows:
        g = r["no_trim"]["gemms"]
        for kind in sorted({x["kind"] for x in g}):
            sub = [x for x in g if x["kind"] == kind]
            s = {k: _per_step(sub, k) for k in ("predicted_s", "warm_s", "cold_s", "in_situ_s")}
            cells = [f"{sum(x['predicted_by'][p] * x['calls'] for x in sub) / s['in_situ_s']:.2f}" for p in compared]
            lines.append(f"| {r['model']} | {r['batch']} | {kind} | {sum(x['calls'] for x in sub):.0f} | "
                         f"{s['predicted_s'] * ms:.2f} | {s['warm_s'] * ms:.2f} | {s['cold_s'] * ms:.2f} | "
                         f"{s['in_situ_s'] * ms:.2f} | {s['predicted_s'] / s['in_situ_s']:.2f} | "
                         + " | ".join(cells) + (" |" if cells else ""))
    if compared:
        lines += [
            "",
            "The same GEMM shapes predicted by other packs (sum per step, ms; error against in situ):",
            "",
            "| model | batch | in situ ms | cold alone ms | " + " | ".join(f"{p} ms" for p in compared) + " |",
            "|---|---:|---:|---:|" + "---:|" * len(compared),
        ]
        for r in rows:
            g = r["no_trim"]["gemms"]
            situ = _per_step(g, "in_situ_s")
            cells = []
            for p in compared:
                pred = sum(x["predicted_by"][p] * x["calls"] for x in g)
                cells.append(f"{pred * ms:.2f} ({100 * (pred / situ - 1):+.1f}%)")
            lines.append(f"| {r['model']} | {r['batch']} | {situ * ms:.2f} | {_per_step(g, 'cold_s') * ms:.2f} | "
                         + " | ".join(cells) + " |")
    lines += [
        "",
        "## Everything else: predicted vs in situ (profiled, so slightly inflated)",
        "",
        "| model | batch | predicted ms (non-GEMM tasks) | in situ ms (non-GEMM ops) | largest in situ |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        nt = r["no_trim"]
        top = ", ".join(f"{k.removeprefix('aten::')} {v * ms:.2f}" for k, v in list(nt["other_ops_s"].items())[:6])
        lines.append(f"| {r['model']} | {r['batch']} | {nt['predicted_other_s'] * ms:.2f} | "
                     f"{nt['other_in_situ_s'] * ms:.2f} | {top} |")
    if all("sum_in_situ_s" in r["no_trim"] for r in rows):
        lines += [
            "",
            "The bias gradients: the graph's column sums (kind `sum`) against the profiled `aten::sum` calls per step "
            "(the steps' only `sum`s: their losses reduce inside `nll_loss`).",
            "",
            *_vs_situ_head("| model | batch | sums | predicted ms | in situ ms | predicted / in situ | ",
                           "|---|---:|---:|---:|---:|---:|", compared),
        ]
        for r in rows:
            nt = r["no_trim"]
            situ = nt["sum_in_situ_s"]
            cells = [_ratio(nt.get("sum_predicted_by", {}).get(p, float("nan")), situ) for p in compared]
            lines.append(f"| {r['model']} | {r['batch']} | {len(nt['sum_tasks'])} | {nt['predicted_sum_s'] * ms:.3f} | "
                         f"{situ * ms:.3f} | {_ratio(nt['predicted_sum_s'], situ)} | " + " | ".join(cells)
                         + (" |" if cells else ""))
    lines += [
        "",
        "Caveat: on this shared 2-core VM, memory-bound kernels switch between a fast and a several-times slower "
        "state for seconds to minutes (the same `_log_softmax_backward_data` on 1024 x 2048 timed alone: 0.63 ms "
        "in one run, 2.5 ms in another a few minutes later), so the non-GEMM column is a snapshot of the machine's "
        "state during the profiled blocks; each op keeps its fastest of 3 blocks to damp that. What each gap is and "
        "what was tried: `docs/SESSION_NOTES.md`, session 6.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "BATCH"), help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--platform", default="cpu-local", help="the asset pack (name or path) that predicts the steps")
    ap.add_argument("--compare", nargs="*", default=[],
                    help="more packs that predict the same GEMM shapes: names, paths or specs as "
                         "experiments/e2e_windows.py --compare takes them (git:REV[:NAME], refit:DIR, ...)")
    ap.add_argument("--out", type=Path, default=RESULTS / "insitu_cpu")
    ap.add_argument("--render", action="store_true", help="only re-write the .md from the existing .json")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.profile, platform=args.platform)))
        return
    if args.render:
        from tuner.report import atomic_write_text

        saved = json.loads(args.out.with_suffix(".json").read_text())
        atomic_write_text(args.out.with_suffix(".md"), markdown(saved["rows"], saved["meta"]))
        return
    import torch

    # bad names fail before three minutes of measuring; the measuring children resolve --platform by name
    # (--compare specs such as git:REV are extracted into a folder that lives as long as this run)
    packs_dir = tempfile.TemporaryDirectory(prefix="insitu-packs-")
    timings = {**resolve_packs([args.platform]), **resolve_packs(args.compare, Path(packs_dir.name))}
    t0 = time.perf_counter()
    rows = []
    for model, batch in CONFIGS:
        r = {"model": model, "batch": batch, "default": run_child(model, batch, {}, False, args.platform),
             "no_trim": run_child(model, batch, NO_TRIM, True, args.platform)}
        d, nt = r["default"], r["no_trim"]
        print(f"{model} b{batch}: predicted {d['predicted_s'] * 1e3:.2f} ms, step {d['step_s'] * 1e3:.2f} ms "
              f"(system {d['system_s'] * 1e3:.2f} ms, {d['faults']:.0f} faults), no trim {nt['step_s'] * 1e3:.2f} ms",
              flush=True)
        rows.append(r)
    meta = {"date": dt.date.today().isoformat(), "machine": f"{pyplatform.machine()} {os.cpu_count()}-core",
            "torch": torch.__version__, "wall_s": time.perf_counter() - t0, "platform": args.platform,
            "compare": list(args.compare),
            "args": (f" --platform {args.platform}" if args.platform != "cpu-local" else "")
            + (" --compare " + " ".join(args.compare) if args.compare else "")}
    if args.compare:
        predict_gemms(rows, {name: timings[name] for name in args.compare})
        predict_sums(rows, {name: timings[name] for name in args.compare})
    packs_dir.cleanup()
    from tuner.report import atomic_write_text

    atomic_write_text(args.out.with_suffix(".json"), json.dumps({"meta": meta, "rows": rows}, indent=1))
    atomic_write_text(args.out.with_suffix(".md"), markdown(rows, meta))
    print(f"wrote {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
