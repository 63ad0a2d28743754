"""OnlineTrainer with the in-process embedding store: pass records, predict-then-train,
donefile waits, malformed data, checkpoint/restart, export and predict."""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY
from servers import wait_for
from streamrec import layout
from streamrec.datagen.planted import StreamParams, generate
from streamrec.trainer.data.batches import ParseStats
from streamrec.trainer.data.reader import iter_batches
from streamrec.trainer.errors import CheckpointError, ConfigError, DataError
from streamrec.trainer.model.evaluation import AucAccumulator
from streamrec.trainer.runner import OnlineTrainer
from trainer_helpers import SLOTS, small_config, write_stream

NO_SAVES = {"checkpoint_per_pass": 0, "save_base_at_day_end": False}


def records(model: Path) -> list[dict]:
    return [json.loads(x) for x in (model / "passes.jsonl").read_text().splitlines()]


def test_pass_records_and_metrics(stream, tmp_path):
    cfg = small_config(stream, tmp_path / "m", metrics_port=0, **NO_SAVES)
    trained = ("streamrec_trainer_samples_total", {"rank": "0", "phase": "train"})
    before = REGISTRY.get_sample_value(*trained) or 0.0  # the registry is the process's
    with OnlineTrainer(cfg) as t:
        specs = t.passes_todo()
        assert [(s.day, s.pass_id, s.splits) for s in specs] == [
            ("20190720", 1, ("0000",)),
            ("20190720", 2, ("1200",)),
            ("20190721", 1, ("0000",)),
            ("20190721", 2, ("1200",)),
        ]
        for s in specs:
            t.run_pass(s)
        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{t.metrics_port}/metrics", timeout=5)
            .read()
            .decode()
        )
    recs = records(tmp_path / "m")
    assert [(r["day"], r["pass_id"]) for r in recs] == [(s.day, s.pass_id) for s in specs]
    for r in recs:
        assert r["samples"] == 1500 and r["malformed_lines"] == 0 and r["files"] == 2
        for k in ("predict_auc", "train_auc", "logloss", "best_auc", "seconds"):
            assert isinstance(r[k], float), k
        assert 0.6 < r["best_auc"] < 0.99
        assert r["predict_auc"] < r["best_auc"] + 0.02
    # it learns: the last pass is predicted better than the first
    assert recs[-1]["predict_auc"] > recs[0]["predict_auc"] + 0.05
    assert 'streamrec_trainer_samples_total{phase="train",rank="0"}' in body
    assert REGISTRY.get_sample_value(*trained) - before == 4 * 1500
    # a pass's AUC has one metric name, the control plane's (streamrec_api_pass_auc)
    assert "streamrec_trainer_pass_auc" not in body


def test_predict_uses_the_model_before_training_on_the_pass(stream, tmp_path):
    with OnlineTrainer(small_config(stream, tmp_path / "m", **NO_SAVES)) as t:
        first, second = t.passes_todo()[:2]
        t.run_pass(first)
        files = t.rank_files(second)
        before = AucAccumulator()
        t.predict_files(files, before, None, ParseStats())
        rec = t.run_pass(second)
        after = AucAccumulator()
        t.predict_files(files, after, None, ParseStats())
    assert rec["predict_auc"] == pytest.approx(before.auc(), abs=1e-12)
    assert rec["predict_auc"] != pytest.approx(after.auc(), abs=1e-6)
    assert after.auc() > before.auc()  # having trained on it, the model fits it better


def test_waits_for_donefiles(tmp_path):
    data, model = tmp_path / "data", tmp_path / "m"
    cfg = small_config(data, model, end_day="20190720", **NO_SAVES)
    generate(data, "20190720", 1, 720, 400, params=StreamParams(slots=SLOTS, seed=5), max_splits=1)
    with OnlineTrainer(cfg) as t:
        runner = threading.Thread(target=t.run)
        runner.start()
        # pass 2 has no donefile yet: the runner waits for it, pass 1 done
        spec, _ = wait_for(lambda: t.waiting, 30, what="the runner waiting for pass 2")
        assert (spec.day, spec.pass_id) == ("20190720", 2)
        assert [r["pass_id"] for r in records(model)] == [1]
        split = data / "20190720" / "1200"
        split.mkdir(parents=True)
        (split / "part-00000").write_bytes((data / "20190720" / "0000" / "part-00000").read_bytes())
        # data without its donefile is not read: two more polls see the files, still waiting
        landed = t.waiting[1]
        wait_for(lambda: (w := t.waiting) is not None and w[1] >= landed + 2, 30, what="2 polls")
        assert runner.is_alive() and [r["pass_id"] for r in records(model)] == [1]
        (split / "to.hadoop.done").touch()
        runner.join(timeout=30)
        assert not runner.is_alive()
        assert t.waiting is None
    assert [r["pass_id"] for r in records(model)] == [1, 2]


def test_data_wait_timeout_and_stop(tmp_path):
    cfg = small_config(tmp_path / "none", tmp_path / "m", data_wait_timeout_second=0.2, **NO_SAVES)
    with (
        OnlineTrainer(cfg) as t,
        pytest.raises(DataError, match=r"pass 20190720/1: split\(s\) 20190720/0000 have no "),
    ):
        t.run()
    # a stop while waiting returns at the next poll, without an error
    with OnlineTrainer(small_config(tmp_path / "none", tmp_path / "m2", **NO_SAVES)) as t:
        runner = threading.Thread(target=t.run)
        runner.start()
        wait_for(lambda: t.waiting, 30, what="the runner waiting")
        t.stop_event.set()
        runner.join(timeout=10)
        assert not runner.is_alive() and not (tmp_path / "m2" / "passes.jsonl").exists()


def test_malformed_share_fails_naming_file_and_line(tmp_path):
    data = write_stream(tmp_path / "data", days=1, samples=400)
    bad = data / "20190720" / "0000" / "part-00001"
    lines = bad.read_bytes().splitlines(keepends=True)
    lines[4] = b"1\tnot\ta\tsample\n"
    bad.write_bytes(b"".join(lines))
    with OnlineTrainer(
        small_config(data, tmp_path / "m", max_malformed_ratio=0.0, **NO_SAVES)
    ) as t:
        spec = t.passes_todo()[0]
        with pytest.raises(DataError, match=rf"{bad} line 5: expected"):
            t.run_pass(spec)
    with OnlineTrainer(
        small_config(data, tmp_path / "m2", max_malformed_ratio=0.01, **NO_SAVES)
    ) as t:
        rec = t.run_pass(t.passes_todo()[0])
    assert rec["malformed_lines"] == 1 and rec["samples"] == 399


def test_several_ranks_need_a_shared_store(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="set store.endpoints to the embedding-store shards"):
        OnlineTrainer(small_config(tmp_path, tmp_path / "m"))


def sparse_rows(t: OnlineTrainer, stream: Path) -> list[torch.Tensor]:
    """The store rows of every key of day 1's first pass, per table (none created)."""
    spec = next(layout.iter_passes("20190720", "20190720", 720, 1))
    batches = list(iter_batches(t.rank_files(spec), "generated", SLOTS, 4096, ParseStats()))
    keys = torch.cat([b.keys for b in batches])
    return [
        t.store.pull(name, torch.unique(keys[:, j]), create=False)
        for j, name in enumerate(t.config.table_names)
    ]


def test_checkpoint_restart_continues_at_the_next_pass_with_identical_parameters(stream, tmp_path):
    straight = small_config(stream, tmp_path / "a", save_delta_frequency=1)
    with OnlineTrainer(straight) as t:
        t.run()
        want_dense = {k: v.clone() for k, v in t.dense.state_dict().items()}
        want_rows = sparse_rows(t, stream)
        want_lr = t.optimizer.param_groups[0]["lr"]

    resumed = small_config(stream, tmp_path / "b", end_day="20190720", save_delta_frequency=1)
    with OnlineTrainer(resumed) as t:
        t.run()  # day 1 only: checkpoints after passes 1 and 2
    # an interrupted checkpoint (no manifest) must not be taken for a good one
    half = layout.checkpoint_dir(tmp_path / "b", "20190721", 1)
    half.mkdir(parents=True)
    (half / "dense.pt").write_bytes(b"garbage")
    with OnlineTrainer(small_config(stream, tmp_path / "b", save_delta_frequency=1)) as t:
        assert t.warm_start() == ("20190720", 2)
        assert [(s.day, s.pass_id) for s in t.passes_todo()] == [("20190721", 1), ("20190721", 2)]
        t.last_pass = None
        t.run()  # warm-starts again itself, then trains day 2 only
        got_dense = t.dense.state_dict()
        got_rows = sparse_rows(t, stream)
        got_lr = t.optimizer.param_groups[0]["lr"]
    for k, v in want_dense.items():
        assert torch.equal(v, got_dense[k]), k
    for a, b in zip(want_rows, got_rows, strict=True):
        assert a.abs().sum() > 0 and torch.equal(a, b)
    assert got_lr == want_lr
    recs = records(tmp_path / "b")
    assert [(r["day"], r["pass_id"]) for r in recs] == [
        ("20190720", 1),
        ("20190720", 2),
        ("20190721", 1),
        ("20190721", 2),
    ]
    model = tmp_path / "b" / "20190721"
    assert {p.name for p in model.iterdir()} >= {"1", "2", "base", "batch", "delta_1"}


def test_corrupt_checkpoint_is_refused(stream, tmp_path):
    cfg = small_config(stream, tmp_path / "m", end_day="20190720")
    with OnlineTrainer(cfg) as t:
        t.run_pass(t.passes_todo()[0])
    ckpt = layout.checkpoint_dir(tmp_path / "m", "20190720", 1)
    with (ckpt / "dense.pt").open("ab") as f:
        f.write(b"tampered")
    with OnlineTrainer(cfg) as t, pytest.raises(CheckpointError, match="checksum of dense.pt"):
        t.warm_start()


def test_export_and_predict(stream, tmp_path):
    from streamrec.trainer.model.export import Predictor

    cfg = small_config(stream, tmp_path / "m", end_day="20190720")
    with OnlineTrainer(cfg) as t:
        t.run()
        spec = next(layout.iter_passes("20190721", "20190721", 720, 1))
        files = t.rank_files(spec)
        acc = AucAccumulator()
        t.predict_files(files, acc, None, ParseStats())
        out = t.export_serving(tmp_path / "serving")
    assert (out / "dense_int8.pt").is_file() and (out / "MANIFEST.json").is_file()
    pred = Predictor(out)
    try:
        res = pred.score_files(files, tmp_path / "scores.txt")
    finally:
        pred.close()
    scores = np.loadtxt(tmp_path / "scores.txt")
    assert res["samples"] == scores.size == 1500
    assert ((scores > 0) & (scores < 1)).all()
    # int8 dense and base rows (rare keys dropped) stay close to the float model
    assert abs(res["auc"] - acc.auc()) < 0.03
    assert os.path.getsize(out / "dense_int8.pt") > 0
