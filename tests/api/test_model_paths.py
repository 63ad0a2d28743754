"""One model path, one job: the API refuses (409, naming the other job) a job whose
``checkpoint.model_save_path`` is, contains or lies inside another live job's, at create and
at start, compared resolved; a deleted job frees its path."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from api_helpers import TOKEN, job_body
from streamrec.control import keys


def with_model(roots, name: str, model: str) -> dict:
    body = job_body(roots, name)
    body["checkpoint"]["model_save_path"] = model
    return body


def created(client, body: dict) -> dict:
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    return resp.json()


def taken(resp: httpx.Response, other_id: str, relation: str) -> str:
    assert resp.status_code == 409, resp.text
    body = resp.json()
    assert body["code"] == "model_path_taken", body
    assert (
        f"of job {other_id!r}" in body["detail"]
        and f" {relation} the model path" in (body["detail"])
    ), body
    return body["detail"]


@pytest.mark.parametrize(
    "second,relation",
    [
        ("shared", "is"),
        ("shared/inner", "lies inside"),
        ("shared/./x/../inner", "lies inside"),  # normalised before it is compared
        (".", "contains"),
    ],
)
def test_a_second_live_job_on_one_model_path_is_refused(client, roots, second, relation):
    a = created(client, with_model(roots, "a", str(roots["model"] / "shared")))
    resp = client.post("/v1/jobs", json=with_model(roots, "b", str(roots["model"] / second)))
    detail = taken(resp, a["id"], relation)
    assert str(roots["model"] / "shared") in detail
    assert [j["id"] for j in client.get("/v1/jobs").json()["data"]] == [a["id"]]
    # a sibling is not inside: "shared-2" is its own path
    created(client, with_model(roots, "c", str(roots["model"] / "shared-2")))


def test_a_symlink_to_another_jobs_model_path_is_refused(client, roots):
    target = roots["model"] / "real"
    target.mkdir()
    link = roots["model"] / "alias"
    link.symlink_to(target)
    a = created(client, with_model(roots, "a", str(target)))
    resp = client.post("/v1/jobs", json=with_model(roots, "b", str(link / "sub")))
    assert str(target) in taken(resp, a["id"], "lies inside")


def test_a_deleted_job_frees_its_model_path(client, roots, r):
    body = with_model(roots, "a", str(roots["model"] / "reused"))
    a = created(client, body)
    assert r.hget(keys.MODEL_PATHS, a["id"]) == str(roots["model"] / "reused")
    taken(client.post("/v1/jobs", json=body), a["id"], "is")
    assert client.delete(f"/v1/jobs/{a['id']}").status_code == 204
    assert not r.exists(keys.MODEL_PATHS)
    b = created(client, body)
    assert b["spec"]["checkpoint"]["model_save_path"] == str(roots["model"] / "reused")


def test_of_concurrent_creates_on_one_model_path_one_wins(api, client, roots):
    body = with_model(roots, "race", str(roots["model"] / "race"))
    statuses: list[int] = []
    start = threading.Barrier(8)

    def post() -> None:
        with httpx.Client(
            base_url=api.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as c:
            start.wait()
            statuses.append(c.post("/v1/jobs", json=body).status_code)

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [201] + [409] * 7, statuses
    assert client.get("/v1/jobs").json()["count"] == 1


def test_jobs_stored_before_the_check_are_checked_at_create_and_start(client, roots, r):
    """Two jobs on one path from before the index: the second to start gets the 409, and a new
    job on that path is refused although the index did not list them."""
    a = created(client, with_model(roots, "a", str(roots["model"] / "old")))
    b = created(client, with_model(roots, "b", str(roots["model"] / "old-b")))
    # as stored before the API kept the index: B's spec names A's path, nothing indexed
    spec = json.loads(r.hget(keys.job(b["id"]), "spec"))
    spec["checkpoint"]["model_save_path"] = str(roots["model"] / "old")
    r.hset(keys.job(b["id"]), "spec", json.dumps(spec))
    r.delete(keys.MODEL_PATHS)
    taken(client.post(f"/v1/jobs/{b['id']}/start"), a["id"], "is")
    assert client.get(f"/v1/jobs/{b['id']}").json()["state"] == "created"
    resp = client.post("/v1/jobs", json=with_model(roots, "c", str(roots["model"] / "old")))
    assert resp.status_code == 409 and resp.json()["code"] == "model_path_taken", resp.text
    d = created(client, with_model(roots, "d", str(roots["model"] / "new")))
    assert set(r.hkeys(keys.MODEL_PATHS)) == {a["id"], b["id"], d["id"]}  # indexed by D's create
    assert client.delete(f"/v1/jobs/{a['id']}").status_code == 204
    assert client.post(f"/v1/jobs/{b['id']}/start").status_code == 200
