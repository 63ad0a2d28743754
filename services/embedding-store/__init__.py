# ruff: noqa: N999 - the directory is services/embedding-store, the package embedding_store
"""Sparse parameter server: dynamic multi-table embedding store (PaddleRec / OneEmbedding).

The library, usable in-process::

    from streamrec.embedding_store import EmbeddingStore, TableOptions, StoreEmbeddingBags

See ``README.md`` in this directory for the semantics (seed 002) and tiers (seed 003).
"""

import os

import torch  # noqa: F401  (loads libtorch before the C++ extension)

# read by the C++ extension when it loads (rows.cpp): a misspelt value would pass silently
if os.environ.get("STREAMREC_SIMD", "") not in ("", "portable"):
    raise ImportError(
        f"STREAMREC_SIMD must be unset or 'portable', got {os.environ['STREAMREC_SIMD']!r}"
    )

from streamrec.embedding_store.converters import Converter, FileConverter
from streamrec.embedding_store.module import PulledBatch, StoreEmbeddingBags
from streamrec.embedding_store.options import (
    NormalInitializer,
    SgdRuleParam,
    StoreOptions,
    TableOptions,
    UniformInitializer,
    ZerosInitializer,
)
from streamrec.embedding_store.store import EmbeddingStore

__all__ = [
    "Converter",
    "EmbeddingStore",
    "FileConverter",
    "NormalInitializer",
    "PulledBatch",
    "SgdRuleParam",
    "StoreEmbeddingBags",
    "StoreOptions",
    "TableOptions",
    "UniformInitializer",
    "ZerosInitializer",
]
