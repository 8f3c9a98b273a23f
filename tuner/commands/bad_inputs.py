"""The bad inputs every ``tuner`` command must answer with one ``error:`` line and exit code 2.

One table of cases over all commands (search with the three space kinds, predict, replay,
calibrate, catalog) and the runner that checks a case in this process (typer's ``CliRunner``):
exit code 2, exactly one line on stderr and it starts with ``error:``, no traceback, no file
written outside the case's ``out`` folder, no file that existed before changed or removed, and
no ``results.json`` or temporary file left in ``out``. ``tests/test_cli_fuzz.py`` runs every
case; ``experiments/bad_input_sweep.py`` runs them and writes the counts.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["BadInput", "CaseResult", "bad_input_cases", "run_bad_input", "SPACES"]

#: valid, small space files; each case breaks one thing
SPACES: dict[str, dict[str, Any]] = {
    "sharding": {"space": "sharding", "platform": "a100-80gb", "n_gpus": 2, "batch_sizes": [512],
                 "tasks": {"generate": {"count": 1, "seed": 1}}, "model": {"bottom_mlp": [64, 32], "top_mlp": [64, 1]},
                 "sharders": ["naive"]},
    "parallel": {"space": "parallel", "model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 128, "vocab": 1000},
                 "cluster": {"platform": "a100-80gb", "nodes": 1, "devices_per_node": 2}, "global_batch": 8,
                 "ranges": {"tp": [1], "pp": [1], "micro_batch": [1], "schedule": ["1f1b"], "recompute": ["none"]}},
    "accelerators": {"space": "accelerators", "models": [{"name": "resnet50"}], "accelerators": ["a100-80gb"],
                     "devices": [1], "batch_sizes": [1, 2]},
}

#: (field path, bad values) of each space kind: types (a boolean, a string, a float for an integer),
#: ranges (zero, negative, beyond the limit) and choices
FIELD_CASES: dict[str, list[tuple[str, list[Any]]]] = {
    "sharding": [
        ("n_gpus", [0, -2, True, "2", 1.5, 5000, 10**40, None]),
        ("batch_sizes", [[], [0], [True], ["x"], [513], [2**30], 512]),
        ("tasks.generate.count", [0, True, 1001, "3"]),
        ("tasks.generate.seed", [-1, -1000000, True, 2**40]),
        ("tasks.generate.dataset", ["2023"]),
        ("sharders", [[], ["magic"], ["naive", "naive"], "naive"]),
        ("memory_fraction", [0, 1.5, True, "x", -0.1]),
        ("model_guided.max_evals", [0, 10**6]),
        ("model.bottom_mlp", [[], [0], [True], [2**21]]),
        ("model.dense_features", [0, True]),
        ("model.optimizer", ["adam"]),
        ("model.dtype", ["fp8"]),
        ("objective", ["cost"]),
        ("seed", [-1, True, 2**33]),
        ("platform", ["no-such-gpu", 7]),
        ("colour", ["blue"]),
    ],
    "parallel": [
        ("model.layers", [0, True, 10**5, "x"]),
        ("model.hidden", [0, 2**21, 63]),
        ("model.heads", [0, True]),
        ("model.seq", [0, -1]),
        ("model.vocab", [0, True, 2**25]),
        ("model.ffn", [0]),
        ("model.ffn_mult", [0, -1, 100, True]),
        ("model.kv_heads", [0, True, 3]),
        ("model.kv_channels", [0, 2**20]),
        ("model.fp8_params", [True, "yes"]),
        ("model.mla", [{"kv_lora_rank": 0}, {"v_head_dim": -1}]),
        ("model.mlp", ["relu"]),
        ("model.moe", [{"experts": 0}, {"experts": 2, "top_k": 3}, {"experts": 2, "ffn": 0}, {"experts": 2, "shared_ffn": -1},
                       {"experts": 2, "dense_layers": 10_000}, {"experts": 2, "grouped_gemm": "yes"},
                       {"experts": 2, "every": 0}]),
        ("model.dtype", ["fp64"]),
        ("options.recompute_modules", [["attention"], ["moe"]]),
        ("model.causal", ["yes"]),
        ("cluster.platform", ["no-such-gpu"]),
        ("cluster.nodes", [0, True, 10**6]),
        ("cluster.devices_per_node", [0, True, 2000, -8]),
        ("global_batch", [0, True, 1e12, 2**30, -8]),
        ("ranges.tp", [[], [0], [True], [10**6]]),
        ("ranges.pp", [[0]]),
        ("ranges.micro_batch", [[0], [1.5]]),
        ("ranges.schedule", [["zigzag"]]),
        ("ranges.virtual_stages", [[1]]),
        ("ranges.recompute", [["some"]]),
        ("ranges.cp", [[0], [True]]),
        ("search.strategy", ["random"]),
        ("search.trials", [0]),
        ("search.seed", [-1]),
        ("search.top", [0]),
        ("search.grid_limit", [0]),
        ("options.grad_reduce_dtype", ["int8"]),
        ("options.optimizer_state", ["fp8"]),
        ("options.expert_tp", [2]),
        ("options.pipeline_split", ["balanced"]),
        ("options.memory_fraction", [0, 1.5]),
        ("options.fsdp_reshard_after_forward", ["sometimes"]),
        ("options.fsdp_shard", [0, "node"]),
        ("options.overlap_param_gather", ["sometimes"]),
        ("options.align_param_gather", [[True]]),
    ],
    "accelerators": [
        ("models", [[], [{"name": ""}], [{"name": "no_such_model"}], [{"name": "resnet50"}, {"name": "resnet50"}]]),
        ("accelerators", [[], ["no-such-gpu"], ["a100-80gb", "A100-80GB"]]),
        ("devices", [[0], [True], [10**6]]),
        ("precision", ["fp8"]),
        ("batch_sizes", [[0], [2**21], []]),
        ("memory_fraction", [0, 2]),
        ("workspace_mib", [-1]),
        ("gradient_accumulation", [0, True]),
        ("objective", ["speed"]),
        ("baseline", ["h100-sxm"]),
        ("data_loading.host_link_gb_per_s", [0, 1e9]),
        ("communication.compression_ratio", [0, 2]),
        ("communication.bucket_mib", [0]),
    ],
}

#: a model module that ends the process while it is imported
EXITING_MODULE = "import sys\nsys.exit(7)\n"


@dataclass(frozen=True)
class BadInput:
    """One bad input: ``args`` of ``tuner`` (``{dir}`` is the case folder, ``{out}`` its ``out`` folder) and
    the files written first (``files``: path under the case folder -> text; ``kept`` files must survive)."""

    name: str
    args: tuple[str, ...]
    files: dict[str, str] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    module_path: bool = False  # put the case folder on sys.path (a user's model module)


@dataclass
class CaseResult:
    """What one case did, and whether it kept every promise."""

    name: str
    exit_code: int
    error_lines: int
    other_lines: int
    traceback: bool
    outside: list[str]
    lost: list[str]
    half_written: list[str]
    first_line: str = ""

    @property
    def ok(self) -> bool:
        """Exit 2, one ``error:`` line and nothing else, no traceback, nothing outside, lost or half written."""
        return (self.exit_code == 2 and self.error_lines == 1 and self.other_lines == 0 and not self.traceback
                and not self.outside and not self.lost and not self.half_written)


def _set(data: dict, path: str, value: Any) -> dict:
    d = copy.deepcopy(data)
    node = d
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return d


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def _search(name: str, space: str | dict, *extra: str, files: dict[str, str] | None = None,
            kept: dict[str, str] | None = None, module_path: bool = False) -> BadInput:
    text = space if isinstance(space, str) else _dump(space)
    return BadInput(name, ("search", "{dir}/space.yaml", "--out", "{out}", "--workers", "0", "--quiet", *extra),
                    {"space.yaml": text, **(files or {})}, kept or {}, module_path)


def _field_cases() -> Iterator[BadInput]:
    for kind, cases in FIELD_CASES.items():
        for path, values in cases:
            for v in values:
                yield _search(f"search {kind}: {path}={v!r}"[:120], _set(SPACES[kind], path, v))


def _file_cases() -> Iterator[BadInput]:
    sh = SPACES["sharding"]
    yield _search("search: empty file", "")
    yield _search("search: a list, not a mapping", "- 1\n- 2\n")
    yield _search("search: YAML syntax error", "space: sharding\nn_gpus: [1,\n")
    yield _search("search: deep nesting", "[" * 5000 + "]" * 5000 + "\n")
    yield _search("search: deep mapping nesting", "a: " + "{b: " * 3000 + "1" + "}" * 3000 + "\n")
    yield _search("search: binary bytes", "\x00\x01\x02\xff")
    yield _search("search: unknown kind", _dump({**sh, "space": "quantum"}))
    yield _search("search: no space key", _dump({k: v for k, v in sh.items() if k != "space"}))
    yield _search("search: huge number", "space: sharding\nn_gpus: 1e400\n")
    yield _search("search: explicit task name with ..", _dump({**sh, "tasks": {"explicit": [
        {"name": "../../escaped", "tables": [{"rows": 10, "dim": 4, "pooling": 1}]}]}}))
    yield _search("search: explicit task name with /", _dump({**sh, "tasks": {"explicit": [
        {"name": "a/b", "tables": [{"rows": 10, "dim": 4, "pooling": 1}]}]}}))
    yield _search("search: duplicate task names", _dump({**sh, "tasks": {"explicit": [
        {"name": "t", "tables": [{"rows": 10, "dim": 4, "pooling": 1}]},
        {"name": "T", "tables": [{"rows": 10, "dim": 4, "pooling": 1}]}]}}))
    yield _search("search: no tables", _dump({**sh, "tasks": {"explicit": [{"name": "t", "tables": []}]}}))
    for bad in ({"rows": 1e30}, {"rows": True}, {"rows": 10**30}, {"dim": 0}, {"pooling": -1}, {"pooling": "x"},
                {"reuse": [1, 2]}):
        table = {"rows": 10, "dim": 4, "pooling": 1, **bad}
        yield _search(f"search: table {bad}", _dump({**sh, "tasks": {"explicit": [{"name": "t", "tables": [table]}]}}))
    yield _search("search: too many tables", _dump({**sh, "tasks": {"explicit": [
        {"name": "t", "tables": [{"rows": 10, "dim": 4, "pooling": 1}] * 10_001}]}}))
    yield _search("search: no tasks", _dump({**sh, "tasks": {}}))
    yield _search("search: catalog file missing", _dump({**sh, "catalog": "no_such_catalog.yaml"}))
    yield _search("search: catalog malformed", _dump({**sh, "catalog": "cat.yaml"}),
                  files={"cat.yaml": "a100-80gb: [unclosed\n"})
    yield _search("search parallel: catalog missing", _dump(_set(SPACES["parallel"], "cluster.catalog", "nope.yaml")))
    yield _search("search parallel: hf_config missing", _dump({**SPACES["parallel"], "model": {"hf_config": "nope.json"}}))
    yield _search("search parallel: hf_config of an unknown family",
                  _dump({**SPACES["parallel"], "model": {"hf_config": "config.json"}}),
                  files={"config.json": '{"model_type": "t5"}'})
    yield _search("search parallel: no plan fits the devices", _dump(_set(SPACES["parallel"], "ranges.tp", [3])))
    yield _search("search parallel: too many devices", _dump(_set(SPACES["parallel"], "cluster.nodes", 40000)))
    yield _search("search accelerators: catalog missing", _dump({**SPACES["accelerators"], "catalog": "nope.yaml"}))
    yield _search("search accelerators: model module calls sys.exit",
                  _dump({**SPACES["accelerators"], "models": [{"name": "exiting_model_mod:build"}]}),
                  files={"exiting_model_mod.py": EXITING_MODULE}, module_path=True)


def _search_flag_cases() -> Iterator[BadInput]:
    ok = _dump(SPACES["sharding"])
    yield BadInput("search: space file missing", ("search", "{dir}/nope.yaml", "--out", "{out}"))
    yield BadInput("search: space is a folder", ("search", "{dir}", "--out", "{out}"))
    yield BadInput("search: no space argument", ("search",))
    for flags in (("--workers", "-1"), ("--workers", "99999"), ("--workers", "x"), ("--workers", "lots"), ("--storage", ""),
                  ("--storage", "nonsense://x"), ("--storage", "mysql://u:pw@127.0.0.1:1/db"),
                  ("--storage", "postgresql+psycopg2://user:secret@127.0.0.1:1/db"), ("--resume", "true"),
                  ("--bogus",), ("--no-resume", "--resume", "--overwrite", "extra")):
        yield _search(f"search: {' '.join(flags) or repr('')}", ok, *flags)
    yield BadInput("search: --out is a file", ("search", "{dir}/space.yaml", "--out", "{dir}/space.yaml"),
                   {"space.yaml": ok}, {"space.yaml": ok})
    yield BadInput("search: --out under a file", ("search", "{dir}/space.yaml", "--out", "{dir}/space.yaml/sub"),
                   {"space.yaml": ok}, {"space.yaml": ok})
    other = {".tuner-search.json": json.dumps({"space": "0000000000", "storage": "default", "space_file": "x.yaml"}),
             "results.json": '{"space": "parallel"}', "thesis.tex": "my thesis"}
    kept = {f"out/{k}": v for k, v in other.items()}
    yield _search("search: --out holds another space's results", ok, files=kept, kept=kept)
    legacy = {"out/results.json": '{"space": "sharding"}', "out/notes.txt": "keep me"}
    yield _search("search: --out holds results of an unknown search", ok, files=legacy, kept=legacy)


def _predict_cases() -> Iterator[BadInput]:
    wl = _dump(SPACES["parallel"])
    yield BadInput("predict: nothing to predict", ("predict",))
    yield BadInput("predict: workload missing", ("predict", "--workload", "{dir}/nope.yaml"))
    yield BadInput("predict: workload is a folder", ("predict", "--workload", "{dir}"))
    yield BadInput("predict: workload YAML error", ("predict", "--workload", "{dir}/w.yaml"), {"w.yaml": "model: [1,\n"})
    yield BadInput("predict: workload bad field", ("predict", "--workload", "{dir}/w.yaml"),
                   {"w.yaml": _dump(_set(SPACES["parallel"], "model.layers", True))})
    for flags in (("--set", "tp"), ("--set", "colour=blue"), ("--set", "tp=x"), ("--set", "cp=0"),
                  ("--set", "recompute_layers=x"), ("--set", "recompute_layers=3"), ("--set", "stage_layers=1,x"),
                  ("--set", "stage_layers=1,3,3"), ("--set", "expert_tp=2"), ("--set", "fsdp_shard=3"), ("--platform", "no-such-gpu"),
                  ("--catalog", "{dir}/nope.yaml"), ("--devices-per-node", "0"), ("--devices", "0"),
                  ("--devices", "-4"), ("--detail", "fine"), ("--bogus",)):
        yield BadInput(f"predict: {' '.join(flags)}", ("predict", "--workload", "{dir}/w.yaml", *flags), {"w.yaml": wl})
    yield BadInput("predict: FP8 linears on a chip without an FP8 peak", ("predict", "--workload", "{dir}/w.yaml"),
                   {"w.yaml": _dump(_set(SPACES["parallel"], "model.fp8_linear", True))})
    yield BadInput("search: an fp32 DLRM on a chip listing only a bf16 peak", ("search", "{dir}/s.yaml", "--out", "{dir}/out"),
                   {"s.yaml": _dump(_set(SPACES["sharding"], "platform", "gaudi2"))})
    split = _dump(_set(_set(SPACES["parallel"], "options.pipeline_split", "embedding_and_loss"), "model.layers", 3))
    yield BadInput("predict: a pipeline split that does not divide the layers",
                   ("predict", "--workload", "{dir}/w.yaml", "--set", "pp=2", "--set", "dp=1"), {"w.yaml": split})
    megatron = ("--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --micro-batch-size 1 "
                "--vocab-size 1000 --pipeline-model-parallel-size 4 ")
    for name, flags in (("first-stage layers with the loss counted",
                         "--decoder-first-pipeline-num-layers 2 --account-for-loss-in-pipeline-split"),
                        ("first-stage layers that leave the rest uneven", "--decoder-first-pipeline-num-layers 3"),
                        ("experts split over 3 of 2 TP ranks", "--tensor-model-parallel-size 2 --num-experts 4 "
                                                              "--expert-tensor-parallel-size 3"),
                        ("DeepSpeed ZeRO stage 4", "--deepspeed --zero-stage 4"),
                        ("FP8 parameters without FP8 linears", "--fp8-param-gather"),
                        ("an unknown transformer implementation", "--transformer-impl fast"),
                        ("DeepSpeed partition counting the embedding, 10 slots on 4 stages",
                         "--deepspeed --pp-partition-method 'type:transformer|embedding'"),
                        ("a pipeline layout naming 7 of 8 layers", "--pipeline-model-parallel-layout 'Et|(tt|)*2ttL'"),
                        ("a pipeline layout with an unknown layer", "--pipeline-model-parallel-layout 'Et|(tt|)*2tXL'"),
                        ("a pipeline layout placing an MTP layer --mtp-num-layers does not ask for",
                         "--pipeline-model-parallel-layout 'Et|(tt|)*2tmL'"),
                        ("a pipeline layout beside another split",
                         "--pipeline-model-parallel-layout 'Et|(tt|)*2tL' --decoder-first-pipeline-num-layers 1"),
                        ("flag misspelt", "--tensor-model-paralel-size 2"),
                        ("expert groups that do not divide the experts",
                         "--num-experts 4 --moe-router-num-groups 3 --moe-router-group-topk 1")):
        yield BadInput(f"predict: Megatron {name}", ("predict", "--megatron-args", "{dir}/args.txt", "--devices", "8"),
                       {"args.txt": megatron + flags})
    yield BadInput("predict: an asset pack for a transformer plan",
                   ("predict", "--workload", "{dir}/w.yaml", "--platform", "h100"), {"w.yaml": wl})
    yield BadInput("predict: malformed --catalog", ("predict", "--workload", "{dir}/w.yaml", "--catalog", "{dir}/c.yaml"),
                   {"w.yaml": wl, "c.yaml": "x: [1,\n"})
    yield BadInput("predict: --trace is a folder", ("predict", "--workload", "{dir}/w.yaml", "--trace", "{out}"),
                   {"w.yaml": wl, "out/keep.txt": "keep"}, {"out/keep.txt": "keep"})
    yield BadInput("predict: trace path missing", ("predict", "{dir}/no_trace.json"))
    yield BadInput("predict: trace not JSON", ("predict", "{dir}/t.json"), {"t.json": "not json"})
    yield BadInput("predict: torchtitan recipe file missing", ("predict", "--torchtitan", "{dir}/nope.py:tuner_plan"))
    yield BadInput("predict: torchtitan configuration of an unknown module",
                   ("predict", "--torchtitan", "no_such_module:cfg", "--devices", "8"))
    yield BadInput("predict: torchtitan TOML with an unknown fsdp_reshard_after_forward",
                   ("predict", "--torchtitan", "{dir}/t.toml", "--devices", "8"),
                   {"t.toml": '[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\n'
                              'fsdp_reshard_after_forward = "sometimes"\n'})
    yield BadInput("predict: torchtitan TOML whose model parts skip a layer",
                   ("predict", "--torchtitan", "{dir}/t.toml", "--devices", "8"),
                   {"t.toml": '[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\npipeline_parallel_degree = 2\n'
                              "module_fqns_per_model_part = [['tok_embeddings', 'layers.0'], ['layers.2', 'output']]\n"})
    lf = ("model:\n  name: mpt_causal_lm\n  d_model: 256\n  n_heads: 4\n  n_layers: 2\n  max_seq_len: 128\n"
          "global_train_batch_size: 16\ndevice_train_microbatch_size: 2\nfsdp_config:\n  sharding_strategy: FULL_SHARD\n")
    for name, text, flags in (("without --devices", lf, ()),
                              ("YAML syntax error", "model: [1,\n", ("--devices", "8")),
                              ("interpolation of a missing key", lf + "max_seq_len: ${variables.seq}\n", ("--devices", "8")),
                              ("micro-batch auto", lf.replace("2\nfsdp", "auto\nfsdp"), ("--devices", "8")),
                              ("sharding strategy unknown", lf.replace("FULL_SHARD", "ZERO3"), ("--devices", "8")),
                              ("batch not divisible by the devices", lf, ("--devices", "6"))):
        yield BadInput(f"predict: llm-foundry YAML {name}", ("predict", "--llm-foundry", "{dir}/run.yaml", *flags),
                       {"run.yaml": text})
    for name, text in (("not JSON", "{"), ("without model_type", '{"hidden_size": 8}'),
                       ("of an unknown family", '{"model_type": "t5"}'),
                       ("missing its layer count", '{"model_type": "llama", "hidden_size": 4096}')):
        yield BadInput(f"predict: Hugging Face config.json {name}", ("predict", "--workload", "{dir}/config.json",
                                                                     "--set", "global_batch=8"), {"config.json": text})
    nemo = ("trainer:\n  num_nodes: 1\n  devices: 8\nmodel:\n  num_layers: 4\n  hidden_size: 256\n"
            "  num_attention_heads: 4\n  encoder_seq_length: 128\n  global_batch_size: 16\n")
    for name, text in (("without a model section", "trainer: {}\n"), ("YAML syntax error", "model: [1,\n"),
                       ("TP not dividing the devices", nemo + "  tensor_model_parallel_size: 3\n"),
                       ("layers not splitting over the stages",
                        nemo.replace("num_layers: 4", "num_layers: 5") + "  pipeline_model_parallel_size: 2\n")):
        yield BadInput(f"predict: NeMo YAML {name}", ("predict", "--nemo", "{dir}/cfg.yaml"), {"cfg.yaml": text})
    yield BadInput("predict: --set attention unknown", ("predict", "--workload", "{dir}/w.yaml", "--set",
                                                        "attention=magic"), {"w.yaml": wl})
    yield BadInput("predict: --set seq not a number", ("predict", "--workload", "{dir}/w.yaml", "--set", "seq=long"),
                   {"w.yaml": wl})
    yield BadInput("predict: torchtitan recipe that raises", ("predict", "--torchtitan", "{dir}/r.py:f"),
                   {"r.py": "def f():\n    raise RuntimeError('no configuration')\n"})


def _replay_cases() -> Iterator[BadInput]:
    yield BadInput("replay: path missing", ("replay", "{dir}/nope.json", "--out", "{out}"))
    yield BadInput("replay: empty folder", ("replay", "{dir}/empty", "--out", "{out}"), {"empty/.keep": ""})
    yield BadInput("replay: not JSON", ("replay", "{dir}/t.json", "--out", "{out}"), {"t.json": "{{{"})
    yield BadInput("replay: JSON without events", ("replay", "{dir}/t.json", "--out", "{out}"), {"t.json": "[1, 2]"})
    yield BadInput("replay: --top -1", ("replay", "{dir}/t.json", "--top", "-1", "--out", "{out}"),
                   {"t.json": '{"traceEvents": []}'})
    yield BadInput("replay: --et missing", ("replay", "{dir}/t.json", "--et", "{dir}/nope", "--out", "{out}"),
                   {"t.json": '{"traceEvents": []}'})
    yield BadInput("replay: --collectives unknown", ("replay", "{dir}/t.json", "--collectives", "guess", "--out",
                                                     "{out}"), {"t.json": '{"traceEvents": []}'})
    yield BadInput("replay: no argument", ("replay",))
    yield BadInput("replay: --bogus", ("replay", "{dir}/t.json", "--bogus"), {"t.json": "{}"})


def _calibrate_cases() -> Iterator[BadInput]:
    yield BadInput("calibrate: no --out", ("calibrate",))
    thesis = {"out/thesis.tex": "my thesis"}
    yield BadInput("calibrate: --out is a non-empty folder", ("calibrate", "--out", "{out}", "--tiny"), thesis, thesis)
    yield BadInput("calibrate: --out is a file", ("calibrate", "--out", "{dir}/f.txt", "--tiny"), {"f.txt": "keep"},
                   {"f.txt": "keep"})
    for flags in (("--seed", "-1"), ("--world-size", "0"), ("--threads", "0"), ("--scale", "0"), ("--scale", "-1"),
                  ("--scale", "nan"), ("--scale", "inf"), ("--rounds", "0"), ("--no-fit", "--refit", "{dir}/p"),
                  ("--overheads", "{dir}/o.json"), ("--data-from", "gemm=x"), ("--match-level",), ("--bogus",),
                  ("--world-size", "x")):
        yield BadInput(f"calibrate: {' '.join(flags)}", ("calibrate", "--out", "{out}", *flags))
    yield BadInput("calibrate: --refit missing pack", ("calibrate", "--refit", "{dir}/nope"))


def _other_cases() -> Iterator[BadInput]:
    yield BadInput("catalog: --bogus", ("catalog", "--bogus"))
    yield BadInput("catalog: extra argument", ("catalog", "extra"))
    yield BadInput("tuner: unknown command", ("frobnicate",))
    yield BadInput("tuner: unknown option", ("--bogus",))


def bad_input_cases() -> list[BadInput]:
    """Every case of the table, in a stable order."""
    return [*_field_cases(), *_file_cases(), *_search_flag_cases(), *_predict_cases(), *_replay_cases(),
            *_calibrate_cases(), *_other_cases()]


def _digest(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else "(folder)"


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): _digest(p) for p in root.rglob("*") if p.is_file()}


def run_bad_input(case: BadInput, folder: Path) -> CaseResult:
    """Run ``case`` in ``folder`` (created; the working directory while it runs) and check its promises."""
    from typer.testing import CliRunner

    from tuner.cli import app

    work = folder / "work"
    work.mkdir(parents=True, exist_ok=True)
    for rel, text in case.files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text.replace("{dir}", str(work)))
    before = _snapshot(folder)
    args = [a.replace("{out}", str(work / "out")).replace("{dir}", str(work)) for a in case.args]
    cwd, path = os.getcwd(), list(sys.path)
    os.chdir(work)
    if case.module_path:
        sys.path.insert(0, str(work))
    try:
        result = CliRunner().invoke(app, args)
    finally:
        os.chdir(cwd)
        sys.path[:] = path
    after = _snapshot(folder)
    err = [ln for ln in (result.stderr or "").splitlines() if ln.strip()]
    errors = [ln for ln in err if ln.startswith("error:")]
    text = (result.output or "") + (result.stderr or "")
    exc = result.exception if result.exception is not None and not isinstance(result.exception, SystemExit) else None
    out_prefix = "work/out/"
    outside = sorted(k for k in after if k not in before and not k.startswith(out_prefix))
    lost = sorted(f"work/{k}" for k in case.kept if after.get(f"work/{k}") != before.get(f"work/{k}"))
    half = sorted(k for k in after if k.startswith(out_prefix) and k not in before
                  and (k.endswith("results.json") or k.endswith(".tmp")))
    return CaseResult(case.name, result.exit_code, len(errors), len(err) - len(errors),
                      exc is not None or "Traceback" in text, outside, lost, half, err[0][:300] if err else "")
