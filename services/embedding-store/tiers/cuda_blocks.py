"""The block ops of the CUDA library: every table of a step in one call each.

A block (:class:`BlockArgs`, the C API's StreamrecBlock, ``streamrec_cuda.h``) is P parts laid
end to end, part p of table ``part_table[p]``, the tables' descriptors
(:class:`~streamrec.embedding_store.tiers.cuda_lib.BlockTable`, one per table) in device memory.
``find_tables``, ``find_or_insert_tables``, ``gather_tables``, ``check_push_tables`` and
``update_tables`` launch the same kernels whatever the table count, and none of them waits for
the device: their kernel errors go to each table's sticky error word, read where the caller
synchronises anyway (``device_table.DeviceTable.settle``). ``unique_tables`` dedups every part
of a block at once. :class:`BlockOps` is a base of
:class:`~streamrec.embedding_store.tiers.cuda_ext.CudaOps`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamrec.embedding_store.tiers.cuda_calls import CudaCalls, ptr
from streamrec.embedding_store.tiers.cuda_lib import Block, BlockTable

if TYPE_CHECKING:
    import torch


def part_bits(parts: int) -> int:
    """Bits that hold every part index of a block of ``parts`` parts (at least 1)."""
    return max(1, (parts - 1).bit_length())


@dataclass(frozen=True)
class BlockArgs:
    """A block's device arrays and sizes (the C API's StreamrecBlock, ``streamrec_cuda.h``).

    Args:
        tables: (T * sizeof(BlockTable),) uint8 on the ops' device: the tables' descriptors.
        layout: (2P + 1,) int64 on the ops' device: offsets (P + 1, from 0 to n), then the
            table of each part (P, each in [0, T)).
        count: T, tables.
        parts: P, parts (a table may hold several).
        n: positions.
        dim: weights per row (every table's).
        max_rows: at least every table's R (the push's sort takes its bits).
    """

    tables: torch.Tensor
    layout: torch.Tensor
    count: int
    parts: int
    n: int
    dim: int
    max_rows: int

    def struct(self) -> Block:
        base = int(self.layout.data_ptr())
        return Block(
            tables=int(self.tables.data_ptr()) if self.count else None,
            offsets=base,
            part_table=base + 8 * (self.parts + 1),
            parts=self.parts,
            n=self.n,
            dim=self.dim,
            max_rows=self.max_rows,
            part_bits=part_bits(self.parts),
        )


class BlockOps(CudaCalls):
    """The block ops over torch tensors (see the module doc)."""

    def _block(self, op: str, b: BlockArgs) -> Block:
        """The block's struct, its arrays checked (device, dtype, sizes)."""
        self._check(op, "block tables", b.tables, self._torch.uint8, 1)
        self._keys(op, b.layout, "block layout")
        if b.tables.numel() != b.count * ctypes.sizeof(BlockTable):
            raise ValueError(
                f"{op}: block tables has {b.tables.numel()} bytes for {b.count} tables "
                f"({ctypes.sizeof(BlockTable)} each)"
            )
        if b.layout.numel() != 2 * b.parts + 1:
            raise ValueError(f"{op}: block layout has {b.layout.numel()} values, needs "
                             f"{2 * b.parts + 1} for {b.parts} parts")  # fmt: skip
        return b.struct()

    def _positions(self, op: str, b: BlockArgs, name: str, t: torch.Tensor) -> None:
        self._keys(op, t, name)
        if t.numel() != b.n:
            raise ValueError(f"{op}: {name} has {t.numel()} values for the block's {b.n}")

    def _push_values(
        self,
        op: str,
        b: BlockArgs,
        grads: torch.Tensor,
        shows: torch.Tensor | None,
        clicks: torch.Tensor | None,
    ) -> None:
        f32 = self._torch.float32
        self._check(op, "grads", grads, f32, 2, b.dim)
        if grads.shape[0] != b.n:
            raise ValueError(f"{op}: grads has {grads.shape[0]} rows for the block's {b.n}")
        for name, t in (("shows", shows), ("clicks", clicks)):
            if t is not None:
                self._check(op, name, t, f32, 1)
                if t.numel() != b.n:
                    raise ValueError(f"{op}: {name} has {t.numel()} values for {b.n}")

    def find_tables(self, b: BlockArgs, keys: torch.Tensor) -> torch.Tensor:
        """Row per key in its part's table, -1 where absent. keys: (n,) int64 -> (n,) int64."""
        op = "find_tables"
        block = self._block(op, b)
        self._positions(op, b, "keys", keys)
        rows = self._torch.empty_like(keys)
        self._run(op, self.lib.streamrec_cuda_find_tables, block, ptr(keys), ptr(rows))
        return rows

    def find_or_insert_tables(
        self, b: BlockArgs, keys: torch.Tensor, skip: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Row per key in its part's table, absent keys inserted and their rows initialised
        (ids from each table's next_row); a table's failure goes to its error word, that
        key's row -1. skip ((1,) int32, from check_push_tables): when it holds a code,
        nothing is inserted. keys: (n,) int64 -> (n,) int64."""
        op = "find_or_insert_tables"
        block = self._block(op, b)
        self._positions(op, b, "keys", keys)
        if skip is not None:
            self._check(op, "skip", skip, self._torch.int32, 1)
        rows = self._torch.empty_like(keys)
        self._run(
            op, self.lib.streamrec_cuda_find_or_insert_tables, block, ptr(keys), ptr(rows),
            ptr(skip),
        )  # fmt: skip
        return rows

    def gather_tables(self, b: BlockArgs, rows: torch.Tensor) -> torch.Tensor:
        """Weights of rows (n,) int64 in their parts' tables, zeros where < 0 -> (n, dim)."""
        op = "gather_tables"
        block = self._block(op, b)
        self._positions(op, b, "rows", rows)
        out = self._empty((b.n, b.dim), self._torch.float32)
        self._run(op, self.lib.streamrec_cuda_gather_tables, block, ptr(rows), ptr(out))
        return out

    def check_push_tables(
        self,
        b: BlockArgs,
        grads: torch.Tensor,
        shows: torch.Tensor | None,
        clicks: torch.Tensor | None,
    ) -> torch.Tensor:
        """A push's flag ((1,) int32): ERR_NONFINITE / ERR_BAD_COUNT where a value is bad
        (also in that table's error word), else 0. grads (n, dim); shows, clicks (n,)
        float32 or None (1 and 0 per position)."""
        op = "check_push_tables"
        block = self._block(op, b)
        self._push_values(op, b, grads, shows, clicks)
        flag = self._empty(1, self._torch.int32)  # zeroed by the call
        self._run(
            op, self.lib.streamrec_cuda_check_push_tables, block, ptr(grads), ptr(shows),
            ptr(clicks), ptr(flag),
        )  # fmt: skip
        return flag

    def update_tables(
        self,
        b: BlockArgs,
        rows: torch.Tensor,
        grads: torch.Tensor,
        shows: torch.Tensor | None,
        clicks: torch.Tensor | None,
        flag: torch.Tensor,
    ) -> None:
        """The fused push of every part; nothing is written when flag ((1,) int32, from
        check_push_tables) holds a code. rows (n,) int64; the rest as check_push_tables.
        Rows expanded add to each table's counters."""
        op = "update_tables"
        block = self._block(op, b)
        self._positions(op, b, "rows", rows)
        self._push_values(op, b, grads, shows, clicks)
        self._check(op, "flag", flag, self._torch.int32, 1)
        with self._guard():
            nbytes = int(self.lib.streamrec_cuda_update_tables_scratch_bytes(b.n, b.dim))
        scratch = self._empty(nbytes, self._torch.uint8)
        self._run(
            op, self.lib.streamrec_cuda_update_tables, block, ptr(rows), ptr(grads),
            ptr(shows), ptr(clicks), ptr(flag), ptr(scratch), nbytes,
        )  # fmt: skip

    def block_sizes(self, tables: torch.Tensor, count: int) -> torch.Tensor:
        """Every block table's next_row -> (count,) int64 on the device (one launch)."""
        op = "block_sizes"
        self._check(op, "tables", tables, self._torch.uint8, 1)
        if tables.numel() != count * ctypes.sizeof(BlockTable):
            raise ValueError(f"{op}: tables has {tables.numel()} bytes for {count} tables")
        sizes = self._empty(count, self._torch.int64)
        self._run(op, self.lib.streamrec_cuda_block_sizes, ptr(tables), count, ptr(sizes))
        return sizes

    def unique_tables(
        self, keys: torch.Tensor, offsets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The dedup of every part at once (``dedup.unique_groups`` on the device): keys (n,)
        int64, offsets (P + 1,) int64 from 0 to n -> (distinct (n,) int64, of which the
        first total: each part's distinct keys in order of first occurrence, part after part;
        inverse (n,) int64; counts (P,) int64; total (1,) int64), all on the device."""
        op = "unique_tables"
        self._keys(op, keys)
        self._keys(op, offsets, "offsets")
        n, parts = keys.numel(), offsets.numel() - 1
        if parts < 0:
            raise ValueError(f"{op}: offsets must hold P + 1 >= 1 values")
        if parts == 0:
            if n:
                raise ValueError(f"{op}: {n} keys in no part")
            return (
                keys.clone(),
                keys.clone(),
                self._empty(0, keys.dtype),
                self._zeros(1, keys.dtype),
            )
        distinct, inverse = self._torch.empty_like(keys), self._torch.empty_like(keys)
        counts, total = self._empty(parts, self._torch.int64), self._empty(1, self._torch.int64)
        with self._guard():
            nbytes = int(self.lib.streamrec_cuda_unique_tables_scratch_bytes(n))
        scratch = self._empty(nbytes, self._torch.uint8)
        self._run(
            op, self.lib.streamrec_cuda_unique_tables, ptr(keys), n, ptr(offsets), parts,
            ptr(distinct), ptr(inverse), ptr(counts), ptr(total), ptr(scratch), nbytes,
        )  # fmt: skip
        return distinct, inverse, counts, total
