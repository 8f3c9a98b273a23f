"""FSDP plans of the transformer synthesiser and the published multi-node rows' data file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from predictor.simulate import simulate
from predictor.sources.synth.transformer import (
    ParallelPlan,
    PlanError,
    TransformerSpec,
    build_transformer_graph,
    check_plan,
    transformer_timing,
)
from predictor.sources.synth.transformer_memory import memory_per_stage
from predictor.timing.platforms import get_platform, load_catalog

DATA = Path(__file__).resolve().parents[1] / "experiments" / "multinode_published.yaml"
SPEC = TransformerSpec(layers=4, hidden=512, heads=8, seq=256, vocab=4096)
A100 = get_platform("a100-80gb")


def _frame(plan: ParallelPlan, spec: TransformerSpec = SPEC):
    return build_transformer_graph(spec, plan, detail="kernel").tasks_frame()


def test_fsdp_gathers_each_layer_twice_and_reduce_scatters_every_micro_batch():
    plan = ParallelPlan(dp=16, micro_batch=2, global_batch=64, fsdp=True, overlap_grad_reduce=True)
    df = _frame(plan)
    m = plan.micro_batches
    gathers = df[df.name.str.match(r"fsdp\.layer\[\d+\]\.all_gather") & (df.kind == "all_gather")]
    assert len(gathers) == 2 * SPEC.layers * m  # forward and backward, per micro-batch
    reduces = df[df.name.str.match(r"fsdp\.layer\[\d+\]\.reduce_scatter") & (df.kind == "reduce_scatter")]
    assert len(reduces) == SPEC.layers * m
    assert not df.name.str.startswith("dp_grad").any()  # no DDP bucket all-reduce
    # one process group: the gathers and the reduce-scatters share its NCCL stream, in issue order
    comm = set(pd_kinds(df).processor)
    assert comm == {"stream comm"}


def pd_kinds(df):
    """The FSDP collectives (not their CPU ops) of a task frame."""
    return df[df.name.str.startswith("fsdp.") & df.kind.isin(["all_gather", "reduce_scatter"])]


def test_fsdp2_copies_each_gathered_layer_out_and_each_gradient_in():
    """PyTorch's fully_shard copies the all-gather output into the parameters on the compute stream (forward and
    backward) and the gradients into the reduce-scatter input (in the reduce dtype) beside the collectives."""
    plan = ParallelPlan(dp=8, micro_batch=2, global_batch=16, fsdp=True, grad_reduce_dtype="fp32")
    flat, fsdp2 = _frame(plan), _frame(ParallelPlan(**{**plan.to_dict(), "fsdp2": True}))
    assert not flat.name.str.contains("copy_").any()
    outs = fsdp2[fsdp2.name.str.endswith(".copy_out") & (fsdp2.kind == "memcpy") & (fsdp2["rank"] == 0)]
    ins = fsdp2[fsdp2.name.str.endswith(".copy_in") & (fsdp2.kind == "memcpy") & (fsdp2["rank"] == 0)]
    layer = 12 * SPEC.hidden**2  # a GPT layer's weights (its biases and norms are 0.2 % more)
    assert len(outs) == 2 * SPEC.layers + 1 and len(ins) == SPEC.layers + 1  # + the root unit's
    per_layer = outs[outs.name == "fsdp.layer[0].copy_out"].bytes.iloc[0]
    assert per_layer == pytest.approx(2 * 2 * layer, rel=0.01)  # read and write, bf16
    assert ins[ins.name == "fsdp.layer[0].reduce_scatter.copy_in"].bytes.iloc[0] == pytest.approx(per_layer / 4 * 6)
    compute = set(flat[flat.name.str.contains("fc1") & (flat.category != "cpu")].processor)
    assert set(outs.processor) <= compute and not set(ins.processor) & compute
    timing = transformer_timing(A100)
    t = [simulate(build_transformer_graph(SPEC, p, timing=timing), timing).iteration_s
         for p in (plan, ParallelPlan(**{**plan.to_dict(), "fsdp2": True}))]
    assert t[1] > t[0]
    # the all-gather output beside the parameters it fills, the model-dtype gradients beside the reduce-scatter input
    # (both as PyTorch FSDP keeps its shards: the fp32 weight shard is the master copy)
    extra = memory_per_stage(SPEC, ParallelPlan(**{**plan.to_dict(), "fsdp2": True}))[0].total_bytes \
        - memory_per_stage(SPEC, replace(plan, fsdp_fp32_params=True))[0].total_bytes
    assert extra == pytest.approx(2 * 2 * layer, rel=0.01)
    with pytest.raises(PlanError, match="fsdp2 .* needs fsdp"):
        check_plan(SPEC, ParallelPlan(dp=8, global_batch=8, fsdp2=True), 8)


def test_fsdp_keeping_gathers_to_the_backward_gathers_once_and_holds_every_layer():
    """SHARD_GRAD_OP (torchtitan's fsdp_reshard_after_forward = "never"): each micro-batch's forward gathers
    every layer and the backward uses them; gradients are reduce-scattered as with full sharding."""
    spec = TransformerSpec(layers=4, hidden=4096, heads=32, seq=1024, vocab=32000)
    full = ParallelPlan(dp=16, micro_batch=1, global_batch=32, fsdp=True)
    keep = replace(full, fsdp_reshard_after_forward=False)
    assert keep.label().endswith("-fsdp-zero2") and full.label().endswith("-fsdp")
    df = _frame(keep, spec)
    gathers = pd_kinds(df)[pd_kinds(df).kind == "all_gather"]
    assert len(gathers[gathers.name.str.match(r"fsdp\.layer")]) == spec.layers * keep.micro_batches
    assert not gathers.name.str.endswith("_bwd").any()
    assert len(pd_kinds(df)[pd_kinds(df).kind == "reduce_scatter"]) == len(
        pd_kinds(_frame(full, spec))[lambda d: d.kind == "reduce_scatter"])
    layer = 12 * spec.hidden**2
    extra = memory_per_stage(spec, keep)[0].total_bytes - memory_per_stage(spec, full)[0].total_bytes
    assert extra == pytest.approx((spec.layers - 2) * layer * 2, rel=0.01)  # every layer's bf16 weights, not two
    slow = A100.model_copy(update={"interconnect": A100.interconnect.model_copy(
        update={"nic_bandwidth_bytes_per_s": A100.interconnect.nic_bandwidth_bytes_per_s / 16,
                "inter_node_bandwidth_bytes_per_s": A100.interconnect.inter_node_bandwidth_bytes_per_s / 16})})
    timing = transformer_timing(slow)
    t_full, t_keep = (simulate(build_transformer_graph(spec, p, timing=timing), timing).iteration_s for p in (full, keep))
    assert t_keep < 0.85 * t_full  # on a slow network a third of the traffic saved shows


def test_hsdp_shards_inside_a_node_and_all_reduces_the_shards_across():
    """HSDP (fsdp_shard): each layer gathered and reduce-scattered over the 8 ranks of a node, the gradient
    shard then all-reduced over the 2 nodes holding it; states sharded over 8 ranks, not 16."""
    full = ParallelPlan(dp=16, micro_batch=1, global_batch=16, fsdp=True, grad_reduce_dtype="fp32")
    hsdp = replace(full, fsdp_shard=8)
    assert hsdp.label().endswith("-fsdp-hsdp8") and (hsdp.shard_ranks, hsdp.fsdp_replicas) == (8, 2)
    df = pd_kinds(_frame(hsdp))
    assert set(zip(df.world, df.nodes, strict=True)) == {(8, 1)}  # gathers and reduce-scatters inside the node
    f_all = _frame(hsdp)
    ar = f_all[f_all.name.str.endswith(".replicas") & (f_all.kind == "all_reduce")]
    rs = df[df.kind == "reduce_scatter"]
    assert len(ar) == len(rs) and set(zip(ar.world, ar.nodes, strict=True)) == {(2, 2)}
    assert ar.msg_bytes.iloc[0] == pytest.approx(rs.msg_bytes.iloc[0] / 8)  # the rank's shard, fp32
    wide = pd_kinds(_frame(full))
    assert set(zip(wide.world, wide.nodes, strict=True)) == {(16, 2)}
    m_full, m_hsdp = memory_per_stage(SPEC, full)[0], memory_per_stage(SPEC, hsdp)[0]
    assert m_hsdp.optimizer_bytes == pytest.approx(2 * m_full.optimizer_bytes)
    for bad, match in ((replace(full, fsdp=False, fsdp_shard=8), "needs fsdp"), (replace(full, fsdp_shard=3), "divide"),
                       (replace(full, fsdp_shard=1), "at least 2")):
        with pytest.raises(PlanError, match=match):
            check_plan(SPEC, bad, 16)


def test_pytorch_fsdp_keeps_its_fp32_weight_shard_as_the_master_copy():
    """PyTorch FSDP (FSDP1 with fsdp_fp32_params, FSDP2): 4 + 4 + 8 bytes a parameter over the shard group;
    Megatron-FSDP a 2-byte weight shard beside the 4-byte main weights: 18."""
    plan = ParallelPlan(dp=8, micro_batch=1, global_batch=8, fsdp=True)
    mega, torch1, torch2 = (memory_per_stage(SPEC, p)[0] for p in (
        plan, replace(plan, fsdp_fp32_params=True), replace(plan, fsdp2=True)))
    for m, per_param in ((mega, 18), (torch1, 16), (torch2, 16)):
        states = m.weights_bytes + m.grads_bytes + m.optimizer_bytes
        assert states == pytest.approx(m.params * per_param / 8)
    assert torch1.weights_bytes == pytest.approx(mega.weights_bytes * 2)  # fp32, not bf16


def test_fsdp_runs_without_pipelines_with_tensor_parallelism_inside():
    with pytest.raises(PlanError, match="fsdp"):
        check_plan(SPEC, ParallelPlan(pp=2, dp=4, global_batch=8, fsdp=True))
    check_plan(SPEC, ParallelPlan(tp=2, dp=4, global_batch=8, fsdp=True, sequence_parallel=True))
    assert ParallelPlan(dp=4, global_batch=8, fsdp=True).label().endswith("-fsdp")


def test_fsdp_with_tp_gathers_each_tp_ranks_shard_over_the_strided_data_parallel_group():
    # torchtitan's 2-D layout: TP 8 inside each node, FSDP over the 4 ranks of a TP position (one a node)
    plan = ParallelPlan(tp=8, dp=4, micro_batch=1, global_batch=8, fsdp=True, sequence_parallel=True)
    df = _frame(plan)
    def first_gather(frame):
        return frame[frame.name.str.match(r"fsdp\.layer\[0\]\.all_gather$") & (frame.kind == "all_gather")]

    gathers = first_gather(df)
    whole = first_gather(_frame(ParallelPlan(dp=4, micro_batch=1, global_batch=8, fsdp=True)))
    assert set(gathers.world) == {4} and set(gathers.nodes) == {4}
    # a TP rank gathers its share: 1/8 of the layer's matrices (norms and biases of the row-parallel
    # layers stay whole on every TP rank)
    assert gathers.msg_bytes.iloc[0] == pytest.approx(whole.msg_bytes.iloc[0] / 8, rel=0.01)
    assert df.kind.isin(["all_reduce", "all_gather", "reduce_scatter"]).any()  # TP collectives too


def test_fsdp_of_an_moe_model_gathers_experts_over_their_own_ranks():
    from predictor.sources.synth.transformer import MoESpec

    spec = TransformerSpec(layers=4, hidden=512, heads=8, seq=256, vocab=4096, mlp="swiglu",
                           moe=MoESpec(experts=8, top_k=2, dense_layers=1))
    df = _frame(ParallelPlan(dp=8, ep=2, micro_batch=1, global_batch=8, fsdp=True), spec)
    experts = df[df.name.str.match(r"fsdp\.layer\[\d+\]\.all_gather(_bwd)?\.experts$") & (df.kind == "all_gather")]
    dense = df[df.name.str.match(r"fsdp\.layer\[\d+\]\.all_gather(_bwd)?$") & (df.kind == "all_gather")]
    assert set(experts.world) == {4} and set(dense.world) == {8}  # dp / ep ranks hold the same experts
    # the dense first layer gathers no experts; the three MoE layers do, once forward and once backward
    assert len(experts) == 2 * (spec.layers - 1) and len(dense) == 2 * spec.layers
    assert (df.name.str.endswith(".reduce_scatter.experts") & (df.kind == "reduce_scatter")).sum() == spec.layers - 1


def test_fsdp_with_tp_slows_with_the_network():
    spec = TransformerSpec(layers=4, hidden=4096, heads=32, seq=2048, vocab=32000)
    plan = ParallelPlan(tp=8, dp=8, micro_batch=1, global_batch=8, fsdp=True, sequence_parallel=True)

    def seconds(platform):
        timing = transformer_timing(platform)
        return simulate(build_transformer_graph(spec, plan, timing=timing), timing).iteration_s

    slow = A100.model_copy(update={"interconnect": A100.interconnect.model_copy(
        update={"nic_bandwidth_bytes_per_s": A100.interconnect.nic_bandwidth_bytes_per_s / 16,
                "inter_node_bandwidth_bytes_per_s": A100.interconnect.inter_node_bandwidth_bytes_per_s / 16})})
    assert seconds(slow) > 1.2 * seconds(A100)  # the data-parallel gathers cross nodes, one rank a node


def test_fsdp_costs_more_than_ddp_across_slow_nodes_and_hides_on_nvlink():
    timing = transformer_timing(A100)
    spec = TransformerSpec(layers=4, hidden=2048, heads=16, seq=1024, vocab=8192)

    def seconds(plan):
        return simulate(build_transformer_graph(spec, plan, timing=timing), timing).iteration_s

    ddp = seconds(ParallelPlan(dp=8, micro_batch=4, global_batch=64))
    fsdp = seconds(ParallelPlan(dp=8, micro_batch=4, global_batch=64, fsdp=True))
    assert fsdp == pytest.approx(ddp, rel=0.15)  # inside one node the gathers hide behind compute
    wide = seconds(ParallelPlan(dp=64, micro_batch=4, global_batch=512, fsdp=True))
    assert wide > fsdp  # gathers and reduce-scatters over 8 nodes' NICs


def test_published_rows_name_their_sources_and_fit_one_source_per_chip():
    doc = yaml.safe_load(DATA.read_text())["sources"]
    catalog = load_catalog()
    fits: dict[str, list[str]] = {}
    for key, src in doc.items():
        assert src["cite"] and src["url"].startswith("https://"), key
        assert src["platform"] in catalog, key
        assert src["split"] in ("fit", "held-out"), key
        assert src["rows"], key
        # a row may end with a dict of its own fields (sequence length, model or plan fields)
        assert len({len(r) - isinstance(r[-1], dict) for r in src["rows"]}) == 1, f"{key}: rows of unequal length"
        if src["split"] == "fit":
            fits.setdefault(src["platform"].split("-")[0], []).append(key)
    assert all(len(v) == 1 for v in fits.values()), fits
    assert sum(src["split"] == "held-out" for src in doc.values()) >= 3


#: llm-foundry's scripts/train/yamls/pretrain/mpt-*.yaml at 33aeb79: d_model, n_layers, n_heads (760M, 1B and 3B
#: have n_heads lowered so that the head size is 128, FlashAttention's)
MPT_SHAPES = {"MPT-125M": (768, 12, 12), "MPT-350M": (1024, 24, 16), "MPT-760M": (1536, 24, 12),
              "MPT-1B": (2048, 24, 16), "MPT-3B": (2560, 32, 20), "MPT-7B": (4096, 32, 32), "MPT-13B": (5120, 40, 40),
              "MPT-30B": (7168, 48, 56), "MPT-70B": (8192, 80, 64)}


def test_mosaicml_rows_have_llm_foundrys_shapes():
    doc = yaml.safe_load(DATA.read_text())["sources"]
    for key, src in doc.items():
        if key.startswith("mosaic"):
            for name, hidden, layers, heads, *_ in src["rows"]:
                assert (hidden, layers, heads) == MPT_SHAPES[name], (key, name)



def test_mosaicml_large_scale_rows_run_as_their_sweep_says(multinode_validation):
    """llm-foundry's benchmarking/sweep.py (commit 5e85bd6): SHARD_GRAD_OP for 1B and 3B, Triton attention for
    13B and 30B, FlashAttention-2 for the others."""
    rows = [r for r in multinode_validation.load_rows() if r.key == "mosaic_h100_large"]
    assert len(rows) == 18 and {r.gpus for r in rows} == {128, 256, 512}
    for r in rows:
        assert r.plan.get("fsdp_reshard_after_forward", True) == (r.model not in ("MPT-1B", "MPT-3B")), r.model
        assert r.spec["attention"] == ("flash_triton" if r.model in ("MPT-13B", "MPT-30B") else "flash2"), r.model
        assert r.plan["global_batch"] == r.gpus * r.plan["micro_batch"]  # no gradient accumulation


def test_a100_entries_share_the_fitted_gemm_ceiling():
    # one constant per die, written back from experiments/multinode_validation.py's fit
    a40, a80 = get_platform("a100-40gb"), get_platform("a100-80gb")
    assert a40.gemm_efficiency_max == a80.gemm_efficiency_max < 0.93
    for p in (a40, a80, get_platform("h100-sxm")):
        assert "multinode_validation.py" in p.sources["gemm_efficiency_max"]


#: DGX Cloud Benchmarking recipes (v25.01 at 143b90d: configure.sh and the READMEs; v25.04 at 741c886: the README's
#: table): the global batch each recipe sets for a cluster of ``gpus`` (405B's proxies fix theirs)
DGXC_BATCH = {
    "dgxc_llama31": {"Llama3.1-8B": lambda g: 16 * g, "Llama3.1-70B": lambda g: 2 * g,
                     "Llama3.1-405B": lambda g: 252 * g // 576},
    "dgxc_llama31_nemo2": {"Llama3.1-8B": lambda g: 16 * g, "Llama3.1-70B": lambda g: 2 * g,
                           "Llama3.1-405B": lambda g: g // 2},
    "dgxc_nemotron4": {"Nemotron4-15B": lambda g: 4 * g, "Nemotron4-340B": lambda g: g // 4},
    "dgxc_nemotron4_nemo2": {"Nemotron4-15B": lambda g: 4 * g, "Nemotron4-340B": lambda g: g // 4},
    "dgxc_gpt3": {"GPT3-175B": lambda g: 2 * g}, "dgxc_gpt3_nemo2412": {"GPT3-175B": lambda g: 2 * g},
    "dgxc_grok1": {"Grok-1 314B": lambda g: 2 * g},
}


def test_dgx_cloud_rows_scale_the_recipes_batch_and_pair_bf16_with_fp8():
    doc = yaml.safe_load(DATA.read_text())["sources"]
    pairs: dict[tuple[str, str, int], set[str]] = {}
    for key, src in doc.items():
        if not key.startswith("dgxc"):
            continue
        assert src["published"] == "step_s", key
        for name, _heads, _hidden, _layers, gpus, gbs, *_rest in src["rows"]:
            base, precision = name.rsplit(" ", 1)
            assert precision in ("bf16", "fp8"), name
            fields = _rest[-1] if isinstance(_rest[-1], dict) else {}
            assert fields.get("fp8_linear", False) == (precision == "fp8"), name
            if "proxy" not in base:
                assert gbs == DGXC_BATCH[key][base](gpus), (key, name)
            pairs.setdefault((key, base, gpus), set()).add(precision)
    assert len(pairs) == 78 and all(v == {"bf16", "fp8"} for v in pairs.values())


def test_bigscience_rows_fill_48_nodes_with_the_embedding_in_a_pipeline_slot():
    # BLOOM's search: 48 nodes of 8 A100s, every plan TP x PP x DP = 384; DeepSpeed's
    # 'type:transformer|embedding' partition gives each stage (layers + 2) / PP slots
    src = yaml.safe_load(DATA.read_text())["sources"]["bigscience_176b"]
    assert src["published"] == "step_s" and src["defaults"]["pipeline_split"] == "embedding_and_loss"
    assert src["defaults"]["pp_scatter_gather"] is False  # DeepSpeed sends each TP rank's whole activation
    for row in src["rows"] + [[*r, None] for r in src["out_of_memory"]]:
        name, heads, hidden, layers, gpus, gbs, mbs, tp, pp, vp, seconds, *fields = row
        assert gpus == 384 and vp == 1 and (layers + 2) % pp == 0, name
        dp = gpus // (tp * pp)
        assert dp * tp * pp == gpus and gbs % (dp * mbs) == 0 and heads % tp == 0 and hidden % heads == 0, name
        assert seconds is None or seconds > 0
        assert all(set(f) <= {"memory_gib"} for f in fields), name
    bloom = [r for r in src["rows"] if r[0] == "BLOOM-176B"]
    assert {(r[2], r[3]) for r in bloom} == {(14336, 70)}  # README.md: NHIDDEN 14336, NLAYERS 70


def test_a_sources_own_network_replaces_the_catalog_entrys(multinode_validation):
    mod = multinode_validation
    rows = [r for r in mod.load_rows() if r.key == "bigscience_176b"]
    assert rows and all(r.network["nics_per_node"] == 4 for r in rows)
    own = mod.platform_for("a100-80gb", "nccl", None, rows[0].network)
    assert own.interconnect.nics_per_node == 4 and own.interconnect.nic_bandwidth_bytes_per_s == 12.5e9
    assert mod.platform_for("a100-80gb", "nccl").interconnect.nics_per_node == 8
    with pytest.raises(ValueError):
        mod.platform_for("a100-80gb", "nccl", None, {"nics_per_node": 0})
    # the source's 4 x 100 Gb/s per node is slower than the catalog's 8 x 200 Gb/s: its row predicts slower
    on_catalog_network = [mod.Row(**{**rows[0].__dict__, "network": {}})]
    assert mod.predict(rows[:1], "nccl", {})[0] > mod.predict(on_catalog_network, "nccl", {})[0]
