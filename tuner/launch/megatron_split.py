"""Megatron-LM's pipeline splits: the layers of each virtual stage as Megatron-core places them (an uneven first /
last stage, or the embedding and the loss counted as layers) and the launch flags that ask for a split."""

from __future__ import annotations

from predictor.sources.synth.transformer import ParallelPlan
from tuner.launch.common import LaunchError

__all__ = ["PP_PARTITIONS", "counted_ends", "megatron_stage_layers", "split_flags"]


def megatron_stage_layers(layers: int, pp: int, v: int = 1, *, first: int | None = None, last: int | None = None,
                          embedding: bool = False, loss: bool = False) -> tuple[int, ...] | None:
    """Layers of each virtual pipeline stage (model order) as Megatron-core places them
    (``get_num_layers_to_build``): the first / last pipeline rank ``first`` / ``last`` layers (over its
    ``v`` chunks) and the rest even; or, with the embedding and / or the loss counted as a layer, ``(layers
    + 1 + 1) / (pp x v)`` each, the first / last chunk one fewer. None: an even split. :class:`ValueError`
    where Megatron refuses the split."""
    if pp == 1:
        return None
    if first is not None or last is not None:
        if embedding or loss:
            raise ValueError("an uneven first / last pipeline stage does not go with the embedding or the loss "
                             "counted in the split")
        given = [n for n in (first, last) if n is not None]
        left, rest = pp - len(given), layers - sum(given)
        if left and rest % left or not left and rest:
            raise ValueError(f"the {rest} layers left do not split evenly over {left} pipeline stages")
        ranks = [rest // left if left else 0] * pp
        ranks[0] = ranks[0] if first is None else first
        ranks[-1] = ranks[-1] if last is None else last
        if any(n % v for n in ranks):
            raise ValueError(f"the stages' layers {ranks} do not split over {v} virtual stages each")
        chunks = [ranks[s] // v for _ in range(v) for s in range(pp)]
    elif embedding or loss:
        total = layers + embedding + loss
        if total % (pp * v):
            raise ValueError(f"{layers} layers with the embedding / loss counted do not split over {pp * v} "
                             "virtual stages")
        chunks = [total // (pp * v)] * (pp * v)
        chunks[0] -= embedding
        chunks[-1] -= loss
    else:
        return None
    return None if len(set(chunks)) == 1 else tuple(chunks)


def split_flags(layers: int, plan: ParallelPlan) -> list[str]:
    """Megatron-LM's flags for ``plan.stage_layers``; :class:`LaunchError` for a split it cannot express."""
    if plan.stage_layers is None:
        return []
    pp, v = plan.pp, plan.virtual_stages_effective
    for emb, loss in ((True, True), (True, False), (False, True)):
        try:
            if megatron_stage_layers(layers, pp, v, embedding=emb, loss=loss) == plan.stage_layers:
                return (["--account-for-embedding-in-pipeline-split"] if emb else []) + \
                       (["--account-for-loss-in-pipeline-split"] if loss else [])
        except ValueError:
            continue
    ranks = [plan.rank_layers(layers, s) for s in range(pp)]
    middle = ranks[1] if pp > 2 else None
    first = ranks[0] if ranks[0] != middle else None
    last = ranks[-1] if ranks[-1] != middle else None
    try:
        if megatron_stage_layers(layers, pp, v, first=first, last=last) == plan.stage_layers:
            return ((["--decoder-first-pipeline-num-layers", str(first)] if first is not None else []) +
                    (["--decoder-last-pipeline-num-layers", str(last)] if last is not None else []))
    except ValueError:
        pass
    raise LaunchError(f"stage_layers {list(plan.stage_layers)}: Megatron-LM splits a pipeline evenly but for its first "
                      "and last stage, or with the embedding and the loss counted as layers")


#: Megatron-DeepSpeed's --pp-partition-method values -> (embedding, output layer) counted as pipeline layers
PP_PARTITIONS = {"type:transformer": (False, False), "type:transformer|embedding": (True, True)}


def counted_ends(values: dict) -> tuple[bool, bool]:
    """Whether the pipeline split counts the embedding and the loss as a layer each (Megatron's
    ``--account-for-embedding/loss-in-pipeline-split``, Megatron-DeepSpeed's ``--pp-partition-method``)."""
    counted = PP_PARTITIONS.get(values.get("pp_partition") or "type:transformer", (False, False))
    return (bool(values.get("--account-for-embedding-in-pipeline-split")) or counted[0],
            bool(values.get("--account-for-loss-in-pipeline-split")) or counted[1])
