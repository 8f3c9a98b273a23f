"""Where asset packs live, which one ``cpu-local`` stands for, and a pack's calibrated platform.

An asset pack is a folder written by ``tuner calibrate`` (:mod:`predictor.timing.kernels.assets` loads its
kernel models). Where a name is looked up (first hit wins), see :func:`asset_search_paths`:

1. a path to a pack folder;
2. ``$TUNER_ASSETS`` (folders separated by ``os.pathsep``);
3. the ``assets/`` folder of the repository this package runs from (editable installs:
   ``pip install -e .``; a wheel install has no such folder — use 2 or 4);
4. ``$TUNER_CACHE_DIR/assets`` or ``~/.cache/tuner/assets``, and the registry of packs that
   ``tuner calibrate --out ANYWHERE`` wrote (``registry.json`` there).

``cpu-local`` stands for the pack calibrated on this host's CPU (:func:`cpu_local_pack`: a pack named
``cpu-local`` or ``cpu-local-*`` whose manifest records this CPU), else for the CPU measured in a few seconds
with analytic models. ``$TUNER_CPU_PACK`` overrides that choice on any host (:data:`CPU_PACK_ENV`): a pack name
or folder makes ``cpu-local`` (``--platform cpu-local``, ``get_platform("cpu-local")``) that pack's calibrated
platform and models, so that predictions do not depend on the machine they run on (another team's CPU, a CI
runner, the tests); ``none`` makes it the measured CPU with analytic models even where a pack of this CPU exists.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from predictor.timing.platforms.schema import Platform

__all__ = [
    "CPU_PACK_ENV",
    "NO_PACK",
    "AssetPackError",
    "asset_search_paths",
    "cpu_local_pack",
    "cpu_pack_override",
    "find_asset_pack",
    "looks_like_path",
    "pinned_cpu_platform",
    "read_pack_json",
    "read_pack_platform",
    "register_asset_pack",
    "repo_assets_dir",
]

#: environment variable naming the asset pack ``cpu-local`` stands for on any host (a name on the search
#: path or a pack folder; :data:`NO_PACK`: none); unset or empty: the pack calibrated on this CPU
CPU_PACK_ENV = "TUNER_CPU_PACK"
#: the :data:`CPU_PACK_ENV` value that makes ``cpu-local`` the measured CPU with analytic models
NO_PACK = "none"


class AssetPackError(ValueError):
    """A missing, incomplete or corrupt asset pack (one-line message naming the file)."""


# ----------------------------------------------------------------------------- search paths
def _cache_root() -> Path:
    root = os.environ.get("TUNER_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "tuner"


def repo_assets_dir() -> Path:
    """``assets/`` next to the ``predictor`` package (exists for a source checkout / editable install)."""
    return Path(__file__).resolve().parents[3] / "assets"


def asset_search_paths() -> list[Path]:
    """Folders whose sub-folders are asset packs, in lookup order (see the module docstring)."""
    paths = [Path(p) for p in os.environ.get("TUNER_ASSETS", "").split(os.pathsep) if p]
    paths += [repo_assets_dir(), _cache_root() / "assets"]
    return paths


def _registry_path() -> Path:
    return _cache_root() / "assets" / "registry.json"


def register_asset_pack(name: str, path: str | Path) -> None:
    """Remember where pack ``name`` lives so ``--platform name`` finds it; best effort."""
    reg = _registry_path()
    try:
        data = json.loads(reg.read_text(encoding="utf-8")) if reg.exists() else {}
        if not isinstance(data, dict):
            data = {}
        data[name.lower()] = str(Path(path).resolve())
        reg.parent.mkdir(parents=True, exist_ok=True)
        tmp = reg.with_name(f"{reg.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, reg)
    except (OSError, ValueError):
        pass


def _read_registry() -> dict:
    """The registry of pack names -> folders (:func:`register_asset_pack`); empty when missing or unreadable."""
    try:
        reg = json.loads(_registry_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return reg if isinstance(reg, dict) else {}


def find_asset_pack(name: str) -> Path | None:
    """The folder of pack ``name`` (case-insensitive), or None."""
    key = name.strip().lower()
    if not key or "/" in key or os.sep in key:
        return None
    for root in asset_search_paths():
        cand = root / key
        if (cand / "manifest.json").is_file():
            return cand
    reg = _read_registry()
    hit = Path(reg[key]) if isinstance(reg.get(key), str) else None
    if hit is not None and (hit / "manifest.json").is_file():
        return hit
    return None


def list_asset_packs() -> dict[str, Path]:
    """Every pack ``--platform NAME`` finds, by name: the search paths' sub-folders (first one wins), then the
    registry's packs written elsewhere."""
    out: dict[str, Path] = {}
    for root in asset_search_paths():
        if root.is_dir():
            for cand in sorted(root.iterdir()):
                if (cand / "manifest.json").is_file():
                    out.setdefault(cand.name.lower(), cand)
    for name, folder in sorted(_read_registry().items()):
        if isinstance(folder, str) and (Path(folder) / "manifest.json").is_file():
            out.setdefault(name, Path(folder))
    return out


def looks_like_path(value: str) -> bool:
    """Whether a ``--platform`` value names a folder rather than a pack or catalog entry."""
    return "/" in value or os.sep in value or value.startswith(".") or (Path(value) / "manifest.json").is_file()


# ----------------------------------------------------------------------------- pack files
def read_pack_json(file: Path, root: Path) -> Any:
    """A JSON file of the pack at ``root``; AssetPackError when it is missing or not JSON."""
    if not file.is_file():
        raise AssetPackError(f"{file}: missing from asset pack {root}")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise AssetPackError(f"{file}: not a text file") from None
    except json.JSONDecodeError as exc:
        raise AssetPackError(f"{file}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def read_pack_platform(file: Path) -> Platform:
    """The calibrated platform of a pack's ``platform.yaml`` (one ``KEY: fields`` entry, catalog layout)."""
    if not file.is_file():
        raise AssetPackError(f"{file}: missing from the asset pack")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise AssetPackError(f"{file}: invalid YAML{where}") from None
    if not isinstance(data, Mapping) or len(data) != 1:
        raise AssetPackError(f"{file}: must hold exactly one platform entry (KEY: fields)")
    key, fields = next(iter(data.items()))
    if not isinstance(fields, Mapping):
        raise AssetPackError(f"{file}: entry {key!r} must be a mapping of fields")
    try:
        return Platform.model_validate({**fields, "key": str(key)})
    except ValidationError as exc:
        parts = [f"{'.'.join(str(p) for p in e['loc']) or '<entry>'}: {e['msg']}" for e in exc.errors()]
        raise AssetPackError(f"{file}: {'; '.join(parts)}") from None


# ----------------------------------------------------------------------------- cpu-local
def cpu_pack_override() -> str | None:
    """The value of :data:`CPU_PACK_ENV` (stripped), or None when it is unset or empty."""
    value = os.environ.get(CPU_PACK_ENV, "").strip()
    return value or None


def _pinned_pack(value: str) -> Path:
    """The pack folder :data:`CPU_PACK_ENV` names (a folder, or a pack name on the search path)."""
    if looks_like_path(value):
        path = Path(value).expanduser()
        if not (path / "manifest.json").is_file():
            raise AssetPackError(f"{CPU_PACK_ENV}={value}: not an asset pack folder (no manifest.json)")
        return path
    found = find_asset_pack(value)
    if found is None:
        raise AssetPackError(f"{CPU_PACK_ENV}={value}: no asset pack of that name on the search path "
                             f"({', '.join(str(p) for p in asset_search_paths())}); give a pack folder, a "
                             f"pack name, or {NO_PACK}")
    return found


def cpu_local_pack() -> Path | None:
    """The pack ``--platform cpu-local`` stands for on this host.

    With :data:`CPU_PACK_ENV` set: the pack it names (None for :data:`NO_PACK`; AssetPackError when it names
    none). Else, of the packs named ``cpu-local`` or ``cpu-local-*`` on the search path, the first whose
    manifest records this CPU (:func:`~predictor.timing.platforms.cpu_local.same_cpu` with this host's
    signature); else the pack named ``cpu-local`` when it records no CPU (an older pack) and its ``cpu_model``
    is this host's; else None. So one checkout carries a pack per CPU its team runs on (e.g.
    ``assets/cpu-local-zen4``, ``assets/cpu-local-avx2``) and each host picks its own."""
    from predictor.timing.platforms.cpu_local import cpu_model, cpu_signature, same_cpu

    pin = cpu_pack_override()
    if pin is not None:
        return None if pin.lower() == NO_PACK else _pinned_pack(pin)
    here = cpu_signature()
    candidates: list[Path] = []
    for root in asset_search_paths():
        if root.is_dir():
            candidates += sorted(d for d in root.glob("cpu-local*") if (d / "manifest.json").is_file()
                                 and (d.name == "cpu-local" or d.name.startswith("cpu-local-")))
    # packs calibrated with --out elsewhere, by the name they were written as
    candidates += [Path(v) for k, v in sorted(_read_registry().items()) if isinstance(v, str)
                   and (k == "cpu-local" or k.startswith("cpu-local-")) and (Path(v) / "manifest.json").is_file()]
    legacy = None
    for d in candidates:
        try:
            m = json.loads((d / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(m, dict):
            continue
        if m.get("cpu"):
            if same_cpu(m["cpu"], here):
                return d
        elif legacy is None and d.name == "cpu-local" and m.get("cpu_model") == cpu_model():
            legacy = d
    return legacy


def pinned_cpu_platform() -> Platform | None:
    """The calibrated platform of the pack :data:`CPU_PACK_ENV` pins ``cpu-local`` to; None when it pins none
    (unset, empty or :data:`NO_PACK`): ``cpu-local`` is then this CPU, measured."""
    pin = cpu_pack_override()
    if pin is None or pin.lower() == NO_PACK:
        return None
    return read_pack_platform(_pinned_pack(pin) / "platform.yaml")
