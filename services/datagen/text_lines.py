"""Integer columns written as text lines, vectorised (the generators' writers).

:func:`format_lines` writes rows of int64 columns (decimal or hex, zero-padded, empty
fields) in one pass per digit; :func:`to_generated_text` and :func:`to_criteo_text` lay
samples out in the trainer's ``generated`` format and Criteo's TSV.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


@dataclass
class TextColumn:
    """A column of non-negative or negative int64 values to write as text.

    Attributes:
        values: (n,) int64.
        base: 10 or 16 (hex, lowercase; values must be >= 0).
        pad: minimum digits, zero-padded (for the fraction of a fixed-point number).
        sep: the byte written after the field (tab, '.', or newline for the last one).
        empty: (n,) bool, write nothing for these rows; None: none empty.
    """

    values: np.ndarray
    base: int = 10
    pad: int = 1
    sep: bytes = b"\t"
    empty: np.ndarray | None = None


def format_lines(columns: Sequence[TextColumn]) -> bytes:
    """Writes rows of integer columns as text, vectorised over rows (one pass per digit)."""
    n = len(columns[0].values)
    texts = []
    widths = np.zeros(n, dtype=np.int64)
    for col in columns:
        v = np.asarray(col.values, dtype=np.int64)
        neg = v < 0
        mag = np.where(neg, -v, v).astype(np.uint64)
        ndig = np.ones(n, dtype=np.int64)
        probe = mag.copy()
        base = np.uint64(col.base)
        probe //= base
        while probe.any():
            ndig += probe > 0
            probe //= base
        ndig = np.maximum(ndig, col.pad)
        length = ndig + neg
        if col.empty is not None:
            length = np.where(col.empty, 0, length)
        texts.append((mag, neg, ndig, length))
        widths += length + 1  # + separator
    line_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(widths, out=line_start[1:])
    out = np.empty(int(line_start[-1]), dtype=np.uint8)
    pos = line_start[:-1].copy()
    for col, (mag, neg, ndig, length) in zip(columns, texts, strict=True):
        keep = length > 0
        out[pos[keep & neg]] = ord("-")
        digit_end = pos + length  # one past the last digit
        base = np.uint64(col.base)
        rest = mag.copy()
        for j in range(int(ndig.max(initial=1))):
            m = keep & (j < ndig)
            out[(digit_end - 1 - j)[m]] = _DIGITS[(rest % base).astype(np.int64)][m]
            rest //= base
        out[digit_end] = ord(col.sep)
        pos = digit_end + 1
    return out.tobytes()


def to_generated_text(s: dict[str, np.ndarray]) -> bytes:
    """Samples from :meth:`PlantedStream.draw` -> lines in the ``generated`` format."""
    micro = np.round(s["ptrue"] * 1e6).astype(np.int64)
    cols = [
        TextColumn(s["label"]),
        TextColumn(micro // 1_000_000, sep=b"."),
        TextColumn(micro % 1_000_000, pad=6),
    ]
    cols += [TextColumn(s["ints"][:, j]) for j in range(s["ints"].shape[1])]
    nslots = s["keys"].shape[1]
    empty = s.get("empty")
    for j in range(nslots):
        cols.append(
            TextColumn(
                s["keys"][:, j],
                empty=None if empty is None else empty[:, j],
                sep=b"\n" if j == nslots - 1 else b"\t",
            )
        )
    return format_lines(cols)


def to_criteo_text(
    label: np.ndarray, ints: np.ndarray, keys: np.ndarray, empty: np.ndarray | None = None
) -> bytes:
    """label (n,), ints (n, 13), keys (n, 26) in [0, 2**32) -> Criteo TSV lines (hex)."""
    cols = [TextColumn(label)] + [TextColumn(ints[:, j]) for j in range(ints.shape[1])]
    for j in range(keys.shape[1]):
        cols.append(
            TextColumn(
                keys[:, j],
                base=16,
                pad=8,
                empty=None if empty is None else empty[:, j],
                sep=b"\n" if j == keys.shape[1] - 1 else b"\t",
            )
        )
    return format_lines(cols)
