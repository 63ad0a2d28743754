"""The trainer agent's /metrics port (``--metrics-port``, what ``streamrec up`` scrapes) and a
failed save reaching the control plane as a checkpoint failure: a real agent, a real API."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest
from agent_helpers import agent_args, alive, datagen, finished, small_job, started_job
from api_helpers import free_port
from servers import parse_metrics, wait_for
from streamrec.process import spawn, stop_process


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_rank_serves_metrics_and_a_failed_save_is_a_checkpoint_failure(
    client, roots, redis_server, tmp_path: Path
):
    data, model = roots["data"] / "agent-metrics", roots["model"] / "agent-metrics"
    datagen(data, max_splits=1)  # only pass 1 of 2 has landed: the agent waits for pass 2
    job_id = started_job(client, small_job("agent-metrics", data, model))
    port = free_port()
    log = tmp_path / "agent.log"
    # model writes: pass 1's checkpoint (#1) fails, the pass is trained again and saved
    agent = spawn(
        [
            sys.executable,
            "-m",
            "streamrec.trainer.agent",
            *agent_args(redis_server.url, job_id),
            "--metrics-port",
            str(port),
        ],
        log=log,
        die_with_parent=True,
        env={"STREAMREC_FAULT": "checkpoint_enospc#1"},
    )
    try:
        wait_for(
            lambda: (
                alive(agent, log)
                or client.get(f"/v1/jobs/{job_id}/passes/20190720/1").json().get("state") == "done"
            ),
            timeout=120,
            interval=0.2,
            what="pass 1 done",
        )
        url = f"http://127.0.0.1:{port}/metrics"  # rank 0 (no LOCAL_RANK): the port itself
        rank = parse_metrics(urllib.request.urlopen(url, timeout=10).read().decode())
        assert rank['streamrec_trainer_passes_total{rank="0"}'] == 1
        assert rank['streamrec_trainer_pass_id{rank="0"}'] == 1
        assert rank["process_resident_memory_bytes"] > 0
        api = parse_metrics(client.get("/metrics").text)
        assert api[f'streamrec_api_checkpoint_failures_total{{job_id="{job_id}"}}'] == 1
        assert api[f'streamrec_api_passes_requeued_total{{job_id="{job_id}"}}'] == 1
        datagen(data)  # pass 2 lands
        job = finished(client, job_id, agent, log)
        assert job["state"] == "succeeded", job
        assert agent.wait(timeout=60) == 0
        api = parse_metrics(client.get("/metrics").text)
        assert api[f'streamrec_api_checkpoint_failures_total{{job_id="{job_id}"}}'] == 1
    finally:
        stop_process(agent)
