"""EmbeddingStoreClient: threads sharing one client, StoreEmbeddingBags over the remote store.

The shards run as separate processes (``LocalShards``) on 127.0.0.1 free ports.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from streamrec.embedding_store import (
    EmbeddingStore,
    EmbeddingStoreClient,
    LocalShards,
    StoreEmbeddingBags,
    TableOptions,
)
from streamrec.embedding_store.service.routing import MAX_REQUEST_ROW_BYTES, request_cuts
from streamrec.embedding_store.service.stats import sum_stats
from streamrec.errors import BadRequest
from streamrec.ragged import RaggedTensor

TABLES = [
    {
        "name": "a",
        "embedx_dim": 7,
        "embedx_threshold": 0,
        "embed_sgd_param": {"name": "adagrad", "learning_rate": 0.1, "initial_range": 0.05},
        "embedx_sgd_param": {"name": "adagrad", "learning_rate": 0.1, "initial_range": 0.05},
    },
    {
        "name": "b",
        "embedx_dim": 3,
        "embedx_threshold": 0,
        "initializer": {"type": "normal", "mean": 0.0, "std": 0.1},
        "embed_sgd_param": {"name": "naive", "learning_rate": 0.2},
        "embedx_sgd_param": {"name": "naive", "learning_rate": 0.2},
    },
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    path = tmp_path_factory.mktemp("tables") / "tables.json"
    path.write_text(json.dumps(TABLES))
    with LocalShards(path, 2) as s:
        yield s


def _fresh_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(-(2**62), 2**62, n, dtype=np.int64)


def test_prefetch_thread_pulls_while_main_thread_pushes(shards):
    """One client, two threads: pulls of table a and pushes of table b are in flight at once;
    every reply reaches the thread that asked for it."""
    client = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
    ref = EmbeddingStore([TableOptions.parse(t) for t in TABLES])
    rng = np.random.default_rng(11)
    a_keys = [_fresh_keys(rng, 800) for _ in range(25)]
    b_keys = _fresh_keys(rng, 500)
    b_grads = [
        torch.from_numpy(rng.standard_normal((500, 4)).astype(np.float32)) for _ in range(25)
    ]
    pulled: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def prefetch():
        try:
            for k in a_keys:
                pulled.append(client.pull("a", k))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    th = threading.Thread(target=prefetch)
    th.start()
    for g in b_grads:
        client.push("b", b_keys, g)
    th.join(120)
    assert not th.is_alive() and not errors, errors
    for k, got in zip(a_keys, pulled, strict=True):
        torch.testing.assert_close(got, ref.pull("a", k))
    for g in b_grads:
        ref.push("b", b_keys, g)
    torch.testing.assert_close(
        client.pull("b", b_keys, create=False), ref.pull("b", b_keys, create=False)
    )
    client.close()
    ref.close()


def test_store_embedding_bags_works_the_same_remote_and_in_process(shards):
    remote = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
    local = EmbeddingStore([TableOptions.parse(t) for t in TABLES])
    rng = np.random.default_rng(5)
    vocab = {"a": _fresh_keys(rng, 300), "b": _fresh_keys(rng, 200)}
    sizes_before = {t: remote.size(t) for t in vocab}
    bags = {
        name: StoreEmbeddingBags(store, ["a", "b"], pooling="mean")
        for name, store in (("remote", remote), ("local", local))
    }
    for _step in range(5):
        batch = 64
        features = []
        for t in ("a", "b"):
            lengths = rng.integers(0, 4, batch)
            values = rng.choice(vocab[t], int(lengths.sum()))  # repeats within and across rows
            features.append(
                RaggedTensor.from_lengths(torch.from_numpy(values), torch.from_numpy(lengths))
            )
        labels = torch.from_numpy((rng.random(batch) < 0.4).astype(np.float32))
        outs = {}
        for name, emb in bags.items():
            pulled = emb.pull(features)
            pooled = emb(pulled)
            assert [tuple(p.shape) for p in pooled] == [(batch, 8), (batch, 4)]
            loss = sum((p * torch.arange(1, p.shape[1] + 1)).sum() for p in pooled)
            loss.backward()
            emb.push(pulled, labels)
            outs[name] = [p.detach() for p in pooled]
        for got, want in zip(outs["remote"], outs["local"], strict=True):
            torch.testing.assert_close(got, want)
    for t in ("a", "b"):
        torch.testing.assert_close(
            remote.pull(t, vocab[t], create=False), local.pull(t, vocab[t], create=False)
        )
        assert remote.size(t) - sizes_before[t] == local.size(t)
    remote.close()
    local.close()


def test_pull_empty_and_all_duplicates(shards):
    client = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
    assert tuple(client.pull("a", np.zeros(0, np.int64)).shape) == (0, 8)
    client.push("a", np.zeros(0, np.int64), torch.zeros(0, 8))
    same = np.full(100, 987654321, np.int64)
    rows = client.pull("b", same)
    assert rows.shape == (100, 4) and bool((rows == rows[0]).all())
    feasigns = np.array([2**64 - 1, 2**63, 12345], dtype=np.uint64)  # PaddleRec uint64 ids
    torch.testing.assert_close(
        client.pull("b", feasigns), client.pull("b", feasigns.view(np.int64))
    )
    assert set(client.tables) == {"a", "b"} and client.tables["a"].dim == 8
    stats = client.stats()
    assert stats["num_shards"] == 2 and len(stats["shards"]) == 2
    client.close()


def test_push_after_pull_reuses_the_route_only_for_equal_keys(shards):
    """The push of a step reuses its pull's route (dedup + split); a key tensor refilled in
    place between them must be routed again."""
    client = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
    ref = EmbeddingStore([TableOptions.parse(t) for t in TABLES])
    rng = np.random.default_rng(12)
    keys = torch.empty(3_000, dtype=torch.int64)
    for step in range(4):
        keys.copy_(torch.from_numpy(rng.integers(0, 2_000, keys.numel())))  # duplicates
        torch.testing.assert_close(client.pull("a", keys), ref.pull("a", keys))
        if step % 2:
            keys.copy_(torch.from_numpy(rng.integers(1_000, 4_000, keys.numel())))
        grads = torch.from_numpy(rng.standard_normal((keys.numel(), 8)).astype(np.float32))
        client.push("a", keys, grads)
        ref.push("a", keys, grads)
    every = torch.arange(4_000)
    torch.testing.assert_close(client.pull("a", every, False), ref.pull("a", every, False))
    client.close()


def test_sum_stats_adds_counts_and_drops_rates():
    shards = [
        {"tables": {"a": {"rows": 3, "cache_hit_rate": 0.5, "tier": "host"}}},
        {"tables": {"a": {"rows": 4, "cache_hit_rate": 0.9, "tier": "host"}}},
    ]
    assert sum_stats(shards) == {"tables": {"a": {"rows": 7, "tier": "host"}}}


def test_sockets_of_ended_threads_are_closed(shards):
    import gc

    client = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
    mine = client._link.open_sockets()  # this thread's, one per shard
    assert mine == 2
    for _ in range(4):
        th = threading.Thread(target=lambda: client.pull("a", np.arange(10, dtype=np.int64)))
        th.start()
        th.join()
    gc.collect()
    assert client._link.open_sockets() == mine
    client.close()
    with pytest.raises(BadRequest, match="closed"):
        client.pull("a", np.arange(3, dtype=np.int64))


def test_start_up_checks(shards):
    from streamrec.errors import RpcTimeout

    good = [TableOptions.parse(t) for t in TABLES]
    client = EmbeddingStoreClient(shards.endpoints, tables=good, timeout_s=30)
    assert client.tables["b"] == good[1]
    client.close()
    wrong = [TableOptions.parse({**TABLES[0], "embedx_dim": 3}), good[1]]
    with pytest.raises(BadRequest, match="differ from the shards'"):
        EmbeddingStoreClient(shards.endpoints, tables=wrong, timeout_s=30)
    with pytest.raises(BadRequest, match="shard order"):
        EmbeddingStoreClient(shards.endpoints[:1], timeout_s=30)  # shard 0 of 2, not of 1
    with pytest.raises(RpcTimeout, match="no reply"):
        EmbeddingStoreClient([*shards.endpoints, "tcp://127.0.0.1:1"], timeout_s=0.5)
    with pytest.raises(BadRequest, match="at least one"):
        EmbeddingStoreClient([])
    for bad in (0, -5, 2.5, "1000"):
        with pytest.raises(BadRequest, match=f"max_request_keys .* got {bad!r}"):
            EmbeddingStoreClient(shards.endpoints, max_request_keys=bad)


def test_requests_are_cut_by_keys_and_by_row_bytes():
    """A shard's part goes in requests of at most max_request_keys keys and
    MAX_REQUEST_ROW_BYTES of rows: narrow tables by keys, wide ones by bytes (pure logic)."""
    per_dim64 = MAX_REQUEST_ROW_BYTES // 256
    assert request_cuts([0, 100_000, 100_000], 64, 1 << 17) == [
        (0, a, min(a + per_dim64, 100_000)) for a in range(0, 100_000, per_dim64)
    ]
    assert request_cuts([0, 150_000, 160_000], 16, 1 << 17) == [
        (0, 0, 1 << 17),
        (0, 1 << 17, 150_000),
        (1, 150_000, 160_000),
    ]
    assert request_cuts([0, 200, 200], 64, 97) == [(0, 0, 97), (0, 97, 194), (0, 194, 200)]


def test_shards_on_ipc_sockets_serve_a_node_local_client(tmp_path):
    path = tmp_path / "tables.json"
    path.write_text(json.dumps(TABLES))
    with LocalShards(path, 2, endpoint=f"ipc://{tmp_path}/shard-{{shard}}.ipc") as s:
        assert s.endpoints == [f"ipc://{tmp_path}/shard-{k}.ipc" for k in range(2)]
        client = EmbeddingStoreClient(s.endpoints, timeout_s=30)
        ref = EmbeddingStore([TableOptions.parse(t) for t in TABLES])
        keys = torch.arange(-500, 500)
        grads = torch.full((1_000, 4), 0.5)
        client.push("b", keys, grads)
        ref.push("b", keys, grads)
        torch.testing.assert_close(client.pull("b", keys), ref.pull("b", keys))
        assert sum(client.sizes("b")) == 1_000 and min(client.sizes("b")) > 0
        client.close()
