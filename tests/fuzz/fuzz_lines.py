"""atheris target: the Criteo and generated line parsers of :mod:`streamrec.trainer.data.reader`.

An input picks the format and the slot count, then either raw bytes or lines of fuzzed
tab-separated tokens (numbers, hex, signs, dots, CR, NUL, empty fields), and goes through
both the chunk parser (``parse_chunk``: the compiled parser, ``streamrec.trainer._C``) and
the file reader (``read_file`` with tiny chunks and a tiny line limit, so chunk boundaries,
overlong lines and gzip framing are all reached). Malformed lines are counted, never raised:
any exception is a crash, except ``DataError`` from a gzip file that is not valid gzip. Every
result is checked: counts add up, labels are 0/1, features are finite, p_true in [0, 1], and
the compiled parser gives exactly what the numpy reference parser (``_parse_chunk_numpy``)
gives. (atheris instruments the Python code only: coverage guidance sees the reference
parser's branches and the reader's, not the C++ ones.)

    .venv/bin/python tests/fuzz/fuzz_lines.py -max_total_time=30 -rss_limit_mb=2048
"""

from __future__ import annotations

import gzip
import os
import sys
import tempfile

import atheris
import torch

with atheris.instrument_imports(
    include=["streamrec.trainer.data.reader", "streamrec.trainer.data.batches"]
):
    from streamrec.trainer.data import batches
    from streamrec.trainer.data import reader as data
from streamrec.trainer.errors import DataError

TOKENS = [
    b"",
    b"0",
    b"1",
    b"-",
    b"-1",
    b"2",
    b"12",
    b"3.5",
    b"0.25",
    b"1.",
    b".",
    b"1.2.3",
    b"ff",
    b"FF",
    b"abc",
    b"-0",
    b"+1",
    b"1e3",
    b"nan",
    b"inf",
    b" 1",
    b"\r",
    b"\x00",
    b"99999999999999999999",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-922337203685477580",
    b"ffffffffffffffff",
    b".5",
    b"1.0000001",
    b"ffffffffffffffffff",
    b"\xff\xfe",
    b'"1"',
]
_FILE = os.path.join(tempfile.mkdtemp(prefix="fuzz_lines_"), "part-00000")


def _lines(fdp: atheris.FuzzedDataProvider, ncols: int) -> bytes:
    out = []
    for _ in range(fdp.ConsumeIntInRange(0, 8)):
        n = ncols + fdp.ConsumeIntInRange(-2, 1) if fdp.ConsumeIntInRange(0, 3) == 0 else ncols
        fields = [
            TOKENS[fdp.ConsumeIntInRange(0, len(TOKENS) - 1)]
            if fdp.ConsumeIntInRange(0, 7)
            else fdp.ConsumeBytes(4)
            for _ in range(max(n, 0))
        ]
        end = [b"\n", b"\r\n", b"\n\n", b""][fdp.ConsumeIntInRange(0, 3)]
        out.append(b"\t".join(fields) + end)
    return b"".join(out)


def _check(batch: batches.Batch, stats: batches.ParseStats, num_slots: int, gen: bool) -> None:
    assert 0 <= stats.malformed <= stats.lines, (stats.malformed, stats.lines)
    assert len(batch) == stats.lines - stats.malformed, (len(batch), stats)
    assert (stats.first_bad is None) == (stats.malformed == 0), stats
    assert tuple(batch.keys.shape) == (len(batch), num_slots)
    assert tuple(batch.dense.shape) == (len(batch), data.NUM_DENSE)
    assert bool(((batch.labels == 0) | (batch.labels == 1)).all())
    assert bool(batch.dense.isfinite().all()) and bool((batch.dense >= 0).all())
    if gen:
        assert batch.ptrue is not None
        assert bool(((batch.ptrue >= 0) & (batch.ptrue <= 1)).all()), batch.ptrue


def test_one_input(raw: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(raw)
    gen = fdp.ConsumeBool()
    fmt = "generated" if gen else "criteo"
    num_slots = fdp.ConsumeIntInRange(1, 4) if gen else data.CRITEO_SLOTS
    ncols = (2 if gen else 1) + data.NUM_DENSE + num_slots
    how = fdp.ConsumeIntInRange(0, 3)
    text = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096)) if how == 0 else _lines(fdp, ncols)
    batch, stats = data.parse_chunk(text, fmt, num_slots)
    _check(batch, stats, num_slots, gen)
    # the compiled parser and the numpy reference read every line the same
    exact, exact_stats = data._parse_chunk_numpy(text, fmt, num_slots)
    assert (stats.lines, stats.malformed, stats.first_bad) == (
        exact_stats.lines,
        exact_stats.malformed,
        exact_stats.first_bad,
    ), (stats, exact_stats)
    for name in ("labels", "dense", "keys", "ptrue"):
        a, b = getattr(batch, name), getattr(exact, name)
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), name
    a, b = batch.present, exact.present
    if a is not None or b is not None:
        full = torch.ones_like(batch.keys, dtype=torch.bool)
        assert torch.equal(full if a is None else a, full if b is None else b), "present"

    compress = how == 3
    with open(_FILE, "wb") as f:
        f.write(gzip.compress(text) if compress else text)
    total = batches.ParseStats()
    try:
        for batch, chunk_stats in data.read_file(_FILE, fmt, num_slots, 64, max_line_bytes=256):
            _check(batch, chunk_stats, num_slots, gen)
            total.add(chunk_stats)
    except DataError:
        assert text[:2] == data.GZIP_MAGIC and not compress, text[:16]
        return
    # a line is counted once whether parsed whole or dropped as overlong
    assert total.lines <= text.count(b"\n") + 1


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
