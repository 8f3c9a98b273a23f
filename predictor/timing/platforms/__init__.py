"""Accelerator catalog: peak FLOP/s, memory hierarchy, interconnect, CPU overheads and prices.

The packaged ``catalog.yaml`` holds one :class:`Platform` per device (units in the field names:
FLOP/s, bytes, bytes/s, seconds, USD per device-hour). A user YAML with the same layout can
override any field of a packaged entry (e.g. a price) or add new devices::

    a100-80gb:
      price_per_device_hour_usd: 1.80
      price_date: "2025-06"

``cpu-local`` is not in the file: it is measured on the running machine
(:func:`predictor.timing.platforms.cpu_local.measure_cpu_local`, cached), or, with ``$TUNER_CPU_PACK`` set,
it is that asset pack's calibrated platform on any host (:mod:`predictor.timing.platforms.packs`).
"""

from __future__ import annotations

import copy
import difflib
import functools
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from predictor.timing.platforms.schema import Platform

__all__ = [
    "CPU_LOCAL",
    "CatalogError",
    "Platform",
    "UnknownPlatformError",
    "get_platform",
    "load_catalog",
    "override_platform",
]

#: name of the platform measured on the running machine
CPU_LOCAL = "cpu-local"


class CatalogError(ValueError):
    """A catalog YAML that is not valid YAML or whose entry violates the :class:`Platform` schema."""


class UnknownPlatformError(KeyError):
    """A platform name that is neither in the catalog nor ``cpu-local`` (``pack``: it names an asset pack, which
    times captured runs and DLRM kernels but is no catalog entry)."""

    def __init__(self, name: str, valid: list[str], pack: bool = False) -> None:
        self.name = name
        self.valid = sorted(valid)
        stem = Path(name.strip().lower()).name
        close = [v for v in self.valid if v.startswith(stem)] or difflib.get_close_matches(stem, self.valid, n=1,
                                                                                             cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        if pack:
            msg = (f"{name!r} is an asset pack, not a catalog entry: this command prices on catalog entries, whose "
                   f"GEMM ceilings are fitted to published runs{hint}; --catalog FILE adds a device; valid names: "
                   f"{', '.join(self.valid)}")
        else:
            msg = f"unknown platform {name!r}{hint}; valid names: {', '.join(self.valid)}"
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def load_catalog(extra: str | Path | None = None) -> dict[str, Platform]:
    """All catalog platforms by key; ``extra`` (a YAML file) is merged over them field by field.

    Entries of ``extra`` whose key is in the packaged catalog override only the fields they
    give (nested mappings such as ``interconnect`` merge too; lists such as ``memory`` are
    replaced whole); other keys add devices, which must then be complete. An overridden field
    without its own ``sources`` entry is attributed to the user file.

    Raises:
        CatalogError: malformed YAML or an entry that violates the schema.
        FileNotFoundError: ``extra`` does not exist.
    """
    if extra is None:
        return dict(_packaged())
    path = Path(extra)
    over = _parse(path.read_text(encoding="utf-8"), str(path))
    out = dict(_packaged())
    base = _packaged_raw()
    for key, fields in over.items():
        if key == CPU_LOCAL:
            continue  # applied by get_platform on top of the measured entry
        merged = _merge_entry(base.get(key, {}), fields, str(path))
        out[key] = _validate(key, merged)
    return out


def get_platform(name: str, extra: str | Path | None = None) -> Platform:
    """One platform by (case-insensitive) name; ``cpu-local`` is measured on this machine, or is the
    calibrated platform of the asset pack ``$TUNER_CPU_PACK`` names (:mod:`predictor.timing.platforms.packs`).

    Raises:
        UnknownPlatformError: ``name`` is not in the catalog (message lists valid names).
        CatalogError: see :func:`load_catalog`.
        AssetPackError: ``$TUNER_CPU_PACK`` names no readable pack.
    """
    key = name.strip().lower()
    if key == CPU_LOCAL:
        from predictor.timing.platforms.cpu_local import measure_cpu_local
        from predictor.timing.platforms.packs import pinned_cpu_platform

        platform = pinned_cpu_platform() or measure_cpu_local()
        if extra is not None:
            path = Path(extra)
            over = _parse(path.read_text(encoding="utf-8"), str(path)).get(CPU_LOCAL)
            if over:
                platform = override_platform(platform, over, str(path))
        return platform
    catalog = load_catalog(extra)
    if key not in catalog:
        from predictor.timing.platforms.packs import find_asset_pack

        pack = (Path(name.strip()) / "manifest.json").is_file() or find_asset_pack(key) is not None
        raise UnknownPlatformError(name, [*catalog, CPU_LOCAL], pack=pack)
    return catalog[key]


def override_platform(platform: Platform, fields: Mapping[str, Any], origin: str) -> Platform:
    """``platform`` with ``fields`` merged over it as a user catalog file's entry is (nested mappings such as
    ``interconnect`` merge, lists are replaced; an overridden field without its own ``sources`` entry cites
    ``origin``). Raises :class:`CatalogError` when the result violates the schema."""
    return _validate(platform.key, _merge_entry(platform.model_dump(exclude={"key"}), fields, origin))


# ------------------------------------------------------------------ internals
@functools.lru_cache(maxsize=1)
def _packaged_raw() -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath("catalog.yaml").read_text(encoding="utf-8")
    return _parse(text, "packaged catalog.yaml")


@functools.lru_cache(maxsize=1)
def _packaged() -> dict[str, Platform]:
    return {key: _validate(key, fields) for key, fields in _packaged_raw().items()}


def _parse(text: str, origin: str) -> dict[str, dict[str, Any]]:
    """YAML text -> {key: raw fields}; raises CatalogError with a one-line message."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise CatalogError(f"{origin}: invalid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise CatalogError(
            f"{origin}: top level must map platform keys to entries, got {type(data).__name__}"
        )
    out: dict[str, dict[str, Any]] = {}
    for key, fields in data.items():
        if not isinstance(key, str) or key != key.strip().lower() or not key:
            raise CatalogError(f"{origin}: catalog key {key!r} must be a non-empty lower-case string")
        if not isinstance(fields, Mapping):
            raise CatalogError(
                f"catalog entry {key!r}: must be a mapping of fields, got {type(fields).__name__}"
            )
        out[key] = dict(fields)
    return out


def _validate(key: str, fields: Mapping[str, Any]) -> Platform:
    """Raw fields -> Platform; schema violations become one-line CatalogErrors."""
    if fields.get("key", key) != key:
        raise CatalogError(f"catalog entry {key!r}: key: must be omitted or equal the YAML key")
    try:
        return Platform.model_validate({**fields, "key": key})
    except ValidationError as exc:
        parts = [f"{'.'.join(str(p) for p in err['loc']) or '<entry>'}: {err['msg']}" for err in exc.errors()]
        raise CatalogError(f"catalog entry {key!r}: {'; '.join(parts)}") from None


def _merge_entry(base: Mapping[str, Any], over: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``; overridden fields lacking a source cite ``origin``."""
    merged = _deep_merge(copy.deepcopy(dict(base)), over)
    if base:  # an override of a packaged entry: keep provenance honest
        sources = dict(merged.get("sources") or {})
        given = over.get("sources") or {}
        for path in _leaf_paths(over):
            if path.startswith("sources") or path in given:
                continue
            for stale in [s for s in sources if s.startswith(path + ".")]:
                del sources[stale]
            sources[path] = f"user override ({origin})"
        merged["sources"] = sources
    return merged


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    for name, value in over.items():
        if isinstance(value, Mapping) and isinstance(base.get(name), Mapping):
            base[name] = _deep_merge(dict(base[name]), value)
        else:
            base[name] = copy.deepcopy(value)
    return base


def _leaf_paths(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    paths: list[str] = []
    for name, value in tree.items():
        path = f"{prefix}{name}"
        if isinstance(value, Mapping) and value:
            paths.extend(_leaf_paths(value, path + "."))
        else:
            paths.append(path)
    return paths
