"""A save of M shards loaded into N shards (resharding), in-process, on every tier.

M in-process stores play the M shards (each trained on the keys that route to it, saved as
``shard-J-of-M/``); N fresh stores each load the keys of shard K of N
(``EmbeddingStore.load(path, shard=(K, N))``, streaming in small chunks here). Every row
(weights, optimizer state, show/click, unseen days, flags) must come back bit for bit, each
in the shard it routes to; a base + delta chain must give the weights the whole chain gives
one store; a bad save must change nothing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from streamrec.embedding_store import (
    EmbeddingStore,
    EmbeddingStoreClient,
    LocalShards,
    TableOptions,
)
from streamrec.embedding_store.errors import CheckpointError
from streamrec.embedding_store.persistence import reshard as reshard_mod
from streamrec.embedding_store.persistence.manifests import shard_dir_name
from streamrec.embedding_store.tiers.table_tier import SELECT_ALL
from streamrec.keyhash import shard_of
from test_service import reference_store, write_tables
from test_sharded_saves import keys_of, saved_rows
from test_sharded_saves import train as train_service

TABLES = [
    TableOptions(
        name="user",
        embedx_dim=6,
        embedx_threshold=1.0,
        embed_sgd_param={"name": "adagrad", "learning_rate": 0.05},
        embedx_sgd_param={"name": "adam"},
    ),
    TableOptions(name="item", dim=4, embedx_threshold=0),
]
DIMS = {"user": 7, "item": 4}
KEYS = 5000  # per table: several chunks of 1024 rows with the chunk size below


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 1024 rows, so every table is read in several (the boundaries tested)."""
    monkeypatch.setattr(reshard_mod, "CHUNK_BYTES", 4096)


def store_of(tier: str, tmp: Path, name: str) -> EmbeddingStore:
    kw: dict[str, Any] = {"seed": 5, "tier": tier}
    if tier == "ssd":
        kw.update(persistent_path=str(tmp / "ssd" / name), capacity=20_000, cache_budget_mb=0.05)
    if tier == "device":
        kw["device"] = "cpu"  # the CPU build of the kernels
    return EmbeddingStore(TABLES, **kw)


def all_keys(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t: np.unique(rng.integers(-(2**63), 2**63 - 1, KEYS, dtype=np.int64)) for t in DIMS}


def train(store: EmbeddingStore, keys: dict[str, np.ndarray], seed: int) -> None:
    """Two pushes per table: shows and clicks vary, so rows expand (or not) and the
    optimizer state differs from row to row."""
    rng = np.random.default_rng(seed)
    for _ in range(2):
        for t, k in keys.items():
            if not k.size:
                continue
            grads = rng.standard_normal((k.size, DIMS[t])).astype(np.float32)
            store.push(
                t,
                k,
                torch.from_numpy(grads),
                torch.from_numpy(rng.integers(0, 3, k.size).astype(np.float32)),
                torch.from_numpy((rng.random(k.size) < 0.3).astype(np.float32)),
            )


def rows_of(store: EmbeddingStore, table: str) -> tuple[np.ndarray, np.ndarray]:
    """(keys, full rows) of ``table``, sorted by key."""
    with store.exclusive(table) as tier:
        keys, rows = tier.export(SELECT_ALL)
    keys, rows = keys.cpu().numpy(), rows.cpu().numpy()
    order = np.argsort(keys)
    return keys[order], rows[order]


def sharded_save(tmp: Path, tier: str, m: int, saves: list[tuple[str, str]]) -> list[Any]:
    """M stores trained on their keys; after each training round i, ``saves[i]`` = (mode,
    directory name) is saved by every one as ``<dir>/shard-J-of-M``. Returns the stores."""
    keys = all_keys()
    owned = [{t: k[shard_of(k, m) == j] for t, k in keys.items()} for j in range(m)]
    stores = [store_of(tier, tmp, f"src{m}-{j}") for j in range(m)]
    for i, (mode, name) in enumerate(saves):
        for j, s in enumerate(stores):
            train(s, owned[j], seed=10 * i + j)
            if i == 0:
                s.advance_day()
            extra = {"shard_id": j, "num_shards": m}
            s.save(str(tmp / name / shard_dir_name(j, m)), mode, extra=extra)
    return stores


TIERS = ["host", "ssd", "device"]


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("m", "n"), [(2, 3), (3, 2)])
def test_every_row_lands_bit_identical_in_the_shard_it_routes_to(tmp_path, tier, m, n):
    sources = sharded_save(tmp_path, tier, m, [("checkpoint", "ckpt")])
    want = {}
    for t in DIMS:
        parts = [rows_of(s, t) for s in sources]
        keys = np.concatenate([p[0] for p in parts])
        order = np.argsort(keys)
        want[t] = (keys[order], np.concatenate([p[1] for p in parts])[order])
    targets = [store_of(tier, tmp_path, f"dst{n}-{k}") for k in range(n)]
    for k, target in enumerate(targets):
        target.pull("item", torch.tensor([123456789]))  # a row of before: replaced
        loaded = target.load(str(tmp_path / "ckpt"), shard=(k, n))
        assert loaded["resharded"] == f"{m} -> {n}" and loaded["shards"] == m
        assert target.day == 1
    for t in DIMS:
        got = [rows_of(s, t) for s in targets]
        for k, (keys, _rows) in enumerate(got):
            assert (shard_of(keys, n) == k).all(), f"shard {k} of {n} holds another's key"
        keys = np.concatenate([g[0] for g in got])
        rows = np.concatenate([g[1] for g in got])
        order = np.argsort(keys)
        np.testing.assert_array_equal(keys[order], want[t][0])
        # bit for bit: the float32 patterns, so -0.0 vs 0.0 or a rounding would show
        np.testing.assert_array_equal(rows[order].view(np.int32), want[t][1].view(np.int32))
        assert sum(s.size(t) for s in targets) == want[t][0].size
    # the loaded rows train on: a pull creates nothing for a loaded key
    k0 = want["user"][0][:50]
    mine = k0[shard_of(k0, n) == 0]
    before = targets[0].size("user")
    targets[0].pull("user", torch.from_numpy(mine))
    assert targets[0].size("user") == before
    for s in sources + targets:
        s.close()


@pytest.mark.parametrize(("m", "n"), [(2, 3), (3, 2)])
def test_a_base_and_delta_chain_applies_in_order_into_another_shard_count(tmp_path, m, n):
    sharded_save(tmp_path, "host", m, [("base", "base"), ("delta", "delta1"), ("delta", "d2")])
    # what the chain gives: every part of it loaded into one store, in order
    whole = store_of("host", tmp_path, "whole")
    for name in ("base", "delta1", "d2"):
        whole.load(str(tmp_path / name))
    keys = all_keys()
    for k in range(n):
        target = store_of("host", tmp_path, f"chain{k}")
        for name in ("base", "delta1", "d2"):
            assert target.load(str(tmp_path / name), shard=(k, n))["resharded"] == f"{m} -> {n}"
        for t, tk in keys.items():
            got_keys, _ = rows_of(target, t)
            assert (shard_of(got_keys, n) == k).all()
            mine = torch.from_numpy(got_keys)
            a = target.pull(t, mine, create=False).numpy()
            b = whole.pull(t, mine, create=False).numpy()
            np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32))
            ours = tk[shard_of(tk, n) == k]
            in_base = np.isin(ours, rows_of(whole, t)[0])
            assert np.isin(ours[in_base], got_keys).all()  # every key of the chain is here
        target.close()
    whole.close()


def test_a_bad_save_changes_nothing(tmp_path):
    sharded_save(tmp_path, "host", 2, [("checkpoint", "ckpt")])
    target = store_of("host", tmp_path, "dst")
    probe = torch.from_numpy(all_keys(9)["user"][:20])
    target.pull("user", probe)
    before = rows_of(target, "user")

    def unchanged() -> None:
        after = rows_of(target, "user")
        np.testing.assert_array_equal(after[0], before[0])
        np.testing.assert_array_equal(after[1], before[1])

    # a key in the part of a shard it does not route to: the parts would not be disjoint
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "ckpt", moved)
    part = moved / "shard-1-of-2"
    keys = np.load(part / "item.keys.npy")
    stray = next(int(x) for x in all_keys(3)["item"] if shard_of(np.array([x]), 2)[0] == 0)
    keys[7] = stray
    np.save(part / "item.keys.npy", keys)
    manifest = json.loads((part / "MANIFEST.json").read_text())
    digest = hashlib.sha256((part / "item.keys.npy").read_bytes()).hexdigest()
    manifest["files"]["item.keys.npy"]["sha256"] = digest
    (part / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=f"key {stray} .*belongs to shard 0 of 2"):
        target.load(str(moved), shard=(0, 3))
    unchanged()
    # a file that fails its checksum
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "ckpt", broken)
    with open(broken / "shard-0-of-2" / "user.rows.npy", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x00\xc0\x7f")
    with pytest.raises(CheckpointError, match="fails its sha256"):
        target.load(str(broken), shard=(1, 3))
    unchanged()
    # a part missing
    shutil.rmtree(broken / "shard-1-of-2")
    with pytest.raises(CheckpointError, match="not a whole save of 2"):
        target.load(str(broken), shard=(1, 3))
    unchanged()
    with pytest.raises(ValueError, match=r"shard must be \(K, N\) with 0 <= K < N, got \(3, 3\)"):
        target.load(str(tmp_path / "ckpt"), shard=(3, 3))
    target.close()


def test_one_stores_save_splits_into_shards(tmp_path):
    source = store_of("host", tmp_path, "one")
    keys = all_keys(4)
    train(source, keys, 1)
    source.save(str(tmp_path / "one"), "checkpoint")
    want = rows_of(source, "item")
    got = []
    for k in range(3):
        target = store_of("host", tmp_path, f"part{k}")
        assert target.load(str(tmp_path / "one"), shard=(k, 3))["resharded"] == "1 -> 3"
        got.append(rows_of(target, "item"))
        target.close()
    keys_got = np.concatenate([g[0] for g in got])
    order = np.argsort(keys_got)
    np.testing.assert_array_equal(keys_got[order], want[0])
    rows = np.concatenate([g[1] for g in got])[order]
    np.testing.assert_array_equal(rows.view(np.int32), want[1].view(np.int32))
    source.close()


@pytest.fixture(scope="module")
def tables_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tables(tmp_path_factory.mktemp("tables") / "tables.json")


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("m", "n"), [(2, 3), (3, 2)])
def test_shard_processes_load_a_save_of_another_count(tables_file, tmp_path, m, n):
    """Shard processes (``LocalShards``): M shards save, N others load it (each the keys that
    route to it) and save it again: the same rows, bit for bit, each in its own shard."""
    keys = keys_of(m)
    ckpt, base, delta = tmp_path / "ckpt", tmp_path / "base", tmp_path / "delta"
    with LocalShards(tables_file, m) as shards:
        c = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
        train_service(c, keys, 1)
        c.advance_day()
        c.save(str(ckpt), "checkpoint")
        c.save(str(base), "base")
        train_service(c, keys, 2)
        c.save(str(delta), "delta")
        c.close()
    chain = reference_store()
    chain.load(str(base))
    chain.load(str(delta))
    again = tmp_path / "again"
    with LocalShards(tables_file, n) as shards:
        c = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
        assert c.load(str(ckpt)) == {"path": str(ckpt), "num_shards": n, "resharded": f"{m} -> {n}"}
        c.save(str(again), "checkpoint")
        parts = [Path(d) for d in c.shard_dirs(str(again))]
        for t in keys:
            for k, part in enumerate(parts):
                assert (shard_of(np.load(part / f"{t}.keys.npy"), n) == k).all()
            want_keys, want_rows = saved_rows(sorted(ckpt.iterdir()), t)
            got_keys, got_rows = saved_rows(parts, t)
            np.testing.assert_array_equal(got_keys, want_keys)
            np.testing.assert_array_equal(got_rows.view(np.int32), want_rows.view(np.int32))
        manifest = json.loads((parts[0] / "MANIFEST.json").read_text())
        assert manifest["day"] == 1
        c.close()
        # the base + delta chain, resharded on each load, gives what it gives one store
        c = EmbeddingStoreClient(shards.endpoints, chain.tables.values(), namespace="chain")
        c.load(str(base))
        assert c.load(str(delta))["resharded"] == f"{m} -> {n}"
        for t, k in keys.items():
            np.testing.assert_array_equal(
                c.pull(t, k, create=False).numpy().view(np.int32),
                chain.pull(t, k, create=False).numpy().view(np.int32),
            )
        c.close()
    chain.close()
