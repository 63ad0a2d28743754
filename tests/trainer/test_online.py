"""Online export: the trainer's base and delta saves published to a real redis-server."""

from __future__ import annotations

import json

import numpy as np
import pytest
import redis
from servers import RedisServer, free_port
from streamrec.embedding_store import FileConverter, RedisConverter
from streamrec.errors import BadRequest
from streamrec.trainer.model.online import export_online
from streamrec.trainer.runner import OnlineTrainer
from trainer_helpers import small_config


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.stop()


def served(url: str, prefix: str, table: str) -> dict[int, np.ndarray]:
    conv = RedisConverter(url, prefix)
    keys, values = conv.read_rows(table)
    conv.redis.close()
    return {int(k): v for k, v in zip(keys, values, strict=True)}


def test_base_and_delta_saves_are_published_with_a_version(stream, tmp_path, redis_url):
    prefix = "t-online"
    cfg = small_config(stream, tmp_path / "model", end_day="20190720", save_delta_frequency=1)
    cfg = cfg.model_copy(
        update={"online": cfg.online.model_copy(update={"redis_url": redis_url, "prefix": prefix})}
    )
    r = redis.Redis.from_url(redis_url)
    watcher = r.pubsub()
    watcher.subscribe(f"{prefix}:version")
    with OnlineTrainer(cfg) as t:
        plan = t.run()
        assert plan.end == ("20190720", "1200")
        # pass 1: delta_1 (not the day's last), pass 2: the day's base; a version each
        version = {k.decode(): v.decode() for k, v in r.hgetall(f"{prefix}:version").items()}
        assert version["seq"] == "2" and version["tag"] == "20190720/base"
        assert version["mode"] == "base" and version["tables"] == "4"
        for table in cfg.table_names:
            rows = served(redis_url, prefix, table)
            # exactly the rows of the base save on disk, with the store's weights
            files = FileConverter(tmp_path / "model" / "20190720" / "base" / "sparse")
            base_keys, base_values = files.read_rows(table, "base")
            assert sorted(rows) == sorted(base_keys.tolist()) and rows
            keys = np.array(sorted(rows), dtype=np.int64)
            store_rows = t.store.pull(table, keys, create=False).numpy()
            np.testing.assert_array_equal(np.stack([rows[k] for k in keys]), store_rows)
            meta = r.hgetall(f"{prefix}:{table}:meta:0-of-1")
            assert meta[b"tag"] == b"20190720/base"
        total = sum(len(served(redis_url, prefix, tb)) for tb in cfg.table_names)
        assert int(version["rows"]) == total
        # the REST trigger's mode online: a base of the model as it is now, seq 3
        out = export_online(t)
        assert out["mode"] == "online" and out["day"] == "20190720"
        assert out["version"]["seq"] == 3 and out["version"]["tag"] == "20190720/base"
    messages = []
    while (m := watcher.get_message(timeout=1)) is not None:
        if m["type"] == "message":
            messages.append(json.loads(m["data"]))
    assert [(m["seq"], m["tag"]) for m in messages] == [
        (1, "20190720/delta_1"),
        (2, "20190720/base"),
        (3, "20190720/base"),
    ]
    watcher.close()
    r.close()


def test_online_needs_a_redis_url(stream, tmp_path):
    cfg = small_config(stream, tmp_path / "model", end_day="20190720")
    with OnlineTrainer(cfg) as t:
        with pytest.raises(BadRequest, match="online.redis_url"):
            export_online(t)
    with pytest.raises(BadRequest, match="online.redis_url must be a redis:// URL"):
        small_config(stream, tmp_path).parse({"online": {"redis_url": "http://x"}})


def test_a_sharded_store_is_published_partition_by_partition(stream, tmp_path, redis_url):
    """Store service shards save their own files; each shard's rows go to its partition."""
    from streamrec.embedding_store import LocalShards
    from streamrec.trainer.store_tables import build_table_options

    prefix = "t-sharded"
    cfg = small_config(stream, tmp_path / "model", end_day="20190720")
    tables = tmp_path / "tables.json"
    tables.write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in build_table_options(cfg)]})
    )
    with LocalShards(tables, 2) as shards:
        data = cfg.model_dump(mode="json")
        data["store"]["endpoints"] = shards.endpoints
        data["online"] = {"redis_url": redis_url, "prefix": prefix, "modes": ["base"]}
        with OnlineTrainer(type(cfg).parse(data)) as t:
            t.run()
            assert t.last_online is not None and t.last_online["seq"] == 1
            total = 0
            for table in cfg.table_names:
                parts = [RedisConverter(redis_url, prefix, k, 2) for k in (0, 1)]
                sizes = [p.redis.hlen(p.key(table, "rows")) for p in parts]
                assert all(sizes), sizes  # both partitions hold rows
                keys, values = parts[0].read_rows(table)  # every partition
                assert keys.size == sum(sizes)
                total += keys.size
                np.testing.assert_array_equal(
                    values, t.store.pull(table, keys, create=False).numpy()
                )
                found = parts[1].lookup(table, keys)[1]  # the serving read routes by key
                assert found.all()
                for p in parts:
                    p.redis.close()
            assert t.last_online["rows"] == total


def test_a_delta_publishes_the_stores_deletes_and_a_replay_is_refused(tmp_path, redis_url):
    """Rows a shrink deleted leave the serving Redis with the next delta; the same delta
    published again is refused, naming both versions."""
    from streamrec.embedding_store import EmbeddingStore, TableOptions
    from streamrec.trainer.errors import OnlinePublishError
    from streamrec.trainer.model.online import publish_dir

    options = TableOptions(
        name="user",
        dim=4,
        embedx_threshold=0,
        base_threshold=0,
        delta_threshold=0,
        delta_keep_days=1000,
        delete_threshold=0,
        delete_after_unseen_days=1,
    )
    store = EmbeddingStore([options])
    keys = np.arange(50, dtype=np.int64)
    store.push("user", keys, np.ones((50, 4), np.float32))
    store.save(str(tmp_path / "base" / "sparse"), "base")
    prefix = "t-deletes"
    publish_dir(redis_url, prefix, tmp_path / "base", ["user"], "base", "d/base", {})
    assert len(served(redis_url, prefix, "user")) == 50
    store.advance_day()
    store.advance_day()
    store.push("user", keys[:20], np.ones((20, 4), np.float32))
    assert store.shrink() == {"user": 30}
    store.save(str(tmp_path / "delta" / "sparse"), "delta")
    out = publish_dir(redis_url, prefix, tmp_path / "delta", ["user"], "delta", "d/delta_1", {})
    assert out["model_version"] == 2
    rows = served(redis_url, prefix, "user")
    assert sorted(rows) == list(range(20))  # the 30 deleted keys are gone from serving
    want = store.pull("user", keys[:20], create=False).numpy()
    np.testing.assert_array_equal(np.stack([rows[k] for k in range(20)]), want)
    with pytest.raises(OnlinePublishError, match="VersionConflict.*already applied"):
        publish_dir(redis_url, prefix, tmp_path / "delta", ["user"], "delta", "d/delta_1", {})


def test_a_delta_serving_refuses_after_a_rollback_is_published_as_a_base(
    stream, tmp_path, redis_url
):
    """The trainer goes back to an older checkpoint (a group restart): its next delta does
    not apply on what serving holds (a later version). The pass does not fail: a base of the
    model as it is now is written and published instead, and serving holds the store's rows."""
    prefix = "t-rollback"
    cfg = small_config(
        stream,
        tmp_path / "model",
        end_day="20190720",
        save_delta_frequency=1,
        checkpoint_per_pass=1,
    )
    cfg = cfg.model_copy(
        update={"online": cfg.online.model_copy(update={"redis_url": redis_url, "prefix": prefix})}
    )
    with OnlineTrainer(cfg) as t:
        t.run()  # delta_1, then the day's base: serving holds the base's version
        conv = RedisConverter(redis_url, prefix)
        served_before = conv.served_model_version(cfg.table_names[0])
        t.load_checkpoint("20190720", 1)  # back to pass 1: an older model_version
        out = t.save_model("delta", "20190720", 2)
        assert out == tmp_path / "model" / "20190720" / "delta_2"
        assert t.last_online is not None and t.last_online["mode"] == "base"
        assert t.last_online["tag"] == "20190720/base"
        assert conv.served_model_version(cfg.table_names[0]) > served_before
        for table in cfg.table_names:
            rows = served(redis_url, prefix, table)
            keys = np.array(sorted(rows), dtype=np.int64)
            np.testing.assert_array_equal(
                np.stack([rows[k] for k in keys]), t.store.pull(table, keys, create=False).numpy()
            )
        conv.redis.close()
