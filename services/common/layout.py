"""The streaming data layout and the model layout of PaddleRec, shared by trainer and api.

Data::

    data_root/
      20190720/            day, YYYYMMDD
        0000/              split, HHMM; one every `split_interval` minutes
          part-00000       data files (any name not starting with '.' or '_', not the donefile)
          to.hadoop.done   the donefile: the split is ready once it exists
        0005/ ...

Passes: the splits of a day in time order, grouped by `split_per_pass`; pass ids start at 1 each
day (PaddleRec). A pass is ready when every split of it is ready.

Models::

    model_root/20190720/3/            full checkpoint after pass 3 (MANIFEST.json written last)
    model_root/20190720/base/         base model (end of day, after shrink)
    model_root/20190720/delta_3/      delta after pass 3
    model_root/20190720/batch/        batch model (end of day, after shrink)
    model_root/passes.jsonl           one JSON line per finished pass
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MANIFEST_NAME = "MANIFEST.json"
DAY_FORMAT = "%Y%m%d"


def parse_day(day: str | int) -> dt.date:
    """'20190720' -> date; raises ValueError naming the value."""
    text = str(day)
    try:
        if len(text) != 8:
            raise ValueError
        return dt.datetime.strptime(text, DAY_FORMAT).date()
    except ValueError:
        raise ValueError(f"day must be YYYYMMDD, got {day!r}") from None


def format_day(day: dt.date) -> str:
    return day.strftime(DAY_FORMAT)


def days_between(start_day: str | int, end_day: str | int) -> list[str]:
    """Every day from start_day to end_day inclusive, as YYYYMMDD strings."""
    start, end = parse_day(start_day), parse_day(end_day)
    if end < start:
        raise ValueError(f"end_day {end_day!r} is before start_day {start_day!r}")
    return [format_day(start + dt.timedelta(days=i)) for i in range((end - start).days + 1)]


def split_names(split_interval: int) -> list[str]:
    """The HHMM names of one day's splits: split_interval=5 -> ['0000', '0005', ..., '2355']."""
    if not (
        isinstance(split_interval, int)
        and 0 < split_interval <= 1440
        and 1440 % split_interval == 0
    ):
        raise ValueError(f"split_interval must divide 1440 minutes, got {split_interval!r}")
    return [f"{m // 60:02d}{m % 60:02d}" for m in range(0, 1440, split_interval)]


@dataclass(frozen=True, order=True)
class PassSpec:
    """One pass: a day, its 1-based pass id within the day, and its split names."""

    day: str
    pass_id: int
    splits: tuple[str, ...]

    def split_dirs(self, data_root: str | Path) -> list[Path]:
        return [Path(data_root) / self.day / s for s in self.splits]

    def is_last_of_day(self, split_interval: int, split_per_pass: int) -> bool:
        return self.pass_id == passes_per_day(split_interval, split_per_pass)


def passes_per_day(split_interval: int, split_per_pass: int) -> int:
    n = len(split_names(split_interval))
    return (n + split_per_pass - 1) // split_per_pass


def _check_split_per_pass(split_per_pass: int) -> None:
    if not (isinstance(split_per_pass, int) and split_per_pass >= 1):
        raise ValueError(f"split_per_pass must be an integer >= 1, got {split_per_pass!r}")


def day_count(start_day: str | int, end_day: str | int) -> int:
    """Days from start_day to end_day inclusive (what :func:`days_between` lists, not listed)."""
    start, end = parse_day(start_day), parse_day(end_day)
    if end < start:
        raise ValueError(f"end_day {end_day!r} is before start_day {start_day!r}")
    return (end - start).days + 1


def _end_index(split_interval: int, end_split: str | None) -> int:
    """How many splits of the last day a run with ``end_split`` trains (all when None)."""
    names = split_names(split_interval)
    if end_split is None:
        return len(names)
    if end_split not in names:
        raise ValueError(
            f"end_split must be a split of the day (HHMM, a multiple of split_interval="
            f"{split_interval} minutes), got {end_split!r}"
        )
    return names.index(end_split) + 1


def count_passes(
    start_day: str | int,
    end_day: str | int,
    split_interval: int,
    split_per_pass: int,
    end_split: str | None = None,
) -> int:
    """How many passes :func:`iter_passes` yields, computed (days x passes a day), not counted."""
    _check_split_per_pass(split_per_pass)
    per_day = passes_per_day(split_interval, split_per_pass)
    last_day = -(-_end_index(split_interval, end_split) // split_per_pass)
    return (day_count(start_day, end_day) - 1) * per_day + last_day


def iter_passes(
    start_day: str | int,
    end_day: str | int,
    split_interval: int,
    split_per_pass: int,
    end_split: str | None = None,
) -> Iterator[PassSpec]:
    """Every pass from start_day to end_day, in training order.

    ``end_split`` (HHMM): the run ends with that split of end_day; the pass holding it keeps
    only the splits up to it (a partial pass). None: end_day's last split.
    """
    _check_split_per_pass(split_per_pass)
    names = split_names(split_interval)
    stop = _end_index(split_interval, end_split)
    days = days_between(start_day, end_day)
    for day in days:
        last = stop if day == days[-1] else len(names)
        for i in range(0, last, split_per_pass):
            yield PassSpec(
                day, i // split_per_pass + 1, tuple(names[i : min(i + split_per_pass, last)])
            )


def landed_end(
    data_root: str | Path, passes: Iterable[PassSpec], donefile: str | None
) -> tuple[str, str] | None:
    """(day, HHMM) of the last split that has landed, walking ``passes``' splits in order up
    to the first one not ready (training cannot skip it); None when the first is not ready.

    What a run bounded at "the splits landed when it starts" trains up to.
    """
    found = None
    for spec in passes:
        for split, d in zip(spec.splits, spec.split_dirs(data_root), strict=True):
            if not split_ready(d, donefile):
                return found
            found = (spec.day, split)
    return found


def split_ready(split_dir: Path, donefile: str | None) -> bool:
    """A split is ready when its directory exists and, if a donefile is configured, holds it."""
    if donefile:
        return (split_dir / donefile).is_file()
    return split_dir.is_dir()


def pass_ready(data_root: str | Path, spec: PassSpec, donefile: str | None) -> bool:
    return all(split_ready(d, donefile) for d in spec.split_dirs(data_root))


def missing_splits(data_root: str | Path, spec: PassSpec, donefile: str | None) -> list[str]:
    """The splits (HHMM) of ``spec`` that are not ready, in order (none: the pass is)."""
    return [
        s
        for s, d in zip(spec.splits, spec.split_dirs(data_root), strict=True)
        if not split_ready(d, donefile)
    ]


def pass_files(
    data_root: str | Path,
    spec: PassSpec,
    donefile: str | None,
    skipped: list[Path] | None = None,
) -> list[Path]:
    """The data files of a pass, sorted (split order, then name).

    A file or split directory that is a symlink leading out of ``data_root`` (resolved) is
    not read: it is logged, appended to ``skipped`` when given, and left out. Links that stay
    inside the root are followed.
    """
    root = Path(data_root).resolve()
    files: list[Path] = []

    def inside(p: Path) -> bool:
        if p.resolve().is_relative_to(root):
            return True
        log.warning("skipped %s: a symlink out of the data root %s", p, root)
        if skipped is not None:
            skipped.append(p)
        return False

    for d in spec.split_dirs(data_root):
        if not d.is_dir() or not inside(d):
            continue
        files.extend(
            sorted(
                p
                for p in d.iterdir()
                if p.is_file()
                and p.name != donefile
                and not p.name.startswith((".", "_"))
                and inside(p)
            )
        )
    return files


def wait_for_pass(
    data_root: str | Path,
    spec: PassSpec,
    donefile: str | None,
    data_sleep_second: float,
    timeout_s: float | None = None,
    stop: object | None = None,
    not_ready: Callable[[], None] | None = None,
) -> bool:
    """Polls every ``data_sleep_second`` until the pass is ready (True) or ``timeout_s`` has
    passed (False: the last poll at the deadline, however long the sleep between polls).

    Args:
        stop: optional ``threading.Event``; when set, returns False at the next poll.
        not_ready: called after every poll that found the pass not ready (who waits can say so).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not pass_ready(data_root, spec, donefile):
        if not_ready is not None:
            not_ready()
        if stop is not None and stop.is_set():  # type: ignore[attr-defined]
            return False
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return False
        nap = data_sleep_second if deadline is None else min(data_sleep_second, deadline - now)
        time.sleep(nap)
    return True


def checkpoint_dir(model_root: str | Path, day: str, pass_id: int) -> Path:
    return Path(model_root) / day / str(pass_id)


def base_dir(model_root: str | Path, day: str) -> Path:
    return Path(model_root) / day / "base"


def delta_dir(model_root: str | Path, day: str, pass_id: int) -> Path:
    return Path(model_root) / day / f"delta_{pass_id}"


def batch_dir(model_root: str | Path, day: str) -> Path:
    return Path(model_root) / day / "batch"


def complete_checkpoints(model_root: str | Path) -> list[tuple[str, int, Path]]:
    """(day, pass_id, dir) of every checkpoint whose manifest exists, oldest first.

    A checkpoint without its manifest was interrupted and is never taken for a good one.
    """
    root = Path(model_root)
    found: list[tuple[str, int, Path]] = []
    if not root.is_dir():
        return found
    for day_dir in root.iterdir():
        if not (day_dir.is_dir() and len(day_dir.name) == 8 and day_dir.name.isdigit()):
            continue
        for pass_dir in day_dir.iterdir():
            if pass_dir.name.isdigit() and (pass_dir / MANIFEST_NAME).is_file():
                found.append((day_dir.name, int(pass_dir.name), pass_dir))
    return sorted(found)


def newest_checkpoint(model_root: str | Path) -> tuple[str, int, Path] | None:
    found = complete_checkpoints(model_root)
    return found[-1] if found else None
