"""The compiled slot text parser (``parse_slot_chunk``) against the numpy reference parser.

Every field of the Batch must be equal (floats bit for bit, each bag's keys and offsets) and
the ParseStats the same (the first bad line's reason too), on lines with slot text's quirks
(lists, empty bags, unknown names, a dense feature twice, tokens that are not ``name:value``,
string ids, CRLF, blank lines, long lines, lines over a limit, numbers in every float syntax,
nan, inf and values beyond float32) and on random lines built from such tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from streamrec.control.feature_schema import FeatureSchema
from streamrec.keyhash import string_key
from streamrec.trainer import _C
from streamrec.trainer.data.batches import MAX_LINE_BYTES, Batch, ParseStats
from streamrec.trainer.data.feature_data import _parse_slot_chunk_numpy, parse_slot_chunk
from streamrec.trainer.data.reader import iter_batches

SCHEMA = FeatureSchema(
    label="click",
    dense=["age", {"name": "price", "log1p": True}, "score"],
    sparse=[{"name": "user_id"}, {"name": "genres"}, {"name": "tag"}, {"name": "item.id"}],
)
#: No dense feature: a line needs only its label.
SPARSE_ONLY = FeatureSchema(label="y", sparse=[{"name": "u"}, {"name": "v"}])


def bits(t: torch.Tensor) -> torch.Tensor:
    """A float32 tensor's bit patterns (so -0.0 and 0.0 differ)."""
    assert t.dtype == torch.float32 and t.is_contiguous()
    return t.view(torch.int32)


def assert_same(
    text: bytes | bytearray | memoryview,
    schema: FeatureSchema = SCHEMA,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> tuple[Batch, ParseStats]:
    """parse_slot_chunk(text) == _parse_slot_chunk_numpy(text), field for field."""
    got, stats = parse_slot_chunk(text, schema, "part-7", 5, max_line_bytes)
    want, want_stats = _parse_slot_chunk_numpy(bytes(text), schema, "part-7", 5, max_line_bytes)
    assert (stats.lines, stats.malformed, stats.first_bad) == (
        want_stats.lines,
        want_stats.malformed,
        want_stats.first_bad,
    ), bytes(text)
    assert torch.equal(bits(got.labels), bits(want.labels)), bytes(text)
    assert got.dense.shape == want.dense.shape == (len(want), len(schema.dense))
    assert torch.equal(bits(got.dense), bits(want.dense)), bytes(text)
    assert got.bags is not None and want.bags is not None
    assert len(got.bags) == len(want.bags) == len(schema.sparse)
    for a, b in zip(got.bags, want.bags, strict=True):
        assert a.dtype == b.dtype == torch.int64
        assert torch.equal(a.values(), b.values()), bytes(text)
        assert torch.equal(a.offsets(), b.offsets()), bytes(text)
    return got, stats


def line(*tokens: str, end: str = "\n") -> bytes:
    return (" ".join(tokens) + end).encode("utf-8", "surrogateescape")


GOOD = ("click:1", "age:0.5", "price:2", "score:-1.25")


def test_a_clean_line_and_its_values():
    got, stats = assert_same(line(*GOOD, "user_id:17", "genres:5", "genres:9", "item.id:sku-53"))
    assert (stats.lines, stats.malformed, stats.first_bad) == (1, 0, None)
    assert got.labels.tolist() == [1.0]
    # age and score as they are (the model standardizes them), price its log1p (make_batch)
    assert got.dense.tolist() == [[0.5, float(np.log1p(np.float32(2))), -1.25]]
    assert [b.to_list() for b in got.bags] == [[[17]], [[5, 9]], [[]], [[string_key("sku-53")]]]


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"\n",
        b"\n\n\r\n \t \n",  # blank lines: no token
        line(*GOOD),  # every bag empty
        line(*GOOD, end=""),  # no final newline
        line(*GOOD, end="\r\n") * 3,
        line(*GOOD, end="\r\r\n"),
        line(*reversed(GOOD), "genres:1", "tag:2", "genres:3"),  # any order
        line(*GOOD, "other:7", "clic:1", "Click:1", "click2:1"),  # names the schema lacks
        line(*GOOD, "age:1"),  # a dense twice
        line(*GOOD, "click:1"),  # the label twice
        line(*GOOD[1:]),  # no label
        line(*GOOD[:3]),  # a dense missing
        line(*GOOD, "user_id"),  # no ':'
        line(*GOOD, "user_id:"),  # no value
        line(*GOOD, ":5"),  # no name
        line(*GOOD, ":"),
        line(*GOOD, "::"),
        line(*GOOD, "user_id::5"),  # a value holding ':': a string id
        line(*GOOD, "user_id:a:b", "tag:1:2"),
        line("click:1:2", *GOOD[1:]),  # a label that is no number
        line(*GOOD, "other:"),  # an unknown name without value: still malformed
        line(*GOOD, "other"),
        b"click:1\tage:0.5\rprice:2\t\tscore:3 \r user_id:1\n",  # tabs and lone CRs split
        b"click:1 age:0.5 price:2 score:3 user_id:\x00\xff\xfe tag:\xc3\xa9\n",  # raw bytes
        b"click:1 age:0.5 price:2 score:3 user_id:1\x0b2 tag:\x0c\n",  # \v, \f: no separator
        b"\n\nclick:0 age:1 price:1 score:1\nbad\n\nclick:1 age:1 price:1 score:1\n",
    ],
)
def test_quirks(text):
    assert_same(text)
    assert_same(bytearray(text))
    assert_same(memoryview(text))


NUMBERS = [
    "0",
    "-0",
    "1",
    "-1",
    "0.5",
    "-.5",
    ".5",
    "5.",
    ".",
    "-.",
    "-",
    "--1",
    "+1",
    "1e3",
    "nan",
    "inf",
    "1.2.3",
    "0x10",
    "16777217",  # 2**24 + 1: rounds in float32
    "0.1",
    "123456789.123456789",  # 19 bytes
    "-123456789.123456789",  # 19 after the sign
    "1234567890.123456789",  # 20 bytes
    "9999999999999999999",  # 19 digits, < 2**64
    "99999999999999999999",  # 20 digits
    ".000000000000000001",  # 10**-18
    "1.000000000000000001",
    "0000000000000000001",
    "3.4028236e38",
    "1.5e-7",
    "-2.5E+3",
    "+.5",
    "+-1",
    "1e",
    "1e+",
    "1.e5",
    ".e5",
    "e5",
    "NaN",
    "-nan",
    "nan(1)",
    "INF",
    "-Infinity",
    "infinit",
    "1e39",
    "-1e39",
    "1e309",
    "1e-400",
    "3.4028235677973366e38",  # float32's largest and the next power of 2: a tie, to inf
    "3.4028235677973365e38",
    "0.1000000000000000055511151231257827021181583404541015625",
    "1" * 128,
    "1" * 129,  # longer than a number may be
]
KEYS = [
    "0",
    "-0",
    "17",
    "-17",
    "007",
    "-",
    "--1",
    "+1",
    "1.5",
    "1e3",
    "sku-53",
    "9223372036854775807",  # 2**63 - 1
    "9223372036854775808",  # 2**63: a string id
    "-9223372036854775807",  # 20 bytes with the sign: a string id
    "-922337203685477580",  # 19 bytes with the sign
    "9999999999999999999",
    "18446744073709551616",
    "0000000000000000001",
    "12ab",
    "ab12",
    "\u00e9t\u00e9",
]


@pytest.mark.parametrize("value", NUMBERS)
def test_label_and_dense_values(value):
    assert_same(line(f"click:{value}", "age:1", "price:1", "score:1"))
    assert_same(line("click:1", f"age:{value}", f"price:{value}", "score:1"))
    assert_same(line(f"y:{value}", "u:1"), SPARSE_ONLY)


@pytest.mark.parametrize("value", KEYS)
def test_sparse_values(value):
    got, _ = assert_same(line(*GOOD, f"user_id:{value}", f"genres:{value}", f"genres:{value}"))
    assert len(got) == 1  # a sparse value never makes its line malformed


def test_no_dense_and_a_bad_line_first():
    text = b"u:1\ny:1 u:2 u:3 v:x\n\ny:0\nv:1 y:1 y:1\n"
    got, stats = assert_same(text, SPARSE_ONLY)
    assert (stats.lines, stats.malformed) == (4, 2)
    assert stats.first_bad == ("part-7", 5, stats.first_bad[2])  # line 0 of the chunk
    assert [b.to_list() for b in got.bags] == [[[2, 3], []], [[string_key("x")], []]]


def test_long_lines():
    big = [f"genres:{i}" for i in range(20_000)]
    text = line(*GOOD, *big, "user_id:x" * 5000) + line(*GOOD, "tag:" + "7" * 100_000)
    text += line(*GOOD, *big, "age:1") + line(*GOOD, "x" * 200_000)  # malformed, long
    got, stats = assert_same(text)
    assert (stats.lines, stats.malformed, len(got)) == (4, 2, 2)


NAMES = ["click", "age", "price", "score", "user_id", "genres", "tag", "item.id"]
NAMES += ["other", "clic", "click2", "Click", "", "item"]
SEPS = [" ", " ", " ", "  ", "\t", "\r", " \r "]
ENDS = ["\n", "\n", "\n", "\r\n", "\n\n", " \n", "\r\n\r\n"]


def random_line(rng: np.random.Generator) -> str:
    """A line likely good: the label and the dense ones once, some lists; then mangled."""
    tokens = [f"{n}:{rng.choice(NUMBERS[:8])}" for n in NAMES[:4]]
    for _ in range(rng.integers(0, 8)):
        tokens.append(f"{rng.choice(NAMES[4:8])}:{rng.choice(KEYS)}")
    for _ in range(rng.integers(0, 3) if rng.random() < 0.5 else 0):
        name, value = rng.choice(NAMES), rng.choice(NUMBERS + KEYS)
        tokens.append(str(rng.choice([f"{name}:{value}", name, f":{value}", f"{name}:"])))
    if rng.random() < 0.1:
        tokens.pop(int(rng.integers(len(tokens))))
    rng.shuffle(tokens)
    seps = rng.choice(SEPS, size=len(tokens))
    return "".join(f"{t}{s}" for t, s in zip(tokens, seps, strict=True)).rstrip(" ")


@pytest.mark.parametrize("seed", range(40))
def test_random_chunks(seed):
    rng = np.random.default_rng(seed)
    for _ in range(10):
        lines = [random_line(rng) + str(rng.choice(ENDS)) for _ in range(rng.integers(0, 40))]
        text = "".join(lines)
        if text and rng.random() < 0.3:
            text = text.rstrip("\r\n")  # no final newline
        assert_same(text.encode("utf-8", "surrogateescape"))


@pytest.mark.parametrize("seed", range(10))
def test_random_chunks_over_a_line_limit(seed):
    """Lines longer than the limit are malformed whatever they hold, the first one named."""
    rng = np.random.default_rng(2000 + seed)
    for _ in range(10):
        text = "".join(random_line(rng) + str(rng.choice(ENDS)) for _ in range(30))
        assert_same(text.encode("utf-8", "surrogateescape"), max_line_bytes=int(rng.integers(60)))


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes(seed):
    rng = np.random.default_rng(1000 + seed)
    alphabet = np.frombuffer(b"yuv:01-.x \t\r\n\n", dtype=np.uint8)
    for _ in range(20):
        text = rng.choice(alphabet, size=int(rng.integers(0, 300))).tobytes()
        assert_same(text, SPARSE_ONLY)


def test_through_the_file_reader(tmp_path):
    """Chunk boundaries: a file read in tiny chunks gives the rows a whole parse gives."""
    rng = np.random.default_rng(7)
    text = "".join(random_line(rng) + "\n" for _ in range(300)).encode()
    path = tmp_path / "part-00000"
    path.write_bytes(text)
    whole, whole_stats = assert_same(text)
    stats = ParseStats()
    got = Batch.concat(list(iter_batches([path], "slot", 0, 64, stats, 1.0, 512, SCHEMA)))
    assert (stats.lines, stats.malformed) == (whole_stats.lines, whole_stats.malformed)
    assert torch.equal(got.dense, whole.dense) and torch.equal(got.labels, whole.labels)
    assert got.bags is not None and whole.bags is not None
    assert [b.to_list() for b in got.bags] == [b.to_list() for b in whole.bags]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_dense must be in"):
        _C.parse_slot(b"y:1\n", ["y", "u"], 2)
    with pytest.raises(ValueError, match="num_dense must be in"):
        _C.parse_slot(b"y:1\n", ["y"], -1)
    with pytest.raises(TypeError):
        _C.parse_slot("y:1\n", ["y"], 0)  # text, not bytes
    with pytest.raises(ValueError, match="max_line_bytes must be >= 0, got -1"):
        _C.parse_slot(b"y:1\n", ["y"], 0, -1)
