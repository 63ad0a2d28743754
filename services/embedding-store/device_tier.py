"""The device tier: every row of a table in GPU memory, over the CUDA ops.

The same layout as the host tier (``tier.py``) on the GPU, each row padded to 16 bytes (the
gather loads 4 weights at once): rows of stride float32 whose first width columns are the
host tier's row and their keys, in fixed-size chunks (``device_rows.RowChunks``: growth adds
chunks and copies nothing, a shrink compacts in place through one chunk of scratch), and the
CUDA hash index, all CUDA tensors; rows ``[0, size)`` are in use. Keys, gradients and results
cross the interface as CPU tensors (the store's contract); the rows never leave the GPU except
for ``export``, ``inspect`` and the weights a pull returns.

Differences from the host tier, by design: new rows are numbered by an atomic counter (a
table's row order differs from the host tier's; keys, weights and statistics do not), and
admission (``admission_score``, ``admission_probability``) is refused by name until the
device tier implements it.

``EmbeddingStore(..., tier="device")`` and ``streamrec-embedding-store serve --tier device``
build one per table; where there is no CUDA GPU that raises ``TierUnavailable`` saying so.
``DeviceTable(..., device="cpu")`` runs the same table on the CPU build of the kernels (the
tests' "CPU device": every tensor a CPU tensor, every kernel body on CPU threads).
:meth:`DeviceTable.pull_resident` hands the weights over as CUDA tensors (the store's ``pull(...,
device=self.device)``, for a trainer on the same GPU): no copy through host memory.

Streams: a CUDA table runs every op on a stream of its own (:meth:`DeviceTable.ordered`), so
its ops run in call order whichever thread (with its own current stream) calls, even where an
op leaves work queued when the table's lock is released (``advance_day``, ``clear_dirty``,
``mark_dirty``, ``reset``). The table's stream first waits for the caller's (the inputs it
wrote), and the caller's for the table's at the end (the results); the table's tensors are
allocated on its stream, so only what crosses streams is recorded on the other one
(``record_stream``): inputs already on the GPU, and the weights :meth:`pull_resident` returns.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Concatenate, ParamSpec, TypeVar

import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store import cuda_ext
from streamrec.embedding_store.device_rows import RowChunks, chunk_shift
from streamrec.embedding_store.device_staging import Staging, aligned
from streamrec.embedding_store.errors import CapacityExceeded, InvalidInput
from streamrec.embedding_store.tier import MAX_LOAD, MIN_ROWS, TableTier, index_slots
from streamrec.store_schema import TableOptions

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _ordered(
    method: Callable[Concatenate[DeviceTable, _P], _R],
) -> Callable[Concatenate[DeviceTable, _P], _R]:
    """The method runs on the table's stream (:meth:`DeviceTable.ordered`)."""

    @functools.wraps(method)
    def run(self: DeviceTable, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self.ordered():
            return method(self, *args, **kwargs)

    return run


class DeviceTable(TableTier):
    """All rows in GPU memory, indexed by the CUDA hash index.

    Args:
        options: the table.
        seed: the store's initializer seed.
        capacity: most rows this table may hold (None: bounded by GPU memory).
        device: ``"cuda"``/``"cuda:N"`` (a GPU), or ``"cpu"`` (the CPU build of the kernels).
        chunk_rows: rows per chunk, a power of two (None: from the initial rows and stride,
            :func:`~streamrec.embedding_store.device_rows.chunk_shift`).

    Raises:
        TierUnavailable: no CUDA GPU here (or the CUDA extension cannot be built).
        InvalidInput: an option the device tier does not implement yet (admission).
    """

    def __init__(
        self,
        options: TableOptions,
        seed: int = 0,
        capacity: int | None = None,
        device: str | torch.device = "cuda",
        chunk_rows: int | None = None,
    ) -> None:
        super().__init__(options, seed)
        # first: without a GPU, that is what the caller hears
        cpu = torch.device(device).type == "cpu"
        self._ops = cuda_ext.load_cpu() if cpu else cuda_ext.load(device)
        self.device = self._ops.device
        if options.admission_score is not None or options.admission_probability < 1.0:
            raise InvalidInput(
                f"table {options.name!r}: admission_score / admission_probability are not "
                "implemented by the device tier yet; use tier 'host' or 'ssd'"
            )
        # rows padded to 16 bytes: the gather loads 4 weights at once
        self._gp = cuda_ext.TableParams.of(self.params, pad=True)
        self._stride = self._gp.stride
        self.capacity = capacity
        rows = max(MIN_ROWS, options.init_capacity)
        if capacity is not None:
            rows = max(MIN_ROWS, min(rows, capacity))
        self._init_rows = rows
        #: every op's stream (None on the CPU build: calls finish when they return)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if chunk_rows is None:
            shift = chunk_shift(rows, self._stride)
        elif chunk_rows >= 1 and chunk_rows & (chunk_rows - 1) == 0:
            shift = chunk_rows.bit_length() - 1
        else:
            raise InvalidInput(f"chunk_rows must be a power of two, got {chunk_rows}")
        with self.ordered():  # the table's tensors allocated on its stream
            self._rows = RowChunks(self._stride, shift, self.device)
            self._rows.reserve(rows)
            self._slots = self._ops.index_new(index_slots(rows))
            self._next = torch.zeros(1, dtype=torch.int64, device=self.device)  # next row id
            self._misses = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._size = 0
        #: host inputs go to the GPU through pinned buffers reused between steps
        self.staging = Staging(self.device)
        #: where :meth:`pull_resident` returns the weights
        self.resident_device = self.device

    # -- ordering ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def ordered(self) -> Iterator[None]:
        """The table's stream current inside, after the caller's stream's work so far; the
        caller's stream waits for what was queued inside (on leaving, even by an error). One
        stream for every op of the table: each runs after the one before, whichever thread's
        stream called it (the store's table lock orders the calls; this orders the GPU work).
        Nothing on the CPU build."""
        stream = self._stream
        if stream is None:
            yield
            return
        caller = torch.cuda.current_stream(self.device)
        stream.wait_stream(caller)
        try:
            with torch.cuda.stream(stream):
                yield
        finally:
            caller.wait_stream(stream)

    # -- growth and creation ------------------------------------------------------------
    def _reserve(self, extra: int) -> None:
        """Room for ``extra`` more rows: new chunks (no row moves, ids kept) and a larger
        index."""
        need = self._size + extra
        self._rows.reserve(need)
        if need > MAX_LOAD * self._slots.shape[0]:
            self._slots = self._ops.rebuild(self._slots, index_slots(need))

    def _find_or_create(self, keys: torch.Tensor, why: str) -> tuple[torch.Tensor, int]:
        """Rows (n,) int64 cuda of keys (n,) int64 cuda, absent ones created (initial
        values); the count created. Refuses (nothing written) past ``capacity``.

        Host syncs: the miss count (one int64), and only where keys are new the count of
        distinct new keys and the insert's error flag. Only the missed positions are probed
        again (by the insert).
        """
        self._misses.zero_()
        rows = self._ops.find(self._slots, keys, self._misses)
        if int(self._misses.item()) == 0:
            return rows, 0
        missed = rows < 0
        absent = keys[missed]
        distinct = int(torch.unique(absent).numel())
        if self.capacity is not None and self._size + distinct > self.capacity:
            raise CapacityExceeded(
                f"table {self.options.name!r}: {why} {distinct} new rows would exceed "
                f"capacity {self.capacity} (holds {self._size})"
            )
        self._reserve(distinct)
        created = self._ops.find_or_insert(
            self._slots, absent, self._next, self._rows, None, self._gp
        )
        rows.masked_scatter_(missed, created)  # in position order, as keys[missed]
        # calls on a table are serialised: exactly the distinct absent keys were created
        self._size += distinct
        return rows, distinct

    def _compact(self, idx: torch.Tensor) -> None:
        """Keeps rows ``idx`` (m,) int64 cuda, ascending, renumbered 0..m-1."""
        m = idx.numel()
        self._rows.compact(self._ops, idx, self._gp)  # in place, one chunk of scratch
        self._rows.release_from(max(m, self._init_rows))
        self._size = m
        self._next.fill_(m)
        self._slots = self._ops.index_new(index_slots(max(m, self._init_rows)))
        if m:
            ids = torch.arange(m, dtype=torch.int64, device=self.device)
            keys = torch.empty(m, dtype=torch.int64, device=self.device)
            self._ops.read_rows(self._rows, ids, 0, 1, self._gp, out_keys=keys)
            self._ops.insert_or_assign(self._slots, keys, ids)

    def _cuda(self, t: torch.Tensor, dtype: torch.dtype, name: str = "") -> torch.Tensor:
        """t as a contiguous tensor of dtype on the table's device: as it is when already
        there; from the host through the pinned buffer ``name`` (a step's inputs), or a plain
        copy (unnamed: loads and inspection, off the hot path)."""
        if name:
            out = self.staging.to_device(name, t, dtype)
        else:
            out = aligned(t.to(device=self.device, dtype=dtype).contiguous())
        if self._stream is not None and t.device == self.device:
            out.record_stream(self._stream)  # the caller's tensor, read on the table's stream
        return out

    # -- the tier interface ---------------------------------------------------------------
    def pull_resident(self, keys: torch.Tensor, create: bool) -> torch.Tensor:
        """Weights (n, dim) float32 of keys (n,) int64 (CPU or cuda), left on the device
        (ready on the caller's current stream)."""
        caller = torch.cuda.current_stream(self.device) if self._stream is not None else None
        with self.ordered():
            kd = self._cuda(keys, torch.int64, "keys")
            if create:
                rows, created = self._find_or_create(kd, "creating")
                self.counters["rows_created"] += created
            else:
                rows = self._ops.find(self._slots, kd)
            out = self._ops.gather(self._rows, rows, self._gp)
        if caller is not None:
            out.record_stream(caller)  # freed by the caller: reused after its stream's reads
        return out

    @_ordered
    def pull(self, keys: torch.Tensor, create: bool, hint: object = None) -> torch.Tensor:
        return self.pull_resident(keys, create).cpu()

    @_ordered
    def push(
        self, keys: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> bool:
        rows, created = self._find_or_create(self._cuda(keys, torch.int64, "keys"), "creating")
        self.counters["rows_created"] += created
        self.counters["rows_expanded"] += self._ops.update(
            self._rows,
            None,
            rows,
            self._cuda(grads, torch.float32, "grads"),
            self._cuda(shows, torch.float32, "shows"),
            self._cuda(clicks, torch.float32, "clicks"),
            self._gp,
        )
        return True

    def size(self) -> int:
        return self._size

    @_ordered
    def inspect(self, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = self._ops.find(self._slots, self._cuda(keys, torch.int64))
        full = self._ops.read_rows(self._rows, rows.clamp(min=0), 0, self.width, self._gp).cpu()
        return self._stats_of(rows.cpu(), full)

    @_ordered
    def advance_day(self) -> None:
        self._ops.advance_day(self._rows, self._size, self._gp)

    @_ordered
    def shrink(self) -> int:
        keep = self._ops.shrink(self._rows, self._size, self._gp)
        idx = keep.nonzero().squeeze(1)
        deleted = self._size - idx.numel()
        if deleted:
            self._compact(idx)
        self.counters["rows_deleted"] += deleted
        return deleted

    @_ordered
    def export(self, select: int) -> tuple[torch.Tensor, torch.Tensor]:
        mask = self._ops.select_rows(self._rows, self._size, select, self._gp)
        idx = mask.nonzero().squeeze(1)
        keys = torch.empty(idx.numel(), dtype=torch.int64, device=self.device)
        rows = self._ops.read_rows(self._rows, idx, 0, self.width, self._gp, out_keys=keys)
        return keys.cpu(), rows.cpu()

    @_ordered
    def clear_dirty(self) -> None:
        self._ops.clear_dirty(self._rows, self._size, self._gp)

    @_ordered
    def import_rows(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        if rows.dim() != 2 or rows.shape[1] != self.width or rows.shape[0] != keys.numel():
            raise InvalidInput(
                f"table {self.options.name!r}: rows must be ({keys.numel()}, {self.width}), "
                f"got {tuple(rows.shape)}"
            )
        where, _ = self._find_or_create(self._cuda(keys, torch.int64), "loading")
        self._ops.write_rows(self._rows, where, 0, self._cuda(rows, torch.float32), self._gp)

    @_ordered
    def import_weights(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if values.dim() != 2 or values.shape != (keys.numel(), self.dim):
            raise InvalidInput(
                f"table {self.options.name!r}: values must be ({keys.numel()}, {self.dim}), "
                f"got {tuple(values.shape)}"
            )
        rows, _ = self._find_or_create(self._cuda(keys, torch.int64), "loading")
        v = self._cuda(values, torch.float32)
        self._ops.write_rows(self._rows, rows, _C.EMBED_W, v, self._gp)
        expanded = (v[:, 1:] != 0).any(dim=1).to(torch.int64) * _C.FLAG_EXPANDED
        flags = self._ops.read_rows(self._rows, rows, _C.FLAGS, 1, self._gp).to(torch.int64)
        flags |= expanded[:, None]
        self._ops.write_rows(self._rows, rows, _C.FLAGS, flags.to(torch.float32), self._gp)

    @_ordered
    def mark_dirty(self, keys: torch.Tensor) -> None:
        rows = self._ops.find(self._slots, self._cuda(keys, torch.int64))
        self._ops.mark_dirty(self._rows, rows, self._gp)  # absent (-1) skipped

    @_ordered
    def reset(self) -> None:
        self._size = 0
        self._rows.release_from(self._init_rows)
        self._next.zero_()
        self._slots = self._ops.index_new(index_slots(self._init_rows))

    def bytes_used(self) -> dict[str, int]:
        return {"device": self._rows.nbytes() + self._slots.numel() * 8}

    def row_chunks(self) -> RowChunks:
        """The chunked rows (for inspection: their chunk tensors, bytes and R)."""
        return self._rows

    @_ordered
    def close(self) -> None:
        self._size = 0
        self._rows.clear()
        self.staging.release()
        self._slots = self._ops.index_new(1)
