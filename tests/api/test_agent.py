"""The real trainer agent (streamrec.trainer.agent, one rank) driven by the real API.

A small planted stream; the job is started, trained pass by pass, sent triggers, stopped,
started again (the new agent warm-starts from the checkpoint) and finished.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from api_helpers import wait_for
from streamrec.process import spawn, stop_process

SMALL_MODEL = {
    "runner": {"train_batch_size": 128},
    "hyper_parameters": {
        "sparse_inputs_slots": 4,
        "arch_sparse_feature_size": 4,
        "arch_mlp_bot": "13-16-4",
        "arch_mlp_top": "8-1",
        "optimizer": "adagrad",
        "learning_rate": 0.05,
    },
}


def datagen(out: Path, max_splits: int | None = None) -> None:
    args = [
        str(Path(sys.executable).parent / "streamrec-datagen"),
        "--out",
        str(out),
        "--start-day",
        "20190720",
        "--days",
        "1",
        "--split-interval",
        "720",
        "--samples-per-split",
        "1500",
        "--slots",
        "4",
        "--vocab",
        "300",
        "--seed",
        "5",
    ]
    if max_splits is not None:
        args += ["--max-splits", str(max_splits)]
    subprocess.run(args, check=True, capture_output=True, timeout=120)


def alive(agent: subprocess.Popen, log: Path) -> None:
    if agent.poll() is not None:
        raise AssertionError(f"agent exited {agent.returncode}: {log.read_text()[-3000:]}")


def run_agent(redis_url: str, job_id: str, log: Path) -> subprocess.Popen:
    return spawn(
        [
            sys.executable,
            "-m",
            "streamrec.trainer.agent",
            "--redis-url",
            redis_url,
            "--job-id",
            job_id,
            "--heartbeat-ttl-s",
            "3",
            "--poll-ms",
            "200",
        ],
        log=log,
        die_with_parent=True,
    )


@pytest.mark.timeout(240)
def test_agent_trains_obeys_triggers_stops_and_resumes(client, roots, redis_server, tmp_path):
    data = roots["data"] / "agent"
    model = roots["model"] / "agent"
    datagen(data, max_splits=1)  # only pass 1 of 2 has landed
    body = {
        "name": "agent",
        "data": {
            "train_data_dir": str(data),
            "start_day": "20190720",
            "end_day": "20190720",
            "split_interval": 720,
            "split_per_pass": 1,
            "data_donefile": "to.hadoop.done",
            "data_sleep_second": 0.1,
        },
        "checkpoint": {"model_save_path": str(model), "checkpoint_per_pass": 1},
        "model": SMALL_MODEL,
    }
    job = client.post("/v1/jobs", json=body)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/start").status_code == 200
    agent = run_agent(redis_server.url, job_id, tmp_path / "agent1.log")
    try:
        p1 = wait_for(
            lambda: (
                alive(agent, tmp_path / "agent1.log")
                or (p := client.get(f"/v1/jobs/{job_id}/passes/20190720/1")).status_code == 200
                and p.json()["state"] == "done"
                and p.json()
            ),
            timeout=120,
            interval=0.2,
            what="pass 1 done",
        )
        assert p1["samples"] == 1500 and p1["ranks"] == 1 and p1["malformed_lines"] == 0
        assert 0.5 < p1["train_auc"] <= 1 and 0 < p1["best_auc"] <= 1
        assert p1["logloss"] > 0 and p1["seconds"] > 0
        job = wait_for(
            lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["last_checkpoint"] and j,
            timeout=30,
            what="checkpoint reported",
        )
        assert job["last_checkpoint"] == "20190720/1"
        assert (model / "20190720" / "1" / "MANIFEST.json").is_file()
        assert client.get(f"/v1/jobs/{job_id}/workers").json()["alive"] is True
        # triggers while the agent idles waiting for pass 2
        made = [
            client.post(f"/v1/jobs/{job_id}/triggers", json=b).json()
            for b in (
                {"kind": "checkpoint"},
                {"kind": "export", "mode": "delta"},
                {"kind": "shrink"},
            )
        ]
        done = [
            wait_for(
                lambda t=t: (
                    (g := client.get(f"/v1/jobs/{job_id}/triggers/{t['id']}").json())["state"]
                    != "pending"
                    and g
                ),
                timeout=60,
                what=f"trigger {t['kind']}",
            )
            for t in made
        ]
        assert [t["state"] for t in done] == ["done", "done", "done"], done
        assert Path(done[0]["result"]["path"]) == model / "20190720" / "1"
        assert Path(done[1]["result"]["path"]) == model / "20190720" / "delta_1"
        assert (model / "20190720" / "delta_1" / "MANIFEST.json").is_file()
        assert isinstance(done[2]["result"]["deleted"], dict)
        # stop: the agent obeys, reports, and leaves
        assert client.post(f"/v1/jobs/{job_id}/stop").json()["state"] == "stopping"
        assert agent.wait(timeout=60) == 0
        wait_for(
            lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == "stopped", what="stopped"
        )
        assert client.get(f"/v1/jobs/{job_id}/workers").json()["alive"] is False
    finally:
        stop_process(agent)
    # the rest of the day lands; start again: a new agent warm-starts from 20190720/1
    datagen(data)
    assert client.post(f"/v1/jobs/{job_id}/start").json()["state"] == "running"
    agent = run_agent(redis_server.url, job_id, tmp_path / "agent2.log")
    try:
        job = wait_for(
            lambda: (
                (j := client.get(f"/v1/jobs/{job_id}").json())["state"] in ("succeeded", "failed")
                and j
            ),
            timeout=150,
            interval=0.2,
            what="job finished",
        )
        assert job["state"] == "succeeded", job
        assert agent.wait(timeout=60) == 0
    finally:
        stop_process(agent)
    passes = client.get(f"/v1/jobs/{job_id}/passes").json()["data"]
    assert [(p["pass_id"], p["state"], p["attempts"]) for p in passes] == [
        (1, "done", 1),
        (2, "done", 1),
    ]
    assert passes[1]["predict_auc"] is not None and passes[1]["train_auc"] > 0.5
    assert job["passes_done"] == 2 and job["last_checkpoint"] == "20190720/2"
    events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    started = [e for e in events if e["type"] == "trainer"]
    assert len(started) == 2 and started[1]["data"]["resumed_from"] == "20190720/1"
    # the day's end: base and batch models after the last pass (trainer policy)
    assert (model / "20190720" / "base" / "MANIFEST.json").is_file()


def small_job(name: str, data: Path, model: Path, **sections) -> dict:
    return {
        "name": name,
        "data": {
            "train_data_dir": str(data),
            "start_day": "20190720",
            "end_day": "20190720",
            "split_interval": 720,
            "split_per_pass": 1,
            "data_donefile": "to.hadoop.done",
            "data_sleep_second": 0.1,
        },
        "checkpoint": {"model_save_path": str(model), "checkpoint_per_pass": 1},
        "model": SMALL_MODEL,
        **sections,
    }


def started_job(client, body: dict) -> str:
    job = client.post("/v1/jobs", json=body)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/start").status_code == 200
    return job_id


def fails_at_start(client, redis_server, body: dict, log: Path) -> dict:
    """Runs an agent on a job it cannot take: it reports why and exits 2; the job fails."""
    job_id = started_job(client, body)
    agent = run_agent(redis_server.url, job_id, log)
    try:
        assert agent.wait(timeout=120) == 2, log.read_text()[-3000:]
    finally:
        stop_process(agent)
    return wait_for(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["state"] == "failed" and j,
        what="job failed",
    )


@pytest.mark.timeout(180)
def test_a_group_of_another_size_fails_the_job(client, roots, redis_server, tmp_path):
    body = small_job(
        "ranks", roots["data"] / "ranks", roots["model"] / "ranks", resources={"trainer_ranks": 2}
    )
    job = fails_at_start(client, redis_server, body, tmp_path / "agent.log")
    assert job["error"] == (
        "resources.trainer_ranks is 2 but this trainer group has 1 rank(s) (WORLD_SIZE): "
        "start it with 2 ranks, or change resources.trainer_ranks"
    )


@pytest.mark.timeout(180)
def test_shards_of_another_tier_fail_the_job(client, roots, redis_server, tmp_path):
    from streamrec.embedding_store import LocalShards
    from streamrec.trainer.config import TrainerConfig
    from streamrec.trainer.store import build_table_options

    tables = build_table_options(TrainerConfig.parse(SMALL_MODEL))
    (tmp_path / "tables.json").write_text(
        json.dumps({"tables": [t.model_dump(mode="json") for t in tables]})
    )
    with LocalShards(tmp_path / "tables.json", 1) as shards:  # host tier
        body = small_job(
            "tier",
            roots["data"] / "tier",
            roots["model"] / "tier",
            store={"endpoints": shards.endpoints, "tier": "ssd"},
        )
        job = fails_at_start(client, redis_server, body, tmp_path / "agent.log")
    assert job["error"] == (
        f"store.tier is 'ssd' but shard 0 ({shards.endpoints[0]}) serves tier 'host' "
        f"(shards own their tier: start them with --tier ssd, or change store.tier)"
    )


@pytest.mark.timeout(240)
def test_negatives_and_threads_reach_the_trainer_group(client, roots, redis_server, tmp_path):
    """sampler.neg_num negatives per click from sampler.endpoint; threads_per_rank threads."""
    from streamrec.sampler import LocalRpcDataSampler
    from streamrec.sampler.client import stop_server
    from streamrec.trainer.data import ParseStats, iter_batches

    data, model = roots["data"] / "negatives", roots["model"] / "negatives"
    datagen(data, max_splits=1)
    files = sorted((data / "20190720" / "0000").glob("part-*"))
    batches = list(iter_batches(files, "generated", 4, 10**6, ParseStats()))
    clicks = sum(int(b.labels.sum()) for b in batches)
    items = torch.unique(torch.cat([b.keys[:, 0] for b in batches])).numpy()
    pq.write_table(
        pa.table(
            {
                "slot_0": pa.array(items, pa.int64()),
                "category": pa.array(np.ones(len(items), np.int64)),
                "weight": pa.array(np.ones(len(items), np.float32)),
                "skey": pa.array([""] * len(items)),
            }
        ),
        tmp_path / "items.parquet",
    )
    sock = tempfile.mkdtemp(prefix="agt-", dir="/tmp")  # ipc socket paths are short
    endpoint = f"ipc://{sock}/sampler.sock"
    sampler = LocalRpcDataSampler("category", "slot_0", "weight", "skey", endpoint=endpoint)
    body = small_job(
        "negatives",
        data,
        model,
        sampler={"endpoint": endpoint, "neg_num": 2},
        resources={"threads_per_rank": 2},
    )
    body["model"] = {
        **SMALL_MODEL,
        "negative_sampling": {"table_path": str(tmp_path / "items.parquet"), "item_slot": 0},
    }
    job_id = started_job(client, body)
    agent = run_agent(redis_server.url, job_id, tmp_path / "agent.log")
    try:
        p1 = wait_for(
            lambda: (
                alive(agent, tmp_path / "agent.log")
                or (p := client.get(f"/v1/jobs/{job_id}/passes/20190720/1")).status_code == 200
                and p.json()["state"] == "done"
                and p.json()
            ),
            timeout=120,
            interval=0.2,
            what="pass 1 done",
        )
        assert 0 < clicks < 1500 and p1["samples"] == 3 * clicks  # each click + 2 negatives
        assert client.post(f"/v1/jobs/{job_id}/stop").json()["state"] == "stopping"
        assert agent.wait(timeout=60) == 0
    finally:
        stop_process(agent)
        pid = sampler.server_pid
        sampler.close()
        if pid:
            stop_server(pid)
        shutil.rmtree(sock, ignore_errors=True)
    events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    started = [e["data"] for e in events if e["type"] == "trainer"]
    assert [(s["ranks"], s["threads"]) for s in started] == [(1, 2)]
