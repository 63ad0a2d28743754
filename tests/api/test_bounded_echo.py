"""A 422 echoes what the client sent bounded (``errors.bounded_detail``): a huge value comes
back as its first characters and its full length, at most ``MAX_PROBLEMS`` problems are
listed, and each still names its field path. Over real HTTP, against the real API."""

from __future__ import annotations

import json

from api_helpers import job_body
from streamrec.api.errors import ECHO_LIMIT, MAX_PROBLEMS


def schema_job(roots, sparse: list) -> dict:
    body = job_body(roots)
    body["data"]["data_format"] = "slot"
    body["data"]["schema"] = {"label": "click", "dense": ["age"], "sparse": sparse}
    return body


def test_5000_features_are_refused_without_echoing_the_whole_input(client, roots):
    features = [{"name": f"feature_{i:05d}"} for i in range(5000)]
    resp = client.post("/v1/jobs", json=schema_job(roots, features))
    assert resp.status_code == 422, resp.text[:500]
    assert len(resp.content) < 2000, len(resp.content)  # the body sent was ~125 KB of JSON
    (problem,) = resp.json()["detail"]
    assert problem["loc"] == ["body", "data", "schema", "sparse"]
    assert "at most 1024 items" in problem["msg"] and "not 5000" in problem["msg"]
    sent = json.dumps(features, separators=(",", ":"))
    assert problem["input"] == f"{sent[:ECHO_LIMIT]}... ({len(sent)} chars of JSON)"
    assert problem["ctx"] == {"field_type": "List", "max_length": 1024, "actual_length": 5000}
    assert client.get("/v1/jobs").json()["count"] == 0


def test_a_small_bad_value_is_still_echoed_as_it_is(client, roots):
    resp = client.post("/v1/jobs", json=schema_job(roots, [{"name": "u", "pooling": "max"}]))
    assert resp.status_code == 422, resp.text
    (problem,) = resp.json()["detail"]
    assert problem["loc"] == ["body", "data", "schema", "sparse", 0, "pooling"]
    assert problem["input"] == "max"


def test_thousands_of_problems_list_the_first_ones_and_count_the_rest(client, roots):
    features = [{"name": i} for i in range(1000)]  # a name is a string: one problem each
    resp = client.post("/v1/jobs", json=schema_job(roots, features))
    assert resp.status_code == 422
    assert len(resp.content) < 40_000, len(resp.content)
    detail = resp.json()["detail"]
    assert len(detail) == MAX_PROBLEMS + 1
    assert [p["loc"] for p in detail[:3]] == [
        ["body", "data", "schema", "sparse", i, "name"] for i in range(3)
    ]
    assert [p["input"] for p in detail[:3]] == [0, 1, 2]
    rest = detail[-1]
    assert rest["type"] == "too_many_problems" and rest["loc"] == ["body"]
    shown = f"the first {MAX_PROBLEMS} are"
    assert rest["msg"] == f"{1000 - MAX_PROBLEMS} more problem(s) not shown ({shown})"
