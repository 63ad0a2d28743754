"""The ssd tier's RAM cache: a bounded set of rows in front of the table's file, CLOCK, write-back.

A module of its own because it is one concept with its own invariants (which cache row holds
which key, which rows are free, pinned or dirty), apart from what the table decides (which
keys exist, admission, capacity, the bulk paths around the cache). :class:`SsdCache` owns::

    data   (rows, width) float32   the cached rows, row-indexed
    keys   (rows,) int64           the key of each row
    index  compact key -> row      (ssd_file.CompactIndex)
    ref    (rows,) uint8           CLOCK byte: free, idle, used (a second chance), pinned
    dirty  (rows,) bool            written since read: written back when evicted or flushed
    free   a stack of free rows

Room is made by the CLOCK hand (a row used since it last passed gets a second chance; rows
of the call in progress are pinned), a block of victims at a time; dirty victims are written
back in slot order, and rows never written before get consecutive slots (sequential writes).
"""

from __future__ import annotations

from collections.abc import Iterator

import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.errors import CapacityExceeded
from streamrec.embedding_store.tiers.ssd_file import LOAD, MAX_SLOTS, CompactIndex, RowFile

REF_FREE, REF_IDLE, REF_USED, REF_PINNED = _C.REF_FREE, _C.REF_IDLE, _C.REF_USED, _C.REF_PINNED
#: mark: leave the CLOCK byte as it is
REF_KEEP = -1


def rows_for_budget(budget_mb: float, width: int) -> int:
    """Rows a budget of ``budget_mb`` MiB holds (at least 16): a row (4 * width), its key (8),
    its index entry (12 / LOAD), CLOCK and dirty bytes (2) and its free-stack entry (8)."""
    row_bytes = width * 4 + 8 + 12 / LOAD + 2 + 8
    return int(min(max(budget_mb * 2**20 // row_bytes, 16), MAX_SLOTS))


class SsdCache:
    """``rows`` rows of a table cached in RAM in front of its ``file``, CLOCK eviction,
    write-back.

    Counts ``cache_evictions`` in ``counters`` (the file counts the bytes it reads and
    writes). A call pins the rows it touches (:meth:`mark` with ``REF_PINNED``, :meth:`fill`)
    and ends with :meth:`unpin`; a call needs at most ``rows`` rows at once (:meth:`slices`).

    Args:
        file: the table's records, where rows come from and go back to.
        rows: rows cached at most (:func:`rows_for_budget`).
        width: floats a row.
        counters: the table's counters.
        name: the table's, for errors.
    """

    def __init__(
        self, file: RowFile, rows: int, width: int, counters: dict[str, int], name: str
    ) -> None:
        self.file = file
        self.rows = rows
        self.counters = counters
        self.name = name
        self.data = torch.zeros((rows, width), dtype=torch.float32)
        self.keys = torch.zeros(rows, dtype=torch.int64)
        self._dirty = torch.zeros(rows, dtype=torch.bool)  # written since read: write back
        self._filled: list[torch.Tensor] = []  # rows brought in by the call in progress
        self._generation = 0  # bumped whenever cached rows leave (eviction, clearing)
        self.clear()

    def clear(self) -> None:
        """Empties the cache, dirty rows dropped (:meth:`flush` writes them back first)."""
        self._generation += 1
        self._recent = (-1, torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64))
        c = self.rows
        self._index = CompactIndex(c)  # key -> cache row
        self._ref = torch.full((c,), REF_FREE, dtype=torch.uint8)
        self._dirty.zero_()
        self._free_rows = torch.arange(c - 1, -1, -1)  # a stack of free rows
        self._n_free = c
        self._hand = 0

    def close(self) -> None:
        """Lets the cache's memory go now, not when the last reference to the store does."""
        width = self.data.shape[1]
        self.rows = 0
        self.data = torch.zeros((0, width))
        self.keys = torch.zeros(0, dtype=torch.int64)
        self._dirty = torch.zeros(0, dtype=torch.bool)
        self.clear()

    # -- lookups --------------------------------------------------------------------------
    def find(self, keys: torch.Tensor) -> torch.Tensor:
        """Cache rows (n,) int64 of ``keys`` (n,) int64, -1 where not cached."""
        return self._index.find(keys)

    def find_count(self, keys: torch.Tensor) -> tuple[torch.Tensor, int]:
        """As :meth:`find`, with the number of keys not cached."""
        return self._index.find_count(keys)

    def remember(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Keeps the rows of a pull for the push after it (the trainer pushes the keys it
        pulled): valid until rows are evicted."""
        self._recent = (self._generation, keys.clone(), rows)

    def recent_rows(self, keys: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(rows (n,) int64, -1 where absent; the number absent) of ``keys`` (n,) int64: the
        last pull's when these are its keys and no row moved since, else a find."""
        gen, pulled, rows = self._recent
        if gen == self._generation and keys.shape == pulled.shape and torch.equal(keys, pulled):
            return rows, int((rows < 0).sum())
        return self._index.find_count(keys)

    def cached_rows(self) -> int:
        """Rows cached now."""
        return self.rows - self._n_free

    def nbytes(self) -> int:
        """RAM the cache holds: rows, keys, index, CLOCK and dirty bytes, free stack."""
        n = self.data.numel() * 4 + self.keys.numel() * 8 + self._index.nbytes()
        return n + self._ref.numel() + self._dirty.numel() + self._free_rows.numel() * 8

    def slices(self, n: int) -> Iterator[slice]:
        """Slices of at most half the cache, so that one always fits."""
        step = max(self.rows // 2, 1)
        for a in range(0, n, step):
            yield slice(a, min(a + step, n))

    # -- a call's rows --------------------------------------------------------------------
    def fill(
        self,
        keys: torch.Tensor,
        slots: torch.Tensor,
        on_file: torch.Tensor,
        n_file: int,
        new: torch.Tensor,
        n_new: int,
        params: _C.TableParams,
    ) -> torch.Tensor:
        """Cache rows (m,) int64 (pinned) of ``keys`` (m,) int64, unique and not cached: the
        ``n_file`` where ``on_file`` (m,) bool read from their file ``slots`` (m,) int64, the
        ``n_new`` where ``new`` (m,) bool initialised (``params``: the table's) and dirty
        (never written until evicted); -1 for the others."""
        out = torch.full((keys.numel(),), -1, dtype=torch.int64)
        rows = self._take_rows(n_file + n_new)
        if n_file:
            r = rows[:n_file]
            self.keys[r] = keys[on_file]
            self.file.read(slots[on_file], self.data, r)
            out[on_file] = r
        if n_new:
            r = rows[n_file:]
            self.keys[r] = keys[new]
            _C.init_rows_at(self.data, self.keys, r, params)
            self._dirty[r] = True
            out[new] = r
        got = out >= 0
        self._index.assign(keys[got], out[got])
        self._ref[rows] = REF_PINNED
        self._filled.append(rows)
        return out

    def mark(self, rows: torch.Tensor, ref: int, dirty: bool = False) -> None:
        """CLOCK byte ``ref`` (``REF_KEEP``: as it is; and the write-back bit when ``dirty``)
        of ``rows`` (n,) int64, -1 skipped."""
        _C.mark_rows(self._ref, self._dirty, rows, ref, dirty)

    def unpin(self, rows: torch.Tensor) -> None:
        """Ends a call: its rows that were cached before count as used; those it brought in
        stay idle (evicted at the hand's next pass unless used again: a key seen once does
        not push a hot one out)."""
        self.mark(rows, REF_USED)
        for filled in self._filled:
            self.mark(filled, REF_IDLE)
        self._filled.clear()

    def flush(self, clear: bool) -> None:
        """Writes every dirty cached row back; empties the cache when ``clear``."""
        self._write_back((self._ref != REF_FREE).nonzero().squeeze(1))
        if clear:
            self.clear()

    # -- room -----------------------------------------------------------------------------
    def _write_back(self, rows: torch.Tensor) -> None:
        """Writes the dirty ones of cache ``rows`` (m,) int64 to their file records."""
        dirty = rows[self._dirty[rows]]
        if dirty.numel():
            slots = self.file.slots_for(self.keys[dirty])
            self.file.write(self.data, self.keys, dirty, slots)
            self._dirty[dirty] = False

    def _evict(self, need: int) -> None:
        """Frees at least ``need`` more cache rows (a block more when there are that many
        unpinned rows, so that evictions come in blocks)."""
        want = min(need + self.rows // 32, self.rows - self._n_free)
        victims, self._hand = _C.clock_victims(self._ref, self._hand, want)
        self._generation += 1
        if victims.numel() < need:
            self._ref[victims] = REF_USED  # left as they were: still cached
            raise CapacityExceeded(
                f"table {self.name!r}: a call needs more rows at once than the "
                f"cache's {self.rows}; raise cache_budget_mb"
            )
        self._write_back(victims)
        self._index.erase(self.keys[victims])
        m = victims.numel()
        self._free_rows[self._n_free : self._n_free + m] = victims
        self._n_free += m
        self.counters["cache_evictions"] += m

    def _take_rows(self, n: int) -> torch.Tensor:
        if n > self._n_free:
            self._evict(n - self._n_free)
        rows = self._free_rows[self._n_free - n : self._n_free].clone()
        self._n_free -= n
        return rows
