"""``streamrec-datagen`` (``python -m streamrec.datagen``): the command line of every layout
writer::

    streamrec-datagen --out data --start-day 20190720 ...  # the planted stream
    streamrec-datagen --from-criteo FILE [FILE ...] ...    # real Criteo files
    streamrec-datagen --from-events LOG [LOG ...] ...      # event logs, by event time
    streamrec-datagen --random ...                         # the reference DLRM's random data

(:mod:`.planted`, :mod:`.criteo_layout`, :mod:`.event_layout`, :mod:`.randgen`). Each
writer's own flags are refused by the others; every one says, on stderr and in ``--job-out
FILE``, the trainer config lines that train what it laid out.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from streamrec.datagen import planted
from streamrec.datagen.layout_flags import add_job_out_flag, check_layout_flags, say_job
from streamrec.layout import parse_day, split_names


def _add_inputs(ap: argparse.ArgumentParser, flag: str, metavar: str, help: str) -> None:
    """Adds a layout's required input files, one or more after ``flag``."""
    ap.add_argument(flag, nargs="+", required=True, metavar=metavar, help=help)


def main_from_criteo(argv: list[str]) -> int:
    """``streamrec-datagen --from-criteo FILE [FILE ...]``: real Criteo files into the layout
    (:mod:`.criteo_layout`); the planted stream's own flags are refused."""
    from streamrec.datagen import criteo_layout  # lazy: torch (the trainer's gzip opener)

    ap = argparse.ArgumentParser(
        prog="streamrec-datagen",
        description="Lays Criteo Kaggle (train.txt) or Terabyte (day_N, day_N.gz) files, read "
        "in order as one stream, into OUT/YYYYMMDD/HHMM/part-* with a donefile per split; "
        "lines are copied byte for byte. The last split holds the lines left (fewer than "
        "--samples-per-split; its later parts may be empty files). A file's last line without "
        "a newline gets one.",
    )
    _add_inputs(ap, "--from-criteo", "FILE", "read in order; plain or gzip (by its magic bytes)")
    ap.add_argument("--out", required=True, help="data root (train_data_dir)")
    ap.add_argument("--start-day", required=True, help="YYYYMMDD of the first split")
    ap.add_argument("--split-interval", type=int, default=60, help="minutes per split")
    ap.add_argument("--samples-per-split", type=int, default=10000, help="lines per split")
    ap.add_argument(
        "--files-per-split",
        type=int,
        default=1,
        help="part files per split, each a contiguous block of the split's lines",
    )
    ap.add_argument("--donefile", default="to.hadoop.done", help="'' for none")
    ap.add_argument("--max-splits", type=int, default=None, help="stop after this many splits")
    ap.add_argument(
        "--block-bytes",
        type=int,
        default=criteo_layout.DEFAULT_BLOCK_BYTES,
        help="bytes read at a time; memory stays within about 9x this",
    )
    add_job_out_flag(ap)
    args = ap.parse_args(argv)
    check_layout_flags(ap, args, ("max_splits", "block_bytes"))
    for path in args.from_criteo:
        if not Path(path).is_file():
            ap.error(f"--from-criteo: no such file: {path}")
    try:
        counts = criteo_layout.lay_out_criteo(
            args.from_criteo,
            args.out,
            args.start_day,
            args.split_interval,
            args.samples_per_split,
            args.files_per_split,
            args.donefile or None,
            args.max_splits,
            args.block_bytes,
        )
    except FileExistsError as exc:
        ap.error(f"--out: {exc}")
    except ValueError as exc:  # DataError is one: no lines, an unreadable file
        ap.error(f"--from-criteo: {exc}")
    print(json.dumps(counts))
    say_job(args, counts, "criteo", 26)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--from-criteo", nargs="*")
    pre.add_argument("--from-events", nargs="*")
    pre.add_argument("--random", action="store_true")
    known = pre.parse_known_args(argv)[0]
    if known.from_criteo is not None:
        return main_from_criteo(argv)
    if known.from_events is not None:
        return main_from_events(argv)
    if known.random:
        from streamrec.datagen.randgen import main_random  # lazy: torch

        return main_random(argv)
    ap = argparse.ArgumentParser(
        prog="streamrec-datagen", description=planted.__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--from-criteo",
        nargs="+",
        metavar="FILE",
        help="lay real Criteo files out instead of generating (its flags: "
        "streamrec-datagen --from-criteo FILE --help)",
    )
    ap.add_argument(
        "--from-events",
        nargs="+",
        metavar="LOG",
        help="lay timestamped event logs (Parquet, CSV, JSON lines) out by event time instead "
        "(its flags: streamrec-datagen --from-events LOG --help)",
    )
    ap.add_argument(
        "--random",
        action="store_true",
        help="the reference DLRM's random data instead (its flags: streamrec-datagen "
        "--random --help)",
    )
    ap.add_argument("--out", required=True, help="data root (train_data_dir)")
    ap.add_argument("--start-day", required=True, help="YYYYMMDD")
    ap.add_argument("--days", type=int, default=1)
    ap.add_argument("--split-interval", type=int, default=60, help="minutes per split")
    ap.add_argument("--samples-per-split", type=int, default=10000)
    ap.add_argument("--files-per-split", type=int, default=1)
    ap.add_argument("--donefile", default="to.hadoop.done", help="'' for none")
    ap.add_argument("--rate", type=float, default=0.0, help="splits per second (0: no pause)")
    ap.add_argument("--max-splits", type=int, default=None)
    for name, default in asdict(planted.StreamParams()).items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    args = ap.parse_args(argv)
    try:
        parse_day(args.start_day)
        split_names(args.split_interval)
        if args.days < 1 or args.samples_per_split < 1 or args.files_per_split < 1:
            raise ValueError(
                f"--days, --samples-per-split and --files-per-split must be >= 1, "
                f"got {args.days}, {args.samples_per_split}, "
                f"{args.files_per_split}"
            )
    except ValueError as exc:
        ap.error(str(exc))
    params = planted.StreamParams(**{k: getattr(args, k) for k in asdict(planted.StreamParams())})
    counts = planted.generate(
        args.out,
        args.start_day,
        args.days,
        args.split_interval,
        args.samples_per_split,
        args.files_per_split,
        params,
        args.donefile or None,
        args.rate,
        args.max_splits,
    )
    print(json.dumps(counts))
    return 0


def main_from_events(argv: list[str]) -> int:
    """``streamrec-datagen --from-events LOG [LOG ...]``: event logs into the layout by time;
    bad flags and bad input exit 2 naming the flag, the column or the value."""
    from streamrec.datagen.event_layout import (  # lazy: pyarrow
        DEFAULT_BUFFER_BYTES,
        DEFAULT_MAX_SPAN_DAYS,
        FORMATS,
        lay_out_events,
    )
    from streamrec.datagen.event_logs import DEFAULT_BLOCK_BYTES
    from streamrec.datagen.event_times import TIME_UNITS

    ap = argparse.ArgumentParser(
        prog="streamrec-datagen",
        description="Lays timestamped event logs (Parquet, CSV or JSON lines; any order, any "
        "size: read in bounded memory) into OUT/YYYYMMDD/HHMM/part-*, each event in the split "
        "of its time, every split from the first event's day to the last event's split with "
        "its donefile (empty ones included), and prints the start_day / end_day / end_split "
        "to train them. Run it again with a later log to extend the stream: a split that has "
        "its donefile is never touched; events that fall into one are dropped as late and "
        "counted. Times: integer seconds since the epoch (>= 1e11: milliseconds, see "
        "--time-unit), ISO 8601 strings (without an offset: the --timezone clock) or "
        "Parquet timestamps, fractions of a second floored; between 1970 and 9999, and "
        "spanning at most --max-span-days.",
        epilog="Train it with data_format parquet or slot and a feature schema naming the "
        "columns (runner.schema; REST data.schema): label (0/1), dense [name or {name, "
        "log1p, normalize}] (raw values: normalized online by default), sparse [{name, "
        "pooling: sum|mean, table?}] of int or string ids or lists of them. "
        "services/trainer/README.md: 'Walk-through: your own data over REST'.",
    )
    _add_inputs(
        ap,
        "--from-events",
        "LOG",
        "event logs: Parquet (by its magic bytes), .csv, .json/.jsonl/.ndjson",
    )
    ap.add_argument("--time-column", required=True, help="the column holding each event's time")
    ap.add_argument("--out", required=True, help="data root (train_data_dir)")
    ap.add_argument(
        "--split-interval", type=int, default=60, help="minutes per split (dividing 1440)"
    )
    ap.add_argument(
        "--timezone",
        default="UTC",
        help="IANA zone whose wall clock the splits follow (default UTC)",
    )
    ap.add_argument(
        "--format",
        default="parquet",
        choices=FORMATS,
        help="parquet: every column as it is, lists as lists; slot: PaddleRec slot "
        "text, 'name:value' tokens, a list repeating its name",
    )
    ap.add_argument(
        "--time-unit",
        default="auto",
        choices=TIME_UNITS,
        help="of integer times: auto reads values >= 1e11 as milliseconds",
    )
    ap.add_argument(
        "--list-columns",
        default="",
        metavar="A,B",
        help="CSV columns whose cells are lists (5|9); Parquet and JSON carry lists",
    )
    ap.add_argument("--list-sep", default="|", help="separator of a CSV list cell")
    ap.add_argument("--donefile", default="to.hadoop.done", help="'' for none")
    ap.add_argument(
        "--buffer-bytes",
        type=int,
        default=DEFAULT_BUFFER_BYTES,
        help="events buffered before part files are written (the memory bound)",
    )
    ap.add_argument(
        "--block-bytes",
        type=int,
        default=DEFAULT_BLOCK_BYTES,
        help="bytes of a CSV or JSON log read at a time",
    )
    ap.add_argument(
        "--max-span-days",
        type=int,
        default=DEFAULT_MAX_SPAN_DAYS,
        metavar="DAYS",
        help="refuse (naming both ends, before anything lands) events spanning more days, "
        "or appended ones more days after the last landed split: an outlying time would "
        f"lay out every split in between (default {DEFAULT_MAX_SPAN_DAYS})",
    )
    add_job_out_flag(ap)
    args = ap.parse_args(argv)
    try:
        counts = lay_out_events(
            args.from_events,
            args.out,
            args.time_column,
            args.split_interval,
            args.timezone,
            args.format,
            args.donefile or None,
            args.time_unit,
            [c for c in args.list_columns.split(",") if c],
            args.list_sep,
            args.buffer_bytes,
            args.block_bytes,
            args.max_span_days,
        )
    except ValueError as exc:  # DataError is one
        ap.error(str(exc))
    if counts["late"]:
        print(
            f"streamrec-datagen: warning: {counts['late']} events dropped as late: their splits "
            f"({counts['late_first']} .. {counts['late_last']}) had already landed (a split "
            "with its donefile is never rewritten)",
            file=sys.stderr,
        )
    print(json.dumps(counts))
    say_job(args, counts, args.format, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
