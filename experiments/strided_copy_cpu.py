"""What a permuted copy costs on this CPU against the memcpy roofline that prices it today.

A training step's head split / merge (``q.view(b, s, h, d).transpose(1, 2)`` then ``.contiguous()`` or a
``reshape`` that must copy) is a copy whose reads (or writes) jump by a stride every ``d`` elements. The
synthesisers emit it as kind ``memcpy`` (bytes = 2 x payload) and the asset pack's memcpy roofline prices it;
in situ on the GPT step (session 40, ``docs/SESSION_NOTES.md``) those clones took 2.6-3.5x that price. This
measures, cold (the last-level cache evicted before each call, as the calibration times memory-bound kernels),
per total size and contiguous run length ``r`` (elements):

* ``permute``: ``x.permute(1, 0, 2).contiguous()`` of an ``S x C x r`` tensor (``S`` = ``C``: a square
  transpose of ``r``-element blocks; ``r`` = 1 is the element-wise transpose the ``transpose`` kernel times);
* ``memcpy``: ``dst.copy_(src)`` of as many elements (the roofline's own benchmark);
* the pack's memcpy prediction of that copy,

and the GPT step's own head split / merge copies at batch 8. Each time is the median over shuffled rounds of
the median of ``--calls`` cold calls. Nothing here feeds a prediction: it sizes a strided-copy kernel model.

Run:  flock /tmp/tuner-measure.lock python experiments/strided_copy_cpu.py [--platform cpu-local-zen4]
      (writes experiments/results/strided_copy_cpu.{md,json}; about a minute)
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import write_results  # noqa: E402

#: total elements (fp32) and contiguous run lengths (elements) of the grid
SIZES = (2**18, 2**20, 2**22)
RUNS = (1, 4, 16, 64, 256, 1024)
#: the GPT step's copies at batch 8 (``experiments/e2e_cpu.py``: 4 heads of 64, 128 tokens): input view shape,
#: permutation, label
GPT_COPIES = (
    ((8, 128, 3, 4, 64), (2, 0, 3, 1, 4), "qkv split [b, s, 3, h, d] -> [3, b, h, s, d]"),
    ((3, 8, 4, 128, 64), (1, 3, 0, 2, 4), "qkv split backward [3, b, h, s, d] -> [b, s, 3, h, d]"),
    ((8, 4, 128, 64), (0, 2, 1, 3), "context merge [b, h, s, d] -> [b, s, h, d]"),
    ((8, 128, 4, 64), (0, 2, 1, 3), "context merge backward [b, s, h, d] -> [b, h, s, d]"),
)


def _cases() -> list[dict]:
    cases = []
    for n in SIZES:
        for r in RUNS:
            side = int(round((n / r) ** 0.5))
            if side < 2:
                continue
            cases.append({"label": f"{n} elements, runs of {r}", "shape": (side, side, r), "perm": (1, 0, 2),
                          "elements": side * side * r, "run": r})
    for shape, perm, label in GPT_COPIES:
        cases.append({"label": label, "shape": shape, "perm": perm, "elements": int(np.prod(shape)),
                      "run": shape[-1]})
    return cases


def measure(cases: list[dict], rounds: int, calls: int, seed: int) -> None:
    """Fill each case's ``permute_s`` and ``memcpy_s`` (seconds, median over ``rounds`` shuffled rounds)."""
    import torch

    from experiments.measure_env import llc_flush_buffer, time_call

    torch.set_num_threads(1)
    flush = llc_flush_buffer()
    rng = np.random.default_rng(seed)
    timings: dict[tuple[int, str], list[float]] = {}
    for _ in range(rounds):
        for i in rng.permutation(len(cases)):
            c = cases[int(i)]
            x = torch.randn(*c["shape"])
            src, dst = torch.randn(c["elements"]), torch.empty(c["elements"])
            jobs = {"permute_s": lambda x=x, p=c["perm"]: x.permute(*p).contiguous(),
                    "memcpy_s": lambda s=src, d=dst: d.copy_(s)}
            for what in rng.permutation(sorted(jobs)):
                timings.setdefault((int(i), str(what)), []).append(time_call(jobs[str(what)], flush, n=calls))
    for (i, what), ts in timings.items():
        cases[i][what] = float(np.median(ts))


def predict(cases: list[dict], platform: str) -> None:
    """Each case's ``predicted_s``: the pack's memcpy model of a copy of its bytes (how it is priced today)."""
    from predictor.timing.kernels import TaskView
    from predictor.timing.kernels.timing import models_by_kind
    from predictor.timing.platforms.assets import AssetPackError, resolve_platform

    pack = resolve_platform(platform).pack
    if pack is None:
        raise AssetPackError(f"--platform {platform}: not an asset pack (no calibrated memcpy model)")
    model = models_by_kind(pack.models)["memcpy"]
    n = np.array([c["elements"] for c in cases], dtype=float)
    view = TaskView.from_columns("memcpy", elements=n, dtype_bytes=np.full(len(n), 4.0), bytes=8.0 * n)
    for c, p in zip(cases, model.predict(view, pack.platform), strict=True):
        c["predicted_s"] = float(p)


def markdown(cases: list[dict], meta: dict) -> str:
    us = 1e6
    lines = [
        "# Permuted copies against the memcpy roofline (CPU, 1 thread)",
        "",
        f"{meta['date']}, torch {meta['torch']}; asset pack `{meta['platform']}`; {meta['rounds']} shuffled rounds, "
        f"each the median of {meta['calls']} cold calls (last-level cache evicted before each); median over rounds. "
        f"Wall time {meta['wall_s']:.0f} s. Reproduce: `flock /tmp/tuner-measure.lock python "
        f"experiments/strided_copy_cpu.py --platform {meta['platform']}`",
        "",
        "`permute`: `x.permute(...).contiguous()`; runs = contiguous elements between jumps; `memcpy`: a plain copy "
        "of as many elements; `predicted`: the pack's memcpy roofline, which prices the synthesisers' head split / "
        "merge copies today.",
        "",
        "| copy | elements | run | permute us | memcpy us | permute / memcpy | predicted us | permute / predicted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cases:
        lines.append(f"| {c['label']} | {c['elements']} | {c['run']} | {c['permute_s'] * us:.1f} | "
                     f"{c['memcpy_s'] * us:.1f} | {c['permute_s'] / c['memcpy_s']:.2f} | {c['predicted_s'] * us:.1f} | "
                     f"{c['permute_s'] / c['predicted_s']:.2f} |")
    gpt = [c for c in cases if c["label"].startswith(("qkv", "context"))]
    if gpt:
        total = sum(c["permute_s"] for c in gpt)
        pred = sum(c["predicted_s"] for c in gpt)
        lines += ["", f"The GPT step's four head copies (batch 8; each runs once per layer): {total * 1e3:.3f} ms "
                  f"measured alone against {pred * 1e3:.3f} ms priced (x{total / pred:.2f})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--platform", default="cpu-local-zen4", help="asset pack whose memcpy model prices the copies")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "strided_copy_cpu"))
    args = ap.parse_args(argv)
    import torch

    from experiments.common import fail
    from predictor.timing.platforms import UnknownPlatformError
    from predictor.timing.platforms.assets import AssetPackError

    cases = _cases()
    try:
        predict(cases, args.platform)  # before measuring: a bad --platform fails at once
    except (AssetPackError, UnknownPlatformError) as exc:
        fail(str(exc))
    t0 = time.perf_counter()
    measure(cases, args.rounds, args.calls, args.seed)
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
            "platform": args.platform, "rounds": args.rounds, "calls": args.calls,
            "wall_s": time.perf_counter() - t0}
    write_results(Path(args.out), {"meta": meta, "cases": cases}, markdown(cases, meta))
    print(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
