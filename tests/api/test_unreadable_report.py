"""A ``pass_failed`` report the API cannot read in full (an error class it does not know)
is an event, and its pass is still retried: the trainers have given it up, so leaving it in
flight would stall the job until the group is declared stuck."""

from __future__ import annotations

import json
import time

from api_helpers import job_body, land_split
from servers import wait_for
from streamrec.control import keys
from streamrec.control.channel import TrainerChannel


def test_a_pass_failed_with_an_unknown_error_class_is_an_event_and_the_pass_is_retried(
    client, roots, redis_server
):
    resp = client.post("/v1/jobs", json=job_body(roots, "unreadable"))
    assert resp.status_code == 201, resp.text
    job_id = resp.json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/start").json()["state"] == "running"
    ch = TrainerChannel(redis_server.url, job_id, "g1", heartbeat_ttl_s=60)
    ch.heartbeat(ranks=1, busy=True, progress_ts=time.time())
    land_split(roots["data"] / "unreadable", "20190720", "0000")
    item = wait_for(lambda: ch.take_pass(block_ms=500), what="the pass handed out")
    data = {
        "day": item.spec.day,
        "pass_id": item.spec.pass_id,
        "attempt": item.attempt,
        "error": "MeteorStrike: the rack is gone",
        "error_class": "meteor",  # no class this API knows
    }
    redis_server.client().xadd(
        keys.reports(job_id),
        {"type": "pass_failed", "data": json.dumps(data), "ts": str(time.time())},
    )
    ch.ack_pass(item)
    again = wait_for(lambda: ch.take_pass(block_ms=500), what="the pass handed out again")
    assert (again.spec.day, again.spec.pass_id) == (item.spec.day, item.spec.pass_id)
    assert again.attempt == item.attempt + 1
    events = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    bad = [e for e in events if e["type"] == "bad_report"]
    assert bad and "meteor" in bad[0]["message"], events
    ch.close()
