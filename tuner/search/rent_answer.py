"""The answer of a ``space: rent`` search: the Pareto front, the picks, and how to launch a pick.

Only ``ok`` records take part: they fit in memory and meet the deadline and the budget. The
front is the set of records no other record beats on both time to train and cost;
:func:`picks` names the cheapest (the cheapest plan that meets the deadline, within the budget)
and the fastest (the fastest within the budget, by the deadline); :func:`best_per_accelerator`
names each accelerator's cheapest and fastest; :func:`launch_arguments` says how to start one.
"""

from __future__ import annotations

import math
import shlex

from predictor.sources.synth.transformer import ParallelPlan, TransformerSpec
from tuner.launch import megatron_command

__all__ = ["feasible", "pareto_front", "dominates", "picks", "best_per_accelerator", "best_per_unit",
           "launch_arguments"]


def feasible(records: list[dict]) -> list[dict]:
    """Records that fit in memory and meet the deadline and the budget, with both objectives."""
    return [r for r in records if r.get("status") == "ok" and r.get("time_to_train_h") is not None
            and r.get("usd") is not None]


def dominates(a: dict, b: dict) -> bool:
    """``a`` is no worse than ``b`` on time to train and cost, and better on one."""
    ta, ua, tb, ub = a["time_to_train_h"], a["usd"], b["time_to_train_h"], b["usd"]
    return ta <= tb and ua <= ub and (ta < tb or ua < ub)


def pareto_front(records: list[dict]) -> list[dict]:
    """The feasible records no other feasible record dominates, fastest first (one per (time, cost) point)."""
    front: list[dict] = []
    best_usd = math.inf
    for r in sorted(feasible(records), key=lambda r: (r["time_to_train_h"], r["usd"])):
        if r["usd"] < best_usd:
            front.append(r)
            best_usd = r["usd"]
    return front


def picks(records: list[dict]) -> dict[str, dict | None]:
    """``cheapest`` and ``fastest`` feasible records (``None`` when no record is feasible)."""
    ok = feasible(records)
    if not ok:
        return {"cheapest": None, "fastest": None}
    return {"cheapest": min(ok, key=lambda r: (r["usd"], r["time_to_train_h"])),
            "fastest": min(ok, key=lambda r: (r["time_to_train_h"], r["usd"]))}


def best_per_accelerator(records: list[dict], accelerators: list[str]) -> dict[str, dict[str, dict | None]]:
    """Accelerator -> its ``cheapest`` and ``fastest`` feasible records."""
    return {a: picks([r for r in records if r.get("accelerator") == a]) for a in accelerators}


def best_per_unit(records: list[dict]) -> dict[str, dict[str, str]]:
    """Accelerator -> device count (as text) -> the key of its fastest feasible record, or why there is none.

    Within one accelerator and device count time and cost both scale with the iteration time, so
    the fastest plan is also the cheapest. Without a feasible record the entry is ``miss:REASON``
    (``memory``, ``deadline``, ``budget``, ``failed``) of the unit's fastest prediction, or of its
    first record.
    """
    units: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        units.setdefault((r["accelerator"], r["devices"]), []).append(r)
    out: dict[str, dict[str, str]] = {}
    for (acc, dev), recs in units.items():
        ok = feasible(recs)
        if ok:
            entry = min(ok, key=lambda r: r["time_to_train_h"])["key"]
        else:
            timed = [r for r in recs if r.get("time_to_train_h") is not None]
            first = min(timed, key=lambda r: r["time_to_train_h"]) if timed else recs[0]
            why = first.get("reason") or first.get("status", "failed")
            entry = "miss:" + (why.split(":")[0] if first.get("status") == "infeasible" else first.get("status", "failed"))
        out.setdefault(acc, {})[str(dev)] = entry
    return out


def launch_arguments(record: dict, spec: TransformerSpec | None = None) -> dict[str, str]:
    """How to start a record's plan: the ``torchrun`` line; for a transformer (``spec``) the Megatron-LM
    command of :func:`tuner.launch.megatron_command` with ``--train-iters``.

    DLRM and module plans give the per-rank batch and, for DLRM, the sharder that placed the tables.
    """
    devices, per_node = record["devices"], record["devices_per_node"]
    f = record.get("fields") or {}
    if record.get("kind") == "transformer" and spec is not None and f:
        cmd = megatron_command(spec, ParallelPlan(**f), per_node)
        if record.get("iterations"):
            cmd += ["--train-iters", str(record["iterations"])]
        return {"megatron": shlex.join(cmd)}
    nproc = math.gcd(devices, per_node)  # torchrun starts the same count on every node
    out = {"torchrun": f"torchrun --nnodes {devices // nproc} --nproc-per-node {nproc}"}
    if record.get("kind") == "dlrm" and f:
        out["dlrm"] = (f"batch per rank {f['global_batch'] // devices} (global {f['global_batch']}), tables placed "
                       f"by the {f['sharder']} sharder (assignment in results.json)")
    elif f:
        out["module"] = f"batch per device {f.get('batch_size')} (global {f.get('global_batch')}), data parallel"
    return out
