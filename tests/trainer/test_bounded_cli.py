"""The trainer CLI over a stream that ends: a bounded run succeeds saying where it stopped,
prints the demo's line per pass (not with --quiet), and predict says what is held out."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from streamrec.launcher import report
from streamrec.pass_line import PASS_HEADER, pass_row
from trainer_helpers import small_config, write_stream


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrec.trainer", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_landed_run_ends_succeeded_at_the_last_split_with_progress(tmp_path):
    data = write_stream(tmp_path / "data", days=3, samples=600, max_splits=3)
    model = tmp_path / "model"
    job = small_config(
        data, model, end_day="20190722", end_split="landed", checkpoint_per_pass=0
    ).model_dump(mode="json")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    run = cli("--config", str(path))  # no data_wait_timeout: a wait would hang the test
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0] == PASS_HEADER
    rows = [line.split() for line in lines[1:4]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("20190720", "1", "600"),
        ("20190720", "2", "600"),
        ("20190721", "1", "600"),
    ]
    assert all(0.0 < float(r[3]) < 1.0 and float(r[6]) > 0.0 for r in rows)  # AUC, logloss
    assert lines[4].startswith(
        "streamrec-trainer: done: trained through split 20190721/0000 (landed); model at "
        "pass 20190721/1"
    )
    # the run's last pass wrote a checkpoint (checkpoint_per_pass 0: only day ends did)
    found = sorted(p.parent.name + "/" + p.name for p in model.glob("*/[0-9]*"))
    assert found == ["20190720/2", "20190721/1"]

    # the next split lands; --quiet: no line per pass, the end still said
    write_stream(tmp_path / "more", days=3, samples=600, max_splits=4)
    (tmp_path / "more" / "20190721" / "1200").rename(data / "20190721" / "1200")
    again = cli("--config", str(path), "--quiet")
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.splitlines() == [
        "streamrec-trainer: done: trained through split 20190721/1200 (landed); model at "
        f"pass 20190721/2 under {model}"
    ]
    records = [json.loads(x) for x in (model / "passes.jsonl").read_text().splitlines()]
    assert [(r["day"], r["pass_id"]) for r in records][-1] == ("20190721", 2)

    nothing = cli("--config", str(path))
    assert nothing.returncode == 0 and "nothing to train (landed" in nothing.stdout

    # predict: the model's lineage says which files it was trained on
    exp = cli("export", "--config", str(path), "--out", str(tmp_path / "serving"))
    assert exp.returncode == 0, exp.stderr[-2000:]
    trained = sorted((data / "20190721" / "1200").glob("part-*"))
    inside = cli("predict", "--model", str(tmp_path / "serving"), "--data", str(trained[0]))
    assert inside.returncode == 0, inside.stderr[-2000:]
    res = json.loads(inside.stdout)
    assert res["held_out"] is False and res["trained_on"] == [str(trained[0])]
    assert "in-sample" in inside.stderr
    write_stream(tmp_path / "later", days=3, samples=600, max_splits=5)
    later = sorted((tmp_path / "later" / "20190722" / "0000").glob("part-*"))
    # a later day under another root: held out
    held = cli("predict", "--model", str(tmp_path / "serving"), "--data", str(later[0]))
    res = json.loads(held.stdout)
    assert res["held_out"] is True and res["trained_on"] == [] and "in-sample" not in held.stderr
    assert res["model_last_pass"] == ["20190721", 2]


def test_end_split_flag_and_a_fixed_end(tmp_path):
    data = write_stream(tmp_path / "data", days=2, samples=300)
    model = tmp_path / "model"
    job = small_config(data, model, end_day="20190721").model_dump(mode="json")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    run = cli("--config", str(path), "--end-day", "20190720", "--end-split", "0000", "--quiet")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "trained through split 20190720/0000 (end_split 0000)" in run.stdout
    bad = cli("--config", str(path), "--end-split", "0005")
    assert bad.returncode == 2 and "end_split '0005' is not a split of the day" in bad.stderr
    # no end set past the data: the wait gives up, and the error says how to end instead
    wait = cli("--config", str(path), "--end-day", "20190722", "--data-wait-timeout-second", "0.3")
    assert wait.returncode == 2
    assert "pass 20190722/1: split(s) 20190722/0000 have no donefile" in wait.stderr
    assert "set runner.end_split: landed" in wait.stderr


def test_the_pass_line_is_the_demos():
    record = {"day": "20190720", "pass_id": 3, "samples": 1000, "predict_auc": 0.61}
    record |= {"train_auc": 0.64, "best_auc": None, "logloss": 0.67, "seconds": 2.25}
    assert report.PASS_HEADER is PASS_HEADER and report.pass_row is pass_row  # the demo's rows
    assert pass_row(record).split() == [
        "20190720",
        "3",
        "1000",
        "0.6100",
        "0.6400",
        "-",
        "0.6700",
        "2.2",
    ]
