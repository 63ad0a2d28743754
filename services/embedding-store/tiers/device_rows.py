"""A table's rows on a device in fixed-size chunks (the C API's ``StreamrecRows``).

Why chunks: a table that grows by doubling one (rows, stride) matrix needs the old and the
new matrix at once (a 54 GB table cannot grow on an 80 GB card). Here rows live in chunks of
``2**shift`` rows, each its own tensor; growth appends chunks and moves nothing, so a table
never holds more than its rows plus one chunk::

    chunk 0  rows [0, C)        (C, stride) float32    keys (C,) int64
    chunk 1  rows [C, 2C)       (C, stride) float32    keys (C,) int64
    ...
    pointers (2, chunks) int64 on the device: the chunks' data_ptr()s, what the kernels read

Row ``r`` is at ``chunks[r >> shift] + (r & (C - 1)) * stride`` (``row_at`` in
``csrc/cuda/common.cuh``, the one place the kernels compute it). The keys are chunked with the
same shift for the same reason (8 bytes a row is a fifth of a 40-byte row: their doubling
would need a second copy too) and so that one row id addresses both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from streamrec.embedding_store.tiers.cuda_lib import Rows, TableParams

if TYPE_CHECKING:
    from streamrec.embedding_store.tiers.cuda_ext import CudaOps

#: the largest chunk, bytes of row values: growth steps of at most this much, and the
#: compaction's scratch is one chunk
MAX_CHUNK_BYTES = 1 << 28


def chunk_shift(init_rows: int, stride: int, max_bytes: int = MAX_CHUNK_BYTES) -> int:
    """log2 of the rows per chunk of a table starting with ``init_rows`` rows of ``stride``
    floats: the power of two at or above init_rows (a new table is one chunk), at most
    ``max_bytes`` of values per chunk (and at least one row)."""
    shift = max(int(init_rows) - 1, 0).bit_length()
    while shift > 0 and (1 << shift) * stride * 4 > max_bytes:
        shift -= 1
    return shift


class RowChunks:
    """Rows and row keys in chunks of ``2**shift`` rows on ``device``.

    Args:
        stride: floats per row (the params' stride).
        shift: log2 of the rows per chunk (:func:`chunk_shift`).
        device: where the chunks live.
    """

    def __init__(self, stride: int, shift: int, device: torch.device) -> None:
        if not 0 <= shift <= 62:
            raise ValueError(f"shift must be in [0, 62], got {shift}")
        self.stride, self.shift, self.device = stride, shift, device
        self.chunk_rows = 1 << shift
        self._data: list[torch.Tensor] = []
        self._keys: list[torch.Tensor | None] = []
        self._ptrs = torch.zeros((2, 0), dtype=torch.int64, device=device)
        #: rows addressable (R): whole chunks, or a single matrix's rows
        self.rows = 0

    @classmethod
    def single(cls, data: torch.Tensor | None, keys: torch.Tensor | None) -> RowChunks:
        """One chunk over an existing (R, stride) matrix and/or (R,) key vector (no copy;
        either may be None where an op needs no values or no keys): R is the smaller."""
        counts = [t.shape[0] for t in (data, keys) if t is not None]
        if not counts:
            raise ValueError("single: give data, keys or both")
        rows = min(counts)
        ref = data if data is not None else keys
        assert ref is not None
        stride = data.shape[1] if data is not None else 0
        out = cls(stride, max(rows - 1, 0).bit_length(), ref.device)
        out._data = [data] if data is not None else []
        out._keys = [keys]
        out.rows = rows
        out._ptrs = _single_ptrs(_addr(data, 16), _addr(keys, 8), ref.device)
        return out

    # -- growth ----------------------------------------------------------------------------
    def reserve(self, rows: int) -> None:
        """At least ``rows`` addressable: new chunks appended, none moved or copied."""
        if rows <= self.rows:
            return
        add = -(-(rows - self.rows) // self.chunk_rows)
        for _ in range(add):
            self._data.append(
                torch.empty((self.chunk_rows, self.stride), dtype=torch.float32, device=self.device)
            )
            self._keys.append(torch.empty(self.chunk_rows, dtype=torch.int64, device=self.device))
        self._set_rows(len(self._data) * self.chunk_rows)

    def release_from(self, rows: int) -> None:
        """Drops the chunks wholly at or above row ``rows`` (after a compaction)."""
        keep = -(-rows // self.chunk_rows)
        if keep < len(self._data):
            del self._data[keep:], self._keys[keep:]
            self._set_rows(keep * self.chunk_rows)

    def _set_rows(self, rows: int) -> None:
        self.rows = rows
        ptrs = [[_addr(t, 16) for t in self._data], [_addr(t, 8) for t in self._keys]]
        # tiny, and only on growth: the kernels read the chunk pointers from device memory;
        # from page-locked memory, so the copy does not wait for the device (torch's pinned
        # allocator keeps the source until the copy has run)
        host = torch.tensor(ptrs, dtype=torch.int64).reshape(2, -1)
        if self.device.type == "cuda":
            host = host.pin_memory()
        self._ptrs = host.to(self.device, non_blocking=True)

    # -- what the kernels and the tests see -------------------------------------------------
    def struct(self) -> Rows:
        """The C API's StreamrecRows (valid while this object and its chunks live)."""
        data = self._ptrs[0].data_ptr() if self.has_values() else None
        keys = self._ptrs[1].data_ptr() if self.has_keys() else None
        return Rows(data, keys, self.shift, self.rows)

    def has_values(self) -> bool:
        return bool(self._data)

    def has_keys(self) -> bool:
        return any(k is not None for k in self._keys)

    def chunks(self) -> list[torch.Tensor]:
        """The row chunks, (chunk_rows, stride) float32 each (the same tensors until
        released: growth never replaces one)."""
        return list(self._data)

    def nbytes(self) -> int:
        """Bytes of row values and keys held (every chunk, used or not)."""
        return sum(
            t.numel() * t.element_size() for t in [*self._data, *self._keys] if t is not None
        )

    def clear(self) -> None:
        """Drops every chunk (R = 0)."""
        self._data, self._keys = [], []
        self._set_rows(0)

    # -- compaction -------------------------------------------------------------------------
    def compact(self, ops: CudaOps, idx: torch.Tensor, p: TableParams) -> None:
        """Keeps rows ``idx`` (m,) int64 (ascending, distinct, < R) as rows 0..m-1, in place,
        through a scratch of one chunk (never a second copy of the table).

        Destinations go in blocks of one chunk, in ascending order: block b first reads its
        sources idx[bC:(b+1)C] into the scratch, then writes rows [bC, (b+1)C). Why no source
        is overwritten before it is read: idx ascending and distinct gives idx[j] >= j, so a
        later block's sources (idx[j], j >= (b+1)C) are all >= (b+1)C, above every row block b
        writes; block b's own sources are read into the scratch before any of its rows is
        written (two launches, in order on one stream); earlier blocks' sources were read by
        earlier blocks. So every row is read before anything lands on it.
        """
        m = idx.numel()
        if m == 0:
            return
        c = min(self.chunk_rows, m)
        # the row's width columns: padding (stride - width) is never read nor written
        scratch = torch.empty((c, p.width), dtype=torch.float32, device=self.device)
        scratch_keys = torch.empty(c, dtype=torch.int64, device=self.device)
        dest = torch.arange(c, dtype=torch.int64, device=self.device)
        for b in range(0, m, c):  # m / chunk_rows blocks: not a per-row loop
            k = min(c, m - b)
            src = idx[b : b + k]
            if bool(src[-1] == b + k - 1):
                continue  # idx[j] >= j: the block's rows are already in place
            ops.read_rows(self, src, 0, p.width, p, scratch[:k], scratch_keys[:k])
            ops.write_rows(self, dest[:k] + b, 0, scratch[:k], p, scratch_keys[:k])


#: pointer arrays of recent single-matrix tables: a caller passing the same tensors every step
#: (the GPU cache) reuses one instead of a blocking host-to-device copy per call
_SINGLES: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _single_ptrs(data: int, keys: int, device: torch.device) -> torch.Tensor:
    """(2, 1) int64 on device: [[data], [keys]], cached by value (addresses, not tensors)."""
    key = (data, keys, device)
    ptrs = _SINGLES.get(key)
    if ptrs is None:
        if len(_SINGLES) >= 32:
            _SINGLES.clear()
        ptrs = _SINGLES[key] = torch.tensor([[data], [keys]], dtype=torch.int64, device=device)
    return ptrs


def _addr(t: torch.Tensor | None, align: int) -> int:
    """t's address (0 for None); row chunks 16-byte aligned (the gather's float4 loads)."""
    if t is None:
        return 0
    if t.data_ptr() % align:
        raise ValueError(f"a chunk must be {align}-byte aligned, got address {t.data_ptr():#x}")
    return int(t.data_ptr())
