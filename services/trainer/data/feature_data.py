"""Reading a schema job's data: PaddleRec slot text and Parquet, into ragged batches.

Both give a :class:`~.batches.Batch` with ``bags`` (one RaggedTensor of int64
keys per sparse feature of ``data.schema``, any number a row) and ``dense`` (B, D) float32
in the schema's order (``log1p`` where the schema asks it).

``slot``: one sample a line, space-separated ``name:value`` tokens, a list feature repeating
its name, in any order::

    click:1 age:0.31 price:12.5 user_id:17 genres:5 genres:9

The label's and the dense values are numbers in standard float syntax, at most
:data:`MAX_NUMBER_BYTES` bytes: an optional sign (``-`` or ``+``), digits with at most one
``.`` (``5.``, ``.5``), an optional exponent (``1.5e-7``, ``2E+03``), any number of digits
(read as the correctly rounded float64, then a dense one rounded to float32, as numpy's
``astype`` and ``strtod`` do); or ``nan``, ``inf``, ``infinity`` in any case. The label is a
click when > 0; a sparse value is a decimal int64 key, or else a string id
(``item_id:sku-53``, what ``streamrec-datagen --from-events --format slot`` writes of a
string column) hashed by :func:`streamrec.keyhash.hash_ranges` as Parquet's strings are. A
sparse feature absent from a line is an empty bag; a name the schema does not hold is
skipped (a file may carry more slots than a job reads).

Missing and non-finite values (decided): a dense ``nan`` is a missing value, NaN in
``Batch.dense`` (the model's normalizer takes it for the mean); a dense value whose float32
is infinite (``inf``, ``-inf``, or beyond float32's range: ``1e39``) and a label that is not
a finite number (``nan``, ``inf``, ``1e309``) make the line malformed. A line is malformed,
counted as the TSV parsers count theirs (``max_malformed_ratio``), when it lacks the label
or a dense feature, names one twice, has a token that is not ``name:value``, a label or
dense value that is not a number or not as above, or is longer than
:data:`~.batches.MAX_LINE_BYTES`; the first one of a chunk is named with
its file, line, feature and value (:class:`SlotBad`).

:func:`parse_slot_chunk` hands a whole chunk to the compiled parser
(``streamrec.trainer._C.parse_slot``: one pass, one thread, without the GIL), which writes
the labels, the dense columns and each feature's keys and offsets. :func:`_parse_slot_chunk_numpy`
states the same rules in numpy (token bounds, names hashed by
:func:`streamrec.keyhash.hash_ranges` and matched to the schema's, values parsed column by
column: the float syntax by a state machine over the value's bytes, the value by numpy's
``astype(float64)`` of the text); it is the reference the tests hold the compiled parser to,
field for field and bit for bit (the compiled parser reads numbers with ``std::from_chars``:
both are correctly rounded, so they agree).

``parquet``: columns named by the schema, read with pyarrow a record batch at a time (memory
bounded by ``batch_rows``); ids int (one key a row, null: an empty bag), string (hashed to
int64 by :func:`streamrec.keyhash.string_keys`), or a list of either (a bag; a null list or
item: none); the label and dense columns numbers. A null or NaN dense value is missing (NaN);
an infinite one (or one beyond float32's range) and a null, NaN or infinite label make the
row malformed, the first one named with its file, row, column and value. A file whose
columns lack a schema feature fails the split (DataError naming the column).
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import IntEnum
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from streamrec.control.feature_schema import FeatureSchema
from streamrec.errors import quote
from streamrec.keyhash import hash_ranges, string_key, string_keys
from streamrec.ragged import RaggedTensor
from streamrec.trainer import _C
from streamrec.trainer.data.batches import (
    MAX_LINE_BYTES,
    OVERLONG,
    Batch,
    ParseStats,
    parse_columns,
)
from streamrec.trainer.errors import DataError

_NL, _CR, _TAB, _SPACE, _COLON, _MINUS, _PLUS = 10, 13, 9, 32, 58, 45, 43
#: The longest label or dense value of slot text, in bytes, its sign included (ops.h's
#: kMaxNumber); a longer one is not a number.
MAX_NUMBER_BYTES = 128
#: How much of a bad value an error shows.
_SHOWN = 40


class SlotBad(IntEnum):
    """Why a slot-text line is malformed (ops.h's ``SlotBad``): the first bad token of the
    line decides, then a missing label or dense feature; a line too long is that first."""

    TOKEN = 1  # a token that is not name:value
    REPEATED = 2  # the label or a dense feature twice
    NOT_NUMBER = 3  # a label or dense value that is not a number
    NOT_FINITE = 4  # a label not finite, a dense value infinite in float32
    MISSING = 5  # no label, or no value of a dense feature
    OVERLONG = 6  # longer than max_line_bytes


def make_batch(
    schema: FeatureSchema, labels: np.ndarray, dense: np.ndarray, bags: list[RaggedTensor]
) -> Batch:
    """A ragged Batch; ``log1p`` taken of the dense columns the schema asks it of (the log of
    the value's positive part). A missing value (NaN) stays NaN for the model's normalizer.

    Args:
        labels: (B,) float, > 0 a click; dense: (B, D) float; bags: S RaggedTensors of B rows.
    """
    dense = dense.astype(np.float32)
    logs = [i for i, d in enumerate(schema.dense) if d.log1p]
    if logs:
        dense[:, logs] = np.log1p(np.maximum(dense[:, logs], 0))
    return Batch(
        dense=torch.from_numpy(np.ascontiguousarray(dense)),
        labels=torch.from_numpy((labels > 0).astype(np.float32)),
        keys=torch.zeros((labels.shape[0], 0), dtype=torch.int64),
        bags=bags,
    )


def _ints(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, ok) of n tokens' values as decimal int64 keys."""
    v, ok, empty = parse_columns(buf, starts[:, None], ends[:, None], "int")
    return v[:, 0], (ok & ~empty)[:, 0]


# The float syntax after the sign, a state machine over the value's bytes. Byte classes:
# 0 other, 1 digit, 2 sign, 3 '.', 4 'e'/'E'. States: 0 dead, 1 start, 2 digits, 3 "digits.",
# 4 "." alone, 5 digits after the '.', 6 'e', 7 the exponent's sign, 8 exponent digits.
_FLOAT_CLASS = np.zeros(256, dtype=np.uint8)
_FLOAT_CLASS[48:58] = 1
_FLOAT_CLASS[[_PLUS, _MINUS]] = 2
_FLOAT_CLASS[46] = 3
_FLOAT_CLASS[[ord("e"), ord("E")]] = 4
_FLOAT_STEP = np.zeros((9, 5), dtype=np.uint8)  # [state, class] -> state (0: dead)
for _state, _cls, _to in [
    (1, 1, 2), (1, 3, 4),
    (2, 1, 2), (2, 3, 3), (2, 4, 6),
    (3, 1, 5), (3, 4, 6),
    (4, 1, 5),
    (5, 1, 5), (5, 4, 6),
    (6, 1, 8), (6, 2, 7),
    (7, 1, 8),
    (8, 1, 8),
]:  # fmt: skip
    _FLOAT_STEP[_state, _cls] = _to
_FLOAT_ACCEPT = np.zeros(9, dtype=bool)
_FLOAT_ACCEPT[[2, 3, 5, 8]] = True
#: What a label or dense value reads as (:func:`_floats`' kinds).
_FINITE, _NAN, _INFINITE, _NOT_NUMBER = 0, 1, 2, 3


def _floats(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values (n,) float64, kinds (n,) int8) of n non-empty label or dense values: the
    correctly rounded float64 of a number (numpy's ``astype`` of its text: an overflow is
    inf, an underflow 0), NaN for nan, +-inf for inf / infinity; kinds ``_FINITE``,
    ``_NAN``, ``_INFINITE`` (inf, or a number beyond float64) or ``_NOT_NUMBER``."""
    n = starts.size
    lens = ends - starts
    first = buf[np.minimum(starts, buf.size - 1)]
    neg = first == _MINUS
    signed = neg | (first == _PLUS)
    body, blen = starts + signed, lens - signed  # after the sign
    fits = (lens <= MAX_NUMBER_BYTES) & (blen > 0)
    width = max(int(blen[fits].max(initial=0)), 8)  # 8: "infinity"
    cols = np.arange(width)
    inside = fits[:, None] & (cols < blen[:, None])
    text = np.where(inside, buf[np.minimum(body[:, None] + cols, buf.size - 1)], 0)
    text = np.ascontiguousarray(text, dtype=np.uint8)  # (n, width), zero-padded
    cls = _FLOAT_CLASS[text]
    state = np.ones(n, dtype=np.uint8)
    for j in range(width):  # one step a byte column, every value at once
        state = np.where(inside[:, j], _FLOAT_STEP[state, cls[:, j]], state)
    number = fits & _FLOAT_ACCEPT[state]
    lower = text | np.where((text >= 65) & (text <= 90), 32, 0).astype(np.uint8)

    def word(w: bytes) -> np.ndarray:
        spelled = np.zeros(width, dtype=np.uint8)
        spelled[: len(w)] = np.frombuffer(w, dtype=np.uint8)
        return fits & (blen == len(w)) & (lower == spelled).all(axis=1)

    values = np.zeros(n)
    if number.any():
        with np.errstate(over="ignore", under="ignore"):
            values[number] = text[number].view(f"S{width}")[:, 0].astype(np.float64)
    infinite = word(b"inf") | word(b"infinity")
    values[infinite] = np.inf
    values = np.where(neg, -values, values)
    nan = word(b"nan")
    values[nan] = np.nan  # one NaN whatever the sign
    kinds = np.full(n, _NOT_NUMBER, dtype=np.int8)
    kinds[number] = np.where(np.isinf(values[number]), _INFINITE, _FINITE)
    kinds[nan], kinds[infinite] = _NAN, _INFINITE
    return values, kinds


def _shown(raw: bytes) -> str:
    """Bytes of a bad value as an error shows them (UTF-8, escapes, cut)."""
    return quote(raw.decode("utf-8", "backslashreplace"), _SHOWN)


def _slot_reason(
    data: bytes | bytearray | memoryview,
    schema: FeatureSchema,
    why: int,
    fid: int,
    begin: int,
    end: int,
    max_line_bytes: int,
) -> str:
    """Why the first malformed line of ``data`` is (the parsers' SlotBad, the feature id it
    names and the bytes [begin, end) that show it), in words naming feature and value."""
    names = _feature_names(schema)
    what = ""
    if fid >= 0:
        what = f"label {names[0]!r}" if fid == 0 else f"dense feature {names[fid]!r}"
    shown = _shown(bytes(memoryview(data)[begin:end])) if begin >= 0 else ""
    bad = SlotBad(why)
    if bad == SlotBad.OVERLONG:
        return OVERLONG.format(max_line_bytes)
    if bad == SlotBad.TOKEN:
        return f"token {shown} is not name:value"
    if bad == SlotBad.REPEATED:
        return f"{what} twice (again: {shown})"
    if bad == SlotBad.NOT_NUMBER:
        return f"{what} value {shown} is not a number"
    if bad == SlotBad.NOT_FINITE and fid == 0:
        return f"{what} value {shown} is not a finite number"
    if bad == SlotBad.NOT_FINITE:
        return (
            f"{what} value {shown} is infinite in float32 (inf, or beyond +-3.4028235e38; a "
            f"missing value is nan)"
        )
    return f"no {what}"


def _feature_names(schema: FeatureSchema) -> list[str]:
    """The label's name, the dense features', then the sparse features' (feature ids 0..)."""
    return [schema.label, *(d.name for d in schema.dense), *(s.name for s in schema.sparse)]


def parse_slot_chunk(
    data: bytes | bytearray | memoryview,
    schema: FeatureSchema,
    source: str = "<bytes>",
    first_line: int = 1,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> tuple[Batch, ParseStats]:
    """Parses whole lines of slot text into a ragged Batch; malformed lines counted, skipped.

    Args:
        data: whole lines (a missing final newline is tolerated); any contiguous buffer,
            read in place.
        schema: the job's features.
        source, first_line: file name and line number of ``data``'s first line, for errors.
        max_line_bytes: the longest line taken (its bytes before the newline).
    """
    labels, dense, keys, offsets, lines, malformed, first_bad, why = _C.parse_slot(
        data, _feature_names(schema), len(schema.dense), max_line_bytes
    )
    bags = [RaggedTensor(k, o) for k, o in zip(keys, offsets, strict=True)]
    stats = ParseStats(lines=lines, malformed=malformed)
    if malformed:
        code, fid, begin, end = why
        reason = _slot_reason(data, schema, code, fid, begin, end, max_line_bytes)
        stats.first_bad = (source, first_line + first_bad, reason)
    return make_batch(schema, labels.numpy(), dense.numpy(), bags), stats


def _occurrence(keys: np.ndarray) -> np.ndarray:
    """(n,) int64: 0 for the first of each equal key in ``keys``' order, 1 the next, ..."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    new = np.concatenate([[True], k[1:] != k[:-1]]) if k.size else np.zeros(0, dtype=bool)
    at = np.arange(k.size)
    rank = np.empty(k.size, dtype=np.int64)
    rank[order] = at - np.maximum.accumulate(np.where(new, at, 0))
    return rank


def _parse_slot_chunk_numpy(
    data: bytes,
    schema: FeatureSchema,
    source: str = "<bytes>",
    first_line: int = 1,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> tuple[Batch, ParseStats]:
    """The reference parser, in numpy: what :func:`parse_slot_chunk` (compiled) must give,
    field for field and count for count. Only the tests and tests/fuzz/fuzz_slot.py call it.

    Args:
        data: whole lines (a missing final newline is tolerated).
        schema: the job's features.
        source, first_line: file name and line number of ``data``'s first line, for errors.
        max_line_bytes: the longest line taken (its bytes before the newline).
    """
    if data and not data.endswith(b"\n"):
        data = bytes(data) + b"\n"
    buf = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(buf == _NL)
    sep = (buf == _SPACE) | (buf == _NL) | (buf == _CR) | (buf == _TAB)
    word = ~sep
    starts = np.flatnonzero(word & np.concatenate([[True], sep[:-1]]))
    ends = np.flatnonzero(word & np.concatenate([sep[1:], [True]])) + 1
    line = np.searchsorted(nl, starts)  # the line of each token
    colons = np.flatnonzero(buf == _COLON)
    ci = np.minimum(np.searchsorted(colons, starts), max(colons.size - 1, 0))
    colon = colons[ci] if colons.size else np.full(starts.shape, -1)
    well = (colon > starts) & (
        colon < ends - 1
    )  # the token's first ':' after a name, before a value
    # feature ids: 0 label, 1..D dense, D+1..D+S sparse, -1 a name the schema lacks
    names = _feature_names(schema)
    name_keys = np.array([string_key(n) for n in names], dtype=np.int64)
    order = np.argsort(name_keys)
    tok_keys = hash_ranges(buf, starts, np.where(well, colon - starts, 0))
    pos = np.minimum(np.searchsorted(name_keys[order], tok_keys), len(names) - 1)
    # a 64-bit hash and the length both equal: the name (a collision is ~n^2 / 2^64)
    name_lens = np.array([len(n.encode()) for n in names], dtype=np.int64)
    same = (name_keys[order][pos] == tok_keys) & (name_lens[order][pos] == colon - starts)
    fid = np.where(well & same, order[pos], -1)
    nd, ns = len(schema.dense), len(schema.sparse)
    n = nl.size
    # why each token is bad (a SlotBad; 0: it is not)
    tok_bad = np.where(well, 0, int(SlotBad.TOKEN))
    vstart = colon + 1
    num = (fid >= 0) & (fid <= nd)  # the label and the dense features
    values, kinds = _floats(buf, vstart[num], ends[num])
    with np.errstate(over="ignore"):
        single = values.astype(np.float32)  # what a dense value keeps
    dense_tok = fid[num] > 0
    # a dense value: nan (missing) or finite in float32; the label: a finite number
    ok = (kinds == _FINITE) & np.where(dense_tok, np.isfinite(single), True)
    ok |= dense_tok & (kinds == _NAN)
    why = np.where(kinds == _NOT_NUMBER, SlotBad.NOT_NUMBER, SlotBad.NOT_FINITE)
    why = np.where(ok, 0, why)
    # the label and each dense feature once a line: a second one is bad whatever its value
    again = _occurrence(line[num] * (nd + 1) + fid[num]) > 0
    tok_bad[num] = np.where(again, int(SlotBad.REPEATED), why)
    bad = np.zeros(n, dtype=bool)
    bad[line[tok_bad > 0]] = True
    counts = np.bincount(line[num] * (nd + 1) + fid[num], minlength=n * (nd + 1))
    missing = counts.reshape(n, nd + 1) == 0
    bad |= missing.any(axis=1)
    line_starts = np.concatenate([[0], nl[:-1] + 1]).astype(np.int64)
    overlong = nl - line_starts > max_line_bytes
    bad |= overlong
    sp = fid > nd
    keys, kok = _ints(buf, vstart[sp], ends[sp])
    if not kok.all():  # not a decimal int64: a string id, hashed as Parquet's strings are
        keys[~kok] = hash_ranges(buf, vstart[sp][~kok], (ends[sp] - vstart[sp])[~kok])
    nonblank = np.bincount(line, minlength=n)[:n] > 0
    bad &= nonblank
    good = nonblank & ~bad
    row = np.cumsum(good) - 1  # the batch row of each good line
    m = int(good.sum())
    labels = np.zeros(m)
    dense = np.zeros((m, nd))
    keep = good[line[num]]
    rows, f = row[line[num]][keep], fid[num][keep]
    labels[rows[f == 0]] = values[keep][f == 0]
    dense[rows[f > 0], f[f > 0] - 1] = values[keep][f > 0]
    keep = good[line[sp]]
    srows, sfid, skeys = row[line[sp]][keep], fid[sp][keep] - nd - 1, keys[keep]
    by = np.argsort(sfid, kind="stable")  # feature-major, rows in order within a feature
    bounds = np.concatenate([[0], np.cumsum(np.bincount(sfid, minlength=ns))])
    bags = []
    for k in range(ns):
        sel = by[bounds[k] : bounds[k + 1]]
        lengths = np.bincount(srows[sel], minlength=m)[:m]
        bags.append(RaggedTensor.from_lengths(torch.from_numpy(skeys[sel]), lengths))
    stats = ParseStats(lines=int(nonblank.sum()), malformed=int(bad.sum()))
    if stats.malformed:
        at = int(np.flatnonzero(bad)[0])
        first = np.flatnonzero((line == at) & (tok_bad > 0))[:1]  # its first bad token
        if overlong[at]:
            reason: tuple[int, int, int, int] = (
                SlotBad.OVERLONG,
                -1,
                int(line_starts[at]),
                int(nl[at]),
            )
        elif first.size:
            t = int(first[0])
            code = int(tok_bad[t])
            begin = int(starts[t] if code == SlotBad.TOKEN else vstart[t])
            reason = (code, int(fid[t]) if code != SlotBad.TOKEN else -1, begin, int(ends[t]))
        else:
            reason = (SlotBad.MISSING, int(np.flatnonzero(missing[at])[0]), -1, -1)
        text = _slot_reason(data, schema, *reason, max_line_bytes)
        stats.first_bad = (source, first_line + at, text)
    return make_batch(schema, labels, dense, bags), stats


# ---- Parquet --------------------------------------------------------------------------


def _ids(col: pa.Array, path: Path, name: str) -> RaggedTensor:
    """A sparse column -> a bag a row: ints, strings (hashed) or lists of either."""
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
        values = col.flatten()
    else:
        lengths = col.is_valid().to_numpy(zero_copy_only=False).astype(np.int64)
        values = col.drop_null()
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    if not valid.all():  # a null item of a list: no key
        rows = np.repeat(np.arange(len(col)), lengths)
        lengths = np.bincount(rows[valid], minlength=len(col))
        values = values.drop_null()
    vt = values.type
    if pa.types.is_integer(vt):
        keys = values.cast(pa.int64()).to_numpy(zero_copy_only=False)
    elif pa.types.is_string(vt) or pa.types.is_large_string(vt) or pa.types.is_binary(vt):
        s = values.cast(pa.large_binary())
        offs = np.frombuffer(s.buffers()[1], dtype=np.int64)[s.offset : s.offset + len(s) + 1]
        data = s.buffers()[2]
        keys = string_keys(np.frombuffer(data, np.uint8) if data else np.zeros(0, np.uint8), offs)
    else:
        raise DataError(
            f"{path}: column {name!r} is {t}: a sparse feature is int64 or string ids, or a "
            f"list of them"
        )
    keys = np.require(keys, np.int64, ["C", "W"])  # torch wants a writable array
    return RaggedTensor.from_lengths(torch.from_numpy(keys), np.array(lengths, dtype=np.int64))


def _column_values(col: pa.Array, path: Path, name: str) -> np.ndarray:
    """(n,) float64 of a label or dense column, NaN where null."""
    if not (
        pa.types.is_integer(col.type)
        or pa.types.is_floating(col.type)
        or pa.types.is_boolean(col.type)
    ):
        raise DataError(f"{path}: column {name!r} is {col.type}, not a number")
    return pc.fill_null(col.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)


def read_parquet(
    path: str | Path, schema: FeatureSchema, batch_rows: int = 65536
) -> Iterator[tuple[Batch, ParseStats]]:
    """Reads a Parquet file ``batch_rows`` rows at a time (only the schema's columns).

    Raises:
        DataError: the file is unreadable, or lacks a schema column (named), or a column
            has a type no feature can take.
    """
    path = Path(path)
    names = [schema.label, *(d.name for d in schema.dense), *(s.name for s in schema.sparse)]
    try:
        f = pq.ParquetFile(path)
        have = set(f.schema_arrow.names)
        for i, name in enumerate(names):
            if name not in have:
                what = "label" if i == 0 else "feature"
                raise DataError(
                    f"{path}: no column {name!r} (the {what} {name!r} of data.schema); the "
                    f"file has {sorted(have)[:20]}"
                )
        row = 0  # the file's row of the record batch's first
        for rb in f.iter_batches(batch_size=batch_rows, columns=names):
            yield _record_batch(rb, schema, path, row)
            row += rb.num_rows
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot read data file {path}: {type(exc).__name__}: {exc}") from exc


def _record_batch(
    rb: pa.RecordBatch, schema: FeatureSchema, path: Path, row0: int = 0
) -> tuple[Batch, ParseStats]:
    """A record batch (the file's rows from ``row0``, 0-based) -> its Batch and counts.

    A null or NaN dense value is missing (NaN); a row is malformed when its label is null,
    NaN or infinite, or a dense value is infinite in float32 (inf, or beyond its range)."""
    label = _column_values(rb.column(schema.label), path, schema.label)
    dense = np.zeros((rb.num_rows, len(schema.dense)))
    for j, d in enumerate(schema.dense):
        dense[:, j] = _column_values(rb.column(d.name), path, d.name)
    with np.errstate(over="ignore"):
        infinite = np.isinf(dense.astype(np.float32))  # (B, D): what the model would get
    bad = ~np.isfinite(label) | infinite.any(axis=1)
    bags = [_ids(rb.column(s.name), path, s.name) for s in schema.sparse]
    stats = ParseStats(lines=rb.num_rows, malformed=int(bad.sum()), first_bad_unit="row")
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        if not np.isfinite(label[at]):
            value = "null" if rb.column(schema.label)[at].as_py() is None else label[at]
            reason = f"label {schema.label!r} is {value}, not a finite number"
        else:
            d = schema.dense[int(np.flatnonzero(infinite[at])[0])]
            reason = (
                f"dense feature {d.name!r} is {rb.column(d.name)[at].as_py()!r}: infinite in "
                f"float32 (inf, or beyond +-3.4028235e38; a missing value is null or NaN)"
            )
        stats.first_bad = (str(path), row0 + at + 1, reason)
        rows = torch.from_numpy(np.flatnonzero(~bad))
        bags = [b.take_rows(rows) for b in bags]
        label, dense = label[~bad], dense[~bad]
    return make_batch(schema, label, dense, bags), stats


#: The formats read by a schema (``criteo``/``generated`` are positional, reader.py).
SCHEMA_FORMATS = ("parquet", "slot")
