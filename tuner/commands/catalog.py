"""``tuner catalog``: the accelerators the catalog knows."""

from __future__ import annotations

from tuner.commands.common import console


def catalog() -> None:
    """List the accelerators the catalog knows."""
    from rich.table import Table

    from predictor.timing.platforms import load_catalog

    table = Table(title="Accelerator catalog")
    for col in ("key", "name", "bf16 TFLOP/s", "memory GiB", "HBM TB/s", "USD/h"):
        table.add_column(col)
    for key, p in load_catalog().items():
        price = "—" if p.price_per_device_hour_usd is None else f"{p.price_per_device_hour_usd:.2f}"
        table.add_row(key, p.name, f"{p.flops_for('bf16') / 1e12:.0f}", f"{p.memory_bytes / 2**30:.0f}",
                      f"{p.memory_bandwidth / 1e12:.2f}", price)
    console.print(table)


