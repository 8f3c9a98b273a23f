"""Megatron-LM's mixture-of-experts flags, read into a :class:`MoESpec` and written from one.

Read: ``--num-experts --moe-router-topk --moe-expert-capacity-factor --moe-ffn-hidden-size
--moe-shared-expert-intermediate-size --moe-grouped-gemm --moe-layer-freq`` (first-k dense layers, then every
n-th MoE), the dispatcher (``--moe-token-dispatcher-type alltoall`` or ``flex`` with
``--moe-flex-dispatcher-backend deepep``, the default, or the deprecated ``--moe-enable-deepep``) and node-limited
routing (``--moe-router-num-groups`` / ``--moe-router-group-topk``). Without ``--moe-router-force-load-balancing``
or a capacity factor, a note says routing is priced balanced; ``--overlap-moe-expert-parallel-comm`` reads with a
note that its all-to-all hiding is not modelled.
"""

from __future__ import annotations

from predictor.sources.synth.transformer import MoESpec, ParallelPlan, TransformerSpec
from predictor.sources.synth.transformer_spec import moe_layout
from tuner.launch.common import LaunchError, dispatcher_note
from tuner.launch.shell import literal_value

__all__ = ["MOE_FLOAT_FLAGS", "MOE_INT_FLAGS", "MOE_STR_FLAGS", "MOE_SWITCHES", "OVERLAP_NOTE", "ROUTING_NOTE", "moe_args",
           "read_moe"]

MOE_INT_FLAGS = {"--num-experts": "experts", "--moe-router-topk": "top_k", "--moe-ffn-hidden-size": "moe_ffn",
                 "--moe-shared-expert-intermediate-size": "shared_ffn", "--moe-router-num-groups": "router_groups",
                 "--moe-router-group-topk": "router_group_topk"}
MOE_FLOAT_FLAGS = {"--moe-expert-capacity-factor": "capacity_factor"}
MOE_STR_FLAGS = {"--moe-layer-freq": "moe_layer_freq", "--moe-token-dispatcher-type": "moe_dispatcher",
                 "--moe-flex-dispatcher-backend": "flex_backend"}
MOE_SWITCHES = {"--moe-grouped-gemm", "--moe-router-force-load-balancing", "--moe-enable-deepep",
                "--overlap-moe-expert-parallel-comm"}

#: what tuner prices of Megatron's merged 1F1B schedule that hides the expert all-to-all behind the other micro-batch
OVERLAP_NOTE = ("--overlap-moe-expert-parallel-comm not modelled: the dispatch and combine are priced on the "
                "critical path, as without it (the Megatron-core MoE team's Qwen3-235B-A22B, EP 32 with DeepEP, "
                "took 17.6 s a step with it against 19.7 s without, Megatron-MoE-ModelZoo best_practice/qwen3)")

#: a dropless MoE run whose router is not forced to balance: what tuner prices and how to price the skew
ROUTING_NOTE = ("routing priced as balanced experts; a learned router sends the busiest expert-parallel rank more "
                "tokens (the Megatron-core MoE team's Qwen3-235B-A22B runs without "
                "--moe-router-force-load-balancing: 9-24 % slower); --moe-expert-capacity-factor F prices every "
                "rank at F x the mean share")


def read_moe(values: dict, layers: int, source: str, notes: list[str]) -> MoESpec | None:
    """The MoE of Megatron's parsed ``values`` (None without ``--num-experts``); notes appended to ``notes``."""
    dispatcher = _dispatcher(values, notes)
    if not values.get("experts"):
        return None
    if not values.get("capacity_factor", 1.0) > 0:
        raise LaunchError(f"{source}: --moe-expert-capacity-factor must be > 0")
    expert_ffn = values.get("moe_ffn")
    if expert_ffn is not None and expert_ffn < 1:
        raise LaunchError(f"{source}: --moe-ffn-hidden-size must be >= 1 (got {expert_ffn})")
    shared = values.get("shared_ffn", 0)
    if shared < 0:
        raise LaunchError(f"{source}: --moe-shared-expert-intermediate-size must be >= 0 (got {shared})")
    k, every = _dense_layers(values.get("moe_layer_freq"), layers, notes)
    if values.get("--overlap-moe-expert-parallel-comm"):
        notes.append(OVERLAP_NOTE)
    if not values.get("--moe-router-force-load-balancing") and "capacity_factor" not in values:
        notes.append(ROUTING_NOTE)
    groups, group_topk = values.get("router_groups") or 0, values.get("router_group_topk") or 0
    if bool(groups) != bool(group_topk):
        raise LaunchError(f"{source}: --moe-router-num-groups and --moe-router-group-topk go together")
    if groups and (values["experts"] % groups or not 1 <= group_topk <= groups):
        raise LaunchError(f"{source}: --moe-router-num-groups {groups} must divide --num-experts {values['experts']} "
                          f"and --moe-router-group-topk {group_topk} be 1 .. {groups}")
    return MoESpec(experts=int(values["experts"]), top_k=int(values.get("top_k", 2)),
                   capacity_factor=float(values.get("capacity_factor", 1.0)), ffn=expert_ffn,
                   shared_ffn=int(shared), dense_layers=k, every=every,
                   grouped_gemm=bool(values.get("--moe-grouped-gemm")), dispatcher=dispatcher,
                   router_groups=int(groups), router_group_topk=int(group_topk))


def _dispatcher(values: dict, notes: list[str]) -> str:
    """``moe.dispatcher`` of Megatron's flags: the flex dispatcher's backends as DeepEP (hybridep and ncclep with a
    note), the all-gather dispatcher as the all-to-all (with a note)."""
    kind = values.get("moe_dispatcher")
    if kind != "flex" and not values.get("--moe-enable-deepep"):
        note = dispatcher_note("--moe-token-dispatcher-type", kind)
        if note:
            notes.append(note)
        return "alltoall"
    backend = values.get("flex_backend", "deepep")
    if backend != "deepep":
        notes.append(f"--moe-flex-dispatcher-backend {backend}: priced as DeepEP's normal kernels (one copy per "
                     "destination node over the network, forwarded over NVLink)")
    return "deepep"


def _dense_layers(freq: str | None, layers: int, notes: list[str]) -> tuple[int, int]:
    """(first dense layers, MoE every n-th layer after them) of Megatron's ``--moe-layer-freq``: ``1`` (every
    layer MoE) or a list pattern of first-k dense layers and then every n-th MoE, ``([0]*k+([0]*(n-1)+[1])*m)``.
    An integer ``n`` (Megatron: MoE at layers 0, n, 2n, ...) or a list of that shape reads as every n-th layer
    from layer n - 1, with a note (the count differs by one where ``n`` does not divide the layers); any other
    pattern reads as every layer MoE, with a note."""
    if freq is None or freq.strip() == "1":
        return 0, 1
    value = literal_value(freq)
    pattern = [int(i % value == 0) for i in range(layers)] if isinstance(value, int) and value > 1 else value
    if isinstance(pattern, list) and len(pattern) == layers and set(pattern) <= {0, 1}:
        layout = moe_layout([v == 1 for v in pattern])
        if layout is not None:
            return layout
        every = _period_from_first(pattern)
        if every is not None:
            priced = layers // every
            notes.append(f"--moe-layer-freq {freq}: MoE at layers 0, {every}, {2 * every}, ... ({sum(pattern)} of "
                         f"{layers}) priced as layers {every - 1}, {2 * every - 1}, ... ({priced}): tuner models "
                         "first-k dense layers, then every n-th layer MoE")
            return 0, every
    notes.append(f"--moe-layer-freq {freq} read as every layer an MoE layer (tuner models first-k dense layers and "
                 "every n-th layer MoE after them)")
    return 0, 1


def _period_from_first(pattern: list[int]) -> int | None:
    """``n`` where ``pattern`` has MoE (1) exactly at layers 0, n, 2n, ... (n > 1, at least two of them); else None."""
    moe = [i for i, v in enumerate(pattern) if v]
    if len(moe) < 2 or moe[0] != 0:
        return None
    n = moe[1]
    return n if n > 1 and moe == list(range(0, len(pattern), n)) else None


def moe_args(spec: TransformerSpec, plan: ParallelPlan) -> list[str]:
    """The MoE flags of ``spec`` under ``plan`` (none for a dense model)."""
    moe = spec.moe
    if moe is None:
        return []
    a = ["--num-experts", str(moe.experts), "--moe-router-topk", str(moe.top_k),
         "--moe-expert-capacity-factor", f"{moe.capacity_factor:g}", "--expert-model-parallel-size", str(plan.ep)]
    if plan.etp != plan.tp:
        a += ["--expert-tensor-parallel-size", str(plan.etp)]
    if moe.ffn:
        a += ["--moe-ffn-hidden-size", str(moe.ffn)]
    if moe.shared_ffn:
        a += ["--moe-shared-expert-intermediate-size", str(moe.shared_ffn)]
    k, every = moe.dense_layers, moe.every
    if every > 1:  # whole periods after the first k dense layers, then the dense remainder
        periods, rest = divmod(spec.layers - k, every)
        a += ["--moe-layer-freq", f"([0]*{k}+([0]*{every - 1}+[1])*{periods}+[0]*{rest})"]
    elif k:
        a += ["--moe-layer-freq", f"([0]*{k}+[1]*{spec.layers - k})"]
    if moe.grouped_gemm:
        a.append("--moe-grouped-gemm")
    if moe.dispatcher == "deepep":
        a += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
    if moe.router_groups:
        a += ["--moe-router-num-groups", str(moe.router_groups), "--moe-router-group-topk", str(moe.router_group_topk)]
    return a
