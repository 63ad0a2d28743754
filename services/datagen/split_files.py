"""The files of a split in the streaming layout (``ROOT/YYYYMMDD/HHMM/part-NNNNN``), as every
layout writer writes them: each part under a temporary name renamed into place, then the
split's donefile; and which split the i-th one from a start day is.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from streamrec.layout import format_day, parse_day, split_names


def part_name(index: int) -> str:
    """The name of a split's data file number ``index`` (0-based): ``part-00003``."""
    return f"part-{index:05d}"


@contextmanager
def open_part(split_dir: Path, index: int) -> Iterator[BinaryIO]:
    """Opens a split's data file for writing under a temporary ``.``-prefixed name (readers
    skip it) and renames it into place once the block ends: a reader never sees half a file.
    A block that raises leaves no file behind."""
    tmp = split_dir / f".{part_name(index)}.tmp"
    try:
        with tmp.open("wb") as f:
            yield f
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, split_dir / part_name(index))


def mark_split_done(split_dir: Path, donefile: str | None) -> None:
    """Writes the split's donefile (when one is configured): call it after the split's files."""
    if donefile:
        (split_dir / donefile).touch()


def write_split(split_dir: Path, text_parts: list[bytes], donefile: str | None) -> None:
    """Writes a split's files (each via a temporary name), then its donefile."""
    split_dir.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(text_parts):
        with open_part(split_dir, i) as f:
            f.write(text)
    mark_split_done(split_dir, donefile)


def split_at(start_day: str, split_interval: int, index: int) -> tuple[str, str]:
    """(day YYYYMMDD, split HHMM) of the ``index``-th split (0-based) from start_day's 0000."""
    names = split_names(split_interval)
    day = parse_day(start_day) + dt.timedelta(days=index // len(names))
    return format_day(day), names[index % len(names)]
