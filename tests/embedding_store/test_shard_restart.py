"""A shard restarted EMPTY at the same address (as a Kubernetes StatefulSet restarts a crashed
pod) is seen by its clients: data ops raise ``ShardRestarted`` and do nothing on the shard,
until the client loads a checkpoint (or accepts the shards as they are).

The shards run as separate processes (``LocalShards``), killed with SIGKILL and started
again on the same endpoint.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from streamrec import wire
from streamrec.embedding_store import EmbeddingStore, EmbeddingStoreClient, LocalShards
from streamrec.embedding_store.errors import ShardRestarted
from streamrec.embedding_store.service.handlers import StoreService
from streamrec.embedding_store.service.incarnation import (
    EXPECT_FIELD,
    REPLY_FIELD,
    Incarnations,
    new_incarnation,
)
from streamrec.errors import BadRequest
from streamrec.keyhash import shard_of
from streamrec.process import free_port
from streamrec.store_schema import TableOptions

TABLES = [
    {
        "name": "user",
        "embedx_dim": 4,
        "embedx_threshold": 0,
        "initializer": {"type": "uniform", "low": -0.1, "high": 0.1},
        "embed_sgd_param": {"name": "naive", "learning_rate": 0.1},
        "embedx_sgd_param": {"name": "naive", "learning_rate": 0.1},
    },
]
DIM = 5  # embed_w + 4 embedx


@pytest.fixture
def tables_file(tmp_path):
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": TABLES}))
    return path


def keys_of(shard: int, num_shards: int, n: int = 64) -> torch.Tensor:
    """``n`` keys (n,) int64 that shard ``shard`` of ``num_shards`` owns."""
    keys = np.arange(1, 50 * n * num_shards, dtype=np.int64)
    return torch.from_numpy(keys[shard_of(keys, num_shards) == shard][:n])


def restart(shards: LocalShards, k: int) -> None:
    """Shard ``k`` crashes (SIGKILL) and comes back, empty, at the same endpoint."""
    endpoint = shards.endpoints[k]
    shards.kill(k)
    shards.start_shard(k)
    assert shards.endpoints[k] == endpoint


def test_a_restarted_shard_refuses_data_ops_until_the_checkpoint_is_loaded(tables_file, tmp_path):
    """Pull, push, shrink and save against the restarted shard raise ShardRestarted (naming
    it) and leave it empty; ping/size/stats still answer; the other shard serves on; a
    checkpoint load brings the rows back and re-arms the client."""
    model = tmp_path / "model"
    endpoint = f"ipc://{tmp_path}/shard-{{shard}}.ipc"
    with LocalShards(tables_file, 2, endpoint=endpoint, model_roots=[tmp_path]) as shards:
        client = EmbeddingStoreClient(shards.endpoints, timeout_s=20)
        mine, other = keys_of(1, 2), keys_of(0, 2)
        both = torch.cat([mine, other])
        client.push("user", both, torch.ones(both.numel(), DIM))
        trained = client.pull("user", both)
        client.save(str(model / "ckpt"), "checkpoint")
        before = client.incarnations()

        restart(shards, 1)
        with pytest.raises(ShardRestarted) as info:
            client.pull("user", mine)
        assert shards.endpoints[1] in str(info.value)
        assert "rows are gone" in str(info.value) and "checkpoint" in str(info.value)
        assert client.sizes("user") == [other.numel(), 0]  # the pull created no row
        with pytest.raises(ShardRestarted):
            client.pull("user", both, create=False)
        with pytest.raises(ShardRestarted):
            client.push("user", mine, torch.ones(mine.numel(), DIM))
        with pytest.raises(ShardRestarted):
            client.pull_many(["user"], [mine])
        with pytest.raises(ShardRestarted):
            client.save(str(model / "after-restart"), "checkpoint")
        assert not (model / "after-restart" / "shard-1-of-2").exists()
        assert client.sizes("user") == [other.numel(), 0]
        assert client.stats()["num_shards"] == 2  # safe ops answer, and re-arm nothing
        assert client.incarnations() == before
        torch.testing.assert_close(client.pull("user", other), trained[mine.numel() :])
        with pytest.raises(ShardRestarted):
            client.pull("user", mine)
        with pytest.raises(ShardRestarted):
            client.shrink()  # shard 0 shrinks its part (as any broadcast op), shard 1 refuses
        assert client.sizes("user")[1] == 0

        client.load(str(model / "ckpt"))
        assert client.incarnations()[0] == before[0]
        assert client.incarnations()[1] != before[1]
        torch.testing.assert_close(client.pull("user", both), trained, rtol=0, atol=0)
        client.push("user", mine, torch.ones(mine.numel(), DIM))  # trains on
        assert client.sizes("user") == [other.numel(), mine.numel()]
        client.close()


def test_accept_restarts_goes_on_with_the_empty_shard(tables_file, tmp_path):
    """Over TCP, on a fixed port as in Kubernetes: after ``accept_restarts`` the restarted
    shard serves again, with fresh rows (a job without a checkpoint to go back to)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with LocalShards(tables_file, 1, endpoint=endpoint, model_roots=[tmp_path]) as shards:
        client = EmbeddingStoreClient(shards.endpoints, timeout_s=20)
        keys = keys_of(0, 1)
        client.push("user", keys, torch.ones(keys.numel(), DIM))
        assert client.accept_restarts() == []  # nothing restarted: a no-op

        restart(shards, 0)
        with pytest.raises(ShardRestarted):
            client.push("user", keys, torch.ones(keys.numel(), DIM))
        assert client.size("user") == 0
        assert client.accept_restarts() == [endpoint]
        assert client.pull("user", keys).shape == (keys.numel(), DIM)
        assert client.size("user") == keys.numel()
        client.close()


# -- unit level: the shard's check and the client's, without processes --------------------


def test_the_shard_refuses_a_data_op_that_expects_another_incarnation():
    store = EmbeddingStore([TableOptions.parse(TABLES[0])])
    service = StoreService(store, 0, 1, incarnation=7)
    ops = service.handlers()
    keys = {"keys": np.arange(5, dtype=np.int64)}
    with pytest.raises(ShardRestarted, match="0x7.*0x8"):
        ops["pull"]({"table": "user", EXPECT_FIELD: 8}, keys)
    assert store.size("user") == 0
    with pytest.raises(BadRequest, match=EXPECT_FIELD):
        ops["pull"]({"table": "user", EXPECT_FIELD: "7"}, keys)
    meta, arrays = ops["pull"]({"table": "user", EXPECT_FIELD: 7}, keys)
    assert meta == {REPLY_FIELD: 7} and arrays["values"].shape == (5, DIM)
    meta, _ = ops["pull"]({"table": "user"}, keys)  # an older client sends no expectation
    assert meta == {REPLY_FIELD: 7}
    # safe ops run whatever the client expects
    assert ops["size"]({"table": "user", EXPECT_FIELD: 8}, {})[0] == {"size": 5, REPLY_FIELD: 7}
    assert 0 < new_incarnation() < 1 << 64
    store.close()


def test_a_reply_without_the_incarnation_is_accepted():
    """A shard older than the incarnation check sends none: the client checks nothing."""
    reply = wire.encode({"id": 3, "ok": True}, {"size": 4}, None)
    meta = wire.decode(reply).meta
    known = Incarnations(["tcp://a:1"])
    known.check(0, "pull", meta)
    assert meta == {"size": 4} and known.known() == [None]
    assert known.expect(0, "pull", {"table": "t"}) == {"table": "t"}

    meta = wire.decode(wire.encode({"id": 4, "ok": True}, {REPLY_FIELD: 1 << 63}, None)).meta
    known.check(0, "pull", meta)  # the first one seen is held
    assert meta == {} and known.known() == [1 << 63]
    assert known.expect(0, "push", {})[EXPECT_FIELD] == 1 << 63
    assert EXPECT_FIELD not in known.expect(0, "stats", {})
    known.check(0, "pull", {})  # an older shard at that address later: still accepted
    known.check(0, "stats", {REPLY_FIELD: 5})  # a safe op lets another one pass...
    assert known.known() == [1 << 63]
    with pytest.raises(ShardRestarted, match="tcp://a:1"):  # ...a data op does not
        known.check(0, "pull", {REPLY_FIELD: 5})
    known.check(0, "load", {REPLY_FIELD: 5}, adopt=True)
    assert known.known() == [5]
    assert known.adopt([6]) == ["tcp://a:1"] and known.adopt([None]) == []
