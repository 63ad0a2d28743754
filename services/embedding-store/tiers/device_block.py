"""Every device table of a step in one launch per op, and no wait for the device.

The in-process store's ``pull_rows`` and ``push_rows`` over tables all on one device
(``tier="device"``, a GPU or the CPU build of the kernels) take the whole block of keys
(``sparse_store.py``'s layout) to the kernels at once, however many tables it spans::

    tables   ["user", "item", "user"]   counts [3, 0, 2]      (a table may repeat)
    part     0          1       2       part_table [0, 1, 0]  (index into the distinct tables)
    offsets  [0, 3, 3, 5]                                      (part p: positions [o[p], o[p+1]))

    pull:  find_or_insert_tables (2 kernels) + gather_tables (1) + block_sizes (1)
    push:  check_push_tables (memset + 1) + find_or_insert_tables (2) + update_tables
           (keys, sort, 2 sums, steps: 5) + block_sizes (1)

What each step copies to the device: its keys, the layout (offsets and part_table, 2P + 1
int64), the push's gradients, shows and clicks where they are on the host; the tables'
descriptors (``cuda_ext.BlockTable``, one per distinct table) only when one changed (growth).
Nothing reads back and waits: each table reserves rows for every key it is sent
(:meth:`DeviceTable.reserve_block`, an upper bound), the tables' row counts come back with a
copy that is looked at once it has landed (a step later on a GPU), and a kernel's error stays
in its table's error word until that table is next settled (any other call on it: ``size``,
``stats``, ``save``...), which raises it naming the table. A push with NaN/Inf or a bad
show/click anywhere writes nothing to any table of the block (the check runs first, on the
device) and is reported that way.

On a GPU the block runs on the caller's current stream: it first waits for the tables' own
streams where they ran something (:meth:`DeviceTable.enter_block`), and their next own op waits
for it (an event, :meth:`DeviceTable.leave_block`).
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from typing import NamedTuple

import torch
from streamrec.embedding_store.tiers import cuda_ext
from streamrec.embedding_store.tiers.device_staging import MIN_BYTES, aligned
from streamrec.embedding_store.tiers.device_table import DeviceTable

#: descriptor arrays kept per list of tables (a trainer uses one or two lists)
MAX_DESCRIPTORS = 16
#: sizes read back and not yet landed, at most (older ones are dropped: a later one is newer)
MAX_READINGS = 8


class Uploads:
    """Host inputs to a GPU through page-locked buffers that are never waited for.

    ``device_staging.Staging`` waits (an event's synchronize) before it overwrites a buffer;
    here each name keeps a few buffers, each with the event of its last copy out, and takes
    one whose copy has landed (``Event.query``: no wait), else adds one. A step in flight
    holds one buffer per name, so a name settles at two or three buffers.

    Args:
        device: the GPU the inputs go to.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._rings: dict[str, list[tuple[torch.Tensor, torch.cuda.Event | None]]] = {}

    def to_device(self, name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """t (host) as a contiguous dtype tensor on the device, copied asynchronously on the
        device's current stream."""
        nbytes = t.numel() * dtype.itemsize
        ring = self._rings.setdefault(name, [])
        free = next((i for i, (_, ev) in enumerate(ring) if ev is None or ev.query()), None)
        if free is None:
            free = len(ring)
            ring.append((torch.empty(0, dtype=torch.uint8), None))
        buf = ring[free][0]
        if buf.numel() < nbytes:
            size = max(nbytes, MIN_BYTES, 2 * buf.numel())
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        staged = buf[:nbytes].view(dtype).view(t.shape)
        staged.copy_(t)
        out = torch.empty(t.shape, dtype=dtype, device=self.device)
        out.copy_(staged, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(self.device))
        ring[free] = (buf, copied)
        return out

    def release(self) -> None:
        """Drops every buffer, after its copy has run."""
        for ring in self._rings.values():
            for _, ev in ring:
                if ev is not None:
                    ev.synchronize()
        self._rings = {}


class _Reading(NamedTuple):
    """The tables' row counts, copying back to the host: usable once ``done`` has passed."""

    done: torch.cuda.Event | None  # None: already on the host (the CPU build)
    sizes: torch.Tensor  # (T,) int64 on the host
    tables: list[DeviceTable]
    issued: list[int]  # each table's keys issued when the sizes were taken


class DeviceBlocks:
    """The block ops of one store over its device tables (any lists of them, one device).

    Two threads may run blocks of disjoint tables at once (the store's table locks order the
    rest): the bookkeeping here (descriptors, uploads, readings) is under one lock, the
    kernels are not.

    Args:
        device: where the tables' rows live (``cuda:N``, or ``cpu`` for the CPU build).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.uploads = Uploads(device)
        self._descriptors: dict[tuple[int, ...], tuple[tuple[int, ...], torch.Tensor]] = {}
        self._readings: deque[_Reading] = deque()
        self._lock = threading.Lock()

    # -- the two ops -------------------------------------------------------------------------
    def pull(
        self, tables: list[DeviceTable], keys: torch.Tensor, counts: list[int], create: bool
    ) -> torch.Tensor:
        """Weights (n, dim) float32 on the tables' device of keys (n,) int64 (host or device),
        ``counts[t]`` of ``tables[t]``; absent keys created when ``create``, else zeros.
        Call under every table's exclusive lock."""
        ops, dim = tables[0]._ops, tables[0].dim
        n = keys.numel()
        distinct, part_table = _distinct(tables)
        caller = self._begin(distinct, tables, counts if create else None)
        args = self._args(ops, distinct, part_table, counts, n, dim)
        k = self._to_device(ops, "pull_keys", keys, torch.int64)
        rows = ops.find_or_insert_tables(args, k) if create else ops.find_tables(args, k)
        out = ops.gather_tables(args, rows)
        self._end(ops, distinct, args, caller, read_sizes=create)
        return out

    def push(
        self,
        tables: list[DeviceTable],
        keys: torch.Tensor,
        counts: list[int],
        grads: torch.Tensor,
        shows: torch.Tensor | None,
        clicks: torch.Tensor | None,
    ) -> None:
        """The fused push of keys (n,) int64 laid out as :meth:`pull`'s: grads (n, dim),
        shows and clicks (n,) float32 (None: 1 and 0 per key), on the host or the device;
        absent keys created first. Checked on the device first: a bad value anywhere writes
        nothing, reported at the tables' next settle. Call under every table's exclusive
        lock."""
        ops, dim = tables[0]._ops, tables[0].dim
        n = keys.numel()
        distinct, part_table = _distinct(tables)
        caller = self._begin(distinct, tables, counts)
        for table in distinct:
            table.note_push()  # before the descriptor: a compact table's holds round_step
        args = self._args(ops, distinct, part_table, counts, n, dim)
        k = self._to_device(ops, "push_keys", keys, torch.int64)
        g = self._to_device(ops, "grads", grads, torch.float32)
        s = None if shows is None else self._to_device(ops, "shows", shows, torch.float32)
        c = None if clicks is None else self._to_device(ops, "clicks", clicks, torch.float32)
        flag = ops.check_push_tables(args, g, s, c)
        rows = ops.find_or_insert_tables(args, k, skip=flag)
        ops.update_tables(args, rows, g, s, c, flag)
        self._end(ops, distinct, args, caller, read_sizes=True)

    # -- around them -------------------------------------------------------------------------
    def _begin(
        self, distinct: list[DeviceTable], tables: list[DeviceTable], counts: list[int] | None
    ) -> torch.cuda.Stream | None:
        """Sizes landed so far noted, rows reserved for every key that may be new (counts;
        None: nothing is created), the caller's stream after the tables' own work."""
        self._note_sizes()
        if counts is not None:
            per_table: dict[int, int] = {}
            for table, count in zip(tables, counts, strict=True):
                per_table[table.block_token] = per_table.get(table.block_token, 0) + count
            for table in distinct:
                if per_table[table.block_token]:
                    table.reserve_block(per_table[table.block_token])
        caller = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        for table in distinct:
            table.enter_block(caller)
        return caller

    def _end(
        self,
        ops: cuda_ext.CudaOps,
        distinct: list[DeviceTable],
        args: cuda_ext.BlockArgs,
        caller: torch.cuda.Stream | None,
        read_sizes: bool,
    ) -> None:
        done = None
        if caller is not None:
            done = torch.cuda.Event()
            done.record(caller)
        for table in distinct:
            table.leave_block(done)
        if not read_sizes:
            return
        sizes = ops.block_sizes(args.tables, args.count)
        if caller is None:
            reading = _Reading(None, sizes, distinct, [t.issued() for t in distinct])
        else:
            host = torch.empty(sizes.shape, dtype=sizes.dtype, pin_memory=True)
            host.copy_(sizes, non_blocking=True)  # looked at once its event has passed
            landed = torch.cuda.Event()
            landed.record(caller)
            reading = _Reading(landed, host, distinct, [t.issued() for t in distinct])
        with self._lock:
            if len(self._readings) >= MAX_READINGS:
                self._readings.popleft()
            self._readings.append(reading)

    def _note_sizes(self) -> None:
        """Hands the tables every row count that has landed on the host (never waits)."""
        with self._lock:
            while self._readings:
                reading = self._readings[0]
                if reading.done is not None and not reading.done.query():
                    return
                self._readings.popleft()
                for table, rows, issued in zip(
                    reading.tables, reading.sizes.tolist(), reading.issued, strict=True
                ):
                    table.note_size(rows, issued)

    def _args(
        self,
        ops: cuda_ext.CudaOps,
        distinct: list[DeviceTable],
        part_table: list[int],
        counts: list[int],
        n: int,
        dim: int,
    ) -> cuda_ext.BlockArgs:
        offsets = [0]
        for count in counts:
            offsets.append(offsets[-1] + count)
        layout = torch.tensor(offsets + part_table, dtype=torch.int64)
        return cuda_ext.BlockArgs(
            tables=self._descriptor(ops, distinct),
            layout=self._to_device(ops, "layout", layout, torch.int64),
            count=len(distinct),
            parts=len(counts),
            n=n,
            dim=dim,
            max_rows=max(t.rows_limit() for t in distinct),
        )

    def _descriptor(self, ops: cuda_ext.CudaOps, distinct: list[DeviceTable]) -> torch.Tensor:
        """The tables' descriptors on the device: the last one made for these tables while
        none of them changed (grew a chunk, a larger index), else a new one copied over."""
        key = tuple(t.block_token for t in distinct)
        generations = tuple(t.generation for t in distinct)
        with self._lock:
            cached = self._descriptors.get(key)
        if cached is not None and cached[0] == generations:
            return cached[1]
        entries = (cuda_ext.BlockTable * len(distinct))(*[t.block_entry() for t in distinct])
        host = torch.frombuffer(bytearray(entries), dtype=torch.uint8)
        assert host.numel() == len(distinct) * ctypes.sizeof(cuda_ext.BlockTable)
        tables = self._to_device(ops, "tables", host, torch.uint8, keep=True)
        with self._lock:
            if len(self._descriptors) >= MAX_DESCRIPTORS:
                self._descriptors.clear()
            self._descriptors[key] = (generations, tables)
        return tables

    def _to_device(
        self,
        ops: cuda_ext.CudaOps,
        name: str,
        t: torch.Tensor,
        dtype: torch.dtype,
        keep: bool = False,
    ) -> torch.Tensor:
        """t as a contiguous dtype tensor on the device: as it is when already there, else
        through the name's pinned buffer (an asynchronous copy, counted). keep: a tensor kept
        past the step (a copy of its own, never a view of a buffer)."""
        if t.device == self.device:
            out = aligned(t.to(dtype=dtype).contiguous())
            return out.clone() if keep and out.data_ptr() == t.data_ptr() else out
        ops.note_copy()
        with self._lock:  # a buffer is picked and marked in use by its copy's event at once
            return self.uploads.to_device(name, t, dtype)

    def release(self) -> None:
        """Drops the pinned buffers and the cached descriptors (the store is closing)."""
        with self._lock:
            self.uploads.release()
            self._descriptors.clear()
            self._readings.clear()


def _distinct(tables: list[DeviceTable]) -> tuple[list[DeviceTable], list[int]]:
    """The block's distinct tables in order of first listing, and each part's index there."""
    index: dict[int, int] = {}
    distinct: list[DeviceTable] = []
    part_table = []
    for table in tables:
        at = index.setdefault(table.block_token, len(distinct))
        if at == len(distinct):
            distinct.append(table)
        part_table.append(at)
    return distinct, part_table
