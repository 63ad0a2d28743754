"""The ssd tier's file side: a compact key -> slot index and the records of a table on file.

A record is ``[key (two float32 words holding its int64 bits), row (width float32)]``, so the
file says which key each record holds (export and shrink read keys from it; RAM holds only
the index). A freed record (shrink) has flags -1 and goes to a free list. Records are read
by ``pread`` (a read fault of a mapping maps the pages around it too: ~75 KiB a random row,
measured) and written through a shared mapping of the file (a random 88-byte row: 0.3 us
there, 39 us by ``pwrite``), in slot order (one sorted pass per call). A MAP_SHARED page is
the page cache's own (counted in RssFile, not RssAnon), and the pages this process maps are
dropped with MADV_DONTNEED (contents kept in the page cache or on disk) once it maps more
than ``resident_bytes`` of file (measured in /proc/self/statm), so the file's resident share
stays bounded.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.disk import pread_into
from streamrec.embedding_store.errors import CapacityExceeded, InvalidInput

#: the compact index is resized larger before more than this share of its slots is taken
LOAD = 0.8
#: int32 values: the most rows (file slots, cache rows) the index can name
MAX_SLOTS = 2**31 - 1
#: words of a record before its row (the key's int64 bits)
KEY_WORDS = 2
_PAGE = 4096


def file_backed_bytes() -> int:
    """Resident file-backed (and shared) memory of this process, bytes (/proc/self/statm)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[2]) * _PAGE


class CompactIndex:
    """A key -> value index in C++ (ops ``compact_*``): keys (cap,) int64 and vals (cap,) int32
    (-1 empty), 12 bytes a slot, at most :data:`LOAD` full (15 bytes a key), linear probing,
    erase by backward shift. Grows (a rebuild) as keys are added.

    Args:
        rows: keys to make room for now.
    """

    def __init__(self, rows: int) -> None:
        self._make(rows)

    def _make(self, rows: int) -> None:
        cap = max(int(rows / LOAD) + 1, 16)
        self.keys = torch.empty(cap, dtype=torch.int64)  # read only where vals >= 0
        self.vals = torch.full((cap,), -1, dtype=torch.int32)
        self.size = 0

    @property
    def capacity(self) -> int:
        return self.keys.numel()

    def find(self, keys: torch.Tensor) -> torch.Tensor:
        """Value (n,) int64 per key, -1 where absent. keys: (n,) int64."""
        return _C.compact_find(self.keys, self.vals, keys)[0]

    def find_count(self, keys: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(value (n,) int64 per key, -1 where absent; the number absent)."""
        return _C.compact_find(self.keys, self.vals, keys)

    def assign(self, keys: torch.Tensor, vals: torch.Tensor) -> None:
        """Sets key -> val. keys: (m,) int64; vals: (m,) int64 in [0, 2^31)."""
        if self.size + keys.numel() > LOAD * self.capacity:
            self.resize(max(2 * self.size, self.size + keys.numel()))
        self.size += _C.compact_assign(self.keys, self.vals, keys, vals)

    def erase(self, keys: torch.Tensor) -> None:
        """Removes keys (m,) int64; absent ones are ignored."""
        self.size -= _C.compact_erase(self.keys, self.vals, keys)

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (size,) int64 and their values (size,) int64."""
        live = self.vals >= 0
        return self.keys[live], self.vals[live].to(torch.int64)

    def resize(self, rows: int) -> None:
        """Rebuilds the index with room for ``rows`` keys (at least its size)."""
        keys, vals = self.items()
        self._make(max(rows, keys.numel()))
        self.size = _C.compact_assign(self.keys, self.vals, keys, vals)

    def nbytes(self) -> int:
        return self.capacity * 12


class RowFile:
    """Records of one table in a file of ``capacity`` records (sparse: blocks are allocated as
    records are written), with the compact index key -> slot.

    Args:
        path: the file (created, truncated).
        capacity: most records.
        width: floats of a row.
        counters: the table's counters; ``cache_disk_read_bytes`` and
            ``cache_disk_written_bytes`` are added to.
        resident_bytes: mapped file pages this process keeps before dropping them.
    """

    CHUNK = 1 << 18
    _WRITE_PIECE = 1 << 14
    _PWRITE_BYTES = 8 << 20
    _RESERVE_BYTES = 256 << 20

    def __init__(
        self,
        path: Path,
        capacity: int,
        width: int,
        counters: dict[str, int],
        resident_bytes: int = 1 << 30,
    ) -> None:
        if not 1 <= capacity <= MAX_SLOTS:
            raise InvalidInput(f"capacity must be in [1, {MAX_SLOTS}] rows, got {capacity}")
        self.path = path
        self.capacity = capacity
        self.width = width
        self.record_bytes = 4 * (width + KEY_WORDS)
        self.counters = counters
        self.resident_bytes = resident_bytes
        size = capacity * self.record_bytes
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(self._fd, size)
            self._mapping = mmap.mmap(self._fd, size)
        except BaseException:
            os.close(self._fd)
            raise
        #: (capacity, KEY_WORDS + width) float32, a view of the mapping
        self.records = torch.frombuffer(self._mapping, dtype=torch.float32).view(
            capacity, KEY_WORDS + width
        )
        # sized for the capacity at once: no rebuild (and its copies) as the table grows
        self.index = CompactIndex(capacity)
        self.next_slot = 0
        self._free: list[torch.Tensor] = []
        self._base_file_bytes = file_backed_bytes()
        self._reserved = 0  # bytes of the file allocated on disk (fallocate) from its start
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    # -- slots --------------------------------------------------------------------------
    def _alloc(self, n: int) -> torch.Tensor:
        """n free slots (n,) int64: freed ones first, then the append region (ascending)."""
        out = []
        while n and self._free:
            take = self._free.pop()
            if take.numel() > n:
                self._free.append(take[n:])
                take = take[:n]
            out.append(take)
            n -= take.numel()
        if n:
            if self.next_slot + n > self.capacity:
                raise CapacityExceeded(f"the ssd file {str(self.path)!r} is full")
            self._reserve(self.next_slot + n)
            out.append(torch.arange(self.next_slot, self.next_slot + n))
            self.next_slot += n
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)

    def append(self, keys: torch.Tensor) -> torch.Tensor:
        """Free slots (m,) int64 for keys (m,) int64, unique and absent (set in the index)."""
        slots = self._alloc(keys.numel())
        self.index.assign(keys, slots)
        return slots

    def _reserve(self, slots: int) -> None:
        """Allocates the file's blocks (fallocate) through record ``slots``, a step of
        :data:`_RESERVE_BYTES` at a time: a write into a hole of the sparse file costs the
        kernel ~2.4 s a GB here (block allocation), into allocated blocks ~0.2 s."""
        want = slots * self.record_bytes
        if want <= self._reserved:
            return
        end = min(
            -(-want // self._RESERVE_BYTES) * self._RESERVE_BYTES, self.capacity * self.record_bytes
        )
        os.posix_fallocate(self._fd, self._reserved, end - self._reserved)
        self._reserved = end

    def has_free(self) -> bool:
        """Whether freed slots wait for reuse (new records then do not all append)."""
        return bool(self._free)

    def find_or_append(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots (m,) int64, added (m,) bool) of keys (m,) int64, repeats allowed: a key
        absent gets the next append slot at its first occurrence (added there), one probe a
        key. Only while no freed slot waits (:meth:`has_free`); the caller writes the added
        records (:meth:`write_records`, from the old ``next_slot``)."""
        if self.index.size + keys.numel() > LOAD * self.index.capacity:
            self.index.resize(self.index.size + keys.numel())
        slots, added, n = _C.compact_find_or_add(
            self.index.keys, self.index.vals, keys, self.next_slot
        )
        if self.next_slot + n > self.capacity:
            self.index.erase(keys[added])
            raise CapacityExceeded(f"the ssd file {str(self.path)!r} is full")
        self._reserve(self.next_slot + n)
        self.index.size += n
        self.next_slot += n
        return slots, added

    def write_records(self, records: torch.Tensor, first: int) -> None:
        """Writes records (n, KEY_WORDS + width) float32 to slots first, first + 1, ...: by
        ``pwrite``, a few MiB a call (sequential, nothing mapped), on a writer thread while
        the caller goes on (one write in flight; every other access to the file waits for
        it: :meth:`sync`). ``records`` must not change until then."""
        self.sync()
        if records.numel() == 0:
            return
        view = records.contiguous().numpy().data.cast("B")
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="ssd-write")
        self._pending = self._writer.submit(self._pwrite, view, first * self.record_bytes)
        self.counters["cache_disk_written_bytes"] += len(view)

    def _pwrite(self, view: memoryview, at: int) -> None:
        done = 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done : done + self._PWRITE_BYTES], at + done)

    def sync(self) -> None:
        """Waits for the write in flight (:meth:`write_records`); raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def read_chunks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(start, records (b, KEY_WORDS + width)) per chunk of the used slots, read by
        ``pread`` into one buffer reused: a view, valid until the next chunk (nothing
        mapped)."""
        self.sync()
        buf = torch.empty((min(self.CHUNK, self.next_slot), KEY_WORDS + self.width))
        for a in range(0, self.next_slot, self.CHUNK):
            b = min(a + self.CHUNK, self.next_slot)
            view = buf.numpy().data.cast("B")[: (b - a) * self.record_bytes]
            if pread_into(self._fd, view, a * self.record_bytes) < len(view):
                raise OSError(f"reading {str(self.path)!r}: end of file at slot {a}")
            yield a, buf[: b - a]

    def slots_for(self, keys: torch.Tensor) -> torch.Tensor:
        """Slots (m,) int64 of keys (m,) int64 unique, giving absent keys free slots."""
        slots = self.index.find(keys)
        new = slots < 0
        n = int(new.sum())
        if n:
            fresh = self._alloc(n)
            self.index.assign(keys[new], fresh)
            slots[new] = fresh
        return slots

    def free(self, slots: torch.Tensor) -> None:
        """Marks records free (their keys must be erased from the index by the caller)."""
        self.sync()
        self.records[slots, KEY_WORDS + _C.FLAGS] = -1.0
        self._free.append(slots.clone())

    # -- records ------------------------------------------------------------------------
    def _touch(self) -> None:
        """Drops the mapped file pages once this process maps more than ``resident_bytes``
        of file beyond what it mapped at start. Measured (/proc/self/statm), not counted: a
        fault maps a whole folio of the page cache, often far more than the row touched."""
        if file_backed_bytes() - self._base_file_bytes > self.resident_bytes:
            self.drop_resident()

    def drop_resident(self) -> None:
        """Unmaps this process's file pages (their contents stay in the page cache or go to
        disk): RssFile drops, nothing is lost."""
        self._mapping.madvise(mmap.MADV_DONTNEED)
        # what the process maps besides the file now (its code pages grow as it runs)
        self._base_file_bytes = file_backed_bytes()

    def read(self, slots: torch.Tensor, data: torch.Tensor, rows: torch.Tensor) -> None:
        """data[rows[i]] = the row of record slots[i], in slot order. slots, rows: (m,)
        int64; data: (R, width) float32."""
        self.sync()
        order = torch.argsort(slots)
        s = slots[order]
        # pread, not the mapping: a read fault maps the pages around it too (64 KiB and more
        # a row, measured), which would make the mapping's resident pages grow by far more
        # than the rows read
        _C.pread_records(self._fd, self.capacity, s, data, rows[order])
        self.counters["cache_disk_read_bytes"] += s.numel() * self.record_bytes

    def write(
        self,
        data: torch.Tensor,
        row_keys: torch.Tensor,
        rows: torch.Tensor,
        slots: torch.Tensor,
        ordered: bool = False,
    ) -> None:
        """Record slots[i] = [row_keys[rows[i]], data[rows[i]]], in slot order (slots
        already ascending when ``ordered``)."""
        self.sync()
        if ordered or bool((slots[1:] > slots[:-1]).all()):
            s = slots
        else:
            order = torch.argsort(slots)
            s, rows = slots[order], rows[order]
        for a in range(0, s.numel(), self._WRITE_PIECE):  # the bound checked between pieces
            b = a + self._WRITE_PIECE
            _C.rows_to_records(data, row_keys, rows[a:b], self.records, s[a:b])
            self._touch()
        self.counters["cache_disk_written_bytes"] += s.numel() * self.record_bytes

    def full_rows(self, slots: torch.Tensor) -> torch.Tensor:
        """Copies of the rows (m, width) of records ``slots`` (m,) int64."""
        out = torch.empty((slots.numel(), self.width), dtype=torch.float32)
        self.read(slots, out, torch.arange(slots.numel()))
        return out

    def chunks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(start, records (b, KEY_WORDS + width) view) per chunk of the used slots."""
        self.sync()
        for a in range(0, self.next_slot, self.CHUNK):
            b = min(a + self.CHUNK, self.next_slot)
            yield a, self.records[a:b]
            self._touch()

    @staticmethod
    def keys_of(chunk: torch.Tensor) -> torch.Tensor:
        """The keys (b,) int64 of a chunk of records."""
        return chunk[:, :KEY_WORDS].contiguous().view(torch.int64).squeeze(1)

    @staticmethod
    def live(chunk: torch.Tensor) -> torch.Tensor:
        """Which records (b,) bool of a chunk hold a row (not freed)."""
        return chunk[:, KEY_WORDS + _C.FLAGS] >= 0

    def rows(self) -> int:
        return self.index.size

    def reset(self) -> None:
        self.sync()
        self.index = CompactIndex(0)  # the old one freed before the new one is made
        self.index = CompactIndex(self.capacity)
        self.next_slot = 0
        self._free = []
        self.drop_resident()

    def close(self) -> None:
        if self._mapping.closed:
            return
        try:
            self.sync()
        finally:
            if self._writer is not None:
                self._writer.shutdown()
            # no view may outlive the mapping: an access after close finds no records
            self.records = torch.zeros((0, KEY_WORDS + self.width))
            self.index = CompactIndex(16)
            self._mapping.close()
            os.close(self._fd)
            self.path.unlink(missing_ok=True)
