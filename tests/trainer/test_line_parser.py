"""The compiled line parser (``parse_chunk``) against the numpy reference parser.

Every field of the Batch must be equal (torch.equal) and the ParseStats the same, on lines
with the real files' quirks and on random lines built from such tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from streamrec.trainer import _C
from streamrec.trainer.data.batches import MAX_LINE_BYTES, Batch, ParseStats
from streamrec.trainer.data.reader import NUM_DENSE, _parse_chunk_numpy, parse_chunk

S_GEN = 3  # slots of the generated lines here (Criteo lines have 26)


def assert_same(
    text: bytes, data_format: str, num_slots: int, max_line_bytes: int = MAX_LINE_BYTES
) -> tuple[Batch, ParseStats]:
    """parse_chunk(text) == _parse_chunk_numpy(text), field for field; returns the former."""
    got, stats = parse_chunk(text, data_format, num_slots, "part-3", 10, max_line_bytes)
    want, want_stats = _parse_chunk_numpy(
        text, data_format, num_slots, "part-3", 10, max_line_bytes
    )
    assert (stats.lines, stats.malformed, stats.first_bad) == (
        want_stats.lines,
        want_stats.malformed,
        want_stats.first_bad,
    ), text
    for name in ("dense", "labels", "keys", "present", "ptrue"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), (name, text)
        if a is not None:
            assert a.dtype == b.dtype and a.is_contiguous(), name
            assert torch.equal(a, b), (name, text)
    return got, stats


def criteo_line(label: str = "1", ints: list[str] | None = None, keys: list[str] | None = None):
    ints = ints if ints is not None else [str(i) for i in range(NUM_DENSE)]
    keys = keys if keys is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *ints, *keys]).encode("latin-1") + b"\n"


def gen_line(label="1", p="0.5", ints=None, keys=None) -> bytes:
    ints = ints if ints is not None else ["3"] * NUM_DENSE
    keys = keys if keys is not None else ["7", "8", "9"]
    return "\t".join([label, p, *ints, *keys]).encode("latin-1") + b"\n"


def with_int(value: str, j: int = 4) -> list[str]:
    ints = ["5"] * NUM_DENSE
    ints[j] = value
    return ints


def with_key(value: str, j: int = 25, n: int = 26) -> list[str]:
    keys = ["a1b2c3d4"] * n
    keys[j] = value
    return keys


INT_TOKENS = [
    "",
    "0",
    "-0",
    "-1",
    "-",
    "--1",
    "+1",
    " 1",
    "1 ",
    "1e3",
    "0x10",
    "1.5",
    "16777217",  # 2**24 + 1: rounds in float32
    "9223372036854775807",  # 19 digits, 2**63 - 1
    "9223372036854775808",  # 2**63: not an int64
    "9999999999999999999",  # 19 digits, < 2**64
    "18446744073709551616",  # 20 digits, 2**64
    "-922337203685477580",  # 19 bytes with the sign
    "-9223372036854775807",  # 20 bytes with the sign
    "0000000000000000001",
    "00000000000000000001",
    "\x00",
    "1\x00",
    "\r",
    "1\r",
]
HEX_TOKENS = [
    "",
    "0",
    "ffffffffffffffff",  # 16 digits: -1 as int64
    "FFFFFFFFFFFFFFFF",
    "8000000000000000",
    "1ffffffffffffffff",  # 17 digits
    "0000000000000000a",
    "AbCdEf09",
    "g1",
    "-1",
    "+1",
    " 1",
    "0x1f",
    "\xff",
    "\x00",
    "12\r",
]
PROB_TOKENS = [
    "",
    "0",
    "1",
    "1.",
    ".5",
    ".",
    "..",
    "1.2.3",
    "0.25",
    "1.0",
    "1.0000001",
    "1.000000000000000000",  # 20 bytes
    "0.99999999999999999",  # 19 bytes
    ".000000000000000001",  # 19 bytes, 18 digits after the dot
    "0.000000000000000001",  # 20 bytes
    "1e-1",
    "+0.5",
    "-0",
    " 0.5",
    "nan",
    "inf",
    "2",
]
LABEL_TOKENS = ["0", "1", "-0", "00", "-1", "2", "", " 1", "1 ", "+1", "01", "1.0", "\x00"]


@pytest.mark.parametrize("token", INT_TOKENS)
def test_integer_fields(token):
    lines = [criteo_line(ints=with_int(token)), criteo_line(ints=with_int(token, 12))]
    lines.append(criteo_line(ints=with_int(token, 0), keys=with_key("")))
    lines.append(gen_line(ints=with_int(token)))
    assert_same(b"".join(lines[:3]), "criteo", 26)
    assert_same(lines[3], "generated", S_GEN)
    assert_same(gen_line(keys=["1", token, "2"]), "generated", S_GEN)  # an int key
    assert_same(gen_line(keys=["1", "2", token]), "generated", S_GEN)


@pytest.mark.parametrize("token", HEX_TOKENS)
def test_hex_keys(token):
    text = b"".join(criteo_line(keys=with_key(token, j)) for j in (0, 11, 25))
    assert_same(text, "criteo", 26)


@pytest.mark.parametrize("token", PROB_TOKENS)
def test_p_true(token):
    assert_same(gen_line(p=token), "generated", S_GEN)


@pytest.mark.parametrize("token", LABEL_TOKENS)
def test_labels(token):
    assert_same(criteo_line(label=token), "criteo", 26)
    assert_same(gen_line(label=token), "generated", S_GEN)


def test_values_where_good():
    text = criteo_line(
        label="-0",
        ints=with_int("-9", 0)[:-1] + ["9223372036854775807"],
        keys=with_key("FFFFFFFFFFFFFFFF", 0)[:-1] + [""],
    )
    batch, stats = assert_same(text, "criteo", 26)
    assert stats.malformed == 0 and batch.labels.tolist() == [0.0]
    assert batch.dense[0, 0].item() == 0.0  # negative -> 0
    assert batch.keys[0, 0].item() == -1 and batch.keys[0, 1].item() == 0xA1B2C3D4
    assert batch.present is not None and batch.present[0].tolist() == [True] * 25 + [False]
    batch, _ = assert_same(gen_line(p="1.") + gen_line(p=".25"), "generated", S_GEN)
    assert batch.ptrue.tolist() == [1.0, 0.25]


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"\n",
        b"\r\n\n\r\n",
        b"\r",
        b"\r\r\n",
        b"\t\n",
        b"1\n",
        criteo_line(),
        criteo_line()[:-1],  # no final newline
        criteo_line()[:-1] + b"\r",  # no final newline, a CR
        criteo_line()[:-1] + b"\r\n",
        criteo_line()[:-1] + b"\r\r\n",  # one CR stripped, the other is a bad byte
        criteo_line()[:-1] + b"\t\n",  # a trailing tab: 41 fields
        criteo_line()[:-1] + b"\t\r\n",
        criteo_line(keys=with_key("")[:-1]),  # 39 fields
        criteo_line(keys=with_key("")[:-1]) + b"\r\n",
        b"\n\n" + criteo_line() + b"\n" + b"1\t2\n" + criteo_line(label="3") + b"\r\n",
        criteo_line(label="3") + b"\n1\t2\n",  # a bad value before a bad field count
        b"1\t2\n" + criteo_line(label="3"),
        criteo_line().replace(b"\t", b"\t\t", 1),
        criteo_line() * 3 + b"\x00\xff\n" + criteo_line(),
        criteo_line().replace(b"\n", b"\x00\n"),
        b"\xff" * 100,
    ],
)
def test_line_structure(text):
    assert_same(text, "criteo", 26)


def test_first_bad_line_numbers_count_blank_lines():
    text = b"\n\r\n" + criteo_line() + b"\n" + criteo_line(label="x") + b"1\t2\n"
    _, stats = assert_same(text, "criteo", 26)
    assert stats.lines == 3 and stats.malformed == 2
    assert stats.first_bad == (
        "part-3",
        14,
        "bad label (not 0/1) or a field that is not a number of its column's kind",
    )
    _, stats = assert_same(b"1\t2\n\n" + criteo_line(label="x"), "criteo", 26)
    assert stats.first_bad == ("part-3", 10, "expected 40 tab-separated fields")


def test_no_lines_at_all():
    for text in (b"", b"\n\n", b"1\t2\n"):
        batch, _ = assert_same(text, "generated", S_GEN)
        assert tuple(batch.keys.shape) == (0, S_GEN) and batch.present is None
        assert batch.ptrue is not None and batch.ptrue.shape == (0,)


def test_zero_slots():
    assert_same(gen_line(keys=[]) * 2 + gen_line(keys=["1"]), "generated", 0)


def test_dense_is_numpys_log1p():
    """Every float32 rounding of the integers and numpy's own log1p (which is not the C
    library's log1pf on every CPU: a SIMD one, different in the last bit for some inputs)."""
    rng = np.random.default_rng(5)
    values = np.concatenate(
        [np.arange(-5, 5000), rng.integers(0, 2**31, 2000), rng.integers(0, 2**63 - 1, 2000)]
    )
    values = np.concatenate([values, np.zeros(-values.size % NUM_DENSE, np.int64)])
    rows = values.reshape(-1, NUM_DENSE)
    text = b"".join(gen_line(ints=[str(v) for v in row]) for row in rows)
    batch, stats = assert_same(text, "generated", S_GEN)
    assert stats.malformed == 0
    want = np.log1p(np.maximum(rows, 0).astype(np.float32))
    assert np.array_equal(batch.dense.numpy(), want)


def _random_text(rng: np.random.Generator, gen: bool, num_slots: int, lines: int) -> bytes:
    """Lines of random good fields of each column's kind, some with a quirky token, a field
    too many or too few, CRLF, blank lines, and the last one without its newline."""
    kinds = ["label"] + (["prob"] if gen else []) + ["int"] * NUM_DENSE
    kinds += ["int" if gen else "hex"] * num_slots
    quirks = {"label": LABEL_TOKENS, "prob": PROB_TOKENS, "int": INT_TOKENS, "hex": HEX_TOKENS}
    pool = LABEL_TOKENS + PROB_TOKENS + INT_TOKENS + HEX_TOKENS

    def good(kind: str) -> str:
        if kind == "label":
            return str(rng.integers(0, 2))
        if kind == "prob":
            return f"{rng.random():.{rng.integers(0, 8)}f}"
        if rng.random() < 0.1:
            return ""
        if kind == "hex":
            digits = "".join(rng.choice(list("0123456789abcdefABCDEF"), rng.integers(1, 17)))
            return digits
        return str(int(rng.integers(-(10 ** rng.integers(1, 19)), 10 ** rng.integers(1, 19))))

    out = []
    for _ in range(lines):
        fields = [good(k) for k in kinds]
        r = rng.random()
        if r < 0.3:
            for _ in range(rng.integers(1, 3)):
                j = int(rng.integers(0, len(fields)))
                own = quirks[kinds[j]]
                fields[j] = (
                    own[rng.integers(len(own))]
                    if rng.random() < 0.8
                    else pool[rng.integers(len(pool))]
                )
        elif r < 0.35:
            fields = fields[:-1]
        elif r < 0.4:
            fields.append(good(kinds[-1]))
        end = ["\n", "\r\n", "\n\n", "\n\r\n"][rng.choice(4, p=[0.85, 0.1, 0.03, 0.02])]
        out.append("\t".join(fields) + end)
    text = "".join(out).encode("latin-1")
    return text.rstrip(b"\r\n") if rng.random() < 0.5 else text


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("data_format", ["criteo", "generated"])
def test_random_lines(seed, data_format):
    rng = np.random.default_rng(seed)
    gen = data_format == "generated"
    num_slots = 26 if not gen else int(rng.integers(1, 6))
    text = _random_text(rng, gen, num_slots, 2000)
    batch, stats = assert_same(text, data_format, num_slots)
    assert 0.5 * stats.lines < len(batch) < stats.lines  # both kinds of lines are there
    for cut in rng.integers(0, len(text), 5):  # any piece of whole lines, or a line cut short
        assert_same(text[:cut], data_format, num_slots)
        assert_same(text[cut:], data_format, num_slots)


@pytest.mark.parametrize("data_format", ["criteo", "generated"])
def test_random_lines_over_a_line_limit(data_format):
    """A line longer than the limit (before its newline, a CR counted) is malformed whatever
    it holds, named for its length when it is the chunk's first bad line."""
    rng = np.random.default_rng(11)
    gen = data_format == "generated"
    num_slots = 26 if not gen else 3
    text = _random_text(rng, gen, num_slots, 500)
    lengths = [len(x.rstrip(b"\r")) for x in text.split(b"\n")]
    for limit in (0, *np.quantile([n for n in lengths if n], [0.1, 0.5, 0.9]).astype(int)):
        batch, stats = assert_same(text, data_format, num_slots, int(limit))
        assert len(batch) <= sum(0 < n <= limit for n in lengths)
    _, stats = assert_same(text, data_format, num_slots, 0)
    assert stats.malformed == stats.lines and stats.first_bad is not None
    assert stats.first_bad[2] == "line longer than max_line_bytes (0 bytes); skipped"


def test_any_contiguous_buffer_is_read_in_place():
    text = criteo_line() + criteo_line(label="0")
    want, _ = parse_chunk(text, "criteo", 26)
    for data in (bytearray(text), memoryview(text), np.frombuffer(text, np.uint8)):
        got, stats = parse_chunk(data, "criteo", 26)
        assert stats.lines == 2 and torch.equal(got.keys, want.keys)
    with pytest.raises(BufferError):
        parse_chunk(memoryview(text)[::2], "criteo", 26)
    with pytest.raises(TypeError):
        parse_chunk("text", "criteo", 26)  # type: ignore[arg-type]


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_slots"):
        _C.parse_lines(b"", False, -1)
    with pytest.raises(ValueError, match="max_line_bytes must be >= 0, got -2"):
        _C.parse_lines(b"", False, 3, -2)
    with pytest.raises(ValueError, match="data_format"):
        parse_chunk(b"", "tsv", 26)


def test_every_byte_at_every_position_of_a_field():
    """The digits are read 8 bytes at a time: each byte value, at each of a field's first
    9 positions, in an int, a hex key and p_true, reads as in numpy."""
    criteo, gen = [], []
    for byte in range(256):
        for at in range(9):
            field = "1" * at + chr(byte) + "2" * (8 - at)
            criteo.append(criteo_line(ints=with_int(field), keys=with_key(field.replace("2", "e"))))
            gen.append(gen_line(p="0." + field[:9], keys=["1", field, "2"]))
    assert_same(b"".join(criteo), "criteo", 26)
    assert_same(b"".join(gen), "generated", S_GEN)
