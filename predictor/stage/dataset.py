"""Training data for the stage model: real stage latencies measured on this machine.

A *sample* is a :class:`~predictor.stage.gpt.StageSpec` — a contiguous layer range of one of
several small GPT models (:data:`DEFAULT_MODELS`: hidden / heads / sequence / vocabulary /
micro-batch variants), with tensor parallelism ``tp`` in {1, 2, 4} emulated by shapes — and the
measured latency of one micro-batch's forward + backward of that stage on the CPU.

Timing protocol (:func:`measure_stage`): build the stage with random weights, run ``warmup``
untimed steps, then ``repeats`` timed steps (garbage collector off). Each step is timed on two
clocks: the **CPU time of the calling thread** (``time.thread_time``) and wall-clock time
(``time.perf_counter``). With ``torch.set_num_threads(1)`` all the work runs on that one
thread, so its CPU time is the stage's latency on a core of its own; on a shared VM wall-clock
time also counts the slices the scheduler gives to other tenants, so the sample's latency label
is the **median CPU time** (coefficient of variation over repeats on a shared 2-core VM: ~0.04
CPU time, ~0.2 wall-clock); the wall-clock median, the minimum and the quartiles are kept too.
The collection (:func:`collect`) sweeps over all stages several times, each sweep in a new random
order with a fresh build of every stage, so that a label mixes several builds and several minutes
of the shared machine's state; then it re-measures a random ``retest_fraction`` of the stages the
same way: the relative difference between the two labels is the measurement noise floor that no
predictor can beat. 12 passes by default: labels of two collections 1.5 % apart on average (6.7 %
with 5 passes), which takes about one point off the stage models' held-out MRE
(``experiments/results/predtop_tables.md``).

Collect (timing-sensitive, so under the shared measurement lock, one thread)::

    flock /tmp/tuner-measure.lock python experiments/collect_stage_latencies.py collect \
        --out predictor/stage/data/cpu_stage_latencies.json

The JSON holds the specs and timings only (graphs are rebuilt from the specs by tracing,
:func:`load_graphs`, cached under ``~/.cache/tuner/stage_graphs``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import gzip
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .gpt import GPTSpec, StageSpec, build_stage_module, stage_inputs, stage_step_fn
from .graph import GRAPH_FORMAT_VERSION, StageGraph, stage_graph

__all__ = [
    "DEFAULT_MODELS",
    "DEFAULT_DATASET",
    "GPU_MODELS",
    "H100_DATASET",
    "StageSample",
    "StageTiming",
    "all_stage_specs",
    "collect",
    "load_dataset",
    "load_graphs",
    "measure_stage",
]

#: GPT variants whose stages make up the CPU dataset (all have 8 layers but one with 6)
DEFAULT_MODELS: tuple[GPTSpec, ...] = (
    GPTSpec(hidden=128, heads=4, seq=128, vocab=4096, n_layers=8, micro_batch=4),
    GPTSpec(hidden=192, heads=12, seq=64, vocab=8192, n_layers=8, micro_batch=4),
    GPTSpec(hidden=256, heads=8, seq=128, vocab=8192, n_layers=8, micro_batch=2),
    GPTSpec(hidden=320, heads=8, seq=96, vocab=6144, n_layers=8, micro_batch=2),
    GPTSpec(hidden=384, heads=12, seq=64, vocab=16384, n_layers=6, micro_batch=2),
)

#: GPT variants of the GPU dataset: the CPU ones' shapes scaled up until a layer's forward + backward
#: takes milliseconds on a data-centre GPU (fp32, TF32 off), so that the stages are GPU-bound, as
#: the stages of a real pipeline are (hidden 768..2560, sequence 256..2048)
GPU_MODELS: tuple[GPTSpec, ...] = (
    GPTSpec(hidden=1024, heads=16, seq=1024, vocab=32768, n_layers=8, micro_batch=4),
    GPTSpec(hidden=1536, heads=16, seq=512, vocab=50304, n_layers=8, micro_batch=4),
    GPTSpec(hidden=2048, heads=16, seq=512, vocab=32768, n_layers=8, micro_batch=2),
    GPTSpec(hidden=768, heads=12, seq=2048, vocab=50304, n_layers=8, micro_batch=2),
    GPTSpec(hidden=2560, heads=20, seq=256, vocab=32768, n_layers=6, micro_batch=4),
)

#: where the committed CPU dataset lives
DEFAULT_DATASET = Path(__file__).resolve().parent / "data" / "cpu_stage_latencies.json"
#: where the committed H100 dataset lives (``collect --device cuda``)
H100_DATASET = Path(__file__).resolve().parent / "data" / "h100_stage_latencies.json"


@dataclass(frozen=True)
class StageTiming:
    """Seconds of one micro-batch forward + backward (thread CPU time: median = the label, min,
    quartiles, every repeat; and the wall-clock median)."""

    median_s: float
    min_s: float
    q25_s: float
    q75_s: float
    wall_median_s: float
    repeats_s: tuple[float, ...]


@dataclass(frozen=True)
class StageSample:
    """A measured stage: its spec and its latency label (seconds)."""

    spec: StageSpec
    latency_s: float
    timing: dict


def all_stage_specs(model: GPTSpec, tp: int = 1, dp: int = 1) -> list[StageSpec]:
    """Every contiguous layer range ``i..j`` of ``model`` (``L (L + 1) / 2`` stages)."""
    n = model.n_layers
    return [StageSpec(model, i, j, tp, dp) for i in range(n) for j in range(i, n)]


def measure_stage(
    spec: StageSpec, warmup: int = 2, repeats: int = 15, seed: int = 0, device: str | torch.device = "cpu"
) -> StageTiming:
    """Time one micro-batch's forward + backward of ``spec`` (seconds; see module docstring).

    On the CPU the label clock is the thread's CPU time. On a GPU it is the wall-clock time from a
    synchronised start to the synchronised end of the step (the stage's latency as the pipeline
    sees it, host issue included); both clocks then hold that time.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    torch.manual_seed(seed)
    module = build_stage_module(spec, dev)
    inputs = stage_inputs(spec, dev, seed=seed)
    params = dict(module.named_parameters())
    step = stage_step_fn(module)
    for _ in range(warmup):
        step(params, inputs)
    if cuda:
        torch.cuda.synchronize(dev)
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        cpu, wall = [], []
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.thread_time()
            step(params, inputs)
            if cuda:
                torch.cuda.synchronize(dev)
                cpu.append(time.perf_counter() - w0)
            else:
                cpu.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - w0)
    finally:
        if gc_was_enabled:
            gc.enable()
        del module, inputs, params
    q = np.quantile(cpu, [0.25, 0.75])
    return StageTiming(
        statistics.median(cpu), min(cpu), float(q[0]), float(q[1]), statistics.median(wall), tuple(cpu)
    )


def _machine(device: torch.device | None = None) -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torch_num_threads": torch.get_num_threads(),
        **({"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda,
            "note": "a lent GPU machine, the only job on it"} if device is not None and device.type == "cuda" else
           {"note": "2-core VM shared with other engineers' jobs; measurements taken under flock "
                    "/tmp/tuner-measure.lock"}),
    }


def _measure_passes(
    specs: Sequence[StageSpec],
    idx: Sequence[int],
    passes: int,
    warmup: int,
    repeats: int,
    rng: np.random.Generator,
    progress: str = "",
    device: str | torch.device = "cpu",
) -> dict[int, list[StageTiming]]:
    """``passes`` sweeps over ``specs[idx]``, each in a fresh random order; per index, one timing per pass."""
    out: dict[int, list[StageTiming]] = {int(i): [] for i in idx}
    t0 = time.perf_counter()
    total = passes * len(idx)
    k = 0
    for p in range(passes):
        for i in rng.permutation(np.asarray(idx)):
            out[int(i)].append(measure_stage(specs[i], warmup, repeats, seed=int(i), device=device))
            k += 1
            if progress and (k % 100 == 0 or k == total):
                print(
                    f"{progress} pass {p + 1}/{passes} [{k}/{total}] {time.perf_counter() - t0:.0f}s",
                    file=sys.stderr,
                )
    return out


def _label(timings: list[StageTiming]) -> dict:
    cpu = [t for tm in timings for t in tm.repeats_s]
    q = np.quantile(cpu, [0.25, 0.75])
    return {
        "latency_s": statistics.median(cpu),
        "min_s": min(cpu),
        "q25_s": float(q[0]),
        "q75_s": float(q[1]),
        "wall_median_s": statistics.median([tm.wall_median_s for tm in timings]),
        "pass_medians_s": [tm.median_s for tm in timings],
    }


def collect(
    specs: Sequence[StageSpec],
    out: Path,
    passes: int = 12,
    warmup: int = 1,
    repeats: int = 2,
    retest_fraction: float = 0.1,
    seed: int = 0,
    threads: int = 1,
    progress: bool = True,
    device: str | torch.device = "cpu",
) -> dict:
    """Measure ``specs`` in ``passes`` shuffled sweeps, re-measure a fraction, write ``out`` (JSON, atomically).

    Each sweep builds every stage afresh and times ``repeats`` steps after ``warmup``; the label
    is the median over all timed steps of all sweeps. Spreading a stage's timings over several
    builds and several minutes averages out the slow drifts of this shared machine, which
    dominate the noise (a single build's median varies by ~6 % from one minute to the next here).
    """
    from predictor.files import atomic_write_text  # the one atomic writer of the project

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 GEMMs as fp32 (the graphs say float32)
        torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(threads)
    rng = np.random.default_rng(seed)
    t_start = time.perf_counter()
    all_idx = list(range(len(specs)))
    first = _measure_passes(specs, all_idx, passes, warmup, repeats, rng, "measure" if progress else "", dev)
    rows = [{**specs[i].to_dict(), **_label(first[i])} for i in all_idx]
    n_re = int(round(retest_fraction * len(specs)))
    re_idx = sorted(int(i) for i in rng.choice(len(specs), size=n_re, replace=False)) if n_re else []
    again = _measure_passes(specs, re_idx, passes, warmup, repeats, rng, "retest" if progress else "", dev)
    retest = [
        {"index": i, "latency_s": rows[i]["latency_s"], "retest_s": _label(again[i])["latency_s"]}
        for i in re_idx
    ]
    rel = [abs(r["retest_s"] - r["latency_s"]) / r["latency_s"] * 100 for r in retest]
    doc = {
        "format": "tuner.stage_latencies/1",
        "date": _dt.date.today().isoformat(),
        "machine": _machine(dev),
        "protocol": {
            "device": str(dev),
            "passes": passes,
            "warmup": warmup,
            "repeats": repeats,
            "label": "median thread CPU time (time.thread_time) over all timed steps of all passes"
            if dev.type == "cpu" else
            "median wall-clock time, synchronised start to synchronised end, over all timed steps of all passes "
            "(float32, TF32 off)",
            "unit": "seconds",
            "work": "forward + backward of one micro-batch (gradients of all parameters and the input)",
        },
        "collection_seconds": round(time.perf_counter() - t_start, 1),
        "retest": {
            "n": len(retest),
            "mean_abs_rel_diff_pct": float(np.mean(rel)) if rel else None,
            "max_abs_rel_diff_pct": float(np.max(rel)) if rel else None,
            "rows": retest,
        },
        "samples": rows,
    }
    atomic_write_text(out, json.dumps(doc, indent=None, separators=(",", ":")) + "\n")
    return doc


def load_dataset(path: str | Path = DEFAULT_DATASET) -> tuple[list[StageSample], dict]:
    """Samples and header of a dataset written by :func:`collect`; ValueError on a foreign file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read stage dataset ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != "tuner.stage_latencies/1":
        raise ValueError(f"{path}: not a stage latency dataset")
    samples = []
    for r in doc["samples"]:
        timing = {k: r[k] for k in ("min_s", "q25_s", "q75_s", "wall_median_s", "pass_medians_s") if k in r}
        samples.append(StageSample(StageSpec.from_dict(r), float(r["latency_s"]), timing))
    header = {k: v for k, v in doc.items() if k != "samples"}
    return samples, header


def _cache_dir() -> Path:
    return Path(os.environ.get("TUNER_CACHE", Path.home() / ".cache" / "tuner")) / "stage_graphs"


def _spec_key(spec: StageSpec) -> str:
    payload = json.dumps(
        {"spec": spec.to_dict(), "torch": torch.__version__, "v": GRAPH_FORMAT_VERSION}, sort_keys=True
    )
    return hashlib.sha1(payload.encode()).hexdigest()[:16]


def load_graphs(specs: Iterable[StageSpec], cache: bool = True) -> list[StageGraph]:
    """Stage graphs of ``specs`` (traced, pruned), from the on-disk cache when present."""
    out = []
    d = _cache_dir()
    for spec in specs:
        f = d / f"{_spec_key(spec)}.json.gz"
        g = None
        if cache and f.exists():
            try:
                g = StageGraph.from_dict(json.loads(gzip.decompress(f.read_bytes())))
            except (OSError, ValueError, KeyError):
                g = None
        if g is None:
            g = stage_graph(spec)
            if cache:
                d.mkdir(parents=True, exist_ok=True)
                tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
                tmp.write_bytes(gzip.compress(json.dumps(g.to_dict()).encode()))
                tmp.replace(f)
        out.append(g)
    return out


def default_specs(
    models: Sequence[GPTSpec] = DEFAULT_MODELS, tps: Sequence[int] = (1, 2, 4)
) -> list[StageSpec]:
    """Every layer range of every model at every ``tp`` (540 stages for the defaults)."""
    return [s for m in models for tp in tps for s in all_stage_specs(m, tp)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="experiments/collect_stage_latencies.py", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="measure the default stages on this CPU (run under flock) or a GPU")
    c.add_argument("--device", default="cpu", help="cpu (the CPU models) or cuda[:N] (the GPU models, GPU_MODELS)")
    c.add_argument("--out", type=Path, default=None,
                   help=f"default: {DEFAULT_DATASET.name} on the CPU, {H100_DATASET.name} on a GPU")
    c.add_argument("--passes", type=int, default=12)
    c.add_argument("--repeats", type=int, default=2)
    c.add_argument("--warmup", type=int, default=1)
    c.add_argument("--threads", type=int, default=1)
    c.add_argument(
        "--limit", type=int, default=0, help="measure only the first N shuffled stages (smoke test)"
    )
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {args.device}: CUDA is not available on this machine", file=sys.stderr)
        return 2
    specs = default_specs(GPU_MODELS if device.type == "cuda" else DEFAULT_MODELS)
    if args.out is None:
        args.out = H100_DATASET if device.type == "cuda" else DEFAULT_DATASET
    if args.limit:
        rng = np.random.default_rng(1)
        specs = [specs[i] for i in rng.permutation(len(specs))[: args.limit]]
    doc = collect(specs, args.out, args.passes, args.warmup, args.repeats, threads=args.threads, device=device)
    rt = doc["retest"]
    print(
        f"wrote {args.out}: {len(doc['samples'])} stages in {doc['collection_seconds']} s; "
        f"retest mean |diff| {rt['mean_abs_rel_diff_pct']}% (n={rt['n']})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
