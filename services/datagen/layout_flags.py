"""The command-line flags every layout writer of ``streamrec-datagen`` shares (the planted
stream, ``--from-criteo``, ``--from-events``, ``--random``), and the trainer config lines
that train exactly what one laid out (``--job-out``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

from streamrec.layout import parse_day, split_names


def add_job_out_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--job-out",
        default=None,
        metavar="FILE",
        help="write a trainer job YAML that trains exactly what was laid out (the same "
        "lines are printed on stderr)",
    )


def check_layout_flags(
    ap: argparse.ArgumentParser, args: argparse.Namespace, more: tuple[str, ...]
) -> None:
    """The flags every layout writer shares, each refused by name."""
    try:
        parse_day(args.start_day)
    except ValueError:
        ap.error(f"--start-day {args.start_day!r}: must be a date YYYYMMDD")
    try:
        split_names(args.split_interval)
    except ValueError:
        ap.error(
            f"--split-interval {args.split_interval}: must be minutes dividing 1440 (a day), "
            "e.g. 5, 60, 360"
        )
    for flag in ("samples_per_split", "files_per_split", *more):
        value = getattr(args, flag)
        if value is not None and value < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1, got {value}")


def job_lines(
    out: str | Path,
    counts: Mapping[str, object],
    split_interval: int,
    data_format: str,
    slots: int | None,
    donefile: str | None,
) -> str:
    """The trainer config (YAML) that trains exactly the splits laid out under ``out``;
    ``slots`` None (a schema's data: the schema names the features) writes no slot count."""
    done = "null" if donefile is None else donefile
    text = (
        "runner:\n"
        f"  train_data_dir: {Path(out).resolve()}\n"
        f"  data_format: {data_format}\n"
        f"  split_interval: {split_interval}\n"
        f'  start_day: "{counts["start_day"]}"\n'
        f'  end_day: "{counts["end_day"]}"\n'
        f'  end_split: "{counts["last_split"]}"    # the last split laid out\n'
        f"  data_donefile: {done}\n"
    )
    if slots is None:
        return text
    return text + f"hyper_parameters:\n  sparse_inputs_slots: {slots}\n"


def say_job(
    args: argparse.Namespace, counts: Mapping[str, object], fmt: str, slots: int | None
) -> None:
    """Prints :func:`job_lines` to stderr, and writes them to ``--job-out`` if given."""
    text = job_lines(args.out, counts, args.split_interval, fmt, slots, args.donefile or None)
    print(f"# trainer config lines for what was laid out:\n{text}", file=sys.stderr, end="")
    if args.job_out:
        Path(args.job_out).write_text(text)
