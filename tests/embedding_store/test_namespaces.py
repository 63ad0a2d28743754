"""Each job's tables in their own namespace of the shards: jobs share no state.

Shard processes over real ZeroMQ (``LocalShards``, started without ``--tables``), clients
with a namespace each: other dims under one table name at once, no row seen across, drop
frees rows, save/load of one namespace leaves the other alone, a restarted (empty) shard
answers ``unknown_namespace`` at once, hostile metas get ``bad_request`` and the shard serves
on.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from servers import scrape_metrics
from streamrec import wire
from streamrec.embedding_store import EmbeddingStore, EmbeddingStoreClient, LocalShards
from streamrec.embedding_store.errors import (
    InvalidInput,
    ShardRestarted,
    UnknownNamespace,
)
from streamrec.embedding_store.service.namespaces import MAX_TABLES, check_namespace
from streamrec.errors import BadRequest, RemoteError
from streamrec.keyhash import shard_of
from streamrec.store_schema import TableOptions


def table(name: str, dim: int, lr: float = 0.1) -> TableOptions:
    return TableOptions.parse(
        {
            "name": name,
            "dim": dim,
            "embedx_threshold": 0,
            "initializer": {"type": "uniform", "low": -0.1, "high": 0.1},
            "embed_sgd_param": {"name": "naive", "learning_rate": lr},
            "embedx_sgd_param": {"name": "naive", "learning_rate": lr},
        }
    )


JOB_A = [table("user", 5), table("item", 3)]
JOB_B = [table("user", 9)]  # the same table name, another dim
KEYS = torch.arange(10_000, 10_200, dtype=torch.int64)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two shards started with no tables: they serve only the namespaces clients create."""
    root = tmp_path_factory.mktemp("namespaces")
    with LocalShards(None, 2, metrics=True, model_roots=[root]) as running:
        running.root = root
        yield running


def client_of(shards, tables, namespace, **kw) -> EmbeddingStoreClient:
    return EmbeddingStoreClient(shards.endpoints, tables, timeout_s=20, namespace=namespace, **kw)


def test_two_namespaces_with_other_dims_on_the_same_shards(shards):
    """Two jobs at once: "user" has dim 5 in one and 9 in the other; neither sees the
    other's rows, sizes and stats are per namespace, metrics carry the namespace."""
    a = client_of(shards, JOB_A, "job-a")
    b = client_of(shards, JOB_B, "job-b")
    try:
        assert a.tables["user"].dim == 5 and b.tables["user"].dim == 9
        a.push("user", KEYS, torch.ones(KEYS.numel(), 5))
        a.pull("item", KEYS[:10])
        assert a.size("user") == KEYS.numel() and a.size("item") == 10
        assert b.size("user") == 0  # a's rows are not b's
        assert torch.count_nonzero(b.pull("user", KEYS, create=False)) == 0
        assert b.pull("user", KEYS).shape == (KEYS.numel(), 9)
        b.push("user", KEYS, torch.full((KEYS.numel(), 9), 2.0))
        fresh = EmbeddingStore(JOB_A)
        want = fresh.pull("user", KEYS) - 0.1  # one naive step of gradient 1, from a's rows
        torch.testing.assert_close(a.pull("user", KEYS, create=False), want)
        fresh.close()

        # the default namespace holds no table (no --tables): a client of it sees none
        plain = EmbeddingStoreClient(shards.endpoints, timeout_s=20)
        assert plain.tables == {}
        with pytest.raises(BadRequest, match="default namespace"):
            plain.drop_namespace()
        plain.close()

        held = a.stats()["total"]["namespaces"]  # summed over the shards
        assert held["job-a"]["tables"] == {"user": KEYS.numel(), "item": 10}
        assert held["job-b"] == {"tables": {"user": KEYS.numel()}, "rows": KEYS.numel()}
        assert set(a.stats()["total"]["tables"]) == {"user", "item"}  # its own tables
        assert set(b.stats()["total"]["tables"]) == {"user"}

        owned = [int((shard_of(KEYS.numpy(), 2) == k).sum()) for k in range(2)]
        for k, port in enumerate(shards.metrics_ports):
            scraped = scrape_metrics(port)
            for ns in ("job-a", "job-b"):
                rows = f'streamrec_embedding_store_rows{{namespace="{ns}",shard="{k}-of-2",'
                assert scraped[f'{rows}table="user",tier="host"}}'] == owned[k]
            keys = 'streamrec_embedding_store_push_keys_total{namespace="job-b",table="user"}'
            assert scraped[keys] == owned[k]
    finally:
        a.drop_namespace()
        b.drop_namespace()
        a.close()
        b.close()
    for port in shards.metrics_ports:  # a dropped namespace's series go with it
        assert not any('namespace="job-' in name for name in scrape_metrics(port))


def test_create_is_idempotent_and_other_options_are_refused(shards):
    a = client_of(shards, JOB_A, "job-c")
    try:
        a.push("user", KEYS, torch.ones(KEYS.numel(), 5))
        trained = a.pull("user", KEYS, create=False)
        again = client_of(shards, JOB_A, "job-c")  # another rank of the job: rows kept
        torch.testing.assert_close(again.pull("user", KEYS, create=False), trained)
        attached = client_of(shards, None, "job-c")  # no tables: what the namespace holds
        assert {n: t.dim for n, t in attached.tables.items()} == {"user": 5, "item": 3}
        again.close()
        attached.close()

        with pytest.raises(RemoteError) as info:
            client_of(shards, [table("user", 7)], "job-c")
        assert info.value.code == "table_conflict"
        message = str(info.value)
        assert "'user'" in message and "dim 5" in message and "dim 7" in message
        with pytest.raises(RemoteError, match="learning_rate|embed_sgd_param"):
            client_of(shards, [table("user", 5, lr=0.5)], "job-c")  # same dim, other rule
        assert a.size("user") == KEYS.numel()  # nothing changed by the refusals

        grown = client_of(shards, [*JOB_A, table("extra", 2)], "job-c")  # a table added
        assert grown.size("extra") == 0 and grown.size("user") == KEYS.numel()
        grown.close()
    finally:
        a.drop_namespace()
        a.close()


def test_drop_frees_rows_and_a_new_namespace_starts_fresh(shards):
    a = client_of(shards, JOB_A, "job-d")
    a.push("user", KEYS, torch.ones(KEYS.numel(), 5))
    a.pull("item", KEYS[:7])
    assert a.drop_namespace() == {"user": KEYS.numel(), "item": 7}
    assert a.drop_namespace() == {}  # idempotent
    with pytest.raises(UnknownNamespace, match="job-d"):
        a.pull("user", KEYS)
    with pytest.raises(UnknownNamespace):
        a.size("user")
    a.close()
    plain = EmbeddingStoreClient(shards.endpoints, timeout_s=20)
    assert "job-d" not in plain.stats()["total"]["namespaces"]
    plain.close()

    again = client_of(shards, JOB_A, "job-d")  # made again: empty, fresh rows
    next_job = client_of(shards, JOB_A, "job-e")  # the next job: none of job-d's rows
    try:
        assert again.size("user") == 0 and again.size("item") == 0
        reference = EmbeddingStore(JOB_A)  # the shards' seed: the initial values
        for c in (again, next_job):
            torch.testing.assert_close(
                c.pull("user", KEYS), reference.pull("user", KEYS), rtol=0, atol=0
            )
        reference.close()
    finally:
        for c in (again, next_job):
            c.drop_namespace()
            c.close()


def test_save_and_load_of_one_namespace_leave_the_other_untouched(shards):
    a = client_of(shards, JOB_A, "job-f")
    b = client_of(shards, JOB_B, "job-g")
    path = str(shards.root / "job-f" / "ckpt")
    try:
        a.push("user", KEYS, torch.ones(KEYS.numel(), 5))
        b.push("user", KEYS, torch.ones(KEYS.numel(), 9))
        saved = a.pull("user", KEYS, create=False)
        out = a.save(path, "checkpoint")
        for k, shard in enumerate(out["shards"]):
            assert shard["dir"] == f"{path}/shard-{k}-of-2"
            assert set(shard["manifest"]["tables"]) == {"user", "item"}  # its tables only
            assert shard["manifest"]["extra"]["namespace"] == "job-f"

        a.push("user", KEYS, torch.ones(KEYS.numel(), 5))
        b.push("user", KEYS, torch.ones(KEYS.numel(), 9))
        b_now = b.pull("user", KEYS, create=False)
        a.advance_day()
        a.load(path)
        torch.testing.assert_close(a.pull("user", KEYS, create=False), saved, rtol=0, atol=0)
        torch.testing.assert_close(b.pull("user", KEYS, create=False), b_now, rtol=0, atol=0)
        with pytest.raises(RemoteError, match="not in this store"):
            b.load(path)  # job-f's tables (user dim 5, item) do not fit job-g
        torch.testing.assert_close(b.pull("user", KEYS, create=False), b_now, rtol=0, atol=0)
        # b's shrink deletes b's low-score rows (score 0.2 < 0.8) and none of a's
        assert b.shrink() == {"user": KEYS.numel()}
        assert b.size("user") == 0 and a.size("user") == KEYS.numel()
        torch.testing.assert_close(a.pull("user", KEYS, create=False), saved, rtol=0, atol=0)
    finally:
        for c in (a, b):
            c.drop_namespace()
            c.close()


def test_a_restarted_shard_answers_unknown_namespace_at_once(tmp_path):
    """A shard restarted empty holds no namespace: the job's next op fails at once with
    UnknownNamespace (a ShardRestarted), not after its timeout; ``load`` makes the
    namespace's tables again and brings the rows back."""
    endpoint = f"ipc://{tmp_path}/shard-{{shard}}.ipc"
    with LocalShards(None, 2, endpoint=endpoint, model_roots=[tmp_path]) as local:
        client = EmbeddingStoreClient(local.endpoints, JOB_A, timeout_s=60, namespace="job-h")
        client.push("user", KEYS, torch.ones(KEYS.numel(), 5))
        trained = client.pull("user", KEYS, create=False)
        client.save(str(tmp_path / "ckpt"), "checkpoint")

        local.kill(1)
        local.start_shard(1)
        started = time.monotonic()
        with pytest.raises(UnknownNamespace) as info:
            client.pull("user", KEYS)
        assert time.monotonic() - started < 10  # the client's timeout is 60 s
        assert isinstance(info.value, ShardRestarted)
        assert "job-h" in str(info.value) and local.endpoints[1] in str(info.value)
        with pytest.raises(UnknownNamespace):
            client.sizes("user")  # a safe op too

        client.load(str(tmp_path / "ckpt"))
        torch.testing.assert_close(client.pull("user", KEYS, create=False), trained)
        client.push("user", KEYS, torch.ones(KEYS.numel(), 5))  # trains on
        client.close()


def _call(endpoint: str, op: str, meta: dict, arrays: dict | None = None) -> tuple:
    with wire.RpcClient(endpoint, timeout_s=10) as c:
        return c.call(op, meta, arrays)


def test_hostile_metas_are_refused_and_the_shard_serves_on(shards):
    good = client_of(shards, JOB_A, "job-i")
    good.push("user", KEYS, torch.ones(KEYS.numel(), 5))
    kept = good.pull("user", KEYS, create=False)
    ep = shards.endpoints[0]
    mine = KEYS.numpy()[shard_of(KEYS.numpy(), 2) == 0]
    user = JOB_A[0].model_dump(mode="json")
    huge = {**user, "name": "huge", "init_capacity": 2**40}
    cases = [
        ("create_tables", {"namespace": "../x", "tables": [user]}, "bad_request", "'../x'"),
        ("create_tables", {"namespace": "a" * 65, "tables": [user]}, "bad_request", "aaaa"),
        ("create_tables", {"namespace": 3, "tables": [user]}, "bad_request", "namespace"),
        ("create_tables", {"namespace": "x", "tables": "user"}, "bad_request", "'user'"),
        ("create_tables", {"namespace": "x", "tables": []}, "bad_request", "tables"),
        (
            "create_tables",
            {"namespace": "x", "tables": [user] * (MAX_TABLES + 1)},
            "bad_request",
            f"list of {MAX_TABLES + 1}",
        ),
        ("create_tables", {"namespace": "x", "tables": [huge]}, "bad_request", "init_capacity"),
        ("create_tables", {"namespace": "x", "tables": [{**user, "dim": 0}]}, "bad_request", "dim"),
        ("create_tables", {"namespace": "x", "tables": [3]}, "bad_request", "[0]"),
        ("create_tables", {"namespace": "x", "tables": [user, user]}, "bad_request", "repeat"),
        ("drop_tables", {"namespace": ""}, "bad_request", "default namespace"),
        ("drop_tables", {"namespace": ["job-i"]}, "bad_request", "namespace"),
        ("pull", {"namespace": "nope", "table": "user"}, "unknown_namespace", "'nope'"),
        ("pull", {"namespace": {"a": 1}, "table": "user"}, "bad_request", "namespace"),
        ("stats", {"namespace": "x" * 10_000}, "bad_request", "chars"),
        ("save", {"namespace": "nope", "path": "/tmp/x"}, "unknown_namespace", "nope"),
    ]
    for op, meta, code, text in cases:
        with pytest.raises(RemoteError) as info:
            _call(ep, op, meta, {"keys": mine})
        assert info.value.code == code, (op, meta, info.value)
        assert text in str(info.value), (op, str(info.value)[:300])
        assert len(str(info.value)) < 2000  # the echo of bad input is bounded
    # huge counts inside a namespace: refused, nothing written
    with pytest.raises(RemoteError) as info:
        _call(
            ep,
            "pull_many",
            {"namespace": "job-i", "tables": ["user"]},
            {"keys": mine, "counts": np.array([2**62], np.int64)},
        )
    assert info.value.code == "invalid_input" and "exceeds" in str(info.value)
    for k in range(2):
        assert shards.alive(k) and shards.ping(k)["shard_id"] == k
    torch.testing.assert_close(good.pull("user", KEYS, create=False), kept)
    assert "x" not in good.stats()["total"]["namespaces"]  # no refused create made one
    good.drop_namespace()
    good.close()


def test_a_shard_holds_a_bounded_number_of_namespaces(tmp_path):
    with LocalShards(None, 1, extra_args=["--max-namespaces", "2"], model_roots=[tmp_path]) as one:
        first = client_of(one, JOB_A, "n1")
        second = client_of(one, JOB_B, "n2")
        with pytest.raises(RemoteError, match="at most 2") as info:
            client_of(one, JOB_B, "n3")
        assert info.value.code == "bad_request"
        first.drop_namespace()
        third = client_of(one, JOB_B, "n3")  # room again
        assert third.size("user") == 0
        for c in (first, second, third):
            c.close()


def test_the_client_checks_its_namespace_before_sending():
    for bad in ("", None):
        assert check_namespace(bad) == ""
    for bad in ("a/b", "a" * 65, "é", 7):
        with pytest.raises(BadRequest, match="namespace"):
            EmbeddingStoreClient(["tcp://127.0.0.1:1"], namespace=bad)  # type: ignore[arg-type]


def test_in_process_store_starts_empty_and_adds_tables():
    """The in-process store has no namespaces (one store is one job's); it may start with
    no tables and add some, as a shard's namespace does."""
    store = EmbeddingStore([])
    assert store.tables == {} and store.stats()["rows"] == 0
    store.add_tables([JOB_A[0]])
    assert store.pull("user", KEYS[:3]).shape == (3, 5)
    with pytest.raises(InvalidInput, match="duplicate"):
        store.add_tables([table("user", 9)])
    store.close()
