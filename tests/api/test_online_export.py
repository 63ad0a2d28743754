"""Through REST: a job that ends at a split, and the export trigger's mode ``online``, which
publishes the model's rows to a real redis-server (read back, checked against the store)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import redis
from api_helpers import job_body, land_split
from servers import wait_for
from streamrec.control.trainer_config import TrainerConfig
from streamrec.embedding_store import EmbeddingStore, FileConverter, RedisConverter
from streamrec.process import spawn, stop_process
from streamrec.trainer.store_tables import build_table_options

MODEL = {
    "runner": {"train_batch_size": 128},
    "hyper_parameters": {
        "sparse_inputs_slots": 4,
        "arch_sparse_feature_size": 4,
        "arch_mlp_bot": "13-16-4",
        "arch_mlp_top": "8-1",
    },
}


def datagen(out: Path, max_splits: int) -> None:
    subprocess.run(
        [
            str(Path(sys.executable).parent / "streamrec-datagen"),
            *("--out", str(out), "--start-day", "20190720", "--split-interval", "720"),
            *("--samples-per-split", "1000", "--slots", "4", "--vocab", "300"),
            *("--days", "2", "--max-splits", str(max_splits)),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def test_end_split_landed_is_the_split_there_at_creation(client, roots):
    body = job_body(roots, "landed", end_day="20190721", end_split="landed")
    res = client.post("/v1/jobs", json=body)
    assert res.status_code == 422 and "no split has landed" in res.text, res.text
    for day, split in (("20190720", "0000"), ("20190720", "0600"), ("20190720", "1800")):
        land_split(roots["data"] / "landed", day, split)  # 1200 missing: 1800 is not reached
    job = client.post("/v1/jobs", json=body)
    assert job.status_code == 201, job.text
    data = job.json()["spec"]["data"]
    assert (data["end_day"], data["end_split"]) == ("20190720", "0600")  # stored as it was
    assert job.json()["passes_total"] == 2
    assert client.get(f"/v1/jobs/{job.json()['id']}").json()["spec"]["data"]["end_split"] == "0600"


def test_bad_end_split_and_export_mode_are_refused_by_name(client, roots):
    body = job_body(roots, "bounded", end_split="0005")  # split_interval 360
    res = client.post("/v1/jobs", json=body)
    assert res.status_code == 422 and "end_split '0005' is not a split of the day" in res.text
    job = client.post("/v1/jobs", json=job_body(roots, "bounded", end_split="0600")).json()
    assert job["passes_total"] == 2 and job["spec"]["data"]["end_split"] == "0600"
    res = client.post(f"/v1/jobs/{job['id']}/triggers", json={"kind": "export", "mode": "live"})
    assert res.status_code == 422 and "online" in res.text


@pytest.mark.timeout(240)
def test_online_export_trigger_publishes_the_store_rows(client, roots, redis_server, tmp_path):
    data = roots["data"] / "online"
    model = roots["model"] / "online"
    datagen(data, max_splits=1)  # pass 1 of 2 has landed
    prefix = "job-online"
    body = {
        "name": "online",
        "data": {
            "train_data_dir": str(data),
            "start_day": "20190720",
            "end_day": "20190721",
            "end_split": "0000",  # ends with the next day's first split
            "split_interval": 720,
            "data_sleep_second": 0.1,
        },
        "checkpoint": {"model_save_path": str(model), "checkpoint_per_pass": 1},
        "model": {**MODEL, "online": {"redis_url": redis_server.url, "prefix": prefix}},
    }
    job = client.post("/v1/jobs", json=body)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    assert job.json()["passes_total"] == 3
    assert client.post(f"/v1/jobs/{job_id}/start").status_code == 200
    log = tmp_path / "agent.log"
    agent = spawn(
        [
            sys.executable,
            "-m",
            "streamrec.trainer.agent",
            *("--redis-url", redis_server.url, "--job-id", job_id),
            *("--heartbeat-ttl-s", "3", "--poll-ms", "200"),
        ],
        log=log,
        die_with_parent=True,
    )
    r = redis.Redis.from_url(redis_server.url)
    try:
        wait_for(
            lambda: (
                (agent.poll() is None or pytest.fail(f"agent exited: {log.read_text()[-3000:]}"))
                and client.get(f"/v1/jobs/{job_id}").json()["last_checkpoint"] == "20190720/1"
            ),
            timeout=120,
            interval=0.2,
            what="pass 1 done and checkpointed",
        )
        trig = client.post(f"/v1/jobs/{job_id}/triggers", json={"kind": "export", "mode": "online"})
        assert trig.status_code == 202, trig.text
        done = wait_for(
            lambda: (
                (g := client.get(f"/v1/jobs/{job_id}/triggers/{trig.json()['id']}").json())["state"]
                in ("done", "failed")
                and g
            ),
            timeout=60,
            interval=0.2,
            what="online export done",
        )
        assert done["state"] == "done", done
        assert done["mode"] == "online"
        version = done["result"]["version"]
        assert version["seq"] == 1 and version["tag"] == "20190720/base"

        # what Redis serves is the store's rows: the model is the checkpoint of pass 1
        cfg = TrainerConfig.parse(MODEL)
        store = EmbeddingStore(build_table_options(cfg))
        store.load(str(model / "20190720" / "1" / "sparse"))
        base = FileConverter(model / "20190720" / "base" / "sparse")
        conv = RedisConverter(redis_server.url, prefix)
        for table in cfg.table_names:
            keys, values = conv.read_rows(table)
            assert keys.size > 0
            np.testing.assert_array_equal(values, store.pull(table, keys, create=False).numpy())
            base_keys, _ = base.read_rows(table, "base")  # the rows a base selects
            assert keys.tolist() == sorted(base_keys.tolist())
            served, found = conv.lookup(table, keys[:5])  # the serving read
            assert found.all() and np.array_equal(served, values[:5])
        store.close()
        assert r.hget(f"{prefix}:version", "seq") == b"1"

        # the rest lands; the job's day-end base is published too, and it ends at its split
        datagen(tmp_path / "more", max_splits=4)
        for day, split in (("20190720", "1200"), ("20190721", "0000"), ("20190721", "1200")):
            staged = data / day / f".{split}"  # whole, then renamed: never half a split
            shutil.copytree(tmp_path / "more" / day / split, staged)
            staged.rename(data / day / split)
        job = wait_for(
            lambda: (
                (j := client.get(f"/v1/jobs/{job_id}").json())["state"] in ("succeeded", "failed")
                and j
            ),
            timeout=120,
            interval=0.2,
            what="job finished",
        )
        assert job["state"] == "succeeded", job
        assert job["passes_done"] == 3 and job["last_checkpoint"] == "20190721/1"
        events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
        assert any("through split 20190721/0000" in e["message"] for e in events), events
        assert r.hget(f"{prefix}:version", "tag") == b"20190720/base"
        assert r.hget(f"{prefix}:version", "seq") == b"2"
        # 20190721/1200 landed too, after the job's end: not trained
        passes = client.get(f"/v1/jobs/{job_id}/passes").json()["data"]
        assert [(p["day"], p["pass_id"]) for p in passes] == [
            ("20190720", 1),
            ("20190720", 2),
            ("20190721", 1),
        ]
        records = (model / "passes.jsonl").read_text().splitlines()
        assert len(records) == 3 and '"pass_id": 1' in records[-1]
        agent.wait(timeout=30)
    finally:
        stop_process(agent)
        r.close()
