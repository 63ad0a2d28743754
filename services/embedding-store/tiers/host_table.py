"""The host tier: every row of a table in RAM (OneEmbedding's host store).

A row matrix ``_data`` (rows, width) float32, the row keys ``_row_keys`` (rows,) int64 and an
open-addressing hash index key -> row (the C++ ops of ``csrc/cpu``). Rows ``[0, size)`` are
in use, numbered in creation order; shrink and erase renumber them (compaction).

Besides the :class:`~streamrec.embedding_store.tiers.table_tier.TableTier` interface, a host table
offers what another tier needs of it as a RAM cache (the ssd tier): row-level access
(:meth:`HostTable.gather`, :meth:`HostTable.take`, :meth:`HostTable.contents`,
:meth:`HostTable.update_rows`), creation (:meth:`HostTable.create`,
:meth:`HostTable.find_or_insert`) and least-recently-used eviction
(:meth:`HostTable.mark_used`, :meth:`HostTable.least_used`, :meth:`HostTable.drop_rows`).
"""

from __future__ import annotations

from collections import deque

import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.errors import CapacityExceeded, InvalidInput
from streamrec.embedding_store.tiers import row_codec
from streamrec.embedding_store.tiers.prefault import Prefaulter
from streamrec.embedding_store.tiers.table_tier import (
    MAX_LOAD,
    MIN_ROWS,
    TableTier,
    admission_mask,
    index_slots,
)
from streamrec.store_schema import TableOptions

#: pulls whose rows a host table keeps for the pushes after them (HostTable._remember)
_RECENT_PULLS = 8


class HostTable(TableTier):
    """All rows in RAM, indexed by an open-addressing hash index (C++).

    Args:
        options: the table.
        seed: the store's initializer seed.
        capacity: most rows this table may hold (None: unbounded).
        track_use: keep a last-use tick per row (:meth:`mark_used`), for a table that is
            another tier's cache.
    """

    concurrent_reads = True
    kind = "host"
    block_group = "host"

    def __init__(
        self,
        options: TableOptions,
        seed: int = 0,
        capacity: int | None = None,
        track_use: bool = False,
    ) -> None:
        super().__init__(options, seed)
        self.capacity = capacity
        self._size = 0
        # rows allocated up front: options.init_capacity (within capacity), at least MIN_ROWS
        rows = max(MIN_ROWS, options.init_capacity)
        if capacity is not None:
            rows = max(MIN_ROWS, min(rows, capacity))
        self._init_rows = rows
        try:
            # last-use tick per row, kept only when this table is another tier's cache
            self._stamp = torch.zeros(rows, dtype=torch.int64) if track_use else None
            self._data = torch.empty((rows, self.width), dtype=torch.float32)
            self._row_keys = torch.empty(rows, dtype=torch.int64)
        except RuntimeError as exc:  # the allocator's "can't allocate memory"
            raise InvalidInput(
                f"table {options.name!r}: init_capacity={options.init_capacity} needs "
                f"{rows * (4 * self.width + 8) / 2**30:.1f} GiB, more than can be allocated"
            ) from exc
        for t in (self._data, self._row_keys):
            _C.advise_huge(t)  # before the first touch
        self._slots = _C.index_build(index_slots(rows), self._row_keys[:0])
        self._generation = 0  # bumped whenever rows are renumbered (compaction, reset)
        self._prefault = Prefaulter()
        if rows > MIN_ROWS:  # an asked-for capacity is mapped now, not while creating rows
            self._prefault.map_now((self._data, self._row_keys), rows)
        # (generation, keys, rows) of the last pulls that found or created every key: the
        # push of a training step sends the keys it pulled, and finds their rows here
        self._recent: deque[tuple[int, torch.Tensor, torch.Tensor]] = deque(maxlen=_RECENT_PULLS)
        self._rng = torch.Generator().manual_seed(seed ^ (int(self.params.seed) >> 1))

    # -- growth -------------------------------------------------------------------------
    def _reserve(self, extra: int) -> None:
        need = self._size + extra
        if need > self._data.shape[0]:
            rows = max(need, 2 * self._data.shape[0])
            if self.capacity is not None:
                rows = max(min(rows, self.capacity), need)
            data = torch.empty((rows, self.width), dtype=torch.float32)
            keys = torch.empty(rows, dtype=torch.int64)
            for t in (data, keys):  # before the first touch (the copies below)
                _C.advise_huge(t)
            data[: self._size] = self._data[: self._size]
            keys[: self._size] = self._row_keys[: self._size]
            self._data, self._row_keys = data, keys
            self._prefault.reset(self._size)  # the copy above mapped those
            if self._stamp is not None:
                stamp = torch.zeros(rows, dtype=torch.int64)
                stamp[: self._size] = self._stamp[: self._size]
                self._stamp = stamp
        if need > MAX_LOAD * self._slots.shape[0]:
            self._rebuild_index(need)

    def _rebuild_index(self, rows: int) -> None:
        self._slots = _C.index_build(index_slots(rows), self._row_keys[: self._size])

    def find(self, keys: torch.Tensor) -> torch.Tensor:
        """Row per key, -1 where absent. keys: (n,) int64 -> (n,) int64."""
        return _C.find(self._slots, keys)

    def _admit_all(self) -> bool:
        """Whether every absent key is admitted (no admission rule)."""
        o = self.options
        return o.admission_score is None and o.admission_probability >= 1.0

    def _admit(
        self, n: int, shows: torch.Tensor | None, clicks: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Admission mask (n,) bool of absent keys, or None when all are admitted.
        shows, clicks: (n,) float32 of a push, None for a pull."""
        return admission_mask(self.options, self._rng, n, shows, clicks)

    def _create(
        self,
        keys: torch.Tensor,
        rows: torch.Tensor,
        shows: torch.Tensor | None = None,
        clicks: torch.Tensor | None = None,
        misses: int | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Creates the absent keys (rows == -1) that admission lets in; returns updated rows.
        shows, clicks: (n,) of a push (admission by score), None for a pull. misses: the
        count of rows == -1 if known. out: (n, dim) float32 weights of a pull, whose rows
        of created keys are filled when every key is admitted (else the caller gathers)."""
        if self._admit_all():
            # fused: only the misses are visited; insert, initialise and copy out at once
            if misses is None:
                misses = int((rows < 0).sum())
            if misses == 0:
                return rows
            if self.capacity is not None and self._size + misses > self.capacity:
                distinct = int(_C.unique(keys[rows < 0])[0].numel())
                if self._size + distinct > self.capacity:
                    raise CapacityExceeded(
                        f"table {self.options.name!r}: {distinct} new rows would exceed "
                        f"capacity {self.capacity} (holds {self._size})"
                    )
            if self._size + misses > self._data.shape[0]:
                # growing copies the whole table: grow by the distinct new keys, not by the
                # count of misses (duplicates included), which may overshoot a presized table
                misses = int(_C.unique(keys[rows < 0])[0].numel())
            slots = self._slots
            self._reserve(misses)
            m = _C.insert_init(
                self._slots,
                self._data,
                self._row_keys,
                keys,
                rows,
                torch.empty(0) if out is None else out,
                self._size,
                self.params,
                hinted=self._slots is slots,  # rows < -1 hold slots of this same index
            )
            self._size += m
            self.counters["rows_created"] += m
            # creation should not wait on page faults (see streamrec.embedding_store.tiers.prefault)
            self._prefault.ahead((self._data, self._row_keys), self._size, m)
            return rows
        missing = rows < 0
        if not bool(missing.any()):
            return rows
        new = keys[missing]
        admitted = self._admit(
            new.numel(),
            None if shows is None else shows[missing],
            None if clicks is None else clicks[missing],
        )
        if admitted is not None:
            self.counters["rows_refused"] += int((~admitted).sum())
            new = new[admitted]
            if new.numel() == 0:
                return rows
        # new may repeat a key; the count of distinct new keys is known after insertion, so
        # check capacity against the upper bound first and refuse before writing anything.
        if self.capacity is not None and self._size + new.numel() > self.capacity:
            distinct = int(torch.unique(new).numel())
            if self._size + distinct > self.capacity:
                raise CapacityExceeded(
                    f"table {self.options.name!r}: {distinct} new rows would exceed capacity "
                    f"{self.capacity} (holds {self._size})"
                )
        self._reserve(new.numel())
        start = self._size
        _rows, fresh = _C.find_or_insert(self._slots, new.contiguous(), start)
        m = fresh.numel()
        self._row_keys[start : start + m] = fresh
        _C.init_rows(self._data, self._row_keys, start, m, self.params)
        self._size += m
        self.counters["rows_created"] += m
        if admitted is not None or new.numel() != missing.sum():
            return self.find(keys)
        rows = rows.clone()
        rows[missing] = _rows
        return rows

    # -- the tier interface ---------------------------------------------------------------
    def _remember(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Keeps the rows of a pull that found or created every key, for the push after it
        (a copy of the keys: the caller may reuse its tensor). The last _RECENT_PULLS are
        kept: a client sends a large pull as several requests, then the push as many."""
        self._recent.append((self._generation, _C.step_copy(keys), rows))

    def _recent_rows(self, keys: torch.Tensor) -> torch.Tensor | None:
        """Rows of keys if they are the keys of a recent complete pull (same generation)."""
        for gen, pulled, rows in reversed(self._recent):
            if gen == self._generation and keys.shape == pulled.shape and torch.equal(keys, pulled):
                return rows
        return None

    def read(self, keys: torch.Tensor, create: bool = False) -> tuple[torch.Tensor | None, object]:
        # a pull that creates fills the rows of absent keys itself: no zeros written first
        out, rows, misses = _C.find_gather(self._slots, keys, self._data, self.params, not create)
        if misses:
            return None, (self._generation, rows, out, misses, not create)
        self._remember(keys, rows)
        return out, None

    def pull(self, keys: torch.Tensor, create: bool, hint: object = None) -> torch.Tensor:
        """hint: what :meth:`read` returned, passed only when nothing was written since."""
        if isinstance(hint, tuple) and hint[0] == self._generation and (create or hint[4]):
            _gen, rows, out, misses, _zeroed = hint
        else:
            out, rows, misses = _C.find_gather(
                self._slots, keys, self._data, self.params, not create
            )
        if misses == 0:
            self._remember(keys, rows)
        if not create or misses == 0:
            return out  # absent keys read as zeros
        if self._admit_all():  # out's rows of absent keys are filled here
            self._create(keys, rows, misses=misses, out=out)
            self._remember(keys, rows)  # insert_init filled every row
            return out
        rows = self._create(keys, rows, misses=misses)
        return _C.gather(self._data, rows, self.params)  # refused keys read as zeros

    def push(
        self, keys: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> bool:
        rows = self._recent_rows(keys)
        if rows is None:
            rows, misses = _C.find_count(self._slots, keys)
            if misses:
                rows = self._create(keys, rows, shows, clicks, misses=misses)
        self.update_rows(rows, grads, shows, clicks)
        return True

    def size(self) -> int:
        return self._size

    def inspect(self, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = self.find(keys)
        return self._stats_of(rows, self._data.index_select(0, rows.clamp(min=0)))

    def advance_day(self) -> None:
        _C.advance_day(self._data, self._size)

    def shrink(self) -> torch.Tensor:
        keep = _C.shrink(self._data, self._size, self.params)
        gone = self._row_keys[: self._size][~keep[: self._size]]
        if gone.numel():
            self._compact(keep.nonzero().squeeze(1))
        self.counters["rows_deleted"] += gone.numel()
        return gone

    def _compact(self, idx: torch.Tensor) -> None:
        """Keeps rows ``idx`` (m,) int64, ascending, renumbered 0..m-1."""
        m = idx.numel()
        self._data[:m] = self._data.index_select(0, idx)
        self._row_keys[:m] = self._row_keys.index_select(0, idx)
        if self._stamp is not None:
            self._stamp[:m] = self._stamp.index_select(0, idx)
        self._size = m
        self._generation += 1
        self._rebuild_index(max(m, self._init_rows))

    def erase(self, keys: torch.Tensor) -> torch.Tensor:
        rows = self.find(keys)
        present = rows >= 0
        if not bool(present.any()):
            return keys[:0].clone()
        keep = torch.ones(self._size, dtype=torch.bool)
        keep[rows[present]] = False
        self._compact(keep.nonzero().squeeze(1))
        return keys[present].clone()

    def export(self, select: int) -> tuple[torch.Tensor, torch.Tensor]:
        mask = _C.select_rows(self._data, self._size, select, self.params)
        idx = mask.nonzero().squeeze(1)
        return self._row_keys.index_select(0, idx), self._data.index_select(0, idx)

    def full_rows(self, keys: torch.Tensor, create: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if create:
            self.pull(keys, True)
        rows = self.find(keys)
        present = rows >= 0
        full = torch.zeros(keys.numel(), self.width)
        full[present] = self.take(rows[present])[1]
        return full, present

    def clear_dirty(self) -> None:
        _C.clear_dirty(self._data, self._size)

    def import_rows(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        if rows.dim() != 2 or rows.shape[1] != self.width or rows.shape[0] != keys.numel():
            raise InvalidInput(
                f"table {self.options.name!r}: rows must be ({keys.numel()}, {self.width}), "
                f"got {tuple(rows.shape)}"
            )
        where = self.find_or_insert(keys)
        self._data[where] = rows.to(torch.float32)

    def find_or_insert(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows (n,) int64 of ``keys`` (n,) int64 unique, absent ones created with fresh
        rows (initial values, no admission)."""
        rows = self.find(keys)
        absent = int((rows < 0).sum())
        if absent == 0:
            return rows
        if self.capacity is not None and self._size + absent > self.capacity:
            raise CapacityExceeded(
                f"table {self.options.name!r}: loading {absent} new rows would exceed "
                f"capacity {self.capacity} (holds {self._size})"
            )
        self._reserve(absent)
        start = self._size
        rows, fresh = _C.find_or_insert(self._slots, keys, start)
        self._row_keys[start : start + fresh.numel()] = fresh
        _C.init_rows(self._data, self._row_keys, start, fresh.numel(), self.params)
        self._size += fresh.numel()
        return rows

    def import_weights(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if values.dim() != 2 or values.shape != (keys.numel(), self.dim):
            raise InvalidInput(
                f"table {self.options.name!r}: values must be ({keys.numel()}, {self.dim}), "
                f"got {tuple(values.shape)}"
            )
        rows = self.find_or_insert(keys)
        block = self._data[rows]
        row_codec.encode_(block, self.options.dtype, _C.EMBED_W, values.to(torch.float32))
        self._data[rows] = block
        expanded = (values[:, 1:] != 0).any(dim=1).to(torch.int64) * _C.FLAG_EXPANDED
        flags = self._data[rows, _C.FLAGS].to(torch.int64) | expanded
        self._data[rows, _C.FLAGS] = flags.to(torch.float32)

    def mark_dirty(self, keys: torch.Tensor) -> None:
        rows = self.find(keys)
        rows = rows[rows >= 0]
        flags = self._data[rows, _C.FLAGS].to(torch.int64) | _C.FLAG_DIRTY
        self._data[rows, _C.FLAGS] = flags.to(torch.float32)

    def reset(self) -> None:
        self._size = 0
        self._generation += 1
        self._rebuild_index(self._init_rows)

    def bytes_used(self) -> dict[str, int]:
        n = self._data.numel() * 4 + self._row_keys.numel() * 8 + self._slots.numel() * 8
        return {"host": int(n)}

    def close(self) -> None:
        self._size = 0
        self._data = torch.empty((0, self.width), dtype=torch.float32)
        self._row_keys = torch.empty(0, dtype=torch.int64)

    # -- row-level access, for a tier that uses this table as its RAM cache -------------
    def create(
        self,
        keys: torch.Tensor,
        shows: torch.Tensor | None = None,
        clicks: torch.Tensor | None = None,
    ) -> None:
        """Creates rows for ``keys`` (n,) int64, all absent, subject to admission (shows,
        clicks (n,) float32 of a push for admission by score; None for a pull)."""
        self._create(keys, torch.full_like(keys, -1), shows, clicks)

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Weights (n, dim) float32 of ``rows`` (n,) int64; -1 reads as zeros."""
        return _C.gather(self._data, rows, self.params)

    def take(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the keys (m,) int64 and full rows (m, width) float32 at ``rows``
        (m,) int64, every one in use."""
        return self._row_keys.index_select(0, rows), self._data.index_select(0, rows)

    def contents(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (size,) int64 and full rows (size, width) float32 of every row in use:
        views, valid until the table next changes."""
        return self._row_keys[: self._size], self._data[: self._size]

    def update_rows(
        self, rows: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> None:
        """The fused update of ``rows`` (n,) int64, all present (repeats summed in index
        order): grads (n, dim), shows and clicks (n,) float32, contiguous."""
        self.params.round_step += 1  # a compact row's stochastic rounding: new bits per push
        self.counters["rows_expanded"] += _C.update(
            self._data, self._row_keys, rows, grads, shows, clicks, self.params
        )

    def mark_used(self, rows: torch.Tensor, tick: int) -> None:
        """Stamps ``rows`` (m,) int64 as used at ``tick`` (a table made with track_use)."""
        assert self._stamp is not None, "mark_used needs a table made with track_use=True"
        self._stamp[rows] = tick

    def least_used(self, count: int, keep: torch.Tensor) -> torch.Tensor:
        """The ``count`` rows (count,) int64 used longest ago, ``keep`` (k,) int64 last."""
        assert self._stamp is not None, "least_used needs a table made with track_use=True"
        stamp = self._stamp[: self._size].clone()
        stamp[keep] = torch.iinfo(torch.int64).max
        return torch.topk(stamp, count, largest=False).indices

    def drop_rows(self, rows: torch.Tensor) -> None:
        """Removes ``rows`` (m,) int64; the others are renumbered (as shrink does)."""
        alive = torch.ones(self._size, dtype=torch.bool)
        alive[rows] = False
        self._compact(alive.nonzero().squeeze(1))


# -- several tables' parts in one block (the in-process store's pull_rows / push_rows) ----
def read_block(
    tiers: list[HostTable], keys: torch.Tensor, counts: list[int], create: bool
) -> tuple[torch.Tensor, list[object]]:
    """:meth:`HostTable.read` of each tier's part of ``keys`` (``counts[t]`` keys of
    ``tiers[t]``, laid end to end), in one C++ call: (weights (n, dim), per part None or,
    where keys are absent and ``create``, the hint :meth:`HostTable.pull` takes to create
    them without looking the keys up again; its weights are a view of the block's). Absent
    keys read as zeros when not ``create``. Call under every tier's read lock."""
    out, rows, misses = _C.find_gather_tables(
        [t._slots for t in tiers], keys, counts, [t._data for t in tiers],
        [t.params for t in tiers], not create,
    )  # fmt: skip
    hints: list[object] = []
    split = (keys.split(counts), rows.split(counts), out.split(counts))
    for tier, k, r, o, m in zip(tiers, *split, misses, strict=True):
        if m == 0:
            tier._remember(k, r)
        hints.append((tier._generation, r, o, m, not create) if m and create else None)
    return out, hints


def push_block(
    tiers: list[HostTable],
    keys: torch.Tensor,
    counts: list[int],
    grads: torch.Tensor,
    shows: torch.Tensor,
    clicks: torch.Tensor,
) -> None:
    """:meth:`HostTable.push` of each tier's part (laid out as in :func:`read_block`; inputs
    checked), one C++ update for all: each part's rows from its tier's recent pulls, else
    found, absent keys created first. Call under every tier's write lock."""
    rows = []
    parts = zip(tiers, keys.split(counts), shows.split(counts), clicks.split(counts), strict=True)
    for tier, k, s, c in parts:
        r = tier._recent_rows(k)
        if r is None:
            r, misses = _C.find_count(tier._slots, k)
            if misses:
                r = tier._create(k, r, s, c, misses=misses)
        rows.append(r)
    # after every creation: a table's rows may have moved to a larger tensor
    for tier in tiers:
        tier.params.round_step += 1
    expanded = _C.update_tables(
        [t._data for t in tiers], [t._row_keys for t in tiers], rows, grads, shows, clicks,
        [t.params for t in tiers],
    )  # fmt: skip
    for tier, e in zip(tiers, expanded, strict=True):
        tier.counters["rows_expanded"] += e
