"""The batch the trainer reads pass data into, the counts of what a read parsed, and the
field parser every text format shares.

:class:`Batch` holds B samples: dense features, labels and the sparse keys, one key a slot
(Criteo and the generator's TSV, reader.py) or ragged bags (a schema's slot text and Parquet,
feature_data.py). :class:`ParseStats` counts lines and malformed lines and names the first
one. :func:`parse_columns` parses blocks of text fields, all lines at once, in numpy (the
reference TSV parser and the slot text's reference parser use it). :data:`MAX_LINE_BYTES`
bounds a line of every text format.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from streamrec.ragged import RaggedTensor
from streamrec.trainer.errors import DataError

_MINUS, _DOT = 45, 46

#: A text line longer than this (bytes before its newline) is malformed whatever it holds:
#: counted and skipped by the parsers, and not even buffered whole by the file reader (a file
#: of binary garbage without newlines costs this much memory).
MAX_LINE_BYTES = 1 << 20
#: Why such a line is malformed (``first_bad``'s reason), formatted with the limit.
OVERLONG = "line longer than max_line_bytes ({} bytes); skipped"

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
_DEC = np.full(256, 255, dtype=np.uint8)
_DEC[48:58] = np.arange(10, dtype=np.uint8)


@dataclass
class Batch:
    """A batch of samples.

    Attributes:
        dense: (B, D) float32: log-transformed integer features (criteo, generated), or a
            schema's dense features, NaN where a value is missing (a null, a nan).
        labels: (B,) float32 in {0, 1}.
        keys: (B, S) int64, the key of each sparse slot (meaningless where not present).
        present: (B, S) bool, False for an empty categorical field; None: all present.
        ptrue: (B,) float32 planted click probability (generated data), else None.
        bags: None (one key a slot: ``keys``), or S RaggedTensors of ``B`` rows of int64
            keys each, any number a row (a schema's list features); ``keys`` is then (B, 0).
    """

    dense: torch.Tensor
    labels: torch.Tensor
    keys: torch.Tensor
    present: torch.Tensor | None = None
    ptrue: torch.Tensor | None = None
    bags: list[RaggedTensor] | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_features(self) -> int:
        """S, the sparse features (slots)."""
        return int(self.keys.shape[1]) if self.bags is None else len(self.bags)

    def features(self) -> list[RaggedTensor]:
        """One RaggedTensor per slot (S x (values, offsets)), ``B`` rows each."""
        if self.bags is not None:
            return self.bags
        b, s = self.keys.shape
        if self.present is None:
            offsets = torch.arange(b + 1, dtype=torch.int64)
            cols = self.keys.t().contiguous()
            return [RaggedTensor(cols[j], offsets) for j in range(s)]
        out = []
        for j in range(s):
            mask = self.present[:, j]
            offsets = torch.zeros(b + 1, dtype=torch.int64)
            torch.cumsum(mask.to(torch.int64), 0, out=offsets[1:])
            out.append(RaggedTensor(self.keys[:, j][mask], offsets))
        return out

    @staticmethod
    def concat(batches: list[Batch]) -> Batch:
        """The rows of ``batches`` in order (all one-key, or all ragged)."""
        if len(batches) == 1:
            return batches[0]
        present = bags = ptrue = None
        if batches[0].bags is not None:
            parts = [b.bags for b in batches]
            assert all(p is not None for p in parts), "ragged and one-key batches are not mixed"
            bags = [RaggedTensor.concat(list(f)) for f in zip(*parts, strict=True)]  # type: ignore[arg-type]
        elif any(b.present is not None for b in batches):
            present = torch.cat(
                [
                    b.present
                    if b.present is not None
                    else torch.ones_like(b.keys, dtype=torch.bool)
                    for b in batches
                ]
            )
        if all(b.ptrue is not None for b in batches):
            ptrue = torch.cat([b.ptrue for b in batches])  # type: ignore[misc]
        return Batch(
            torch.cat([b.dense for b in batches]),
            torch.cat([b.labels for b in batches]),
            torch.cat([b.keys for b in batches]),
            present,
            ptrue,
            bags,
        )

    def slice(self, start: int, stop: int) -> Batch:
        return Batch(
            self.dense[start:stop],
            self.labels[start:stop],
            self.keys[start:stop],
            None if self.present is None else self.present[start:stop],
            None if self.ptrue is None else self.ptrue[start:stop],
            None if self.bags is None else [f.slice_rows(start, stop) for f in self.bags],
        )


@dataclass
class ParseStats:
    """Line counts of what was read; ``first_bad`` names the first malformed line (a row of
    a Parquet file: ``first_bad_unit`` "row")."""

    lines: int = 0
    malformed: int = 0
    first_bad: tuple[str, int, str] | None = None  # (file, 1-based line, reason)
    files: list[str] = field(default_factory=list)
    first_bad_unit: str = "line"

    def add(self, other: ParseStats) -> None:
        self.lines += other.lines
        self.malformed += other.malformed
        if self.first_bad is None and other.first_bad is not None:
            self.first_bad, self.first_bad_unit = other.first_bad, other.first_bad_unit
        self.files.extend(other.files)

    def check(self, max_malformed_ratio: float, what: str = "pass") -> None:
        """Raises DataError when the malformed share exceeds ``max_malformed_ratio``."""
        if self.lines and self.malformed / self.lines > max_malformed_ratio:
            assert self.first_bad is not None
            path, line, reason = self.first_bad
            raise DataError(
                f"{what}: {self.malformed} of {self.lines} lines malformed "
                f"({self.malformed / self.lines:.2%} > max_malformed_ratio "
                f"{max_malformed_ratio:.2%}); first: {path} {self.first_bad_unit} {line}: "
                f"{reason}"
            )


def parse_columns(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, kind: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parses a block of fields, all lines at once.

    Args:
        buf: (nbytes,) uint8 text.
        starts, ends: (n, k) int64 byte range [start, end) of each field.
        kind: 'int' (optional '-', decimal), 'hex', or 'fixed' (decimal with one optional '.').

    Returns:
        values: (n, k) int64 for int/hex, float64 for fixed; ok: (n, k) bool;
        empty: (n, k) bool (empty fields are ok and read as 0).
    """
    lens = ends - starts
    empty = lens == 0
    ok = lens <= (16 if kind == "hex" else 19)
    if kind == "int":
        neg = ~empty & (buf[np.minimum(starts, len(buf) - 1)] == _MINUS)
        starts = starts + neg
        lens = lens - neg
        ok &= ~(neg & (lens == 0))
    width = int(lens.max(initial=0)) if lens.size else 0
    width = min(width, 19)
    table = _HEX if kind == "hex" else _DEC
    base = np.uint64(16 if kind == "hex" else 10)
    acc = np.zeros(starts.shape, dtype=np.uint64)
    frac = np.zeros(starts.shape, dtype=np.int64)
    seen_dot = np.zeros(starts.shape, dtype=bool)
    last = len(buf) - 1
    with np.errstate(over="ignore"):
        for j in range(width):
            active = j < lens
            ch = buf[np.minimum(starts + j, last)]
            if kind == "fixed":
                dot = active & (ch == _DOT)
                ok &= ~(dot & seen_dot)
                seen_dot |= dot
                active &= ~dot
            d = table[ch]
            ok &= ~(active & (d == 255))
            step = active & (d != 255)
            acc = np.where(step, acc * base + d.astype(np.uint64), acc)
            if kind == "fixed":
                frac += step & seen_dot
    if kind == "fixed":
        ok &= ~(seen_dot & (lens == 1))  # "." alone is no number
        return acc.astype(np.float64) / np.power(10.0, frac), ok, empty
    if kind == "int":
        ok &= acc <= np.uint64(2**63 - 1)  # 19 digits may pass int64: malformed, not wrapped
    values = acc.view(np.int64)
    if kind == "int":
        values = np.where(neg, -values, values)
    return values, ok, empty
