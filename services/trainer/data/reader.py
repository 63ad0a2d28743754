"""Reading pass data: TSV parsing (Criteo and the generator's format), files read in chunks
and batching (:func:`iter_batches`, every format: ``parquet`` and ``slot`` through
feature_data.py) into :class:`~.batches.Batch`.

The two TSV formats are tab-separated text, one sample a line::

    criteo     label  I1..I13 (decimal ints, may be empty or negative)  C1..C26 (hex, may be empty)
    generated  label  p_true (decimal, the planted click probability)  I1..I13  C1..C{S} (decimal)

Parsing works on whole chunks of a file at once: :func:`parse_chunk` hands a chunk to the
compiled parser (``streamrec.trainer._C.parse_lines``, one pass, single-threaded so it does
not compete with torch's threads, without the GIL), which writes the columns of the good
lines straight into the batch's tensors. A line with the wrong number of fields, a label
that is not 0/1, a field holding a character that does not belong there, or more than
:data:`~.batches.MAX_LINE_BYTES` bytes is malformed; malformed lines are
counted, skipped, and the first one is remembered (file, 1-based line) for the error a pass
raises when their share is too high. :func:`_parse_chunk_numpy` states
the same rules in numpy, column by column over all lines together; it is the reference the
tests hold the compiled parser to.

Integer features follow the reference's Criteo preprocessing: empty -> 0, negative -> 0,
then ``log(x + 1)``: always finite (an int64 is far inside float32's range), so these formats
have no missing or infinite dense value. An empty categorical field is an empty bag (no key)
for that slot.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from streamrec.trainer.data.batches import (
    MAX_LINE_BYTES,
    OVERLONG,
    Batch,
    ParseStats,
    parse_columns,
)
from streamrec.trainer.data.feature_data import SCHEMA_FORMATS, parse_slot_chunk, read_parquet
from streamrec.trainer.errors import DataError

# isort: off
# after torch: the compiled parser links against libtorch's libraries, which torch loads
import streamrec.trainer._C as _C

# isort: on

if TYPE_CHECKING:
    from streamrec.control.feature_schema import FeatureSchema

NUM_DENSE = 13
CRITEO_SLOTS = 26
_NL, _TAB, _CR = 10, 9, 13


def split_lines(
    buf: np.ndarray, ncols: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Field ranges of every line with exactly ``ncols`` tab-separated fields.

    Args:
        buf: (nbytes,) uint8, whole lines, the last one ending in '\\n'.

    Returns:
        starts, ends: (m, ncols) int64 of the good lines; good: (n,) bool per line;
        line_ends: (n,) int64 position of each line's newline.
    """
    nl = np.flatnonzero(buf == _NL)
    n = nl.size
    line_starts = np.empty(n, dtype=np.int64)
    line_starts[:1] = 0
    line_starts[1:] = nl[:-1] + 1
    line_ends = nl.astype(np.int64)
    has_cr = np.zeros(n, dtype=bool)
    nonempty = line_ends > line_starts
    has_cr[nonempty] = buf[line_ends[nonempty] - 1] == _CR
    content_ends = line_ends - has_cr
    tabs = np.flatnonzero(buf == _TAB)
    line_of_tab = np.searchsorted(nl, tabs)
    counts = np.bincount(line_of_tab, minlength=n)[:n]
    good = (counts == ncols - 1) & (content_ends > line_starts)
    tpos = tabs[good[line_of_tab]].reshape(-1, ncols - 1).astype(np.int64)
    starts = np.concatenate([line_starts[good][:, None], tpos + 1], axis=1)
    ends = np.concatenate([tpos, content_ends[good][:, None]], axis=1)
    return starts, ends, good, line_ends


def _line_scan(buf: np.ndarray, ncols: int) -> tuple[np.ndarray, np.ndarray]:
    """Per non-blank line: whether it has ``ncols`` fields, and its 0-based line index.

    Args:
        buf: (nbytes,) uint8, whole lines, the last one ending in '\\n'.

    Returns:
        field_ok: (m,) bool over the m non-blank lines; line_index: (m,) int64.
    """
    nl = np.flatnonzero(buf == _NL)
    starts = np.empty(nl.size, dtype=np.int64)
    starts[:1] = 0
    starts[1:] = nl[:-1] + 1
    lens = nl - starts
    has_cr = np.zeros(nl.size, dtype=bool)
    has_cr[lens > 0] = buf[nl[lens > 0] - 1] == _CR
    nonblank = (lens - has_cr) > 0
    # tabs before each newline, differenced: the tab count of every line
    before = np.searchsorted(np.flatnonzero(buf == _TAB), nl)
    tabs = np.diff(before, prepend=0)
    line_index = np.flatnonzero(nonblank)
    return tabs[nonblank] == ncols - 1, line_index


def _check_format(data_format: str) -> None:
    if data_format not in ("criteo", "generated"):
        raise ValueError(f"data_format must be 'criteo' or 'generated', got {data_format!r}")


def _frame(
    data: bytes, data_format: str, num_slots: int
) -> tuple[bytes, np.ndarray, bool, int, int]:
    """Checks the format and ends the text with a newline: (data, its bytes as uint8, whether
    it is the generated format, the leading columns before the dense ones, columns per line)."""
    _check_format(data_format)
    if data and not data.endswith(b"\n"):
        data = data + b"\n"
    gen = data_format == "generated"
    head = 2 if gen else 1
    return data, np.frombuffer(data, dtype=np.uint8), gen, head, head + NUM_DENSE + num_slots


def _parse_format(
    data: bytes,
    source: str,
    first_line: int,
    max_line_bytes: int,
    data_format: str,
    num_slots: int,
) -> tuple[Batch, ParseStats]:
    return parse_chunk(data, data_format, num_slots, source, first_line, max_line_bytes)


def parse_chunk(
    data: bytes | bytearray | memoryview,
    data_format: str,
    num_slots: int,
    source: str = "<bytes>",
    first_line: int = 1,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> tuple[Batch, ParseStats]:
    """Parses whole lines of text into a Batch; malformed lines are counted and skipped.

    Blank lines are ignored. A line is malformed when it has the wrong number of fields,
    a label other than 0/1, a field that is not a number of its column's kind, or more than
    ``max_line_bytes`` bytes before its newline.

    Args:
        data: text of whole lines (a missing final newline is tolerated); any contiguous
            buffer (bytes, bytearray, memoryview), read in place.
        data_format: 'criteo' or 'generated'.
        num_slots: S, categorical fields per line (26 for Criteo).
        source, first_line: file name and line number of ``data``'s first line, for errors.
        max_line_bytes: the longest line taken (its bytes before the newline, a CR counted).
    """
    _check_format(data_format)
    gen = data_format == "generated"
    (
        dense,
        labels,
        keys,
        present,
        ptrue,
        lines,
        malformed,
        bad_fields,
        bad_value,
        overlong,
    ) = _C.parse_lines(data, gen, num_slots, max_line_bytes)
    # log1p is numpy's, as in _make_batch: numpy's float32 log1p (SIMD where the CPU has it)
    # and the C library's log1pf differ in the last bit for some inputs
    values = dense.numpy()
    np.log1p(values, out=values)
    stats = ParseStats(lines=lines, malformed=malformed)
    ncols = (2 if gen else 1) + NUM_DENSE + num_slots
    stats.first_bad = _first_bad(
        bad_fields if bad_fields >= 0 else None,
        bad_value if bad_value >= 0 else None,
        overlong if overlong >= 0 else None,
        ncols,
        max_line_bytes,
        source,
        first_line,
    )
    return Batch(dense, labels, keys, present, ptrue), stats


def _make_batch(
    label: np.ndarray,
    ints: np.ndarray,
    keys: np.ndarray,
    empty: np.ndarray,
    ptrue: np.ndarray | None,
    row_ok: np.ndarray,
) -> Batch:
    if not row_ok.all():
        label, ints, keys, empty = label[row_ok], ints[row_ok], keys[row_ok], empty[row_ok]
        ptrue = None if ptrue is None else ptrue[row_ok]
    dense = np.log1p(np.maximum(ints, 0).astype(np.float32))
    present = ~empty
    return Batch(
        dense=torch.from_numpy(np.ascontiguousarray(dense)),
        labels=torch.from_numpy(label.astype(np.float32)),
        keys=torch.from_numpy(np.ascontiguousarray(keys)),
        present=None if present.all() else torch.from_numpy(present),
        ptrue=None if ptrue is None else torch.from_numpy(ptrue.astype(np.float32)),
    )


def _parse_chunk_numpy(
    data: bytes,
    data_format: str,
    num_slots: int,
    source: str = "<bytes>",
    first_line: int = 1,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> tuple[Batch, ParseStats]:
    """The reference parser, in numpy: what :func:`parse_chunk` (compiled) must give, field
    for field and count for count. Only the tests and tests/fuzz/fuzz_lines.py call it.

    Args:
        data: text of whole lines (a missing final newline is tolerated).
        data_format: 'criteo' or 'generated'.
        num_slots: S, categorical fields per line (26 for Criteo).
        source, first_line: file name and line number of ``data``'s first line, for errors.
        max_line_bytes: the longest line taken (its bytes before the newline, a CR counted).
    """
    data, buf, gen, head, ncols = _frame(data, data_format, num_slots)
    starts, ends, good, line_ends = split_lines(buf, ncols)
    line_starts = np.concatenate([[0], line_ends[:-1] + 1]).astype(np.int64)
    overlong = line_ends - line_starts > max_line_bytes  # (n,) every line
    label, lab_ok, lab_empty = parse_columns(buf, starts[:, :1], ends[:, :1], "int")
    row_ok = (lab_ok & ~lab_empty & ((label == 0) | (label == 1)))[:, 0]
    ints, int_ok, _ = parse_columns(
        buf, starts[:, head : head + NUM_DENSE], ends[:, head : head + NUM_DENSE], "int"
    )
    keys, key_ok, key_empty = parse_columns(
        buf, starts[:, head + NUM_DENSE :], ends[:, head + NUM_DENSE :], "int" if gen else "hex"
    )
    row_ok &= int_ok.all(axis=1) & key_ok.all(axis=1)
    ptrue = None
    if gen:
        p, p_ok, p_empty = parse_columns(buf, starts[:, 1:2], ends[:, 1:2], "fixed")
        row_ok &= (p_ok & ~p_empty & (p <= 1.0))[:, 0]
        ptrue = p[:, 0]
    field_ok, line_index = _line_scan(buf, ncols)  # the same numbering as the fast path
    assert int(field_ok.sum()) == int(good.sum())
    row_ok &= ~overlong[good]  # too long: malformed whatever it holds
    long_line = overlong[line_index]
    stats = ParseStats(lines=int(field_ok.size))
    bad_fields = line_index[~field_ok & ~long_line]
    bad_values = line_index[field_ok & ~long_line][~row_ok[~long_line[field_ok]]]
    bad_long = line_index[long_line]
    _record_malformed(
        stats, bad_fields, bad_values, bad_long, ncols, max_line_bytes, source, first_line
    )
    return _make_batch(label[:, 0], ints, keys, key_empty, ptrue, row_ok), stats


#: The first bytes of a gzip file: such a file is decompressed as it is read.
GZIP_MAGIC = b"\x1f\x8b"


def open_data_file(path: Path) -> io.BufferedIOBase:
    """Opens a data file for reading bytes; a gzip file (by its magic bytes, whatever its name)
    is decompressed on the fly, so memory stays bounded by the chunk size."""
    f = path.open("rb")
    if f.read(2) == GZIP_MAGIC:
        f.close()
        return gzip.open(path, "rb")
    f.seek(0)
    return f


def read_file(
    path: str | Path,
    data_format: str,
    num_slots: int,
    chunk_bytes: int = 16 << 20,
    max_line_bytes: int = MAX_LINE_BYTES,
    parse: Callable[[bytes, str, int, int], tuple[Batch, ParseStats]] | None = None,
) -> Iterator[tuple[Batch, ParseStats]]:
    """Parses a file chunk by chunk (whole lines each); yields (batch, stats) per chunk.

    ``parse(text, file, first line, max_line_bytes)`` parses a chunk (default:
    :func:`parse_chunk` of ``data_format``; the slot text's parser in feature_data.py).

    Memory stays within about ``chunk_bytes + max_line_bytes`` whatever the file holds: a line
    longer than ``max_line_bytes`` is malformed, dropped up to its newline (never buffered
    whole when it outgrows a chunk; counted by the parser when a chunk holds it whole). A
    gzip file is read through (:func:`open_data_file`); one that is corrupt or cut short, like
    an unreadable file, raises DataError naming the file.
    """
    path = Path(path)
    if parse is None:
        parse = partial(_parse_format, data_format=data_format, num_slots=num_slots)
    line_no = 1  # 1-based number of the next line to parse
    rest = b""  # the start of a line whose newline is not read yet
    skipping = False  # inside a line longer than max_line_bytes: dropped up to its newline

    def overlong() -> tuple[Batch, ParseStats]:
        stats = ParseStats(lines=1, malformed=1)
        stats.first_bad = (str(path), line_no, OVERLONG.format(max_line_bytes))
        return parse(b"", str(path), line_no, max_line_bytes)[0], stats

    try:
        with open_data_file(path) as f:
            while True:
                block = f.read(chunk_bytes)
                if not block:
                    break
                if skipping:
                    nl = block.find(b"\n")
                    if nl < 0:
                        continue
                    yield overlong()
                    line_no += 1
                    skipping, block = False, block[nl + 1 :]
                block = rest + block
                cut = block.rfind(b"\n")
                rest = block[cut + 1 :]
                if cut >= 0:
                    batch, stats = parse(block[: cut + 1], str(path), line_no, max_line_bytes)
                    line_no += block.count(b"\n", 0, cut + 1)
                    yield batch, stats
                if len(rest) > max_line_bytes:
                    skipping, rest = True, b""
            if skipping:
                yield overlong()
            elif rest:
                yield parse(rest, str(path), line_no, max_line_bytes)
    except (OSError, EOFError, zlib.error) as exc:
        # gzip: BadGzipFile (an OSError) on a bad header, EOFError when cut short, zlib.error
        # on corrupt data
        raise DataError(f"cannot read data file {path}: {type(exc).__name__}: {exc}") from exc


def read_chunks(
    path: Path,
    data_format: str,
    num_slots: int,
    chunk_bytes: int,
    schema: FeatureSchema | None,
) -> Iterator[tuple[Batch, ParseStats]]:
    """(batch, stats) per chunk of a data file in any format: the TSV formats parsed here,
    ``parquet`` and ``slot`` by ``schema`` (feature_data.py)."""
    if data_format not in SCHEMA_FORMATS:
        return read_file(path, data_format, num_slots, chunk_bytes)
    if schema is None:
        raise DataError(f"data_format {data_format!r} needs a schema (runner.schema)")
    if data_format == "parquet":
        return read_parquet(path, schema)
    return read_file(
        path,
        data_format,
        num_slots,
        chunk_bytes,
        parse=lambda text, source, line, limit: parse_slot_chunk(text, schema, source, line, limit),
    )


def iter_batches(
    files: list[Path],
    data_format: str,
    num_slots: int,
    batch_size: int,
    stats: ParseStats,
    max_malformed_ratio: float = 1.0,
    chunk_bytes: int = 16 << 20,
    schema: FeatureSchema | None = None,
) -> Iterator[Batch]:
    """Batches of exactly ``batch_size`` (the last may be smaller) over several files;
    ``parquet`` and ``slot`` read by ``schema`` (feature_data.py).

    ``stats`` accumulates line counts; after each file the malformed share so far is
    checked against ``max_malformed_ratio`` (DataError naming the first bad line).
    """
    pending: list[Batch] = []
    npending = 0
    for path in files:
        for chunk, chunk_stats in read_chunks(path, data_format, num_slots, chunk_bytes, schema):
            stats.add(chunk_stats)
            if len(chunk) == 0:
                continue
            pending.append(chunk)
            npending += len(chunk)
            if npending >= batch_size:
                merged = Batch.concat(pending)
                full = (npending // batch_size) * batch_size
                for start in range(0, full, batch_size):
                    yield merged.slice(start, start + batch_size)
                pending = [merged.slice(full, npending)] if full < npending else []
                npending -= full
        stats.files.append(str(path))
        stats.check(max_malformed_ratio, f"pass data up to {path}")
    if npending:
        yield Batch.concat(pending)


#: Why a line is malformed, by kind (the first one of a chunk is named in ParseStats).
_BAD_FIELDS = "expected {} tab-separated fields"
_BAD_VALUE = "bad label (not 0/1) or a field that is not a number of its column's kind"


def _first_bad(
    bad_fields: int | None,
    bad_value: int | None,
    overlong: int | None,
    ncols: int,
    max_line_bytes: int,
    source: str,
    first_line: int,
) -> tuple[str, int, str] | None:
    """(file, 1-based line, reason) of the earliest of the three kinds' first malformed lines.

    Args:
        bad_fields, bad_value, overlong: 0-based index in the chunk of the first line with the
            wrong number of fields, of the first one with a bad value, and of the first one
            longer than ``max_line_bytes``; None: no such line.
    """
    firsts = []
    if bad_fields is not None:
        firsts.append((bad_fields, _BAD_FIELDS.format(ncols)))
    if bad_value is not None:
        firsts.append((bad_value, _BAD_VALUE))
    if overlong is not None:
        firsts.append((overlong, OVERLONG.format(max_line_bytes)))
    if not firsts:
        return None
    line, reason = min(firsts)
    return (source, first_line + line, reason)


def _record_malformed(
    stats: ParseStats,
    bad_fields: np.ndarray,
    bad_values: np.ndarray,
    bad_long: np.ndarray,
    ncols: int,
    max_line_bytes: int,
    source: str,
    first_line: int,
) -> None:
    """Counts malformed lines and names the first one (file, line, reason) in ``stats``.

    Args:
        bad_fields: (k,) int64 line indices with the wrong number of fields.
        bad_values: (m,) int64 line indices whose fields do not parse as their column's kind.
        bad_long: (j,) int64 line indices longer than ``max_line_bytes`` (in neither above).
    """
    stats.malformed = int(bad_fields.size + bad_values.size + bad_long.size)
    stats.first_bad = _first_bad(
        int(bad_fields[0]) if bad_fields.size else None,
        int(bad_values[0]) if bad_values.size else None,
        int(bad_long[0]) if bad_long.size else None,
        ncols,
        max_line_bytes,
        source,
        first_line,
    )
