"""Space kinds, how a space file is loaded, and how ``tuner search`` runs any kind.

:data:`SPACES` maps each ``space:`` kind to its schema and its :class:`~tuner.search.core.SearchSpace`
plug-in, as ``"module:attribute"`` strings imported only when a file of that kind is used. To add
a kind: write a module with both (see :mod:`tuner.search.sharding`) and register it here.

:func:`run_request` is the one runner: it resolves the space (a :class:`SpaceError` on bad
input), runs :func:`tuner.search.core.run_search`, writes the outputs under ``request.out``
(``results.json`` last, atomically), prints the table unless ``quiet``, and returns the summary.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError
from rich.console import Console

from tuner.search.core import Progress, SearchSpace, run_search
from tuner.search.schema import SpaceError, format_validation_error

__all__ = ["SPACES", "SearchRequest", "load_space", "space_schema", "space_plugin", "run_request"]

#: space kind -> (schema, search-space plug-in)
SPACES: dict[str, tuple[str, str]] = {
    "sharding": ("tuner.search.sharding:ShardingSpace", "tuner.search.sharding:ShardingSearch"),
    "parallel": ("tuner.search.parallel:ParallelSpace", "tuner.search.parallel:ParallelSearch"),
    "accelerators": ("tuner.search.accelerators:AcceleratorSpace", "tuner.search.accelerators:AcceleratorSearch"),
    "rent": ("tuner.search.rent:RentSpace", "tuner.search.rent:RentSearch"),
}


def _attribute(target: str) -> object:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def space_schema(kind: str) -> type[BaseModel]:
    """The pydantic schema of a space kind."""
    return _attribute(SPACES[kind][0])  # type: ignore[return-value]


def space_plugin(kind: str) -> type[SearchSpace]:
    """The search-space plug-in of a space kind."""
    if kind not in SPACES:
        raise ValueError(f"no search for space {kind!r}; known: {', '.join(sorted(SPACES))}")
    return _attribute(SPACES[kind][1])  # type: ignore[return-value]


def load_space(path: str | Path) -> BaseModel:
    """Read and validate a space file; raises :class:`SpaceError` with one clear line."""
    path = Path(path)
    if not path.exists():
        raise SpaceError(f"{path}: no such file")
    if path.is_dir():
        raise SpaceError(f"{path}: is a directory, expected a YAML file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpaceError(f"{path}: YAML syntax error{where}: {problem}") from None
    except UnicodeDecodeError:
        raise SpaceError(f"{path}: not a text file") from None
    if not isinstance(data, dict):
        raise SpaceError(f"{path}: expected a mapping with a 'space:' key at the top level")
    kind = data.get("space")
    if kind not in SPACES:
        raise SpaceError(f"{path}: space: must be one of {', '.join(sorted(SPACES))} (got {kind!r})")
    model = data.get("model")
    if isinstance(model, dict) and kind == "rent" and isinstance(model.get("transformer"), dict):
        data = {**data, "model": {**model, "transformer": _hf_model(model["transformer"], path)}}
    elif isinstance(model, dict) and kind == "parallel":
        data = {**data, "model": _hf_model(model, path)}
    try:
        return space_schema(kind).model_validate(data)
    except ValidationError as err:
        raise SpaceError(f"{path}: {format_validation_error(err)}") from None


def _hf_model(section: dict, space: Path) -> dict:
    """A transformer model section with its ``hf_config`` (a Hugging Face ``config.json``, relative to the space
    file's folder) expanded into the fields it gives; the section's other fields override them."""
    if "hf_config" not in section:
        return section
    from tuner.launch.common import LaunchError
    from tuner.launch.huggingface import read_hf_config_file

    given = {k: v for k, v in section.items() if k != "hf_config"}
    config = Path(str(section["hf_config"]))
    config = config if config.is_absolute() else space.parent / config
    seq = given.get("seq")
    try:
        spec, _ = read_hf_config_file(config, seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None)
    except LaunchError as exc:
        raise SpaceError(f"{space}: model.hf_config: {exc}") from None
    return {**spec.to_dict(), **given}


@dataclass
class SearchRequest:
    """What ``tuner search`` was asked to do."""

    space_path: Path
    spec: BaseModel  # the validated space file
    out: Path
    storage: str  # Optuna storage URL
    workers: int  # Ray workers; 0 = evaluate in this process, AUTO (-1) = choose from the measured work
    address: str | None  # existing Ray cluster, or None (then RAY_ADDRESS, else a local Ray)
    resume: bool
    quiet: bool
    console: Console
    progress: Progress | None = None
    all_traces: bool = False  # charts and traces of every candidate's best option, not only the best plans
    on_open: Callable[[], None] | None = None  # run once the study is open (after a live-study refusal could come)
    search: SearchSpace | None = None  # the space's plug-in, built (and its input checked) before OUT is claimed


def run_request(req: SearchRequest) -> str:
    """Search the space of ``req``, write its outputs, print its table; returns the one-line summary."""
    space = req.search or space_plugin(req.spec.space)(req.spec)  # type: ignore[attr-defined]
    result = run_search(space, storage=req.storage, workers=req.workers, address=req.address, resume=req.resume,
                        progress=req.progress, on_open=req.on_open)
    space.all_traces = req.all_traces
    payload = space.write_outputs(result, req.out)
    if not req.quiet:
        space.print_table(payload, req.console)
    summary = space.summary(result, payload, req.out)
    return f"{summary}; {result.how}" if result.how else summary
