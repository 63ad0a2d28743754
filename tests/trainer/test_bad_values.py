"""Own data's bad inputs as the readers and a real pass take them: numbers in standard float
syntax in slot text, missing (NaN) and infinite dense values in slot text and Parquet, lines
longer than MAX_LINE_BYTES in every text format, and a pass whose data holds an infinite
value failing as bad data (``on_bad_split`` applies), not as a transient torch error."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from streamrec.control.feature_schema import FeatureSchema
from streamrec.control.reports import ErrorClass
from streamrec.control.trainer_config import TrainerConfig
from streamrec.trainer.data.batches import MAX_LINE_BYTES, OVERLONG, Batch, ParseStats
from streamrec.trainer.data.feature_data import (
    MAX_NUMBER_BYTES,
    _parse_slot_chunk_numpy,
    parse_slot_chunk,
)
from streamrec.trainer.data.reader import _parse_chunk_numpy, iter_batches, parse_chunk, read_file
from streamrec.trainer.errors import DataError, error_class
from streamrec.trainer.runner import OnlineTrainer
from trainer_helpers import SLOTS, write_stream

#: Two dense features read as they are (no log), one sparse one.
RAW = {
    "label": "click",
    "dense": [{"name": "x", "log1p": False}, {"name": "y", "log1p": False}],
    "sparse": [{"name": "u"}],
}
SCHEMA = FeatureSchema(**RAW)
INFINITE = "is infinite in float32 (inf, or beyond +-3.4028235e38; a missing value is nan)"


def bits(t: torch.Tensor | np.ndarray) -> list[int]:
    """float32 values' bit patterns (NaN's and -0.0's too)."""
    return np.asarray(t, dtype=np.float32).view(np.int32).ravel().tolist()


def parse(text: bytes, **kw) -> tuple[Batch, ParseStats]:
    """The compiled parser's result, checked against the numpy reference bit for bit."""
    got, stats = parse_slot_chunk(text, SCHEMA, "part-9", 1, **kw)
    want, want_stats = _parse_slot_chunk_numpy(text, SCHEMA, "part-9", 1, **kw)
    assert (stats.lines, stats.malformed, stats.first_bad) == (
        want_stats.lines,
        want_stats.malformed,
        want_stats.first_bad,
    )
    assert bits(got.dense) == bits(want.dense) and bits(got.labels) == bits(want.labels)
    return got, stats


# ---- slot text: the float syntax ---------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "1.5e-7",
        "-2.5E+3",
        "+0.25",
        "+1",
        "1e0",
        "5.",
        ".5",
        "+.5e-2",
        "1.e5",
        "00012",
        "1e+0010",
        "-0",
        "3.14159265358979323846264338327950288",  # more digits than a double holds
        "0.1000000000000000055511151231257827021181583404541015625",  # 0.1's double, exact
        "16777217",  # 2**24 + 1: a tie in float32, to even
        "3.4028234663852886e38",  # float32's largest
        "1e-45",  # float32's smallest denormal
        "-7e-46",  # half of it: to even, -0
        "1e-400",  # below any double: 0
        "9" * 60 + "e-60",
        "1." + "0" * 126,  # MAX_NUMBER_BYTES long
    ],
)
def test_slot_numbers_in_standard_float_syntax(value):
    """A dense value reads as its correctly rounded float64, then float32 (strtod's and
    numpy's reading): Python's float() of the text, then np.float32."""
    got, stats = parse(f"click:1 x:{value} y:0 u:3\n".encode())
    assert (stats.lines, stats.malformed, len(got)) == (1, 0, 1), stats.first_bad
    assert bits(got.dense[0, :1]) == bits([np.float32(float(value))])


@pytest.mark.parametrize(
    "value",
    ["1e", "1e+", "e5", ".", ".e1", "+", "-", "+-1", "-+1", "--1", "1.2.3", "0x10", "1_000"]
    + ["1e5.0", "1,5", "nan(1)", "infinit", "nana", "\u0661", "1" * (MAX_NUMBER_BYTES + 1)],
)
def test_slot_values_that_are_no_number_name_feature_and_value(value):
    _, stats = parse(f"click:1 x:1 y:{value} u:3\n".encode())
    assert stats.malformed == 1
    shown = value if len(value) <= 40 else value[:40]
    assert stats.first_bad is not None
    assert stats.first_bad[:2] == ("part-9", 1)
    assert stats.first_bad[2].startswith(f"dense feature 'y' value '{shown}'")
    assert stats.first_bad[2].endswith("is not a number")


# ---- missing and infinite values ---------------------------------------------------------


def test_slot_nan_is_a_missing_dense_value_and_inf_a_malformed_line():
    text = (
        b"click:1 x:nan y:1 u:1\n"  # kept: x missing
        b"click:0 x:NaN y:-NAN\n"  # kept: both missing
        b"click:1 x:inf y:1\n"  # line 3: malformed, the first
        b"click:1 x:1 y:-Infinity\n"
        b"click:1 x:1e39 y:1\n"  # beyond float32: infinite there
        b"click:1 x:3.4028235e38 y:-3.4028235e38\n"  # rounds to float32's largest: kept
    )
    got, stats = parse(text)
    assert (stats.lines, stats.malformed, len(got)) == (6, 3, 3)
    assert stats.first_bad == ("part-9", 3, f"dense feature 'x' value 'inf' {INFINITE}")
    big = float(np.finfo(np.float32).max)
    nan = float("nan")
    assert bits(got.dense) == bits([[nan, 1.0], [nan, nan], [big, -big]])
    assert got.labels.tolist() == [1.0, 0.0, 1.0]
    assert [b for b in got.bags[0].to_list()] == [[1], [], []]  # type: ignore[index]


@pytest.mark.parametrize(
    "line,reason",
    [
        ("click:1 x:1 y:-Infinity", f"dense feature 'y' value '-Infinity' {INFINITE}"),
        ("click:1 x:-1e39 y:1", f"dense feature 'x' value '-1e39' {INFINITE}"),
        ("click:nan x:1 y:1", "label 'click' value 'nan' is not a finite number"),
        ("click:inf x:1 y:1", "label 'click' value 'inf' is not a finite number"),
        ("click:1e309 x:1 y:1", "label 'click' value '1e309' is not a finite number"),
        ("click:1 x:1", "no dense feature 'y'"),
        ("x:1 y:1", "no label 'click'"),
        ("click:1 x:1 y:1 x:nan", "dense feature 'x' twice (again: 'nan')"),
        ("click:1 x:1 y:1 u", "token 'u' is not name:value"),
    ],
)
def test_slot_malformed_lines_name_the_feature_and_value(line, reason):
    got, stats = parse(f"click:0 x:0 y:0\n{line}\n".encode())
    assert (len(got), stats.malformed) == (1, 1)
    assert stats.first_bad == ("part-9", 2, reason)


def test_an_infinite_value_over_the_ratio_fails_naming_file_line_feature_and_value(tmp_path):
    path = tmp_path / "part-00000"
    path.write_bytes(b"click:1 x:1 y:2 u:1\n\nclick:0 x:-inf y:2 u:1\n" + b"click:1 x:1 y:2\n" * 8)
    with pytest.raises(DataError) as raised:
        list(iter_batches([path], "slot", 0, 64, ParseStats(), 0.01, schema=SCHEMA))
    assert f"1 of 10 lines malformed (10.00% > max_malformed_ratio 1.00%); first: {path} " in str(
        raised.value
    )
    assert str(raised.value).endswith(f"line 3: dense feature 'x' value '-inf' {INFINITE}")


def test_parquet_null_and_nan_dense_are_missing_inf_is_malformed(tmp_path):
    inf = float("inf")
    table = pa.table(
        {
            "click": pa.array([1, 0, 1, 0, 1, 1], pa.int64()),
            "x": pa.array([1.0, None, float("nan"), inf, 2.0, 1e39]),
            "y": pa.array([1, 2, None, 4, 5, 6], pa.int64()),
            "u": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
        }
    )
    path = tmp_path / "part-0.parquet"
    pq.write_table(table, path, row_group_size=2)
    stats = ParseStats()
    (batch,) = iter_batches([path], "parquet", 0, 64, stats, 1.0, schema=SCHEMA)
    assert (stats.lines, stats.malformed) == (6, 2)
    nan = float("nan")
    assert bits(batch.dense) == bits([[1.0, 1.0], [nan, 2.0], [nan, nan], [2.0, 5.0]])
    assert batch.bags is not None and batch.bags[0].to_list() == [[1], [2], [3], [5]]
    # the row is the file's (read 2 rows a record batch: row 4 is the 2nd batch's 2nd)
    assert stats.first_bad == (
        str(path),
        4,
        f"dense feature 'x' is inf: {INFINITE.replace('is nan', 'is null or NaN')[3:]}",
    )
    assert stats.first_bad_unit == "row"
    with pytest.raises(DataError, match=rf"first: {path} row 4: dense feature 'x' is inf"):
        list(iter_batches([path], "parquet", 0, 64, ParseStats(), 0.1, schema=SCHEMA))


def test_parquet_a_null_nan_or_infinite_label_is_malformed(tmp_path):
    table = pa.table(
        {
            "click": pa.array([1.0, float("nan"), None, float("-inf"), 0.0]),
            "x": pa.array([1.0] * 5),
            "y": pa.array([1.0] * 5),
            "u": pa.array([1] * 5, pa.int64()),
        }
    )
    path = tmp_path / "part-0.parquet"
    pq.write_table(table, path)
    stats = ParseStats()
    (batch,) = iter_batches([path], "parquet", 0, 64, stats, 1.0, schema=SCHEMA)
    assert (stats.lines, stats.malformed) == (5, 3)
    assert batch.labels.tolist() == [1.0, 0.0]
    assert stats.first_bad == (str(path), 2, "label 'click' is nan, not a finite number")
    pq.write_table(table.slice(2), path)
    stats = ParseStats()
    list(iter_batches([path], "parquet", 0, 64, stats, 1.0, schema=SCHEMA))
    assert stats.first_bad == (str(path), 1, "label 'click' is null, not a finite number")


# ---- lines longer than MAX_LINE_BYTES -----------------------------------------------------


def test_a_10_mb_slot_line_is_dropped_not_trained(tmp_path):
    path = tmp_path / "part-00000"
    huge = b"click:1 x:1 y:1 " + b"u:7 " * (10 << 18)  # 10 MiB of keys, one line
    path.write_bytes(b"click:1 x:1 y:1 u:1\n" + huge + b"\nclick:0 x:2 y:2 u:2\n")
    stats = ParseStats()
    (batch,) = iter_batches([path], "slot", 0, 64, stats, 1.0, schema=SCHEMA)
    assert len(batch) == 2 and batch.labels.tolist() == [1.0, 0.0]
    assert batch.bags is not None and batch.bags[0].to_list() == [[1], [2]]
    assert (stats.lines, stats.malformed) == (3, 1)
    assert stats.first_bad == (str(path), 2, OVERLONG.format(MAX_LINE_BYTES))


@pytest.mark.parametrize("limit", [0, 10, 19, 20, 21, 40])
def test_slot_lines_over_a_limit_agree_with_the_reference(limit):
    text = b"click:1 x:1 y:1\r\n\nclick:1 x:1 y:1 u:123456789\n  \nclick:0 x:0 y:bad u:1\nclick:1"
    _, stats = parse(text, max_line_bytes=limit)
    # the non-blank lines' bytes before their '\n' (a CR counted); the last two are malformed
    # anyway (a bad value, no dense features) when not too long
    lengths, bad_anyway = (16, 27, 21, 7), (False, False, True, True)
    long = [n > limit for n in lengths]
    assert stats.malformed == sum(a or b for a, b in zip(long, bad_anyway, strict=True))
    if limit < 16:
        assert stats.first_bad == ("part-9", 1, OVERLONG.format(limit))


def test_generated_lines_over_the_limit_are_malformed_whatever_they_hold(tmp_path):
    data = write_stream(tmp_path / "data", days=1, samples=40)
    text = (data / "20190720" / "0000" / "part-00000").read_bytes()
    width = len(text.split(b"\n")[0])  # every line about as long
    got, stats = parse_chunk(text, "generated", SLOTS, "part-0", 1, max_line_bytes=width - 1)
    want, want_stats = _parse_chunk_numpy(text, "generated", SLOTS, "part-0", 1, width - 1)
    assert (stats.lines, stats.malformed, stats.first_bad) == (
        want_stats.lines,
        want_stats.malformed,
        want_stats.first_bad,
    )
    assert torch.equal(got.labels, want.labels) and 0 < stats.malformed < stats.lines
    assert stats.first_bad is not None
    assert stats.first_bad[2] == OVERLONG.format(width - 1)
    # a 2 MiB line inside one chunk: dropped for its length, named so
    path = tmp_path / "part-long"
    first, rest = text.split(b"\n", 1)
    path.write_bytes(first + b"\n" + b"1\t" * (1 << 20) + b"\n" + rest)
    total = ParseStats()
    for _, chunk_stats in read_file(path, "generated", SLOTS):
        total.add(chunk_stats)
    assert total.malformed == 1
    assert total.first_bad == (str(path), 2, OVERLONG.format(MAX_LINE_BYTES))


# ---- a whole pass ----------------------------------------------------------------------------


def samples(n: int, seed: int) -> dict[str, list]:
    """Columns whose click follows u (a few ids) and x."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 20, n)
    x = rng.normal(0, 1, n)
    click = rng.random(n) < 1 / (1 + np.exp(-(x + (u % 2) * 2 - 1)))
    return {"click": click.astype(int).tolist(), "x": x.tolist(), "y": u.tolist(), "u": u.tolist()}


def write_split(root: Path, fmt: str, cols: dict[str, list]) -> str:
    """One split of ``cols`` in ``fmt`` (a float as Python writes it: nan, inf); its file."""
    split = root / "20190720" / "0000"
    split.mkdir(parents=True)
    path = split / "part-00000"
    if fmt == "parquet":
        pq.write_table(pa.table(cols), path, row_group_size=128)
    else:
        rows = zip(*cols.values(), strict=True)
        tokens = (" ".join(f"{k}:{v}" for k, v in zip(cols, r, strict=True)) for r in rows)
        path.write_text("".join(f"{line}\n" for line in tokens))
    (split / "to.hadoop.done").touch()
    return str(path)


def schema_config(data: Path, model: Path, fmt: str, **runner) -> TrainerConfig:
    return TrainerConfig.parse(
        {
            "runner": {
                "train_data_dir": str(data),
                "model_save_path": str(model),
                "data_format": fmt,
                "schema": RAW,
                "split_interval": 720,
                "start_day": "20190720",
                "end_day": "20190720",
                "checkpoint_per_pass": 0,
                "save_base_at_day_end": False,
                "train_batch_size": 64,
                **runner,
            },
            "hyper_parameters": {
                "arch_sparse_feature_size": 4,
                "arch_mlp_bot": "2-8-4",
                "arch_mlp_top": "8-1",
            },
        }
    )


@pytest.mark.parametrize("fmt", ["parquet", "slot"])
def test_an_infinite_dense_value_fails_the_pass_as_bad_data(tmp_path, fmt):
    cols = samples(600, 1)
    cols["x"][100] = float("inf")
    path = write_split(tmp_path / "data", fmt, cols)
    cfg = schema_config(tmp_path / "data", tmp_path / "m", fmt, max_malformed_ratio=0)
    with OnlineTrainer(cfg) as t, pytest.raises(DataError) as raised:
        t.run_pass(t.passes_todo()[0])
    # bad data: the job's on_bad_split decides (not a transient error, retried and failed)
    assert error_class(raised.value) == ErrorClass.DATA
    value = "is inf:" if fmt == "parquet" else "value 'inf' is infinite"
    where = "row" if fmt == "parquet" else "line"
    assert f"{path} {where} 101: dense feature 'x' {value}" in str(raised.value)
    # under the ratio: the row is left out, the rest trained
    with OnlineTrainer(schema_config(tmp_path / "data", tmp_path / "m2", fmt)) as t:
        record = t.run_pass(t.passes_todo()[0])
    assert record["malformed_lines"] == 1 and record["samples"] == 599
    assert math.isfinite(record["logloss"])


@pytest.mark.parametrize("fmt", ["parquet", "slot"])
def test_missing_dense_values_train_as_missing(tmp_path, fmt):
    """NaN reaches the model (Batch.dense: a Parquet null or NaN, slot text's nan) and the
    model's normalizer takes it for the mean: the pass trains every row, its loss finite."""
    cols = samples(600, 2)
    cols["x"] = [float("nan") if i % 7 == 0 else v for i, v in enumerate(cols["x"])]
    cols["y"] = [None if i % 5 == 0 else v for i, v in enumerate(cols["y"])]
    if fmt == "slot":  # a missing value written nan (slot_text writes a null so)
        cols["y"] = [float("nan") if v is None else v for v in cols["y"]]
    write_split(tmp_path / "data", fmt, cols)
    with OnlineTrainer(schema_config(tmp_path / "data", tmp_path / "m", fmt)) as t:
        record = t.run_pass(t.passes_todo()[0])
    assert record["malformed_lines"] == 0 and record["samples"] == 600
    assert math.isfinite(record["logloss"]) and math.isfinite(record["train_auc"])
