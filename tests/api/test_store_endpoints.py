"""A job's store endpoints must be among the deployment's (``--store-endpoint``): others are a
422 naming the field and the value, over REST against a real API process."""

from __future__ import annotations

import pytest
from api_helpers import STORE_ENDPOINTS, job_body, make_api


@pytest.mark.parametrize(
    "endpoints,bad",
    [
        (["tcp://8.8.8.8:5555"], 0),
        (["ipc:///etc/passwd"], 0),
        ([STORE_ENDPOINTS[0], "tcp://127.0.0.1:7702"], 1),
        (["tcp://" + "h" * 5000 + ":5555"], 0),  # quoted bounded
    ],
)
def test_store_endpoints_outside_the_allowed_list_are_refused(client, roots, endpoints, bad):
    body = job_body(roots, "ep")
    body["store"] = {"endpoints": endpoints}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    (err,) = resp.json()["detail"]
    assert err["loc"] == ["body", "store", f"endpoints[{bad}]"]
    assert err["type"] == "endpoint_refused"
    assert len(err["msg"]) < 800  # a long value is quoted bounded
    if len(endpoints[bad]) < 100:
        assert f"'{endpoints[bad]}' is not an allowed store endpoint" in err["msg"]
    assert client.get("/v1/jobs").json()["count"] == 0


def test_allowed_store_endpoints_are_accepted(client, roots):
    body = job_body(roots, "ok")
    body["store"] = {"endpoints": STORE_ENDPOINTS}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    assert resp.json()["spec"]["store"]["endpoints"] == STORE_ENDPOINTS


def test_without_a_configured_list_every_store_endpoint_is_refused(redis_server, roots, r):
    api = make_api(redis_server.url, roots, store_endpoints=[])
    api.start()
    try:
        with api.http() as c:
            body = job_body(roots, "none")
            body["store"] = {"endpoints": [STORE_ENDPOINTS[0]]}
            resp = c.post("/v1/jobs", json=body)
            assert resp.status_code == 422, resp.text
            assert "no --store-endpoint is configured" in resp.json()["detail"][0]["msg"]
            body["store"] = {"endpoints": []}  # the in-process store needs no endpoint
            assert c.post("/v1/jobs", json=body).status_code == 201
    finally:
        api.stop()
