"""``tuner catalog``: the accelerators the catalog knows, and the asset packs ``--platform`` finds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.commands.common import console, fail


def catalog(
    catalog_file: Annotated[Path | None, typer.Option("--catalog", help="user YAML overriding or adding catalog entries, shown merged")] = None,
) -> None:
    """List the accelerators the catalog knows (merged with --catalog FILE) and the asset packs --platform finds."""
    from rich.table import Table

    from predictor.timing.platforms import CatalogError, load_catalog
    from predictor.timing.platforms.packs import AssetPackError, list_asset_packs, read_pack_json

    if catalog_file is not None and not catalog_file.is_file():
        fail(f"--catalog {catalog_file}: no such file")
    try:
        entries = load_catalog(catalog_file)
    except CatalogError as exc:
        fail(str(exc))
    table = Table(title="Accelerator catalog" + (f" (with {catalog_file})" if catalog_file else ""))
    for col in ("key", "name", "bf16 TFLOP/s", "fp32 TFLOP/s", "memory GiB", "HBM TB/s", "USD/h"):
        table.add_column(col)
    for key, p in entries.items():
        price = "—" if p.price_per_device_hour_usd is None else f"{p.price_per_device_hour_usd:.2f}"
        fp32 = f"{p.flops_for('fp32') / 1e12:.0f}" if p.lists_peak("fp32") else "—"  # fp32 models refused there
        table.add_row(key, p.name, f"{p.flops_for('bf16') / 1e12:.0f}", fp32, f"{p.memory_bytes / 2**30:.0f}",
                      f"{p.memory_bandwidth / 1e12:.2f}", price)
    console.print(table)
    packs = Table(title="Asset packs (calibrated kernel models: captured runs, sharding spaces)")
    for col in ("name", "device", "created", "folder"):
        packs.add_column(col)
    for name, folder in list_asset_packs().items():
        try:
            m = read_pack_json(folder / "manifest.json", folder)
        except AssetPackError:  # a broken pack is listed as such, not fatal to the listing
            m = {}
        packs.add_row(name, str(m.get("cpu_model", "?")), str(m.get("created", "?"))[:10], str(folder))
    console.print(packs)
