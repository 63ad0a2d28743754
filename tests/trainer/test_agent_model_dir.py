"""A trainer group refuses a job whose model directory belongs to another job: the agent
reports it ``fatal`` and the API fails the job, naming both jobs and the directory (no retry)."""

from __future__ import annotations

import pytest
from agent_helpers import datagen, run_agent, small_job, started_job
from servers import wait_for
from streamrec.process import stop_process
from streamrec.trainer.model.model_owner import claim


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_model_directory_of_a_deleted_job_fails_the_new_job(
    client, roots, redis_server, tmp_path
):
    data, model = roots["data"] / "owned", roots["model"] / "owned"
    datagen(data, max_splits=1)
    # job A (deleted since: the API lets a new job name its path) wrote this directory
    claim(model, "job-a-deleted")
    job_id = started_job(client, small_job("owned", data, model))
    log = tmp_path / "agent.log"
    agent = run_agent(redis_server.url, job_id, log)
    try:
        assert agent.wait(timeout=120) == 2, log.read_text()[-3000:]
    finally:
        stop_process(agent)
    job = wait_for(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["state"] == "failed" and j,
        what="job failed",
    )
    error = job["error"]
    assert "'job-a-deleted'" in error and repr(job_id) in error and str(model) in error, error
    assert job["passes_done"] == 0
    assert sorted(p.name for p in model.iterdir()) == ["owner.json"]  # nothing written
