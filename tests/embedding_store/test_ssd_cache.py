"""The ssd tier's parts: the compact key -> slot index, the file's records, and the CLOCK
cache with write-back, against the host tier over a skewed stream on a table 8x its cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from streamrec.embedding_store import EmbeddingStore, TableOptions
from streamrec.embedding_store.service.metrics import _families
from streamrec.embedding_store.tiers.ssd_file import LOAD, CompactIndex, RowFile, file_backed_bytes

T = TableOptions(
    name="t",
    dim=8,
    embedx_threshold=1.0,
    embed_sgd_param={"name": "adagrad", "initial_range": 0.1},
    embedx_sgd_param={"name": "adagrad", "initial_range": 0.1},
)


def test_compact_index_grows_erases_and_agrees_with_a_dict() -> None:
    index = CompactIndex(16)
    start = index.capacity
    rng = np.random.default_rng(0)
    ref: dict[int, int] = {}
    for _ in range(20):
        keys = torch.from_numpy(np.unique(rng.integers(-(2**62), 2**62, 3000)))
        vals = torch.from_numpy(rng.integers(0, 2**31 - 1, keys.numel()))
        index.assign(keys, vals)
        ref.update(zip(keys.tolist(), vals.tolist(), strict=True))
        assert index.size == len(ref) <= LOAD * index.capacity
        gone = keys[: keys.numel() // 3]
        index.erase(gone)
        for k in gone.tolist():
            del ref[k]
        assert index.size == len(ref)
    assert index.capacity > 100 * start  # resized as keys came
    every = torch.tensor(list(ref), dtype=torch.int64)
    assert index.find(every).tolist() == [ref[k] for k in every.tolist()]
    absent = torch.from_numpy(rng.integers(2**62, 2**63 - 1, 1000))
    found, misses = index.find_count(absent)
    assert misses == 1000 and bool((found == -1).all())
    k, v = index.items()
    assert dict(zip(k.tolist(), v.tolist(), strict=True)) == ref
    with pytest.raises(RuntimeError, match="vals must be in"):
        index.assign(torch.tensor([1]), torch.tensor([2**31]))


def test_row_file_round_trips_records_across_dropped_pages(tmp_path) -> None:
    counters = {"cache_disk_read_bytes": 0, "cache_disk_written_bytes": 0}
    f = RowFile(tmp_path / "rows.f32", 50_000, 6, counters, resident_bytes=256 << 10)
    keys = torch.arange(40_000, dtype=torch.int64) * 7_919 - 3
    rows = torch.randn(40_000, 6)
    slots = f.slots_for(keys)
    assert sorted(slots.tolist()) == list(range(40_000))
    perm = torch.randperm(40_000)
    for i, part in enumerate(perm.split(4_000)):  # random order: each call in slot order
        f.write(rows, keys, part, slots[part])
        if i == 0:
            f.drop_resident()  # the first call also paged in the code it runs
        # the file pages this process maps stay within the bound (dropped past it)
        assert file_backed_bytes() - f._base_file_bytes <= 256 << 10
    back = torch.zeros(40_000, 6)
    f.read(slots.flip(0), back, torch.arange(40_000).flip(0))
    assert torch.equal(back, rows)  # bit-identical after many drops of the mapped pages
    assert counters["cache_disk_written_bytes"] == counters["cache_disk_read_bytes"] == 40_000 * 32
    got = torch.cat([f.keys_of(chunk) for _a, chunk in f.chunks()])
    assert torch.equal(got[slots], keys)
    f.close()
    assert not (tmp_path / "rows.f32").exists()


@pytest.mark.timeout(120)
def test_table_8x_its_cache_equals_host_over_a_skewed_stream(tmp_path) -> None:
    rows = 24_000
    ssd = EmbeddingStore(
        [T],
        tier="ssd",
        persistent_path=str(tmp_path),
        cache_budget_mb=rows * 60 / 8 / 2**20,  # ~2,200 cache rows of ~81 bytes
        capacity=rows,
        seed=3,
    )
    host = EmbeddingStore([T], seed=3)
    rng = np.random.default_rng(1)
    for step in range(30):
        ranks = np.concatenate([rng.integers(0, rows // 20, 1800), rng.integers(0, rows, 200)])
        keys = ranks * 7_919 + 11
        assert torch.equal(ssd.pull("t", keys), host.pull("t", keys))
        grads = rng.normal(0, 1, (keys.size, 8)).astype(np.float32)
        for s in (ssd, host):
            s.push("t", keys, grads)
        if step == 20:  # creation well past the cache: new rows evicted unwritten so far
            fresh = np.arange(rows, dtype=np.int64) * 7_919 + 11
            assert torch.equal(ssd.pull("t", fresh), host.pull("t", fresh))
    table = ssd.tier("t")
    stats = ssd.stats()["tables"]["t"]
    assert stats["rows"] == host.size("t") >= 8 * table.cache_rows
    assert stats["cache_evictions"] > 0
    assert stats["cache_disk_read_bytes"] > 0 and stats["cache_disk_written_bytes"] > 0
    assert 0.5 < stats["cache_hit_rate"] < 1.0
    every = np.arange(rows, dtype=np.int64) * 7_919 + 11
    a, b = ssd.tier("t").export(0), host.tier("t").export(0)
    order_a, order_b = torch.argsort(a[0]), torch.argsort(b[0])
    assert torch.equal(a[0][order_a], b[0][order_b])
    assert torch.equal(a[1][order_a], b[1][order_b])  # every full row bit-identical
    assert torch.equal(ssd.pull("t", every, create=False), host.pull("t", every, create=False))
    names = {f.name for f in _families({"ns": {"tier": "ssd", **ssd.stats()}}, "0-of-1")}
    for n in ("cache_evictions", "cache_disk_read_bytes", "cache_disk_written_bytes"):
        assert f"streamrec_embedding_store_{n}" in names
    ssd.close()
