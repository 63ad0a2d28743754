"""Event times -> splits of the streaming layout, on a time zone's wall clock.

A split is ``split_interval`` minutes of the zone's clock; split ``i`` starts ``i *
split_interval`` minutes after 1970-01-01 00:00 on that clock, so a day's splits are
``1440 / split_interval`` consecutive indices and ``split_label`` names one
``(YYYYMMDD, HHMM)`` as :mod:`streamrec.layout` lays it out.

What a time is (decided):
- integers: seconds since the epoch; with ``time_unit="auto"`` a value of at least 1e11 (after
  1973-03-03 in milliseconds, after the year 5138 in seconds) is read as milliseconds; ``"s"``
  or ``"ms"`` force one unit. Floats: seconds, the fraction dropped.
- ISO 8601 strings (``2024-03-05T10:47:12``, a space for the ``T``, fractions of a second
  as Python's ``isoformat()`` writes them): with an offset (``Z``, ``+01:00``) an instant,
  shown on the zone's clock; without one, already the zone's wall clock. Parquet timestamps
  the same (with a time zone: an instant; naive: the zone's clock; any unit, ``s`` to
  ``ns``), dates their midnight.
- A time is floored to its second (``10:59:59.999`` is in the split holding 10:59:59).
- A time's wall clock falls between 1970-01-01 and 9999-12-31 (:data:`FIRST_WALL`,
  :data:`END_WALL`): the layout names its days YYYYMMDD, and a time before the epoch is a
  placeholder (``-1``) more often than an event. Others are refused naming the row.
- On a daylight-saving change the splits follow the clock: the skipped hour's splits are
  empty, the repeated hour's events share its splits.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from streamrec.layout import format_day

TIME_UNITS = ("auto", "s", "ms")
#: Integers at least this large are milliseconds under ``time_unit="auto"``.
MS_THRESHOLD = 100_000_000_000
_EPOCH = dt.date(1970, 1, 1)
#: Seconds a day.
DAY_SECONDS = 86400
#: Wall seconds of 1970-01-01 00:00 and of 10000-01-01 00:00: a time is in [FIRST, END).
FIRST_WALL = 0
END_WALL = ((dt.date(9999, 12, 31) - _EPOCH).days + 1) * DAY_SECONDS
#: Ticks a second of each Arrow timestamp unit.
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_OFFSET = r"(Z|z|[+-]\d\d(:?\d\d)?)$"
_NUMBER = r"^-?\d+(\.\d*)?$"


def check_timezone(zone: str) -> None:
    """ValueError naming ``--timezone`` unless ``zone`` is a known IANA zone."""
    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"--timezone {zone!r}: not a known time zone (an IANA name, e.g. UTC, Europe/Paris)"
        ) from None


def value_at(values: pa.Array, at: int) -> object:
    """``values[at]`` as an error shows it: a timestamp or date as ISO text (beyond what
    Python holds: its ticks and type)."""
    try:
        v = values[at].as_py()
    except (OverflowError, ValueError):
        return f"{values.slice(at, 1).cast(pa.int64())[0].as_py()} ({values.type})"
    return v.isoformat() if isinstance(v, dt.date) else v


def first_bad(values: pa.Array, ok: np.ndarray) -> tuple[int, object]:
    """The place of the first False of ``ok`` ((n,) bool) and its value (:func:`value_at`)."""
    at = int(np.flatnonzero(~ok)[0])
    return at, value_at(values, at)


def wall_text(secs: int) -> str:
    """Wall seconds as ``YYYY-MM-DD HH:MM:SS`` (the zone's clock, as the splits see it)."""
    when = dt.datetime(1970, 1, 1) + dt.timedelta(seconds=secs)
    return when.isoformat(sep=" ")


def _floor_seconds(stamps: pa.Array) -> np.ndarray:
    """Timestamps of any unit -> (n,) int64 whole seconds, floored (a null: 0, the callers
    use the others). Integer arithmetic: float64 cannot hold nanoseconds since the epoch."""
    ticks = pc.fill_null(stamps.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    return ticks // _PER_SECOND[stamps.type.unit]


def check_range(
    secs: np.ndarray, values: pa.Array, where: str, first_row: int, margin: int = 0
) -> None:
    """ValueError naming the first of ``values`` whose wall seconds (secs: (n,) int64) fall
    outside [FIRST_WALL - margin, END_WALL + margin)."""
    ok = (secs >= FIRST_WALL - margin) & (secs < END_WALL + margin)
    if ok.all():
        return
    at, v = first_bad(values, ok)
    raise ValueError(
        f"{where}, row {first_row + at}: {v!r} is not a time between 1970-01-01 and "
        f"9999-12-31 (read as {int(secs[at])} seconds since 1970-01-01 on the --timezone "
        "clock: a placeholder, or another unit? --time-unit)"
    )


def _parse_iso(values: pa.Array, zone: str) -> pa.Array:
    """ISO strings -> naive timestamps[ns] on the zone's clock (an offset: converted)."""
    aware = pc.fill_null(pc.match_substring_regex(values, _OFFSET), False)
    naive_text = pc.if_else(aware, None, values)
    aware_text = pc.if_else(aware, values, None)
    naive = pc.cast(naive_text, pa.timestamp("ns"))
    instants = pc.cast(aware_text, pa.timestamp("ns", tz="UTC"))
    local = pc.local_timestamp(pc.cast(instants, pa.timestamp("ns", tz=zone)))
    return pc.if_else(aware, local, naive)


def _epoch_wall(
    values: pa.Array,
    zone: str,
    time_unit: str,
    where: str,
    first_row: int,
    shown: pa.Array | None = None,
) -> np.ndarray:
    """Numbers since the epoch (seconds, or ms: ``time_unit``) -> (n,) int64 wall seconds;
    an error names the value of ``shown`` (default ``values``) at its row."""
    shown = values if shown is None else shown
    raw = values.to_numpy(zero_copy_only=False)
    if pa.types.is_floating(values.type):
        finite = np.isfinite(raw) & (np.abs(raw) < 2.0**62)
        if not finite.all():
            at, v = first_bad(shown, finite)
            raise ValueError(f"{where}, row {first_row + at}: {v!r} is not a time")
        raw = np.floor(raw)
    raw = raw.astype(np.int64)
    ms = (np.abs(raw) >= MS_THRESHOLD) if time_unit == "auto" else time_unit == "ms"
    secs = np.where(ms, raw // 1000, raw)
    # an instant a day outside the range is outside it on every clock (and the zone's
    # conversion below would overflow on a year in the millions)
    check_range(secs, shown, where, first_row, margin=DAY_SECONDS)
    if zone == "UTC":
        return secs
    stamps = pa.array(secs, type=pa.timestamp("s", tz=zone))
    return pc.local_timestamp(stamps).cast(pa.int64()).to_numpy()


def wall_seconds(
    values: pa.Array,
    zone: str,
    time_unit: str = "auto",
    where: str = "the log",
    first_row: int = 1,
) -> np.ndarray:
    """Event times -> (n,) int64 seconds since 1970-01-01 00:00 on the zone's wall clock,
    each floored to its second.

    Raises:
        ValueError: a null, a value that is not a time, or one outside 1970..9999 on the
            zone's clock, naming it, its row (``first_row`` is the row number of
            ``values[0]``) and ``where``.
    """
    secs = _wall_seconds(values, zone, time_unit, where, first_row)
    check_range(secs, values, where, first_row)
    return secs


def _wall_seconds(
    values: pa.Array, zone: str, time_unit: str, where: str, first_row: int
) -> np.ndarray:
    t = values.type
    nulls = np.asarray(values.is_null(), dtype=bool)
    if nulls.any():
        at, _ = first_bad(values, ~nulls)
        raise ValueError(f"{where}, row {first_row + at}: the time is null")
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return _epoch_wall(values, zone, time_unit, where, first_row)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        # a column of numbers and a typo is read as text: its numbers stay epoch times
        numeric = pc.fill_null(pc.match_substring_regex(values, _NUMBER), False)
        if pc.all(numeric).as_py():
            nums = pc.cast(values, pa.float64())
            return _epoch_wall(nums, zone, time_unit, where, first_row, values)
        text = pc.if_else(numeric, None, values)
        try:
            stamps = _parse_iso(text, zone)
        except pa.ArrowInvalid:
            ok = np.ones(len(values), dtype=bool)
            for i in range(len(values)):  # the error path only: find the value to name
                try:
                    _parse_iso(text.slice(i, 1), zone)
                except pa.ArrowInvalid:
                    ok[i] = False
                    break
            at, v = first_bad(values, ok)
            raise ValueError(
                f"{where}, row {first_row + at}: {v!r} is not a time (an ISO 8601 date-time, "
                "or seconds since the epoch)"
            ) from None
        iso = _floor_seconds(stamps)
        if not pc.any(numeric).as_py():
            return iso
        nums = pc.cast(pc.if_else(numeric, values, "0"), pa.float64())
        epoch = _epoch_wall(nums, zone, time_unit, where, first_row, values)
        return np.where(np.asarray(numeric, dtype=bool), epoch, iso)
    if pa.types.is_timestamp(t):
        if t.tz is None:
            return _floor_seconds(values)
        zoned = pc.cast(values, pa.timestamp(t.unit, tz=zone))
        return _floor_seconds(pc.local_timestamp(zoned))
    if pa.types.is_date(t):
        return _floor_seconds(pc.cast(values, pa.timestamp("s")))
    raise ValueError(
        f"{where}: a time column of type {t} (integers, floats, ISO strings, timestamps or dates)"
    )


def split_label(index: int, split_interval: int) -> tuple[str, str]:
    """(YYYYMMDD, HHMM) of split ``index`` (splits of ``split_interval`` minutes since the
    epoch on the zone's wall clock)."""
    minutes = index * split_interval
    day = _EPOCH + dt.timedelta(days=minutes // 1440)
    m = minutes % 1440
    return format_day(day), f"{m // 60:02d}{m % 60:02d}"


def split_index(day: str, split: str, split_interval: int) -> int:
    minutes = (dt.datetime.strptime(day, "%Y%m%d").date() - _EPOCH).days * 1440
    minutes += int(split[:2]) * 60 + int(split[2:])
    if minutes % split_interval:
        raise ValueError(f"split {day}/{split} is not on a {split_interval}-minute boundary")
    return minutes // split_interval
