"""Disk errors of a real shard come back as codes the client can act on, never ``internal``:
a full disk (a 2 MB tmpfs as the model root) is ``no_space`` naming the path and the bytes
free, leaves no partial directory, and a retry backs off; a name too long is
``bad_request``, a file where a directory must go is ``exists``. The shard keeps serving."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from servers import tmpfs
from streamrec.embedding_store import EmbeddingStoreClient, LocalShards
from streamrec.embedding_store.disk import BACKOFF_FIRST_S
from streamrec.errors import RemoteError

TMPFS_BYTES = 2 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs: a real filesystem that fills up."""
    with tmpfs(tmp_path / "models", TMPFS_BYTES) as root:
        yield root


def remote_error(call) -> RemoteError:
    with pytest.raises(RemoteError) as err:
        call()
    return err.value


def test_disk_errors_are_codes_and_a_full_disk_leaves_nothing(small_disk, tmp_path):
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps({"tables": [{"name": "user", "embedx_dim": 8}]}))
    root = small_disk
    with LocalShards(tables, 1, model_roots=[root]) as shards:
        client = EmbeddingStoreClient(shards.endpoints, timeout_s=60)
        try:
            keys = torch.from_numpy(np.arange(1, 100_001, dtype=np.int64))
            client.pull("user", keys)  # creates 100k rows: several MB saved, the disk has 2

            err = remote_error(lambda: client.save(str(root / ("x" * 300))))
            assert err.code == "bad_request" and "File name too long" in str(err), err
            err = remote_error(lambda: client.load(str(root / ("x" * 300))))
            assert err.code == "bad_request" and "File name too long" in str(err), err
            (root / "a-file").write_text("not a directory")
            err = remote_error(lambda: client.save(str(root / "a-file" / "ckpt")))
            assert err.code == "exists" and "a-file" in str(err), err

            target = root / "20260101" / "7" / "base"
            err = remote_error(lambda: client.save(str(target)))
            assert err.code == "no_space", err
            assert str(target) in str(err) and "bytes free" in str(err), err
            assert sorted(p.name for p in root.iterdir()) == ["a-file"]  # no partial directory

            started = time.monotonic()
            err = remote_error(lambda: client.save(str(target)))  # at once: backed off
            assert err.code == "no_space" and "retry in" in str(err), err
            assert time.monotonic() - started < BACKOFF_FIRST_S

            assert client.pull("user", keys[:3]).shape == (3, 9)  # still serving
        finally:
            client.close()
