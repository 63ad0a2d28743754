"""Lays timestamped event logs into the streaming layout (``streamrec-datagen --from-events``).

Each event goes to the split of its timestamp, the split boundaries computed on the wall
clock of ``--timezone`` (default UTC)::

    ts = 2024-03-05T10:47:12Z, split_interval 60  ->  out/20240305/1000/part-*
    ts = 2024-03-05T11:02:00Z                     ->  out/20240305/1100/part-*

Logs (Parquet, CSV or JSON lines, found by Parquet's magic bytes or the name's suffix) are
read in any order and in bounded memory: a Parquet file row group by row group, CSV and JSON
lines a block of ``block_bytes`` at a time. A batch's rows are sorted by split (one numpy
argsort, one take) and its per-split slices buffered; when the buffers exceed
``buffer_bytes``, the largest splits are written out as new part files (``part-00000``,
``part-00001``, ... : a split whose events come from several logs or out of order gets
several) and the small rest is copied out of the batches it came from, so memory stays
within about ``buffer_bytes`` plus one batch whatever the logs' size.

Once every log is read, every split from the first event's day at 0000 to the last event's
split gets its directory and its donefile, in time order, empty ones included (a job waits
for each split's donefile, so a hole would stall it for ever).

Appending: a later run into the same ``out`` extends the stream. A split that has its
donefile is never touched; an event whose split is at or before the last landed split is
*late*: dropped, counted, and reported (which splits it would have gone to), never written
to another split, which would train it at a time it did not happen. The splits between the
last landed one and the new events are laid out empty. ``out/event_layout.json`` keeps the
time column, interval, zone and format; a run with another interval, zone or format is
refused by name.

Times and the zone's clock: :mod:`.event_times` (integer seconds since the
epoch, milliseconds from 1e11 up under ``time_unit="auto"``, ISO 8601 strings, Parquet
timestamps and dates, fractions of a second floored, 1970 to 9999). Outlying times are
refused before a split lands: a batch's times are checked before any of it is laid out, and
a run whose events span more than ``max_span_days`` (or, appending, reach that far past the
last landed split) stops naming its earliest and latest event; the parts it had written are
removed. A log is checked before it is read: an empty file, a ``.parquet`` that is not one,
binary data given as CSV or JSON lines are refused naming it; a reader's error quoting the
log's bytes is escaped and cut (:mod:`.event_logs`).

Output (``fmt``): ``parquet`` keeps every column as it is (list columns stay lists, the time
column too), one file per part; ``slot`` writes PaddleRec slot text
(:mod:`.slot_text`: ``click:1 age:0.31 user_id:17 genres:5 genres:9``).

CSV has no lists: ``list_columns`` names the columns whose cells are lists, values separated
by ``list_sep`` (``5|9``; an empty cell an empty list), read as ``list<int64>`` when every
value is an integer, else ``list<string>``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from streamrec.datagen.event_logs import DEFAULT_BLOCK_BYTES, log_kind, read_log
from streamrec.datagen.event_times import (
    DAY_SECONDS,
    TIME_UNITS,
    check_timezone,
    split_index,
    split_label,
    value_at,
    wall_seconds,
    wall_text,
)
from streamrec.datagen.slot_text import slot_text
from streamrec.datagen.split_files import mark_split_done, open_part, part_name
from streamrec.layout import split_names, split_ready
from streamrec.trainer.errors import DataError

FORMATS = ("parquet", "slot")
#: The state file a run writes at the root of ``out`` (what an appending run must match).
STATE_NAME = "event_layout.json"
DEFAULT_BUFFER_BYTES = 64 << 20
#: A run whose events (and, appending, the splits since the last landed one) span more days
#: is refused unless ``--max-span-days`` says more: one outlying time would otherwise lay
#: out every split between it and the others.
DEFAULT_MAX_SPAN_DAYS = 366


def landed_range(out: Path, split_interval: int, donefile: str | None) -> tuple[int, int] | None:
    """(first, last) split index of the splits under ``out`` that are ready; None if none.

    Raises:
        ValueError: a split that is not ready holds part files (left by a run that was
            killed before its donefiles): laying out again would count its events twice.
    """
    found: list[int] = []
    if not out.is_dir():
        return None
    for day in out.iterdir():
        if not (day.is_dir() and len(day.name) == 8 and day.name.isdigit()):
            continue
        for split in day.iterdir():
            if not (len(split.name) == 4 and split.name.isdigit()):
                continue
            if split_ready(split, donefile):
                found.append(split_index(day.name, split.name, split_interval))
            elif any(split.glob("part-*")):
                raise ValueError(
                    f"--out: {split} holds part files but no donefile (a run stopped before "
                    "its donefiles): remove that run's open splits or lay out into a fresh "
                    "--out, so that no event is laid out twice"
                )
    return (min(found), max(found)) if found else None


@dataclass
class SplitBuffers:
    """Rows buffered per split until ``budget`` bytes, then written as new part files."""

    out: Path
    split_interval: int
    fmt: str
    budget: int
    schema: pa.Schema | None = None
    pending: dict[int, list[pa.RecordBatch]] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    next_part: dict[int, int] = field(default_factory=dict)
    total: int = 0
    written: list[Path] = field(default_factory=list)  # part files, in writing order
    created: list[Path] = field(default_factory=list)  # directories made, parents first

    @property
    def parts_written(self) -> int:
        return len(self.written)

    def remove_written(self) -> None:
        """Deletes the part files written so far and the directories made for them (a run
        that fails leaves nothing behind: run again once the log is fixed)."""
        for path in self.written:
            path.unlink(missing_ok=True)
        self.written.clear()
        for d in reversed(self.created):
            with contextlib.suppress(OSError):  # not empty: something else put a file there
                d.rmdir()
        self.created.clear()

    def _make_dir(self, split_dir: Path) -> None:
        missing = []
        for d in (split_dir, *split_dir.parents):
            if d.is_dir():
                break
            missing.append(d)
        split_dir.mkdir(parents=True, exist_ok=True)
        self.created += reversed(missing)

    def add(self, index: int, rows: pa.RecordBatch) -> None:
        self.pending.setdefault(index, []).append(rows)
        self.sizes[index] = self.sizes.get(index, 0) + rows.nbytes
        self.total += rows.nbytes

    def over(self) -> bool:
        return self.total > self.budget

    def spill(self) -> None:
        """Writes the largest splits until at most half the budget is left, and copies the
        rest, so that no batch read so far stays referenced."""
        for index in sorted(self.sizes, key=self.sizes.__getitem__, reverse=True):
            if self.total <= self.budget // 2:
                table = self._table(index).take(np.arange(self._rows(index)))  # a copy
                self.pending[index] = table.to_batches()
            else:
                self.write(index)

    def _rows(self, index: int) -> int:
        return sum(b.num_rows for b in self.pending[index])

    def _table(self, index: int) -> pa.Table:
        assert self.schema is not None
        rows = [b if b.schema == self.schema else b.cast(self.schema) for b in self.pending[index]]
        return pa.Table.from_batches(rows, schema=self.schema)

    def write(self, index: int) -> None:
        table = self._table(index)
        day, split = split_label(index, self.split_interval)
        split_dir = self.out / day / split
        self._make_dir(split_dir)
        number = self.next_part.get(index, 0)  # an open split holds no part: checked
        with open_part(split_dir, number) as f:
            if self.fmt == "parquet":
                pq.write_table(table, f)
            else:
                f.write(slot_text(table))
        self.written.append(split_dir / part_name(number))
        self.next_part[index] = number + 1
        self.total -= self.sizes.pop(index)
        del self.pending[index]

    def write_all(self) -> None:
        for index in sorted(self.pending):
            self.write(index)


def _check_state(out: Path, state: dict[str, object]) -> None:
    path = out / STATE_NAME
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    for key in ("split_interval", "timezone", "format"):
        if old.get(key) != state[key]:
            flag = "--" + key.replace("_", "-")
            raise ValueError(
                f"{flag} {state[key]!r}: {out} was laid out with {old.get(key)!r} "
                f"({path}); an appended log must use the same"
            )


def _check_columns(batch: pa.RecordBatch, buffers: SplitBuffers, where: str) -> pa.RecordBatch:
    """The batch with the run's columns in the run's order; the schema widened if needed."""
    if buffers.schema is None:
        buffers.schema = batch.schema
        return batch
    names = buffers.schema.names
    if sorted(batch.schema.names) != sorted(names):
        raise ValueError(
            f"{where}: columns {', '.join(batch.schema.names)} differ from the first log's "
            f"{', '.join(names)}"
        )
    batch = batch.select(names)
    if batch.schema != buffers.schema:
        try:
            buffers.schema = pa.unify_schemas(
                [buffers.schema, batch.schema], promote_options="permissive"
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(
                f"{where}: a column's type differs from the first log's: {exc}"
            ) from None
    return batch


@dataclass
class SplitRange:
    """How many events were seen, and the first and last split index they fell in."""

    count: int = 0
    first: int | None = None
    last: int | None = None

    def see(self, index: np.ndarray) -> None:
        """index: (n,) int64 split indices of n events."""
        if len(index) == 0:
            return
        lo, hi = int(index.min()), int(index.max())
        self.count += len(index)
        self.first = lo if self.first is None else min(self.first, lo)
        self.last = hi if self.last is None else max(self.last, hi)

    def first_day_start(self, per_day: int) -> int:
        """The index of split 0000 of the first split's day (where a job starts)."""
        if self.first is None:
            raise ValueError("no split seen")
        return self.first // per_day * per_day

    @staticmethod
    def label(index: int | None, split_interval: int) -> str | None:
        return None if index is None else "/".join(split_label(index, split_interval))


@dataclass(frozen=True)
class EventAt:
    """One event's time: wall seconds, where it is (log, column, row) and its value."""

    secs: int
    where: str
    value: object

    def describe(self, zone: str) -> str:
        return f"{self.where}: {self.value!r}, {wall_text(self.secs)} on the {zone} clock"


@dataclass
class TimeSpan:
    """The earliest and latest event of a run, checked batch by batch against
    ``max_days`` before the batch is laid out: one outlying time (a ``0`` among 2024's
    events) would lay out every split between it and the others (half a million for 0)."""

    max_days: int
    zone: str
    earliest: EventAt | None = None
    latest: EventAt | None = None

    def see(self, secs: np.ndarray, values: pa.Array, where: str, first_row: int) -> None:
        """secs: (n,) int64 wall seconds of ``values``, whose first is row ``first_row``."""
        if len(secs) == 0:
            return
        lo, hi = int(np.argmin(secs)), int(np.argmax(secs))
        if self.earliest is None or secs[lo] < self.earliest.secs:
            self.earliest = EventAt(
                int(secs[lo]), f"{where}, row {first_row + lo}", value_at(values, lo)
            )
        if self.latest is None or secs[hi] > self.latest.secs:
            self.latest = EventAt(
                int(secs[hi]), f"{where}, row {first_row + hi}", value_at(values, hi)
            )

    def check(self, landed_end: int | None, landed_label: str | None) -> None:
        """ValueError when the events span more than ``max_days`` days, or (appending) the
        latest is more than ``max_days`` after ``landed_end`` (the wall seconds where the
        split after the last landed one, ``landed_label``, starts)."""
        if self.earliest is None or self.latest is None:
            return
        advice = (
            "an outlying time? Fix or drop its row, or pass --max-span-days {need} to lay "
            "out every split between them (nothing was laid out)"
        )
        span = self.latest.secs - self.earliest.secs
        if span > self.max_days * DAY_SECONDS:
            raise ValueError(
                f"the events span {span / DAY_SECONDS:.1f} days, more than --max-span-days "
                f"{self.max_days}: the earliest is {self.earliest.describe(self.zone)}; the "
                f"latest is {self.latest.describe(self.zone)}; "
                + advice.format(need=-(-span // DAY_SECONDS))
            )
        if landed_end is None:
            return
        gap = self.latest.secs - landed_end
        if gap > self.max_days * DAY_SECONDS:
            raise ValueError(
                f"--out has landed up to split {landed_label}, and the latest event is "
                f"{gap / DAY_SECONDS:.1f} days after it, more than --max-span-days "
                f"{self.max_days}: {self.latest.describe(self.zone)}; "
                + advice.format(need=-(-gap // DAY_SECONDS))
            )


def _route(batch: pa.RecordBatch, index: np.ndarray, buffers: SplitBuffers) -> None:
    """Buffers each split's rows of a batch (index: (n,) int64 split of each row): one sort,
    one take, then zero-copy slices; spills when the buffers are full."""
    if batch.num_rows == 0:
        return
    order = np.argsort(index, kind="stable")
    ordered = batch.take(order)
    index = index[order]
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
    ends = np.r_[starts[1:], len(index)]
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):  # per split, not per row
        buffers.add(int(index[a]), ordered.slice(a, b - a))
    if buffers.over():
        buffers.spill()


def lay_out_events(
    logs: Sequence[str | Path],
    out: str | Path,
    time_column: str,
    split_interval: int = 60,
    timezone: str = "UTC",
    fmt: str = "parquet",
    donefile: str | None = "to.hadoop.done",
    time_unit: str = "auto",
    list_columns: Sequence[str] = (),
    list_sep: str = "|",
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    max_span_days: int = DEFAULT_MAX_SPAN_DAYS,
) -> dict[str, int | str | None]:
    """Writes every event of ``logs`` into the split of its time under ``out``.

    ``max_span_days`` bounds the days from the earliest event to the latest (and,
    appending, from the last landed split to the latest event): a run spanning more is
    refused naming both ends, before a split lands.

    Returns:
        counts: events (written), late (dropped: their split had landed), late_first and
        late_last (the splits the late events fell in, or None), parts, splits (laid out by
        this run, empty ones included), start_day (the stream's first day under ``out``),
        end_day and last_split (its last split), split_interval.

    Raises:
        ValueError: a bad argument, a missing time column, a value that is not a time, a
            span of more than ``max_span_days``; nothing is laid out.
        DataError: a log that cannot be read, or no event at all.
    """
    paths = [Path(p) for p in logs]
    if not paths:
        raise ValueError("--from-events: no event log given")
    for p in paths:
        if not p.is_file():
            raise ValueError(f"--from-events: no such file: {p}")
        log_kind(p)
    split_names(split_interval)
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    if time_unit not in TIME_UNITS:
        raise ValueError(f"--time-unit {time_unit!r}: one of {', '.join(TIME_UNITS)}")
    check_timezone(timezone)
    if buffer_bytes < 1 or block_bytes < 1:
        raise ValueError(
            f"--buffer-bytes and --block-bytes must be >= 1, got {buffer_bytes}, {block_bytes}"
        )
    if max_span_days < 1:
        raise ValueError(f"--max-span-days must be >= 1, got {max_span_days}")
    root = Path(out)
    state = {
        "time_column": time_column,
        "split_interval": split_interval,
        "timezone": timezone,
        "format": fmt,
    }
    _check_state(root, state)
    landed = landed_range(root, split_interval, donefile)
    last_landed = None if landed is None else landed[1]
    buffers = SplitBuffers(root, split_interval, fmt, buffer_bytes)
    seen, late = SplitRange(), SplitRange()
    span = TimeSpan(max_span_days, timezone)
    # where the first split this run may lay out starts (appending), and the last landed one
    landed_end = None if last_landed is None else (last_landed + 1) * split_interval * 60
    landed_label = SplitRange.label(last_landed, split_interval)
    try:
        for path in paths:
            row = 1  # of the batch's first event in its log, counted from 1 (no CSV header)
            for batch in read_log(path, time_column, list_columns, list_sep, block_bytes):
                where = f"event log {path}"
                if time_column not in batch.schema.names:
                    raise ValueError(
                        f"{where}: no time column {time_column!r} (--time-column; columns: "
                        f"{', '.join(batch.schema.names)})"
                    )
                times = batch.column(time_column)
                column_where = f"{where}, column {time_column!r}"
                secs = wall_seconds(times, timezone, time_unit, column_where, row)
                span.see(secs, times, column_where, row)
                span.check(landed_end, landed_label)  # before any of the batch is laid out
                batch = _check_columns(batch, buffers, where)
                row += batch.num_rows
                index = (secs // 60) // split_interval
                if last_landed is not None:
                    is_late = index <= last_landed
                    late.see(index[is_late])
                    keep = np.flatnonzero(~is_late)
                    if len(keep) < len(index):
                        batch, index = batch.take(keep), index[keep]
                seen.see(index)
                _route(batch, index, buffers)
        if seen.count == 0 and late.count == 0:
            raise DataError(f"no events in {', '.join(map(str, paths))}")
        buffers.write_all()
    except BaseException:
        buffers.remove_written()
        raise
    per_day = 1440 // split_interval
    splits = 0
    if seen.last is not None:
        # every split from the first one to lay out to the last event's gets its donefile
        first = last_landed + 1 if last_landed is not None else seen.first_day_start(per_day)
        for i in range(first, seen.last + 1):  # time order: a job sees them land so
            day, split = split_label(i, split_interval)
            split_dir = root / day / split
            split_dir.mkdir(parents=True, exist_ok=True)
            mark_split_done(split_dir, donefile)
            splits += 1
    (root / STATE_NAME).write_text(json.dumps(state, indent=1) + "\n")
    stream_last: int | None
    if landed is not None:
        stream_first, stream_last = landed[0], max(landed[1], seen.last or landed[1])
    else:
        stream_first, stream_last = seen.first_day_start(per_day), seen.last
    assert stream_last is not None  # events or landed splits, checked above
    end_day, last_split = split_label(stream_last, split_interval)
    return {
        "events": seen.count,
        "late": late.count,
        "late_first": late.label(late.first, split_interval),
        "late_last": late.label(late.last, split_interval),
        "parts": buffers.parts_written,
        "splits": splits,
        "start_day": split_label(stream_first, split_interval)[0],
        "end_day": end_day,
        "last_split": last_split,
        "split_interval": split_interval,
    }
