"""Event times -> splits of the streaming layout, on a time zone's wall clock.

A split is ``split_interval`` minutes of the zone's clock; split ``i`` starts ``i *
split_interval`` minutes after 1970-01-01 00:00 on that clock, so a day's splits are
``1440 / split_interval`` consecutive indices and ``split_label`` names one
``(YYYYMMDD, HHMM)`` as :mod:`streamrec.layout` lays it out.

What a time is (decided):
- integers: seconds since the epoch; with ``time_unit="auto"`` a value of at least 1e11 (after
  1973-03-03 in milliseconds, after the year 5138 in seconds) is read as milliseconds; ``"s"``
  or ``"ms"`` force one unit. Floats: seconds, the fraction dropped.
- ISO 8601 strings (``2024-03-05T10:47:12``, a space for the ``T``, fractions): with an
  offset (``Z``, ``+01:00``) an instant, shown on the zone's clock; without one, already the
  zone's wall clock. Parquet timestamps the same (with a time zone: an instant; naive: the
  zone's clock), dates their midnight.
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


def first_bad(values: pa.Array, ok: np.ndarray) -> tuple[int, object]:
    at = int(np.flatnonzero(~ok)[0])
    return at, values[at].as_py()


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
    values: pa.Array, zone: str, time_unit: str, where: str, first_row: int
) -> np.ndarray:
    """Numbers since the epoch (seconds, or ms: ``time_unit``) -> (n,) int64 wall seconds."""
    raw = values.to_numpy(zero_copy_only=False)
    if pa.types.is_floating(values.type):
        finite = np.isfinite(raw) & (np.abs(raw) < 2.0**62)
        if not finite.all():
            at, v = first_bad(values, finite)
            raise ValueError(f"{where}, row {first_row + at}: {v!r} is not a time")
        raw = np.floor(raw)
    raw = raw.astype(np.int64)
    ms = (np.abs(raw) >= MS_THRESHOLD) if time_unit == "auto" else time_unit == "ms"
    secs = np.where(ms, raw // 1000, raw)
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
    """Event times -> (n,) int64 seconds since 1970-01-01 00:00 on the zone's wall clock.

    Raises:
        ValueError: a null or a value that is not a time, naming it, its row (``first_row``
            is the row number of ``values[0]``) and ``where``.
    """
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
            return _epoch_wall(pc.cast(values, pa.float64()), zone, time_unit, where, first_row)
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
        iso = pc.cast(stamps, pa.timestamp("s")).cast(pa.int64()).to_numpy(zero_copy_only=False)
        if not pc.any(numeric).as_py():
            return iso
        nums = pc.cast(pc.if_else(numeric, values, "0"), pa.float64())
        epoch = _epoch_wall(nums, zone, time_unit, where, first_row)
        return np.where(np.asarray(numeric, dtype=bool), epoch, np.nan_to_num(iso)).astype(np.int64)
    elif pa.types.is_timestamp(t):
        stamps = values
        if t.tz is not None:
            zoned = pc.cast(values, pa.timestamp(t.unit, tz=zone))
            stamps = pc.local_timestamp(zoned)
    elif pa.types.is_date(t):
        stamps = pc.cast(values, pa.timestamp("s"))
    else:
        raise ValueError(
            f"{where}: a time column of type {t} (integers, floats, ISO strings, "
            "timestamps or dates)"
        )
    return pc.cast(stamps, pa.timestamp("s")).cast(pa.int64()).to_numpy()


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
