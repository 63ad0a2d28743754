"""RedisConverter against a real redis-server started on a free port (stopped after)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import redis
from servers import RedisServer, free_port
from streamrec.embedding_store.persistence.redis_converter import RedisConverter
from streamrec.errors import BadRequest, NotFound


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def r(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


def _rows(keys, dim, seed):
    rng = np.random.default_rng(seed)
    return np.asarray(keys, dtype=np.int64), rng.standard_normal((len(keys), dim)).astype(
        np.float32
    )


def test_base_then_delta_is_what_serving_reads(r, redis_url):
    conv = RedisConverter(redis_url, prefix="t1")
    keys, values = _rows([5, 1, -3, 2**63 - 1, -(2**63)], 4, 0)
    conv.write_rows("user", keys, values, "base", "20190720/base")
    got_k, got_v = conv.read_rows("user", "20190720/base")
    order = np.argsort(keys)
    np.testing.assert_array_equal(got_k, keys[order])
    np.testing.assert_array_equal(got_v, values[order])
    assert got_v.dtype == np.float32 and got_k.dtype == np.int64
    # the feasign (uint64 bit pattern) is the Redis field
    assert r.hexists(conv.key("user", "rows"), str(np.int64(-3).view(np.uint64)))

    # delta: one changed row, one new row; the rest stays as the base wrote it
    d_keys, d_vals = _rows([1, 77], 4, 1)
    conv.write_rows("user", d_keys, d_vals, "delta", "20190720/delta_1")
    assert conv.served_tag("user") == "20190720/delta_1"
    with pytest.raises(NotFound, match="not written since its last base"):
        conv.read_rows("user", "20190719/delta_9")
    got_k, got_v = conv.read_rows("user", "20190720/base")  # the current state: base + delta
    expect = {int(k): v for k, v in zip(keys, values, strict=True)}
    expect.update({int(k): v for k, v in zip(d_keys, d_vals, strict=True)})
    assert got_k.tolist() == sorted(expect)
    np.testing.assert_array_equal(got_v, np.stack([expect[k] for k in sorted(expect)]))

    # the serving read by key: found rows equal, missing keys are zeros and not found
    q = np.array([77, 12345, 5, 1], dtype=np.int64)
    vals, found = conv.lookup("user", q)
    assert found.tolist() == [True, False, True, True]
    np.testing.assert_array_equal(vals[0], expect[77])
    np.testing.assert_array_equal(vals[1], np.zeros(4, np.float32))
    np.testing.assert_array_equal(vals[3], expect[1])


def test_base_replaces_the_table_and_drops_old_keys(redis_url):
    conv = RedisConverter(redis_url, prefix="t2")
    conv.write_rows("item", *_rows([1, 2, 3], 2, 0), "base", "d1/base")
    conv.write_rows("item", *_rows([1, 2, 3], 2, 9), "delta", "d1/delta_1")
    new_k, new_v = _rows([3, 4], 2, 5)
    conv.write_rows("item", new_k, new_v, "base", "d2/base")
    got_k, got_v = conv.read_rows("item", "d2/base")
    assert got_k.tolist() == [3, 4]
    with pytest.raises(NotFound, match="d1/delta_1"):
        conv.read_rows("item", "d1/delta_1")
    np.testing.assert_array_equal(got_v, new_v)
    # an empty base is a valid model: the table serves nothing
    conv.write_rows("item", np.zeros(0, np.int64), np.zeros((0, 2), np.float32), "base", "d3")
    got_k, got_v = conv.read_rows("item", "d3")
    assert got_k.size == 0 and got_v.shape == (0, 2)


def test_readers_never_see_half_a_base(r, redis_url):
    conv = RedisConverter(redis_url, prefix="t3", chunk_rows=500)
    n_old, n_new = 3000, 5000
    old_k = np.arange(n_old, dtype=np.int64)
    conv.write_rows("t", old_k, np.zeros((n_old, 2), np.float32), "base", "old")
    live = conv.key("t", "rows")
    seen: set[int] = set()
    stop = threading.Event()

    def reader():
        rc = redis.Redis.from_url(redis_url)
        while not stop.is_set():
            seen.add(rc.hlen(live))
        rc.close()

    th = threading.Thread(target=reader)
    th.start()
    try:
        for _ in range(3):
            conv.write_rows(
                "t",
                np.arange(n_new, dtype=np.int64) + 10**6,
                np.ones((n_new, 2), np.float32),
                "base",
                "new",
            )
            conv.write_rows("t", old_k, np.zeros((n_old, 2), np.float32), "base", "old")
    finally:
        stop.set()
        th.join()
    assert seen and seen <= {n_old, n_new}, seen


def test_crash_during_base_write_keeps_the_previous_base(r, redis_url):
    class Crashing(RedisConverter):
        def _hset_chunks(self, key, fields, rows, transaction, ttl):
            super()._hset_chunks(key, fields[:10], rows[:10], transaction, ttl)
            # what a hard crash leaves: a staging hash that expires on its own
            assert 0 < r.ttl(key) <= 24 * 3600
            raise ConnectionError("connection lost mid-write")

    good = RedisConverter(redis_url, prefix="t4")
    keys, values = _rows(range(100), 3, 0)
    good.write_rows("u", keys, values, "base", "b1")
    crashing = Crashing(redis_url, prefix="t4")
    with pytest.raises(ConnectionError):
        crashing.write_rows("u", *_rows(range(50, 250), 3, 1), "base", "b2")
    got_k, got_v = good.read_rows("u", "b1")
    np.testing.assert_array_equal(got_k, keys)
    np.testing.assert_array_equal(got_v, values)
    assert not list(r.scan_iter("t4:*staging*"))


def test_bad_input_is_refused_and_nothing_changes(redis_url):
    conv = RedisConverter(redis_url, prefix="t5")
    keys, values = _rows([1, 2], 3, 0)
    conv.write_rows("u", keys, values, "base", "b")
    bad = [
        (dict(mode="checkpoint"), "mode"),
        (dict(mode="batch"), "mode"),
        (dict(values=np.full((2, 3), np.nan, np.float32)), "NaN"),
        (dict(values=np.full((2, 3), np.inf, np.float32)), "NaN or Inf"),
        (dict(values=values.astype(np.float64)), "float32"),
        (dict(keys=keys.astype(np.int32)), "int64"),
        (dict(keys=np.array([3, 3], np.int64)), "duplicates"),
        (dict(values=np.zeros((2, 5), np.float32), mode="delta"), "dim 5"),
        (dict(values=np.zeros((3, 3), np.float32)), "values"),
    ]
    for change, match in bad:
        args = dict(table="u", keys=keys, values=values, mode="delta", tag="x") | change
        with pytest.raises(BadRequest, match=match):
            conv.write_rows(**args)
    got_k, got_v = conv.read_rows("u", "b")
    np.testing.assert_array_equal(got_k, keys)
    np.testing.assert_array_equal(got_v, values)
    with pytest.raises(NotFound, match="nothing served"):
        conv.read_rows("absent")
    with pytest.raises(BadRequest, match="shard_id"):
        RedisConverter(redis_url, shard_id=2, num_shards=2)


def test_partitions_of_a_sharded_store(redis_url):
    from streamrec.keyhash import shard_of

    keys = np.arange(-500, 500, dtype=np.int64) * 7919
    _, values = _rows(keys, 5, 3)
    owner = shard_of(keys, 2)
    convs = [RedisConverter(redis_url, prefix="t6", shard_id=k, num_shards=2) for k in (0, 1)]
    for k, conv in enumerate(convs):
        mine = owner == k
        conv.write_rows("u", keys[mine], values[mine], "base", "b")
    # a base of shard 1 replaces shard 1's rows only
    mine = owner == 1
    convs[1].write_rows("u", keys[mine], values[mine] + 1, "base", "b")
    expect = values.copy()
    expect[mine] += 1
    for conv in convs:
        got_k, got_v = conv.read_rows("u", "b")
        order = np.argsort(keys)
        np.testing.assert_array_equal(got_k, keys[order])
        np.testing.assert_array_equal(got_v, expect[order])
        vals, found = conv.lookup("u", keys)
        assert found.all()
        np.testing.assert_array_equal(vals, expect)


def test_store_saves_base_and_delta_into_redis(redis_url, tmp_path):
    """The in-process store with the converter: Redis holds the base, then base + delta."""
    import torch
    from streamrec.embedding_store import EmbeddingStore, TableOptions

    opts = TableOptions(
        name="u", dim=4, embedx_threshold=0, base_threshold=1.5, delta_threshold=0.25
    )
    store = EmbeddingStore([opts])
    conv = RedisConverter(redis_url, prefix="t7")
    hot, cold = np.arange(0, 50, dtype=np.int64), np.arange(100, 150, dtype=np.int64)
    # score = 0.1 * (show - click) + 1.0 * click: hot 2.0 (>= base_threshold), cold 0.1
    store.push("u", hot, torch.zeros(50, 4), torch.full((50,), 2.0), torch.full((50,), 2.0))
    store.push("u", cold, torch.zeros(50, 4), torch.ones(50), torch.zeros(50))
    store.save(str(tmp_path / "base"), "base", converter=conv)
    keys, values = conv.read_rows("u", "base")
    np.testing.assert_array_equal(keys, hot)
    np.testing.assert_array_equal(values, store.pull("u", hot, create=False).numpy())
    # cold keys reach 0.1 * 1 + 1.0 * 1 = 1.1 >= delta_threshold: the delta adds them
    store.push("u", cold, torch.ones(50, 4), torch.ones(50), torch.ones(50))
    store.save(str(tmp_path / "delta_1"), "delta", converter=conv)
    keys, values = conv.read_rows("u", "delta")
    np.testing.assert_array_equal(keys, np.concatenate([hot, cold]))
    np.testing.assert_array_equal(values, store.pull("u", keys, create=False).numpy())
    store.close()


def test_service_shards_publish_base_to_redis(redis_url, tmp_path):
    import json

    import torch
    from streamrec.embedding_store import EmbeddingStoreClient, LocalShards

    tables = tmp_path / "tables.yaml"
    tables.write_text(json.dumps([{"name": "u", "dim": 8, "embedx_threshold": 0}]))
    keys = np.arange(1, 401, dtype=np.int64) * 1_000_003
    extra = ["--redis-url", redis_url, "--redis-prefix", "svc"]
    with LocalShards(tables, 2, extra_args=extra) as shards:
        client = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
        # score 0.1 * (3 - 2) + 2 = 2.1 >= base_threshold (1.5): every key is in the base
        client.push(
            "u", keys, torch.full((400, 8), 0.01), torch.full((400,), 3.0), torch.full((400,), 2.0)
        )
        result = client.save(str(tmp_path / "20190720" / "base"), "base", converter="redis")
        assert [s["manifest"]["extra"]["shard_id"] for s in result["shards"]] == [0, 1]
        serving = RedisConverter(redis_url, prefix="svc", num_shards=2)
        got_k, got_v = serving.read_rows("u", "base")
        np.testing.assert_array_equal(got_k, keys)
        np.testing.assert_array_equal(got_v, client.pull("u", keys, create=False).numpy())
        vals, found = serving.lookup("u", keys[::-1])
        assert found.all()
        np.testing.assert_array_equal(vals, got_v[::-1])
        # a shard without --redis-url says so; the converter name is checked
        with pytest.raises(BadRequest, match="'files' or 'redis'"):
            client.save(str(tmp_path / "x"), "base", converter="s3")
        client.close()
    with LocalShards(tables, 1) as plain:
        client = EmbeddingStoreClient(plain.endpoints, timeout_s=30)
        from streamrec.errors import RemoteError

        with pytest.raises(RemoteError, match="--redis-url"):
            client.save(str(tmp_path / "y"), "base", converter="redis")
        client.close()
