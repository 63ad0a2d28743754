"""Trainer parse benchmark: text -> Batch, MB/s and ms per 2048-sample batch.

Text: setup (b)'s samples as bench/trainer.py writes them (``make_data`` + ``to_criteo_text``:
13 ints, 26 hex categoricals), and the generator's format for the planted stream with 26
slots (``to_generated_text``), one chunk of ``--samples`` lines each (the trainer's chunks
are 16 MiB: the default is about that). Parsers, all measured in this run:

    streamrec    ``parse_chunk``: the compiled parser (one thread, no GIL) + numpy's log1p,
                 the Batch the trainer trains on
    pyarrow      ``pyarrow.csv.read_csv`` with its defaults (its thread pool, all cores) into
                 typed columns: ints as int64, categoricals as strings (generated: int64).
                 It does less than we do: no hex conversion, no log1p, no per-line checks of
                 the format, no Batch
    old path     the pyarrow + numpy parse_chunk this replaced (pyarrow's reader, then the hex
                 keys and p_true converted by numpy), kept here as a copy; the text is clean, so
                 its exact-numpy fallback is never taken

Slot text (``--format slot``, in the default run too): PaddleRec lines of the same shape as
setup (b)'s (``click``, 13 int dense I1..I13 with log1p, 24 int ids C1..C24, a list C25 of
0 to 5 ids and a string id C26), written by ``slot_text``; parsers:

    streamrec    ``parse_slot_chunk``: the compiled slot parser (one thread, no GIL) + numpy's
                 log1p, the ragged Batch a schema job trains on
    numpy        ``_parse_slot_chunk_numpy``, the numpy reference it replaced as the default

Each figure is the median of ``--repeats`` runs; ratios are streamrec's speed over the other's.

    .venv/bin/python bench/trainer_parse.py [--format criteo|generated|slot]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import torch

# bench/ is the script's directory, first on sys.path
from reference_dlrm import SETUPS
from streamrec.control.feature_schema import FeatureSchema
from streamrec.datagen.planted import PlantedStream, StreamParams
from streamrec.datagen.slot_text import slot_text
from streamrec.datagen.text_lines import to_generated_text
from streamrec.trainer.data.batches import Batch, parse_columns
from streamrec.trainer.data.feature_data import _parse_slot_chunk_numpy, parse_slot_chunk
from streamrec.trainer.data.reader import NUM_DENSE, _make_batch, parse_chunk
from trainer import DAY, make_data, to_criteo_text

BATCH = 2048
SLOTS = 26


def criteo_text(samples: int) -> bytes:
    data = make_data(SETUPS["b"], samples)
    return to_criteo_text(data["label"], data["ints"], data["keys"])


def generated_text(samples: int) -> bytes:
    stream = PlantedStream(StreamParams(slots=SLOTS, seed=0), DAY)
    return to_generated_text(stream.draw(DAY, samples, np.random.default_rng(0)))


def slot_sample_text(samples: int) -> tuple[bytes, FeatureSchema]:
    """Slot lines shaped as setup (b)'s, and their schema (the module docstring)."""
    rng = np.random.default_rng(0)
    cols = {"click": pa.array(rng.integers(0, 2, samples))}
    for i in range(1, NUM_DENSE + 1):
        cols[f"I{i}"] = pa.array(np.round(rng.exponential(20, samples)).astype(np.int64))
    for i in range(1, SLOTS - 1):
        cols[f"C{i}"] = pa.array(rng.integers(0, 10**6, samples))
    offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 6, samples))]).astype(np.int32)
    items = pa.array(rng.integers(0, 1000, int(offsets[-1])))
    cols[f"C{SLOTS - 1}"] = pa.ListArray.from_arrays(pa.array(offsets), items)
    cols[f"C{SLOTS}"] = pa.array([f"sku-{k}" for k in rng.integers(0, 10**5, samples)])
    schema = FeatureSchema(
        label="click",
        dense=[{"name": f"I{i}", "log1p": True} for i in range(1, NUM_DENSE + 1)],
        sparse=[{"name": f"C{i}"} for i in range(1, SLOTS + 1)],
    )
    return slot_text(pa.table(cols)), schema


def column_types(
    gen: bool, num_slots: int, ptrue: pa.DataType, key: pa.DataType
) -> tuple[list[str], dict[str, pa.DataType]]:
    """Column names f0.. and their types: int64 but p_true (generated) and the hex keys
    (criteo), which get ``ptrue`` and ``key``."""
    head = 2 if gen else 1
    names = [f"f{i}" for i in range(head + NUM_DENSE + num_slots)]
    types = {n: pa.int64() for n in names}
    if gen:
        types["f1"] = ptrue
    else:
        for n in names[head + NUM_DENSE :]:
            types[n] = key
    return names, types


def pyarrow_read(text: bytes, gen: bool) -> pa.Table:
    """pyarrow's CSV reader, its defaults but for the tab and typed columns."""
    names, types = column_types(gen, SLOTS, pa.float64(), pa.string())
    return pacsv.read_csv(
        pa.py_buffer(text),
        read_options=pacsv.ReadOptions(column_names=names),
        parse_options=pacsv.ParseOptions(delimiter="\t"),
        convert_options=pacsv.ConvertOptions(column_types=types),
    )


# --- the old path (services/trainer/data/reader.py before its C++ parser), bench code only ---


def _old_table(data: bytes, gen: bool, num_slots: int) -> pa.Table:
    names, types = column_types(gen, num_slots, pa.binary(), pa.binary())
    options = pacsv.ParseOptions(
        delimiter="\t",
        quote_char=False,
        double_quote=False,
        escape_char=False,
        newlines_in_values=False,
        invalid_row_handler=lambda row: "skip",
    )
    return pacsv.read_csv(
        pa.py_buffer(data),
        read_options=pacsv.ReadOptions(column_names=names, block_size=1 << 22),
        parse_options=options,
        convert_options=pacsv.ConvertOptions(
            column_types=types, strings_can_be_null=False, quoted_strings_can_be_null=False
        ),
    )


def _old_int(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    arr = col.combine_chunks()
    null = arr.is_null().to_numpy(zero_copy_only=False)
    return pc.fill_null(arr, 0).to_numpy(zero_copy_only=False).astype(np.int64), null


def _old_text(col: pa.ChunkedArray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arr = col.combine_chunks()
    n = len(arr)
    _, offs_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offs_buf, dtype=np.int32)[arr.offset : arr.offset + n + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8)
    starts = offsets[:-1].astype(np.int64)[:, None]
    ends = offsets[1:].astype(np.int64)[:, None]
    values, ok, empty = parse_columns(data, starts, ends, kind)
    return values[:, 0], ok[:, 0], empty[:, 0]


def old_parse(data: bytes, gen: bool, num_slots: int) -> Batch:
    """The old parse_chunk's fast path on clean text."""
    head = 2 if gen else 1
    table = _old_table(data, gen, num_slots)
    label, label_null = _old_int(table.column(0))
    row_ok = ~label_null & ((label == 0) | (label == 1))
    ints = np.empty((table.num_rows, NUM_DENSE), dtype=np.int64)
    for j in range(NUM_DENSE):
        ints[:, j] = _old_int(table.column(head + j))[0]
    keys = np.empty((table.num_rows, num_slots), dtype=np.int64)
    empty = np.zeros((table.num_rows, num_slots), dtype=bool)
    for j in range(num_slots):
        col = table.column(head + NUM_DENSE + j)
        if gen:
            keys[:, j], empty[:, j] = _old_int(col)
        else:
            keys[:, j], ok, empty[:, j] = _old_text(col, "hex")
            row_ok &= ok
    ptrue = None
    if gen:
        ptrue, p_ok, p_empty = _old_text(table.column(1), "fixed")
        row_ok &= p_ok & ~p_empty & (ptrue <= 1.0)
    return _make_batch(label, ints, keys, empty, ptrue, row_ok)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: allocator, pyarrow's thread pool
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def report(fmt: str, text: bytes, samples: int, repeats: int) -> None:
    gen = fmt == "generated"
    batch, stats = parse_chunk(text, fmt, SLOTS)
    assert stats.malformed == 0 and len(batch) == samples, stats
    old = old_parse(text, gen, SLOTS)
    for name in ("dense", "labels", "keys", "present", "ptrue"):
        a, b = getattr(batch, name), getattr(old, name)
        assert (a is None and b is None) or torch.equal(a, b), f"the old path's {name} differ"
    seconds = {
        "streamrec": median_seconds(lambda: parse_chunk(text, fmt, SLOTS), repeats),
        "pyarrow": median_seconds(lambda: pyarrow_read(text, gen), repeats),
        "old path": median_seconds(lambda: old_parse(text, gen, SLOTS), repeats),
    }
    mb = len(text) / 1e6
    print(
        f"{fmt}: {samples} lines, {mb:.1f} MB ({len(text) / samples:.0f} bytes/line), {SLOTS} slots"
    )
    for name, s in seconds.items():
        vs = "" if name == "streamrec" else f"   streamrec is {s / seconds['streamrec']:.2f}x"
        print(
            f"  {name:<10} {mb / s:8.0f} MB/s {s / samples * BATCH * 1e3:8.3f} ms "
            f"per {BATCH}-sample batch{vs}"
        )


def report_slot(samples: int, repeats: int) -> None:
    text, schema = slot_sample_text(samples)
    batch, stats = parse_slot_chunk(text, schema)
    assert stats.malformed == 0 and len(batch) == samples, stats
    exact, _ = _parse_slot_chunk_numpy(text, schema)
    assert torch.equal(batch.dense, exact.dense) and torch.equal(batch.labels, exact.labels)
    assert batch.bags is not None and exact.bags is not None
    assert all(a == b for a, b in zip(batch.bags, exact.bags, strict=True)), "the bags differ"
    seconds = {
        "streamrec": median_seconds(lambda: parse_slot_chunk(text, schema), repeats),
        "numpy": median_seconds(lambda: _parse_slot_chunk_numpy(text, schema), repeats),
    }
    mb = len(text) / 1e6
    print(
        f"slot: {samples} lines, {mb:.1f} MB ({len(text) / samples:.0f} bytes/line), "
        f"{len(schema.dense)} dense, {SLOTS} sparse (one a list, one string ids)"
    )
    for name, s in seconds.items():
        vs = "" if name == "streamrec" else f"   streamrec is {s / seconds['streamrec']:.2f}x"
        print(
            f"  {name:<10} {mb / s:8.0f} MB/s {s / samples * BATCH * 1e3:8.3f} ms "
            f"per {BATCH}-sample batch{vs}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=61_440, help="lines per text (30 batches)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--format", choices=["criteo", "generated", "slot"], help="only this one (default: all)"
    )
    args = ap.parse_args()
    print(f"median of {args.repeats} runs; torch threads {torch.get_num_threads()}")
    if args.format in (None, "criteo"):
        report("criteo", criteo_text(args.samples), args.samples, args.repeats)
    if args.format in (None, "generated"):
        report("generated", generated_text(args.samples), args.samples, args.repeats)
    if args.format in (None, "slot"):
        report_slot(args.samples, args.repeats)


if __name__ == "__main__":
    main()
    # pyarrow's CSV thread pool sometimes aborts the interpreter's exit ("terminate called
    # without an active exception", apache/arrow#34314): the figures are printed, leave now
    sys.stdout.flush()
    os._exit(0)
