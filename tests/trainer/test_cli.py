"""The console scripts as separate processes: a job from YAML, export, predict, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml
from trainer_helpers import small_config


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrec.trainer", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_job_export_predict(stream, tmp_path):
    job = small_config(stream, tmp_path / "model", end_day="20190720").model_dump(mode="json")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    run = cli("--config", str(path), "--learning-rate", "0.04")
    assert run.returncode == 0, run.stderr[-2000:]
    recs = [
        json.loads(x) for x in (tmp_path / "model" / "passes.jsonl").read_text().split("\n") if x
    ]
    assert [(r["day"], r["pass_id"]) for r in recs] == [("20190720", 1), ("20190720", 2)]
    assert recs[0]["lr"] == 0.04
    again = cli("--config", str(path))  # warm start: every pass is done, nothing retrained
    assert again.returncode == 0, again.stderr[-2000:]
    assert len((tmp_path / "model" / "passes.jsonl").read_text().splitlines()) == 2

    exp = cli("export", "--config", str(path), "--out", str(tmp_path / "serving"))
    assert exp.returncode == 0, exp.stderr[-2000:]
    assert json.loads(exp.stdout)["last_pass"] == ["20190720", 2]
    data = sorted((stream / "20190721" / "0000").glob("part-*"))
    pred = cli(
        "predict",
        "--model",
        str(tmp_path / "serving"),
        "--data",
        str(data[0]),
        "--data",
        str(data[1]),
        "--out",
        str(tmp_path / "scores.txt"),
    )
    assert pred.returncode == 0, pred.stderr[-2000:]
    res = json.loads(pred.stdout)
    assert res["samples"] == 1500 and 0.55 < res["auc"] < 1.0
    assert np.loadtxt(tmp_path / "scores.txt").shape == (1500,)


def test_bad_config_is_a_clear_error(tmp_path: Path):
    path = tmp_path / "job.yaml"
    path.write_text("runner:\n  split_per_pass: 2\n  trian_batch_size: 5\n")
    run = cli("--config", str(path))
    assert run.returncode == 2
    assert "runner.trian_batch_size: Extra inputs are not permitted" in run.stderr
    missing = cli("predict", "--model", str(tmp_path / "nothing"), "--data", "x")
    assert missing.returncode == 2 and "MANIFEST.json" in missing.stderr
