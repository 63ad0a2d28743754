"""Deletes carried by deltas, versions of base and delta saves, and deleted rows counted.

A real store (host and ssd tiers), real files and a real redis-server: rows
a shrink or an erase deletes reach serving with the next delta (file deltas and the serving
Redis alike), a model rebuilt from base + deltas is the store's live set, a delta applied
twice or out of order is refused, and all of it survives a store restart from a checkpoint
between the shrink and the delta. The deleted rows are counted by reason on a shard's
``/metrics``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
from servers import RedisServer, free_port, scrape_metrics
from streamrec.embedding_store import (
    EmbeddingStore,
    EmbeddingStoreClient,
    FileConverter,
    LocalShards,
    RedisConverter,
    SaveVersion,
    TableOptions,
    VersionConflict,
)
from streamrec.embedding_store.persistence.manifests import read_manifest
from streamrec.embedding_store.tiers.table_tier import SELECT_ALL


def table(name: str, dim: int) -> TableOptions:
    """Every row in every base and delta (thresholds 0), deleted after one unseen day."""
    return TableOptions(
        name=name,
        dim=dim,
        embedx_threshold=0,
        base_threshold=0,
        delta_threshold=0,
        delta_keep_days=1000,
        delete_threshold=0,  # no score is under 0: only unseen days delete
        delete_after_unseen_days=1,
    )


TABLES = [table("user", 4), table("item", 3)]
OLD = np.arange(0, 200, dtype=np.int64)
KEPT = OLD[:80]  # seen again before the shrink
NEW = np.arange(1000, 1050, dtype=np.int64)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.stop()


def make_store(tier: str, root: Path) -> EmbeddingStore:
    if tier == "ssd":
        root.mkdir(parents=True, exist_ok=True)
        return EmbeddingStore(
            TABLES, tier="ssd", persistent_path=str(root), capacity=10_000, cache_budget_mb=0.01
        )
    return EmbeddingStore(TABLES)


def push(store: EmbeddingStore, keys: np.ndarray, value: float) -> None:
    for t in TABLES:
        store.push(t.name, keys, np.full((keys.size, t.dim), value, np.float32))


def live(store: EmbeddingStore, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The store's live keys of table ``name`` (sorted) and their weights."""
    with store.exclusive(name) as tier:
        keys = np.sort(tier.export(SELECT_ALL)[0].numpy())
    return keys, store.pull(name, keys, create=False).numpy()


def publish(url: str, prefix: str, directory: Path, mode: str) -> None:
    """What the trainer's online export does: a save's files, read back, to Redis."""
    manifest = json.loads((directory / "MANIFEST.json").read_text())
    files = FileConverter(directory)
    conv = RedisConverter(url, prefix)
    try:
        for t in TABLES:
            keys, values = files.read_rows(t.name, mode)
            deleted = files.read_deleted(t.name, mode) if mode == "delta" else None
            version = SaveVersion.of_manifest(manifest)
            conv.write_rows(t.name, keys, values, mode, directory.name, deleted, version)
    finally:
        conv.redis.close()


def served(url: str, prefix: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    conv = RedisConverter(url, prefix)
    try:
        return conv.read_rows(name)
    finally:
        conv.redis.close()


@pytest.mark.parametrize(
    ("tier", "restart"),
    [("host", False), ("host", True), ("ssd", True)],
)
def test_deltas_carry_deletes_to_files_and_redis_and_refuse_replays(
    tmp_path, redis_url, tier, restart
):
    prefix = f"t-{tier}-{restart}"
    store = make_store(tier, tmp_path / "ssd")
    push(store, OLD, 0.1)
    base = store.save(str(tmp_path / "base"), "base")
    assert (base["model_version"], base["applies_on"]) == (1, None)
    publish(redis_url, prefix, tmp_path / "base", "base")

    store.advance_day()
    store.advance_day()  # every row unseen for 2 days > 1
    push(store, KEPT, 0.2)  # seen again: kept
    push(store, NEW, 0.3)
    assert store.shrink() == {"user": OLD.size - KEPT.size, "item": OLD.size - KEPT.size}
    assert store.erase("user", [KEPT[0], KEPT[1], 999_999]) == 2  # the absent key: nothing
    assert store.stats()["tables"]["user"]["deletes_pending"] == OLD.size - KEPT.size + 2
    if restart:  # a store restarted from a checkpoint between the shrink and the delta
        ck = store.save(str(tmp_path / "ck"), "checkpoint")
        assert ck["model_version"] == 1 and ck["tables"]["user"]["deleted"] == 122
        store.close()
        store = make_store(tier, tmp_path / "ssd-again")
        store.load(str(tmp_path / "ck"))
        assert store.model_version == 1
    push(store, OLD[150:152], 0.4)  # deleted, then made again: written, not deleted

    delta = store.save(str(tmp_path / "d1"), "delta")
    assert (delta["model_version"], delta["applies_on"]) == (2, 1)
    assert delta["tables"]["user"]["deleted"] == OLD.size - KEPT.size + 2 - 2
    assert delta["tables"]["item"]["deleted"] == OLD.size - KEPT.size - 2
    assert "user.delta.deleted.npy" in read_manifest(tmp_path / "d1")["files"]  # checksummed
    assert store.stats()["tables"]["user"]["deletes_pending"] == 0  # carried: cleared
    publish(redis_url, prefix, tmp_path / "d1", "delta")

    rebuilt = EmbeddingStore(TABLES)
    rebuilt.load(str(tmp_path / "base"))
    rebuilt.load(str(tmp_path / "d1"))
    assert rebuilt.model_version == 2
    for t in TABLES:
        keys, weights = live(store, t.name)
        assert 0 not in keys or t.name == "item"
        got_keys, got_weights = live(rebuilt, t.name)
        np.testing.assert_array_equal(got_keys, keys)  # exactly the live set
        np.testing.assert_array_equal(got_weights, weights)
        redis_keys, redis_values = served(redis_url, prefix, t.name)
        np.testing.assert_array_equal(redis_keys, keys)
        np.testing.assert_array_equal(redis_values, weights)
    by_reason = rebuilt.stats()["tables"]["user"]["rows_deleted_by_reason"]
    assert by_reason == {"delta_load": OLD.size - KEPT.size}

    # the same delta again: refused by the files and by Redis, naming both versions
    with pytest.raises(VersionConflict, match=r"model_version=2 has applies_on=1.*holds model_"):
        rebuilt.load(str(tmp_path / "d1"))
    with pytest.raises(VersionConflict, match=r"applies_on=1, the partition serves model_ver"):
        publish(redis_url, prefix, tmp_path / "d1", "delta")
    # out of order: d3 before d2 is refused; in order both apply
    push(store, NEW[:5], 0.5)
    store.save(str(tmp_path / "d2"), "delta")
    store.erase("item", NEW[5:7])
    store.save(str(tmp_path / "d3"), "delta")
    with pytest.raises(VersionConflict, match=r"model_version=4 has applies_on=3.*out of order"):
        rebuilt.load(str(tmp_path / "d3"))
    with pytest.raises(VersionConflict, match=r"serves model_version=2: out of order"):
        publish(redis_url, prefix, tmp_path / "d3", "delta")
    for d in ("d2", "d3"):
        rebuilt.load(str(tmp_path / d))
        publish(redis_url, prefix, tmp_path / d, "delta")
    conv = RedisConverter(redis_url, prefix)
    assert conv.served_model_version("item") == 4
    conv.redis.close()
    for t in TABLES:
        keys, weights = live(store, t.name)
        np.testing.assert_array_equal(live(rebuilt, t.name)[0], keys)
        np.testing.assert_array_equal(served(redis_url, prefix, t.name)[1], weights)
    assert 1005 not in live(rebuilt, "item")[0] and 1005 in live(rebuilt, "user")[0]


def test_a_base_clears_the_record_and_a_failed_delta_gives_it_back(tmp_path, monkeypatch):
    store = EmbeddingStore(TABLES)
    push(store, OLD, 0.1)
    store.erase("user", OLD[:10])
    base = store.save(str(tmp_path / "base"), "base")
    assert base["tables"]["user"]["deleted"] == 0  # a base replaces: nothing to delete
    assert not (tmp_path / "base" / "user.base.deleted.npy").exists()
    store.erase("user", OLD[10:20])

    def broken(self, *args, **kwargs):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(FileConverter, "write_rows", broken)
    with pytest.raises(OSError, match="I/O"):
        store.save(str(tmp_path / "d1"), "delta")
    monkeypatch.undo()
    assert store.model_version == 1  # the failed delta numbered nothing
    delta = store.save(str(tmp_path / "d1"), "delta")
    assert (delta["model_version"], delta["applies_on"]) == (2, 1)
    deleted = FileConverter(tmp_path / "d1").read_deleted("user", "delta")
    np.testing.assert_array_equal(deleted, OLD[10:20])


def test_a_delta_whose_shards_are_not_in_step_is_refused(tmp_path):
    """The parts of one delta (shard-K-of-N) with other versions: one store cannot apply it."""
    store = EmbeddingStore(TABLES)
    push(store, OLD, 0.1)
    store.save(str(tmp_path / "base"), "base")
    push(store, OLD[:5], 0.2)
    for k in range(2):
        store.model_version = 1 + k  # shard 1 ran one delta more
        store.save(str(tmp_path / "d" / f"shard-{k}-of-2"), "delta", extra={"shard_id": k})
    rebuilt = EmbeddingStore(TABLES)
    rebuilt.load(str(tmp_path / "base"))
    with pytest.raises(VersionConflict, match=r"not in step"):
        rebuilt.load(str(tmp_path / "d"))


def test_deleted_rows_are_counted_by_reason_on_the_shards_metrics(tmp_path):
    """A shard process's /metrics: 0 for every reason until rows go, then the shrink's rows
    under reason shrink, and a dropped namespace's rows under reason namespace_drop."""
    options = [table("user", 4)]
    with LocalShards(None, 1, metrics=True, model_roots=[tmp_path]) as shards:
        client = EmbeddingStoreClient(shards.endpoints, options, timeout_s=20, namespace="job")
        port = shards.metrics_ports[0]
        keys = torch.arange(0, 100, dtype=torch.int64)
        client.push("user", keys, torch.ones(100, 4))
        client.shrink()  # nothing unseen yet: nothing deleted
        name = "streamrec_embedding_store_rows_deleted_total"
        labels = 'namespace="job",reason="{}",shard="0-of-1",table="user"'
        scraped = scrape_metrics(port)
        for reason in ("shrink", "erase", "delta_load"):
            assert scraped[f"{name}{{{labels.format(reason)}}}"] == 0
        live = 'streamrec_embedding_store_table_rows{namespace="job",shard="0-of-1",table="user"}'
        assert scraped[live] == 100
        client.advance_day()
        client.advance_day()
        client.push("user", keys[:30], torch.ones(30, 4))
        assert client.shrink() == {"user": 70}
        scraped = scrape_metrics(port)
        assert scraped[f"{name}{{{labels.format('shrink')}}}"] == 70
        assert scraped[f"{name}{{{labels.format('erase')}}}"] == 0
        assert scraped[live] == 30
        assert client.drop_namespace() == {"user": 30}
        client.close()
        dropped = 'namespace="*",reason="namespace_drop",shard="0-of-1",table="user"'
        assert scrape_metrics(port)[f"{name}{{{dropped}}}"] == 30


def test_redis_served_version_names_the_model(redis_url):
    """``served_version`` (the prefix's) carries the model_version a publish names."""
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    r.close()
    conv = RedisConverter(redis_url, "t-version")
    keys = np.arange(3, dtype=np.int64)
    values = np.ones((3, 2), np.float32)
    assert conv.served_model_version("user") is None
    conv.write_rows("user", keys, values, "base", "b", version=SaveVersion(7))
    assert conv.served_model_version("user") == 7
    conv.publish_version({"tag": "b", "mode": "base", "model_version": 7})
    assert conv.served_version() == {"seq": "1", "tag": "b", "mode": "base", "model_version": "7"}
    with pytest.raises(VersionConflict, match="already applied"):
        conv.write_rows("user", keys, values, "delta", "d", version=SaveVersion(7, 6))
    conv.write_rows(
        "user", keys[:1], values[:1], "delta", "d", deleted=keys[1:], version=SaveVersion(8, 7)
    )
    assert conv.read_rows("user")[0].tolist() == [0]
    conv.redis.close()
