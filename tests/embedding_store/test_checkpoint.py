"""Save/load: round trips of every mode, manifest checks, crashes and bad files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from streamrec.embedding_store import EmbeddingStore, FileConverter, TableOptions
from streamrec.embedding_store.errors import CheckpointError, InvalidInput
from streamrec.embedding_store.persistence import save_load as ckpt
from streamrec.embedding_store.persistence.manifests import read_manifest

TABLES = [
    TableOptions(
        name="user",
        dim=5,
        embedx_threshold=1.0,
        base_threshold=2.0,
        embed_sgd_param={"name": "adam"},
        embedx_sgd_param={"name": "adagrad"},
    ),
    TableOptions(
        name="item",
        dim=3,
        embedx_threshold=0,
        embed_sgd_param={"name": "std_adagrad"},
        embedx_sgd_param={"name": "adam"},
    ),
]
KEYS = np.arange(0, 400, 3, dtype=np.int64)


def trained_store(steps: int = 5, seed: int = 0) -> EmbeddingStore:
    store = EmbeddingStore(TABLES)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        for t in TABLES:
            keys = rng.choice(KEYS, 100)
            store.push(
                t.name,
                keys,
                rng.normal(0, 1, (100, t.dim)).astype(np.float32),
                rng.integers(1, 3, 100).astype(np.float32),
                (rng.random(100) < 0.4).astype(np.float32),
            )
    store.advance_day()
    return store


def snapshot(store: EmbeddingStore) -> dict[str, tuple]:
    out = {}
    for t in TABLES:
        st = store.inspect(t.name, KEYS)
        out[t.name] = (
            store.pull(t.name, KEYS, create=False),
            st["show"],
            st["click"],
            st["unseen_days"],
            st["expanded"],
            st["present"],
        )
    return out


def assert_same(a: dict, b: dict) -> None:
    for name in a:
        for x, y in zip(a[name], b[name], strict=True):
            assert torch.equal(x, y), name


def test_checkpoint_round_trip_restores_rows_state_and_day(tmp_path) -> None:
    store = trained_store()
    manifest = store.save(str(tmp_path / "ck"), "checkpoint", extra={"shard_id": 0})
    assert manifest["mode"] == "checkpoint" and manifest["extra"] == {"shard_id": 0}
    assert set(manifest["files"]) == {
        "user.keys.npy",
        "user.rows.npy",
        "item.keys.npy",
        "item.rows.npy",
        "user.deleted.npy",  # the keys deleted since the last base/delta: none yet
        "item.deleted.npy",
    }
    assert read_manifest(tmp_path / "ck") == manifest
    other = EmbeddingStore(TABLES)
    other.pull("user", np.array([10_000]))  # replaced by the load
    other.load(str(tmp_path / "ck"))
    assert other.day == 1 and other.size("user") == store.size("user")
    assert_same(snapshot(store), snapshot(other))
    # the optimizer state came along: the same push gives the same rows
    g = np.random.default_rng(9).normal(0, 1, (len(KEYS), 5)).astype(np.float32)
    for s in (store, other):
        s.push("user", KEYS, g)
    assert_same(snapshot(store), snapshot(other))


def test_batch_model_after_shrink_round_trips(tmp_path) -> None:
    store = trained_store()
    store.shrink()
    store.save(str(tmp_path / "batch"), "batch")
    other = EmbeddingStore(TABLES)
    assert other.load(str(tmp_path / "batch"))["mode"] == "batch"
    assert_same(snapshot(store), snapshot(other))


def test_base_then_delta_load_gives_the_served_weights(tmp_path) -> None:
    store = trained_store()
    base = store.save(str(tmp_path / "base"), "base")
    assert base["tables"]["user"]["rows"] > 0
    assert base["tables"]["user"]["rows"] < store.size("user")  # base_threshold filters
    store.push("item", KEYS[:7], np.ones((7, 3), np.float32))
    delta = store.save(str(tmp_path / "delta_1"), "delta")
    assert delta["tables"]["item"]["rows"] == 7 and delta["tables"]["user"]["rows"] == 0
    serving = EmbeddingStore(TABLES)
    serving.load(str(tmp_path / "base"))
    serving.load(str(tmp_path / "delta_1"))
    for name in ("user", "item"):
        keys, _ = FileConverter(tmp_path / "base").read_rows(name, "base")
        if name == "item":
            keys = np.union1d(keys, KEYS[:7])
        torch.testing.assert_close(
            serving.pull(name, keys, create=False), store.pull(name, keys, create=False)
        )
    assert serving.size("item") == len(
        np.union1d(FileConverter(tmp_path / "base").read_rows("item", "base")[0], KEYS[:7])
    )


def test_converter_writes_where_it_is_told(tmp_path) -> None:
    store = trained_store()
    conv = FileConverter(tmp_path / "serving")
    manifest = store.save(str(tmp_path / "meta"), "base", converter=conv)
    assert manifest["converter"] == f"FileConverter({tmp_path / 'serving'})"
    keys, values = conv.read_rows("user", "base")
    assert keys.shape[0] == manifest["tables"]["user"]["rows"] and values.shape[1] == 5
    assert not list((tmp_path / "meta").glob("*.npy"))
    other = EmbeddingStore(TABLES)
    other.load(str(tmp_path / "meta"), converter=conv)
    torch.testing.assert_close(other.pull("user", keys, create=False), torch.from_numpy(values))


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "manifest", "no_manifest"])
def test_bad_checkpoint_is_refused_and_the_previous_one_stays_loadable(tmp_path, damage) -> None:
    good, bad = tmp_path / "p1", tmp_path / "p2"
    store = trained_store()
    store.save(str(good), "checkpoint")
    before = snapshot(store)
    trained_store(seed=1).save(str(bad), "checkpoint")
    rows = bad / "user.rows.npy"
    if damage == "flip":
        data = bytearray(rows.read_bytes())
        data[-3] ^= 0x40
        rows.write_bytes(bytes(data))
        match = "sha256"
    elif damage == "truncate":
        rows.write_bytes(rows.read_bytes()[:-8])
        match = "bytes"
    elif damage == "remove":
        rows.unlink()
        match = "missing file 'user.rows.npy'"
    elif damage == "manifest":
        (bad / "MANIFEST.json").write_text("{not json")
        match = "unreadable manifest"
    else:
        (bad / "MANIFEST.json").unlink()
        match = "no MANIFEST.json"
    with pytest.raises(CheckpointError, match=match):
        store.load(str(bad))
    assert_same(before, snapshot(store))  # nothing changed
    other = EmbeddingStore(TABLES)
    other.load(str(good))
    assert_same(before, snapshot(other))


def test_refuses_foreign_files_and_mismatched_tables(tmp_path) -> None:
    store = trained_store()
    store.save(str(tmp_path / "ck"), "checkpoint")
    m = json.loads((tmp_path / "ck" / "MANIFEST.json").read_text())
    m["files"]["../escape"] = {"sha256": "0", "bytes": 1}
    (tmp_path / "ck" / "MANIFEST.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="not a plain file name"):
        store.load(str(tmp_path / "ck"))
    store.save(str(tmp_path / "ck2"), "checkpoint")
    changed = [
        TABLES[0].model_copy(update={"embed_sgd_param": TABLES[1].embed_sgd_param}),
        TABLES[1],
    ]
    with pytest.raises(CheckpointError, match="embed_sgd_param.name"):
        EmbeddingStore(changed).load(str(tmp_path / "ck2"))
    with pytest.raises(CheckpointError, match="not in this store"):
        EmbeddingStore(TABLES[1:]).load(str(tmp_path / "ck2"))
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        store.load(str(tmp_path / "nothing"))
    with pytest.raises(InvalidInput, match="mode must be one of"):
        store.save(str(tmp_path / "x"), "full")
    with pytest.raises(InvalidInput, match="path"):
        store.save("", "checkpoint")


def test_failed_save_over_a_checkpoint_keeps_it_and_keeps_delta_flags(tmp_path, monkeypatch):
    path = tmp_path / "ck"
    store = trained_store()
    store.save(str(path), "checkpoint")
    first = snapshot(store)
    store.push("user", KEYS, np.ones((len(KEYS), 5), np.float32))
    real = ckpt.save_npy
    calls = []

    def disk_full(p: Path, a: np.ndarray) -> None:
        calls.append(p)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(p, a)

    monkeypatch.setattr(ckpt, "save_npy", disk_full)
    with pytest.raises(OSError, match="No space"):
        store.save(str(path), "checkpoint")
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # the staging dir is gone
    other = EmbeddingStore(TABLES)
    other.load(str(path))
    assert_same(first, snapshot(other))
    # a failed delta gives the changed-since flags back: the next delta has the rows
    conv_calls = []

    def broken(self, *a, **k):
        conv_calls.append(a)
        raise OSError(5, "I/O error")

    monkeypatch.setattr(FileConverter, "write_rows", broken)
    with pytest.raises(OSError, match="I/O"):
        store.save(str(tmp_path / "d1"), "delta")
    monkeypatch.undo()
    delta = store.save(str(tmp_path / "d2"), "delta")
    assert delta["tables"]["user"]["rows"] > 0
    assert not (tmp_path / "d1").exists()


CRASH_CHILD = """
import os, signal, sys
import numpy as np
from streamrec.embedding_store import EmbeddingStore, TableOptions
from streamrec.embedding_store.persistence import save_load as ckpt
store = EmbeddingStore([TableOptions(name="user", dim=5, embedx_threshold=0)])
store.pull("user", np.arange(5000))
real, n = ckpt.save_npy, []
def save_then_die(p, a):
    real(p, a)
    n.append(p)
    if len(n) == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # a crash in the middle of the save
ckpt.save_npy = save_then_die
store.save(sys.argv[1], "checkpoint")
"""


def test_process_killed_during_save_leaves_the_previous_checkpoint(tmp_path) -> None:
    path = tmp_path / "ck"
    store = EmbeddingStore([TableOptions(name="user", dim=5, embedx_threshold=0)])
    store.pull("user", np.arange(10))
    store.save(str(path), "checkpoint")
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_CHILD, str(path)], timeout=120, capture_output=True
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "ck"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".ck.tmp-")
    other = EmbeddingStore([TableOptions(name="user", dim=5, embedx_threshold=0)])
    other.load(str(path))
    assert other.size("user") == 10
    torch.testing.assert_close(
        other.pull("user", np.arange(10), create=False),
        store.pull("user", np.arange(10), create=False),
    )
    assert os.listdir(path) and "MANIFEST.json" in os.listdir(path)


@pytest.mark.parametrize("hostile", ["repeated_keys", "nan_rows", "wrong_width"])
def test_well_formed_but_hostile_files_are_refused(tmp_path, hostile) -> None:
    store = trained_store()
    path = tmp_path / "ck"
    store.save(str(path), "checkpoint")
    keys = np.load(path / "user.keys.npy")
    rows = np.load(path / "user.rows.npy")
    if hostile == "repeated_keys":
        keys[1] = keys[0]
        match = "repeats keys"
    elif hostile == "nan_rows":
        rows[0, 5] = np.nan
        match = "NaN or Inf"
    else:
        rows = rows[:, :-1].copy()
        match = "do not match the manifest"
    np.save(path / "user.keys.npy", keys)
    np.save(path / "user.rows.npy", rows)
    m = json.loads((path / "MANIFEST.json").read_text())
    for name in ("user.keys.npy", "user.rows.npy"):  # checksums that agree with the files
        data = (path / name).read_bytes()
        m["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (path / "MANIFEST.json").write_text(json.dumps(m))
    other = EmbeddingStore(TABLES)
    other.pull("user", KEYS[:3])
    before = other.pull("user", KEYS[:3], create=False)
    with pytest.raises(CheckpointError, match=match):
        other.load(str(path))
    assert torch.equal(other.pull("user", KEYS[:3], create=False), before)
    assert other.size("user") == 3
