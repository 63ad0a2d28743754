"""Jobs over real HTTP on a real Redis: CRUD, every state transition, auth, bad input."""

from __future__ import annotations

import json

import pytest
import redis
from api_helpers import TOKEN, job_body
from servers import wait_for
from streamrec.api.state import change_state
from streamrec.control import keys

STATES = ["created", "running", "paused", "stopping", "stopped", "succeeded", "failed"]
ACTIONS = ["start", "stop", "pause", "resume", "delete"]
#: The allowed operator transitions, written out here independently of state.TRANSITIONS.
ALLOWED = {
    ("created", "start"): "running",
    ("stopped", "start"): "running",
    ("failed", "start"): "running",
    ("running", "pause"): "paused",
    ("paused", "resume"): "running",
    ("running", "stop"): "stopping",
    ("paused", "stop"): "stopping",
    ("created", "delete"): None,
    ("stopped", "delete"): None,
    ("succeeded", "delete"): None,
    ("failed", "delete"): None,
}


def create(client, roots, name="t", **kw) -> dict:
    resp = client.post("/v1/jobs", json=job_body(roots, name, **kw))
    assert resp.status_code == 201, resp.text
    return resp.json()


def drive_to(client, r: redis.Redis, job_id: str, state: str) -> None:
    """Brings a job to ``state`` through the API (and the scheduler's own transitions)."""
    post = lambda action: client.post(f"/v1/jobs/{job_id}/{action}")  # noqa: E731
    if state == "created":
        return
    if state == "stopping":  # a live trainer group keeps the job stopping until it obeys
        r.set(keys.heartbeat(job_id), json.dumps({"consumer": "t"}), px=60_000)
    assert post("start").status_code == 200
    if state == "paused":
        assert post("pause").status_code == 200
    elif state in ("stopping", "stopped"):
        assert post("stop").status_code == 200
    elif state == "succeeded":
        change_state(r, job_id, "succeed", reason="test")
    elif state == "failed":
        change_state(r, job_id, "fail", reason="test")
    wait_for(
        lambda: client.get(f"/v1/jobs/{job_id}").json()["state"] == state, what=f"state {state}"
    )


def test_create_get_list_delete(client, roots):
    job = create(client, roots, "a")
    assert job["state"] == "created" and job["name"] == "a"
    assert job["passes_total"] == 4 and job["passes_done"] == 0  # 1440 / 360 splits, 1 each
    assert job["spec"]["data"]["split_per_pass"] == 1
    create(client, roots, "b")
    got = client.get(f"/v1/jobs/{job['id']}").json()
    assert got["id"] == job["id"] and got["spec"] == job["spec"]
    listing = client.get("/v1/jobs").json()
    assert listing["count"] == 2 and [j["name"] for j in listing["data"]] == ["a", "b"]
    page = client.get("/v1/jobs", params={"offset": 1, "limit": 1}).json()
    assert [j["name"] for j in page["data"]] == ["b"]
    assert client.get("/v1/jobs", params={"state": "running"}).json()["count"] == 0
    assert client.get("/v1/jobs", params={"state": "created"}).json()["count"] == 2
    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 204
    assert client.get(f"/v1/jobs/{job['id']}").status_code == 404
    assert client.get("/v1/jobs").json()["count"] == 1


@pytest.mark.parametrize("state", STATES)
def test_every_transition(client, roots, r, state):
    for action in ACTIONS:
        job = create(client, roots, f"{state}-{action}")
        drive_to(client, r, job["id"], state)
        if action == "stop":  # a live group keeps a stopping job stopping while we look
            r.set(keys.heartbeat(job["id"]), json.dumps({"consumer": "t"}), px=60_000)
        method = client.delete if action == "delete" else client.post
        path = f"/v1/jobs/{job['id']}" + ("" if action == "delete" else f"/{action}")
        resp = method(path)
        if (state, action) in ALLOWED:
            if action == "delete":
                assert resp.status_code == 204, (state, action, resp.text)
                assert client.get(f"/v1/jobs/{job['id']}").status_code == 404
                assert job["id"] not in r.smembers(keys.jobs_in_state(state))
            else:
                assert resp.status_code == 200, (state, action, resp.text)
                new = ALLOWED[(state, action)]
                assert resp.json()["state"] == new
                # the state indexes moved with the state
                assert job["id"] in r.smembers(keys.jobs_in_state(new))
                assert job["id"] not in r.smembers(keys.jobs_in_state(state))
        else:
            assert resp.status_code == 409, (state, action, resp.text)
            body = resp.json()
            assert body["state"] == state and state in body["detail"]
            assert client.get(f"/v1/jobs/{job['id']}").json()["state"] == state


def test_state_changes_are_events(client, roots):
    job = create(client, roots)
    for action in ("start", "pause", "resume", "stop"):
        assert client.post(f"/v1/jobs/{job['id']}/{action}").status_code == 200
    wait_for(lambda: client.get(f"/v1/jobs/{job['id']}").json()["state"] == "stopped")
    events = client.get(f"/v1/jobs/{job['id']}/events").json()["data"]
    moves = [(e["data"].get("from"), e["data"].get("to")) for e in events if e["type"] == "state"]
    assert moves == [
        (None, "created"),
        ("created", "running"),
        ("running", "paused"),
        ("paused", "running"),
        ("running", "stopping"),
        ("stopping", "stopped"),
    ]


def test_event_paging(client, roots):
    job = create(client, roots)
    for _ in range(3):
        client.post(f"/v1/jobs/{job['id']}/start")
        client.post(f"/v1/jobs/{job['id']}/pause")
        client.post(f"/v1/jobs/{job['id']}/resume")
        client.post(f"/v1/jobs/{job['id']}/stop")
        wait_for(lambda: client.get(f"/v1/jobs/{job['id']}").json()["state"] == "stopped")
    everything = client.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
    assert everything["next"] is None
    ids, after = [], None
    while True:
        params = {"limit": 4, **({"after": after} if after else {})}
        page = client.get(f"/v1/jobs/{job['id']}/events", params=params).json()
        assert len(page["data"]) <= 4
        ids += [e["id"] for e in page["data"]]
        after = page["next"]
        if after is None:
            break
    assert ids == [e["id"] for e in everything["data"]]
    # the pool scheduler may add "waiting for trainers" events between the moves
    states = [e for e in everything["data"] if e["type"] == "state"]
    assert len(states) == 1 + 3 * 5


def test_auth(api, client, roots):
    body = job_body(roots)
    with api.http(token=None) as anon, api.http(token="wrong-token-xyz") as wrong:
        assert anon.post("/v1/jobs", json=body).status_code == 401
        resp = wrong.post("/v1/jobs", json=body)
        assert resp.status_code == 401 and resp.json()["detail"] == "invalid token"
        assert resp.headers["www-authenticate"] == 'Bearer error="invalid_token"'
        job = create(client, roots)
        for path in ("start", "stop", "pause", "resume"):
            assert anon.post(f"/v1/jobs/{job['id']}/{path}").status_code == 401
            assert wrong.post(f"/v1/jobs/{job['id']}/{path}").status_code == 401
        assert anon.delete(f"/v1/jobs/{job['id']}").status_code == 401
        assert (
            wrong.post(f"/v1/jobs/{job['id']}/triggers", json={"kind": "shrink"}).status_code == 401
        )
        # reads are closed by default too (every GET route: test_read_auth.py)
        assert anon.get(f"/v1/jobs/{job['id']}").status_code == 401
        assert client.get(f"/v1/jobs/{job['id']}").json()["state"] == "created"
    assert TOKEN not in client.get("/openapi.json").text


def test_reads_opened_by_setting(redis_server, roots, r):
    """``--no-auth-reads`` opens the reads (writes still need the token)."""
    from api_helpers import make_api

    server = make_api(redis_server.url, roots, extra=["--no-auth-reads", "--no-scheduler"])
    server.start()
    try:
        with (
            server.http(token=None) as anon,
            server.http(token="nope-nope-nope") as wrong,
            server.http() as ok,
        ):
            assert anon.get("/v1/jobs").status_code == 200
            assert wrong.get("/v1/jobs").status_code == 200
            assert ok.get("/v1/jobs").status_code == 200
            assert anon.post("/v1/jobs", json=job_body(roots)).status_code == 401
            assert anon.get("/healthz").status_code == 200
    finally:
        server.stop()


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda b: b["data"].update(split_interval=7), "split_interval"),
        (lambda b: b["data"].update(start_day="2019-07-20"), "start_day"),
        (lambda b: b["data"].update(start_day="20190732"), "start_day"),
        (lambda b: b["data"].update(end_day="20190701"), "data"),
        (lambda b: b["data"].update(split_per_pass=0), "split_per_pass"),
        (lambda b: b["data"].update(data_donefile="../x"), "data_donefile"),
        (lambda b: b.update(name=""), "name"),
        (lambda b: b.update(surprise=1), "surprise"),
        (lambda b: b["checkpoint"].update(checkpoint_per_pass=-1), "checkpoint_per_pass"),
        (
            lambda b: (
                b["store"].update(endpoints=["http://x"])
                if "store" in b
                else b.update(store={"endpoints": ["http://x"]})
            ),
            "endpoints",
        ),
        (lambda b: b.update(resources={"trainer_ranks": 0}), "trainer_ranks"),
        # the trainer config the job implies is validated too, with its field path
        (
            lambda b: b.update(model={"hyper_parameters": {"arch_mlp_bot": "13-x"}}),
            "model.hyper_parameters.arch_mlp_bot",
        ),
        (
            lambda b: b.update(model={"hyper_parameters": {"optimiser": "sgd"}}),
            "model.hyper_parameters.optimiser",
        ),
        (lambda b: b.update(model={"runner": {"train_data_dir": "/etc"}}), "model"),
    ],
)
def test_invalid_spec_is_422_with_field(client, roots, mutate, field):
    body = job_body(roots)
    mutate(body)
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    locs = [".".join(str(p) for p in e["loc"]) for e in resp.json()["detail"]]
    assert any(field in loc for loc in locs), locs
    assert client.get("/v1/jobs").json()["count"] == 0


@pytest.mark.parametrize(
    "mutate,loc,msg",
    [
        (
            lambda b: b["data"].update(data_root=b["data"].pop("train_data_dir")),
            "body.data",
            "data.data_root was renamed data.train_data_dir",
        ),
        (
            lambda b: b["data"].update(format="criteo"),
            "body.data",
            "data.format was renamed data.data_format",
        ),
        (
            lambda b: b["data"].update(data_format="streamrec"),
            "body.data",
            "data.data_format 'streamrec' was renamed 'generated'",
        ),
        (
            lambda b: b.update(model={"store": {"addresses": ["tcp://127.0.0.1:5555"]}}),
            "body.model.store",
            "store.addresses was renamed store.endpoints",
        ),
    ],
)
def test_a_renamed_field_is_refused_naming_its_new_name(client, roots, mutate, loc, msg):
    body = job_body(roots)
    mutate(body)
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    errors = [(".".join(map(str, e["loc"])), e["msg"]) for e in resp.json()["detail"]]
    assert any(where == loc and msg in text for where, text in errors), errors
    assert client.get("/v1/jobs").json()["count"] == 0


@pytest.mark.parametrize(
    "mutate,loc,msg",
    [
        (  # an endpoint that would do nothing
            lambda b: b.update(sampler={"endpoint": "ipc:///tmp/s.sock"}),
            "body.sampler",
            "endpoint 'ipc:///tmp/s.sock' is set but neg_num is 0",
        ),
        (  # negatives need their table
            lambda b: b.update(sampler={"neg_num": 3}),
            "body.model.negative_sampling",
            "negative_sampling.enabled needs table_path",
        ),
        (
            lambda b: b.update(store={"tier": "ssd"}),
            "body.store",
            "tier 'ssd' needs endpoints",
        ),
        (
            lambda b: b.update(model={"negative_sampling": {"sample_size": 3}}),
            "body.model",
            "model.negative_sampling.sample_size is set by the job's sampler.neg_num",
        ),
        (
            lambda b: b.update(model={"store": {"tier": "host"}}),
            "body.model",
            "model.store.tier is set by the job's store.tier",
        ),
        (
            lambda b: b.update(resources={"threads_per_rank": 0}),
            "body.resources.threads_per_rank",
            "greater than or equal to 1",
        ),
    ],
)
def test_a_field_that_cannot_work_is_refused_by_name(client, roots, mutate, loc, msg):
    body = job_body(roots)
    mutate(body)
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    errors = [(".".join(map(str, e["loc"])), e["msg"]) for e in resp.json()["detail"]]
    assert any(where == loc and msg in text for where, text in errors), errors
    assert client.get("/v1/jobs").json()["count"] == 0


def test_every_field_reaches_the_trainer_config_the_agent_reads(client, roots, redis_server):
    """The job's sampler, store and resources sections become the trainer config the API
    stores with the job; the trainer side reads it through its channel."""
    from streamrec.control.channel import TrainerChannel

    body = job_body(roots, "wired", data_format="criteo")
    table = str(roots["data"] / "tables" / "items.parquet")
    body["model"] = {"negative_sampling": {"table_path": table}}
    body["sampler"] = {"endpoint": "tcp://127.0.0.1:7700", "neg_num": 4}
    body["store"] = {"endpoints": ["tcp://127.0.0.1:7701"], "tier": "ssd"}
    body["resources"] = {"trainer_ranks": 2, "threads_per_rank": 3}
    job = create_body(client, body)
    assert job["spec"]["sampler"] == body["sampler"]
    ch = TrainerChannel(redis_server.url, job["id"], "test")
    try:
        t = ch.trainer_config()
    finally:
        ch.close()
    ns = t.negative_sampling
    assert (ns.enabled, ns.sample_size, ns.endpoint) == (True, 5, "tcp://127.0.0.1:7700")
    assert ns.table_path == table
    assert (t.store.endpoints, t.store.tier) == (["tcp://127.0.0.1:7701"], "ssd")
    assert (t.resources.trainer_ranks, t.resources.threads_per_rank) == (2, 3)
    assert t.runner.train_data_dir == str(roots["data"] / "wired")
    assert t.runner.data_format == "criteo"


def test_a_job_stored_before_the_renames_still_reads_and_starts(client, roots, r):
    """Specs already in Redis keep working (REST bodies with the old names are refused)."""
    job = create(client, roots, "old", data_format="generated")
    old = dict(job["spec"])
    old["data"] = {
        k: v for k, v in old["data"].items() if k not in ("train_data_dir", "data_format")
    }
    old["data"].update(data_root=job["spec"]["data"]["train_data_dir"], format="streamrec")
    r.hset(keys.job(job["id"]), "spec", json.dumps(old))
    r.hdel(keys.job(job["id"]), "trainer_config")
    got = client.get(f"/v1/jobs/{job['id']}").json()
    assert got["spec"]["data"] == job["spec"]["data"]
    assert client.post(f"/v1/jobs/{job['id']}/start").json()["state"] == "running"
    trainer = json.loads(r.hget(keys.job(job["id"]), "trainer_config"))
    assert trainer["runner"]["train_data_dir"] == str(roots["data"] / "old")
    assert trainer["runner"]["data_format"] == "generated"


def create_body(client, body: dict) -> dict:
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    return resp.json()


@pytest.mark.parametrize(
    "section,key,path",
    [
        ("data", "train_data_dir", "/etc"),
        ("data", "train_data_dir", "{data}/../../../etc"),
        ("checkpoint", "model_save_path", "/tmp/elsewhere"),
        ("checkpoint", "model_save_path", "{data}/x"),  # a data root is not a model root
    ],
)
def test_paths_outside_roots_refused(client, roots, section, key, path):
    body = job_body(roots)
    body[section][key] = path.format(data=roots["data"])
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    err = resp.json()["detail"][0]
    assert err["loc"] == ["body", section, key] and "outside the allowed roots" in err["msg"]
    assert client.get("/v1/jobs").json()["count"] == 0


def test_not_json_and_oversized_bodies(client, roots):
    resp = client.post(
        "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422
    big = job_body(roots)
    big["model"] = {"blob": "x" * (2 << 20)}
    resp = client.post("/v1/jobs", json=big)
    assert resp.status_code == 413 and "exceeds" in resp.json()["detail"]

    def chunks():  # no Content-Length: the cap applies to the streamed body too
        for _ in range(40):
            yield b"x" * 65536

    resp = client.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert client.get("/v1/jobs").json()["count"] == 0
    assert client.get("/healthz").status_code == 200


def test_unknown_things_are_404(client, roots):
    assert client.get("/v1/jobs/feedfacefeedface").status_code == 404
    assert client.post("/v1/jobs/feedfacefeedface/start").status_code == 404
    assert client.delete("/v1/jobs/feedfacefeedface").status_code == 404
    assert client.get("/v1/jobs/feedfacefeedface/passes").status_code == 404
    assert client.get("/v1/jobs/feedfacefeedface/events").status_code == 404
    job = create(client, roots)
    assert client.get(f"/v1/jobs/{job['id']}/passes/20190720/1").status_code == 404
    assert client.get(f"/v1/jobs/{job['id']}/triggers/abc").status_code == 404
    assert client.get("/v1/jobs/bad id!").status_code in (404, 422)


def test_health_ready_metrics_docs(client):
    assert client.get("/healthz").json() == {"status": "ok", "redis": None}
    assert client.get("/readyz").json() == {"status": "ok", "redis": True}
    client.get("/v1/jobs")
    text = client.get("/metrics").text
    assert 'streamrec_api_requests_total{method="GET",route="/v1/jobs",status="200"}' in text
    assert "streamrec_api_scheduler_leader 1.0" in text
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert "/v1/jobs/{job_id}/start" in spec["paths"] and "/readyz" in spec["paths"]
