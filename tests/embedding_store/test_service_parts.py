"""Pulls and pushes split into many requests per shard (``max_request_keys``), with replies in
any order from shards of two workers: the same values as the in-process store."""

from __future__ import annotations

import json

import numpy as np
import torch
from streamrec.embedding_store import EmbeddingStore, EmbeddingStoreClient, LocalShards
from streamrec.store_schema import TableOptions

PART_TABLES = [
    {"name": "normal", "embedx_dim": 5, "embedx_threshold": 0,
     "initializer": {"type": "normal", "mean": 0.1, "std": 0.3}},
    {"name": "late", "embedx_dim": 5, "embedx_threshold": 4.0,  # embedx zeros until expanded
     "embed_sgd_param": {"name": "adagrad", "initial_range": 0.2}},
    {"name": "zeros", "embedx_dim": 2, "embedx_threshold": 0, "initializer": {"type": "zeros"}},
]  # fmt: skip


def test_pulls_and_pushes_in_parts_match_the_store(tmp_path):
    """Pulls and pushes sent as many requests (max_request_keys) to shards with two workers
    each (replies may come in any order): the same values as the in-process store with the
    same seed, for every initializer."""
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": PART_TABLES}))
    ref = EmbeddingStore([TableOptions.parse(t) for t in PART_TABLES], seed=11)
    args = ["--workers", "2", "--seed", "11"]
    with LocalShards(str(path), 2, extra_args=args) as shards:
        client = EmbeddingStoreClient(shards.endpoints, timeout_s=20, max_request_keys=97)
        rng = np.random.default_rng(5)
        for _step in range(3):
            keys = rng.integers(0, 3_000, 2_000)  # new and known keys, repeats
            for t in PART_TABLES:
                name, dim = t["name"], t["embedx_dim"] + 1
                torch.testing.assert_close(client.pull(name, keys), ref.pull(name, keys))
                grads = torch.from_numpy(rng.standard_normal((keys.size, dim)).astype(np.float32))
                client.push(name, keys, grads)
                ref.push(name, keys, grads)
        every = np.arange(3_000)
        for t in PART_TABLES:
            got = client.pull(t["name"], every, create=False)
            torch.testing.assert_close(got, ref.pull(t["name"], every, create=False))
        client.close()
    ref.close()
