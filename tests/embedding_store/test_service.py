"""The embedding-store service: shard processes over real ZeroMQ, clients in other processes.

Each test starts its shards with ``LocalShards`` (``streamrec-embedding-store serve`` as
separate processes on 127.0.0.1 free ports) and stops them after.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap

import msgpack
import numpy as np
import pytest
import torch
import zmq
from servers import scrape_metrics
from streamrec import wire
from streamrec.auth import load_token
from streamrec.embedding_store import (
    EmbeddingStore,
    EmbeddingStoreClient,
    LocalShards,
    TableOptions,
)
from streamrec.embedding_store.dedup import DEDUP_MODES, DEDUP_RECHECK
from streamrec.embedding_store.errors import (
    InvalidInput,
    NonFiniteGradient,
    UnknownTable,
)
from streamrec.errors import BadRequest, RemoteError
from streamrec.handshake import set_credentials
from streamrec.keyhash import shard_of
from streamrec.process import spawn, stop_process

TABLES = [
    {
        "name": "user",
        "embedx_dim": 8,
        "embedx_threshold": 0,
        "initializer": {"type": "uniform", "low": -0.1, "high": 0.1},
        "embed_sgd_param": {"name": "naive", "learning_rate": 0.1},
        "embedx_sgd_param": {"name": "naive", "learning_rate": 0.1},
    },
    {
        "name": "item",
        "embedx_dim": 3,
        "embedx_threshold": 0,
        "embed_sgd_param": {"name": "adagrad", "learning_rate": 0.05, "initial_range": 0.01},
        "embedx_sgd_param": {"name": "adagrad", "learning_rate": 0.05, "initial_range": 0.01},
    },
]


def write_tables(path) -> str:
    path.write_text(json.dumps({"tables": TABLES}))
    return str(path)


@pytest.fixture(scope="module")
def tables_file(tmp_path_factory):
    return write_tables(tmp_path_factory.mktemp("tables") / "tables.json")


@pytest.fixture(scope="module")
def two_shards(tables_file):
    with LocalShards(tables_file, 2, metrics=True) as shards:
        yield shards


@pytest.fixture
def client(two_shards):
    c = EmbeddingStoreClient(two_shards.endpoints, timeout_s=20)
    yield c
    c.close()


def reference_store() -> EmbeddingStore:
    """The in-process store with the same tables and seed: the service must match it."""
    return EmbeddingStore([TableOptions.parse(t) for t in TABLES])


CLIENT_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from streamrec.embedding_store import EmbeddingStoreClient

    endpoints, seed, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    store = EmbeddingStoreClient(endpoints, timeout_s=30)
    rng = np.random.default_rng(seed)
    seen = []
    for step in range(15):
        # duplicates on purpose; the two client processes use disjoint key ranges
        keys = seed * 10**12 + rng.integers(0, 1500, 2500)
        before = store.pull("user", keys).numpy()
        grads = rng.standard_normal((keys.size, 9)).astype(np.float32)
        store.push("user", torch.from_numpy(keys), torch.from_numpy(grads))
        after = store.pull("user", keys, create=False).numpy()
        uniq, inv = np.unique(keys, return_inverse=True)
        summed = np.zeros((uniq.size, 9), np.float32)
        np.add.at(summed, inv, grads)
        np.testing.assert_allclose(after, before - 0.1 * summed[inv], rtol=1e-5, atol=1e-6)
        seen.append(keys)
    keys = np.unique(np.concatenate(seen))
    np.savez(out, keys=keys, values=store.pull("user", keys, create=False).numpy())
    store.close()
""")


def test_two_client_processes_on_two_shards(two_shards, client, tmp_path):
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    before = client.sizes("user")
    logs = {seed: tmp_path / f"client{seed}.log" for seed in (1, 2)}
    procs = {
        seed: spawn(
            [
                sys.executable,
                str(script),
                json.dumps(two_shards.endpoints),
                str(seed),
                str(tmp_path / f"out{seed}.npz"),
            ],
            log=logs[seed],
            die_with_parent=True,
        )
        for seed in (1, 2)
    }
    try:
        for seed, p in procs.items():
            assert p.wait(timeout=240) == 0, logs[seed].read_text()[-3000:]
    finally:
        for p in procs.values():
            stop_process(p)
    results = [np.load(tmp_path / f"out{seed}.npz") for seed in (1, 2)]
    keys = np.concatenate([r["keys"] for r in results])
    values = np.concatenate([r["values"] for r in results])
    assert np.unique(keys).size == keys.size  # disjoint ranges
    # every key lives on the shard its hash names, and only there
    grown = np.array(client.sizes("user")) - np.array(before)
    np.testing.assert_array_equal(grown, np.bincount(shard_of(keys, 2), minlength=2))
    # a third client reads what the two wrote, in any order
    perm = np.random.default_rng(0).permutation(keys.size)
    np.testing.assert_array_equal(
        client.pull("user", keys[perm], create=False).numpy(), values[perm]
    )


@pytest.mark.parametrize("dedup", ["auto", "always", "never"])
def test_service_matches_the_in_process_store(two_shards, dedup):
    """Every dedup mode gives the in-process store's rows bit for bit (a shard sums repeats
    in the same float64 order as the client), for batches with many and few repeats."""
    client = EmbeddingStoreClient(two_shards.endpoints, timeout_s=20, dedup=dedup)
    ref = reference_store()
    rng = np.random.default_rng(list(DEDUP_MODES).index(dedup) + 7)  # keys of its own
    for step in range(4):
        keys = rng.integers(-(2**63), 2**63 - 1, 600, dtype=np.int64)
        repeats = 100 if step % 2 == 0 else 3  # 14% of the keys, then 0.5%
        keys = np.concatenate([keys, keys[:repeats]])
        for table, dim in (("user", 9), ("item", 4)):
            got = client.pull(table, keys)
            want = ref.pull(table, keys)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            grads = torch.from_numpy(rng.standard_normal((keys.size, dim)).astype(np.float32))
            shows = torch.ones(keys.size)
            clicks = torch.from_numpy((rng.random(keys.size) < 0.3).astype(np.float32))
            client.push(table, keys, grads, shows, clicks)
            ref.push(table, keys, grads, shows, clicks)
            torch.testing.assert_close(
                client.pull(table, keys, create=False),
                ref.pull(table, keys, create=False),
                rtol=0,
                atol=0,
            )
    client.close()
    ref.close()


def test_auto_dedup_sends_nearly_distinct_keys_as_they_are(two_shards):
    """A table whose last batch repeated under DEDUP_MIN_REPEATS of its keys sends the next
    batches whole (the shards count every key); a skewed table stays deduplicated."""
    client = EmbeddingStoreClient(two_shards.endpoints, timeout_s=20)

    def keys_sent(table: str, keys: np.ndarray) -> int:
        name = f'streamrec_embedding_store_pull_keys_total{{namespace="",table="{table}"}}'
        before = sum(scrape_metrics(p).get(name, 0.0) for p in two_shards.metrics_ports)
        client.pull(table, keys)
        return int(sum(scrape_metrics(p)[name] for p in two_shards.metrics_ports) - before)

    def batch(start: int, distinct: int, repeats: int) -> np.ndarray:
        keys = np.arange(start, start + distinct, dtype=np.int64)
        return np.concatenate([keys, keys[:repeats]])

    assert keys_sent("item", batch(8_000_000, 1000, 5)) == 1000  # measured: 0.5% repeats
    assert keys_sent("item", batch(8_100_000, 1000, 5)) == 1005  # sent as they are
    assert keys_sent("user", batch(8_200_000, 1000, 500)) == 1000  # 33% repeats
    assert keys_sent("user", batch(8_300_000, 1000, 500)) == 1000  # still deduplicated
    # "item" starts repeating: its DEDUP_RECHECK-th route since the measure measures again
    sent = [keys_sent("item", batch(8_400_000 + 10_000 * i, 1000, 500)) for i in range(16)]
    assert sent == [1500] * (DEDUP_RECHECK - 2) + [1000] * (18 - DEDUP_RECHECK)
    client.close()
    with pytest.raises(BadRequest, match="dedup must be one of"):
        EmbeddingStoreClient(two_shards.endpoints, dedup="sometimes")


def test_one_shard_pull_without_dedup_returns_the_callers_rows(tmp_path, tables_file):
    """With one shard and no repeats the reply is the result (no copy): it is the caller's to
    write, and writing it changes nothing in the store."""
    ref = reference_store()
    with LocalShards(tables_file, 1) as one:
        client = EmbeddingStoreClient(one.endpoints, timeout_s=20, dedup="never")
        keys = np.arange(9_000_000, 9_000_500, dtype=np.int64)
        got = client.pull("item", keys)
        torch.testing.assert_close(got, ref.pull("item", keys), rtol=0, atol=0)
        got.fill_(5.0)
        torch.testing.assert_close(client.pull("item", keys), ref.pull("item", keys))
        # a route is reused by equal keys, even after the caller refilled the tensor it
        # pulled with: the push goes to the pulled keys, not to the refilled ones
        fresh = np.arange(9_100_000, 9_100_500, dtype=np.int64)
        mine = torch.from_numpy(fresh.copy())
        client.pull("item", mine)
        ref.pull("item", fresh)
        mine.add_(1_000_000)
        grads = torch.ones(fresh.size, 4)
        client.push("item", torch.from_numpy(fresh), grads)
        ref.push("item", fresh, grads)
        torch.testing.assert_close(client.pull("item", fresh), ref.pull("item", fresh))
        assert client.size("item") == keys.size + fresh.size
        client.close()
    ref.close()


def _raw_call(endpoint, op, meta=None, arrays=None):
    with wire.RpcClient(endpoint, timeout_s=10) as c:
        return c.call(op, meta, arrays)


def test_bad_requests_get_clear_errors_and_the_shard_keeps_serving(two_shards, client):
    ep0 = two_shards.endpoints[0]
    keys = np.arange(1000, dtype=np.int64)
    mine = keys[shard_of(keys, 2) == 0][:50]
    theirs = keys[shard_of(keys, 2) == 1][:5]
    client.push("user", mine, torch.full((mine.size, 9), 0.5))
    kept = client.pull("user", mine, create=False)
    size0 = client.sizes("user")

    def still_serving():
        assert two_shards.alive(0) and two_shards.alive(1)
        assert two_shards.ping(0)["shard_id"] == 0
        torch.testing.assert_close(client.pull("user", mine, create=False), kept)
        assert client.sizes("user") == size0

    g9 = np.zeros((mine.size, 9), np.float32)
    cases = [
        ("pull", {"table": "nope"}, {"keys": mine}, "unknown_table", "'nope'"),
        ("pull", {"table": 3}, {"keys": mine}, "bad_request", "table"),
        ("pull", {"table": "user"}, {"keys": mine.astype(np.int32)}, "invalid_input", "int32"),
        ("pull", {"table": "user"}, {"keys": mine.reshape(5, 10)}, "invalid_input", "shape"),
        ("pull", {"table": "user", "create": "yes"}, {"keys": mine}, "bad_request", "create"),
        ("pull", {"table": "user"}, {}, "invalid_input", "'keys' is missing"),
        (
            "push",
            {"table": "user"},
            {"keys": mine, "grads": g9[:, :4]},
            "invalid_input",
            f"({mine.size}, 9)",
        ),
        (
            "push",
            {"table": "user"},
            {"keys": mine, "grads": g9.astype(np.float64)},
            "invalid_input",
            "float64",
        ),
        (
            "push",
            {"table": "user"},
            {"keys": mine, "grads": np.full_like(g9, np.nan)},
            "non_finite_gradient",
            "NaN",
        ),
        (
            "push",
            {"table": "user"},
            {"keys": mine, "grads": g9, "shows": np.full(mine.size, np.inf, np.float32)},
            "non_finite_gradient",
            "shows",
        ),
        (
            "push",
            {"table": "user"},
            {
                "keys": np.concatenate([mine, theirs]),
                "grads": np.zeros((mine.size + 5, 9), np.float32),
            },
            "wrong_shard",
            "5 of 55 keys",
        ),
        ("pull", {"table": "user"}, {"keys": theirs}, "wrong_shard", "shard 1"),
        ("save", {"path": "", "mode": "checkpoint"}, {}, "bad_request", "path"),
        ("save", {"path": "/tmp/x", "mode": "full"}, {}, "bad_request", "'full'"),
        ("frobnicate", {}, {}, "unknown_op", "frobnicate"),
    ]
    for op, meta, arrays, code, text in cases:
        with pytest.raises(RemoteError) as info:
            _raw_call(ep0, op, meta, arrays)
        assert info.value.code == code, (op, meta, str(info.value))
        assert text in str(info.value), (op, meta, str(info.value))
        still_serving()
    # a NaN in one row: that row (and the rest of the push) is never written
    bad = g9.copy()
    bad[3, 2] = np.nan
    with pytest.raises(RemoteError, match="NaN"):
        _raw_call(ep0, "push", {"table": "user"}, {"keys": mine, "grads": bad})
    still_serving()

    # malformed frames from a raw socket (past the handshake)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    set_credentials(sock, load_token())
    sock.connect(ep0)
    try:
        for frames in (
            [b"\xc1\xc1garbage"],
            [
                msgpack.packb(
                    {
                        "v": 1,
                        "op": "pull",
                        "id": 1,
                        "meta": {"table": "user"},
                        "arrays": [["keys", "<i8", [4]]],
                    }
                ),
                b"\0" * 7,
            ],
            [msgpack.packb({"v": 99, "op": "ping", "id": 2})],
            [msgpack.packb([1, 2, 3])],
        ):
            sock.send_multipart(frames)
            assert sock.poll(10_000), "no reply to a malformed message"
            reply = wire.decode(sock.recv_multipart())
            assert reply.header["ok"] is False and reply.header["error"]["message"]
            still_serving()
    finally:
        sock.close(linger=0)

    # the client refuses bad input before anything is sent
    for call, exc, text in [
        (lambda: client.pull("nope", mine), UnknownTable, "nope"),
        # (int32 keys are widened, as by the in-process store: see test_validation.py)
        (lambda: client.pull("user", mine.astype(np.float64)), InvalidInput, "float64"),
        (lambda: client.push("user", mine, torch.zeros(mine.size, 8)), InvalidInput, "9"),
        (
            lambda: client.push("user", mine, torch.zeros(mine.size, 9, dtype=torch.float64)),
            InvalidInput,
            "float64",
        ),
        (
            lambda: client.push(
                "user",
                np.concatenate([mine, theirs]),
                torch.from_numpy(np.vstack([g9, np.full((5, 9), np.inf, np.float32)])),
            ),
            NonFiniteGradient,
            "NaN or Inf",
        ),
        (lambda: client.save("/tmp/x", "full"), BadRequest, "full"),
    ]:
        with pytest.raises(exc, match=text):
            call()
        still_serving()
    # the keys of the refused mixed push were not created on shard 1 either
    assert client.pull("user", theirs, create=False).abs().sum() == 0

    # endpoints given out of shard order are refused at start-up
    with pytest.raises(BadRequest, match="shard order"):
        EmbeddingStoreClient(two_shards.endpoints[::-1], timeout_s=10)


def test_checkpoint_round_trip_through_the_service(tables_file, tmp_path):
    ref = reference_store()
    rng = np.random.default_rng(3)
    keys = {t: rng.integers(0, 2**40, 3000, dtype=np.int64) for t in ("user", "item")}
    dims = {"user": 9, "item": 4}

    def train(store, seed):
        r = np.random.default_rng(seed)
        for t, k in keys.items():
            store.pull(t, k)
            store.push(
                t,
                k,
                torch.from_numpy(r.standard_normal((k.size, dims[t])).astype(np.float32)),
                torch.ones(k.size),
                torch.from_numpy((r.random(k.size) < 0.5).astype(np.float32)),
            )

    ckpt = tmp_path / "model" / "20190720" / "1"
    with LocalShards(tables_file, 2) as shards:
        c = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
        train(c, 1)
        train(ref, 1)
        saved = {t: c.pull(t, k, create=False) for t, k in keys.items()}
        sizes = {t: c.sizes(t) for t in keys}
        result = c.save(str(ckpt), "checkpoint")
        assert [s["dir"] for s in result["shards"]] == c.shard_dirs(str(ckpt))
        c.close()
        for k in range(2):
            shards.kill(k)  # a crash, not a clean stop
    assert sorted(p.name for p in ckpt.iterdir()) == ["shard-0-of-2", "shard-1-of-2"]

    with LocalShards(tables_file, 2) as shards:
        c = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
        assert c.size("user") == 0
        c.load(str(ckpt))
        for t, k in keys.items():
            assert c.sizes(t) == sizes[t]
            torch.testing.assert_close(c.pull(t, k, create=False), saved[t], rtol=0, atol=0)
        # optimizer state came back too: one more step matches the store that never stopped
        train(c, 2)
        train(ref, 2)
        for t, k in keys.items():
            torch.testing.assert_close(c.pull(t, k, create=False), ref.pull(t, k, create=False))
        # a second checkpoint with a corrupt file on shard 1: refused, and no shard loads it
        bad = tmp_path / "model" / "20190720" / "2"
        c.save(str(bad), "checkpoint")
        victim = sorted((bad / "shard-1-of-2").glob("user*"))[0]
        victim.write_bytes(victim.read_bytes()[:-4] + b"\0\0\0\0")
        c.push("user", keys["user"], torch.ones(keys["user"].size, 9))
        ref.push("user", keys["user"], torch.ones(keys["user"].size, 9))
        with pytest.raises(RemoteError) as info:
            c.load(str(bad))
        assert info.value.code == "bad_checkpoint" and "shard 1" in str(info.value)
        assert victim.name in str(info.value)
        gone = sorted((bad / "shard-0-of-2").glob("item*"))[0]
        gone.unlink()
        with pytest.raises(RemoteError) as info:
            c.load(str(bad))
        assert info.value.code == "bad_checkpoint" and "missing file" in str(info.value)
        assert "shard 0" in str(info.value) and gone.name in str(info.value)
        torch.testing.assert_close(
            c.pull("user", keys["user"], create=False),
            ref.pull("user", keys["user"], create=False),
        )
        # shard directories swapped by hand: each manifest names the shard that wrote it
        swapped = tmp_path / "swapped"
        for k in range(2):
            shutil.copytree(ckpt / f"shard-{k}-of-2", swapped / f"shard-{1 - k}-of-2")
        with pytest.raises(RemoteError) as info:
            c.load(str(swapped))
        assert info.value.code == "shard_mismatch" and "saved by shard 1 of 2" in str(info.value)
        # a missing checkpoint is a clear error and the loaded state stays
        with pytest.raises(RemoteError) as info:
            c.load(str(tmp_path / "nowhere"))
        assert info.value.code == "not_found" and "shard-0-of-2" in str(info.value)
        torch.testing.assert_close(
            c.pull("item", keys["item"], create=False), ref.pull("item", keys["item"], create=False)
        )
        # day advance and shrink on every shard delete what the in-process store deletes
        idle = np.arange(10**15, 10**15 + 500, dtype=np.int64)  # pulled, never pushed
        for store in (c, ref):
            store.pull("user", idle)
            store.advance_day()
        deleted = c.shrink()
        assert deleted == ref.shrink() and deleted["user"] >= idle.size
        for t, k in keys.items():
            assert c.size(t) == ref.size(t)
            torch.testing.assert_close(c.pull(t, k, create=False), ref.pull(t, k, create=False))
        c.close()
    ref.close()

    with LocalShards(tables_file, 1) as one:  # another shard count: resharded, 2 -> 1
        c = EmbeddingStoreClient(one.endpoints, timeout_s=30)
        assert c.load(str(ckpt))["resharded"] == "2 -> 1"
        for t, k in keys.items():
            assert c.size(t) == sum(sizes[t])
            torch.testing.assert_close(c.pull(t, k, create=False), saved[t], rtol=0, atol=0)
        c.close()


def test_metrics_count_what_the_shard_did(two_shards, client, tmp_path):
    keys = np.arange(5_000_000, 5_000_300, dtype=np.int64)
    part = shard_of(keys, 2)
    before = [scrape_metrics(p) for p in two_shards.metrics_ports]
    client.pull("item", keys)
    client.push("item", keys, torch.zeros(keys.size, 4), torch.ones(keys.size), None)
    client.save(str(tmp_path / "ckpt"), "checkpoint")
    client.load(str(tmp_path / "ckpt"))
    with pytest.raises(UnknownTable):
        client.pull("nope", keys)  # refused by the client: no request, no shard error counted
    with pytest.raises(RemoteError):
        _raw_call(two_shards.endpoints[0], "pull", {"table": "nope"}, {"keys": keys[:0]})
    for k, port in enumerate(two_shards.metrics_ports):
        after = scrape_metrics(port)
        n = int((part == k).sum())
        label = 'namespace="",table="item"'  # the default namespace's table
        for metric in ("pull_keys_total", "push_keys_total", "optimizer_steps_total"):
            name = f"streamrec_embedding_store_{metric}{{{label}}}"
            want = 1 if metric == "optimizer_steps_total" else n
            assert after[name] - before[k].get(name, 0.0) == want, name
        for name in (
            'streamrec_embedding_store_save_seconds_count{mode="checkpoint"}',
            "streamrec_embedding_store_load_seconds_count",
        ):
            assert after[name] - before[k].get(name, 0.0) == 1, name
        errors = 'streamrec_embedding_store_request_errors_total{code="unknown_table",op="pull"}'
        assert after.get(errors, 0.0) - before[k].get(errors, 0.0) == (1 if k == 0 else 0)
        rows = [
            v
            for name, v in after.items()
            if name.startswith("streamrec_embedding_store_rows{") and 'table="item"' in name
        ]
        assert rows == [client.sizes("item")[k]]
        assert any(
            name.startswith("streamrec_embedding_store_request_seconds_count")
            and 'op="push"' in name
            for name in after
        )


def test_ssd_tier_shard_beyond_its_cache_budget(tables_file, tmp_path):
    """One shard on the ssd tier with a table ~4x its RAM cache: same values as the host tier
    in process, rows in files under persistent_path/shard-0-of-1, hit rate in the metrics."""
    root = tmp_path / "ssd"
    args = [
        "--tier",
        "ssd",
        "--persistent-path",
        str(root),
        "--cache-budget-mb",
        "0.25",
        "--capacity",
        "100000",
    ]
    ref = reference_store()
    # 16k rows of 9 weights + stats + state (~70 B each) ~ 1.1 MB, over 4x the 0.25 MiB cache
    keys = np.arange(1, 16_001, dtype=np.int64) * 7_919
    rng = np.random.default_rng(4)
    with LocalShards(tables_file, 1, extra_args=args, metrics=True) as shards:
        c = EmbeddingStoreClient(shards.endpoints, timeout_s=60)
        for _ in range(3):
            batch = rng.choice(keys, 4000)
            torch.testing.assert_close(c.pull("user", batch), ref.pull("user", batch))
            g = torch.from_numpy(rng.standard_normal((batch.size, 9)).astype(np.float32))
            c.push("user", batch, g)
            ref.push("user", batch, g)
        c.pull("user", keys)
        ref.pull("user", keys)
        torch.testing.assert_close(
            c.pull("user", keys, create=False), ref.pull("user", keys, create=False)
        )
        table = c.stats()["shards"][0]["tables"]["user"]
        assert table["rows"] == keys.size and table["cache_misses"] > 0
        assert 0.0 < table["cache_hit_rate"] < 1.0
        assert any((root / "shard-0-of-1").rglob("*")), "no files under the shard's directory"
        scraped = scrape_metrics(shards.metrics_ports[0])
        rate = [
            v
            for name, v in scraped.items()
            if name.startswith("streamrec_embedding_store_cache_hit_ratio{")
            and 'table="user"' in name
        ]
        assert rate and 0.0 < rate[0] < 1.0
        c.close()
    ref.close()
