"""A model trained on N store shards loads wherever it goes: warm start in one process,
``streamrec-trainer export`` then ``predict`` as a user runs them (N = 1, 2, 3).

The shards are processes (``LocalShards``); the job trains through them, so its checkpoint
holds ``sparse/shard-K-of-N/``. The in-process trainer warm-starts from it with every
shard's rows, and its export scores exactly what the CLI's export of the shards scores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from streamrec.control.trainer_config import TrainerConfig
from streamrec.embedding_store import EmbeddingStoreClient, LocalShards
from streamrec.trainer.model.export import Predictor
from streamrec.trainer.runner import OnlineTrainer
from streamrec.trainer.store_tables import build_table_options
from trainer_helpers import small_config, write_stream

LAST = ("20190720", 2)


@pytest.fixture(scope="module")
def tiny_stream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One day, 2 splits of 2 files, 400 samples a split."""
    return write_stream(tmp_path_factory.mktemp("tiny_stream"), days=1, samples=400)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrec.trainer", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def through_shards(config: TrainerConfig, endpoints: list[str]) -> TrainerConfig:
    store = config.store.model_copy(update={"endpoints": endpoints})
    return config.model_copy(update={"store": store})


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_model_of_n_shards_warm_starts_exports_and_predicts(tiny_stream, tmp_path, n):
    config = small_config(tiny_stream, tmp_path / "model", end_day="20190720")
    tables = tmp_path / "tables.json"
    tables.write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in build_table_options(config)]})
    )
    data = sorted((tiny_stream / "20190720" / "0000").glob("part-*"))
    with LocalShards(tables, n) as shards:
        remote = through_shards(config, shards.endpoints)
        with OnlineTrainer(remote) as t:
            t.run()
        sparse = tmp_path / "model" / LAST[0] / str(LAST[1]) / "sparse"
        assert sorted(p.name for p in sparse.iterdir()) == [f"shard-{k}-of-{n}" for k in range(n)]

        # the user's commands: export from the job's checkpoint (through the shards), predict
        job = tmp_path / "job.yaml"
        job.write_text(yaml.safe_dump(remote.model_dump(mode="json")))
        exp = cli("export", "--config", str(job), "--out", str(tmp_path / "serving"))
        assert exp.returncode == 0, exp.stderr[-2000:]
        assert json.loads(exp.stdout)["last_pass"] == list(LAST)
        args = ["--data", str(data[0]), "--out", str(tmp_path / "scores.txt")]
        pred = cli("predict", "--model", str(tmp_path / "serving"), *args)
        assert pred.returncode == 0, pred.stderr[-2000:]
        res = json.loads(pred.stdout)
        assert res["samples"] == 200 and res["model_last_pass"] == list(LAST)
        assert 0.5 < res["auc"] <= 1.0

        # in one process: the warm start takes every shard's rows
        with OnlineTrainer(config) as local, EmbeddingStoreClient(shards.endpoints) as c:
            assert local.warm_start() == LAST
            for name in config.table_names:
                keys = np.concatenate(
                    [np.load(sparse / d.name / f"{name}.keys.npy") for d in sparse.iterdir()]
                )
                assert local.store.size(name) == c.size(name) == keys.size > 0
                torch.testing.assert_close(
                    local.store.pull(name, keys, create=False),
                    c.pull(name, keys, create=False),
                    rtol=0,
                    atol=0,
                )
            local.export_serving(tmp_path / "serving_local")
    # ... and its export scores what the shards' export scores (shards gone by now)
    pred_local = Predictor(tmp_path / "serving_local")
    try:
        pred_local.score_files([data[0]], tmp_path / "scores_local.txt")
    finally:
        pred_local.close()
    np.testing.assert_allclose(
        np.loadtxt(tmp_path / "scores.txt"), np.loadtxt(tmp_path / "scores_local.txt"), atol=1e-6
    )
