"""``streamrec-datagen --from-events``: timestamped event logs (Parquet, CSV, JSON lines; in
any order, with a list column) laid out by event time through the console script, read back
split by split against an independent oracle (``zoneinfo``); empty splits with donefiles,
appending without touching landed splits, late events, bad input, and bounded memory."""

from __future__ import annotations

import datetime as dt
import json
import random
import subprocess
import sys
import textwrap
import zoneinfo
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from in_process import run_main
from streamrec.datagen.__main__ import main as datagen_main
from streamrec.process import bin_path

DONE = "to.hadoop.done"
T0 = int(dt.datetime(2024, 3, 5, 10, 0, tzinfo=dt.UTC).timestamp())
HOUR = 3600
#: hours after T0 holding events: 3 to 5 and 9 stay empty (splits laid out with no part)
BUSY_HOURS = (0, 1, 2, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16)


def datagen(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [bin_path("streamrec-datagen"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def make_events(n: int, seed: int, hours: tuple[int, ...] = BUSY_HOURS, t0: int = T0) -> list:
    """``n`` events in random order: id, ts (seconds), click, age, user_id, city, genres."""
    rng = random.Random(seed)
    cities = ["paris", "lyon", "nice"]
    return [
        {
            "id": seed * 1_000_000 + i,
            "ts": t0 + rng.choice(hours) * HOUR + rng.randrange(HOUR),
            "click": rng.randrange(2),
            "age": round(rng.random(), 3),
            "user_id": rng.randrange(1000),
            "city": rng.choice(cities),
            "genres": [rng.randrange(20) for _ in range(rng.randrange(4))],  # [] included
        }
        for i in range(n)
    ]


def write_log(events: list, path: Path) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(events), path, row_group_size=37)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
    else:
        table = pa.Table.from_pylist(
            [{**e, "genres": "|".join(map(str, e["genres"]))} for e in events]
        )
        pa_csv.write_csv(table, path)
    return path


def split_of(ts: int, zone: str = "UTC", interval: int = 60) -> tuple[str, str]:
    """The oracle: (YYYYMMDD, HHMM) of an epoch second on the zone's clock."""
    t = dt.datetime.fromtimestamp(ts, zoneinfo.ZoneInfo(zone))
    m = (t.hour * 60 + t.minute) // interval * interval
    return t.strftime("%Y%m%d"), f"{m // 60:02d}{m % 60:02d}"


def split_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("*/*") if p.is_dir())


def parse_slot_line(line: str) -> dict:
    """A slot line back into an event (lists for genres; every other name once)."""
    event: dict = {"genres": []}
    for token in line.split(" "):
        name, value = token.split(":", 1)
        if name == "genres":
            event["genres"].append(int(value))
        elif name in ("age",):
            event[name] = float(value)
        elif name == "city":
            event[name] = value
        else:
            event[name] = int(value)
    return event


def read_back(out: Path, fmt: str) -> dict[tuple[str, str], list[dict]]:
    """Every split's events, read from its part files."""
    found: dict[tuple[str, str], list[dict]] = {}
    for d in split_dirs(out):
        rows: list[dict] = []
        for part in sorted(d.glob("part-*")):
            if fmt == "parquet":
                rows += pq.read_table(part).to_pylist()
            else:
                rows += [parse_slot_line(x) for x in part.read_text().splitlines()]
        found[(d.parent.name, d.name)] = rows
    return found


def all_splits(first: tuple[str, str], last: tuple[str, str]) -> list[tuple[str, str]]:
    """Every hourly split name from ``first`` to ``last`` inclusive."""
    t = dt.datetime.strptime("".join(first), "%Y%m%d%H%M")
    end = dt.datetime.strptime("".join(last), "%Y%m%d%H%M")
    names = []
    while t <= end:
        names.append((t.strftime("%Y%m%d"), t.strftime("%H%M")))
        t += dt.timedelta(hours=1)
    return names


@pytest.mark.parametrize(
    ("log_name", "fmt"),
    [("events.parquet", "parquet"), ("events.csv", "slot"), ("events.jsonl", "parquet")],
)
def test_each_event_in_the_split_of_its_time(tmp_path, log_name, fmt):
    events = make_events(400, seed=1)
    # a split's events come from both logs: buffered across them, spilled as several parts
    logs = [
        write_log(events[:200], tmp_path / log_name),
        write_log(events[200:], tmp_path / f"2{log_name}"),
    ]
    out, job = tmp_path / "data", tmp_path / "job.yaml"
    more = ["--list-columns", "genres"] if log_name.endswith(".csv") else []
    done = datagen(
        "--from-events", *logs, "--time-column", "ts", "--out", out, "--format", fmt,
        "--buffer-bytes", "4000", "--job-out", job, *more,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    last = split_of(T0 + max(BUSY_HOURS) * HOUR)
    assert counts["events"] == 400 and counts["late"] == 0
    assert (counts["start_day"], counts["end_day"], counts["last_split"]) == ("20240305", *last)
    # from the first event's day at 0000 (the job starts there) to the last event's split
    want = all_splits(("20240305", "0000"), last)
    assert [(d.parent.name, d.name) for d in split_dirs(out)] == want
    assert all((d / DONE).is_file() for d in split_dirs(out))
    found = read_back(out, fmt)
    for name, rows in found.items():
        assert all(split_of(r["ts"]) == name for r in rows), name
    empty = {name for name, rows in found.items() if not rows}
    busy = {split_of(T0 + h * HOUR) for h in BUSY_HOURS}
    assert empty == set(want) - busy and len(empty) == 10 + 4  # 00..09 and 13..15, 19
    laid = sorted((r for rows in found.values() for r in rows), key=lambda r: r["id"])
    assert laid == sorted(events, key=lambda r: r["id"])  # every column, lists as lists
    assert sum(len(list(d.glob("part-*"))) for d in split_dirs(out)) > len(busy)  # spilled
    text = job.read_text()
    assert f"data_format: {fmt}" in text and 'start_day: "20240305"' in text
    assert f'end_day: "{last[0]}"' in text and f'end_split: "{last[1]}"' in text
    assert text in done.stderr and "split_interval: 60" in text


def test_slot_lines_repeat_a_list_and_skip_empty_ones(tmp_path):
    events = [
        {"ts": T0, "click": 1, "age": 0.31, "user_id": 17, "genres": [5, 9]},
        {"ts": T0 + 1, "click": 0, "age": 0.5, "user_id": 18, "genres": []},
    ]
    log = write_log(events, tmp_path / "e.jsonl")
    done = run_main(
        datagen_main,
        ["--from-events", str(log), "--time-column", "ts", "--out", str(tmp_path / "d"),
         "--format", "slot"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    part = tmp_path / "d" / "20240305" / "1000" / "part-00000"
    assert part.read_text() == (
        f"ts:{T0} click:1 age:0.31 user_id:17 genres:5 genres:9\n"
        f"ts:{T0 + 1} click:0 age:0.5 user_id:18\n"
    )


def test_iso_times_and_a_half_hour_zone(tmp_path):
    """ISO strings with and without an offset, in Asia/Kolkata (UTC+05:30): a naive time is
    the zone's clock, an offset one an instant; milliseconds read as such."""
    zone = "Asia/Kolkata"
    instants = [T0 + k * 1700 for k in range(12)]
    random.Random(3).shuffle(instants)
    tz = zoneinfo.ZoneInfo(zone)
    rows = []
    for i, t in enumerate(instants):
        when = dt.datetime.fromtimestamp(t, tz)
        text = when.replace(tzinfo=None).isoformat(sep=" ") if i % 2 else when.isoformat()
        rows.append({"id": i, "when": text, "ms": t * 1000})
    log = write_log(rows, tmp_path / "iso.jsonl")
    for column in ("when", "ms"):
        out = tmp_path / column
        done = run_main(
            datagen_main,
            ["--from-events", str(log), "--time-column", column, "--out", str(out),
             "--timezone", zone, "--split-interval", "30"],
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        for (day, split), laid in read_back(out, "parquet").items():
            for r in laid:
                assert split_of(instants[r["id"]], zone, 30) == (day, split), (column, r)
        assert sum(len(v) for v in read_back(out, "parquet").values()) == 12


def snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_appending_a_later_log_keeps_landed_splits_and_drops_late_events(tmp_path):
    out = tmp_path / "data"
    first = write_log(make_events(200, seed=1, hours=(0, 1, 2)), tmp_path / "a.parquet")
    done = datagen("--from-events", first, "--time-column", "ts", "--out", out)
    assert done.returncode == 0, done.stderr
    landed = snapshot(out)
    assert json.loads(done.stdout)["last_split"] == "1200"
    # a day later, with a gap; 7 events of the landed hours come late
    later = make_events(150, seed=2, hours=(24 + 3, 24 + 5)) + make_events(7, seed=3, hours=(1,))
    random.Random(4).shuffle(later)
    done = datagen(
        "--from-events", write_log(later, tmp_path / "b.csv"), "--time-column", "ts",
        "--out", out, "--list-columns", "genres",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert (counts["events"], counts["late"]) == (150, 7)
    assert counts["late_first"] == counts["late_last"] == "20240305/1100"
    assert "7 events dropped as late" in done.stderr and "20240305/1100" in done.stderr
    assert {k: v for k, v in snapshot(out).items() if k in landed} == landed
    landed_dirs = {str(Path(k).parent) for k in landed if "/" in k}
    new = {k for k in snapshot(out) if k not in landed}
    assert new and all(str(Path(k).parent) not in landed_dirs for k in new)
    # the stream is whole: every split from the first day's 0000 to the new last one is ready
    last = split_of(T0 + (24 + 5) * HOUR)
    assert (counts["start_day"], counts["end_day"], counts["last_split"]) == ("20240305", *last)
    want = all_splits(("20240305", "0000"), last)
    assert [(d.parent.name, d.name) for d in split_dirs(out)] == want
    assert all((d / DONE).is_file() for d in split_dirs(out))
    found = read_back(out, "parquet")
    assert sorted(r["id"] for rows in found.values() for r in rows) == sorted(
        [e["id"] for e in make_events(200, seed=1, hours=(0, 1, 2))]
        + [e["id"] for e in later if e["ts"] >= T0 + 24 * HOUR]
    )
    # another interval on the same stream is refused by name
    done = run_main(
        datagen_main,
        ["--from-events", str(first), "--time-column", "ts", "--out", str(out),
         "--split-interval", "30"],
    )  # fmt: skip
    assert done.returncode == 2 and "--split-interval 30" in done.stderr


@pytest.mark.parametrize(
    ("rows", "argv", "message"),
    [
        ([{"time": T0, "x": 1}], [], "no time column 'ts'"),
        ([{"ts": "2024-03-05T10:00:00"}, {"ts": "yesterday"}], [], "row 2: 'yesterday' is not"),
        ([{"ts": T0}, {"ts": None}], [], "row 2: the time is null"),
        ([{"ts": T0}], ["--format", "csv"], "--format: invalid choice: 'csv'"),
        ([{"ts": T0}], ["--timezone", "Mars/Base"], "--timezone 'Mars/Base'"),
        ([{"ts": T0}], ["--split-interval", "7"], "split_interval must divide 1440"),
        ([{"ts": T0, "c": "a b"}], ["--format", "slot"], "column 'c': the value 'a b'"),
    ],
)
def test_bad_input_exits_2_naming_it(tmp_path, rows, argv, message):
    log = write_log(rows, tmp_path / "e.jsonl")
    done = run_main(
        datagen_main,
        ["--from-events", str(log), "--time-column", "ts", "--out", str(tmp_path / "d"), *argv],
    )
    assert done.returncode == 2, done
    assert message in done.stderr, done.stderr


def test_an_unknown_log_format_exits_2_through_the_script(tmp_path):
    log = tmp_path / "events.txt"
    log.write_text("ts\n1\n")
    done = datagen("--from-events", log, "--time-column", "ts", "--out", tmp_path / "d")
    assert done.returncode == 2
    assert f"event log {log}: unknown format" in done.stderr


#: Laid out in a process of its own: a warm-up log first (what any run costs once: library
#: code paged in, thread pools and their allocator arenas), then the big one. The high-water
#: mark is /proc's VmHWM: getrusage's ru_maxrss survives exec, so a child of the test
#: process would report the test process's own peak.
MEASURE = textwrap.dedent(
    """
    import json, sys
    from streamrec.datagen.event_layout import lay_out_events

    def high_water():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024

    warm, big, out, buffer_bytes = sys.argv[1:5]
    lay_out_events([warm], out + "-warm", "ts", buffer_bytes=int(buffer_bytes))
    base = high_water()
    counts = lay_out_events([big], out, "ts", buffer_bytes=int(buffer_bytes))
    print(json.dumps({"grown": high_water() - base, **counts}))
    """
)


def event_csv(path: Path, n: int, seed: int) -> int:
    """``n`` small events shuffled over 48 hourly splits into a CSV file; its size."""
    rng = np.random.default_rng(seed)
    table = pa.table(
        {
            "ts": T0 + rng.integers(0, 48 * HOUR, n),
            "click": rng.integers(0, 2, n),
            "user_id": rng.integers(0, 1 << 40, n),
            "item_id": rng.integers(0, 1 << 40, n),
        }
    )
    pa_csv.write_csv(table, path)
    return path.stat().st_size


def lay_out_measured(tmp_path: Path, buffer_bytes: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, tmp_path / "warm.csv", tmp_path / "big.csv",
         tmp_path / f"d{buffer_bytes}", str(buffer_bytes)],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_memory_stays_bounded_whatever_the_log_size(tmp_path):
    n = 1_500_000
    event_csv(tmp_path / "warm.csv", 300_000, seed=4)
    size = event_csv(tmp_path / "big.csv", n, seed=5)
    assert size > 50 << 20
    got = lay_out_measured(tmp_path, 8 << 20)
    assert got["events"] == n and got["splits"] == 48 + 10  # from the day's 0000
    assert got["grown"] < size / 4, (got["grown"], size)
    out = tmp_path / f"d{8 << 20}"
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in out.rglob("part-*")) == n


def test_a_failed_run_leaves_no_part_and_leftovers_are_refused(tmp_path):
    out = tmp_path / "data"
    good = write_log(make_events(300, seed=1), tmp_path / "a.jsonl")
    bad = write_log([{**make_events(1, seed=2)[0], "ts": "soon"}], tmp_path / "b.jsonl")
    argv = ["--time-column", "ts", "--out", str(out), "--buffer-bytes", "2000"]
    done = run_main(datagen_main, ["--from-events", str(good), str(bad), *argv])
    assert done.returncode == 2 and "'soon' is not a time" in done.stderr
    assert not list(out.rglob("part-*")) and not list(out.rglob(DONE))  # spilled, removed
    assert run_main(datagen_main, ["--from-events", str(good), *argv]).returncode == 0
    # a run killed before its donefiles: an open split holding parts is refused by name
    killed = out / "20240306" / "1000"
    killed.mkdir(parents=True)
    (killed / "part-00000").write_bytes(b"")
    done = run_main(datagen_main, ["--from-events", str(good), *argv])
    assert done.returncode == 2 and f"--out: {killed} holds part files" in done.stderr


def test_a_typo_among_csv_epoch_times_is_named_by_its_row(tmp_path):
    """The CSV reader reads a column of numbers and one typo as text: the numbers stay
    epoch times, the typo is named with its row (counted from 1, the header not counted)."""
    log = tmp_path / "e.csv"
    log.write_text(f"ts,a\n{T0},1\n{T0 + 1}000,2\n2024-03-05T11:00:00Z,3\nsoon,4\n")
    argv = ["--from-events", str(log), "--time-column", "ts", "--out", str(tmp_path / "d")]
    done = run_main(datagen_main, argv)
    assert done.returncode == 2 and "row 4: 'soon' is not a time" in done.stderr
    log.write_text(log.read_text().replace("soon", str(T0 + 2)))
    done = run_main(datagen_main, argv)
    assert done.returncode == 0, done.stderr
    got = read_back(tmp_path / "d", "parquet")
    assert [r["a"] for r in got[("20240305", "1000")]] == [1, 2, 4]  # s, ms, s
    assert [r["a"] for r in got[("20240305", "1100")]] == [3]


def test_daylight_saving_changes_follow_the_clock(tmp_path):
    """Europe/Paris: the hour skipped on 2024-03-31 is an empty split with its donefile; the
    two 02:30s of 2024-10-27 (an hour apart) share the split 0200."""
    spring = int(dt.datetime(2024, 3, 31, 0, 30, tzinfo=dt.UTC).timestamp())  # 01:30 CET
    autumn = int(dt.datetime(2024, 10, 27, 0, 30, tzinfo=dt.UTC).timestamp())  # 02:30 CEST
    rows = [
        {"id": i, "ts": t} for i, t in enumerate([spring, spring + HOUR, autumn, autumn + HOUR])
    ]
    for log, out in ((rows[:2], "spring"), (rows[2:], "autumn")):
        done = run_main(
            datagen_main,
            ["--from-events", str(write_log(log, tmp_path / f"{out}.jsonl")), "--time-column",
             "ts", "--out", str(tmp_path / out), "--timezone", "Europe/Paris"],
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    spring_splits = read_back(tmp_path / "spring", "parquet")
    assert [r["id"] for r in spring_splits[("20240331", "0100")]] == [0]
    assert spring_splits[("20240331", "0200")] == []  # 02:00-03:00 never happened
    assert (tmp_path / "spring" / "20240331" / "0200" / DONE).is_file()
    assert [r["id"] for r in spring_splits[("20240331", "0300")]] == [1]
    autumn_splits = read_back(tmp_path / "autumn", "parquet")
    assert [r["id"] for r in autumn_splits[("20241027", "0200")]] == [2, 3]
    assert list(autumn_splits)[-1] == ("20241027", "0200")


# ---- bad inputs: outlying times, fractions of a second, binary and empty logs --


def assert_clean_error(stderr: str, *parts: str) -> None:
    """One readable error line naming ``parts``: no traceback, no raw bytes."""
    assert "Traceback" not in stderr, stderr
    error = [line for line in stderr.splitlines() if "streamrec-datagen: error:" in line]
    assert len(error) == 1, stderr
    for part in parts:
        assert part in error[0], error[0]
    assert error[0].isprintable() and "\ufffd" not in error[0], error[0]


def test_an_outlying_time_is_refused_naming_it_before_anything_lands(tmp_path):
    """One event at time 0 after 299 of 2024's, in time order: refused, naming its log,
    column, row and value, the latest event and the span, before a split lands and whatever
    was buffered and written before it (nothing is left under --out: the CSV is read 2 KB
    at a time, the events spilled to part files every 2 KB)."""
    events = sorted(make_events(300, seed=1), key=lambda e: e["ts"])
    events[-1]["ts"] = 0
    log = write_log(events, tmp_path / "e.csv")
    out = tmp_path / "data"
    done = datagen(
        "--from-events", log, "--time-column", "ts", "--out", out, "--list-columns", "genres",
        "--split-interval", "1440", "--block-bytes", "2000", "--buffer-bytes", "2000",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout
    latest = events[-2]["ts"]
    span_days = latest / 86400
    assert_clean_error(
        done.stderr,
        f"the events span {span_days:.1f} days, more than --max-span-days 366",
        f"the earliest is event log {log}, column 'ts', row 300: 0, 1970-01-01 00:00:00 on "
        "the UTC clock",
        f"the latest is event log {log}, column 'ts', row 299: {latest}, "
        f"{dt.datetime.fromtimestamp(latest, dt.UTC):%Y-%m-%d %H:%M:%S} on the UTC clock",
        f"pass --max-span-days {int(span_days) + 1} to lay out every split between them "
        "(nothing was laid out)",
    )
    assert not out.exists()


def test_a_long_span_is_laid_out_with_max_span_days(tmp_path):
    """Two events 400 days apart: refused by default (366), laid out with
    --max-span-days 400, every day between them a split with its donefile."""
    log = write_log([{"ts": T0 - 400 * 86400}, {"ts": T0}], tmp_path / "e.jsonl")
    argv = ["--from-events", log, "--time-column", "ts", "--split-interval", "1440"]
    done = datagen(*argv, "--out", tmp_path / "refused")
    assert done.returncode == 2
    assert_clean_error(done.stderr, "the events span 400.0 days", "--max-span-days 400 ")
    assert not (tmp_path / "refused").exists()
    done = datagen(*argv, "--out", tmp_path / "d", "--max-span-days", "400")
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    first = dt.datetime.fromtimestamp(T0 - 400 * 86400, dt.UTC)
    assert (counts["splits"], counts["start_day"], counts["end_day"]) == (
        401, f"{first:%Y%m%d}", "20240305"
    )  # fmt: skip
    assert len(list((tmp_path / "d").glob(f"*/0000/{DONE}"))) == 401


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat()


@pytest.mark.parametrize(
    ("times", "shown"),
    [
        ([T0, T0 + 1, 10**18], "1000000000000000000"),  # milliseconds under auto: 31 M years
        ([T0, T0 + 1, -1], "-1"),  # a placeholder
        ([iso(T0), iso(T0 + 1), "1969-07-20T20:17:40Z"], "'1969-07-20T20:17:40Z'"),
    ],
)
def test_a_time_outside_1970_to_9999_is_refused_naming_its_row(tmp_path, times, shown):
    log = write_log([{"ts": t} for t in times], tmp_path / "e.jsonl")
    out = tmp_path / "d"
    done = datagen("--from-events", log, "--time-column", "ts", "--out", out)
    assert done.returncode == 2
    assert_clean_error(
        done.stderr,
        f"event log {log}, column 'ts', row 3: {shown} is not a time between 1970-01-01 and "
        "9999-12-31",
    )
    assert not out.exists()


def test_an_appended_log_far_after_the_landed_splits_is_refused(tmp_path):
    """Two years after the landed stream: refused (it would lay out two years of empty
    splits), naming the last landed split and the event; the landed stream untouched."""
    out = tmp_path / "data"
    done = datagen(
        "--from-events", write_log(make_events(50, seed=1), tmp_path / "a.parquet"),
        "--time-column", "ts", "--out", out,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    landed = snapshot(out)
    later = write_log(make_events(50, seed=2, t0=T0 + 2 * 366 * 86400), tmp_path / "b.parquet")
    done = datagen("--from-events", later, "--time-column", "ts", "--out", out)
    assert done.returncode == 2
    assert_clean_error(
        done.stderr,
        f"--out has landed up to split {counts['end_day']}/{counts['last_split']}",
        "more than --max-span-days 366",
        f"event log {later}, column 'ts', row ",
    )
    assert snapshot(out) == landed


#: Instants with fractions of a second, the last a microsecond before a split's end.
FRACTIONS = [
    T0 + 0.509,
    T0 + 1799.25,
    T0 + HOUR - 0.000001,
    T0 + HOUR + 0.5,
    T0 + 5 * HOUR + 59.999,
]


def fractional_log(path: Path, kind: str) -> Path:
    """FRACTIONS (one row each, ``id`` their index) as ``kind``'s time column."""
    utc = [dt.datetime.fromtimestamp(t, dt.UTC) for t in FRACTIONS]
    if kind.startswith("timestamp"):  # timestamp[ms], timestamp[ns, Asia/Kolkata] ...
        unit, _, zone = kind[len("timestamp[") : -1].partition(", ")
        stamps = pa.array(utc, pa.timestamp("us", tz="UTC"))
        if unit != "us":
            stamps = stamps.cast(pa.timestamp(unit, tz="UTC"), safe=False)
        stamps = stamps.cast(pa.timestamp(unit, tz=zone)) if zone else stamps
        if zone == "":
            stamps = stamps.cast(pa.timestamp(unit))  # naive: the UTC clock's time
        table = pa.table({"id": range(len(utc)), "ts": stamps})
        pq.write_table(table, path)
        return path
    # ISO text: Python's isoformat() (microseconds, +00:00), milliseconds with an offset, Z
    plus2 = dt.timezone(dt.timedelta(hours=2))
    texts = [
        utc[0].isoformat(),
        utc[1].astimezone(plus2).isoformat(timespec="milliseconds"),
        utc[2].isoformat().replace("+00:00", "Z"),
        utc[3].replace(tzinfo=None).isoformat(sep=" "),  # naive: the UTC clock
        utc[4].astimezone(plus2).isoformat(),
    ]
    rows = [{"id": i, "ts": text} for i, text in enumerate(texts)]
    write_log(rows, path) if path.suffix == ".jsonl" else pa_csv.write_csv(
        pa.Table.from_pylist(rows), path
    )
    return path


@pytest.mark.parametrize(
    "kind",
    ["timestamp[ms]", "timestamp[us]", "timestamp[ns]", "timestamp[ns, Asia/Kolkata]",
     "iso.csv", "iso.jsonl"],
)  # fmt: skip
def test_times_with_fractions_of_a_second_go_to_the_split_of_their_second(tmp_path, kind):
    suffix = Path(kind).suffix if kind.startswith("iso") else ".parquet"
    log = fractional_log(tmp_path / f"e{suffix}", kind)
    out = tmp_path / "d"
    done = datagen("--from-events", log, "--time-column", "ts", "--out", out)
    assert done.returncode == 0, done.stderr
    found = read_back(out, "parquet")
    placed = {r["id"]: name for name, rows in found.items() for r in rows}
    assert placed == {i: split_of(int(t // 1)) for i, t in enumerate(FRACTIONS)}
    assert placed[2] == ("20240305", "1000")  # 10:59:59.999999 is still 10:59


def test_slot_text_floats_read_back_by_the_slot_reader(tmp_path):
    """Floats that Arrow writes with an exponent (1.5e-7) or 17 digits after leading zeros
    (0.012345678901234568) come out of --format slot as numbers the slot reader takes:
    every line well-formed, each value the float32 of the log's."""
    from streamrec.control.feature_schema import FeatureSchema
    from streamrec.trainer.data.feature_data import parse_slot_chunk

    x = [1.5e-7, 123456789.123, -0.1, 0.012345678901234568, 1e16, -2.5e-9, 0.1, 0.0, 1e-5]
    y = [3.0e-8, 1e10, -0.1, 0.3333333, 7.0, 1.2345678e-4, 16777217.0, -0.0, 2.5e-7]
    table = pa.table(
        {
            "ts": [T0 + i for i in range(len(x))],
            "click": [i % 2 for i in range(len(x))],
            "x": pa.array(x, pa.float64()),
            "y": pa.array(y, pa.float32()),
            "user_id": range(len(x)),
        }
    )
    log = tmp_path / "e.parquet"
    pq.write_table(table, log)
    out = tmp_path / "d"
    done = datagen("--from-events", log, "--time-column", "ts", "--out", out, "--format", "slot")
    assert done.returncode == 0, done.stderr
    text = (out / "20240305" / "1000" / "part-00000").read_bytes()
    assert b"e" not in text.replace(b"user_id", b""), text  # no exponent
    schema = FeatureSchema.model_validate(
        {
            "label": "click",
            "dense": [{"name": "x", "log1p": False}, {"name": "y", "log1p": False}],
            "sparse": [{"name": "user_id"}],
        }
    )
    batch, stats = parse_slot_chunk(text, schema, "part-00000")
    assert (stats.lines, stats.malformed) == (len(x), 0), text
    got = batch.dense.numpy()
    assert got[:, 0].tolist() == np.float32(x).tolist(), text
    assert got[:, 1].tolist() == np.float32(y).tolist(), text
    assert batch.labels.tolist() == [float(i % 2) for i in range(len(x))]


def test_a_missing_float_is_written_as_nan_and_read_back_missing(tmp_path):
    """A null or NaN dense value of the log is ``x:nan`` in slot text (no token would make
    the line lack a dense feature: malformed); the reader keeps it as NaN, a missing value
    the model's normalizer takes for the mean."""
    from streamrec.control.feature_schema import FeatureSchema
    from streamrec.trainer.data.feature_data import parse_slot_chunk

    table = pa.table(
        {
            "ts": [T0, T0 + 1, T0 + 2],
            "click": [1, 0, 1],
            "x": pa.array([1.5, None, float("nan")], pa.float64()),
            "user_id": [1, 2, 3],
        }
    )
    log = tmp_path / "e.parquet"
    pq.write_table(table, log)
    out = tmp_path / "d"
    done = datagen("--from-events", log, "--time-column", "ts", "--out", out, "--format", "slot")
    assert done.returncode == 0, done.stderr
    text = (out / "20240305" / "1000" / "part-00000").read_bytes()
    assert text.count(b"x:nan") == 2, text
    schema = FeatureSchema.model_validate(
        {"label": "click", "dense": ["x"], "sparse": [{"name": "user_id"}]}
    )
    batch, stats = parse_slot_chunk(text, schema, "part-00000")
    assert (stats.lines, stats.malformed) == (3, 0), text
    assert np.isnan(batch.dense[1:, 0].numpy()).all() and not np.isnan(batch.dense[0, 0])


def test_a_binary_file_given_as_csv_is_named_without_its_bytes(tmp_path):
    rng = random.Random(5)
    nul = tmp_path / "dump.csv"  # a NUL byte in the first 64 KiB: binary, said before reading
    nul.write_bytes(bytes(rng.randrange(256) for _ in range(3000)))
    done = datagen("--from-events", nul, "--time-column", "ts", "--out", tmp_path / "d")
    assert done.returncode == 2
    assert_clean_error(done.stderr, f"event log {nul}: binary data, not CSV text (byte ")
    # no NUL, a valid header: pyarrow's error quotes the bad row, escaped and cut
    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(b"ts,v\n1709632800,1\n" + bytes(rng.randrange(1, 256) for _ in range(5000)))
    done = datagen("--from-events", garbage, "--time-column", "ts", "--out", tmp_path / "d")
    assert done.returncode == 2
    assert_clean_error(done.stderr, f"cannot read event log {garbage} as csv: ", "... (cut)")
    assert len(done.stderr.splitlines()[-1].replace(str(garbage), "")) < 500  # cut, the path aside
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("events.parquet", b"", "the file is empty (0 bytes)"),
        ("events.csv", b"", "the file is empty (0 bytes)"),
        ("events.parquet", b"ts,v\n1,2\n", "not a Parquet file (it does not start with Parquet's"),
    ],
)
def test_an_empty_or_false_parquet_log_is_named(tmp_path, name, data, message):
    log = tmp_path / name
    log.write_bytes(data)
    done = datagen("--from-events", log, "--time-column", "ts", "--out", tmp_path / "d")
    assert done.returncode == 2
    assert_clean_error(done.stderr, f"event log {log}: {message}")
