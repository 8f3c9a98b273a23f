"""Asset packs: a calibrated platform and its fitted kernel models, on disk, and how names resolve.

An asset pack is a folder written by ``tuner calibrate`` (:func:`predictor.timing.calibrate.calibrate`)::

    NAME/
      manifest.json     {format, name, device, created, torch, hostname, cpu_model, threads,
                         level, models: {key: {file, type, kinds}}, error_table: [...], overheads}
      platform.yaml     {NAME: full Platform entry} (catalog layout; measured peaks, bandwidths,
                         overheads, collective latency)
      models/*.json     one file per calibrated kernel model (MLP weights as base64 float32,
                         roofline fits, piecewise-sigmoid curves)
      data/*.csv        the microbenchmark samples the models were fitted to
      errors.md         the held-out error table

Where a name is looked up, and which pack ``cpu-local`` stands for (the one calibrated on this CPU, or the
one ``$TUNER_CPU_PACK`` names on any host), see :mod:`predictor.timing.platforms.packs`.

:func:`resolve_platform` turns a ``--platform`` value into (platform, kernel models, source
label): an asset pack's calibrated models ("asset pack NAME"), or the catalog's analytic
models ("analytic (catalog)"), or for ``cpu-local`` the measured platform with analytic
models unless a pack for this CPU is found (:func:`~predictor.timing.platforms.packs.cpu_local_pack`).
:func:`timing_for` wraps that into a :class:`~predictor.timing.kernels.timing.ModelTiming`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from predictor.timing.platforms.packs import (
    CPU_PACK_ENV,
    AssetPackError,
    asset_search_paths,
    cpu_local_pack,
    cpu_pack_override,
    find_asset_pack,
    looks_like_path,
    read_pack_json,
    read_pack_platform,
    register_asset_pack,
)
from predictor.timing.platforms.schema import CpuOverheads, Platform

__all__ = [
    "PACK_FORMAT",
    "STORED_FLOAT_FORMAT",
    "AssetPack",
    "AssetPackError",
    "ResolvedPlatform",
    "asset_search_paths",
    "cpu_local_pack",
    "find_asset_pack",
    "load_asset_pack",
    "register_asset_pack",
    "resolve_platform",
    "timing_for",
    "write_asset_pack",
]

#: how a pack stores its benchmark tables' floats (``data/<family>.csv``): 6 significant digits
STORED_FLOAT_FORMAT = "%.6g"


#: version of the on-disk layout
PACK_FORMAT = 1
_REQUIRED = ("format", "name", "device", "created", "models")


@dataclass
class AssetPack:
    """A loaded asset pack: the calibrated platform and its kernel models."""

    name: str
    path: Path
    manifest: dict
    platform: Platform
    models: list  # list[KernelModel]
    error_table: list[dict] = field(default_factory=list)

    @property
    def source(self) -> str:
        """Label that outputs print to say which models produced the numbers (and the platform's measured kernel
        pace, when it carries one: it scales every predicted kernel of its class)."""
        pace = self.platform.kernel_pace
        return f"asset pack {self.name}" + (
            " (kernel pace " + ", ".join(f"{k} x{v:.3f}" for k, v in pace.items()) + ")" if pace else "")

    @property
    def overheads(self) -> CpuOverheads:
        return self.platform.overheads

    def timing(self, keep_measured: bool = False):
        """A :class:`~predictor.timing.kernels.timing.ModelTiming` with this pack's models (analytic ones behind)."""
        from predictor.timing.kernels.timing import ModelTiming, analytic_models

        return ModelTiming(self.platform, [*self.models, *analytic_models()], keep_measured=keep_measured,
                           source=self.source)


@dataclass(frozen=True)
class ResolvedPlatform:
    """What a ``--platform`` value resolved to."""

    platform: Platform
    models: list  # list[KernelModel]
    source: str
    pack: AssetPack | None = None

    def timing(self, keep_measured: bool = False):
        from predictor.timing.kernels.timing import ModelTiming

        return ModelTiming(self.platform, self.models, keep_measured=keep_measured, source=self.source)


# ----------------------------------------------------------------------------- load
def load_asset_pack(path: str | Path, allow_unfitted: bool = False) -> AssetPack:
    """Load a pack folder.

    Args:
        path: the pack folder.
        allow_unfitted: accept a pack written by ``tuner calibrate --no-fit`` (benchmarks, no
            models); only :func:`predictor.timing.calibrate.refit` reads such a pack.

    Raises:
        AssetPackError: the folder or a file is missing, not valid JSON/YAML, or inconsistent; or
            the pack is not fitted yet and ``allow_unfitted`` is false.
    """
    from predictor.timing.kernels.serialize import model_from_dict

    root = Path(path)
    if not root.exists():
        raise AssetPackError(f"asset pack {root}: not found")
    if not root.is_dir():
        raise AssetPackError(f"asset pack {root}: not a folder")
    manifest = read_pack_json(root / "manifest.json", root)
    if not isinstance(manifest, dict):
        raise AssetPackError(f"{root / 'manifest.json'}: must be a JSON object")
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise AssetPackError(f"{root / 'manifest.json'}: missing field(s) {', '.join(missing)}")
    if manifest["format"] != PACK_FORMAT:
        raise AssetPackError(
            f"{root / 'manifest.json'}: format {manifest['format']!r} is not supported (expected {PACK_FORMAT}); "
            "re-run tuner calibrate"
        )
    if manifest.get("fitted", True) is False and not allow_unfitted:
        raise AssetPackError(f"asset pack {root}: holds benchmarks but no fitted models yet; "
                             f"fit them with: tuner calibrate --refit {root}")
    name = str(manifest["name"])
    platform = read_pack_platform(root / "platform.yaml")
    models = []
    if not isinstance(manifest["models"], Mapping):
        raise AssetPackError(f"{root / 'manifest.json'}: models must map model keys to entries")
    for key, entry in manifest["models"].items():
        file = root / str(entry.get("file", "")) if isinstance(entry, Mapping) else None
        if file is None or not entry.get("file"):
            raise AssetPackError(f"{root / 'manifest.json'}: model {key!r} names no file")
        data = read_pack_json(file, root)
        try:
            models.append(model_from_dict(data))
        except (KeyError, ValueError, TypeError) as exc:
            what = f"missing field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc).splitlines()[0]
            raise AssetPackError(f"{file}: not a valid kernel model ({what})") from None
    table = manifest.get("error_table", [])
    return AssetPack(name=name, path=root, manifest=manifest, platform=platform, models=models,
                     error_table=list(table) if isinstance(table, list) else [])


# ----------------------------------------------------------------------------- write
def write_asset_pack(
    path: str | Path,
    *,
    name: str,
    device: str,
    platform: Platform,
    models: Mapping[str, Any],
    error_table: Sequence[Mapping[str, Any]] = (),
    data: Mapping[str, Any] | None = None,
    manifest_extra: Mapping[str, Any] | None = None,
    errors_md: str = "",
) -> Path:
    """Write a pack folder; the folder appears complete or not at all (built aside, then renamed).

    Args:
        path: target folder (replaced if it exists).
        name: pack name (lower-case; the platform key inside ``platform.yaml``).
        device: ``"cpu"``, ``"cuda:0"``, ...
        platform: the calibrated platform (written under key ``name``).
        models: model key -> KernelModel (serialised with ``model_to_dict``).
        error_table: rows of the held-out error table.
        data: family -> DataFrame of microbenchmark samples (``data/FAMILY.csv``).
        manifest_extra: more manifest fields (threads, level, overhead details, ...).
        errors_md: Markdown of the error table (``errors.md``).
    """
    import platform as _pyplatform
    import socket

    import torch

    from predictor.timing.kernels.serialize import model_to_dict

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "models").mkdir(parents=True)
    entries = {}
    for key, model in models.items():
        d = model_to_dict(model)
        file = f"models/{key}.json"
        (tmp / file).write_text(json.dumps(d, separators=(",", ":")), encoding="utf-8")
        entries[key] = {"file": file, "type": d["type"], "kinds": list(getattr(model, "kinds", ()))}
    fields = platform.model_dump(mode="json", exclude={"key"})
    (tmp / "platform.yaml").write_text(
        "# calibrated platform written by tuner calibrate; catalog layout\n"
        + yaml.safe_dump({name: fields}, sort_keys=False, width=100),
        encoding="utf-8",
    )
    if data:
        (tmp / "data").mkdir()
        for family, frame in data.items():
            if frame is not None and len(frame):
                frame.to_csv(tmp / "data" / f"{family}.csv", index=False, float_format=STORED_FLOAT_FORMAT)
    if errors_md:
        (tmp / "errors.md").write_text(errors_md, encoding="utf-8")
    manifest = {
        "format": PACK_FORMAT,
        "name": name,
        "device": device,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "hostname": socket.gethostname(),
        "machine": _pyplatform.machine(),
        **dict(manifest_extra or {}),
        "models": entries,
        "error_table": [dict(r) for r in error_table],
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, default=float), encoding="utf-8")
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)
    return target


def pack_at_revision(repo: str | Path, rev: str, pack: str, dest: str | Path) -> Path:
    """Extract the pack folder ``pack`` (relative to ``repo``, e.g. ``assets/h100``) as committed at git
    revision ``rev`` into ``dest``; return the extracted pack's path (to compare packs across commits).

    Raises:
        AssetPackError: ``rev`` or ``pack`` is unknown to git, or git is missing.
    """
    import subprocess
    import tarfile

    try:
        blob = subprocess.run(["git", "-C", str(repo), "archive", rev, pack], check=True,
                              capture_output=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        raise AssetPackError(f"cannot read {pack} at git revision {rev} ({exc})") from None
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tar = dest / "pack.tar"
    tar.write_bytes(blob)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    tar.unlink()
    return dest / pack


# ----------------------------------------------------------------------------- resolve
def resolve_platform(name_or_path: str, extra: str | Path | None = None) -> ResolvedPlatform:
    """A ``--platform`` value -> platform, kernel models and a source label.

    * a pack folder path, or the name of a pack on the search path -> its calibrated models
      (``"asset pack NAME"``);
    * ``cpu-local`` -> the pack ``$TUNER_CPU_PACK`` names, else the pack calibrated on this CPU
      (:func:`~predictor.timing.platforms.packs.cpu_local_pack`: ``cpu-local`` or a ``cpu-local-*`` sibling),
      else the measured platform with analytic models (``"analytic (measured cpu-local)"``);
    * a catalog key -> the catalog entry with analytic models (``"analytic (catalog)"``).

    Raises:
        AssetPackError: a pack was found (or a path given) but cannot be loaded.
        UnknownPlatformError / CatalogError: as :func:`predictor.timing.platforms.get_platform`.
    """
    from predictor.timing.kernels.timing import analytic_models
    from predictor.timing.platforms import CPU_LOCAL, get_platform

    value = name_or_path.strip()
    if looks_like_path(value):
        pack = load_asset_pack(value)
        return ResolvedPlatform(pack.platform, [*pack.models, *analytic_models()], pack.source, pack)
    key = value.lower()
    found = cpu_local_pack() if key == CPU_LOCAL else find_asset_pack(key)
    if found is not None:
        pack = load_asset_pack(found)
        return ResolvedPlatform(pack.platform, [*pack.models, *analytic_models()], pack.source, pack)
    if key == CPU_LOCAL and cpu_pack_override() is not None:  # pinned to no pack
        return ResolvedPlatform(get_platform(key, extra), analytic_models(),
                                f"analytic (measured cpu-local; {CPU_PACK_ENV}={cpu_pack_override()})")
    if key == CPU_LOCAL and find_asset_pack(key) is not None:
        return ResolvedPlatform(get_platform(key, extra), analytic_models(),
                                "analytic (measured cpu-local; the cpu-local asset pack is from another CPU)")
    platform = get_platform(key, extra)
    source = "analytic (measured cpu-local)" if key == CPU_LOCAL else "analytic (catalog)"
    return ResolvedPlatform(platform, analytic_models(), source)


def timing_for(name_or_path: str, extra: str | Path | None = None, keep_measured: bool = False):
    """The :class:`~predictor.timing.kernels.timing.ModelTiming` for a ``--platform`` value.

    Its ``source`` says which models it uses (see :func:`resolve_platform`).
    """
    return resolve_platform(name_or_path, extra).timing(keep_measured=keep_measured)
