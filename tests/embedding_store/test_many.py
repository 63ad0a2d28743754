"""pull_many/push_many: several tables in one call (in-process) and one request per shard.

The service tests start two shards as separate processes (``LocalShards``) on 127.0.0.1 free
ports and compare them with per-table pull/push on an in-process store.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from servers import scrape_metrics
from streamrec import wire
from streamrec.embedding_store import (
    _C,
    EmbeddingStore,
    EmbeddingStoreClient,
    LocalShards,
    TableOptions,
)
from streamrec.embedding_store.errors import InvalidInput, NonFiniteGradient, UnknownTable
from streamrec.errors import RemoteError
from streamrec.keyhash import shard_of
from test_service import TABLES as SERVICE_TABLES

#: three tables of different dims and rules: the service tests' two and one with Adam
TABLES = [
    *SERVICE_TABLES,
    {
        "name": "ctx",
        "embedx_dim": 4,
        "embedx_threshold": 2.0,  # expands after a few shows: the embedx rule kicks in later
        "embed_sgd_param": {"name": "adam", "learning_rate": 0.01},
        "embedx_sgd_param": {"name": "adam", "learning_rate": 0.01},
    },
]
NAMES = [t["name"] for t in TABLES]
DIMS = {"user": 9, "item": 4, "ctx": 5}


def make_store() -> EmbeddingStore:
    return EmbeddingStore([TableOptions.parse(t) for t in TABLES])  # the shards' seed (0)


def random_batch(rng: np.random.Generator, step: int, empty: str | None = None):
    """Keys (duplicates, shared across steps), grads, shows, clicks per table; ``empty``
    names a table with no keys."""
    keys, grads, shows, clicks = [], [], [], []
    for i, name in enumerate(NAMES):
        n = 0 if name == empty else int(rng.integers(50, 400))
        k = rng.integers(0, 300, n).astype(np.int64) * 7_919 + i - 2**40
        keys.append(torch.from_numpy(k))
        grads.append(torch.from_numpy(rng.standard_normal((n, DIMS[name])).astype(np.float32)))
        # shows/clicks on some tables only: the rest take the defaults
        if (i + step) % 2:
            shows.append(torch.from_numpy(rng.integers(1, 3, n).astype(np.float32)))
            clicks.append(torch.from_numpy((rng.random(n) < 0.3).astype(np.float32)))
        else:
            shows.append(None)
            clicks.append(None)
    return keys, grads, shows, clicks


def assert_same_rows(a, b, keys_by_table) -> None:
    for name, keys in zip(NAMES, keys_by_table, strict=True):
        torch.testing.assert_close(
            a.pull(name, keys, create=False), b.pull(name, keys, create=False)
        )


def push_rows_and_many(
    rng: np.random.Generator,
    with_counts: bool,
    store,
    ref: EmbeddingStore,
    tables: list[str],
    keys: torch.Tensor,
    counts: list[int],
    max_show: int,
) -> None:
    """The same random dim-4 gradients (and, ``with_counts``, shows and clicks) as
    ``store.push_rows`` of the block and ``ref.push_many`` of its parts."""
    n = keys.numel()
    grads = torch.from_numpy(rng.standard_normal((n, 4)).astype(np.float32))
    split = list(keys.split(counts))
    if not with_counts:
        store.push_rows(tables, keys, counts, grads)
        ref.push_many(tables, split, list(grads.split(counts)))
        return
    shows = torch.from_numpy(rng.integers(1, max_show, n).astype(np.float32))
    clicks = torch.from_numpy((rng.random(n) < 0.3).astype(np.float32))
    store.push_rows(tables, keys, counts, grads, shows, clicks)
    ref.push_many(
        tables, split, list(grads.split(counts)), list(shows.split(counts)),
        list(clicks.split(counts)),
    )  # fmt: skip


# -- the in-process store ---------------------------------------------------------------


def test_in_process_many_equals_per_table_calls():
    many, ref = make_store(), make_store()
    rng = np.random.default_rng(1)
    seen = []
    for step in range(4):
        keys, grads, shows, clicks = random_batch(rng, step, empty="item" if step == 2 else None)
        seen.append(keys)
        got = many.pull_many(NAMES, keys, create=True)
        want = [ref.pull(n, k, create=True) for n, k in zip(NAMES, keys, strict=True)]
        assert [tuple(g.shape) for g in got] == [
            (k.numel(), DIMS[n]) for n, k in zip(NAMES, keys, strict=True)
        ]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
        many.push_many(NAMES, keys, grads, shows, clicks)
        for args in zip(NAMES, keys, grads, shows, clicks, strict=True):
            ref.push(*args)
    for t, name in enumerate(NAMES):
        keys = torch.unique(torch.cat([s[t] for s in seen]))
        torch.testing.assert_close(
            many.pull(name, keys, create=False), ref.pull(name, keys, create=False)
        )
        a, b = many.inspect(name, keys), ref.inspect(name, keys)
        for field in ("show", "click", "expanded"):
            assert torch.equal(a[field], b[field]), (name, field)
        assert many.size(name) == ref.size(name) > 0
    assert bool(many.inspect("ctx", keys)["expanded"].any())  # the embedx rule was exercised
    # a table may appear twice: the calls apply in order, as separate pushes would
    k = torch.tensor([5, 6], dtype=torch.int64)
    g = torch.ones(2, 9)
    many.push_many(["user", "user"], [k, k], [g, g])
    ref.push("user", k, g)
    ref.push("user", k, g)
    torch.testing.assert_close(
        many.pull("user", k, create=False), ref.pull("user", k, create=False)
    )
    # pull_many(create=False) creates nothing
    fresh = torch.arange(10**12, 10**12 + 50)
    out = many.pull_many(["item", "ctx"], [fresh, fresh], create=False)
    assert all(float(o.abs().sum()) == 0 for o in out)
    assert not bool(many.inspect("item", fresh)["present"].any())
    many.close()
    ref.close()


#: three tables of one dim (one block of rows): the rules differ, one admits by score
BLOCK_TABLES = [
    TABLES[1],
    {**TABLES[2], "name": "ctx3", "embedx_dim": 3},
    {
        "name": "admitted",
        "embedx_dim": 3,
        "embedx_threshold": 1.0,
        "admission_score": 2.0,  # a push's keys come in by their show/click score
        "embed_sgd_param": {"name": "naive", "learning_rate": 0.1},
        "embedx_sgd_param": {"name": "naive", "learning_rate": 0.1},
    },
]


def test_in_process_rows_equal_the_many_calls():
    """The in-process pull_rows/push_rows (one C++ call each way for the block) give what
    pull_many/push_many give: absent keys created, repeats, a table listed twice, a table
    with no keys, shows/clicks given or defaulted, admission by score."""
    block, ref = (EmbeddingStore([TableOptions.parse(t) for t in BLOCK_TABLES]) for _ in "ab")
    tables = ["item", "ctx3", "admitted", "item"]
    rng = np.random.default_rng(11)
    seen = []
    for step in range(6):
        counts = [int(rng.integers(20, 300)), 0 if step == 3 else 90, 60, 40]
        keys = torch.from_numpy(rng.integers(0, 400, sum(counts)).astype(np.int64) * 977 - 2**41)
        split = list(keys.split(counts))
        create = step != 4
        rows = block.pull_rows(tables, keys, counts, create=create)
        assert rows.shape == (keys.numel(), 4) and rows.dtype == torch.float32
        torch.testing.assert_close(rows, torch.cat(ref.pull_many(tables, split, create=create)))
        push_rows_and_many(rng, step % 2 == 1, block, ref, tables, keys, counts, max_show=4)
        seen.append(keys)
    every = torch.unique(torch.cat(seen))
    for name in ("item", "ctx3", "admitted"):
        torch.testing.assert_close(
            block.pull(name, every, create=False), ref.pull(name, every, create=False)
        )
        a, b = block.inspect(name, every), ref.inspect(name, every)
        for field in ("present", "show", "click", "expanded"):
            assert torch.equal(a[field], b[field]), (name, field)
    assert 0 < block.size("admitted") < every.numel()  # admission left some keys out
    assert block.stats()["tables"]["item"] == ref.stats()["tables"]["item"]
    block.close()
    ref.close()


def test_in_process_bad_push_rows_names_the_table_and_writes_nothing():
    store = EmbeddingStore([TableOptions.parse(t) for t in BLOCK_TABLES])
    keys = torch.arange(10, dtype=torch.int64)
    store.push_rows(["item", "ctx3"], keys, [5, 5], torch.ones(10, 4))
    before = store.pull_rows(["item", "ctx3"], keys, [5, 5], create=False)
    bad = torch.zeros(10, 4)
    bad[7, 2] = float("inf")
    with pytest.raises(NonFiniteGradient, match="table 'ctx3'"):
        store.push_rows(["item", "ctx3"], keys, [5, 5], bad)
    with pytest.raises(InvalidInput, match="shows"):
        store.push_rows(["item", "ctx3"], keys, [5, 5], bad * 0, shows=-torch.ones(10))
    with pytest.raises(InvalidInput, match="summing to the 10 keys"):
        store.pull_rows(["item", "ctx3"], keys, [5, 4])
    with pytest.raises(UnknownTable, match="nope"):
        store.push_rows(["item", "nope"], keys, [5, 5], bad * 0)
    torch.testing.assert_close(store.pull_rows(["item", "ctx3"], keys, [5, 5], False), before)
    store.close()


def test_the_block_ops_refuse_a_block_that_does_not_add_up():
    """The C++ block ops check the layout themselves too: their error names the op."""
    store = EmbeddingStore([TableOptions.parse(t) for t in [*BLOCK_TABLES, TABLES[0]]])
    item, user = store.tier("item"), store.tier("user")
    keys = torch.arange(10, dtype=torch.int64)
    for counts, tiers, text in (
        ([5, 4], [item, item], "counts sum to 9, not the 10 keys"),
        ([5, -5, 10], [item, item, item], r"counts\[1\] = -5 < 0"),
        ([5, 5], [item, user], "table 1 has dim 9, table 0 has 4"),
    ):
        with pytest.raises(RuntimeError, match=f"find_gather_tables: {text}"):
            _C.find_gather_tables(
                [t._slots for t in tiers], keys, counts, [t._data for t in tiers],
                [t.params for t in tiers],
            )  # fmt: skip
    rows = [torch.zeros(5, dtype=torch.int64)] * 2
    with pytest.raises(RuntimeError, match="update_tables: counts sum to 10, not the 9 keys"):
        _C.update_tables(
            [item._data] * 2, [item._row_keys] * 2, rows, torch.zeros(9, 4), torch.zeros(9),
            torch.zeros(9), [item.params] * 2,
        )  # fmt: skip
    with pytest.raises(RuntimeError, match="update_tables: shows and clicks must be"):
        _C.update_tables(
            [item._data] * 2, [item._row_keys] * 2, rows, torch.zeros(10, 4), torch.zeros(9),
            torch.zeros(10), [item.params] * 2,
        )  # fmt: skip
    store.close()


def test_in_process_rows_from_threads_with_maintenance_between():
    """Blocks over the same tables, listed in two orders, from two threads while a third
    advances the day (each table's exclusive lock): the locks are taken in one order, so
    none waits forever, and every push lands (each key's show counts its pushes)."""
    store = EmbeddingStore([TableOptions.parse(t) for t in BLOCK_TABLES[:2]])
    keys = torch.arange(500, dtype=torch.int64)
    errors: list[BaseException] = []

    def worker(tables: list[str]) -> None:
        try:
            for _ in range(60):
                rows = store.pull_rows(tables, keys, [250, 250])
                store.push_rows(tables, keys, [250, 250], rows * 0)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def maintenance() -> None:
        for _ in range(20):
            store.advance_day()

    threads = [
        threading.Thread(target=worker, args=(["item", "ctx3"],)),
        threading.Thread(target=worker, args=(["ctx3", "item"],)),
        threading.Thread(target=maintenance),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a block waits forever"
    assert not errors, errors
    for name, part in (("item", keys[:250]), ("ctx3", keys[250:])):
        assert torch.all(store.inspect(name, part)["show"] == 60), name  # one thread's 60
    for name, part in (("item", keys[250:]), ("ctx3", keys[:250])):
        assert torch.all(store.inspect(name, part)["show"] == 60), name  # the other's
    store.close()


def test_in_process_bad_push_many_writes_nothing():
    store = make_store()
    rng = np.random.default_rng(2)
    keys, grads, _, _ = random_batch(rng, 0)
    store.push_many(NAMES, keys, grads)
    sizes = {n: store.size(n) for n in NAMES}
    before = [store.pull(n, k, create=False) for n, k in zip(NAMES, keys, strict=True)]
    fresh = [k + 10**9 for k in keys]  # absent keys: a written push would create them

    def nothing_written():
        assert {n: store.size(n) for n in NAMES} == sizes
        for name, k, b in zip(NAMES, keys, before, strict=True):
            torch.testing.assert_close(store.pull(name, k, create=False), b)

    nan = [g.clone() for g in grads]
    nan[2][7, 1] = float("nan")  # the last table's grads: the first two must not be written
    wrong_dim = [grads[0], grads[1][:, :3], grads[2]]
    cases = [
        ((NAMES, fresh, nan), NonFiniteGradient, "table 'ctx': grads hold NaN"),
        ((NAMES, fresh, wrong_dim), InvalidInput, "table 'item': grads must have shape"),
        ((["user", "nope", "ctx"], fresh, grads), UnknownTable, "'nope'"),
        ((NAMES, fresh[:2], grads), InvalidInput, "keys has 2 entries for 3 tables"),
        (("user", fresh, grads), InvalidInput, "tables must be a list"),
        ((NAMES, fresh, [g.double() for g in grads]), InvalidInput, "float32, got torch.float64"),
    ]
    for args, exc, text in cases:
        with pytest.raises(exc, match=text):
            store.push_many(*args)
        nothing_written()
    bad_shows = [None, torch.full((keys[1].numel(),), -1.0), None]
    with pytest.raises(InvalidInput, match="table 'item': shows and clicks must be finite"):
        store.push_many(NAMES, fresh, grads, shows=bad_shows)
    nothing_written()
    with pytest.raises(UnknownTable, match="'nope'"):
        store.pull_many(["user", "nope"], fresh[:2], create=True)  # user's rows not created
    nothing_written()
    store.close()


# -- the service: two shard processes -----------------------------------------------------


@pytest.fixture(scope="module")
def two_shards(tmp_path_factory):
    path = tmp_path_factory.mktemp("tables") / "tables.json"
    path.write_text(json.dumps({"tables": TABLES}))
    with LocalShards(path, 2, metrics=True) as shards:
        yield shards


@pytest.fixture
def client(two_shards):
    c = EmbeddingStoreClient(two_shards.endpoints, timeout_s=20, dedup="always")
    yield c
    c.close()


def _requests(scrape: dict[str, float], op: str) -> float:
    return sum(
        v
        for name, v in scrape.items()
        if name.startswith("streamrec_embedding_store_request_seconds_count")
        and f'op="{op}"' in name
    )


def test_service_many_equals_per_table_calls_in_one_request_per_shard(two_shards, client):
    ref = make_store()
    rng = np.random.default_rng(3)
    before = [scrape_metrics(p) for p in two_shards.metrics_ports]
    seen = []
    steps = 4
    for step in range(steps):
        keys, grads, shows, clicks = random_batch(rng, step, empty="item" if step == 2 else None)
        keys = [k + 10**13 for k in keys]  # keys no other test of this module uses
        seen.append(keys)
        got = client.pull_many(NAMES, keys, create=True)
        for name, k, g in zip(NAMES, keys, got, strict=True):
            torch.testing.assert_close(g, ref.pull(name, k, create=True))
        client.push_many(NAMES, keys, grads, shows, clicks)
        for args in zip(NAMES, keys, grads, shows, clicks, strict=True):
            ref.push(*args)
    scraped = [scrape_metrics(p) for p in two_shards.metrics_ports]
    all_keys = [torch.unique(torch.cat([s[t] for s in seen])) for t in range(len(NAMES))]
    assert_same_rows(client, ref, all_keys)
    # many tables, one pull_many and one push_many request per shard and step
    for k, after in enumerate(scraped):
        for op in ("pull_many", "push_many"):
            assert _requests(after, op) - _requests(before[k], op) == steps, (k, op)
        for op in ("pull", "push"):
            assert _requests(after, op) == _requests(before[k], op), (k, op)
        # the per-table metrics are counted for each table of the requests
        for t, name in enumerate(NAMES):
            # the client sends each distinct key of a step once, to its shard
            mine = sum(int((shard_of(np.unique(s[t].numpy()), 2) == k).sum()) for s in seen)
            metric = f'streamrec_embedding_store_pull_keys_total{{namespace="",table="{name}"}}'
            assert after[metric] - before[k].get(metric, 0.0) == mine, (k, name)
    ref.close()


def test_service_bad_many_requests_are_refused_and_nothing_is_written(two_shards, client):
    ep0 = two_shards.endpoints[0]
    keys = np.arange(2**41, 2**41 + 400, dtype=np.int64)
    mine = keys[shard_of(keys, 2) == 0][:40]
    theirs = keys[shard_of(keys, 2) == 1][:5]
    client.push_many(["user", "item"], [mine, mine], [torch.ones(40, 9), torch.ones(40, 4)])
    kept = client.pull_many(NAMES, [mine, mine, mine], create=False)
    sizes = {n: client.sizes(n) for n in NAMES}

    def nothing_written():
        assert two_shards.alive(0) and two_shards.alive(1)
        assert {n: client.sizes(n) for n in NAMES} == sizes
        for got, want in zip(client.pull_many(NAMES, [mine] * 3, create=False), kept, strict=True):
            torch.testing.assert_close(got, want)

    fresh = mine + 1_000_003 * 2  # other keys
    fresh = fresh[shard_of(fresh, 2) == 0]
    m = fresh.size
    counts = np.array([m, m], np.int64)
    two = np.concatenate([fresh, fresh])
    g = np.zeros(m * 9 + m * 4, np.float32)
    nan = g.copy()
    nan[m * 9 + 3] = np.nan  # in the second table's part
    ok = {"tables": ["user", "item"]}
    cases = [
        ("push_many", ok, {"keys": two, "counts": np.array([m, m + 1]), "grads": g}, "sums to"),
        ("push_many", ok, {"keys": two, "counts": np.array([m * 2 + 1, -1]), "grads": g}, "-1"),
        ("push_many", ok, {"keys": two, "counts": np.array([2**62, 2**62]), "grads": g}, "exceeds"),
        ("push_many", ok, {"keys": two, "counts": counts.astype(np.int32), "grads": g}, "int32"),
        ("push_many", ok, {"keys": two, "counts": counts[:1], "grads": g}, "'counts': shape"),
        ("push_many", ok, {"keys": two, "grads": g}, "'counts' is missing"),
        ("push_many", ok, {"keys": two, "counts": counts, "grads": g[:-1]}, f"({m * 13})"),
        ("push_many", ok, {"keys": two, "counts": counts, "grads": nan}, "NaN"),
        (
            "push_many",
            {"tables": ["user", "nope"]},
            {"keys": two, "counts": counts, "grads": g},
            "'tables'[1]: unknown table 'nope'",
        ),
        ("push_many", {"tables": "user"}, {"keys": two, "counts": counts}, "'tables' must be"),
        (
            "push_many",
            ok,
            {
                "keys": two,
                "counts": counts,
                "grads": g,
                "shows": np.full(2 * m, np.inf, np.float32),
            },
            "'shows'",
        ),
        (
            "push_many",
            ok,
            {"keys": np.concatenate([two, theirs]), "counts": counts + [0, 5], "grads": g},
            "5 of",
        ),
        ("pull_many", {**ok, "create": 1}, {"keys": two, "counts": counts}, "'create'"),
        ("pull_many", ok, {"keys": two, "counts": np.array([m, m - 1])}, "sums to"),
        ("pull_many", {"tables": ["user", 3]}, {"keys": two, "counts": counts}, "'tables'"),
        ("pull_many", {"tables": ["user", "nope"]}, {"keys": two, "counts": counts}, "'nope'"),
    ]
    for op, meta, arrays, text in cases:
        with pytest.raises(RemoteError) as info, wire.RpcClient(ep0, timeout_s=10) as c:
            c.call(op, meta, arrays)
        assert text in str(info.value), (op, meta, str(info.value))
        nothing_written()
    # the client refuses bad input before sending anything
    grads = [torch.zeros(m, 9), torch.zeros(m, 4)]
    nan_grads = [grads[0], grads[1].clone()]
    nan_grads[1][0, 0] = float("inf")
    for call, exc, text in [
        (
            lambda: client.push_many(["user", "item"], [fresh, fresh], nan_grads),
            NonFiniteGradient,
            "'item'",
        ),
        (
            lambda: client.push_many(
                ["user", "item"],
                [fresh, fresh],
                grads,
                shows=[torch.ones(m), -torch.ones(m)],
            ),
            InvalidInput,
            r"shows: must be >= 0 \(after summing duplicate keys\); "
            "nothing was pushed to table 'item'",
        ),
        (lambda: client.push_many(["user", "nope"], [fresh, fresh], grads), UnknownTable, "nope"),
        (lambda: client.push_many(["user", "item"], [fresh], grads), InvalidInput, "1 entries"),
        (
            lambda: client.push_many(["user", "item"], [fresh, fresh], [grads[0], grads[0]]),
            InvalidInput,
            "table 'item': grads",
        ),
        (lambda: client.pull_many(["user", "nope"], [fresh, fresh]), UnknownTable, "nope"),
    ]:
        with pytest.raises(exc, match=text):
            call()
        nothing_written()
    assert float(client.pull("user", fresh, create=False).abs().sum()) == 0


def test_service_many_edge_cases(two_shards, client):
    """Empty lists, an empty table, a table twice, keys on one shard only."""
    assert client.pull_many([], []) == []
    client.push_many([], [], [])
    nothing = np.zeros(0, np.int64)
    with wire.RpcClient(two_shards.endpoints[0], timeout_s=10) as c:  # no table at all
        _, reply = c.call("pull_many", {"tables": []}, {"keys": nothing, "counts": nothing})
        assert reply["values"].shape == (0,) and reply["values"].dtype == np.float32
        grads = np.zeros(0, np.float32)
        c.call("push_many", {"tables": []}, {"keys": nothing, "counts": nothing, "grads": grads})
    empty = torch.zeros(0, dtype=torch.int64)
    out = client.pull_many(["user", "item"], [empty, empty])
    assert [tuple(o.shape) for o in out] == [(0, 9), (0, 4)]
    keys = np.arange(2**42, 2**42 + 300, dtype=np.int64)
    one_shard = torch.from_numpy(keys[shard_of(keys, 2) == 1][:20])
    ref = make_store()
    g = torch.full((20, 9), 0.5)
    client.push_many(
        ["user", "item", "user"], [one_shard, empty, one_shard], [g, torch.zeros(0, 4), g]
    )
    ref.push("user", one_shard, g)
    ref.push("user", one_shard, g)
    torch.testing.assert_close(
        client.pull_many(["user"], [one_shard], create=False)[0],
        ref.pull("user", one_shard, create=False),
    )
    ref.close()


def test_service_rows_equal_the_many_calls(two_shards, client):
    """pull_rows/push_rows (every table's keys and rows as one block: the trainer's path) give
    what pull_many/push_many give on an in-process store: keys on both shards, repeats, a
    table listed twice, a table with no keys, shows/clicks given or defaulted."""
    ref = make_store()
    rng = np.random.default_rng(7)
    tables = ["item", "item", "item"]  # one dim for one block; a table more than once
    seen = []
    for step in range(3):
        parts = [rng.integers(0, 150, n).astype(np.int64) * 31 + 2**42 for n in (120, 0, 75)]
        counts = [p.size for p in parts]
        keys = torch.from_numpy(np.concatenate(parts))
        split = list(keys.split(counts))
        rows = client.pull_rows(tables, keys, counts)
        assert rows.shape == (keys.numel(), DIMS["item"]) and rows.dtype == torch.float32
        torch.testing.assert_close(rows, torch.cat(ref.pull_many(tables, split)))
        push_rows_and_many(rng, step % 2 == 1, client, ref, tables, keys, counts, max_show=3)
        seen.append(keys)
    every = torch.unique(torch.cat(seen))
    torch.testing.assert_close(
        client.pull_rows(["item"], every, [every.numel()], create=False),
        ref.pull("item", every, create=False),
    )


def test_service_bad_rows_calls_are_refused_before_sending(client):
    keys = torch.arange(2**43, 2**43 + 10)
    before = client.pull_rows(["item"], keys, [10], create=False)
    grads = torch.zeros(10, 4)
    bad = grads.clone()
    bad[7, 2] = float("nan")  # the second table's part
    for call, exc, text in [
        (
            lambda: client.push_rows(["item", "item"], keys, [5, 5], bad),
            NonFiniteGradient,
            r"grads: holds NaN or Inf \(key 7 of 10\); nothing was pushed to table 'item'",
        ),
        (
            lambda: client.push_rows(["item"], keys, [10], grads, shows=-torch.ones(10)),
            InvalidInput,
            "shows: must be >= 0",
        ),
        (lambda: client.pull_rows(["item"], keys, [9]), InvalidInput, "summing to the 10 keys"),
        (lambda: client.pull_rows(["item"], keys, [10.0]), InvalidInput, "counts must be"),
        (lambda: client.pull_rows(["item", "user"], keys, [5, 5]), InvalidInput, "one dim"),
        (lambda: client.pull_rows(["nope"], keys, [10]), UnknownTable, "nope"),
        (lambda: client.push_rows(["item"], keys, [10], torch.zeros(10, 9)), InvalidInput, "grads"),
    ]:
        with pytest.raises(exc, match=text):
            call()
    torch.testing.assert_close(client.pull_rows(["item"], keys, [10], create=False), before)
    assert client.pull_rows(["item"], torch.zeros(0, dtype=torch.int64), [0]).shape == (0, 4)
