"""Ragged batches: rows of different lengths stored as one values tensor plus offsets.

A batch of three rows ``[[10, 11], [], [12, 13, 14]]`` is held as::

    values   = [10, 11, 12, 13, 14]      (5,)  any dtype
    offsets  = [0, 2, 2, 5]              (rows + 1,) int64, offsets[0] == 0
    lengths  = [2, 0, 3]                 derived: offsets[1:] - offsets[:-1]

Row ``i`` is ``values[offsets[i]:offsets[i + 1]]``. This is RecIS's ``RaggedTensor`` shape
(``values()`` / ``offsets()``), so code written against RecIS runs unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def _as_tensor(x: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x if dtype is None else x.to(dtype)
    return torch.as_tensor(np.asarray(x), dtype=dtype)


class RaggedTensor:
    """A batch of variable-length rows.

    Args:
        values: (nnz,) the concatenated rows.
        offsets: (rows + 1,) int64, non-decreasing, starting at 0 and ending at nnz.

    Example:
        >>> r = RaggedTensor(values=[10, 11, 12], offsets=[0, 2, 3])
        >>> r.to_list()
        [[10, 11], [12]]
    """

    __slots__ = ("_values", "_offsets")

    def __init__(self, values: Any, offsets: Any) -> None:
        v = _as_tensor(values)
        o = _as_tensor(offsets, torch.int64)
        if v.dim() != 1:
            raise ValueError(f"RaggedTensor values must be 1-D, got shape {tuple(v.shape)}")
        if o.dim() != 1 or o.numel() < 1:
            raise ValueError(
                f"RaggedTensor offsets must be 1-D with rows+1 >= 1 entries, got {tuple(o.shape)}"
            )
        if int(o[0]) != 0 or int(o[-1]) != v.numel():
            raise ValueError(
                f"RaggedTensor offsets must start at 0 and end at len(values)={v.numel()}, "
                f"got {int(o[0])}..{int(o[-1])}"
            )
        if o.numel() > 1 and bool((o[1:] < o[:-1]).any()):
            raise ValueError("RaggedTensor offsets must be non-decreasing")
        self._values = v
        self._offsets = o

    @classmethod
    def from_lengths(cls, values: Any, lengths: Any) -> RaggedTensor:
        lens = _as_tensor(lengths, torch.int64)
        offsets = torch.zeros(lens.numel() + 1, dtype=torch.int64)
        torch.cumsum(lens, 0, out=offsets[1:])
        return cls(values, offsets)

    @classmethod
    def from_list(
        cls, rows: Sequence[Sequence[Any]], dtype: torch.dtype = torch.int64
    ) -> RaggedTensor:
        flat = [x for row in rows for x in row]
        return cls.from_lengths(torch.tensor(flat, dtype=dtype), [len(r) for r in rows])

    def values(self) -> torch.Tensor:
        return self._values

    def offsets(self) -> torch.Tensor:
        return self._offsets

    def lengths(self) -> torch.Tensor:
        return self._offsets[1:] - self._offsets[:-1]

    @property
    def num_rows(self) -> int:
        return self._offsets.numel() - 1

    def __len__(self) -> int:
        return self.num_rows

    @property
    def dtype(self) -> torch.dtype:
        return self._values.dtype

    def row(self, i: int) -> torch.Tensor:
        return self._values[int(self._offsets[i]) : int(self._offsets[i + 1])]

    def to_list(self) -> list[list[Any]]:
        return [self.row(i).tolist() for i in range(self.num_rows)]

    def take_rows(self, rows: torch.Tensor) -> RaggedTensor:
        """The rows at ``rows`` ((k,) int64, repeats allowed), vectorised."""
        rows = _as_tensor(rows, torch.int64)
        starts = self._offsets[rows]
        lens = self._offsets[rows + 1] - starts
        out_offsets = torch.zeros(rows.numel() + 1, dtype=torch.int64)
        torch.cumsum(lens, 0, out=out_offsets[1:])
        total = int(out_offsets[-1])
        # index of each output value = start of its row + position within the row
        row_of_value = torch.repeat_interleave(torch.arange(rows.numel()), lens)
        within = torch.arange(total, dtype=torch.int64) - out_offsets[:-1][row_of_value]
        gather = starts[row_of_value] + within
        return RaggedTensor(self._values[gather], out_offsets)

    def slice_rows(self, start: int, stop: int) -> RaggedTensor:
        """Rows ``start:stop`` (a view of the values, offsets rebased to 0)."""
        off = self._offsets[start : stop + 1]
        lo, hi = int(off[0]), int(off[-1])
        return RaggedTensor(self._values[lo:hi], off - lo)

    @staticmethod
    def concat(parts: Sequence[RaggedTensor]) -> RaggedTensor:
        """The rows of ``parts`` one after the other (one cat of values, one of offsets)."""
        if len(parts) == 1:
            return parts[0]
        values = torch.cat([p._values for p in parts])
        shift = 0
        offsets = [parts[0]._offsets[:1]]
        for p in parts:
            offsets.append(p._offsets[1:] + shift)
            shift += p._values.numel()
        return RaggedTensor(values, torch.cat(offsets))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RaggedTensor):
            return NotImplemented
        return torch.equal(self._offsets, other._offsets) and torch.equal(
            self._values, other._values
        )

    def __repr__(self) -> str:
        return f"RaggedTensor(values={self._values.tolist()!r}, offsets={self._offsets.tolist()!r})"
