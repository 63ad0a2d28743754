"""The API's side of the trainer pool against a real API process and Redis: a group whose
registration names a job that has ended counts as free, and a gauge says how many do.

The group is played by :class:`streamrec.control.pool.PoolChannel` (what a pooled group's
rank 0 registers with), in this process: a registration left naming an ended job is what a
group that could not start its job kept for ever before the pool healed.
"""

from __future__ import annotations

import socket

import httpx
import redis
from api_helpers import job_body
from servers import parse_metrics, wait_for
from streamrec.control import keys
from streamrec.control.pool import PoolChannel, ended_jobs

HELD = "streamrec_api_pool_groups_held_by_ended_jobs"


def gauges(client: httpx.Client) -> dict[str, float]:
    return parse_metrics(client.get("/metrics").text)


def gauge_is(client: httpx.Client, name: str, value: float) -> dict[str, float]:
    """Waits until the leader's ``name`` reads ``value``; returns every sample then."""
    return wait_for(
        lambda: (g := gauges(client)).get(name) == value and g,
        timeout=10,
        what=f"{name} == {value}",
        detail=lambda: str({k: v for k, v in gauges(client).items() if "pool" in k}),
    )


def created(client: httpx.Client, roots, name: str) -> str:
    resp = client.post("/v1/jobs", json=job_body(roots, name))
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def stopped_job(client: httpx.Client, roots, name: str) -> str:
    """A job started and stopped with no trainer group (it goes to stopped at once)."""
    job_id = created(client, roots, name)
    assert client.post(f"/v1/jobs/{job_id}/start").json()["state"] == "running"
    assert client.post(f"/v1/jobs/{job_id}/stop").status_code == 200
    wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == "stopped", what="stopped")
    return job_id


def test_ended_jobs_are_the_deleted_and_the_finished(client, roots, r: redis.Redis):
    stopped = stopped_job(client, roots, "ended-stopped")
    running = created(client, roots, "ended-running")
    assert client.post(f"/v1/jobs/{running}/start").json()["state"] == "running"
    waiting = created(client, roots, "ended-created")
    assert ended_jobs(r, [stopped, running, "no-such-job", waiting]) == {
        stopped,
        "no-such-job",
        waiting,
    }
    assert ended_jobs(r, []) == set()
    client.post(f"/v1/jobs/{running}/stop")


def test_a_group_held_by_an_ended_job_is_free_and_counted(client, roots, r: redis.Redis):
    gauge_is(client, HELD, 0)  # an empty pool
    old = stopped_job(client, roots, "pool-old")
    group = PoolChannel(r, "held-0", 1, socket.gethostname(), ttl_s=30)
    group.register(old)  # a group left naming its stopped job
    held = gauge_is(client, HELD, 1)
    assert held['streamrec_api_pool_groups{state="idle"}'] == 1
    assert held['streamrec_api_pool_groups{state="busy"}'] == 0
    # deleted: still ended, still free
    assert client.delete(f"/v1/jobs/{old}").status_code == 204
    assert gauge_is(client, HELD, 1)['streamrec_api_pool_groups{state="idle"}'] == 1
    # a new job is given to that group at once, not left waiting for trainers
    new = created(client, roots, "pool-new")
    assert client.post(f"/v1/jobs/{new}/start").json()["state"] == "running"
    job = wait_for(
        lambda: (j := client.get(f"/v1/jobs/{new}").json())["group"] and j,
        timeout=10,
        what="a group for the new job",
    )
    assert job["group"] == "held-0" and job["trainers"] == "assigned", job
    assert r.hget(keys.POOL_ASSIGNMENTS, "held-0") is not None
    # the group takes it: its registration names a running job, busy, not counted held
    group.register(new)
    busy = gauge_is(client, HELD, 0)
    assert busy['streamrec_api_pool_groups{state="busy"}'] == 1
    assert busy["streamrec_api_jobs_waiting_for_trainers"] == 0
    assert client.post(f"/v1/jobs/{new}/stop").status_code == 200
    group.leave()


def test_a_group_working_for_a_running_job_is_busy(client, roots, r: redis.Redis):
    """A registration naming a running job is busy and not held: the normal state of a
    group at work, in which StreamRecPoolGroupHeldByEndedJob is silent."""
    job_id = created(client, roots, "pool-running")
    assert client.post(f"/v1/jobs/{job_id}/start").json()["state"] == "running"
    PoolChannel(r, "working-0", 1, socket.gethostname(), ttl_s=30).register(job_id)
    seen = wait_for(
        lambda: (g := gauges(client))['streamrec_api_pool_groups{state="busy"}'] == 1 and g,
        timeout=10,
        what="the group counted busy",
    )
    assert seen['streamrec_api_pool_groups{state="idle"}'] == 0
    assert seen[HELD] == 0
    client.post(f"/v1/jobs/{job_id}/stop")
