"""Reading event logs (Parquet, CSV, JSON lines) a bounded piece at a time, for
:mod:`.event_layout`.

A log is checked before it is read: an empty file, a ``.parquet`` that is not one, binary
data given as CSV or JSON lines are refused naming it; a reader's error quoting the log's
bytes is escaped and cut (:func:`printable`). CSV has no lists: ``list_columns`` names the
columns whose cells are lists, values separated by ``list_sep`` (``5|9``; an empty cell an
empty list), read as ``list<int64>`` when every value is an integer, else ``list<string>``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from streamrec.trainer.errors import DataError

#: pyarrow's CSV reader holds about 36 blocks (measured): 256 KiB keeps it near 9 MiB.
DEFAULT_BLOCK_BYTES = 256 << 10
#: Rows per batch read from a Parquet file.
PARQUET_BATCH_ROWS = 65536
#: Bytes of a log read to tell its kind (and a text log from binary data).
SNIFF_BYTES = 64 << 10
#: An error quoting a log (pyarrow's, with the row it failed on) is cut after this many
#: characters.
MESSAGE_CHARS = 300
#: A text log's kind as an error names it.
TEXT_NAMES = {"csv": "CSV", "json": "JSON lines"}


def log_kind(path: Path) -> str:
    """``parquet`` (its magic bytes ``PAR1``, whatever the name), ``csv`` (``.csv``) or
    ``json`` (``.json``, ``.jsonl``, ``.ndjson``: JSON lines).

    Raises:
        ValueError: an empty file, a ``.parquet`` without Parquet's magic bytes, an unknown
            suffix, or a CSV or JSON lines log holding binary data (a NUL byte), naming the
            file.
    """
    with path.open("rb") as f:
        head = f.read(SNIFF_BYTES)
    if not head:
        raise ValueError(f"event log {path}: the file is empty (0 bytes): no events, no header")
    if head[:4] == b"PAR1":
        return "parquet"
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        raise ValueError(
            f"event log {path}: not a Parquet file (it does not start with Parquet's magic "
            f"bytes PAR1 but with {head[:16]!r})"
        )
    kinds = {".csv": "csv", ".json": "json", ".jsonl": "json", ".ndjson": "json"}
    if suffix not in kinds:
        raise ValueError(
            f"event log {path}: unknown format (suffix {suffix!r}); a log is Parquet, "
            ".csv or JSON lines (.json, .jsonl, .ndjson)"
        )
    nul = head.find(b"\0")
    if nul >= 0:
        raise ValueError(
            f"event log {path}: binary data, not {TEXT_NAMES[kinds[suffix]]} text (byte "
            f"{nul} is NUL; it starts with {head[:16]!r}): a compressed or "
            "other file? A Parquet log is found by its magic bytes whatever its name"
        )
    return kinds[suffix]


def printable(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` fit for one error line: characters that are not printable (control bytes,
    the replacement character of undecodable bytes) escaped, cut after ``limit`` shown."""
    shown: list[str] = []
    size = escaped = 0
    for c in text:
        if size >= limit:
            shown.append(" ... (cut)")
            break
        if not c.isprintable() or c == "\ufffd":
            c = ascii(c)[1:-1]
            escaped += 1
        shown.append(c)
        size += len(c)
    if escaped:
        shown.append(" [bytes that are not text shown escaped: binary data?]")
    return "".join(shown)


def _csv_lists(batch: pa.RecordBatch, list_columns: Sequence[str], sep: str) -> pa.RecordBatch:
    """A CSV batch with its ``list_columns`` (strings ``5|9``) turned into list arrays."""
    cols = []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        if name in list_columns:
            text = pc.if_else(pc.equal(col, ""), None, col)
            parts = pc.split_pattern(text, pattern=sep)
            parts = pc.if_else(pc.is_null(col), pa.scalar(None, parts.type), parts)
            parts = pc.if_else(pc.equal(col, ""), pa.scalar([], parts.type), parts)
            try:
                col = pc.cast(parts, pa.list_(pa.int64()))
            except pa.ArrowInvalid:
                col = parts
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, names=batch.schema.names)


def _text_times(t: pa.DataType) -> bool:
    """A column type the CSV or JSON reader infers from text that looks like a time."""
    return pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t)


def read_log(
    path: Path,
    time_column: str,
    list_columns: Sequence[str] = (),
    list_sep: str = "|",
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Iterator[pa.RecordBatch]:
    """The record batches of one event log, read a bounded piece at a time.

    A CSV or JSON time column of ISO strings stays strings (pyarrow's readers would turn a
    time with an offset into UTC and one without into the clock's, losing which was which):
    :func:`.event_times.wall_seconds` reads them.

    Raises:
        DataError: the file cannot be read as its kind (the file and pyarrow's reason).
    """
    kind = log_kind(path)
    try:
        if kind == "parquet":
            yield from pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH_ROWS)
            return
        if kind == "json":
            options = pa_json.ReadOptions(block_size=block_bytes)
            reader = pa_json.open_json(path, read_options=options)
            field = reader.schema.field(time_column) if time_column in reader.schema.names else None
            if field is not None and _text_times(field.type):
                reader = pa_json.open_json(
                    path,
                    read_options=options,
                    parse_options=pa_json.ParseOptions(
                        explicit_schema=pa.schema([(time_column, pa.string())]),
                        unexpected_field_behavior="infer",
                    ),
                )
            yield from reader
            return
        types = {name: pa.string() for name in list_columns}
        convert = pa_csv.ConvertOptions(column_types=types, strings_can_be_null=False)
        read = pa_csv.ReadOptions(block_size=block_bytes)
        reader = pa_csv.open_csv(path, read_options=read, convert_options=convert)
        names = reader.schema.names
        if time_column in names and _text_times(reader.schema.field(time_column).type):
            convert.column_types = {**types, time_column: pa.string()}
            reader = pa_csv.open_csv(path, read_options=read, convert_options=convert)
        missing = [c for c in list_columns if c not in names]
        if missing:
            raise ValueError(
                f"--list-columns: {', '.join(missing)} not a column of {path} "
                f"(columns: {', '.join(names)})"
            )
        for batch in reader:
            yield _csv_lists(batch, list_columns, list_sep)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read event log {path} as {kind}: {printable(str(exc))}") from exc
