"""Megatron-LM's pipeline splits: the layers of each virtual stage as Megatron-core places them (an uneven first /
last stage, the embedding and the loss counted as layers, or a ``--pipeline-model-parallel-layout``) and the launch
flags that ask for a split."""

from __future__ import annotations

import re

from predictor.sources.synth.transformer import ParallelPlan

__all__ = ["LAYOUT_FLAG", "PP_PARTITIONS", "counted_ends", "layout_stage_layers", "layout_text",
           "megatron_stage_layers", "split_flags"]

#: Megatron-core's flag naming each virtual stage's layers (Megatron-core 0.13 and later)
LAYOUT_FLAG = "--pipeline-model-parallel-layout"


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


def split_flags(layers: int, plan: ParallelPlan, mtp: int = 0) -> list[str]:
    """Megatron-LM's flags for ``plan.stage_layers``: the embedding and / or the loss counted as layers, or an
    uneven first / last stage where they give it, else Megatron-core's ``--pipeline-model-parallel-layout``."""
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
    return [LAYOUT_FLAG, layout_text(plan.stage_layers, mtp)]


def _unrolled(layout: str) -> str:
    """``layout`` with its cosmetic commas dropped and its repetitions written out: ``(...)*n`` first, then a
    character's ``x*n`` (Megatron-core's ``PipelineParallelLayerLayout.parse_str_to_list``)."""
    text = layout.strip().strip("'\"").replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    return re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)


def layout_stage_layers(layout: str, layers: int, pp: int) -> tuple[tuple[int, ...] | None, int, int, bool]:
    """(decoder layers of each virtual stage — None for an even split —, virtual stages per pipeline rank, MTP
    layers, whether they all sit on the last virtual stage) of Megatron-core's ``--pipeline-model-parallel-layout``:
    stages split by ``|`` in model order (virtual
    stage ``i`` on pipeline rank ``i % pp``), ``E`` the embedding, ``t`` a decoder layer, ``m`` a multi-token
    prediction layer, ``L`` the loss. :class:`ValueError` where Megatron refuses the layout or tuner cannot place
    it (the embedding not on the first virtual stage, the loss not on the last, a stage between them without a
    decoder layer)."""
    stages = _unrolled(layout).split("|")
    odd = sorted({c for stage in stages for c in stage} - set("EtmL"))
    if odd:
        raise ValueError(f"layout {layout!r}: unknown layer character(s) {' '.join(odd)} (E, t, m, L)")
    if len(stages) % pp:
        raise ValueError(f"layout {layout!r}: {len(stages)} stages do not divide over pp={pp}")
    flat = "".join(stages)
    if flat.count("E") != 1 or flat.count("L") != 1 or not flat.startswith("E") or not flat.endswith("L"):
        raise ValueError(f"layout {layout!r}: the embedding E must come first and the loss L last, once each")
    if not stages[0].startswith("E") or not stages[-1].endswith("L"):
        raise ValueError(f"layout {layout!r}: tuner models the embedding on the first virtual stage and the loss on "
                         "the last")
    counts = tuple(stage.count("t") for stage in stages)
    if sum(counts) != layers:
        raise ValueError(f"layout {layout!r} names {sum(counts)} decoder layers t, the model has {layers}")
    if any(n < 1 for n in counts[1:-1]):
        raise ValueError(f"layout {layout!r}: a stage between the first and the last holds no decoder layer")
    even = len(set(counts)) == 1
    return (None if even else counts), len(stages) // pp, flat.count("m"), stages[-1].count("m") == flat.count("m")


def layout_text(stage_layers: tuple[int, ...], mtp: int = 0) -> str:
    """``--pipeline-model-parallel-layout`` for ``stage_layers`` (decoder layers of each virtual stage) and ``mtp``
    multi-token prediction layers: the embedding on the first, the MTP layers and the loss on the last, runs of
    equal stages between them folded, e.g. ``Et|(tt|)*3tmL``."""
    def stage(n: int) -> str:
        return "t" if n == 1 else (f"t*{n}" if n > 3 else "t" * n)

    out = ["E" + stage(stage_layers[0]) + "|"]
    middle = list(stage_layers[1:-1])
    while middle:
        run = next((i for i, n in enumerate(middle) if n != middle[0]), len(middle))
        out.append(f"({stage(middle[0])}|)*{run}" if run > 1 else stage(middle[0]) + "|")
        middle = middle[run:]
    return "".join(out) + stage(stage_layers[-1]) + "m" * mtp + "L"


#: Megatron-DeepSpeed's --pp-partition-method values -> (embedding, output layer) counted as pipeline layers
PP_PARTITIONS = {"type:transformer": (False, False), "type:transformer|embedding": (True, True)}


def counted_ends(values: dict) -> tuple[bool, bool]:
    """Whether the pipeline split counts the embedding and the loss as a layer each (Megatron's
    ``--account-for-embedding/loss-in-pipeline-split``, Megatron-DeepSpeed's ``--pp-partition-method``)."""
    counted = PP_PARTITIONS.get(values.get("pp_partition") or "type:transformer", (False, False))
    return (bool(values.get("--account-for-embedding-in-pipeline-split")) or counted[0],
            bool(values.get("--account-for-loss-in-pipeline-split")) or counted[1])
