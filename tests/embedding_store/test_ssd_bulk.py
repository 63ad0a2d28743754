"""The ssd tier's bulk paths: rows created in bulk straight to the file, and checkpoints saved
and loaded a chunk at a time; both bit-identical to the host tier."""

from __future__ import annotations

import numpy as np
import pytest
import streamrec.embedding_store.persistence.reshard as reshard
import streamrec.embedding_store.tiers.ssd_table as ssd_tier
import torch
from streamrec.embedding_store import EmbeddingStore, TableOptions
from streamrec.embedding_store.persistence.converters import NpyWriter
from streamrec.embedding_store.tiers.ssd_file import RowFile

T = TableOptions(
    name="t",
    dim=8,
    embedx_threshold=0,
    embed_sgd_param={"name": "adagrad", "initial_range": 0.1},
    embedx_sgd_param={"name": "adagrad", "initial_range": 0.1},
)
ROWS = 30_000


def ssd_store(tmp_path, name: str) -> EmbeddingStore:
    return EmbeddingStore(
        [T],
        tier="ssd",
        persistent_path=str(tmp_path / name),
        cache_budget_mb=0.2,
        capacity=2 * ROWS,
        seed=3,
    )


def full_rows(store: EmbeddingStore, keys: np.ndarray) -> dict[str, torch.Tensor]:
    return store.inspect("t", keys)


def assert_same_rows(a: EmbeddingStore, b: EmbeddingStore, keys: np.ndarray) -> None:
    ra, rb = full_rows(a, keys), full_rows(b, keys)
    assert ra.keys() == rb.keys()
    for k in ra:
        assert torch.equal(ra[k], rb[k]), k


def test_bulk_creation_equals_host_with_cached_filed_and_repeated_keys(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(ssd_tier, "_BULK_CREATE", 4096)
    ssd, host = ssd_store(tmp_path, "ssd"), EmbeddingStore([T], seed=3)
    rng = np.random.default_rng(1)
    # a few rows first: some stay cached, some go to the file (the cache holds ~2k rows)
    early = rng.integers(0, 2**62, 6000)
    for s in (ssd, host):
        s.pull("t", early[:3000])
        s.pull("t", early[3000:])
    created = ssd.stats()["tables"]["t"]["rows_created"]
    # one large pull: new keys (repeated), cached keys and keys on file
    new = rng.integers(0, 2**62, ROWS)
    keys = np.concatenate([new, new[:500], early[::7]])
    rng.shuffle(keys)
    tier = ssd.tier("t")
    cached = tier.cache.cached_rows()
    bulk = []
    creating = tier._pull_creating
    monkeypatch.setattr(tier, "_pull_creating", lambda *a: bulk.append(1) or creating(*a))
    got, want = ssd.pull("t", keys), host.pull("t", keys)
    assert torch.equal(got, want)
    assert bulk == [1]  # the bulk path, not the cache's
    assert ssd.size("t") == host.size("t") == len(np.unique(np.concatenate([early, new])))
    # created on file, around the cache: the cache holds what it held
    assert ssd.stats()["tables"]["t"]["rows_created"] - created == len(np.unique(new))
    assert tier.cache.cached_rows() == cached
    assert_same_rows(ssd, host, np.concatenate([early, new]))
    # the rows train alike afterwards (read back from the file through the cache)
    grads = rng.normal(0, 1, (2000, 8)).astype(np.float32)
    for s in (ssd, host):
        s.push("t", new[:2000], grads)
    assert torch.equal(ssd.pull("t", new[:2000]), host.pull("t", new[:2000]))
    ssd.close()


@pytest.mark.timeout(60)
def test_checkpoint_round_trip_is_bit_identical_and_streams_in_chunks(
    tmp_path, monkeypatch
) -> None:
    chunk = 1000
    monkeypatch.setattr(RowFile, "CHUNK", chunk)
    monkeypatch.setattr(reshard, "CHUNK_BYTES", chunk * 4 * 22)  # ~1000 rows of width 22
    written: list[int] = []
    write = NpyWriter.write

    def counted(self: NpyWriter, block: np.ndarray) -> None:
        if self.path.name.endswith(".rows.npy"):
            written.append(block.shape[0])
        write(self, block)

    monkeypatch.setattr(NpyWriter, "write", counted)
    ssd, host = ssd_store(tmp_path, "ssd"), EmbeddingStore([T], seed=3)
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 2**62, ROWS)
    grads = rng.normal(0, 1, (ROWS, 8)).astype(np.float32)
    for s in (ssd, host):
        s.pull("t", keys)
        s.push("t", keys, grads)
    ssd.save(str(tmp_path / "ck"), "checkpoint")
    # the rows went out a file chunk at a time: never the whole table at once
    assert sum(written) == ROWS
    assert max(written) <= chunk and len(written) >= ROWS // chunk
    imported: list[int] = []
    back = ssd_store(tmp_path, "back")
    tier = back.tier("t")
    import_rows = tier.import_rows

    def counted_import(k: torch.Tensor, v: torch.Tensor) -> None:
        imported.append(k.numel())
        import_rows(k, v)

    monkeypatch.setattr(tier, "import_rows", counted_import)
    back.load(str(tmp_path / "ck"))
    assert sum(imported) == ROWS and max(imported) <= 2 * chunk and len(imported) > 10
    assert back.size("t") == ROWS
    assert_same_rows(back, host, keys)
    # the host tier loads the ssd tier's save too (same files)
    other = EmbeddingStore([T], seed=3)
    other.load(str(tmp_path / "ck"))
    assert_same_rows(other, host, keys)
    ssd.close()
    back.close()
