"""Lays real Criteo files into the streaming layout (``streamrec-datagen --from-criteo``).

Criteo's Kaggle ``train.txt`` and Terabyte ``day_0`` .. ``day_23`` (plain or gzip) hold one
sample a line: label, I1..I13, C1..C26, tab separated. Read in order as one stream, their
lines are dealt out ``samples_per_split`` at a time to consecutive splits of the layout of
:mod:`streamrec.layout`, the same files and donefiles as the planted stream's writer::

    lines 0 .. N-1     -> out/20190720/0000/part-00000 .. part-{K-1}, then to.hadoop.done
    lines N .. 2N-1    -> out/20190720/0005/...              (split_interval 5)
    ...                   after 1440 / split_interval splits, the next day

Lines are copied byte for byte (CRLF, empty fields, trailing tabs, short lines stay as they
are: the trainer's parser decides what a line is worth). A split's lines go to its K part
files in contiguous blocks (``numpy.linspace`` bounds, as the planted stream's writer), so a
part is one slice of the input. The one change: a file's last line without a newline gets
one (``\\n``), so that it stays a line of its own when the next file follows.

Memory stays within about ``9 x block_bytes`` whatever the files' size: a block is read,
its newlines located (numpy, 8 bytes each), and its slices written, one block at a time.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
from streamrec.datagen.split_files import mark_split_done, open_part, split_at
from streamrec.layout import parse_day, split_names
from streamrec.trainer.data.reader import open_data_file
from streamrec.trainer.errors import DataError

#: Bytes read from an input file at a time (the memory bound's unit).
DEFAULT_BLOCK_BYTES = 1 << 20


class LineReader:
    """Whole lines of several files read in order as one stream, handed out ``n`` at a time
    as slices of bounded blocks (never a whole line buffered: a line may exceed a block).

    A gzip file is decompressed as it is read, recognised by its magic bytes whatever its
    name (:func:`streamrec.trainer.data.reader.open_data_file`).

    Example::

        with LineReader([Path("day_0.gz"), Path("day_1")]) as r:
            for piece in r.take(1000):  # the next 1000 lines, in one or more slices
                out.write(piece)
    """

    def __init__(self, paths: Sequence[Path], block_bytes: int = DEFAULT_BLOCK_BYTES) -> None:
        if block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
        self.block_bytes = block_bytes
        self.lines = 0  # lines handed out so far
        self._paths = iter(paths)
        self._path: Path | None = None
        self._file: io.BufferedIOBase | None = None
        self._last_byte = b"\n"  # of the file being read: b"\n" when its last line is ended
        self._block = b""
        self._newlines = np.zeros(0, dtype=np.int64)  # (m,) int64 positions in _block
        self._pos = 0  # next unread byte of _block
        self._next_nl = 0  # index in _newlines of the first newline at or after _pos

    def _set_block(self, block: bytes) -> None:
        self._block = block
        self._newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == ord("\n"))
        self._pos = self._next_nl = 0

    def _read(self) -> bytes:
        assert self._file is not None and self._path is not None
        try:
            return self._file.read(self.block_bytes)
        except (OSError, EOFError, zlib.error) as exc:
            # gzip: BadGzipFile (an OSError), EOFError when cut short, zlib.error when corrupt
            raise DataError(
                f"cannot read Criteo file {self._path}: {type(exc).__name__}: {exc}"
            ) from exc

    def _fill(self) -> bool:
        """Makes sure unread bytes are at hand; False once every file is read."""
        while self._pos >= len(self._block):
            if self._file is None:
                path = next(self._paths, None)
                if path is None:
                    return False
                self._path, self._last_byte = path, b"\n"
                try:
                    self._file = open_data_file(path)
                except OSError as exc:
                    raise DataError(f"cannot open Criteo file {path}: {exc}") from exc
            block = self._read()
            if block:
                self._last_byte = block[-1:]
                self._set_block(block)
                continue
            self.close()
            if self._last_byte != b"\n":
                self._set_block(b"\n")  # ends the file's last line before the next file
        return True

    def exhausted(self) -> bool:
        """True when no byte is left in any file (reads ahead to know)."""
        return not self._fill()

    def take(self, n: int) -> Iterator[memoryview]:
        """The next ``n`` lines (fewer at the end of the stream) as consecutive slices."""
        while n > 0 and self._fill():
            ahead = len(self._newlines) - self._next_nl
            if n <= ahead:
                end = int(self._newlines[self._next_nl + n - 1]) + 1
                self._next_nl += n
                done = n
            else:  # the block ends inside the part: hand it all out, go on in the next one
                end = len(self._block)
                self._next_nl = len(self._newlines)
                done = ahead
            piece = memoryview(self._block)[self._pos : end]
            self._pos = end
            n -= done
            self.lines += done
            yield piece

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> LineReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def lay_out_criteo(
    inputs: Sequence[str | Path],
    out: str | Path,
    start_day: str,
    split_interval: int,
    samples_per_split: int,
    files_per_split: int = 1,
    donefile: str | None = "to.hadoop.done",
    max_splits: int | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> dict[str, int | str]:
    """Writes the lines of ``inputs`` (in order) as consecutive splits under ``out``.

    Every split but the stream's last holds ``samples_per_split`` lines; the last holds the
    lines left (its later part files may be empty: every split has ``files_per_split``).
    A split's donefile is written after its files. ``max_splits`` stops after that many.

    Returns:
        counts: splits, lines, start_day, end_day (the last split's day), last_split (HHMM),
        last_split_lines.

    Raises:
        ValueError: a bad argument or a missing input.
        FileExistsError: a split directory already holds files (its part files would mix
            with the old ones); checked before each split is written.
        DataError: the inputs hold no line, or one cannot be read (a corrupt gzip file); the
            splits written before stay complete.
    """
    paths = [Path(p) for p in inputs]
    if not paths:
        raise ValueError("no Criteo file given")
    for p in paths:
        if not p.is_file():
            raise ValueError(f"no such Criteo file: {p}")
    split_names(split_interval)
    parse_day(start_day)
    for name, value in (
        ("samples_per_split", samples_per_split),
        ("files_per_split", files_per_split),
        ("max_splits", 1 if max_splits is None else max_splits),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    bounds = np.linspace(0, samples_per_split, files_per_split + 1).astype(int)
    quotas = [int(b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    root = Path(out)
    splits = 0
    day = split = ""
    split_lines = 0
    with LineReader(paths, block_bytes) as reader:
        while (max_splits is None or splits < max_splits) and not reader.exhausted():
            day, split = split_at(start_day, split_interval, splits)
            split_dir = root / day / split
            if split_dir.is_dir() and any(split_dir.iterdir()):
                raise FileExistsError(
                    f"{split_dir} already holds files: lay Criteo files out into an empty directory"
                )
            split_dir.mkdir(parents=True, exist_ok=True)
            before = reader.lines
            for i, quota in enumerate(quotas):
                with open_part(split_dir, i) as f:
                    for piece in reader.take(quota):
                        f.write(piece)
            mark_split_done(split_dir, donefile)
            split_lines = reader.lines - before
            splits += 1
        if splits == 0:
            raise DataError(f"no lines in the Criteo files {', '.join(map(str, paths))}")
        return {
            "splits": splits,
            "lines": reader.lines,
            "start_day": start_day,
            "end_day": day,
            "last_split": split,
            "last_split_lines": split_lines,
        }
