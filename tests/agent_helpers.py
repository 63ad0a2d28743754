"""What the tests that run the real trainer agent under the real API share: a small model,
a planted day, the agent's process and flags, a job body, waiting for a job to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from servers import wait_for
from streamrec.process import spawn

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


def land_day(out: Path) -> None:
    """A day of 6 splits of 240 minutes, 400 planted samples each (6 short passes)."""
    subprocess.run(
        [
            str(Path(sys.executable).parent / "streamrec-datagen"),
            *("--out", str(out), "--start-day", "20190720", "--days", "1"),
            *("--split-interval", "240", "--samples-per-split", "400"),
            *("--slots", "4", "--vocab", "200", "--seed", "7"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def run_agent(
    redis_url: str, job_id: str, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    return spawn(
        [sys.executable, "-m", "streamrec.trainer.agent", *agent_args(redis_url, job_id)],
        log=log,
        die_with_parent=True,
        env=env,
    )


def agent_args(redis_url: str, job_id: str) -> list[str]:
    """The agent's flags in these tests: short heartbeats and polls."""
    return [
        "--redis-url",
        redis_url,
        "--job-id",
        job_id,
        "--heartbeat-ttl-s",
        "3",
        "--poll-ms",
        "200",
    ]


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


def finished(client, job_id: str, agent: subprocess.Popen, log: Path, timeout: float = 120):
    return wait_for(
        lambda: (
            alive(agent, log)
            or (j := client.get(f"/v1/jobs/{job_id}").json())["state"] in ("succeeded", "failed")
            and j
        ),
        timeout=timeout,
        interval=0.2,
        what="job finished",
    )


def pass_done(client, job_id: str, pass_id: int, agent: subprocess.Popen, log: Path) -> dict:
    """The record of pass ``pass_id`` of day 20190720 once it is done (the agent alive)."""

    def done() -> dict | None:
        alive(agent, log)
        p = client.get(f"/v1/jobs/{job_id}/passes/20190720/{pass_id}")
        return p.json() if p.status_code == 200 and p.json()["state"] == "done" else None

    return wait_for(done, timeout=120, interval=0.2, what=f"pass {pass_id} done")
