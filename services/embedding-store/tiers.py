"""Storage tiers of one table behind one interface (OneEmbedding's store options, seed 003).

- :class:`HostTable` keeps every row in RAM: a row matrix ``data`` (rows, width) float32, the
  row keys (rows,) int64 and an open-addressing hash index key -> row (the C++ ops of
  ``csrc/cpu``).
- :class:`SsdTable` keeps rows in a file under ``persistent_path`` (at most ``capacity``) and
  a :class:`HostTable` as a write-back cache of at most ``cache_budget_mb`` MiB.
- A device tier (GPU memory, the CUDA extension) implements :class:`TableTier` the same way.

Tiers are not thread-safe; :class:`streamrec.embedding_store.store.EmbeddingStore` locks
each table (readers share, writers are exclusive).

Row layout (see ``csrc/cpu/table_params.h``)::

    [show, click, unseen_days, flags, embed_w, embedx_w (dim-1), embed_state, embedx_state]
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from streamrec.embedding_store import _C
from streamrec.embedding_store.errors import CapacityExceeded, InvalidInput
from streamrec.embedding_store.options import TableOptions

#: Save selections (csrc select_rows modes).
SELECT_ALL, SELECT_BASE, SELECT_DELTA = 0, 1, 2
_MAX_LOAD = 0.75
_MIN_ROWS = 1024
#: rows mapped ahead of creation at least (see HostTable._prefault_ahead)
_PREFAULT_ROWS = 1 << 16
#: one background thread maps fresh row memory ahead of creation for every host table:
#: first writes to fresh pages cost ~2 s/GiB here, so row creation should not take them
_PREFAULTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="emb-prefault")
#: pulls whose rows a host table keeps for the pushes after them (HostTable._remember)
_RECENT_PULLS = 8


def table_params(options: TableOptions, seed: int = 0) -> _C.TableParams:
    """The C++ parameters of a table; initializer seed = f(store seed, table name)."""
    p = _C.TableParams()
    p.dim = options.dim
    for part, sgd in (("embed", options.embed_sgd_param), ("embedx", options.embedx_sgd_param)):
        rule = _C.RuleParams()
        rule.kind = sgd.kind
        rule.learning_rate = sgd.learning_rate
        rule.initial_g2sum = sgd.initial_g2sum
        rule.lower_bound, rule.upper_bound = sgd.weight_bounds
        rule.beta1, rule.beta2, rule.epsilon = sgd.beta1, sgd.beta2, sgd.epsilon
        setattr(p, f"{part}_rule", rule)
        init = _C.InitParams()
        ini = options.initializer
        if ini is None:
            init.kind, init.a, init.b = 1, -sgd.initial_range, sgd.initial_range
        elif ini.type == "uniform":
            init.kind, init.a, init.b = 1, ini.low, ini.high
        elif ini.type == "normal":
            init.kind, init.a, init.b = 2, ini.mean, ini.std
        else:
            init.kind, init.a, init.b = 0, 0.0, 0.0
        setattr(p, f"{part}_init", init)
    for name in (
        "nonclk_coeff",
        "click_coeff",
        "embedx_threshold",
        "show_click_decay_rate",
        "delete_threshold",
        "delete_after_unseen_days",
        "base_threshold",
        "delta_threshold",
        "delta_keep_days",
    ):
        setattr(p, name, float(getattr(options, name)))
    digest = hashlib.blake2b(options.name.encode(), digest_size=8).digest()
    p.seed = (int.from_bytes(digest, "little") ^ (seed * 0x9E3779B97F4A7C15)) % 2**64
    p.finalize()
    return p


def _pow2_at_least(n: int) -> int:
    return 1 << max(int(n) - 1, 1).bit_length()


class TableTier(ABC):
    """One table's rows on one storage tier.

    Keys are (n,) int64 contiguous tensors, already validated by the store. Weights are
    (n, dim) float32; full rows (n, width) float32 in the layout above.
    """

    #: Whether :meth:`read` may run in several threads at once (under a shared lock).
    concurrent_reads: bool = False

    def __init__(self, options: TableOptions, seed: int = 0) -> None:
        self.options = options
        self.params = table_params(options, seed)
        self.dim = options.dim
        self.width = int(self.params.width)
        self.counters = {
            "rows_created": 0,
            "rows_expanded": 0,
            "rows_deleted": 0,
            "rows_refused": 0,
            "cache_hits": 0,
            "cache_misses": 0,
        }

    def read(self, keys: torch.Tensor, create: bool = False) -> tuple[torch.Tensor | None, object]:
        """(weights (n, dim), None) if answerable without writing anything (all keys present
        in RAM), else (None, hint): the caller retries with ``pull(keys, create, hint)`` under
        an exclusive lock, and the hint saves that call the work already done. create: what
        that retry will pass."""
        return None, None

    @abstractmethod
    def pull(self, keys: torch.Tensor, create: bool, hint: object = None) -> torch.Tensor:
        """Weights (n, dim) float32; creates absent keys when ``create`` (subject to
        admission), else reads them as zeros."""

    @abstractmethod
    def push(
        self, keys: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> bool:
        """Fused update. keys: (n,) int64; grads: (n, dim); shows, clicks: (n,). A tier that
        does not sum repeated keys itself returns False when keys repeat, having written
        nothing (the caller sums them and pushes again); the host tier sums in C++."""

    @abstractmethod
    def size(self) -> int: ...

    @abstractmethod
    def inspect(self, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-key statistics (see EmbeddingStore.inspect)."""

    def _stats_of(self, rows: torch.Tensor, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """Statistics from full rows (n, width) of which rows >= 0 are present."""
        present = rows >= 0
        full = torch.where(present[:, None], full, torch.zeros(()))
        show, click = full[:, _C.SHOW], full[:, _C.CLICK]
        o = self.options
        return {
            "present": present,
            "show": show.clone(),
            "click": click.clone(),
            "unseen_days": full[:, _C.UNSEEN].clone(),
            "score": o.nonclk_coeff * (show - click) + o.click_coeff * click,
            "expanded": (full[:, _C.FLAGS].to(torch.int64) & _C.FLAG_EXPANDED) != 0,
        }

    @abstractmethod
    def advance_day(self) -> None: ...

    @abstractmethod
    def shrink(self) -> int:
        """Decays show/click, deletes rows (see TableOptions); returns the rows deleted."""

    @abstractmethod
    def export(self, select: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (m,) int64 and full rows (m, width) that a save selection takes."""

    @abstractmethod
    def clear_dirty(self) -> None:
        """Marks every row saved (the base/delta changed-since flag)."""

    @abstractmethod
    def import_rows(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Sets full rows (insert or assign). keys: (m,) int64 unique; rows: (m, width)."""

    @abstractmethod
    def import_weights(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Sets the weights of keys (base/delta load), creating absent rows (fresh state);
        rows with a nonzero embedx part count as expanded. values: (m, dim) float32."""

    @abstractmethod
    def mark_dirty(self, keys: torch.Tensor) -> None:
        """Sets the changed-since-save flag of present keys (undoes a failed base/delta)."""

    @abstractmethod
    def reset(self) -> None:
        """Removes every row."""

    @abstractmethod
    def bytes_used(self) -> dict[str, int]:
        """Bytes allocated per tier, e.g. ``{"host": ..., "ssd": ...}``."""

    def stats(self) -> dict[str, object]:
        return {"rows": self.size(), "bytes": self.bytes_used(), **self.counters}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Releases files and memory."""


class HostTable(TableTier):
    """All rows in RAM, indexed by an open-addressing hash index (C++).

    Args:
        options: the table.
        seed: the store's initializer seed.
        capacity: most rows this table may hold (None: unbounded).
    """

    concurrent_reads = True

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
        # rows allocated up front: options.init_capacity (within capacity), at least _MIN_ROWS
        rows = max(_MIN_ROWS, options.init_capacity)
        if capacity is not None:
            rows = max(_MIN_ROWS, min(rows, capacity))
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
        self._slots = _C.index_build(_pow2_at_least(int(rows / 0.5) + 1), self._row_keys[:0])
        self._generation = 0  # bumped whenever rows are renumbered (compaction, reset)
        self._mapped = 0  # rows of the current buffers already asked to be prefaulted
        if rows > _MIN_ROWS:  # an asked-for capacity is mapped now, not while creating rows
            _C.prefault(self._data, 0, rows)
            _C.prefault(self._row_keys, 0, rows)
            self._mapped = rows
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
            self._mapped = self._size  # the copy above mapped those
            if self._stamp is not None:
                stamp = torch.zeros(rows, dtype=torch.int64)
                stamp[: self._size] = self._stamp[: self._size]
                self._stamp = stamp
        if need > _MAX_LOAD * self._slots.shape[0]:
            self._rebuild_index(need)

    def _prefault_ahead(self, created: int) -> None:
        """Asks the background thread to map the row memory that the next creations will
        write (twice the last creation, at least _PREFAULT_ROWS rows, within the buffers),
        so that creation does not wait on page faults. Contents are not changed, so it may
        run while rows are written; the task holds the buffers it maps."""
        want = min(self._size + max(2 * created, _PREFAULT_ROWS), self._data.shape[0])
        if want <= self._mapped:
            return
        lo, self._mapped = self._mapped, want
        for t in (self._data, self._row_keys):
            _PREFAULTER.submit(_C.prefault, t, lo, want)

    def _rebuild_index(self, rows: int) -> None:
        cap = _pow2_at_least(int(rows / 0.5) + 1)
        self._slots = _C.index_build(cap, self._row_keys[: self._size])

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
        o = self.options
        if o.admission_score is not None:
            if shows is None or clicks is None:
                return torch.zeros(n, dtype=torch.bool)  # pulls never create
            score = o.nonclk_coeff * (shows - clicks) + o.click_coeff * clicks
            p = (score / o.admission_score).clamp(0.0, 1.0)
        elif o.admission_probability < 1.0:
            p = torch.full((n,), o.admission_probability)
        else:
            return None
        return torch.rand(n, generator=self._rng) < p

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
            self._prefault_ahead(m)
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
        self._recent.append((self._generation, keys.clone(), rows))

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
        self.counters["rows_expanded"] += _C.update(
            self._data, self._row_keys, rows, grads, shows, clicks, self.params
        )
        return True

    def size(self) -> int:
        return self._size

    def inspect(self, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = self.find(keys)
        return self._stats_of(rows, self._data.index_select(0, rows.clamp(min=0)))

    def advance_day(self) -> None:
        _C.advance_day(self._data, self._size)

    def shrink(self) -> int:
        keep = _C.shrink(self._data, self._size, self.params)
        idx = keep.nonzero().squeeze(1)
        deleted = self._size - idx.numel()
        if deleted:
            self._compact(idx)
        self.counters["rows_deleted"] += deleted
        return deleted

    def _compact(self, idx: torch.Tensor) -> None:
        m = idx.numel()
        self._data[:m] = self._data.index_select(0, idx)
        self._row_keys[:m] = self._row_keys.index_select(0, idx)
        if self._stamp is not None:
            self._stamp[:m] = self._stamp.index_select(0, idx)
        self._size = m
        self._generation += 1
        self._rebuild_index(max(m, self._init_rows))

    def erase(self, keys: torch.Tensor) -> int:
        """Removes keys (absent ones ignored); returns the rows removed."""
        rows = self.find(keys)
        rows = rows[rows >= 0]
        if rows.numel() == 0:
            return 0
        keep = torch.ones(self._size, dtype=torch.bool)
        keep[rows] = False
        idx = keep.nonzero().squeeze(1)
        removed = self._size - idx.numel()
        self._compact(idx)
        return removed

    def export(self, select: int) -> tuple[torch.Tensor, torch.Tensor]:
        mask = _C.select_rows(self._data, self._size, select, self.params)
        idx = mask.nonzero().squeeze(1)
        return self._row_keys.index_select(0, idx), self._data.index_select(0, idx)

    def export_rows(self, keys: torch.Tensor) -> torch.Tensor:
        """Full rows (n, width) of present keys (every key must be present)."""
        return self._data.index_select(0, self.find(keys))

    def clear_dirty(self) -> None:
        _C.clear_dirty(self._data, self._size)

    def import_rows(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        if rows.dim() != 2 or rows.shape[1] != self.width or rows.shape[0] != keys.numel():
            raise InvalidInput(
                f"table {self.options.name!r}: rows must be ({keys.numel()}, {self.width}), "
                f"got {tuple(rows.shape)}"
            )
        where = self._insert_absent(keys)
        self._data[where] = rows.to(torch.float32)

    def _insert_absent(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of keys, creating absent ones with fresh rows (no admission). keys unique."""
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
        rows = self._insert_absent(keys)
        self._data[rows, _C.EMBED_W : _C.EMBED_W + self.dim] = values.to(torch.float32)
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
        self._file = np.memmap(
            self.path, dtype=np.float32, mode="w+", shape=(self.capacity, self.width)
        )
        self._slot_key = np.zeros(self.capacity, dtype=np.int64)
        self._occupied = np.zeros(self.capacity, dtype=bool)
        self._free: list[np.ndarray] = []
        self._next_slot = 0
        self._total = 0  # distinct keys in cache or file
        self._tick = 0
        self._new_index(_MIN_ROWS)

    # -- file side ------------------------------------------------------------------------
    def _new_index(self, rows: int) -> None:
        cap = _pow2_at_least(int(rows / 0.5) + 1)
        self._fslots = _C.index_build(cap, torch.empty(0, dtype=torch.int64))

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
            if need > _MAX_LOAD * self._fslots.shape[0]:
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
        n = self.cache.size()
        self._write_back(self.cache._row_keys[:n].clone(), self.cache._data[:n])
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
        stamp = self.cache._stamp[:size].clone()
        stamp[keep] = torch.iinfo(torch.int64).max
        victims = torch.topk(stamp, size - target, largest=False).indices
        self._write_back(
            self.cache._row_keys.index_select(0, victims), self.cache._data.index_select(0, victims)
        )
        alive = torch.ones(size, dtype=torch.bool)
        alive[victims] = False
        self.cache._compact(alive.nonzero().squeeze(1))

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
                    self.cache._create(
                        absent,
                        torch.full_like(absent, -1),
                        None if shows is None else shows[where],
                        None if clicks is None else clicks[where],
                    )
                else:
                    self.cache._insert_absent(absent)
                self._total += self.cache.size() - before
            rows = self.cache.find(keys)
        present = rows[rows >= 0]
        self.cache._stamp[present] = self._tick
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
            out[sl] = _C.gather(self.cache._data, rows, self.params)
        return out.index_select(0, inverse)

    def push(
        self, keys: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> bool:
        if _C.unique(keys)[0].numel() != keys.numel():
            return False
        for sl in self._batches(keys.numel()):
            rows = self._bring(keys[sl], True, True, shows[sl], clicks[sl])
            self.counters["rows_expanded"] += _C.update(
                self.cache._data,
                self.cache._row_keys,
                rows,
                grads[sl].contiguous(),
                shows[sl].contiguous(),
                clicks[sl].contiguous(),
                self.params,
            )
        return True

    def size(self) -> int:
        return self._total

    def inspect(self, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        full = torch.zeros(keys.numel(), self.width)
        rows = self.cache.find(keys)
        hit = rows >= 0
        full[hit] = self.cache._data.index_select(0, rows[hit])
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
            self._rebuild_file_index(max(self._file_rows(), _MIN_ROWS))
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
        self._new_index(_MIN_ROWS)

    def bytes_used(self) -> dict[str, int]:
        host = self.cache.bytes_used()["host"] + self._fslots.numel() * 8
        host += self._slot_key.nbytes + self._occupied.nbytes
        return {"host": int(host), "ssd": int(self._next_slot * self.width * 4)}

    def stats(self) -> dict[str, object]:
        s = super().stats()
        s["rows_by_tier"] = {"host": self.cache.size(), "ssd": self._file_rows()}
        s["cache_rows_max"] = self.cache_rows
        return s

    def close(self) -> None:
        self.cache.close()
        if self._file is not None:
            self._file._mmap.close()  # noqa: SLF001 - release the mapping before unlinking
            self._file = None
            self.path.unlink(missing_ok=True)
            os.close(self._lock_fd)
