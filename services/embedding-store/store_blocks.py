"""The in-process store's block ops: every table of a batch in one call each way.

:meth:`BlockRows.pull_rows` and :meth:`BlockRows.push_rows` (:class:`SparseStore`'s, the
trainer's one pull and one push per batch, laid out as in
:mod:`~streamrec.embedding_store.sparse_store`) take the fast path the tables allow:

- every table a plain host table: one C++ gather (or update) for the whole block under the
  tables' locks, taken in name order; a table with keys to create is then created alone;
- every table on one device (tier device): the block's kernels once for all its tables
  (:mod:`~streamrec.embedding_store.tiers.device_block`), no wait for the device;
- otherwise a table at a time (:class:`~streamrec.embedding_store.sparse_store.RowsFromTables`).

:class:`BlockRows` is a base of :class:`~streamrec.embedding_store.store.EmbeddingStore`, whose
tables, locks and counters it works on (declared below; the store sets them).
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import cast

import torch
from streamrec.embedding_store.locks import RWLock, all_locked
from streamrec.embedding_store.push_check import PushDefaults
from streamrec.embedding_store.sparse_store import RowsFromTables, checked_block
from streamrec.embedding_store.tiers.device_block import DeviceBlocks
from streamrec.embedding_store.tiers.device_table import DeviceTable
from streamrec.embedding_store.tiers.host_table import HostTable, push_block, read_block
from streamrec.embedding_store.tiers.table_tier import TableTier
from streamrec.embedding_store.validation import FloatsLike, KeysLike, as_floats, push_faults
from streamrec.store_schema import TableOptions


class BlockRows(RowsFromTables):
    """``pull_rows``/``push_rows`` of the in-process store over its tables' tiers and locks."""

    # the store's state these ops work on (EmbeddingStore.__init__ sets every one)
    _tiers: dict[str, TableTier]
    _locks: dict[str, RWLock]
    _counts: dict[str, dict[str, int]]
    _count_lock: threading.Lock
    _push_defaults: PushDefaults
    #: the block ops of device tables, per device (device_block.py)
    _device_blocks: dict[torch.device, DeviceBlocks]
    _closed: bool

    # the store's own calls these ops build on (checked_block, the table-at-a-time fallback)
    @property
    @abstractmethod
    def tables(self) -> dict[str, TableOptions]: ...

    @abstractmethod
    def resident_device(self) -> torch.device | None: ...

    @abstractmethod
    def pull_many(
        self,
        tables: Sequence[str],
        keys: Sequence[KeysLike],
        create: bool = True,
        *,
        device: torch.device | str | None,
    ) -> list[torch.Tensor]: ...

    @abstractmethod
    def push_many(
        self,
        tables: Sequence[str],
        keys: Sequence[KeysLike],
        grads: Sequence[FloatsLike],
        shows: Sequence[FloatsLike | None] | None = None,
        clicks: Sequence[FloatsLike | None] | None = None,
    ) -> None: ...

    def pull_rows(
        self, tables: list[str], keys: KeysLike, counts: list[int], create: bool = True
    ) -> torch.Tensor:
        """:meth:`SparseStore.pull_rows`. Tables all in host memory: one C++ gather for the
        block under the tables' shared locks; a table with absent keys to create is then
        pulled alone (:meth:`pull`). Tables all on one device (tier device): the block's
        kernels once for every table, under their exclusive locks, no wait for the device
        (:mod:`~streamrec.embedding_store.tiers.device_block`); the rows stay on that device."""
        on_device = self._device_tiers(tables)
        if on_device is not None:
            keys_t, _dim, sizes = checked_block(self, tables, keys, counts)
            self._count_keys("pull_keys", tables, sizes)
            with self._tables_locked(tables, write=True):
                return self._blocks(on_device).pull(on_device, keys_t, sizes, create)
        tiers = self._host_tiers(tables)
        if tiers is None:
            return super().pull_rows(tables, keys, counts, create)
        keys_t, _dim, sizes = checked_block(self, tables, keys, counts)
        self._count_keys("pull_keys", tables, sizes)
        with self._tables_locked(tables, write=False):
            epochs = {t: self._locks[t].epoch for t in tables}
            out, hints = read_block(tiers, keys_t, sizes, create)
        at = 0
        for table, tier, size, hint in zip(tables, tiers, sizes, hints, strict=True):
            if hint is not None:  # absent keys to create: as _pull_host does after its read
                lock, part = self._locks[table], out[at : at + size]
                with lock.write():
                    # the hint holds what the read found; valid only if nothing was written
                    valid = lock.epoch == epochs[table] + 1
                    got = tier.pull(keys_t[at : at + size], True, hint if valid else None)
                if got.data_ptr() != part.data_ptr():
                    part.copy_(got)
            at += size
        return out

    def push_rows(
        self,
        tables: list[str],
        keys: KeysLike,
        counts: list[int],
        grads: FloatsLike,
        shows: FloatsLike | None = None,
        clicks: FloatsLike | None = None,
    ) -> None:
        """:meth:`SparseStore.push_rows`. Tables all in host memory: the block checked whole,
        then one C++ update under the tables' exclusive locks. A block with a bad value goes
        table by table (:meth:`push_many`), whose error names the table. Tables all on one
        device: the block's kernels once for every table, no wait for the device; its values
        are checked there first (a bad one writes nothing to any table and is raised, naming
        the table, by that table's next call that synchronises: ``size``, ``stats``, ...)."""
        on_device = self._device_tiers(tables)
        if on_device is not None:
            keys_t, dim, sizes = checked_block(self, tables, keys, counts)
            n, device = keys_t.numel(), on_device[0].device
            g = as_floats(grads, "grads", (n, dim), device)
            s = None if shows is None else as_floats(shows, "shows", (n,), device)
            c = None if clicks is None else as_floats(clicks, "clicks", (n,), device)
            self._count_keys("push_keys", tables, sizes)
            with self._tables_locked(tables, write=True):
                self._blocks(on_device).push(on_device, keys_t, sizes, g, s, c)
            return None
        tiers = self._host_tiers(tables)
        if tiers is None:
            return super().push_rows(tables, keys, counts, grads, shows, clicks)
        keys_t, dim, sizes = checked_block(self, tables, keys, counts)
        n = keys_t.numel()
        g = as_floats(grads, "grads", (n, dim))
        s = (
            self._push_defaults.constant(1.0, n)
            if shows is None
            else as_floats(shows, "shows", (n,))
        )
        c = (
            self._push_defaults.constant(0.0, n)
            if clicks is None
            else as_floats(clicks, "clicks", (n,))
        )
        if push_faults(g, s, c) != (0, 0):
            return super().push_rows(tables, keys, counts, grads, shows, clicks)
        self._count_keys("push_keys", tables, sizes)
        with self._tables_locked(tables, write=True):
            push_block(tiers, keys_t, sizes, g, s, c)
        return None

    def _host_tiers(self, tables: list[str]) -> list[HostTable] | None:
        """The tiers of ``tables`` when every one is a plain host table (the block's one C++
        call each way); None otherwise, or for an unknown table (refused by the caller)."""
        tiers = [self._tiers.get(t) for t in tables] if not self._closed else []
        if not tiers or any(t is None or t.block_group != "host" for t in tiers):
            return None
        return cast(list[HostTable], tiers)

    def _device_tiers(self, tables: list[str]) -> list[DeviceTable] | None:
        """The tiers of ``tables`` when every one is a device table on one device (the block
        ops); None otherwise, or for an unknown table (refused by the caller)."""
        tiers = [self._tiers.get(t) for t in tables] if not self._closed else []
        if not tiers or any(t is None or t.block_group != "device" for t in tiers):
            return None
        on_device = cast(list[DeviceTable], tiers)
        return on_device if len({t.device for t in on_device}) == 1 else None

    def _blocks(self, tiers: list[DeviceTable]) -> DeviceBlocks:
        device = tiers[0].device
        blocks = self._device_blocks.get(device)
        if blocks is None:
            blocks = self._device_blocks.setdefault(device, DeviceBlocks(device))
        return blocks

    def _count_keys(self, counter: str, tables: list[str], sizes: list[int]) -> None:
        with self._count_lock:
            for table, size in zip(tables, sizes, strict=True):
                self._counts[table][counter] += size

    def _tables_locked(self, tables: list[str], write: bool) -> AbstractContextManager[None]:
        """Every one of ``tables``' locks, taken in name order (a fixed order: two blocks
        cannot each hold a lock the other waits for)."""
        return all_locked([self._locks[t] for t in sorted(set(tables))], write)
