"""The CUDA ops over torch tensors (:class:`CudaOps`), on a GPU or on the CPU build.

:func:`load` gives the ops on a CUDA device (``TierUnavailable`` where there is no GPU);
:func:`load_cpu` gives the same ops from the CPU build of the same kernels
(:mod:`~streamrec.embedding_store.tiers.cuda_lib`), over CPU tensors: a "CPU device" of the CUDA
library, for the tests and CI on machines without a GPU. The C API, its structs and the builds
are in :mod:`~streamrec.embedding_store.tiers.cuda_lib` (re-exported here).

Every method checks its tensors (device, dtype, contiguity, shape) and raises ``ValueError``
naming the argument before any pointer reaches the library; runs under a device guard for the
ops' device, on that device's current stream; and raises :class:`CudaOpError` (``IndexFull``,
``RowsFull``) with the library's message. A kernel's error comes back through an error flag of
the call's own (a new zeroed int32 per call): one instance serves every table of a device, from
any thread, and no call can read, clear or trip on another's error.

Example (on a GPU machine)::

    ops = load("cuda:1")
    rows = ops.find(slots, keys)  # slots (capacity, 2) int64, keys (n,) int64, both on cuda:1

Blocks (:class:`BlockArgs`): ``find_tables``, ``find_or_insert_tables``, ``gather_tables``,
``check_push_tables`` and ``update_tables`` take every table of a step at once (the C API's
StreamrecBlock), so a step launches the same kernels whatever its table count, and none of them
waits for the device: their kernel errors go to each table's sticky error word, read where the
caller synchronises anyway (``device_table.DeviceTable.settle``); they are
:mod:`~streamrec.embedding_store.tiers.cuda_blocks`'.

Counted: :meth:`CudaOps.counts` gives the calling thread's launches (the library's kernels,
memsets, sorts and scans, each counted once, plus the torch fills this wrapper queues), host
syncs (a kernel flag read back, a value read to the host) and host-to-device copies, the same
on the CPU build (which counts the ops a GPU would launch) as on a GPU. Inside
:meth:`CudaOps.no_syncs` a sync raises instead (tests assert a step never waits). The counts,
the sync guard, the device guard and the tensor checks are
:mod:`~streamrec.embedding_store.tiers.cuda_calls`' (:class:`CudaOps` is a ``CudaCalls``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING

from streamrec.embedding_store.errors import TierUnavailable
from streamrec.embedding_store.tiers.cuda_blocks import BlockArgs, BlockOps
from streamrec.embedding_store.tiers.cuda_calls import HostSync, OpCounts, ptr
from streamrec.embedding_store.tiers.cuda_lib import (
    API_VERSION,
    BINDINGS,
    CUDA_DIR,
    ERR_ARGUMENT,
    ERR_BAD_COUNT,
    ERR_CUDA,
    ERR_INDEX_FULL,
    ERR_NONFINITE,
    ERR_ROW_OUTSIDE,
    ERR_ROWS_FULL,
    NVCC_FLAGS,
    Block,
    BlockTable,
    CudaOpError,
    Index,
    IndexFull,
    Init,
    NewRows,
    Push,
    Rows,
    RowsFull,
    Rule,
    TableParams,
    build,
    build_cpu,
    check_devices,
    cpu_library_path,
    nvcc_command,
    open_library,
)

if TYPE_CHECKING:
    import torch
    from streamrec.embedding_store.tiers.device_rows import RowChunks

__all__ = [
    "API_VERSION",
    "BINDINGS",
    "CUDA_DIR",
    "ERR_ARGUMENT",
    "ERR_BAD_COUNT",
    "ERR_CUDA",
    "ERR_INDEX_FULL",
    "ERR_NONFINITE",
    "ERR_ROWS_FULL",
    "ERR_ROW_OUTSIDE",
    "NVCC_FLAGS",
    "Block",
    "BlockArgs",
    "BlockTable",
    "CudaOpError",
    "CudaOps",
    "HostSync",
    "OpCounts",
    "Index",
    "IndexFull",
    "Init",
    "NewRows",
    "Push",
    "Rows",
    "RowsFull",
    "Rule",
    "TableParams",
    "build",
    "check_devices",
    "load",
    "load_cpu",
    "nvcc_command",
    "open_library",
]


def _no_gpu_reason() -> str | None:
    """Why this process cannot use a CUDA GPU through torch, or None when it can."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        return f"torch is not importable ({exc})"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
    return None


_LOADED: dict[str, CudaOps] = {}


def load(device: str | torch.device | None = None, path: Path | None = None) -> CudaOps:
    """The CUDA ops on a GPU (device: ``"cuda"``/``"cuda:N"``, default the current one);
    TierUnavailable where there is none, or where the library's CUDA runtime sees fewer
    devices than torch (a driver older than it needs: :func:`check_devices`). One instance
    per device."""
    reason = _no_gpu_reason()
    if reason is not None:
        raise TierUnavailable(
            f"the device tier needs a CUDA GPU for the store's CUDA extension; found none: {reason}"
        )
    import torch

    dev = torch.device(device if device is not None else "cuda")
    if dev.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {device!r}")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    key = f"{dev}:{path}"
    if key not in _LOADED:
        lib = open_library(path)
        check_devices(lib, torch.cuda.device_count())
        _LOADED[key] = CudaOps(lib, dev)
    return _LOADED[key]


def load_cpu(path: Path | None = None) -> CudaOps:
    """The same ops from the CPU build of the kernels, over CPU tensors (built on first use,
    or rebuilt when a source changed: ``make cuda-cpu``)."""
    import torch

    path = build_cpu(path or cpu_library_path())
    key = f"cpu:{path}"
    if key not in _LOADED:
        _LOADED[key] = CudaOps(open_library(path, build_missing=False), torch.device("cpu"))
    return _LOADED[key]


class CudaOps(BlockOps):
    """The C API over torch tensors on one device: a CUDA GPU, or the CPU for the CPU build.

    Args:
        lib: the library (:func:`~streamrec.embedding_store.tiers.cuda_lib.open_library`).
        device: where its tensors live; ``cpu`` only for the CPU build.

    The plumbing, checks and counts are :class:`~.cuda_calls.CudaCalls`', the block ops
    :class:`~.cuda_blocks.BlockOps`'.
    """

    # -- hash index --------------------------------------------------------------------------
    def index_new(self, capacity: int) -> torch.Tensor:
        """An empty index: (capacity, 2) int64, capacity a power of two."""
        slots = self._empty((capacity, 2), self._torch.int64)
        self._run("index_init", self.lib.streamrec_cuda_index_init, self._slots("index_new", slots))
        return slots

    def find(
        self, slots: torch.Tensor, keys: torch.Tensor, misses: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Row per key, -1 where absent. keys: (n,) int64 -> (n,) int64; misses ((1,) int64,
        when given) += the absent keys (positions, not distinct keys)."""
        index = self._slots("find", slots)
        self._keys("find", keys)
        if misses is not None:
            self._keys("find", misses, "misses")
        rows = self._torch.empty_like(keys)
        self._run(
            "find", self.lib.streamrec_cuda_find, index, ptr(keys), keys.numel(), ptr(rows),
            ptr(misses),
        )  # fmt: skip
        return rows

    def find_or_insert(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        next_row: torch.Tensor,
        row_keys: torch.Tensor | RowChunks,
        data: torch.Tensor | None = None,
        params: TableParams | None = None,
    ) -> torch.Tensor:
        """Row per key, inserting absent keys with ids from next_row ((1,) int64, updated);
        row_keys ((R,) int64, or a chunked table) gets each new row's key; new rows are
        initialised when params are given (into data (R, stride) float32, or the table's
        chunks). Raises IndexFull / RowsFull; after RowsFull next_row is min(next_row, R), so
        a retry after growth leaves no hole."""
        op = "find_or_insert"
        index = self._slots(op, slots)
        self._keys(op, keys)
        self._keys(op, next_row, "next_row")
        if isinstance(row_keys, self._torch.Tensor):
            if data is not None and params is None:
                raise ValueError(f"{op}: params must be given with data")
            table = self._table(op, data, params, row_keys, keys=True)
        else:
            if data is not None:
                raise ValueError(f"{op}: data comes with the table, not separately")
            table = self._table(op, row_keys, params, keys=True)
        rt = table.struct()
        init = params is not None and table.has_values()
        if not init:
            rt.chunks = None
        rows, flag = self._torch.empty_like(keys), self._flag()
        nr = NewRows(ptr(next_row), rt, None, ptr(flag))
        pp = ctypes.byref(params) if init and params is not None else None
        self._run(
            op, self.lib.streamrec_cuda_find_or_insert, index, ptr(keys), keys.numel(),
            ptr(rows), nr, pp,
        )  # fmt: skip
        try:
            self._check_flag(op, flag)
        except RowsFull:
            next_row.clamp_(max=table.rows)
            raise
        return rows

    def insert_or_assign(self, slots: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor) -> None:
        """Sets key -> val. keys, vals: (n,) int64, vals >= 0. Raises IndexFull."""
        op = "insert_or_assign"
        index = self._slots(op, slots)
        self._keys(op, keys)
        self._keys(op, vals, "vals")
        if vals.numel() != keys.numel():
            raise ValueError(f"{op}: vals has {vals.numel()} values for {keys.numel()} keys")
        flag = self._flag()
        self._run(
            op, self.lib.streamrec_cuda_insert_or_assign, index, ptr(keys), ptr(vals),
            keys.numel(), ptr(flag),
        )  # fmt: skip
        self._check_flag(op, flag)

    def erase(self, slots: torch.Tensor, keys: torch.Tensor) -> int:
        """Erases keys; returns how many were present. keys: (n,) int64."""
        index = self._slots("erase", slots)
        self._keys("erase", keys)
        erased = self._zeros(1, self._torch.int64)
        self._run(
            "erase", self.lib.streamrec_cuda_erase, index, ptr(keys), keys.numel(), ptr(erased)
        )
        return self.item(erased, "erase")

    def size(self, slots: torch.Tensor) -> int:
        """Live entries of the index."""
        out = self._zeros(1, self._torch.int64)
        self._run("size", self.lib.streamrec_cuda_size, self._slots("size", slots), ptr(out))
        return self.item(out, "size")

    def export(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every live (key, row), unordered: ((m,) int64, (m,) int64)."""
        index = self._slots("export", slots)
        keys = self._empty(slots.shape[0], self._torch.int64)
        rows = self._torch.empty_like(keys)
        count = self._zeros(1, self._torch.int64)
        self._run("export", self.lib.streamrec_cuda_export, index, ptr(keys), ptr(rows), ptr(count))
        m = self.item(count, "export")
        return keys[:m], rows[:m]

    def rebuild(
        self, slots: torch.Tensor, capacity: int, error: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A new index of capacity slots holding every live entry of slots (growth). error:
        a table's sticky error word ((1,) int32) that takes a full index instead of waiting
        for the call's own flag (no sync: a block's growth)."""
        src = self._slots("index_rebuild", slots)
        dst = self._empty((capacity, 2), self._torch.int64)
        if error is not None:
            self._check("index_rebuild", "error", error, self._torch.int32, 1)
        flag = self._flag() if error is None else error
        self._run(
            "index_rebuild", self.lib.streamrec_cuda_index_rebuild, src,
            Index(dst.data_ptr(), capacity), ptr(flag),
        )  # fmt: skip
        if error is None:
            self._check_flag("index_rebuild", flag)
        return dst

    # -- rows (data: a chunked device_rows.RowChunks or one (R, stride) float32 matrix) ----
    def init_rows(
        self,
        data: torch.Tensor | RowChunks,
        row_keys: torch.Tensor | None,
        start: int,
        count: int,
        p: TableParams,
    ) -> None:
        """Initialises rows [start, start + count) from their keys (row_keys (R,) int64 with
        a matrix; None with a chunked table)."""
        table = self._table("init_rows", data, p, row_keys, keys=True)
        if start < 0 or count < 0 or start + count > table.rows:
            raise ValueError(f"init_rows: rows [{start}, {start} + {count}) outside the table")
        self._run(
            "init_rows", self.lib.streamrec_cuda_init_rows, table.struct(), start, count,
            ctypes.byref(p),
        )  # fmt: skip

    def initial_weights(
        self, keys: torch.Tensor, p: TableParams, with_embedx: bool
    ) -> torch.Tensor:
        """keys (n,) int64 -> (n, dim) float32, as init_rows draws them."""
        self._keys("initial_weights", keys)
        out = self._empty((keys.numel(), p.dim), self._torch.float32)
        self._run(
            "initial_weights", self.lib.streamrec_cuda_initial_weights, ptr(keys), keys.numel(),
            int(with_embedx), ptr(out), ctypes.byref(p),
        )  # fmt: skip
        return out

    def gather(
        self, data: torch.Tensor | RowChunks, rows: torch.Tensor, p: TableParams
    ) -> torch.Tensor:
        """Weights of rows (n,) int64, zeros where < 0 -> (n, dim) float32."""
        table = self._table("gather", data, p)
        self._keys("gather", rows, "rows")
        out, flag = self._empty((rows.numel(), p.dim), self._torch.float32), self._flag()
        self._run(
            "gather", self.lib.streamrec_cuda_gather, table.struct(), ptr(rows), rows.numel(),
            ptr(out), ptr(flag), ctypes.byref(p),
        )  # fmt: skip
        self._check_flag("gather", flag)
        return out

    def gather_pooled(
        self,
        data: torch.Tensor | RowChunks,
        rows: torch.Tensor,
        offsets: torch.Tensor,
        p: TableParams,
        mean: bool = False,
    ) -> torch.Tensor:
        """Bags rows[offsets[b]:offsets[b + 1]] summed (or averaged) -> (bags, dim) float32."""
        op = "gather_pooled"
        table = self._table(op, data, p)
        self._keys(op, rows, "rows")
        self._keys(op, offsets, "offsets")
        bags = offsets.numel() - 1
        out, flag = self._empty((max(bags, 0), p.dim), self._torch.float32), self._flag()
        self._run(
            op, self.lib.streamrec_cuda_gather_pooled, table.struct(), ptr(rows), ptr(offsets),
            bags, int(mean), ptr(out), ptr(flag), ctypes.byref(p),
        )  # fmt: skip
        self._check_flag(op, flag)
        return out

    def read_rows(
        self,
        data: torch.Tensor | RowChunks,
        rows: torch.Tensor,
        col: int,
        cols: int,
        p: TableParams,
        out: torch.Tensor | None = None,
        out_keys: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Columns [col, col + cols) of rows (n,) int64 -> (n, cols) float32 (into out when
        given), zeros where < 0; out_keys (n,) int64, when given, gets their keys (-1)."""
        op = "read_rows"
        table = self._table(op, data, p, keys=out_keys is not None)
        self._keys(op, rows, "rows")
        if out is None:
            out = self._empty((rows.numel(), cols), self._torch.float32)
        self._check(op, "out", out, self._torch.float32, 2, cols)
        if out_keys is not None:
            self._keys(op, out_keys, "out_keys")
        if out.shape[0] != rows.numel() or (
            out_keys is not None and out_keys.numel() != rows.numel()
        ):
            raise ValueError(f"{op}: out and out_keys must have {rows.numel()} rows")
        flag = self._flag()
        self._run(
            op, self.lib.streamrec_cuda_read_rows, table.struct(), ptr(rows), rows.numel(), col,
            cols, ptr(out), ptr(out_keys), ptr(flag), ctypes.byref(p),
        )  # fmt: skip
        self._check_flag(op, flag)
        return out

    def write_rows(
        self,
        data: torch.Tensor | RowChunks,
        rows: torch.Tensor,
        col: int,
        values: torch.Tensor,
        p: TableParams,
        keys: torch.Tensor | None = None,
    ) -> None:
        """Columns [col, col + cols) of rows (n,) int64 (distinct, < 0 skipped) = values
        (n, cols) float32; their keys = keys (n,) int64 when given."""
        op = "write_rows"
        table = self._table(op, data, p, keys=keys is not None)
        self._keys(op, rows, "rows")
        self._check(op, "values", values, self._torch.float32, 2)
        if keys is not None:
            self._keys(op, keys, "keys")
        if values.shape[0] != rows.numel() or (keys is not None and keys.numel() != rows.numel()):
            raise ValueError(f"{op}: values and keys must have {rows.numel()} rows")
        flag = self._flag()
        self._run(
            op, self.lib.streamrec_cuda_write_rows, table.struct(), ptr(rows), rows.numel(),
            col, values.shape[1], ptr(values), ptr(keys), ptr(flag), ctypes.byref(p),
        )  # fmt: skip
        self._check_flag(op, flag)

    def update(
        self,
        data: torch.Tensor | RowChunks,
        row_keys: torch.Tensor | None,
        rows: torch.Tensor,
        grads: torch.Tensor,
        shows: torch.Tensor,
        clicks: torch.Tensor,
        p: TableParams,
    ) -> int:
        """The fused push; returns the rows expanded. rows (n,) int64; grads (n, dim);
        shows, clicks (n,) float32; row_keys (R,) int64 with a matrix, None with a chunked
        table. Scratch comes from torch's allocator (caching on CUDA)."""
        op, f32, n = "update", self._torch.float32, rows.numel()
        if isinstance(data, self._torch.Tensor) and row_keys is not None:
            have, need = row_keys.numel(), data.shape[0]
            if have < need:
                raise ValueError(f"{op}: row_keys has {have} keys for {need} rows")
        table = self._table(op, data, p, row_keys, keys=True)
        self._keys(op, rows, "rows")
        self._check(op, "grads", grads, f32, 2, p.dim)
        self._check(op, "shows", shows, f32, 1)
        self._check(op, "clicks", clicks, f32, 1)
        if grads.shape[0] != n or shows.numel() != n or clicks.numel() != n:
            raise ValueError(f"{op}: grads, shows and clicks must have {n} rows, one per position")
        expanded, flag = self._zeros(1, self._torch.int64), self._flag()
        with self._guard():  # CUB's size query would make a context on the current device
            scratch_bytes = int(self.lib.streamrec_cuda_update_scratch_bytes(n, p.dim))
        scratch = self._empty(scratch_bytes, self._torch.uint8)
        push = Push(
            table.struct(), ptr(rows), ptr(grads), ptr(shows), ptr(clicks), n,
            ptr(expanded), ptr(flag),
        )  # fmt: skip
        self._run(
            op, self.lib.streamrec_cuda_update, push, ptr(scratch), scratch.numel(),
            ctypes.byref(p),
        )  # fmt: skip
        self._check_flag(op, flag)
        return self.item(expanded, op)

    # -- day, shrink, save selection, dirty marks --------------------------------------------
    def _rows_in_use(
        self, op: str, data: torch.Tensor | RowChunks, size: int, p: TableParams
    ) -> RowChunks:
        """The table, checked (the caller keeps it alive: the kernels read its pointers)."""
        table = self._table(op, data, p)
        if not 0 <= size <= table.rows:
            raise ValueError(f"{op}: size {size} outside [0, {table.rows}]")
        return table

    def advance_day(self, data: torch.Tensor | RowChunks, size: int, p: TableParams) -> None:
        table = self._rows_in_use("advance_day", data, size, p)
        fn = self.lib.streamrec_cuda_advance_day
        self._run("advance_day", fn, table.struct(), size, ctypes.byref(p))

    def shrink(self, data: torch.Tensor | RowChunks, size: int, p: TableParams) -> torch.Tensor:
        """Decays show/click of rows [0, size); the keep mask (size,) bool."""
        table = self._rows_in_use("shrink", data, size, p)
        keep = self._empty(size, self._torch.uint8)
        fn = self.lib.streamrec_cuda_shrink
        self._run("shrink", fn, table.struct(), size, ptr(keep), ctypes.byref(p))
        return keep.bool()

    def select_rows(
        self, data: torch.Tensor | RowChunks, size: int, mode: int, p: TableParams
    ) -> torch.Tensor:
        """Rows a save mode takes (0 all, 1 base, 2 delta): (size,) bool."""
        table = self._rows_in_use("select_rows", data, size, p)
        sel = self._empty(size, self._torch.uint8)
        self._run(
            "select_rows", self.lib.streamrec_cuda_select_rows, table.struct(), size, mode,
            ptr(sel), ctypes.byref(p),
        )  # fmt: skip
        return sel.bool()

    def clear_dirty(self, data: torch.Tensor | RowChunks, size: int, p: TableParams) -> None:
        table = self._rows_in_use("clear_dirty", data, size, p)
        fn = self.lib.streamrec_cuda_clear_dirty
        self._run("clear_dirty", fn, table.struct(), size, ctypes.byref(p))

    def mark_dirty(
        self, data: torch.Tensor | RowChunks, rows: torch.Tensor, p: TableParams
    ) -> None:
        """Sets the changed-since-save flag of rows (n,) int64 (< 0 skipped)."""
        table = self._table("mark_dirty", data, p)
        self._keys("mark_dirty", rows, "rows")
        self._run(
            "mark_dirty", self.lib.streamrec_cuda_mark_dirty, table.struct(), ptr(rows),
            rows.numel(), ctypes.byref(p),
        )  # fmt: skip
