"""``streamrec-datagen --random``: the reference's random data in the streaming layout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import yaml
from in_process import run_main
from streamrec.control.trainer_config import TrainerConfig
from streamrec.datagen.__main__ import main as datagen_main
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import iter_batches


def datagen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "streamrec-datagen"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def random_args(out: Path, *more: str) -> list[str]:
    return [
        "--random",
        "--out",
        str(out),
        "--start-day",
        "20190720",
        "--split-interval",
        "720",
        "--samples-per-split",
        "100",
        "--data-size",
        "250",
        "--arch-embedding-size",
        "50-40-3",
        "--files-per-split",
        "2",
        *more,
    ]


def test_random_data_is_laid_out_and_parses(tmp_path):
    job = tmp_path / "job.yaml"
    done = datagen(*random_args(tmp_path / "data", "--job-out", str(job)))
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    # 250 samples, 100 a split, 2 splits a day: 20190720/0000, 1200, 20190721/0000 (50)
    assert counts == {
        "splits": 3,
        "lines": 250,
        "start_day": "20190720",
        "end_day": "20190721",
        "last_split": "0000",
        "last_split_lines": 50,
    }
    files = sorted((tmp_path / "data").glob("*/*/part-*"))
    assert len(files) == 6 and all((f.parent / "to.hadoop.done").is_file() for f in files)
    stats = ParseStats()
    batches = list(iter_batches(files, "generated", 3, 1000, stats))
    assert stats.malformed == 0 and sum(len(b) for b in batches) == 250
    keys = torch.cat([b.keys for b in batches])
    for j, size in enumerate([50, 40, 3]):
        assert int(keys[:, j].min()) >= 0 and int(keys[:, j].max()) <= size - 1
    assert int(keys[:, 2].unique().numel()) == 3  # uniform over a table of 3
    labels = torch.cat([b.labels for b in batches])
    assert set(labels.tolist()) == {0.0, 1.0}
    assert torch.cat([b.ptrue for b in batches]).eq(0.5).all()  # no signal: best AUC 0.5
    # the job lines train exactly what was laid out (and say it on stderr too)
    cfg = TrainerConfig.parse(yaml.safe_load(job.read_text()))
    assert cfg.runner.end_day == "20190721" and cfg.runner.end_split == "0000"
    assert cfg.runner.data_format == "generated" and cfg.hyper_parameters.sparse_inputs_slots == 3
    assert cfg.runner.split_interval == 720 and job.read_text() in done.stderr
    # the same flags give the same bytes
    again = datagen(*random_args(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    for f in files:
        twin = tmp_path / "again" / f.relative_to(tmp_path / "data")
        assert np.array_equal(np.fromfile(f, np.uint8), np.fromfile(twin, np.uint8))


def test_reference_flags_that_the_layout_cannot_carry_are_refused(tmp_path):
    cases = [
        (["--num-indices-per-lookup", "10"], "--num-indices-per-lookup 10: must be 1"),
        (["--arch-mlp-bot", "4-3-2"], "--arch-mlp-bot '4-3-2': must start with 13"),
        (["--arch-embedding-size", "4-x"], "--arch-embedding-size '4-x'"),
        (["--split-interval", "7"], "--split-interval 7"),
    ]
    # the first through the installed script, the others through its main() here
    for i, (flags, says) in enumerate(cases):
        args = random_args(tmp_path / "bad", *flags)
        done = datagen(*args) if i == 0 else run_main(datagen_main, args)
        assert done.returncode == 2 and says in done.stderr, (flags, done.stderr)
    done = datagen(*random_args(tmp_path / "size", "--num-batches", "3", "--mini-batch-size", "7"))
    assert done.returncode == 0 and json.loads(done.stdout)["lines"] == 21
    # into a directory that holds data: refused, nothing mixed
    done = datagen(*random_args(tmp_path / "size"))
    assert done.returncode == 2 and "already holds files" in done.stderr
