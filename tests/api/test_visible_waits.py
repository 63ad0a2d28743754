"""What the control plane waits for is visible (real API, real redis-server): a job waiting
for a split names it (REST ``waiting_for``, one ``data_wait`` event per split, the wait age
metric), a pass with 0 samples has an event and a counter, and a door left open (auth off,
Redis without a password) is warned about at start-up and set in a metric."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import redis
from api_helpers import job_body, land_split, make_api, report_pass
from servers import RedisServer, free_port, wait_for


def events_of(client, job_id: str, kind: str) -> list[dict]:
    data = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    return [e for e in data if e["type"] == kind]


def metric(client, name: str, **labels: str) -> float | None:
    text = client.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}{{{re.escape(want)}}} (\S+)$", text, re.M)
    return None if m is None else float(m.group(1))


def test_a_job_waiting_for_data_names_the_split(client, roots):
    data = roots["data"] / "waits"
    body = job_body(roots, "waits")
    job_id = client.post("/v1/jobs", json=body).json()["id"]
    assert client.get(f"/v1/jobs/{job_id}").json()["waiting_for"] is None  # not running
    client.post(f"/v1/jobs/{job_id}/start")
    job = wait_for(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["waiting_for"] and j,
        what="waiting_for",
    )
    assert job["waiting_for"] == "20190720/0000" and job["in_flight"] is None
    wait_for(lambda: metric(client, "streamrec_api_data_wait_seconds", job_id=job_id) is not None)
    (event,) = events_of(client, job_id, "data_wait")
    assert event["data"]["split"] == "20190720/0000"
    assert str(data / "20190720" / "0000" / "DONE") in event["message"]
    land_split(data, "20190720", "0000")
    job = wait_for(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["in_flight"] and j,
        what="pass 1 handed out",
    )
    assert job["waiting_for"] is None
    assert len(events_of(client, job_id, "data_wait")) == 1  # once per split


def test_a_pass_with_no_samples_has_an_event_and_a_counter(client, roots, redis_server):
    data = roots["data"] / "empty"
    land_split(data, "20190720", "0000", lines=0)
    job_id = client.post("/v1/jobs", json=job_body(roots, "empty")).json()["id"]
    client.post(f"/v1/jobs/{job_id}/start")
    report_pass(redis_server.url, job_id, {"samples": 0, "seconds": 0.1})
    (event,) = wait_for(lambda: events_of(client, job_id, "empty_pass"), what="empty_pass")
    assert event["data"]["pass"] == "20190720/1" and "0 samples" in event["message"]
    assert metric(client, "streamrec_api_empty_passes_total", job_id=job_id) == 1.0


def test_insecure_settings_are_warned_about_and_counted(redis_server, roots):
    api = make_api(redis_server.url, roots, extra=["--auth-disabled", "--log-level", "warning"])
    api.start()
    try:
        with httpx.Client(base_url=api.url, timeout=10) as c:
            text = c.get("/metrics").text
        assert 'streamrec_api_insecure{setting="auth_disabled"} 1.0' in text
        assert 'streamrec_api_insecure{setting="redis_no_password"} 1.0' in text
    finally:
        api.stop()
    log = api.log.read_text()
    assert "INSECURE: auth_disabled" in log and "INSECURE: redis_no_password" in log


@pytest.fixture
def locked_redis(tmp_path_factory):
    """A redis-server that requires a password, and the file holding it."""
    directory = tmp_path_factory.mktemp("locked-redis")
    password_file = directory / "password"
    password_file.write_text("s3cret-redis-password\n")
    server = RedisServer(free_port(), directory)
    server.start()
    r = server.client()
    r.config_set("requirepass", "s3cret-redis-password")
    r.close()
    yield server, password_file
    server.stop()


def test_the_api_authenticates_to_redis_with_the_password_file(locked_redis, roots):
    server, password_file = locked_redis
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=server.port).set("k", "v")
    api = make_api(server.url, roots, env={"STREAMREC_REDIS_PASSWORD_FILE": str(password_file)})
    api.start()
    try:
        with api.http() as c:
            assert c.get("/readyz").status_code == 200
            resp = c.post("/v1/jobs", json=job_body(roots, "locked"))
            assert resp.status_code == 201, resp.text
            assert "streamrec_api_insecure{" not in c.get("/metrics").text
    finally:
        api.stop()
    assert "s3cret-redis-password" not in Path(api.log).read_text()
