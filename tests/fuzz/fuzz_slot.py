"""atheris target: the slot text parsers of :mod:`streamrec.trainer.data.feature_data`.

An input picks a schema (0 to 3 dense features, 1 to 3 sparse ones), then either raw bytes
or lines of fuzzed tokens (``name:value`` of the schema's names and others, numbers, string
ids, bare names, ':' alone, CR, tabs, NUL), and goes through both the compiled parser
(``parse_slot_chunk``: ``streamrec.trainer._C.parse_slot``) and the numpy reference
(``_parse_slot_chunk_numpy``), which must agree field for field, then through the file
reader with tiny chunks and a tiny line limit. Malformed lines are counted, never raised:
any exception is a crash, but DataError from text that starts as gzip does. (atheris
instruments the Python code only: coverage guidance sees the reference parser's branches,
not the C++ ones.)

    .venv/bin/python tests/fuzz/fuzz_slot.py -max_total_time=30 -rss_limit_mb=2048
"""

from __future__ import annotations

import os
import sys
import tempfile

import atheris
import torch
from streamrec.control.feature_schema import FeatureSchema

with atheris.instrument_imports(
    include=["streamrec.trainer.data.feature_data", "streamrec.trainer.data.batches"]
):
    from streamrec.trainer.data import feature_data
from streamrec.trainer.data.batches import Batch, ParseStats
from streamrec.trainer.data.reader import GZIP_MAGIC, read_file
from streamrec.trainer.errors import DataError

NAMES = ["y", "d0", "d1", "d2", "s0", "s1", "s2", "other", "Y", "s", ""]
VALUES = [b"0", b"1", b"-1", b"-0", b"0.5", b"-.5", b".", b"-", b"5.", b"1e3", b"nan", b"x"]
VALUES += [b"+1.5e-7", b"1E+39", b"-inf", b"Infinity", b"1e", b"-NaN", b"1e-400", b"1e309"]
VALUES += [b"sku-9", b"a:b", b"9223372036854775807", b"9223372036854775808", b"\xff\x00"]
VALUES += [b"-922337203685477580", b"99999999999999999999", b"1.2.3", b""]
SEPS = [b" ", b" ", b"\t", b"\r", b"  "]
ENDS = [b"\n", b"\r\n", b"\n\n", b""]
_FILE = os.path.join(tempfile.mkdtemp(prefix="fuzz_slot_"), "part-00000")


def _lines(fdp: atheris.FuzzedDataProvider) -> bytes:
    out = []
    for _ in range(fdp.ConsumeIntInRange(0, 8)):
        tokens = []
        for _ in range(fdp.ConsumeIntInRange(0, 10)):
            name = NAMES[fdp.ConsumeIntInRange(0, len(NAMES) - 1)].encode()
            value = VALUES[fdp.ConsumeIntInRange(0, len(VALUES) - 1)]
            how = fdp.ConsumeIntInRange(0, 7)
            token = name if how == 0 else fdp.ConsumeBytes(3) if how == 1 else name + b":" + value
            tokens.append(token + SEPS[fdp.ConsumeIntInRange(0, len(SEPS) - 1)])
        out.append(b"".join(tokens) + ENDS[fdp.ConsumeIntInRange(0, len(ENDS) - 1)])
    return b"".join(out)


def test_one_input(raw: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(raw)
    schema = FeatureSchema(
        label="y",
        dense=[f"d{i}" for i in range(fdp.ConsumeIntInRange(0, 3))],
        sparse=[{"name": f"s{i}"} for i in range(fdp.ConsumeIntInRange(1, 3))],
    )
    how = fdp.ConsumeIntInRange(0, 3)
    text = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 2048)) if how == 0 else _lines(fdp)
    batch, stats = feature_data.parse_slot_chunk(text, schema)
    assert 0 <= stats.malformed <= stats.lines and len(batch) == stats.lines - stats.malformed
    assert (stats.first_bad is None) == (stats.malformed == 0), stats
    exact, exact_stats = feature_data._parse_slot_chunk_numpy(text, schema)
    assert (stats.lines, stats.malformed, stats.first_bad) == (
        exact_stats.lines,
        exact_stats.malformed,
        exact_stats.first_bad,
    ), (stats, exact_stats)
    # bit for bit: -0.0 is not 0.0 here
    assert torch.equal(batch.labels.view(torch.int32), exact.labels.view(torch.int32))
    assert torch.equal(batch.dense.view(torch.int32), exact.dense.view(torch.int32))
    assert batch.bags is not None and exact.bags is not None
    for a, b in zip(batch.bags, exact.bags, strict=True):
        assert torch.equal(a.values(), b.values()) and torch.equal(a.offsets(), b.offsets())

    with open(_FILE, "wb") as f:
        f.write(text)
    total = ParseStats()

    def parse(chunk: bytes, source: str, line: int, limit: int) -> tuple[Batch, ParseStats]:
        return feature_data.parse_slot_chunk(chunk, schema, source, line, limit)

    try:
        for chunk, chunk_stats in read_file(_FILE, "slot", 0, 64, max_line_bytes=256, parse=parse):
            assert len(chunk) == chunk_stats.lines - chunk_stats.malformed
            total.add(chunk_stats)
    except DataError:  # text starting as gzip does is read as gzip: not valid gzip here
        assert text[:2] == GZIP_MAGIC, text[:16]
        return
    # a line is counted once whether parsed whole or dropped as overlong
    assert total.lines <= text.count(b"\n") + 1


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
