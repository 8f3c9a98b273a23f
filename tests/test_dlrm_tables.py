"""Tests of predictor.sources.synth.dlrm_tables: table set, locality-stats parsing, task generation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from predictor.sources.synth.dlrm_reuse import (
    RF_BINS,
    load_locality_stats,
    parse_locality_stats,
    reuse_profile_meta,
    reuse_profiles,
    thin_reuse,
)
from predictor.sources.synth.dlrm_tables import HEAVY_FRACTION, EmbeddingTables, generate_tasks

REPO = Path(__file__).resolve().parents[1]
LOCALITY_DIR = REPO.parent / "shared" / "data" / "dlrm_locality"
needs_stats = pytest.mark.skipif(not LOCALITY_DIR.is_dir(), reason="../shared/data/dlrm_locality not present")


def _tables(n: int = 4) -> EmbeddingTables:
    return EmbeddingTables(
        rows=np.arange(1, n + 1) * 1000,
        dim=[64] * n,
        pooling=np.linspace(0.5, 40.0, n),
        name=[f"x{i}" for i in range(n)],
        label="toy",
    )


# ---- EmbeddingTables --------------------------------------------------------------------------


def test_tables_basics():
    t = _tables(4)
    assert len(t) == 4
    assert t.bytes_per_table().tolist() == [r * 64 * 4 for r in (1000, 2000, 3000, 4000)]
    assert t.heavy_mask().tolist() == [False, False, True, True]  # L = 0.5, 13.7, 26.8, 40
    assert t.heavy_mask(threshold=10.0).sum() == 3
    assert t.reuse.shape == (4, RF_BINS)
    np.testing.assert_allclose(t.reuse.sum(axis=1), 1.0)  # default profile, normalised
    with pytest.raises(ValueError):
        t.rows[0] = 5  # read-only columns


def test_tables_subset_and_records_roundtrip():
    t = _tables(5)
    s = t.subset([4, 1])
    assert s.name == ["x4", "x1"] and s.rows.tolist() == [5000, 2000]
    assert t.subset(t.heavy_mask()).name == ["x2", "x3", "x4"]
    assert len(t.subset(slice(1, 3))) == 2

    recs = t.to_records()
    back = EmbeddingTables.from_records(yaml.safe_load(yaml.safe_dump(recs)), label="toy")
    assert back == t
    back_json = EmbeddingTables.from_records(json.loads(json.dumps(recs)), label="toy")
    assert back_json == t

    # reuse is optional in records; a missing one gets the mean dataset profile
    bare = EmbeddingTables.from_records([{"rows": 10, "dim": 4, "pooling": 2.0}])
    np.testing.assert_allclose(
        bare.reuse[0], reuse_profiles().mean(axis=0) / reuse_profiles().mean(axis=0).sum()
    )
    assert bare.name == ["t0"]
    with pytest.raises(ValueError, match="pooling"):
        EmbeddingTables.from_records([{"rows": 10, "dim": 4}])


def test_tables_validation():
    with pytest.raises(ValueError):
        EmbeddingTables(rows=[10, 20], dim=[4], pooling=[1.0, 1.0])
    with pytest.raises(ValueError):
        EmbeddingTables(rows=[0], dim=[4], pooling=[1.0])
    with pytest.raises(ValueError):
        EmbeddingTables(rows=[10], dim=[4], pooling=[1.0], reuse=np.ones((1, 5)))
    t = EmbeddingTables(rows=[10], dim=[4], pooling=[1.0], reuse=2 * np.ones((1, RF_BINS)))
    np.testing.assert_allclose(t.reuse.sum(), 1.0)  # renormalised


# ---- locality stats ---------------------------------------------------------------------------


@needs_stats
@pytest.mark.parametrize("year,n_blocks,batch", [(2021, 17, 65536), (2022, 16, 131072)])
def test_parse_real_locality_stats(year, n_blocks, batch):
    path = LOCALITY_DIR / f"{year}_locality_stats.txt"
    blocks = parse_locality_stats(path)
    assert len(blocks) == n_blocks
    assert all(b.batch_size == batch for b in blocks)
    raw = np.array([b.index_ratio for b in blocks])
    assert raw.shape == (n_blocks, RF_BINS)
    np.testing.assert_allclose(raw.sum(axis=1), 1.0, atol=0.01)  # printed with 3 decimals
    # first 2021 block, as printed in the file
    if year == 2021:
        assert raw[0, 0] == pytest.approx(0.069) and raw[0, 16] == pytest.approx(0.019)
        assert blocks[0].col_histogram[0] == pytest.approx(0.473)

    for kind in ("index", "col"):
        h = load_locality_stats(path, kind=kind)
        assert h.shape == (n_blocks, RF_BINS)
        assert np.all(h >= 0)
        np.testing.assert_allclose(h.sum(axis=1), 1.0, atol=1e-12)


@needs_stats
def test_packaged_profiles_match_parse():
    for year in (2021, 2022):
        parsed = load_locality_stats(LOCALITY_DIR / f"{year}_locality_stats.txt")
        np.testing.assert_allclose(reuse_profiles(year), parsed, atol=1e-12)
        np.testing.assert_allclose(
            reuse_profiles(year, kind="col"),
            load_locality_stats(LOCALITY_DIR / f"{year}_locality_stats.txt", kind="col"),
            atol=1e-12,
        )
    both = reuse_profiles()
    assert both.shape == (33, RF_BINS)
    np.testing.assert_allclose(both[:17], reuse_profiles(2021))


def test_packaged_profiles_source_and_meta():
    from importlib import resources

    doc = json.loads(
        resources.files("predictor.sources.synth").joinpath("data/dlrm_reuse_profiles.json").read_text()
    )
    assert "facebookresearch/dlrm_datasets" in doc["source"]
    assert "locality_stats.txt" in doc["source"]
    m21, m22 = reuse_profile_meta(2021), reuse_profile_meta(2022)
    assert m21["batch_size"] == 65536 and m22["batch_size"] == 131072
    assert m21["n_tables"] == 856 and m22["n_tables"] == 788
    assert 1 < m21["mean_pooling"] < 30 and 1 < m22["mean_pooling"] < 30
    with pytest.raises(ValueError):
        reuse_profiles(2023)


# ---- thinning ---------------------------------------------------------------------------------


def _mean_bin(h: np.ndarray) -> np.ndarray:
    return h @ np.arange(RF_BINS)


def test_thin_reuse_shifts_toward_low_bins():
    p = reuse_profiles(2021)[0]
    np.testing.assert_allclose(thin_reuse(p, 1.0), p, atol=1e-12)
    fs = [1.0, 0.5, 1 / 16, 1 / 256, 1e-4]
    means = [_mean_bin(thin_reuse(p, f)) for f in fs]
    assert all(a > b for a, b in zip(means, means[1:], strict=False))
    tiny = thin_reuse(p, 1e-6)
    assert tiny[0] > 0.9  # nearly every lookup hits a row only once
    # a row accessed exactly once stays in bin 0 whatever the fraction
    one = np.zeros(RF_BINS)
    one[0] = 1
    np.testing.assert_allclose(thin_reuse(one, 0.01), one)
    # batched form, per-row fractions, composition f1 * f2
    batch = thin_reuse(np.stack([p, p]), np.array([1.0, 0.25]))
    np.testing.assert_allclose(batch.sum(axis=1), 1.0)
    np.testing.assert_allclose(batch[1], thin_reuse(p, 0.25))
    np.testing.assert_allclose(thin_reuse(thin_reuse(p, 0.25), 0.25), thin_reuse(p, 1 / 16), atol=0.01)
    with pytest.raises(ValueError):
        thin_reuse(p, 0.0)


# ---- task generation --------------------------------------------------------------------------


def test_generate_tasks_deterministic():
    a = generate_tasks(4, seed=7)
    b = generate_tasks(4, seed=7)
    assert len(a) == 20
    assert all(x == y for x, y in zip(a, b, strict=True))
    c = generate_tasks(4, seed=8)
    assert any(x != y for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("n_gpus", [2, 4, 8])
def test_generate_tasks_shape_and_labels(n_gpus):
    tasks = generate_tasks(n_gpus, seed=0)
    labels = [t.label for t in tasks]
    assert labels[0] == "task00-heavy-2021" and labels[5] == "task05-normal-2021"
    assert labels[10] == "task10-heavy-2022" and labels[19] == "task19-normal-2022"
    assert sum("heavy" in s for s in labels) == 10
    for t in tasks:
        assert round(0.7 * 13 * n_gpus) <= len(t) <= round(1.3 * 13 * n_gpus)
        assert set(np.unique(t.dim)) <= {32, 64, 128}
        assert t.rows.min() >= 1_000 and t.rows.max() <= 10_000_000
        assert t.reuse.shape == (len(t), RF_BINS)
        np.testing.assert_allclose(t.reuse.sum(axis=1), 1.0)
        assert len(set(t.name)) == len(t)


def test_generate_tasks_heavy_fractions_and_pooling():
    tasks = generate_tasks(8, seed=0)
    for t in tasks:
        if "heavy" in t.label:
            assert t.heavy_mask().all()
    for year in (2021, 2022):
        normal = [t for t in tasks if t.label.endswith(f"normal-{year}")]
        assert len(normal) == 5
        pooled = np.concatenate([t.pooling for t in normal])
        frac = float(np.mean(pooled >= 20))
        assert abs(frac - HEAVY_FRACTION[year]) < 0.05, (year, frac)
        light = pooled[pooled < 20]
        assert np.mean(light < 10) > 0.8  # concentrated in [0, 10)
        assert np.mean(light <= 1) > 0.4  # especially [0, 1]
    all_normal = np.concatenate([t.pooling for t in tasks if "normal" in t.label])
    assert 0.12 <= np.mean(all_normal >= 20) <= 0.21
    heavy_pool = np.concatenate([t.pooling for t in tasks if "heavy" in t.label])
    assert heavy_pool.max() > 100  # heavy tail reaches hundreds
    assert heavy_pool.max() <= 1000


def test_generate_tasks_reuse_is_per_batch():
    tasks = generate_tasks(4, seed=0)
    whole = _mean_bin(reuse_profiles()).mean()
    for t in tasks:
        assert _mean_bin(t.reuse).mean() < whole  # shifted toward low bins
    # heavier tables keep more reuse than light ones
    normal = tasks[5]
    mb = _mean_bin(normal.reuse)
    assert mb[normal.heavy_mask()].mean() > mb[~normal.heavy_mask()].mean()
    # a smaller batch shifts further
    small = generate_tasks(4, seed=0, batch_size=512)
    assert _mean_bin(small[0].reuse).mean() < _mean_bin(tasks[0].reuse).mean()


@pytest.mark.parametrize("n_gpus,mem_gib", [(2, 2.0), (4, 1.0), (8, 40.0)])
def test_generate_tasks_memory_bound(n_gpus, mem_gib):
    mem = mem_gib * 2**30
    tasks = generate_tasks(n_gpus, n_tasks=6, seed=3, device_memory_bytes=mem, memory_fraction=0.8)
    for t in tasks:
        b = t.bytes_per_table()
        assert b.sum() <= n_gpus * 0.8 * mem
        assert b.max() <= 0.8 * mem


def test_generate_tasks_single_dataset_and_errors():
    tasks = generate_tasks(2, n_tasks=5, dataset="2022")
    assert [t.label for t in tasks] == [
        "task00-heavy-2022",
        "task01-heavy-2022",
        "task02-heavy-2022",
        "task03-normal-2022",
        "task04-normal-2022",
    ]
    with pytest.raises(ValueError):
        generate_tasks(2, dataset="2019")
    with pytest.raises(ValueError, match="cannot fit"):
        generate_tasks(4, device_memory_bytes=1e6)
