"""Parsing Criteo and generated lines: values, empty fields, negatives, malformed lines."""

import numpy as np
import pytest
import torch
from streamrec.datagen.planted import PlantedStream, StreamParams
from streamrec.datagen.text_lines import to_criteo_text, to_generated_text
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import _parse_chunk_numpy, iter_batches, parse_chunk, read_file
from streamrec.trainer.errors import DataError

# Lines in the Criteo Kaggle train.txt format: empty integer and categorical fields, a
# negative integer, trailing empty categoricals.
CRITEO = (
    "0\t1\t1\t5\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t68fd1e64\t80e26c9b\tfb936136\t7b4723c4\t"
    "25c83c98\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\ta8cd5504\tb2cb9c98\t37c9c164\t2824a5f6\t"
    "1adce6ef\t8ba8b39a\t891b62e7\te5ba7672\tf54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t\t3a171ecb\t"
    "c5c50484\te8b83407\t9727dd16\n"
    "1\t\t-1\t\t\t8000\t\t0\t0\t\t\t0\t\t\t05db9164\t38a947a1\t\t\t25c83c98\t\t2f2f9a5d\t"
    "0b153874\ta73ee510\t3b08e48b\t\t\t\t07d13a8f\t\t\t\t\t\t\t\t\t\t\t\t\n"
)


def test_criteo_real_format_lines():
    batch, stats = parse_chunk(CRITEO.encode(), "criteo", 26, "day_0", 1)
    assert stats.lines == 2 and stats.malformed == 0 and stats.first_bad is None
    assert batch.labels.tolist() == [0.0, 1.0]
    ints0 = [1, 1, 5, 0, 1382, 4, 15, 2, 181, 1, 2, 0, 2]
    f32 = torch.float32
    torch.testing.assert_close(batch.dense[0], torch.log1p(torch.tensor(ints0, dtype=f32)))
    ints1 = [0, 0, 0, 0, 8000, 0, 0, 0, 0, 0, 0, 0, 0]  # empty -> 0, -1 -> 0
    torch.testing.assert_close(batch.dense[1], torch.log1p(torch.tensor(ints1, dtype=f32)))
    assert batch.keys[0, 0].item() == 0x68FD1E64 and batch.keys[0, 25].item() == 0x9727DD16
    assert batch.keys[1, 1].item() == 0x38A947A1
    assert batch.present is not None
    assert batch.present[0].tolist() == [True] * 21 + [False] + [True] * 4
    assert batch.present[1].sum().item() == 8
    feats = batch.features()
    assert len(feats) == 26
    assert feats[0].to_list() == [[0x68FD1E64], [0x05DB9164]]
    assert feats[21].to_list() == [[], []]


def test_malformed_lines_are_counted_and_named():
    good = CRITEO.splitlines()
    text = "\n".join(
        [
            good[0],
            "1\tnot enough fields",
            good[1],
            "",
            good[0].replace("0", "2", 1),
            good[1].replace("38a947a1", "38a9zz"),
            good[0],
        ]
    ).encode()
    for parse in (parse_chunk, _parse_chunk_numpy):
        batch, stats = parse(text, "criteo", 26, "part-7", 100)
        assert len(batch) == 3
        assert stats.lines == 6  # the blank line is not a line of data
        assert stats.malformed == 3
        assert stats.first_bad[:2] == ("part-7", 101)
        assert "40 tab-separated fields" in stats.first_bad[2]


def test_generated_round_trip_and_fallback_agree():
    stream = PlantedStream(StreamParams(slots=5, empty_share=0.1, seed=3), "20190720")
    s = stream.draw("20190721", 3000, np.random.default_rng(0))
    text = to_generated_text(s)
    fast, st1 = parse_chunk(text, "generated", 5)
    slow, st2 = _parse_chunk_numpy(text, "generated", 5)
    assert st1.malformed == st2.malformed == 0 and st1.lines == 3000
    assert fast.labels.tolist() == s["label"].astype(float).tolist()
    np.testing.assert_allclose(fast.ptrue.numpy(), s["ptrue"], atol=1e-6)
    present = ~s["empty"]
    assert np.array_equal(fast.present.numpy(), present)
    assert np.array_equal(fast.keys.numpy()[present], s["keys"][present])
    for a, b in (
        (fast.dense, slow.dense),
        (fast.labels, slow.labels),
        (fast.ptrue, slow.ptrue),
        (fast.present, slow.present),
    ):
        torch.testing.assert_close(a, b)
    assert torch.equal(fast.keys[fast.present], slow.keys[slow.present])


def test_criteo_writer_round_trip_with_negatives():
    rng = np.random.default_rng(1)
    ints = rng.integers(-3, 10**6, (500, 13))
    keys = rng.integers(0, 2**32, (500, 26))
    empty = rng.random((500, 26)) < 0.05
    text = to_criteo_text(rng.integers(0, 2, 500), ints, keys, empty)
    batch, stats = parse_chunk(text, "criteo", 26)
    assert stats.malformed == 0
    torch.testing.assert_close(
        batch.dense, torch.log1p(torch.from_numpy(np.maximum(ints, 0).astype(np.float32)))
    )
    assert np.array_equal(batch.keys.numpy()[~empty], keys[~empty])


def test_chunked_reading_matches_whole_file(tmp_path):
    stream = PlantedStream(StreamParams(slots=3, seed=1), "20190720")
    s = stream.draw("20190720", 2000, np.random.default_rng(2))
    path = tmp_path / "part-0"
    path.write_bytes(to_generated_text(s) + b"0\tbroken\n")
    whole, _ = parse_chunk(path.read_bytes(), "generated", 3)
    parts = list(read_file(path, "generated", 3, chunk_bytes=4096))
    assert len(parts) > 10
    assert torch.equal(torch.cat([b.keys for b, _ in parts]), whole.keys)
    stats = ParseStats()
    for _, st in parts:
        stats.add(st)
    assert stats.lines == 2001 and stats.malformed == 1
    assert stats.first_bad[:2] == (str(path), 2001)


def test_batches_span_files_and_malformed_share_fails(tmp_path):
    stream = PlantedStream(StreamParams(slots=3, seed=1), "20190720")
    files = []
    for i in range(3):
        p = tmp_path / f"part-{i}"
        p.write_bytes(to_generated_text(stream.draw("20190720", 250, np.random.default_rng(i))))
        files.append(p)
    stats = ParseStats()
    sizes = [len(b) for b in iter_batches(files, "generated", 3, 100, stats)]
    assert sizes == [100] * 7 + [50] and stats.lines == 750
    bad = tmp_path / "part-bad"
    bad.write_bytes(b"1\t0.5\t1\n" * 10)
    with pytest.raises(DataError, match=r"part-bad line 1: expected 18 tab-separated fields"):
        list(iter_batches([*files, bad], "generated", 3, 100, ParseStats(), 0.01))
    # under the share, the pass goes on and reports the count
    stats = ParseStats()
    list(iter_batches([*files, bad], "generated", 3, 100, stats, 0.05))
    assert stats.malformed == 10


def _gen_line(label="1", p="0.5", first_int="3", key="7") -> bytes:
    ints = "\t".join([first_int] + ["3"] * 12)
    return f"{label}\t{p}\t{ints}\t{key}\t8\n".encode()


@pytest.mark.parametrize(
    "line,good",
    [
        (_gen_line(p="1e-1"), False),  # CSV readers take these as numbers; the format does not
        (_gen_line(p="+0.5"), False),
        (_gen_line(p="-0"), False),
        (_gen_line(p=" 0.5"), False),
        (_gen_line(p="."), False),
        (_gen_line(label=" 1"), False),
        (_gen_line(first_int="9223372036854775808"), False),  # int64 + 1: not wrapped
        (_gen_line(key="9999999999999999999"), False),
        (_gen_line(p=".5"), True),
        (_gen_line(p="1."), True),
        (_gen_line(key="9223372036854775807"), True),
        (_gen_line(key="-7"), True),
    ],
)
def test_a_line_reads_the_same_whatever_chunk_it_is_in(line, good):
    """Found by tests/fuzz/fuzz_lines.py when parse_chunk was pyarrow's reader backed by the
    numpy parser: they disagreed, so a line counted as good or malformed depending on the
    lines around it. Whatever parse_chunk is, a line's fate is its own."""
    garbage = b"\xff not a line\n"
    for text in (line, line + garbage, garbage + line):
        for parse in (parse_chunk, _parse_chunk_numpy):
            batch, stats = parse(text, "generated", 2)
            assert len(batch) == int(good), (parse.__name__, text)
            assert stats.malformed == stats.lines - int(good)
