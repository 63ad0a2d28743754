"""``SparseStore``: the embedding store as its users (the trainer) see it, whatever serves it.

Two classes implement it: :class:`~streamrec.embedding_store.EmbeddingStore`, the
in-process store (host memory, SSD, or every row on a GPU with ``tier="device"``), and
:class:`~streamrec.embedding_store.EmbeddingStoreClient`, the client of the shard processes.
Code that takes "a store" types it as ``SparseStore`` and calls these methods only; mypy
checks both classes against it where the trainer makes its store (``trainer/store.py``).

The trainer's fused path sends every table of a batch as one block of keys, table-major::

    tables  ["t0", "t1"]        counts [2, 1]
    keys    [7, 3, 9]           (n,) int64: 7 and 3 of t0, then 9 of t1
    rows    (3, dim) float32    row i the row of keys[i] in its table (one dim for all)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from streamrec.embedding_store.errors import InvalidInput, UnknownTable
from streamrec.embedding_store.validation import (
    FloatsLike,
    KeysLike,
    as_floats,
    as_keys,
    check_aligned,
)
from streamrec.save_modes import SaveMode
from streamrec.store_schema import TableOptions


class SparseStore(Protocol):
    """Pull/push of rows, day and shrink upkeep, saves and shard restarts of one store."""

    @property
    def tables(self) -> dict[str, TableOptions]:
        """Table name -> options."""
        ...

    def pull_rows(
        self, tables: list[str], keys: KeysLike, counts: list[int], create: bool = True
    ) -> torch.Tensor:
        """Rows (n, dim) float32 of ``keys`` (n,) int64, ``counts[t]`` of ``tables[t]``, on
        :meth:`resident_device` (else the CPU); ``create`` False reads absent keys as zeros."""
        ...

    def push_rows(
        self,
        tables: list[str],
        keys: KeysLike,
        counts: list[int],
        grads: FloatsLike,
        shows: FloatsLike | None = None,
        clicks: FloatsLike | None = None,
    ) -> None:
        """Gradients (n, dim), shows and clicks (n,) float32 of keys laid out as in
        :meth:`pull_rows`; a NaN/Inf anywhere refuses the whole push."""
        ...

    def resident_device(self) -> torch.device | None:
        """The GPU the rows live on (pulled there with no host copy), or None."""
        ...

    def size(self, table: str) -> int:
        """Rows held by ``table`` (over every shard)."""
        ...

    def advance_day(self) -> None:
        """One more unseen day for every row."""
        ...

    def shrink(self) -> dict[str, int]:
        """Decay and delete; rows deleted per table."""
        ...

    def stats(self) -> dict[str, Any]:
        """JSON-able statistics (the client's: ``shards`` per shard, ``total``)."""
        ...

    def save(
        self, path: str, mode: SaveMode = SaveMode.CHECKPOINT, converter: str | None = None
    ) -> dict[str, Any]:
        """Saves every row ``mode`` selects under ``path``; returns what was written."""
        ...

    def load(self, path: str, converter: str | None = None) -> object:
        """Loads a save of the same store layout; a bad one changes nothing."""
        ...

    def accept_restarts(self, incarnations: list[int | None] | None = None) -> list[str]:
        """Serves shards restarted empty again; their endpoints (none in-process)."""
        ...

    def incarnations(self) -> list[int | None]:
        """Each shard's incarnation this store expects (none in-process)."""
        ...

    def close(self) -> None:
        """Releases what the store holds; it is unusable afterwards."""
        ...


class _TableAtATime(Protocol):
    """What :class:`RowsFromTables` builds the block methods on."""

    @property
    def tables(self) -> dict[str, TableOptions]: ...

    def resident_device(self) -> torch.device | None: ...

    def pull_many(
        self,
        tables: Sequence[str],
        keys: Sequence[KeysLike],
        create: bool = True,
        *,
        device: torch.device | str | None,
    ) -> list[torch.Tensor]: ...

    def push_many(
        self,
        tables: Sequence[str],
        keys: Sequence[KeysLike],
        grads: Sequence[FloatsLike],
        shows: Sequence[FloatsLike | None] | None = None,
        clicks: Sequence[FloatsLike | None] | None = None,
    ) -> None: ...


class RowsFromTables:
    """:meth:`SparseStore.pull_rows`/``push_rows`` of a store that takes one array per table
    (the in-process store): the block split by ``counts`` (views), no per-key work."""

    def pull_rows(
        self: _TableAtATime,
        tables: list[str],
        keys: KeysLike,
        counts: list[int],
        create: bool = True,
    ) -> torch.Tensor:
        """:meth:`SparseStore.pull_rows`: gathered on :meth:`resident_device`, no host copy."""
        keys_t, dim, sizes = checked_block(self, tables, keys, counts)
        device = self.resident_device()
        parts = self.pull_many(tables, keys_t.split(sizes), create, device=device)
        return torch.cat(parts) if parts else torch.zeros(0, dim, device=device)

    def push_rows(
        self: _TableAtATime,
        tables: list[str],
        keys: KeysLike,
        counts: list[int],
        grads: FloatsLike,
        shows: FloatsLike | None = None,
        clicks: FloatsLike | None = None,
    ) -> None:
        """:meth:`SparseStore.push_rows`: tables without keys are left out; gradients on
        :meth:`resident_device` stay there."""
        keys_t, dim, sizes = checked_block(self, tables, keys, counts)
        n, device = keys_t.numel(), self.resident_device()
        used = [t for t, size in enumerate(sizes) if size]
        k, g = keys_t.split(sizes), as_floats(grads, "grads", (n, dim), device).split(sizes)
        s, c = (
            None if v is None else as_floats(v, name, (n,), device).split(sizes)
            for name, v in (("shows", shows), ("clicks", clicks))
        )
        self.push_many(
            [tables[t] for t in used],
            [k[t] for t in used],
            [g[t] for t in used],
            None if s is None else [s[t] for t in used],
            None if c is None else [c[t] for t in used],
        )


def checked_block(
    store: _TableAtATime, tables: list[str], keys: KeysLike, counts: list[int]
) -> tuple[torch.Tensor, int, list[int]]:
    """(keys (n,) int64, dim, counts as ints) of a checked block of ``store``'s tables."""
    check_aligned(tables, counts=counts)
    keys_t = as_keys(keys)
    known = store.tables
    for t in tables:
        if t not in known:
            raise UnknownTable(f"unknown table {t!r}; tables: {sorted(known)}")
    dim = check_rows_layout(tables, keys_t, counts, {known[t].checked_dim() for t in tables})
    return keys_t, dim, [int(c) for c in counts]


def check_rows_layout(
    tables: Sequence[str], keys: torch.Tensor, counts: Sequence[int], dims: set[int]
) -> int:
    """Checks a block of rows (see the module doc) and returns its dim (0 with no tables).

    Raises:
        InvalidInput: the tables differ in dim, or ``counts`` are not T ints >= 0 summing
            to the number of keys.
    """
    if len(dims) > 1:
        raise InvalidInput(f"tables must share one dim for one block of rows, got {dims}")
    if (
        len(counts) != len(tables)
        or sum(counts) != keys.numel()
        or any(not isinstance(c, int | np.integer) or isinstance(c, bool) or c < 0 for c in counts)
    ):
        raise InvalidInput(
            f"counts must be {len(tables)} ints >= 0 summing to the {keys.numel()} keys, got "
            f"{list(counts)!r:.200}"
        )
    return dims.pop() if dims else 0
