"""Data files a split may hold, each read as services/trainer/README.md ("Data files") says:
binary garbage, a 50 MB line, an empty file, CRLF endings, gzip (good, cut short, corrupt)
and a mix. Every case ends (no hang), in bounded memory, counted or refused by name."""

from __future__ import annotations

import gzip
import random
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import MAX_LINE_BYTES, iter_batches, read_file
from streamrec.trainer.errors import DataError

SLOTS = 2


def good_lines(n: int, seed: int = 0) -> bytes:
    """``n`` lines of the generated format (label, p_true, 13 ints, SLOTS keys)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ints = "\t".join(str(rng.randrange(0, 50)) for _ in range(13))
        keys = "\t".join(str(rng.randrange(0, 1 << 40)) for _ in range(SLOTS))
        out.append(f"{i % 2}\t0.{rng.randrange(10, 99)}\t{ints}\t{keys}\n")
    return "".join(out).encode()


def read_all(path: Path, **kw) -> tuple[list[torch.Tensor], ParseStats]:
    """The labels of every batch read from ``path`` and the summed counts."""
    total = ParseStats()
    labels = []
    for batch, stats in read_file(path, "generated", SLOTS, **kw):
        total.add(stats)
        labels.append(batch.labels)
    return labels, total


def samples(path: Path, **kw) -> tuple[int, ParseStats]:
    labels, stats = read_all(path, **kw)
    return sum(len(x) for x in labels), stats


def test_binary_garbage_is_counted_malformed_and_fails_the_file(tmp_path):
    path = tmp_path / "part-garbage"
    path.write_bytes(random.Random(1).randbytes(4 << 20))
    t0 = time.monotonic()
    n, stats = samples(path, chunk_bytes=1 << 20)
    assert time.monotonic() - t0 < 20
    assert n == 0 and stats.lines > 0 and stats.malformed == stats.lines
    assert stats.first_bad is not None and stats.first_bad[:2] == (str(path), 1)
    with pytest.raises(DataError, match=r"part-garbage line 1"):
        list(iter_batches([path], "generated", SLOTS, 64, ParseStats(), 0.01))


@pytest.mark.parametrize("tabs", [False, True])
def test_a_50_mb_line_is_one_malformed_line_in_bounded_memory(tmp_path, tabs):
    filler = (b"1\t" * (25 << 20)) if tabs else (b"x" * (50 << 20))
    path = tmp_path / "part-long"
    path.write_bytes(good_lines(3) + filler + b"\n" + good_lines(2, seed=9))
    tracemalloc.start()
    try:
        n, stats = samples(path, chunk_bytes=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 5 and stats.lines == 6 and stats.malformed == 1
    assert stats.first_bad == (
        str(path),
        4,
        f"line longer than max_line_bytes ({MAX_LINE_BYTES} bytes); skipped",
    )
    # the chunk, the line limit and the parse of one chunk; never the 50 MB line
    assert peak < 16 << 20, peak


def test_a_file_of_one_endless_line_ends_in_bounded_memory(tmp_path):
    path = tmp_path / "part-endless"
    path.write_bytes(b"\x00" * (50 << 20))  # no newline at all
    tracemalloc.start()
    try:
        n, stats = samples(path, chunk_bytes=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 0 and stats.lines == 1 and stats.malformed == 1
    assert stats.first_bad is not None and stats.first_bad[1] == 1
    assert peak < 16 << 20, peak


def test_an_empty_file_has_no_lines_and_is_no_error(tmp_path):
    path = tmp_path / "part-empty"
    path.write_bytes(b"")
    assert samples(path) == (0, ParseStats())
    stats = ParseStats()
    assert list(iter_batches([path], "generated", SLOTS, 64, stats, 0.0)) == []
    assert stats.lines == 0 and stats.files == [str(path)]


def test_crlf_lines_read_the_same_as_lf(tmp_path):
    text = good_lines(50)
    lf, crlf = tmp_path / "part-lf", tmp_path / "part-crlf"
    lf.write_bytes(text)
    crlf.write_bytes(text.replace(b"\n", b"\r\n"))
    for chunk in (1 << 20, 300):  # also with a CR and its LF in different chunks
        a = list(read_file(lf, "generated", SLOTS, chunk))
        b = list(read_file(crlf, "generated", SLOTS, chunk))
        assert sum(s.malformed for _, s in b) == 0
        for field in ("labels", "dense", "keys", "ptrue"):
            got = torch.cat([getattr(batch, field) for batch, _ in b])
            want = torch.cat([getattr(batch, field) for batch, _ in a])
            assert torch.equal(got, want), field


def test_gzip_is_read_by_its_magic_bytes_whatever_its_name(tmp_path):
    text = good_lines(200)
    plain, packed = tmp_path / "part-plain", tmp_path / "part-00001"  # no .gz suffix
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))
    for chunk in (1 << 20, 512):
        a = read_all(plain, chunk_bytes=chunk)
        b = read_all(packed, chunk_bytes=chunk)
        assert torch.equal(torch.cat(a[0]), torch.cat(b[0]))
        assert b[1].lines == 200 and b[1].malformed == 0


@pytest.mark.parametrize(
    "mangle,exc_name",
    [
        (lambda z: z[: len(z) // 2], "EOFError"),  # cut short
        (lambda z: z[:10] + bytes(len(z) - 10), "error"),  # body zeroed: corrupt deflate
        (lambda z: b"\x1f\x8b" + b"garbage after the magic", "BadGzipFile"),
    ],
)
def test_a_broken_gzip_file_is_a_data_error_naming_it(tmp_path, mangle, exc_name):
    path = tmp_path / "part-broken.gz"
    path.write_bytes(mangle(gzip.compress(good_lines(2000))))
    with pytest.raises(DataError, match=rf"cannot read data file {path}: \w*{exc_name}"):
        samples(path)


def test_a_split_with_every_kind_of_file(tmp_path):
    """One split, sorted as pass_files lists it: counts add up across the kinds."""
    files = {
        "part-0-good": good_lines(100),
        "part-1-crlf": good_lines(100, seed=1).replace(b"\n", b"\r\n"),
        "part-2-gzip": gzip.compress(good_lines(100, seed=2)),
        "part-3-empty": b"",
        "part-4-long": good_lines(1, seed=3) + b"9" * (MAX_LINE_BYTES + 1) + b"\n",
        "part-5-garbage": b"\xff\xfe\t\x00\n" * 10,
    }
    paths = []
    for name, body in files.items():
        (tmp_path / name).write_bytes(body)
        paths.append(tmp_path / name)
    stats = ParseStats()
    got = sum(len(b) for b in iter_batches(paths, "generated", SLOTS, 64, stats, 0.05))
    assert got == 301 and stats.lines == 312 and stats.malformed == 11
    assert stats.files == [str(p) for p in paths]
    assert stats.first_bad is not None and stats.first_bad[:2] == (str(paths[4]), 2)
    with pytest.raises(DataError, match="part-4-long line 2"):
        list(iter_batches(paths, "generated", SLOTS, 64, ParseStats(), 0.01))


def test_line_numbers_stay_exact_across_chunks_and_blank_lines(tmp_path):
    path = tmp_path / "part-blank"
    good = good_lines(80).split(b"\n")[:-1]
    lines = []
    for i, line in enumerate(good):
        lines += [line, b""] if i % 3 == 0 else [line]
    lines[70] = b"not a line"  # file line 71
    path.write_bytes(b"\n".join(lines) + b"\n")
    _, stats = read_all(path, chunk_bytes=200)
    assert stats.malformed == 1 and stats.first_bad is not None
    assert stats.first_bad[1] == 71
