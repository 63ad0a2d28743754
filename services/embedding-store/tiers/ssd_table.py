"""The ssd tier: a table's rows in a file, a bounded RAM cache in front (OneEmbedding's).

RAM holds the file's compact key -> slot index (:mod:`~streamrec.embedding_store.tiers.ssd_file`,
15 bytes a key) and the cache (:mod:`~streamrec.embedding_store.tiers.ssd_cache`):
``cache_rows`` fixed rows ``(cache_rows, width)`` with their keys, a compact key -> cache row
index, one CLOCK byte and one write-back bit a row. A pull whose keys are all cached is one
find and one gather (C++), as on the host tier; the keys it misses are deduplicated and
brought in at once: one sorted pass over their file records, new keys created in the cache
(never written until evicted). This module decides which keys exist (admission, capacity)
and takes the bulk paths around the cache (a bulk load, save and load a file chunk at a time).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.errors import CapacityExceeded, InvalidInput
from streamrec.embedding_store.tiers import row_codec
from streamrec.embedding_store.tiers.ssd_cache import (
    REF_KEEP,
    REF_PINNED,
    REF_USED,
    SsdCache,
    rows_for_budget,
)
from streamrec.embedding_store.tiers.ssd_file import KEY_WORDS, MAX_SLOTS, RowFile
from streamrec.embedding_store.tiers.table_tier import TableTier, admission_mask
from streamrec.store_schema import TableOptions

#: a pull creating at least this many rows creates them on file, around the cache (a bulk load)
_BULK_CREATE = 1 << 18
#: keys probed to tell a bulk load (keys mostly new) from a large read of rows on file
_SAMPLE = 4096
#: shows, clicks (m,) float32 of a push's keys, for admission by score
_Counts = tuple[torch.Tensor, torch.Tensor]


class SsdTable(TableTier):
    """Rows in a file under ``persistent_path``, a bounded write-back RAM cache in front.

    The file ``<persistent_path>/<table>/rows.f32`` holds up to ``capacity`` records; the
    cache holds at most ``cache_budget_mb`` MiB of rows (row, key, index, CLOCK and dirty
    bytes). Pulls count cache hits and misses per lookup; evictions and the bytes read from
    and written to the file are counted too. The file is a working area, not a checkpoint (it
    is removed on close): use ``save``/``load`` to keep a table.

    Args:
        options: the table.
        seed: the store's initializer seed.
        capacity: most rows of the table.
        cache_budget_mb: RAM for the cache, MiB.
        persistent_path: directory for the file.
    """

    kind = "ssd"
    streams_rows = True
    capacity: int  # required by this tier

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
        if not 1 <= int(capacity) <= MAX_SLOTS:
            raise InvalidInput(f"capacity must be in [1, {MAX_SLOTS}] rows, got {capacity}")
        self.capacity = int(capacity)
        for k in ("cache_evictions", "cache_disk_read_bytes", "cache_disk_written_bytes"):
            self.counters[k] = 0
        self.dir = Path(persistent_path) / options.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            raise InvalidInput(
                f"persistent_path {str(self.dir)!r} is in use by another store"
            ) from exc
        try:
            self.file = RowFile(self.dir / "rows.f32", self.capacity, self.width, self.counters)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.path = self.file.path
        rows = rows_for_budget(cache_budget_mb, self.width)
        self.cache = SsdCache(self.file, rows, self.width, self.counters, options.name)
        self._rng = torch.Generator().manual_seed(seed ^ (int(self.params.seed) >> 1))
        self._total = 0  # distinct keys in cache or file
        self._closed = False

    @property
    def cache_rows(self) -> int:
        """Rows the RAM cache holds at most (0 once closed)."""
        return self.cache.rows

    # -- the table's rows through the cache -----------------------------------------------
    def _fill(
        self, keys: torch.Tensor, create: bool, admit: bool = True, counts: _Counts | None = None
    ) -> torch.Tensor:
        """Cache rows (m,) int64 (pinned) of ``keys`` (m,) int64, unique and not cached:
        read from the file, or created when ``create`` (subject to admission when ``admit``;
        ``counts`` the shows, clicks of a push for admission by score); -1 for keys left absent."""
        slots = self.file.index.find(keys)
        on_file = slots >= 0
        new = ~on_file if create else torch.zeros_like(on_file)
        if create and admit:
            mask = admission_mask(
                self.options,
                self._rng,
                int(new.sum()),
                None if counts is None else counts[0][new],
                None if counts is None else counts[1][new],
            )
            if mask is not None:
                self.counters["rows_refused"] += int((~mask).sum())
                new[new.clone()] = mask
        n_file, n_new = int(on_file.sum()), int(new.sum())
        if n_new and self._total + n_new > self.capacity:
            raise CapacityExceeded(
                f"table {self.options.name!r}: {n_new} new rows would exceed capacity "
                f"{self.capacity} (holds {self._total})"
            )
        out = self.cache.fill(keys, slots, on_file, n_file, new, n_new, self.params)
        if n_new:
            self._total += n_new
            self.counters["rows_created"] += n_new
        return out

    def _rows_of(
        self, keys: torch.Tensor, create: bool, admit: bool = True, counts: _Counts | None = None
    ) -> torch.Tensor:
        """Cache rows (m,) int64 of ``keys`` (m,) int64 unique, pinned, brought in as
        :meth:`_fill` does (``counts`` as there); -1 for keys left absent."""
        rows, misses = self.cache.find_count(keys)
        self.cache.mark(rows, REF_PINNED)
        if misses:
            miss = rows < 0
            rows[miss] = self._fill(
                keys[miss],
                create,
                admit,
                None if counts is None else (counts[0][miss], counts[1][miss]),
            )
        return rows

    # -- the tier interface ---------------------------------------------------------------
    def pull(self, keys: torch.Tensor, create: bool, hint: object = None) -> torch.Tensor:
        rows, n_miss = self.cache.find_count(keys)
        self.counters["cache_hits"] += keys.numel() - n_miss
        self.counters["cache_misses"] += n_miss
        if n_miss == 0:
            self.cache.mark(rows, REF_USED)
            self.cache.remember(keys, rows)
            return _C.gather(self.cache.data, rows, self.params)
        if (
            create
            and n_miss >= _BULK_CREATE
            and not self.file.has_free()
            and admission_mask(self.options, self._rng, 0, None, None) is None
            and self._mostly_new(keys, rows)
        ):
            return self._pull_creating(keys, rows, n_miss)
        if keys.numel() <= self.cache_rows // 2:
            self.cache.mark(rows, REF_PINNED)
            miss = rows < 0
            absent, inverse = _C.unique(keys[miss])
            rows[miss] = self._fill(absent, create)[inverse]
            out = _C.gather(self.cache.data, rows, self.params)
            self.cache.unpin(rows)
            if create:
                self.cache.remember(keys, rows)
            return out
        # a large pull: the keys absent everywhere are created on file, the others come in
        # through the cache in slices
        uniq, inverse = _C.unique(keys)
        out = torch.empty(uniq.numel(), self.dim)
        rest = torch.arange(uniq.numel())
        if create and admission_mask(self.options, self._rng, 0, None, None) is None:
            absent = (self.cache.find(uniq) < 0) & (self.file.index.find(uniq) < 0)
            if bool(absent.any()):
                out[absent] = self._create_on_file(uniq[absent])
                rest = (~absent).nonzero().squeeze(1)
        for sl in self.cache.slices(rest.numel()):
            at = rest[sl]
            r = self._rows_of(uniq[at], create)
            out[at] = _C.gather(self.cache.data, r, self.params)
            self.cache.unpin(r)
        return out.index_select(0, inverse)

    def _mostly_new(self, keys: torch.Tensor, rows: torch.Tensor) -> bool:
        """Whether most of the first keys missing from the cache (``rows`` < 0) are absent
        from the file too (a sample: a bulk load's keys are new; a warm-up's are on file and
        go through the cache)."""
        head = rows[: 16 * _SAMPLE]
        sample = keys[: head.numel()][head < 0][:_SAMPLE]
        return 2 * int((self.file.index.find(sample) < 0).sum()) > sample.numel()

    def _pull_creating(self, keys: torch.Tensor, rows: torch.Tensor, n_miss: int) -> torch.Tensor:
        """A pull of many keys absent from the cache (``rows`` (n,) their cache rows, -1
        there; ``n_miss`` of them), creating the absent ones: cached keys are gathered, the
        others found or added in the file's index in one probe a key; new rows are
        initialised straight into file records, written by a few sequential ``pwrite``; rows
        already on file are read. The cache is left as it was (a bulk load does not evict
        the hot set)."""
        every = n_miss == keys.numel()  # none cached (a bulk load's case): no gather, no selection
        miss = torch.empty(0, dtype=torch.int64) if every else (rows < 0).nonzero().squeeze(1)
        mk = keys if every else keys[miss]
        first = self.file.next_slot
        slots, added = self.file.find_or_append(mk)
        n_new = self.file.next_slot - first
        if self._total + n_new > self.capacity:  # the file's capacity is the table's
            self.file.index.erase(mk[added])
            self.file.next_slot = first
            raise CapacityExceeded(
                f"table {self.options.name!r}: {n_new} new rows would exceed capacity "
                f"{self.capacity} (holds {self._total})"
            )
        records = torch.empty((n_new, KEY_WORDS + self.width), dtype=torch.float32)
        weights = _C.init_records(records, mk if n_new == mk.numel() else mk[added], self.params)
        self.file.write_records(records, first)
        self._total += n_new
        self.counters["rows_created"] += n_new
        if n_new == mk.numel():  # every miss new and once: slots first, first + 1, ...
            w = weights
        else:
            fresh = slots >= first
            w = torch.empty((mk.numel(), self.dim), dtype=torch.float32)
            w[fresh] = weights[slots[fresh] - first]
            old = (~fresh).nonzero().squeeze(1)
            if old.numel():
                full = self.file.full_rows(slots[old])
                w[old] = _C.gather(full, torch.arange(old.numel()), self.params)
        if every:
            return w
        out = _C.gather(self.cache.data, rows, self.params)  # zeros where not cached
        out[miss] = w
        return out

    def _create_on_file(self, keys: torch.Tensor) -> torch.Tensor:
        """Creates rows of ``keys`` (m,) int64, unique and absent, straight into the file's
        free or append slots (one sequential pass, the cache untouched); their weights (m,
        dim)."""
        n = keys.numel()
        if self._total + n > self.capacity:
            raise CapacityExceeded(
                f"table {self.options.name!r}: {n} new rows would exceed capacity "
                f"{self.capacity} (holds {self._total})"
            )
        rows = torch.empty((n, self.width), dtype=torch.float32)
        _C.init_rows(rows, keys, 0, n, self.params)
        self.file.write(rows, keys, torch.arange(n), self.file.append(keys))
        self._total += n
        self.counters["rows_created"] += n
        return self.weights_of(rows)

    def push(
        self, keys: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> bool:
        rows, n_miss = self.cache.recent_rows(keys)
        if n_miss and _C.unique(keys)[0].numel() != keys.numel():
            return False  # the caller sums repeated keys (admission needs their sums)
        self.params.round_step += 1  # a compact row's stochastic rounding: new bits per push
        if n_miss:
            if keys.numel() > self.cache_rows // 2:
                for sl in self.cache.slices(keys.numel()):
                    r = self._rows_of(keys[sl], True, True, (shows[sl], clicks[sl]))
                    self._push_rows(
                        r, grads[sl].contiguous(), shows[sl].contiguous(), clicks[sl].contiguous()
                    )
                    self.cache.unpin(r)
                return True
            self.cache.mark(rows, REF_PINNED)
            miss = rows < 0
            rows[miss] = self._fill(keys[miss], True, True, (shows[miss], clicks[miss]))
            self._push_rows(rows, grads, shows, clicks)
            self.cache.unpin(rows)
            return True
        self._push_rows(rows, grads, shows, clicks)  # a push of pulled keys: no new use
        return True

    def _push_rows(
        self, rows: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> None:
        self.counters["rows_expanded"] += _C.update(
            self.cache.data, self.cache.keys, rows, grads, shows, clicks, self.params
        )
        self.cache.mark(rows, REF_KEEP, dirty=True)

    # -- row-level access, for a cache in front of this table (cached_table) ------------
    def rows_per_call(self) -> int:
        return max(self.cache_rows // 2, 1)  # one RAM-cache batch: all its rows stay in RAM

    def full_rows(self, keys: torch.Tensor, create: bool) -> tuple[torch.Tensor, torch.Tensor]:
        full = torch.zeros(keys.numel(), self.width)
        for sl in self.cache.slices(keys.numel()):
            rows = self._rows_of(keys[sl], create)
            found = rows >= 0
            full[sl][found] = self.cache.data[rows[found]]
            self.cache.unpin(rows)
        return full, self._present(keys)

    def _present(self, keys: torch.Tensor) -> torch.Tensor:
        return (self.cache.find(keys) >= 0) | (self.file.index.find(keys) >= 0)

    def write_rows(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        full = rows
        for sl in self.cache.slices(keys.numel()):
            rows = self._rows_of(keys[sl], False)
            assert bool((rows >= 0).all()), "write_rows: every key must be present"
            self.cache.data[rows] = full[sl].to(torch.float32)
            self.cache.mark(rows, REF_KEEP, dirty=True)
            self.cache.unpin(rows)

    def size(self) -> int:
        return self._total

    def inspect(self, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        full = torch.zeros(keys.numel(), self.width)
        rows = self.cache.find(keys)
        hit = rows >= 0
        full[hit] = self.cache.data[rows[hit]]
        slots = self.file.index.find(keys)
        on_file = (~hit) & (slots >= 0)
        if bool(on_file.any()):
            full[on_file] = self.file.full_rows(slots[on_file])
        return self._stats_of(torch.where(hit | on_file, 0, -1), full)

    def advance_day(self) -> None:
        # cached rows and their file records alike (a clean cached row stays equal to its
        # record; free records too: they are rewritten before reuse)
        self.cache.data[:, _C.UNSEEN] += 1
        for _a, chunk in self.file.chunks():
            chunk[:, KEY_WORDS + _C.UNSEEN] += 1

    def shrink(self) -> torch.Tensor:
        self.cache.flush(clear=True)
        deleted = [torch.zeros(0, dtype=torch.int64)]
        for a, chunk in self.file.chunks():
            rows = chunk[:, KEY_WORDS:].contiguous()
            keep = _C.shrink(rows, rows.shape[0], self.params)
            chunk[:, KEY_WORDS:] = rows
            gone = (self.file.live(chunk) & ~keep).nonzero().squeeze(1)
            if gone.numel():
                keys = self.file.keys_of(chunk)[gone]
                self.file.index.erase(keys)
                self.file.free(gone + a)
                deleted.append(keys.clone())
        out = torch.cat(deleted)
        self._total -= out.numel()
        self.counters["rows_deleted"] += out.numel()
        return out

    def erase(self, keys: torch.Tensor) -> torch.Tensor:
        self.cache.flush(clear=True)  # every row on file: erasing is the file's alone
        slots = self.file.index.find(keys)
        present = slots >= 0
        gone = keys[present].clone()
        if gone.numel():
            self.file.index.erase(gone)
            self.file.free(slots[present])
            self._total -= gone.numel()
        return gone

    def export(self, select: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.cache.flush(clear=False)
        keys, rows = [], []
        for k, r in self._export_chunks(select):
            keys.append(k)
            rows.append(r)
        if not keys:
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0, self.width)
        return torch.cat(keys), torch.cat(rows)

    def export_chunks(self, select: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """As :meth:`export`, a file chunk at a time: (keys (b,) int64, rows (b, width))
        per chunk, copies; what a chunk adds to memory is all a streaming save holds."""
        self.cache.flush(clear=False)
        yield from self._export_chunks(select)

    def _export_chunks(self, select: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _a, chunk in self.file.read_chunks():
            full = chunk[:, KEY_WORDS:].contiguous()
            sel = _C.select_rows(full, full.shape[0], select, self.params) & self.file.live(chunk)
            idx = sel.nonzero().squeeze(1)
            yield self.file.keys_of(chunk)[idx], full[idx]

    def clear_dirty(self) -> None:
        self.cache.flush(clear=False)  # then cache and file both clear (cached rows stay clean)
        _C.clear_dirty(self.cache.data, self.cache_rows)
        for _a, chunk in self.file.chunks():
            rows = chunk[:, KEY_WORDS:].contiguous()
            _C.clear_dirty(rows, rows.shape[0])
            chunk[:, KEY_WORDS:] = rows

    def mark_dirty(self, keys: torch.Tensor) -> None:
        self.cache.flush(clear=True)
        self.file.sync()
        slots = self.file.index.find(keys)
        slots = slots[slots >= 0]
        col = KEY_WORDS + _C.FLAGS
        flags = self.file.records[slots, col].to(torch.int64) | _C.FLAG_DIRTY
        self.file.records[slots, col] = flags.to(torch.float32)

    def import_rows(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        if rows.dim() != 2 or rows.shape != (keys.numel(), self.width):
            raise InvalidInput(
                f"table {self.options.name!r}: rows must be ({keys.numel()}, {self.width}), "
                f"got {tuple(rows.shape)}"
            )
        if self.cache.cached_rows():  # rows cached: written back, the cache emptied
            self.cache.flush(clear=True)
        new = int((self.file.index.find(keys) < 0).sum())
        if self._total + new > self.capacity:
            raise CapacityExceeded(
                f"table {self.options.name!r}: loading {new} new rows would exceed capacity "
                f"{self.capacity}"
            )
        src = rows.to(torch.float32).contiguous()
        if new == keys.numel() and not self.file.has_free():
            # a load's chunk (keys new and distinct): records appended by sequential pwrite
            first = self.file.next_slot
            slots, added = self.file.find_or_append(keys)
            if int(added.sum()) == keys.numel():
                records = torch.empty((keys.numel(), KEY_WORDS + self.width))
                records[:, :KEY_WORDS] = keys.contiguous().view(torch.float32).view(-1, KEY_WORDS)
                records[:, KEY_WORDS:] = src
                self.file.write_records(records, first)
                self._total += new
                return
            self.file.index.erase(keys[added])  # repeated keys: the general path below
            self.file.next_slot = first
        slots = self.file.slots_for(keys)
        self.file.write(src, keys.contiguous(), torch.arange(keys.numel()), slots)
        self._total += new

    def import_weights(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if values.dim() != 2 or values.shape != (keys.numel(), self.dim):
            raise InvalidInput(
                f"table {self.options.name!r}: values must be ({keys.numel()}, {self.dim}), "
                f"got {tuple(values.shape)}"
            )
        for sl in self.cache.slices(keys.numel()):
            rows = self._rows_of(keys[sl], True, admit=False)
            v = values[sl].to(torch.float32)
            block = self.cache.data[rows]
            row_codec.encode_(block, self.options.dtype, _C.EMBED_W, v)
            self.cache.data[rows] = block
            expanded = (v[:, 1:] != 0).any(dim=1).to(torch.int64) * _C.FLAG_EXPANDED
            flags = self.cache.data[rows, _C.FLAGS].to(torch.int64) | expanded
            self.cache.data[rows, _C.FLAGS] = flags.to(torch.float32)
            self.cache.mark(rows, REF_KEEP, dirty=True)
            self.cache.unpin(rows)

    def reset(self) -> None:
        self.cache.clear()
        self.file.reset()
        self._total = 0

    def bytes_used(self) -> dict[str, int]:
        host = self.cache.nbytes() + self.file.index.nbytes()
        return {"host": int(host), "ssd": int(self.file.next_slot * self.file.record_bytes)}

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["rows_by_tier"] = {"host": self.cache.cached_rows(), "ssd": self.file.rows()}
        s["cache_rows_max"] = self.cache_rows
        return s

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.file.close()
        os.close(self._lock_fd)
        self.cache.close()
