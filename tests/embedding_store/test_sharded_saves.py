"""Saves of N shard processes loaded anywhere: into one in-process store, into N shards.

A shard service's save is ``path/shard-K-of-N/`` (one manifest each); the in-process store
reads all N into its one store (every row of every shard), the service loads them back into
N shards, and a one-shard store loads one in-process store's save. Shards are real processes
(``LocalShards``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from streamrec.embedding_store import (
    EmbeddingStore,
    EmbeddingStoreClient,
    FileConverter,
    LocalShards,
)
from streamrec.embedding_store.errors import CheckpointError, InvalidInput
from test_service import reference_store, write_tables

DIMS = {"user": 9, "item": 4}


@pytest.fixture(scope="module")
def tables_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tables(tmp_path_factory.mktemp("tables") / "tables.json")


def keys_of(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t: rng.integers(0, 2**40, 600, dtype=np.int64) for t in DIMS}


def train(store: EmbeddingStore | EmbeddingStoreClient, keys: dict[str, np.ndarray], seed: int):
    """One pull and push per table: every key twice shown, about half clicked."""
    r = np.random.default_rng(seed)
    for t, k in keys.items():
        store.pull(t, k)
        store.push(
            t,
            k,
            torch.from_numpy(r.standard_normal((k.size, DIMS[t])).astype(np.float32)),
            torch.full((k.size,), 2.0),
            torch.from_numpy((r.random(k.size) < 0.5).astype(np.float32)),
        )


def saved_rows(parts: list[Path], table: str) -> tuple[np.ndarray, np.ndarray]:
    """(keys, full rows) of ``table`` over checkpoint directories, sorted by key."""
    keys = np.concatenate([np.load(p / f"{table}.keys.npy") for p in parts])
    rows = np.concatenate([np.load(p / f"{table}.rows.npy") for p in parts])
    order = np.argsort(keys)
    return keys[order], rows[order]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_save_of_n_shards_loads_in_process_and_into_n_shards(tables_file, tmp_path, n):
    keys = keys_of(n)
    ckpt, base, delta = tmp_path / "ckpt", tmp_path / "base", tmp_path / "delta"
    with LocalShards(tables_file, n) as shards:
        c = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
        train(c, keys, 1)
        c.advance_day()
        c.save(str(ckpt), "checkpoint")
        c.save(str(base), "base")
        train(c, keys, 2)
        c.save(str(delta), "delta")
        served = {t: c.pull(t, k, create=False) for t, k in keys.items()}
        parts = [Path(d) for d in c.shard_dirs(str(ckpt))]
        assert sorted(p.name for p in ckpt.iterdir()) == sorted(p.name for p in parts)

        # in-process: every shard's rows in the one store, the day with them
        local = reference_store()
        manifest = local.load(str(ckpt))
        assert manifest["mode"] == "checkpoint" and manifest.get("shards", 1) == n
        assert local.day == 1
        local.save(str(tmp_path / "merged"), "checkpoint")
        for t in keys:
            want_keys, want_rows = saved_rows(parts, t)
            got_keys, got_rows = saved_rows([tmp_path / "merged"], t)
            assert local.size(t) == sum(c.sizes(t)) == want_keys.size
            np.testing.assert_array_equal(got_keys, want_keys)
            np.testing.assert_array_equal(got_rows, want_rows)

        # the service: the N shards take the N-shard checkpoint back (a step after it
        # matches the in-process store's step: optimizer state and statistics came back)
        c.load(str(ckpt))
        train(c, keys, 3)
        train(local, keys, 3)
        for t, k in keys.items():
            torch.testing.assert_close(
                c.pull(t, k, create=False), local.pull(t, k, create=False), rtol=0, atol=0
            )

        # serving: base then delta of N shards into one store give the shards' weights
        serving = reference_store()
        serving.load(str(base))
        assert serving.load(str(delta))["mode"] == "delta"
        for t, k in keys.items():
            present = serving.inspect(t, k)["present"]
            assert present.any()
            torch.testing.assert_close(
                serving.pull(t, k, create=False)[present], served[t][present], rtol=0, atol=0
            )

        if n == 1:  # one in-process store's save is the whole of a one-shard store
            local.save(str(tmp_path / "in_process"), "checkpoint")
            c.load(str(tmp_path / "in_process"))
            for t, k in keys.items():
                torch.testing.assert_close(
                    c.pull(t, k, create=False), local.pull(t, k, create=False), rtol=0, atol=0
                )
        c.close()
        local.close()
        serving.close()


def test_a_damaged_or_mixed_sharded_save_changes_nothing(tables_file, tmp_path):
    keys = keys_of(7)
    good, bad = tmp_path / "good", tmp_path / "bad"
    with LocalShards(tables_file, 2) as shards:
        c = EmbeddingStoreClient(shards.endpoints, timeout_s=30)
        train(c, keys, 1)
        c.save(str(good), "checkpoint")
        train(c, keys, 2)
        c.save(str(bad), "checkpoint")
        c.save(str(tmp_path / "base"), "base")
        local = reference_store()
        # a sharded base is read from each shard's files: a converter object is refused
        with pytest.raises(InvalidInput, match="converter: a save of 2 shards"):
            local.load(str(tmp_path / "base"), converter=FileConverter(tmp_path / "base"))
        local.load(str(good))
        before = {t: local.pull(t, k, create=False) for t, k in keys.items()}

        # an in-process save is one store's: two shards split it (resharded 1 -> 2)
        local.save(str(tmp_path / "in_process"), "checkpoint")
        assert c.load(str(tmp_path / "in_process"))["resharded"] == "1 -> 2"
        for t, k in keys.items():
            assert c.size(t) == local.size(t)
            torch.testing.assert_close(
                c.pull(t, k, create=False), local.pull(t, k, create=False), rtol=0, atol=0
            )
        c.close()

    victim = bad / "shard-1-of-2" / "user.rows.npy"
    victim.write_bytes(victim.read_bytes()[:-4] + b"\0\0\0\0")
    cases = [(bad, "shard-1-of-2", "fails its sha256 checksum")]
    lost = tmp_path / "lost"
    shutil.copytree(good / "shard-0-of-2", lost / "shard-0-of-2")
    cases.append((lost, "not a whole save of 2 shard(s): it holds shard-0-of-2,", "shard-1-of-2"))
    mixed = tmp_path / "mixed"
    shutil.copytree(good, mixed)
    shutil.copytree(good / "shard-0-of-2", mixed / "shard-0-of-3")
    cases.append((mixed, "mixes saves of 2 and 3 shards", "shard-0-of-3"))
    twice = tmp_path / "twice"
    shutil.copytree(good, twice)
    shutil.copytree(good / "shard-0-of-2", twice / "shard-1-of-2", dirs_exist_ok=True)
    cases.append((twice, "repeats keys across its 2 shards", "twice"))
    other = tmp_path / "other_mode"
    shutil.copytree(good, other)
    shutil.rmtree(other / "shard-1-of-2")
    with reference_store() as empty:
        empty.save(str(other / "shard-1-of-2"), "batch")
    cases.append((other, "a batch save of tables", "not one save"))
    for path, *words in cases:
        with pytest.raises(CheckpointError) as err:
            local.load(str(path))
        assert all(w in str(err.value) for w in words), str(err.value)
        for t, k in keys.items():
            torch.testing.assert_close(local.pull(t, k, create=False), before[t], rtol=0, atol=0)
    json.loads((good / "shard-0-of-2" / "MANIFEST.json").read_text())  # the good one is intact
    local.close()
