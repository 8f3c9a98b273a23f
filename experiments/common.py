"""What the experiment scripts share: the one way to stop on bad input (one line, exit code 2), and the
plumbing of the small gloo probes on forked local ranks (``run_gloo_ranks``, ``span_after_last_arrival``;
used by ``collective_protocol_cpu`` and ``comm_overlap_cpu``)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with code 2 (bad input), no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


REPO = Path(__file__).resolve().parents[1]


def repo_relative(path: str | Path) -> str:
    """``path`` relative to the repository where it lies inside it (for the reproduce lines of result
    files), else as given."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(path)


def write_results(out: Path, data: dict, markdown_text: str) -> None:
    """Write an experiment's results as ``OUT.json`` and ``OUT.md`` (folders made; each file written aside
    and renamed into place, the markdown last) and say where."""
    from tuner.report import atomic_write_text

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out.with_suffix(".json"), json.dumps(data, indent=1))
    atomic_write_text(out.with_suffix(".md"), markdown_text)
    print(f"wrote {repo_relative(out.with_suffix('.md'))}")


def host_check(manifest: dict | None) -> dict:
    """This host's CPU signature and, when a calibrated CPU pack predicts it, why the pack may not
    describe this CPU (:func:`predictor.timing.platforms.cpu_local.signature_mismatch`; None when they agree or
    no pack is used). A mismatch is printed on stderr at once, before anything is measured."""
    from predictor.timing.platforms.cpu_local import cpu_signature, signature_mismatch

    here = cpu_signature()
    why = signature_mismatch((manifest or {}).get("cpu"), here) if manifest is not None else None
    if why:
        print(f"warning: {why}", file=sys.stderr)
    return {"cpu": here, "pack_cpu_mismatch": why}


def host_line(check: dict) -> str:
    """One line for a result file: the CPU measured on and, if any, the pack's host mismatch."""
    from predictor.timing.platforms.cpu_local import describe_cpu

    line = f"CPU: {describe_cpu(check.get('cpu') or {})}."
    if check.get("pack_cpu_mismatch"):
        line += f" **Host check: {check['pack_cpu_mismatch']}.**"
    return line


def _gloo_rank(rank: int, world: int, port: int, probe: Callable, cfg: dict, out: str) -> None:
    """One forked rank: join the local gloo group of ``world`` ranks on 127.0.0.1:``port`` with one torch
    thread, run ``probe(dist, rank, cfg)``; rank 0 writes its rows to ``out`` (JSON)."""
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rows = probe(dist, rank, cfg)
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_gloo_ranks(probe: Callable[..., list[dict]], cfg: dict, world: int = 2) -> list[dict]:
    """Run ``probe(dist, rank, cfg) -> rows`` on ``world`` forked local gloo ranks (one torch thread
    each); rank 0's rows."""
    import torch.multiprocessing as mp

    from predictor.timing.calibration.collectives import free_port

    with tempfile.TemporaryDirectory(prefix="gloo-probe-") as tmp:
        out = str(Path(tmp) / "rows.json")
        mp.start_processes(_gloo_rank, args=(world, free_port(), probe, cfg, out), nprocs=world, join=True,
                           start_method="fork")
        return json.loads(Path(out).read_text())


def span_after_last_arrival(dist, start: float, end: float) -> float:
    """Seconds from the last rank's ``start`` to the last rank's ``end`` (``perf_counter`` readings: one
    clock for every process of the host), gathered over the group."""
    import torch

    every = [torch.empty(2, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(every, torch.tensor([start, end], dtype=torch.float64))
    return max(float(v[1]) for v in every) - max(float(v[0]) for v in every)
