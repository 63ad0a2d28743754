"""The control plane's alerting metrics, set by the scheduler of a real API process against a
real Redis: Redis reachability, trainer heartbeat and progress ages, the work queue depth,
checkpoint failures (counted from 0), and the process collector."""

from __future__ import annotations

import time

from api_helpers import free_port, job_body, land_split, make_api
from servers import wait_for
from streamrec.control.channel import TrainerChannel


def scrape(client) -> dict[str, float]:
    """Every sample of the API's /metrics: ``name{labels}`` -> value."""
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def scrape_holding(client, names: list[str], timeout_s: float = 10.0) -> dict[str, float]:
    """The first scrape in which every one of ``names`` appears (gauges set on a tick)."""
    last: dict[str, float] = {}

    def holding() -> dict[str, float] | None:
        last.update(metrics := scrape(client))
        return metrics if all(name in metrics for name in names) else None

    return wait_for(
        holding,
        timeout_s,
        what=f"{names} in one scrape",
        detail=lambda: f"missing: {[n for n in names if n not in last]}",
    )


def sample(client, name: str) -> float | None:
    return scrape(client).get(name)


def start_job(client, roots, name: str) -> str:
    resp = client.post("/v1/jobs", json=job_body(roots, name))
    assert resp.status_code == 201, resp.text
    job_id = resp.json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/start").json()["state"] == "running"
    return job_id


def test_a_running_jobs_gauges_follow_its_trainer_group(client, roots, redis_server):
    job_id = start_job(client, roots, "gauges")
    job = f'job_id="{job_id}"'
    # counters the alerts read exist at 0 from the job's start; the liveness gauges follow
    # at the scheduler's first tick, so wait for one scrape that holds them all
    wanted = [
        f"streamrec_api_checkpoint_failures_total{{{job}}}",
        f"streamrec_api_work_queue_depth{{{job}}}",
        f"streamrec_api_data_wait_seconds{{{job}}}",
    ]
    metrics = scrape_holding(client, wanted)
    assert metrics[f"streamrec_api_checkpoint_failures_total{{{job}}}"] == 0
    assert metrics[f"streamrec_api_trainer_groups_dead_total{{{job}}}"] == 0
    assert metrics['streamrec_api_triggers_total{kind="checkpoint",state="failed"}'] == 0
    assert metrics["streamrec_api_redis_up"] == 1
    assert metrics["process_resident_memory_bytes"] > 0
    assert metrics[f"streamrec_api_work_queue_depth{{{job}}}"] == 0
    assert metrics[f"streamrec_api_pass_lag_seconds{{{job}}}"] == 0  # no data landed
    # no group serves the job (the pool is empty): it waits for trainers, which is what the
    # alerts read for it, and it has no heartbeat or progress age (no group to be late)
    wait_for(
        lambda: sample(client, "streamrec_api_jobs_waiting_for_trainers") == 1,
        what="the job counted as waiting for trainers",
    )
    metrics = scrape(client)
    assert f"streamrec_api_trainer_heartbeat_age_seconds{{{job}}}" not in metrics
    assert f"streamrec_api_trainer_progress_age_seconds{{{job}}}" not in metrics

    ch = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=60)
    ch.heartbeat(ranks=1, busy=True, progress_ts=time.time() - 100)
    wait_for(
        lambda: (
            (sample(client, f"streamrec_api_trainer_progress_age_seconds{{{job}}}") or 0) >= 100
        ),
        what="progress age from the heartbeat",
    )
    assert sample(client, f"streamrec_api_trainer_heartbeat_age_seconds{{{job}}}") < 30

    # a ready pass is handed out: queued until a group takes it
    land_split(roots["data"] / "gauges", "20190720", "0000")
    wait_for(
        lambda: sample(client, f"streamrec_api_work_queue_depth{{{job}}}") == 1,
        what="one pass queued",
    )
    item = ch.take_pass(block_ms=2000)
    assert item is not None
    wait_for(
        lambda: sample(client, f"streamrec_api_work_queue_depth{{{job}}}") == 0,
        what="the queue emptied by the take",
    )

    # a pass whose save failed, then a failed checkpoint trigger: two checkpoint failures
    ch.report(
        "pass_failed",
        day=item.spec.day,
        pass_id=item.spec.pass_id,
        attempt=item.attempt,
        error="OSError: disk full",
        error_class="transient",
        phase="save",
    )
    ch.ack_pass(item)
    wait_for(
        lambda: sample(client, f"streamrec_api_checkpoint_failures_total{{{job}}}") == 1,
        what="a failed save counted",
    )
    made = client.post(f"/v1/jobs/{job_id}/triggers", json={"kind": "checkpoint"}).json()
    ch.report("trigger_failed", trigger_id=made["id"], error="disk full")
    wait_for(
        lambda: sample(client, f"streamrec_api_checkpoint_failures_total{{{job}}}") == 2,
        what="a failed checkpoint trigger counted",
    )
    # a trigger refused for want of a model (the agent's NotFound, as before a first pass)
    # is no failed save: not counted, so no alert pages for it
    refused = client.post(f"/v1/jobs/{job_id}/triggers", json={"kind": "checkpoint"}).json()
    ch.report(
        "trigger_failed",
        trigger_id=refused["id"],
        error="NotFound: no pass trained or loaded yet: nothing to save or shrink",
    )
    wait_for(
        lambda: (
            client.get(f"/v1/jobs/{job_id}/triggers/{refused['id']}").json()["state"] == "failed"
        ),
        what="the refused trigger recorded",
    )
    assert sample(client, f"streamrec_api_checkpoint_failures_total{{{job}}}") == 2
    # a failure of training itself is no checkpoint failure
    again = wait_for(lambda: ch.take_pass(block_ms=500), what="the pass handed out again")
    ch.report(
        "pass_failed",
        day=again.spec.day,
        pass_id=again.spec.pass_id,
        attempt=again.attempt,
        error="RuntimeError: nan",
        error_class="transient",
        phase="train",
    )
    ch.ack_pass(again)
    wait_for(
        lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == "failed",
        what="the job failed (second failure)",
    )
    metrics = scrape(client)
    assert metrics[f"streamrec_api_checkpoint_failures_total{{{job}}}"] == 2
    # the running-only gauges are gone once the job no longer runs
    assert f"streamrec_api_trainer_heartbeat_age_seconds{{{job}}}" not in metrics
    assert f"streamrec_api_work_queue_depth{{{job}}}" not in metrics
    ch.close()


def test_redis_up_is_0_while_redis_is_unreachable(roots):
    """And the API stops at once: a scheduler tick retrying an unreachable Redis is not
    waited for, nor is the lease released (it expires); the stop took 13 s before."""
    env = {"STREAMREC_API_REDIS_OUTAGE_S": "0"}
    api = make_api(f"redis://127.0.0.1:{free_port()}/0", roots, env=env)
    api.start()
    try:
        with api.http() as c:
            wait_for(
                lambda: (sample(c, "streamrec_api_redis_errors_total") or 0) >= 1,
                what="a failed tick",
            )
            assert sample(c, "streamrec_api_redis_up") == 0
        t0 = time.monotonic()
        api.stop()
        assert time.monotonic() - t0 < 4.0
    finally:
        api.stop()
