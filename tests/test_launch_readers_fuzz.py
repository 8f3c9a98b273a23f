"""Every field of the llm-foundry, NeMo and config.json readers' test files, set to a value of the wrong kind,
reads or raises one LaunchError line: never another exception."""

from __future__ import annotations

import copy

import pytest
import yaml
from test_hf_config import CONFIGS
from test_launch_llmfoundry import MPT_1B
from test_launch_nemo import LLAMA_70B

from tuner.launch import LaunchError, read_llmfoundry_yaml, read_nemo_yaml
from tuner.launch.huggingface import spec_from_hf_config

BAD = ["x", -1, 1.5, None, [], {}, True, 0, 10**12]


def _paths(d: dict, path: tuple = ()):
    for k, v in d.items():
        yield (*path, k)
        if isinstance(v, dict):
            yield from _paths(v, (*path, k))


def _with(doc: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(doc)
    d = out
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return out


READERS = {
    "config.json": (CONFIGS["DeepSeek-V3"][1], lambda d: spec_from_hf_config(d, "f")),
    "config.json (gpt2)": (CONFIGS["gpt2"][1], lambda d: spec_from_hf_config(d, "f")),
    "nemo": (yaml.safe_load(LLAMA_70B), lambda d: read_nemo_yaml(yaml.safe_dump(d), "f")),
    "llm-foundry": (yaml.safe_load(MPT_1B), lambda d: read_llmfoundry_yaml(yaml.safe_dump(d), "f", devices=128)),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_wrong_kinds_of_value_read_or_raise_one_line(reader):
    doc, read = READERS[reader]
    for path in _paths(doc):
        for value in BAD:
            try:
                read(_with(doc, path, value))
            except LaunchError as err:
                assert "\n" not in str(err), (path, value)
