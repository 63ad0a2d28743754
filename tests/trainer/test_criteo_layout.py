"""``streamrec-datagen --from-criteo``: Criteo files with the real files' quirks (empty fields,
negative integers, short lines, an empty last field, CRLF, no final newline; plain and gzip)
laid into the streaming layout by the console script, byte for byte and in bounded memory,
then parsed and trained by the trainer."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from in_process import run_main
from streamrec import layout
from streamrec.control.trainer_config import TrainerConfig
from streamrec.datagen.__main__ import main as datagen_main
from streamrec.datagen.criteo_layout import LineReader
from streamrec.datagen.split_files import split_at
from streamrec.process import bin_path
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import CRITEO_SLOTS, NUM_DENSE, read_file
from streamrec.trainer.runner import OnlineTrainer

DONE = "to.hadoop.done"
FIELDS = 1 + NUM_DENSE + CRITEO_SLOTS


def criteo_lines(n: int, seed: int) -> tuple[list[bytes], list[int | None]]:
    """``n`` Criteo lines with the real files' quirks, and each one's label (None: a line the
    parser must count as malformed, as the reference's reader refuses it)."""
    rng = random.Random(seed)
    lines: list[bytes] = []
    labels: list[int | None] = []
    for i in range(n):
        label = rng.randrange(2)
        ints = [
            "" if rng.random() < 0.2 else str(rng.choice([-2, -1, 0, 1, 7, 123456]))
            for _ in range(NUM_DENSE)
        ]
        cats = ["" if rng.random() < 0.25 else f"{rng.randrange(1 << 32):08x}" for _ in range(26)]
        if i % 5 == 0:
            cats[-1] = ""  # the line ends in a tab: its last categorical is empty
        end = "\r\n" if i % 3 == 0 else "\n"
        fields = [str(label), *ints, *cats]
        if i % 17 == 4:
            fields = [str(label)] + [""] * (FIELDS - 1)  # short: every feature empty
        if i % 23 == 11:
            fields = fields[: FIELDS - 6]  # short: fields missing, malformed
            label = None
        lines.append(("\t".join(fields) + end).encode())
        labels.append(label)
    lines[-1] = lines[-1].rstrip(b"\r\n")  # the file's last line has no newline
    return lines, labels


def datagen(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [bin_path("streamrec-datagen"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def split_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("*/*") if p.is_dir())


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], bytes, list[int]]:
    """A plain file and a gzip one named like a plain day file: (paths, the stream's bytes
    as laid out, the labels of its good lines in order)."""
    root = tmp_path_factory.mktemp("criteo")
    a, a_labels = criteo_lines(130, seed=1)
    b, b_labels = criteo_lines(121, seed=2)
    plain, packed = root / "train.txt", root / "day_1"  # gzip, found by its magic bytes
    plain.write_bytes(b"".join(a))
    packed.write_bytes(gzip.compress(b"".join(b)))
    stream = b"".join(a) + b"\n" + b"".join(b) + b"\n"  # each last line gets its newline
    labels = [x for x in a_labels + b_labels if x is not None]
    return [plain, packed], stream, labels


@pytest.fixture(scope="module")
def laid_out(
    inputs: tuple[list[Path], bytes, list[int]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict]:
    paths, _, _ = inputs
    out = tmp_path_factory.mktemp("layout")
    done = datagen(
        "--from-criteo",
        *paths,
        "--out",
        out,
        "--start-day",
        "20190720",
        "--split-interval",
        "720",
        "--samples-per-split",
        "50",
        "--files-per-split",
        "3",
    )
    assert done.returncode == 0, done.stderr
    return out, json.loads(done.stdout)


def test_layout_days_splits_parts_and_donefiles(laid_out):
    out, counts = laid_out
    # 251 lines, 50 a split: 5 full splits and one of 1; two splits a day (720 minutes)
    assert counts == {
        "splits": 6,
        "lines": 251,
        "start_day": "20190720",
        "end_day": "20190722",
        "last_split": "1200",
        "last_split_lines": 1,
    }
    want = [split_at("20190720", 720, i) for i in range(6)]
    assert want[:3] == [("20190720", "0000"), ("20190720", "1200"), ("20190721", "0000")]
    assert [(d.parent.name, d.name) for d in split_dirs(out)] == want
    for i, d in enumerate(split_dirs(out)):
        assert sorted(p.name for p in d.iterdir()) == [
            "part-00000",
            "part-00001",
            "part-00002",
            DONE,
        ]
        newlines = [(d / f"part-{k:05d}").read_bytes().count(b"\n") for k in range(3)]
        # contiguous blocks as numpy.linspace(0, 50, 4); the last split's lines in its first
        assert newlines == ([16, 17, 17] if i < 5 else [1, 0, 0])


def test_every_byte_is_kept_in_order(inputs, laid_out):
    _, stream, _ = inputs
    out, _ = laid_out
    parts = [f for d in split_dirs(out) for f in sorted(d.glob("part-*"))]
    assert b"".join(p.read_bytes() for p in parts) == stream
    assert b"\r\n" in stream and b"\t\r\n" in stream and b"\t\n" in stream


def test_the_trainer_parses_every_part(inputs, laid_out):
    _, _, labels = inputs
    out, counts = laid_out
    got: list[torch.Tensor] = []
    total = ParseStats()
    present = []
    for spec in layout.iter_passes("20190720", counts["end_day"], 720, 1):
        if not layout.pass_ready(out, spec, DONE):
            continue
        for path in layout.pass_files(out, spec, DONE):
            for batch, stats in read_file(path, "criteo", CRITEO_SLOTS):
                total.add(stats)
                got.append(batch.labels)
                if batch.present is not None:
                    present.append(batch.present)
                assert torch.all(batch.dense >= 0)  # negative ints read as 0, then log1p
    assert total.lines == 251
    assert total.malformed == 251 - len(labels) > 0  # only the lines with fields missing
    assert torch.cat(got).tolist() == [float(x) for x in labels]
    assert not torch.cat(present)[:, -1].all()  # empty last categoricals are empty bags


def test_a_training_pass_over_the_laid_out_files(laid_out, tmp_path):
    out, counts = laid_out
    cfg = TrainerConfig.parse(
        {
            "runner": {
                "train_data_dir": str(out),
                "data_format": "criteo",
                "model_save_path": str(tmp_path / "model"),
                "split_interval": 720,
                "split_per_pass": 2,
                "start_day": "20190720",
                "end_day": counts["end_day"],
                "checkpoint_per_pass": 0,
                "save_base_at_day_end": False,
                "save_delta_frequency": 0,
                "train_batch_size": 32,
                "max_malformed_ratio": 0.1,
            },
            "hyper_parameters": {
                "sparse_inputs_slots": CRITEO_SLOTS,
                "arch_sparse_feature_size": 4,
                "arch_mlp_bot": "13-8-4",
                "arch_mlp_top": "8-1",
                "optimizer": "adagrad",
                "learning_rate": 0.05,
            },
        }
    )
    with OnlineTrainer(cfg) as t:
        specs = [s for s in t.passes_todo() if layout.pass_ready(out, s, DONE)]
        records = [t.run_pass(s) for s in specs]
    assert [(r["day"], r["pass_id"]) for r in records] == [
        ("20190720", 1),
        ("20190721", 1),
        ("20190722", 1),
    ]
    assert sum(r["lines"] for r in records) == 251
    assert sum(r["samples"] + r["malformed_lines"] for r in records) == 251
    assert all(r["logloss"] is not None and r["logloss"] > 0 for r in records)
    assert records[-1]["step"] > 0


def test_line_reader_hands_out_lines_in_slices_no_larger_than_a_block(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x\r\ny\t\n\nzz")  # a blank line, no final newline
    b.write_bytes(gzip.compress(b"1\n" + b"w" * 40 + b"\n"))  # a line longer than a block
    for block in (1, 3, 7, 1 << 20):
        with LineReader([a, b], block) as r:
            got = [b"".join(r.take(2)) for _ in range(3)]
            assert r.exhausted() and list(r.take(5)) == []
            assert r.lines == 6
        assert got == [b"x\r\ny\t\n", b"\nzz\n", b"1\n" + b"w" * 40 + b"\n"]
        with LineReader([a, b], block) as r:
            assert all(len(piece) <= block for piece in r.take(100))


MEASURE = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True)
assert done.returncode == 0, done.stderr
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_rss_kib(*args: str | Path) -> int:
    """Peak RSS of ``streamrec-datagen args`` alone (a wrapper process waits for it, so no
    other child of this test process counts)."""
    argv = [bin_path("streamrec-datagen"), *map(str, args)]
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_memory_stays_bounded_whatever_the_input_size(tmp_path):
    lines, _ = criteo_lines(400, seed=3)
    unit = b"".join(lines) + b"\n"
    plain, packed, tiny = tmp_path / "day_0", tmp_path / "day_1.gz", tmp_path / "day_2"
    big = unit * (24 * 2**20 // len(unit))
    plain.write_bytes(big + b"1" + b"\t" * 8 * 2**20 + b"\n")  # and one 8 MiB line
    packed.write_bytes(gzip.compress(big, compresslevel=1))
    tiny.write_bytes(lines[0])
    size = plain.stat().st_size + len(big)
    flags = ("--start-day", "20190720", "--split-interval", "5", "--samples-per-split", "20000")
    args = ("--block-bytes", str(64 << 10), *flags)
    small_peak = peak_rss_kib("--from-criteo", tiny, "--out", tmp_path / "o1", *args)
    big_peak = peak_rss_kib("--from-criteo", plain, packed, "--out", tmp_path / "o2", *args)
    assert size > 50 * 2**20
    # a stream of over 50 MB costs no more than a few MB beyond a one-line file
    assert big_peak - small_peak < 12 * 1024, (small_peak, big_peak)
    written = sum(p.stat().st_size for p in (tmp_path / "o2").glob("*/*/part-*"))
    assert written == size


def test_max_splits_stops_early(inputs, tmp_path):
    paths, stream, _ = inputs
    out = tmp_path / "out"
    done = datagen(
        "--from-criteo",
        *paths,
        "--out",
        out,
        "--start-day",
        "20191231",
        "--split-interval",
        "1440",
        "--samples-per-split",
        "40",
        "--max-splits",
        "2",
        "--donefile",
        "",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["splits"] == 2
    dirs = split_dirs(out)
    assert [(d.parent.name, d.name) for d in dirs] == [("20191231", "0000"), ("20200101", "0000")]
    assert [p.name for p in dirs[0].iterdir()] == ["part-00000"]  # no donefile asked for
    laid = b"".join((d / "part-00000").read_bytes() for d in dirs)
    assert laid.count(b"\n") == 80 and stream.startswith(laid)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"--start-day": "2019-07-20"}, "--start-day '2019-07-20': must be a date YYYYMMDD"),
        ({"--start-day": "20190230"}, "--start-day '20190230'"),
        ({"--split-interval": "7"}, "--split-interval 7: must be minutes dividing 1440"),
        ({"--samples-per-split": "0"}, "--samples-per-split must be >= 1, got 0"),
        ({"--files-per-split": "0"}, "--files-per-split must be >= 1, got 0"),
        ({"files": ["missing.txt"]}, "--from-criteo: no such file: "),
        ({"files": ["empty.txt", "empty.gz"]}, "--from-criteo: no lines in the Criteo files"),
        ({"--slots": "26"}, "unrecognized arguments: --slots 26"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(tmp_path, change, says):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "empty.gz").write_bytes(gzip.compress(b""))
    (tmp_path / "ok.txt").write_bytes(criteo_lines(3, seed=4)[0][0])
    flags = {"--start-day": "20190720", "--split-interval": "60", "--samples-per-split": "10"}
    flags.update({k: v for k, v in change.items() if k != "files"})
    files = [tmp_path / f for f in change.get("files", ["ok.txt"])]
    args = [x for kv in flags.items() for x in kv]
    # through the script's main() here (test_randgen_cli runs the installed script's exit 2)
    argv = ["--from-criteo", *map(str, files), "--out", str(tmp_path / "out"), *args]
    done = run_main(datagen_main, argv)
    assert done.returncode == 2
    assert says in done.stderr
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_an_existing_split_is_not_written_over(inputs, tmp_path):
    paths, _, _ = inputs
    old = tmp_path / "out" / "20190720" / "0000" / "part-00007"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"old\n")
    done = datagen("--from-criteo", *paths, "--out", tmp_path / "out", "--start-day", "20190720")
    assert done.returncode == 2
    assert "--out: " in done.stderr and "already holds files" in done.stderr
    assert [p.name for p in old.parent.iterdir()] == ["part-00007"]


def test_a_corrupt_gzip_file_is_refused_naming_it(tmp_path):
    bad = tmp_path / "day_0.gz"
    bad.write_bytes(gzip.compress(b"".join(criteo_lines(2000, seed=5)[0]))[:-200])
    done = datagen("--from-criteo", bad, "--out", tmp_path / "out", "--start-day", "20190720")
    assert done.returncode == 2
    assert f"cannot read Criteo file {bad}" in done.stderr and "EOFError" in done.stderr
    # the split being written is left without files (no half part, no donefile)
    assert [p for p in (tmp_path / "out").rglob("*") if p.is_file()] == []
