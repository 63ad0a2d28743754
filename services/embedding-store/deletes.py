"""Rows deleted from a table: why (:class:`DeleteReason`) and which keys since the last save
that serving reads (:class:`DeletedKeys`).

A serving copy of a table (a serving Redis, a model rebuilt from base + deltas) only learns
that a key is gone when a delta says so. So every row a store deletes is recorded, per
table, until the next base or delta save: a base clears the record (it replaces what serving
holds), a delta carries the keys as deletes (``<table>.delta.deleted.npy`` beside its rows,
HDELs in the serving Redis's transaction) and clears it. Checkpoints keep the record
(``<table>.deleted.npy``), so a store restarted from one still carries it::

    shrink deletes 7, 9      record {7, 9}
    erase 12                 record {7, 9, 12}
    delta save               writes rows changed since, deletes {7, 9, 12}; record {}
    shrink deletes 3         record {3}
    base save                writes every row kept; record {}
"""

from __future__ import annotations

import threading
from enum import StrEnum

import torch


class DeleteReason(StrEnum):
    """Why rows were deleted: the ``reason`` label of ``rows_deleted_total``."""

    #: the day-end shrink: score under ``delete_threshold`` or unseen too long
    SHRINK = "shrink"
    #: an explicit ``EmbeddingStore.erase``
    ERASE = "erase"
    #: a loaded delta said the rows were deleted where it was saved
    DELTA_LOAD = "delta_load"
    #: the job's namespace was dropped from a shard (its whole store)
    NAMESPACE_DROP = "namespace_drop"


def _empty() -> torch.Tensor:
    return torch.zeros(0, dtype=torch.int64)


class DeletedKeys:
    """The keys of one table deleted since its last base or delta save (see the module doc).

    The store changes it under the table's write lock; an own lock keeps a read from a
    scrape (``len``) safe. Keys are kept as the tensors recorded and merged (sorted, unique)
    when read, so a shrink deleting millions of rows costs one tensor append.
    """

    def __init__(self) -> None:
        self._parts: list[torch.Tensor] = []
        self._merged = True  # _parts is one sorted, unique tensor (or none)
        self._lock = threading.Lock()

    def add(self, keys: torch.Tensor) -> None:
        """Records ``keys`` (n,) int64 (any device; repeats and keys already held are fine)."""
        if keys.numel():
            part = keys.detach().to("cpu", torch.int64).reshape(-1).clone()
            with self._lock:
                self._parts.append(part)
                self._merged = False

    def keys(self) -> torch.Tensor:
        """The keys recorded, (m,) int64, sorted and unique."""
        with self._lock:
            return self._merge().clone()

    def _merge(self) -> torch.Tensor:
        if not self._parts:
            return _empty()
        if not self._merged:
            self._parts = [torch.unique(torch.cat(self._parts))]  # sorted
            self._merged = True
        return self._parts[0]

    def take(self) -> torch.Tensor:
        """:meth:`keys`, and the record cleared (a base or delta save; :meth:`add` them back
        when the save fails)."""
        with self._lock:
            out = self._merge()
            self._parts, self._merged = [], True
        return out

    def replace(self, keys: torch.Tensor) -> None:
        """The record becomes ``keys`` (n,) int64 (a checkpoint's, loaded)."""
        with self._lock:
            self._parts, self._merged = [], True
        self.add(keys)

    def __len__(self) -> int:
        with self._lock:
            return int(self._merge().numel())
