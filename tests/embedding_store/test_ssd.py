"""The ssd tier: rows in a file with a bounded RAM cache, equal to the host tier."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from streamrec.embedding_store import EmbeddingStore, FileConverter, TableOptions
from streamrec.embedding_store.errors import CapacityExceeded, InvalidInput

T = TableOptions(
    name="t",
    dim=8,
    embedx_threshold=1.0,
    delete_threshold=0.15,
    delete_after_unseen_days=1,
    base_threshold=0.5,
    embed_sgd_param={"name": "adagrad", "initial_range": 0.1},
    embedx_sgd_param={"name": "adam", "initial_range": 0.1},
)
KEYS = 20_000


def pair(tmp_path, budget_mb: float = 0.15) -> tuple[EmbeddingStore, EmbeddingStore]:
    ssd = EmbeddingStore(
        [T],
        tier="ssd",
        persistent_path=str(tmp_path / "ssd"),
        cache_budget_mb=budget_mb,
        capacity=50_000,
        seed=4,
    )
    return ssd, EmbeddingStore([T], seed=4)


def test_ssd_beyond_its_cache_budget_equals_host_and_reports_hit_rate(tmp_path) -> None:
    ssd, host = pair(tmp_path)
    rng = np.random.default_rng(0)
    for step in range(40):
        keys = (rng.zipf(1.2, 2000) % KEYS).astype(np.int64)
        for s in (ssd, host):
            s.pull("t", keys)
        assert torch.equal(ssd.pull("t", keys), host.pull("t", keys))
        grads = rng.normal(0, 1, (2000, 8)).astype(np.float32)
        clicks = (rng.random(2000) < 0.2).astype(np.float32)
        for s in (ssd, host):
            s.push("t", keys, grads, None, clicks)
        if step % 15 == 14:
            for s in (ssd, host):
                s.advance_day()
            assert ssd.shrink() == host.shrink()
    all_keys = np.arange(KEYS)
    assert torch.equal(
        ssd.pull("t", all_keys, create=False), host.pull("t", all_keys, create=False)
    )
    a, b = ssd.inspect("t", all_keys), host.inspect("t", all_keys)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    stats = ssd.stats()["tables"]["t"]
    tier = ssd.tier("t")
    assert ssd.size("t") == host.size("t") == stats["rows"]
    assert stats["rows"] >= 4 * tier.cache_rows  # the table is 4x its cache
    assert stats["rows_by_tier"]["host"] <= tier.cache_rows
    assert stats["rows_by_tier"]["ssd"] > tier.cache_rows
    assert 0.0 < stats["cache_hit_rate"] < 1.0
    assert stats["cache_hits"] + stats["cache_misses"] > 0
    assert stats["bytes"]["ssd"] > 0
    assert stats["rows_deleted"] > 0
    # base selection and checkpoints agree across tiers; an ssd checkpoint loads into host
    ssd.save(str(tmp_path / "base_ssd"), "base")
    host.save(str(tmp_path / "base_host"), "base")
    ks, vs = FileConverter(tmp_path / "base_ssd").read_rows("t", "base")
    kh, vh = FileConverter(tmp_path / "base_host").read_rows("t", "base")
    assert len(ks) > 0 and set(ks.tolist()) == set(kh.tolist())
    ssd.save(str(tmp_path / "ck"), "checkpoint")
    back = EmbeddingStore([T], seed=4)
    back.load(str(tmp_path / "ck"))
    assert torch.equal(
        back.pull("t", all_keys, create=False), host.pull("t", all_keys, create=False)
    )
    other = EmbeddingStore(
        [T],
        tier="ssd",
        persistent_path=str(tmp_path / "ssd2"),
        cache_budget_mb=0.25,
        capacity=50_000,
        seed=4,
    )
    other.load(str(tmp_path / "ck"))
    assert torch.equal(
        other.pull("t", all_keys, create=False), host.pull("t", all_keys, create=False)
    )
    ssd.close()
    other.close()
    assert not (tmp_path / "ssd" / "t" / "rows.f32").exists()


def test_ssd_capacity_and_path_in_use(tmp_path) -> None:
    ssd = EmbeddingStore(
        [T], tier="ssd", persistent_path=str(tmp_path), cache_budget_mb=0.1, capacity=1000
    )
    ssd.pull("t", np.arange(900))
    with pytest.raises(CapacityExceeded, match="capacity 1000"):
        ssd.pull("t", np.arange(900, 1200))
    assert ssd.size("t") == 900
    with pytest.raises(InvalidInput, match="in use"):
        EmbeddingStore(
            [T], tier="ssd", persistent_path=str(tmp_path), cache_budget_mb=0.1, capacity=1000
        )
    ssd.close()
    again = EmbeddingStore(
        [T], tier="ssd", persistent_path=str(tmp_path), cache_budget_mb=0.1, capacity=1000
    )
    assert again.size("t") == 0
    again.close()
