"""The in-process embedding store: several dynamic sparse tables behind pull/push.

Example:
    >>> store = EmbeddingStore([TableOptions(name="item", dim=16, embedx_threshold=0)])
    >>> w = store.pull("item", torch.tensor([3, 7, 3]))         # (3, 16) float32
    >>> store.push("item", torch.tensor([3, 7]), torch.ones(2, 16))

Semantics (PaddleRec's CtrCommonAccessor, docs/design-notes.md):

- ``pull(create=True)`` finds or creates rows (new rows get their deterministic initial
  values); ``pull(create=False)`` (prediction) creates nothing and reads absent keys as zeros.
- ``push`` sums duplicate keys, refuses NaN/Inf, creates absent keys (PaddleRec does),
  adds show/click, resets unseen days, runs the embed rule, the embedx rule on expanded rows,
  and expands rows whose score reached ``embedx_threshold`` (embedx initialised, trained from
  the next push on). ``shows`` defaults to 1 per occurrence, ``clicks`` to 0.
- ``advance_day`` adds one unseen day to every row; ``shrink`` decays show/click by
  ``show_click_decay_rate`` and deletes rows with score < ``delete_threshold`` or unseen
  days > ``delete_after_unseen_days``; ``erase`` deletes given keys. Every deleted key is
  recorded until the next base or delta save, which carries it to serving
  (:mod:`~streamrec.embedding_store.deletes`), and counted by reason (``stats()``).
- ``model_version``: the last base or delta saved or loaded
  (:mod:`~streamrec.embedding_store.persistence.versions`); a delta loads only on the version
  it was saved after.

Thread safety: each table has a reader-writer lock (:mod:`~streamrec.embedding_store.locks`);
pulls of present keys share it, pushes, creation, shrink, save and load hold it alone. The
C++ ops release the GIL.

Inputs are checked by :mod:`~streamrec.embedding_store.validation` (the client's rules too);
the rows live in one tier per table (:mod:`~streamrec.embedding_store.tiers.table_tier`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store import lookup as lookups
from streamrec.embedding_store.dedup import unique_keys
from streamrec.embedding_store.deletes import DeletedKeys, DeleteReason
from streamrec.embedding_store.errors import (
    InvalidInput,
    StoreClosed,
    UnknownTable,
)
from streamrec.embedding_store.locks import RWLock
from streamrec.embedding_store.persistence.save_load import load_store, save_store
from streamrec.embedding_store.push_check import CheckedPush, PushDefaults, checked_push
from streamrec.embedding_store.store_blocks import BlockRows
from streamrec.embedding_store.tiers.cached_table import CachedTable
from streamrec.embedding_store.tiers.device_block import DeviceBlocks
from streamrec.embedding_store.tiers.device_table import DeviceTable
from streamrec.embedding_store.tiers.host_table import HostTable
from streamrec.embedding_store.tiers.ssd_table import SsdTable
from streamrec.embedding_store.tiers.table_tier import TableTier
from streamrec.embedding_store.validation import as_keys, check_aligned
from streamrec.malloc import keep_freed_memory
from streamrec.save_modes import SaveMode
from streamrec.store_schema import StoreOptions, TableOptions

#: called after each table of pull_many/push_many with (table, keys, seconds)
TableHook = Callable[[str, int, float], None]


def _resident(tier: TableTier) -> torch.device | None:
    """The device whose memory a tier pulls rows from when it is not the CPU (a DeviceTable,
    a CachedTable on a GPU), else None."""
    device = tier.resident_device
    return None if device.type == "cpu" else device


class EmbeddingStore(BlockRows):
    """Dynamic multi-table sparse parameter store (PaddleRec tables, OneEmbedding tiers).

    Args:
        tables: one :class:`TableOptions` per table (names unique); may be empty, more come
            with :meth:`add_tables`.
        tier: ``"host"`` (RAM), ``"ssd"`` (files under ``persistent_path`` with a RAM cache of
            ``cache_budget_mb`` MiB per table, at most ``capacity`` rows per table) or
            ``"device"`` (every row in GPU memory, the CUDA extension; TierUnavailable where
            there is no CUDA GPU).
        persistent_path: directory of the ssd tier's files.
        cache_budget_mb: RAM cache per table of the ssd tier, MiB.
        gpu_cache_budget_mb: tiers host and ssd: a write-back cache of each table's hot rows
            in GPU memory, MiB (:mod:`~streamrec.embedding_store.tiers.cached_table`); None: none.
        gpu_cache_device: where that cache lives (``"cuda"``, ``"cuda:N"``; ``"cpu"`` runs
            the same cache in RAM, for tests).
        device: tier device's rows (``"cuda"``, ``"cuda:N"``; None: the current CUDA device;
            ``"cpu"``: the CPU build of the kernels, for tests).
        capacity: most rows per table (required for ssd; host: unbounded when None).
        seed: initializer seed; initial values are a function of (seed, table, key, column).
        num_threads: threads of the C++ ops (sets torch's intra-op threads, process-wide).
    """

    def __init__(
        self,
        tables: Sequence[TableOptions],
        tier: str = "host",
        persistent_path: str | None = None,
        cache_budget_mb: float | None = None,
        capacity: int | None = None,
        seed: int = 0,
        num_threads: int | None = None,
        gpu_cache_budget_mb: float | None = None,
        gpu_cache_device: str = "cuda",
        device: str | None = None,
    ) -> None:
        self.options = StoreOptions.parse(
            {
                "tier": tier,
                "persistent_path": persistent_path,
                "cache_budget_mb": cache_budget_mb,
                "capacity": capacity,
                "seed": seed,
                "num_threads": num_threads,
                "gpu_cache_budget_mb": gpu_cache_budget_mb,
                "gpu_cache_device": gpu_cache_device,
                "device": device,
            },
            source="store options",
        )
        keep_freed_memory()  # per-step buffers reuse the heap's pages (streamrec.malloc)
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self._tables: dict[str, TableOptions] = {}
        self._tiers: dict[str, TableTier] = {}
        self._locks: dict[str, RWLock] = {}
        self._counts: dict[str, dict[str, int]] = {}
        #: keys deleted since the last base/delta save, per table (deletes.py)
        self._deleted: dict[str, DeletedKeys] = {}
        #: rows deleted per table and reason (DeleteReason values), under _count_lock
        self._deleted_rows: dict[str, dict[str, int]] = {}
        #: the last base or delta saved or loaded (persistence/versions.py); 0: none
        self.model_version = 0
        self._count_lock = threading.Lock()
        self._push_defaults = PushDefaults()  # the shows and clicks of a push sending none
        #: the block ops of device tables, per device (device_block.py)
        self._device_blocks: dict[torch.device, DeviceBlocks] = {}
        self._day = 0
        self._closed = False
        self._admin = threading.Lock()  # serialises save/load/shrink/advance_day/add_tables
        self.add_tables(tables)

    def add_tables(self, tables: Sequence[TableOptions | dict[str, Any]]) -> None:
        """Makes ``tables`` (names new to this store), empty. A store may start with none and
        get its tables later: a shard's namespace gets them from ``create_tables``
        (:mod:`~streamrec.embedding_store.service.namespaces`).

        Raises:
            InvalidInput: a name repeated, or one this store already holds.
            StoreClosed: the store is closed.
        """
        opts = [TableOptions.parse(t) for t in tables]  # an instance is taken as it is
        names = [t.name for t in opts]
        with self._admin:
            if self._closed:
                raise StoreClosed("the embedding store is closed")
            dup = sorted({n for n in names if names.count(n) > 1 or n in self._tables})
            if dup:
                raise InvalidInput(f"tables: duplicate table names {dup}")
            made: dict[str, TableTier] = {}
            try:
                for t in opts:
                    made[t.name] = self._make_tier(t)
            except BaseException:
                for tier in made.values():  # an ssd table holds a lock file
                    tier.close()
                raise
            for t in opts:  # lock and counters first: tier() is what lets a call in
                self._locks[t.name] = RWLock()
                with self._count_lock:
                    self._counts[t.name] = {"pull_keys": 0, "push_keys": 0}
                    self._deleted_rows[t.name] = {}
                self._deleted[t.name] = DeletedKeys()
                self._tables[t.name] = t
                self._tiers[t.name] = made[t.name]

    def _make_tier(self, t: TableOptions) -> TableTier:
        """The table's tier; TierUnavailable for tier 'device' (or a GPU cache) without a
        CUDA GPU, saying so."""
        o = self.options
        if o.tier == "device":
            return DeviceTable(t, o.seed, o.capacity, device=o.device or "cuda")
        backing: HostTable | SsdTable
        if o.tier == "host":
            backing = HostTable(t, o.seed, o.capacity)
        else:
            backing = SsdTable(t, o.seed, o.capacity, o.cache_budget_mb, o.persistent_path)
        if o.gpu_cache_budget_mb is None:
            return backing
        try:
            return CachedTable(backing, o.gpu_cache_budget_mb, o.gpu_cache_device)
        except BaseException:
            backing.close()
            raise

    # -- accessors ----------------------------------------------------------------------
    @property
    def tables(self) -> dict[str, TableOptions]:
        """Table name -> options, in construction order."""
        return dict(self._tables)

    @property
    def day(self) -> int:
        """Days advanced since the store was created (or the loaded checkpoint's day)."""
        return self._day

    @day.setter
    def day(self, day: int) -> None:
        """Sets the day count (a full checkpoint's load restores the saved one)."""
        self._day = int(day)

    def tier(self, table: str) -> TableTier:
        """The tier holding ``table``'s rows. Its layout (``dim``, ``width``, ``options``) is
        fixed; read or write its rows only under :meth:`exclusive` (or the store's calls).

        Raises:
            StoreClosed: the store is closed.
            UnknownTable: no such table.
        """
        if self._closed:
            raise StoreClosed("the embedding store is closed")
        tier = self._tiers.get(table) if isinstance(table, str) else None
        if tier is None:
            raise UnknownTable(f"unknown table {table!r}; tables are {list(self._tables)}")
        return tier

    @contextmanager
    def exclusive(self, table: str) -> Iterator[TableTier]:
        """``table``'s tier under the table's write lock: no pull, push or maintenance of the
        table runs meanwhile (checkpoint save and load export and import rows this way)."""
        tier = self.tier(table)
        with self._locks[table].write():
            yield tier

    # -- pull / push --------------------------------------------------------------------
    def pull(
        self, table: str, keys: Any, create: bool = True, device: Any | None = None
    ) -> torch.Tensor:
        """Weights of keys.

        Args:
            table: table name.
            keys: (n,) int64 tensor or ndarray (duplicates allowed).
            create: create absent keys (training); False reads them as zeros (prediction).
            device: where the weights are wanted (None: CPU). When the table's rows live
                there (tier device, or a GPU cache: :meth:`resident_device`), they are
                gathered there, with no copy through host memory.

        Returns:
            (n, dim) float32 tensor (a copy; column 0 embed, columns 1.. embedx, zeros until
            the row is expanded).
        """
        tier = self.tier(table)
        keys = as_keys(keys)
        lock = self._locks[table]
        with self._count_lock:
            self._counts[table]["pull_keys"] += keys.numel()
        if device is not None and torch.device(device).type != "cpu":
            want = torch.device(device)
            if want.type == "cuda" and want.index is None:
                want = torch.device("cuda", torch.cuda.current_device())
            if _resident(tier) == want:
                with lock.write():
                    return tier.pull_resident(keys, create)
            return self._pull_host(tier, lock, keys, create).to(want)
        return self._pull_host(tier, lock, keys, create)

    def resident_device(self) -> torch.device | None:
        """The CUDA device every table's rows are pulled from (tier device or a GPU cache),
        where :meth:`pull` with that ``device`` hands them over without a host copy; None
        when the rows live in host memory."""
        devices = {_resident(tier) for _name, tier in self._each_tier()}
        return devices.pop() if len(devices) == 1 else None

    def _pull_host(
        self, tier: TableTier, lock: RWLock, keys: torch.Tensor, create: bool
    ) -> torch.Tensor:
        """:meth:`pull` into host memory: present keys under the shared lock where the tier
        allows it, else (or to create rows) under the exclusive one."""
        hint, epoch = None, -1
        if tier.concurrent_reads:  # present keys (or a read-only pull) under a shared lock
            with lock.read():
                epoch = lock.epoch
                out, hint = tier.read(keys, create)
                if out is None and not create:
                    out = tier.pull(keys, False, hint)
            if out is not None:
                return out
        with lock.write():
            # the hint holds what the shared read found; valid only if nothing was written
            return tier.pull(keys, create, hint if lock.epoch == epoch + 1 else None)

    def push(
        self,
        table: str,
        keys: Any,
        grads: Any,
        shows: Any | None = None,
        clicks: Any | None = None,
    ) -> None:
        """Applies gradients of the loss and show/click counts.

        Args:
            table: table name.
            keys: (n,) int64; duplicates are summed first (grads, shows and clicks).
            grads: (n, dim) float32, finite (a push with NaN/Inf is refused whole).
            shows: (n,) float32 >= 0, or None for 1 per key occurrence.
            clicks: (n,) float32 >= 0, or None for 0.

        Absent keys are created first (PaddleRec's behaviour), subject to admission. The
        inputs are only read (the service passes read-only views of its frames).
        """
        self._write_push(
            checked_push(table, self.tier(table), keys, grads, shows, clicks, self._push_defaults)
        )

    def _write_push(self, p: CheckedPush) -> None:
        """Applies a push checked by :func:`~streamrec.embedding_store.push_check.checked_push`."""
        n, dim = p.keys.numel(), p.tier.dim
        if n == 0:
            return
        with self._count_lock:
            self._counts[p.table]["push_keys"] += n
        with self._locks[p.table].write():
            if p.tier.push(p.keys, p.grads, p.shows, p.clicks):
                return
            # duplicate keys: sum them (in float64, in key order, as the host tier's update
            # does), then push once per key
            uniq, inverse = unique_keys(p.keys)
            m, f64 = uniq.numel(), torch.float64
            grads = torch.zeros(m, dim, dtype=f64).index_add_(0, inverse, p.grads.to(f64))
            shows = torch.zeros(m, dtype=f64).index_add_(0, inverse, p.shows.to(f64))
            clicks = torch.zeros(m, dtype=f64).index_add_(0, inverse, p.clicks.to(f64))
            grads, shows, clicks = grads.float(), shows.float(), clicks.float()
            if not p.tier.push(uniq, grads, shows, clicks):
                raise AssertionError("push of distinct keys reported duplicates")

    # -- several tables in one call (the service's one request per shard and batch) ----
    def pull_many(
        self,
        tables: Sequence[str],
        keys: Sequence[Any],
        create: bool = True,
        on_table: TableHook | None = None,
        device: Any | None = None,
    ) -> list[torch.Tensor]:
        """:meth:`pull` of each table in order; every table and key array is checked first,
        so a bad one refuses the call before any row is created.

        Args:
            tables: T table names (a name may repeat).
            keys: T arrays, ``keys[t]`` (n_t,) int64 for ``tables[t]``.
            create: as in :meth:`pull`.
            device: as in :meth:`pull`.
            on_table: called after each table with (table, n_t, seconds) (the service's
                per-table metrics).

        Returns:
            T tensors, ``out[t]`` (n_t, dim_t) float32.
        """
        check_aligned(tables, keys=keys)
        for t in tables:
            self.tier(t)
        keys = [as_keys(k, f"table {t!r}: keys") for t, k in zip(tables, keys, strict=True)]
        out = []
        for table, k in zip(tables, keys, strict=True):
            started = time.perf_counter()
            out.append(self.pull(table, k, create, device))
            if on_table is not None:
                on_table(table, k.numel(), time.perf_counter() - started)
        return out

    def push_many(
        self,
        tables: Sequence[str],
        keys: Sequence[Any],
        grads: Sequence[Any],
        shows: Sequence[Any | None] | None = None,
        clicks: Sequence[Any | None] | None = None,
        on_table: TableHook | None = None,
    ) -> None:
        """:meth:`push` of each table in order. Every table's part is validated (table,
        dtypes, shapes, NaN/Inf) before any is written: a bad one refuses the whole call and
        nothing is written to any table.

        Args:
            tables: T table names.
            keys: T arrays (n_t,) int64.
            grads: T arrays (n_t, dim_t) float32.
            shows: None, or T arrays (n_t,) float32 (or None: 1 per occurrence).
            clicks: None, or T arrays (n_t,) float32 (or None: 0).
            on_table: called after each table with (table, n_t, seconds).
        """
        t_count = check_aligned(tables, keys=keys, grads=grads, shows=shows, clicks=clicks)
        shows = [None] * t_count if shows is None else shows
        clicks = [None] * t_count if clicks is None else clicks
        checked = [
            checked_push(t, self.tier(t), k, g, s, c, self._push_defaults)
            for t, k, g, s, c in zip(tables, keys, grads, shows, clicks, strict=True)
        ]
        for p in checked:
            started = time.perf_counter()
            self._write_push(p)
            if on_table is not None:
                on_table(p.table, p.keys.numel(), time.perf_counter() - started)

    def accept_restarts(self, incarnations: list[int | None] | None = None) -> list[str]:
        """No shards to restart in-process: nothing restarted (``SparseStore``)."""
        return []

    def incarnations(self) -> list[int | None]:
        """No shards in-process: none (``SparseStore``)."""
        return []

    def initial_values(self, table: str, keys: Any, expanded: bool = False) -> torch.Tensor:
        """The deterministic initial weights a row of each key gets, (n, dim) float32; the
        embedx columns as zeros unless ``expanded`` (as drawn when the row expands)."""
        tier = self.tier(table)
        return _C.initial_weights(as_keys(keys), tier.params, expanded)

    def inspect(self, table: str, keys: Any) -> dict[str, torch.Tensor]:
        """Per-key statistics, read-only: ``present`` (n,) bool, ``show``, ``click``,
        ``unseen_days``, ``score`` (n,) float32, ``expanded`` (n,) bool (absent keys: zeros)."""
        tier = self.tier(table)
        keys = as_keys(keys)
        lock = self._locks[table]
        with lock.read() if tier.concurrent_reads else lock.write():
            return tier.inspect(keys)

    # -- OneEmbedding-style multi-table lookup and bag pooling (lookup.py) ---------------
    def lookup(self, ids: Any, table_ids: Any | None = None, create: bool = True) -> torch.Tensor:
        """Multi-table lookup (OneEmbedding's): ids (batch, num_tables) int64 -> (batch,
        num_tables, dim) float32, or ids (n,) with table_ids (n,) -> (n, dim); see
        :func:`streamrec.embedding_store.lookup.lookup`."""
        return lookups.lookup(self, ids, table_ids, create)

    def pull_bags(
        self, table: str, keys: Any, offsets: Any, pooling: str = "sum", create: bool = True
    ) -> torch.Tensor:
        """Pooled bags (DLRM's EmbeddingBag), no autograd: keys (nnz,) int64, offsets
        (bags + 1,) int64 -> (bags, dim) float32; see
        :func:`streamrec.embedding_store.lookup.pull_bags`."""
        return lookups.pull_bags(self, table, keys, offsets, pooling, create)

    # -- table maintenance --------------------------------------------------------------
    def size(self, table: str) -> int:
        """Rows held by ``table``."""
        tier = self.tier(table)
        with self._locks[table].read():
            return tier.size()

    def advance_day(self) -> None:
        """One more unseen day for every row of every table (call at the end of a day)."""
        with self._admin:
            for name, tier in self._each_tier():
                with self._locks[name].write():
                    tier.advance_day()
            self._day += 1

    def shrink(self) -> dict[str, int]:
        """Decays show/click and deletes rows (see the module doc); returns deleted per table."""
        out = {}
        with self._admin:
            for name, tier in self._each_tier():
                with self._locks[name].write():
                    gone = tier.shrink()
                    self._deleted[name].add(gone)
                out[name] = int(gone.numel())
                self.count_deleted(name, DeleteReason.SHRINK, out[name])
        return out

    def erase(self, table: str, keys: Any) -> int:
        """Deletes the rows of ``keys`` (n,) int64 (absent ones and repeats ignored), recorded
        for the next delta as a shrink's deletes are; returns the rows deleted."""
        tier = self.tier(table)
        keys, _ = unique_keys(as_keys(keys))
        with self._locks[table].write():
            gone = tier.erase(keys)
            self._deleted[table].add(gone)
        self.count_deleted(table, DeleteReason.ERASE, int(gone.numel()))
        return int(gone.numel())

    def deleted_keys(self, table: str) -> DeletedKeys:
        """The keys of ``table`` deleted since the last base or delta save; read or change
        it only under :meth:`exclusive` (saves and loads do)."""
        self.tier(table)
        return self._deleted[table]

    def count_deleted(self, table: str, reason: DeleteReason, rows: int) -> None:
        """Counts ``rows`` deleted from ``table`` for ``reason`` (``stats()``,
        ``rows_deleted_by_reason``)."""
        if rows:
            with self._count_lock:
                by_reason = self._deleted_rows[table]
                by_reason[reason.value] = by_reason.get(reason.value, 0) + rows

    def _each_tier(self) -> list[tuple[str, TableTier]]:
        if self._closed:
            raise StoreClosed("the embedding store is closed")
        return list(self._tiers.items())

    def stats(self) -> dict[str, Any]:
        """JSON-able statistics.

        Keys: ``tier``, ``day``, ``model_version``, ``rows`` (total), ``bytes`` (tier ->
        bytes allocated), ``tables``: name -> {``rows``, ``bytes`` (tier -> bytes),
        ``rows_by_tier`` (tier -> rows), ``rows_created``, ``rows_expanded``,
        ``rows_deleted`` (by shrink), ``rows_deleted_by_reason`` (reason -> rows,
        :class:`DeleteReason` values: shrink, erase, delta_load), ``deletes_pending`` (keys
        the next delta carries), ``rows_refused`` (admission), ``cache_hits``,
        ``cache_misses``, ``cache_hit_rate`` (ssd tier; the host tier has no cache and
        reports 1.0), ``cache_rows_max`` (ssd), ``pull_keys``, ``push_keys``}.
        """
        tables: dict[str, Any] = {}
        total_bytes: dict[str, int] = {}
        for name, tier in self._each_tier():
            with self._locks[name].read():
                s = tier.stats()
            s = dict(s)
            s["deletes_pending"] = len(self._deleted[name])
            with self._count_lock:
                s.update(self._counts[name])
                s["rows_deleted_by_reason"] = dict(self._deleted_rows[name])
            looked = s["cache_hits"] + s["cache_misses"]
            s["cache_hit_rate"] = (s["cache_hits"] / looked) if looked else 1.0
            s.setdefault("rows_by_tier", {self.options.tier: s["rows"]})
            for k, v in s["bytes"].items():
                total_bytes[k] = total_bytes.get(k, 0) + int(v)
            tables[name] = s
        return {
            "tier": self.options.tier,
            "day": self._day,
            "model_version": self.model_version,
            "rows": sum(t["rows"] for t in tables.values()),
            "bytes": total_bytes,
            "tables": tables,
        }

    # -- save / load --------------------------------------------------------------------
    def save(
        self,
        path: str,
        mode: SaveMode = SaveMode.CHECKPOINT,
        converter: Any | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Saves to directory ``path`` (see :mod:`streamrec.embedding_store.persistence.save_load`).

        Args:
            path: the directory (created; an existing one is replaced only once the new one
                is complete).
            mode: checkpoint (every row with optimizer state), batch (the same, meant after
                the daily shrink), base (score >= base_threshold, weights) or delta (changed
                since the last base/delta, score >= delta_threshold, unseen days <=
                delta_keep_days, weights); a string naming one is taken too.
            converter: where base/delta rows go (default: files in ``path``).
            extra: JSON-able facts for the manifest (e.g. the shard id and count).

        Returns:
            The manifest written (JSON-able).
        """
        with self._admin:
            return save_store(self, path, mode, converter, extra)

    def load(
        self, path: str, converter: Any | None = None, shard: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """Loads a save of :meth:`save` or of N shards, checksums first (a bad one changes
        nothing: CheckpointError). checkpoint/batch replace their tables' rows and the day;
        base/delta set their keys' weights (``converter`` as at save). ``shard`` (K, N): only
        shard K of N's keys, from a save of any shard count (streaming, :mod:`.reshard`)."""
        with self._admin:
            return load_store(self, path, converter, shard)

    def close(self) -> None:
        """Releases the tiers' memory and files; later calls raise StoreClosed."""
        with self._admin:
            for name, tier in list(self._tiers.items()):
                with self._locks[name].write():
                    tier.close()
            for blocks in self._device_blocks.values():
                blocks.release()
            self._closed = True

    def __enter__(self) -> EmbeddingStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
