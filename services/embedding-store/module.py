"""``StoreEmbeddingBags``: pooled embeddings from a store, with autograd, for trainers.

One step::

    pulled = emb.pull(features)      # may run in a prefetch thread
    outs = emb(pulled)               # list of (batch, dim) float32, differentiable
    loss(outs, ...).backward()
    emb.push(pulled, labels)         # summed grads per unique key, show/click

Per table, a batch of ``batch`` rows is a :class:`~streamrec.ragged.RaggedTensor` of keys::

    features[t].values()  = [k0, k1, k2, k1]     (nnz,) int64
    features[t].offsets() = [0, 2, 2, 4]         batch = 3 rows: [k0, k1], [], [k2, k1]

``pull`` keeps each table's unique keys ``(u,)``, the inverse ``(nnz,)`` and the pulled
weights ``(u, dim)`` as a leaf tensor; ``forward`` pools them with ``embedding_bag``; after
backward the leaf holds the summed gradient per unique key. ``push`` sends it with
shows = occurrences of the key and clicks = the sum of the labels of the rows it occurs in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from streamrec.embedding_store.dedup import unique_keys
from streamrec.embedding_store.errors import InvalidInput
from streamrec.ragged import RaggedTensor
from torch import nn


class TableStore(Protocol):
    """What the module needs of a store, one table at a time (the in-process store or the
    remote client; the trainer's fused path uses
    :class:`~streamrec.embedding_store.SparseStore`)."""

    def pull(self, table: str, keys: Any, create: bool = True) -> torch.Tensor: ...

    def push(
        self, table: str, keys: Any, grads: Any, shows: Any | None = None, clicks: Any | None = None
    ) -> None: ...


@dataclass
class PulledTable:
    """One table's part of a pulled batch.

    Attributes:
        table: table name.
        keys: (u,) int64 unique keys.
        inverse: (nnz,) int64, position in ``keys`` of each value of the batch.
        offsets: (batch + 1,) int64, the batch's row offsets.
        weights: (u, dim) float32 leaf with ``requires_grad``.
    """

    table: str
    keys: torch.Tensor
    inverse: torch.Tensor
    offsets: torch.Tensor
    weights: torch.Tensor


@dataclass
class PulledBatch:
    """What :meth:`StoreEmbeddingBags.pull` returns: one :class:`PulledTable` per table."""

    tables: list[PulledTable]
    batch: int


class StoreEmbeddingBags(nn.Module):
    """Multi-table embedding bags whose rows live in an embedding store.

    Args:
        store: anything with ``pull``/``push`` as :class:`EmbeddingStore` (or the client).
        tables: the table names, in the order of the features.
        pooling: "sum" or "mean".
    """

    def __init__(self, store: TableStore, tables: list[str], pooling: str = "sum") -> None:
        super().__init__()
        if pooling not in ("sum", "mean"):
            raise InvalidInput(f"pooling must be 'sum' or 'mean', got {pooling!r}")
        if not tables:
            raise InvalidInput("tables must name at least one table")
        self.store = store
        self.table_names = list(tables)
        self.pooling = pooling

    def pull(self, features: list[RaggedTensor], create: bool = True) -> PulledBatch:
        """Pulls the unique keys of each table (thread-safe: keeps no state in the module).

        Args:
            features: one RaggedTensor of int64 keys per table, each with ``batch`` rows.
            create: create absent keys (training) or read them as zeros (prediction).
        """
        if len(features) != len(self.table_names):
            raise InvalidInput(
                f"features: expected {len(self.table_names)} RaggedTensors (one per table "
                f"{self.table_names}), got {len(features)}"
            )
        batch = features[0].num_rows if features else 0
        parts = []
        for name, feat in zip(self.table_names, features, strict=True):
            if not isinstance(feat, RaggedTensor):
                raise InvalidInput(f"features for table {name!r} must be a RaggedTensor")
            if feat.num_rows != batch:
                raise InvalidInput(
                    f"features for table {name!r} have {feat.num_rows} rows, expected {batch}"
                )
            values = feat.values()
            if values.dtype != torch.int64:
                raise InvalidInput(f"features for table {name!r} must be int64, got {values.dtype}")
            keys, inverse = unique_keys(values)
            weights = self.store.pull(name, keys, create=create).detach().requires_grad_(True)
            parts.append(PulledTable(name, keys, inverse, feat.offsets(), weights))
        return PulledBatch(parts, batch)

    def forward(self, pulled: PulledBatch) -> list[torch.Tensor]:
        """Pooled embeddings: one (batch, dim) float32 per table, differentiable w.r.t. the
        pulled weights."""
        return [
            F.embedding_bag(
                p.inverse, p.weights, p.offsets, mode=self.pooling, include_last_offset=True
            )
            for p in pulled.tables
        ]

    def push(self, pulled: PulledBatch, labels: Any) -> None:
        """Pushes gradients (after backward) and show/click to the store.

        Args:
            pulled: the batch as :meth:`pull` returned it and :meth:`forward` used it.
            labels: (batch,) click labels (0/1 or weights), any real dtype.
        """
        labels = torch.as_tensor(labels).detach().to("cpu", torch.float32).reshape(-1)
        if labels.numel() != pulled.batch:
            raise InvalidInput(f"labels: expected {pulled.batch} values, got {labels.numel()}")
        rows = torch.arange(pulled.batch)
        for p in pulled.tables:
            u = p.keys.numel()
            if u == 0:
                continue
            grad = p.weights.grad
            if grad is None:
                grad = torch.zeros_like(p.weights)
            lengths = p.offsets[1:] - p.offsets[:-1]
            row_of_value = torch.repeat_interleave(rows, lengths)
            shows = torch.bincount(p.inverse, minlength=u).to(torch.float32)
            clicks = torch.zeros(u).index_add_(0, p.inverse, labels[row_of_value])
            self.store.push(p.table, p.keys, grad.detach().contiguous(), shows, clicks)
            p.weights.grad = None
