"""What one eager PyTorch op costs the host on a GPU machine, with and without the profiler.

The calibration's T1..T5 (:mod:`predictor.timing.calibration.overheads`) come from a *profiled* training
step, corrected by the profiler's mean cost per event once per gap. This script measures the
host's real issue cost of single-kernel ops in a tight loop (no synchronisation, tiny tensors, so
the GPU never holds the host back) and the same loop under ``torch.profiler``, per op type; the
sum T1 + T2 + T3 + T4 of an asset pack is what the simulator charges such an op.

Run (GPU machine): ``python experiments/host_op_cost.py --out host_op_cost.json``
Writes a JSON with, per op: seconds per op unprofiled and profiled, and the pack's charge.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _ops(device: torch.device) -> dict:
    """The calibration's single-kernel ops, plus ``F.linear`` (a transpose view + addmm) and a view +
    reshape (no kernel)."""
    from predictor.timing.calibration.overheads import single_kernel_ops

    ops = single_kernel_ops(device)
    x = torch.randn(64, 64, device=device)
    w = torch.randn(64, 64, device=device)
    bias = torch.randn(64, device=device)
    ops["linear"] = lambda: F.linear(x, w, bias)
    ops["view+reshape (no kernel)"] = lambda: x.view(4096).reshape(64, 64)
    return ops


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="host_op_cost.json")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--pack", default=str(REPO / "assets" / "h100"))
    args = ap.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    from predictor.timing.calibration.overheads import host_seconds_per_call

    device = torch.device("cuda")
    rows = {}
    for name, fn in _ops(device).items():
        plain = min(host_seconds_per_call(fn, args.calls, device) for _ in range(3))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            profiled = host_seconds_per_call(fn, max(200, args.calls // 10), device)
        rows[name] = {"unprofiled_s": plain, "profiled_s": profiled}
        print(f"{name:<26} {plain * 1e6:7.2f} us unprofiled, {profiled * 1e6:7.2f} us profiled", flush=True)
    charge = None
    manifest = Path(args.pack) / "manifest.json"
    if manifest.exists():
        o = json.loads(manifest.read_text())["overheads"]
        charge = {"one_kernel_op_s": o["t1_s"] + o["t2_s"] + o["t3_s"] + o["t4_s"], "t": {k: o[k] for k in
                  ("t1_s", "t2_s", "t3_s", "t4_s", "t5_s")}}
        print(f"the pack charges a one-kernel op T1+T2+T3+T4 = {charge['one_kernel_op_s'] * 1e6:.1f} us")
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
                                          "ops": rows, "pack_charge": charge}, indent=1))


if __name__ == "__main__":
    main()
