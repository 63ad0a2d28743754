"""The device tier: every row of a table in GPU memory, over the CUDA ops.

The same layout as the host tier (``tier.py``) on the GPU, each row padded to 16 bytes (the
gather loads 4 weights at once): rows of stride float32 whose first width columns are the
host tier's row and their keys, in fixed-size chunks (``device_rows.RowChunks``: growth adds
chunks and copies nothing, a shrink compacts in place through one chunk of scratch), and the
CUDA hash index, all CUDA tensors; rows ``[0, size)`` are in use. Keys, gradients and results
cross the interface as CPU tensors (the store's contract); the rows never leave the GPU except
for ``export``, ``inspect`` and the weights a pull returns.

Compact rows (``dtype`` fp16 / bf16) are the host tier's words: the gather decodes their
weights, a push rounds stochastically with the same bits as the host tier (the table's push
counter ``round_step``, bumped once per push as there), imported weights are encoded by
:mod:`~streamrec.embedding_store.tiers.row_codec` as there.

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

Blocks (:mod:`~streamrec.embedding_store.tiers.device_block`): the store's ``pull_rows`` and
``push_rows`` run every device table of a step in one launch per op. Those ops never wait for
the device: each table reserves rows and index slots ahead for every key it is sent (an upper
bound on its size, tightened by sizes read back without waiting), and a kernel's error (a
full table, a NaN in a push) lands in the table's sticky error word. Every other method first
settles the table (:meth:`DeviceTable.settle`: one read of its row count, counters and error
word), where a pending error is raised, naming the table.

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
import itertools
from collections.abc import Callable, Iterator
from typing import Concatenate, ParamSpec, TypeVar

import streamrec.embedding_store._C as _C
import torch
from streamrec.embedding_store.errors import (
    CapacityExceeded,
    InvalidInput,
    NonFiniteGradient,
)
from streamrec.embedding_store.tiers import cuda_ext, row_codec
from streamrec.embedding_store.tiers.device_rows import RowChunks, chunk_shift
from streamrec.embedding_store.tiers.device_staging import Staging, aligned
from streamrec.embedding_store.tiers.table_tier import MAX_LOAD, MIN_ROWS, TableTier, index_slots
from streamrec.errors import StreamRecError
from streamrec.store_schema import TableOptions

_P = ParamSpec("_P")
_R = TypeVar("_R")


#: what a table's error word holds, as the C API's status would say it
_BLOCK_ERRORS = {
    cuda_ext.ERR_INDEX_FULL: "the hash index was full",
    cuda_ext.ERR_ROWS_FULL: "no free row for a new key",
    cuda_ext.ERR_ROW_OUTSIDE: "a row id outside the table's rows",
}
_TOKENS = itertools.count()


def _ordered(
    method: Callable[Concatenate[DeviceTable, _P], _R],
) -> Callable[Concatenate[DeviceTable, _P], _R]:
    """The method runs on the table's stream (:meth:`DeviceTable.ordered`), the table settled
    first (:meth:`DeviceTable.settle`: a block's pending error is raised here)."""

    @functools.wraps(method)
    def run(self: DeviceTable, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self.ordered():
            self.settle()
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
            :func:`~streamrec.embedding_store.tiers.device_rows.chunk_shift`).

    Raises:
        TierUnavailable: no CUDA GPU here (or the CUDA extension cannot be built).
        InvalidInput: an option the device tier does not implement yet (admission).
    """

    kind = "device"
    block_group = "device"

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
        #: a GPU table's stream waits for this (a block's work on its caller's stream)
        self._after: torch.cuda.Event | None = None
        #: whether the table's stream ran work a block must wait for
        self._used_stream = False
        with self.ordered():  # the table's tensors allocated on its stream
            self._rows = RowChunks(self._stride, shift, self.device)
            self._rows.reserve(rows)
            self._slots = self._ops.index_new(index_slots(rows))
            self._next = torch.zeros(1, dtype=torch.int64, device=self.device)  # next row id
            self._misses = torch.zeros(1, dtype=torch.int64, device=self.device)
            #: the block ops' sticky error word and their counts (rows created, expanded)
            self._error = torch.zeros(1, dtype=torch.int32, device=self.device)
            self._block_counts = torch.zeros(2, dtype=torch.int64, device=self.device)
        self._size = 0
        #: a block's descriptor of this table is stale once this changes (new index, chunks)
        self.block_token = next(_TOKENS)
        self.generation = 0
        # rows in use, without a sync: at most _size_base + (_issued - _issued_base), keys
        # sent to block creation since the size read at _issued_base
        self._issued = 0
        self._size_base = 0
        self._issued_base = 0
        self._unsettled = False
        #: host inputs go to the GPU through pinned buffers reused between steps
        self.staging = Staging(self.device)
        self.resident_device = self.device
        self.push_device = self.device  # gradients already there are checked there

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
        if self._after is not None:  # a block on another thread's stream
            stream.wait_event(self._after)
            self._after = None
        try:
            with torch.cuda.stream(stream):
                yield
        finally:
            caller.wait_stream(stream)
            self._used_stream = True

    # -- blocks (device_block.py): no sync, errors kept for the next settle -----------------
    def settle(self) -> None:
        """Reads what block ops left on the device (one sync, only after a block): the rows
        in use, rows created and expanded, and the error word; raises a pending error naming
        the table (CapacityExceeded, NonFiniteGradient, InvalidInput, CudaOpError). Call on
        the table's stream (:meth:`ordered`); every method but the block ops does."""
        if not self._unsettled:
            return
        self._unsettled = False
        state = torch.cat([self._next, self._block_counts, self._error.to(torch.int64)])
        self._ops.note_launch(2)  # the cast and the cat
        next_row, created, expanded, code = self._ops.read(state, "settle").tolist()
        limit = self.rows_limit()
        self._set_size(min(next_row, limit))
        self.counters["rows_created"] += created
        self.counters["rows_expanded"] += expanded
        self._block_counts.zero_()
        self._ops.note_launch()
        if code:
            self._error.zero_()
            if next_row > limit:  # ids drawn past a full table were never used
                self._next.fill_(limit)
            raise self._block_error(code)

    def _block_error(self, code: int) -> StreamRecError:
        name = self.options.name
        if code == cuda_ext.ERR_ROWS_FULL and self.capacity is not None:
            return CapacityExceeded(
                f"table {name!r}: a block pull or push reached the capacity {self.capacity}; "
                f"the new keys past it were not created (holds {self._size})"
            )
        if code == cuda_ext.ERR_NONFINITE:
            return NonFiniteGradient(
                f"table {name!r}: a block push's grads held NaN or Inf; nothing of that push "
                "was written"
            )
        if code == cuda_ext.ERR_BAD_COUNT:
            return InvalidInput(
                f"table {name!r}: a block push's shows and clicks must be finite and >= 0; "
                "nothing of that push was written"
            )
        what = _BLOCK_ERRORS.get(code, f"a kernel reported error code {code}")
        return cuda_ext.CudaOpError(f"table {name!r}: a block op", code, what)

    def rows_limit(self) -> int:
        """Row ids a new row may take: the rows reserved, at most ``capacity``."""
        rows = self._rows.rows
        return rows if self.capacity is None else min(rows, self.capacity)

    def size_bound(self) -> int:
        """At least the rows in use, known without a sync."""
        return self._size_base + self._issued - self._issued_base

    def reserve_block(self, n: int) -> None:
        """Room for ``n`` more keys of a block (all of them new, the worst case): chunks and
        index slots (up to ``capacity``; keys past it fail on the device, reported at the next
        settle). No sync: a larger index is rebuilt with errors to the error word."""
        need = self.size_bound() + n
        if self.capacity is not None:
            need = min(need, self.capacity)
        grow_rows = need > self._rows.rows
        grow_index = need > MAX_LOAD * self._slots.shape[0]
        if grow_rows or grow_index:
            with self.ordered():  # after the blocks queued so far; new tensors on its stream
                self._rows.reserve(need)
                if grow_index:
                    self._slots = self._ops.rebuild(
                        self._slots, index_slots(need), error=self._error
                    )
            self.generation += 1
        self._issued += n
        self._unsettled = True

    def note_size(self, rows: int, issued: int) -> None:
        """A size read back without a sync: ``rows`` in use once the keys issued up to
        ``issued`` were created (ignored when a later reading or a settle is newer)."""
        if issued > self._issued_base:
            self._size_base, self._issued_base = min(rows, self.rows_limit()), issued

    def issued(self) -> int:
        """Keys sent to block creation so far (what :meth:`note_size` compares)."""
        return self._issued

    def note_push(self) -> None:
        """Before a push of this table (alone or in a block): a compact row's stochastic
        rounding draws new bits (the push counter ``round_step``, bumped as the host tier
        does). A compact table's block descriptor holds the counter, so it is made again."""
        self.params.round_step += 1
        self._gp.round_step = self.params.round_step
        if self.options.dtype != "fp32":
            self.generation += 1

    def block_entry(self) -> cuda_ext.BlockTable:
        """This table as a block's descriptor (valid until :attr:`generation` changes)."""
        rows = self._rows.struct()
        rows.R = self.rows_limit()
        return cuda_ext.BlockTable(
            index=cuda_ext.Index(self._slots.data_ptr(), self._slots.shape[0]),
            table=rows,
            next_row=self._next.data_ptr(),
            error=self._error.data_ptr(),
            counters=self._block_counts.data_ptr(),
            params=self._gp,
        )

    def enter_block(self, caller: torch.cuda.Stream | None) -> None:
        """Before a block on ``caller``'s stream: it waits for this table's own stream's work."""
        if caller is not None and self._stream is not None and self._used_stream:
            caller.wait_stream(self._stream)
            self._used_stream = False

    def leave_block(self, done: torch.cuda.Event | None) -> None:
        """After a block: this table's next op on its stream waits for ``done``."""
        self._after = done
        self._unsettled = True

    def _set_size(self, rows: int) -> None:
        """The exact rows in use (a settle, a creation, a compaction)."""
        self._size = self._size_base = rows
        self._issued_base = self._issued

    # -- growth and creation ------------------------------------------------------------
    def _reserve(self, extra: int) -> None:
        """Room for ``extra`` more rows: new chunks (no row moves, ids kept) and a larger
        index."""
        need = self._size + extra
        rows = self._rows.rows
        self._rows.reserve(need)
        if need > MAX_LOAD * self._slots.shape[0]:
            self._slots = self._ops.rebuild(self._slots, index_slots(need))
            self.generation += 1
        elif self._rows.rows != rows:
            self.generation += 1

    def _find_or_create(self, keys: torch.Tensor, why: str) -> tuple[torch.Tensor, int]:
        """Rows (n,) int64 cuda of keys (n,) int64 cuda, absent ones created (initial
        values); the count created. Refuses (nothing written) past ``capacity``.

        Host syncs: the miss count (one int64), and only where keys are new the count of
        distinct new keys and the insert's error flag. Only the missed positions are probed
        again (by the insert).
        """
        self._misses.zero_()
        self._ops.note_launch()
        rows = self._ops.find(self._slots, keys, self._misses)
        if self._ops.item(self._misses, "misses") == 0:
            return rows, 0
        missed = rows < 0
        absent = keys[missed]
        self._ops.synced("distinct new keys")  # the boolean index and unique: sizes read back
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
        self._set_size(self._size + distinct)
        return rows, distinct

    def _compact(self, idx: torch.Tensor) -> None:
        """Keeps rows ``idx`` (m,) int64 cuda, ascending, renumbered 0..m-1."""
        m = idx.numel()
        self._rows.compact(self._ops, idx, self._gp)  # in place, one chunk of scratch
        self._rows.release_from(max(m, self._init_rows))
        self._set_size(m)
        self._next.fill_(m)
        self._slots = self._ops.index_new(index_slots(max(m, self._init_rows)))
        self.generation += 1
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
            self.settle()
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
        return self._ops.read(self.pull_resident(keys, create), "pull")

    @_ordered
    def push(
        self, keys: torch.Tensor, grads: torch.Tensor, shows: torch.Tensor, clicks: torch.Tensor
    ) -> bool:
        rows, created = self._find_or_create(self._cuda(keys, torch.int64, "keys"), "creating")
        self.counters["rows_created"] += created
        self.note_push()
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
        if self._unsettled:
            with self.ordered():
                self.settle()
        return self._size

    @_ordered
    def inspect(self, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = self._ops.find(self._slots, self._cuda(keys, torch.int64))
        full = self._ops.read_rows(self._rows, rows.clamp(min=0), 0, self.width, self._gp)
        return self._stats_of(self._ops.read(rows, "inspect"), self._ops.read(full, "inspect"))

    @_ordered
    def full_rows(self, keys: torch.Tensor, create: bool) -> tuple[torch.Tensor, torch.Tensor]:
        kd = self._cuda(keys, torch.int64)
        if create:
            rows, created = self._find_or_create(kd, "creating")
            self.counters["rows_created"] += created
        else:
            rows = self._ops.find(self._slots, kd)
        full = self._ops.read_rows(self._rows, rows.clamp(min=0), 0, self.width, self._gp)
        present = self._ops.read(rows, "full_rows") >= 0
        full = self._ops.read(full, "full_rows")
        return torch.where(present[:, None], full, torch.zeros(())), present

    @_ordered
    def advance_day(self) -> None:
        self._ops.advance_day(self._rows, self._size, self._gp)

    @_ordered
    def shrink(self) -> torch.Tensor:
        keep = self._ops.shrink(self._rows, self._size, self._gp)
        gone = self._keys_of((~keep).nonzero().squeeze(1))
        if gone.numel():
            self._compact(keep.nonzero().squeeze(1))
        self.counters["rows_deleted"] += gone.numel()
        return gone

    @_ordered
    def erase(self, keys: torch.Tensor) -> torch.Tensor:
        rows = self._ops.read(self._ops.find(self._slots, self._cuda(keys, torch.int64)), "erase")
        present = rows >= 0
        gone = keys.cpu()[present].clone()
        if gone.numel():
            keep = torch.ones(self._size, dtype=torch.bool)
            keep[rows[present]] = False
            self._compact(keep.nonzero().squeeze(1).to(self.device))
        return gone

    def _keys_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The keys (m,) int64 on the CPU of rows ``ids`` (m,) int64 on the device."""
        keys = torch.empty(ids.numel(), dtype=torch.int64, device=self.device)
        if ids.numel():
            self._ops.read_rows(self._rows, ids, 0, 1, self._gp, out_keys=keys)
        return self._ops.read(keys, "shrink")

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
        if self.options.dtype == "fp32":
            self._ops.write_rows(self._rows, rows, _C.EMBED_W, v, self._gp)
        else:  # encoded as the host tier does (row_codec, to nearest), whole rows rewritten
            full = self._ops.read_rows(self._rows, rows, 0, self.width, self._gp)
            row_codec.encode_(full, self.options.dtype, _C.EMBED_W, v)
            self._ops.write_rows(self._rows, rows, 0, full, self._gp)
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
        self._set_size(0)
        self._rows.release_from(self._init_rows)
        self._next.zero_()
        self._slots = self._ops.index_new(index_slots(self._init_rows))
        self.generation += 1

    def bytes_used(self) -> dict[str, int]:
        return {"device": self._rows.nbytes() + self._slots.numel() * 8}

    def row_chunks(self) -> RowChunks:
        """The chunked rows (for inspection: their chunk tensors, bytes and R)."""
        return self._rows

    def close(self) -> None:
        with self.ordered():
            self._unsettled = False  # a pending block error dies with the table
            self._set_size(0)
            self._rows.clear()
            self.staging.release()
            self._slots = self._ops.index_new(1)
            self.generation += 1
