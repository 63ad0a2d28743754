"""Reading a schema job's data: PaddleRec slot text and Parquet, into ragged batches.

Both give a :class:`~streamrec.trainer.batches.Batch` with ``bags`` (one RaggedTensor of int64
keys per sparse feature of ``data.schema``, any number a row) and ``dense`` (B, D) float32
in the schema's order (``log1p`` where the schema asks it).

``slot``: one sample a line, space-separated ``name:value`` tokens, a list feature repeating
its name, in any order::

    click:1 age:0.31 price:12.5 user_id:17 genres:5 genres:9

The label's value is a number (> 0: a click); a dense value a decimal (``-``, digits, one
optional ``.``: no exponent); a sparse value a decimal int64 key, or else a string id
(``item_id:sku-53``, what ``streamrec-datagen --from-events --format slot`` writes of a
string column) hashed by :func:`streamrec.keyhash.hash_ranges` as Parquet's strings are. A
sparse feature absent from a line is an empty bag; a name the schema does not hold is
skipped (a file may carry more slots than a job reads). A line is malformed, counted as the
TSV parsers count theirs (``max_malformed_ratio``), when it lacks the label or a dense
feature, names one twice, has a token that is not ``name:value``, or a label or dense value
that is not a number. :func:`parse_slot_chunk` hands a whole chunk to the compiled parser
(``streamrec.trainer._C.parse_slot``: one pass, one thread, without the GIL), which writes
the labels, the dense columns and each feature's keys and offsets. :func:`_parse_slot_chunk_numpy`
states the same rules in numpy (token bounds, names hashed by
:func:`streamrec.keyhash.hash_ranges` and matched to the schema's, values parsed column by
column); it is the reference the tests hold the compiled parser to.

``parquet``: columns named by the schema, read with pyarrow a record batch at a time (memory
bounded by ``batch_rows``); ids int (one key a row, null: an empty bag), string (hashed to
int64 by :func:`streamrec.keyhash.string_keys`), or a list of either (a bag; a null list or
item: none); the label and dense columns numbers, a null one makes its row malformed. A file
whose columns lack a schema feature fails the split (DataError naming the column).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from streamrec.control.feature_schema import FeatureSchema
from streamrec.keyhash import hash_ranges, string_key, string_keys
from streamrec.ragged import RaggedTensor
from streamrec.trainer import _C
from streamrec.trainer.batches import Batch, ParseStats, parse_columns
from streamrec.trainer.errors import DataError

_NL, _CR, _TAB, _SPACE, _COLON, _MINUS = 10, 13, 9, 32, 58, 45
#: Why a slot-text line is malformed (the first one of a chunk is named in ParseStats).
BAD_SLOT_LINE = (
    "does not match the schema: a missing or repeated label or dense feature, a token that "
    "is not name:value, or a label or dense value that is not a number"
)


def make_batch(
    schema: FeatureSchema, labels: np.ndarray, dense: np.ndarray, bags: list[RaggedTensor]
) -> Batch:
    """A ragged Batch; each dense column transformed as the schema says (``log1p``: the
    log of the value's positive part; the default: the signed log, ``DenseFeature``). A
    missing value (NaN) stays NaN for the model's normalizer.

    Args:
        labels: (B,) float, > 0 a click; dense: (B, D) float; bags: S RaggedTensors of B rows.
    """
    dense = dense.astype(np.float32)
    logs = [i for i, d in enumerate(schema.dense) if d.log1p]
    if logs:
        dense[:, logs] = np.log1p(np.maximum(dense[:, logs], 0))
    signed = [i for i, d in enumerate(schema.dense) if d.signed_log]
    if signed:
        cols = dense[:, signed]
        dense[:, signed] = np.copysign(np.log1p(np.abs(cols)), cols)
    return Batch(
        dense=torch.from_numpy(np.ascontiguousarray(dense)),
        labels=torch.from_numpy((labels > 0).astype(np.float32)),
        keys=torch.zeros((labels.shape[0], 0), dtype=torch.int64),
        bags=bags,
    )


def _numbers(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """(values, ok) of n tokens' values: kind 'float' (``-`` and a decimal) or 'int'."""
    if kind == "int":
        v, ok, empty = parse_columns(buf, starts[:, None], ends[:, None], "int")
        return v[:, 0], (ok & ~empty)[:, 0]
    neg = (ends > starts) & (buf[np.minimum(starts, buf.size - 1)] == _MINUS)
    v, ok, empty = parse_columns(buf, (starts + neg)[:, None], ends[:, None], "fixed")
    return np.where(neg, -v[:, 0], v[:, 0]), (ok & ~empty)[:, 0]


def _feature_names(schema: FeatureSchema) -> list[str]:
    """The label's name, the dense features', then the sparse features' (feature ids 0..)."""
    return [schema.label, *(d.name for d in schema.dense), *(s.name for s in schema.sparse)]


def parse_slot_chunk(
    data: bytes | bytearray | memoryview,
    schema: FeatureSchema,
    source: str = "<bytes>",
    first_line: int = 1,
) -> tuple[Batch, ParseStats]:
    """Parses whole lines of slot text into a ragged Batch; malformed lines counted, skipped.

    Args:
        data: whole lines (a missing final newline is tolerated); any contiguous buffer,
            read in place.
        schema: the job's features.
        source, first_line: file name and line number of ``data``'s first line, for errors.
    """
    labels, dense, keys, offsets, lines, malformed, first_bad = _C.parse_slot(
        data, _feature_names(schema), len(schema.dense)
    )
    bags = [RaggedTensor(k, o) for k, o in zip(keys, offsets, strict=True)]
    stats = ParseStats(lines=lines, malformed=malformed)
    if malformed:
        stats.first_bad = (source, first_line + first_bad, BAD_SLOT_LINE)
    return make_batch(schema, labels.numpy(), dense.numpy(), bags), stats


def _parse_slot_chunk_numpy(
    data: bytes, schema: FeatureSchema, source: str = "<bytes>", first_line: int = 1
) -> tuple[Batch, ParseStats]:
    """The reference parser, in numpy: what :func:`parse_slot_chunk` (compiled) must give,
    field for field and count for count. Only the tests and tests/fuzz/fuzz_slot.py call it.

    Args:
        data: whole lines (a missing final newline is tolerated).
        schema: the job's features.
        source, first_line: file name and line number of ``data``'s first line, for errors.
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
    bad = np.zeros(n, dtype=bool)
    bad[line[~well]] = True
    # the label and each dense feature exactly once a line
    once = fid <= nd
    counts = np.bincount(
        line[once & (fid >= 0)] * (nd + 1) + fid[once & (fid >= 0)], minlength=n * (nd + 1)
    ).reshape(n, nd + 1)
    bad |= (counts != 1).any(axis=1)
    vstart = colon + 1
    num = (fid >= 0) & (fid <= nd)
    values, ok = _numbers(buf, vstart[num], ends[num], "float")
    bad[line[num][~ok]] = True
    sp = fid > nd
    keys, kok = _numbers(buf, vstart[sp], ends[sp], "int")
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
        stats.first_bad = (source, first_line + int(np.flatnonzero(bad)[0]), BAD_SLOT_LINE)
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


def _floats(col: pa.Array, path: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, present) of a label or dense column."""
    if not (
        pa.types.is_integer(col.type)
        or pa.types.is_floating(col.type)
        or pa.types.is_boolean(col.type)
    ):
        raise DataError(f"{path}: column {name!r} is {col.type}, not a number")
    present = col.is_valid().to_numpy(zero_copy_only=False)
    values = pc.fill_null(col.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
    return values, present


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
        for rb in f.iter_batches(batch_size=batch_rows, columns=names):
            yield _record_batch(rb, schema, path)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot read data file {path}: {type(exc).__name__}: {exc}") from exc


def _record_batch(
    rb: pa.RecordBatch, schema: FeatureSchema, path: Path
) -> tuple[Batch, ParseStats]:
    label, ok = _floats(rb.column(schema.label), path, schema.label)
    dense = np.zeros((rb.num_rows, len(schema.dense)))
    for j, d in enumerate(schema.dense):
        dense[:, j], present = _floats(rb.column(d.name), path, d.name)
        ok &= present
    bags = [_ids(rb.column(s.name), path, s.name) for s in schema.sparse]
    stats = ParseStats(lines=rb.num_rows, malformed=int((~ok).sum()))
    if not ok.all():
        stats.first_bad = (str(path), int(np.flatnonzero(~ok)[0]) + 1, "a null label or dense")
        rows = torch.from_numpy(np.flatnonzero(ok))
        bags = [b.take_rows(rows) for b in bags]
        label, dense = label[ok], dense[ok]
    return make_batch(schema, label, dense, bags), stats


#: The formats read by a schema (``criteo``/``generated`` are positional, data.py).
SCHEMA_FORMATS = ("parquet", "slot")
