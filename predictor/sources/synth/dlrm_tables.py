"""DLRM embedding tables: the columnar table set and random table tasks.

Vocabulary (Lin et al. 2024, §III-A and §III-E):

* ``E`` (:attr:`EmbeddingTables.rows`): number of rows (embeddings) of a table.
* ``D`` (:attr:`EmbeddingTables.dim`): embedding dimension, elements per row.
* ``L`` (:attr:`EmbeddingTables.pooling`): pooling factor, the *mean* number of lookups per
  sample of a batch. A table with ``L >= 20`` is "heavy" (§III-A).
* Reuse factors (RF, §III-E): per table, the lookup-weighted 17-bin histogram of
  :mod:`predictor.sources.synth.dlrm_reuse` (real profiles from Meta's DLRM dataset, thinned to
  the batch).

:func:`generate_tasks` draws table sets in the manner of Lin et al. 2024 §IV-B1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from predictor.sources.synth.dlrm_reuse import RF_BINS, reuse_profile_meta, reuse_profiles, thin_reuse

__all__ = [
    "HEAVY_POOLING",
    "EmbeddingTables",
    "sample_pooling",
    "generate_tasks",
]

#: Mean pooling factor at or above which a table is "heavy" (Lin et al. 2024 §III-A).
HEAVY_POOLING = 20.0


def _frozen_array(values: Any, dtype: Any, name: str, ndim: int = 1) -> np.ndarray:
    arr = np.array(values, dtype=dtype, copy=True)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class EmbeddingTables:
    """A set of embedding tables, one entry per table in every column (numpy arrays, read-only).

    Attributes
    ----------
    rows:
        ``E``, rows per table (int64, >= 1).
    dim:
        ``D``, embedding dimension, elements per row (int64, >= 1).
    pooling:
        ``L``, mean lookups per sample (float64, >= 0).
    reuse:
        Per-batch reuse-factor histogram, shape ``(n, RF_BINS)`` float64, lookup-weighted, each
        row normalised to sum to 1 (see the module docstring). ``None`` at construction means
        "unknown" and is replaced by the mean of the packaged dataset profiles.
    dtype_bytes:
        Bytes per embedding element (4 for fp32, 2 for fp16).
    name:
        One name per table; defaults to ``t0, t1, ...``.
    label:
        Free-form label of the whole set, e.g. ``"task03-heavy-2021"``.
    """

    rows: np.ndarray
    dim: np.ndarray
    pooling: np.ndarray
    reuse: np.ndarray | None = None
    dtype_bytes: int = 4
    name: list[str] | None = None
    label: str = ""

    def __post_init__(self) -> None:
        rows = _frozen_array(self.rows, np.int64, "rows")
        n = rows.shape[0]
        dim = _frozen_array(self.dim, np.int64, "dim")
        pooling = _frozen_array(self.pooling, np.float64, "pooling")
        for arr, nm in ((dim, "dim"), (pooling, "pooling")):
            if arr.shape[0] != n:
                raise ValueError(f"{nm} has {arr.shape[0]} entries, rows has {n}")
        if n and (rows.min() < 1 or dim.min() < 1):
            raise ValueError("rows and dim must be >= 1")
        if n and (not np.all(np.isfinite(pooling)) or pooling.min() < 0):
            raise ValueError("pooling must be finite and >= 0")

        if self.reuse is None:
            reuse = np.tile(reuse_profiles().mean(axis=0), (n, 1))
        else:
            reuse = np.array(self.reuse, dtype=np.float64).reshape(n, -1) if n else np.zeros((0, RF_BINS))
        if reuse.shape != (n, RF_BINS):
            raise ValueError(f"reuse must have shape ({n}, {RF_BINS}), got {reuse.shape}")
        if n and (not np.all(np.isfinite(reuse)) or reuse.min() < 0):
            raise ValueError("reuse must be finite and >= 0")
        sums = reuse.sum(axis=1, keepdims=True)
        if n and sums.min() <= 0:
            raise ValueError("every reuse row needs positive mass")
        reuse = _frozen_array(reuse / np.where(sums > 0, sums, 1.0), np.float64, "reuse", ndim=2)

        names = [f"t{i}" for i in range(n)] if self.name is None else [str(s) for s in self.name]
        if len(names) != n:
            raise ValueError(f"name has {len(names)} entries, rows has {n}")
        dtype_bytes = int(self.dtype_bytes)
        if dtype_bytes < 1:
            raise ValueError("dtype_bytes must be >= 1")

        for attr, value in (
            ("rows", rows),
            ("dim", dim),
            ("pooling", pooling),
            ("reuse", reuse),
            ("name", names),
            ("dtype_bytes", dtype_bytes),
            ("label", str(self.label)),
        ):
            object.__setattr__(self, attr, value)

    # ---- basics ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EmbeddingTables):
            return NotImplemented
        return (
            self.dtype_bytes == other.dtype_bytes
            and self.label == other.label
            and self.name == other.name
            and np.array_equal(self.rows, other.rows)
            and np.array_equal(self.dim, other.dim)
            and np.array_equal(self.pooling, other.pooling)
            and np.array_equal(self.reuse, other.reuse)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking content: not hashable

    def __repr__(self) -> str:
        return (
            f"EmbeddingTables(n={len(self)}, label={self.label!r}, "
            f"total={self.bytes_per_table().sum() / 2**30:.3f} GiB, heavy={int(self.heavy_mask().sum())})"
        )

    def bytes_per_table(self) -> np.ndarray:
        """Parameter memory of each table, bytes (int64): ``rows * dim * dtype_bytes``."""
        return self.rows * self.dim * self.dtype_bytes

    def heavy_mask(self, threshold: float = HEAVY_POOLING) -> np.ndarray:
        """Boolean mask of heavy tables: mean pooling ``L >= threshold`` (lookups/sample)."""
        return self.pooling >= threshold

    def subset(self, idx: Sequence[int] | np.ndarray | slice) -> EmbeddingTables:
        """Tables selected by integer indices, a boolean mask of length ``n``, or a slice."""
        if isinstance(idx, slice):
            sel = np.arange(len(self))[idx]
        else:
            arr = np.asarray(idx)
            if arr.dtype == bool:
                if arr.shape != (len(self),):
                    raise ValueError(f"boolean mask must have shape ({len(self)},), got {arr.shape}")
                sel = np.flatnonzero(arr)
            else:
                sel = arr.astype(np.int64).reshape(-1)
        return EmbeddingTables(
            rows=self.rows[sel],
            dim=self.dim[sel],
            pooling=self.pooling[sel],
            reuse=self.reuse[sel],
            dtype_bytes=self.dtype_bytes,
            name=[self.name[i] for i in sel],
            label=self.label,
        )

    # ---- serialisation --------------------------------------------------------------------

    def to_records(self) -> list[dict[str, Any]]:
        """Plain-Python records for YAML/JSON: ``[{name, rows, dim, pooling, reuse}, ...]``."""
        return [
            {
                "name": self.name[i],
                "rows": int(self.rows[i]),
                "dim": int(self.dim[i]),
                "pooling": float(self.pooling[i]),
                "reuse": [float(x) for x in self.reuse[i]],
            }
            for i in range(len(self))
        ]

    @classmethod
    def from_records(
        cls, records: Iterable[Mapping[str, Any]], dtype_bytes: int = 4, label: str = ""
    ) -> EmbeddingTables:
        """Inverse of :meth:`to_records`. ``rows``, ``dim``, ``pooling`` are required per record;
        ``name`` and ``reuse`` are optional (a missing ``reuse`` gets the mean dataset profile).
        """
        recs = list(records)
        for i, r in enumerate(recs):
            missing = [k for k in ("rows", "dim", "pooling") if k not in r]
            if missing:
                raise ValueError(f"table record {i} lacks {', '.join(missing)}")
        default = reuse_profiles().mean(axis=0) if any(r.get("reuse") is None for r in recs) else None
        reuse = np.array(
            [default if r.get("reuse") is None else np.asarray(r["reuse"], dtype=np.float64) for r in recs],
            dtype=np.float64,
        ).reshape(len(recs), RF_BINS)
        return cls(
            rows=[int(r["rows"]) for r in recs],
            dim=[int(r["dim"]) for r in recs],
            pooling=[float(r["pooling"]) for r in recs],
            reuse=reuse,
            dtype_bytes=dtype_bytes,
            name=[str(r.get("name", f"t{i}")) for i, r in enumerate(recs)],
            label=label,
        )


# --------------------------------------------------------------------------------------------
# Task generation (Lin et al. 2024 §IV-B1)
# --------------------------------------------------------------------------------------------

#: Fraction of heavy tables per dataset year (Lin et al. 2024 Fig. 3: 103/856 and 166/788).
HEAVY_FRACTION: dict[int, float] = {2021: 103 / 856, 2022: 166 / 788}
#: Embedding dimensions drawn uniformly (FBGEMM-friendly powers of two used by DLRM configs:
#: 64 and 128 in Lin et al. 2022 Table III, 32 for memory-constrained runs).
DIMS: tuple[int, ...] = (32, 64, 128)
#: Rows per table are log-uniform on [ROWS_MIN, ROWS_MAX]: hashed DLRM features range from
#: thousands of rows to ~10M (MLPerf/Criteo tables go up to ~14M rows, Lin et al. 2022 Table III).
ROWS_MIN, ROWS_MAX = 1_000, 10_000_000
#: Mix of light-table pooling (L < 20): P(0 < L < 1), P(L == 1, one-hot), rest log-uniform on (1, 20).
LIGHT_MIX = (0.30, 0.25)
#: Heavy pooling is Pareto(HEAVY_ALPHA) from 20, capped at HEAVY_MAX (the paper's tail reaches ~1000).
HEAVY_ALPHA, HEAVY_MAX = 1.2, 1000.0


def sample_pooling(rng: np.random.Generator, n: int, heavy: np.ndarray) -> np.ndarray:
    """Mean pooling L per table (lookups/sample); ``heavy`` marks tables to draw from the tail."""
    u = rng.random(n)
    p_frac, p_one = LIGHT_MIX
    light = np.where(
        u < p_frac,
        rng.uniform(0.01, 1.0, n),
        np.where(u < p_frac + p_one, 1.0, np.exp(rng.uniform(np.log(1.0 + 1e-3), np.log(HEAVY_POOLING), n))),
    )
    light = np.minimum(light, np.nextafter(HEAVY_POOLING, 0.0))
    tail = np.minimum(HEAVY_POOLING * rng.random(n) ** (-1.0 / HEAVY_ALPHA), HEAVY_MAX)
    return np.where(heavy, tail, light)


def _fit_memory(
    rows: np.ndarray, table_bytes_per_row: np.ndarray, per_rank: float, total: float
) -> np.ndarray:
    """Halve the rows of the largest table until every table fits one rank and the sum fits all."""
    rows = rows.copy()
    while True:
        b = rows * table_bytes_per_row
        i = int(np.argmax(b))
        if b[i] <= per_rank and b.sum() <= total:
            return rows
        if rows[i] <= ROWS_MIN:
            raise ValueError(
                f"cannot fit {len(rows)} tables of >= {ROWS_MIN} rows into {total / 2**30:.3f} GiB "
                f"({per_rank / 2**30:.3f} GiB per rank)"
            )
        rows[i] = max(ROWS_MIN, rows[i] // 2)


def generate_tasks(
    n_gpus: int,
    n_tasks: int = 20,
    seed: int = 0,
    device_memory_bytes: float = 40 * 2**30,
    memory_fraction: float = 0.8,
    dataset: Literal["2021", "2022", "both"] | int = "both",
    batch_size: int = 4096,
    dtype_bytes: int = 4,
) -> list[EmbeddingTables]:
    """Random DLRM embedding-table tasks in the manner of Lin et al. 2024 §IV-B1.

    Layout: the tasks are split evenly across the selected dataset years (2021 first); within a
    year the first half (rounded up) are *heavy* tasks (every table has ``L >= 20``) and the
    rest *normal* tasks (each table heavy with the year's dataset probability, 12.0% / 21.1%).
    With the defaults this is the paper's 20 tasks: 0-4 heavy/2021, 5-9 normal/2021, 10-14
    heavy/2022, 15-19 normal/2022; labels are ``"task03-heavy-2021"`` etc.

    Per task:

    * tables: ``round(13 * n_gpus * U(0.7, 1.3))``;
    * ``L``: light tables mix ``U(0.01, 1)`` (30%), exactly 1 (one-hot, 25%) and log-uniform
      ``(1, 20)`` (45%), so ~90% of light tables have ``L < 10`` as in the paper's Fig. 3;
      heavy tables Pareto(alpha=1.2) from 20, capped at 1000;
    * ``E``: log-uniform on ``[1e3, 1e7]`` rows; ``D``: uniform on ``{32, 64, 128}``;
    * reuse: a random block of the year's packaged profile, thinned (:func:`thin_reuse`) by the
      table's share of lookups relative to the profile's batch,
      ``f = (batch_size / B0) * (L / L0) * LogNormal(0, 0.5)`` capped at 1, where ``B0`` and
      ``L0`` are the profile's batch size and mean pooling (:func:`reuse_profile_meta`). This is
      the paper's shift toward low bins for per-batch samples; heavier tables keep more reuse.
    * memory: while a table exceeds ``memory_fraction * device_memory_bytes`` or all tables
      exceed ``n_gpus`` times that, the largest table's rows are halved (not below 1e3).

    Parameters
    ----------
    n_gpus:
        GPUs (ranks) the task is meant for.
    n_tasks:
        Number of tasks.
    seed:
        Seed of the ``numpy.random.Generator``; the result is a pure function of the arguments.
    device_memory_bytes:
        Memory per GPU, bytes (default 40 GiB, the A100-40GB of the paper's GCP platform).
    memory_fraction:
        Fraction of each GPU's memory the tables may use (paper: 80%).
    dataset:
        ``"2021"``, ``"2022"`` or ``"both"``.
    batch_size:
        Training batch size, samples, at which the reuse histograms hold.
    dtype_bytes:
        Bytes per embedding element.
    """
    if n_gpus < 1 or n_tasks < 1:
        raise ValueError("n_gpus and n_tasks must be >= 1")
    if not 0 < memory_fraction <= 1:
        raise ValueError("memory_fraction must be in (0, 1]")
    years = [2021, 2022] if str(dataset) == "both" else [int(dataset)]
    for y in years:
        if y not in HEAVY_FRACTION:
            raise ValueError(f"dataset must be '2021', '2022' or 'both', got {dataset!r}")

    rng = np.random.default_rng(seed)
    per_rank = memory_fraction * float(device_memory_bytes)
    total_budget = per_rank * n_gpus
    plan: list[tuple[int, bool]] = []
    for k, y in enumerate(years):
        n_y = n_tasks // len(years) + (1 if k < n_tasks % len(years) else 0)
        n_heavy = (n_y + 1) // 2
        plan += [(y, True)] * n_heavy + [(y, False)] * (n_y - n_heavy)

    tasks: list[EmbeddingTables] = []
    for t, (year, heavy_task) in enumerate(plan):
        n = max(1, int(round(13 * n_gpus * rng.uniform(0.7, 1.3))))
        heavy = np.ones(n, dtype=bool) if heavy_task else rng.random(n) < HEAVY_FRACTION[year]
        pooling = sample_pooling(rng, n, heavy)
        rows = np.exp(rng.uniform(np.log(ROWS_MIN), np.log(ROWS_MAX), n)).astype(np.int64)
        dim = rng.choice(np.array(DIMS, dtype=np.int64), size=n)
        rows = _fit_memory(rows, dim * dtype_bytes, per_rank, total_budget)

        profiles = reuse_profiles(year)
        meta = reuse_profile_meta(year)
        base = profiles[rng.integers(0, len(profiles), n)]
        frac = (batch_size / meta["batch_size"]) * (np.maximum(pooling, 1e-3) / meta["mean_pooling"])
        frac = np.minimum(frac * rng.lognormal(0.0, 0.5, n), 1.0)
        reuse = thin_reuse(base, frac)

        kind = "heavy" if heavy_task else "normal"
        tasks.append(
            EmbeddingTables(
                rows=rows,
                dim=dim,
                pooling=pooling,
                reuse=reuse,
                dtype_bytes=dtype_bytes,
                name=[f"t{i}" for i in range(n)],
                label=f"task{t:02d}-{kind}-{year}",
            )
        )
    return tasks
