"""A job's record says which trainer group ran it after it ends: ``group`` is cleared when the
pool releases the group, ``last_group`` keeps its name (a real API process and Redis; the
group is played by :class:`streamrec.control.pool.PoolChannel`, as in
``test_pool_registrations.py``)."""

from __future__ import annotations

import socket

import redis
from api_helpers import job_body
from servers import wait_for
from streamrec.control.pool import PoolChannel


def test_last_group_outlives_the_assignment(client, roots, r: redis.Redis):
    job_id = client.post("/v1/jobs", json=job_body(roots, "last-group")).json()["id"]
    assert client.get(f"/v1/jobs/{job_id}").json()["last_group"] is None  # never given out
    group = PoolChannel(r, "ran-0", 1, socket.gethostname(), ttl_s=30)
    group.register(None)
    try:
        assert client.post(f"/v1/jobs/{job_id}/start").json()["state"] == "running"
        job = wait_for(
            lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["group"] and j,
            timeout=10,
            what="the job given to the group",
        )
        assert job["group"] == job["last_group"] == "ran-0", job
        assert client.post(f"/v1/jobs/{job_id}/stop").status_code == 200
        ended = wait_for(
            lambda: (
                (j := client.get(f"/v1/jobs/{job_id}").json())["state"] == "stopped"
                and j["group"] is None
                and j
            ),
            timeout=20,
            what="the job stopped and its group released",
        )
        assert ended["last_group"] == "ran-0", ended
        listed = client.get("/v1/jobs", params={"state": "stopped"}).json()["data"]
        assert [j["last_group"] for j in listed if j["id"] == job_id] == ["ran-0"]
    finally:
        group.leave()
