# ruff: noqa: N999 - the directory is services/embedding-store, the package embedding_store
"""Sparse parameter server: dynamic multi-table embedding store (PaddleRec / OneEmbedding).

The public API is what this module exports; other services import nothing else of it::

    from streamrec.embedding_store import EmbeddingStore, TableOptions, StoreEmbeddingBags
    from streamrec.embedding_store import EmbeddingStoreClient, LocalShards, unique_keys
    from streamrec.embedding_store import SparseStore  # what the two stores above share

See ``README.md`` in this directory for the semantics (PaddleRec's), the tiers (OneEmbedding's) and
where each concept lives.
"""

import os

import torch  # noqa: F401  (loads libtorch before the C++ extension)

# read by the C++ extension when it loads (row_init.cpp): a misspelt value would pass silently
if os.environ.get("STREAMREC_SIMD", "") not in ("", "portable"):
    raise ImportError(
        f"STREAMREC_SIMD must be unset or 'portable', got {os.environ['STREAMREC_SIMD']!r}"
    )

from streamrec.embedding_store.dedup import unique_groups, unique_keys
from streamrec.embedding_store.deletes import DeleteReason
from streamrec.embedding_store.errors import (
    ShardRestarted,
    StaleGeneration,
    UnknownNamespace,
    VersionConflict,
)
from streamrec.embedding_store.module import PulledBatch, StoreEmbeddingBags
from streamrec.embedding_store.persistence.converters import Converter, FileConverter
from streamrec.embedding_store.persistence.redis_converter import RedisConverter
from streamrec.embedding_store.persistence.versions import SaveVersion
from streamrec.embedding_store.service.client import EmbeddingStoreClient
from streamrec.embedding_store.service.local_shards import LocalShards
from streamrec.embedding_store.service.shard_link import shard_count
from streamrec.embedding_store.sparse_store import SparseStore
from streamrec.embedding_store.store import EmbeddingStore
from streamrec.store_schema import (
    NormalInitializer,
    SgdRuleParam,
    StoreOptions,
    TableOptions,
    UniformInitializer,
    ZerosInitializer,
)

__all__ = [
    "Converter",
    "DeleteReason",
    "EmbeddingStore",
    "RedisConverter",
    "EmbeddingStoreClient",
    "FileConverter",
    "LocalShards",
    "NormalInitializer",
    "PulledBatch",
    "SaveVersion",
    "SgdRuleParam",
    "ShardRestarted",
    "SparseStore",
    "StaleGeneration",
    "StoreEmbeddingBags",
    "StoreOptions",
    "TableOptions",
    "UniformInitializer",
    "UnknownNamespace",
    "VersionConflict",
    "ZerosInitializer",
    "shard_count",
    "unique_groups",
    "unique_keys",
]
