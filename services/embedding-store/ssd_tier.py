"""The ssd tier: a table's rows in a file, a host table as write-back RAM cache (OneEmbedding's).

The file ``<persistent_path>/<table>/rows.f32`` holds up to ``capacity`` rows; a RAM hash
index maps key -> file slot. The cache is a
:class:`~streamrec.embedding_store.host_tier.HostTable`, used only through its public
methods.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.errors import CapacityExceeded, InvalidInput
from streamrec.embedding_store.host_tier import HostTable
from streamrec.embedding_store.tier import MAX_LOAD, MIN_ROWS, TableTier, index_slots
from streamrec.store_schema import TableOptions


class SsdTable(TableTier):
    """Rows in a file under ``persistent_path``, a :class:`HostTable` as write-back RAM cache.

    The file ``<persistent_path>/<table>/rows.f32`` holds ``capacity`` rows of ``width``
    float32 (a sparse file, allocated as rows arrive); a RAM index maps key -> file slot. The
    cache holds at most ``cache_budget_mb`` MiB of rows (row, key and index bytes); when a
    batch needs room, the least recently used rows not in the batch are written back and
    dropped. Every lookup counts a cache hit or miss. The file is a working area, not a
    checkpoint (it is removed on close): use ``save``/``load`` to keep a table.

    Args:
        options: the table.
        seed: the store's initializer seed.
        capacity: most rows of the table.
        cache_budget_mb: RAM for the cache, MiB.
        persistent_path: directory for the file.
    """

    _CHUNK = 1 << 18

    def __init__(
        self,
        options: TableOptions,
        seed: int,
        capacity: int | None,
        cache_budget_mb: float | None,
        persistent_path: str | None,
    ) -> None:
        super().__init__(options, seed)
        if capacity is None or cache_budget_mb is None or persistent_path is None:
            raise InvalidInput("tier 'ssd' needs capacity, cache_budget_mb and persistent_path")
        self.capacity = int(capacity)
        row_bytes = self.width * 4 + 8 + 32  # row, key, index slots at half load
        self.cache_rows = max(int(cache_budget_mb * 2**20 // row_bytes), 16)
        self.cache = HostTable(options, seed, capacity=self.cache_rows, track_use=True)
        self.cache.counters = self.counters  # one set of counters for the table
        self.dir = Path(persistent_path) / options.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            import fcntl

            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            raise InvalidInput(
                f"persistent_path {str(self.dir)!r} is in use by another store"
            ) from exc
        self.path = self.dir / "rows.f32"
        # the file's mapping is ours, so close() can release it before unlinking the file
        with open(self.path, "w+b") as f:
            f.truncate(self.capacity * self.width * 4)
            self._mapping = mmap.mmap(f.fileno(), self.capacity * self.width * 4)
        #: (capacity, width) float32 rows on file, a view of the mapping
        self._file = np.ndarray((self.capacity, self.width), np.float32, buffer=self._mapping)
        self._slot_key = np.zeros(self.capacity, dtype=np.int64)
        self._occupied = np.zeros(self.capacity, dtype=bool)
        self._free: list[np.ndarray] = []
        self._next_slot = 0
        self._total = 0  # distinct keys in cache or file
        self._tick = 0
        self._new_index(MIN_ROWS)

    # -- file side ------------------------------------------------------------------------
    def _new_index(self, rows: int) -> None:
        self._fslots = _C.index_build(index_slots(rows), torch.empty(0, dtype=torch.int64))

    def _file_rows(self) -> int:
        return int(self._occupied[: self._next_slot].sum())

    def _file_find(self, keys: torch.Tensor) -> torch.Tensor:
        return _C.find(self._fslots, keys)

    def _alloc(self, n: int) -> np.ndarray:
        out = []
        while n and self._free:
            take = self._free.pop()
            if take.size > n:
                self._free.append(take[n:])
                take = take[:n]
            out.append(take)
            n -= take.size
        if n:
            if self._next_slot + n > self.capacity:
                raise CapacityExceeded(
                    f"table {self.options.name!r}: the ssd file is full ({self.capacity} rows)"
                )
            out.append(np.arange(self._next_slot, self._next_slot + n, dtype=np.int64))
            self._next_slot += n
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def _write_back(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Writes full rows of keys to their file slots, allocating slots for new keys."""
        if keys.numel() == 0:
            return
        slots = self._file_find(keys).numpy().copy()
        new = slots < 0
        if new.any():
            fresh = self._alloc(int(new.sum()))
            slots[new] = fresh
            need = self._file_rows() + fresh.size
            if need > MAX_LOAD * self._fslots.shape[0]:
                self._rebuild_file_index(need)
            _C.insert_or_assign(
                self._fslots, keys[torch.from_numpy(new)].contiguous(), torch.from_numpy(fresh)
            )
            self._slot_key[fresh] = keys.numpy()[new]
            self._occupied[fresh] = True
        order = np.argsort(slots)  # sequential writes
        self._file[slots[order]] = rows.numpy()[order]

    def _rebuild_file_index(self, rows: int) -> None:
        self._new_index(rows)
        occ = np.flatnonzero(self._occupied[: self._next_slot])
        _C.insert_or_assign(
            self._fslots, torch.from_numpy(self._slot_key[occ]), torch.from_numpy(occ)
        )

    def _flush(self, clear: bool) -> None:
        """Writes every cached row back; drops them from the cache when ``clear``."""
        keys, rows = self.cache.contents()
        self._write_back(keys.clone(), rows)
        if clear:
            self.cache.reset()

    def _chunks(self) -> Iterator[tuple[int, torch.Tensor, np.ndarray]]:
        """(start, rows (b, width) view of the file, occupied (b,) bool) per chunk."""
        for a in range(0, self._next_slot, self._CHUNK):
            b = min(a + self._CHUNK, self._next_slot)
            yield a, torch.from_numpy(self._file[a:b]), self._occupied[a:b]

    # -- cache side -----------------------------------------------------------------------
    def _make_room(self, incoming: int, keep: torch.Tensor) -> None:
        """Evicts least recently used rows (not ``keep``, rows of the current batch) so that
        ``incoming`` more rows fit in the cache."""
        if incoming > self.cache_rows:
            raise CapacityExceeded(
                f"table {self.options.name!r}: a batch of {incoming} keys needs more than the "
                f"cache's {self.cache_rows} rows; raise cache_budget_mb"
            )
        size = self.cache.size()
        if size + incoming <= self.cache_rows:
            return
        # evict down to leave a quarter of the cache free, so evictions come in batches
        target = max(self.cache_rows - max(incoming, self.cache_rows // 4), 0)
        victims = self.cache.least_used(size - target, keep)
        self._write_back(*self.cache.take(victims))
        self.cache.drop_rows(victims)

    def _bring(
        self,
        keys: torch.Tensor,
        create: bool,
        admit: bool = True,
        shows: torch.Tensor | None = None,
        clicks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Cache rows of keys ((n,) int64 unique), loading them from the file and creating
        absent ones when ``create`` (shows, clicks (n,) of a push for admission by score);
        -1 for keys left absent."""
        self._tick += 1
        rows = self.cache.find(keys)
        miss = rows < 0
        n_miss = int(miss.sum())
        self.counters["cache_hits"] += keys.numel() - n_miss
        self.counters["cache_misses"] += n_miss
        if n_miss:
            mk = keys[miss]
            slots = self._file_find(mk)
            on_file = slots >= 0
            absent = mk[~on_file]
            if create and absent.numel() and self._total + absent.numel() > self.capacity:
                raise CapacityExceeded(
                    f"table {self.options.name!r}: {absent.numel()} new rows would exceed "
                    f"capacity {self.capacity} (holds {self._total})"
                )
            incoming = int(on_file.sum()) + (absent.numel() if create else 0)
            self._make_room(incoming, rows[~miss])
            if bool(on_file.any()):
                fk = mk[on_file]
                fs = slots[on_file].numpy()
                self.cache.import_rows(fk, torch.from_numpy(self._file[fs]))
            if create and absent.numel():
                before = self.cache.size()
                if admit:
                    where = miss.clone()
                    where[miss] = ~on_file
                    self.cache.create(
                        absent,
                        None if shows is None else shows[where],
                        None if clicks is None else clicks[where],
                    )
                else:
                    self.cache.find_or_insert(absent)
                self._total += self.cache.size() - before
            rows = self.cache.find(keys)
        self.cache.mark_used(rows[rows >= 0], self._tick)
        return rows

    # -- the tier interface ---------------------------------------------------------------
    def _batches(self, n: int) -> Iterator[slice]:
        """Slices of at most half the cache, so that one batch always fits."""
        step = max(self.cache_rows // 2, 1)
        for a in range(0, n, step):
            yield slice(a, min(a + step, n))

    def pull(self, keys: torch.Tensor, create: bool, hint: object = None) -> torch.Tensor:
        uniq, inverse = _C.unique(keys)
        out = torch.empty(uniq.numel(), self.dim)
        for sl in self._batches(uniq.numel()):
            rows = self._bring(uniq[sl], create)
            out[sl] = self.cache.gather(rows)
        return out.index_select(0, inverse)

    def push(
        self, keys: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> bool:
        if _C.unique(keys)[0].numel() != keys.numel():
            return False
        for sl in self._batches(keys.numel()):
            rows = self._bring(keys[sl], True, True, shows[sl], clicks[sl])
            self.cache.update_rows(
                rows, grads[sl].contiguous(), shows[sl].contiguous(), clicks[sl].contiguous()
            )
        return True

    def size(self) -> int:
        return self._total

    def inspect(self, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        full = torch.zeros(keys.numel(), self.width)
        rows = self.cache.find(keys)
        hit = rows >= 0
        full[hit] = self.cache.take(rows[hit])[1]
        slots = self._file_find(keys)
        on_file = (~hit) & (slots >= 0)
        if bool(on_file.any()):
            full[on_file] = torch.from_numpy(self._file[slots[on_file].numpy()])
        present = torch.where(hit | on_file, 0, -1)
        return self._stats_of(present, full)

    def advance_day(self) -> None:
        self.cache.advance_day()
        for _a, rows, _occ in self._chunks():
            rows[:, _C.UNSEEN] += 1  # free slots too: they are rewritten before reuse

    def shrink(self) -> int:
        self._flush(clear=True)
        deleted = 0
        for a, rows, occ in self._chunks():
            keep = _C.shrink(rows, rows.shape[0], self.params).numpy()
            gone = np.flatnonzero(occ & ~keep) + a
            if gone.size:
                self._occupied[gone] = False
                self._free.append(gone)
                deleted += gone.size
        if deleted:
            self._rebuild_file_index(max(self._file_rows(), MIN_ROWS))
        self._total -= deleted
        self.counters["rows_deleted"] += deleted
        return deleted

    def export(self, select: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._flush(clear=False)
        keys, rows = [], []
        for a, chunk, occ in self._chunks():
            sel = _C.select_rows(chunk, chunk.shape[0], select, self.params).numpy() & occ
            idx = np.flatnonzero(sel)
            keys.append(torch.from_numpy(self._slot_key[idx + a]))
            rows.append(chunk[torch.from_numpy(idx)].clone())
        if not keys:
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0, self.width)
        return torch.cat(keys), torch.cat(rows)

    def clear_dirty(self) -> None:
        self.cache.clear_dirty()
        for _a, chunk, _occ in self._chunks():
            _C.clear_dirty(chunk, chunk.shape[0])

    def mark_dirty(self, keys: torch.Tensor) -> None:
        self._flush(clear=True)
        slots = self._file_find(keys).numpy()
        slots = slots[slots >= 0]
        flags = self._file[slots, _C.FLAGS].astype(np.int64) | _C.FLAG_DIRTY
        self._file[slots, _C.FLAGS] = flags.astype(np.float32)

    def import_rows(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        if rows.dim() != 2 or rows.shape != (keys.numel(), self.width):
            raise InvalidInput(
                f"table {self.options.name!r}: rows must be ({keys.numel()}, {self.width}), "
                f"got {tuple(rows.shape)}"
            )
        self._flush(clear=True)
        new = int((self._file_find(keys) < 0).sum())
        if self._total + new > self.capacity:
            raise CapacityExceeded(
                f"table {self.options.name!r}: loading {new} new rows would exceed capacity "
                f"{self.capacity}"
            )
        self._write_back(keys, rows.to(torch.float32).contiguous())
        self._total += new

    def import_weights(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        for sl in self._batches(keys.numel()):
            self._bring(keys[sl], create=True, admit=False)
            self.cache.import_weights(keys[sl], values[sl])

    def reset(self) -> None:
        self.cache.reset()
        self._occupied[:] = False
        self._free = []
        self._next_slot = 0
        self._total = 0
        self._new_index(MIN_ROWS)

    def bytes_used(self) -> dict[str, int]:
        host = self.cache.bytes_used()["host"] + self._fslots.numel() * 8
        host += self._slot_key.nbytes + self._occupied.nbytes
        return {"host": int(host), "ssd": int(self._next_slot * self.width * 4)}

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["rows_by_tier"] = {"host": self.cache.size(), "ssd": self._file_rows()}
        s["cache_rows_max"] = self.cache_rows
        return s

    def close(self) -> None:
        self.cache.close()
        if not self._mapping.closed:
            # no view may outlive the mapping: an access after close finds no rows
            self._file = np.empty((0, self.width), np.float32)
            self._mapping.close()
            self.path.unlink(missing_ok=True)
            os.close(self._lock_fd)
