"""The real trainer agent (streamrec.trainer.agent, one rank) driven by the real API.

A small planted stream; the job is started, trained pass by pass, sent triggers, stopped,
started again (the new agent warm-starts from the checkpoint) and finished.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from api_helpers import wait_for

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
    out = open(log, "ab")  # noqa: SIM115 - closed by the OS with the child
    return subprocess.Popen(
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
        stdout=out,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.timeout(240)
def test_agent_trains_obeys_triggers_stops_and_resumes(client, roots, redis_server, tmp_path):
    data = roots["data"] / "agent"
    model = roots["model"] / "agent"
    datagen(data, max_splits=1)  # only pass 1 of 2 has landed
    body = {
        "name": "agent",
        "data": {
            "data_root": str(data),
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
        if agent.poll() is None:
            agent.kill()
            agent.wait()
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
        if agent.poll() is None:
            agent.kill()
            agent.wait()
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
